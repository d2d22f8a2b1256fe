"""The update-level gradient verdict (seeupo.tabular.gradient.update_direction) against hand computations.

The expected first step of an algorithm's whole update reads more than its estimator: the loss's
derivative at ratio 1, the aggregation's weights, a loss's own turn weights, the M factor's first
value and the schedule. Each case below changes one of them on the stop-or-continue problem and
compares the toolkit's exact step with an independent computation in fractions (:func:`reference`):
RLOO with G = 2, whose advantage for path i against a group-mate j is R_i - R_j, so a path's
expected advantage is E_j[T(R_i - R_j)] for a loss that applies T to it; token-mean aggregation
(one token per action) divides by the expected number of rows, E[turns] for a simultaneous update
and each turn's own reach for a sequential one.

On stop_or_continue(3/5, 3/10, (1/2, 0)) at the uniform policy the returns are 3/5 (stop, p 1/2),
4/5 (continue then a, p 1/4), 3/10 (continue then b, p 1/4); J = 23/40, J* = 4/5, and
grad J = (+1/80, -1/80) on turn 0's logits (stopping is better while turn 1 is uniform) and
(1/16, -1/16) on turn 1's after continuing.
"""

from __future__ import annotations

from fractions import Fraction as Fr

import pytest
import torch

from seeupo.core.batch import segment_sum
from seeupo.core.config import PRESETS, preset
from seeupo.core.registry import M_FACTORS, POLICY_LOSSES, register_m_factor, register_policy_loss
from seeupo.tabular.gradient import (
    UPDATE_PARTS, biasing_part, expected_direction, gradient_directions, linear_in_advantage, plain_ascent,
    update_direction,
)
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import random_family, stop_or_continue

DT = torch.float64


# ---- the parts under test, registered as a user's plugin would register them


def _turn_weighted(weight: float):
    def loss(logp_new, batch, adv, cfg):
        w = torch.where(batch.turn == 0, weight, 1.0).to(logp_new.dtype)
        return logp_new * adv * w[:, None], None
    return loss


def _negative_only(logp_new, batch, adv, cfg):
    """PPO on min(A, 0) at ratio 1: only the advantages below 0 count."""
    return logp_new * adv.clamp(max=0.0), None


def _per_trajectory_length(logp_new, batch, adv, cfg):
    """Each trajectory's tokens divided by its own length, as one row per trajectory with seq-mean-token-mean."""
    real = (batch.token_mask & batch.valid[:, None]).to(logp_new.dtype)
    length = segment_sum(real.sum(1), batch.traj_id, batch.num_trajectories)
    return logp_new * adv / length[batch.traj_id][:, None].clamp_min(1.0), None


LOSSES = {"turn0_zero_test": _turn_weighted(0.0), "turn0_flip_test": _turn_weighted(-1.0),
          "negative_only_test": _negative_only, "trajectory_length_test": _per_trajectory_length}


@pytest.fixture(scope="module", autouse=True)
def parts():
    for name, fn in LOSSES.items():
        register_policy_loss(name, surrogate=False)(fn)
    register_m_factor("negate_test", uses_ratio=True)(lambda factor, ratio, cfg: -factor * ratio.to(factor.dtype))
    yield
    for name in LOSSES:
        POLICY_LOSSES.remove(name)
    M_FACTORS.remove("negate_test")


# ---- the independent computation, in fractions


def reference(stop, cont, finals, p_cont=Fr(1, 2), p_final=None, *, transform=lambda a: a, turn0=Fr(1),
              by_length=False, sequential_factor=None):
    """The expected first step of RLOO (G = 2, token-mean aggregation) on stop_or_continue, per turn: turn 0's two
    logits, turn 1's four (history 0, after stopping, is never reached). ``transform``: what the loss does to an
    advantage; ``turn0``: the loss's weight on turn 0; ``by_length``: each path divided by its number of turns;
    ``sequential_factor``: a reverse-order sequential update whose M factor is this after turn 1 (else simultaneous)."""
    p_final = p_final or [Fr(1, len(finals))] * len(finals)
    paths = [(1 - p_cont, [0], Fr(stop))] + [(p_cont * q, [1, k], Fr(cont) + Fr(f))
                                            for k, (q, f) in enumerate(zip(p_final, finals))]
    pi = [[1 - p_cont, p_cont], p_final]
    g0, g1 = [Fr(0)] * 2, [Fr(0)] * (2 * len(finals))
    for p, actions, ret in paths:
        adv = sum(q * transform(ret - other) for q, _, other in paths) / (len(actions) if by_length else 1)
        for a in range(2):  # grad log pi(a0) = e_a0 - pi_0
            g0[a] += p * adv * turn0 * ((a == actions[0]) - pi[0][a])
        if len(actions) == 2:
            for a in range(len(finals)):
                g1[len(finals) + a] += p * adv * ((a == actions[1]) - pi[1][a])
    if sequential_factor is None:
        rows = sum(p * len(actions) for p, actions, _ in paths)  # token mean over every row
        return [x / rows for x in g0], [x / rows for x in g1]
    return [x * sequential_factor for x in g0], [x / p_cont for x in g1]  # each turn's step over its own rows


