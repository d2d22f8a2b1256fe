"""DAPO as a plugin: clip-higher, the token-level loss, and dynamic sampling as an advantage estimator.

Yu, Zhang, Zhu, Yuan, Zuo, Yue, Fan, Liu, Liu, Liu, et al. (2025), "DAPO: An Open-Source LLM
Reinforcement Learning System at Scale", arXiv:2503.14476.

DAPO maximises, for a question with ``G`` sampled responses ``o_i`` of returns ``R_i``::

    J = E[ 1 / sum_i |o_i| * sum_i sum_t min(r_it A_i, clip(r_it, 1 - eps_low, 1 + eps_high) A_i) ]
    s.t. 0 < |{i : o_i correct}| < G,         A_i = (R_i - mean_j R_j) / std_j R_j.

Implemented (the preset ``dapo`` that the plugin registers, :data:`PRESET`):

* clip-higher: ``clip_eps_low=0.2``, ``clip_eps_high=0.28`` (built-in config fields);
* the token-level loss ``1 / sum_i |o_i|``: ``aggregation="token_mean"`` (built in; like verl's
  token-level loss it averages over every token of the batch, not of one group);
* no KL term: ``kl_coef=0``;
* dynamic sampling: the ``"dapo"`` estimator below (always mean-centred and std-scaled: it does
  not read ``grae_center`` or ``grae_clamp``).

Dynamic sampling drops the groups whose returns are all equal (verl's ``filter_groups``) and
samples more until the batch holds ``B`` informative groups. A degenerate group's GRPO advantage
is 0, so its tokens add nothing to the numerator of the token mean; they only enlarge its
denominator. With ``N`` the weighted count of real tokens of an instance's batch and ``N_inf``
that count over its informative groups, the token mean of the *filtered* batch is the token mean
of the whole batch times ``N / N_inf``. Hence the estimator::

    A_i = 1[group of i informative] * (R_i - mean_g R) / (std_g R + eps) * N / N_inf

which, with ``token_mean`` and the clipped surrogate (positively homogeneous in ``A``), gives
*exactly* the objective and gradient of this batch with its degenerate groups filtered out.
Refilling the batch to ``B`` informative groups changes only how many groups are averaged (the
variance, and the finite-batch bias of a ratio of sums): both are token means over informative
groups, with the same infinite-batch limit ``E[sum obj; inf] / E[tokens; inf]``.
In exact mode (weights = probabilities) ``N / N_inf = E[tokens] / E[tokens; informative]``, so the
exact objective is that limit; with fixed-length actions it is ``1 / P(group informative)``.

Not exact with ``minibatches > 1`` (the rescale is the whole batch's, the token mean the
minibatch's; equal in expectation), with another aggregation (then the rescale is not the
filter's), or with ``kl_coef > 0`` (the KL would still average over the dropped groups' tokens).
The clip fraction still counts the dropped groups' tokens (a diagnostic only).

Left out, and why: overlong reward shaping (the soft overlong punishment, a reward ``-1..0`` for
responses longer than ``L_max - L_cache`` tokens) and overlong filtering (masking truncated
responses). Both depend on response lengths near the generation limit: on the toy problems every
action has the same few tokens, so the punishment is identically 0 and nothing is truncated; on a
language model it is a term of the environment's reward (and the batch has no "truncated" flag),
and as part of an estimator it would read the lengths of group-mates' responses, which the exact
mode does not provide.

Exact mode: the group statistics count every member once (unweighted), the informative share is
weighted by ``batch.weight``, and the estimator reads only the group's returns: a symmetric
function of the group's outcomes, which the generic exact mode enumerates. It also has a closed
form over each trajectory's ``(group_sum, group_sumsq)`` (``group_stats_closed_form``, the fast
path), for which the engine tracks the sum of squares only under ``grae_scale="group_std"``, as
the preset keeps it; the two exact modes agree (tests/examples/test_algorithms.py).

Use: ``seeupo train run.yaml --plugin examples/algorithms/dapo.py --set algorithm.preset=dapo``;
the trainer keeps a registered preset's own settings (the paper's ``kl_coef=0.002`` and
``clip_eps_high=0.2`` apply to the built-in presets only), but a run config that sets
``algorithm.kl_coef`` or a clip range itself (the bridge demo's sets ``kl_coef: 0.002``) overrides
them: add ``--set algorithm.kl_coef=0`` there. In Python, after :func:`seeupo.plugins.load_plugin`,
``preset("dapo")``.
"""

