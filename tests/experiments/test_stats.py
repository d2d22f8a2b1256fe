"""Intervals and Fisher's test against hand computations and closed forms."""

from __future__ import annotations

import math

import pytest

from seeupo.experiments.stats import (
    clopper_pearson_interval,
    fisher_two_sided,
    format_rate,
    interval,
    rate,
    wilson_interval,
)

Z95 = 1.959963984540054


def _wilson_by_hand(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def test_wilson_zero_of_twenty_is_z2_over_n_plus_z2():
    lo, hi = wilson_interval(0, 20)
    assert lo == 0.0
    assert math.isclose(hi, Z95**2 / (20 + Z95**2), rel_tol=1e-12)  # 3.8415 / 23.8415
    assert math.isclose(hi, 0.161125, abs_tol=1e-6)


@pytest.mark.parametrize("k,n", [(3, 20), (11, 20), (18, 80), (1, 1), (7, 9)])
def test_wilson_matches_the_formula(k, n):
    lo, hi = wilson_interval(k, n)
    want_lo, want_hi = _wilson_by_hand(k, n)
    assert math.isclose(lo, max(0.0, want_lo), abs_tol=1e-12) or k == 0
    assert math.isclose(hi, min(1.0, want_hi), abs_tol=1e-12) or k == n
    assert lo <= k / n <= hi


def test_wilson_3_of_20_known_value():
    lo, hi = wilson_interval(3, 20)
    assert math.isclose(lo, 0.05236, abs_tol=5e-5) and math.isclose(hi, 0.36042, abs_tol=5e-5)


def test_clopper_pearson_closed_forms_at_the_edges():
    # k = 0: upper end solves (1 - p)^n = alpha/2; k = n: lower end solves p^n = alpha/2
    lo, hi = clopper_pearson_interval(0, 20)
    assert lo == 0.0 and math.isclose(hi, 1 - 0.025 ** (1 / 20), rel_tol=1e-10)  # 0.16843
    lo, hi = clopper_pearson_interval(20, 20)
    assert hi == 1.0 and math.isclose(lo, 0.025 ** (1 / 20), rel_tol=1e-10)
    lo, hi = clopper_pearson_interval(1, 1)
    assert math.isclose(lo, 0.025, rel_tol=1e-10) and hi == 1.0


def test_clopper_pearson_endpoints_are_binomial_tail_quantiles():
    from scipy.stats import binom

    k, n = 3, 20
    lo, hi = clopper_pearson_interval(k, n)
    assert math.isclose(binom.sf(k - 1, n, lo), 0.025, rel_tol=1e-8)  # P(X >= k | lo)
    assert math.isclose(binom.cdf(k, n, hi), 0.025, rel_tol=1e-8)  # P(X <= k | hi)
    w_lo, w_hi = wilson_interval(k, n)
    assert lo < w_lo and hi > w_hi  # the exact interval is the wider one here


def test_fisher_by_hand_enumeration():
    # 3/20 vs 0/20: margins 3 events of 40; P(X = x events in the first row) = C(20,x) C(20,3-x) / C(40,3).
    total = math.comb(40, 3)
    probs = [math.comb(20, x) * math.comb(20, 3 - x) / total for x in range(4)]
    by_hand = sum(p for p in probs if p <= probs[3] * (1 + 1e-7))
    assert math.isclose(by_hand, 2 * 1140 / 9880)
    assert math.isclose(fisher_two_sided(3, 20, 0, 20), by_hand, rel_tol=1e-9)  # 0.2308
    assert math.isclose(fisher_two_sided(0, 20, 3, 20), by_hand, rel_tol=1e-9)  # symmetric


def test_fisher_known_values_of_the_issue():
    assert round(fisher_two_sided(3, 20, 1, 20), 2) == 0.60  # 0.605
    assert round(fisher_two_sided(18, 80, 6, 80), 3) == 0.014
    assert fisher_two_sided(0, 20, 0, 20) == 1.0
    assert fisher_two_sided(20, 20, 0, 20) < 1e-10


def test_rate_and_format():
    r = rate(3, 20)
    assert (r["k"], r["n"], r["method"]) == (3, 20, "wilson") and math.isclose(r["rate"], 0.15)
    assert format_rate(r) == "3/20 (0.15, 95% CI 0.05-0.36)"
    assert interval(3, 20, "clopper_pearson") == clopper_pearson_interval(3, 20)


@pytest.mark.parametrize("args", [(-1, 20), (21, 20), (0, 0), (1.0, 2)])
def test_bad_counts_are_refused(args):
    with pytest.raises(ValueError):
        wilson_interval(*args)
    with pytest.raises(ValueError):
        clopper_pearson_interval(*args)


def test_bad_method_and_confidence_are_refused():
    with pytest.raises(ValueError, match="unknown interval method"):
        interval(1, 2, "wald")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="confidence"):
        wilson_interval(1, 2, confidence=1.0)
