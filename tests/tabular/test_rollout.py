"""Batches (`seeupo.tabular.rollout`): path enumeration, exact GRAE against Monte Carlo, critics, oracles."""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest
import torch

from seeupo.core import AlgorithmConfig, compute_advantages, policy_update, preset
from seeupo.tabular.exact import evaluate
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import random_token_bandit
from seeupo.tabular.rollout import (
    critic_values,
    enumerate_paths,
    exact_advantages,
    exact_batch,
    exact_group_batch,
    group_mate_distribution,
    oracle_advantages,
    sample_batch,
)

ATOL = 1e-12


def _policy(problem, probs):
    policy = TabularPolicy(problem)
    policy.set_action_probs(probs)
    return policy


# ----------------------------------------------------------------------------------------------
# enumerate_paths
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("zero_frac", [0.0, 0.5])
def test_enumerate_paths_probabilities_sum_to_one(tree_mdp, ref, zero_frac):
    probs = ref.random_probs(tree_mdp, 1, zero_frac=zero_frac)
    paths = enumerate_paths(tree_mdp, probs)
    num_leaves = tree_mdp.num_histories(tree_mdp.num_turns)
    assert paths.prob.shape == (tree_mdp.num_instances, num_leaves)
    assert paths.hist.shape == (tree_mdp.num_instances, num_leaves, tree_mdp.num_turns)
    assert torch.allclose(paths.prob.sum(-1), torch.ones(tree_mdp.num_instances), atol=ATOL, rtol=0)
    assert bool((paths.prob >= 0).all())
    assert bool(paths.alive[:, :, 0].all())
    assert not bool(paths.alive[:, :, -1].all())  # some paths end early
    # the expected discounted return over the paths is J
    discount = tree_mdp.gamma ** torch.arange(tree_mdp.num_turns, dtype=torch.float64)
    returns = (paths.reward * discount).sum(-1)
    assert torch.allclose((paths.prob * returns).sum(-1), evaluate(tree_mdp, probs).J, atol=ATOL, rtol=0)
    # the alive mass at every turn is the probability of being alive there
    alive_mass = (paths.prob[..., None] * paths.alive).sum(1)
    reach = evaluate(tree_mdp, probs).reach
    for t in range(tree_mdp.num_turns):
        assert torch.allclose(alive_mass[:, t], reach[t].sum(-1), atol=ATOL, rtol=0)


def test_enumerate_paths_deterministic_policy(tree_mdp, ref):
    probs = ref.deterministic_probs(tree_mdp, 2)
    paths = enumerate_paths(tree_mdp, probs)
    assert torch.allclose(paths.prob.sum(-1), torch.ones(tree_mdp.num_instances), atol=ATOL, rtol=0)
    # a deterministic policy never puts mass on a path that deviates from it at an alive turn
    inst = torch.arange(tree_mdp.num_instances)[:, None]
    for t in range(tree_mdp.num_turns):
        chosen = probs[t].argmax(-1)[inst, paths.hist[..., t]]
        off = paths.alive[..., t] & (paths.action[..., t] != chosen)
        assert bool((paths.prob[off] == 0).all())


# ----------------------------------------------------------------------------------------------
# group_mate_distribution
# ----------------------------------------------------------------------------------------------


def _brute_force_mates(values, probs, num_mates, with_squares):
    out = defaultdict(float)
    for draw in itertools.product(range(len(values)), repeat=num_mates):
        p = 1.0
        for k in draw:
            p *= probs[k]
        s = sum(values[k] for k in draw)
        q = sum(values[k] ** 2 for k in draw) if with_squares else 0.0
        out[(round(s, 9), round(q, 9))] += p
    return out


@pytest.mark.parametrize("num_mates", [1, 2, 3])
@pytest.mark.parametrize("with_squares", [False, True])
@pytest.mark.parametrize(
    "values, probs",
    [([0.0, 0.5, 1.0], [0.2, 0.3, 0.5]), ([0.1, 0.7, 0.3, -0.4], [0.1, 0.2, 0.3, 0.4]), ([0.0, 1.0, 2.0, 3.0], [0.4, 0.1, 0.2, 0.3])],
)
def test_group_mate_distribution_matches_brute_force(values, probs, num_mates, with_squares):
    got = group_mate_distribution(values, probs, num_mates, with_squares)
    assert sum(p for _, _, p in got) == pytest.approx(1.0, abs=ATOL)
    got_map = defaultdict(float)
    for s, q, p in got:
        got_map[(round(s, 9), round(q, 9))] += p
    # no two entries share the same statistics (draws are merged)
    assert len(got_map) == len(got)
    expected = _brute_force_mates(values, probs, num_mates, with_squares)
    assert set(got_map) == set(expected)
    for key, p in expected.items():
        assert got_map[key] == pytest.approx(p, abs=ATOL)


