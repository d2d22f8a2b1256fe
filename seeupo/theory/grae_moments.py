"""Conditional moments of the GRAE signal, and when its conditional mean is affine in ``Q``.

Setting (docs/method.md §2). A group of ``G`` trajectories is drawn from the same ``s0``; trajectory
``i`` has return ``R_i`` and its ``G - 1`` group-mates have i.i.d. returns ``R_j`` with mean
``mu`` and variance ``sigma^2`` (the return distribution of the policy from ``s0``). The GRAE
signal of trajectory ``i`` (:func:`seeupo.core.advantages.grae_from_group_stats`) is::

    mean centring   A_i = R_i - (1/G) sum_j R_j
    leave-one-out   A_i = R_i - 1/(G-1) sum_{j != i} R_j
    group std       A_i <- A_i / (std_j R_j + eps),   std unbiased (divide by G - 1)

Closed forms (derived by linearity in :func:`grae_conditional_moments`, and independently by
expanding the polynomial over explicit group-mates in :func:`grae_moments_by_expansion`)::

    mean:  E[A_i | R_i] = (1 - 1/G) (R_i - mu),   Var[A_i | R_i] = (G - 1) sigma^2 / G^2
    loo:   E[A_i | R_i] = R_i - mu,               Var[A_i | R_i] = sigma^2 / (G - 1)

With the group std the signal is not polynomial in the returns; for a finite reward support
:func:`conditional_mean_given_return` gives ``f(R) = E[A_i | R_i = R]`` exactly (a sum over the
multisets of group-mates, sympy ``Rational``/algebraic arithmetic).

Affinity in ``Q``. In a multi-turn instance the signal of the turn-1 sample ``(s, a)`` is the
signal of the whole trajectory, so ``E[signal | s, a] = sum_R P(R | s, a) f_s(R)`` with
``f_s`` as above (group-mates drawn from the policy at ``s``). If ``f_s`` is affine on the
support, ``f_s(R) = c R + b``, then ``E[signal | s, a] = c Q(s, a) + b`` (docs/method.md, "Leads
for the analysis"). Two consequences, both checked here:

* **binary returns**: any function on a two-point support is affine, so every GRAE variant
  (group std included) gives ``c(s) Q(s, a) + b(s)``; :func:`binary_affine_certificate` proves
  ``c > 0`` for every ``p = P(R = 1)`` by a term-wise argument (returns in ``{0, 1}`` suffice:
  centred, std-scaled GRAE is invariant under ``R -> lo + (hi - lo) R``, and centred GRAE
  without the std only scales by ``hi - lo > 0``);
* **non-binary returns with the group std**: ``f_s`` is not affine and the map from ``Q`` to the
  signal's mean can even reverse the order of actions. :func:`non_affine_instance` is such a
  2-turn bandit (see its docstring), and :func:`is_state_affine` decides affinity for any
  instance.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy as sp
import torch

from seeupo.core.advantages import grae
from seeupo.core.config import AlgorithmConfig, GraeCenter
from seeupo.tabular.exact import evaluate
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import DTYPE, TreeMDP, sequential_bandit
from seeupo.tabular.rollout import enumerate_paths, exact_batch

Center = GraeCenter
Number = sp.Expr | int | float
Distribution = Mapping[sp.Expr, sp.Expr]  # value -> probability

R, MU = sp.symbols("R mu", real=True)
SIGMA2 = sp.Symbol("sigma2", positive=True)
P = sp.Symbol("p", nonnegative=True)  # P(R = 1) of a binary return


# ---------------------------------------------------------------------------------------------
# moments of mean-centred and leave-one-out GRAE
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Moments:
    """Conditional mean and variance of a GRAE signal given the trajectory's own return ``R``."""

    mean: sp.Expr
    variance: sp.Expr