def uniform(problem) -> TabularPolicy:
    return TabularPolicy(problem)


def close(tensor, fractions):
    torch.testing.assert_close(tensor, torch.tensor([float(f) for f in fractions], dtype=DT), rtol=0, atol=1e-12)


def rloo(**changes):
    return preset("rloo").replace(group_size=2, **changes)


PROBLEM = (Fr(3, 5), Fr(3, 10), (Fr(1, 2), Fr(0)))


def test_the_update_of_plain_rloo_is_the_hand_computed_policy_gradient():
    problem = stop_or_continue(*PROBLEM)
    (g0, g1), _ = update_direction(problem, uniform(problem), rloo())
    want0, want1 = reference(*PROBLEM)
    assert want0 == [Fr(1, 120), Fr(-1, 120)] and want1[2:] == [Fr(1, 24), Fr(-1, 24)]  # grad J / E[turns] = / (3/2)
    close(g0[0], want0)
    close(g1[0], want1)
    assert gradient_directions(problem, uniform(problem), rloo(), "update")[0].verdict == "unbiased"


def test_a_loss_that_never_updates_turn_0_is_biased_and_stops_below_J_star():
    """A response mask that drops the first assistant message: turn 0 never learns. From the uniform policy the
    ascent can only perfect turn 1: J -> 1/2 * 3/5 + 1/2 * (3/10 + 1/2) = 7/10, against J* = 4/5."""
    problem, cfg = stop_or_continue(*PROBLEM), rloo(update="turn0_zero_test")
    (g0, g1), _ = update_direction(problem, uniform(problem), cfg)
    want0, want1 = reference(*PROBLEM, turn0=Fr(0))
    close(g0[0], want0)
    close(g1[0], want1)
    d = gradient_directions(problem, uniform(problem), cfg, "update")[0]
    assert d.verdict == "biased but uphill" and gradient_directions(problem, uniform(problem), cfg)[0].verdict == "unbiased"
    assert biasing_part(problem, uniform(problem), cfg, 0) == "loss"
    ascent = plain_ascent(problem, cfg, level="update", steps=300)
    assert ascent.verdict == ["stops below J*"] and float(ascent.J[-1, 0]) == pytest.approx(0.7, abs=5e-3)


def test_a_loss_that_flips_turn_0_points_downhill_and_ascent_ends_at_stopping():
    problem, cfg = stop_or_continue(*PROBLEM), rloo(update="turn0_flip_test")
    (g0, _), _ = update_direction(problem, uniform(problem), cfg)
    want0, _ = reference(*PROBLEM, turn0=Fr(-1))
    assert want0 == [Fr(-1, 120), Fr(1, 120)]
    close(g0[0], want0)
    d = gradient_directions(problem, uniform(problem), cfg, "update")[0]
    assert d.verdict == "points downhill" and d.downhill_turn == 0 and d.turn_cosines[0] == pytest.approx(-1.0, abs=1e-12)
    ascent = plain_ascent(problem, cfg, level="update", steps=300)
    assert ascent.verdict == ["stops below J*"] and float(ascent.J[-1, 0]) == pytest.approx(0.6, abs=5e-3)


