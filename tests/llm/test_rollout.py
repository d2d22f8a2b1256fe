"""HFGenerateEngine: token-in/token-out, engine log-probs equal the policy's, stops, seeds, greedy."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers", reason="tests/llm need transformers and tokenizers (pip install -e '.[llm]')")
pytest.importorskip("tokenizers", reason="tests/llm need transformers and tokenizers (pip install -e '.[llm]')")

from seeupo.llm.policy import CausalLMPolicy
from seeupo.llm.rollout import HFGenerateEngine, SamplingParams


@pytest.mark.parametrize("dtype_name,tol", [("float32", 1e-5), ("float64", 2e-6)])
def test_engine_logprobs_equal_the_policy(tiny32, tiny64, dtype_name, tol, sample_prompts, score_completions):
    # float64 is not tighter than ~1e-6: generate casts logits to float32 (rollout module docstring)
    model, tokenizer = tiny64 if dtype_name == "float64" else tiny32
    prompts = sample_prompts(tokenizer)
    params = SamplingParams(temperature=0.9, max_new_tokens=12, stop_token_ids=(tokenizer.eos_token_id,), seed=3)
    results = HFGenerateEngine(model, tokenizer.pad_token_id, max_batch_size=4).generate(prompts, 3, params)
    assert [len(r) for r in results] == [3, 3, 3]
    for completions in results:
        for c in completions:
            assert len(c.token_ids) == len(c.logprobs) and 1 <= len(c.token_ids) <= 12
            assert c.finish_reason == ("stop" if c.token_ids[-1] == tokenizer.eos_token_id else "length")
            assert tokenizer.eos_token_id not in c.token_ids[:-1]
    got, engine, batch = score_completions(model, prompts, results, 0.9)
    assert (got - engine).abs().max() < tol
    # the policy at another temperature does not match: the ratio needs the sampling temperature
    other = CausalLMPolicy(model, temperature=1.0).token_logps(batch).detach()
    assert (other - engine).abs().max() > 1e-3


def test_model_generation_config_does_not_leak(tiny32, sample_prompts, score_completions):
    model, tokenizer = tiny32
    model = copy.deepcopy(model)
    # a checkpoint's sampling defaults: they must not change the engine's distribution
    model.generation_config.top_k = 5
    model.generation_config.repetition_penalty = 2.0
    prompts = sample_prompts(tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=2)
    results = HFGenerateEngine(model, tokenizer.pad_token_id).generate(prompts, 2, params)
    got, engine, _ = score_completions(model, prompts, results, 1.0)
    assert (got - engine).abs().max() < 1e-5
    assert model.generation_config.top_k == 5  # and the model's own config is restored


@pytest.mark.parametrize(
    "bad", [dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(max_new_tokens=0)]
)
def test_sampling_params_are_validated(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_seed_reproduces_and_leaves_global_rng_alone(tiny32, sample_prompts):
    model, tokenizer = tiny32
    engine = HFGenerateEngine(model, tokenizer.pad_token_id)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=11)
    state = torch.get_rng_state()
    a = engine.generate(sample_prompts(tokenizer), 2, params)
    assert torch.equal(torch.get_rng_state(), state)
    b = engine.generate(sample_prompts(tokenizer), 2, params)
    c = engine.generate(sample_prompts(tokenizer), 2, SamplingParams(temperature=1.0, max_new_tokens=8, seed=12))
    ids = lambda r: [x.token_ids for group in r for x in group]  # noqa: E731
    assert ids(a) == ids(b)
    assert ids(a) != ids(c)


def test_stop_tokens_and_length(tiny32, sample_prompts):
    model, tokenizer = tiny32
    engine = HFGenerateEngine(model, tokenizer.pad_token_id)
    everything = tuple(range(len(tokenizer)))
    stopped = engine.generate(sample_prompts(tokenizer), 2, SamplingParams(max_new_tokens=5, stop_token_ids=everything, seed=0))
    assert all(len(c.token_ids) == 1 and c.finish_reason == "stop" for g in stopped for c in g)
    running = engine.generate(sample_prompts(tokenizer), 2, SamplingParams(max_new_tokens=5, stop_token_ids=(), seed=0))
    assert all(len(c.token_ids) == 5 and c.finish_reason == "length" for g in running for c in g)


def test_top_p_logprobs_are_of_the_truncated_distribution(tiny32, sample_prompts, score_completions):
    model, tokenizer = tiny32
    prompts = sample_prompts(tokenizer)
    params = SamplingParams(temperature=1.0, top_p=0.5, max_new_tokens=6, seed=5)
    results = HFGenerateEngine(model, tokenizer.pad_token_id).generate(prompts, 2, params)
    got, engine, batch = score_completions(model, prompts, results, 1.0)
    mask = batch.token_mask
    # renormalising over the nucleus makes every sampled token more likely than under the full softmax
    assert torch.all(engine[mask] >= got[mask] - 1e-5)
    assert torch.any(engine[mask] > got[mask] + 1e-3)


def test_greedy_is_the_argmax_and_padding_free(tiny64, sample_prompts, score_completions):
    model, tokenizer = tiny64
    prompts = sample_prompts(tokenizer)
    engine = HFGenerateEngine(model, tokenizer.pad_token_id)
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    together = engine.generate(prompts, 1, params)
    alone = [engine.generate([p], 1, params)[0] for p in prompts]
    # left padding inside the engine does not change a prompt's continuation
    assert [g[0].token_ids for g in together] == [g[0].token_ids for g in alone]
    got, logps, _ = score_completions(model, prompts, together, 1.0)
    assert (got - logps).abs().max() < 2e-6
    for prompt, group in zip(prompts, together):
        ids = torch.tensor([prompt + group[0].token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0]
        argmax = logits[len(prompt) - 1 : -1].argmax(-1).tolist()
        assert argmax == group[0].token_ids


def test_sync_weights_is_a_no_op_for_the_shared_module(tiny32):
    model, tokenizer = tiny32
    engine = HFGenerateEngine(model, tokenizer.pad_token_id)
    engine.sync_weights(model)
    assert engine.model is model


def test_empty_prompt_is_rejected(tiny32):
    model, tokenizer = tiny32
    with pytest.raises(ValueError, match="at least one token"):
        HFGenerateEngine(model, tokenizer.pad_token_id).generate([[]], 1, SamplingParams())


def _counting(model):
    """Count the real tokens each forward call puts through ``model`` (its new positions under the attention mask)."""
    counted = []

    def hook(module, args, kwargs):
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
        counted.append(int(mask[:, mask.shape[1] - ids.shape[1]:].sum()))

    return counted, model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_shared_prompt_prefill_samples_the_same_tokens_and_forwards_fewer(tiny64, temperature):
    model, tokenizer = tiny64
    g = torch.Generator().manual_seed(0)
    vocab = len(tokenizer)
    prompts = [torch.randint(3, vocab, (length,), generator=g).tolist() for length in (30, 1, 17, 9)]
    params = SamplingParams(temperature=temperature, max_new_tokens=7, seed=4)
    n = 3
    results, counts = {}, {}
    for share in (False, True):
        counted, handle = _counting(model)
        try:
            engine = HFGenerateEngine(model, tokenizer.pad_token_id, max_batch_size=6, share_prompts=share)
            results[share] = engine.generate(prompts, n, params)
        finally:
            handle.remove()
        counts[share] = sum(counted)
    for unshared, shared in zip(results[False], results[True]):
        for a, b in zip(unshared, shared):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-9
    # each prompt's first len - 1 tokens are forwarded once instead of n times
    assert counts[False] - counts[True] == (n - 1) * sum(len(p) - 1 for p in prompts)