def test_group_mate_distribution_merges_equal_sums():
    # two mates from {0, 1, 2} uniform: sum 2 arises from (0,2), (1,1), (2,0) with different squares
    without = {(s, q): p for s, q, p in group_mate_distribution([0.0, 1.0, 2.0], [1 / 3] * 3, 2, False)}
    assert len(without) == 5 and without[(2.0, 0.0)] == pytest.approx(3 / 9)
    with_sq = {(s, q): p for s, q, p in group_mate_distribution([0.0, 1.0, 2.0], [1 / 3] * 3, 2, True)}
    assert len(with_sq) == 6
    assert with_sq[(2.0, 4.0)] == pytest.approx(2 / 9) and with_sq[(2.0, 2.0)] == pytest.approx(1 / 9)


# ----------------------------------------------------------------------------------------------
# exact GRAE against Monte Carlo
# ----------------------------------------------------------------------------------------------


def _advantage_moments(problem, batch, adv):
    """Per instance: ``E[A 1(a_0 = a)]`` for every turn-0 action and ``E[A 1(valid, h_1 = h, a_1 = a)]``.

    Expectations are over trajectories: weighted sums divided by the instance's total trajectory weight.
    """
    num_inst = problem.num_instances
    a = adv[:, 0] * batch.weight
    first = batch.turn == 0
    m0 = torch.zeros(num_inst, problem.actions_per_turn[0]).index_put_(
        (batch.instance[first], batch.data["action"][first]), a[first], accumulate=True
    )
    second = (batch.turn == 1) & batch.valid
    m1 = torch.zeros(num_inst, problem.num_histories(1), problem.actions_per_turn[1]).index_put_(
        (batch.instance[second], batch.data["hist"][second], batch.data["action"][second]), a[second], accumulate=True
    )
    mass = torch.zeros(num_inst).index_put_((batch.instance[first],), batch.weight[first], accumulate=True)
    return torch.cat([m0, m1.reshape(num_inst, -1)], 1) / mass[:, None]


@pytest.mark.parametrize(
    "center, scale", [("mean", "none"), ("loo", "none"), ("mean", "group_std"), ("mean", "batch_std")]
)
def test_exact_grae_matches_monte_carlo(small_tree_mdp, ref, center, scale):
    problem = small_tree_mdp
    policy = _policy(problem, ref.random_probs(problem, 3))
    cfg = AlgorithmConfig(advantage="grae", group_size=4, grae_center=center, grae_scale=scale)

    batch, stats = exact_batch(problem, policy, cfg)
    first = batch.turn == 0
    mass = torch.zeros(problem.num_instances).index_put_((batch.instance[first],), batch.weight[first], accumulate=True)
    assert torch.allclose(mass, torch.ones(problem.num_instances), atol=1e-12, rtol=0)
    exact = _advantage_moments(problem, batch, compute_advantages(batch, cfg, group_stats=stats))

    gen = torch.Generator().manual_seed(0)
    calls, tasks = 40, 1000
    draws = []
    for _ in range(calls):
        sampled = sample_batch(problem, policy, tasks, cfg.group_size, gen)
        draws.append(_advantage_moments(problem, sampled, compute_advantages(sampled, cfg)))
    draws = torch.stack(draws)
    mc, se = draws.mean(0), draws.std(0) / calls**0.5

    reachable = se > 0
    assert reachable.sum() > 20
    # never-visited (history, action) pairs have exactly zero moment in both modes
    assert torch.allclose(exact[~reachable], torch.zeros_like(exact[~reachable]), atol=ATOL, rtol=0)
    # batch_std: the sampled z-score uses the finite batch's mean and std, a bias of O(1/batch)
    bias = 2.0 / (tasks * cfg.group_size) if scale == "batch_std" else 0.0
    assert bool(((mc - exact).abs() <= 4.5 * se + bias).all()), ((mc - exact) / se).abs().max()
    # the moments are not trivially zero: the test can tell them apart from 0
    assert (exact.abs() / se.clamp_min(1e-300))[reachable].max() > 20


