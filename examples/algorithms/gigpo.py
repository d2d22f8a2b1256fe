"""GiGPO as a plugin: GRPO's episode advantage plus a step advantage within "anchor state" groups.

Feng, Xue, Liu, An (2025), "Group-in-Group Policy Optimization for LLM Agent Training",
arXiv:2505.10978.

GiGPO (critic-free, for multi-turn agents) gives step ``t`` of trajectory ``i`` of a group of ``G``
rollouts of one task two advantages and adds them::

    A^E_i     = (R_i - mean_j R_j) / F_norm(R)                  episode level: GRPO over the group
    A^S_{i,t} = (G_{i,t} - mean_S G) / F_norm(G_S)              step level, over the step group S
    A_{i,t}   = A^E_i + OMEGA * A^S_{i,t}                        OMEGA = 1 (the paper's default)

with ``F_norm = 1`` (the authors' ``mode="mean_norm"``, the default of ``compute_gigpo_outcome_advantage``
and of ``algorithm.gigpo.mode`` in verl-agent's ``ppo_trainer.yaml``: registered here as ``gigpo``) or
``F_norm = std + 1e-6`` (``mode="mean_std_norm"``, which some of the authors' scripts set, e.g.
``run_alfworld.sh``: registered as ``gigpo_std``).

where ``G_{i,t} = sum_{k >= t} GAMMA^(k-t) r_{i,k}`` is the discounted return-to-go and the step
group ``S`` of ``(i, t)`` holds every step of the group's trajectories, at any turn, whose
environment state is identical to that of ``(i, t)`` (an "anchor state").

Implemented, on the tabular engine's batches:

* episode level: the built-in group-relative advantage of ``batch.traj_return``: mean-centred
  (``gigpo``) or GRPO's (``gigpo_std``: unbiased std plus ``EPS``);
* anchor key: ``(group_id, turn, batch.data["hist"])``. In a tree MDP the history index of a turn
  (the initial state, then every action and observation so far) is the agent's whole view and the
  environment's whole state, so two steps are at "the same state" exactly when they share it; the
  turn is part of the key because history indices are numbered within their turn (and a history
  of turn ``t`` is never that of another turn). The paper groups identical observations (the
  text an LLM agent sees, which holds the state); a tree MDP's per-turn observation ``o_t`` is
  only the last piece of its history, and two histories ending in the same ``o_t`` are different
  states to the tabular policy, which conditions on the whole history. At turn 0 every
  member of a group shares its initial state, so the first step group is the whole group;
* step level: ``G_{i,t}`` from the rows' per-turn rewards ``batch.reward`` with ``GAMMA`` (below),
  centred within its step group among valid rows (``gigpo_std``: and divided by its unbiased std
  plus ``EPS``); a step group of one member gets 0 (nothing to compare it with), as the authors'
  ``step_norm_reward``. The ``grae_*`` and ``gae_gamma`` fields of the config are not read.

Simplified, and why:

* ``OMEGA`` and ``GAMMA`` are module constants (the paper's ``omega = 1``; ``GAMMA`` below), not config fields: the
  config has no fields for them and a plugin cannot add any;
* the authors' episode statistics are taken over step rows (``compute_mean_std_cross_steps=True``:
  a trajectory counts once per step, so longer ones weigh more); here each trajectory counts once,
  as the paper's Eq. 3 writes it;
* the authors group steps by the observation text (``anchor_obs``) across turns; here by history
  (above): a tree MDP's observation is not the agent's state;
* the episode return is ``batch.traj_return`` (discounted by the problem's own ``gamma``, 1 on the
  stock problems), the step returns use ``GAMMA``: the two levels are computed as the paper writes
  them, from the quantities the batch carries.

Language models: a language-model batch carries no ``hist`` (the trainer does not detect repeated
states), so the estimator is registered with ``lm=False`` (``seeupo train``, the verl export and
the bridge part of ``seeupo check`` refuse it in one line: use ``--no-bridge``) and raises a ``ValueError`` naming the missing ``batch.data["hist"]`` if it
is called on such a batch anyway.

Exact mode: the estimator declares ``reads_histories=True``. GiGPO's step groups read the
group-mates' histories, i.e. the states they passed through, so the generic exact mode must tell
group-mates apart by their whole path (histories, rewards, ends), not only by their rewards and
ends (:func:`seeupo.tabular.rollout.exact_group_batch`): more classes, more rows, and the exact
batch is the expectation of the sampled advantage (tests/examples/test_algorithms.py compares the
two). The contract check (:func:`seeupo.core.contract.exact_mode_refusal`) changes the group-mates'
actions and log-probabilities but keeps their histories for such an estimator; an estimator that
reads histories without declaring it is refused for exact mode.

Use: the plugin registers the presets ``gigpo`` (``preset("grpo", name="gigpo", advantage="gigpo")``) and
``gigpo_std`` (``advantage="gigpo_std"``)::

    seeupo check gigpo --plugin examples/algorithms/gigpo.py --quick --no-bridge
"""

