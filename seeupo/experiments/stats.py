"""Rates with confidence intervals and the test that compares two of them.

Experiments that run a handful of seeds per setting report counts ("3 of 20 runs collapsed"); a
count alone invites reading a difference of 3/20 against 0/20 as an effect. Every comparison of
presets on the bridge goes through these few functions, so that each rate carries its interval
and each comparison names its test and its p-value. Pure functions of integer counts.
"""

from __future__ import annotations

import math
from typing import Literal

from scipy import stats as _scipy_stats

IntervalMethod = Literal["wilson", "clopper_pearson"]
INTERVAL_METHODS: tuple[IntervalMethod, ...] = ("wilson", "clopper_pearson")


def _check_counts(k: int, n: int) -> None:
    if not (isinstance(k, int) and isinstance(n, int)) or n < 1 or not 0 <= k <= n:
        raise ValueError(f"need integer counts 0 <= k <= n, n >= 1 (got k={k!r}, n={n!r})")


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion ``k / n``.

    Preferred over the normal (Wald) interval because it stays inside [0, 1] and does not
    collapse to a point at ``k = 0`` or ``k = n``, the usual case for rare collapses over 20 seeds.
    """
    _check_counts(k, n)
    _check_confidence(confidence)
    z = float(_scipy_stats.norm.ppf(0.5 + confidence / 2))
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # exact endpoints at k = 0 and k = n (the formula gives them up to rounding)
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return lo, hi


def clopper_pearson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson ("exact") interval: never below nominal coverage, at the price of width."""
    _check_counts(k, n)
    _check_confidence(confidence)
    alpha = 1 - confidence
    lo = 0.0 if k == 0 else float(_scipy_stats.beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(_scipy_stats.beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def interval(k: int, n: int, method: IntervalMethod = "wilson", confidence: float = 0.95) -> tuple[float, float]:
    """The interval of ``method`` (one of :data:`INTERVAL_METHODS`)."""
    if method == "wilson":
        return wilson_interval(k, n, confidence)
    if method == "clopper_pearson":
        return clopper_pearson_interval(k, n, confidence)
    raise ValueError(f"unknown interval method {method!r}; choose from {', '.join(INTERVAL_METHODS)}")


def rate(k: int, n: int, method: IntervalMethod = "wilson", confidence: float = 0.95) -> dict[str, float | int | str]:
    """``{k, n, rate, lo, hi, method, confidence}``: a count reported with its interval."""
    lo, hi = interval(k, n, method, confidence)
    return {"k": k, "n": n, "rate": k / n, "lo": lo, "hi": hi, "method": method, "confidence": confidence}


def fisher_two_sided(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p-value of Fisher's exact test that ``k1/n1`` and ``k2/n2`` share one rate.

    Exact for the small counts of seed sweeps, where a chi-square approximation is not. The
    two-sided p sums the hypergeometric probabilities of the tables no more likely than the observed one.
    """
    _check_counts(k1, n1)
    _check_counts(k2, n2)
    table = [[k1, n1 - k1], [k2, n2 - k2]]
    return float(_scipy_stats.fisher_exact(table, alternative="two-sided").pvalue)


def format_rate(r: dict[str, float | int | str], digits: int = 2) -> str:
    """``"3/20 (0.15, 95% CI 0.05-0.36)"``."""
    conf = round(100 * float(r["confidence"]))
    return f"{r['k']}/{r['n']} ({float(r['rate']):.{digits}f}, {conf}% CI {float(r['lo']):.{digits}f}-{float(r['hi']):.{digits}f})"