def test_a_negative_only_loss_points_downhill_where_the_estimator_is_unbiased():
    """stop_or_continue(1/2, 0, (1, 1/10)) at the uniform policy: continuing is better on average (11/20 > 1/2), but
    min(R_i - R_j, 0) punishes the risky continue paths more: E_j[min(.)] is -1/8 for stop, 0 for (continue, a),
    -17/40 for (continue, b); turn 0's step (7/320, -7/320) / (3/2) pushes towards stopping, against
    grad J = (-1/80, +1/80). The loss is not linear in the advantage, so the group-mates are enumerated."""
    spec = (Fr(1, 2), Fr(0), (Fr(1), Fr(1, 10)))
    problem, cfg = stop_or_continue(*spec), rloo(update="negative_only_test")
    assert not linear_in_advantage(cfg) and linear_in_advantage(rloo())
    (g0, g1), _ = update_direction(problem, uniform(problem), cfg)
    want0, want1 = reference(*spec, transform=lambda a: min(a, Fr(0)))
    assert want0 == [Fr(7, 480), Fr(-7, 480)] and want1[2:] == [Fr(17, 480), Fr(-17, 480)]
    close(g0[0], want0)
    close(g1[0], want1)
    d = gradient_directions(problem, uniform(problem), cfg, "update")[0]
    assert d.verdict == "points downhill" and d.downhill_turn == 0 and d.turn_cosines[0] == pytest.approx(-1.0, abs=1e-12)
    assert gradient_directions(problem, uniform(problem), cfg)[0].verdict == "unbiased"  # the estimator alone
    assert biasing_part(problem, uniform(problem), cfg, 0) == "loss"


def test_an_m_factor_that_negates_reverses_turn_0_of_a_sequential_update():
    """Reverse order: turn 1 first (F = 1), then turn 0 with F <- -F = -1 (the ratio is 1 at the first step). Turn 1's
    step over its own rows (reach 1/2) is (1/8, -1/8), twice grad J; turn 0's is -grad J = (-1/80, +1/80)."""
    problem = stop_or_continue(*PROBLEM)
    cfg = rloo(schedule="sequential", order="reverse", m_factor="negate_test")
    (g0, g1), _ = update_direction(problem, uniform(problem), cfg)
    want0, want1 = reference(*PROBLEM, sequential_factor=Fr(-1))
    assert want0 == [Fr(-1, 80), Fr(1, 80)] and want1[2:] == [Fr(1, 8), Fr(-1, 8)]
    close(g0[0], want0)
    close(g1[0], want1)
    d = gradient_directions(problem, uniform(problem), cfg, "update")[0]
    assert d.verdict == "points downhill" and d.downhill_turn == 0
    assert biasing_part(problem, uniform(problem), cfg, 0) == "M factor"
    ascent = plain_ascent(problem, cfg, level="update", steps=300)
    assert ascent.verdict == ["stops below J*"] and float(ascent.J[-1, 0]) == pytest.approx(0.6, abs=5e-3)
    # happo's factor (1 at the first step) gives each turn the gradient, scaled by its own reach: per turn unbiased
    happo = gradient_directions(problem, uniform(problem), cfg.replace(m_factor="happo"), "update")[0]
    assert happo.verdict == "unbiased per turn up to a positive scale"


def test_a_loss_divided_by_the_trajectory_length_weights_the_turns_differently():
    """Each path divided by its number of turns: stop paths count twice as much as continue paths. By hand, turn 0's
    step is (1/2 * 1/40 * (1/2, -1/2) + (1/4 * 9/40 - 1/4 * 11/40) / 2 * (-1/2, 1/2)) / (3/2) = (3/320, -3/320) / (3/2)
    and turn 1's is half the plain one: per turn parallel to grad J, by factors 3/4 and 1/2 of RLOO's."""
    problem, cfg = stop_or_continue(*PROBLEM), rloo(update="trajectory_length_test")
    (g0, g1), _ = update_direction(problem, uniform(problem), cfg)
    want0, want1 = reference(*PROBLEM, by_length=True)
    assert want0 == [Fr(1, 160), Fr(-1, 160)] and want1[2:] == [Fr(1, 48), Fr(-1, 48)]
    close(g0[0], want0)
    close(g1[0], want1)
    d = gradient_directions(problem, uniform(problem), cfg, "update")[0]
    assert d.verdict == "unbiased per turn up to a positive scale"
    assert d.turn_scales == pytest.approx([1 / 2, 1 / 3], abs=1e-12)  # against grad J; plain RLOO's are 2/3 and 2/3


