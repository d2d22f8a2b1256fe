"""How an update's optimizer steps run: minibatches, micro-batches, data parallelism, clipping, fused ratio passes.

:mod:`seeupo.core.update` is the algorithm (which rows, which weights, in which turn order);
this module executes its steps. None of it changes the update: micro-batches accumulate the
one-pass gradient, data parallelism gives the single-process step (:mod:`seeupo.core.parallel`),
and the fused ratio passes give the reference sweep's update (tested against it). The one
interface is :class:`GradientSteps`, a :class:`~seeupo.core.update.TurnUpdate`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Iterable, Protocol

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.config import AlgorithmConfig
from seeupo.core.factor import apply_m_factor, ratio_from_logps
from seeupo.core.losses import aggregate, kl_term, policy_objective, row_coefficients
from seeupo.core.parallel import DataParallel, owned, owner_scored
from seeupo.core.registry import policy_loss

Tensor = torch.Tensor


class Policy(Protocol):
    """What the update needs from a policy: differentiable per-token log-probabilities.

    Optionally ``turns_share_parameters = True``: every parameter serves every turn (a language
    model, a tabular policy with shared features), which :meth:`GradientSteps.fused` needs. With
    per-turn parameters (independent tabular tables) a fused step would give the finished turn's parameters a zero gradient
    instead of none, and an optimizer with momentum (Adam) still moves those; absent means ``False``.
    """

    def token_logps(self, batch: SampleBatch) -> Tensor:
        """``[n, L]`` log-probabilities of ``batch``'s tokens under the current parameters."""
        ...

    def parameters(self) -> Iterable[Tensor]: ...

    # optional: ``micro_batches(batch, max_rows, max_tokens, whole_trajectories) -> list[Tensor]``, the
    # row indices of an optimizer step's forward/backward passes under the limits, where a policy
    # knows what its passes forward (a packed language-model layout); otherwise micro_batch_plan
    # optional: ``token_entropies(batch) -> [n, L]``, the entropy of each token's whole conditional
    # distribution (differentiable), which an entropy bonus (``AlgorithmConfig.entropy_coef``) needs;
    # ``token_logps_and_entropies(batch)`` gives both from one forward where the policy can


@dataclass(frozen=True, eq=False)
class UpdateSettings:
    """How :func:`~seeupo.core.update.policy_update` runs, besides the algorithm (``cfg``): extra inputs and execution settings.

    None of them changes the algorithm: micro-batches and data parallelism give the same step
    as one pass on one process.

    Attributes:
      logp_ref: ``[n, L]`` reference-policy log-probabilities of the batch (for ``cfg.kl_coef > 0``).
      generator: the source of minibatch permutations, random turn orders and the shuffled-``M``
        ablation (CPU draws, so a run draws the same on any device).
      micro_batch_rows: rows per forward/backward pass (gradient accumulation; the step is
        exactly the one-pass step); ``None``: the whole minibatch in one pass.
      micro_batch_tokens: at most this many tokens per pass; needs ``row_tokens``, unless the
        policy plans its passes itself (a language model's ``micro_batches``: the rows and tokens
        its layout forwards, see :class:`Policy`).
      row_tokens: ``[n]`` the tokens row ``i`` puts through the model, context included
        (:func:`micro_batch_plan`).
      max_grad_norm: clip the gradient's global norm before each optimizer step.
      dp: data parallelism: this process's rank among processes that all call
        :func:`~seeupo.core.update.policy_update` with the same global batch (:mod:`seeupo.core.parallel`).
        Only the execution reads it: each step passes this process's own rows, and the sweep's ratio
        passes score each row on its owner (:attr:`GradientSteps.scorer`).
      fuse_ratio_passes: a sequential update takes each turn's ratio in the next turn's first
        optimizer step where the schedule allows (:meth:`GradientSteps.fused`); ``False``:
        a separate no-gradient pass (:func:`~seeupo.core.update.sequential_sweep`, the reference). The same update;
        only for a policy whose turns share its parameters (:class:`Policy`).
      old_logps_from_update: the update is one optimizer step (:func:`~seeupo.core.update.is_on_policy`), so its own
        passes score the batch under the parameters the batch is rated against: ``logp_old`` is
        taken as the pass's detached log-probabilities (ratio 1, gradient ``grad log pi``; verl's
        on-policy actor does the same), ``stats.logp_old`` returns them, and the caller needs no
        scoring pass before the update. ``False``: ``batch.logp_old`` as given (the reference).
    """

    logp_ref: Tensor | None = None
    generator: torch.Generator | None = None
    micro_batch_rows: int | None = None
    micro_batch_tokens: int | None = None
    row_tokens: Tensor | None = None
    max_grad_norm: float | None = None
    dp: DataParallel | None = None
    fuse_ratio_passes: bool = True
    old_logps_from_update: bool = False

    def select(self, rows: Tensor) -> "UpdateSettings":
        """The settings of ``batch.select(rows)``: the per-row tensors restricted to ``rows``."""
        return dataclasses.replace(
            self,
            logp_ref=self.logp_ref[rows] if self.logp_ref is not None else None,
            row_tokens=self.row_tokens[rows] if self.row_tokens is not None else None,
        )

    def execution_blocker(self, batch: SampleBatch) -> str | None:
        """Why the execution, not the algorithm, keeps :meth:`GradientSteps.fused` from running on ``batch``
        (a one-line reason), or ``None``: with ``dp``, a trajectory's rows must have one owner (each
        process advances the factors of the trajectories it scores)."""
        if self.dp is not None and batch.owner is not None:
            first = torch.full((batch.num_trajectories,), -1, dtype=batch.owner.dtype, device=batch.owner.device)
            first[batch.traj_id] = batch.owner
            if not bool((first[batch.traj_id] == batch.owner).all()):
                return "a trajectory's rows have more than one owner (data parallelism)"
        return None


