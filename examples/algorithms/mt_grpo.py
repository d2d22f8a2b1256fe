"""MT-GRPO as a plugin: turn-level credit from per-turn rewards, on top of GRPO's outcome advantage.

Zeng, Wei, Brown, Frunza, Nevmyvaka, Hong (2025), "Reinforcing Multi-Turn Reasoning in LLM Agents
via Turn-Level Credit Assignment", arXiv:2505.11821.

MT-GRPO (their two-turn tool-use task: a search call, then the answer) normalises two rewards
within the group separately::

    A^T_i = (R^T_i - mean_j R^T_j) / std_j R^T_j      turn-level reward (did the tool call execute, ...)
    A^O_i = (R^O_i - mean_j R^O_j) / std_j R^O_j      outcome reward (answer, format)

and gives the tokens of the first turn ``A^O_i + lambda A^T_i`` and those of the final (answer)
turn ``A^O_i``, with ``lambda = 1`` (``turn_advantage_coef`` in the authors' code).

Implemented, for ``T`` turns, with the turn reward of turn ``t`` the row's ``batch.reward`` and the
outcome the trajectory's return ``R_i`` (``batch.traj_return``, as GRPO uses)::

    A_{i,t}   = z(R)_i + LAMBDA * z_t(r_t)_i     for t < T - 1
    A_{i,T-1} = z(R)_i

``z`` standardises over the ``G`` trajectories of the group (unbiased std plus ``EPS``: the
built-in GRPO advantage), ``z_t`` over the group's trajectories still running at turn ``t``
(its valid rows); a turn where fewer than two of them run gets no turn term. The ``grae_*``
fields of the config are not read.

Simplified, and why:

* every turn but the last gets its own turn term (the paper has one tool turn before the answer);
* the outcome is the total return, turn rewards included: the batch carries per-turn rewards and
  their sum, not a separate outcome reward;
* "the last turn" is the batch's last turn index ``T - 1``; an episode that ends earlier gets the
  turn term on its own last turn too;
* the authors' fallback (a completion with no tool result gets a combined-reward advantage) has
  no counterpart: every turn here has a reward.

On a sequential bandit (``random_token_bandit``: reward only after the last turn) every turn term
is 0 and MT-GRPO is GRPO; per-turn rewards (``random_tree_mdp(..., per_turn_rewards=True)``) make
them differ.

Exact mode: ``z`` and ``z_t`` count every group member once (unweighted) and read only the group's
per-turn rewards, returns and valid masks, so the estimator is a symmetric function of the group's
outcomes, which the generic exact mode enumerates. It has no closed form over the group's
``(sum, sum of squares)`` of returns: those carry no per-turn rewards.

Use: the plugin registers the preset ``mt_grpo``, ``preset("grpo", name="mt_grpo", advantage="mt_grpo")``::

    seeupo train run.yaml --plugin examples/algorithms/mt_grpo.py --set algorithm.preset=mt_grpo
"""

from __future__ import annotations

from typing import Any

import torch

from seeupo.core.advantages import broadcast_to_tokens, grae
from seeupo.core.batch import segment_sum
from seeupo.core.config import preset, register_preset
from seeupo.core.registry import register_adv_est

LAMBDA = 1.0
"""The weight of the turn term (the paper's ``turn_advantage_coef``)."""

EPS = 1e-6
"""Added to the group std, as the built-in GRPO does."""


@register_adv_est("mt_grpo", needs_group_stats=True)
def mt_grpo(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    """MT-GRPO: GRPO's outcome advantage plus LAMBDA x each non-final turn's reward standardised within its group."""
    outcome = grae(batch, group_size=cfg.group_size, center="mean", scale="group_std", eps=EPS)  # z(R), [n, L]

    # z_t: each valid row's reward standardised among the valid rows of its (group, turn)
    num_turns = int(batch.turn.max().item()) + 1
    cell = batch.group_id * num_turns + batch.turn
    n_cells = batch.num_groups * num_turns
    alive = batch.valid.to(batch.reward.dtype)
    count = segment_sum(alive, cell, n_cells)
    mean = segment_sum(batch.reward * alive, cell, n_cells) / count.clamp_min(1)
    centred = (batch.reward - mean[cell]) * alive
    std = (segment_sum(centred**2, cell, n_cells) / (count - 1).clamp_min(1)).sqrt()
    z_turn = centred / (std[cell] + EPS)
    z_turn = torch.where((count[cell] >= 2) & (batch.turn < num_turns - 1), z_turn, torch.zeros_like(z_turn))
    return outcome + LAMBDA * broadcast_to_tokens(z_turn, batch)


PRESET = register_preset(preset("grpo", name="mt_grpo", advantage="mt_grpo"))
