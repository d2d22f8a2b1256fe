"""Exact entropy and pass@k of a tabular policy, and the covariance identity of an entropy change.

Whether an update narrows what a policy can do while it raises ``J`` is a question about exact quantities
(Yue et al. 2025, arXiv:2504.13837; Cui et al. 2025, arXiv:2505.22617):

* :func:`entropy_per_turn`: ``sum_h d_t(h) H(pi_t(. | h))``, the entropy of each turn's choice over the
  histories the policy reaches (an action is a whole answer);
* :func:`pass_at_k`: the probability that at least one of ``k`` independent episodes from the same initial
  state succeeds, ``sum_s0 rho(s0) (1 - (1 - p(s0))^k)``, ``p(s0)`` the probability that an episode's return
  reaches the best return from ``s0`` (``V*(s0)``, within ``tol``): the limit of Yue et al.'s unbiased
  estimator ``1 - C(n - c, k) / C(n, k)`` as ``n`` grows;
* :func:`alternative_mass`: on problems with several optimal answers, the share of the optimal answers'
  probability held by all but the most likely one (0: the policy kept one);
* :func:`entropy_change_prediction`: the first-order change of a softmax's entropy when its logits move by
  ``delta``, ``-Cov_{a ~ pi}(log pi(a), delta(a))``: the covariance identity, which the tests check against
  the exact change.
"""

from __future__ import annotations

import torch

from seeupo.core.losses import entropy_of_log_probs
from seeupo.tabular.exact import optimal, reach_probabilities
from seeupo.tabular.problems import DTYPE, TreeMDP
from seeupo.tabular.rollout import path_returns, enumerate_paths

Tensor = torch.Tensor


def entropy_per_turn(problem: TreeMDP, probs: list[Tensor]) -> Tensor:
    """``[T, I]``: each turn's expected entropy of the policy's choice, ``sum_h d_t(h) H(pi_t(. | h))``."""
    reach = reach_probabilities(problem, probs)
    return torch.stack([(d * entropy_of_log_probs(p.to(DTYPE).log())).sum(-1) for d, p in zip(reach, probs)])


def success_probability(problem: TreeMDP, probs: list[Tensor], tol: float = 1e-9) -> Tensor:
    """``[I, S0]``: the probability that an episode from each initial state returns at least ``V*(s0) - tol``."""
    paths = enumerate_paths(problem, [p.detach() for p in probs])
    returns = path_returns(problem, paths)  # [I, P]
    best = optimal(problem).V[0]  # [I, S0]
    success = returns >= best[:, paths.s0] - tol
    joint = torch.zeros(problem.num_instances, problem.num_initial_states, dtype=DTYPE)
    joint.index_add_(1, paths.s0, torch.where(success, paths.prob, 0.0))  # the paths' probabilities include rho(s0)
    rho = problem.initial_state_probs
    return torch.where(rho > 0, joint / rho.clamp_min(1e-300), 0.0)


def pass_at_k(problem: TreeMDP, probs: list[Tensor], ks: tuple[int, ...] | list[int], tol: float = 1e-9) -> Tensor:
    """``[len(ks), I]``: pass@k for each ``k`` (module docstring)."""
    p = success_probability(problem, probs, tol)
    rho = problem.initial_state_probs
    return torch.stack([(rho * (1 - (1 - p).clamp_min(0) ** k)).sum(-1) for k in ks])


def alternative_mass(problem: TreeMDP, probs: list[Tensor], tol: float = 1e-9) -> Tensor:
    """``[I]``: at turn 0, over the initial states (weighted by ``rho``), the share of the optimal first actions'
    probability held by all but the most likely of them (0 where one optimal action holds it all, or only one is
    optimal)."""
    best = optimal(problem)
    q, v = best.Q[0], best.V[0]  # [I, S0, A0], [I, S0]
    optimal_actions = (q >= v[..., None] - tol) & problem.possible_actions(0)
    mass = torch.where(optimal_actions, probs[0].to(DTYPE), 0.0)
    total = mass.sum(-1)
    share = torch.where(total > 0, 1 - mass.max(-1).values / total.clamp_min(1e-300), 0.0)
    return (problem.initial_state_probs * share).sum(-1)


def entropy_change_prediction(logits: Tensor, delta: Tensor) -> Tensor:
    """``-Cov_{a ~ softmax(logits)}(log pi(a), delta(a))`` over the last axis: the first-order change of the
    entropy of ``softmax(logits)`` when the logits move by ``delta`` (Cui et al. 2025, the entropy dynamics of a
    softmax policy; vanilla policy gradient has ``delta = eta pi(a) A(a)``, natural policy gradient ``eta A(a)``)."""
    log_p = torch.log_softmax(logits, -1)
    p = log_p.exp()
    centred = log_p - (p * log_p).sum(-1, keepdim=True)
    return -(p * centred * (delta - (p * delta).sum(-1, keepdim=True))).sum(-1)
