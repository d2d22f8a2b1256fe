"""Tests of seeupo.theory.haml: advantage decomposition and the importance-ratio identity."""

from __future__ import annotations

import itertools

import pytest
import torch

from seeupo.tabular.exact import evaluate
from seeupo.tabular.problems import random_sequential_bandit, random_tree_mdp
from seeupo.theory.haml import (
    coalition_q,
    haml_weighted_expectation,
    joint_advantage,
    mixed_expectation,
    multi_agent_advantages,
    symbolic_advantage_decomposition,
    symbolic_importance_identity,
)


@pytest.mark.parametrize("acts", [(2, 2), (2, 2, 2)])
def test_symbolic_importance_identity_every_order_and_prefix(acts):
    for order in itertools.permutations(range(len(acts))):
        for k in range(len(acts) + 1):
            proof = symbolic_importance_identity(acts, order, k)
            assert proof.lhs_minus_rhs == 0, (order, k)
            assert proof.rhs_minus_value == 0, (order, k)
    # not vacuous: with k >= 1 the weighted expectation depends on the new policy
    proof = symbolic_importance_identity(acts, tuple(range(len(acts))), 1)
    assert any(s.name.startswith("q") for s in proof.lhs.free_symbols)


@pytest.mark.parametrize("acts", [(2, 2), (3, 2), (2, 2, 2)])
def test_symbolic_advantage_decomposition(acts):
    for order in itertools.permutations(range(len(acts))):
        assert symbolic_advantage_decomposition(acts, order) == 0


@pytest.mark.parametrize("acts", [(2, 3), (3, 2, 2)])
def test_importance_identity_on_random_bandits(acts, random_probs):
    problem = random_sequential_bandit(4, acts, num_initial_states=2, generator=torch.Generator().manual_seed(1))
    old, new = random_probs(problem, 1), random_probs(problem, 2)
    j_old, j_new = evaluate(problem, old).J, evaluate(problem, new).J
    for order in itertools.permutations(range(len(acts))):
        gains = []
        for k in range(len(acts) + 1):
            lhs = haml_weighted_expectation(problem, old, new, order, k)
            rhs = mixed_expectation(problem, old, new, order, k)
            assert torch.allclose(lhs, rhs, atol=1e-12), (order, k)
            gains.append(lhs)
        assert torch.allclose(gains[0], torch.zeros_like(gains[0]), atol=1e-12)  # E_old[A_old] = 0
        assert torch.allclose(gains[-1], j_new - j_old, atol=1e-12)  # the sweep's gains telescope
    assert bool(((j_new - j_old).abs() > 1e-3).all())


@pytest.mark.parametrize("acts", [(2, 3), (3, 2, 2)])
def test_decomposition_on_random_bandits(acts, random_probs):
    problem = random_sequential_bandit(3, acts, num_initial_states=2, generator=torch.Generator().manual_seed(3))
    probs = random_probs(problem, 4)
    joint = joint_advantage(problem, probs)
    for order in itertools.permutations(range(len(acts))):
        parts = multi_agent_advantages(problem, probs, order)
        assert torch.allclose(sum(parts), joint, atol=1e-12)
    # forward order: A^t is the engine's per-turn advantage A_t(h_t, a_t)
    ev = evaluate(problem, probs)
    forward = multi_agent_advantages(problem, probs, list(range(len(acts))))
    shape = (problem.num_instances, problem.num_initial_states)
    for t, part in enumerate(forward):
        index = (slice(None),) * (3 + t) + (0,) * (len(acts) - t - 1)
        assert torch.allclose(part[index], ev.A[t].reshape(*shape, *acts[: t + 1]), atol=1e-12)
    # the empty coalition is V(s0)
    v = coalition_q(problem, probs, [])
    assert torch.allclose(v[(slice(None), slice(None)) + (0,) * len(acts)], ev.V[0], atol=1e-12)


def test_rejects_non_bandits(random_probs):
    problem = random_tree_mdp(1, (2, 2), (2, 1), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="sequential bandit"):
        joint_advantage(problem, random_probs(problem, 0))
