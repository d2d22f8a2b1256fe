"""Shared by the language-model tests: no downloads, a tiny Qwen3.

Each test module starts with ``pytest.importorskip("transformers")`` (a conftest cannot skip
itself when its folder is named on the command line), so without the ``llm`` extra the whole
folder is skipped with the reason shown by ``pytest -rs``. Nothing here imports transformers
at import time. The tiny models are built once per session; tests must not change their
weights in place (deep-copy first).
"""

from __future__ import annotations

import os

import pytest

import torch

from seeupo.core.batch import SampleBatch
from seeupo.llm.models import tiny_qwen3
from seeupo.llm.layout import pack_rows

os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture(scope="session")
def tiny32():
    """``(model, tokenizer)``: the tiny Qwen3 in float32."""
    return tiny_qwen3(seed=0, dtype=torch.float32)


@pytest.fixture(scope="session")
def tiny64():
    """``(model, tokenizer)``: the same tiny Qwen3 in float64 (for tight comparisons)."""
    return tiny_qwen3(seed=0, dtype=torch.float64)


def lm_batch(
    contexts: list[list[int]],
    responses: list[list[int]],
    *,
    valid: list[bool] | None = None,
    logp_old: torch.Tensor | None = None,
    pad_token_id: int = 0,
    dtype: torch.dtype = torch.float64,
) -> SampleBatch:
    """A one-turn-per-trajectory batch in the LLM layout from token lists."""
    n = len(contexts)
    L = max(1, max(len(r) for r in responses))
    mask = torch.zeros(n, L, dtype=torch.bool)
    for i, r in enumerate(responses):
        mask[i, : len(r)] = True
    zeros = torch.zeros(n, dtype=dtype)
    return SampleBatch(
        traj_id=torch.arange(n),
        group_id=torch.zeros(n, dtype=torch.long),
        turn=torch.zeros(n, dtype=torch.long),
        logp_old=logp_old if logp_old is not None else torch.zeros(n, L, dtype=dtype),
        token_mask=mask,
        valid=torch.tensor(valid if valid is not None else [True] * n),
        reward=zeros,
        traj_return=zeros,
        weight=zeros + 1,
        instance=torch.zeros(n, dtype=torch.long),
        data=pack_rows(contexts, responses, pad_token_id),
    )


@pytest.fixture(name="lm_batch")
def _lm_batch_fixture():
    """The :func:`lm_batch` helper, as a fixture (avoids importing conftest by name)."""
    return lm_batch


def sample_prompts(tokenizer) -> list[list[int]]:
    """Three prompts of different lengths (one of a single token) for rollout-engine tests."""
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    return [enc("hello there"), enc("The quick brown fox jumps over the lazy dog."), enc("x")]


def score_completions(model, prompts, results, tau: float):
    """``(policy logps, engine logps, batch)`` of every completion of an engine's ``generate`` result.

    The policy scores each (prompt, completion) at temperature ``tau``; the engine's reported
    log-probabilities are laid out the same way (``[n, L]``, 0 on padding).
    """
    from seeupo.llm.policy import CausalLMPolicy

    contexts, responses, logps = [], [], []
    for prompt, completions in zip(prompts, results):
        for c in completions:
            contexts.append(prompt)
            responses.append(c.token_ids)
            logps.append(c.logprobs)
    batch = lm_batch(contexts, responses, dtype=model.dtype)
    with torch.no_grad():
        got = CausalLMPolicy(model, temperature=tau, micro_batch_rows=8).token_logps(batch)
    engine = torch.zeros_like(got)
    for i, lp in enumerate(logps):
        engine[i, : len(lp)] = torch.tensor(lp, dtype=got.dtype)
    return got, engine, batch


@pytest.fixture(name="sample_prompts")
def _sample_prompts_fixture():
    """The :func:`sample_prompts` helper, as a fixture."""
    return sample_prompts


@pytest.fixture
def attention_calls(monkeypatch) -> list[int]:
    """``[n]``: how often the tree attention kernel ran since the test last set ``n`` (every
    layer's attention call of a packed pass goes through it)."""
    from seeupo.llm import tree_attention

    calls = [0]
    kernel = tree_attention.tree_attention

    def counted(*args, **kwargs):
        calls[0] += 1
        return kernel(*args, **kwargs)

    monkeypatch.setattr(tree_attention, "tree_attention", counted)
    return calls


@pytest.fixture(name="score_completions")
def _score_completions_fixture():
    """The :func:`score_completions` helper, as a fixture."""
    return score_completions
