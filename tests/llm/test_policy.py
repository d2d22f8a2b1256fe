"""CausalLMPolicy, ReferencePolicy, ValueModel and the clipped value loss against independent computations."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("transformers", reason="tests/llm need transformers and tokenizers (pip install -e '.[llm]')")
pytest.importorskip("tokenizers", reason="tests/llm need transformers and tokenizers (pip install -e '.[llm]')")

from seeupo.llm.layout import pack_rows
from seeupo.llm.policy import CausalLMPolicy, ReferencePolicy, ValueModel, clipped_value_loss, micro_batches


class BigramLM(torch.nn.Module):
    """A causal LM whose next-token logits depend only on the current token: ``logits = table[token]``."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(table)

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None):
        return SimpleNamespace(logits=self.table[input_ids])


def test_pack_rows_layout():
    data = pack_rows([[5, 6], [7], []], [[8], [9, 10, 11], []], pad_token_id=0)
    assert data["input_ids"].tolist() == [[5, 6, 8, 0], [7, 9, 10, 11], [0, 0, 0, 0]]
    assert data["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    assert data["response_start"].tolist() == [2, 1, 0]


def test_token_logps_by_hand(lm_batch):
    # vocab of 3; after token 0 the next token has probabilities (1, 2, 3) / 6, after token 1 (1, 1, 2) / 4
    table = torch.log(torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 2.0], [1.0, 1.0, 1.0]], dtype=torch.float64))
    policy = CausalLMPolicy(BigramLM(table), temperature=1.0)
    assert policy._head is None  # no separate backbone and head: its own logits, then sliced
    # row 0: context [0], response [2, 1]: p(2|0) = 3/6, p(1|2) = 1/3
    # row 1: context [2, 0], response [1]:  p(1|0) = 2/6
    batch = lm_batch([[0], [2, 0]], [[2, 1], [1]])
    expected = torch.tensor([[math.log(3 / 6), math.log(1 / 3)], [math.log(2 / 6), 0.0]], dtype=torch.float64)
    torch.testing.assert_close(policy.token_logps(batch), expected, rtol=0, atol=1e-12)
    # temperature 0.5 squares the probabilities before renormalising: p(2|0) = 9 / 14
    hot = CausalLMPolicy(BigramLM(table), temperature=0.5)
    assert hot.token_logps(batch)[0, 0].item() == pytest.approx(math.log(9 / 14), abs=1e-12)
    assert policy.log_probs(batch, temperature=0.5)[0, 0].item() == pytest.approx(math.log(9 / 14), abs=1e-12)


