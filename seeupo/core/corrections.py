"""Rollout corrections: per-token weights for rows sampled from a behaviour policy ``mu`` other than the policy
``pi_old`` whose log-probabilities the update reads (:attr:`seeupo.core.batch.SampleBatch.logp_behaviour`).

Every correction reads the per-token log-ratio ``log r = log pi_old - log mu`` of the rows' real tokens and
returns a weight ``w >= 0`` per token (0 masks the token), which multiplies the token's advantage (and so its
policy objective: a clipped surrogate is positively homogeneous in the advantage). The weights carry no
gradient. A "sequence" here is the whole trajectory (every turn's tokens), the sequence whose probability ratio
makes an importance weight exact for the trajectory distribution; with one turn it is the response, as in
verl's single-turn rows.

* ``none``: ``w = 1`` (the old log-probabilities recomputed, ``mu`` ignored);
* ``token_is``: ``w = min(r_token, cap)``, truncated importance sampling per token (TIS: Yao et al. 2025, whose
  reference implementation is verl PR #2953, ``tis_imp_ratio_cap``, C = 2 in its example; verl's
  ``rollout_is="token"`` with ``rollout_is_threshold`` 2.0, ``rollout_corr_helper.compute_rollout_correction_weights``
  at verl b178a3cd; TRL's ``vllm_importance_sampling_mode="token_truncate"``);
* ``sequence_is``: ``w = min(prod r over the trajectory, cap)`` (verl's ``rollout_is="sequence"``: the product over
  the response; TRL's ``sequence_truncate``); unbiased for the trajectory distribution when the cap never binds;
* ``geometric_is``: ``w = min(exp(mean log r over the trajectory), cap)`` (AReaL's rejection sampling with
  ``level="sequence"``, ``agg="mean"``, ``action="clamp"``; verl's former ``rollout_is_level="geometric"``);
* ``token_mask``: ``w = 1`` where ``floor <= r_token <= cap``, else 0 (verl's former ``rollout_rs="token"`` with the
  lower bound ``1 / upper`` by default; TRL's ``token_mask``);
* ``sequence_mask``: ``w = 1`` for trajectories whose ratio lies in ``[floor, cap]``, else 0 (verl's ``seq_sum_k1``
  rejection, ``"0.5_2.0"`` in its ``decoupled_seq_is_rs`` preset; TRL's ``sequence_mask``, its default mode);
* ``decoupled``: ``w = r_token`` where ``r_token <= cap``, else 0: decoupled PPO's behaviour weight ``pi_prox / mu``
  with ``pi_old`` the proximal policy, tokens above ``behav_imp_weight_cap`` masked, not truncated (AReaL,
  arXiv:2505.24298, ``realhf/impl/model/utils/ppo_functional.actor_loss_fn`` at c0200f10d);
* ``m2po``: ``w = 1`` except on the tokens of largest ``(log r)^2``, masked until the mean of ``(log r)^2`` over the
  kept tokens is at most ``m2_tau`` (0.04 in every experiment of M2PO, arXiv:2510.01161). This is AReaL's port
  (``areal/trainer/ppo/actor._get_m2po_loss_mask``: ``(log mu / pi_prox)^2`` over every valid token, the clip kept);
  the paper's Algorithm 1 takes ``r = pi_theta / mu`` over its "trust-region tokens" and drops the clip, and the
  authors' code (Infini-AI-Lab/M2PO, ``compute_m2po_policy_loss``) solves for one clip bound over the harmful tokens
  instead of masking: neither is this one.

Where they enter the loss: every weight multiplies its token's advantage, so masked tokens stay in the
aggregation's denominators, as in TRL and AReaL; verl's rejection removes them from ``response_mask`` (and so
from ``token-mean``'s count) instead, a constant factor per batch in expectation.
"""

from __future__ import annotations

import math

import torch

from seeupo.core.batch import SampleBatch, segment_sum

Tensor = torch.Tensor