from __future__ import annotations

from typing import Any

import torch

from seeupo.core.advantages import broadcast_to_tokens, grae_from_group_stats
from seeupo.core.batch import per_trajectory, segment_sum
from seeupo.core.config import preset, register_preset
from seeupo.core.registry import register_adv_est

EPS = 1e-6
"""Added to the group std, as the built-in GRPO does."""

DEGENERATE_VAR = 1e-12
"""A group whose return variance is at most this has equal returns (round-off of equal returns stays far below)."""


@register_adv_est("dapo", needs_group_stats=True, group_stats_closed_form=True)
def dapo(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    """DAPO: GRPO's group-std advantage, 0 on groups of equal returns, rescaled as if those groups were filtered out."""
    G = cfg.group_size
    returns = per_trajectory(batch.traj_return, batch)
    if group_stats is None:
        group = per_trajectory(batch.group_id, batch)
        if not bool((torch.bincount(group, minlength=batch.num_groups) == G).all()):
            raise ValueError(f"dapo: every group must hold exactly group_size={G} trajectories")
        # each member counts once, whatever its weight: the group is G rollouts of one task
        group_sum = segment_sum(returns, group, batch.num_groups)[group]
        group_sumsq = segment_sum(returns**2, group, batch.num_groups)[group]
    else:
        if cfg.grae_scale != "group_std":
            raise ValueError("dapo's closed form needs grae_scale='group_std' (the sum of squares of returns); "
                             "or use the generic exact mode, RunConfig(exact_closed_form=False)")
        group_sum, group_sumsq = group_stats
    informative = (group_sumsq - group_sum**2 / G) / (G - 1) > DEGENERATE_VAR
    adv = grae_from_group_stats(returns, group_sum, group_sumsq, G, center="mean", group_std=True, eps=EPS)
    adv = torch.where(informative, adv, torch.zeros_like(adv))

    # N / N_inf per instance: real tokens weighted as token_mean weights them
    tokens = (batch.token_mask & batch.valid[:, None]).sum(1).to(adv.dtype) * batch.weight.to(adv.dtype)
    n_all = segment_sum(tokens, batch.instance, batch.num_instances)
    n_inf = segment_sum(tokens * informative[batch.traj_id], batch.instance, batch.num_instances)
    # no informative group: every advantage is 0 already (and 0 * N / 0 would be nan)
    rescale = torch.where(n_inf > 0, n_all / torch.where(n_inf > 0, n_inf, 1.0), 0.0)
    own = adv[batch.traj_id]
    out = torch.where(informative[batch.traj_id], own * rescale[batch.instance], 0.0)
    # exact mode near a deterministic policy: informative groups of probability ~1e-310, which no run ever draws,
    # make N / N_inf (or its product with a finite advantage) overflow; such a batch has no signal, as if none were
    # drawn (a non-finite advantage, from non-finite rewards, is left as it is: the update skips that step)
    out = torch.where(torch.isfinite(out) | ~torch.isfinite(own), out, 0.0)
    return broadcast_to_tokens(out, batch)


PRESET = register_preset(preset("grpo", name="dapo", advantage="dapo", grae_scale="group_std", clip_eps_low=0.2,
                                clip_eps_high=0.28, aggregation="token_mean", kl_coef=0.0))
