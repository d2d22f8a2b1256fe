"""The exact gradients of the KL estimators in each placement (seeupo.tabular.kl), against hand computations.

One token, pi = (1/4, 3/4) and ref = (1/2, 1/2) on two logits: grad KL(ref || pi) = pi - ref = (-1/4, 1/4), and
grad KL(pi || ref) = pi_a (log(pi_a / ref_a) - KL(pi || ref)) with KL(pi || ref) = 1/4 log(1/2) + 3/4 log(3/2).
"""

from __future__ import annotations

import math

import pytest
import torch

from seeupo.core.config import preset
from seeupo.tabular.kl import kl_gradients, kl_reward_problem, reference_policy, turn_penalties
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import random_token_bandit, sequential_bandit

DT = torch.float64
KL_REVERSE = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
REVERSE = torch.tensor([0.25 * (math.log(0.5) - KL_REVERSE), 0.75 * (math.log(1.5) - KL_REVERSE)], dtype=DT)
FORWARD = torch.tensor([-0.25, 0.25], dtype=DT)


def _one_token():
    problem = sequential_bandit(torch.ones(1, 1), (2,), torch.tensor([[[0.0, 1.0]]], dtype=DT))
    reference = TabularPolicy(problem)  # uniform: (1/2, 1/2)
    policy = TabularPolicy(problem)
    policy.set_action_probs([torch.tensor([[[0.25, 0.75]]], dtype=DT)])
    return problem, policy, reference_policy(problem, reference)


@pytest.mark.parametrize("estimator, placement, expected", [
    ("k1", "loss", torch.zeros(2, dtype=DT)),
    ("k2", "loss", REVERSE),
    ("k3", "loss", FORWARD),
    ("k1", "loss_is", REVERSE),
    ("k3", "loss_is", REVERSE),
    ("k1", "reward", REVERSE),
])
def test_on_one_token_each_placement_gives_the_gradient_schulman_and_rpg_say(estimator, placement, expected):
    problem, policy, reference = _one_token()
    found = kl_gradients(problem, policy, reference, estimator, placement)
    torch.testing.assert_close(found.reverse[0][0], REVERSE, rtol=0, atol=1e-12)
    torch.testing.assert_close(found.forward[0][0], FORWARD, rtol=0, atol=1e-12)
    torch.testing.assert_close(found.term[0][0], expected, rtol=0, atol=1e-12)


def test_over_several_tokens_only_the_reward_placement_gives_the_trajectory_kl_gradient():
    """Answers of 2 tokens of 3 over 2 turns, random policy and reference: k1 in the reward is the score function of
    the whole trajectory's log-ratio, grad KL(pi || ref) exactly; k2 in the loss (the per-token reverse KL) and k3
    with its ratio (unbiased per token) miss how earlier tokens move the later ones' states, so they differ from it
    (Tang and Munos 2025); k1 in the loss is 0 in expectation whatever the length."""
    problem = random_token_bandit(2, 2, 3, 2, generator=torch.Generator().manual_seed(0))
    policy = TabularPolicy(problem, init_scale=1.0, generator=torch.Generator().manual_seed(1))
    reference = reference_policy(problem, TabularPolicy(problem, init_scale=1.0, generator=torch.Generator().manual_seed(2)))
    reverse = torch.cat(kl_gradients(problem, policy, reference, "k1", "reward").reverse, 1)
    for estimator, placement, equal in (("k1", "reward", True), ("k2", "loss", False), ("k3", "loss_is", False)):
        term = torch.cat(kl_gradients(problem, policy, reference, estimator, placement).term, 1)
        gap = float((term - reverse).abs().max())
        assert (gap < 1e-12) == equal, (estimator, placement, gap)
        if not equal:
            assert gap > 1e-3
    zero = torch.cat(kl_gradients(problem, policy, reference, "k1", "loss").term, 1)
    assert float(zero.abs().max()) < 1e-12


def test_the_reward_placement_lowers_each_reward_by_the_action_s_kl_estimates():
    """k1 in the reward: the penalty at (h, a) is log pi(a|h) - log ref(a|h), summed over the action's tokens."""
    problem, policy, reference = _one_token()
    penalty = turn_penalties(problem, policy, reference, "k1")[0][0, 0]
    torch.testing.assert_close(penalty, torch.tensor([math.log(0.5), math.log(1.5)], dtype=DT), rtol=0, atol=1e-12)
    cfg = preset("rloo", kl_coef=0.1, kl_estimator="k1", kl_placement="reward")
    penalised = kl_reward_problem(problem, policy, reference, cfg)
    torch.testing.assert_close(penalised.rewards[0][0, 0, :, 0], torch.tensor([0.0, 1.0], dtype=DT) - 0.1 * penalty)
    assert torch.equal(problem.rewards[0], torch.tensor([[[[0.0], [1.0]]]], dtype=DT))  # the problem is unchanged


def test_an_action_the_policy_cannot_play_has_no_penalty():
    """Answers of 2 binary tokens ending at token 0: the spelling 01 is impossible (no finite estimate, never sampled)
    and gets no penalty; every other action's k3 penalty is finite, however unlikely the policy makes it."""
    problem = random_token_bandit(1, 1, 2, 2, end_token=0, generator=torch.Generator().manual_seed(0))
    reference = reference_policy(problem, TabularPolicy(problem))
    policy = TabularPolicy(problem)
    policy.set_action_probs([torch.tensor([[[1.0, 0.0, 0.0, 0.0]]], dtype=DT)])  # 1e-300 floors the others
    penalty = turn_penalties(problem, policy, reference, "k3")[0][0, 0]
    assert penalty[1] == 0.0 and bool(torch.isfinite(penalty).all()) and float(penalty[2]) > 0


@pytest.mark.parametrize("estimator, placement, expected", [
    ("k1", "reward", -REVERSE), ("k2", "loss", -REVERSE), ("k3", "loss", -FORWARD), ("k1", "loss", torch.zeros(2, dtype=DT)),
])
def test_the_whole_update_s_first_step_keeps_its_kl_term_against_a_reference(estimator, placement, expected):
    """update_direction(..., reference=ref) with every reward 0: the first step is the KL term alone, as the update
    applies it (RLOO's oracle advantage, its aggregation over one-token rows: the expectation itself), beta times the
    hand values above; without the reference the term is left out (0)."""
    from seeupo.tabular.gradient import update_direction

    problem, policy, reference = _one_token()
    problem = sequential_bandit(torch.ones(1, 1), (2,), torch.zeros(1, 1, 2, dtype=DT))
    cfg = preset("rloo", advantage="oracle", kl_coef=0.5, kl_estimator=estimator, kl_placement=placement)
    (step,), _ = update_direction(problem, policy, cfg, reference=reference)
    torch.testing.assert_close(step[0], 0.5 * expected, rtol=0, atol=1e-12)
    (without,), _ = update_direction(problem, policy, cfg)
    assert float(without.abs().max()) == 0.0
