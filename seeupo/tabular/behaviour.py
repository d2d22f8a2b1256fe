"""Behaviour policies: what generated the rows when it is not the policy being updated.

An inference engine samples with a temperature, top-k and top-p truncation, or kernels whose numbers differ
from the trainer's; an asynchronous trainer learns from rollouts of a policy some updates old. Either way the
rows come from a behaviour policy ``mu`` and the update reads ``pi_old``'s log-probabilities
(:attr:`seeupo.core.batch.SampleBatch.logp_behaviour`). :func:`behaviour_policy` builds ``mu`` exactly from
``pi`` for a :class:`Sampler`, token by token as an engine samples; a stale ``mu`` is a copy of an earlier
policy (:func:`seeupo.tabular.kl.reference_policy` copies one). The exact engine then weights every path by
``mu``'s probability (:func:`seeupo.tabular.rollout.exact_advantages` with ``behaviour=``), so the expected
update of a correction (:mod:`seeupo.core.corrections`) is computed, not sampled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.config import AlgorithmConfig
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import DTYPE, TreeMDP

Tensor = torch.Tensor


@dataclass(frozen=True)
class Sampler:
    """How an inference engine draws each token from the policy's conditional: divide the logits by
    ``temperature``, keep the ``top_k`` most likely tokens (0: all), then the smallest set of most likely tokens
    whose probability reaches ``top_p`` (vLLM's order), renormalise; ``noise`` adds seeded Gaussian noise of that
    standard deviation to every log-probability first (a stand-in for kernels that compute other numbers)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    noise: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: no truncation), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.noise < 0:
            raise ValueError(f"noise must be >= 0, got {self.noise}")

    @property
    def on_policy(self) -> bool:
        return self.temperature == 1.0 and self.top_k == 0 and self.top_p == 1.0 and self.noise == 0.0


@dataclass(frozen=True)
class Rollouts:
    """Where a run's rows come from, in the words the ecosystem uses: ``staleness``, the updates between the policy
    that drew the rows and the policy they update, fixed (an asynchronous trainer's off-policyness, of which AReaL's
    ``max_head_offpolicyness`` is the bound; the first ``staleness`` updates of a run read the start policy's rows),
    and the inference engine's ``sampler`` (vLLM's ``temperature``, ``top_k``, ``top_p``; ``noise`` for kernels that
    compute other numbers). The default is on policy. A ``top_k`` at least the vocabulary truncates nothing but
    counts as off policy (the setting does not know the vocabulary)."""

    staleness: int = 0
    sampler: Sampler = Sampler()

    def __post_init__(self) -> None:
        if self.staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {self.staleness}")

    @property
    def on_policy(self) -> bool:
        return self.staleness == 0 and self.sampler.on_policy

    @classmethod
    def from_dict(cls, data: dict[str, object] | None) -> "Rollouts":
        """The setting from its ``dataclasses.asdict`` (``None``, as a report written before there was one: on policy)."""
        if not data:
            return cls()
        return cls(int(data.get("staleness", 0)), Sampler(**dict(data.get("sampler") or {})))  # type: ignore[arg-type]

    def run_fields(self) -> dict[str, object]:
        """The :class:`~seeupo.tabular.train.RunConfig` fields that draw a run's rows this way."""
        return {"staleness": self.staleness, "sampler": None if self.sampler.on_policy else self.sampler}

    @classmethod
    def of_run(cls, run: Any) -> "Rollouts":
        """The setting a :class:`~seeupo.tabular.train.RunConfig` draws its rows with (:meth:`run_fields`' inverse)."""
        return cls(run.staleness, run.sampler if run.sampler is not None else Sampler())

    def words(self) -> str:
        """The setting in words: ``"on policy"``, or e.g. ``"rows 1 update stale; engine: temperature 0.7, top-p 0.9"``."""
        if self.on_policy:
            return "on policy"
        s = self.sampler
        parts = [f"rows {self.staleness} update{'s' if self.staleness != 1 else ''} stale"] if self.staleness else []
        engine = ([f"temperature {s.temperature:g}"] if s.temperature != 1.0 else []) + (
            [f"top-k {s.top_k}"] if s.top_k else []) + ([f"top-p {s.top_p:g}"] if s.top_p < 1.0 else []) + (
            [f"per-token noise {s.noise:g} (seed {s.seed})"] if s.noise else [])
        if engine:
            parts.append("engine: " + ", ".join(engine))
        return "; ".join(parts)


