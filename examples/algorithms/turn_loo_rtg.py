"""A per-turn estimator that is **unbiased**: the return-to-go with a leave-one-out baseline per turn.

A teaching example, not a published algorithm: the fix of :mod:`turn_mean_rtg`. Each turn gets
the reward still to come, undivided, minus the mean of the same quantity over the *other*
trajectories of its group that are still running at that turn (RLOO's baseline, Kool et al.
2019, taken per turn)::

    G_{i,t} = r_{i,t} + r_{i,t+1} + ... + r_{i,end}
    A_{i,t} = G_{i,t} - mean_{j != i, j running at t} G_{j,t}      (0 baseline when no other runs)

The baseline is built from the group-mates alone, which are independent of trajectory ``i``'s own
actions, so it adds nothing to the expected update; the rewards before turn ``t`` are left out,
which removes only terms of zero mean. In exact arithmetic the expected update of every turn is
the policy gradient of that turn (a factor of 1), so plain exact ascent with it climbs to ``J*``
(tests/tabular/test_gradient.py; docs/tutorial.md, the agentic chapter).

Exact mode: a symmetric function of its group's outcomes (per-turn rewards, valid masks),
counting every member once.

Use: ``seeupo check turn_loo_rtg --plugin examples/algorithms/turn_loo_rtg.py``.
"""

from __future__ import annotations

from typing import Any

import torch

from seeupo.core.advantages import broadcast_to_tokens
from seeupo.core.batch import segment_sum
from seeupo.core.config import preset, register_preset
from seeupo.core.registry import register_adv_est


def returns_to_go(batch: Any) -> torch.Tensor:
    """Per row: the reward from its turn to the end of its trajectory."""
    num_turns = int(batch.turn.max().item()) + 1
    reward = torch.zeros(batch.num_trajectories, num_turns, dtype=batch.reward.dtype, device=batch.reward.device)
    reward[batch.traj_id, batch.turn] = batch.reward * batch.valid
    return reward.flip(1).cumsum(1).flip(1)[batch.traj_id, batch.turn]


@register_adv_est("turn_loo_rtg", needs_group_stats=True)
def turn_loo_rtg(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    """Return-to-go minus the mean return-to-go of the other group members running at that turn."""
    to_go = returns_to_go(batch)
    num_turns = int(batch.turn.max().item()) + 1
    cell = batch.group_id * num_turns + batch.turn
    alive = batch.valid.to(to_go.dtype)
    total = segment_sum(to_go * alive, cell, batch.num_groups * num_turns)[cell]
    others = segment_sum(alive, cell, batch.num_groups * num_turns)[cell] - 1
    baseline = torch.where(others > 0, (total - to_go) / others.clamp_min(1), torch.zeros_like(to_go))
    return broadcast_to_tokens((to_go - baseline) * alive, batch)


register_preset(preset("grpo", name="turn_loo_rtg", advantage="turn_loo_rtg", grae_scale="none"))