def test_a_loss_divided_by_the_trajectory_length_points_downhill_on_a_three_turn_tool_problem():
    """Measured, not by hand: on the toolkit's tool family with 3 turns (a stochastic tool result after turn 0), the
    same loss points a turn downhill where RLOO itself is unbiased."""
    problem = random_family("tool", 6, 3, reward_levels=3, generator=torch.Generator().manual_seed(3))
    cfg = rloo(update="trajectory_length_test")
    d = gradient_directions(problem, uniform(problem), cfg, "update")[0]
    assert d.verdict == "points downhill" and d.turn_cosines[d.downhill_turn] < -0.9
    assert gradient_directions(problem, uniform(problem), cfg)[0].verdict == "unbiased"
    assert biasing_part(problem, uniform(problem), cfg, 0) == "loss"


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("family", ["stop", "tool", "tokens"])
def test_with_every_part_neutral_the_update_is_the_estimators_direction(name, family):
    """A plain policy-gradient loss, every token summed with its row's weight, no M factor, every turn at once: the
    update's first step is the estimator's expected direction times one positive number per instance."""
    problem = random_family(family, 4, 3, reward_levels=3, generator=torch.Generator().manual_seed(7))
    policy = TabularPolicy(problem, init_scale=1.0, generator=torch.Generator().manual_seed(1))
    cfg = PRESETS[name].replace(group_size=3)
    neutral = cfg.replace(**{k: v for part in UPDATE_PARTS.values() for k, v in part.items()})
    estimator, _ = expected_direction(problem, policy, cfg)
    update, _ = update_direction(problem, policy, neutral)
    for i in range(problem.num_instances):
        e, u = torch.cat([t[i] for t in estimator]), torch.cat([t[i] for t in update])
        scale = float(u.norm() / e.norm())
        assert scale > 0
        torch.testing.assert_close(u, scale * e, rtol=0, atol=1e-12 * float(u.norm()))


def test_averaging_each_answer_s_tokens_weighs_it_by_one_over_its_length_by_hand():
    """Answers of 3 binary tokens ending at token 0 under uniform token logits: 000 (p 1/2, 1 token), 100 (1/4, 2),
    110 and 111 (1/8 each, 3); rewards 0, 1, 0, 1, so J = 3/8 and A = -3/8, 5/8, -3/8, 5/8. On the logits
    (position 0; position 1 after token 1; position 2 after 11) grad J = sum_a pi(a) A(a) grad log pi(a) =
    (1/16)(-3, 3, 1, -1, -1, 1); with each answer's tokens averaged every term is divided by |a|:
    (1/384)(-53, 53, 13, -13, -8, 8), whose cosine with grad J is 360 / sqrt(22 * 6084). Token-mean aggregation
    divides by the expected token count only (a constant): the direction stays grad J's."""
    import dataclasses
    import math

    from seeupo.tabular.policies import TabularPolicy
    from seeupo.tabular.problems import sequential_bandit

    rewards = torch.tensor([[[0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0]]], dtype=torch.float64)
    problem = dataclasses.replace(sequential_bandit(torch.ones(1, 1), (8,), rewards, tokens=((2, 3),)), end_token=0)
    used = [0, 1, 4, 5, 12, 13]  # theta0[.], theta1[prefix 1][.], theta2[prefix 11][.] in the flattened tables
    grad_j = torch.tensor([-3.0, 3, 1, -1, -1, 1], dtype=torch.float64) / 16
    averaged = torch.tensor([-53.0, 53, 13, -13, -8, 8], dtype=torch.float64) / 384
    for aggregation, expected in (("seq_mean_token_mean", averaged), ("token_mean", grad_j)):
        (step,), _ = update_direction(problem, TabularPolicy(problem), preset("rloo", advantage="oracle",
                                                                                aggregation=aggregation))
        step = step[0].to(torch.float64)
        assert torch.count_nonzero(step).item() == 6 and torch.count_nonzero(step[used]).item() == 6
        scale = float(step[used] @ expected / (expected @ expected))
        assert scale > 0 and torch.allclose(step[used], scale * expected, atol=1e-12, rtol=0)
    cosine = float(averaged @ grad_j / (averaged.norm() * grad_j.norm()))
    assert cosine == pytest.approx(360 / math.sqrt(22 * 6084), abs=1e-6) and cosine < 0.985