from __future__ import annotations

from typing import Any

import torch

from seeupo.core.advantages import broadcast_to_tokens, grae, reward_to_go
from seeupo.core.batch import segment_sum
from seeupo.core.config import preset, register_preset
from seeupo.core.registry import register_adv_est

OMEGA = 1.0
"""The weight of the step advantage (the paper's default)."""

GAMMA = 0.95
"""The discount of the step-level return-to-go: the paper writes ``gamma`` in ``(0, 1]``; 0.95 is, to our
knowledge, the value of the authors' released training scripts (verl-agent's ``algorithm.gamma``; not re-checked
here). ``cfg.gae_gamma`` (GAE's, default 1) is not used: it belongs to another estimator."""

EPS = 1e-6
"""Added to the group std, as the built-in GRPO does."""


def gigpo_advantage(batch: Any, cfg: Any, std_norm: bool) -> Any:
    """GiGPO: the episode advantage plus OMEGA x the discounted return-to-go centred in its step group (each divided by
    its group's std plus EPS when ``std_norm``: the authors' ``mean_std_norm``)."""
    if "hist" not in batch.data:
        raise ValueError("gigpo groups steps by their state, batch.data['hist'], which this batch lacks "
                         "(the tabular engine provides it; a language-model batch does not)")
    episode = grae(batch, group_size=cfg.group_size, center="mean", scale="group_std" if std_norm else "none",
                   eps=EPS)  # A^E, [n, L]

    # step groups: valid rows with the same (group, turn, history), one integer key each
    num_turns = int(batch.turn.max().item()) + 1
    num_hist = int(batch.data["hist"].max().item()) + 1
    key = (batch.group_id * num_turns + batch.turn) * num_hist + batch.data["hist"]
    _, cell = torch.unique(key, return_inverse=True)
    n_cells = int(cell.max().item()) + 1
    to_go = reward_to_go(batch, GAMMA)
    alive = batch.valid.to(to_go.dtype)
    count = segment_sum(alive, cell, n_cells)
    mean = segment_sum(to_go * alive, cell, n_cells) / count.clamp_min(1)
    centred = (to_go - mean[cell]) * alive
    if std_norm:
        std = (segment_sum(centred**2, cell, n_cells) / (count - 1).clamp_min(1)).sqrt()
        centred = centred / (std[cell] + EPS)
    step = torch.where(count[cell] >= 2, centred, torch.zeros_like(centred))
    return episode + OMEGA * broadcast_to_tokens(step, batch)


@register_adv_est("gigpo", needs_group_stats=True, reads_histories=True, lm=False)
def gigpo(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    """GiGPO as its authors' default (``mode="mean_norm"``): no std at either level."""
    return gigpo_advantage(batch, cfg, std_norm=False)


@register_adv_est("gigpo_std", needs_group_stats=True, reads_histories=True, lm=False)
def gigpo_std(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    """GiGPO with ``mode="mean_std_norm"``: each level divided by its group's std plus EPS."""
    return gigpo_advantage(batch, cfg, std_norm=True)


PRESET = register_preset(preset("grpo", name="gigpo", advantage="gigpo"))
STD_PRESET = register_preset(preset("grpo", name="gigpo_std", advantage="gigpo_std"))
