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
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import torch

from seeupo.llm.models import cache_argument, keeps_every_key, output_cache

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
    ) -> None:
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

    def sync_weights(self, model: torch.nn.Module) -> None:
        """The engine samples from the very module that is trained (swaps in ``model`` if it is another one); kept key/values are dropped."""
        self.model = model
        self._cached.clear()

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Completion]]:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        weights = self._weights_version()
        if weights != self._weights:  # key/values of other weights are not this model's
            self._cached.clear()
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

    def _keep(self, cache: object, sequences: Tensor, attention_mask: Tensor, lengths: list[int]) -> None:
        """Keep each row's key/values: its prompt columns and its first ``lengths[b]`` new tokens."""
        width = attention_mask.shape[1]
        layers = cache.layers
        total = layers[0].keys.shape[2]
        for b in range(sequences.shape[0]):
            kept = min(lengths[b], total - width)  # the last sampled token was never forwarded
            columns = torch.cat([attention_mask[b].nonzero()[:, 0], torch.arange(width, width + kept)])
            index = columns.to(layers[0].keys.device)
            self._cached[self._next_key] = _CachedContext(
                sequences[b, columns].cpu(),
                [layer.keys[b].index_select(1, index) for layer in layers],
                [layer.values[b].index_select(1, index) for layer in layers],
            )
            self._next_key += 1
            while len(self._cached) > self.max_cached:
                self._cached.popitem(last=False)

    def _generate_chunk(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[Completion]:
        from transformers import DynamicCache, GenerationConfig

        reuse = self._reuses()
        share = self.share_prompts and n > 1
        if reuse or share:
            rows = prompts if share else [p for p in prompts for _ in range(n)]
            input_ids, attention_mask, cache = self._prefill(rows, reuse, len(prompts) * n)
            if share:
                input_ids, attention_mask = input_ids.repeat_interleave(n, 0), attention_mask.repeat_interleave(n, 0)
                if cache is not None:
                    cache.batch_repeat_interleave(n)
        else:  # the reference path: whole left-padded prompts, generate prefills them
            width = max(len(p) for p in prompts)
            input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
            attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
            for i, p in enumerate(prompts):
                input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
                attention_mask[i, width - len(p) :] = 1
            input_ids, attention_mask, cache = input_ids.repeat_interleave(n, 0), attention_mask.repeat_interleave(n, 0), None
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
        new_tokens = new_tokens.cpu()
        completions = []
        stop_set = set(stops)
        for i in range(new_tokens.shape[0]):
            tokens = new_tokens[i].tolist()
            end = next((k + 1 for k, t in enumerate(tokens) if t in stop_set), None)
            reason = "stop" if end is not None else "length"
            end = end if end is not None else len(tokens)
            completions.append(Completion(tokens[:end], logps[i, :end].tolist(), reason))
        if reuse:
            out_cache = output_cache(result)
            if isinstance(out_cache, DynamicCache):
                self._keep(out_cache, result.sequences.cpu(), attention_mask, [len(c.token_ids) for c in completions])
        return completions
