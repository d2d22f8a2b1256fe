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
        ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
        # generate drops an all-ones mask (one unpadded row); the static path's decode steps pass a
        # 4-D mask and forward one real token per row
        real = mask is None or mask.dim() == 4
        counted.append(ids.numel() if real else int(mask[:, mask.shape[1] - ids.shape[1]:].sum()))

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


def _turns(model, tokenizer, reuse: bool, temperature: float, *, max_cached: int | None = None):
    """Three turns of a multi-turn rollout: 4 prompts x 2 samples, each context then grows by its response and 0-5 new tokens.

    No stop tokens, so every response has ``max_new_tokens`` tokens. Returns the completions of each
    turn, the contexts each turn was given, and the real tokens each turn forwarded (all calls).
    """
    g = torch.Generator().manual_seed(1)
    vocab = len(tokenizer)
    prompts = [torch.randint(3, vocab, (length,), generator=g).tolist() for length in (30, 1, 17, 9)]
    engine = HFGenerateEngine(model, tokenizer.pad_token_id, max_batch_size=8, reuse_contexts=reuse, max_cached=max_cached)
    turns, contexts, counts = [], [], []
    context = None
    for t in range(3):
        params = SamplingParams(temperature=temperature, max_new_tokens=5, seed=10 + t)
        counted, handle = _counting(model)
        try:
            if t == 0:
                out = [c for group in engine.generate(prompts, 2, params) for c in group]
                context = [p for p in prompts for _ in range(2)]
            else:
                out = [group[0] for group in engine.generate(context, 1, params)]
        finally:
            handle.remove()
        turns.append(out)
        contexts.append(context)
        counts.append(sum(counted))
        extra = [torch.randint(3, vocab, (int(k),), generator=g).tolist() for k in torch.randint(0, 6, (len(out),), generator=g)]
        context = [c + o.token_ids + e for c, o, e in zip(context, out, extra)]
    return turns, contexts, counts


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_context_reuse_samples_the_same_tokens_and_forwards_only_new_tokens(tiny64, temperature):
    model, tokenizer = tiny64
    plain, contexts, plain_counts = _turns(model, tokenizer, False, temperature)
    reused, contexts_r, reused_counts = _turns(model, tokenizer, True, temperature)
    assert contexts == contexts_r
    for a_turn, b_turn in zip(plain, reused):
        for a, b in zip(a_turn, b_turn):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason == "length"
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-9
    assert reused_counts[0] == plain_counts[0]  # nothing kept yet (both share the first prompt's prefill)
    for t in (1, 2):
        # the previous turn kept its context and all but the last response token, so a row forwards
        # len(context) - (len(previous context) + 5 - 1) tokens, unless nothing was appended but the
        # response (then the last prompt token is forwarded again: it gives the first logits)
        saved = sum(min(len(prev) + 4, len(now) - 1) for prev, now in zip(contexts[t - 1], contexts[t]))
        assert plain_counts[t] - reused_counts[t] == saved > 0


