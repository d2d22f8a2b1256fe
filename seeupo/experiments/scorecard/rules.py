"""The scoring rules of the scorecard's capabilities: pure functions from measured cases to a score in [0, 1].

Each capability (:mod:`seeupo.experiments.scorecard.capabilities`) measures one outcome per case
(a problem, or a problem and a start policy) and hands the list to one of these rules. A rule
never sees the algorithm's name, so an algorithm is scored by what it did and nothing else. No
cases, no score: every rule returns ``None`` for an empty list, never a number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

#: A decrease of ``J`` larger than this (absolute; rewards lie in [0, 1]) counts, as in ``seeupo verify``.
DECREASE_TOL = 1e-7
#: Two update directions are the same when their cosine is at least ``1 - INVARIANCE_TOL``.
INVARIANCE_TOL = 1e-6


@dataclass(frozen=True)
class Score:
    """A capability's score and what it rests on.

    value: in [0, 1], or ``None`` where there is no evidence (``reason`` says why).
    passed, cases: the cases that met the rule and all cases measured (a share rule), or ``None``
      for a rule that averages a graded quantity.
    interval: a 95% interval of ``value`` where it rests on sampled runs (t over the bridge's
      seeds); ``None`` for an exact score over a fixed set of cases (it has no sampling error).
    """

    value: float | None
    cases: int
    passed: int | None = None
    interval: tuple[float, float] | None = None
    reason: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {"value": self.value, "cases": self.cases, "passed": self.passed,
                "interval": list(self.interval) if self.interval is not None else None, "reason": self.reason}


def no_evidence(reason: str) -> Score:
    """The score of a capability that measured nothing, and why."""
    return Score(None, 0, reason=reason)


def share(flags: Sequence[bool], *, what: str = "cases") -> Score:
    """The share of cases that met the rule (exact cases: no interval). No cases: no score."""
    if not flags:
        return no_evidence(f"no {what} measured")
    passed = sum(bool(f) for f in flags)
    return Score(passed / len(flags), len(flags), passed)


def share_without_decrease(largest_decreases: Sequence[float], tol: float = DECREASE_TOL) -> Score:
    """Monotone improvement: the share of runs whose ``J`` never fell by more than ``tol`` in one update.

    ``largest_decreases``: per run, the largest single-update decrease of the exact ``J`` (negative or
    0 where ``J`` only rose; ``nan`` where ``J`` stopped being finite, which counts as a failure).
    """
    return share([math.isfinite(d) and d <= tol for d in largest_decreases], what="runs")


def share_improving(largest_decreases: Sequence[float], moved: Sequence[bool], tol: float = DECREASE_TOL) -> Score:
    """Monotone improvement: the share of runs whose ``J`` never fell by more than ``tol`` in one update and that
    improved where they could (``moved``: ``J`` rose by more than ``tol`` over the run, or the run started at ``J*``).
    An update that never moves ``J`` does not improve it: it fails, where :func:`share_without_decrease` passes it."""
    return share([math.isfinite(d) and d <= tol and m for d, m in zip(largest_decreases, moved)], what="runs")


def mean_of(values: Sequence[float], *, what: str = "cases") -> Score:
    """A graded capability: the mean of per-case values in [0, 1] (exact cases: no interval). No cases: no score."""
    if not values:
        return no_evidence(f"no {what} measured")
    if any(not (-1e-9 <= v <= 1.0 + 1e-9) for v in values):  # rounding of a probability's complement: ~1e-16
        raise ValueError(f"a graded case lies outside [0, 1]: {min(values)} .. {max(values)}")
    return Score(min(1.0, max(0.0, sum(values) / len(values))), len(values))


def worst_turn_cosine(turn_cosines: Sequence[float], turn_scales: Sequence[float]) -> float | None:
    """One case's credit: the smallest cosine over turns between the expected update and ``grad J``, floored at 0.

    A turn where ``grad J`` is zero (scale ``nan``) is left out; a turn whose expected update is zero
    while ``grad J`` is not (scale 0) has cosine 0 (no signal where there is one to follow). A case
    with no turn left (the policy is stationary) gives ``None``: it is no evidence either way.
    """
    judged = []
    for cosine, scale in zip(turn_cosines, turn_scales):
        if scale is None or (isinstance(scale, float) and math.isnan(scale)):
            continue
        judged.append(0.0 if scale == 0 or cosine is None or math.isnan(cosine) else max(0.0, cosine))
    return min(judged) if judged else None


def mean_worst_turn_cosine(cases: Sequence[tuple[Sequence[float], Sequence[float]]]) -> Score:
    """Per-turn credit: the mean over cases of :func:`worst_turn_cosine` (stationary cases left out).

    1 exactly when every turn's expected update is a positive multiple of that turn's ``grad J`` in
    every case (unbiased per turn up to a positive scale); 0 when, in every case, some turn's
    expected update points downhill or carries no signal.
    """
    credits = [c for c in (worst_turn_cosine(cos, scales) for cos, scales in cases) if c is not None]
    if not credits:
        return no_evidence("every case was stationary (grad J = 0)")
    return Score(sum(credits) / len(credits), len(credits))


def share_invariant(cosines: Sequence[float], tol: float = INVARIANCE_TOL) -> Score:
    """Invariance: the share of (problem, transform) pairs whose update direction did not change.

    ``cosines``: per pair, the cosine between the expected update on the original rewards and on the
    transformed ones (``nan``, where either is zero or not finite, fails unless both are zero,
    which the caller passes as 1.0).
    """
    return share([math.isfinite(c) and c >= 1 - tol for c in cosines], what="pairs")


def mean_gain_fraction(initial: Sequence[float], final: Sequence[float], optimum: Sequence[float]) -> Score:
    """Language-model learning: the mean over seeds of the share of the gap to ``J*`` closed, clipped to [0, 1].

    Per seed ``clip((J_final - J_initial) / (J* - J_initial), 0, 1)``; the interval is the t
    interval of the mean over seeds (95%), clipped to [0, 1]. A seed already at ``J*`` is left out.
    """
    gains = [min(1.0, max(0.0, (f - i) / (s - i))) for i, f, s in zip(initial, final, optimum) if s - i > 1e-12]
    if not gains:
        return no_evidence("no seed had a gap to J* to close")
    mean = sum(gains) / len(gains)
    if len(gains) < 2:
        return Score(mean, len(gains))
    sd = math.sqrt(sum((g - mean) ** 2 for g in gains) / (len(gains) - 1))
    half = _t95(len(gains) - 1) * sd / math.sqrt(len(gains))
    return Score(mean, len(gains), interval=(max(0.0, mean - half), min(1.0, mean + half)))


_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def _t95(dof: int) -> float:
    """The two-sided 95% quantile of Student's t with ``dof`` degrees of freedom, or one above it
    (wider: the interval errs on the side of saying less): t at 10 up to 30, t at 30 beyond."""
    if dof in _T95:
        return _T95[dof]
    return 2.228 if dof <= 30 else 2.042