def sampled_conditional(log_probs: Tensor, sampler: Sampler, generator: torch.Generator | None = None) -> Tensor:
    """``[..., V]`` log-probabilities of the next token as ``sampler`` draws it from ``log_probs`` (``-inf`` on the
    tokens it never draws)."""
    logits = log_probs
    if sampler.noise > 0:
        noise = torch.randn(log_probs.shape, generator=generator, dtype=log_probs.dtype)
        logits = logits + sampler.noise * noise
    logits = logits / sampler.temperature
    if sampler.top_k and sampler.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampler.top_k, dim=-1).values[..., -1:]
        logits = torch.where(logits >= kth, logits, -torch.inf)
    probs = torch.softmax(logits, dim=-1)
    if sampler.top_p < 1:
        ordered, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(ordered, dim=-1) - ordered  # mass of the more likely tokens
        keep_sorted = before < sampler.top_p  # the most likely token is always kept
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        logits = torch.where(keep, logits, -torch.inf)
    return torch.log_softmax(logits, dim=-1)


def behaviour_policy(problem: TreeMDP, policy: TabularPolicy, sampler: Sampler) -> TabularPolicy:
    """The behaviour policy ``mu`` of ``policy`` drawn through ``sampler``, exactly: an independent, frozen
    policy whose every token conditional is :func:`sampled_conditional` of ``policy``'s."""
    generator = torch.Generator().manual_seed(sampler.seed)
    mu = TabularPolicy(problem)
    with torch.no_grad():
        tables = [[sampled_conditional(table.to(DTYPE), sampler, generator) for table in turn]
                  for turn in policy.token_log_probs()]
    mu.set_token_log_probs(tables)
    mu.requires_grad_(False)
    return mu


def admitted_batch(problem: TreeMDP, policy: TabularPolicy, cfg: AlgorithmConfig, past: list[TabularPolicy] | None,
                   max_age: int) -> tuple[SampleBatch, Tensor]:
    """The exact batch of an asynchronous trainer that admits an episode only if it is at most ``max_age`` updates
    old, where an episode of ``n`` turns took ``n`` updates' time, so it was started (and drawn) ``n`` updates before
    it is read: its rows come from ``past[-n]`` (the start policy, ``past[0]``, when none is that old; ``past=None``:
    every episode from ``policy``, so that only the admission rule acts), and episodes of more than ``max_age`` turns
    are discarded. Returns ``(batch, advantages)`` as :func:`seeupo.tabular.rollout.exact_advantages` does: every
    admitted path weighted by its probability under the policy that drew it, renormalised over the admitted paths
    (the trainer fills its batch with admitted episodes), with ``logp_behaviour`` from that policy.

    A group estimator's episodes start together, drawn by one policy, and the group is read when its longest
    episode has finished: a group is as old as its longest episode, drawn by ``past[-n]`` for that length ``n``, and
    is dropped whole when ``n > max_age`` (the stale-group rule of tinker-cookbook, whose PR #822 observes that it
    favours short episodes). Every group draw is enumerated (:func:`seeupo.tabular.rollout.group_draws`), its
    weight the probability of the whole group under its drawing policy, so that the estimator's group statistics
    are those of the admitted groups."""
    from seeupo.core.registry import adv_estimator

    if max_age < 1:
        raise ValueError(f"max_age must be >= 1 (an episode of one turn is one update old), got {max_age}")
    if adv_estimator(cfg.advantage).needs_group_stats:
        return _admitted_groups(problem, policy, cfg, past, max_age)
    from seeupo.tabular.rollout import batch_advantages, exact_batch

    batch, _ = exact_batch(problem, policy, cfg)  # every path under policy: the rows' tokens and histories
    turns = torch.zeros(batch.num_trajectories, dtype=torch.long).index_add_(0, batch.traj_id, batch.valid.long())
    length = turns[batch.traj_id]
    generators = past if past is not None else [policy]
    with torch.no_grad():
        drawn_by = [g.token_logps(batch) * batch.token_mask for g in generators]
    index = (len(generators) - length).clamp(min=0) if past is not None else torch.zeros_like(length)
    logp_behaviour = torch.stack(drawn_by)[index, torch.arange(batch.num_rows)]
    # the path's probability under its generator over its probability under policy (observations cancel)
    log_ratio = torch.where(batch.valid[:, None], logp_behaviour - batch.logp_old, 0.0).sum(1)
    per_traj = torch.zeros(batch.num_trajectories, dtype=DTYPE).index_add_(0, batch.traj_id, log_ratio)
    weight = batch.weight * torch.exp(per_traj[batch.traj_id]) * (length <= max_age)
    admitted = _renormalised(batch.with_updates(weight=weight, logp_behaviour=logp_behaviour if past is not None else None))
    return admitted, batch_advantages(problem, policy, admitted, cfg)


