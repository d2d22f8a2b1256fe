"""Exact evaluation (`seeupo.tabular.exact`) against plain-Python enumeration and Monte Carlo."""

from __future__ import annotations

import math

import pytest
import torch

from seeupo.tabular.exact import evaluate, kl_divergence, mixed_policy, optimal, reach_probabilities
from seeupo.tabular.policies import TabularPolicy, uniform_probs
from seeupo.tabular.problems import random_sequential_bandit, random_tree_mdp, sequential_bandit
from seeupo.tabular.rollout import sample_batch

ATOL = 1e-12


def _assert_matches_brute_force(problem, probs, ref):
    ev = evaluate(problem, probs)
    for i in range(problem.num_instances):
        bf = ref.brute_force(problem, probs, i)
        assert ev.J[i].item() == pytest.approx(bf.J, abs=ATOL)
        for t in range(problem.num_turns):
            assert len(bf.V[t]) == problem.num_histories(t)  # the walk visited every history
            for h in range(problem.num_histories(t)):
                assert ev.V[t][i, h].item() == pytest.approx(bf.V[t][h], abs=ATOL)
                assert ev.reach[t][i, h].item() == pytest.approx(bf.reach[t][h], abs=ATOL)
                for a in range(problem.actions_per_turn[t]):
                    assert ev.Q[t][i, h, a].item() == pytest.approx(bf.Q[t][(h, a)], abs=ATOL)
                    assert ev.A[t][i, h, a].item() == pytest.approx(bf.Q[t][(h, a)] - bf.V[t][h], abs=ATOL)
    return ev


@pytest.mark.parametrize("seed", [0, 1])
def test_evaluate_matches_brute_force_tree_mdp(tree_mdp, ref, seed):
    probs = ref.random_probs(tree_mdp, seed, zero_frac=0.3 * seed)
    ev = _assert_matches_brute_force(tree_mdp, probs, ref)
    assert tree_mdp.gamma < 1 and bool(tree_mdp.terminal[0].any())  # the features under test are present
    assert ev.J.shape == (tree_mdp.num_instances,)


def test_evaluate_matches_brute_force_undiscounted_terminal_rewards(ref):
    problem = random_tree_mdp(
        2, (3, 2, 2), (1, 2, 2), num_initial_states=3, terminate_prob=0.4, per_turn_rewards=False,
        gamma=1.0, generator=torch.Generator().manual_seed(5),
    )
    _assert_matches_brute_force(problem, ref.random_probs(problem, 3), ref)
    _assert_matches_brute_force(problem, ref.deterministic_probs(problem, 4), ref)


def test_evaluate_sequential_bandit_by_hand():
    # J = sum_{a0,a1} pi0(a0) pi1(a1 | a0) r(a0, a1) for a single initial state.
    rewards = [[[0.6, 0.6], [1.0, 0.0]]]
    problem = sequential_bandit([1.0], (2, 2), rewards)
    pi0 = torch.tensor([[[0.3, 0.7]]])
    pi1 = torch.tensor([[[0.9, 0.1], [0.25, 0.75]]])
    ev = evaluate(problem, [pi0, pi1])
    expected = 0.3 * (0.9 * 0.6 + 0.1 * 0.6) + 0.7 * (0.25 * 1.0 + 0.75 * 0.0)
    assert ev.J.item() == pytest.approx(expected, abs=ATOL)
    assert ev.Q[0][0, 0].tolist() == pytest.approx([0.6, 0.25], abs=ATOL)


def test_evaluate_against_monte_carlo(tree_mdp, ref):
    probs = ref.random_probs(tree_mdp, 7)
    policy = TabularPolicy(tree_mdp)
    policy.set_action_probs(probs)
    batch = sample_batch(tree_mdp, policy, tasks=20_000, group_size=1, generator=torch.Generator().manual_seed(0))
    first = batch.turn == 0
    returns, inst = batch.traj_return[first], batch.instance[first]
    J = evaluate(tree_mdp, probs).J
    for i in range(tree_mdp.num_instances):
        r = returns[inst == i]
        assert r.numel() == 20_000
        se = r.std().item() / r.numel() ** 0.5
        assert se > 0
        assert abs(r.mean().item() - J[i].item()) < 4.0 * se


