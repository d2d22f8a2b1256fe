"""Advantage estimators: oracle, GAE with a critic, and GRAE (group relative).

Every estimator returns a per-token advantage ``[n, L]`` aligned with
``SampleBatch.logp_old`` (a sequence-level advantage is broadcast over the tokens
of the row; placeholder rows get 0).

GRAE, for a group of ``G`` trajectories from the same ``s0`` with returns ``R_j``
(docs/method.md §2)::

    mean centring   A_i = R_i - (1/G) sum_j R_j
    leave-one-out   A_i = R_i - 1/(G-1) sum_{j != i} R_j          (RLOO, Kool et al. 2019)
    group std       A_i = (R_i - mean_j R_j) / (std_j R_j + eps)   (GRPO, Shao et al. 2024)
    batch z-score   A <- (A - mean_batch A) / (std_batch A + eps)  (SeeUPO, REINFORCE++)
    clamp           A <- clip(A, -c, c)

The group statistics are passed as sufficient statistics (sum and sum of squares
including the trajectory itself), so the exact mode of the tabular engine can feed
the exact distribution of a trajectory's group-mates through the same formula.
"""

from __future__ import annotations

from typing import get_args

import torch

from seeupo.core.batch import SampleBatch, per_trajectory, segment_sum
from seeupo.core.config import GraeCenter, GraeScale

Tensor = torch.Tensor
Center = GraeCenter


