"""A per-turn estimator that is **biased**: the mean reward per remaining turn, centred per turn in its group.

A teaching example, not a published algorithm. It is the shape of the turn-level credit that
multi-turn trainers add once per-turn rewards exist: each turn gets the reward still to come, and,
so that long and short episodes are on one scale, that return-to-go is divided by the number of
turns it spans (the mean reward per remaining turn)::

    x_{i,t} = (r_{i,t} + r_{i,t+1} + ... + r_{i,end}) / (turns of trajectory i from t on)
    A_{i,t} = x_{i,t} - mean_j x_{j,t}      over the group's trajectories still running at turn t

The division makes the advantage depend on the trajectory's own length, that is on its own
later actions: an action that continues the episode (and earns more in total) is scored by a
*mean* over more turns, and one that stops is scored by its one reward. Where stopping earns
more per turn but less in total, the expected update of the first turn points away from the
policy gradient; plain exact ascent with it ends at the policy that stops
(``seeupo.tabular.gradient``; the stop-or-continue problem of docs/tutorial.md, the agentic
chapter, computed and asserted in tests/tabular/test_gradient.py). Its fix is
:mod:`turn_loo_rtg`: the same return-to-go, undivided, with a leave-one-out baseline.

Exact mode: the statistics count every group member once and read only the group's per-turn
rewards and valid masks, so the estimator is a symmetric function of its group's outcomes.

Use: ``seeupo check turn_mean_rtg --plugin examples/algorithms/turn_mean_rtg.py``.
"""

from __future__ import annotations

from typing import Any

import torch

from seeupo.core.advantages import broadcast_to_tokens
from seeupo.core.batch import segment_sum
from seeupo.core.config import preset, register_preset
from seeupo.core.registry import register_adv_est


def returns_to_go(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the reward from its turn to the end of its trajectory, and the number of turns that spans."""
    num_turns = int(batch.turn.max().item()) + 1
    reward = torch.zeros(batch.num_trajectories, num_turns, dtype=batch.reward.dtype, device=batch.reward.device)
    alive = torch.zeros_like(reward)
    reward[batch.traj_id, batch.turn] = batch.reward * batch.valid
    alive[batch.traj_id, batch.turn] = batch.valid.to(reward.dtype)
    to_go = reward.flip(1).cumsum(1).flip(1)
    turns_left = alive.flip(1).cumsum(1).flip(1)
    return to_go[batch.traj_id, batch.turn], turns_left[batch.traj_id, batch.turn]


@register_adv_est("turn_mean_rtg", needs_group_stats=True)
def turn_mean_rtg(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    """Mean reward per remaining turn, minus its mean over the group's trajectories running at that turn."""
    to_go, turns_left = returns_to_go(batch)
    x = to_go / turns_left.clamp_min(1)
    num_turns = int(batch.turn.max().item()) + 1
    cell = batch.group_id * num_turns + batch.turn
    alive = batch.valid.to(x.dtype)
    mean = segment_sum(x * alive, cell, batch.num_groups * num_turns) / segment_sum(
        alive, cell, batch.num_groups * num_turns).clamp_min(1)
    return broadcast_to_tokens((x - mean[cell]) * alive, batch)


register_preset(preset("grpo", name="turn_mean_rtg", advantage="turn_mean_rtg", grae_scale="none"))
