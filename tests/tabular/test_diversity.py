"""Exact entropy, pass@k, alternative mass and the covariance identity (seeupo.tabular.diversity), by hand."""

from __future__ import annotations

import math

import pytest
import torch

from seeupo.tabular.diversity import (alternative_mass, entropy_change_prediction, entropy_per_turn, pass_at_k,
                                      success_probability)
from seeupo.tabular.exact import reach_probabilities
from seeupo.tabular.policies import uniform_probs
from seeupo.tabular.problems import random_tree_mdp, sequential_bandit

DT = torch.float64


def _bandit(rewards):
    return sequential_bandit(torch.ones(1, 1), (len(rewards),), torch.tensor([[rewards]], dtype=DT))


def test_pass_at_k_of_one_right_answer_in_three_is_one_minus_two_thirds_to_the_k():
    problem = _bandit([1.0, 0.0, 0.0])
    found = pass_at_k(problem, uniform_probs(problem), [1, 2, 4, 64])[:, 0]
    torch.testing.assert_close(found, torch.tensor([1 - (2 / 3) ** k for k in (1, 2, 4, 64)], dtype=DT))


def test_success_is_reaching_the_best_return_of_the_episode_s_initial_state():
    """Two initial states (1/4, 3/4) of two turns of two answers: s0 = 0 pays 1 only for (0, 1), s0 = 1 pays 1/2 for
    every answer but (1, 1), which pays 1. Uniformly, an episode succeeds with probability 1/4 from either state."""
    rewards = torch.tensor([[[[0.0, 1.0], [0.0, 0.0]], [[0.5, 0.5], [0.5, 1.0]]]], dtype=DT)
    problem = sequential_bandit(torch.tensor([[0.25, 0.75]], dtype=DT), (2, 2), rewards)
    torch.testing.assert_close(success_probability(problem, uniform_probs(problem))[0], torch.tensor([0.25, 0.25], dtype=DT))
    torch.testing.assert_close(pass_at_k(problem, uniform_probs(problem), [3])[0, 0], torch.tensor(1 - 0.75**3, dtype=DT))


def test_entropy_per_turn_weighs_each_history_by_its_reach():
    problem = random_tree_mdp(2, (3, 2), (2, 1), terminate_prob=0.3, generator=torch.Generator().manual_seed(0))
    probs = uniform_probs(problem)
    found = entropy_per_turn(problem, probs)
    assert found.shape == (2, 2)
    torch.testing.assert_close(found[0], torch.full((2,), math.log(3), dtype=DT))  # every episode makes turn 0's choice
    # turn 1: log 2 times the probability of being alive there (some episodes ended after turn 0)
    alive = reach_probabilities(problem, probs)[1].sum(-1)
    torch.testing.assert_close(found[1], math.log(2) * alive)
    assert bool((alive < 1).all())


def test_alternative_mass_is_the_optimal_answers_share_beyond_the_likeliest():
    problem = _bandit([1.0, 1.0, 0.0, 1.0])
    probs = [torch.tensor([[[0.5, 0.2, 0.1, 0.2]]], dtype=DT)]
    # optimal answers hold 0.9; all but the likeliest (0.5) hold 0.4: 4/9
    assert float(alternative_mass(problem, probs)[0]) == pytest.approx(4 / 9)
    assert float(alternative_mass(problem, [torch.tensor([[[1.0, 0.0, 0.0, 0.0]]], dtype=DT)])[0]) == 0.0


def test_the_covariance_identity_is_the_first_order_entropy_change():
    """H(softmax(l + eps d)) - H(softmax(l)) = -eps Cov(log pi, d) + O(eps^2), for random logits and directions."""
    gen = torch.Generator().manual_seed(0)
    logits, delta = torch.randn(5, 7, generator=gen, dtype=DT), torch.randn(5, 7, generator=gen, dtype=DT)

    def entropy(x):
        p = torch.softmax(x, -1)
        return -(p * p.log()).sum(-1)

    eps = 1e-6
    measured = (entropy(logits + eps * delta) - entropy(logits)) / eps
    torch.testing.assert_close(measured, entropy_change_prediction(logits, delta), rtol=1e-4, atol=1e-8)
    # a step along the policy's own log-probabilities (its "sharpening") always lowers the entropy
    sharpen = torch.log_softmax(logits, -1)
    assert bool((entropy_change_prediction(logits, sharpen) < 0).all())
