"""A user's plugin, as issue 40 (item 5) timed it: GRPO with the group's range ``max - min`` as the scale.

    A_i = (R_i - mean_g R) / (max_g R - min_g R + EPS)

registered with ``needs_group_stats=True`` and no closed form, so exact mode enumerates the
group-mates (:func:`seeupo.tabular.rollout.exact_group_batch`): the slow path a plugin gets when it
reads its group in a way the engine has no sufficient statistics for. It is a benchmark input, not a
published algorithm (hence here, not under ``examples/algorithms/``):

    seeupo scorecard range_grpo --plugin benchmarks/range_grpo.py --no-bridge
"""

from __future__ import annotations

from typing import Any

import torch

from seeupo.core.advantages import broadcast_to_tokens
from seeupo.core.batch import per_trajectory, segment_sum
from seeupo.core.config import preset, register_preset
from seeupo.core.registry import register_adv_est

EPS = 1e-6
"""Added to the range, as the built-in GRPO adds it to the std."""


@register_adv_est("range_grpo", needs_group_stats=True)
def range_grpo(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    """GRPO's mean-centred advantage over the group's range (every member counted once, unweighted)."""
    G = cfg.group_size
    returns = per_trajectory(batch.traj_return, batch)
    group = per_trajectory(batch.group_id, batch)
    if not bool((torch.bincount(group, minlength=batch.num_groups) == G).all()):
        raise ValueError(f"range_grpo: every group must hold exactly group_size={G} trajectories")
    mean = segment_sum(returns, group, batch.num_groups) / G
    top = torch.full((batch.num_groups,), -torch.inf, dtype=returns.dtype).scatter_reduce(0, group, returns, "amax")
    low = torch.full((batch.num_groups,), torch.inf, dtype=returns.dtype).scatter_reduce(0, group, returns, "amin")
    adv = (returns - mean[group]) / (top - low + EPS)[group]
    return broadcast_to_tokens(adv[batch.traj_id], batch)


PRESET = register_preset(preset("grpo", name="range_grpo", advantage="range_grpo"))