@pytest.mark.parametrize("group_size", [2, 3, 4])
@pytest.mark.parametrize("problem_name", ["small_tree_mdp", "bandit"])
def test_exact_grae_conditional_mean(request, ref, group_size, problem_name):
    """E[R_i - mean_j R_j | tau_i] = (1 - 1/G)(R(tau_i) - V(s0)), and E[loo | tau_i] = R(tau_i) - V(s0)."""
    problem = request.getfixturevalue(problem_name)
    probs = ref.random_probs(problem, 4)
    policy = _policy(problem, probs)
    V0 = evaluate(problem, probs).V[0]
    for center, factor in (("mean", 1.0 - 1.0 / group_size), ("loo", 1.0)):
        cfg = AlgorithmConfig(advantage="grae", group_size=group_size, grae_center=center)
        batch, stats = exact_batch(problem, policy, cfg)
        adv = compute_advantages(batch, cfg, group_stats=stats)
        rows = batch.turn == 0
        n_traj = batch.num_trajectories
        # the path of each trajectory: its histories, actions, alive flags and return
        T = problem.num_turns
        table = torch.zeros(n_traj, 3 * T + 2, dtype=torch.float64)
        table[batch.traj_id, batch.turn] = batch.data["hist"].to(torch.float64)
        table[batch.traj_id, T + batch.turn] = batch.data["action"].to(torch.float64)
        table[batch.traj_id, 2 * T + batch.turn] = batch.valid.to(torch.float64)
        table[batch.traj_id[rows], 3 * T] = batch.instance[rows].to(torch.float64)
        table[batch.traj_id[rows], 3 * T + 1] = batch.traj_return[rows]
        keys, inverse = torch.unique(table, dim=0, return_inverse=True)
        w = torch.zeros(n_traj).index_put_((batch.traj_id[rows],), batch.weight[rows])
        a = torch.zeros(n_traj).index_put_((batch.traj_id[rows],), adv[rows, 0])
        cond = torch.zeros(len(keys)).index_add_(0, inverse, w * a) / torch.zeros(len(keys)).index_add_(0, inverse, w)
        inst, s0, ret = keys[:, 3 * T].long(), keys[:, 0].long(), keys[:, 3 * T + 1]
        expected = factor * (ret - V0[inst, s0])
        assert len(keys) > 10
        assert torch.allclose(cond, expected, atol=1e-10, rtol=0)
        # every row of a trajectory carries the same advantage (broadcast over its alive turns)
        per_traj = a[batch.traj_id]
        valid = batch.valid
        assert torch.allclose(adv[valid, 0], per_traj[valid], atol=ATOL, rtol=0)
        assert bool((adv[~valid] == 0).all())


# ----------------------------------------------------------------------------------------------
# the average sampled REINFORCE step approaches the exact one
# ----------------------------------------------------------------------------------------------


def _sgd_step_delta(policy, batch, adv, cfg):
    """The parameter change of one SGD step (lr 1) of ``policy_update``; the policy is restored."""
    before = [p.detach().clone() for p in policy.parameters()]
    policy_update(policy, torch.optim.SGD(policy.parameters(), lr=1.0), batch, adv, cfg)
    delta = torch.cat([(p.detach() - b).reshape(-1) for p, b in zip(policy.parameters(), before)])
    with torch.no_grad():
        for p, b in zip(policy.parameters(), before):
            p.copy_(b)
    return delta


@pytest.mark.parametrize("setting", ["independent_atomic", "shared_tokens"])
def test_average_sampled_reinforce_step_approaches_exact_step(bandit, setting):
    cfg = preset("rloo")
    if setting == "independent_atomic":
        problem, parameterization = bandit, "independent"
    else:
        problem, parameterization = random_token_bandit(2, 2, 2, 2, generator=torch.Generator().manual_seed(8)), "shared"
    policy = TabularPolicy(problem, parameterization, init_scale=0.5, generator=torch.Generator().manual_seed(9))

    batch, stats = exact_batch(problem, policy, cfg)
    exact = _sgd_step_delta(policy, batch, compute_advantages(batch, cfg, group_stats=stats), cfg)

    # the exact REINFORCE-LOO step is the policy gradient of J divided by the number of
    # tokens per trajectory (token_mean aggregation; no early termination in a bandit)
    policy.zero_grad()
    evaluate(problem, policy.action_probs()).J.sum().backward()
    tokens_per_traj = sum(length for _, length in problem.tokens)
    grad_j = torch.cat([p.grad.reshape(-1) for p in policy.parameters()]) / tokens_per_traj
    policy.zero_grad()
    assert torch.allclose(exact, grad_j, atol=1e-12, rtol=0)

    gen = torch.Generator().manual_seed(1)
    draws = []
    for _ in range(300):
        sampled = sample_batch(problem, policy, 8, cfg.group_size, gen)
        draws.append(_sgd_step_delta(policy, sampled, compute_advantages(sampled, cfg), cfg))
    draws = torch.stack(draws)
    mean, se = draws.mean(0), draws.std(0) / draws.shape[0] ** 0.5
    assert bool(((mean - exact).abs() <= 4.5 * se + 1e-12).all()), ((mean - exact) / se).abs().max()
    # the comparison has power: the exact step is far from zero in units of the standard error
    assert (exact.abs() / se.clamp_min(1e-300)).max() > 10