@dataclass
class UpdateStats:
    """Diagnostics of one update, one entry per optimizer step (verl's ``actor/*`` metrics).

    ``objective`` is the policy objective (``actor/pg_loss`` is its negative), ``kl`` the
    aggregated KL penalty before ``kl_coef``, ``entropy`` the aggregated entropy an entropy bonus
    adds before ``entropy_coef`` (only with one), ``grad_norm`` the gradient norm before
    clipping. A step whose loss or gradient is not finite is skipped (no parameter change)
    and counted in ``skipped_steps``. A sequential update also reports its ``turn_order`` and
    ``factor``, the ``[n_traj]`` factor ``F`` that the last turn's weights read (the product over
    the other turns; :func:`~seeupo.core.update.final_factor` adds the last turn's ratio); where its ``M`` reads the
    ratio, ``fused_ratio_passes`` says whether the ratio passes were fused into the next turns'
    steps (:meth:`GradientSteps.fused`) and ``fusion_blocker`` why not (:func:`~seeupo.core.update.fusion_blocker`).
    With ``settings.old_logps_from_update``, ``logp_old`` holds the ``[n, L]`` log-probabilities the
    update's step scored the batch's rows with before it moved the parameters (0 off the tokens).
    """

    steps: int = 0
    skipped_steps: int = 0
    objective: list[float] = field(default_factory=list)
    clip_frac: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    turn_order: list[int] = field(default_factory=list)
    factor: Tensor | None = None
    fused_ratio_passes: bool | None = None
    fusion_blocker: str | None = None
    logp_old: Tensor | None = None


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


@dataclass(eq=False)
class _PendingRatio:
    """A finished turn's ratio, taken in the next turn's first optimizer step (:meth:`GradientSteps.fused`).

    ``finished`` marks the step batch's rows of the finished turn. They are scored in the same
    passes as the trained rows; their log-probabilities advance ``factor``
    (:func:`~seeupo.core.factor.apply_m_factor`) before the trained rows' weights ``A * F[traj]`` are formed,
    and they add nothing to the objective (coefficient 0, ratio 1).
    """

    finished: Tensor
    factor: Tensor