def _weights(center: Center, g: sp.Expr) -> tuple[sp.Expr, sp.Expr]:
    """``(w_self, w_mate)`` with ``A_i = R_i - w_self R_i - w_mate sum_{j != i} R_j``."""
    if center == "mean":
        return 1 / g, 1 / g
    if center == "loo":
        return sp.Integer(0), 1 / (g - 1)
    if center == "none":
        return sp.Integer(0), sp.Integer(0)
    raise ValueError(f"unknown GRAE centring {center!r}; expected 'mean', 'loo' or 'none'")


def grae_conditional_moments(
    center: Center,
    group_size: int | sp.Expr = sp.Symbol("G", integer=True, positive=True),
    own_return: sp.Expr = R,
    mu: sp.Expr = MU,
    sigma2: sp.Expr = SIGMA2,
) -> Moments:
    """``E[A_i | R_i]`` and ``Var[A_i | R_i]`` of mean-centred / leave-one-out GRAE (no std scaling).

    Derivation: ``A_i = (1 - w_self) R_i - w_mate S`` with ``S`` the sum of the ``G - 1`` i.i.d.
    group-mates, ``E[S] = (G - 1) mu`` and ``Var[S] = (G - 1) sigma^2``; hence
    ``E = (1 - w_self) R_i - w_mate (G - 1) mu`` and ``Var = w_mate^2 (G - 1) sigma^2``, with
    ``(w_self, w_mate) = (1/G, 1/G)`` (mean) or ``(0, 1/(G-1))`` (leave-one-out). This gives
    the closed forms of the module docstring (Kool et al. 2019 for the leave-one-out baseline).
    """
    g = sp.sympify(group_size)
    w_self, w_mate = _weights(center, g)
    mean = (1 - w_self) * own_return - w_mate * (g - 1) * mu
    var = w_mate**2 * (g - 1) * sigma2
    return Moments(sp.simplify(mean), sp.simplify(var))


def iid_expectation(poly: sp.Expr, variables: Sequence[sp.Symbol], mu: sp.Expr, second_moment: sp.Expr) -> sp.Expr:
    """``E[poly]`` for a polynomial of degree <= 2 in each of the i.i.d. ``variables``.

    Each monomial factorises over the independent variables: ``E[X^0] = 1``, ``E[X] = mu``,
    ``E[X^2] = second_moment``.
    """
    expanded = sp.Poly(sp.expand(poly), *variables)
    total = sp.Integer(0)
    for powers, coeff in expanded.terms():
        term = coeff
        for k in powers:
            if k > 2:
                raise ValueError("iid_expectation handles degree <= 2 per variable")
            term *= (sp.Integer(1), mu, second_moment)[k]
        total += term
    return sp.expand(total)


def grae_moments_by_expansion(center: Center, group_size: int) -> Moments:
    """The moments of :func:`grae_conditional_moments` for a concrete ``G``, by brute expansion.

    Writes the group-mates as explicit symbols ``X_1 .. X_{G-1}``, builds ``A_i`` with the same
    formula as :func:`seeupo.core.advantages.grae_from_group_stats`, and takes expectations
    monomial by monomial (:func:`iid_expectation`): an independent derivation of the closed form.
    """
    if group_size < 2:
        raise ValueError(f"GRAE needs a group size of at least 2, got {group_size}")
    mates = sp.symbols(f"X1:{group_size}", real=True)
    g = sp.Integer(group_size)
    group_sum = R + sum(mates)
    if center == "mean":
        adv = R - group_sum / g
    elif center == "loo":
        adv = R - (group_sum - R) / (g - 1)
    elif center == "none":
        adv = R
    else:
        raise ValueError(f"unknown GRAE centring {center!r}")
    second = SIGMA2 + MU**2
    mean = iid_expectation(adv, mates, MU, second)
    var = sp.expand(iid_expectation(adv**2, mates, MU, second) - mean**2)
    return Moments(sp.simplify(mean), sp.simplify(var))


# ---------------------------------------------------------------------------------------------
# exact conditional mean with a finite support (group std included)
# ---------------------------------------------------------------------------------------------


