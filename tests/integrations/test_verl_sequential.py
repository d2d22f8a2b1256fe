"""seeupo.integrations.verl_sequential: SeeUPO's sweep on verl's one-row-per-trajectory batches.

Marked ``verl`` (``make test-verl``: verl 0.9.1's ``DataProto`` and its ``balance_batch``
partitioner). The same trajectories are built twice from token lists: as the toolkit's
per-(trajectory, turn) batch, directly, and as verl's agent-loop batch (left-padded prompts, the
turns and tool tokens in one response, ``response_mask``). One update of a float64 tiny Qwen3
through :func:`sequential_update` on verl's batch must equal :func:`policy_update` on the direct
batch (parameters and ``M``), also after verl re-orders the rows.
"""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest
import torch

pytestmark = pytest.mark.verl

from seeupo.core.batch import SampleBatch
from seeupo.core.config import preset
from seeupo.core.update import UpdateSettings, compute_advantages, policy_update
from seeupo.llm.layout import pack_rows

try:
    from verl import DataProto
    from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

    from seeupo.integrations.verl_sequential import sample_batch_from_verl, sequential_update, turn_spans
except ImportError:  # `make test` deselects this module; elsewhere each test skips with the reason
    DataProto = None

PAD = 0
TOL = 1e-10


@pytest.fixture(autouse=True)
def _needs_verl():
    if DataProto is None:
        pytest.skip("verl is not installed (make test-verl builds an environment with verl==0.9.1)")


@pytest.fixture(scope="module")
def tiny():
    pytest.importorskip("transformers")
    from seeupo.llm.models import norms_in_model_dtype, tiny_qwen3

    # float64 throughout: transformers' RMSNorm rounds its gradient to float32 otherwise, and the
    # packed and per-row layouts round different sums (tests/llm/test_packed_scoring.py)
    return norms_in_model_dtype(tiny_qwen3(seed=0, dtype=torch.float64)[0])


def episodes(seed: int, n_groups: int = 2, group: int = 4, max_turns: int = 3):
    """Random trajectories as token lists: ``(uid, prompt, [(turn tokens, observation tokens)], per-turn rewards)``."""
    rng = random.Random(seed)
    out = []
    for g in range(n_groups):
        prompt = [rng.randrange(5, 400) for _ in range(rng.randint(3, 7))]
        for _ in range(group):
            turns = []
            for t in range(rng.randint(1, max_turns)):
                turn = [rng.randrange(5, 400) for _ in range(rng.randint(1, 5))]
                obs = [rng.randrange(5, 400) for _ in range(rng.randint(1, 4))]
                turns.append((turn, obs))
            out.append((f"task-{g}", prompt, turns, [rng.choice([0.0, 1.0]) for _ in turns]))
    return out


def direct_batch(eps, logp_old, logp_ref):
    """The toolkit's per-(trajectory, turn) batch of ``eps``, built from the token lists."""
    T = max(len(turns) for _, _, turns, _ in eps)
    L = max(len(turn) for _, _, turns, _ in eps for turn, _ in turns)
    n = len(eps) * T
    contexts, responses = [], []
    old, ref = torch.zeros(n, L, dtype=torch.float64), torch.zeros(n, L, dtype=torch.float64)
    mask, valid, reward = torch.zeros(n, L, dtype=torch.bool), torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.float64)
    groups = {}
    for k, (uid, prompt, turns, rewards) in enumerate(eps):
        groups.setdefault(uid, len(groups))
        context = list(prompt)
        for t in range(T):
            i = k * T + t
            if t >= len(turns):
                contexts.append([]), responses.append([])
                continue
            turn, obs = turns[t]
            contexts.append(list(context)), responses.append(turn)
            old[i, : len(turn)], ref[i, : len(turn)] = logp_old[k][t], logp_ref[k][t]
            mask[i, : len(turn)], valid[i], reward[i] = True, True, rewards[t]
            context += turn + obs
    traj_return = reward.reshape(len(eps), T).sum(1).repeat_interleave(T)
    return SampleBatch(
        traj_id=torch.arange(len(eps)).repeat_interleave(T), group_id=torch.tensor([groups[e[0]] for e in eps]).repeat_interleave(T),
        turn=torch.arange(T).repeat(len(eps)), logp_old=old, token_mask=mask, valid=valid, reward=reward,
        traj_return=traj_return, weight=torch.ones(n, dtype=torch.float64), instance=torch.zeros(n, dtype=torch.long),
        data=pack_rows(contexts, responses, PAD)), ref


