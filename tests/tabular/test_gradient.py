"""The gradient verdict (seeupo.tabular.gradient) and the agentic problem families, against hand computations.

The stop-or-continue problem: turn 0 stops (reward 3/5) or continues (reward 3/10); after
continuing, turn 1 earns 1/2 (action a) or 0 (action b). J* = 3/10 + 1/2 = 4/5. At the start
policy pi_0 = (1/2, 1/2), pi_1 = (9/10, 1/10): Q(stop) = 3/5, Q(continue) = 3/10 + 9/20 = 3/4,
V = 27/40, so the policy gradient on turn 0's logits is pi(b) (Q(b) - V) = (-3/80, +3/80), and on
turn 1's (reached with probability 1/2) it is 1/2 pi(a) (r(a) - 9/20) = (+9/400, -9/400).
"""

from __future__ import annotations

import math
from fractions import Fraction as Fr

import pytest
import torch

from seeupo.core.config import preset
from seeupo.tabular.exact import optimal
from seeupo.tabular.gradient import (
    DIRECTIONS, STATIONARY, classify, expected_direction, gradient_directions, plain_ascent, policy_gradient, worst,
)
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import AGENTIC_FAMILIES, random_agentic_mdp, random_family, stop_or_continue

DT = torch.float64


def problem():
    return stop_or_continue(0.6, 0.3, (0.5, 0.0))


def start_policy(p_continue=Fr(1, 2), p_a=Fr(9, 10)) -> TabularPolicy:
    prob = problem()
    policy = TabularPolicy(prob)
    policy.set_action_probs([torch.tensor([[[float(1 - p_continue), float(p_continue)]]], dtype=DT),
                             torch.tensor([[[0.5, 0.5], [float(p_a), float(1 - p_a)]]], dtype=DT)])
    return policy


def close(tensor, fractions):
    torch.testing.assert_close(tensor, torch.tensor([float(f) for f in fractions], dtype=DT), rtol=0, atol=1e-12)


# ---- the problems


def test_stop_or_continue_optimum_is_continuing_then_a():
    opt = optimal(problem())
    assert float(opt.J[0]) == pytest.approx(0.8, abs=1e-15)
    assert opt.policy[0][0, 0].tolist() == [0.0, 1.0]
    assert opt.policy[1][0, 1].tolist() == [1.0, 0.0]


@pytest.mark.parametrize("family", list(AGENTIC_FAMILIES))
@pytest.mark.parametrize("turns", [1, 2, 3])
def test_agentic_family_stops_on_action_0_and_continues_otherwise(family, turns):
    prob = random_family(family, 3, turns, reward_levels=3, generator=torch.Generator().manual_seed(turns))
    for t in range(turns):
        term = prob.terminal[t]
        if t == turns - 1:
            assert bool(term.all())
        else:
            assert bool(term[:, :, 0].all()) and not bool(term[:, :, 1:].any())
        torch.testing.assert_close(prob.obs_probs[t].sum(-1), torch.ones_like(prob.obs_probs[t][..., 0]))
    if family == "tool" and turns > 1:
        assert prob.obs_per_turn[0] == 2 and prob.obs_per_turn[-1] == 1
    if family == "tokens":
        assert prob.tokens == ((2, 2),) * turns
    if family == "stop" and turns > 1:  # no intermediate rewards: a continuing action earns 0
        assert bool((prob.rewards[0][:, :, 1:] == 0).all())


def test_agentic_problem_refuses_one_action():
    with pytest.raises(ValueError, match="at least 2 actions"):
        random_agentic_mdp(1, 2, actions=1)


# ---- the policy gradient


def test_policy_gradient_matches_the_hand_computation():
    prob, policy = problem(), start_policy()
    g0, g1 = policy_gradient(prob, policy)
    close(g0[0], [Fr(-3, 80), Fr(3, 80)])
    close(g1[0], [0, 0, Fr(9, 400), Fr(-9, 400)])  # history 0 (after 'stop') is never reached


