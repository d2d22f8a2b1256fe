"""Activation checkpointing "as_needed": how many layers a pass recomputes, and the same gradients."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")

from seeupo.llm.distributed import decoder_layers, enable_activation_checkpointing  # noqa: E402
from seeupo.llm.layout import scoring_batch  # noqa: E402
from seeupo.llm.memory import ESTIMATE_MARGIN, activation_bytes_per_token, recomputed_layers, token_budget  # noqa: E402
from seeupo.llm.policy import CausalLMPolicy, ValueModel  # noqa: E402


def four_layer_model():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=256, pad_token_id=0)
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).to(torch.float64).eval()


def test_activation_bytes_with_some_layers_recomputed_by_hand():
    c = four_layer_model().config  # hidden 32, MLP 64, 4 layers, 4 heads / 2 key-value heads of 8
    layer = (2 * 4 * 8 + 2 * 2 * 8 + 5 * 32 + 4 * 64) * 8
    final = 4 * 32 * 4
    for k in range(5):
        want = k * 32 * 8 + (4 - k) * layer + (2 * layer if k else 0) + final
        assert activation_bytes_per_token(c, torch.float64, checkpointing=True, recomputed=k) == want
    assert activation_bytes_per_token(c, torch.float64, True, recomputed=4) == activation_bytes_per_token(c, torch.float64, True)
    assert activation_bytes_per_token(c, torch.float64, True, recomputed=0) == activation_bytes_per_token(c, torch.float64, False)
    with pytest.raises(ValueError, match="0..4"):
        activation_bytes_per_token(c, torch.float64, True, recomputed=5)


def test_activation_bytes_when_checkpointed_layers_keep_their_attention_by_hand():
    c = four_layer_model().config
    layer = (2 * 4 * 8 + 2 * 2 * 8 + 5 * 32 + 4 * 64) * 8
    attention = (2 * 4 * 8 + 2 * 2 * 8) * 8 + 4 * 4  # q, output, k, v in float64; a float32 log-sum-exp per head
    final = 4 * 32 * 4
    for k in range(5):
        want = k * (32 * 8 + attention) + (4 - k) * layer + (2 * layer if k else 0) + final
        assert activation_bytes_per_token(c, torch.float64, True, recomputed=k, keep_attention=True) == want
    # without checkpointing nothing is recomputed, so keeping attention changes nothing
    assert (activation_bytes_per_token(c, torch.float64, False, keep_attention=True)
            == activation_bytes_per_token(c, torch.float64, False))
    # a budget counts the kept attention: fewer tokens fit
    gib = 2**30
    budgets = [token_budget(c, torch.float64, True, True, total=80 * gib, allocated=4 * gib, reserve=10 * gib,
                            keep_attention=keep) for keep in (False, True)]
    assert budgets[1] < budgets[0]


def test_token_budget_by_hand_and_the_share_bounds_as_needed():
    c = four_layer_model().config
    per_token = activation_bytes_per_token(c, torch.float64, checkpointing=True)
    gib = 2**30
    budget = token_budget(c, torch.float64, True, True, total=80 * gib, allocated=4 * gib, reserve=10 * gib, share=0.5)
    assert budget == int((0.5 * 80 * gib - 14 * gib) // (ESTIMATE_MARGIN * per_token))
    full = token_budget(c, torch.float64, True, True, total=80 * gib, allocated=4 * gib, reserve=10 * gib)  # 0.85
    assert full == int((0.85 * 80 * gib - 14 * gib) // (ESTIMATE_MARGIN * per_token)) > budget
    # nothing left: 0 tokens, not a negative budget
    assert token_budget(c, torch.float64, True, True, total=80 * gib, allocated=40 * gib, reserve=10 * gib, share=0.5) == 0
    for share in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"\(0, 1\]"):
            token_budget(c, torch.float64, True, True, total=gib, allocated=0, reserve=0, share=share)
    # as_needed keeps a pass's activations within a fully checkpointed pass at the budget, so a
    # lower share recomputes at least as many layers and bounds the activations by its memory
    for tokens in (budget // 4, budget // 2, budget):
        k_low, k_full = recomputed_layers(c, torch.float64, tokens, budget), recomputed_layers(c, torch.float64, tokens, full)
        assert k_low >= k_full
        kept = tokens * activation_bytes_per_token(c, torch.float64, True, recomputed=k_low)
        assert kept * ESTIMATE_MARGIN <= 0.5 * 80 * gib - 14 * gib


def test_a_policys_memory_share_is_checked_where_it_enters():
    for share in (0.0, 1.01):
        with pytest.raises(ValueError, match="memory_share"):
            CausalLMPolicy(four_layer_model(), memory_share=share)
    assert CausalLMPolicy(four_layer_model(), memory_share=0.5)._budget.share == 0.5


def test_recomputed_layers_are_the_fewest_that_fit_the_budgets_memory():
    c = four_layer_model().config
    bytes_of = lambda k: activation_bytes_per_token(c, torch.float64, True, recomputed=k)  # noqa: E731
    budget = 1000
    allowed = budget * bytes_of(4)
    for tokens in (1, 50, 100, 150, 200, 250, 400, 999, 1000, 5000):
        k = recomputed_layers(c, torch.float64, tokens, budget)
        if k < 4:
            assert tokens * bytes_of(k) <= allowed
        if k > 0:  # one layer fewer would not fit
            assert tokens * bytes_of(k - 1) > allowed
    assert recomputed_layers(c, torch.float64, 1, budget) == 0
    assert recomputed_layers(c, torch.float64, budget, budget) == 4
    assert recomputed_layers(c, torch.float64, 3 * budget, budget) == 4  # over the budget: all (the planner splits such passes)


def _counting(model):
    """Per decoder layer, how often a module inside it runs forward (a recomputed layer runs twice)."""
    counts = [0] * len(decoder_layers(model))
    for i, layer in enumerate(decoder_layers(model)):
        layer.mlp.register_forward_pre_hook(lambda *_, i=i: counts.__setitem__(i, counts[i] + 1))
    return counts


@pytest.mark.parametrize("budget", [None, 10, 14, 1000])
def test_as_needed_recomputes_the_layers_memory_requires_with_the_same_gradient(budget):
    model = four_layer_model()
    batch = scoring_batch([[5, 6, 7, 8], [9, 10]], [[11, 12], [13, 14, 15]], 0)
    tokens = 6 + 5  # the two rows packed into one row (tree attention); under a budget of 10, one pass each
    passes = 1 if budget is None or budget >= tokens else 2
    plain = copy.deepcopy(model)
    CausalLMPolicy(plain, scoring="packed").token_logps(batch).sum().backward()
    enable_activation_checkpointing(model, as_needed=True)
    policy = CausalLMPolicy(model, scoring="packed")
    if budget is not None:  # as on a GPU whose memory gives this budget
        policy._budget._value, policy._budget._known = budget, True
    counts = _counting(model)
    policy.token_logps(batch).sum().backward()
    recomputed = 4 if budget is None else recomputed_layers(model.config, torch.float64, tokens, budget, keep_attention=True)
    assert counts == [2 * passes] * recomputed + [passes] * (4 - recomputed)
    assert all(layer.gradient_checkpointing for layer in decoder_layers(model))  # restored after the pass
    worst = max(float((p.grad - q.grad).abs().max()) for p, q in zip(model.parameters(), plain.parameters()))
    assert worst < 1e-12
    with torch.no_grad():  # scoring without a gradient: nothing kept, nothing recomputed
        counts[:] = [0] * 4
        policy.token_logps(batch)
        assert counts == [passes] * 4


@pytest.mark.parametrize("as_needed", [False, True])
def test_a_checkpointed_layer_replays_its_attention_with_the_full_recomputations_gradient(attention_calls, as_needed):
    batch = scoring_batch([[5, 6, 7, 8], [9, 10]], [[11, 12], [13, 14, 15]], 0)
    grads, counts = {}, {}
    for keep in (None, False, True):  # None: no checkpointing
        model = four_layer_model()
        if keep is not None:
            enable_activation_checkpointing(model, as_needed=as_needed, keep_attention=keep)
        policy = CausalLMPolicy(model, scoring="packed")
        budget = 14 if keep else 16  # the 11 tokens recompute 3 of the 4 layers either way (kept attention counted)
        if as_needed:
            policy._budget._value, policy._budget._known = budget, True
        layers = _counting(model)
        attention_calls[0] = 0
        policy.token_logps(batch).sum().backward()
        grads[keep] = [p.grad for p in model.parameters()]
        counts[keep] = (layers, attention_calls[0])
    for keep in (False, True):
        recomputed = recomputed_layers(model.config, torch.float64, 11, 14 if keep else 16, keep) if as_needed else 4
        assert recomputed == (3 if as_needed else 4)
        ran = [2] * recomputed + [1] * (4 - recomputed)
        # without keep_attention the kernel runs again in every recomputed layer; with it, never
        assert counts[keep] == (ran, 4 + (0 if keep else recomputed))
        worst = max(float((g - h).abs().max()) for g, h in zip(grads[keep], grads[None]))
        assert worst < 1e-12
    assert counts[None] == ([1] * 4, 4)


def test_the_budgets_in_the_test_above_cover_none_some_and_all_layers():
    c = four_layer_model().config
    assert [recomputed_layers(c, torch.float64, 11, b, keep_attention=True) for b in (10, 14, 1000)] == [4, 3, 0]


def test_a_critic_recomputes_as_needed_too():
    model = four_layer_model()
    batch = scoring_batch([[5, 6, 7, 8], [9, 10]], [[11, 12], [13, 14, 15]], 0)
    critic = ValueModel.from_causal_lm(model, scoring="packed")
    enable_activation_checkpointing(critic.backbone, as_needed=True)
    critic._budget._value, critic._budget._known = 1000, True
    counts = _counting(critic.backbone)
    critic.values(batch).sum().backward()
    assert counts == [1] * 4  # 14 tokens fit without checkpointing


def test_decoder_layers_are_found_after_fsdp_renames_their_class():
    # FSDP2's fully_shard swaps each sharded module's class for a subclass named FSDP<name>; a pass
    # with checkpointing "as_needed" looks the layers up after sharding
    model = four_layer_model()
    for layer in decoder_layers(model):
        layer.__class__ = type(f"FSDP{type(layer).__name__}", (type(layer),), {})
    assert [type(layer).__name__ for layer in decoder_layers(model)] == ["FSDPQwen3DecoderLayer"] * 4


_FSDP_WORKER = '''
import copy, sys, torch
sys.path.insert(0, sys.argv[1])
from test_memory import _counting, four_layer_model
from seeupo.llm.distributed import (barrier, enable_activation_checkpointing, exit_skipping_teardown, init_distributed,
                                   shard_model, shutdown)
from seeupo.llm.layout import scoring_batch
from seeupo.llm.policy import CausalLMPolicy

env = init_distributed()
model = four_layer_model()
plain = copy.deepcopy(model)
batch = scoring_batch([[5, 6, 7, 8], [9, 10]], [[11, 12], [13, 14, 15]], 0)
CausalLMPolicy(plain, scoring="packed").token_logps(batch).sum().backward()
enable_activation_checkpointing(model, as_needed=True)
shard_model(model, env)
policy = CausalLMPolicy(model, scoring="packed")
policy._budget._value, policy._budget._known = 14, True  # 11 tokens: 3 of 4 layers recomputed (attention kept)
counts = _counting(model)
policy.token_logps(batch).sum().backward()
assert counts == [2, 2, 2, 1], counts
# FSDP sums the two processes' gradients of the same batch: twice the plain gradient
worst = max(float((p.grad.full_tensor() - 2 * q.grad).abs().max()) for p, q in zip(model.parameters(), plain.parameters()))
assert worst < 1e-12, worst
open(f"{sys.argv[2]}/ok{env.dp.rank}", "w").close()
# leave the group together and skip the interpreter's teardown, as `seeupo train` does: a rank that had done its
# work aborted there in CI runs ("terminate called without an active exception")
barrier()
shutdown()
exit_skipping_teardown(0)
'''


@pytest.mark.slow
def test_as_needed_under_fsdp2_with_two_processes(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "worker.py"
    script.write_text(_FSDP_WORKER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
           str(Path(__file__).parent), str(tmp_path)]
    run = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "ok0").exists() and (tmp_path / "ok1").exists()  # both processes checked
