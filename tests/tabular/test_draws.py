"""The law of one sampled update (seeupo/tabular/draws.py): the draws' probabilities by hand, early-ending episodes
merged, the expected first step against the exact update's, and a hand computation of ``P(J falls)`` and the
signal share for the leave-one-out policy gradient on a two-armed bandit."""

import math
from fractions import Fraction

import pytest
import torch

from seeupo.core.advantages import grae
from seeupo.core.config import preset
from seeupo.core.registry import ADV_ESTIMATORS, register_adv_est
from seeupo.tabular.draws import TooManyDraws, group_draws, one_sampled_update, repeat, trajectories
from seeupo.tabular.gradient import update_direction
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import DTYPE, random_family, random_token_bandit, sequential_bandit


def two_armed(p: float) -> tuple:
    """Arm 0 pays 1, arm 1 pays 0; the policy plays arm 0 with probability ``p``."""
    problem = sequential_bandit(torch.ones(1), (2,), torch.tensor([[1.0, 0.0]], dtype=DTYPE))
    policy = TabularPolicy(problem)
    policy.set_action_probs([torch.tensor([[[p, 1 - p]]], dtype=DTYPE)])
    return problem, policy


def test_each_group_of_two_has_its_multinomial_probability():
    problem, policy = two_armed(0.3)
    draws = group_draws(problem, policy, 2)
    assert draws.problem.num_instances == 3 and draws.batch.num_groups == 3
    assert draws.prob.tolist() == pytest.approx([0.09, 0.42, 0.49], abs=1e-15)  # {0,0}, {0,1}, {1,1}
    assert draws.batch.data["action"].tolist() == [0, 0, 0, 1, 1, 1]
    with pytest.raises(TooManyDraws, match="3 group draws"):
        group_draws(problem, policy, 2, max_draws=2)
    with pytest.raises(ValueError, match="one-instance"):
        repeat(repeat(problem, 2), 2)


def test_an_episode_that_ends_early_is_one_trajectory():
    problem = random_family("stop", 1, 3, reward_levels=3, generator=torch.Generator().manual_seed(0))
    policy = TabularPolicy(problem, init_scale=1.0, generator=torch.Generator().manual_seed(1))
    paths = trajectories(problem, policy.action_probs())
    assert float(paths.prob.sum()) == pytest.approx(1.0, abs=1e-12)
    assert len(paths.prob) < problem.num_histories(problem.num_turns)  # stopped episodes merged
    keys = {(tuple(h), tuple(a)) for h, a in zip(paths.hist.tolist(), paths.action.tolist())}
    assert len(keys) == len(paths.prob)


@pytest.mark.parametrize("name", ["grpo", "rloo", "gspo", "ppo"])
def test_the_draws_first_steps_average_to_the_exact_update(name):
    """Equal-length answers and every episode of full length: the aggregation's normaliser is the same in every draw,
    so the expected first step is the exact update's direction (a group estimator's closed form is its expectation).
    Not SeeUPO's: its batch std over one drawn group is not the exact batch's std."""
    problem = random_token_bandit(1, 2, 2, 2, reward_levels=3, generator=torch.Generator().manual_seed(3))
    policy = TabularPolicy(problem, init_scale=1.0, generator=torch.Generator().manual_seed(0))
    cfg = preset(name, group_size=2)
    law = one_sampled_update(problem, policy, cfg, "adam", 0.05)
    assert float(law.prob.sum()) == pytest.approx(1.0, abs=1e-12) and len(law.prob) == math.comb(16 + 1, 2)
    mean = (law.prob[:, None] * law.first_step).sum(0)
    exact = torch.cat(update_direction(problem, policy, cfg)[0], dim=1)[0]
    assert float(mean @ exact) / float(mean.norm() * exact.norm()) == pytest.approx(1.0, abs=1e-9)


def test_leave_one_out_on_two_arms_by_hand():
    """RLOO, G = 2, one SGD step: only the draw {0, 1} moves (A = +1 for arm 0, -1 for arm 1); its first step on the
    logits is (e0 - e1) / 2 (token mean over the 2 rows), probability 2pq. So J never falls, the mean step is
    pq (1, -1), its second moment 2pq |(1, -1)/2|^2 = pq, and the signal share 2 p^2 q^2 / (pq) = 2pq."""
    p = Fraction(3, 10)
    q = 1 - p
    problem, policy = two_armed(float(p))
    law = one_sampled_update(problem, policy, preset("rloo", group_size=2), "sgd", 0.1)
    assert law.p_lower(1e-12) == 0.0
    assert law.first_step.flatten().tolist() == pytest.approx([0.0, 0.0, 0.5, -0.5, 0.0, 0.0], abs=1e-15)
    assert law.signal_share == pytest.approx(float(2 * p * q), abs=1e-14)
    assert law.J_after[1] > law.J_before and law.J_after[0] == law.J_before
    register_adv_est("minus_loo_test", needs_group_stats=True, lm=False)(
        lambda batch, cfg, **_: -grae(batch, group_size=cfg.group_size, center="loo", scale="none"))
    try:  # minus the update: only the draw {0, 1} moves, and it lowers J
        anti = one_sampled_update(problem, policy, preset("rloo", group_size=2, advantage="minus_loo_test"), "sgd", 0.1)
    finally:
        ADV_ESTIMATORS.remove("minus_loo_test")
    assert anti.p_lower(1e-12) == pytest.approx(float(2 * p * q), abs=1e-14)