# ---- expected directions of three estimators


def test_turn_mean_return_to_go_points_downhill_at_turn_0(load):
    """Mean reward per remaining turn, centred per turn (G = 2): at turn 0, E[A | a] = (f(a) - E f) / 2 with
    f(stop) = 3/5 and f(continue) = E[(3/10 + r_1) / 2] = 3/8; so the direction is
    pi(b) (f(b) - E f) / 2 = (+9/320, -9/320), opposite to the gradient. At turn 1 the group-mate runs with
    probability 1/2 (else the baseline is the trajectory itself): 1/2 * (1/2) (r(a) - 9/20) * 1/2 * pi(a),
    a quarter of the gradient."""
    load("turn_mean_rtg")
    prob, policy = problem(), start_policy()
    cfg = preset("turn_mean_rtg", group_size=2)
    (d0, d1), _ = expected_direction(prob, policy, cfg)
    close(d0[0], [Fr(9, 320), Fr(-9, 320)])
    close(d1[0], [0, 0, Fr(9, 1600), Fr(-9, 1600)])
    verdict = gradient_directions(prob, policy, cfg)[0]
    assert verdict.verdict == "points downhill" and verdict.downhill_turn == 0
    assert verdict.turn_cosines[0] == pytest.approx(-1.0, abs=1e-12)
    assert verdict.turn_cosines[1] == pytest.approx(1.0, abs=1e-12)
    assert verdict.turn_scales[1] == pytest.approx(0.25, abs=1e-12)


def test_turn_mean_return_to_go_is_uphill_where_stopping_is_better(load):
    """At the uniform policy Q(continue) = 3/10 + 1/4 = 11/20 < 3/5: stopping is better, and the biased
    estimator happens to point the right way (each turn parallel, with other factors)."""
    load("turn_mean_rtg")
    prob, policy = problem(), start_policy(p_a=Fr(1, 2))
    verdict = gradient_directions(prob, policy, preset("turn_mean_rtg", group_size=2))[0]
    assert verdict.verdict == "unbiased per turn up to a positive scale"


@pytest.mark.parametrize("group_size", [2, 3])
def test_turn_loo_return_to_go_is_the_policy_gradient(load, group_size):
    """Leave-one-out baseline of the undivided return-to-go: E[A_0 | a] = Q(a) - V and, at turn 1,
    r(a) minus a constant, so the direction is the gradient itself (factor 1) for any G."""
    load("turn_loo_rtg")
    prob, policy = problem(), start_policy()
    (d0, d1), _ = expected_direction(prob, policy, preset("turn_loo_rtg", group_size=group_size))
    close(d0[0], [Fr(-3, 80), Fr(3, 80)])
    close(d1[0], [0, 0, Fr(9, 400), Fr(-9, 400)])
    assert gradient_directions(prob, policy, preset("turn_loo_rtg", group_size=group_size))[0].verdict == "unbiased"


@pytest.mark.parametrize("group_size", [2, 3, 5])
def test_mean_centred_grae_is_parallel_with_factor_one_minus_one_over_g(group_size):
    prob, policy = problem(), start_policy()
    cfg = preset("grpo", grae_scale="none", group_size=group_size)
    (d0, d1), _ = expected_direction(prob, policy, cfg)
    factor = 1 - Fr(1, group_size)
    close(d0[0], [factor * Fr(-3, 80), factor * Fr(3, 80)])
    close(d1[0], [0, 0, factor * Fr(9, 400), factor * Fr(-9, 400)])
    verdict = gradient_directions(prob, policy, cfg)[0]
    assert verdict.verdict == "unbiased"
    assert verdict.turn_scales == pytest.approx([float(factor)] * 2, abs=1e-12)


# ---- fixed points of plain exact ascent


