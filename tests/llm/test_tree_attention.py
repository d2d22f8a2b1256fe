"""Tree attention: a pass's rows packed into one row, each token seeing exactly what it sees in its own row.

The layout is checked by hand (:func:`pack_tree`), the rule against a dense mask written out by
hand, the segment kernel against one dense masked attention call, the model-level result against
each row forwarded alone, and the flex kernel against the segment kernel where CUDA exists. The
policy-level exactness (every layout against ``per_row``: micro-batches, dummy passes, activation
checkpointing, the reference, the critic, core updates, agent-loop batches) is in
``test_packed_scoring.py``, whose ``packed`` and ``prefix_shared`` layouts run on this module.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

pytest.importorskip("transformers", reason="tests/llm need transformers and tokenizers (pip install -e '.[llm]')")

from seeupo.llm.memory import activation_bytes_per_token, auto_token_budget
from seeupo.validation.errors import InputError
from seeupo.llm.models import norms_in_model_dtype
from seeupo.llm.policy import CausalLMPolicy
from seeupo.llm.tree_attention import (
    FLEX_BLOCK, Segment, call_tokens, enable_tree_attention, pack_tree, prepared_mask, segment_attention, tree_allows,
    tree_attention, tree_of,
)

CUDA = torch.cuda.is_available()


def _rows(lengths: list[int], prefix: list[int], prefix_row: list[int], vocab: int = 50, seed: int = 0):
    """Right-padded ids whose rows of one group share their first ``prefix`` ids."""
    g = torch.Generator().manual_seed(seed)
    W = max(lengths)
    ids = torch.zeros(len(lengths), W, dtype=torch.long)
    shared: dict[int, torch.Tensor] = {}
    for i, (n, p, r) in enumerate(zip(lengths, prefix, prefix_row)):
        head = shared.setdefault(r, torch.randint(3, vocab, (max(p, 1),), generator=g))[:p]
        ids[i, :n] = torch.cat([head, torch.randint(3, vocab, (n - p,), generator=g)])
    return ids


def test_pack_tree_by_hand():
    # group 0: rows 0 and 1 share 3 tokens; row 2 is alone with no prefix
    ids = torch.tensor([[10, 11, 12, 13, 14, 0],
                        [10, 11, 12, 20, 0, 0],
                        [30, 31, 0, 0, 0, 0]])
    packed = pack_tree(ids, torch.tensor([5, 4, 2]), torch.tensor([3, 3, 0]), torch.tensor([0, 0, 1]))
    assert packed.input_ids.tolist() == [[10, 11, 12, 13, 14, 20, 30, 31]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 0, 1]]  # each token at its position in its row
    assert packed.index.tolist() == [[0, 1, 2, 3, 4, -1], [0, 1, 2, 5, -1, -1], [6, 7, -1, -1, -1, -1]]
    assert packed.mask.segments == [Segment(0, 3), Segment(3, 5, 0, 3), Segment(5, 6, 0, 3), Segment(6, 8, 6, 0)]
    assert packed.mask.group.tolist() == [0, 0, 0, 0, 0, 0, 1, 1]
    assert packed.mask.branch.tolist() == [-1, -1, -1, 0, 0, 1, 2, 2]
    assert packed.mask.tokens == 8 and call_tokens(packed.input_ids, prepared_mask(packed.mask)) == (8, 8)
    # the flex kernel pads to a block; the padding is its own group, read by nothing
    flex = pack_tree(ids, torch.tensor([5, 4, 2]), torch.tensor([3, 3, 0]), torch.tensor([0, 0, 1]), "flex")
    assert flex.input_ids.shape == (1, FLEX_BLOCK) and flex.mask.tokens == 8
    assert set(flex.mask.group[8:].tolist()) == {2} and flex.index.max() == 7


def test_pack_tree_refuses_what_it_cannot_lay_out():
    ids = torch.tensor([[1, 2, 3], [1, 2, 4]])
    with pytest.raises(ValueError, match="share one prefix length"):
        pack_tree(ids, torch.tensor([3, 3]), torch.tensor([2, 1]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="at least one token after its shared prefix"):
        pack_tree(ids, torch.tensor([2, 3]), torch.tensor([2, 2]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="unknown tree kernel"):
        pack_tree(ids, torch.tensor([3, 3]), torch.tensor([0, 0]), torch.tensor([0, 1]), "dense")


def test_the_rule_by_hand():
    ids = _rows([5, 4, 2], [3, 3, 0], [0, 0, 1])
    mask = pack_tree(ids, torch.tensor([5, 4, 2]), torch.tensor([3, 3, 0]), torch.tensor([0, 0, 1])).mask
    n = mask.length
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    got = tree_allows(q, k, mask.group, mask.branch).int()
    # rows: prefix p0 p1 p2 | row 0's rest a3 a4 | row 1's rest b3 | row 2: c0 c1
    want = torch.tensor([[1, 0, 0, 0, 0, 0, 0, 0],
                         [1, 1, 0, 0, 0, 0, 0, 0],
                         [1, 1, 1, 0, 0, 0, 0, 0],
                         [1, 1, 1, 1, 0, 0, 0, 0],
                         [1, 1, 1, 1, 1, 0, 0, 0],
                         [1, 1, 1, 0, 0, 1, 0, 0],  # b3 sees the prefix and itself, not row 0's rest
                         [0, 0, 0, 0, 0, 0, 1, 0],
                         [0, 0, 0, 0, 0, 0, 1, 1]])
    assert torch.equal(got, want)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_segment_kernel_equals_one_dense_masked_call(seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 9, (5,), generator=g)
    prefix_row = torch.tensor([0, 0, 0, 1, 1])
    prefix = torch.tensor([1, 1, 1, 0, 0]) * int(lengths[:3].min() - 1)
    ids = _rows(lengths.tolist(), prefix.tolist(), prefix_row.tolist(), seed=seed)
    mask = pack_tree(ids, lengths, prefix, prefix_row).mask
    n, heads, kv, d = mask.length, 4, 2, 8
    q = torch.randn(1, heads, n, d, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, kv, n, d, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, kv, n, d, generator=g, dtype=torch.float64, requires_grad=True)
    dense = tree_allows(torch.arange(n)[:, None], torch.arange(n)[None, :], mask.group, mask.branch)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=0.3, enable_gqa=True)
    got = segment_attention(q, k, v, mask, 0.3)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    w = torch.randn(want.shape, generator=g, dtype=torch.float64)
    grads_want = torch.autograd.grad((want * w).sum(), (q, k, v))
    grads_got = torch.autograd.grad((got * w).sum(), (q, k, v))
    for a, b in zip(grads_got, grads_want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.fixture(scope="module")
def exact64(tiny64):
    model, tokenizer = tiny64
    return norms_in_model_dtype(copy.deepcopy(model)), tokenizer


def test_one_call_gives_each_row_forwarded_alone(exact64):
    model, _ = exact64
    model = copy.deepcopy(model)
    assert enable_tree_attention(model) is None
    assert model.config._attn_implementation == "seeupo_tree_sdpa"
    lengths, prefix, prefix_row = torch.tensor([9, 12, 7, 6]), torch.tensor([5, 5, 5, 0]), torch.tensor([0, 0, 0, 1])
    ids = _rows(lengths.tolist(), prefix.tolist(), prefix_row.tolist(), vocab=model.config.vocab_size)
    packed = pack_tree(ids, lengths, prefix, prefix_row)
    out = model(input_ids=packed.input_ids, position_ids=packed.position_ids,
                attention_mask=prepared_mask(packed.mask), use_cache=False).logits[0]
    for i, n in enumerate(lengths.tolist()):
        alone = model(input_ids=ids[i : i + 1, :n], use_cache=False).logits[0]
        torch.testing.assert_close(out[packed.index[i, :n]], alone, rtol=0, atol=1e-12)
    # anything else still goes to sdpa as before: a padded batch with its 2-D mask
    attention_mask = (torch.arange(ids.shape[1]) < lengths[:, None]).long()
    padded = model(input_ids=ids, attention_mask=attention_mask, use_cache=False).logits
    torch.testing.assert_close(padded[3, :6], model(input_ids=ids[3:, :6], use_cache=False).logits[0], rtol=0, atol=1e-12)


def test_models_it_cannot_run_on_say_why(exact64):
    model, _ = exact64
    sliding = copy.deepcopy(model)
    sliding.config._attn_implementation = "sdpa"
    sliding.config.layer_types = ["sliding_attention"] * len(sliding.config.layer_types)
    sliding.config.sliding_window = 4
    assert "not all its layers are full attention" in enable_tree_attention(sliding)
    assert "is not a transformers model" in enable_tree_attention(torch.nn.Linear(2, 2))

    class IgnoresMasks(torch.nn.Module):
        """A model with a transformers config whose forward drops the attention mask."""

        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, input_ids, position_ids=None, attention_mask=None, use_cache=None):
            return self.inner(input_ids=input_ids, position_ids=position_ids, use_cache=False)

    fake = IgnoresMasks(copy.deepcopy(model))
    fake.config._attn_implementation = "sdpa"
    assert "ignores a prepared attention mask" in enable_tree_attention(fake)
    assert fake.config._attn_implementation == "sdpa"  # left as it was


def test_activation_bytes_per_token_by_hand(tiny64):
    model, _ = tiny64
    c = model.config  # hidden 64, MLP 128, 2 layers, 4 heads / 2 key-value heads of 32
    layer = (2 * 4 * 32 + 2 * 2 * 32 + 5 * 64 + 4 * 128) * 8
    final = 4 * 64 * 4
    assert activation_bytes_per_token(c, torch.float64, checkpointing=False) == 2 * layer + final
    assert activation_bytes_per_token(c, torch.float64, checkpointing=True) == 2 * 64 * 8 + 2 * layer + final
    assert activation_bytes_per_token(c, torch.bfloat16, checkpointing=False) == 2 * layer // 4 + final
    # a frozen model (no backward pass): one layer's intermediates at a time
    assert activation_bytes_per_token(c, torch.float64, checkpointing=False, training=False) == layer + final
    assert auto_token_budget(model, checkpointing=True) is None  # the CPU: no budget


def test_a_row_over_a_memory_budget_is_refused_before_any_pass(exact64, lm_batch):
    model, _ = exact64
    policy = CausalLMPolicy(copy.deepcopy(model), scoring="prefix_shared")
    ids = _rows([9, 12], [4, 4], [0, 0], vocab=model.config.vocab_size)
    batch = lm_batch([ids[0, :6].tolist(), ids[1, :6].tolist()], [ids[0, 6:9].tolist(), ids[1, 6:12].tolist()])
    assert batch.data["attention_mask"].sum(1).tolist() == [9, 12]
    policy._budget._value, policy._budget._known = 10, True  # as a GPU whose memory allows 10 tokens
    calls: list[int] = []
    handle = policy.model.register_forward_pre_hook(lambda *a: calls.append(1))
    with pytest.raises(InputError, match="micro_batch_tokens.*chosen from this device's memory: 10 tokens per pass, but a row of 12"):
        policy.token_logps(batch)
    handle.remove()
    assert calls == []
    policy._budget._value = 12  # room for it: one row per pass
    assert policy.token_logps(batch).shape == (2, 6)


@pytest.mark.parametrize("heads,kv", [(4, 4), (4, 2)])
def test_cascade_kernel_equals_segment_kernel_in_float64(heads, kv):
    # group 0: three branches under a 12-token prompt; row 3 alone (no prefix); group 2: one branch
    lengths, prefix, prefix_row = [30, 15, 17, 9, 12], [12, 12, 12, 0, 5], [0, 0, 0, 1, 2]
    ids = _rows(lengths, prefix, prefix_row)
    args = (ids, torch.tensor(lengths), torch.tensor(prefix), torch.tensor(prefix_row))
    segments, cascade = pack_tree(*args, "segments").mask, pack_tree(*args, "cascade").mask
    g = torch.Generator().manual_seed(1)
    n = segments.length
    q, k, v = (torch.randn(1, h, n, 8, generator=g, dtype=torch.float64).requires_grad_() for h in (heads, kv, kv))
    want, got = tree_attention(q, k, v, segments, 0.3), tree_attention(q, k, v, cascade, 0.3)
    assert (got - want).abs().max() < 1e-12
    w = torch.randn(want.shape, generator=g, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad((got * w).sum(), (q, k, v)), torch.autograd.grad((want * w).sum(), (q, k, v))):
        assert (a - b).abs().max() < 1e-12


@pytest.mark.parametrize("checkpointing", [None, "keep", "as_needed"])
def test_a_policy_on_the_cascade_kernel_equals_the_segment_kernel(tiny64, lm_batch, monkeypatch, checkpointing):
    import seeupo.llm.passes as passes_module  # where the policy's passes pick their kernel
    from seeupo.llm.distributed import enable_activation_checkpointing

    model, _ = tiny64
    lengths = [40, 55, 33, 47]
    ids = _rows(lengths, [20, 20, 20, 20], [0, 0, 0, 0], vocab=model.config.vocab_size)
    batch = lm_batch([ids[i, :25].tolist() for i in range(4)], [ids[i, 25:n].tolist() for i, n in enumerate(lengths)])
    weights = torch.randn(batch.token_mask.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    logps, grads = {}, {}
    for kernel in ("segments", "cascade"):
        monkeypatch.setattr(passes_module, "default_kernel", lambda device, kernel=kernel: kernel)
        copied = copy.deepcopy(model)
        if checkpointing is not None:
            enable_activation_checkpointing(copied, as_needed=checkpointing == "as_needed")
        policy = CausalLMPolicy(copied, scoring="prefix_shared")
        if checkpointing == "as_needed":  # a budget under which some layers are recomputed, some kept
            policy._budget._value, policy._budget._known = 200, True
        logps[kernel] = policy.token_logps(batch)
        (logps[kernel] * weights).sum().backward()
        grads[kernel] = [p.grad for p in copied.parameters()]
    assert (logps["cascade"] - logps["segments"]).abs().max() < 1e-12
    assert max(float((a - b).abs().max()) for a, b in zip(grads["cascade"], grads["segments"])) < 1e-12
    per_row = CausalLMPolicy(copy.deepcopy(model), scoring="per_row").token_logps(batch)
    assert (logps["cascade"] - per_row).abs().max() < 1e-12


@pytest.mark.skipif(not CUDA, reason="flex attention has a backward pass on CUDA only (torch: 'FlexAttention does not "
                                     "support backward on CPU'); this check runs where a GPU is lent")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 2e-2)])
def test_flex_kernel_equals_segment_kernel_on_cuda(dtype, tol):
    g = torch.Generator().manual_seed(0)
    lengths, prefix, prefix_row = torch.tensor([300, 150, 170, 40]), torch.tensor([120, 120, 120, 0]), torch.tensor([0, 0, 0, 1])
    ids = _rows(lengths.tolist(), prefix.tolist(), prefix_row.tolist()).cuda()
    flex = pack_tree(ids, lengths, prefix, prefix_row, "flex").mask
    n, heads, kv, d = flex.length, 8, 4, 64
    q, k, v = (torch.randn(1, h, n, d, generator=g).to("cuda", dtype).requires_grad_() for h in (heads, kv, kv))
    seg = pack_tree(ids, lengths, prefix, prefix_row, "segments").mask
    real = flex.tokens
    got = tree_attention(q, k, v, flex, d**-0.5)[:, :, :real]
    want = tree_attention(q[:, :, :real], k[:, :, :real], v[:, :, :real], seg, d**-0.5)
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    w = torch.randn(want.shape, generator=g).to("cuda", dtype)
    for a, b in zip(torch.autograd.grad((got * w).sum(), (q, k, v)), torch.autograd.grad((want * w).sum(), (q, k, v))):
        torch.testing.assert_close(a[:, :, :real].float(), b[:, :, :real].float(), rtol=tol, atol=tol * 10)


@pytest.mark.skipif(not CUDA, reason="the flex kernel runs on CUDA only; this check runs where a GPU is lent")
def test_policy_on_cuda_equals_per_row(tiny32, lm_batch):
    model, _ = tiny32
    model = copy.deepcopy(model).cuda()
    lengths = [40, 55, 33, 47]
    ids = _rows(lengths, [20, 20, 20, 20], [0, 0, 0, 0], vocab=model.config.vocab_size)
    batch = lm_batch([ids[i, :25].tolist() for i in range(4)], [ids[i, 25:n].tolist() for i, n in enumerate(lengths)],
                     dtype=torch.float32)
    want = CausalLMPolicy(copy.deepcopy(model), scoring="per_row").token_logps(batch)
    got = CausalLMPolicy(model, scoring="prefix_shared").token_logps(batch)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


@pytest.mark.skipif(not CUDA, reason="the flex kernel runs on CUDA only; this check runs where a GPU is lent")
def test_checkpointing_that_keeps_flex_attention_gives_the_full_recomputations_gradients_on_cuda(tiny32, lm_batch,
                                                                                               attention_calls):
    from seeupo.llm.distributed import enable_activation_checkpointing

    model, _ = tiny32
    lengths = [40, 55, 33, 47]
    ids = _rows(lengths, [20, 20, 20, 20], [0, 0, 0, 0], vocab=model.config.vocab_size)
    batch = lm_batch([ids[i, :25].tolist() for i in range(4)], [ids[i, 25:n].tolist() for i, n in enumerate(lengths)],
                     dtype=torch.float32)
    grads, counts = {}, {}
    for keep in (False, True):
        copy_ = copy.deepcopy(model).cuda()
        enable_activation_checkpointing(copy_, keep_attention=keep)
        policy = CausalLMPolicy(copy_, scoring="prefix_shared")
        with torch.no_grad():  # the first pass probes the model with 3 tokens, which calls attention too
            policy.token_logps(batch)
        attention_calls[0] = 0
        policy.token_logps(batch).sum().backward()
        grads[keep], counts[keep] = [p.grad for p in copy_.parameters()], attention_calls[0]
    layers = model.config.num_hidden_layers
    assert (counts[False], counts[True]) == (2 * layers, layers)
    for a, b in zip(grads[True], grads[False]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_every_family_takes_the_rule_through_a_prepared_mask(family):
    """Llama's model under transformers 5.24 refuses a mask mapping (it builds its mask from it); a
    prepared 4-D mask reaches every family's attention: the packed pass equals each row alone (float64)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if family == "llama" else (Qwen3Config, Qwen3ForCausalLM)
    torch.manual_seed(0)
    model = model_cls(config_cls(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                 attn_implementation="sdpa")).to(torch.float64).eval()
    assert enable_tree_attention(model) is None
    lengths, prefix, prefix_row = torch.tensor([9, 12, 6]), torch.tensor([5, 5, 0]), torch.tensor([0, 0, 1])
    ids = _rows(lengths.tolist(), prefix.tolist(), prefix_row.tolist(), vocab=64)
    packed = pack_tree(ids, lengths, prefix, prefix_row)
    carrier = prepared_mask(packed.mask)
    assert carrier.shape == (1, 1, 0, 0) and tree_of(carrier) is packed.mask
    assert tree_of(torch.ones(1, 1, 2, 2)) is None and tree_of(None) is None
    out = model(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=carrier,
                use_cache=False).logits[0]
    for i, n in enumerate(lengths.tolist()):
        alone = model(input_ids=ids[i : i + 1, :n], use_cache=False).logits[0]
        torch.testing.assert_close(out[packed.index[i, :n]], alone, rtol=0, atol=1e-12)