def _admitted_groups(problem: TreeMDP, policy: TabularPolicy, cfg: AlgorithmConfig,
                     past: list[TabularPolicy] | None, max_age: int) -> tuple[SampleBatch, Tensor]:
    """:func:`admitted_batch` for a group estimator: whole groups, as old as their longest episode."""
    from seeupo.tabular.rollout import batch_advantages, enumerate_paths, group_batch, group_draws

    generators = past if past is not None else [policy]
    with torch.no_grad():
        paths = enumerate_paths(problem, policy.action_probs())
        scored = tuple(enumerate_paths(problem, g.action_probs()) for g in generators)
    inst, path, mates, weight = group_draws(problem, paths, cfg, under=scored)
    length = paths.alive[inst, path].sum(-1)
    if mates.shape[1]:
        length = torch.maximum(length, paths.alive[inst[:, None], mates].sum(-1).amax(1))
    which = (len(generators) - length).clamp(min=0) if past is not None else torch.zeros_like(length)
    drawn = weight[torch.arange(inst.numel()), 1 + which] * (length <= max_age)
    batch = group_batch(problem, policy, paths, inst, path, mates, drawn)
    if past is not None:
        with torch.no_grad():
            drawn_by = torch.stack([g.token_logps(batch) * batch.token_mask for g in generators])
        batch = batch.with_updates(logp_behaviour=drawn_by[which[batch.group_id], torch.arange(batch.num_rows)])
    admitted = _renormalised(batch)
    own = admitted.traj_id < inst.numel()
    return admitted.select(own), batch_advantages(problem, policy, admitted, cfg)[own]


def _renormalised(batch: SampleBatch) -> SampleBatch:
    """``batch`` with its weights summing to 1 per instance over its trajectories (the trainer fills its batch with
    admitted episodes)."""
    total = torch.zeros(batch.num_instances, dtype=DTYPE).index_add_(
        0, batch.instance, torch.where(batch.turn == 0, batch.weight, 0.0))
    return batch.with_updates(weight=batch.weight / total.clamp_min(1e-300)[batch.instance])


def admitted_direction(problem: TreeMDP, policy: TabularPolicy, cfg: AlgorithmConfig,
                       past: list[TabularPolicy] | None, max_age: int) -> list[Tensor]:
    """The expected first step of ``cfg``'s update per turn (``[I, P_t]``) on :func:`admitted_batch`."""
    from seeupo.tabular.gradient import first_step_per_turn

    batch, adv = admitted_batch(problem, policy, cfg, past, max_age)
    return first_step_per_turn(policy, batch, adv, cfg)