def log_ratio(batch: SampleBatch) -> Tensor:
    """``[n, L]``: ``log pi_old - log mu`` on the real tokens of valid rows, 0 elsewhere (0 everywhere on policy)."""
    real = batch.token_mask & batch.valid[:, None]
    if batch.logp_behaviour is None:
        return torch.zeros_like(batch.logp_old)
    return torch.where(real, batch.logp_old - batch.logp_behaviour, 0.0)


def trajectory_log_ratio(batch: SampleBatch, mean: bool = False) -> Tensor:
    """``[n]``: each row's trajectory's summed (or, with ``mean``, token-averaged) log-ratio."""
    real = batch.token_mask & batch.valid[:, None]
    total = segment_sum(log_ratio(batch).sum(1), batch.traj_id, batch.num_trajectories)
    if mean:
        count = segment_sum(real.sum(1).to(total.dtype), batch.traj_id, batch.num_trajectories)
        total = total / count.clamp_min(1)
    return total[batch.traj_id]


def _tokens(batch: SampleBatch, per_row: Tensor) -> Tensor:
    """A per-row weight on each of the row's tokens."""
    return per_row[:, None].expand_as(batch.logp_old).clone()


def token_is(batch: SampleBatch, cap: float) -> Tensor:
    return torch.exp(log_ratio(batch).clamp(max=math.log(cap)))


def sequence_is(batch: SampleBatch, cap: float) -> Tensor:
    return _tokens(batch, torch.exp(trajectory_log_ratio(batch).clamp(max=math.log(cap))))


def geometric_is(batch: SampleBatch, cap: float) -> Tensor:
    log_w = trajectory_log_ratio(batch, mean=True).clamp(max=math.log(cap))
    return _tokens(batch, torch.exp(log_w))


def _inside(log_value: Tensor, floor: float, cap: float) -> Tensor:
    return ((log_value >= math.log(floor)) & (log_value <= math.log(cap)))


def token_mask(batch: SampleBatch, floor: float, cap: float) -> Tensor:
    return _inside(log_ratio(batch), floor, cap).to(batch.logp_old.dtype)


def sequence_mask(batch: SampleBatch, floor: float, cap: float) -> Tensor:
    return _tokens(batch, _inside(trajectory_log_ratio(batch), floor, cap).to(batch.logp_old.dtype))


def decoupled(batch: SampleBatch, cap: float) -> Tensor:
    lr, log_cap = log_ratio(batch), math.log(cap)
    return torch.where(lr <= log_cap, torch.exp(lr.clamp(max=log_cap)), 0.0)


def m2po(batch: SampleBatch, tau: float) -> Tensor:
    """Mask the tokens of largest ``(log r)^2`` until the kept tokens' mean ``(log r)^2`` is at most ``tau``: keep
    every token whose ``(log r)^2`` is at most the largest value ``v`` such that the mean over the tokens with values
    ``<= v`` is ``<= tau`` (tied tokens are kept or masked together). The mean weighs each token by its row's
    weight: 1 in a sampled batch, the path's probability in the exact mode's expected batch."""
    real = batch.token_mask & batch.valid[:, None]
    second = log_ratio(batch) ** 2
    weight = (batch.weight * batch.valid)[:, None].expand_as(second)[real].to(second.dtype)
    values = second[real]
    if values.numel() == 0:
        return torch.ones_like(second)
    order = torch.argsort(values)
    v, w = values[order], weight[order]
    total_w, total_v = torch.cumsum(w, 0), torch.cumsum(w * v, 0)
    mean = total_v / total_w.clamp_min(torch.finfo(v.dtype).tiny)
    last_of_tie = torch.ones_like(v, dtype=torch.bool)
    last_of_tie[:-1] = v[1:] != v[:-1]
    fits = last_of_tie & (mean <= tau) & (total_w > 0)
    limit = v[fits].max() if bool(fits.any()) else torch.tensor(-torch.inf, dtype=v.dtype)
    return torch.where(real & (second > limit), 0.0, 1.0).to(batch.logp_old.dtype)
