"""Tests of seeupo.theory.surrogate_bound: the case proof, the consequence, and exact clip steps."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
import torch

from seeupo.core.config import AlgorithmConfig
from seeupo.tabular.exact import evaluate
from seeupo.tabular.problems import DTYPE, random_sequential_bandit, random_tree_mdp
from seeupo.theory.surrogate_bound import (
    ADV,
    EPS,
    RHO,
    clipped_objective,
    derive_statewise_improvement,
    exact_clip_step,
    group_std_decrease_instance,
    maximise_clipped_surrogate,
    performance_difference,
    prove_clip_lower_bound,
    statewise_gains,
    surrogate_and_linear,
    surrogate_expr,
    tight_at_one,
)


def test_case_proof_covers_nine_cases_with_nonnegative_gaps():
    cases = prove_clip_lower_bound()
    assert {(c.advantage_sign, c.region) for c in cases} == {
        (s, r) for s in ("positive", "negative", "zero") for r in ("below", "inside", "above")
    }
    assert all(c.gap_nonnegative for c in cases)
    clipped = {(c.advantage_sign, c.region) for c in cases if c.active_branch == "clipped"}
    # the clip only binds where it removes the incentive: A > 0 above, A < 0 below
    assert clipped == {("positive", "above"), ("negative", "below")}
    for c in cases:
        if c.active_branch == "unclipped":
            assert sp.simplify(c.gap) == 0


def test_case_values_agree_with_the_min_clip_expression():
    """Each case's surrogate equals min(rho A, clip(rho) A) at random points of its region."""
    rng = np.random.default_rng(0)
    for case in prove_clip_lower_bound():
        params = sorted(set().union(*(e.free_symbols for e in case.substitution.values())), key=str)
        for _ in range(5):
            point = {
                p: sp.Rational(int(rng.integers(0, 50)), 7) + (sp.Rational(1, 3) if p.is_positive else 0) for p in params
            }
            rho, adv, eps = (case.substitution[s].subs(point) for s in (RHO, ADV, EPS))
            reference = surrogate_expr(rho, adv, eps)
            assert sp.simplify(case.surrogate.subs(point) - reference) == 0
            assert sp.simplify(rho * adv - reference - case.gap.subs(point)) == 0
            assert rho > 0 and 0 < eps < 1


def test_tight_at_one():
    value_gap, slope_gap = tight_at_one()
    assert value_gap == 0 and slope_gap == 0


@pytest.mark.parametrize("n", [2, 3, 4])
def test_statewise_improvement_identity(n):
    assert derive_statewise_improvement(n).difference == 0


def test_core_clipped_surrogate_below_linear_and_tight_at_pi_old():
    gen = torch.Generator().manual_seed(0)
    num_states, num_actions, support = 64, 4, 3
    for eps in (0.1, 0.2, 0.5):
        pi_old = -torch.log(torch.rand(num_states, num_actions, generator=gen, dtype=DTYPE))
        pi_old = pi_old / pi_old.sum(-1, keepdim=True)
        pi_new = torch.rand(num_states, num_actions, generator=gen, dtype=DTYPE) ** 4  # often far from pi_old
        pi_new = pi_new / pi_new.sum(-1, keepdim=True)
        signal = torch.randn(num_states, num_actions, support, generator=gen, dtype=DTYPE)
        probs = torch.rand(num_states, num_actions, support, generator=gen, dtype=DTYPE)
        probs = probs / probs.sum(-1, keepdim=True)
        surr, lin = surrogate_and_linear(pi_old, pi_new, signal, probs, eps)
        assert bool((surr <= lin + 1e-12).all())
        assert bool((surr < lin - 1e-6).any())  # the bound is not trivially tight
        surr_old, lin_old = surrogate_and_linear(pi_old, pi_old, signal, probs, eps)
        assert torch.allclose(surr_old, lin_old, atol=1e-14)