def grae_from_group_stats(
    returns: Tensor,
    group_sum: Tensor,
    group_sumsq: Tensor,
    group_size: int,
    *,
    center: Center = "mean",
    group_std: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """Group-relative advantage of each trajectory from its group's sufficient statistics.

    Args:
      returns: ``R_i``, any shape.
      group_sum: ``sum_j R_j`` over the whole group, the trajectory itself included.
      group_sumsq: ``sum_j R_j^2`` over the whole group, the trajectory itself included.
      group_size: ``G >= 2``.
      center: ``"mean"`` subtracts the group mean, ``"loo"`` the mean of the other
        ``G - 1`` members, ``"none"`` nothing.
      group_std: divide by the unbiased group standard deviation plus ``eps``
        (as GRPO does with ``torch.std``).

    Returns:
      The advantage, same shape as ``returns``.
    """
    if group_size < 2:
        raise ValueError(f"GRAE needs a group size of at least 2, got {group_size}")
    g = float(group_size)
    if center == "mean":
        adv = returns - group_sum / g
    elif center == "loo":
        adv = returns - (group_sum - returns) / (g - 1.0)
    elif center == "none":
        adv = returns.clone()
    else:
        raise ValueError(f"unknown GRAE centring {center!r}; expected one of {get_args(GraeCenter)}")
    if group_std:
        var = (group_sumsq - group_sum**2 / g) / (g - 1.0)
        adv = adv / (var.clamp_min(0.0).sqrt() + eps)
    return adv


def batch_zscore(adv: Tensor, instance: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """``(A - mean) / (std + eps)`` with weighted mean and (population) std per instance.

    ``adv``, ``instance`` and ``weight`` are ``[m]``. With unit weights this is the
    batch-level normalisation of SeeUPO and REINFORCE++; with probability weights it is
    its infinite-batch limit, used by the exact mode.
    """
    n_inst = int(instance.max().item()) + 1
    w_sum = segment_sum(weight, instance, n_inst)
    mean = segment_sum(weight * adv, instance, n_inst) / w_sum
    centred = adv - mean[instance]
    var = segment_sum(weight * centred**2, instance, n_inst) / w_sum
    return centred / (var.sqrt()[instance] + eps)


def grae(
    batch: SampleBatch,
    *,
    group_size: int,
    center: Center = "mean",
    scale: GraeScale = "none",
    clamp: float | None = None,
    eps: float = 1e-6,
    group_stats: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """Trajectory-level GRAE broadcast to every turn and token of the trajectory.

    The group statistics come from the batch itself (sampled mode: the other rollouts of
    the same task) unless ``group_stats = (group_sum, group_sumsq)`` is given per
    trajectory (exact mode: the statistics of one configuration of group-mates).

    Returns:
      ``[n, L]`` advantages; 0 on placeholder rows and padding tokens.
    """
    returns = per_trajectory(batch.traj_return, batch)
    if group_stats is None:
        traj_group = per_trajectory(batch.group_id, batch)
        counts = torch.bincount(traj_group, minlength=batch.num_groups)
        if not bool((counts == group_size).all()):
            raise ValueError(f"every group must hold exactly group_size={group_size} trajectories, got sizes {counts.unique().tolist()}")
        group_sum = segment_sum(returns, traj_group, batch.num_groups)[traj_group]
        group_sumsq = segment_sum(returns**2, traj_group, batch.num_groups)[traj_group]
    else:
        group_sum, group_sumsq = group_stats
    adv = grae_from_group_stats(
        returns, group_sum, group_sumsq, group_size, center=center, group_std=(scale == "group_std"), eps=eps
    )
    if scale == "batch_std":
        traj_instance = per_trajectory(batch.instance, batch)
        traj_weight = per_trajectory(batch.weight, batch)
        adv = batch_zscore(adv, traj_instance, traj_weight, eps)
    elif scale not in ("none", "group_std"):
        raise ValueError(f"unknown GRAE scale {scale!r}; expected one of {get_args(GraeScale)}")
    if clamp is not None:
        adv = adv.clamp(-clamp, clamp)
    return broadcast_to_tokens(adv[batch.traj_id], batch)


def reward_to_go(batch: SampleBatch, gamma: float) -> Tensor:
    """Per row: ``sum_{k >= t} gamma^(k - t) r_k`` over its trajectory's valid rows from its turn on (``[n]``)."""
    num_turns = int(batch.turn.max().item()) + 1
    reward = torch.zeros(batch.num_trajectories, num_turns, dtype=batch.reward.dtype, device=batch.reward.device)
    reward[batch.traj_id, batch.turn] = batch.reward * batch.valid
    to_go = torch.zeros_like(reward)
    running = torch.zeros_like(reward[:, 0])
    for t in reversed(range(num_turns)):
        running = reward[:, t] + gamma * running
        to_go[:, t] = running
    return to_go[batch.traj_id, batch.turn]


def reinforce_pp(batch: SampleBatch, gamma: float, eps: float = 1e-8) -> Tensor:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262; OpenRLHF's ``--advantage_estimator reinforce``).

    Each token's return-to-go, with no baseline, whitened over every valid token of the batch:
    ``(G - mean) / sqrt(var + eps)`` (OpenRLHF's ``var.clamp(min=1e-8).rsqrt()``; population
    variance), per instance, each token weighted by its row's weight (unit weights: the batch; the
    exact mode's probability weights: its infinite-batch limit). A turn's reward comes at its last
    token, so every token of a turn carries the turn's return-to-go; OpenRLHF's KL penalty folded
    into each token's reward is 0 here (no reference policy), and its reward clip to [-10, 10]
    leaves the toolkit's rewards as they are.
    """
    to_go = reward_to_go(batch, gamma)
    real = (batch.token_mask & batch.valid[:, None]).to(to_go.dtype)
    tokens = batch.weight.to(to_go.dtype) * real.sum(1)
    n_inst = batch.num_instances
    total = segment_sum(tokens, batch.instance, n_inst)
    mean = segment_sum(tokens * to_go, batch.instance, n_inst) / total
    centred = to_go - mean[batch.instance]
    var = segment_sum(tokens * centred**2, batch.instance, n_inst) / total
    return (centred / (var[batch.instance] + eps).sqrt())[:, None] * real


def broadcast_to_tokens(row_values: Tensor, batch: SampleBatch) -> Tensor:
    """Repeat a per-row value over the row's real tokens; 0 on padding and placeholders."""
    mask = batch.token_mask & batch.valid[:, None]
    return row_values[:, None] * mask.to(row_values.dtype)


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over padded step sequences.

    ``delta_s = r_s + gamma * V_{s+1} - V_s`` and ``A_s = sum_l (gamma * lam)^l delta_{s+l}``,
    where ``V`` after the last real step of a sequence is 0 (the episode ended).

    Args:
      rewards, values: ``[B, S]`` reward received after step ``s`` and the critic's value
        of the state at step ``s``.
      mask: ``[B, S]`` bool, real steps; the real steps of a sequence are a prefix.

    Returns:
      ``(advantages, value_targets)``, both ``[B, S]``, 0 on padding.
    """
    maskf = mask.to(values.dtype)
    adv = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    running = torch.zeros_like(values[:, 0])
    for s in reversed(range(values.shape[1])):
        delta = rewards[:, s] + gamma * next_value - values[:, s]
        running = (delta + gamma * lam * running) * maskf[:, s]
        adv[:, s] = running
        next_value = values[:, s] * maskf[:, s]
    return adv, (adv + values) * maskf


def gae_for_batch(
    batch: SampleBatch, values: Tensor, *, gamma: float, lam: float, token_level: bool
) -> Tensor:
    """GAE on a batch, with the critic's value of the state before each token, ``values [n, L]``.

    ``token_level=False``: one step per turn, the state is the history ``h_t`` (value
    ``values[:, 0]``), the reward is the turn's reward. ``token_level=True``: one step per
    token, the reward arrives at the last token of the turn (PPO on LLMs). Discounting
    applies per step.

    Returns:
      ``[n, L]`` advantages (a turn-level advantage is broadcast over the turn's tokens).
    """
    n_traj = batch.num_trajectories
    n_turns = int(batch.turn.max().item()) + 1
    L = batch.logp_old.shape[1]
    tok_mask = batch.token_mask & batch.valid[:, None]
    if not token_level:
        steps_r = torch.zeros(n_traj, n_turns, dtype=values.dtype, device=values.device)
        steps_v = torch.zeros_like(steps_r)
        steps_m = torch.zeros(n_traj, n_turns, dtype=torch.bool, device=values.device)
        steps_r[batch.traj_id, batch.turn] = batch.reward.to(values.dtype)
        steps_v[batch.traj_id, batch.turn] = values[:, 0]
        steps_m[batch.traj_id, batch.turn] = batch.valid
        adv, _ = gae(steps_r, steps_v, steps_m, gamma, lam)
        return broadcast_to_tokens(adv[batch.traj_id, batch.turn], batch)
    # token level: the step index of token j of turn t is t * L + j; padding is squeezed
    # out by sorting real steps first within each trajectory.
    steps_r = torch.zeros(n_traj, n_turns * L, dtype=values.dtype, device=values.device)
    steps_v = torch.zeros_like(steps_r)
    steps_m = torch.zeros(n_traj, n_turns * L, dtype=torch.bool, device=values.device)
    col = batch.turn[:, None] * L + torch.arange(L, device=batch.turn.device)[None, :]
    last_tok = tok_mask.cumsum(1) == tok_mask.sum(1, keepdim=True)
    tok_reward = torch.where(last_tok & tok_mask, batch.reward[:, None].to(values.dtype), 0.0)
    rows = batch.traj_id[:, None].expand(-1, L)
    steps_r[rows, col] = tok_reward
    steps_v[rows, col] = values
    steps_m[rows, col] = tok_mask
    order = torch.argsort((~steps_m).to(torch.int8), dim=1, stable=True)
    packed_r, packed_v, packed_m = (x.gather(1, order) for x in (steps_r, steps_v, steps_m))
    packed_adv, _ = gae(packed_r, packed_v, packed_m, gamma, lam)
    adv = torch.zeros_like(packed_adv).scatter_(1, order, packed_adv)
    return adv[rows, col] * tok_mask.to(values.dtype)