def _common(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_context_reuse_keeps_at_most_max_cached_sequences(tiny64):
    model, tokenizer = tiny64
    plain, contexts, plain_counts = _turns(model, tokenizer, False, 0.9)
    reused, _, reused_counts = _turns(model, tokenizer, True, 0.9, max_cached=3)
    assert [[c.token_ids for c in turn] for turn in plain] == [[c.token_ids for c in turn] for turn in reused]
    for t in (1, 2):
        # only the last 3 sequences of the previous call are kept (context and all but the last
        # response token); a row whose own was dropped reuses what it shares with a kept one (its
        # sibling's first prompt)
        kept = [c + o.token_ids[:4] for c, o in list(zip(contexts[t - 1], plain[t - 1]))[-3:]]
        saved = sum(max(min(_common(now, k), len(now) - 1) for k in kept) for now in contexts[t])
        assert plain_counts[t] - reused_counts[t] == saved
        own = sum(min(len(prev) + 4, len(now) - 1) for prev, now in list(zip(contexts[t - 1], contexts[t]))[-3:])
        assert saved == own + 17  # rows 5-7 their own; row 4 the 17-token prompt it shares with row 5


def test_context_reuse_of_a_shorter_or_diverging_prefix(tiny64):
    model, tokenizer = tiny64
    g = torch.Generator().manual_seed(2)
    first = torch.randint(3, len(tokenizer), (20,), generator=g).tolist()
    # the same prompt again (a second episode of the task), and one that leaves it after 12 tokens
    again, other = list(first), first[:12] + torch.randint(3, len(tokenizer), (6,), generator=g).tolist()
    params = SamplingParams(temperature=0.9, max_new_tokens=4, seed=3)
    results, counts = {}, {}
    for reuse in (False, True):
        engine = HFGenerateEngine(model, tokenizer.pad_token_id, reuse_contexts=reuse)
        engine.generate([first], 1, params)
        counted, handle = _counting(model)
        try:
            results[reuse] = engine.generate([again, other], 1, params)
        finally:
            handle.remove()
        counts[reuse] = sum(counted)
    for a, b in zip(results[False], results[True]):
        assert a[0].token_ids == b[0].token_ids
        assert max(abs(x - y) for x, y in zip(a[0].logprobs, b[0].logprobs)) < 1e-9
    # `again` reuses 19 tokens (its last is forwarded for the logits); `other` 12; the first call's
    # sequence is replaced by the two new ones, so both matched it
    assert counts[False] - counts[True] == 19 + 12


def test_context_reuse_is_dropped_when_the_weights_change(tiny64):
    model, tokenizer = tiny64
    model = copy.deepcopy(model)
    prompt = torch.randint(3, len(tokenizer), (15,), generator=torch.Generator().manual_seed(4)).tolist()
    params = SamplingParams(temperature=0.9, max_new_tokens=4, seed=5)
    engine = HFGenerateEngine(model, tokenizer.pad_token_id)
    first = engine.generate([prompt], 1, params)[0][0]
    with torch.no_grad():  # an optimizer step, in place
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(6), dtype=p.dtype))
    longer = prompt + first.token_ids + [5, 6]
    counted, handle = _counting(model)
    try:
        got = engine.generate([longer], 1, params)[0][0]
    finally:
        handle.remove()
    want = HFGenerateEngine(model, tokenizer.pad_token_id, reuse_contexts=False).generate([longer], 1, params)[0][0]
    assert got.token_ids == want.token_ids
    assert max(abs(x - y) for x, y in zip(got.logprobs, want.logprobs)) < 1e-9
    # the prefill forwards the whole prompt but its last token (then generate's first step): nothing
    # of the old weights is reused (it would forward 2, the last response token and 5)
    assert counted[:2] == [len(longer) - 1, 1]


def test_context_reuse_counts_a_running_call_against_max_cached(tiny64):
    model, tokenizer = tiny64
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, len(tokenizer), (length,), generator=g).tolist() for length in (12, 8, 5)]
    engine = HFGenerateEngine(model, tokenizer.pad_token_id, max_cached=4)
    params = SamplingParams(temperature=0.9, max_new_tokens=3, seed=0)
    held = []  # kept sequences + the rows of the running call, at each forward
    handle = model.register_forward_pre_hook(lambda m, a, kw: held.append(len(engine._cached) + kw["input_ids"].shape[0]),
                                             with_kwargs=True)
    try:
        engine.generate(prompts[:2], 1, params)  # keeps 2
        engine.generate(prompts[2:], 3, params)  # 3 running: the older of the 2 kept is evicted first; keeps 4
        engine.generate(prompts[:1], 1, params)  # 1 running: extends none of the 4, the oldest is evicted first
    finally:
        handle.remove()
    assert held[0] == 2 and max(held) == 4
    assert len(engine._cached) == 4


def test_sliding_window_models_take_the_plain_path(tiny64):
    # a sliding-window layer keeps only the last tokens' key/values: nothing to reuse, so the engine
    # prefills whole prompts, as without reuse (same forwards, same samples)
    from transformers import Qwen3ForCausalLM

    model, tokenizer = tiny64
    config = copy.deepcopy(model.config)
    config.use_sliding_window, config.sliding_window = True, 8
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    sliding = Qwen3ForCausalLM(config).to(torch.float64).eval()
    sliding.load_state_dict(model.state_dict())
    prompt = torch.randint(3, len(tokenizer), (20,), generator=torch.Generator().manual_seed(8)).tolist()
    params = SamplingParams(temperature=0.9, max_new_tokens=4, seed=9)
    results, counts = {}, {}
    for reuse in (False, True):
        engine = HFGenerateEngine(sliding, tokenizer.pad_token_id, reuse_contexts=reuse)
        first = engine.generate([prompt], 1, params)[0][0]
        counted, handle = _counting(sliding)
        try:
            results[reuse] = engine.generate([prompt + first.token_ids + [5]], 1, params)[0][0]
        finally:
            handle.remove()
        counts[reuse] = counted
    assert results[True].token_ids == results[False].token_ids
    assert counts[True] == counts[False] and counts[True][0] == 20 + 4 + 1


