"""Hand-made algorithms whose scores are known in advance (a test plugin, loaded by the scorecard's tests).

* ``exact_pg``: the exact advantage ``Q - V`` of every turn (the tabular engine's oracle) with plain
  policy-gradient steps: its expected update is the policy gradient of every turn.
* ``anti_pg``: the same advantage negated: its expected update is minus the policy gradient.
* ``nan_grpo``: GRPO's advantage divided by the group's std without an epsilon: a group whose
  rewards are all equal gives 0 / 0 (the boundary check refuses it).
* ``range_flip_pg``: ``exact_pg`` where the batch's rewards span exactly [0, 1], ``anti_pg`` elsewhere.
* ``token_bonus_pg``: a fixed bonus for actions whose first token is 0, whatever the rewards.
* ``anti_bonus_pg``: ``anti_pg`` plus a thousandth of that bonus: downhill, and moving where no reward differs.
* ``length_mean_pg``: ``exact_pg`` with each answer's tokens averaged: the policy gradient wherever answers have one
  length, turned away from it where they do not.
* ``exact_pg_sequence_is``: ``exact_pg`` with the trajectory's uncapped importance weight: off policy, the on-policy
  step exactly.
* ``k1_loss_pg``, ``k1_reward_pg``: ``exact_pg`` with a KL term of ``k1`` in the loss (expected gradient 0) or in
  the reward (the trajectory's grad KL).
* ``sharpened_pg``: ``exact_pg`` plus ten times each token's log-probability (down the entropy too).
"""

from __future__ import annotations

from typing import Any

import torch

from seeupo.core.config import preset, register_preset
from seeupo.core.registry import register_adv_est, register_aggregation, register_policy_loss


@register_adv_est("anti_oracle", needs_oracle=True, lm=False)
def anti_oracle(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    return -oracle * (batch.token_mask & batch.valid[:, None])


@register_adv_est("nan_grae", lm=False)
def nan_grae(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    from seeupo.core.advantages import broadcast_to_tokens
    from seeupo.core.batch import segment_sum

    ret = batch.traj_return[batch.traj_id]
    first = batch.turn == 0
    n = segment_sum(first.to(ret.dtype), batch.group_id, batch.num_groups)
    mean = segment_sum(torch.where(first, ret, 0.0), batch.group_id, batch.num_groups) / n
    var = segment_sum(torch.where(first, (ret - mean[batch.group_id]) ** 2, 0.0), batch.group_id, batch.num_groups) / (n - 1)
    return broadcast_to_tokens((ret - mean[batch.group_id]) / var.sqrt()[batch.group_id], batch)


register_preset(preset("rloo", name="exact_pg", advantage="oracle"))
register_preset(preset("rloo", name="anti_pg", advantage="anti_oracle"))
register_preset(preset("grpo", name="nan_grpo", advantage="nan_grae"))


@register_adv_est("range_flip", needs_oracle=True, lm=False)
def range_flip(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    """The exact advantage where the batch's rewards span exactly [0, 1], else its negation: an estimator
    that assumes normalised rewards, so that any shift or scale turns its update around."""
    valid = batch.valid
    lo, hi = float(batch.reward[valid].min()), float(batch.reward[valid].max())
    sign = 1.0 if (lo, hi) == (0.0, 1.0) else -1.0
    return sign * oracle * (batch.token_mask & batch.valid[:, None])


@register_adv_est("first_token_bonus", lm=False)
def first_token_bonus(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    """1 on every token of an action whose first token is 0 (2-token actions of a vocabulary of 2: actions 0 and 1),
    else 0: an update that moves where no reward differs."""
    bonus = (batch.data["action"] < 2).to(batch.reward.dtype)[:, None].expand(batch.token_mask.shape)
    return bonus * (batch.token_mask & batch.valid[:, None])


register_preset(preset("rloo", name="range_flip_pg", advantage="range_flip"))
register_preset(preset("rloo", name="token_bonus_pg", advantage="first_token_bonus"))


@register_adv_est("anti_bonus", needs_oracle=True, lm=False)
def anti_bonus(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    """``anti_oracle`` plus a thousandth of ``first_token_bonus``: downhill wherever rewards differ, and moving
    where they do not."""
    return anti_oracle(batch, cfg, oracle=oracle) + 1e-3 * first_token_bonus(batch, cfg)


register_preset(preset("rloo", name="anti_bonus_pg", advantage="anti_bonus"))


@register_adv_est("shifted_oracle", needs_oracle=True, lm=False)
def shifted_oracle(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    """The exact advantage plus 100: the expected update is still the policy gradient (the score function has mean 0),
    and almost all of a sampled one is noise."""
    return (oracle + 100.0) * (batch.token_mask & batch.valid[:, None])


@register_adv_est("zero_advantage", lm=False)
def zero_advantage(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    """0 everywhere: an update that never moves."""
    return torch.zeros(batch.token_mask.shape, dtype=batch.reward.dtype)


@register_policy_loss("turn0_frozen", surrogate=False)
def turn0_frozen(logp_new: Any, batch: Any, adv: Any, cfg: Any) -> Any:
    """The plain policy-gradient loss on every turn but the first, whose rows weigh 0: turn 0 never learns."""
    keep = (batch.turn != 0).to(logp_new.dtype)
    return logp_new * adv * keep[:, None], None


register_preset(preset("rloo", name="shifted_pg", advantage="shifted_oracle"))
register_preset(preset("rloo", name="frozen_pg", advantage="zero_advantage"))
register_preset(preset("rloo", name="turn0_frozen_pg", advantage="oracle", update="turn0_frozen"))


@register_aggregation("token_mean_per_answer")
def token_mean_per_answer(n_tokens: Any, weight: Any) -> tuple[Any, Any]:
    """Each answer's tokens averaged, then a mean over answers (``seq_mean_token_mean``, re-registered here so that
    the test sees a user's aggregation reach the capability): ``c_i = w_i / (n_i sum_k w_k)``."""
    return weight / n_tokens.clamp_min(1), weight


register_preset(preset("rloo", name="length_mean_pg", advantage="oracle", aggregation="token_mean_per_answer"))

# Off policy: the exact advantage with the trajectory's uncapped importance weight (pi / mu over the whole trajectory)
# recovers the on-policy step exactly; without a correction the rows' law is mu's.
register_preset(preset("rloo", name="exact_pg_sequence_is", advantage="oracle", correction="sequence_is",
                       correction_cap=float("inf")))
# KL: k1 in the loss has expected gradient 0 on policy (Schulman 2020): a KL term that does nothing; k1 in the reward
# gives the trajectory's grad KL(pi || ref).
register_preset(preset("rloo", name="k1_loss_pg", advantage="oracle", kl_coef=0.1, kl_estimator="k1", kl_placement="loss"))
register_preset(preset("rloo", name="k1_reward_pg", advantage="oracle", kl_coef=0.1, kl_estimator="k1",
                       kl_placement="reward"))


@register_adv_est("sharpened_oracle", needs_oracle=True, lm=False)
def sharpened_oracle(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    """The exact advantage plus ten times each token's own log-probability: in expectation the policy gradient plus
    ten times the gradient of minus the entropy, so that every prompt's answers narrow toward its likeliest, right or
    wrong (with prompts sharing parameters, some prompt's right answers become unreachable)."""
    return (oracle + 10 * batch.logp_old) * (batch.token_mask & batch.valid[:, None])


register_preset(preset("rloo", name="sharpened_pg", advantage="sharpened_oracle"))