# ----------------------------------------------------------------------------------------------
# critic values and oracle advantages
# ----------------------------------------------------------------------------------------------


def _batches(problem, policy):
    exact, _ = exact_batch(problem, policy, AlgorithmConfig(advantage="oracle"))
    sampled = sample_batch(problem, policy, 64, 2, torch.Generator().manual_seed(3))
    return {"exact": exact, "sampled": sampled}


@pytest.mark.parametrize("mode", ["exact", "sampled"])
def test_critic_values(token_tree_mdp, mode):
    problem = token_tree_mdp  # turn 0: 2 tokens of 2; turn 1: 1 token of 3
    policy = TabularPolicy(problem, init_scale=1.0, generator=torch.Generator().manual_seed(2))
    probs = policy.action_probs()
    ev = evaluate(problem, probs)
    batch = _batches(problem, policy)[mode]
    values = critic_values(problem, policy, batch)
    assert values.shape == (batch.num_rows, problem.max_tokens)
    valid = batch.valid
    turn, inst, hist, action = batch.turn, batch.instance, batch.data["hist"], batch.data["action"]
    for t in range(problem.num_turns):
        rows = valid & (turn == t)
        assert rows.any()
        # before token 0 the state is h_t
        assert torch.allclose(values[rows, 0], ev.V[t][inst[rows], hist[rows]], atol=ATOL, rtol=0)
    # before token 1 of turn 0 the state is (h_0, y_0): E[Q_0(h_0, a) | first token y_0]
    rows = (valid & (turn == 0)).nonzero().squeeze(1)
    for r in rows.tolist():
        i, h, y0 = inst[r].item(), hist[r].item(), action[r].item() // 2
        p = probs[0][i, h, 2 * y0 : 2 * y0 + 2]
        q = ev.Q[0][i, h, 2 * y0 : 2 * y0 + 2]
        assert values[r, 1].item() == pytest.approx(((p * q).sum() / p.sum()).item(), abs=ATOL)
    # the padding slot of the one-token turn is 0
    assert bool((values[turn == 1, 1] == 0).all())


@pytest.mark.parametrize("mode", ["exact", "sampled"])
def test_oracle_advantages(token_tree_mdp, mode):
    problem = token_tree_mdp
    policy = TabularPolicy(problem, init_scale=1.0, generator=torch.Generator().manual_seed(2))
    A = evaluate(problem, policy.action_probs()).A
    batch = _batches(problem, policy)[mode]
    adv = oracle_advantages(problem, policy, batch)
    assert adv.shape == (batch.num_rows, problem.max_tokens)
    turn, inst, hist, action = batch.turn, batch.instance, batch.data["hist"], batch.data["action"]
    for t in range(problem.num_turns):
        rows = batch.valid & (turn == t)
        expected = A[t][inst[rows], hist[rows], action[rows]]
        length = problem.tokens[t][1]
        for j in range(problem.max_tokens):
            target = expected if j < length else torch.zeros_like(expected)
            assert torch.allclose(adv[rows, j], target, atol=ATOL, rtol=0)
    # compute_advantages passes the oracle through and zeroes placeholders
    through = compute_advantages(batch, AlgorithmConfig(advantage="oracle"), oracle=adv)
    assert torch.allclose(through[batch.valid], adv[batch.valid], atol=ATOL, rtol=0)
    assert bool((through[~batch.valid] == 0).all())
    # in exact mode the weighted mean advantage at each turn-0 history is 0
    if mode == "exact":
        rows = turn == 0
        num = torch.zeros(problem.num_instances).index_add_(0, inst[rows], batch.weight[rows] * adv[rows, 0])
        assert torch.allclose(num, torch.zeros_like(num), atol=1e-12, rtol=0)


