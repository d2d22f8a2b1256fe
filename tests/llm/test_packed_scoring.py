"""Packed and prefix-shared scoring against the per-row layout.

``"packed"``: each trajectory's longest row forwarded once gives every earlier turn's numbers;
``"prefix_shared"``: the same, with each group's shared prompt forwarded once per pass (a key/value
cache kept in the autograd graph). The reference is the per-row layout (``scoring="per_row"``):
log-probabilities, values and parameter gradients must agree to rounding, with micro-batches,
dummy passes, activation checkpointing and a core update, while each layout forwards exactly the
tokens it should.
"""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers", reason="tests/llm need transformers and tokenizers (pip install -e '.[llm]')")
pytest.importorskip("tokenizers", reason="tests/llm need transformers and tokenizers (pip install -e '.[llm]')")

from seeupo.core.batch import SampleBatch
from seeupo.core.config import preset
from seeupo.core.update import UpdateSettings, compute_advantages, policy_update
from seeupo.llm.agent import AgentLimits, StepResult, run_episodes
from seeupo.llm.distributed import enable_activation_checkpointing
from seeupo.llm.models import norms_in_model_dtype
from seeupo.llm.policy import CausalLMPolicy, ReferencePolicy, ValueModel, effective_scoring, shared_micro_batches
from seeupo.llm.tree_attention import call_tokens, enable_tree_attention, tree_of
from seeupo.llm.layout import pack_rows, packing_plan, shared_prefix_lengths
from seeupo.llm.rollout import Completion, SamplingParams

# float64 agreement of the packed and per-row layouts on a model that computes in float64 throughout
# (measured: log-probabilities equal, gradients 6e-15). transformers' RMSNorm computes in float32
# whatever the input dtype; with it, float64 log-probabilities still agree to 1e-15, but each norm's
# backward pass rounds its incoming gradient to float32, and the packed layout sums the gradients
# of the turns before that rounding where the per-row layout rounds each turn's own: parameter
# gradients then agree to float32 precision (measured: 8e-8 of the largest gradient).
TOL64 = 1e-12
STOCK64_GRAD_REL = 1e-6
# float32 (measured: 5e-7 on log-probabilities, 3e-6 on gradients of size 9: the same as
# between two micro-batch sizes of the per-row layout, the summation order of longer passes)
TOL32 = 2e-5


@pytest.fixture(scope="module")
def exact64(tiny64):
    """``(model, tokenizer)``: the float64 tiny Qwen3 with its norms in float64 too (a copy)."""
    model, tokenizer = tiny64
    return norms_in_model_dtype(copy.deepcopy(model)), tokenizer


