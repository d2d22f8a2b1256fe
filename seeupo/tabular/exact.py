"""Exact evaluation of tabular policies: ``J``, ``V``, ``Q``, ``A``, reach probabilities, and ``J*``.

All functions are batched over instances and work backwards over the flat history index
of :mod:`seeupo.tabular.problems`::

    Q_t(h, a) = sum_o P(o | h, a) [ r_t(h, a, o) + gamma * (1 - end(h, a, o)) * V_{t+1}(h') ],
    V_t(h)    = sum_a pi_t(a | h) Q_t(h, a),       J = sum_s0 rho(s0) V_0(s0),

with ``h' = (h * A_t + a) * O_t + o``. Backward induction replaces the policy average by a
max and gives ``J*`` and a deterministic optimal policy (ties go to the lowest action).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from seeupo.tabular.problems import DTYPE, TreeMDP

Tensor = torch.Tensor


@dataclass
class Evaluation:
    """Exact quantities of one policy, per instance; lists are indexed by turn."""

    J: Tensor  # [I]
    V: list[Tensor]  # [I, N_t]
    Q: list[Tensor]  # [I, N_t, A_t]
    problem: TreeMDP = field(repr=False)
    probs: list[Tensor] = field(repr=False)

    @cached_property
    def reach(self) -> list[Tensor]:
        """``[I, N_t]`` per turn: probability of reaching ``h_t`` alive (computed on first use)."""
        return reach_probabilities(self.problem, self.probs)

    @property
    def A(self) -> list[Tensor]:
        """``A_t(h, a) = Q_t(h, a) - V_t(h)``."""
        return [q - v[..., None] for q, v in zip(self.Q, self.V)]


def _q_from_next(problem: TreeMDP, t: int, v_next: Tensor | None) -> Tensor:
    """``Q_t`` ``[I, N_t, A_t]`` from ``V_{t+1}`` ``[I, N_{t+1}]`` (``None`` at the last turn)."""
    p, r, end = problem.obs_probs[t], problem.rewards[t], problem.terminal[t]
    outcome = r if v_next is None else r + problem.gamma * v_next.reshape(r.shape).masked_fill(end, 0.0)
    if outcome.shape[-1] == 1:  # one observation: P = 1, no sum needed
        return outcome[..., 0]
    return (p * outcome).sum(-1)


def evaluate(problem: TreeMDP, probs: list[Tensor]) -> Evaluation:
    """Exact ``J``, ``V``, ``Q`` and reach probabilities of the policy ``probs`` (per turn ``[I, N_t, A_t]``)."""
    if len(probs) != problem.num_turns:
        raise ValueError(f"a policy needs one table per turn ({problem.num_turns}), got {len(probs)}")
    probs = [p.to(DTYPE) for p in probs]  # float32 input would silently cost precision
    V: list[Tensor] = [None] * problem.num_turns  # type: ignore[list-item]
    Q: list[Tensor] = [None] * problem.num_turns  # type: ignore[list-item]
    v_next = None
    for t in reversed(range(problem.num_turns)):
        Q[t] = _q_from_next(problem, t, v_next)
        V[t] = (probs[t] * Q[t]).sum(-1)
        v_next = V[t]
    J = (problem.initial_state_probs * V[0]).sum(-1)
    return Evaluation(J, V, Q, problem, probs)


def reach_probabilities(problem: TreeMDP, probs: list[Tensor]) -> list[Tensor]:
    """``d_t(h)``: probability that the episode is alive at history ``h`` of turn ``t``."""
    probs = [p.to(DTYPE) for p in probs]
    d = problem.initial_state_probs
    out = [d]
    for t in range(problem.num_turns - 1):
        p, end = problem.obs_probs[t], problem.terminal[t]
        flow = d[..., None, None] * probs[t][..., None] * p * (~end).to(DTYPE)
        d = flow.reshape(problem.num_instances, -1)
        out.append(d)
    return out


@dataclass
class Optimum:
    """Backward-induction solution: ``J*``, ``V*``, ``Q*`` and a deterministic optimal policy."""

    J: Tensor
    V: list[Tensor]
    Q: list[Tensor]
    policy: list[Tensor]  # one-hot [I, N_t, A_t]


def optimal(problem: TreeMDP) -> Optimum:
    """``J*`` and an optimal policy by backward induction (exact dynamic programming)."""
    V: list[Tensor] = [None] * problem.num_turns  # type: ignore[list-item]
    Q: list[Tensor] = [None] * problem.num_turns  # type: ignore[list-item]
    pol: list[Tensor] = [None] * problem.num_turns  # type: ignore[list-item]
    v_next = None
    for t in reversed(range(problem.num_turns)):
        Q[t] = _q_from_next(problem, t, v_next)
        V[t], best = Q[t].masked_fill(~problem.possible_actions(t), -torch.inf).max(-1)
        pol[t] = torch.nn.functional.one_hot(best, Q[t].shape[-1]).to(DTYPE)
        v_next = V[t]
    J = (problem.initial_state_probs * V[0]).sum(-1)
    return Optimum(J, V, Q, pol)


def mixed_policy(old: list[Tensor], new: list[Tensor], turns_from_new: set[int] | list[int]) -> list[Tensor]:
    """The joint policy that plays ``new`` at ``turns_from_new`` and ``old`` elsewhere.

    HAML's quantities are values of such mixtures: when turn ``t`` is updated after the
    turns ``U`` (``t`` not in ``U``), its objective is the advantage of the old policy under
    ``mixed_policy(old, new, U | {t})``.
    """
    chosen = set(turns_from_new)
    return [n if t in chosen else o for t, (o, n) in enumerate(zip(old, new))]


def kl_divergence(problem: TreeMDP, p: list[Tensor], q: list[Tensor]) -> Tensor:
    """``E_{h ~ d_p} KL(p(.|h) || q(.|h))`` summed over turns, per instance."""
    reach = reach_probabilities(problem, p)
    total = torch.zeros(problem.num_instances, dtype=DTYPE)
    for d, pt, qt in zip(reach, p, q):
        kl = torch.where(pt > 0, pt * (pt.clamp_min(1e-300).log() - qt.clamp_min(1e-300).log()), torch.zeros_like(pt))
        total = total + (d * kl.sum(-1)).sum(-1)
    return total