def _random_prompts(tokenizer, lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, len(tokenizer), (length,), generator=g).tolist() for length in lengths]


def _assert_same(reference, static, tol):
    """Same tokens and finish reasons, log-probabilities within ``tol``; returns the largest difference."""
    worst = 0.0
    for ref_group, st_group in zip(reference, static, strict=True):
        for a, b in zip(ref_group, st_group, strict=True):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
            worst = max([worst] + [abs(x - y) for x, y in zip(a.logprobs, b.logprobs)])
    assert worst < tol
    return worst


# the static path against the reference (generate with a DynamicCache): same tokens, and log-probs to
# float32 rounding (measured over these cases: at most 4.8e-7 in float32, one rounding step at
# |log p| ~ 4-8, since the attention sums run over other lengths; 0 in float64, where generate's
# float32 logits absorb the difference); asserted < 1e-6
STATIC_CASES = {
    "sampled": dict(temperature=0.9, max_new_tokens=9, seed=3),
    "greedy": dict(temperature=0.0, max_new_tokens=7),
    "top_p": dict(temperature=1.0, top_p=0.6, max_new_tokens=8, seed=5),
    "stops": dict(temperature=1.3, max_new_tokens=12, stop_token_ids=(5, 9, 17, 40, 77), seed=1),
    "one_token": dict(temperature=0.8, max_new_tokens=1, seed=2),
}


@pytest.mark.parametrize("case", sorted(STATIC_CASES))
@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
@pytest.mark.parametrize("share", [True, False])
def test_static_cache_samples_the_same_tokens_as_the_reference(tiny32, tiny64, case, dtype_name, share):
    model, tokenizer = tiny64 if dtype_name == "float64" else tiny32
    prompts = _random_prompts(tokenizer, (30, 1, 17, 9), seed=0)
    params = SamplingParams(**STATIC_CASES[case])
    out = {}
    for cache in ("dynamic", "static"):
        engine = HFGenerateEngine(model, tokenizer.pad_token_id, max_batch_size=6, share_prompts=share,
                                  reuse_contexts=False, cache=cache)
        out[cache] = engine.generate(prompts, 3, params)  # 2 calls: 2 prompts x 3, then 2 x 3
    _assert_same(out["dynamic"], out["static"], 1e-6)
    if case == "stops":  # the case exercises both endings
        reasons = {c.finish_reason for g in out["static"] for c in g}
        assert reasons == {"stop", "length"}


def test_static_cache_logprobs_equal_the_policy(tiny32, sample_prompts, score_completions):
    model, tokenizer = tiny32
    prompts = sample_prompts(tokenizer)
    params = SamplingParams(temperature=0.9, max_new_tokens=12, stop_token_ids=(tokenizer.eos_token_id,), seed=3)
    results = HFGenerateEngine(model, tokenizer.pad_token_id, cache="static").generate(prompts, 3, params)
    got, engine, _ = score_completions(model, prompts, results, 0.9)
    assert (got - engine).abs().max() < 1e-5


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_static_cache_with_context_reuse_across_turns(tiny64, temperature, monkeypatch):
    # reuse keeps key/values from the static buffers and prefills later turns from them: the same
    # tokens and forwarded token counts as the dynamic reference with reuse, and as no reuse at all
    model, tokenizer = tiny64
    plain, contexts, plain_counts = _turns(model, tokenizer, False, temperature)
    monkeypatch.setattr(HFGenerateEngine, "resolved_cache", lambda self: "static")
    static, contexts_s, static_counts = _turns(model, tokenizer, True, temperature)
    assert contexts == contexts_s
    for a_turn, b_turn in zip(plain, static):
        _assert_same([a_turn], [b_turn], 1e-9)
    for t in (1, 2):
        saved = sum(min(len(prev) + 4, len(now) - 1) for prev, now in zip(contexts[t - 1], contexts[t]))
        # the static path forwards a prompt's last token in its first step, as generate does
        assert plain_counts[t] - static_counts[t] == saved > 0


