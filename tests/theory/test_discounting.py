"""Tests of seeupo.theory.discounting: REINFORCE-GRAE at gamma < 1 is exact gradient ascent on J_gamma."""

from __future__ import annotations

import pytest
import sympy as sp
import torch

from seeupo.core.config import preset
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import random_tree_mdp
from seeupo.theory.discounting import (
    DISCOUNT_ALGORITHMS,
    engine_gradient_check,
    group_std_contrast,
    search_discounted_counterexample,
    symbolic_gradient_identity,
)


def test_symbolic_identity_on_a_two_turn_tree():
    identity = symbolic_gradient_identity()
    assert len(identity.grae_minus_gradient) == 6
    assert all(d == 0 for d in identity.grae_minus_gradient)
    gamma = sp.Symbol("gamma", positive=True)
    # the return-to-go estimator (no gamma^t) is off by 1/gamma on the turn-2 logits: not grad J_gamma
    assert all(sp.simplify(r - 1 / gamma) == 0 for r in identity.return_to_go_ratio)
    assert gamma in identity.objective.free_symbols


@pytest.mark.parametrize("name", sorted(DISCOUNT_ALGORITHMS))
@pytest.mark.parametrize("gamma", [0.5, 0.9])
def test_engine_gradient_is_scaled_discounted_policy_gradient(name, gamma):
    problem = random_tree_mdp(
        3, (2, 3), (2, 2), terminate_prob=0.4, gamma=gamma, reward_levels=4, generator=torch.Generator().manual_seed(0)
    )
    policy = TabularPolicy(problem, init_scale=1.0, generator=torch.Generator().manual_seed(3))
    check = engine_gradient_check(problem, policy, DISCOUNT_ALGORITHMS[name])
    assert check.max_error < 1e-12
    assert max(float(t.abs().max()) for t in check.true) > 1e-3  # not a vacuous comparison
    assert bool((check.expected_scale < 1.0).all())  # E[#turns] > 1: episodes of varying length


def test_engine_gradient_check_rejects_scaled_grae():
    problem = random_tree_mdp(1, (2, 2), (1, 1), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError):
        engine_gradient_check(problem, TabularPolicy(problem), preset("grpo", update="reinforce"))


@pytest.mark.parametrize("gamma", [0.5, 0.9])
def test_search_finds_no_discounting_counterexample(gamma):
    result = search_discounted_counterexample(num_instances=5, gamma=gamma, seed=0, iterations=200)
    assert not result.counterexample_found
    for gaps in result.gaps.values():
        assert bool((gaps.abs() < 1e-4).all())
    assert result.instance.gamma == gamma and result.instance.num_instances == 1
    assert bool(result.limit.greedy_optimal.all())
    assert float(result.limit.gap.abs().max()) < 1e-4
    # the instances do exercise early termination and gamma < 1
    assert any(bool(t.any()) for t in result.problem.terminal[:-1])


def test_group_std_limit_is_not_optimal():
    limit = group_std_contrast()
    assert float(limit.J_star) == pytest.approx(0.3)
    assert float(limit.J) == pytest.approx(0.25, abs=1e-3)
    assert not bool(limit.greedy_optimal.all())