def exact(x: Number) -> sp.Expr:
    """A sympy number: Python/sympy floats become the rational they print as (``0.3 -> 3/10``); exact values are kept."""
    if isinstance(x, float | sp.Float):
        return sp.nsimplify(x, rational=True)
    return sp.sympify(x)


def grae_signal(
    own: Number,
    mates: Sequence[Number],
    *,
    center: Center = "mean",
    group_std: bool = False,
    eps: Number = 0,
) -> sp.Expr:
    """The GRAE signal of a trajectory with return ``own`` and group-mates ``mates``, exactly.

    The same formula as :func:`seeupo.core.advantages.grae_from_group_stats` (unbiased group
    std, plus ``eps``). With ``eps = 0`` a group of equal returns has signal ``0`` (the ``0/0``
    limit the engine's ``eps`` produces).
    """
    values = [exact(own)] + [exact(m) for m in mates]
    g = sp.Integer(len(values))
    if g < 2:
        raise ValueError("a group needs at least 2 trajectories")
    total = sum(values)
    if center == "mean":
        adv = values[0] - total / g
    elif center == "loo":
        adv = values[0] - (total - values[0]) / (g - 1)
    elif center == "none":
        adv = values[0]
    else:
        raise ValueError(f"unknown GRAE centring {center!r}")
    if group_std:
        mean = total / g
        std = sp.sqrt(sum((v - mean) ** 2 for v in values) / (g - 1))
        denom = std + exact(eps)
        if denom == 0:
            return sp.Integer(0) if sp.simplify(adv) == 0 else sp.zoo
        adv = adv / denom
    return sp.radsimp(adv)


def _multisets(dist: Distribution, k: int):
    """``(mates, probability)`` for every multiset of ``k`` i.i.d. draws from ``dist`` (multinomial weights)."""
    support = list(dist)
    for combo in itertools.combinations_with_replacement(range(len(support)), k):
        counts = defaultdict(int)
        for j in combo:
            counts[j] += 1
        coeff = sp.Integer(math.factorial(k))
        prob = sp.Integer(1)
        for j, c in counts.items():
            coeff /= math.factorial(c)
            prob *= dist[support[j]] ** c
        yield [support[j] for j in combo], coeff * prob


def conditional_mean_given_return(
    own: Number,
    mate_distribution: Distribution,
    group_size: int,
    *,
    center: Center = "mean",
    group_std: bool = False,
    eps: Number = 0,
) -> sp.Expr:
    """``f(R) = E[A_i | R_i = own]`` when the ``G - 1`` group-mates are i.i.d. from ``mate_distribution``.

    An exact sum over the multisets of group-mates weighted by their multinomial probability;
    probabilities may be symbols (e.g. :data:`P`).
    """
    total = sp.Integer(0)
    for mates, prob in _multisets(mate_distribution, group_size - 1):
        total += prob * grae_signal(own, mates, center=center, group_std=group_std, eps=eps)
    return sp.expand(total)


def conditional_moments_given_return(
    own: Number,
    mate_distribution: Distribution,
    group_size: int,
    *,
    center: Center = "mean",
    group_std: bool = False,
    eps: Number = 0,
) -> Moments:
    """Exact ``E`` and ``Var`` of the signal given the own return, finite support (any GRAE variant)."""
    m1 = sp.Integer(0)
    m2 = sp.Integer(0)
    for mates, prob in _multisets(mate_distribution, group_size - 1):
        s = grae_signal(own, mates, center=center, group_std=group_std, eps=eps)
        m1 += prob * s
        m2 += prob * s**2
    return Moments(sp.expand(m1), sp.expand(m2 - m1**2))


def distribution_moments(dist: Distribution) -> tuple[sp.Expr, sp.Expr]:
    """``(mu, sigma^2)`` of a finite distribution."""
    mu = sum(p * v for v, p in dist.items())
    return sp.expand(mu), sp.expand(sum(p * (v - mu) ** 2 for v, p in dist.items()))


