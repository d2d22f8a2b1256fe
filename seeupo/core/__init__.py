"""The algorithm core: batches, advantage estimators, losses, schedules and presets.

Pure torch; shared unchanged by the tabular engine (``seeupo.tabular``) and the
language-model trainer (``seeupo.llm``).
"""

from __future__ import annotations

import importlib
from typing import Any

# Public names, loaded on first use so that light modules (config, presets) do not pay for torch.
_EXPORTS = {
    "seeupo.core.advantages": ["batch_zscore", "gae", "gae_for_batch", "grae", "grae_from_group_stats"],
    "seeupo.core.batch": ["SampleBatch", "per_trajectory", "segment_sum"],
    "seeupo.core.config": ["PRESETS", "AlgorithmConfig", "preset"],
    "seeupo.core.losses": ["aggregate", "clipped_surrogate", "kl_penalty", "policy_objective"],
    "seeupo.core.parallel": ["DataParallel", "score_rows"],
    "seeupo.core.registry": [
        "register_adv_est", "register_aggregation", "register_m_factor", "register_policy_loss", "register_turn_order",
    ],
    "seeupo.core.execution": ["GradientSteps", "Policy", "UpdateSettings", "UpdateStats"],
    "seeupo.core.update": [
        "TurnUpdate", "compute_advantages", "current_factor", "final_factor", "fusion_blocker", "policy_update",
        "sequential_sweep", "turn_order",
    ],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'seeupo.core' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)


def __dir__() -> list[str]:
    return __all__