def verl_batch(eps, logp_old, logp_ref):
    """verl's agent-loop batch of ``eps``: one row per trajectory, the reward on the turn's last token."""
    P = max(len(p) for _, p, _, _ in eps)
    R = max(sum(len(a) + len(o) for a, o in turns) for _, _, turns, _ in eps) + 2  # + right padding
    B = len(eps)
    prompts, responses = torch.full((B, P), PAD), torch.full((B, R), PAD)
    attention, response_mask = torch.zeros(B, P + R, dtype=torch.long), torch.zeros(B, R, dtype=torch.long)
    old, ref, rewards = (torch.zeros(B, R, dtype=torch.float64) for _ in range(3))
    for i, (_, prompt, turns, turn_rewards) in enumerate(eps):
        prompts[i, P - len(prompt):] = torch.tensor(prompt)
        attention[i, P - len(prompt): P] = 1
        pos = 0
        for t, (turn, obs) in enumerate(turns):
            responses[i, pos: pos + len(turn)] = torch.tensor(turn)
            response_mask[i, pos: pos + len(turn)] = 1
            old[i, pos: pos + len(turn)], ref[i, pos: pos + len(turn)] = logp_old[i][t], logp_ref[i][t]
            rewards[i, pos + len(turn) - 1] = turn_rewards[t]
            pos += len(turn)
            last = t == len(turns) - 1
            if not last:  # the last turn's observation is not part of verl's response
                responses[i, pos: pos + len(obs)] = torch.tensor(obs)
                pos += len(obs)
        attention[i, P: P + pos] = 1
    return DataProto.from_dict(
        tensors=dict(prompts=prompts, responses=responses, input_ids=torch.cat([prompts, responses], 1),
                     attention_mask=attention, position_ids=(attention.cumsum(1) - 1).clamp(min=0),
                     response_mask=response_mask, old_log_probs=old, ref_log_prob=ref,
                     token_level_rewards=rewards),
        non_tensors=dict(uid=[e[0] for e in eps]))


def logps(eps, model, seed: int, noise: float):
    """Per trajectory and turn, ``model``'s own log-probs at temperature 0.9 plus uniform noise in
    ``[-noise, noise]``: the sampling policy near the one being trained, as after a weight sync."""
    from seeupo.llm.policy import CausalLMPolicy

    zeros = [[torch.zeros(len(turn), dtype=torch.float64) for turn, _ in turns] for _, _, turns, _ in eps]
    batch, _ = direct_batch(eps, zeros, zeros)
    with torch.no_grad():
        scored = CausalLMPolicy(model, temperature=0.9, scoring="per_row").token_logps(batch)
    g = torch.Generator().manual_seed(seed)
    scored = scored + noise * (2 * torch.rand(scored.shape, generator=g, dtype=torch.float64) - 1)
    T = int(batch.turn.max()) + 1
    return [[scored[k * T + t, : len(turn)] for t, (turn, _) in enumerate(turns)] for k, (_, _, turns, _) in enumerate(eps)]


def problem(seed: int, model):
    eps = episodes(seed)
    return eps, logps(eps, model, seed, 0.05), logps(eps, model, seed + 100, 0.2)


def config(**overrides):
    """SeeUPO's preset with a KL term, groups of 4 (the episodes' group size)."""
    return dataclasses.replace(preset("seeupo"), kl_coef=0.05, kl_estimator="k3", **overrides)


def params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_turn_spans_reads_runs_of_ones():
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]])
    assert turn_spans(mask) == [[(0, 2), (4, 5)], [(1, 6)], []]