@pytest.mark.parametrize(
    "actions, obs, num_s0",
    [((2, 2), (2, 2), 2), ((3, 2), (1, 2), 1), ((2, 2, 2), (1, 1, 1), 1)],
)
def test_optimal_matches_exhaustive_search(ref, actions, obs, num_s0):
    problem = random_tree_mdp(
        2, actions, obs, num_initial_states=num_s0, terminate_prob=0.3, gamma=0.9,
        generator=torch.Generator().manual_seed(sum(actions) + num_s0),
    )
    opt = optimal(problem)
    for i in range(problem.num_instances):
        best, count = ref.brute_force_optimum(problem, i)
        assert count > 10
        assert opt.J[i].item() == pytest.approx(best, abs=ATOL)
    # the returned deterministic policy achieves J*, and V*, Q* are its values
    ev = evaluate(problem, opt.policy)
    assert torch.allclose(ev.J, opt.J, atol=ATOL, rtol=0)
    for t in range(problem.num_turns):
        assert torch.allclose(ev.V[t], opt.V[t], atol=ATOL, rtol=0)
        assert torch.allclose(ev.Q[t], opt.Q[t], atol=ATOL, rtol=0)
        assert torch.equal(opt.policy[t].sum(-1), torch.ones_like(opt.policy[t].sum(-1)))
        assert bool(((opt.policy[t] == 0) | (opt.policy[t] == 1)).all())


def test_optimal_dominates_random_policies(tree_mdp, ref):
    j_star = optimal(tree_mdp).J
    for seed in range(10):
        for probs in (ref.random_probs(tree_mdp, seed), ref.deterministic_probs(tree_mdp, seed)):
            assert bool((evaluate(tree_mdp, probs).J <= j_star + ATOL).all())
    # and it is strictly better than the uniform policy on random rewards
    assert bool((evaluate(tree_mdp, uniform_probs(tree_mdp)).J < j_star - 1e-3).all())


def test_optimal_ties_go_to_lowest_action():
    problem = sequential_bandit([1.0], (3,), [[0.2, 0.9, 0.9]])
    opt = optimal(problem)
    assert opt.policy[0][0, 0].tolist() == [0.0, 1.0, 0.0]
    assert opt.J.item() == pytest.approx(0.9)


@pytest.mark.parametrize("seed", [0, 1])
def test_reach_probabilities_sum_to_alive_probability(tree_mdp, ref, seed):
    probs = ref.random_probs(tree_mdp, seed, zero_frac=0.3)
    reach = reach_probabilities(tree_mdp, probs)
    assert len(reach) == tree_mdp.num_turns
    for i in range(tree_mdp.num_instances):
        bf = ref.brute_force(tree_mdp, probs, i)
        for t in range(tree_mdp.num_turns):
            assert reach[t][i].sum().item() == pytest.approx(bf.alive[t], abs=ATOL)
    assert torch.allclose(reach[0].sum(-1), torch.ones(tree_mdp.num_instances), atol=ATOL)
    # with early termination the later turns are alive with probability < 1
    assert bool((reach[-1].sum(-1) < 1 - 1e-3).all())


def test_reach_probabilities_without_termination_sum_to_one(ref):
    problem = random_sequential_bandit(3, (2, 3, 2), num_initial_states=2, generator=torch.Generator().manual_seed(1))
    probs = ref.random_probs(problem, 5)
    reach = reach_probabilities(problem, probs)
    for t in range(problem.num_turns):
        assert torch.allclose(reach[t].sum(-1), torch.ones(problem.num_instances), atol=ATOL, rtol=0)
    # a turn-1 history (s0, a0) is reached with probability rho(s0) pi0(a0 | s0)
    expected = (problem.initial_state_probs[:, :, None] * probs[0]).reshape(problem.num_instances, -1)
    assert torch.allclose(reach[1], expected, atol=ATOL, rtol=0)


