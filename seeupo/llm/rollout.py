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

import inspect
from dataclasses import dataclass
from typing import Protocol

import torch

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

    Args:
      model: the causal LM (shared with the policy: no weight copy).
      pad_token_id: the id used for padding (any id; padding is masked).
      max_batch_size: at most this many sequences per ``generate`` call (whole groups of ``n``:
        at least one prompt's ``n`` completions per call).
      share_prompts: prefill each prompt once per group (``False``: ``n`` times, the reference path).
    """

    def __init__(
        self, model: torch.nn.Module, pad_token_id: int, *, max_batch_size: int = 64, share_prompts: bool = True
    ) -> None:
        self.model = model
        self.pad_token_id = int(pad_token_id)
        self.max_batch_size = int(max_batch_size)
        self.share_prompts = bool(share_prompts)

    def sync_weights(self, model: torch.nn.Module) -> None:
        """No-op: the engine samples from the very module that is trained. Swaps in ``model`` if it is another one."""
        self.model = model

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Completion]]:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if params.seed is None:
            done = self._generate_all(prompts, n, params)
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(params.seed)
                done = self._generate_all(prompts, n, params)
        return [done[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _generate_all(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[Completion]:
        out: list[Completion] = []
        per_call = max(1, self.max_batch_size // n)  # whole groups, so that a group shares one prefill
        for start in range(0, len(prompts), per_call):
            out.extend(self._generate_chunk(prompts[start : start + per_call], n, params))
        return out

    def _prefilled(self, input_ids: Tensor, attention_mask: Tensor, n: int) -> dict[str, object]:
        """``generate``'s ``past_key_values``: the prompts but their last token, forwarded once and repeated ``n`` times."""
        if not self.share_prompts or n == 1 or input_ids.shape[1] < 2:  # nothing to share
            return {}
        from transformers import DynamicCache

        device = next(self.model.parameters()).device
        position_ids = (attention_mask.cumsum(1) - 1).clamp_min(0)
        cache = DynamicCache(config=self.model.config)
        # transformers >= 5.24 names it `cache` (`past_key_values` is deprecated); older ones `past_key_values`
        name = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        self.model(input_ids=input_ids[:, :-1].to(device), attention_mask=attention_mask[:, :-1].to(device),
                   position_ids=position_ids[:, :-1].to(device), use_cache=True, **{name: cache})
        cache.batch_repeat_interleave(n)
        return {name: cache}

    def _generate_chunk(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[Completion]:
        from transformers import GenerationConfig

        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention_mask[i, width - len(p) :] = 1
        prefilled = self._prefilled(input_ids, attention_mask, n)
        input_ids, attention_mask = input_ids.repeat_interleave(n, 0), attention_mask.repeat_interleave(n, 0)
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
        return completions