def _independent_logps(model, context, response, tau):
    """Per-row, unpadded, no mask, no position ids: the plainest forward pass."""
    ids = torch.tensor([context + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    logp = torch.log_softmax(logits / tau, dim=-1)
    return torch.stack([logp[len(context) + j - 1, t] for j, t in enumerate(response)])


def _rows(tokenizer):
    texts = ["hello there", "The quick brown fox jumps over", "Observation: the file was created.", "x"]
    replies = ["Turn 1: hello", "ok", "Action: ls(path='/home')", "def add(a, b):"]
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    return [enc(t) for t in texts], [enc(r) for r in replies]


@pytest.mark.parametrize("dtype_name,tol", [("float64", 1e-10), ("float32", 2e-5)])
def test_token_logps_match_unpadded_forward(tiny32, tiny64, lm_batch, dtype_name, tol):
    model, tokenizer = tiny64 if dtype_name == "float64" else tiny32
    contexts, responses = _rows(tokenizer)
    batch = lm_batch(contexts, responses, pad_token_id=tokenizer.pad_token_id)
    policy = CausalLMPolicy(model, temperature=0.7, micro_batch_rows=3)
    assert policy._head is not None  # the transformers path: the LM head on the response positions only
    got = policy.token_logps(batch).detach()
    assert got.dtype == model.dtype
    for i, (c, r) in enumerate(zip(contexts, responses)):
        want = _independent_logps(model, c, r, 0.7)
        torch.testing.assert_close(got[i, : len(r)], want, rtol=0, atol=tol)
        assert torch.all(got[i, len(r) :] == 0)


def _independent_entropies(model, context, response, tau):
    """Per row, unpadded: the entropy of softmax(logits / tau) at each response position, from the model's logits."""
    ids = torch.tensor([context + response])
    logp = torch.log_softmax(model(input_ids=ids).logits[0] / tau, dim=-1)
    return torch.stack([-(logp[len(context) + j - 1].exp() * logp[len(context) + j - 1]).sum()
                        for j in range(len(response))])


@pytest.mark.parametrize("scoring, logprobs", [("prefix_shared", "chunked"), ("per_row", "reference")])
def test_token_entropies_match_unpadded_forward_with_their_gradients(tiny64, lm_batch, scoring, logprobs):
    """token_logps_and_entropies: the log-probabilities token_logps gives (the same numbers: the configured path) and
    each response position's entropy, from the same passes, equal to a per-row forward of the model's own logits; so
    is the gradient of the summed entropies."""
    model, tokenizer = tiny64
    contexts, responses = _rows(tokenizer)
    batch = lm_batch(contexts, responses, pad_token_id=tokenizer.pad_token_id)
    policy = CausalLMPolicy(model, temperature=0.7, micro_batch_rows=3, scoring=scoring, logprobs=logprobs)
    logp, entropy = policy.token_logps_and_entropies(batch)
    assert torch.equal(logp.detach(), policy.token_logps(batch).detach())
    torch.testing.assert_close(policy.token_entropies(batch).detach(), entropy.detach(), rtol=0, atol=1e-12)
    params = [p for p in model.parameters() if p.requires_grad]
    got = torch.autograd.grad(entropy.sum(), params, allow_unused=True)
    want_total = 0.0
    for i, (c, r) in enumerate(zip(contexts, responses)):
        want = _independent_entropies(model, c, r, 0.7)
        torch.testing.assert_close(entropy[i, : len(r)].detach(), want.detach(), rtol=0, atol=1e-10)
        assert torch.all(entropy[i, len(r):] == 0)
        want_total = want_total + want.sum()
    want_grads = torch.autograd.grad(want_total, params, allow_unused=True)
    for g, w in zip(got, want_grads):
        if w is None:
            assert g is None or bool((g == 0).all())
        else:
            torch.testing.assert_close(g, w, rtol=0, atol=1e-10)


def test_token_entropies_by_hand_from_the_model_s_own_logits(lm_batch):
    """A model without a separate head: after token 0 the next token has probabilities (1, 2, 3) / 6."""
    table = torch.log(torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 2.0], [1.0, 1.0, 1.0]], dtype=torch.float64))
    policy = CausalLMPolicy(BigramLM(table), temperature=1.0)
    _, entropy = policy.token_logps_and_entropies(lm_batch([[0]], [[2, 1]]))
    h0 = -sum(p * math.log(p) for p in (1 / 6, 2 / 6, 3 / 6))
    assert entropy[0, 0].item() == pytest.approx(h0, abs=1e-12) and entropy[0, 1].item() == pytest.approx(math.log(3), abs=1e-12)
    # a token the model can never emit (-inf, as a table model's outside its alphabet): it adds 0, and no nan
    table = torch.nn.Parameter(torch.log(torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 2.0], [1.0, 1.0, 1.0]], dtype=torch.float64)))
    model = BigramLM(table.detach().clone())
    _, entropy = CausalLMPolicy(model, temperature=1.0).token_logps_and_entropies(lm_batch([[0]], [[2]]))
    assert entropy[0, 0].item() == pytest.approx(math.log(2), abs=1e-12)
    (grad,) = torch.autograd.grad(entropy.sum(), model.table)
    assert bool(torch.isfinite(grad).all())