def optimizer_step(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    batch: SampleBatch,
    weight: Tensor,
    cfg: AlgorithmConfig,
    settings: UpdateSettings,
    stats: UpdateStats,
    pending: _PendingRatio | None = None,
) -> None:
    """One optimizer step on ``batch``, as one or several accumulated forward/backward passes.

    ``settings`` holds ``batch``'s own rows (:meth:`UpdateSettings.select`). The aggregation's
    normalisers come from the whole ``batch`` (:func:`row_coefficients`), so the accumulated
    gradient equals the one-pass gradient. With ``settings.dp`` this process passes only its own
    rows (padded with empty passes to the largest count over the processes) and the diagnostics
    are summed over the processes. With ``pending``, ``weight`` is the advantage and each pass
    first advances ``pending.factor`` from its finished rows (a trajectory's rows share a pass).
    """
    logp_ref, row_tokens, dp = settings.logp_ref, settings.row_tokens, settings.dp
    if cfg.kl_coef > 0.0 and cfg.kl_placement != "reward" and logp_ref is None:
        raise ValueError("kl_coef > 0 needs the reference policy's log-probabilities (logp_ref=...)")
    if cfg.entropy_coef > 0.0 and not hasattr(policy, "token_entropies"):
        raise ValueError(f"entropy_coef > 0 needs a policy that gives each token's entropy ({type(policy).__name__} "
                         "does not: the tabular engine's policies and the language-model policy do)")
    trained = batch if pending is None else batch.with_updates(valid=batch.valid & ~pending.finished)
    coef = row_coefficients(trained, cfg.aggregation, cfg.aggregation_rows)
    token_coef = row_coefficients(trained, "token_mean")
    whole_trajectories = pending is not None or (
        policy_loss(cfg.update).surrogate and cfg.ratio_level == "sequence" and cfg.ratio_scope == "trajectory"
    )
    mine = owned(batch, dp).nonzero().squeeze(1)
    if hasattr(policy, "micro_batches"):  # the policy knows what its passes forward
        parts = policy.micro_batches(batch.select(mine), settings.micro_batch_rows, settings.micro_batch_tokens,
                                     whole_trajectories)
    else:
        parts = micro_batch_plan(batch.select(mine), settings.micro_batch_rows, whole_trajectories=whole_trajectories,
                                 max_tokens=settings.micro_batch_tokens,
                                 row_tokens=row_tokens[mine] if row_tokens is not None else None)
    plan = [mine[rows] for rows in parts]
    if dp is not None:  # every process makes as many passes (the model's collectives must match)
        plan += [mine[:0]] * (int(dp.max(len(plan))) - len(plan))
    optimizer.zero_grad(set_to_none=True)
    objective_sum = kl_sum = clipped_mass = entropy_sum = 0.0
    for rows in plan:
        micro = batch.select(rows)
        entropies = None
        if cfg.entropy_coef > 0.0 and hasattr(policy, "token_logps_and_entropies"):  # one forward for both
            logp, entropies = policy.token_logps_and_entropies(micro)
        else:
            logp = policy.token_logps(micro)
        if stats.logp_old is not None:  # on-policy: the step's own scores are the old log-probabilities
            old = torch.where(micro.token_mask, logp.detach().to(micro.logp_old.device, micro.logp_old.dtype), 0.0)
            stats.logp_old[rows.to(stats.logp_old.device)] = old
            micro = micro.with_updates(logp_old=old)
        micro_weight = weight[rows]
        if pending is not None:  # F takes the finished rows' ratios under the weights this step starts from
            finished = pending.finished[rows]
            done = micro.select(finished)
            pending.factor = apply_m_factor(pending.factor, done, ratio_from_logps(done, logp[finished].detach(), cfg), cfg)
            micro_weight = torch.where(finished[:, None], 0.0, micro_weight * pending.factor[micro.traj_id][:, None])
            logp = torch.where(finished[:, None], micro.logp_old.to(logp.dtype), logp)  # ratio 1: adds exactly 0
        objective, info = policy_objective(logp, micro, micro_weight, cfg, coef=coef[rows], token_coef=token_coef[rows])
        loss = -objective
        if cfg.entropy_coef > 0.0:  # verl's entropy_coeff: the entropy aggregated as the objective, added to it
            if entropies is None:
                entropies = policy.token_entropies(micro)  # type: ignore[attr-defined]
            entropy = aggregate(entropies, micro, cfg.aggregation, coef[rows], cfg.aggregation_rows)
            loss = loss - cfg.entropy_coef * entropy
            entropy_sum += float(entropy.detach())
        if cfg.kl_coef > 0.0 and cfg.kl_placement != "reward":
            kl = kl_term(logp, micro, logp_ref[rows], cfg, coef[rows])
            loss = loss + cfg.kl_coef * kl
            kl_sum += float(kl.detach())
        if loss.requires_grad:  # a micro-batch of placeholder rows only has no graph (and adds 0)
            loss.backward()
        objective_sum += float(objective.detach())
        clipped_mass += info["clipped_mass"]
    if dp is not None:
        sums = dp.sum(torch.tensor([objective_sum, kl_sum, clipped_mass, entropy_sum], dtype=torch.float64, device="cpu"))
        objective_sum, kl_sum, clipped_mass, entropy_sum = sums.tolist()
        if pending is not None:  # each process advanced its own trajectories' factors: gather them
            pending.factor = _gathered_factor(pending.factor, batch.traj_id[mine[pending.finished[mine]]], dp)
        if stats.logp_old is not None:  # on-policy, the update's only step: each row was scored by its owner
            stats.logp_old = dp.sum(stats.logp_old)
    params = [p for p in policy.parameters() if p.grad is not None]
    max_norm = settings.max_grad_norm if settings.max_grad_norm is not None else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
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
    if cfg.entropy_coef > 0.0:
        stats.entropy.append(entropy_sum)


