"""Multi-agent advantage decomposition and the importance-ratio identity of the sequential update.

Setting (docs/method.md §1, §4): a sequential bandit with turns ``t = 0..T-1`` as virtual agents,
``pi^t(a_t | s0, a_{<t})``, common reward ``r(s0, a_{0:T-1})`` at the end. For a set ``S`` of
agents with fixed actions ``a^S``, the others draw their actions from their own conditionals
(given the full prefix, fixed or drawn)::

    Q^S(s0, a^S) = sum_{a^{-S}} prod_{t not in S} pi^t(a_t | s0, a_{<t}) r(s0, a),   Q^{{}} = V(s0),  Q^{all} = r.

For an order ``i_1, ..., i_n`` the multi-agent advantage of agent ``i_m`` (Kuba et al. 2022,
HATRPO/HAPPO; Zhong et al. 2024, HARL) is ``A^{i_m}(s0, a^{i_{1:m-1}}, a^{i_m}) =
Q^{i_{1:m}} - Q^{i_{1:m-1}}`` and the sum telescopes::

    A(s0, a) = r(s0, a) - V(s0) = sum_m A^{i_m}(s0, a^{i_{1:m-1}}, a^{i_m})          (decomposition)

(:func:`multi_agent_advantages`). In the execution (forward) order ``Q^{0..t}(a_{0..t}) =
Q_t(h_t, a_t)`` and ``A^t`` is the engine's per-turn advantage ``A_t(h_t, a_t)``.

Importance-ratio identity (the HAPPO weight ``M`` of the sequential update, docs/method.md §4; the
paper's Eq. 4). Because the joint policy factorises over turns,
``pi_old(a) prod_{m<=k} pi_new^{i_m}/pi_old^{i_m} = pi_mix_k(a)`` with ``pi_mix_k`` playing
``pi_new`` at ``i_{1:k}`` and ``pi_old`` elsewhere
(:func:`seeupo.tabular.exact.mixed_policy`), so::

    E_{a ~ pi_old}[ prod_{m<=k} (pi_new^{i_m} / pi_old^{i_m})(a) * A_old(s0, a) ] = E_{a ~ pi_mix_k}[A_old(s0, a)] = J(pi_mix_k) - J(pi_old).

The objective of agent ``i_k`` in the sweep, ``E_old[M_k A_old] - E_old[M_{k-1} A_old]``, is
therefore ``J(pi_mix_k) - J(pi_mix_{k-1})``, and the sweep's gains telescope to
``J(pi_new) - J(pi_old)``. :func:`symbolic_importance_identity` proves the identity in sympy
for symbolic policy tables; :func:`haml_weighted_expectation` computes the left side on the
engine's enumerated paths for checking against :func:`seeupo.tabular.exact.evaluate`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import sympy as sp
import torch

from seeupo.tabular.exact import evaluate, mixed_policy
from seeupo.tabular.problems import TreeMDP

Tensor = torch.Tensor


def _check_bandit(problem: TreeMDP) -> None:
    if any(o != 1 for o in problem.obs_per_turn) or any(bool(x.any()) for x in problem.terminal[:-1]) or any(
        bool(x.any()) for x in problem.rewards[:-1]
    ):
        raise ValueError("this function needs a sequential bandit (one observation per turn, reward at the end only)")


def joint_tables(problem: TreeMDP, probs: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
    """Rewards and policies of a sequential bandit in joint-action layout.

    Returns:
      ``(r, pol)``: ``r`` is ``[I, S0, A_0, ..., A_{T-1}]``; ``pol[t]`` is ``pi^t(a_t | s0, a_{<t})``
      broadcastable to the same shape (``[I, S0, A_0, ..., A_t, 1, ..., 1]``). The flat history
      index ``h_{t+1} = h_t A_t + a_t`` is row-major, so this is a reshape.
    """
    _check_bandit(problem)
    num_inst, s0, acts = problem.num_instances, problem.num_initial_states, problem.actions_per_turn
    r = problem.rewards[-1].reshape(num_inst, s0, *acts)
    pol = []
    for t, p in enumerate(probs):
        shape = (num_inst, s0, *acts[: t + 1]) + (1,) * (len(acts) - t - 1)
        pol.append(p.reshape(shape))
    return r, pol


def coalition_q(problem: TreeMDP, probs: list[Tensor], coalition: Sequence[int]) -> Tensor:
    """``Q^S(s0, a^S)`` broadcast to the joint-action shape ``[I, S0, A_0, ..., A_{T-1}]`` (module docstring)."""
    r, pol = joint_tables(problem, probs)
    members = set(coalition)
    weight = torch.ones_like(r)
    for t, p in enumerate(pol):
        if t not in members:
            weight = weight * p
    others = [2 + t for t in range(problem.num_turns) if t not in members]
    q = (weight * r).sum(dim=others, keepdim=True) if others else weight * r
    return q.expand_as(r)


def joint_advantage(problem: TreeMDP, probs: list[Tensor]) -> Tensor:
    """``A(s0, a) = r(s0, a) - V(s0)`` ``[I, S0, A_0, ..., A_{T-1}]``."""
    r, _ = joint_tables(problem, probs)
    return r - coalition_q(problem, probs, [])


def multi_agent_advantages(problem: TreeMDP, probs: list[Tensor], order: Sequence[int]) -> list[Tensor]:
    """``[A^{i_1}, ..., A^{i_n}]``, each ``[I, S0, A_0, ..., A_{T-1}]``: ``A^{i_m} = Q^{i_{1:m}} - Q^{i_{1:m-1}}``."""
    if sorted(order) != list(range(problem.num_turns)):
        raise ValueError(f"order {list(order)} is not a permutation of the turns")
    out = []
    for m in range(len(order)):
        out.append(coalition_q(problem, probs, order[: m + 1]) - coalition_q(problem, probs, order[:m]))
    return out


def path_probability(problem: TreeMDP, probs: list[Tensor]) -> Tensor:
    """``rho(s0) prod_t pi^t(a_t | s0, a_{<t})`` ``[I, S0, A_0, ..., A_{T-1}]``."""
    r, pol = joint_tables(problem, probs)
    prob = problem.initial_state_probs.reshape(problem.num_instances, -1, *([1] * problem.num_turns)).expand_as(r)
    for p in pol:
        prob = prob * p
    return prob


def haml_weighted_expectation(
    problem: TreeMDP, old: list[Tensor], new: list[Tensor], order: Sequence[int], k: int
) -> Tensor:
    """``E_{s0, a ~ pi_old}[ prod_{m<=k} (pi_new^{i_m}/pi_old^{i_m})(a) * A_old(s0, a) ]`` per instance ``[I]``.

    The left side of the importance-ratio identity, computed on every joint action with
    ``pi_old > 0`` (the ratio is undefined elsewhere; such actions are never sampled).
    """
    _, pol_old = joint_tables(problem, old)
    _, pol_new = joint_tables(problem, new)
    weight = path_probability(problem, old)
    factor = torch.ones_like(weight)
    for t in order[:k]:
        factor = factor * pol_new[t] / pol_old[t]
    adv = joint_advantage(problem, old)
    term = torch.where(weight > 0, weight * factor * adv, torch.zeros_like(adv))
    return term.reshape(problem.num_instances, -1).sum(-1)


def mixed_expectation(problem: TreeMDP, old: list[Tensor], new: list[Tensor], order: Sequence[int], k: int) -> Tensor:
    """``E_{a ~ pi_mix_k}[A_old] = J(pi_mix_k) - J(pi_old)`` per instance, from :func:`seeupo.tabular.exact.evaluate`."""
    mixed = mixed_policy(old, new, set(order[:k]))
    return evaluate(problem, mixed).J - evaluate(problem, old).J


# ---------------------------------------------------------------------------------------------
# symbolic proofs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SymbolicBandit:
    """A sequential bandit with symbolic rewards and policy tables (one initial state).

    ``reward[a]`` for every joint action tuple ``a``; ``old[t][(prefix, a_t)]`` and
    ``new[t][(prefix, a_t)]`` are ``pi^t(a_t | a_{<t} = prefix)``, with the last action of each
    prefix eliminated by normalisation when ``normalised``.
    """

    actions_per_turn: tuple[int, ...]
    reward: dict[tuple[int, ...], sp.Expr]
    old: list[dict[tuple[tuple[int, ...], int], sp.Expr]]
    new: list[dict[tuple[tuple[int, ...], int], sp.Expr]]

    def joint_actions(self) -> list[tuple[int, ...]]:
        return list(itertools.product(*(range(a) for a in self.actions_per_turn)))

    def prob(self, tables: list[dict], a: tuple[int, ...], turns_from_new: frozenset[int] = frozenset()) -> sp.Expr:
        """``prod_t pi^t(a_t | a_{<t})`` from ``tables``, except ``new`` at ``turns_from_new``."""
        out = sp.Integer(1)
        for t in range(len(a)):
            table = self.new[t] if t in turns_from_new else tables[t]
            out *= table[(a[:t], a[t])]
        return out


def symbolic_bandit(actions_per_turn: Sequence[int], *, normalised: bool = True) -> SymbolicBandit:
    """Symbols ``r_<a>``, ``p_<t>_<prefix>_<a>`` (old) and ``q_<t>_<prefix>_<a>`` (new)."""
    acts = tuple(actions_per_turn)
    reward = {a: sp.Symbol("r_" + "".join(map(str, a)), real=True) for a in itertools.product(*(range(n) for n in acts))}

    def tables(letter: str) -> list[dict]:
        out = []
        for t, n in enumerate(acts):
            table = {}
            for prefix in itertools.product(*(range(m) for m in acts[:t])):
                name = f"{letter}{t}_{''.join(map(str, prefix))}_"
                syms = [sp.Symbol(name + str(a), positive=True) for a in range(n)]
                if normalised:
                    syms[-1] = 1 - sum(syms[:-1])
                for a in range(n):
                    table[(prefix, a)] = syms[a]
            out.append(table)
        return out

    return SymbolicBandit(acts, reward, tables("p"), tables("q"))


@dataclass(frozen=True)
class IdentityProof:
    """``lhs = E_old[prod ratio * A_old]``, ``rhs = E_mix[A_old]``, ``value = J(mix) - J(old)``; both differences simplify to 0."""

    order: tuple[int, ...]
    k: int
    lhs: sp.Expr
    rhs: sp.Expr
    value: sp.Expr
    lhs_minus_rhs: sp.Expr
    rhs_minus_value: sp.Expr


def symbolic_importance_identity(actions_per_turn: Sequence[int], order: Sequence[int], k: int) -> IdentityProof:
    """Prove ``E_old[prod_{m<=k} ratio_{i_m} A_old] = E_{mix_k}[A_old] = J(mix_k) - J(old)`` symbolically."""
    bandit = symbolic_bandit(actions_per_turn)
    joint = bandit.joint_actions()
    updated = set(order[:k])
    v_old = sum(bandit.prob(bandit.old, a) * bandit.reward[a] for a in joint)
    lhs = sp.Integer(0)
    rhs = sp.Integer(0)
    j_mix = sp.Integer(0)
    for a in joint:
        adv = bandit.reward[a] - v_old
        ratio = sp.Integer(1)
        for t in order[:k]:
            ratio *= bandit.new[t][(a[:t], a[t])] / bandit.old[t][(a[:t], a[t])]
        lhs += bandit.prob(bandit.old, a) * ratio * adv
        p_mix = bandit.prob(bandit.old, a, frozenset(updated))
        rhs += p_mix * adv
        j_mix += p_mix * bandit.reward[a]
    value = j_mix - v_old
    return IdentityProof(
        tuple(order), k, lhs, rhs, value, sp.simplify(sp.cancel(lhs - rhs)), sp.simplify(sp.expand(rhs - value))
    )


def symbolic_advantage_decomposition(actions_per_turn: Sequence[int], order: Sequence[int]) -> sp.Expr:
    """``sum_a (sum_m A^{i_m}(a) - (r(a) - V))^2`` over the joint actions, simplified; 0 proves the decomposition.

    ``A^{i_m}`` are built from symbolic coalition values ``Q^S`` (module docstring), with
    normalised symbolic policies and symbolic rewards.
    """
    bandit = symbolic_bandit(actions_per_turn)
    joint = bandit.joint_actions()
    n = len(actions_per_turn)

    def q_coalition(members: set[int], a: tuple[int, ...]) -> sp.Expr:
        total = sp.Integer(0)
        for b in joint:
            if any(b[t] != a[t] for t in members):
                continue
            w = sp.Integer(1)
            for t in range(n):
                if t not in members:
                    w *= bandit.old[t][(b[:t], b[t])]
            total += w * bandit.reward[b]
        return total

    v = q_coalition(set(), joint[0])
    total = sp.Integer(0)
    for a in joint:
        parts = sum(q_coalition(set(order[: m + 1]), a) - q_coalition(set(order[:m]), a) for m in range(n))
        total += sp.expand(parts - (bandit.reward[a] - v)) ** 2
    return sp.simplify(total)
