"""The algorithm of one policy-optimisation iteration: advantages, then a simultaneous or sequential update.

This is the whole training step of every preset, for tabular policies and language models
alike. Read :func:`policy_update`, then :func:`sequential_sweep`: the sequential (HAML) loop of
docs/method.md §4, written as HARL's (Zhong et al. 2024)::

    for t in order:
        weights = A[turn t] * F[traj]            # M_t
        update turn t's rows with these weights  # a TurnUpdate
        F[traj] = m_factor(F[traj], pi_new(a_t|h_t) / pi_old(a_t|h_t))

Nothing here knows about optimizers, micro-batches or processes: a turn's update is anything
with the :class:`TurnUpdate` interface, the gradient steps of
:class:`seeupo.core.execution.GradientSteps` (how they run: :mod:`seeupo.core.execution`) or the
tabular engine's closed-form mirror step; the policy's ``token_logps`` scores the ratios, and with
data parallelism that policy scores each row on the process that owns it
(:class:`seeupo.core.parallel.OwnerScoring`, which the execution builds: :attr:`GradientSteps.scorer`).
"""

from __future__ import annotations

from typing import Protocol

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.boundary import call_estimator, call_rollout_correction, call_turn_order
from seeupo.core.config import AlgorithmConfig
from seeupo.core.execution import GradientSteps, Policy, UpdateSettings, UpdateStats
from seeupo.core.factor import apply_m_factor, ratio_from_logps
from seeupo.core.registry import M_FACTORS, TURN_ORDERS, adv_estimator
from seeupo.core.registry import rollout_correction as correction_entry

Tensor = torch.Tensor

__all__ = [
    "Policy", "TurnUpdate", "UpdateSettings", "UpdateStats", "advance_factor", "can_fuse_ratio_passes",
    "compute_advantages", "current_factor", "final_factor", "fusion_blocker", "is_on_policy", "misaligned_m_keys",
    "next_factor", "num_turns", "policy_update", "sequential_sweep", "steps_per_turn", "turn_order", "turn_ratio",
]


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


def is_on_policy(cfg: AlgorithmConfig) -> bool:
    """Whether ``cfg``'s update is a single optimizer step on the whole batch (a simultaneous update
    with one epoch and one minibatch, the paper's setting): its only gradient is taken at the
    parameters that scored ``logp_old``, so the ratio is 1 there and the step's own passes can
    score the old log-probabilities (:attr:`UpdateSettings.old_logps_from_update`)."""
    return cfg.schedule == "simultaneous" and cfg.epochs == 1 and cfg.minibatches == 1


class TurnUpdate(Protocol):
    """One turn's policy improvement inside a sweep (or all turns', in a simultaneous update)."""

    def __call__(self, rows: Tensor, weights: Tensor) -> None:
        """Improve the policy on the batch rows ``rows`` (``[n]`` bool) with the per-token
        ``weights`` (``[rows.sum(), L]``: the advantage, or ``M_t`` in a sequential sweep)."""
        ...


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


def turn_ratio(policy: Policy, turn_batch: SampleBatch, cfg: AlgorithmConfig) -> Tensor:
    """Per-row ``pi_new(a_t | h_t) / pi_old(a_t | h_t)`` of one turn's rows: what enters the factor of ``M``.

    The true sequence ratio (product of token ratios), or its geometric mean with
    ``cfg.m_length_norm``; 1 on placeholders. With data parallelism ``policy`` scores each row on
    its owner (:class:`~seeupo.core.parallel.OwnerScoring`).
    """
    with torch.no_grad():
        logp = policy.token_logps(turn_batch).to(turn_batch.logp_old.device)
        return ratio_from_logps(turn_batch, logp, cfg)