# ---------------------------------------------------------------------------------------------
# affinity of the conditional mean in Q
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AffineCheck:
    """Whether ``E[signal | s, a] = c(s) Q(s, a) + b(s)`` over the actions of state ``s``, with ``c(s) > 0``.

    ``q`` and ``signal_mean`` list ``Q(s, a)`` and ``E[signal | s, a]`` per action; ``slope`` and
    ``intercept`` are ``c`` and ``b`` when the points are collinear (``None`` otherwise);
    ``reason`` says which condition failed.
    """

    affine: bool
    slope: sp.Expr | None
    intercept: sp.Expr | None
    q: tuple[sp.Expr, ...]
    signal_mean: tuple[sp.Expr, ...]
    reason: str


def _is_zero(x: sp.Expr) -> bool:
    x = exact(x)
    if x == 0:
        return True
    return sp.simplify(x) == 0


def _is_positive_constant(x: sp.Expr) -> bool:
    """Sign of an explicit constant: sympy's assumptions, else a 50-digit evaluation (sums of radicals)."""
    if x.free_symbols:
        raise ValueError(f"{x} is not a constant")
    positive = sp.simplify(x).is_positive
    if positive is None:
        positive = bool(sp.N(x, 50) > 0)
    return bool(positive)


def affine_check(q: Sequence[sp.Expr], signal_mean: Sequence[sp.Expr]) -> AffineCheck:
    """Decide whether the points ``(q[a], signal_mean[a])`` lie on a line of positive slope.

    Exact (sympy) arithmetic: equality by ``simplify(x - y) == 0``, signs by ``is_positive``
    after simplification (falling back to a 50-digit evaluation for algebraic numbers).
    If all ``q`` are equal the map is affine with any ``c > 0`` iff all means are equal.
    """
    q = tuple(exact(x) for x in q)
    m = tuple(exact(x) for x in signal_mean)
    if len(q) != len(m) or not q:
        raise ValueError("q and signal_mean must be non-empty and of equal length")
    base = next((a for a in range(1, len(q)) if not _is_zero(q[a] - q[0])), None)
    if base is None:
        if all(_is_zero(x - m[0]) for x in m):
            return AffineCheck(True, sp.Integer(1), m[0] - q[0], q, m, "all Q equal and all means equal")
        return AffineCheck(False, None, None, q, m, "equal Q values with different signal means")
    slope = sp.simplify((m[base] - m[0]) / (q[base] - q[0]))
    intercept = sp.simplify(m[0] - slope * q[0])
    off_line = [a for a in range(len(q)) if not _is_zero(m[a] - (slope * q[a] + intercept))]
    if off_line:
        return AffineCheck(False, None, None, q, m, f"actions {off_line} are off the line through actions 0 and {base}")
    if not _is_positive_constant(slope):
        return AffineCheck(False, slope, intercept, q, m, f"collinear but the slope {slope} is not positive")
    return AffineCheck(True, slope, intercept, q, m, "collinear with a positive slope")


def state_affine_check(
    action_return_dists: Sequence[Distribution],
    action_probs: Sequence[Number],
    group_size: int,
    *,
    center: Center = "mean",
    group_std: bool = False,
    eps: Number = 0,
) -> AffineCheck:
    """:func:`affine_check` for one state from its per-action return distributions.

    ``action_return_dists[a]`` is the distribution of the trajectory return given ``(s, a)``
    (later turns following the policy); the group-mates' returns follow the mixture
    ``sum_a pi(a|s) P(R | s, a)``. ``Q(s, a)`` is the mean of ``action_return_dists[a]`` and the
    signal's conditional mean is ``sum_R P(R | s, a) f_s(R)`` (:func:`conditional_mean_given_return`).
    """
    probs = [exact(p) for p in action_probs]
    mates: dict[sp.Expr, sp.Expr] = defaultdict(lambda: sp.Integer(0))
    for p, dist in zip(probs, action_return_dists):
        for v, pv in dist.items():
            mates[exact(v)] += p * exact(pv)
    mates = {v: p for v, p in mates.items() if p != 0}
    f_cache: dict[sp.Expr, sp.Expr] = {}
    q, m = [], []
    for dist in action_return_dists:
        q.append(sum(exact(v) * exact(pv) for v, pv in dist.items()))
        total = sp.Integer(0)
        for v, pv in dist.items():
            v, pv = exact(v), exact(pv)
            if v not in f_cache:
                f_cache[v] = conditional_mean_given_return(
                    v, mates, group_size, center=center, group_std=group_std, eps=eps
                )
            total += pv * f_cache[v]
        m.append(total)
    return affine_check(q, m)


