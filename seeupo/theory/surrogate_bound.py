"""The PPO-clip surrogate is a lower bound of the linear objective, and what follows for GRAE.

Lemma (proved by cases in :func:`prove_clip_lower_bound`). For ``rho > 0``, ``0 < eps < 1`` and
any real ``A``::

    L(rho, A) = min(rho A, clip(rho, 1 - eps, 1 + eps) A) <= rho A,   with equality at rho = 1,

and ``dL/drho = A`` at ``rho = 1`` (the bound is tight to first order). Each case fixes the sign
of ``A`` and the position of ``rho`` (below, inside, above ``[1 - eps, 1 + eps]``); in each the
clip value and the active branch of the min are determined and the gap ``rho A - L`` is
shown non-negative by sympy's sign assumptions on a positive parametrisation of the region.

Consequence (:func:`derive_statewise_improvement`). Let the advantage *signal* ``X`` of a sample
``(s, a)`` be random with conditional mean ``E[X | s, a] = c(s) A(s, a) + b(s)``, ``c(s) > 0``
(mean-centred GRAE: ``c = (1 - 1/G)``; docs/method.md "Leads for the analysis"). The per-state
surrogate from ``pi_old`` is ``L_s(pi) = E_{a ~ pi_old, X}[min(rho_a X, clip(rho_a) X)]`` with
``rho_a = pi(a|s) / pi_old(a|s)``. Since ``rho_a`` does not depend on ``X``, the lemma holds
sample by sample, so::

    L_s(pi) <= E_{a ~ pi_old}[rho_a E[X | s, a]] = sum_a pi(a|s) (c A(s, a) + b),   L_s(pi_old) = sum_a pi_old(a|s) (c A + b),

and a maximiser ``pi_new`` of ``L_s`` satisfies ``sum_a (pi_new - pi_old)(a|s) (c A + b) >= L_s(pi_new) - L_s(pi_old) >= 0``.
With ``sum_a pi_old A = 0`` and both policies normalised this is ``c(s) sum_a pi_new(a|s) A(s, a) >= 0``:
every state improves. In an exact, tabular, independently parameterised model maximising the
sum of per-state surrogates maximises each one, and the performance difference lemma
(Kakade & Langford 2002)::

    J(pi_new) - J(pi_old) = sum_t gamma^t sum_h d_t^{pi_new}(h) sum_a pi_new(a|h) A_t^{pi_old}(h, a)   (>= 0)

gives monotonic improvement. :func:`performance_difference` checks the lemma against the
engine; :func:`exact_clip_step` maximises every per-history surrogate exactly (a linear program:
the surrogate is concave piecewise linear in ``pi``) and so lets the consequence be tested,
and its failure shown when the signal is not affine (group std with non-binary rewards:
:func:`group_std_decrease_instance`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import sympy as sp
import torch
from scipy.optimize import linprog

from seeupo.core.config import AlgorithmConfig
from seeupo.core.losses import clipped_surrogate
from seeupo.core.update import compute_advantages
from seeupo.tabular.exact import evaluate, reach_probabilities
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import DTYPE, TreeMDP
from seeupo.tabular.rollout import exact_batch, oracle_advantages

Tensor = torch.Tensor

RHO = sp.Symbol("rho", positive=True)
EPS = sp.Symbol("epsilon", positive=True)
ADV = sp.Symbol("A", real=True)


def clip_expr(rho: sp.Expr = RHO, eps: sp.Expr = EPS) -> sp.Expr:
    """``clip(rho, 1 - eps, 1 + eps) = min(max(rho, 1 - eps), 1 + eps)``."""
    return sp.Min(sp.Max(rho, 1 - eps), 1 + eps)


def surrogate_expr(rho: sp.Expr = RHO, adv: sp.Expr = ADV, eps: sp.Expr = EPS) -> sp.Expr:
    """``min(rho A, clip(rho, 1 - eps, 1 + eps) A)`` as a sympy expression."""
    return sp.Min(rho * adv, clip_expr(rho, eps) * adv)


@dataclass(frozen=True)
class SurrogateCase:
    """One case of the lemma: the sign of ``A``, the region of ``rho``, and what holds there.

    ``substitution`` maps ``rho``, ``A`` and ``eps`` to a parametrisation of the case by
    non-negative/positive symbols; ``clip_value``, ``surrogate`` and ``gap = rho A - surrogate``
    are expressions in those parameters; ``gap_nonnegative`` is sympy's verdict.
    """

    advantage_sign: Literal["positive", "negative", "zero"]
    region: Literal["below", "inside", "above"]
    substitution: dict[sp.Symbol, sp.Expr]
    clip_value: sp.Expr
    active_branch: Literal["unclipped", "clipped"]
    surrogate: sp.Expr
    gap: sp.Expr
    gap_nonnegative: bool


def _sign(expr: sp.Expr) -> int | None:
    """``+1`` if provably ``>= 0``, ``-1`` if provably ``<= 0``, ``None`` if sympy cannot tell."""
    e = sp.factor(sp.simplify(expr))
    if e.is_nonnegative:
        return 1
    if e.is_nonpositive:
        return -1
    return None


def prove_clip_lower_bound() -> tuple[SurrogateCase, ...]:
    """Prove ``min(rho A, clip(rho) A) <= rho A`` for ``rho > 0``, ``0 < eps < 1``, by 9 cases.

    Parametrisation (``w, a > 0`` and ``v, u >= 0`` symbols): ``eps = 1/(1 + w)`` covers
    ``(0, 1)``; ``rho = (1 - eps)/(1 + v)`` covers ``(0, 1 - eps]`` ("below"),
    ``rho = 1 - eps + 2 eps u/(1 + u)`` covers ``[1 - eps, 1 + eps)`` ("inside"),
    ``rho = 1 + eps + v`` covers ``[1 + eps, inf)`` ("above"); ``A = a``, ``-a`` or ``0``. In
    each case the clip value is checked to equal the case's bound (``max``/``min`` resolved by a
    proven sign), the active branch of the ``min`` is chosen by the proven sign of
    ``clip A - rho A``, and the gap is proven ``>= 0``.

    Raises:
      AssertionError: if sympy cannot establish one of the signs (the proof would be incomplete).
    """
    w, a = sp.symbols("w a", positive=True)
    v, u = sp.symbols("v u", nonnegative=True)
    eps = 1 / (1 + w)
    regions = {
        "below": ((1 - eps) / (1 + v), 1 - eps),
        "inside": (1 - eps + 2 * eps * u / (1 + u), None),
        "above": (1 + eps + v, 1 + eps),
    }
    cases = []
    for sign_name, adv in (("positive", a), ("negative", -a), ("zero", sp.Integer(0))):
        for region, (rho, bound) in regions.items():
            # the clip value: below -> 1 - eps, inside -> rho, above -> 1 + eps
            assert sp.factor(sp.simplify(rho)).is_positive, "rho must be positive"
            lo_gap, hi_gap = _sign(rho - (1 - eps)), _sign((1 + eps) - rho)
            if region == "below":
                assert lo_gap == -1, "rho <= 1 - eps"
                clip = 1 - eps
            elif region == "inside":
                assert lo_gap == 1 and hi_gap == 1, "1 - eps <= rho <= 1 + eps"
                clip = rho
            else:
                assert hi_gap == -1, "rho >= 1 + eps"
                clip = 1 + eps
            assert bound is None or sp.simplify(clip - bound) == 0
            unclipped, clipped = rho * adv, clip * adv
            order = _sign(clipped - unclipped)
            assert order is not None, f"cannot order the branches for A {sign_name}, rho {region}"
            branch = "unclipped" if order == 1 else "clipped"
            surrogate = unclipped if order == 1 else clipped
            gap = sp.factor(sp.simplify(unclipped - surrogate))
            nonneg = _sign(gap) == 1
            assert nonneg, f"gap {gap} not provably >= 0 for A {sign_name}, rho {region}"
            cases.append(
                SurrogateCase(sign_name, region, {RHO: rho, ADV: adv, EPS: eps}, sp.simplify(clip), branch,
                              sp.simplify(surrogate), gap, nonneg)
            )
    return tuple(cases)


def tight_at_one() -> tuple[sp.Expr, sp.Expr]:
    """``(L(1, A) - A, dL/drho(1, A) - A)`` with ``L`` the surrogate on ``[1 - eps, 1 + eps]``; both simplify to 0.

    At ``rho = 1`` the clip is inactive for ``eps > 0`` (``1`` is interior), so ``L = rho A`` on a
    neighbourhood: value and slope agree with the linear objective.
    """
    value = surrogate_expr(sp.Integer(1), ADV, EPS)
    inner = sp.Min(RHO * ADV, RHO * ADV)  # the surrogate on the interior, where clip(rho) = rho
    slope = sp.diff(inner, RHO).subs(RHO, 1)
    return sp.simplify(value - ADV), sp.simplify(slope - ADV)


@dataclass(frozen=True)
class ImprovementDerivation:
    """The consequence for ``n`` actions: ``sum_a (pi_new - pi_old)(c A + b) = c sum_a pi_new A``.

    ``difference`` is ``sum_a (pi_new - pi_old)(a) (c A(a) + b) - c sum_a pi_new(a) A(a)`` after
    eliminating ``pi_new(n-1)``, ``pi_old(n-1)`` (normalisation) and ``A(n-1)`` (``sum_a pi_old A = 0``);
    it simplifies to 0, so the sign of the surrogate improvement is the sign of ``sum pi_new A``.
    """

    num_actions: int
    pi_old: tuple[sp.Symbol, ...]
    pi_new: tuple[sp.Symbol, ...]
    advantage: tuple[sp.Expr, ...]
    linear_gain: sp.Expr
    difference: sp.Expr


def derive_statewise_improvement(num_actions: int) -> ImprovementDerivation:
    """Symbolic identity behind "state-wise improvement" (module docstring), for ``num_actions`` actions."""
    n = num_actions
    old = sp.symbols(f"pi_old0:{n}", positive=True)
    new = sp.symbols(f"pi_new0:{n}", nonnegative=True)
    adv = list(sp.symbols(f"A0:{n}", real=True))
    c = sp.Symbol("c", positive=True)
    b = sp.Symbol("b", real=True)
    subs = {old[-1]: 1 - sum(old[:-1]), new[-1]: 1 - sum(new[:-1])}
    adv[-1] = -sum(old[k] * adv[k] for k in range(n - 1)) / old[-1]  # sum_a pi_old A = 0
    gain = sum((new[k] - old[k]) * (c * adv[k] + b) for k in range(n))
    diff = gain - c * sum(new[k] * adv[k] for k in range(n))
    diff = sp.simplify(sp.together(diff.subs(subs)))
    return ImprovementDerivation(n, old, new, tuple(adv), gain, diff)


# ---------------------------------------------------------------------------------------------
# numeric checks with the core's clipped surrogate
# ---------------------------------------------------------------------------------------------


def surrogate_and_linear(
    pi_old: Tensor, pi_new: Tensor, signal: Tensor, signal_probs: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    """Per-state ``(L_s(pi_new), sum_a pi_new(a|s) E[X | s, a])`` with :func:`seeupo.core.losses.clipped_surrogate`.

    Args:
      pi_old, pi_new: ``[S, A]`` policies (``pi_old > 0``).
      signal, signal_probs: ``[S, A, K]`` support and probabilities of the signal ``X`` given ``(s, a)``.
    """
    ratio = (pi_new / pi_old)[..., None].expand_as(signal)
    surr = clipped_surrogate(ratio, signal, eps, eps)
    surrogate = (pi_old * (signal_probs * surr).sum(-1)).sum(-1)
    linear = (pi_new * (signal_probs * signal).sum(-1)).sum(-1)
    return surrogate, linear


def clipped_objective(ratio: np.ndarray, pos_mass: np.ndarray, neg_mass: np.ndarray, eps: float) -> np.ndarray:
    """``P min(rho, 1 + eps) + N max(rho, 1 - eps)``: the surrogate of one ``(h, a)`` as a function of ``rho``.

    ``P = sum w X`` over the samples with ``X > 0`` and ``N = sum w X`` over those with ``X < 0``;
    for ``X > 0``, ``min(rho X, clip(rho) X) = min(rho, 1 + eps) X`` and for ``X < 0`` it is
    ``max(rho, 1 - eps) X``: concave piecewise linear in ``rho``.
    """
    return pos_mass * np.minimum(ratio, 1 + eps) + neg_mass * np.maximum(ratio, 1 - eps)


def maximise_clipped_surrogate(pi_old: np.ndarray, pos_mass: np.ndarray, neg_mass: np.ndarray, eps: float) -> np.ndarray:
    """``argmax_pi sum_a clipped_objective(pi_a / pi_old_a, P_a, N_a)`` over the simplex, by linear programming.

    Variables ``(pi, z, y)`` with ``z_a <= rho_a``, ``z_a <= 1 + eps``, ``y_a >= rho_a``,
    ``y_a >= 1 - eps``; maximise ``sum_a P_a z_a + N_a y_a`` (``P >= 0 >= N``), subject to
    ``sum pi = 1``, ``pi >= 0``. Actions with ``pi_old = 0`` keep probability 0 (no samples).
    """
    n = pi_old.shape[0]
    pos_mass = np.maximum(pos_mass, 0.0)
    neg_mass = np.minimum(neg_mass, 0.0)
    c = np.concatenate([np.zeros(n), -pos_mass, -neg_mass])
    rows, rhs = [], []
    for k in range(n):
        inv = 1.0 / pi_old[k] if pi_old[k] > 0 else 0.0
        r = np.zeros(3 * n); r[n + k] = 1.0; r[k] = -inv; rows.append(r); rhs.append(0.0)  # z <= rho
        r = np.zeros(3 * n); r[2 * n + k] = -1.0; r[k] = inv; rows.append(r); rhs.append(0.0)  # y >= rho
    bounds = [(0.0, None if pi_old[k] > 0 else 0.0) for k in range(n)]
    bounds += [(None, 1.0 + eps)] * n + [(1.0 - eps, None)] * n
    eq = np.concatenate([np.ones(n), np.zeros(2 * n)])[None]
    res = linprog(c, A_ub=np.array(rows), b_ub=np.array(rhs), A_eq=eq, b_eq=[1.0], bounds=bounds, method="highs")
    if not res.success:
        raise RuntimeError(f"linear program failed: {res.message}")
    pi = np.clip(res.x[:n], 0.0, None)
    return pi / pi.sum()


def _signal_masses(problem: TreeMDP, probs: list[Tensor], cfg: AlgorithmConfig) -> list[tuple[Tensor, Tensor]]:
    """Per turn ``(P, N)`` ``[I, N_t, A_t]``: the weighted positive and negative parts of the signal at ``(h, a)``."""
    policy = TabularPolicy(problem)
    policy.set_action_probs(probs)
    batch, stats = exact_batch(problem, policy, cfg)
    if cfg.advantage == "oracle":
        adv = oracle_advantages(problem, policy, batch)
    else:
        adv = compute_advantages(batch, cfg, group_stats=stats)
    x = adv[:, 0]
    w = batch.weight * batch.valid.to(DTYPE)
    out = []
    for t in range(problem.num_turns):
        rows = batch.turn == t
        num_hist, num_act = problem.num_histories(t), problem.actions_per_turn[t]
        key = (batch.instance[rows] * num_hist + batch.data["hist"][rows]) * num_act + batch.data["action"][rows]
        size = problem.num_instances * num_hist * num_act
        xt, wt = x[rows], w[rows]
        pos = torch.zeros(size, dtype=DTYPE).index_add_(0, key, wt * xt.clamp_min(0.0))
        neg = torch.zeros(size, dtype=DTYPE).index_add_(0, key, wt * xt.clamp_max(0.0))
        shape = (problem.num_instances, num_hist, num_act)
        out.append((pos.reshape(shape), neg.reshape(shape)))
    return out


def exact_clip_step(problem: TreeMDP, probs: list[Tensor], cfg: AlgorithmConfig, eps: float = 0.2) -> list[Tensor]:
    """One exact PPO-clip step: every per-history surrogate maximised exactly (independent parameters).

    The signal of every sample is the engine's (``cfg.advantage``: ``"oracle"`` or ``"grae"``
    with ``cfg``'s centring and scaling) on the exact batch of ``probs``; the surrogate at
    history ``h`` is ``sum_a clipped_objective(rho_a, P(h, a), N(h, a))``
    (:func:`clipped_objective`), maximised by :func:`maximise_clipped_surrogate`. Histories
    without samples keep their policy. All turns are updated simultaneously, as PPO does.
    """
    masses = _signal_masses(problem, probs, cfg)
    new = []
    for t, (pos, neg) in enumerate(masses):
        old_t = probs[t].detach().numpy()
        out = old_t.copy()
        pos_np, neg_np = pos.numpy(), neg.numpy()
        for i in range(problem.num_instances):
            for h in range(problem.num_histories(t)):
                if not np.any(pos_np[i, h]) and not np.any(neg_np[i, h]):
                    continue
                out[i, h] = maximise_clipped_surrogate(old_t[i, h], pos_np[i, h], neg_np[i, h], eps)
        new.append(torch.tensor(out, dtype=DTYPE))
    return new


def statewise_gains(problem: TreeMDP, old: list[Tensor], new: list[Tensor]) -> list[Tensor]:
    """Per turn ``[I, N_t]``: ``sum_a pi_new(a|h) A_t^{pi_old}(h, a)``."""
    adv = evaluate(problem, old).A
    return [(n * a).sum(-1) for n, a in zip(new, adv)]


def performance_difference(problem: TreeMDP, old: list[Tensor], new: list[Tensor]) -> Tensor:
    """``sum_t gamma^t sum_h d_t^{new}(h) sum_a pi_new(a|h) A_t^{old}(h, a)`` per instance.

    By the performance difference lemma this equals ``J(new) - J(old)``.
    """
    reach = reach_probabilities(problem, new)
    gains = statewise_gains(problem, old, new)
    return sum(problem.gamma**t * (d * g).sum(-1) for t, (d, g) in enumerate(zip(reach, gains)))


def group_std_decrease_instance() -> tuple[TreeMDP, list[Tensor]]:
    """A single-turn problem where an exact PPO-clip step with group-std GRAE (``G = 2``) lowers ``J``.

    Action 0 pays ``1/4``; action 1 pays ``1`` with probability ``3/10`` and ``0`` otherwise (a
    stochastic observation), so ``Q = (1/4, 3/10)`` and action 1 is optimal. From the uniform
    policy the group-std signal has conditional means ``(+1/5, -1/5)/sqrt(2)``
    (:func:`seeupo.theory.grae_moments.non_affine_instance` has the same numbers), so the
    exact surrogate maximiser moves mass to action 0: the unique maximiser is
    ``pi_new = (0.6, 0.4)`` with ``eps = 0.2`` (the surrogate's slope in ``pi(0)`` is
    ``E[X | 0] - E[X | 1] > 0`` up to the clip edge, negative beyond), and ``J`` drops from
    ``0.275`` to ``0.27``. With binary rewards or mean centring no step
    lowers ``J`` (the signal is affine in ``Q``).
    """
    rewards = torch.tensor([[[[0.25, 0.25], [1.0, 0.0]]]], dtype=DTYPE)
    obs = torch.tensor([[[[0.5, 0.5], [0.3, 0.7]]]], dtype=DTYPE)
    problem = TreeMDP(
        torch.tensor([[1.0]], dtype=DTYPE), (2,), (2,), [obs], [rewards], [torch.ones(1, 1, 2, 2, dtype=torch.bool)]
    )
    return problem, [torch.full((1, 1, 2), 0.5, dtype=DTYPE)]
