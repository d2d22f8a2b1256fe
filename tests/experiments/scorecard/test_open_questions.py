"""The capabilities of stale rollouts, the KL term's gradient and pass@k (seeupo.experiments.scorecard.open_questions)
on hand-made algorithms whose scores are known (tests/experiments/scorecard/hand_algorithms.py)."""

import torch

from seeupo.experiments.scorecard import open_questions
from seeupo.experiments.scorecard.base import Sizes
from seeupo.experiments.scorecard.card import context

TINY = Sizes(instances=2, iterations=3, exact_epochs=10, starts=1, convergence_updates=10)


def test_the_stale_behaviour_is_one_ascent_step_behind():
    """The stale policy is the policy before an exact ascent step of J whose largest logit change is STALE_STEP: its J
    is lower, and its log-probabilities differ from the policy's."""
    from seeupo.experiments.gradient_check import random_starts
    from seeupo.tabular.exact import evaluate
    from seeupo.tabular.problems import random_token_bandit

    problem = random_token_bandit(3, 1, 2, 2, reward_levels=3, generator=torch.Generator().manual_seed(0))
    probs = random_starts(problem, 1, torch.Generator().manual_seed(1))[1]
    mu = open_questions._stale(problem, probs)
    assert all(not p.requires_grad for p in mu.parameters())
    j_pi, j_mu = evaluate(problem, probs).J, evaluate(problem, mu.action_probs()).J
    assert bool((j_mu < j_pi).all())
    change = (torch.log(mu.action_probs()[0]) - torch.log(probs[0])).abs().max()
    assert 0.0 < float(change) <= 2 * open_questions.STALE_STEP  # a logit change moves a log-probability at most twice


def test_without_a_correction_the_step_turns_off_policy_and_the_trajectory_weight_keeps_it(hand):
    plain = open_questions.off_policy_robustness(context("exact_pg", TINY, None))
    weighted = open_questions.off_policy_robustness(context("exact_pg_sequence_is", TINY, None))
    assert 0.5 < plain.score.value < 1.0 - 1e-6 and "cosine with the on-policy step" in plain.worst
    assert weighted.score.value == 1.0 and weighted.worst is None
    assert plain.score.cases == weighted.score.cases == 2 * 2 * 2 * len(open_questions.ENGINES)
    assert "correction 'none'" in plain.covered and "correction 'sequence_is'" in weighted.covered


def test_k1_in_the_loss_pulls_nowhere_and_k1_in_the_reward_down_the_trajectory_kl(hand):
    """On policy, k1 in the loss has expected gradient 0 (score 0); k1 in the reward is the trajectory's grad KL
    (score 1); GRPO's published k3 in the loss follows KL(ref || pi) per token (below 1); no KL term, no score."""
    assert open_questions.kl_gradient(context("k1_loss_pg", TINY, None)).score.value == 0.0
    reward = open_questions.kl_gradient(context("k1_reward_pg", TINY, None))
    assert reward.score.value == 1.0 and reward.worst is None
    grpo = open_questions.kl_gradient(context("grpo", TINY, None))
    assert 0.0 < grpo.score.value < 1.0 and "-grad KL(pi || ref)" in grpo.worst and "k3 in the loss" in grpo.covered
    none = open_questions.kl_gradient(context("exact_pg", TINY, None))
    assert none.score.value is None and "no KL term" in none.score.reason


def test_sharpening_loses_pass_at_k_and_an_update_that_never_raises_pass_at_1_is_no_evidence(hand):
    sharp = open_questions.pass_at_k_retention(context("sharpened_pg", TINY, None))
    assert sharp.score.value < 0.8 and "pass@64 1.0000 ->" in sharp.worst
    frozen = open_questions.pass_at_k_retention(context("frozen_pg", TINY, None))
    assert frozen.score.value is None and "no run raised pass@1" in frozen.score.reason
    exact = open_questions.pass_at_k_retention(context("exact_pg", TINY, None))
    assert sharp.score.value < exact.score.value <= 1.0