def _rational(x: float, max_denominator: int) -> sp.Rational:
    return sp.Rational(x).limit_denominator(max_denominator)


def first_turn_return_distributions(
    problem: TreeMDP,
    probs: list[torch.Tensor],
    *,
    s0: int = 0,
    instance: int = 0,
    max_denominator: int = 10**6,
) -> tuple[list[dict[sp.Rational, sp.Rational]], list[sp.Rational]]:
    """Per first action ``a``: the exact distribution of the (discounted) return given ``(s0, a)``.

    Computed with :func:`seeupo.tabular.rollout.enumerate_paths` on the policy that plays ``a``
    at turn 0 and ``probs`` afterwards; floats are turned into nearby rationals (denominator at
    most ``max_denominator``), so decimal instances such as ``0.3`` are represented exactly.

    Returns:
      ``(dists, pi0)`` with ``pi0[a] = pi(a | s0)`` as rationals.
    """
    prob = problem.instance(instance)
    pol = [p[instance : instance + 1] for p in probs]
    num_actions = prob.actions_per_turn[0]
    discount = prob.gamma ** torch.arange(prob.num_turns, dtype=DTYPE)
    dists = []
    for a in range(num_actions):
        first = torch.zeros_like(pol[0])
        first[..., a] = 1.0
        paths = enumerate_paths(prob, [first] + pol[1:])
        returns = (paths.reward[0] * discount).sum(-1)
        keep = (paths.s0 == s0) & (paths.prob[0] > 0)
        mass = paths.prob[0, keep].sum()
        dist: dict[sp.Rational, sp.Rational] = defaultdict(lambda: sp.Integer(0))
        for r, p in zip(returns[keep].tolist(), (paths.prob[0, keep] / mass).tolist()):
            dist[_rational(r, max_denominator)] += _rational(p, max_denominator)
        total = sum(dist.values())
        dists.append({v: pv / total for v, pv in dist.items()})
    pi0 = [_rational(x, max_denominator) for x in pol[0][0, s0].tolist()]
    total = sum(pi0)
    return dists, [x / total for x in pi0]


def is_state_affine(
    problem: TreeMDP,
    probs: list[torch.Tensor],
    group_size: int,
    *,
    center: Center = "mean",
    group_std: bool = False,
    eps: Number = 0,
    s0: int = 0,
    instance: int = 0,
) -> AffineCheck:
    """Is ``E[GRAE signal | s0, a_1] = c(s0) Q(s0, a_1) + b(s0)`` with ``c(s0) > 0`` at turn 1?

    Exact decision for one initial state of a (single-turn or multi-turn) tabular instance
    under the policy ``probs``: :func:`first_turn_return_distributions` then
    :func:`state_affine_check`. ``Q`` here is the (discounted) action value of turn 1, the mean
    of the return given ``(s0, a_1)``.
    """
    dists, pi0 = first_turn_return_distributions(problem, probs, s0=s0, instance=instance)
    return state_affine_check(dists, pi0, group_size, center=center, group_std=group_std, eps=eps)


