"""The algorithm core: batches, advantage estimators, losses, schedules and presets.

Pure torch; shared unchanged by the tabular engine (``seeupo.tabular``) and the
language-model trainer (``seeupo.llm``).
"""

from seeupo.core.advantages import batch_zscore, gae, gae_for_batch, grae, grae_from_group_stats
from seeupo.core.batch import SampleBatch, per_trajectory, segment_sum
from seeupo.core.config import PRESETS, AlgorithmConfig, preset
from seeupo.core.losses import aggregate, clipped_surrogate, kl_penalty, policy_objective
from seeupo.core.update import Policy, compute_advantages, policy_update, sequential_sweep, turn_order

__all__ = [
    "AlgorithmConfig", "PRESETS", "Policy", "SampleBatch", "aggregate", "batch_zscore", "clipped_surrogate",
    "compute_advantages", "gae", "gae_for_batch", "grae", "grae_from_group_stats", "kl_penalty",
    "per_trajectory", "policy_objective", "policy_update", "preset", "segment_sum", "sequential_sweep",
    "turn_order",
]