def test_padding_and_micro_batching_do_not_change_a_row(tiny64, lm_batch):
    model, tokenizer = tiny64
    contexts, responses = _rows(tokenizer)
    batch = lm_batch(contexts, responses, pad_token_id=tokenizer.pad_token_id)
    reference = CausalLMPolicy(model, micro_batch_rows=1).token_logps(batch).detach()
    # other micro-batch sizes and token budgets
    for size, budget in [(2, None), (4, None), (8, 40), (8, 1)]:
        got = CausalLMPolicy(model, micro_batch_rows=size, micro_batch_tokens=budget).token_logps(batch)
        torch.testing.assert_close(got.detach(), reference, rtol=0, atol=1e-12)
    # extra padding columns with another pad id, and the rows in reverse order
    wide = dict(batch.data)
    extra = 7
    wide["input_ids"] = torch.cat([batch.data["input_ids"], torch.full((4, extra), 3)], 1)
    wide["attention_mask"] = torch.cat([batch.data["attention_mask"], torch.zeros(4, extra, dtype=torch.long)], 1)
    flipped = batch.with_updates(data=wide).select(torch.tensor([3, 2, 1, 0]))
    got = CausalLMPolicy(model, micro_batch_rows=4).token_logps(flipped).detach()
    torch.testing.assert_close(got, reference.flip(0), rtol=0, atol=1e-12)


def test_a_valid_row_needs_a_context(tiny32, lm_batch):
    model, _ = tiny32
    with pytest.raises(ValueError, match="non-empty context"):
        CausalLMPolicy(model).token_logps(lm_batch([[]], [[5, 6]]))


def test_micro_batches_respect_the_token_budget():
    lengths = torch.tensor([10, 3, 7, 5, 9])
    parts = list(micro_batches(lengths, torch.arange(5), micro_batch_rows=4, max_tokens=20))
    assert sorted(torch.cat(parts).tolist()) == [0, 1, 2, 3, 4]
    for part in parts:
        assert len(part) <= 4 and (len(part) == 1 or len(part) * lengths[part].max() <= 20)
    assert [p.tolist() for p in parts] == [[0, 4], [2, 3], [1]]  # longest first


def test_placeholders_give_zero_and_no_gradient(tiny64, lm_batch):
    model, tokenizer = tiny64
    model = copy.deepcopy(model)
    contexts, responses = _rows(tokenizer)
    policy = CausalLMPolicy(model, micro_batch_rows=2)
    full = lm_batch(contexts, responses, valid=[True, False, True, False])
    real = full.select(torch.tensor([0, 2]))

    def grads(batch):
        model.zero_grad()
        out = policy.token_logps(batch)
        out.sum().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters()]

    out_full, g_full = grads(full)
    out_real, g_real = grads(real)
    assert torch.all(out_full[[1, 3]] == 0)
    torch.testing.assert_close(out_full[[0, 2]], out_real, rtol=0, atol=1e-12)
    for a, b in zip(g_full, g_real):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert any(g.abs().sum() > 0 for g in g_full)


def test_reference_policy_is_frozen(tiny64, lm_batch):
    model, tokenizer = tiny64
    model = copy.deepcopy(model)
    contexts, responses = _rows(tokenizer)
    batch = lm_batch(contexts, responses)
    ref = ReferencePolicy(model, temperature=0.9)
    policy = CausalLMPolicy(model, temperature=0.9)
    before = ref.logp_ref(batch)
    assert not before.requires_grad
    torch.testing.assert_close(before, policy.token_logps(batch).detach(), rtol=0, atol=1e-12)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    torch.testing.assert_close(ref.logp_ref(batch), before, rtol=0, atol=0)
    assert (policy.token_logps(batch).detach() - before).abs().max() > 1e-4


