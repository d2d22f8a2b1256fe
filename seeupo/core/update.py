"""One policy-optimisation iteration: advantages, then a simultaneous or sequential update.

This is the whole training step of every preset, for tabular policies and language
models alike. Read :func:`policy_update` top to bottom: the sequential (HAML) branch is
the SeeUPO loop of PAPER.md §4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.config import AlgorithmConfig
from seeupo.core.losses import aggregate, kl_penalty, policy_objective, row_coefficients, sequence_log_ratio
from seeupo.core.parallel import DataParallel, owned, score_rows
from seeupo.core.registry import adv_estimator, policy_loss

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
    """The ``[n, L]`` advantage of every token of the batch under ``cfg``: the registered estimator ``cfg.advantage``.

    Args:
      critic_values: ``[n, L]`` critic values of the state before each token (estimators that
        declare ``needs_critic``, like GAE).
      oracle: ``[n, L]`` exact advantages (estimators that declare ``needs_oracle``).
      group_stats: per-trajectory ``(group_sum, group_sumsq)`` replacing the batch's own
        group statistics (the exact mode's distribution over group-mates; group estimators).
    """
    estimator = adv_estimator(cfg.advantage)
    if estimator.needs_oracle and oracle is None:
        raise ValueError(f"advantage={cfg.advantage!r} needs the exact advantages (oracle=...)")
    if estimator.needs_critic and critic_values is None:
        raise ValueError(f"advantage={cfg.advantage!r} needs critic values (critic_values=...)")
    return estimator.fn(batch, cfg, critic_values=critic_values, oracle=oracle, group_stats=group_stats)


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


def num_turns(batch: SampleBatch) -> int:
    """The number of turns of the batch (turn indices are 0-based and absolute)."""
    return int(batch.turn.max().item()) + 1


def minibatch_plan(
    batch: SampleBatch, epochs: int, minibatches: int, generator: torch.Generator | None
) -> list[Tensor]:
    """Row masks of the optimizer steps: ``epochs`` shuffled passes of ``minibatches`` parts.

    Minibatches split whole trajectories, never a trajectory's rows, so a trajectory-level
    ratio always sees all of its turns; there are never more minibatches than trajectories
    (no empty steps). Permutations are drawn on the CPU from ``generator``, so a run draws the
    same minibatches on any device.
    """
    present = torch.unique(batch.traj_id).cpu()
    plan: list[Tensor] = []
    for _ in range(epochs):
        perm = present[torch.randperm(present.numel(), generator=generator)]
        for part in perm.tensor_split(min(minibatches, present.numel())):
            member = torch.zeros(batch.num_trajectories, dtype=torch.bool, device=batch.traj_id.device)
            member[part.to(batch.traj_id.device)] = True
            plan.append(member[batch.traj_id])
    return plan


def micro_batch_plan(
    batch: SampleBatch,
    max_rows: int | None,
    *,
    whole_trajectories: bool,
    max_tokens: int | None = None,
    row_tokens: Tensor | None = None,
) -> list[Tensor]:
    """Row indices of the forward/backward passes of one optimizer step.

    Rows are packed in order into passes of at most ``max_rows`` rows and at most ``max_tokens``
    tokens (``row_tokens[i]``: the tokens row ``i`` puts through the model, context included), so
    that long multi-turn contexts get passes of few rows and short ones share a pass (a
    dynamic batch size). ``None`` lifts a limit; with neither, the step is one pass. With
    ``whole_trajectories`` (a trajectory-level ratio needs every row of its trajectory in the
    same pass) the units packed are whole trajectories. A unit over a limit gets a pass of its own.
    """
    n = batch.num_rows
    rows = torch.arange(n, device=batch.traj_id.device)
    if max_tokens is not None and row_tokens is None:
        raise ValueError("max_tokens needs row_tokens, the tokens of each row")
    for name, limit in (("max_rows", max_rows), ("max_tokens", max_tokens)):
        if limit is not None and limit < 1:
            raise ValueError(f"{name} must be >= 1, got {limit}")
    cost = row_tokens.to(torch.long).cpu() if row_tokens is not None else torch.zeros(n, dtype=torch.long, device="cpu")
    if (max_rows is None or n <= max_rows) and (max_tokens is None or int(cost.sum()) <= max_tokens):
        return [rows]
    if whole_trajectories:
        by_traj = rows[torch.argsort(batch.traj_id, stable=True)]
        units = list(by_traj.split([s for s in torch.bincount(batch.traj_id[by_traj]).tolist() if s > 0]))
    else:
        units = list(rows.split(1))
    plan: list[Tensor] = []
    current: list[Tensor] = []
    size = tokens = 0
    for unit in units:
        unit_tokens = int(cost[unit.cpu()].sum())
        too_many = max_rows is not None and size + unit.numel() > max_rows
        too_long = max_tokens is not None and tokens + unit_tokens > max_tokens
        if current and (too_many or too_long):
            plan.append(torch.cat(current))
            current, size, tokens = [], 0, 0
        current.append(unit)
        size, tokens = size + unit.numel(), tokens + unit_tokens
    plan.append(torch.cat(current))
    return plan


@dataclass
class UpdateStats:
    """Diagnostics of one update, one entry per optimizer step (verl's ``actor/*`` metrics).

    ``objective`` is the policy objective (``actor/pg_loss`` is its negative), ``kl`` the
    aggregated KL penalty before ``kl_coef``, ``grad_norm`` the gradient norm before
    clipping. A step whose loss or gradient is not finite is skipped (no parameter change)
    and counted in ``skipped_steps``.
    """

    steps: int = 0
    skipped_steps: int = 0
    objective: list[float] = field(default_factory=list)
    clip_frac: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)
    turn_order: list[int] = field(default_factory=list)
    m_final: Tensor | None = None
    m_current: Tensor | None = None  # the factor under the final policy (``track_m_drift``)


def _optimizer_step(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    batch: SampleBatch,
    weight: Tensor,
    cfg: AlgorithmConfig,
    logp_ref: Tensor | None,
    stats: UpdateStats,
    micro_batch_rows: int | None = None,
    max_grad_norm: float | None = None,
    micro_batch_tokens: int | None = None,
    row_tokens: Tensor | None = None,
    dp: DataParallel | None = None,
) -> None:
    """One optimizer step on ``batch``, as one or several accumulated forward/backward passes.

    The aggregation's normalisers come from the whole ``batch`` (:func:`row_coefficients`),
    so the accumulated gradient equals the one-pass gradient. With ``dp`` this process passes
    only its own rows (padded with empty passes to the largest count over the processes) and
    the diagnostics are summed over the processes.
    """
    if cfg.kl_coef > 0.0 and logp_ref is None:
        raise ValueError("kl_coef > 0 needs the reference policy's log-probabilities (logp_ref=...)")
    coef = row_coefficients(batch, cfg.aggregation)
    token_coef = row_coefficients(batch, "token_mean")
    whole_trajectories = (
        policy_loss(cfg.update).surrogate and cfg.ratio_level == "sequence" and cfg.ratio_scope == "trajectory"
    )
    mine = owned(batch, dp).nonzero().squeeze(1)
    plan = [mine[rows] for rows in micro_batch_plan(
        batch.select(mine), micro_batch_rows, whole_trajectories=whole_trajectories,
        max_tokens=micro_batch_tokens, row_tokens=row_tokens[mine] if row_tokens is not None else None,
    )]
    if dp is not None:  # every process makes as many passes (the model's collectives must match)
        plan += [mine[:0]] * (int(dp.max(len(plan))) - len(plan))
    optimizer.zero_grad(set_to_none=True)
    objective_sum = kl_sum = clipped_mass = 0.0
    for rows in plan:
        micro = batch.select(rows)
        logp = policy.token_logps(micro)
        objective, info = policy_objective(
            logp,
            micro,
            weight[rows],
            update=cfg.update,
            ratio_level=cfg.ratio_level,
            ratio_scope=cfg.ratio_scope,
            length_norm=cfg.length_norm,
            clip_eps_low=cfg.clip_eps_low,
            clip_eps_high=cfg.clip_eps_high,
            dual_clip=cfg.dual_clip,
            aggregation=cfg.aggregation,
            coef=coef[rows],
            token_coef=token_coef[rows],
        )
        loss = -objective
        if cfg.kl_coef > 0.0:
            kl = aggregate(kl_penalty(logp, logp_ref[rows], cfg.kl_estimator), micro, cfg.aggregation, coef[rows])
            loss = loss + cfg.kl_coef * kl
            kl_sum += float(kl.detach())
        if loss.requires_grad:  # a micro-batch of placeholder rows only has no graph (and adds 0)
            loss.backward()
        objective_sum += float(objective.detach())
        clipped_mass += info["clipped_mass"]
    if dp is not None:
        sums = dp.sum(torch.tensor([objective_sum, kl_sum, clipped_mass], dtype=torch.float64, device="cpu"))
        objective_sum, kl_sum, clipped_mass = sums.tolist()
    params = [p for p in policy.parameters() if p.grad is not None]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm is not None else math.inf))
    if math.isfinite(objective_sum) and math.isfinite(kl_sum) and math.isfinite(grad_norm):
        optimizer.step()
    else:  # a non-finite loss or gradient would poison the parameters: skip the step
        stats.skipped_steps += 1
    optimizer.zero_grad(set_to_none=True)
    stats.steps += 1
    stats.objective.append(objective_sum)
    stats.clip_frac.append(clipped_mass / max(batch.num_instances, 1))
    stats.kl.append(kl_sum)
    stats.grad_norm.append(grad_norm)


def misaligned_m_keys(batch: SampleBatch, generator: torch.Generator | None) -> Tensor:
    """The reference code's positional ``M`` (PAPER.md §5), as keys: for ablations only.

    Row ``i`` reads the factor of another trajectory of the same instance and turn, chosen by
    a random permutation of the rows within each (instance, turn) segment.
    """
    segment = (batch.instance * num_turns(batch) + batch.turn).cpu()
    noise = torch.rand(segment.numel(), generator=generator, dtype=torch.float64)
    by_segment = torch.argsort(segment, stable=True)
    shuffled = torch.argsort(segment.to(torch.float64) + noise)
    perm = torch.empty_like(by_segment)
    perm[by_segment] = shuffled
    return batch.traj_id[perm.to(batch.traj_id.device)]


def turn_ratio(policy: Policy, turn_batch: SampleBatch, cfg: AlgorithmConfig, dp: DataParallel | None = None) -> Tensor:
    """Per-row ``pi_new(a_t | h_t) / pi_old(a_t | h_t)`` of one turn's rows: the factor of ``M``.

    The true sequence ratio (product of token ratios), or its geometric mean with
    ``cfg.m_length_norm``; 1 on placeholders; each factor clipped to ``cfg.m_clip`` with
    ``cfg.m_factor="clipped"``. With ``dp``, each row is scored by its owner (:func:`score_rows`).
    """
    with torch.no_grad():
        mask = turn_batch.token_mask & turn_batch.valid[:, None]
        logp = score_rows(policy.token_logps, turn_batch, dp).to(turn_batch.logp_old.device)
        log_ratio = sequence_log_ratio(logp, turn_batch.logp_old, mask, length_norm=cfg.m_length_norm)
        ratio = torch.where(turn_batch.valid, log_ratio.exp(), torch.ones_like(log_ratio))
        return ratio.clamp(*cfg.m_clip) if cfg.m_factor == "clipped" else ratio


def current_factor(
    policy: Policy, batch: SampleBatch, turns: list[int], cfg: AlgorithmConfig, dp: DataParallel | None = None
) -> Tensor:
    """``[n_traj]`` the factor of ``M`` under the current policy: ``prod_{k in turns} pi(a_k|h_k) / pi_old(a_k|h_k)``.

    Compared with the factor recorded during a sweep, it measures how stale the recorded one
    went (parameters shared across turns); ``cfg.m_refresh`` uses it in place of the recorded one.
    """
    factor = torch.ones(batch.num_trajectories, dtype=batch.logp_old.dtype, device=batch.logp_old.device)
    for t in turns:
        rows = batch.turn == t
        traj = batch.traj_id[rows]
        factor[traj] = factor[traj] * turn_ratio(policy, batch.select(rows), cfg, dp).to(factor.dtype)
        if cfg.m_factor == "clipped":
            factor = factor.clamp(*cfg.m_clip)
    return factor


def sequential_sweep(
    policy: Policy,
    batch: SampleBatch,
    advantages: Tensor,
    cfg: AlgorithmConfig,
    update_turn: Callable[[Tensor, Tensor], None],
    generator: torch.Generator | None = None,
    dp: DataParallel | None = None,
    final_factor: bool = True,
) -> tuple[list[int], Tensor]:
    """The HAML loop of PAPER.md §4 (HAPPO's, Zhong et al. 2024), one turn at a time.

    For each turn ``t`` in ``cfg``'s order: the weights are ``M_t = A * F[traj]``;
    ``update_turn(rows_t, M_t)`` improves the turn-``t`` policy on the turn-``t`` rows; then
    ``F[traj] *= pi_new(a_t | h_t) / pi_old(a_t | h_t)`` for the same trajectories
    (:func:`turn_ratio`). ``F`` is indexed by ``traj_id``, so re-ordering the rows cannot
    misalign it. ``cfg.m_alignment="shuffled"`` (an ablation: the reference code's defect)
    only changes which trajectory's factor each row reads. With ``dp`` every process runs the
    same sweep on the same global batch (:mod:`seeupo.core.parallel`).
    ``final_factor=False`` skips the ratio of the last turn in the order, which no update reads
    (the parameters are the same; one no-grad pass over that turn's rows saved); ``F`` then
    holds the product over the other turns.

    Returns:
      ``(order, F)`` with ``F`` the final per-trajectory factor.
    """
    order = turn_order(cfg, num_turns(batch), generator)
    read_key = misaligned_m_keys(batch, generator) if cfg.m_alignment == "shuffled" else batch.traj_id
    factor = torch.ones(batch.num_trajectories, dtype=advantages.dtype, device=advantages.device)
    for i, t in enumerate(order):
        rows = batch.turn == t
        if cfg.m_refresh and cfg.m_factor != "none":  # an ablation: the factor of the current policy
            factor = current_factor(policy, batch, order[:i], cfg, dp).to(factor.dtype)
        update_turn(rows, advantages[rows] * factor[read_key[rows]][:, None])
        if cfg.m_factor != "none" and (final_factor or i < len(order) - 1):
            traj = batch.traj_id[rows]
            factor[traj] = factor[traj] * turn_ratio(policy, batch.select(rows), cfg, dp).to(factor.dtype)
            if cfg.m_factor == "clipped":  # the running product is clipped too (reference code)
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
    micro_batch_rows: int | None = None,
    micro_batch_tokens: int | None = None,
    row_tokens: Tensor | None = None,
    max_grad_norm: float | None = None,
    track_m_drift: bool = False,
    dp: DataParallel | None = None,
    final_factor: bool = True,
) -> UpdateStats:
    """Update ``policy`` on ``batch`` with per-token ``advantages`` following ``cfg``.

    Simultaneous: ``epochs x minibatches`` optimizer steps on all turns at once (PPO, GRPO,
    GSPO, RLOO). Sequential: :func:`sequential_sweep`, each turn getting ``epochs x
    minibatches`` steps on its own rows (or an equal share of that budget if
    ``cfg.equal_budget``).

    Args:
      logp_ref: ``[n, L]`` reference-policy log-probabilities (for ``cfg.kl_coef > 0``).
      generator: the source of minibatch permutations and random turn orders.
      micro_batch_rows: rows per forward/backward pass (gradient accumulation; the step is
        exactly the one-pass step); ``None``: the whole minibatch in one pass.
      micro_batch_tokens, row_tokens: at most this many tokens per pass, with ``row_tokens[i]``
        the tokens row ``i`` puts through the model (:func:`micro_batch_plan`).
      max_grad_norm: clip the gradient's global norm before each optimizer step.
      track_m_drift: after a sequential sweep, also record ``stats.m_current``, the factor of
        ``M`` under the final policy, to compare with the recorded ``stats.m_final``.
      final_factor: compute the factor of ``M`` after the last turn of the sweep, which no
        update reads, to report it in ``stats.m_final``; ``False`` saves one no-grad pass over
        that turn's rows and leaves ``stats.m_final`` at ``None`` (``track_m_drift`` needs it).
      dp: data parallelism: this process's rank among processes that all call this function
        with the same global batch (:mod:`seeupo.core.parallel`); the result is the
        single-process update.
    """
    stats = UpdateStats()

    def steps_on(rows: Tensor, weight: Tensor, epochs: int, minibatches: int) -> None:
        sub = batch.select(rows)
        sub_ref = logp_ref[rows] if logp_ref is not None else None
        sub_tokens = row_tokens[rows] if row_tokens is not None else None
        for part in minibatch_plan(sub, epochs, minibatches, generator):
            _optimizer_step(
                policy, optimizer, sub.select(part), weight[part], cfg, sub_ref[part] if sub_ref is not None else None,
                stats, micro_batch_rows, max_grad_norm, micro_batch_tokens,
                sub_tokens[part] if sub_tokens is not None else None, dp,
            )

    if cfg.schedule == "simultaneous":
        steps_on(torch.ones_like(batch.valid), advantages, cfg.epochs, cfg.minibatches)
        return stats
    epochs, minibatches = cfg.epochs, cfg.minibatches
    if cfg.equal_budget:  # the simultaneous update's number of optimizer steps, shared by the turns
        budget = max(1, (cfg.epochs * cfg.minibatches) // num_turns(batch))
        minibatches = min(cfg.minibatches, budget)
        epochs = budget // minibatches
    final_factor = final_factor or track_m_drift
    stats.turn_order, factor = sequential_sweep(
        policy, batch, advantages, cfg, lambda rows, m: steps_on(rows, m, epochs, minibatches), generator, dp,
        final_factor,
    )
    stats.m_final = factor if final_factor else None
    if track_m_drift:
        stats.m_current = current_factor(policy, batch, stats.turn_order, cfg, dp)
    return stats