def test_lp_maximiser_is_optimal_against_random_policies():
    rng = np.random.default_rng(1)
    for _ in range(20):
        n = int(rng.integers(2, 5))
        pi_old = rng.dirichlet(np.ones(n))
        pos, neg = rng.random(n) * (rng.random(n) < 0.7), -rng.random(n) * (rng.random(n) < 0.7)
        best = maximise_clipped_surrogate(pi_old, pos, neg, 0.2)
        value = clipped_objective(best / pi_old, pos, neg, 0.2).sum()
        assert best.min() >= 0 and best.sum() == pytest.approx(1.0)
        for cand in rng.dirichlet(np.ones(n), size=200):
            assert clipped_objective(cand / pi_old, pos, neg, 0.2).sum() <= value + 1e-9


def test_performance_difference_lemma_matches_engine(random_probs):
    problem = random_tree_mdp(3, (2, 3), (2, 2), terminate_prob=0.3, gamma=0.8, generator=torch.Generator().manual_seed(2))
    old, new = random_probs(problem, 1), random_probs(problem, 2)
    lhs = evaluate(problem, new).J - evaluate(problem, old).J
    assert torch.allclose(performance_difference(problem, old, new), lhs, atol=1e-12)


AFFINE_SIGNALS = {
    "oracle": AlgorithmConfig(advantage="oracle"),
    "grae_mean": AlgorithmConfig(advantage="grae", group_size=3),
    "grae_loo": AlgorithmConfig(advantage="grae", group_size=2, grae_center="loo"),
    "grae_batch_std": AlgorithmConfig(advantage="grae", group_size=3, grae_scale="batch_std"),
}


@pytest.mark.parametrize("name", sorted(AFFINE_SIGNALS))
def test_exact_clip_steps_never_decrease_J_with_affine_signals(name, random_probs):
    """Non-binary rewards, early termination, gamma < 1: every state improves and J is monotone."""
    problem = random_tree_mdp(
        3, (2, 3), (2, 1), terminate_prob=0.3, gamma=0.9, reward_levels=4, generator=torch.Generator().manual_seed(0)
    )
    probs = random_probs(problem, 5)
    values = [evaluate(problem, probs).J]
    for _ in range(3):
        new = exact_clip_step(problem, probs, AFFINE_SIGNALS[name], eps=0.2)
        for gain in statewise_gains(problem, probs, new):
            assert float(gain.min()) >= -1e-10
        probs = new
        values.append(evaluate(problem, probs).J)
    values = torch.stack(values)
    assert bool((values[1:] >= values[:-1] - 1e-10).all())
    assert bool((values[-1] > values[0] + 1e-3).all())


def test_group_std_is_monotone_with_binary_rewards(random_probs):
    problem = random_sequential_bandit(3, (3, 2), reward_levels=2, generator=torch.Generator().manual_seed(4))
    probs = random_probs(problem, 3)
    cfg = AlgorithmConfig(advantage="grae", group_size=3, grae_scale="group_std")
    for _ in range(3):
        new = exact_clip_step(problem, probs, cfg)
        assert bool((evaluate(problem, new).J >= evaluate(problem, probs).J - 1e-10).all())
        probs = new


def test_group_std_with_non_binary_rewards_can_lower_J():
    problem, probs = group_std_decrease_instance()
    cfg = AlgorithmConfig(advantage="grae", group_size=2, grae_scale="group_std")
    new = exact_clip_step(problem, probs, cfg, eps=0.2)
    assert torch.allclose(new[0], torch.tensor([[[0.6, 0.4]]], dtype=DTYPE), atol=1e-9)
    before, after = float(evaluate(problem, probs).J), float(evaluate(problem, new).J)
    assert before == pytest.approx(0.275) and after == pytest.approx(0.27)
    # the same step with mean-centred GRAE improves
    mean_step = exact_clip_step(problem, probs, AlgorithmConfig(advantage="grae", group_size=2), eps=0.2)
    assert float(evaluate(problem, mean_step).J) > before + 1e-3
