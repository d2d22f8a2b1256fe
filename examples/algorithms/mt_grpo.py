"""MT-GRPO as a plugin: turn-level credit from per-turn rewards, on top of GRPO's outcome advantage.

Zeng, Wei, Brown, Frunza, Nevmyvaka, Hong (2025), "Reinforcing Multi-Turn Reasoning in LLM Agents
via Turn-Level Credit Assignment", arXiv:2505.11821.

MT-GRPO (their two-turn tool-use task: a search call, its result, then the answer) normalises three
rewards within the group of ``G`` rollouts (``(r - mean) / (std + 1e-4)``, unbiased std)::

    A^T_i = z(R^T)_i        turn-level reward (did the tool call execute, ...)
    A^O_i = z(R^O)_i        outcome reward (answer, format)
    A^C_i = z(R^T + R^O)_i  the combined reward

and assigns them to tokens as the authors' ``_assign_advantages`` does (SiliangZeng/Multi-Turn-RL-Agent,
``mt_grpo_env_trainer.py``): the tokens before the first tool result get ``A^O_i + lambda A^T_i``
(``turn_advantage_coef`` = 1), every later token ``A^O_i``; an episode with no tool result gets
``A^C_i`` on every token.

Implemented, for ``T`` turns of the tabular engine: a *tool result* is the environment's answer
after a turn that does not end the episode, so the first one follows turn 0 when the episode
continues. The turn reward is that turn's reward, ``R^T_i = r_{i,0}`` for an episode that continued
after turn 0 and 0 for one that stopped there (it made no call); the outcome is the rest of the
return, ``R^O_i = R_i - R^T_i``. Then::

    continued after turn 0:   A_{i,0} = z(R^O)_i + LAMBDA z(R^T)_i,   A_{i,t>0} = z(R^O)_i
    stopped at turn 0:        A_{i,0} = z(R)_i                         (the combined reward)

``z`` over the ``G`` trajectories of the group (unbiased std plus ``EPS``). The ``grae_*`` fields of
the config are not read.

Where it departs, and why:

* the turn reward is the reward the problem pays after turn 0 (an intermediate reward of the
  agentic families); the paper's is a verifier of the tool call. On a sequential bandit
  (``random_token_bandit``: reward only at the end, every episode runs every turn) ``R^T = 0``,
  ``z(R^T) = 0`` and MT-GRPO is GRPO;
* ``EPS`` is the authors' 1e-4.

Before issue 41 this plugin gave every non-final turn its own turn term, on every episode, an
early-stopping episode's final reward included; the authors' rule above replaces it.

Exact mode: ``z`` counts every group member once (unweighted) and reads only the group's
per-turn rewards, returns and valid masks, so the estimator is a symmetric function of the group's
outcomes, which the generic exact mode enumerates. It has no closed form over the group's
``(sum, sum of squares)`` of returns: those carry no per-turn rewards.

Use: the plugin registers the preset ``mt_grpo``, ``preset("grpo", name="mt_grpo", advantage="mt_grpo")``::

    seeupo train run.yaml --plugin examples/algorithms/mt_grpo.py --set algorithm.preset=mt_grpo
"""

from __future__ import annotations

from typing import Any

import torch

from seeupo.core.advantages import broadcast_to_tokens
from seeupo.core.batch import segment_sum
from seeupo.core.config import preset, register_preset
from seeupo.core.registry import register_adv_est

LAMBDA = 1.0
"""The weight of the turn term (the authors' ``turn_advantage_coef``)."""

EPS = 1e-4
"""Added to the group std, as the authors' advantage normalisation does."""


def _z(values: torch.Tensor, group: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Per trajectory, ``(v - mean) / (std + EPS)`` over its group (unbiased std)."""
    ones = torch.ones_like(values)
    count = segment_sum(ones, group, num_groups)
    mean = segment_sum(values, group, num_groups) / count
    centred = values - mean[group]
    std = (segment_sum(centred**2, group, num_groups) / (count - 1).clamp_min(1)).sqrt()
    return centred / (std[group] + EPS)


@register_adv_est("mt_grpo", needs_group_stats=True)
def mt_grpo(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    """MT-GRPO: the authors' assignment of turn, outcome and combined advantages (module docstring)."""
    first = batch.turn == 0
    traj_group = torch.zeros(batch.num_trajectories, dtype=torch.long, device=batch.turn.device)
    traj_group[batch.traj_id[first]] = batch.group_id[first]
    total = torch.zeros(batch.num_trajectories, dtype=batch.reward.dtype, device=batch.reward.device)
    total[batch.traj_id[first]] = batch.traj_return[first]
    turns = segment_sum(batch.valid.to(batch.reward.dtype), batch.traj_id, batch.num_trajectories)
    called = turns > 1  # the episode continued after turn 0: a tool result followed it
    turn_reward = torch.zeros_like(total)
    turn_reward[batch.traj_id[first]] = batch.reward[first]
    turn_reward = torch.where(called, turn_reward, torch.zeros_like(turn_reward))
    z_turn = _z(turn_reward, traj_group, batch.num_groups)
    z_outcome = _z(total - turn_reward, traj_group, batch.num_groups)
    z_combined = _z(total, traj_group, batch.num_groups)
    tid = batch.traj_id
    row = torch.where(called[tid], z_outcome[tid] + LAMBDA * torch.where(batch.turn == 0, z_turn[tid], 0.0),
                      z_combined[tid])
    return broadcast_to_tokens(row, batch)


PRESET = register_preset(preset("grpo", name="mt_grpo", advantage="mt_grpo"))
