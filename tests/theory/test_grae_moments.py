"""Tests of seeupo.theory.grae_moments: closed forms, exact finite-support means, affinity in Q."""

from __future__ import annotations

import pytest
import sympy as sp
import torch

from seeupo.tabular.policies import uniform_probs
from seeupo.tabular.problems import DTYPE, random_sequential_bandit, random_tree_mdp
from seeupo.theory.grae_moments import (
    MU,
    SIGMA2,
    R,
    affine_check,
    binary_affine_certificate,
    conditional_mean_given_return,
    conditional_moments_given_return,
    distribution_moments,
    engine_first_turn_signal_means,
    engine_moments_given_return,
    engine_q_first_turn,
    first_turn_return_distributions,
    grae_conditional_moments,
    grae_moments_by_expansion,
    grae_signal,
    is_state_affine,
    non_affine_instance,
)

G = sp.Symbol("G", integer=True, positive=True)


def test_closed_forms_of_the_brief():
    mean = grae_conditional_moments("mean", G)
    assert sp.simplify(mean.mean - (1 - 1 / G) * (R - MU)) == 0
    assert sp.simplify(mean.variance - (G - 1) * SIGMA2 / G**2) == 0
    loo = grae_conditional_moments("loo", G)
    assert sp.simplify(loo.mean - (R - MU)) == 0
    assert sp.simplify(loo.variance - SIGMA2 / (G - 1)) == 0


@pytest.mark.parametrize("center", ["mean", "loo"])
@pytest.mark.parametrize("group_size", [2, 3, 5])
def test_expansion_over_explicit_mates_agrees(center, group_size):
    by_expansion = grae_moments_by_expansion(center, group_size)
    closed = grae_conditional_moments(center, group_size)
    assert sp.simplify(by_expansion.mean - closed.mean) == 0
    assert sp.simplify(by_expansion.variance - closed.variance) == 0


@pytest.mark.parametrize("center", ["mean", "loo"])
def test_finite_support_moments_equal_closed_form(center):
    """The exact multiset sum (no std) reproduces E and Var for a symbolic 3-point distribution."""
    p, q = sp.symbols("p q", positive=True)
    dist = {sp.Integer(0): 1 - p - q, sp.Rational(1, 2): p, sp.Integer(2): q}
    mu, sigma2 = distribution_moments(dist)
    for own in dist:
        exact = conditional_moments_given_return(own, dist, 3, center=center)
        closed = grae_conditional_moments(center, 3, own, mu, sigma2)
        assert sp.simplify(exact.mean - closed.mean) == 0
        assert sp.simplify(exact.variance - closed.variance) == 0


def test_grae_signal_matches_core_formula():
    from seeupo.core.advantages import grae_from_group_stats

    group = [0.5, 0.0, 1.0, 0.25]
    own = torch.tensor(group[0], dtype=DTYPE)
    s = torch.tensor(sum(group), dtype=DTYPE)
    sq = torch.tensor(sum(x * x for x in group), dtype=DTYPE)
    for center in ("mean", "loo", "none"):
        for std in (False, True):
            core = float(grae_from_group_stats(own, s, sq, 4, center=center, group_std=std, eps=1e-6))
            mine = float(grae_signal(group[0], group[1:], center=center, group_std=std, eps=sp.Rational(1, 10**6)))
            assert mine == pytest.approx(core, abs=1e-12)
    assert grae_signal(1, [1, 1], group_std=True) == 0  # equal group: the 0/0 limit is 0


@pytest.mark.parametrize("center", ["mean", "loo"])
@pytest.mark.parametrize("group_size", [2, 4])
def test_engine_moments_given_return_match_closed_form(center, group_size):
    """Non-binary returns of a 2-turn tree MDP: the engine's exact batch gives the closed-form E and Var."""
    problem = random_tree_mdp(1, (2, 2), (1, 2), reward_levels=3, generator=torch.Generator().manual_seed(1))
    probs = uniform_probs(problem)
    dists, pi0 = first_turn_return_distributions(problem, probs)
    mix: dict = {}
    for p, d in zip(pi0, dists):
        for v, pv in d.items():
            mix[v] = mix.get(v, 0) + p * pv
    assert len(mix) >= 3  # genuinely non-binary
    mu, sigma2 = distribution_moments(mix)
    closed = grae_conditional_moments(center, group_size, R, mu, sigma2)
    engine = engine_moments_given_return(problem, probs, group_size, center=center)
    assert len(engine) == len(mix)
    for r, (mean, var) in engine.items():
        assert mean == pytest.approx(float(closed.mean.subs(R, sp.nsimplify(r, rational=True))), abs=1e-9)
        assert var == pytest.approx(float(closed.variance), abs=1e-9)


