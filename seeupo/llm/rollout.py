"""Rollout engines: token ids in, sampled token ids and their log-probabilities out.

One interface (:class:`RolloutEngine`) so that the agent loop does not care whether Hugging Face
``generate`` or vLLM samples. Engines never see text: prompts are token-id lists and completions
are token-id lists, so what the trainer scores is exactly what was sampled (no re-tokenisation).

Log-probabilities are those of the distribution each token was actually drawn from:
``softmax(logits / temperature)`` restricted to the top-``p`` nucleus and renormalised. With
``top_p = 1`` that is exactly what :class:`seeupo.llm.policy.CausalLMPolicy` at the same
temperature recomputes, so ``logp_old`` from the engine gives an importance ratio of 1 before the
first update. With ``top_p < 1`` the two differ (the policy does not truncate); a trainer that
samples with ``top_p < 1`` should recompute ``logp_old`` with the policy instead.
``temperature = 0`` means greedy decoding; the reported log-probabilities are then those of
``softmax(logits)`` (temperature 1), the greedy choice's probability under the raw model.

Precision: Hugging Face ``generate`` casts each step's logits to float32 before sampling, so the
engine's log-probabilities are float32 numbers even for a float64 model (they agree with a
float64 recomputation to about 1e-6, not 1e-12); they are still exactly the distribution the
tokens were drawn from.

Decoding with a preallocated cache: ``HFGenerateEngine(cache="static")`` decodes with its own loop
over key/value buffers allocated once for the whole batch (every prompt's ``n`` completions),
instead of ``generate``'s growing ``DynamicCache``; on CUDA the one-token step is captured once as a
CUDA graph and replayed. It samples the same tokens with the same log-probabilities as
``cache="dynamic"`` (the reference: ``generate`` itself), tested on the CPU.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import torch

from seeupo.llm.models import cache_argument, keeps_every_key, output_cache
from seeupo.llm.tree_attention import base_attention

Tensor = torch.Tensor


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one response.

    Attributes:
      temperature: ``tau > 0`` samples from ``softmax(logits / tau)``; 0 decodes greedily.
      top_p: nucleus mass (1 keeps the full distribution).
      max_new_tokens: at most this many tokens per completion (stop token included).
      stop_token_ids: a completion ends right after the first of these (it is kept in ``token_ids``).
      seed: seeds the sampling for reproducibility (``None``: the global RNG); engines leave the
        global RNG state untouched when a seed is given.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class Completion:
    """One sampled response: ``token_ids`` and per-token ``logprobs`` (same length), and why it ended.

    ``finish_reason`` is ``"stop"`` (the last token is a stop token) or ``"length"`` (the token
    budget ran out).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


class RolloutEngine(Protocol):
    """Samples completions of token-id prompts."""

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Completion]]:
        """``n`` completions of each prompt: ``result[i][k]`` is the ``k``-th completion of ``prompts[i]``."""
        ...

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the engine sample from ``model``'s current weights (after an optimizer step)."""
        ...


@dataclass
class _CachedContext:
    """One sequence's key/values as a previous call left them: ``tokens`` and, per layer, ``[heads, len(tokens), dim]``."""

    tokens: Tensor  # [L] long, on the CPU (compared against new prompts)
    keys: list[Tensor]
    values: list[Tensor]


# the key/value cache choices of HFGenerateEngine: "auto" is "static" for a CUDA model the static path
# supports, else "dynamic" (on the CPU the static path was not reliably faster with SmolLM2-135M,
# only with the tiny test model: benchmarks/RESULTS.md)
CACHES = ("auto", "dynamic", "static")
# the static path's masks are built here, in the form these attention implementations take
_STATIC_ATTENTION = ("sdpa", "eager")
# "auto" takes the static path only for these model families (tested: Qwen3 here, SmolLM2 is a
# Llama); cache="static" asks for it with any model static_supported() accepts
_AUTO_STATIC_MODELS = ("qwen3", "qwen2", "llama")
# static buffers are allocated for lengths rounded up to this, so that calls of nearby lengths reuse them
_LENGTH_STEP = 128