def _gathered_factor(factor: Tensor, mine: Tensor, dp: DataParallel) -> Tensor:
    """``factor`` with each trajectory's entry from the process that advanced it (``mine``: this process's)."""
    owned_traj = torch.zeros(factor.shape, dtype=factor.dtype, device=factor.device)
    owned_traj[mine.to(factor.device)] = 1.0
    values = dp.sum(torch.where(owned_traj > 0, factor, 0.0))
    return torch.where(dp.sum(owned_traj) > 0, values, factor)


@dataclass
class GradientSteps:
    """The gradient :class:`~seeupo.core.update.TurnUpdate`: ``epochs x minibatches`` optimizer steps on the given rows.

    Each call draws its minibatches (:func:`minibatch_plan`, whole trajectories) from
    ``settings.generator`` and appends one entry per step to ``stats``.
    """

    policy: Policy
    optimizer: torch.optim.Optimizer
    batch: SampleBatch
    cfg: AlgorithmConfig
    settings: UpdateSettings
    stats: UpdateStats
    epochs: int
    minibatches: int

    @property
    def scorer(self) -> Policy:
        """The policy as a sequential sweep's no-gradient ratio passes score it
        (:func:`~seeupo.core.update.sequential_sweep`): with ``settings.dp``, each row on the process
        that owns it, every process getting every row (:class:`~seeupo.core.parallel.OwnerScoring`)."""
        return owner_scored(self.policy, self.settings.dp)

    def __call__(self, rows: Tensor, weights: Tensor) -> None:
        sub, settings = self.batch.select(rows), self.settings.select(rows)
        for part in minibatch_plan(sub, self.epochs, self.minibatches, settings.generator):
            optimizer_step(self.policy, self.optimizer, sub.select(part), weights[part], self.cfg, settings.select(part),
                           self.stats)

    def fused(self, rows: Tensor, advantages: Tensor, factor: Tensor, finished: Tensor | None) -> Tensor:
        """``self(rows, advantages[rows] * F[traj])`` with ``F`` first advanced by the ratio of the
        ``finished`` rows (the previous turn's), scored in the first optimizer step's passes; returns
        that ``F``. Needs one minibatch (:func:`~seeupo.core.update.fusion_blocker`).

        The previous turn's ratio is read under the weights its update left, which are the weights
        this turn's first optimizer step starts from: that step forwards both turns' rows together
        and advances ``F`` from the finished rows before forming its own weights ``M = A * F[traj]``.
        A packed language-model layout then reads the earlier of a trajectory's two turns from the
        later turn's row: one forward pass with gradient where the reference sweep
        (:func:`~seeupo.core.update.sequential_sweep`) makes a no-gradient pass and a gradient pass.
        """
        sub, settings = self.batch.select(rows), self.settings.select(rows)
        for k, part in enumerate(minibatch_plan(sub, self.epochs, self.minibatches, settings.generator)):
            if k == 0 and finished is not None:  # one minibatch: ``part`` is every row of the turn
                joint = rows | finished
                pending = _PendingRatio(finished[joint], factor)
                optimizer_step(self.policy, self.optimizer, self.batch.select(joint), advantages[joint], self.cfg,
                               self.settings.select(joint), self.stats, pending)
                factor = pending.factor
                continue
            weights = advantages[rows] * factor[sub.traj_id][:, None]
            optimizer_step(self.policy, self.optimizer, sub.select(part), weights[part], self.cfg, settings.select(part),
                           self.stats)
        return factor

