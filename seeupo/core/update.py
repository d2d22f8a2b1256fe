"""One policy-optimisation iteration: advantages, then a simultaneous or sequential update.

This is the whole training step of every preset, for tabular policies and language
models alike. Read :func:`policy_update`, then :func:`sequential_sweep`: the sequential
(HAML) loop of docs/method.md §4, written as HARL's (Zhong et al. 2024)::

    for t in order:
        weights = A[turn t] * F[traj]            # M_t
        for minibatch in plan: optimizer step on turn t's rows with these weights
        F[traj] = m_factor(F[traj], pi_new(a_t|h_t) / pi_old(a_t|h_t))

A turn's update is anything with the :class:`TurnUpdate` interface: the gradient steps of
:class:`GradientSteps` here, or the tabular engine's closed-form mirror step.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Iterable, Protocol

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.boundary import call_estimator, call_m_factor, call_turn_order
from seeupo.core.config import AlgorithmConfig
from seeupo.core.losses import aggregate, kl_penalty, policy_objective, row_coefficients, sequence_log_ratio
from seeupo.core.parallel import DataParallel, owned, score_rows
from seeupo.core.registry import M_FACTORS, TURN_ORDERS, adv_estimator, policy_loss

Tensor = torch.Tensor


class Policy(Protocol):
    """What the update needs from a policy: differentiable per-token log-probabilities.

    Optionally ``turns_share_parameters = True``: every parameter serves every turn (a language
    model), which :func:`fused_sequential_sweep` needs. With per-turn parameters (the tabular
    policies' tables) a fused step would give the finished turn's parameters a zero gradient
    instead of none, and an optimizer with momentum (Adam) still moves those; absent means ``False``.
    """

    def token_logps(self, batch: SampleBatch) -> Tensor:
        """``[n, L]`` log-probabilities of ``batch``'s tokens under the current parameters."""
        ...

    def parameters(self) -> Iterable[Tensor]: ...

    # optional: ``micro_batches(batch, max_rows, max_tokens, whole_trajectories) -> list[Tensor]``, the
    # row indices of an optimizer step's forward/backward passes under the limits, where a policy
    # knows what its passes forward (a packed language-model layout); otherwise micro_batch_plan


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
    return call_estimator(estimator, batch, cfg, critic_values=critic_values, oracle=oracle, group_stats=group_stats)


def turn_order(cfg: AlgorithmConfig, num_turns: int, generator: torch.Generator | None = None) -> list[int]:
    """The order in which a sequential update visits the turns (0-based absolute indices): the
    registered turn order ``cfg.order`` (:func:`seeupo.core.registry.register_turn_order`)."""
    return call_turn_order(TURN_ORDERS.get(cfg.order), num_turns, cfg, generator)


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


@dataclass(frozen=True, eq=False)
class UpdateSettings:
    """How :func:`policy_update` runs, besides the algorithm (``cfg``): extra inputs and execution settings.

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
        :func:`policy_update` with the same global batch (:mod:`seeupo.core.parallel`).
      fuse_ratio_passes: a sequential update takes each turn's ratio in the next turn's first
        optimizer step where the schedule allows (:func:`fused_sequential_sweep`); ``False``:
        a separate no-gradient pass (:func:`sequential_sweep`, the reference). The same update;
        only for a policy whose turns share its parameters (:class:`Policy`).
      old_logps_from_update: the update is one optimizer step (:func:`is_on_policy`), so its own
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


@dataclass
class UpdateStats:
    """Diagnostics of one update, one entry per optimizer step (verl's ``actor/*`` metrics).

    ``objective`` is the policy objective (``actor/pg_loss`` is its negative), ``kl`` the
    aggregated KL penalty before ``kl_coef``, ``grad_norm`` the gradient norm before
    clipping. A step whose loss or gradient is not finite is skipped (no parameter change)
    and counted in ``skipped_steps``. A sequential update also reports its ``turn_order`` and
    ``factor``, the ``[n_traj]`` factor ``F`` that the last turn's weights read (the product over
    the other turns; :func:`final_factor` adds the last turn's ratio); where its ``M`` reads the
    ratio, ``fused_ratio_passes`` says whether the ratio passes were fused into the next turns'
    steps (:func:`fused_sequential_sweep`) and ``fusion_blocker`` why not (:func:`fusion_blocker`).
    With ``settings.old_logps_from_update``, ``logp_old`` holds the ``[n, L]`` log-probabilities the
    update's step scored the batch's rows with before it moved the parameters (0 off the tokens).
    """

    steps: int = 0
    skipped_steps: int = 0
    objective: list[float] = field(default_factory=list)
    clip_frac: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)
    turn_order: list[int] = field(default_factory=list)
    factor: Tensor | None = None
    fused_ratio_passes: bool | None = None
    fusion_blocker: str | None = None
    logp_old: Tensor | None = None


class TurnUpdate(Protocol):
    """One turn's policy improvement inside a sweep (or all turns', in a simultaneous update)."""

    def __call__(self, rows: Tensor, weights: Tensor) -> None:
        """Improve the policy on the batch rows ``rows`` (``[n]`` bool) with the per-token
        ``weights`` (``[rows.sum(), L]``: the advantage, or ``M_t`` in a sequential sweep)."""
        ...


@dataclass(eq=False)
class _PendingRatio:
    """A finished turn's ratio, taken in the next turn's first optimizer step (:func:`fused_sequential_sweep`).

    ``finished`` marks the step batch's rows of the finished turn. They are scored in the same
    passes as the trained rows; their log-probabilities advance ``factor``
    (:func:`advance_factor`'s rule) before the trained rows' weights ``A * F[traj]`` are formed,
    and they add nothing to the objective (coefficient 0, ratio 1).
    """

    finished: Tensor
    factor: Tensor


def _optimizer_step(
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
    if cfg.kl_coef > 0.0 and logp_ref is None:
        raise ValueError("kl_coef > 0 needs the reference policy's log-probabilities (logp_ref=...)")
    trained = batch if pending is None else batch.with_updates(valid=batch.valid & ~pending.finished)
    coef = row_coefficients(trained, cfg.aggregation)
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
    objective_sum = kl_sum = clipped_mass = 0.0
    for rows in plan:
        micro = batch.select(rows)
        logp = policy.token_logps(micro)
        if stats.logp_old is not None:  # on-policy: the step's own scores are the old log-probabilities
            old = torch.where(micro.token_mask, logp.detach().to(micro.logp_old.device, micro.logp_old.dtype), 0.0)
            stats.logp_old[rows.to(stats.logp_old.device)] = old
            micro = micro.with_updates(logp_old=old)
        micro_weight = weight[rows]
        if pending is not None:  # F takes the finished rows' ratios under the weights this step starts from
            finished = pending.finished[rows]
            done = micro.select(finished)
            pending.factor = _advanced(pending.factor, done, _ratio(done, logp[finished].detach(), cfg), cfg)
            micro_weight = torch.where(finished[:, None], 0.0, micro_weight * pending.factor[micro.traj_id][:, None])
            logp = torch.where(finished[:, None], micro.logp_old.to(logp.dtype), logp)  # ratio 1: adds exactly 0
        objective, info = policy_objective(logp, micro, micro_weight, cfg, coef=coef[rows], token_coef=token_coef[rows])
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
        if pending is not None:  # each process advanced its own trajectories' factors: gather them
            pending.factor = _gathered_factor(pending.factor, batch.traj_id[mine[pending.finished[mine]]], dp)
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


@dataclass
class GradientSteps:
    """The gradient :class:`TurnUpdate`: ``epochs x minibatches`` optimizer steps on the given rows.

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

    def __call__(self, rows: Tensor, weights: Tensor) -> None:
        sub, settings = self.batch.select(rows), self.settings.select(rows)
        for part in minibatch_plan(sub, self.epochs, self.minibatches, settings.generator):
            _optimizer_step(self.policy, self.optimizer, sub.select(part), weights[part], self.cfg, settings.select(part),
                            self.stats)

    def fused(self, rows: Tensor, advantages: Tensor, factor: Tensor, finished: Tensor | None) -> Tensor:
        """``self(rows, advantages[rows] * F[traj])`` with ``F`` first advanced by the ratio of the
        ``finished`` rows (the previous turn's), scored in the first optimizer step's passes; returns
        that ``F``. Needs one minibatch (:func:`can_fuse_ratio_passes`)."""
        sub, settings = self.batch.select(rows), self.settings.select(rows)
        for k, part in enumerate(minibatch_plan(sub, self.epochs, self.minibatches, settings.generator)):
            if k == 0 and finished is not None:  # one minibatch: ``part`` is every row of the turn
                joint = rows | finished
                pending = _PendingRatio(finished[joint], factor)
                _optimizer_step(self.policy, self.optimizer, self.batch.select(joint), advantages[joint], self.cfg,
                                self.settings.select(joint), self.stats, pending)
                factor = pending.factor
                continue
            weights = advantages[rows] * factor[sub.traj_id][:, None]
            _optimizer_step(self.policy, self.optimizer, sub.select(part), weights[part], self.cfg, settings.select(part),
                            self.stats)
        return factor


def steps_per_turn(cfg: AlgorithmConfig, num_turns: int) -> tuple[int, int]:
    """``(epochs, minibatches)`` of each turn of a sequential update.

    ``cfg.epochs`` and ``cfg.minibatches``; with ``cfg.equal_budget`` (an ablation), the
    simultaneous update's number of optimizer steps shared by the turns (see
    :class:`~seeupo.core.config.AlgorithmConfig`).
    """
    if not cfg.equal_budget:
        return cfg.epochs, cfg.minibatches
    budget = max(1, (cfg.epochs * cfg.minibatches) // num_turns)
    minibatches = min(cfg.minibatches, budget)
    return budget // minibatches, minibatches


def misaligned_m_keys(batch: SampleBatch, generator: torch.Generator | None) -> Tensor:
    """The reference code's positional ``M`` (docs/method.md §5), as keys: for ablations only.

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
    """Per-row ``pi_new(a_t | h_t) / pi_old(a_t | h_t)`` of one turn's rows: what enters the factor of ``M``.

    The true sequence ratio (product of token ratios), or its geometric mean with
    ``cfg.m_length_norm``; 1 on placeholders. With ``dp``, each row is scored by its owner
    (:func:`score_rows`).
    """
    with torch.no_grad():
        logp = score_rows(policy.token_logps, turn_batch, dp).to(turn_batch.logp_old.device)
        return _ratio(turn_batch, logp, cfg)


def _ratio(turn_batch: SampleBatch, logp: Tensor, cfg: AlgorithmConfig) -> Tensor:
    """Per-row ``pi_new / pi_old`` of one turn's rows from their log-probabilities ``logp`` (1 on placeholders)."""
    mask = turn_batch.token_mask & turn_batch.valid[:, None]
    log_ratio = sequence_log_ratio(logp, turn_batch.logp_old, mask, length_norm=cfg.m_length_norm)
    return torch.where(turn_batch.valid, log_ratio.exp(), torch.ones_like(log_ratio))


def _advanced(factor: Tensor, turn_batch: SampleBatch, ratio: Tensor, cfg: AlgorithmConfig) -> Tensor:
    """``factor`` with ``F[traj] <- m_factor(F[traj], ratio)`` on ``turn_batch``'s trajectories (a new tensor)."""
    traj = turn_batch.traj_id
    factor = factor.clone()
    factor[traj] = call_m_factor(M_FACTORS.get(cfg.m_factor), factor[traj], ratio.to(factor.dtype), cfg)
    return factor


def _gathered_factor(factor: Tensor, mine: Tensor, dp: DataParallel) -> Tensor:
    """``factor`` with each trajectory's entry from the process that advanced it (``mine``: this process's)."""
    owned_traj = torch.zeros(factor.shape, dtype=factor.dtype, device=factor.device)
    owned_traj[mine.to(factor.device)] = 1.0
    values = dp.sum(torch.where(owned_traj > 0, factor, 0.0))
    return torch.where(dp.sum(owned_traj) > 0, values, factor)


def advance_factor(
    factor: Tensor, policy: Policy, batch: SampleBatch, turn: int, cfg: AlgorithmConfig, dp: DataParallel | None = None
) -> Tensor:
    """``F`` once turn ``turn`` is updated: ``F[traj] <- m_factor(F[traj], ratio_t)`` on the turn's trajectories.

    ``ratio_t`` is :func:`turn_ratio` under ``policy`` now, ``m_factor`` the registered rule
    ``cfg.m_factor`` (:func:`seeupo.core.registry.register_m_factor`). A new tensor; a rule that
    uses no ratio returns ``factor`` itself without scoring anything.
    """
    if not M_FACTORS.get(cfg.m_factor).uses_ratio:
        return factor
    rows = batch.select(batch.turn == turn)
    return _advanced(factor, rows, turn_ratio(policy, rows, cfg, dp), cfg)


def current_factor(
    policy: Policy, batch: SampleBatch, turns: list[int], cfg: AlgorithmConfig, dp: DataParallel | None = None
) -> Tensor:
    """``[n_traj]`` the factor of ``M`` under the current policy over ``turns``: for ``happo``,
    ``prod_{k in turns} pi(a_k|h_k) / pi_old(a_k|h_k)``.

    Compared with the factor recorded during a sweep, it measures how stale the recorded one
    went (parameters shared across turns); ``cfg.m_refresh`` uses it in place of the recorded one.
    """
    factor = torch.ones(batch.num_trajectories, dtype=batch.logp_old.dtype, device=batch.logp_old.device)
    for t in turns:
        factor = advance_factor(factor, policy, batch, t, cfg, dp)
    return factor


def next_factor(
    factor: Tensor, policy: Policy, batch: SampleBatch, updated: list[int], cfg: AlgorithmConfig,
    dp: DataParallel | None = None,
) -> Tensor:
    """The factor the next turn's weights read, once the turns ``updated`` (in sweep order) are updated.

    HAML's recorded factor: ``factor`` advanced by the last updated turn's ratio
    (:func:`advance_factor`). With ``cfg.m_refresh`` (an ablation) the factor under the current
    policy over every updated turn instead (:func:`current_factor`): one no-grad pass over those
    turns' rows.
    """
    if cfg.m_refresh:
        return current_factor(policy, batch, updated, cfg, dp).to(factor.dtype)
    return advance_factor(factor, policy, batch, updated[-1], cfg, dp)


def sequential_sweep(
    policy: Policy,
    batch: SampleBatch,
    advantages: Tensor,
    cfg: AlgorithmConfig,
    update_turn: TurnUpdate,
    generator: torch.Generator | None = None,
    dp: DataParallel | None = None,
) -> tuple[list[int], Tensor]:
    """The HAML loop of docs/method.md §4 (HAPPO's, Zhong et al. 2024), one turn at a time.

    For each turn ``t`` in ``cfg``'s order: the weights are ``M_t = A * F[traj]``;
    ``update_turn(rows_t, M_t)`` improves the turn-``t`` policy on the turn-``t`` rows; then ``F``
    takes the turn's ratio ``pi_new(a_t | h_t) / pi_old(a_t | h_t)`` for the same trajectories
    (:func:`next_factor`). ``F`` is indexed by ``traj_id``, so re-ordering the rows cannot misalign
    it. No update reads ``F`` after the last turn, so it is not computed (:func:`final_factor`
    computes it for logs). With ``dp`` every process runs the same sweep on the same global batch
    (:mod:`seeupo.core.parallel`).

    The ablations sit outside the loop's three lines: ``cfg.m_alignment="shuffled"`` (the
    reference code's defect) only changes which trajectory's factor each row reads
    (``read_key``, drawn once before the loop), ``cfg.m_refresh`` which factor :func:`next_factor`
    returns, and ``cfg.equal_budget`` the steps of the gradient ``update_turn``
    (:func:`steps_per_turn`).

    Returns:
      ``(order, F)``: the turn order and the factor the last turn's weights read.
    """
    order = turn_order(cfg, num_turns(batch), generator)
    read_key = misaligned_m_keys(batch, generator) if cfg.m_alignment == "shuffled" else batch.traj_id
    factor = torch.ones(batch.num_trajectories, dtype=advantages.dtype, device=advantages.device)
    for i, t in enumerate(order):
        rows = batch.turn == t
        update_turn(rows, advantages[rows] * factor[read_key[rows]][:, None])  # M_t = A * F[traj]
        if i + 1 < len(order):  # no update reads F after the last turn
            factor = next_factor(factor, policy, batch, order[: i + 1], cfg, dp)  # F[traj] <- m_factor(F, ratio_t)
    return order, factor


def fusion_blocker(
    policy: Policy, batch: SampleBatch, cfg: AlgorithmConfig, settings: UpdateSettings | None = None
) -> str | None:
    """Why :func:`fused_sequential_sweep` cannot make ``cfg``'s sequential update of ``policy`` on
    ``batch`` (a one-line reason), or ``None`` where it can.

    ``settings.fuse_ratio_passes`` must be on and the policy's turns must share its parameters
    (:class:`Policy`). Only the first optimizer step of a turn runs under the weights the previous
    turn's update left, so each turn needs one minibatch (:func:`steps_per_turn`; any number of
    epochs); ``M`` must be aligned (a row's weight reads its own trajectory's factor, computed in
    its own pass) and take each turn's ratio once (no ``m_refresh``); with ``settings.dp``, a
    trajectory's rows must have one owner.
    """
    settings = settings if settings is not None else UpdateSettings()
    if not settings.fuse_ratio_passes:
        return "fuse_ratio_passes is off"
    if cfg.schedule != "sequential":
        return f"schedule={cfg.schedule} (only a sequential update has ratio passes)"
    if not M_FACTORS.get(cfg.m_factor).uses_ratio:
        return f"m_factor={cfg.m_factor} reads no ratio"
    if not getattr(policy, "turns_share_parameters", False):
        return "the policy's turns do not share its parameters (turns_share_parameters)"
    if cfg.m_refresh:
        return "m_refresh takes each turn's ratio again"
    if cfg.m_alignment != "trajectory":
        return f"m_alignment={cfg.m_alignment} (a row's weight reads another trajectory's factor)"
    minibatches = steps_per_turn(cfg, num_turns(batch))[1]
    if minibatches != 1:
        return f"minibatches={minibatches} > 1 per turn (only a turn's first step runs under the previous turn's weights)"
    if settings.dp is not None and batch.owner is not None:
        first = torch.full((batch.num_trajectories,), -1, dtype=batch.owner.dtype, device=batch.owner.device)
        first[batch.traj_id] = batch.owner
        if not bool((first[batch.traj_id] == batch.owner).all()):
            return "a trajectory's rows have more than one owner (data parallelism)"
    return None


def can_fuse_ratio_passes(
    policy: Policy, batch: SampleBatch, cfg: AlgorithmConfig, dp: DataParallel | None = None
) -> bool:
    """Whether :func:`fused_sequential_sweep` makes ``cfg``'s sequential update of ``policy`` on
    ``batch`` (:func:`fusion_blocker` gives the reason where not)."""
    return fusion_blocker(policy, batch, cfg, UpdateSettings(dp=dp)) is None


def fused_sequential_sweep(
    batch: SampleBatch,
    advantages: Tensor,
    cfg: AlgorithmConfig,
    steps: GradientSteps,
    generator: torch.Generator | None = None,
) -> tuple[list[int], Tensor]:
    """:func:`sequential_sweep` with each turn's ratio pass fused into the next turn's first optimizer step.

    The ratio of turn ``t`` is read under the weights that turn ``t``'s update left, which are
    the weights the next turn's first optimizer step starts from: that step forwards both turns'
    rows together (:meth:`GradientSteps.fused`) and advances ``F`` from turn ``t``'s rows before
    forming its own weights ``M = A * F[traj]``. A packed language-model layout then reads the
    earlier of a trajectory's two turns from the later turn's row: one forward pass with gradient
    where the reference makes a no-gradient pass and a gradient pass. The same update as
    :func:`sequential_sweep` (tested), under :func:`can_fuse_ratio_passes`.
    """
    order = turn_order(cfg, num_turns(batch), generator)
    factor = torch.ones(batch.num_trajectories, dtype=advantages.dtype, device=advantages.device)
    for i, t in enumerate(order):
        finished = batch.turn == order[i - 1] if i > 0 else None
        factor = steps.fused(batch.turn == t, advantages, factor, finished)  # F <- m_factor(F, ratio_prev); M_t = A * F
    return order, factor


def final_factor(
    policy: Policy, batch: SampleBatch, cfg: AlgorithmConfig, stats: UpdateStats, dp: DataParallel | None = None
) -> Tensor | None:
    """``[n_traj]`` the factor after the whole sweep of a sequential update, every turn's ratio included.

    ``stats.factor`` advanced by the last turn's ratio under ``policy``, the policy that update
    left (:func:`advance_factor`): for logs and checks only, since no update reads it. One
    no-grad pass over the last turn's rows. ``None`` after a simultaneous update.
    """
    if stats.factor is None or not stats.turn_order:
        return None
    return advance_factor(stats.factor, policy, batch, stats.turn_order[-1], cfg, dp)


def is_on_policy(cfg: AlgorithmConfig) -> bool:
    """Whether ``cfg``'s update is a single optimizer step on the whole batch (a simultaneous update
    with one epoch and one minibatch, the paper's setting): its only gradient is taken at the
    parameters that scored ``logp_old``, so the ratio is 1 there and the step's own passes can
    score the old log-probabilities (:attr:`UpdateSettings.old_logps_from_update`)."""
    return cfg.schedule == "simultaneous" and cfg.epochs == 1 and cfg.minibatches == 1


def policy_update(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    batch: SampleBatch,
    advantages: Tensor,
    cfg: AlgorithmConfig,
    settings: UpdateSettings | None = None,
) -> UpdateStats:
    """Update ``policy`` on ``batch`` with per-token ``advantages`` following ``cfg``.

    Simultaneous: ``epochs x minibatches`` optimizer steps on all turns at once (PPO, GRPO,
    GSPO, RLOO). Sequential: :func:`sequential_sweep`, each turn getting ``epochs x
    minibatches`` steps on its own rows (:func:`steps_per_turn`); where it can
    (:func:`fusion_blocker` gives none), the same sweep with the ratio passes fused into the next
    turn's first step (:func:`fused_sequential_sweep`; ``stats.fused_ratio_passes``). ``settings``: the inputs and
    execution settings that are not the algorithm (:class:`UpdateSettings`; ``None``: defaults).
    With ``settings.dp`` the result is the single-process update.
    """
    settings = settings if settings is not None else UpdateSettings()
    stats = UpdateStats()
    if settings.old_logps_from_update:
        if not is_on_policy(cfg):
            raise ValueError("old_logps_from_update needs an update of one optimizer step (is_on_policy): "
                             f"schedule={cfg.schedule!r}, epochs={cfg.epochs}, minibatches={cfg.minibatches}")
        stats.logp_old = torch.zeros_like(batch.logp_old)
    if cfg.schedule == "simultaneous":
        steps = GradientSteps(policy, optimizer, batch, cfg, settings, stats, cfg.epochs, cfg.minibatches)
        steps(torch.ones_like(batch.valid), advantages)
        if stats.logp_old is not None and settings.dp is not None:  # each row was scored by its owner
            stats.logp_old = settings.dp.sum(stats.logp_old)
        return stats
    steps = GradientSteps(policy, optimizer, batch, cfg, settings, stats, *steps_per_turn(cfg, num_turns(batch)))
    blocker = fusion_blocker(policy, batch, cfg, settings)
    if M_FACTORS.get(cfg.m_factor).uses_ratio:  # else there is no ratio pass to fuse
        stats.fused_ratio_passes, stats.fusion_blocker = blocker is None, blocker
    if blocker is None:
        stats.turn_order, stats.factor = fused_sequential_sweep(batch, advantages, cfg, steps, settings.generator)
    else:
        stats.turn_order, stats.factor = sequential_sweep(
            policy, batch, advantages, cfg, steps, settings.generator, settings.dp
        )
    return stats