def test_static_buffers_are_reused_and_dropped(tiny32):
    model, tokenizer = tiny32
    engine = HFGenerateEngine(model, tokenizer.pad_token_id, cache="static")
    params = SamplingParams(temperature=1.0, max_new_tokens=4, seed=0)
    first = engine.generate(_random_prompts(tokenizer, (10, 20), seed=1), 2, params)
    buffers = engine._static
    # a call of the same batch size and a length in the same 128-column step reuses the buffers
    again = engine.generate(_random_prompts(tokenizer, (10, 20), seed=1), 2, params)
    assert engine._static is buffers
    assert [c.token_ids for g in first for c in g] == [c.token_ids for g in again for c in g]
    engine.generate(_random_prompts(tokenizer, (10,), seed=1), 2, params)  # another batch size: new buffers
    assert engine._static is not buffers
    engine.sync_weights(model)
    assert engine._static is None


def test_static_buffers_are_dropped_when_the_weights_change(tiny32):
    # a CUDA graph reads the weights' storage: a load that replaces it must not replay the old graph
    model, tokenizer = tiny32
    model = copy.deepcopy(model)
    engine = HFGenerateEngine(model, tokenizer.pad_token_id, cache="static")
    params = SamplingParams(temperature=1.0, max_new_tokens=4, seed=0)
    prompts = _random_prompts(tokenizer, (10, 20), seed=1)
    engine.generate(prompts, 2, params)
    buffers = engine._static
    model.load_state_dict({k: v + 0.01 for k, v in model.state_dict().items()}, assign=True)
    got = engine.generate(prompts, 2, params)
    assert engine._static is not buffers
    want = HFGenerateEngine(model, tokenizer.pad_token_id, cache="dynamic").generate(prompts, 2, params)
    _assert_same(want, got, 1e-6)


def test_cache_choice_is_validated_and_auto_is_dynamic_on_the_cpu(tiny32):
    model, tokenizer = tiny32
    with pytest.raises(ValueError, match="cache must be one of"):
        HFGenerateEngine(model, tokenizer.pad_token_id, cache="paged")
    assert HFGenerateEngine(model, tokenizer.pad_token_id).resolved_cache() == "dynamic"
    assert HFGenerateEngine(model, tokenizer.pad_token_id, cache="static").resolved_cache() == "static"


def test_static_cache_rejects_sliding_windows(tiny64):
    from transformers import Qwen3ForCausalLM

    model, tokenizer = tiny64
    config = copy.deepcopy(model.config)
    config.use_sliding_window, config.sliding_window = True, 8
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    sliding = Qwen3ForCausalLM(config).to(torch.float64).eval()
    engine = HFGenerateEngine(sliding, tokenizer.pad_token_id, cache="static")
    assert not engine.static_supported()
    with pytest.raises(ValueError, match="static"):
        engine.generate([[5, 6, 7]], 1, SamplingParams(max_new_tokens=2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_static_cache_cuda_graph_samples_the_same_tokens_on_cuda(tiny32):
    # on CUDA "auto" is static and the decode step is a captured CUDA graph, replayed: the same
    # tokens as generate on the same device (float32; log-probs to the kernels' rounding)
    model, tokenizer = tiny32
    model = copy.deepcopy(model).cuda()
    prompts = _random_prompts(tokenizer, (30, 1, 17, 9), seed=0)
    worst = 0.0
    for case in sorted(STATIC_CASES):
        params = SamplingParams(**STATIC_CASES[case])
        reference = HFGenerateEngine(model, tokenizer.pad_token_id, max_batch_size=6, cache="dynamic").generate(
            prompts, 3, params)
        engine = HFGenerateEngine(model, tokenizer.pad_token_id, max_batch_size=6)
        assert engine.resolved_cache() == "static"
        got = engine.generate(prompts, 3, params)
        assert engine._static.graph is not None
        worst = max(worst, _assert_same(reference, got, 1e-5))
    print(f"CUDA static (graph) vs dynamic: largest log-prob difference {worst:.2e}")
