"""Exact argmax sequential sweeps on a sequential bandit: reverse order is backward induction.

Setting (docs/method.md §3 (D), §4; Theorem 2 of the paper as summarised there): a ``T``-turn
sequential bandit with one initial state, rewards ``r(a_0, ..., a_{T-1})``, and the idealised
HAML update with exact advantages, a positive sampling distribution and argmax mirror steps.
When turn ``t`` is updated after the turns ``U`` (already at ``pi_new``), its HAML objective at
history ``h = a_{<t}`` is ``E_old[M A_old | h, a_t = a] = w(h) (Q_t^{mix}(h, a) - V_old)`` with
``w(h) = prod_{u in U, u < t} pi_new^u / pi_old^u > 0`` and ``Q^mix`` the value of ``a`` at ``h``
when the later turns play ``pi_new`` if in ``U`` and ``pi_old`` otherwise; its argmax is
``argmax_a Q_t^{mix}(h, a)`` (ties to the lowest action, as ``torch.argmax``), at every history.

Claims (proved by induction, checked here):

* **reverse order** (``T-1, ..., 0``): the last turn best-responds at every history (its ``Q``
  is ``r`` itself), then each earlier turn best-responds to optimal continuations: one sweep
  is backward induction and reaches ``J* = max_{a_0} ... max_{a_{T-1}} r`` from *any* initial
  policy (:func:`symbolic_reverse_sweep` for ``T = 2`` with symbolic rewards);
* **forward order**: after sweep ``k`` the last ``k`` turns are optimal at every history (the
  last-updated turn of a sweep best-responds to fixed continuations; argmax is stable), so at
  most ``T`` sweeps are needed, and ``T = 2`` sweeps can be necessary:
  :func:`forward_needs_two_sweeps` gives ``r = [[0.6, 0.6], [1, 0]]`` from the uniform policy,
  where forward order reaches ``J = 0.6`` after one sweep and ``J* = 1`` after two.

The engine's ``run(problem, preset('seeupo', order=...), RunConfig(update='mirror',
mirror_beta=0.0, iterations=k))`` performs the same sweeps from exact-mode rows
(:func:`engine_sweep_values`): it agrees on the 2-turn instance (both orders) and reaches
``J*`` in one reverse iteration on random 3-turn bandits. On 3 turns it also matches forward
order (``r = [[[6, 2], [4, 1]], [[3, 5], [7, 0]]]`` needs exactly 3 sweeps: ``7/2, 5, 6, 7``)
because its argmax step keeps ``ARGMAX_FLOOR = 1e-12`` on every action, a positive sampling
distribution as Theorem 2 assumes (values move by about ``T * 1e-12``); a smaller floor let paths
through several discarded actions underflow to probability 0 and stalled forward sweeps
(``tests/theory/test_backward_induction.py::test_engine_forward_order_matches_idealised_sweeps_on_three_turns``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import sympy as sp
import torch

from seeupo.core.config import preset
from seeupo.tabular.problems import DTYPE, sequential_bandit
from seeupo.tabular.train import RunConfig, run

Joint = tuple[int, ...]
Rewards = dict[Joint, sp.Expr]
Policy = list[dict[Joint, tuple[sp.Expr, ...]]]  # per turn: prefix -> probabilities


def reward_table(nested: Sequence, actions_per_turn: Sequence[int] | None = None) -> tuple[Rewards, tuple[int, ...]]:
    """A nested list ``r[a_0][a_1]...`` as ``{joint action: sympy number}`` and its shape (floats become rationals)."""
    if actions_per_turn is None:
        shape, level = [], nested
        while isinstance(level, Sequence) and not isinstance(level, str | sp.Basic):
            shape.append(len(level))
            level = level[0]
        actions_per_turn = tuple(shape)
    acts = tuple(actions_per_turn)
    out: Rewards = {}
    for a in itertools.product(*(range(n) for n in acts)):
        v = nested
        for x in a:
            v = v[x]
        out[a] = sp.nsimplify(v, rational=True) if isinstance(v, float) else sp.sympify(v)
    return out, acts


def uniform_policy(actions_per_turn: Sequence[int]) -> Policy:
    """The uniform policy as exact rationals."""
    acts = tuple(actions_per_turn)
    return [
        {prefix: tuple(sp.Rational(1, n) for _ in range(n)) for prefix in itertools.product(*(range(m) for m in acts[:t]))}
        for t, n in enumerate(acts)
    ]


def q_value(rewards: Rewards, acts: tuple[int, ...], policy: Policy, prefix: Joint, action: int) -> sp.Expr:
    """``Q_t(prefix, action)`` with the later turns following ``policy`` (``t = len(prefix)``)."""
    t = len(prefix)
    total = sp.Integer(0)
    for rest in itertools.product(*(range(n) for n in acts[t + 1 :])):
        a = prefix + (action,) + rest
        w = sp.Integer(1)
        for u in range(t + 1, len(acts)):
            w *= policy[u][a[:u]][a[u]]
        total += w * rewards[a]
    return total


def value(rewards: Rewards, acts: tuple[int, ...], policy: Policy) -> sp.Expr:
    """``J(pi) = sum_a pi(a) r(a)``."""
    return sum((policy[0][()][a] * q_value(rewards, acts, policy, (), a) for a in range(acts[0])), sp.Integer(0))


def optimal_value(rewards: Rewards, acts: tuple[int, ...]) -> sp.Expr:
    """``J*`` by backward induction, ``max_{a_0} ... max_{a_{T-1}} r(a)`` (sympy ``Max``, so symbols are allowed)."""

    def v(prefix: Joint) -> sp.Expr:
        if len(prefix) == len(acts):
            return rewards[prefix]
        return sp.Max(*(v(prefix + (a,)) for a in range(acts[len(prefix)])))

    return v(())


def _argmax(values: Sequence[sp.Expr]) -> int:
    best = 0
    for a in range(1, len(values)):
        if bool(values[a] > values[best]):
            best = a
    return best


def _sweep(rewards: Rewards, acts: tuple[int, ...], policy: Policy, order: Sequence[int]) -> tuple[Policy, bool]:
    if sorted(order) != list(range(len(acts))):
        raise ValueError(f"order {list(order)} is not a permutation of the turns")
    cur = [dict(table) for table in policy]
    tie = False
    for t in order:
        for prefix in cur[t]:
            q = [q_value(rewards, acts, cur, prefix, a) for a in range(acts[t])]
            best = _argmax(q)
            tie = tie or sum(1 for x in q if sp.simplify(x - q[best]) == 0) > 1
            cur[t][prefix] = tuple(sp.Integer(int(a == best)) for a in range(acts[t]))
    return cur, tie


def argmax_sweep(rewards: Rewards, acts: tuple[int, ...], policy: Policy, order: Sequence[int]) -> Policy:
    """One idealised HAML sweep of exact argmax steps in ``order`` (module docstring); returns the new policy.

    Each turn, when its time comes, becomes deterministic at every history:
    ``argmax_a Q_t(h, a)`` under the current mixture (already-updated turns at their new policy).
    """
    return _sweep(rewards, acts, policy, order)[0]


@dataclass(frozen=True)
class SweepResult:
    """``values[k]`` is ``J`` after ``k`` sweeps (``values[0]`` the initial policy); ``sweeps_to_optimum`` the first ``k`` with ``J = J*``.

    ``ties`` records whether any argmax had several maximisers (then a floating-point
    implementation may break the tie differently).
    """

    order: tuple[int, ...]
    values: tuple[sp.Expr, ...]
    j_star: sp.Expr
    sweeps_to_optimum: int | None
    policy: Policy
    ties: bool


def sweeps(
    rewards: Rewards, acts: tuple[int, ...], order: Sequence[int], num_sweeps: int, policy: Policy | None = None
) -> SweepResult:
    """Apply :func:`argmax_sweep` ``num_sweeps`` times from ``policy`` (uniform by default)."""
    pol = policy if policy is not None else uniform_policy(acts)
    j_star = optimal_value(rewards, acts)
    values = [value(rewards, acts, pol)]
    ties = False
    for _ in range(num_sweeps):
        pol, tie = _sweep(rewards, acts, pol, order)
        ties = ties or tie
        values.append(value(rewards, acts, pol))
    hit = next((k for k, v in enumerate(values) if sp.simplify(v - j_star) == 0), None)
    return SweepResult(tuple(order), tuple(values), j_star, hit, pol, ties)


@dataclass(frozen=True)
class ReverseSweepProof:
    """The reverse sweep on a 2-turn bandit with symbolic rewards ``r_ij`` and initial policy ``p``.

    ``turn2_objective[(a1, a2)] = E_old[A_old | a1, a2] = r(a1, a2) - V_old``: its dependence on
    ``a2`` is through ``r`` only (``offset_independent``), so the argmax is the best response
    whatever the initial policy. ``turn1_objective[a1] = sum_a2 pi_new(a2|a1) (r - V_old) =
    max_a2 r(a1, a2) - V_old`` (``pi_new`` the best response). The value after the sweep,
    ``max_a1 max_a2 r``, minus ``J*`` from :func:`optimal_value` is ``difference`` (0).
    """

    turn2_objective: dict[Joint, sp.Expr]
    offset_independent: bool
    turn1_objective: dict[int, sp.Expr]
    value_after_sweep: sp.Expr
    j_star: sp.Expr
    difference: sp.Expr


def symbolic_reverse_sweep(num_actions: tuple[int, int] = (2, 2)) -> ReverseSweepProof:
    """Reverse order reaches ``J*`` in one sweep on a 2-turn bandit with symbolic rewards (:class:`ReverseSweepProof`)."""
    n1, n2 = num_actions
    r = {(i, j): sp.Symbol(f"r_{i}{j}", real=True) for i in range(n1) for j in range(n2)}
    p1 = [sp.Symbol(f"p_{i}", positive=True) for i in range(n1)]
    p2 = {i: [sp.Symbol(f"p_{i}_{j}", positive=True) for j in range(n2)] for i in range(n1)}
    v_old = sum(p1[i] * p2[i][j] * r[(i, j)] for i in range(n1) for j in range(n2))
    turn2 = {(i, j): r[(i, j)] - v_old for i in range(n1) for j in range(n2)}  # M = A_old, w(h) = 1
    offsets = {sp.simplify(turn2[(i, j)] - r[(i, j)]) for i in range(n1) for j in range(n2)}
    independent = len(offsets) == 1  # the same -V_old for every (a1, a2)
    best_response = {i: sp.Max(*(r[(i, j)] for j in range(n2))) for i in range(n1)}
    turn1 = {i: best_response[i] - v_old for i in range(n1)}
    after = sp.Max(*(turn1[i] + v_old for i in range(n1)))
    j_star = optimal_value(r, (n1, n2))
    return ReverseSweepProof(turn2, independent, turn1, after, j_star, sp.simplify(after - j_star))


FORWARD_TWO_SWEEPS_REWARDS = [[0.6, 0.6], [1.0, 0.0]]


def forward_needs_two_sweeps(num_sweeps: int = 3) -> dict[str, SweepResult]:
    """``{"reverse": ..., "forward": ...}`` sweeps on ``r = [[0.6, 0.6], [1, 0]]`` from the uniform policy.

    Reverse: ``J = 11/20 -> 1`` (one sweep). Forward: turn 0 first sees ``Q(a_0) = (3/5, 1/2)``
    under the uniform turn-1 policy and picks ``a_0 = 0``; turn 1 then best-responds
    (``a_1 = 0`` after both ``a_0``), so ``J = 3/5`` after one sweep; in sweep two turn 0 sees
    ``Q(a_0) = (3/5, 1)`` and switches: ``J = 1`` after two sweeps.
    """
    rewards, acts = reward_table(FORWARD_TWO_SWEEPS_REWARDS)
    return {
        "reverse": sweeps(rewards, acts, [1, 0], num_sweeps),
        "forward": sweeps(rewards, acts, [0, 1], num_sweeps),
    }


def engine_sweep_values(nested_rewards: Sequence, order: str, iterations: int) -> list[float]:
    """``J`` after ``0..iterations`` engine iterations of SeeUPO (exact mode, argmax mirror steps, ``order``).

    ``run(problem, preset('seeupo', order=order), RunConfig(update='mirror', mirror_beta=0.0,
    iterations=iterations))`` from the uniform policy (``init_scale = 0``) on the 1-instance
    sequential bandit with these rewards.
    """
    r = torch.tensor(nested_rewards, dtype=DTYPE)[None, None]
    problem = sequential_bandit(torch.tensor([1.0], dtype=DTYPE), tuple(r.shape[2:]), r[0])
    hist = run(problem, preset("seeupo", order=order), RunConfig(update="mirror", mirror_beta=0.0, iterations=iterations))
    return hist.J[:, 0].tolist()