def test_registered_estimator_without_exact_mode_is_refused_there_and_runs_sampled(small_tree_mdp, ref):
    from seeupo.core.advantages import broadcast_to_tokens
    from seeupo.core.batch import per_trajectory
    from seeupo.core.registry import ADV_ESTIMATORS, register_adv_est

    @register_adv_est("raw_return_test", needs_group_stats=True, exact=False)
    def raw_return(batch, cfg, *, critic_values=None, oracle=None, group_stats=None):
        """The trajectory's return itself."""
        return broadcast_to_tokens(per_trajectory(batch.traj_return, batch)[batch.traj_id], batch)

    try:
        problem = small_tree_mdp
        policy = _policy(problem, ref.random_probs(problem, 3))
        cfg = AlgorithmConfig(advantage="raw_return_test", group_size=2)
        with pytest.raises(ValueError, match="advantage 'raw_return_test' has no exact mode; use the sampled mode"):
            exact_batch(problem, policy, cfg)
        with pytest.raises(ValueError, match=r"'raw_return_test' \(.*\): exact: refused \(registered with exact=False\)"):
            exact_advantages(problem, policy, cfg)
        batch = sample_batch(problem, policy, 3, cfg.group_size, torch.Generator().manual_seed(0))
        adv = compute_advantages(batch, cfg)
        mask = batch.token_mask & batch.valid[:, None]
        assert torch.equal(adv[mask], batch.traj_return[:, None].expand_as(adv)[mask])
    finally:
        ADV_ESTIMATORS.remove("raw_return_test")


# ----------------------------------------------------------------------------------------------
# the generic exact mode: enumerating group-mates' outcomes
# ----------------------------------------------------------------------------------------------


def _second_moments(problem, batch, adv):
    """``E[A^2 1(a_0 = a)]`` per instance and turn-0 action: with the first moments, tells two
    distributions of advantages apart where the update is nonlinear in ``A`` (a clipped ratio)."""
    return _advantage_moments(problem, batch, adv * adv[:, :1])


@pytest.mark.parametrize("group_size", [2, 3])
@pytest.mark.parametrize(
    "center, scale, clamp",
    [("mean", "none", None), ("loo", "none", None), ("none", "none", 0.3), ("mean", "group_std", None),
     ("mean", "batch_std", None), ("loo", "batch_std", 0.5)],
)
def test_generic_exact_mode_matches_grae_closed_form(small_tree_mdp, ref, group_size, center, scale, clamp):
    problem = small_tree_mdp
    policy = _policy(problem, ref.random_probs(problem, 5))
    cfg = AlgorithmConfig(advantage="grae", group_size=group_size, grae_center=center, grae_scale=scale, grae_clamp=clamp)
    closed = exact_advantages(problem, policy, cfg, closed_form=True)
    generic = exact_advantages(problem, policy, cfg, closed_form=False)
    assert generic[0].num_rows != closed[0].num_rows  # two different enumerations ...
    for moments in (_advantage_moments, _second_moments):  # ... of the same distribution
        assert torch.allclose(moments(problem, *generic), moments(problem, *closed), atol=1e-12, rtol=0)
    assert _second_moments(problem, *closed).abs().max() > 1e-3


@pytest.mark.parametrize("update", ["gradient", "mirror"])
def test_generic_exact_mode_gives_the_closed_form_update(small_tree_mdp, update):
    from seeupo.tabular.train import RunConfig, run

    cfg = preset("seeupo", group_size=3, epochs=5)
    runs = [run(small_tree_mdp, cfg, RunConfig(iterations=2, update=update, exact_closed_form=c, init_scale=1.0, seed=3))
            for c in (True, False)]
    assert torch.allclose(runs[0].J, runs[1].J, atol=1e-10, rtol=0)
    assert bool((runs[0].J[-1] > runs[0].J[0] + 1e-3).all())  # the update moved J: the comparison can fail


