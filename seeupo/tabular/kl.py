"""The KL term on the tabular engine: the reference policy, the KL in the reward, and the exact gradient of each
estimator in each placement.

A KL term regularises toward a reference policy ``pi_ref`` (the policy a run starts from, frozen). Its
per-token estimators (``k1``, ``k2``, ``k3`` of Schulman 2020, or a registered one) all estimate
``KL(pi || pi_ref)`` from samples of ``pi``, but the gradient their expectation gives depends on where
they sit (``AlgorithmConfig.kl_placement``; :func:`seeupo.core.losses.kl_term`). On one token, on policy:

* in the loss, ``E[grad k1] = 0``, ``E[grad k2] = grad KL(pi || ref)``, ``E[grad k3] = grad KL(ref || pi)``
  (the forward KL, mode-covering);
* in the loss times the ratio ``pi / pi_old`` (``"loss_is"``), ``k1`` and ``k3`` give ``grad KL(pi || ref)``;
* in the reward (a penalty subtracted before the advantages, ``"reward"``), ``k1`` gives ``grad KL(pi || ref)``.

Over an answer of several tokens, or several turns, a per-token term in the loss differentiates each
token's conditional at the states it was sampled in, and misses how the earlier tokens move the states
the later ones see (Tang and Munos 2025, arXiv:2506.09477): only a penalty in the reward, read by the
score function of the whole trajectory, gives the trajectory's ``grad KL(pi || ref)``.
:func:`kl_gradients` computes each expectation exactly, and the two KL gradients, so that these
statements are measured rather than assumed (tests/tabular/test_kl.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from seeupo.core.config import AlgorithmConfig
from seeupo.core.losses import aggregate, kl_penalty, kl_term
from seeupo.core.batch import SampleBatch
from seeupo.tabular.exact import kl_divergence
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import DTYPE, TreeMDP

Tensor = torch.Tensor


def reference_policy(problem: TreeMDP, policy: TabularPolicy) -> TabularPolicy:
    """A frozen copy of ``policy``'s action distribution (independent parameters without gradients): the
    reference of a KL term, as a language-model run freezes its starting model."""
    reference = TabularPolicy(problem)
    with torch.no_grad():
        reference.set_action_probs(policy.action_probs())
    reference.requires_grad_(False)
    return reference


def start_as_reference(batch: SampleBatch, cfg: AlgorithmConfig) -> Tensor | None:
    """``logp_ref`` of one update whose reference is the policy it starts from (the batch's ``logp_old``): what a
    single update measured alone uses (a replay, one sampled update); ``None`` without a KL term in the loss (in
    the reward, the penalty is 0 at the reference itself)."""
    return batch.logp_old if cfg.kl_coef > 0.0 and cfg.kl_placement != "reward" else None


def turn_penalties(problem: TreeMDP, policy: TabularPolicy, reference: TabularPolicy, estimator: str) -> list[Tensor]:
    """Per turn ``[I, N_t, A_t]``: the sum over the action's tokens of the KL estimates at ``policy`` against
    ``reference`` (what :func:`seeupo.core.losses.kl_reward_penalty` gives a sampled row at ``(h, a)``); 0 where
    ``policy`` cannot play the action (a token of probability 0 has no finite estimate, and is never sampled)."""
    out = []
    with torch.no_grad():
        for t, (lp, lr, p) in enumerate(zip(policy.action_token_log_probs(), reference.action_token_log_probs(),
                                            policy.action_probs())):
            spelled = torch.arange(lp.shape[-1]) < policy.answer_lengths[t][:, None]  # [A, L]
            played = (p > 0)[..., None] & spelled
            estimate = kl_penalty(torch.where(played, lp, 0.0), torch.where(played, lr, 0.0), estimator, played)
            out.append(torch.where(played, estimate, 0.0).sum(-1))
    return out


def kl_reward_problem(problem: TreeMDP, policy: TabularPolicy, reference: TabularPolicy,
                      cfg: AlgorithmConfig) -> TreeMDP:
    """``problem`` with each turn's reward lowered by ``cfg.kl_coef`` times :func:`turn_penalties` (the
    ``"reward"`` placement at ``policy``): the penalty is a function of the history and the action, so every
    estimator, exact or sampled, sees it as a reward. ``J`` is still measured on ``problem`` itself."""
    penalties = turn_penalties(problem, policy, reference, cfg.kl_estimator)
    rewards = [r - cfg.kl_coef * pen[..., None] for r, pen in zip(problem.rewards, penalties)]
    return dataclasses.replace(problem, rewards=rewards)


@dataclass(frozen=True)
class KlGradients:
    """Per turn ``[I, P_t]`` (the turn's logits, flattened per instance): the expected gradient of the KL term
    (``term``, minimised), and the exact gradients of ``KL(pi || ref)`` (``reverse``) and ``KL(ref || pi)``
    (``forward``) of the trajectory distributions."""

    term: list[Tensor]
    reverse: list[Tensor]
    forward: list[Tensor]


def _expected_term(problem: TreeMDP, policy: TabularPolicy, reference: TabularPolicy, cfg: AlgorithmConfig,
                   batch: SampleBatch) -> Tensor:
    """``E[sum over the trajectory's tokens of the term]`` on the exact batch (rows weighted by their path's
    probability), differentiable in ``policy``: the loss term with every trajectory's tokens summed."""
    logp = policy.token_logps(batch)
    if cfg.kl_placement == "reward":  # the score function of the whole trajectory, times its penalty
        penalty = turn_penalties(problem, policy, reference, cfg.kl_estimator)
        row = torch.stack([penalty[t][i, h, a] for t, i, h, a in zip(
            batch.turn.tolist(), batch.instance.tolist(), batch.data["hist"].tolist(), batch.data["action"].tolist())])
        per_traj = torch.zeros(batch.num_trajectories, dtype=DTYPE).index_add_(0, batch.traj_id, row * batch.valid)
        return aggregate(per_traj[batch.traj_id][:, None] * logp, batch, "seq_mean_token_sum", rows="trajectory")
    summed = cfg.replace(aggregation="seq_mean_token_sum", aggregation_rows="trajectory")
    return kl_term(logp, batch, reference.token_logps(batch), summed)


def kl_gradients(problem: TreeMDP, policy: TabularPolicy, reference: TabularPolicy, estimator: str,
                 placement: str) -> KlGradients:
    """The exact expected gradient of ``estimator`` in ``placement`` at ``policy`` (independent parameters; on
    policy: the batch drawn from ``policy``, every path weighted by its probability), beside the exact gradients
    of both KL directions of the trajectory distributions (module docstring)."""
    from seeupo.tabular.gradient import turn_gradients
    from seeupo.tabular.rollout import exact_batch

    cfg = AlgorithmConfig(advantage="oracle", kl_estimator=estimator, kl_placement=placement, kl_coef=1.0)
    batch, _ = exact_batch(problem, policy, cfg)
    term = turn_gradients(_expected_term(problem, policy, reference, cfg, batch), policy)
    probs, ref_probs = policy.action_probs(), [p.detach() for p in reference.action_probs()]
    reverse = turn_gradients(kl_divergence(problem, probs, ref_probs).sum(), policy)
    forward = turn_gradients(kl_divergence(problem, ref_probs, policy.action_probs()).sum(), policy)
    return KlGradients(term, reverse, forward)