def test_group_std_conditional_mean_matches_engine():
    problem = random_tree_mdp(1, (2, 2), (1, 2), reward_levels=3, generator=torch.Generator().manual_seed(1))
    probs = uniform_probs(problem)
    dists, pi0 = first_turn_return_distributions(problem, probs)
    mix: dict = {}
    for p, d in zip(pi0, dists):
        for v, pv in d.items():
            mix[v] = mix.get(v, 0) + p * pv
    engine = engine_moments_given_return(problem, probs, 3, group_std=True, eps=1e-6)
    for r, (mean, _) in engine.items():
        own = sp.nsimplify(r, rational=True)
        exact = conditional_mean_given_return(own, mix, 3, group_std=True, eps=sp.Rational(1, 10**6))
        assert float(exact) == pytest.approx(mean, abs=1e-9)


# ---------------------------------------------------------------------------------------------
# affinity
# ---------------------------------------------------------------------------------------------


def test_affine_check_decisions():
    assert affine_check([0, 1, 3], [1, 3, 7]).affine
    assert affine_check([0, 1, 3], [1, 3, 7]).slope == 2
    negative = affine_check([0, 1], [1, 0])
    assert not negative.affine and negative.slope == -1
    off_line = affine_check([0, 1, 2], [0, 1, 3])
    assert not off_line.affine and off_line.slope is None
    assert not affine_check([1, 1], [0, 1]).affine
    assert affine_check([1, 1], [2, 2]).affine


@pytest.mark.parametrize("group_size", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("center", ["mean", "loo"])
@pytest.mark.parametrize("group_std", [False, True])
def test_binary_returns_always_give_positive_slope(group_size, center, group_std):
    cert = binary_affine_certificate(group_size, center=center, group_std=group_std)
    assert cert.slope_positive
    # f is affine on {0, 1}: f(R) = f0 + slope R
    assert sp.simplify(cert.f0 + cert.slope - cert.f1) == 0
    # the slope is positive on a grid of p (an independent numeric check of the certificate)
    p = sp.Symbol("p", nonnegative=True)
    for k in range(11):
        assert float(cert.slope.subs(p, sp.Rational(k, 10))) > 0
    if not group_std:
        c = (1 - sp.Rational(1, group_size)) if center == "mean" else 1
        assert sp.simplify(cert.slope - c) == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_binary_multi_turn_instances_are_affine(seed, random_probs):
    problem = random_sequential_bandit(1, (3, 2, 2), reward_levels=2, generator=torch.Generator().manual_seed(seed))
    probs = random_probs(problem, seed)
    for g in (2, 3):
        check = is_state_affine(problem, probs, g, group_std=True)
        assert check.affine, check.reason


def test_non_affine_instance_reverses_the_order():
    problem, probs = non_affine_instance()
    check = is_state_affine(problem, probs, 2, group_std=True)
    assert not check.affine
    assert check.q == (sp.Rational(1, 4), sp.Rational(3, 10))
    assert engine_q_first_turn(problem, probs)[0, 0].tolist() == pytest.approx([0.25, 0.3], abs=1e-12)
    assert sp.simplify(check.slope + 4 * sp.sqrt(2)) == 0
    assert sp.simplify(check.signal_mean[0] - sp.Rational(1, 5) / sp.sqrt(2)) == 0
    assert sp.simplify(check.signal_mean[1] + sp.Rational(1, 5) / sp.sqrt(2)) == 0
    # the engine's exact batch agrees (same eps)
    engine = engine_first_turn_signal_means(problem, probs, 2, group_std=True, eps=1e-6)
    exact = is_state_affine(problem, probs, 2, group_std=True, eps=sp.Rational(1, 10**6))
    for a in range(2):
        assert float(exact.signal_mean[a]) == pytest.approx(float(engine[0, 0, a]), abs=1e-12)
    # also reversed for larger groups; mean centring stays affine with c = 1 - 1/G
    for g in (3, 4):
        assert not is_state_affine(problem, probs, g, group_std=True).affine
    mean = is_state_affine(problem, probs, 2)
    assert mean.affine and mean.slope == sp.Rational(1, 2)
    engine_mean = engine_first_turn_signal_means(problem, probs, 2)
    for a in range(2):
        assert float(mean.signal_mean[a]) == pytest.approx(float(engine_mean[0, 0, a]), abs=1e-12)


def test_three_action_instance_off_the_line():
    """Non-binary group std with 3 actions: two actions with equal Q get different mean signals."""
    problem = random_sequential_bandit(1, (3, 2), reward_levels=3, generator=torch.Generator().manual_seed(1))
    probs = uniform_probs(problem)
    check = is_state_affine(problem, probs, 3, group_std=True)
    assert not check.affine and check.slope is None
    assert check.q[0] == check.q[1] and sp.simplify(check.signal_mean[0] - check.signal_mean[1]) != 0
    engine = engine_first_turn_signal_means(problem, probs, 3, group_std=True)
    for a in range(3):
        assert float(check.signal_mean[a]) == pytest.approx(float(engine[0, 0, a]), abs=1e-5)
    assert is_state_affine(problem, probs, 3).affine  # without the std: affine
