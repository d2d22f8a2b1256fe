"""The factor ``F`` of HAML's weights ``M_t = A * F[traj]``: a turn's ratio and the registered M-factor rule.

Both the algorithm (:func:`seeupo.core.update.sequential_sweep`) and its execution
(:mod:`seeupo.core.execution`, where the ratio is read inside the next turn's first optimizer step)
advance ``F`` with these two functions, so the rule has one definition.
"""

from __future__ import annotations

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.boundary import call_m_factor
from seeupo.core.config import AlgorithmConfig
from seeupo.core.losses import sequence_log_ratio
from seeupo.core.registry import M_FACTORS

Tensor = torch.Tensor


def ratio_from_logps(turn_batch: SampleBatch, logp: Tensor, cfg: AlgorithmConfig) -> Tensor:
    """Per-row ``pi_new / pi_old`` of one turn's rows from their log-probabilities ``logp`` (1 on placeholders)."""
    mask = turn_batch.token_mask & turn_batch.valid[:, None]
    log_ratio = sequence_log_ratio(logp, turn_batch.logp_old, mask, length_norm=cfg.m_length_norm)
    return torch.where(turn_batch.valid, log_ratio.exp(), torch.ones_like(log_ratio))


def apply_m_factor(factor: Tensor, turn_batch: SampleBatch, ratio: Tensor, cfg: AlgorithmConfig) -> Tensor:
    """``factor`` with ``F[traj] <- m_factor(F[traj], ratio)`` on ``turn_batch``'s trajectories (a new tensor)."""
    traj = turn_batch.traj_id
    factor = factor.clone()
    factor[traj] = call_m_factor(M_FACTORS.get(cfg.m_factor), factor[traj], ratio.to(factor.dtype), cfg)
    return factor
