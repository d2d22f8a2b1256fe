"""The sample batch shared by the tabular and the language-model layers.

One row per (trajectory, turn). The algorithm code only ever sees this batch and
tensors of log-probabilities; it never sees a model or a problem.

Identifiers are what make the algorithm robust to re-ordering: advantages and
the sequential-update factor ``M`` are keyed by ``traj_id``, never by row
position (docs/method.md §5, the reference code's misaligned ``M``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

Tensor = torch.Tensor


@dataclass
class SampleBatch:
    """Rows of (trajectory, turn) samples.

    Attributes:
      traj_id: ``[n]`` long, dense ids ``0..n_traj-1``; every row of a trajectory shares it.
      group_id: ``[n]`` long, dense ids ``0..n_groups-1``; trajectories from the same initial
        state ``s0`` (one task's ``G`` rollouts) share it. Groups never span instances.
      turn: ``[n]`` long, 0-based turn index of the row within its trajectory.
      logp_old: ``[n, L]`` per-token log-probabilities under the sampling policy
        (``L = 1`` for atomic tabular actions).
      token_mask: ``[n, L]`` bool, which token slots are real.
      valid: ``[n]`` bool; ``False`` marks a placeholder for a turn after the episode
        ended. Placeholders have no gradient, a ratio of 1, and are left out of every
        mean (unlike the reference code, docs/method.md §5).
      reward: ``[n]`` reward received at this turn.
      traj_return: ``[n]`` the trajectory's (discounted) total return, repeated on each row.
      weight: ``[n]`` row weight. 1 for sampled rows; in exact mode the probability of
        the trajectory (times the probability of the rest of its group, for GRAE).
      instance: ``[n]`` long; which problem instance the row belongs to, so that many
        independent problems can be updated in one batched call. Always 0 for LLM runs.
      data: layer-specific payload, indexed like the rows (tabular: ``hist``, ``action``;
        LLM: token ids). The algorithm core never reads it; policies do.
      owner: ``[n]`` long or ``None``; with data parallelism (:mod:`seeupo.core.parallel`), the
        process that holds the row's payload and runs it through the model. Every process
        holds every row's metadata (ids, rewards, masks, ``logp_old``); only the owner's
        ``data`` is meaningful. ``None`` in a single process.
      logp_behaviour: ``[n, L]`` or ``None``; the log-probabilities of the tokens under the policy
        that generated them (the behaviour policy ``mu``: a stale policy, an inference engine's
        truncated sampler), where it differs from the policy ``logp_old`` scores. ``None``: the
        rows were sampled from ``logp_old``'s policy (on policy). A rollout correction
        (``AlgorithmConfig.correction``, :func:`seeupo.core.update.rollout_correction`) reads it.
    """

    traj_id: Tensor
    group_id: Tensor
    turn: Tensor
    logp_old: Tensor
    token_mask: Tensor
    valid: Tensor
    reward: Tensor
    traj_return: Tensor
    weight: Tensor
    instance: Tensor
    data: dict[str, Tensor] = field(default_factory=dict)
    owner: Tensor | None = None
    logp_behaviour: Tensor | None = None

    def __post_init__(self) -> None:
        n = self.traj_id.shape[0]
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            tensors = value.values() if isinstance(value, dict) else [] if value is None else [value]
            for tensor in tensors:
                if tensor.shape[0] != n:
                    raise ValueError(f"SampleBatch.{f.name} has {tensor.shape[0]} rows, expected {n}")
        if self.logp_old.shape != self.token_mask.shape:
            raise ValueError("SampleBatch.logp_old and token_mask must have the same shape [n, L]")
        if self.logp_behaviour is not None and self.logp_behaviour.shape != self.token_mask.shape:
            raise ValueError("SampleBatch.logp_behaviour and token_mask must have the same shape [n, L]")

    @property
    def num_rows(self) -> int:
        return int(self.traj_id.shape[0])

    @property
    def num_trajectories(self) -> int:
        return int(self.traj_id.max().item()) + 1 if self.num_rows else 0

    @property
    def num_groups(self) -> int:
        return int(self.group_id.max().item()) + 1 if self.num_rows else 0

    @property
    def num_instances(self) -> int:
        return int(self.instance.max().item()) + 1 if self.num_rows else 0

    def select(self, rows: Tensor) -> "SampleBatch":
        """The sub-batch of the given rows (a bool mask or an index tensor). Ids are kept."""
        kwargs = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict):
                kwargs[f.name] = {k: v[rows] for k, v in value.items()}
            elif value is None:
                kwargs[f.name] = None
            else:
                kwargs[f.name] = value[rows]
        return SampleBatch(**kwargs)

    def with_updates(self, **changes: Tensor) -> "SampleBatch":
        return dataclasses.replace(self, **changes)


def per_trajectory(values: Tensor, batch: SampleBatch) -> Tensor:
    """One value per trajectory (``[n_traj]``) from a per-row tensor that is constant within a trajectory."""
    out = torch.zeros(batch.num_trajectories, dtype=values.dtype, device=values.device)
    return out.index_copy_(0, batch.traj_id, values)


def segment_sum(values: Tensor, segment: Tensor, num_segments: int) -> Tensor:
    """``out[k] = sum of values[i] with segment[i] == k`` (leading dimension only)."""
    out = torch.zeros((num_segments,) + tuple(values.shape[1:]), dtype=values.dtype, device=values.device)
    return out.index_add_(0, segment, values)