def test_mixed_policy(tree_mdp, ref):
    old = ref.random_probs(tree_mdp, 1)
    new = ref.random_probs(tree_mdp, 2)
    mix = mixed_policy(old, new, {0, 2})
    assert mix[0] is new[0] and mix[1] is old[1] and mix[2] is new[2]
    assert all(m is o for m, o in zip(mixed_policy(old, new, []), old))
    assert all(m is n for m, n in zip(mixed_policy(old, new, [0, 1, 2]), new))
    # its value is the value of the policy that plays new at turns 0 and 2 and old at turn 1
    ev = evaluate(tree_mdp, mix)
    for i in range(tree_mdp.num_instances):
        assert ev.J[i].item() == pytest.approx(ref.brute_force(tree_mdp, [new[0], old[1], new[2]], i).J, abs=ATOL)


def test_kl_divergence(tree_mdp, ref):
    p = ref.random_probs(tree_mdp, 1)
    q = ref.random_probs(tree_mdp, 2)
    zero = kl_divergence(tree_mdp, p, p)
    assert zero.shape == (tree_mdp.num_instances,)
    assert torch.allclose(zero, torch.zeros_like(zero), atol=1e-14, rtol=0)
    kl = kl_divergence(tree_mdp, p, q)
    assert bool((kl > 1e-3).all())
    # brute force: sum_t sum_h d_p(h) KL(p(.|h) || q(.|h))
    for i in range(tree_mdp.num_instances):
        bf = ref.brute_force(tree_mdp, p, i)
        expected = 0.0
        for t in range(tree_mdp.num_turns):
            for h, d in bf.reach[t].items():
                for a in range(tree_mdp.actions_per_turn[t]):
                    pa, qa = p[t][i, h, a].item(), q[t][i, h, a].item()
                    expected += d * pa * (math.log(pa) - math.log(qa))
        assert kl[i].item() == pytest.approx(expected, abs=1e-12)


def test_kl_divergence_with_zero_probabilities(tree_mdp, ref):
    # a deterministic p against the uniform q: log(A_t) at every history p reaches
    p = ref.deterministic_probs(tree_mdp, 3)
    q = uniform_probs(tree_mdp)
    kl = kl_divergence(tree_mdp, p, q)
    assert torch.isfinite(kl).all()
    reach = reach_probabilities(tree_mdp, p)
    expected = sum(reach[t].sum(-1) * torch.log(torch.tensor(float(a))) for t, a in enumerate(tree_mdp.actions_per_turn))
    assert torch.allclose(kl, expected, atol=1e-12, rtol=0)
    assert torch.allclose(kl_divergence(tree_mdp, p, p), torch.zeros_like(kl), atol=1e-14, rtol=0)


def test_an_impossible_answer_is_never_optimal():
    """3 binary tokens ending at token 0: the impossible spelling 001 pays 10 but no policy plays it; J* is the best
    possible answer's 0.7 (110), and the uniform policy's J weighs 000, 100, 110, 111 by 1/2, 1/4, 1/8, 1/8."""
    import dataclasses

    rewards = torch.tensor([[[0.2, 10.0, 10.0, 10.0, 0.4, 10.0, 0.7, 0.1]]], dtype=torch.float64)
    problem = dataclasses.replace(sequential_bandit(torch.ones(1, 1), (8,), rewards, tokens=((2, 3),)), end_token=0)
    best = optimal(problem)
    assert float(best.J[0]) == pytest.approx(0.7) and best.policy[0][0, 0].argmax().item() == 6
    expected = 0.2 / 2 + 0.4 / 4 + 0.7 / 8 + 0.1 / 8
    assert float(evaluate(problem, TabularPolicy(problem).action_probs()).J[0]) == pytest.approx(expected, abs=1e-12)