def advance_factor(
    factor: Tensor, policy: Policy, batch: SampleBatch, turn: int, cfg: AlgorithmConfig
) -> Tensor:
    """``F`` once turn ``turn`` is updated: ``F[traj] <- m_factor(F[traj], ratio_t)`` on the turn's trajectories.

    ``ratio_t`` is :func:`turn_ratio` under ``policy`` now, ``m_factor`` the registered rule
    ``cfg.m_factor`` (:func:`seeupo.core.registry.register_m_factor`). A new tensor; a rule that
    uses no ratio returns ``factor`` itself without scoring anything.
    """
    if not M_FACTORS.get(cfg.m_factor).uses_ratio:
        return factor
    rows = batch.select(batch.turn == turn)
    return apply_m_factor(factor, rows, turn_ratio(policy, rows, cfg), cfg)


def current_factor(
    policy: Policy, batch: SampleBatch, turns: list[int], cfg: AlgorithmConfig
) -> Tensor:
    """``[n_traj]`` the factor of ``M`` under the current policy over ``turns``: for ``happo``,
    ``prod_{k in turns} pi(a_k|h_k) / pi_old(a_k|h_k)``.

    Compared with the factor recorded during a sweep, it measures how stale the recorded one
    went (parameters shared across turns); ``cfg.m_refresh`` uses it in place of the recorded one.
    """
    factor = torch.ones(batch.num_trajectories, dtype=batch.logp_old.dtype, device=batch.logp_old.device)
    for t in turns:
        factor = advance_factor(factor, policy, batch, t, cfg)
    return factor


def next_factor(
    factor: Tensor, policy: Policy, batch: SampleBatch, updated: list[int], cfg: AlgorithmConfig
) -> Tensor:
    """The factor the next turn's weights read, once the turns ``updated`` (in sweep order) are updated.

    HAML's recorded factor: ``factor`` advanced by the last updated turn's ratio
    (:func:`advance_factor`). With ``cfg.m_refresh`` (an ablation) the factor under the current
    policy over every updated turn instead (:func:`current_factor`): one no-grad pass over those
    turns' rows.
    """
    if cfg.m_refresh:
        return current_factor(policy, batch, updated, cfg).to(factor.dtype)
    return advance_factor(factor, policy, batch, updated[-1], cfg)


