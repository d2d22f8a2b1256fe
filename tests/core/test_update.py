"""The update loop (seeupo.core.update): HAML sweep, schedules, step counts, minibatches, KL wiring.

A tiny differentiable tabular policy stands in for a model: ``logits[state, token position, action]``;
each row carries ``data["state"]`` ``[n]`` and ``data["action"]`` ``[n, L]``. States are disjoint
across turns (``state = turn * K + k``), so an update of turn ``t`` moves only turn-``t`` probabilities.
"""

from __future__ import annotations

import math

import pytest
import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.advantages import gae_for_batch, grae
from seeupo.core.config import AlgorithmConfig, preset
from seeupo.core.execution import UpdateSettings, micro_batch_plan, minibatch_plan
from seeupo.core.update import (
    can_fuse_ratio_passes,
    advance_factor,
    compute_advantages,
    current_factor,
    final_factor,
    fusion_blocker,
    is_on_policy,
    policy_update,
    sequential_sweep,
    turn_order,
)

DT = torch.float64
T_TURNS, K_STATES, N_ACTIONS, L_TOK = 3, 3, 3, 2
N_GROUPS, G = 2, 3
N_TRAJ = N_GROUPS * G


class TinyPolicy:
    """Softmax over ``N_ACTIONS`` per (state, token position); records every batch it scores."""

    def __init__(self, logits: torch.Tensor):
        self.logits = logits.clone().requires_grad_()
        self.calls: list[SampleBatch] = []
        self.grad_calls: list[SampleBatch] = []  # the calls that build a graph (forward/backward passes)

    def token_logps(self, batch: SampleBatch) -> torch.Tensor:
        self.calls.append(batch)
        if torch.is_grad_enabled():
            self.grad_calls.append(batch)
        lp = torch.log_softmax(self.logits[batch.data["state"]], dim=-1)  # [n, L, A]
        return lp.gather(-1, batch.data["action"][..., None]).squeeze(-1)

    def parameters(self):
        return [self.logits]

    turns_share_parameters = True  # one table for every (state, turn)


class CountingSGD(torch.optim.SGD):
    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.n_steps = 0

    def step(self, closure=None):
        self.n_steps += 1
        return super().step(closure)