def test_value_model_reads_the_state_before_each_token(tiny64, lm_batch):
    model, tokenizer = tiny64
    contexts, responses = _rows(tokenizer)
    batch = lm_batch(contexts, responses, valid=[True, True, False, True])
    critic = ValueModel.from_causal_lm(model, micro_batch_rows=3)
    assert torch.all(critic.values(batch) == 0)  # zero-initialised head
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        critic.head.weight.copy_(torch.randn(critic.head.weight.shape, generator=gen, dtype=torch.float64))
        critic.head.bias.fill_(0.5)
    values = critic.values(batch)
    assert values.requires_grad
    assert torch.all(values[2] == 0)
    for i in [0, 1, 3]:
        c, r = contexts[i], responses[i]
        with torch.no_grad():
            hidden = model.base_model(input_ids=torch.tensor([c + r])).last_hidden_state[0]
            # V before token j is read at the last token of context + response[:j]
            want = critic.head(hidden[len(c) - 1 : len(c) + len(r) - 1]).squeeze(-1)
        torch.testing.assert_close(values[i, : len(r)].detach(), want, rtol=0, atol=1e-10)
        assert torch.all(values[i, len(r) :] == 0)


def test_clipped_value_loss_by_hand():
    old = torch.tensor([[0.0, 1.0]])
    ret = torch.tensor([[1.0, 1.0]])
    new = torch.tensor([[0.5, 2.0]])
    mask = torch.tensor([[True, True]])
    # token 0: unclipped (0.5-1)^2 = 0.25; clipped 0+0.2 -> (0.2-1)^2 = 0.64; max = 0.64
    # token 1: unclipped (2-1)^2 = 1;      clipped 1+0.2 -> (1.2-1)^2 = 0.04; max = 1
    assert clipped_value_loss(new, old, ret, mask, 0.2).item() == pytest.approx(0.5 * (0.64 + 1.0) / 2)
    assert clipped_value_loss(new, old, ret, mask, None).item() == pytest.approx(0.5 * (0.25 + 1.0) / 2)
    only_first = torch.tensor([[True, False]])
    assert clipped_value_loss(new, old, ret, only_first, 0.2).item() == pytest.approx(0.5 * 0.64)
    assert clipped_value_loss(new, old, ret, torch.zeros_like(mask), 0.2).item() == 0.0


def test_bfloat16_model_scores_in_float32(tiny32, lm_batch):
    model, tokenizer = tiny32
    contexts, responses = _rows(tokenizer)
    batch = lm_batch(contexts, responses)
    half = copy.deepcopy(model).to(torch.bfloat16)
    got = CausalLMPolicy(half).token_logps(batch).detach()
    assert got.dtype == torch.float32
    want = CausalLMPolicy(model).token_logps(batch).detach()
    # bf16 weights and activations: close to the float32 model, not equal
    assert (got - want).abs().max() < 0.1
    critic = ValueModel.from_causal_lm(half)
    assert critic.values(batch).dtype == torch.bfloat16


def test_an_entropy_bonus_alone_raises_the_language_model_s_entropy(tiny64, lm_batch):
    """policy_update with zero advantages and entropy_coef > 0 on the tiny Qwen3: the step follows the entropy's
    gradient (one forward per pass gives both the log-probabilities and the entropies), the entropy rises, and the
    update records the aggregated entropy (actor/entropy)."""
    from seeupo.core.config import preset
    from seeupo.core.update import UpdateSettings, policy_update
    from seeupo.llm.metrics import update_metrics

    model, tokenizer = copy.deepcopy(tiny64[0]), tiny64[1]
    contexts, responses = _rows(tokenizer)
    batch = lm_batch(contexts, responses, pad_token_id=tokenizer.pad_token_id)
    policy = CausalLMPolicy(model, micro_batch_rows=2)
    before = policy.token_entropies(batch).detach()
    batch = batch.with_updates(logp_old=policy.token_logps(batch).detach())
    cfg = preset("grpo", entropy_coef=0.1)
    stats = policy_update(policy, torch.optim.SGD(model.parameters(), lr=1.0), batch,
                          torch.zeros(batch.token_mask.shape, dtype=torch.float64), cfg, UpdateSettings())
    after = policy.token_entropies(batch).detach()
    real = batch.token_mask
    assert float(after[real].mean()) > float(before[real].mean()) + 1e-4
    assert len(stats.entropy) == stats.steps == 1 and stats.entropy[0] == pytest.approx(float(before[real].mean()), rel=1e-6)
    assert "actor/entropy" in update_metrics(batch, stats, torch.zeros(0), lr=1.0, prep_s=0.0, update_s=0.0)