def test_plain_ascent_of_the_biased_estimator_stops_at_the_policy_that_stops(load):
    load("turn_mean_rtg")
    result = plain_ascent(problem(), preset("turn_mean_rtg", group_size=2))
    assert result.verdict == ["stops below J*"]
    assert float(result.J[-1, 0]) == pytest.approx(0.6, abs=1e-3)
    assert float(result.probs[0][0, 0, 1]) < 0.01  # P(continue)


def test_plain_ascent_of_the_unbiased_estimator_reaches_j_star(load):
    load("turn_loo_rtg")
    result = plain_ascent(problem(), preset("turn_loo_rtg", group_size=2))
    assert result.verdict == ["reaches J*"]
    assert float(result.J[-1, 0]) == pytest.approx(0.8, abs=1e-3)


def test_plain_ascent_of_a_zero_estimator_stops_at_once():
    """At the optimal deterministic policy every group returns the same, so mean-centred GRAE is zero: no step."""
    prob = problem()
    opt = optimal(prob).policy
    result = plain_ascent(prob, preset("grpo", grae_scale="none", group_size=2), start=opt)
    assert result.steps == 0 and result.verdict == ["reaches J*"]


# ---- classify on hand-made vectors


def t(*xs):
    return torch.tensor(xs, dtype=DT)


@pytest.mark.parametrize("expected, true, verdict", [
    ([t(2, -2), t(1, 1)], [t(1, -1), t(0.5, 0.5)], "unbiased"),
    ([t(2, -2), t(3, 3)], [t(1, -1), t(0.5, 0.5)], "unbiased per turn up to a positive scale"),
    ([t(2, -1), t(1, 1)], [t(1, -1), t(0.5, 0.5)], "biased but uphill"),
    ([t(-1, 1), t(5, 5)], [t(1, -1), t(0.5, 0.5)], "points downhill"),
    ([t(0, 0), t(0, 0)], [t(1, -1), t(0.5, 0.5)], "no expected signal"),
    ([t(1, -1), t(0, 0)], [t(0, 0), t(0, 0)], STATIONARY),
    ([t(1e-12, 0), t(1, 1)], [t(0, 0), t(1, 1)], "unbiased"),  # 1e-12 is below the tolerance of a scale-1 estimator
])
def test_classify(expected, true, verdict):
    assert classify(expected, true, expected_scale=1.0, value_scale=1.0).verdict == verdict


def test_worst_orders_the_verdicts_and_ignores_stationary_cases():
    assert worst(["unbiased", "biased but uphill", STATIONARY]) == "biased but uphill"
    assert worst(["unbiased", "points downhill"]) == "points downhill"
    assert worst([STATIONARY]) == STATIONARY
    assert list(DIRECTIONS)[0] == "unbiased" and list(DIRECTIONS)[-1] == "points downhill"


def test_the_gradient_verdict_refuses_shared_parameters():
    prob = problem()
    with pytest.raises(ValueError, match="independent"):
        policy_gradient(prob, TabularPolicy(prob, "shared"))


def test_cosines_are_nan_where_a_turn_has_no_gradient():
    d = classify([t(1, -1), t(0, 0)], [t(1, -1), t(0, 0)], 1.0, 1.0)
    assert d.verdict == "unbiased" and math.isnan(d.turn_cosines[1]) and math.isnan(d.turn_scales[1])


# ---- the hypothesis strategy


def test_agentic_mdps_draws_problems_of_the_family():
    from hypothesis import given, settings

    from seeupo.testing import agentic_mdps

    @settings(max_examples=5, deadline=None, database=None)
    @given(agentic_mdps("tool", min_turns=2, max_turns=3))
    def draw(prob):
        assert prob.num_instances == 1 and 2 <= prob.num_turns <= 3
        assert prob.obs_per_turn[0] == 2 and bool(prob.terminal[0][:, :, 0].all())
        assert not bool(prob.terminal[0][:, :, 1:].any())

    draw()