def make_rollout(seed: int = 0, lengths=(3, 2, 3, 1, 3, 2)):
    """``N_TRAJ`` trajectories (2 groups of 3) x ``T_TURNS`` rows, trajectory-major, with placeholders.

    Returns ``(batch, initial_logits)``; ``logp_old`` is the initial policy's log-probabilities.
    """
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for traj in range(N_TRAJ):
        for turn in range(T_TURNS):
            valid = turn < lengths[traj]
            n_tok = int(torch.randint(1, L_TOK + 1, (1,), generator=gen))
            rows.append(
                dict(
                    traj=traj,
                    turn=turn,
                    valid=valid,
                    mask=[j < n_tok for j in range(L_TOK)],
                    state=turn * K_STATES + int(torch.randint(0, K_STATES, (1,), generator=gen)),
                    action=torch.randint(0, N_ACTIONS, (L_TOK,), generator=gen).tolist(),
                    reward=float(torch.randn((), generator=gen, dtype=DT)) if valid else 0.0,
                )
            )
    ret = [0.0] * N_TRAJ
    for r in rows:
        ret[r["traj"]] += r["reward"]
    batch = SampleBatch(
        traj_id=torch.tensor([r["traj"] for r in rows]),
        group_id=torch.tensor([r["traj"] // G for r in rows]),
        turn=torch.tensor([r["turn"] for r in rows]),
        logp_old=torch.zeros(len(rows), L_TOK, dtype=DT),
        token_mask=torch.tensor([r["mask"] for r in rows]),
        valid=torch.tensor([r["valid"] for r in rows]),
        reward=torch.tensor([r["reward"] for r in rows], dtype=DT),
        traj_return=torch.tensor([ret[r["traj"]] for r in rows], dtype=DT),
        weight=torch.ones(len(rows), dtype=DT),
        instance=torch.zeros(len(rows), dtype=torch.long),
        data={"state": torch.tensor([r["state"] for r in rows]), "action": torch.tensor([r["action"] for r in rows])},
    )
    logits = 0.5 * torch.randn(T_TURNS * K_STATES, L_TOK, N_ACTIONS, generator=gen, dtype=DT)
    with torch.no_grad():
        logp_old = TinyPolicy(logits).token_logps(batch) * batch.token_mask
    return batch.with_updates(logp_old=logp_old), logits


def turn_ratios(policy: TinyPolicy, batch: SampleBatch) -> torch.Tensor:
    """``[N_TRAJ, T]`` true sequence ratio pi(a_t|h_t)/pi_old(a_t|h_t) of each row under ``policy`` (1 on placeholders)."""
    out = torch.ones(batch.num_trajectories, T_TURNS, dtype=DT)
    with torch.no_grad():
        lp = policy.token_logps(batch)
    for i in range(batch.num_rows):
        if batch.valid[i]:
            m = batch.token_mask[i]
            out[batch.traj_id[i], batch.turn[i]] = math.exp(float((lp[i] - batch.logp_old[i])[m].sum()))
    return out


SEEUPO = preset("seeupo", group_size=G)


# ---------------------------------------------------------------------------------------------
# (1) the final factor M is keyed by trajectory, not by row position (docs/method.md §5)
# ---------------------------------------------------------------------------------------------


def _run(batch, logits, cfg, seed=123, lr=2.0, fuse=False):
    policy = TinyPolicy(logits)
    opt = CountingSGD(policy.parameters(), lr=lr)
    adv = compute_advantages(batch, cfg)
    stats = policy_update(policy, opt, batch, adv, cfg, UpdateSettings(generator=torch.Generator().manual_seed(seed),
                                                                        fuse_ratio_passes=fuse))
    return policy, stats


@pytest.mark.parametrize("relabel", [False, True])
@pytest.mark.parametrize("epochs", [1, 3])
def test_m_final_invariant_to_row_permutation(relabel, epochs):
    batch, logits = make_rollout(seed=0)
    cfg = SEEUPO.replace(epochs=epochs, minibatches=1)
    pol_a, st_a = _run(batch, logits, cfg)

    gen = torch.Generator().manual_seed(99)
    perm = torch.randperm(batch.num_rows, generator=gen)
    shuffled = batch.select(perm)
    sigma = torch.randperm(N_TRAJ, generator=gen) if relabel else torch.arange(N_TRAJ)
    shuffled = shuffled.with_updates(traj_id=sigma[shuffled.traj_id])
    assert not torch.equal(shuffled.traj_id, batch.traj_id)
    pol_b, st_b = _run(shuffled, logits, cfg)

    m_a, m_b = final_factor(pol_a, batch, cfg, st_a), final_factor(pol_b, shuffled, cfg, st_b)
    assert m_a.shape == (N_TRAJ,) and m_b.shape == (N_TRAJ,)
    # the test is only meaningful if M differs between trajectories
    assert float(m_a.std()) > 1e-3
    torch.testing.assert_close(m_b[sigma], m_a, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(pol_b.logits, pol_a.logits, rtol=1e-10, atol=1e-12)
    assert st_a.steps == st_b.steps == T_TURNS * epochs


def test_m_final_invariant_with_minibatches_when_ids_are_kept():
    # minibatches split by trajectory id, so a pure row shuffle (ids kept) gives the same split
    batch, logits = make_rollout(seed=1)
    cfg = SEEUPO.replace(epochs=2, minibatches=2)
    pol_a, st_a = _run(batch, logits, cfg)
    perm = torch.randperm(batch.num_rows, generator=torch.Generator().manual_seed(5))
    pol_b, st_b = _run(batch.select(perm), logits, cfg)
    m_a, m_b = final_factor(pol_a, batch, cfg, st_a), final_factor(pol_b, batch.select(perm), cfg, st_b)
    torch.testing.assert_close(m_b, m_a, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(pol_b.logits, pol_a.logits, rtol=1e-10, atol=1e-12)


def test_shuffled_m_alignment_is_detected():
    # cfg.m_alignment="shuffled" reproduces the reference code's positional M (docs/method.md §5); the
    # invariance check above must catch it: the same data in another row order gives another update
    batch, logits = make_rollout(seed=0)
    cfg = SEEUPO.replace(m_alignment="shuffled")
    pol_a, st_a = _run(batch, logits, cfg)
    perm = torch.randperm(batch.num_rows, generator=torch.Generator().manual_seed(99))
    pol_b, st_b = _run(batch.select(perm), logits, cfg)
    assert not torch.allclose(pol_b.logits, pol_a.logits, rtol=1e-8, atol=1e-10)
    m_a, m_b = final_factor(pol_a, batch, cfg, st_a), final_factor(pol_b, batch.select(perm), cfg, st_b)
    assert not torch.allclose(m_b, m_a, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("order", ["reverse", "forward"])
def test_m_final_is_product_of_turn_ratios_after_policy_update(order):
    # turn-t updates only move turn-t states, so the final M of a trajectory is the product over its turns
    # of pi_final(a_t|h_t) / pi_old(a_t|h_t), evaluated with the final policy
    batch, logits = make_rollout(seed=2)
    cfg = SEEUPO.replace(order=order, epochs=2)
    policy, stats = _run(batch, logits, cfg)
    ratios = turn_ratios(policy, batch)
    expected = ratios.prod(1)
    torch.testing.assert_close(final_factor(policy, batch, cfg, stats), expected, rtol=1e-10, atol=1e-12)
    # the update itself stops before the last turn's ratio, which no update reads
    torch.testing.assert_close(stats.factor, expected / ratios[:, stats.turn_order[-1]], rtol=1e-10, atol=1e-12)
    assert not torch.allclose(expected, torch.ones_like(expected))


@pytest.mark.parametrize("order", ["reverse", "random"])
def test_the_last_turns_factor_is_computed_only_on_request(order):
    # the factor after the last turn of the sweep is read by no update: the reference sweep makes
    # one no-grad ratio pass per other turn, and final_factor (for logs) one more, moving no parameter
    batch, logits = make_rollout(seed=2)
    cfg = SEEUPO.replace(order=order, epochs=2)
    policy, stats = _run(batch, logits, cfg, fuse=False)
    ratio_passes = [call for call in policy.calls if not any(call is g for g in policy.grad_calls)]
    assert sorted(int(c.turn[0]) for c in ratio_passes) == sorted(stats.turn_order[:-1])
    after_update = policy.logits.detach().clone()
    m_final = final_factor(policy, batch, cfg, stats)
    assert len(policy.calls) == len(ratio_passes) + len(policy.grad_calls) + 1
    assert torch.equal(policy.logits.detach(), after_update)
    assert not torch.equal(m_final, stats.factor)


# ---------------------------------------------------------------------------------------------
# the HAML recursion, with a controlled per-turn update
# ---------------------------------------------------------------------------------------------


def _sweep(cfg, delta_scale, seed=3):
    """Run sequential_sweep with an update that adds a fixed random delta to the logits of the turn's states."""
    batch, logits = make_rollout(seed=seed)
    policy = TinyPolicy(logits)
    adv = compute_advantages(batch, cfg)
    delta = delta_scale * torch.randn(logits.shape, generator=torch.Generator().manual_seed(seed + 100), dtype=DT)
    records = []

    def update_turn(rows, m):
        records.append((rows.clone(), m.clone()))
        states = batch.data["state"][rows].unique()
        with torch.no_grad():
            policy.logits[states] += delta[states]

    order, factor = sequential_sweep(policy, batch, adv, cfg, update_turn, torch.Generator().manual_seed(0))
    return batch, policy, adv, order, factor, records


@pytest.mark.parametrize("order,custom", [("reverse", None), ("forward", None), ("custom", (1, 0, 2))])
def test_sweep_happo_weights(order, custom):
    cfg = SEEUPO.replace(order=order, custom_order=custom, m_factor="happo")
    batch, policy, adv, got_order, factor, records = _sweep(cfg, 0.3)
    expected_order = {"reverse": [2, 1, 0], "forward": [0, 1, 2], "custom": [1, 0, 2]}[order]
    assert got_order == expected_order
    ratios = turn_ratios(policy, batch)  # each turn's ratio is frozen after its own update
    running = torch.ones(N_TRAJ, dtype=DT)
    assert len(records) == T_TURNS
    for (rows, m), t in zip(records, expected_order):
        assert torch.equal(rows, batch.turn == t)
        traj = batch.traj_id[rows]
        # M_t = A * prod(ratios of the turns updated before), per trajectory
        torch.testing.assert_close(m, adv[rows] * running[traj][:, None], rtol=1e-12, atol=1e-12)
        if t != expected_order[-1]:  # no update reads the factor after the last turn
            running = running * ratios[:, t]
    torch.testing.assert_close(factor, running, rtol=1e-12, atol=1e-12)
    full = advance_factor(factor, policy, batch, expected_order[-1], cfg)
    torch.testing.assert_close(full, ratios.prod(1), rtol=1e-12, atol=1e-12)
    # placeholders contribute a factor of 1: trajectory 3 (length 1) only has its turn-0 ratio
    torch.testing.assert_close(full[3], ratios[3, 0])


def test_sweep_shuffled_alignment_misplaces_m_but_keeps_f_keyed():
    cfg = SEEUPO.replace(m_alignment="shuffled")
    batch, policy, adv, order, factor, records = _sweep(cfg, 0.3)
    ratios = turn_ratios(policy, batch)
    running = torch.ones(N_TRAJ, dtype=DT)
    misplaced = []
    for (rows, m), t in zip(records, order):
        keyed = adv[rows] * running[batch.traj_id[rows]][:, None]
        misplaced.append(not torch.allclose(m, keyed, rtol=1e-12, atol=1e-12))
        running = running * ratios[:, t]
    assert misplaced[0] is False  # before any update every factor is 1: nothing to misplace
    assert any(misplaced[1:])
    torch.testing.assert_close(advance_factor(factor, policy, batch, order[-1], cfg), running, rtol=1e-12, atol=1e-12)


def test_sweep_m_factor_none_keeps_the_advantage():
    cfg = SEEUPO.replace(m_factor="none")
    batch, _, adv, _, factor, records = _sweep(cfg, 0.5)
    for rows, m in records:
        assert torch.equal(m, adv[rows])
    assert torch.equal(factor, torch.ones(N_TRAJ, dtype=DT))


def test_sweep_m_factor_clipped_stays_in_range():
    cfg = SEEUPO.replace(m_factor="clipped", m_clip=(0.8, 1.2))
    batch, policy, adv, order, factor, records = _sweep(cfg, 1.5)
    ratios = turn_ratios(policy, batch)
    # the deltas are large enough that clipping matters
    valid_ratios = ratios[ratios != 1.0]
    assert bool(((valid_ratios < 0.8) | (valid_ratios > 1.2)).any())
    running = torch.ones(N_TRAJ, dtype=DT)
    for (rows, m), t in zip(records, order):
        traj = batch.traj_id[rows]
        torch.testing.assert_close(m, adv[rows] * running[traj][:, None], rtol=1e-12, atol=1e-12)
        # each factor and the running product clipped (the reference code's variant)
        running = (running * ratios[:, t].clamp(0.8, 1.2)).clamp(0.8, 1.2)
    factor = advance_factor(factor, policy, batch, order[-1], cfg)
    torch.testing.assert_close(factor, running, rtol=1e-12, atol=1e-12)
    assert bool(((factor >= 0.8) & (factor <= 1.2)).all())
    assert bool(((factor == 0.8) | (factor == 1.2)).any())


@pytest.mark.parametrize("m_factor", ["none", "clipped"])
def test_policy_update_m_factor_variants(m_factor):
    batch, logits = make_rollout(seed=4)
    cfg = SEEUPO.replace(m_factor=m_factor, m_clip=(0.9, 1.1), epochs=3)
    policy, stats = _run(batch, logits, cfg, lr=5.0)
    m_final = final_factor(policy, batch, cfg, stats)
    if m_factor == "none":
        assert torch.equal(m_final, torch.ones(N_TRAJ, dtype=DT))
    else:
        assert bool(((m_final >= 0.9) & (m_final <= 1.1)).all())
        assert not torch.allclose(m_final, torch.ones(N_TRAJ, dtype=DT))


# ---------------------------------------------------------------------------------------------
# (2) turn order
# ---------------------------------------------------------------------------------------------


def test_turn_order_named():
    cfg = AlgorithmConfig()
    assert turn_order(cfg.replace(order="reverse"), 4) == [3, 2, 1, 0]
    assert turn_order(cfg.replace(order="forward"), 4) == [0, 1, 2, 3]
    assert turn_order(cfg.replace(order="custom", custom_order=(2, 0, 3, 1)), 4) == [2, 0, 3, 1]
    assert turn_order(cfg.replace(order="reverse"), 1) == [0]


def test_turn_order_random_is_a_seeded_permutation():
    cfg = AlgorithmConfig(order="random")
    a = turn_order(cfg, 6, torch.Generator().manual_seed(11))
    b = turn_order(cfg, 6, torch.Generator().manual_seed(11))
    assert a == b and sorted(a) == list(range(6))
    orders = {tuple(turn_order(cfg, 6, torch.Generator().manual_seed(s))) for s in range(10)}
    assert len(orders) > 1


@pytest.mark.parametrize("bad", [(0, 1, 1, 2), (1, 2, 3, 4)])
def test_custom_order_that_is_no_permutation_is_rejected_at_construction(bad):
    with pytest.raises(ValueError, match="custom_order"):
        AlgorithmConfig(order="custom", custom_order=bad)


@pytest.mark.parametrize("bad", [(0, 1, 2), (0, 1, 2, 3, 4)])
def test_turn_order_custom_of_the_wrong_length_raises(bad):
    cfg = AlgorithmConfig(order="custom", custom_order=bad)
    with pytest.raises(ValueError):
        turn_order(cfg, 4)


@pytest.mark.parametrize("order,custom,expected", [("reverse", None, [2, 1, 0]), ("forward", None, [0, 1, 2]), ("custom", (2, 0, 1), [2, 0, 1])])
def test_policy_update_visits_turns_in_order(order, custom, expected):
    batch, logits = make_rollout(seed=5)
    policy, stats = _run(batch, logits, SEEUPO.replace(order=order, custom_order=custom), fuse=False)
    assert stats.turn_order == expected
    visited = []
    for call in policy.calls:
        turns = call.turn.unique().tolist()
        assert len(turns) == 1  # each scored batch holds a single turn
        if not visited or visited[-1] != turns[0]:
            visited.append(turns[0])
    assert visited == expected  # the factor evaluation of turn t follows the steps on turn t


def test_policy_update_bad_custom_order_raises():
    batch, logits = make_rollout(seed=5)
    with pytest.raises(ValueError):
        _run(batch, logits, SEEUPO.replace(order="custom", custom_order=(0, 1)))


# ---------------------------------------------------------------------------------------------
# (3) optimizer step counts
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("epochs,minibatches", [(1, 1), (2, 1), (1, 3), (2, 3), (7, 1)])
def test_step_counts(epochs, minibatches):
    batch, logits = make_rollout(seed=6)
    base = SEEUPO.replace(epochs=epochs, minibatches=minibatches)
    cases = {
        "simultaneous": (base.replace(schedule="simultaneous"), epochs * minibatches),
        "simultaneous+equal_budget": (base.replace(schedule="simultaneous", equal_budget=True), epochs * minibatches),
        "sequential": (base, T_TURNS * epochs * minibatches),
        "sequential+equal_budget": (
            base.replace(equal_budget=True),
            T_TURNS * max(1, (epochs * minibatches) // T_TURNS),
        ),
    }
    for name, (cfg, expected) in cases.items():
        policy = TinyPolicy(logits)
        opt = CountingSGD(policy.parameters(), lr=0.1)
        stats = policy_update(policy, opt, batch, compute_advantages(batch, cfg), cfg,
                              UpdateSettings(generator=torch.Generator().manual_seed(0)))
        assert opt.n_steps == expected, name
        assert stats.steps == expected, name
        assert len(stats.objective) == len(stats.clip_frac) == expected, name


def test_simultaneous_stats():
    batch, logits = make_rollout(seed=6)
    _, stats = _run(batch, logits, preset("grpo", group_size=G))
    assert stats.factor is None
    assert stats.turn_order == []
    assert stats.steps == 1


def test_multi_epoch_ppo_clips():
    # several epochs on the same data move the ratio away from 1, so clipping eventually acts
    batch, logits = make_rollout(seed=7)
    _, stats = _run(batch, logits, preset("grpo", group_size=G, epochs=8), lr=20.0)
    assert stats.clip_frac[0] == 0.0  # first step: ratio 1 everywhere
    assert max(stats.clip_frac) > 0.0


# ---------------------------------------------------------------------------------------------
# (5) minibatches hold whole trajectories
# ---------------------------------------------------------------------------------------------


def _rows_per_traj(b: SampleBatch) -> dict[int, int]:
    ids, counts = b.traj_id.unique(return_counts=True)
    return dict(zip(ids.tolist(), counts.tolist()))


def test_minibatch_plan_never_splits_a_trajectory():
    batch, _ = make_rollout(seed=8)
    batch = batch.select(torch.randperm(batch.num_rows, generator=torch.Generator().manual_seed(1)))
    plan = minibatch_plan(batch, 2, 3, torch.Generator().manual_seed(2))
    assert len(plan) == 6
    for mask in plan:
        inside = set(batch.traj_id[mask].tolist())
        outside = set(batch.traj_id[~mask].tolist())
        assert inside and not (inside & outside)
        assert len(inside) == N_TRAJ // 3
    for epoch in range(2):
        cover = torch.stack(plan[3 * epoch : 3 * epoch + 3]).sum(0)
        assert torch.equal(cover, torch.ones(batch.num_rows, dtype=cover.dtype))  # a partition of the rows


def test_minibatch_plan_has_no_empty_steps_when_minibatches_exceed_trajectories():
    batch, _ = make_rollout(seed=8)
    plan = minibatch_plan(batch, 2, N_TRAJ + 2, torch.Generator().manual_seed(2))
    assert len(plan) == 2 * N_TRAJ
    assert all(bool(mask.any()) for mask in plan)


def test_minibatch_plan_with_sparse_trajectory_ids():
    batch, _ = make_rollout(seed=8)
    sub = batch.select((batch.traj_id == 1) | (batch.traj_id == 3) | (batch.traj_id == 4))
    plan = minibatch_plan(sub, 1, 3, torch.Generator().manual_seed(0))
    assert sorted(len(set(sub.traj_id[m].tolist())) for m in plan) == [1, 1, 1]
    assert torch.equal(torch.stack(plan).sum(0), torch.ones(sub.num_rows, dtype=torch.long))


@pytest.mark.parametrize("scope", ["turn", "trajectory"])
def test_policy_update_minibatches_hold_whole_trajectories(scope):
    batch, logits = make_rollout(seed=9)
    batch = batch.select(torch.randperm(batch.num_rows, generator=torch.Generator().manual_seed(3)))
    cfg = preset("gspo", group_size=G, ratio_scope=scope, epochs=2, minibatches=3)
    policy, stats = _run(batch, logits, cfg)
    assert stats.steps == 6 and len(policy.calls) == 6
    full = _rows_per_traj(batch)
    seen = []
    for call in policy.calls:
        per = _rows_per_traj(call)
        assert all(per[k] == full[k] == T_TURNS for k in per)
        seen.append(frozenset(per))
    # each epoch covers every trajectory exactly once
    for epoch in range(2):
        parts = seen[3 * epoch : 3 * epoch + 3]
        assert sorted(k for p in parts for k in p) == list(range(N_TRAJ))


# ---------------------------------------------------------------------------------------------
# (6) KL wiring
# ---------------------------------------------------------------------------------------------


def test_kl_without_reference_raises():
    batch, logits = make_rollout(seed=10)
    for cfg in (SEEUPO.replace(kl_coef=0.01), preset("grpo", group_size=G, kl_coef=0.002)):
        with pytest.raises(ValueError):
            _run(batch, logits, cfg)


def test_kl_k3_has_no_gradient_at_the_reference():
    # one step at ratio 1 with logp_ref = logp_old: k3's gradient is 0 there, k1's is not
    batch, logits = make_rollout(seed=10)
    base = preset("grpo", group_size=G)
    out = {}
    for name, cfg in {
        "none": base,
        "k3": base.replace(kl_coef=0.5, kl_estimator="k3"),
        "k1": base.replace(kl_coef=0.5, kl_estimator="k1"),
    }.items():
        policy = TinyPolicy(logits)
        opt = torch.optim.SGD(policy.parameters(), lr=1.0)
        policy_update(
            policy, opt, batch, compute_advantages(batch, cfg), cfg,
            UpdateSettings(logp_ref=batch.logp_old.clone(), generator=torch.Generator().manual_seed(0)),
        )
        out[name] = policy.logits.detach()
    torch.testing.assert_close(out["k3"], out["none"], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(out["k1"], out["none"])


# ---------------------------------------------------------------------------------------------
# compute_advantages dispatch
# ---------------------------------------------------------------------------------------------


def test_compute_advantages_dispatch():
    batch, _ = make_rollout(seed=11)
    # grae: the configured estimator
    cfg = SEEUPO
    torch.testing.assert_close(
        compute_advantages(batch, cfg), grae(batch, group_size=G, center="mean", scale="batch_std")
    )
    # gae: needs critic values, uses the configured gamma/lambda/level
    cfg = preset("ppo", gae_gamma=0.9, gae_lambda=0.7)
    values = torch.rand(batch.num_rows, L_TOK, generator=torch.Generator().manual_seed(0), dtype=DT)
    with pytest.raises(ValueError):
        compute_advantages(batch, cfg)
    torch.testing.assert_close(
        compute_advantages(batch, cfg, critic_values=values),
        gae_for_batch(batch, values, gamma=0.9, lam=0.7, token_level=True),
    )
    # oracle: needs the advantages, masked to real tokens of valid rows
    cfg = AlgorithmConfig(advantage="oracle")
    with pytest.raises(ValueError):
        compute_advantages(batch, cfg)
    oracle = torch.full((batch.num_rows, L_TOK), 2.5, dtype=DT)
    out = compute_advantages(batch, cfg, oracle=oracle)
    keep = batch.token_mask & batch.valid[:, None]
    assert torch.all(out[keep] == 2.5) and torch.all(out[~keep] == 0.0)


# ---------------------------------------------------------------------------------------------
# (7) micro-batches: gradient accumulation gives exactly the one-pass step
# ---------------------------------------------------------------------------------------------

UPDATES = {
    "reinforce": dict(update="reinforce"),
    "ppo token": dict(update="ppo", ratio_level="token"),
    "ppo sequence turn": dict(update="ppo", ratio_level="sequence", ratio_scope="turn"),
    "ppo sequence turn unnormalised": dict(update="ppo", ratio_level="sequence", ratio_scope="turn", length_norm=False),
    "ppo sequence trajectory": dict(update="ppo", ratio_level="sequence", ratio_scope="trajectory"),
}


def _two_instance_rollout(seed: int):
    """``make_rollout`` with group ``g`` as instance ``g``, unequal row weights, and a moved policy (ratios != 1)."""
    batch, logits = make_rollout(seed=seed)
    gen = torch.Generator().manual_seed(seed + 50)
    batch = batch.with_updates(instance=batch.group_id.clone(), weight=0.5 + torch.rand(batch.num_rows, generator=gen, dtype=DT))
    moved = logits + 0.4 * torch.randn(logits.shape, generator=gen, dtype=DT)
    return batch, moved


def _one_step(batch, logits, cfg, adv, logp_ref, micro_batch_rows):
    policy = TinyPolicy(logits)
    opt = torch.optim.SGD(policy.parameters(), lr=1.0)
    stats = policy_update(policy, opt, batch, adv, cfg, UpdateSettings(
        logp_ref=logp_ref, generator=torch.Generator().manual_seed(0), micro_batch_rows=micro_batch_rows))
    return policy.logits.detach() - logits, stats, policy


@pytest.mark.parametrize("update", list(UPDATES))
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
@pytest.mark.parametrize("schedule", ["simultaneous", "sequential"])
def test_micro_batches_accumulate_to_the_one_pass_step(update, aggregation, schedule):
    batch, logits = _two_instance_rollout(seed=12)
    batch = batch.select(torch.randperm(batch.num_rows, generator=torch.Generator().manual_seed(4)))
    cfg = AlgorithmConfig(group_size=G, grae_scale="batch_std", aggregation=aggregation, schedule=schedule,
                          kl_coef=0.1, epochs=2, minibatches=2, **UPDATES[update])
    adv = compute_advantages(batch, cfg)
    logp_ref = batch.logp_old - 0.3 * torch.rand(batch.logp_old.shape, generator=torch.Generator().manual_seed(5), dtype=DT)
    delta_one, stats_one, _ = _one_step(batch, logits, cfg, adv, logp_ref, None)
    assert stats_one.steps > 1 and max(stats_one.clip_frac) > 0 or cfg.update == "reinforce"
    for rows in (1, 2, 5):
        delta, stats, policy = _one_step(batch, logits, cfg, adv, logp_ref, rows)
        torch.testing.assert_close(delta, delta_one, rtol=0, atol=1e-10)
        assert stats.steps == stats_one.steps
        for name in ("objective", "kl", "clip_frac", "grad_norm"):
            torch.testing.assert_close(torch.tensor(getattr(stats, name)), torch.tensor(getattr(stats_one, name)),
                                       rtol=0, atol=1e-10, msg=name)
        assert all(call.num_rows <= max(rows, T_TURNS) for call in policy.grad_calls)
        if rows == 1:
            assert len(policy.grad_calls) > stats.steps  # the steps really ran as several passes
    assert not torch.allclose(delta_one, torch.zeros_like(delta_one))


def test_micro_batch_plan_covers_every_row_once_and_keeps_trajectories_when_asked():

    batch, _ = make_rollout(seed=13)
    batch = batch.select(torch.randperm(batch.num_rows, generator=torch.Generator().manual_seed(6)))
    assert [p.tolist() for p in micro_batch_plan(batch, None, whole_trajectories=True)] == [list(range(batch.num_rows))]
    for max_rows in (1, 2, 4, 7, 100):
        for whole in (False, True):
            plan = micro_batch_plan(batch, max_rows, whole_trajectories=whole)
            assert sorted(torch.cat(plan).tolist()) == list(range(batch.num_rows))
            if whole:  # no trajectory in two passes; a pass over the limit holds one trajectory
                owner = {}
                for k, part in enumerate(plan):
                    for traj in batch.traj_id[part].tolist():
                        assert owner.setdefault(traj, k) == k
                    assert part.numel() <= max_rows or len(set(batch.traj_id[part].tolist())) == 1
            else:
                assert all(part.numel() <= max_rows for part in plan)
    with pytest.raises(ValueError):
        micro_batch_plan(batch, 0, whole_trajectories=False)


def test_micro_batch_plan_packs_rows_up_to_a_token_budget():

    batch, _ = make_rollout(seed=13)
    n = batch.num_rows
    cost = torch.arange(n) % 5 + 1  # tokens of each row: 1..5
    for max_tokens in (1, 4, 9, 1000):
        for whole in (False, True):
            plan = micro_batch_plan(batch, None, whole_trajectories=whole, max_tokens=max_tokens, row_tokens=cost)
            assert sorted(torch.cat(plan).tolist()) == list(range(n))
            for part in plan:  # within the budget, or a single unit that is over it by itself
                unit = set(batch.traj_id[part].tolist()) if whole else set(part.tolist())
                assert int(cost[part].sum()) <= max_tokens or len(unit) == 1
            if max_tokens == 1000:
                assert len(plan) == 1
    # both limits at once: 2 rows of 3 tokens fit 6 tokens, and max_rows=1 splits them
    assert len(micro_batch_plan(batch, 1, whole_trajectories=False, max_tokens=10**6, row_tokens=cost)) == n
    with pytest.raises(ValueError, match="needs row_tokens"):
        micro_batch_plan(batch, None, whole_trajectories=False, max_tokens=5)


@pytest.mark.parametrize("schedule", ["simultaneous", "sequential"])
def test_token_budget_micro_batches_accumulate_to_the_one_pass_step(schedule):
    batch, logits = _two_instance_rollout(seed=12)
    cfg = AlgorithmConfig(group_size=G, grae_scale="batch_std", schedule=schedule, kl_coef=0.1, epochs=2, minibatches=2,
                          **UPDATES["ppo sequence trajectory"])
    adv = compute_advantages(batch, cfg)
    delta_one, _, _ = _one_step(batch, logits, cfg, adv, batch.logp_old, None)
    policy = TinyPolicy(logits)
    policy_update(policy, torch.optim.SGD(policy.parameters(), lr=1.0), batch, adv, cfg, UpdateSettings(
        logp_ref=batch.logp_old, generator=torch.Generator().manual_seed(0), micro_batch_tokens=3,
        row_tokens=batch.token_mask.sum(1) + 2))  # e.g. a 2-token context per row
    torch.testing.assert_close(policy.logits.detach() - logits, delta_one, rtol=0, atol=1e-10)
    assert len(policy.grad_calls) > 2 * cfg.epochs * cfg.minibatches  # the budget split the steps


# ---------------------------------------------------------------------------------------------
# (8) non-finite steps are skipped; the gradient norm is clipped
# ---------------------------------------------------------------------------------------------


def test_non_finite_step_is_skipped_and_counted():
    batch, logits = make_rollout(seed=14)
    cfg = preset("grpo", group_size=G, epochs=2)
    adv = compute_advantages(batch, cfg)
    adv[0, 0] = float("nan") if batch.token_mask[0, 0] and batch.valid[0] else adv[0, 0]
    bad = batch.select(torch.arange(batch.num_rows))
    bad.token_mask[0, 0] = True
    bad.valid[0] = True
    adv[0, 0] = float("nan")
    delta, stats, _ = _one_step(bad, logits, cfg, adv, None, None)
    assert stats.skipped_steps == stats.steps == 2
    assert torch.equal(delta, torch.zeros_like(delta))


def test_max_grad_norm_clips_the_step():
    batch, logits = make_rollout(seed=15)
    cfg = preset("grpo", group_size=G)
    adv = compute_advantages(batch, cfg)
    free, stats, _ = _one_step(batch, logits, cfg, adv, None, None)
    policy = TinyPolicy(logits)
    opt = torch.optim.SGD(policy.parameters(), lr=1.0)
    clipped = policy_update(policy, opt, batch, adv, cfg,
                            UpdateSettings(generator=torch.Generator().manual_seed(0), max_grad_norm=0.01))
    step = policy.logits.detach() - logits
    assert stats.grad_norm[0] > 0.01
    torch.testing.assert_close(float(step.norm()), 0.01, rtol=1e-4, atol=0)  # torch adds 1e-6 to the norm
    torch.testing.assert_close(step, free * (0.01 / stats.grad_norm[0]), rtol=1e-4, atol=1e-12)
    assert clipped.grad_norm == stats.grad_norm


# ---------------------------------------------------------------------------------------------
# (9) M's factor: true sequence ratio, or length-normalised
# ---------------------------------------------------------------------------------------------


def test_m_length_norm_uses_the_geometric_mean_of_token_ratios():
    batch, logits = make_rollout(seed=2)
    cfg = SEEUPO.replace(epochs=2, m_length_norm=True)
    policy, stats = _run(batch, logits, cfg)
    with torch.no_grad():
        lp = policy.token_logps(batch)
    mask = batch.token_mask & batch.valid[:, None]
    mean_log = torch.where(mask, lp - batch.logp_old, 0.0).sum(1) / mask.sum(1).clamp_min(1)
    expected = torch.ones(N_TRAJ, dtype=DT)
    for row in range(batch.num_rows):
        expected[batch.traj_id[row]] *= mean_log[row].exp()
    torch.testing.assert_close(final_factor(policy, batch, cfg, stats), expected, rtol=1e-10, atol=1e-12)
    # two-token rows exist, so the normalised and the true factors differ
    true_cfg = SEEUPO.replace(epochs=2)
    true_policy, true_stats = _run(batch, logits, true_cfg)
    assert not torch.allclose(final_factor(policy, batch, cfg, stats), final_factor(true_policy, batch, true_cfg, true_stats))


# ---------------------------------------------------------------------------------------------
# (10) every tensor the core creates names its device (CUDA-safe without a GPU to test on)
# ---------------------------------------------------------------------------------------------


class _FactoryWatch(torch.overrides.TorchFunctionMode):
    """Records factory calls made from ``seeupo/core`` without an explicit ``device=``.

    Random draws from a CPU ``generator=`` are exempt: the core draws on the CPU on purpose
    (the same numbers on every device) and moves the result.
    """

    FACTORIES = {torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.rand, torch.randn,
                 torch.randint, torch.randperm, torch.tensor, torch.as_tensor, torch.eye, torch.linspace}

    def __init__(self):
        super().__init__()
        self.missing: list[str] = []
        self.seen = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        import sys

        kwargs = kwargs or {}
        if func in self.FACTORIES:
            caller = sys._getframe(1).f_code.co_filename.replace("\\", "/")
            if "/seeupo/core/" in caller:
                self.seen += 1
                if "device" not in kwargs and "generator" not in kwargs:
                    self.missing.append(f"{func.__name__} in {caller}:{sys._getframe(1).f_lineno}")
        return func(*args, **kwargs)


@pytest.mark.parametrize("name", ["ppo", "grpo", "gspo", "rloo", "reinforce_pp", "seeupo"])
def test_core_creates_no_tensor_without_a_device(name):
    batch, logits = make_rollout(seed=16)
    cfg = preset(name, group_size=G, epochs=2, minibatches=2, kl_coef=0.01)
    if name == "seeupo":
        cfg = cfg.replace(m_alignment="shuffled", equal_budget=True)
    values = torch.rand(batch.num_rows, L_TOK, generator=torch.Generator().manual_seed(0), dtype=DT)
    watch = _FactoryWatch()
    with watch:
        adv = compute_advantages(batch, cfg, critic_values=values)
        policy = TinyPolicy(logits)
        policy_update(policy, torch.optim.SGD(policy.parameters(), lr=0.1), batch, adv, cfg, UpdateSettings(
            logp_ref=batch.logp_old, generator=torch.Generator().manual_seed(0), micro_batch_rows=4))
    assert watch.seen > 0  # the watch sees the core's calls
    assert watch.missing == []


# ---------------------------------------------------------------------------------------------
# (11) stale M under shared parameters, and the refreshed factor
# ---------------------------------------------------------------------------------------------


def _shared_states(batch: SampleBatch) -> SampleBatch:
    """The same rows with the turn removed from the state: every turn's policy shares the logits."""
    return batch.with_updates(data={**batch.data, "state": batch.data["state"] % K_STATES})


def test_recorded_m_equals_current_m_with_independent_turns():
    batch, logits = make_rollout(seed=17)
    policy = TinyPolicy(logits)
    cfg = SEEUPO.replace(epochs=2)
    stats = policy_update(policy, torch.optim.SGD(policy.parameters(), lr=2.0), batch, compute_advantages(batch, SEEUPO),
                          cfg, UpdateSettings(generator=torch.Generator().manual_seed(0)))
    torch.testing.assert_close(current_factor(policy, batch, stats.turn_order, cfg), final_factor(policy, batch, cfg, stats),
                               rtol=1e-12, atol=1e-12)
    refreshed, _ = _run(batch, logits, SEEUPO.replace(epochs=2, m_refresh=True), seed=0)
    plain, _ = _run(batch, logits, SEEUPO.replace(epochs=2), seed=0)
    torch.testing.assert_close(refreshed.logits, plain.logits, rtol=1e-12, atol=1e-12)


def test_shared_parameters_make_the_recorded_m_stale_and_refresh_uses_the_current_one():
    batch, logits = make_rollout(seed=18)
    batch = _shared_states(batch)
    logits = logits[:K_STATES]
    with torch.no_grad():
        batch = batch.with_updates(logp_old=TinyPolicy(logits).token_logps(batch) * batch.token_mask)
    cfg = SEEUPO.replace(epochs=2)
    policy = TinyPolicy(logits)
    stats = policy_update(policy, torch.optim.SGD(policy.parameters(), lr=2.0), batch, compute_advantages(batch, cfg), cfg,
                          UpdateSettings(generator=torch.Generator().manual_seed(0)))
    # later turns' updates moved the earlier turns' policies: the recorded factor is not the current one
    m_final, m_current = final_factor(policy, batch, cfg, stats), current_factor(policy, batch, stats.turn_order, cfg)
    assert (m_final.log() - m_current.log()).abs().max() > 1e-3
    # with m_refresh, turn i's weights are A times the factor of the policy right before its update
    adv = compute_advantages(batch, cfg)
    policy = TinyPolicy(logits)
    delta = 0.3 * torch.randn(logits.shape, generator=torch.Generator().manual_seed(3), dtype=DT)
    seen = []

    def update_turn(rows, m):
        seen.append((rows.clone(), m.clone(), current_factor(policy, batch, list(range(T_TURNS - 1, int(batch.turn[rows][0]), -1)), cfg)))
        with torch.no_grad():
            policy.logits += delta

    sequential_sweep(policy, batch, adv, cfg.replace(m_refresh=True), update_turn)
    for rows, m, factor in seen:
        torch.testing.assert_close(m, adv[rows] * factor[batch.traj_id[rows]][:, None], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(seen[-1][2], torch.ones_like(seen[-1][2]))


# ---------------------------------------------------------------------------------------------
# (12) policy_update is the plain HAML loop: bit for bit the naive sweep written out here
# ---------------------------------------------------------------------------------------------


def _naive_step(policy, optimizer, mb, weights, cfg, logp_ref):
    """One optimizer step in one pass: the objective and KL term of ``mb``, backward, step."""
    from seeupo.core.losses import aggregate, kl_penalty, policy_objective, row_coefficients

    real = mb.token_mask & mb.valid[:, None]
    coef = row_coefficients(mb, cfg.aggregation, cfg.aggregation_rows)
    logp = policy.token_logps(mb)
    objective, _ = policy_objective(
        logp, mb, weights, update=cfg.update, ratio_level=cfg.ratio_level, ratio_scope=cfg.ratio_scope,
        length_norm=cfg.length_norm, clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high,
        dual_clip=cfg.dual_clip, aggregation=cfg.aggregation, coef=coef, token_coef=row_coefficients(mb, "token_mean"),
    )
    loss = -objective
    if cfg.kl_coef > 0:
        loss = loss + cfg.kl_coef * aggregate(kl_penalty(logp, logp_ref, cfg.kl_estimator, real), mb, cfg.aggregation, coef,
                                              cfg.aggregation_rows)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def _naive_update(policy, optimizer, batch, adv, cfg, generator, logp_ref):
    """The update of docs/method.md §4 written out as one loop, with every ablation inline; returns ``F`` after all turns."""
    from seeupo.core.update import misaligned_m_keys, num_turns, turn_ratio

    if cfg.schedule == "simultaneous":
        for part in minibatch_plan(batch, cfg.epochs, cfg.minibatches, generator):
            _naive_step(policy, optimizer, batch.select(part), adv[part], cfg, logp_ref[part])
        return None

    def times_ratio(factor, t):  # F[traj] *= pi_new / pi_old of turn t, per cfg.m_factor
        if cfg.m_factor == "none":
            return factor
        rows = batch.turn == t
        ratio = turn_ratio(policy, batch.select(rows), cfg)
        ratio = ratio.clamp(*cfg.m_clip) if cfg.m_factor == "clipped" else ratio
        factor = factor.clone()
        factor[batch.traj_id[rows]] *= ratio
        return factor.clamp(*cfg.m_clip) if cfg.m_factor == "clipped" else factor

    epochs, minibatches = cfg.epochs, cfg.minibatches
    if cfg.equal_budget:
        budget = max(1, epochs * minibatches // num_turns(batch))
        minibatches = min(minibatches, budget)
        epochs = budget // minibatches
    order = turn_order(cfg, num_turns(batch), generator)
    read = misaligned_m_keys(batch, generator) if cfg.m_alignment == "shuffled" else batch.traj_id
    factor = torch.ones(N_TRAJ, dtype=DT)
    for i, t in enumerate(order):
        if cfg.m_refresh:  # the factor of the current policy over the turns updated so far
            factor = torch.ones(N_TRAJ, dtype=DT)
            for k in order[:i]:
                factor = times_ratio(factor, k)
        rows = batch.turn == t
        weights, sub, sub_ref = adv[rows] * factor[read[rows]][:, None], batch.select(rows), logp_ref[rows]
        for part in minibatch_plan(sub, epochs, minibatches, generator):
            _naive_step(policy, optimizer, sub.select(part), weights[part], cfg, sub_ref[part])
        factor = times_ratio(factor, t)
    return factor


NAIVE_CASES = {
    "seeupo": SEEUPO,
    "seeupo 2x2 kl": SEEUPO.replace(epochs=2, minibatches=2, kl_coef=0.1),
    "m_refresh": SEEUPO.replace(epochs=2, m_refresh=True),
    "shuffled": SEEUPO.replace(epochs=2, m_alignment="shuffled"),
    "equal_budget": SEEUPO.replace(epochs=4, minibatches=2, equal_budget=True),
    "clipped": SEEUPO.replace(epochs=3, m_factor="clipped", m_clip=(0.9, 1.1)),
    "none": SEEUPO.replace(epochs=2, m_factor="none"),
    "random order": SEEUPO.replace(epochs=2, order="random"),
    "refresh clipped shuffled": SEEUPO.replace(epochs=2, m_refresh=True, m_factor="clipped", m_alignment="shuffled"),
    "grpo": preset("grpo", group_size=G, epochs=2, minibatches=2, kl_coef=0.1),
    "gspo": preset("gspo", group_size=G, epochs=2, minibatches=3),
}


@pytest.mark.parametrize("name", list(NAIVE_CASES))
@pytest.mark.parametrize("shared", [False, True])
def test_policy_update_is_bit_for_bit_the_naive_loop(name, shared):
    cfg = NAIVE_CASES[name]
    batch, logits = make_rollout(seed=19)
    batch = batch.select(torch.randperm(batch.num_rows, generator=torch.Generator().manual_seed(20)))
    if shared:  # every turn's policy shares the logits: later updates move the earlier turns' ratios
        batch, logits = _shared_states(batch), logits[:K_STATES]
        with torch.no_grad():
            batch = batch.with_updates(logp_old=TinyPolicy(logits).token_logps(batch) * batch.token_mask)
    adv = compute_advantages(batch, cfg)
    logp_ref = batch.logp_old - 0.2
    naive = TinyPolicy(logits)
    expected = _naive_update(naive, torch.optim.SGD(naive.parameters(), lr=2.0), batch, adv, cfg,
                             torch.Generator().manual_seed(21), logp_ref)
    policy = TinyPolicy(logits)
    stats = policy_update(policy, torch.optim.SGD(policy.parameters(), lr=2.0), batch, adv, cfg,
                          UpdateSettings(logp_ref=logp_ref, generator=torch.Generator().manual_seed(21)))
    assert not torch.equal(policy.logits, logits)
    assert torch.equal(policy.logits, naive.logits)
    if expected is None:
        assert stats.factor is None and final_factor(policy, batch, cfg, stats) is None
    else:
        assert torch.equal(final_factor(policy, batch, cfg, stats), expected)
        assert cfg.m_factor == "none" or not torch.equal(expected, torch.ones_like(expected))


# ---------------------------------------------------------------------------------------------
# the ratio passes of M fused into the next turn's first optimizer step: the same update
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("changes,settings", [
    ({}, {}),
    ({"order": "forward", "epochs": 2}, {}),
    ({"order": "random", "kl_coef": 0.1, "m_length_norm": True}, {"micro_batch_rows": 2}),
    ({"aggregation": "seq_mean_token_mean", "clip_eps_low": 0.05, "clip_eps_high": 0.05}, {"micro_batch_rows": 1}),
])
def test_fused_ratio_passes_make_the_reference_update(changes, settings):
    batch, logits = make_rollout(seed=7)
    cfg = SEEUPO.replace(**changes)
    logp_ref = (batch.logp_old - 0.3) * batch.token_mask if cfg.kl_coef > 0 else None
    out = {}
    for fuse in (False, True):
        policy = TinyPolicy(logits)
        opt = CountingSGD(policy.parameters(), lr=2.0)
        stats = policy_update(policy, opt, batch, compute_advantages(batch, cfg), cfg, UpdateSettings(
            generator=torch.Generator().manual_seed(3), fuse_ratio_passes=fuse, logp_ref=logp_ref, **settings))
        out[fuse] = (policy, stats, opt.n_steps)
    (ref, ref_stats, ref_steps), (fused, fused_stats, fused_steps) = out[False], out[True]
    assert can_fuse_ratio_passes(TinyPolicy(logits), batch, cfg)
    # the fused sweep makes no no-gradient pass: each turn's ratio comes from the next turn's first step
    assert len(fused.calls) == len(fused.grad_calls) and len(ref.calls) > len(ref.grad_calls)
    assert fused_steps == ref_steps == fused_stats.steps
    assert fused_stats.turn_order == ref_stats.turn_order
    torch.testing.assert_close(fused.logits, ref.logits, rtol=0, atol=1e-12)
    assert float((ref.logits.detach() - logits).abs().max()) > 1e-2  # the update moved the policy
    torch.testing.assert_close(fused_stats.factor, ref_stats.factor, rtol=0, atol=1e-12)
    assert not torch.allclose(ref_stats.factor, torch.ones_like(ref_stats.factor))
    for key in ("objective", "kl", "grad_norm", "clip_frac"):
        assert getattr(fused_stats, key) == pytest.approx(getattr(ref_stats, key), rel=1e-12, abs=1e-12), key


@pytest.mark.parametrize("changes,reason", [
    ({"minibatches": 2}, "minibatches=2 > 1"), ({"m_refresh": True}, "m_refresh"), ({"m_alignment": "shuffled"}, "m_alignment=shuffled"),
    ({"m_factor": "none"}, "m_factor=none reads no ratio"), ({"schedule": "simultaneous"}, "schedule=simultaneous"),
])
def test_no_fusion_where_the_schedule_does_not_allow_it(changes, reason):
    batch, logits = make_rollout(seed=7)
    policy = TinyPolicy(logits)
    assert can_fuse_ratio_passes(policy, batch, SEEUPO) and fusion_blocker(policy, batch, SEEUPO) is None
    assert not can_fuse_ratio_passes(policy, batch, SEEUPO.replace(**changes))
    assert reason in fusion_blocker(policy, batch, SEEUPO.replace(**changes))


@pytest.mark.parametrize("changes,fuse,fused,reason", [
    ({}, True, True, None),
    ({}, False, False, "fuse_ratio_passes is off"),
    ({"minibatches": 2}, True, False, "minibatches=2 > 1"),
    ({"m_factor": "none"}, True, None, None),  # no ratio pass to fuse
    ({"schedule": "simultaneous"}, True, None, None),
])
def test_the_update_reports_whether_it_fused_its_ratio_passes(changes, fuse, fused, reason):
    batch, logits = make_rollout(seed=7)
    cfg = SEEUPO.replace(**changes)
    policy = TinyPolicy(logits)
    stats = policy_update(policy, CountingSGD(policy.parameters(), lr=2.0), batch, compute_advantages(batch, cfg), cfg,
                          UpdateSettings(generator=torch.Generator().manual_seed(3), fuse_ratio_passes=fuse))
    assert stats.fused_ratio_passes is fused
    assert stats.fusion_blocker == reason or reason in stats.fusion_blocker


def test_no_fusion_for_a_policy_with_per_turn_parameters():
    batch, logits = make_rollout(seed=7)
    policy = TinyPolicy(logits)
    policy.turns_share_parameters = False
    assert not can_fuse_ratio_passes(policy, batch, SEEUPO)
    assert not can_fuse_ratio_passes(object(), batch, SEEUPO)  # not declared: not shared


# ---------------------------------------------------------------------------------------------
# an on-policy update scores its old log-probabilities in its own passes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("update", list(UPDATES))
@pytest.mark.parametrize("micro_batch_rows", [None, 2])
def test_old_logps_from_the_update_give_the_rescored_update(update, micro_batch_rows):
    """The batch arrives with the sampler's log-probabilities (off from the policy's); the reference
    rescores them first, the on-policy update takes them from its own passes: the same step."""
    batch, logits = _two_instance_rollout(seed=21)
    sampler = batch.logp_old + 0.2 * torch.randn(batch.logp_old.shape, generator=torch.Generator().manual_seed(2),
                                                 dtype=DT) * batch.token_mask
    cfg = AlgorithmConfig(group_size=G, kl_coef=0.1, **UPDATES[update])
    adv = compute_advantages(batch, cfg)
    logp_ref = batch.logp_old - 0.3 * torch.rand(batch.logp_old.shape, generator=torch.Generator().manual_seed(5), dtype=DT)
    with torch.no_grad():
        rescored = TinyPolicy(logits).token_logps(batch) * batch.token_mask
    results = {}
    for from_update in (False, True):
        policy = TinyPolicy(logits)
        settings = UpdateSettings(logp_ref=logp_ref, micro_batch_rows=micro_batch_rows, old_logps_from_update=from_update,
                                  generator=torch.Generator().manual_seed(0))
        stats = policy_update(policy, torch.optim.SGD(policy.parameters(), lr=1.0),
                              batch.with_updates(logp_old=sampler if from_update else rescored), adv, cfg, settings)
        results[from_update] = (policy.logits.detach(), stats)
    (ref_logits, ref_stats), (logits_new, stats) = results[False], results[True]
    torch.testing.assert_close(logits_new, ref_logits, rtol=0, atol=1e-12)
    torch.testing.assert_close(stats.logp_old, rescored, rtol=0, atol=1e-12)
    assert ref_stats.logp_old is None
    for name in ("objective", "kl", "clip_frac", "grad_norm"):
        torch.testing.assert_close(torch.tensor(getattr(stats, name)), torch.tensor(getattr(ref_stats, name)),
                                   rtol=0, atol=1e-12, msg=name)
    assert not torch.allclose(logits_new, logits)
    # the sampler's log-probabilities were not read: with them as logp_old the step differs
    policy = TinyPolicy(logits)
    policy_update(policy, torch.optim.SGD(policy.parameters(), lr=1.0), batch.with_updates(logp_old=sampler), adv, cfg,
                  UpdateSettings(logp_ref=logp_ref, generator=torch.Generator().manual_seed(0)))
    assert not torch.allclose(policy.logits.detach(), ref_logits, rtol=0, atol=1e-6) or update == "reinforce"


@pytest.mark.parametrize("change", [dict(epochs=2), dict(minibatches=2), dict(schedule="sequential")])
def test_old_logps_from_the_update_need_a_single_step(change):
    batch, logits = make_rollout()
    cfg = AlgorithmConfig(group_size=G, **change)
    assert not is_on_policy(cfg) and is_on_policy(AlgorithmConfig(group_size=G))
    policy = TinyPolicy(logits)
    with pytest.raises(ValueError, match="one optimizer step"):
        policy_update(policy, torch.optim.SGD(policy.parameters(), lr=1.0), batch, compute_advantages(batch, cfg), cfg,
                      UpdateSettings(old_logps_from_update=True))