def _multi_turn_batch(vocab: int, seed: int = 0) -> tuple[SampleBatch, list[int]]:
    """Six trajectories of up to 4 turns with random token ids, rows in a random order.

    Turn ``t``'s context is the prompt and every earlier response and observation, so each row
    is a prefix of the next turn's; episodes that end early have placeholder rows. Trajectory 3
    changed its context's second token after turn 0 (a re-encoded history): its turn 0 is not
    a prefix of its later turns. Returns the batch and the indices of the rows the packed layout
    must forward (each trajectory's last live turn, and trajectory 3's turn 0).
    """
    gen = torch.Generator().manual_seed(seed)
    rand = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=gen))  # noqa: E731
    tokens = lambda k: torch.randint(3, vocab, (k,), generator=gen).tolist()  # noqa: E731
    T, turns = 4, [4, 2, 1, 3, 4, 3]
    contexts, responses, traj, carriers = [], [], [], []
    prompts = [tokens(rand(5, 12)) for _ in range(len(turns) // 2)]
    for k, n_turns in enumerate(turns):
        # the two trajectories of a group start from their group's prompt, then differ
        history = prompts[k // 2] + tokens(rand(0, 2))
        for t in range(T):
            traj.append(k)
            if t >= n_turns:  # the episode ended: a placeholder
                contexts.append([]), responses.append([])
                continue
            if k == 3 and t == 1:  # re-encoded history: not an extension of turn 0's row
                history[1] = 3 + (history[1] - 3 + 1) % (vocab - 3)
            response = tokens(rand(2, 6))
            contexts.append(list(history)), responses.append(response)
            history += response + tokens(rand(1, 4))
            if t == n_turns - 1 or (k == 3 and t == 0):
                carriers.append(len(contexts) - 1)
    n = len(contexts)
    L = max(len(r) for r in responses)
    token_mask = torch.zeros(n, L, dtype=torch.bool)
    for i, r in enumerate(responses):
        token_mask[i, : len(r)] = True
    traj_id = torch.tensor(traj)
    returns = torch.randn(len(turns), generator=gen, dtype=torch.float64)[traj_id]
    batch = SampleBatch(
        traj_id=traj_id, group_id=traj_id // 2, turn=torch.arange(n) % T,
        logp_old=-torch.rand(n, L, generator=gen, dtype=torch.float64) * token_mask, token_mask=token_mask,
        valid=torch.tensor([len(r) > 0 for r in responses]), reward=returns * (torch.arange(n) % T == 0),
        traj_return=returns, weight=torch.ones(n, dtype=torch.float64), instance=torch.zeros(n, dtype=torch.long),
        data=pack_rows(contexts, responses, pad_token_id=0),
    )
    perm = torch.randperm(n, generator=gen)
    position = torch.argsort(perm)  # row i of the batch is now at position[i]
    return batch.select(perm), sorted(int(position[i]) for i in carriers)


LAYOUTS = ("packed", "prefix_shared")


def _count_tokens(model: torch.nn.Module) -> tuple[list[int], torch.utils.hooks.RemovableHandle]:
    """A list that receives the real tokens each forward call of ``model``'s backbone computes, and the hook's handle."""
    counts: list[int] = []

    def hook(module, args, kwargs):
        counts.append(call_tokens(kwargs["input_ids"], kwargs["attention_mask"])[0])

    return counts, model.base_model.register_forward_pre_hook(hook, with_kwargs=True)


def _grads(module: torch.nn.Module, loss_of) -> list[torch.Tensor]:
    """The parameter gradients of ``loss_of()`` (zeros where a parameter gets none)."""
    module.zero_grad(set_to_none=True)
    loss_of().backward()
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in module.parameters()]
    module.zero_grad(set_to_none=True)
    return grads


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def test_packing_plan_by_hand():
    ids = torch.tensor([
        [1, 2, 3, 0, 0, 0, 0],  # 0: traj 0, prefix of row 2
        [5, 6, 9, 0, 0, 0, 0],  # 1: traj 1, not a prefix of row 3 (9 != 7)
        [1, 2, 3, 4, 5, 6, 7],  # 2: traj 0, longest: a carrier
        [5, 6, 7, 8, 0, 0, 0],  # 3: traj 1, longest: a carrier
        [5, 6, 0, 0, 0, 0, 0],  # 4: traj 1, prefix of rows 3 and 1: the longest carrier (row 3) carries it
        [1, 2, 3, 4, 5, 0, 0],  # 5: traj 2, a prefix of row 2 but another trajectory: a carrier
        [1, 2, 3, 0, 0, 0, 0],  # 6: traj 2, prefix of row 5
        [1, 2, 3, 4, 5, 0, 0],  # 7: traj 2, equal to row 5: the earlier row carries it
    ])
    lengths = torch.tensor([3, 3, 7, 4, 2, 5, 3, 5])
    traj = torch.tensor([0, 1, 0, 1, 1, 2, 2, 2])
    assert packing_plan(traj, ids, lengths).tolist() == [2, 1, 2, 3, 3, 5, 5, 5]
    # the padding beyond a row's length is never compared
    assert packing_plan(torch.tensor([0, 0]), torch.tensor([[4, 9], [4, 7]]), torch.tensor([1, 2])).tolist() == [1, 1]
    assert packing_plan(torch.zeros(0, dtype=torch.long), torch.zeros(0, 3, dtype=torch.long), torch.zeros(0)).numel() == 0


def test_the_hand_batch_is_what_it_claims(tiny64):
    model, _ = tiny64
    batch, carriers = _multi_turn_batch(model.config.vocab_size)
    live = batch.valid.nonzero().squeeze(1)
    plan = live[packing_plan(batch.traj_id[live], batch.data["input_ids"][live], batch.data["attention_mask"][live].sum(1))]
    assert sorted(set(plan.tolist())) == carriers
    assert int((~batch.valid).sum()) == 7 and len(carriers) == 7 and live.numel() == 17


def _prefix_shared_tokens(batch: SampleBatch, carriers: list[int]) -> int:
    """The tokens one prefix-shared pass over ``carriers`` computes, by hand: each group's common
    prefix (up to the first logit any of its rows reads, at least one token) once, then the rest of
    every carrier."""
    ids, lengths, start = batch.data["input_ids"], batch.data["attention_mask"].sum(1), batch.data["response_start"]
    total = 0
    for g in sorted(set(batch.group_id[carriers].tolist())):
        members = [c for c in carriers if int(batch.group_id[c]) == g]
        cap = min(int(start[i]) - 1 for i in range(batch.num_rows) if int(batch.group_id[i]) == g and batch.valid[i])
        rows = [ids[c, : int(lengths[c])].tolist() for c in members]
        common = 0
        while common < cap and all(row[common] == rows[0][common] for row in rows):
            common += 1
        total += common + sum(int(lengths[c]) - common for c in members)
    return total


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("size,budget", [(8, None), (1, None), (3, 60), (8, 1)])
def test_log_probs_and_gradients_equal_per_row(exact64, layout, size, budget):
    model, _ = exact64
    model = copy.deepcopy(model)
    batch, carriers = _multi_turn_batch(model.config.vocab_size)
    lengths = batch.data["attention_mask"].sum(1)
    weights = torch.randn(batch.token_mask.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    per_row = CausalLMPolicy(model, temperature=0.8, scoring="per_row")
    policy = CausalLMPolicy(model, temperature=0.8, micro_batch_rows=size, micro_batch_tokens=budget, scoring=layout)

    counts, handle = _count_tokens(model)
    want = per_row.token_logps(batch)
    per_row_tokens, counts[:] = sum(counts), []
    got = policy.token_logps(batch)
    handle.remove()
    assert per_row_tokens == int(lengths[batch.valid].sum())
    packed_tokens = int(lengths[carriers].sum())
    if layout == "packed":
        assert sum(counts) == packed_tokens < per_row_tokens
    elif size == 8 and budget is None:  # one pass, one call
        assert len(counts) == 1 and sum(counts) == _prefix_shared_tokens(batch, carriers) < packed_tokens
    if budget == 1:  # the budget counts the forwarded tokens: one carrier per pass (one call each)
        assert len(counts) == len(carriers)
    elif budget is not None:
        assert len(counts) > 1 and max(counts) <= max(budget, int(lengths.max()))
    assert got.dtype == torch.float64 and torch.all(got[~batch.token_mask] == 0)
    assert (got - want).abs().max() <= TOL64

    grads_want = _grads(model, lambda: (per_row.token_logps(batch) * weights).sum())
    grads_got = _grads(model, lambda: (policy.token_logps(batch) * weights).sum())
    assert max(float(g.abs().max()) for g in grads_want) > 1e-3  # the loss reaches the weights
    assert _max_diff(grads_got, grads_want) <= TOL64


@pytest.mark.parametrize("layout", ("per_row",) + LAYOUTS)
def test_rows_that_are_not_right_padded_are_refused(exact64, layout):
    # every layout reads a row from column 0: left padding (or a hole in the mask) would be scored wrong silently
    model = copy.deepcopy(exact64[0])
    batch, _ = _multi_turn_batch(model.config.vocab_size)
    data, pad = batch.data, torch.zeros(batch.num_rows, 1, dtype=torch.long)
    left_padded = batch.with_updates(data={
        **data, "input_ids": torch.cat([pad, data["input_ids"]], 1), "attention_mask": torch.cat([pad, data["attention_mask"]], 1),
        "response_start": data["response_start"] + 1})
    row = int(batch.valid.nonzero()[0])
    holed_mask = data["attention_mask"].clone()
    holed_mask[row, 1] = 0  # every context has at least 5 tokens
    holed = batch.with_updates(data={**data, "attention_mask": holed_mask})
    policy = CausalLMPolicy(model, scoring=layout)
    reference = ReferencePolicy(model, scoring=layout, copy_model=False)
    critic = ValueModel.from_causal_lm(model, copy_model=False, scoring=layout)
    want = CausalLMPolicy(model, scoring="per_row").token_logps(batch)
    with torch.no_grad():
        for score in (policy.token_logps, reference.logp_ref, critic.values):
            score(batch)  # right padding is scored as before
            with pytest.raises(ValueError, match=r"rows must be right-padded .*: row \d+'s attention_mask starts with 0"):
                score(left_padded)
            with pytest.raises(ValueError, match=f"row {row}'s attention_mask has a 0 between 1s"):
                score(holed)
        assert (policy.token_logps(batch) - want).abs().max() <= TOL64
        with pytest.raises(ValueError, match="right-padded"):
            policy.micro_batches(left_padded, 8, None, False)  # the update's planning of its passes too


def test_prefix_shared_is_the_default():
    assert CausalLMPolicy(torch.nn.Linear(1, 1)).scoring == "prefix_shared"


def test_shared_prefix_lengths_by_hand():
    ids = torch.tensor([
        [1, 2, 3, 4, 0],  # 0: group 0
        [1, 2, 3, 9, 9],  # 1: group 0: shares 3 tokens with row 0
        [1, 2, 7, 0, 0],  # 2: group 1, alone: its limit
        [5, 6, 7, 8, 9],  # 3: group 2
        [5, 6, 7, 8, 9],  # 4: group 2: equal to row 3; row 3's limit (2) binds
        [4, 4, 0, 0, 0],  # 5: group 3: the padding beyond length 1 is never compared
        [4, 5, 0, 0, 0],  # 6: group 3
    ])
    group = torch.tensor([0, 0, 1, 2, 2, 3, 3])
    lengths = torch.tensor([4, 5, 3, 5, 5, 1, 2])
    limit = torch.tensor([4, 4, 2, 2, 4, 5, 5])
    assert shared_prefix_lengths(group, ids, lengths, limit).tolist() == [3, 3, 2, 2, 2, 1, 1]


def test_shared_micro_batches_by_hand():
    group = torch.tensor([0, 0, 0, 1, 1])
    prefix = torch.tensor([10, 10, 10, 4, 4])
    lengths = torch.tensor([12, 15, 11, 9, 6])
    rows = torch.arange(5)
    # no limit that binds: one pass, group by group, longest first
    assert [b.tolist() for b in shared_micro_batches(group, prefix, lengths, rows, 8, None)] == [[1, 0, 2, 3, 4]]
    # packed, no padding: group 0 alone is 10 (its prefix) + 5 + 2 + 1 (the rests) = 18 tokens; with
    # row 3: + 4 (group 1's prefix) + 5 = 27 <= 27; with row 4 too: + 2 = 29 > 27
    assert [b.tolist() for b in shared_micro_batches(group, prefix, lengths, rows, 8, 27)] == [[1, 0, 2, 3], [4]]
    assert [b.tolist() for b in shared_micro_batches(group, prefix, lengths, rows, 8, 17)] == [[1, 0], [2], [3, 4]]
    assert [b.tolist() for b in shared_micro_batches(group, prefix, lengths, rows, 2, None)] == [[1, 0], [2, 3], [4]]
    # a row over the budget still gets a pass of its own
    assert [b.tolist() for b in shared_micro_batches(group, prefix, lengths, rows, 8, 5)] == [[1], [0], [2], [3], [4]]


def test_prefix_shared_falls_back_where_it_cannot_run(exact64):
    model, _ = exact64
    sliding = copy.deepcopy(model)
    sliding.config.layer_types = ["sliding_attention"] * len(sliding.config.layer_types)
    sliding.config.sliding_window = 4
    assert "not all its layers are full attention" in enable_tree_attention(sliding)
    assert enable_tree_attention(model) is None
    # the same from a copy of a model that was already enabled (the answer kept on the model)
    enabled_then_sliding = copy.deepcopy(model)
    enabled_then_sliding.config.layer_types = ["sliding_attention"] * len(model.config.layer_types)
    enabled_then_sliding.config.sliding_window = 4
    assert "not all its layers are full attention" in enable_tree_attention(enabled_then_sliding)
    with pytest.warns(UserWarning, match="falls back to 'packed'.*not all its layers are full attention"):
        assert effective_scoring(sliding, "prefix_shared") == "packed"
    assert effective_scoring(sliding, "per_row") == "per_row"
    with pytest.raises(ValueError, match="unknown scoring 'rows'"):
        effective_scoring(model, "rows")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_stock_float64_bound(tiny64, layout):
    model, _ = tiny64
    batch, _ = _multi_turn_batch(model.config.vocab_size)
    weights = torch.randn(batch.token_mask.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    per_row = CausalLMPolicy(model, scoring="per_row")
    packed = CausalLMPolicy(model, micro_batch_rows=3, scoring=layout)
    assert (packed.token_logps(batch) - per_row.token_logps(batch)).abs().max() <= TOL64
    grads_got = _grads(model, lambda: (packed.token_logps(batch) * weights).sum())
    grads_want = _grads(model, lambda: (per_row.token_logps(batch) * weights).sum())
    assert _max_diff(grads_got, grads_want) <= STOCK64_GRAD_REL * max(float(g.abs().max()) for g in grads_want)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_float32_bound(tiny32, layout):
    model, _ = tiny32
    batch, _ = _multi_turn_batch(model.config.vocab_size)
    weights = torch.randn(batch.token_mask.shape, generator=torch.Generator().manual_seed(2))
    per_row = CausalLMPolicy(model, scoring="per_row")
    packed = CausalLMPolicy(model, scoring=layout, micro_batch_rows=3)
    assert (packed.token_logps(batch) - per_row.token_logps(batch)).abs().max() <= TOL32
    grads_got = _grads(model, lambda: (packed.token_logps(batch) * weights).sum())
    grads_want = _grads(model, lambda: (per_row.token_logps(batch) * weights).sum())
    assert _max_diff(grads_got, grads_want) <= TOL32


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bfloat16(tiny32, layout):
    model, _ = tiny32
    batch, _ = _multi_turn_batch(model.config.vocab_size)
    half = copy.deepcopy(model).to(torch.bfloat16)
    with torch.no_grad():
        got = CausalLMPolicy(half, scoring=layout).token_logps(batch)
        per_row = CausalLMPolicy(half, scoring="per_row").token_logps(batch)
        full = CausalLMPolicy(model, scoring="per_row").token_logps(batch)
    assert got.dtype == torch.float32  # softmax in float32 whatever the layout
    # bf16 activations: the layouts differ by bf16 rounding (measured 5e-4; two micro-batch sizes of
    # the per-row layout: 1e-3), each 2e-3 from the float32 model
    assert (got - per_row).abs().max() < 5e-3
    assert (got - full).abs().max() < 1e-2


@pytest.mark.parametrize("layout", LAYOUTS)
def test_dummy_passes_and_activation_checkpointing(exact64, layout):
    class ExtraPasses:
        """Stands in for a DataParallel whose busiest process makes 2 more passes than this one."""

        def max(self, value):
            return value + 2

    model, _ = exact64
    batch, carriers = _multi_turn_batch(model.config.vocab_size)
    weights = torch.randn(batch.token_mask.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    plain = copy.deepcopy(model)
    per_row = CausalLMPolicy(plain, scoring="per_row")
    want = per_row.token_logps(batch).detach()
    grads_want = _grads(plain, lambda: (per_row.token_logps(batch) * weights).sum())

    checkpointed = copy.deepcopy(model)
    enable_activation_checkpointing(checkpointed)
    packed = CausalLMPolicy(checkpointed, micro_batch_rows=2, collective=ExtraPasses(), scoring=layout)
    assert effective_scoring(checkpointed, layout) == layout
    counts, handle = _count_tokens(checkpointed)
    got = packed.token_logps(batch)
    handle.remove()
    # one call per pass; the dummy passes: one token each
    assert len(counts) == (len(carriers) + 1) // 2 + 2 and counts[-2:] == [1, 1]
    assert (got.detach() - want).abs().max() <= TOL64
    grads_got = _grads(checkpointed, lambda: (packed.token_logps(batch) * weights).sum())
    assert _max_diff(grads_got, grads_want) <= TOL64


@pytest.mark.parametrize("layout", LAYOUTS)
def test_reference_and_critic_pack_too(exact64, layout):
    model, _ = exact64
    batch, carriers = _multi_turn_batch(model.config.vocab_size)
    lengths = batch.data["attention_mask"].sum(1)
    for scoring in (layout, "per_row"):
        reference = ReferencePolicy(model, scoring=scoring)
        if scoring == layout:
            got = reference.logp_ref(batch)
        else:
            want = reference.logp_ref(batch)
    assert (got - want).abs().max() <= TOL64

    critic = ValueModel.from_causal_lm(model, micro_batch_rows=8, scoring=layout)
    with torch.no_grad():  # a head that reads the hidden state (the default one starts at zero)
        critic.head.weight.copy_(torch.randn(critic.head.weight.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64))
    per_row = copy.deepcopy(critic)
    per_row.scoring = "per_row"
    weights = torch.randn(batch.token_mask.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    counts, handle = _count_tokens(critic.backbone)
    values = critic.values(batch)
    handle.remove()
    want_tokens = int(lengths[carriers].sum()) if layout == "packed" else _prefix_shared_tokens(batch, carriers)
    assert sum(counts) == want_tokens
    assert float(values.detach().abs().max()) > 1e-3 and torch.all(values[~batch.token_mask] == 0)
    assert (values - per_row.values(batch)).abs().max() <= TOL64
    grads_got = _grads(critic, lambda: (critic.values(batch) * weights).sum())
    grads_want = _grads(per_row, lambda: (per_row.values(batch) * weights).sum())
    assert _max_diff(grads_got, grads_want) <= TOL64


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ["seeupo", "grpo"])
@pytest.mark.parametrize("micro_rows,micro_tokens", [(None, None), (3, 80)])
def test_a_core_update_is_the_same_with_either_layout(exact64, layout, name, micro_rows, micro_tokens):
    model, _ = exact64
    batch, _ = _multi_turn_batch(model.config.vocab_size)
    cfg = preset(name, group_size=2, kl_coef=0.05)
    advantages = compute_advantages(batch, cfg)
    after = {}
    for scoring in ("per_row", layout):
        trained = copy.deepcopy(model)
        policy = CausalLMPolicy(trained, scoring=scoring)
        reference = ReferencePolicy(model, scoring=scoring)
        stats = policy_update(policy, torch.optim.SGD(policy.parameters(), lr=0.5), batch, advantages, cfg, UpdateSettings(
            logp_ref=reference.logp_ref(batch), micro_batch_rows=micro_rows, micro_batch_tokens=micro_tokens,
            row_tokens=batch.data["attention_mask"].sum(1),
        ))
        after[scoring] = ([p.detach().clone() for p in trained.parameters()], stats)
    (p_row, s_row), (p_packed, s_packed) = after["per_row"], after[layout]
    assert s_row.steps == s_packed.steps >= 1
    assert max(abs(a - b) for a, b in zip(s_row.objective, s_packed.objective)) <= TOL64
    assert _max_diff(p_row, [p.detach() for p in model.parameters()]) > 1e-5  # the update moved the weights
    assert _max_diff(p_packed, p_row) <= TOL64


class CountingEnv:
    """Task ``length``: the episode lasts ``length`` turns, each answered by a short observation."""

    def reset(self, task):
        self.length, self.k = task, 0
        return [{"role": "system", "content": "Count."}, {"role": "user", "content": "Go."}]

    def step(self, assistant_text, token_ids):
        self.k += 1
        done = self.k >= self.length
        return StepResult(None if done else f"turn {self.k} ok", float(self.k), done, {})


class ScriptedEngine:
    """Answers ``"answer <call number>"`` and the end-of-turn token."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, 0

    def generate(self, prompts, n, params):
        self.calls += 1
        ids = self.tokenizer.encode(f"answer {self.calls}", add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return [[Completion(list(ids), [-0.5] * len(ids), "stop") for _ in range(n)] for _ in prompts]

    def sync_weights(self, model):
        pass


def test_agent_loop_batches_pack_to_one_pass_per_trajectory(tiny64):
    model, tokenizer = tiny64
    params = SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=(tokenizer.eos_token_id,), seed=0)
    out = run_episodes(ScriptedEngine(tokenizer), tokenizer, CountingEnv, [3, 1, 2], 2, params, AgentLimits(max_turns=3))
    batch = out.batch
    assert int((~batch.valid).sum()) == 6  # the early-ended episodes' placeholders
    lengths = batch.data["attention_mask"].sum(1)
    # built before counting: the first policy of a model probes its tree attention with two tiny forwards, which
    # the count would take for scoring passes when no earlier test in this process built one (the order varies)
    policy = CausalLMPolicy(model, micro_batch_rows=1, scoring="packed")
    counts, handle = _count_tokens(model)
    got = policy.token_logps(batch)
    handle.remove()
    # one pass per trajectory, of its last turn: the agent loop's rows are prefixes of each other
    last = torch.zeros(batch.num_trajectories, dtype=torch.long).scatter_reduce(0, batch.traj_id, lengths, "amax")
    assert sorted(counts) == sorted(last.tolist())
    assert sum(counts) < int(lengths.sum())
    want = CausalLMPolicy(model, scoring="per_row").token_logps(batch)
    assert (got - want).abs().max() <= TOL64
    # a task's two rollouts start from the same prompt: prefix-shared scoring forwards it once per task
    prefix_shared = CausalLMPolicy(model, scoring="prefix_shared")
    counts, handle = _count_tokens(model)
    shared = prefix_shared.token_logps(batch)
    handle.remove()
    assert len(counts) == 1 and sum(counts) < int(last.sum())  # one pass, one call
    assert (shared - want).abs().max() <= TOL64


@pytest.mark.parametrize("layout", ("per_row",) + LAYOUTS)
def test_fused_ratio_passes_make_the_same_language_model_update(exact64, layout):
    # SeeUPO's reverse sweep: turn t's ratio is read in turn t-1's first optimizer step, whose rows are
    # prefixes of turn t's: packed layouts forward turn t's rows once for both, with gradient
    model, _ = exact64
    batch, _ = _multi_turn_batch(model.config.vocab_size)
    cfg = preset("seeupo", group_size=2, kl_coef=0.05)
    advantages = compute_advantages(batch, cfg)
    logp_ref = ReferencePolicy(model, scoring=layout).logp_ref(batch)
    after, tokens = {}, {}
    for fuse in (False, True):
        trained = copy.deepcopy(model)
        policy = CausalLMPolicy(trained, scoring=layout)
        counts, handle = _count_tokens(trained)
        stats = policy_update(policy, torch.optim.SGD(policy.parameters(), lr=0.5), batch, advantages, cfg,
                              UpdateSettings(logp_ref=logp_ref, fuse_ratio_passes=fuse))
        handle.remove()
        after[fuse], tokens[fuse] = ([p.detach().clone() for p in trained.parameters()], stats), sum(counts)
    (p_ref, s_ref), (p_fused, s_fused) = after[False], after[True]
    assert _max_diff(p_ref, [p.detach() for p in model.parameters()]) > 1e-5  # the update moved the weights
    assert _max_diff(p_fused, p_ref) <= TOL64
    assert max(abs(a - b) for a, b in zip(s_ref.objective, s_fused.objective)) <= TOL64
    assert (s_fused.factor - s_ref.factor).abs().max() <= TOL64
    if layout == "per_row":  # every row forwarded by itself: the same rows, in fewer calls
        assert tokens[True] == tokens[False]
    else:  # the finished turn's rows carry the next turn's: fewer tokens
        assert tokens[True] < tokens[False]


@pytest.mark.parametrize("layout", ("per_row",) + LAYOUTS)
@pytest.mark.parametrize("whole", [False, True])
def test_the_update_micro_batches_are_the_policys_passes(exact64, layout, whole):
    model, _ = exact64
    batch, _ = _multi_turn_batch(model.config.vocab_size)
    policy = CausalLMPolicy(model, scoring=layout, micro_batch_rows=2, micro_batch_tokens=40)
    parts = policy.micro_batches(batch, 2, 40, whole)
    # every row exactly once (placeholders included)
    assert sorted(torch.cat(parts).tolist()) == list(range(batch.num_rows)) and len(parts) > 1
    for part in parts:
        if whole:  # a trajectory's rows never span two micro-batches
            others = torch.cat([q for q in parts if q is not part])
            assert not set(batch.traj_id[part].tolist()) & set(batch.traj_id[others].tolist())
        calls: list[tuple[int, int]] = []  # (rows, real tokens computed) of each model call
        def hook(module, args, kw):
            mask = kw["attention_mask"]
            # a packed row: its branches are the rows it forwards
            tree = tree_of(mask)
            rows = int((tree.branch.unique() >= 0).sum()) if tree is not None else kw["input_ids"].shape[0]
            calls.append((rows, call_tokens(kw["input_ids"], mask)[0]))

        handle = model.base_model.register_forward_pre_hook(hook, with_kwargs=True)
        with torch.no_grad():
            policy.token_logps(batch.select(part))
        handle.remove()
        if not whole:  # each micro-batch is one pass of the policy (0 calls: placeholders only)
            assert len(calls) in (0, 1)
            # within the limits: at most 2 rows forwarded, 40 tokens unless a single row is longer
            if calls:
                assert calls[-1][0] <= 2 and (sum(c[1] for c in calls) <= 40 or calls[-1][0] == 1)