class _PreallocatedCache:
    """Per-layer key/value buffers ``[batch, kv_heads, length, head_dim]``, written in place.

    It is used through transformers' cache interface (the attention layers call :meth:`update`).

    A forward pass calls :meth:`update` once per layer with the new tokens' keys and values; they go
    to the columns ``column, column + 1, ...`` (a device tensor, so that a captured CUDA graph reads
    the current value on each replay) and the whole buffers are returned: columns not yet written
    hold stale numbers, which the attention mask hides.
    """

    def __init__(self, layers: int, batch: int, heads: int, length: int, dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.keys = [torch.zeros(batch, heads, length, dim, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.column = torch.zeros(1, dtype=torch.long, device=device)

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args,
               **kwargs) -> tuple[Tensor, Tensor]:
        index = self.column + torch.arange(key_states.shape[2], device=self.column.device)
        self.keys[layer_idx].index_copy_(2, index, key_states)
        self.values[layer_idx].index_copy_(2, index, value_states)
        return self.keys[layer_idx], self.values[layer_idx]


class _StaticDecoder:
    """The static path's state: key/values preallocated for ``batch`` rows of ``length`` columns, and the one-token step.

    The step forwards ``ids`` at ``positions`` (``[batch, 1]`` each) against ``mask`` (the 4-D mask
    the model's attention takes as it is: boolean for SDPA, additive for eager) and returns the
    last logits. With ``cuda_graph`` it is captured on its first call and replayed afterwards: the
    inputs are then changed in place, never replaced.
    """

    def __init__(self, model: torch.nn.Module, cache_kwarg: str, batch: int, length: int, cuda_graph: bool) -> None:
        config = model.config
        param = next(model.parameters())
        device, dtype = param.device, param.dtype
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.model, self.cache_kwarg, self.batch, self.length = model, cache_kwarg, batch, length
        self.cache = _PreallocatedCache(config.num_hidden_layers, batch, heads, length, dim, dtype, device)
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.positions = torch.zeros(batch, 1, dtype=torch.long, device=device)
        if base_attention(config) == "sdpa":  # True: attend
            self.visible, self.hidden = True, False
            self.mask = torch.zeros(batch, 1, 1, length, dtype=torch.bool, device=device)
        else:  # eager: added to the scores
            self.visible, self.hidden = 0.0, torch.finfo(dtype).min
            self.mask = torch.zeros(batch, 1, 1, length, dtype=dtype, device=device)
        self.requested = cuda_graph  # what the engine asked for (cuda_graph below turns False if capture fails)
        self.cuda_graph = cuda_graph and device.type == "cuda"
        self.graph = None
        self.logits: Tensor | None = None  # the captured graph's output

    def _forward(self) -> Tensor:
        out = self.model(input_ids=self.ids, position_ids=self.positions, attention_mask=self.mask, use_cache=True,
                         **{self.cache_kwarg: self.cache})
        return out.logits[:, -1]

    def _capture(self) -> None:
        # warm up on a side stream first (lazy initialisations, cuBLAS workspaces), as torch's CUDA
        # graph notes ask; the warm-up computes the very step to come (same inputs, same column)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA work of other threads (a data loader, a logger) does not break the capture
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self.logits = self._forward()
        self.graph = graph

    def step(self) -> Tensor:
        """``[batch, vocab]`` logits of the current ``ids`` (their keys and values go to column ``cache.column``)."""
        if not self.cuda_graph:
            return self._forward()
        if self.graph is None:
            try:
                self._capture()
            except Exception as err:  # an operation a graph cannot hold: decode eagerly (same numbers)
                import warnings

                warnings.warn(f"CUDA graph capture of the decode step failed, decoding eagerly: {err!r}", stacklevel=2)
                self.cuda_graph, self.graph = False, None
                return self._forward()
        self.graph.replay()
        return self.logits


class HFGenerateEngine:
    """Sampling with Hugging Face ``generate`` on the training model itself.

    Prompts are left-padded inside the engine (``generate`` appends on the right); position ids
    follow the attention mask, so padding does not move positions. The generation settings come
    only from :class:`SamplingParams`: the model's own ``generation_config`` (a checkpoint's
    ``top_k``, ``min_p``, ``repetition_penalty``...) and transformers' default ``top_k = 50`` are
    ignored, so the sampling distribution is exactly the documented one.

    The ``n`` completions of a prompt share its prefill (``share_prompts``): each distinct prompt
    but its last token is forwarded once, its key/value cache is repeated ``n`` times
    (``DynamicCache.batch_repeat_interleave``), and ``generate`` continues from it. Per group of
    ``n`` that forwards ``len(prompt) - 1`` prompt tokens instead of ``n`` times as many; the
    tokens drawn and their log-probabilities are those of the unshared path (tested equal).

    A multi-turn context grows by appending (response, then observation), so turn ``t + 1``'s
    prompt starts with turn ``t``'s prompt and response. With ``reuse_contexts`` the engine keeps
    each sequence's key/value cache after ``generate`` and, when a later prompt starts with a
    kept sequence's tokens (the longest common prefix over the kept ones), forwards only the rest
    of the prompt. Keys and values of a token depend only on the tokens before it (causal
    attention), so this is the same computation; the cached ones are laid out left-padded in
    the new batch, with the new tokens after them (padding holes are masked, positions follow
    the mask). Tested: the same tokens and log-probabilities (to 1e-9 in float64) as without.
    Kept sequences are dropped when a call extends them (its own sequences replace them), when
    more than ``max_cached`` would be kept or running (a call's own count while it runs; the
    least recently stored go first), and when the model's weights change (an optimizer step,
    :meth:`sync_weights`, a load). Only models whose cache is a plain ``DynamicCache`` of
    full-attention layers reuse; others (sliding windows, linear attention) take the plain path.

    ``cache="static"`` decodes without ``generate``: the batch's key/values (all its rows, each
    ``n`` times) go into buffers allocated once, of the prompt width plus ``max_new_tokens``
    (rounded up to a multiple of 128, so that later calls of nearby sizes reuse them), and a loop
    forwards one token per row and step against a mask that shows each row its prompt and the
    tokens drawn so far. The prefill (shared prompts, reused contexts) is the one above, computed
    in a ``DynamicCache`` and copied into the buffers, so reuse across turns works with both
    caches. Sampling repeats ``generate``'s: float32 logits, ``/ temperature``, top-``p``
    (transformers' own warper), one ``torch.multinomial`` over the whole batch per step, finished
    rows padded, a stop when every row has finished; so with a seed the two paths draw the same
    tokens (tested against ``cache="dynamic"``; the log-probabilities differ by float rounding:
    the attention sums over other lengths). On CUDA the decode step is captured as a CUDA graph
    (``cuda_graph``) on the first call of a batch shape and replayed, which removes the per-kernel
    launch cost of a 28-layer step. The buffers (and graph) of the last shape are kept between calls:
    ``2 * layers * batch * length * kv_heads * head_dim`` numbers, 4.2 GB for Qwen3-1.7B in bf16 at
    batch 32 and 1,152 columns; :meth:`sync_weights` drops them.

    Args:
      model: the causal LM (shared with the policy: no weight copy).
      pad_token_id: the id used for padding (any id; padding is masked).
      max_batch_size: at most this many sequences per ``generate`` call (whole groups of ``n``:
        at least one prompt's ``n`` completions per call).
      share_prompts: prefill each prompt once per group (``False``: ``n`` times, the reference path).
      reuse_contexts: keep sequences' key/values across calls and forward only a prompt's new
        tokens (``False``: every call prefills whole prompts, the reference path).
      max_cached: at most this many sequences' key/values, kept plus running (default
        ``max_batch_size``: one ``generate`` call's worth, 46 KB per token for SmolLM2-135M in
        float32). A rollout of more trajectories than this, in several calls per turn, reuses
        little: each call evicts the previous call's sequences.
      cache: one of :data:`CACHES`: ``"dynamic"`` decodes with ``generate`` (the reference path),
        ``"static"`` with the preallocated buffers (models whose layers all keep every key, with
        SDPA or eager attention); ``"auto"`` (default) is ``"static"`` when the model is on CUDA
        and supported, else ``"dynamic"`` (decided at each call, from where the model is then).
      cuda_graph: on CUDA, capture the static path's decode step as a CUDA graph (``False``: run
        it eagerly; it is always eager on the CPU).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        pad_token_id: int,
        *,
        max_batch_size: int = 64,
        share_prompts: bool = True,
        reuse_contexts: bool = True,
        max_cached: int | None = None,
        cache: str = "auto",
        cuda_graph: bool = True,
    ) -> None:
        if cache not in CACHES:
            raise ValueError(f"cache must be one of {CACHES}, got {cache!r}")
        self.model = model
        self.pad_token_id = int(pad_token_id)
        self.max_batch_size = int(max_batch_size)
        self.share_prompts = bool(share_prompts)
        self.reuse_contexts = bool(reuse_contexts)
        self.max_cached = self.max_batch_size if max_cached is None else int(max_cached)
        if self.max_cached < 0:
            raise ValueError(f"max_cached must be >= 0, got {self.max_cached}")
        self._cached: OrderedDict[int, _CachedContext] = OrderedDict()  # oldest first
        self._next_key = 0
        self._weights: tuple | None = None  # the weights the kept key/values were computed with
        self.cache = cache
        self.cuda_graph = bool(cuda_graph)
        self._static: _StaticDecoder | None = None  # the static path's buffers (and graph) of the last batch shape

    def sync_weights(self, model: torch.nn.Module) -> None:
        """The engine samples from the very module that is trained (swaps in ``model`` if it is another one); kept key/values are dropped."""
        self.model = model
        self._cached.clear()
        self._static = None

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Completion]]:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        weights = self._weights_version()
        if weights != self._weights:  # key/values of other weights are not this model's
            self._cached.clear()
            self._static = None  # a captured graph reads the weights' old storage (a load may have replaced it)
            self._weights = weights
        if params.seed is None:
            done = self._generate_all(prompts, n, params)
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(params.seed)
                done = self._generate_all(prompts, n, params)
        return [done[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _weights_version(self) -> tuple:
        # every in-place change (optimizer step, load_state_dict, copy_) bumps a tensor's version
        # counter; a swapped tensor changes its address
        return (id(self.model),) + tuple((p.data_ptr(), p._version, p.dtype) for p in self.model.parameters())

    def _generate_all(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[Completion]:
        out: list[Completion] = []
        per_call = max(1, self.max_batch_size // n)  # whole groups, so that a group shares one prefill
        for start in range(0, len(prompts), per_call):
            out.extend(self._generate_chunk(prompts[start : start + per_call], n, params))
        return out

    def static_supported(self) -> bool:
        """Whether the model can take the static path: every layer keeps every key, and SDPA or eager attention."""
        config = self.model.config
        return keeps_every_key(config) and base_attention(config) in _STATIC_ATTENTION

    def resolved_cache(self) -> str:
        """The cache the next call decodes with: ``"dynamic"`` or ``"static"`` (``"auto"`` resolved)."""
        if self.cache != "auto":
            return self.cache
        on_cuda = next(self.model.parameters()).device.type == "cuda"
        auto = getattr(self.model.config, "model_type", None) in _AUTO_STATIC_MODELS
        return "static" if on_cuda and auto and self.static_supported() else "dynamic"

    def _cache_kwarg(self) -> str:
        return cache_argument(self.model)

    def _reuses(self) -> bool:
        if not self.reuse_contexts or self.max_cached == 0:
            return False
        return keeps_every_key(self.model.config)

    def _match(self, prompt: list[int]) -> tuple[int | None, int]:
        """The kept sequence sharing the longest prefix with ``prompt``, and how many of its tokens to reuse (< ``len(prompt)``)."""
        best, best_len = None, 0
        p = torch.tensor(prompt[:-1], dtype=torch.long)  # the last prompt token is always forwarded (it gives the logits)
        for key, entry in self._cached.items():
            m = min(len(p), len(entry.tokens))
            if m <= best_len:
                continue
            differ = (p[:m] != entry.tokens[:m]).nonzero()
            common = int(differ[0]) if len(differ) else m
            if common > best_len:
                best, best_len = key, common
        return best, best_len

    def _prefill(self, prompts: list[list[int]], reuse: bool, running: int) -> tuple[Tensor, Tensor, object | None]:
        """``generate``'s inputs: ``input_ids``, ``attention_mask`` and a cache of all but the last column.

        ``running``: the number of sequences the call generates (``len(prompts)`` or ``n`` times that).
        Row ``r`` reuses ``c_r`` tokens of a kept sequence (0 without reuse) and forwards the other
        ``s_r = len - c_r`` itself. Columns: ``[0, P)`` the reused key/values, right-aligned
        (``P = max c_r``); ``[P, P + S)`` the new tokens, right-aligned (``S = max s_r``); the gaps
        are padding, masked. The cache covers every column but the last, which ``generate`` forwards.
        """
        from transformers import DynamicCache

        device = next(self.model.parameters()).device
        matches = [self._match(p) for p in prompts] if reuse else [(None, 0)] * len(prompts)
        P = max(c for _, c in matches)
        S = max(len(p) - c for p, (_, c) in zip(prompts, matches))
        width = P + S
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for r, (p, (_, c)) in enumerate(zip(prompts, matches)):
            ids = torch.tensor(p, dtype=torch.long)
            input_ids[r, P - c : P], attention_mask[r, P - c : P] = ids[:c], 1
            input_ids[r, width - (len(p) - c) :], attention_mask[r, width - (len(p) - c) :] = ids[c:], 1
        reused = []  # per layer: the rows' reused keys and values, [rows, heads, P, dim]
        if P > 0:
            first = next(self._cached[key] for key, c in matches if c > 0)
            for layer in range(len(first.keys)):
                kv = []
                for part in ("keys", "values"):
                    ref = getattr(first, part)[layer]
                    t = ref.new_zeros((len(prompts), ref.shape[0], P, ref.shape[2]))
                    for r, (key, c) in enumerate(matches):
                        if c > 0:
                            t[r, :, P - c :] = getattr(self._cached[key], part)[layer][:, :c]
                    kv.append(t)
                reused.append(kv)
        for key in {key for key, c in matches if key is not None}:  # extended now: this call's sequences replace them
            del self._cached[key]
        # the call's sequences count against max_cached while it runs: kept ones it does not extend
        # go first (oldest first), so kept and running key/values stay within the bound
        while self._cached and len(self._cached) + running > self.max_cached:
            self._cached.popitem(last=False)
        if width < 2:
            return input_ids, attention_mask, None
        cache = DynamicCache(config=self.model.config)
        for layer, (keys, values) in enumerate(reused):
            cache.update(keys, values, layer)
        if width - 1 > P:
            position_ids = (attention_mask.cumsum(1) - 1).masked_fill(attention_mask == 0, 0)  # as generate makes them
            self.model(input_ids=input_ids[:, P:-1].to(device), attention_mask=attention_mask[:, :-1].to(device),
                       position_ids=position_ids[:, P:-1].to(device), use_cache=True, **{self._cache_kwarg(): cache})
        return input_ids, attention_mask, cache

    def _keep(self, layers: list[tuple[Tensor, Tensor]], written: int, sequences: Tensor, attention_mask: Tensor,
              lengths: list[int]) -> None:
        """Keep each row's key/values: its prompt columns and its first ``lengths[b]`` new tokens.

        ``layers``: per layer, the ``[rows, heads, columns, dim]`` keys and values of the call;
        ``written``: how many columns hold real key/values (the prompt's, then one per forwarded token).
        """
        width = attention_mask.shape[1]
        device = layers[0][0].device
        for b in range(sequences.shape[0]):
            kept = min(lengths[b], written - width)  # the last sampled token was never forwarded
            columns = torch.cat([attention_mask[b].nonzero()[:, 0], torch.arange(width, width + kept)])
            index = columns.to(device)
            self._cached[self._next_key] = _CachedContext(
                sequences[b, columns].cpu(),
                [keys[b].index_select(1, index) for keys, _ in layers],
                [values[b].index_select(1, index) for _, values in layers],
            )
            self._next_key += 1
            while len(self._cached) > self.max_cached:
                self._cached.popitem(last=False)

    def _generate_chunk(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[Completion]:
        reuse = self._reuses()
        share = self.share_prompts and n > 1
        static = self.resolved_cache() == "static"
        if static and not self.static_supported():
            impl = self.model.config._attn_implementation
            raise ValueError("cache='static' needs a model whose layers all keep every key (no sliding window or "
                             f"linear attention) and SDPA or eager attention; got {impl!r}")
        repeat = 1
        if reuse or share or static:
            rows = prompts if share else [p for p in prompts for _ in range(n)]
            input_ids, attention_mask, cache = self._prefill(rows, reuse, len(prompts) * n)
            if share:
                input_ids, attention_mask = input_ids.repeat_interleave(n, 0), attention_mask.repeat_interleave(n, 0)
                repeat = n
                if cache is not None and not static:  # the static path repeats it while copying it into its buffers
                    cache.batch_repeat_interleave(n)
        else:  # the reference path: whole left-padded prompts, generate prefills them
            width = max(len(p) for p in prompts)
            input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
            attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
            for i, p in enumerate(prompts):
                input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
                attention_mask[i, width - len(p) :] = 1
            input_ids, attention_mask, cache = input_ids.repeat_interleave(n, 0), attention_mask.repeat_interleave(n, 0), None
        if static:
            new_tokens, logps, layers, written = self._decode_static(input_ids, attention_mask, cache, repeat, params)
        else:
            new_tokens, logps, layers, written = self._decode_generate(input_ids, attention_mask, cache, params)
        completions = []
        stop_set = set(params.stop_token_ids)
        for i in range(new_tokens.shape[0]):
            tokens = new_tokens[i].tolist()
            end = next((k + 1 for k, t in enumerate(tokens) if t in stop_set), None)
            reason = "stop" if end is not None else "length"
            end = end if end is not None else len(tokens)
            completions.append(Completion(tokens[:end], logps[i, :end].tolist(), reason))
        if reuse and layers is not None:
            sequences = torch.cat([input_ids, new_tokens], dim=1)
            self._keep(layers, written, sequences, attention_mask, [len(c.token_ids) for c in completions])
        return completions

    def _decode_generate(self, input_ids: Tensor, attention_mask: Tensor, cache: object | None,
                         params: SamplingParams) -> tuple[Tensor, Tensor, list[tuple[Tensor, Tensor]] | None, int]:
        """The reference decoding: ``generate`` continues ``input_ids`` from ``cache`` (its columns but the last).

        Returns the new tokens ``[rows, steps]`` and their log-probabilities (on the CPU), and the
        per-layer key/values with the number of columns written (``None`` where the cache is not a
        plain ``DynamicCache``).
        """
        from transformers import DynamicCache, GenerationConfig

        width = input_ids.shape[1]
        prefilled = {} if cache is None else {self._cache_kwarg(): cache}
        greedy = params.temperature == 0
        stops = list(params.stop_token_ids)
        config = GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p,
            top_k=0,  # 0 disables top-k; None would fall back to the model default (50)
            max_new_tokens=params.max_new_tokens,
            eos_token_id=stops or None,
            pad_token_id=self.pad_token_id,
            return_dict_in_generate=True,
            # scores: after temperature and top-p (the sampling distribution); logits: raw (greedy)
            output_scores=not greedy,
            output_logits=greedy,
        )
        # generate fills every unset field from model.generation_config (e.g. a checkpoint's top_k,
        # min_p or repetition_penalty); swap in a neutral one so only SamplingParams apply
        device = next(self.model.parameters()).device
        model_config = self.model.generation_config
        self.model.generation_config = GenerationConfig()
        try:
            result = self.model.generate(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), generation_config=config,
                **prefilled,
            )
        finally:
            self.model.generation_config = model_config
        new_tokens = result.sequences[:, width:]
        steps = result.logits if greedy else result.scores
        # [B, S]: log-prob of each generated token under the distribution it was drawn from, one
        # step at a time (a [B, S, V] stack would be gigabytes for real vocabularies)
        logps = torch.stack(
            [
                torch.log_softmax(step.to(torch.promote_types(step.dtype, torch.float32)), dim=-1)
                .gather(1, new_tokens[:, k, None])
                .squeeze(1)
                for k, step in enumerate(steps)
            ],
            dim=1,
        ).cpu()
        out_cache = output_cache(result)
        if not isinstance(out_cache, DynamicCache):
            return new_tokens.cpu(), logps, None, 0
        layers = [(layer.keys, layer.values) for layer in out_cache.layers]
        return new_tokens.cpu(), logps, layers, layers[0][0].shape[2]

    def _static_decoder(self, batch: int, length: int) -> _StaticDecoder:
        """The buffers for ``batch`` rows of ``length`` columns: those of the last call when they fit, else new ones."""
        length = -(-length // _LENGTH_STEP) * _LENGTH_STEP
        st, param = self._static, next(self.model.parameters())
        reusable = (st is not None and st.model is self.model and st.batch == batch and st.length == length
                    and st.requested == self.cuda_graph and st.ids.device == param.device
                    and st.cache.keys[0].dtype == param.dtype)
        if not reusable:
            self._static = None  # free the old buffers (and graph) before allocating new ones
            self._static = _StaticDecoder(self.model, self._cache_kwarg(), batch, length, self.cuda_graph)
        return self._static

    def _decode_static(self, input_ids: Tensor, attention_mask: Tensor, cache: object | None, repeat: int,
                       params: SamplingParams) -> tuple[Tensor, Tensor, list[tuple[Tensor, Tensor]], int]:
        """The static path's decoding: what :meth:`_decode_generate` returns, with preallocated key/values.

        ``cache``: the prefill's ``DynamicCache`` of all but the last column, one row per
        ``repeat`` rows of ``input_ids`` (shared prompts), or ``None`` (one-column prompts).
        """
        from transformers.generation.logits_process import TopPLogitsWarper

        rows, width = input_ids.shape
        steps = params.max_new_tokens
        # columns: the prompt's but the last, then one per forwarded token (the last column of the
        # prompt first, then every sampled token but the last)
        st = self._static_decoder(rows, width - 1 + steps)
        device = st.ids.device
        if cache is not None:
            for layer, (keys, values) in enumerate(zip(st.cache.keys, st.cache.values)):
                for buffer, prefix in ((keys, cache.layers[layer].keys), (values, cache.layers[layer].values)):
                    # row r of the prefill fills rows r * repeat ... (r + 1) * repeat - 1
                    buffer[:, :, : width - 1].unflatten(0, (-1, repeat)).copy_(prefix.unsqueeze(1))
        mask = attention_mask.to(device).bool()
        st.mask.fill_(st.hidden)
        st.mask[:, 0, 0, :width].masked_fill_(mask, st.visible)
        # positions follow the mask, as generate makes them: the last prompt token's is the count of
        # real tokens before it, and each step adds one
        st.positions.copy_(mask.long().sum(1, keepdim=True) - 1)
        st.ids.copy_(input_ids[:, -1:])
        st.cache.column.fill_(width - 1)

        greedy = params.temperature == 0
        top_p = TopPLogitsWarper(params.top_p) if not greedy and params.top_p < 1.0 else None
        stops = torch.tensor(params.stop_token_ids, dtype=torch.long, device=device) if params.stop_token_ids else None
        unfinished = torch.ones(rows, dtype=torch.bool, device=device)
        tokens = torch.full((rows, steps), self.pad_token_id, dtype=torch.long, device=device)
        logps = torch.zeros((rows, steps), dtype=torch.float32, device=device)
        taken = 0
        for k in range(steps):
            if k > 0:  # the token forwarded now sits in column width - 1 + k: show it to its row
                st.mask[:, 0, 0, width - 1 + k] = st.visible
            logits = st.step().to(dtype=torch.float32, copy=True)  # what generate samples from
            if greedy:
                scores = logits
                next_tokens = torch.argmax(scores, dim=-1)
            else:
                scores = logits / params.temperature if params.temperature != 1.0 else logits
                if top_p is not None:
                    scores = top_p(None, scores)
                next_tokens = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
            logps[:, k] = torch.log_softmax(scores, dim=-1).gather(1, next_tokens[:, None]).squeeze(1)
            if stops is not None:  # finished rows get padding, as in generate
                next_tokens = torch.where(unfinished, next_tokens, self.pad_token_id)
                unfinished &= ~torch.isin(next_tokens, stops)
            tokens[:, k] = next_tokens
            taken = k + 1
            if taken == steps or (stops is not None and not bool(unfinished.any())):
                break
            st.ids.copy_(next_tokens[:, None])
            st.positions.add_(1)
            st.cache.column.add_(1)
        layers = list(zip(st.cache.keys, st.cache.values))
        return tokens[:, :taken].cpu(), logps[:, :taken].cpu(), layers, width - 1 + taken