def test_the_flex_options_benchmark_runs_its_cpu_dry_run_and_counts_the_trees_pairs(tmp_path, capsys):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import flex_options

    out = tmp_path / "flex.jsonl"
    argv = ["--device", "cpu", "--context", "20", "--turns", "1", "--group", "2", "--heads", "2", "--kv-heads", "1",
            "--head-dim", "8", "--repeats", "1", "--out", str(out)]
    assert flex_options.main(argv) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    setup, flex, cascade, done = records
    assert cascade["event"] == "cascade" and cascade["forward_backward_s"] > 0 and "error" not in cascade
    rest = 350
    # the prompt causally, each branch causally over itself and fully over the prompt
    assert setup["pairs"] == 20 * 21 // 2 + 2 * (rest * 20 + rest * (rest + 1) // 2)
    assert setup["tokens"] == 20 + 2 * rest and setup["length"] % 128 == 0
    assert flex["options"] == "default" and flex["forward_s"] > 0 and (done["failed"], done["errors"]) == (0, 0)
    assert flex_options.main(argv[:-2] + ["--options", "nope", "--out", str(out)]) == 2
    assert "--options takes names of" in capsys.readouterr().err
    assert flex_options.main(argv[:-2] + ["--group", "0", "--out", str(out)]) == 2
    assert "got --group 0" in capsys.readouterr().err
    assert len(out.read_text().splitlines()) == len(records)  # a refused run writes nothing