@pytest.mark.parametrize("seed", [0, 1])
def test_verl_batch_becomes_the_direct_batch(tiny, seed):
    eps, old, ref = problem(seed, tiny)
    want, _ = direct_batch(eps, old, ref)
    got, layout = sample_batch_from_verl(verl_batch(eps, old, ref))
    for name in ("traj_id", "group_id", "turn", "logp_old", "token_mask", "valid", "reward", "traj_return"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    for name in ("input_ids", "attention_mask", "response_start"):
        real = want.data["attention_mask"].bool() if name == "input_ids" else slice(None)
        assert torch.equal(got.data[name][real], want.data[name][real]), name


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_verl_update_equals_policy_update(tiny, seed):
    """Parameters and M after one SeeUPO update (3 turns, reverse order, fused ratio passes, KL) agree to 1e-10."""
    eps, old, ref = problem(seed, tiny)
    cfg = config()
    direct, logp_ref = direct_batch(eps, old, ref)
    model_a, model_b = copy.deepcopy(tiny), copy.deepcopy(tiny)
    from seeupo.llm.policy import CausalLMPolicy

    opt_a = torch.optim.SGD(model_a.parameters(), lr=0.05)
    stats_a = policy_update(CausalLMPolicy(model_a, temperature=0.9, scoring="per_row"), opt_a, direct,
                            compute_advantages(direct, cfg), cfg, UpdateSettings(logp_ref=logp_ref, max_grad_norm=1.0))
    opt_b = torch.optim.SGD(model_b.parameters(), lr=0.05)
    stats_b, metrics = sequential_update(model_b, opt_b, verl_batch(eps, old, ref), cfg, temperature=0.9, pad_token_id=PAD)
    moved = (params(model_a) - params(tiny)).abs().max()
    assert moved > 1e-4  # the update did something
    assert (params(model_a) - params(model_b)).abs().max() < TOL * max(1.0, float(moved))
    assert stats_a.turn_order == stats_b.turn_order == [2, 1, 0]
    assert (stats_a.factor - stats_b.factor).abs().max() < TOL
    assert (stats_b.factor - 1).abs().max() > 1e-3  # M moved away from 1
    assert metrics["actor/fused_ratio_passes"] == 1.0 and metrics["actor/optimizer_steps"] == 3


def balance_order(data, k: int = 2):
    """verl's ``balance_batch`` order: rows sorted into ``k`` partitions of equal total length (Karmarkar-Karp)."""
    lengths = data.batch["attention_mask"].sum(-1).tolist()
    parts = get_seqlen_balanced_partitions(lengths, k_partitions=k, equal_size=True)
    return torch.tensor([i for part in parts for i in sorted(part)])


def test_balance_batch_reordering_changes_nothing(tiny):
    """verl re-orders rows by length before the update: the parameters and each trajectory's M stay the same."""
    eps, old, ref = problem(3, tiny)
    cfg = config()
    data = verl_batch(eps, old, ref)
    order = balance_order(data)
    assert not torch.equal(order, torch.arange(len(eps)))
    shuffled = verl_batch(eps, old, ref)
    shuffled.reorder(order)
    model_a, model_b = copy.deepcopy(tiny), copy.deepcopy(tiny)
    stats_a, _ = sequential_update(model_a, torch.optim.SGD(model_a.parameters(), lr=0.05), data, cfg, temperature=0.9)
    stats_b, _ = sequential_update(model_b, torch.optim.SGD(model_b.parameters(), lr=0.05), shuffled, cfg, temperature=0.9)
    assert (params(model_a) - params(model_b)).abs().max() < TOL
    assert (stats_b.factor - stats_a.factor[order]).abs().max() < TOL  # trajectory order[j] is row j now


def test_positional_carry_gives_factors_to_other_trajectories(tiny):
    """The paper's code carries each turn's ratio to the next turn's batch by row position; each turn's
    batch is balanced by its own lengths, so the positions name different trajectories. On this batch
    the trajectories that read another's factor, and by how much, against the keyed factors."""
    eps, old, ref = problem(4, tiny)
    cfg = config()
    data = verl_batch(eps, old, ref)
    model = copy.deepcopy(tiny)
    stats, _ = sequential_update(model, torch.optim.SGD(model.parameters(), lr=0.05), data, cfg, temperature=0.9)
    keyed = stats.factor  # F[traj]: the ratios of the turns before the last-updated turn, by trajectory
    batch, layout = sample_batch_from_verl(data)
    # turn t's own batch holds the trajectories that took turn t, balanced by their turn-t row lengths
    first, second = stats.turn_order[-2], stats.turn_order[-1]
    rows = {t: (batch.valid & (batch.turn == t)).nonzero().flatten() for t in (first, second)}

    def balanced(t):
        traj = batch.traj_id[rows[t]]
        lengths = batch.data["attention_mask"][rows[t]].sum(1).tolist()
        parts = get_seqlen_balanced_partitions(lengths, k_partitions=2, equal_size=len(lengths) % 2 == 0)
        return traj[torch.tensor([i for part in parts for i in sorted(part)])]

    before, after = balanced(first), balanced(second)
    n = min(len(before), len(after))
    positional = keyed.clone()
    positional[after[:n]] = keyed[before[:n]]  # row j of the next turn's batch reads row j's factor
    wrong = (positional - keyed).abs() > 1e-6
    assert int(wrong.sum()) >= 2
    assert float((positional - keyed).abs().max()) > 1e-3


@pytest.fixture
def user_algorithm():
    """A user's sequential algorithm: a registered turn order and M factor (removed afterwards)."""
    from seeupo.core.registry import M_FACTORS, TURN_ORDERS, register_m_factor, register_turn_order

    @register_turn_order("test_middle_first")
    def middle_first(num_turns, cfg, generator):
        """The middle turn, then the others in order."""
        middle = num_turns // 2
        return [middle] + [t for t in range(num_turns) if t != middle]

    @register_m_factor("test_sqrt_ratio")
    def sqrt_ratio(factor, ratio, cfg):
        """``F <- F * sqrt(ratio)``."""
        return factor * ratio.to(factor.dtype).sqrt()

    yield config(order="test_middle_first", m_factor="test_sqrt_ratio")
    TURN_ORDERS.remove("test_middle_first")
    M_FACTORS.remove("test_sqrt_ratio")


def test_a_registered_sequential_algorithm_runs_the_same_on_verls_batch(tiny, user_algorithm):
    eps, old, ref = problem(8, tiny)
    cfg = user_algorithm
    direct, logp_ref = direct_batch(eps, old, ref)
    model_a, model_b = copy.deepcopy(tiny), copy.deepcopy(tiny)
    from seeupo.llm.policy import CausalLMPolicy

    stats_a = policy_update(CausalLMPolicy(model_a, temperature=0.9, scoring="per_row"),
                            torch.optim.SGD(model_a.parameters(), lr=0.05), direct, compute_advantages(direct, cfg), cfg,
                            UpdateSettings(logp_ref=logp_ref, max_grad_norm=1.0))
    stats_b, _ = sequential_update(model_b, torch.optim.SGD(model_b.parameters(), lr=0.05), verl_batch(eps, old, ref),
                                   cfg, temperature=0.9)
    assert stats_a.turn_order == stats_b.turn_order == [1, 0, 2]
    assert (params(model_a) - params(model_b)).abs().max() < TOL
    assert (stats_a.factor - stats_b.factor).abs().max() < TOL


def test_batches_it_cannot_read_are_one_line_errors(tiny):
    eps, old, ref = problem(9, tiny)
    data = verl_batch(eps, old, ref)
    data.batch["response_mask"].zero_()
    with pytest.raises(ValueError, match=r"^no row of the verl batch has an assistant turn \(response_mask is 0 everywhere\)$"):
        sample_batch_from_verl(data)
    data = verl_batch(eps, old, ref)
    data.pop(batch_keys=["old_log_probs"])
    with pytest.raises(ValueError, match=r"^the verl batch lacks old_log_probs \("):
        sample_batch_from_verl(data)
    data = verl_batch(eps, old, ref)
    data.non_tensor_batch.pop("uid")
    with pytest.raises(ValueError, match=r"^the verl batch lacks non_tensor_batch\['uid'\]"):
        sample_batch_from_verl(data)
    for advantage, says in (("gae", "advantage='gae' needs a critic"), ("oracle", "advantage='oracle' has no language-model form")):
        with pytest.raises(ValueError, match=says):
            sequential_update(tiny, torch.optim.SGD(tiny.parameters(), lr=0.0), verl_batch(eps, old, ref),
                              dataclasses.replace(config(), advantage=advantage))


def test_a_simultaneous_update_runs_the_same_on_verls_batch(tiny):
    """GRPO (every turn at once) through the same path: equal to the core on the direct batch."""
    eps, old, ref = problem(11, tiny)
    cfg = dataclasses.replace(preset("grpo"), group_size=4, kl_coef=0.05)
    direct, logp_ref = direct_batch(eps, old, ref)
    model_a, model_b = copy.deepcopy(tiny), copy.deepcopy(tiny)
    from seeupo.llm.policy import CausalLMPolicy

    policy_update(CausalLMPolicy(model_a, temperature=0.9, scoring="per_row"), torch.optim.SGD(model_a.parameters(), lr=0.05),
                  direct, compute_advantages(direct, cfg), cfg, UpdateSettings(logp_ref=logp_ref, max_grad_norm=1.0))
    stats, metrics = sequential_update(model_b, torch.optim.SGD(model_b.parameters(), lr=0.05), verl_batch(eps, old, ref),
                                       cfg, temperature=0.9)
    assert (params(model_a) - params(tiny)).abs().max() > 1e-4
    assert (params(model_a) - params(model_b)).abs().max() < TOL
    assert stats.factor is None and "actor/fused_ratio_passes" not in metrics and metrics["actor/optimizer_steps"] == 1
