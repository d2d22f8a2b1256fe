"""Data parallelism for :func:`seeupo.core.update.policy_update`: several processes, one update.

The scheme keeps the algorithm *exactly* the single-process one. Every process holds the same
global :class:`~seeupo.core.batch.SampleBatch` of metadata (ids, turns, rewards, masks,
``logp_old``, advantages) and owns some of its rows (``batch.owner``): only the owner holds a
row's payload (token ids) and runs it through the model. Then

* advantages, minibatches, turn orders and the aggregation's normalisers
  (:func:`~seeupo.core.losses.row_coefficients`) are computed from the global batch, identically
  on every process, with no communication: a GRAE group or a batch z-score is never split from
  its statistics, and ``M`` is keyed by the global ``traj_id``;
* each process back-propagates the part of the global loss made of its own rows; the gradient
  reduction across processes must **sum** (FSDP2: ``set_gradient_divide_factor(1.0)``), so the
  summed gradient is the single-process gradient;
* per-row quantities that the algorithm needs everywhere (the ratio factors of ``M``,
  recomputed log-probabilities) are scored by their owners and summed across processes
  (:func:`score_rows`), each row being zero on every process but its owner. The algorithm
  (:mod:`seeupo.core.update`) does not know about processes: the policy it scores its ratios
  with is :class:`OwnerScoring` (:func:`owner_scored`), built by the execution layer
  (:mod:`seeupo.core.execution`) or by the caller that logs ``M``.

Collective operations must be called in the same order and number on every process: the update
therefore pads each process's micro-batches to the largest count with empty ones, and a policy
used with data parallelism must take part in the model's collectives even for an empty batch
(:class:`seeupo.llm.policy.CausalLMPolicy` does, with ``collective=``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from seeupo.core.batch import SampleBatch

Tensor = torch.Tensor


@dataclass(frozen=True)
class DataParallel:
    """This process's place in a data-parallel group (``torch.distributed``, already initialised).

    Attributes:
      rank: this process's index in ``group`` (the ``owner`` value of its rows).
      world_size: the number of processes.
      group: the process group (``None``: the default group).
    """

    rank: int
    world_size: int
    group: Any = None

    def sum(self, tensor: Tensor) -> Tensor:
        """``tensor`` summed over the processes, in place (every process gets the sum)."""
        import torch.distributed as dist

        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor

    def max(self, value: int | float) -> float:
        """The largest ``value`` over the processes."""
        import torch.distributed as dist

        out = torch.tensor([float(value)], dtype=torch.float64, device="cpu")
        dist.all_reduce(out, op=dist.ReduceOp.MAX, group=self.group)
        return float(out.item())


def owned(batch: SampleBatch, dp: DataParallel | None) -> Tensor:
    """``[n]`` bool: the rows this process runs through the model (all of them without ``dp``)."""
    if dp is None or batch.owner is None:
        return torch.ones(batch.num_rows, dtype=torch.bool, device=batch.traj_id.device)
    return batch.owner == dp.rank


def score_rows(score: Callable[[SampleBatch], Tensor], batch: SampleBatch, dp: DataParallel | None) -> Tensor:
    """``score(batch)`` (``[n, ...]`` per-row values, no gradient) of every row, each computed by its owner.

    Each process scores its own rows, writes them into zeros, and the processes sum: every
    process ends with every row's values. Without ``dp`` this is ``score(batch)``.
    """
    if dp is None:
        return score(batch)
    mine = owned(batch, dp)
    local = score(batch.select(mine))
    out = torch.zeros((batch.num_rows,) + tuple(local.shape[1:]), dtype=local.dtype, device=local.device)
    out[mine.to(local.device)] = local
    return dp.sum(out)


class OwnerScoring:
    """``policy`` whose :meth:`token_logps` scores each row of a batch on its owner process (:func:`score_rows`).

    Every process gets every row's log-probabilities, each computed once, by its owner, and without
    gradient: what the algorithm's no-gradient passes (the ratio that enters ``M``) need, so that
    :mod:`seeupo.core.update` scores the global batch as on one process without knowing about
    processes. The gradient steps use ``policy`` itself (each process back-propagates its own rows,
    :mod:`seeupo.core.execution`).
    """

    def __init__(self, policy: Any, dp: DataParallel) -> None:
        self.policy, self.dp = policy, dp

    @property
    def turns_share_parameters(self) -> bool:
        """The wrapped policy's (:class:`seeupo.core.execution.Policy`; absent means ``False``)."""
        return bool(getattr(self.policy, "turns_share_parameters", False))

    def token_logps(self, batch: SampleBatch) -> Tensor:
        """``[n, L]`` log-probabilities of every row of ``batch``, each scored by its owner, summed over the processes."""
        return score_rows(self.policy.token_logps, batch, self.dp)

    def parameters(self) -> Iterable[Tensor]:
        return self.policy.parameters()


def owner_scored(policy: Any, dp: DataParallel | None) -> Any:
    """``policy`` as the algorithm's no-gradient passes score it: itself without ``dp``, else :class:`OwnerScoring`."""
    return policy if dp is None else OwnerScoring(policy, dp)