def test_generic_exact_group_batch_structure(small_tree_mdp, ref):
    problem = small_tree_mdp
    policy = _policy(problem, ref.random_probs(problem, 6))
    cfg = AlgorithmConfig(advantage="grae", group_size=3)
    batch, own = exact_group_batch(problem, policy, cfg)
    m = int(batch.traj_id[own].max()) + 1
    # own trajectories 0..m-1, each in its own group with G - 1 group-mates of weight 0
    assert torch.equal(torch.unique(batch.traj_id[own]), torch.arange(m))
    assert bool((batch.weight[~own] == 0).all()) and bool((batch.weight[own] > 0).all())
    sizes = torch.bincount(batch.group_id[batch.turn == 0])
    assert bool((sizes == cfg.group_size).all()) and sizes.numel() == m
    # the own trajectories' weights sum to 1 per instance (paths x group-mate multisets)
    first = own & (batch.turn == 0)
    mass = torch.zeros(problem.num_instances, dtype=torch.float64).index_add_(0, batch.instance[first], batch.weight[first])
    assert torch.allclose(mass, torch.ones_like(mass), atol=1e-12, rtol=0)


def test_generic_exact_mode_matches_monte_carlo_for_a_new_estimator(small_tree_mdp, ref):
    """An estimator without a closed form (the return minus its group's best return, per-turn
    rewards centred by the group's turn mean) is exact in expectation against sampling."""
    from seeupo.core.advantages import broadcast_to_tokens
    from seeupo.core.batch import per_trajectory, segment_sum
    from seeupo.core.registry import ADV_ESTIMATORS, register_adv_est

    @register_adv_est("best_mate_test", needs_group_stats=True)
    def best_mate(batch, cfg, *, critic_values=None, oracle=None, group_stats=None):
        """``R_i - max_j R_j`` plus the turn reward minus the group's mean turn reward (placeholders count 0)."""
        returns = per_trajectory(batch.traj_return, batch)
        group = per_trajectory(batch.group_id, batch)
        best = torch.full((batch.num_groups,), -torch.inf, dtype=returns.dtype).scatter_reduce(0, group, returns, "amax")
        key = batch.group_id * (int(batch.turn.max()) + 1) + batch.turn
        turn_mean = segment_sum(batch.reward, key, int(key.max()) + 1) / cfg.group_size
        row = (returns - best[group])[batch.traj_id] + batch.reward - turn_mean[key]
        return broadcast_to_tokens(row, batch)

    try:
        problem = small_tree_mdp
        policy = _policy(problem, ref.random_probs(problem, 3))
        cfg = AlgorithmConfig(advantage="best_mate_test", group_size=3)
        batch, adv = exact_advantages(problem, policy, cfg)
        exact = _advantage_moments(problem, batch, adv)
        gen = torch.Generator().manual_seed(1)
        calls, tasks = 30, 1000
        draws = torch.stack([
            _advantage_moments(problem, sampled, compute_advantages(sampled, cfg))
            for sampled in (sample_batch(problem, policy, tasks, cfg.group_size, gen) for _ in range(calls))
        ])
        mc, se = draws.mean(0), draws.std(0) / calls**0.5
        reachable = se > 0
        assert reachable.sum() > 20
        assert torch.allclose(exact[~reachable], torch.zeros_like(exact[~reachable]), atol=ATOL, rtol=0)
        assert bool(((mc - exact).abs() <= 4.5 * se).all()), ((mc - exact) / se).abs().max()
        assert (exact.abs() / se.clamp_min(1e-300))[reachable].max() > 20
    finally:
        ADV_ESTIMATORS.remove("best_mate_test")


@pytest.mark.parametrize("reads_histories", [False, True])
def test_exact_group_rows_counts_the_rows_of_the_exact_group_batch(small_tree_mdp, reads_histories, monkeypatch):
    """The count a check uses to refuse a batch too large is the batch's size; classing group-mates by their
    histories makes more classes, hence more rows."""
    import dataclasses

    from seeupo.core.registry import ADV_ESTIMATORS
    from seeupo.tabular.rollout import exact_group_batch, exact_group_rows

    cfg = preset("grpo", group_size=3)
    entry = ADV_ESTIMATORS.get(cfg.advantage)
    monkeypatch.setitem(ADV_ESTIMATORS._entries, cfg.advantage, dataclasses.replace(entry, reads_histories=reads_histories))
    policy = TabularPolicy(small_tree_mdp, init_scale=1.0, generator=torch.Generator().manual_seed(1))
    rows = exact_group_rows(small_tree_mdp, policy, cfg)
    assert rows == exact_group_batch(small_tree_mdp, policy, cfg)[0].num_rows
    monkeypatch.setitem(ADV_ESTIMATORS._entries, cfg.advantage, dataclasses.replace(entry, reads_histories=False))
    by_outcome = exact_group_rows(small_tree_mdp, policy, cfg)
    assert rows > by_outcome if reads_histories else rows == by_outcome