def sequential_sweep(
    policy: Policy,
    batch: SampleBatch,
    advantages: Tensor,
    cfg: AlgorithmConfig,
    update_turn: TurnUpdate,
    generator: torch.Generator | None = None,
) -> tuple[list[int], Tensor]:
    """The HAML loop of docs/method.md §4 (HAPPO's, Zhong et al. 2024), one turn at a time.

    For each turn ``t`` in ``cfg``'s order: the weights are ``M_t = A * F[traj]``;
    ``update_turn(rows_t, M_t)`` improves the turn-``t`` policy on the turn-``t`` rows; then ``F``
    takes the turn's ratio ``pi_new(a_t | h_t) / pi_old(a_t | h_t)`` for the same trajectories
    (:func:`next_factor`). ``F`` is indexed by ``traj_id``, so re-ordering the rows cannot misalign
    it. No update reads ``F`` after the last turn, so it is not computed (:func:`final_factor`
    computes it for logs). With data parallelism every process runs the same sweep on the same
    global batch, ``policy`` scoring each row on its owner (:mod:`seeupo.core.parallel`).

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
            factor = next_factor(factor, policy, batch, order[: i + 1], cfg)  # F[traj] <- m_factor(F, ratio_t)
    return order, factor


def fusion_blocker(
    policy: Policy, batch: SampleBatch, cfg: AlgorithmConfig, settings: UpdateSettings | None = None
) -> str | None:
    """Why :meth:`~seeupo.core.execution.GradientSteps.fused` cannot make ``cfg``'s sequential update of ``policy`` on
    ``batch`` (a one-line reason), or ``None`` where it can.

    ``settings.fuse_ratio_passes`` must be on and the policy's turns must share its parameters
    (:class:`Policy`). Only the first optimizer step of a turn runs under the weights the previous
    turn's update left, so each turn needs one minibatch (:func:`steps_per_turn`; any number of
    epochs); ``M`` must be aligned (a row's weight reads its own trajectory's factor, computed in
    its own pass) and take each turn's ratio once (no ``m_refresh``); and the execution must allow
    it (:meth:`UpdateSettings.execution_blocker`: with data parallelism, a trajectory's rows must have one owner).
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
    return settings.execution_blocker(batch)


def can_fuse_ratio_passes(
    policy: Policy, batch: SampleBatch, cfg: AlgorithmConfig, settings: UpdateSettings | None = None
) -> bool:
    """Whether :meth:`~seeupo.core.execution.GradientSteps.fused` makes ``cfg``'s sequential update of ``policy`` on
    ``batch`` (:func:`fusion_blocker` gives the reason where not)."""
    return fusion_blocker(policy, batch, cfg, settings) is None


def final_factor(
    policy: Policy, batch: SampleBatch, cfg: AlgorithmConfig, stats: UpdateStats
) -> Tensor | None:
    """``[n_traj]`` the factor after the whole sweep of a sequential update, every turn's ratio included.

    ``stats.factor`` advanced by the last turn's ratio under ``policy``, the policy that update
    left (:func:`advance_factor`): for logs and checks only, since no update reads it. One
    no-grad pass over the last turn's rows. ``None`` after a simultaneous update.
    """
    if stats.factor is None or not stats.turn_order:
        return None
    return advance_factor(stats.factor, policy, batch, stats.turn_order[-1], cfg)


def rollout_correction(batch: SampleBatch, cfg: AlgorithmConfig) -> Tensor:
    """``[n, L]``: the weights of ``cfg.correction`` for ``batch``'s tokens (:mod:`seeupo.core.corrections`), checked at
    the boundary; 1 everywhere when the batch was sampled on policy (``logp_behaviour`` is ``None``)."""
    if batch.logp_behaviour is None:
        return torch.ones_like(batch.logp_old)
    return call_rollout_correction(correction_entry(cfg.correction), batch, cfg)


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
    turn's first step (:meth:`~seeupo.core.execution.GradientSteps.fused`; ``stats.fused_ratio_passes``).
    ``settings``: the inputs and execution settings that are not the algorithm
    (:class:`UpdateSettings`; ``None``: defaults).
    With data parallelism (``settings.dp``, which only the execution reads) the result is the single-process update.
    """
    settings = settings if settings is not None else UpdateSettings()
    if batch.logp_behaviour is not None:  # rows from another policy: the correction reweights their tokens
        advantages = advantages * rollout_correction(batch, cfg).to(advantages.dtype)
    if settings.old_logps_from_update and not is_on_policy(cfg):
        raise ValueError("old_logps_from_update needs an update of one optimizer step (is_on_policy): "
                         f"schedule={cfg.schedule!r}, epochs={cfg.epochs}, minibatches={cfg.minibatches}")
    stats = UpdateStats(logp_old=torch.zeros_like(batch.logp_old) if settings.old_logps_from_update else None)
    if cfg.schedule == "simultaneous":  # every turn at once, weights = A
        steps = GradientSteps(policy, optimizer, batch, cfg, settings, stats, cfg.epochs, cfg.minibatches)
        steps(torch.ones_like(batch.valid), advantages)
        return stats
    steps = GradientSteps(policy, optimizer, batch, cfg, settings, stats, *steps_per_turn(cfg, num_turns(batch)))
    blocker = fusion_blocker(policy, batch, cfg, settings)
    if M_FACTORS.get(cfg.m_factor).uses_ratio:  # else there is no ratio pass to fuse
        stats.fused_ratio_passes, stats.fusion_blocker = blocker is None, blocker
    if blocker is None:  # the same sweep, each turn's ratio read in the next turn's first optimizer step
        order = turn_order(cfg, num_turns(batch), settings.generator)
        factor = torch.ones(batch.num_trajectories, dtype=advantages.dtype, device=advantages.device)
        for i, t in enumerate(order):  # F[traj] <- m_factor(F, ratio of turn order[i-1]); update turn t with A * F
            factor = steps.fused(batch.turn == t, advantages, factor, batch.turn == order[i - 1] if i > 0 else None)
        stats.turn_order, stats.factor = order, factor
    else:
        # the sweep's ratio passes score through the execution's scorer (each row on its owner process)
        stats.turn_order, stats.factor = sequential_sweep(steps.scorer, batch, advantages, cfg, steps, settings.generator)
    return stats