# ---------------------------------------------------------------------------------------------
# binary returns: always affine, with a positive slope
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BinaryCertificate:
    """``f(R) = E[A_i | R_i = R]`` on a binary return ``R in {0, 1}`` with ``P(R_j = 1) = p``.

    ``f(R) = f0 + slope * R`` for ``R in {0, 1}`` (any function on two points is affine), so
    ``E[signal | s, a] = slope * Q(s, a) + f0``. ``slope = sum_k w_k(p) gap_k`` with ``w_k`` the
    binomial probability of ``k`` ones among the ``G - 1`` mates and
    ``gap_k = A(1 | k ones) - A(0 | k ones)``; all ``gap_k > 0`` and ``sum_k w_k = 1`` prove
    ``slope > 0`` for every ``p in [0, 1]``. Each ``gap_k`` is an explicit algebraic constant;
    its sign comes from sympy's assumptions or, for sums of radicals, a 50-digit evaluation.
    """

    f0: sp.Expr
    f1: sp.Expr
    slope: sp.Expr
    gaps: tuple[sp.Expr, ...]
    weights: tuple[sp.Expr, ...]
    slope_positive: bool


def binary_affine_certificate(group_size: int, *, center: Center = "mean", group_std: bool = False) -> BinaryCertificate:
    """Prove that every GRAE variant is affine in ``Q`` with a positive slope for binary returns (see :class:`BinaryCertificate`)."""
    k_mates = group_size - 1
    gaps, weights = [], []
    f0 = f1 = sp.Integer(0)
    for k in range(k_mates + 1):
        mates = [1] * k + [0] * (k_mates - k)
        w = sp.binomial(k_mates, k) * P**k * (1 - P) ** (k_mates - k)
        a1 = grae_signal(1, mates, center=center, group_std=group_std)
        a0 = grae_signal(0, mates, center=center, group_std=group_std)
        f0 += w * a0
        f1 += w * a1
        gaps.append(sp.radsimp(a1 - a0))
        weights.append(w)
    slope = sp.expand(f1 - f0)
    weights_sum_one = sp.simplify(sum(weights) - 1) == 0
    same_slope = sp.simplify(slope - sum(w * g for w, g in zip(weights, gaps))) == 0
    positive = weights_sum_one and same_slope and all(_is_positive_constant(g) for g in gaps)
    return BinaryCertificate(sp.expand(f0), sp.expand(f1), slope, tuple(gaps), tuple(weights), positive)


# ---------------------------------------------------------------------------------------------
# a concrete non-affine instance
# ---------------------------------------------------------------------------------------------


def non_affine_instance() -> tuple[TreeMDP, list[torch.Tensor]]:
    """A 2-turn sequential bandit where group-std GRAE (``G = 2``) reverses the order of ``Q``.

    Rewards ``r[a1][a2] = [[1/4, 1/4], [1, 0]]``; the policy plays ``a1`` uniformly and, after
    ``a1 = 1``, ``a2 = 0`` with probability ``3/10`` (after ``a1 = 0`` uniformly). Then
    ``Q(s0, 0) = 1/4 < Q(s0, 1) = 3/10``, the group-mates' return is ``0`` w.p. ``7/20``,
    ``1/4`` w.p. ``1/2``, ``1`` w.p. ``3/20``, and with ``G = 2`` the group-std signal is
    ``sign(R_i - R_j) / sqrt(2)``, whose conditional means are ``+(1/5)/sqrt(2)`` for ``a1 = 0``
    and ``-(1/5)/sqrt(2)`` for ``a1 = 1``: ``c(s0) = -4 sqrt(2) < 0``. The better action gets the
    lower mean signal, so no ``c(s) Q + b(s)`` with ``c(s) > 0`` exists. Mean-centred GRAE on
    the same instance is affine with ``c = 1/2``.

    Returns:
      ``(problem, probs)``, a single instance and its policy (per turn ``[1, N_t, A_t]``).
    """
    rewards = torch.tensor([[[0.25, 0.25], [1.0, 0.0]]], dtype=DTYPE)
    problem = sequential_bandit(torch.tensor([1.0], dtype=DTYPE), (2, 2), rewards)
    probs = [
        torch.tensor([[[0.5, 0.5]]], dtype=DTYPE),
        torch.tensor([[[0.5, 0.5], [0.3, 0.7]]], dtype=DTYPE),
    ]
    return problem, probs


