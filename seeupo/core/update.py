"""One policy-optimisation iteration: advantages, then a simultaneous or sequential update.

This is the whole training step of every preset, for tabular policies and language
models alike. Read :func:`policy_update` top to bottom: the sequential (HAML) branch is
the SeeUPO loop of PAPER.md §4.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol

import torch

from seeupo.core.advantages import gae_for_batch, grae
from seeupo.core.batch import SampleBatch
from seeupo.core.config import AlgorithmConfig
from seeupo.core.losses import aggregate, kl_penalty, policy_objective, sequence_log_ratio

Tensor = torch.Tensor


class Policy(Protocol):
    """What the update needs from a policy: differentiable per-token log-probabilities."""

    def token_logps(self, batch: SampleBatch) -> Tensor:
        """``[n, L]`` log-probabilities of ``batch``'s tokens under the current parameters."""
        ...

    def parameters(self) -> Iterable[Tensor]: ...


def compute_advantages(
    batch: SampleBatch,
    cfg: AlgorithmConfig,
    *,
    critic_values: Tensor | None = None,
    oracle: Tensor | None = None,
    group_stats: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """The ``[n, L]`` advantage of every token of the batch under ``cfg``.

    Args:
      critic_values: ``[n, L]`` critic values of the state before each token (GAE only).
      oracle: ``[n, L]`` exact advantages (``advantage="oracle"`` only).
      group_stats: per-trajectory ``(group_sum, group_sumsq)`` replacing the batch's own
        group statistics (the exact mode's distribution over group-mates; GRAE only).
    """
    if cfg.advantage == "oracle":
        if oracle is None:
            raise ValueError("advantage='oracle' needs the exact advantages (oracle=...)")
        return oracle * (batch.token_mask & batch.valid[:, None])
    if cfg.advantage == "gae":
        if critic_values is None:
            raise ValueError("advantage='gae' needs critic values (critic_values=...)")
        return gae_for_batch(
            batch, critic_values, gamma=cfg.gae_gamma, lam=cfg.gae_lambda, token_level=cfg.gae_token_level
        )
    return grae(
        batch,
        group_size=cfg.group_size,
        center=cfg.grae_center,
        scale=cfg.grae_scale,
        clamp=cfg.grae_clamp,
        group_stats=group_stats,
    )


def turn_order(cfg: AlgorithmConfig, num_turns: int, generator: torch.Generator | None = None) -> list[int]:
    """The order in which a sequential update visits the turns (0-based absolute indices)."""
    if cfg.order == "reverse":
        return list(reversed(range(num_turns)))
    if cfg.order == "forward":
        return list(range(num_turns))
    if cfg.order == "random":
        return torch.randperm(num_turns, generator=generator).tolist()
    order = list(cfg.custom_order or ())
    if sorted(order) != list(range(num_turns)):
        raise ValueError(f"custom_order {order} is not a permutation of the turns 0..{num_turns - 1}")
    return order


def minibatch_plan(
    batch: SampleBatch, epochs: int, minibatches: int, generator: torch.Generator | None
) -> list[Tensor]:
    """Row masks of the optimizer steps: ``epochs`` shuffled passes of ``minibatches`` parts.

    Minibatches split whole trajectories, never a trajectory's rows, so a trajectory-level
    ratio always sees all of its turns; there are never more minibatches than trajectories
    (no empty steps).
    """
    n_traj = batch.num_trajectories
    present = torch.unique(batch.traj_id)
    plan: list[Tensor] = []
    for _ in range(epochs):
        perm = present[torch.randperm(present.numel(), generator=generator)]
        for part in perm.tensor_split(min(minibatches, present.numel())):
            member = torch.zeros(n_traj, dtype=torch.bool)
            member[part] = True
            plan.append(member[batch.traj_id])
    return plan


@dataclass
class UpdateStats:
    """Diagnostics of one update: optimizer steps taken, mean objective and clip fraction, final ``M``."""

    steps: int = 0
    objective: list[float] = field(default_factory=list)
    clip_frac: list[float] = field(default_factory=list)
    turn_order: list[int] = field(default_factory=list)
    m_final: Tensor | None = None


def _optimizer_step(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    batch: SampleBatch,
    weight: Tensor,
    cfg: AlgorithmConfig,
    logp_ref: Tensor | None,
    stats: UpdateStats,
) -> None:
    logp = policy.token_logps(batch)
    objective, info = policy_objective(
        logp,
        batch,
        weight,
        update=cfg.update,
        ratio_level=cfg.ratio_level,
        ratio_scope=cfg.ratio_scope,
        length_norm=cfg.length_norm,
        clip_eps_low=cfg.clip_eps_low,
        clip_eps_high=cfg.clip_eps_high,
        dual_clip=cfg.dual_clip,
        aggregation=cfg.aggregation,
    )
    loss = -objective
    if cfg.kl_coef > 0.0:
        if logp_ref is None:
            raise ValueError("kl_coef > 0 needs the reference policy's log-probabilities (logp_ref=...)")
        loss = loss + cfg.kl_coef * aggregate(kl_penalty(logp, logp_ref, cfg.kl_estimator), batch, cfg.aggregation)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    stats.steps += 1
    stats.objective.append(float(objective.detach()))
    stats.clip_frac.append(info["clip_frac"])


def _shuffle_within(segment: Tensor, generator: torch.Generator | None) -> Tensor:
    """A permutation of the rows that only exchanges rows of the same segment (instance)."""
    noise = torch.rand(segment.numel(), generator=generator, dtype=torch.float64)
    by_segment = torch.argsort(segment, stable=True)
    shuffled = torch.argsort(segment.to(torch.float64) + noise)
    perm = torch.empty_like(by_segment)
    perm[by_segment] = shuffled
    return perm


def sequential_sweep(
    policy: Policy,
    batch: SampleBatch,
    advantages: Tensor,
    cfg: AlgorithmConfig,
    update_turn: Callable[[Tensor, Tensor], None],
    generator: torch.Generator | None = None,
) -> tuple[list[int], Tensor]:
    """The HAML loop of PAPER.md §4, with the per-turn update left to ``update_turn``.

    For each turn ``t`` in ``cfg``'s order: ``update_turn(rows_t, M_t)`` improves the turn-``t``
    policy on the turn-``t`` rows with weights ``M_t = A * F[traj]``; then, for the same
    trajectories, ``F[traj] *= pi_new(a_t | h_t) / pi_old(a_t | h_t)`` (the full sequence
    ratio against the sampling policy; 1 on placeholders). ``F`` is indexed by ``traj_id``, so
    re-ordering the rows cannot misalign it (the reference code's defect, PAPER.md §5).

    Returns:
      ``(order, F)`` with ``F`` the final per-trajectory factor.
    """
    num_turns = int(batch.turn.max().item()) + 1
    order = turn_order(cfg, num_turns, generator)
    factor = torch.ones(batch.num_trajectories, dtype=advantages.dtype, device=advantages.device)
    for t in order:
        turn_rows = batch.turn == t
        turn_traj = batch.traj_id[turn_rows]
        turn_factor = factor[turn_traj]
        if cfg.m_alignment == "shuffled":  # the reference code's defect, for ablations
            turn_factor = turn_factor[_shuffle_within(batch.instance[turn_rows], generator)]
        update_turn(turn_rows, advantages[turn_rows] * turn_factor[:, None])
        if cfg.m_factor == "none":
            continue
        with torch.no_grad():
            turn_batch = batch.select(turn_rows)
            mask = turn_batch.token_mask & turn_batch.valid[:, None]
            log_ratio = sequence_log_ratio(policy.token_logps(turn_batch), turn_batch.logp_old, mask, length_norm=False)
            ratio = torch.where(turn_batch.valid, log_ratio.exp(), torch.ones_like(log_ratio))
            if cfg.m_factor == "clipped":
                ratio = ratio.clamp(*cfg.m_clip)
            factor[turn_traj] = factor[turn_traj] * ratio
            if cfg.m_factor == "clipped":
                factor = factor.clamp(*cfg.m_clip)
    return order, factor


def policy_update(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    batch: SampleBatch,
    advantages: Tensor,
    cfg: AlgorithmConfig,
    *,
    logp_ref: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> UpdateStats:
    """Update ``policy`` on ``batch`` with per-token ``advantages`` following ``cfg``.

    Simultaneous: ``epochs x minibatches`` optimizer steps on all turns at once (PPO, GRPO,
    GSPO, RLOO). Sequential: :func:`sequential_sweep`, each turn getting ``epochs x
    minibatches`` steps on its own rows (or an equal share of that budget if
    ``cfg.equal_budget``).
    """
    stats = UpdateStats()

    def steps_on(rows: Tensor, weight: Tensor, epochs: int, minibatches: int) -> None:
        sub = batch.select(rows)
        sub_ref = logp_ref[rows] if logp_ref is not None else None
        for part in minibatch_plan(sub, epochs, minibatches, generator):
            ref = sub_ref[part] if sub_ref is not None else None
            _optimizer_step(policy, optimizer, sub.select(part), weight[part], cfg, ref, stats)

    if cfg.schedule == "simultaneous":
        steps_on(torch.ones(batch.num_rows, dtype=torch.bool), advantages, cfg.epochs, cfg.minibatches)
        return stats
    epochs, minibatches = cfg.epochs, cfg.minibatches
    if cfg.equal_budget:
        budget = max(1, (cfg.epochs * cfg.minibatches) // (int(batch.turn.max().item()) + 1))
        minibatches = min(cfg.minibatches, budget)
        epochs = budget // minibatches
    stats.turn_order, stats.m_final = sequential_sweep(
        policy, batch, advantages, cfg, lambda rows, m: steps_on(rows, m, epochs, minibatches), generator
    )
    return stats
