"""The scoring rules on hand-made measurements: a case that must score 1, one that must score 0, and the edges."""

import math

import pytest

from seeupo.experiments.scorecard import rules


def test_share_without_decrease():
    assert rules.share_without_decrease([0.0, -0.3, 1e-8]).value == 1.0  # rises, and a decrease within the tolerance
    assert rules.share_without_decrease([0.2, 1e-6, math.nan]).value == 0.0  # a NaN J is a failure, not a pass
    score = rules.share_without_decrease([0.0, 0.01, -1.0, 0.5])
    assert (score.value, score.passed, score.cases, score.interval) == (0.5, 2, 4, None)
    assert rules.share_without_decrease([]).value is None  # no runs, no score


def test_share_improving_fails_a_run_that_never_moved():
    assert rules.share_improving([0.0, -0.1], [True, True]).value == 1.0
    assert rules.share_improving([0.0, -0.1], [False, True]).value == 0.5  # never fell, never rose
    assert rules.share_improving([1e-3, math.nan], [True, True]).value == 0.0
    assert rules.share_improving([], []).value is None


def test_mean_of_grades_and_refuses_values_outside_0_1():
    assert rules.mean_of([1.0, 0.5, 0.0]).value == 0.5 and rules.mean_of([1.0, 0.5, 0.0]).passed is None
    assert rules.mean_of([1.0 + 1e-16, 1.0]).value == 1.0  # a probability's complement, rounded
    assert rules.mean_of([]).value is None
    with pytest.raises(ValueError, match="outside"):
        rules.mean_of([1.5])


def test_convergence_reads_the_gap_closed_and_the_first_update_within_one_per_cent():
    from seeupo.experiments.scorecard.sampled import first_converged, gap_closed

    J = [0.2, 0.5, 0.795, 0.8]
    assert first_converged(J, 0.8, 1.0) == 2 and gap_closed(J, 0.8, 1.0) == 1.0
    assert first_converged([0.2, 0.5], 0.8, 1.0) is None and gap_closed([0.2, 0.5], 0.8, 1.0) == pytest.approx(0.5)
    assert gap_closed([0.2, 0.1], 0.8, 1.0) == 0.0 and gap_closed([0.2, math.nan], 0.8, 1.0) == 0.0


def test_worst_turn_cosine():
    assert rules.worst_turn_cosine([1.0, 1.0], [2.0, 0.5]) == 1.0  # unbiased per turn up to a positive scale
    assert rules.worst_turn_cosine([1.0, -0.4], [1.0, 1.0]) == 0.0  # one turn downhill
    assert rules.worst_turn_cosine([0.9, 0.6], [1.0, 1.0]) == 0.6
    assert rules.worst_turn_cosine([math.nan, 0.8], [0.0, 1.0]) == 0.0  # no signal where grad J is not zero
    assert rules.worst_turn_cosine([math.nan, 0.8], [math.nan, 1.0]) == 0.8  # grad J zero at turn 0: left out
    assert rules.worst_turn_cosine([math.nan], [math.nan]) is None  # stationary: no evidence


def test_mean_worst_turn_cosine():
    assert rules.mean_worst_turn_cosine([([1.0, 1.0], [1.0, 3.0])] * 4).value == 1.0
    assert rules.mean_worst_turn_cosine([([-1.0, 1.0], [1.0, 1.0]), ([0.5, -0.1], [1.0, 1.0])]).value == 0.0
    score = rules.mean_worst_turn_cosine([([1.0], [1.0]), ([0.5], [1.0]), ([math.nan], [math.nan])])
    assert score.value == pytest.approx(0.75) and score.cases == 2
    assert rules.mean_worst_turn_cosine([([math.nan], [math.nan])]).value is None


def test_share_invariant():
    assert rules.share_invariant([1.0, 1 - 1e-9, 1.0]).value == 1.0
    assert rules.share_invariant([-1.0, 0.99, math.nan]).value == 0.0
    assert rules.share_invariant([]).value is None


def test_share():
    assert rules.share([True, True]).value == 1.0 and rules.share([False]).value == 0.0
    assert rules.share([]).value is None and "no cases" in rules.share([]).reason


def test_mean_gain_fraction():
    whole = rules.mean_gain_fraction([0.2, 0.3], [1.0, 1.0], [1.0, 1.0])
    assert whole.value == 1.0 and whole.interval == (1.0, 1.0)
    none = rules.mean_gain_fraction([0.4, 0.4, 0.4], [0.4, 0.3, 0.1], [1.0, 1.0, 1.0])  # no gain, or a loss (clipped)
    assert none.value == 0.0
    half = rules.mean_gain_fraction([0.0, 0.0, 0.0], [0.4, 0.5, 0.6], [1.0, 1.0, 1.0])
    assert half.value == pytest.approx(0.5)
    # t interval over 3 seeds: mean 0.5, sd 0.1, t(2) = 4.303
    assert half.interval == pytest.approx((0.5 - 4.303 * 0.1 / math.sqrt(3), 0.5 + 4.303 * 0.1 / math.sqrt(3)))
    assert rules.mean_gain_fraction([1.0], [1.0], [1.0]).value is None  # already at J*: nothing to close