# ---------------------------------------------------------------------------------------------
# cross-checks against the tabular engine
# ---------------------------------------------------------------------------------------------


def _policy_with(problem: TreeMDP, probs: list[torch.Tensor]) -> TabularPolicy:
    policy = TabularPolicy(problem)
    policy.set_action_probs(probs)
    return policy


def engine_first_turn_signal_means(
    problem: TreeMDP,
    probs: list[torch.Tensor],
    group_size: int,
    *,
    center: Center = "mean",
    group_std: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """``E[signal | s0, a_1]`` ``[I, S0, A_0]`` from the engine's exact batch and GRAE formula.

    :func:`seeupo.tabular.rollout.exact_batch` enumerates every (path, group-mate
    configuration) with its probability; the signal is :func:`seeupo.core.advantages.grae`
    on that batch with those group statistics; the conditional
    mean is the weighted mean of the turn-0 rows at each ``(s0, a_1)`` (``nan`` where unreached).
    """
    cfg = AlgorithmConfig(
        advantage="grae", group_size=group_size, grae_center=center, grae_scale="group_std" if group_std else "none"
    )
    batch, stats = exact_batch(problem, _policy_with(problem, probs), cfg)
    signal = grae(batch, group_size=group_size, center=center, scale=cfg.grae_scale, eps=eps, group_stats=stats)
    rows = batch.turn == 0
    adv = signal[rows, 0]
    w = batch.weight[rows]
    num_s0, num_a = problem.num_initial_states, problem.actions_per_turn[0]
    key = (batch.instance[rows] * num_s0 + batch.data["hist"][rows]) * num_a + batch.data["action"][rows]
    size = problem.num_instances * num_s0 * num_a
    num = torch.zeros(size, dtype=DTYPE).index_add_(0, key, w * adv)
    den = torch.zeros(size, dtype=DTYPE).index_add_(0, key, w)
    return (num / den).reshape(problem.num_instances, num_s0, num_a)


def engine_moments_given_return(
    problem: TreeMDP,
    probs: list[torch.Tensor],
    group_size: int,
    *,
    center: Center = "mean",
    group_std: bool = False,
    eps: float = 1e-6,
) -> dict[float, tuple[float, float]]:
    """``{R: (E[A | R_i = R], Var[A | R_i = R])}`` for instance 0 and ``s0 = 0`` from the engine's exact batch."""
    cfg = AlgorithmConfig(
        advantage="grae", group_size=group_size, grae_center=center, grae_scale="group_std" if group_std else "none"
    )
    batch, stats = exact_batch(problem, _policy_with(problem, probs), cfg)
    signal = grae(batch, group_size=group_size, center=center, scale=cfg.grae_scale, eps=eps, group_stats=stats)
    rows = (batch.turn == 0) & (batch.instance == 0) & (batch.data["hist"] == 0)
    returns = batch.traj_return[rows]
    adv = signal[rows, 0]
    w = batch.weight[rows]
    out: dict[float, tuple[float, float]] = {}
    keys = torch.round(returns * 1e9) / 1e9
    for r in torch.unique(keys).tolist():
        sel = keys == r
        ws = w[sel] / w[sel].sum()
        mean = float((ws * adv[sel]).sum())
        var = float((ws * (adv[sel] - mean) ** 2).sum())
        out[r] = (mean, var)
    return out


def engine_q_first_turn(problem: TreeMDP, probs: list[torch.Tensor]) -> torch.Tensor:
    """``Q_0(s0, a)`` ``[I, S0, A_0]`` from :func:`seeupo.tabular.exact.evaluate` (compare with :attr:`AffineCheck.q`)."""
    return evaluate(problem, probs).Q[0]
