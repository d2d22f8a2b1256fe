"""Policy losses: REINFORCE, the PPO-style clipped surrogate (token or sequence ratio), the KL term.

All functions take per-token tensors ``[n, L]`` aligned with a :class:`SampleBatch`
and return objectives to **maximise** (the trainer negates the aggregate).

Ratios (docs/method.md §2):

* token level (PPO, GRPO): ``rho_j = pi(y_j | h, y_<j) / pi_old(y_j | h, y_<j)``;
* sequence level (GSPO, Zheng et al. 2025): ``s = exp(mean_j log rho_j)`` when length
  normalised, ``exp(sum_j log rho_j) = pi(a|h) / pi_old(a|h)`` otherwise; the sequence is
  one turn's response (``scope="turn"``) or every assistant token of the trajectory
  (``scope="trajectory"``, which couples the turns in one ratio).

Clipped surrogate (Schulman et al. 2017): ``min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)``,
with the dual clip of Ye et al. 2020 (``max(., c * A)`` for ``A < 0``) as an option.
"""

from __future__ import annotations

from typing import get_args

import torch

from seeupo.core.batch import SampleBatch, per_trajectory, segment_sum
from seeupo.core.boundary import call_aggregation, call_kl_estimator, call_policy_loss
from seeupo.core.config import AggregationRows, AlgorithmConfig, KlPlacement, RatioLevel, RatioScope
from seeupo.core.registry import aggregation as aggregation_entry, kl_estimator as kl_estimator_entry, policy_loss

Tensor = torch.Tensor
# A registered aggregation's name (:data:`seeupo.core.registry.AGGREGATIONS` lists them).
Aggregation = str


def sequence_log_ratio(logp_new: Tensor, logp_old: Tensor, mask: Tensor, *, length_norm: bool) -> Tensor:
    """Per-row ``sum_j (log pi - log pi_old)`` over real tokens, divided by the token count if ``length_norm``."""
    diff = torch.where(mask, logp_new - logp_old, 0.0).sum(1)
    return diff / mask.sum(1).clamp_min(1) if length_norm else diff


def trajectory_log_ratio(
    logp_new: Tensor, logp_old: Tensor, mask: Tensor, traj_id: Tensor, *, length_norm: bool
) -> Tensor:
    """The sequence log-ratio taken over every row of the same trajectory, repeated on each row."""
    n_traj = int(traj_id.max().item()) + 1
    total = segment_sum(torch.where(mask, logp_new - logp_old, 0.0).sum(1), traj_id, n_traj)
    if length_norm:
        total = total / segment_sum(mask.sum(1).to(total.dtype), traj_id, n_traj).clamp_min(1)
    return total[traj_id]


def clipped_surrogate(
    ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float, dual_clip: float | None = None
) -> Tensor:
    """``min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)``, elementwise (to maximise).

    With ``dual_clip = c > 1``, the objective of a negative advantage is floored at ``c * A``.
    """
    obj = torch.minimum(ratio * adv, ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        obj = torch.where(adv < 0, torch.maximum(obj, dual_clip * adv), obj)
    return obj


def kl_penalty(logp: Tensor, logp_ref: Tensor, estimator: str, valid: Tensor | None = None) -> Tensor:
    """Per-token estimates of ``KL(pi || pi_ref)`` by the registered ``estimator`` (built in: Schulman 2020's
    ``k1``, ``k2``, ``k3``, :mod:`seeupo.core.builtins`), checked at the boundary (finite on ``valid`` tokens)."""
    mask = valid if valid is not None else torch.ones_like(logp, dtype=torch.bool)
    return call_kl_estimator(kl_estimator_entry(estimator), logp, logp_ref, mask)


def kl_term(logp: Tensor, batch: SampleBatch, logp_ref: Tensor, cfg: AlgorithmConfig,
            coef: Tensor | None = None) -> Tensor:
    """The KL term of the loss (to minimise; the update multiplies it by ``cfg.kl_coef``): each token's estimate
    (``cfg.kl_estimator``) aggregated as the policy objective is (``coef``: the minibatch's coefficients).

    ``kl_placement="loss"``: the estimates as they are; on policy, in expectation, ``k1``'s gradient is 0,
    ``k2``'s that of one token's ``KL(pi || ref)`` and ``k3``'s that of ``KL(ref || pi)``. ``"loss_is"``: each
    estimate times its token's ratio ``pi / pi_old`` (differentiable), which makes it an estimate of
    ``E_pi[k]`` from samples of ``pi_old``: ``k1`` and ``k3`` then give the gradient of ``KL(pi || ref)``
    (Zhang et al. 2025, RPG, arXiv:2505.17508). ``"reward"``: no loss term (the penalty went into the
    rewards before the advantages, :func:`kl_reward_penalty`); the exact gradients of each placement are
    measured by :mod:`seeupo.tabular.kl`.
    """
    if cfg.kl_placement == "reward":
        return torch.zeros((), dtype=logp.dtype, device=logp.device)
    real = batch.token_mask & batch.valid[:, None]
    estimate = kl_penalty(logp, logp_ref, cfg.kl_estimator, real)
    if cfg.kl_placement == "loss_is":
        estimate = torch.exp(torch.where(real, logp - batch.logp_old, 0.0)) * estimate
    elif cfg.kl_placement != "loss":
        raise ValueError(f"unknown KL placement {cfg.kl_placement!r}; expected one of {get_args(KlPlacement)}")
    return aggregate(estimate, batch, cfg.aggregation, coef, cfg.aggregation_rows)


def kl_reward_penalty(batch: SampleBatch, logp_ref: Tensor, estimator: str) -> Tensor:
    """``[n]``: each row's sum of its real tokens' KL estimates at the sampling policy (``batch.logp_old``), the
    penalty that ``kl_placement="reward"`` subtracts (times ``kl_coef``) from the row's reward: a turn's tokens
    share their turn's penalty (a row is a turn), as a sequence-level KL in the reward does (TRL's RLOO)."""
    real = batch.token_mask & batch.valid[:, None]
    with torch.no_grad():
        estimate = kl_penalty(batch.logp_old, logp_ref, estimator, real)
    return torch.where(real, estimate, 0.0).sum(1)


def with_kl_in_reward(batch: SampleBatch, logp_ref: Tensor, cfg: AlgorithmConfig, gamma: float = 1.0) -> SampleBatch:
    """``batch`` with each row's reward lowered by ``cfg.kl_coef`` times :func:`kl_reward_penalty`, and each
    trajectory's return by the same penalties discounted by ``gamma`` (``kl_placement="reward"``: verl's
    ``use_kl_in_reward``, TRL's RLOO), before the advantages are computed."""
    penalty = cfg.kl_coef * kl_reward_penalty(batch, logp_ref, cfg.kl_estimator).to(batch.reward.dtype)
    discounted = penalty * gamma ** batch.turn.to(penalty.dtype)
    per_traj = segment_sum(discounted, batch.traj_id, batch.num_trajectories)
    return batch.with_updates(reward=batch.reward - penalty, traj_return=batch.traj_return - per_traj[batch.traj_id])


def entropy_of_log_probs(logp: Tensor) -> Tensor:
    """``-sum_v p_v log p_v`` over the last dimension of log-probabilities ``logp``. ``-inf`` is allowed: a choice of
    probability 0 adds 0, and no ``nan`` reaches the gradient (as ``0 * -inf`` would)."""
    finite = torch.where(torch.isfinite(logp), logp, 0.0)
    return -(logp.exp() * finite).sum(-1)


def token_covariance(logp: Tensor, batch: SampleBatch, adv: Tensor) -> Tensor:
    """``[n, L]``: each valid token's centred covariance term ``(A - mean A) (log pi - mean log pi)`` (means over the
    batch's valid tokens, weighted by the rows' weights: 1 sampled, the path's probability in the exact mode; the
    log-probabilities detached), ``-inf`` elsewhere. Its mean is ``Cov(log pi, A)``, whose negative is the first-order
    entropy change of a natural policy-gradient step (Cui et al. 2025, arXiv:2505.22617, Theorem 2; Eq. 10 selects
    tokens by it in Clip-Cov and KL-Cov)."""
    valid = batch.token_mask & batch.valid[:, None]
    weight = (batch.weight * batch.valid)[:, None].expand_as(adv).to(adv.dtype) * valid
    total = weight.sum().clamp_min(torch.finfo(adv.dtype).tiny)
    detached = torch.where(valid, logp.detach(), 0.0)
    mean_a, mean_l = (weight * adv).sum() / total, (weight * detached).sum() / total
    return torch.where(valid, (adv - mean_a) * (detached - mean_l), -torch.inf)


def row_coefficients(batch: SampleBatch, mode: Aggregation, rows: AggregationRows = "turn") -> Tensor:
    """Per-row coefficients ``c`` with ``aggregate(values) = sum_i c_i * sum_j values[i, j]`` (real tokens).

    Computed once on a whole minibatch, the coefficients carry its normalisers (token count,
    row count, per instance), so that the minibatch may be processed as several micro-batches
    whose objectives add up *exactly* to the one-pass objective (gradient accumulation).

    * ``token_mean``: ``c_i = w_i / sum_k w_k n_k`` (``n_k`` real tokens of row ``k``);
    * ``seq_mean_token_mean``: ``c_i = w_i / (n_i sum_k w_k)``;
    * ``seq_mean_token_sum``: ``c_i = w_i / sum_k w_k``;

    sums over the valid rows ``k`` of the same instance; ``c_i = 0`` on placeholders. Other
    registered aggregations (:func:`seeupo.core.registry.register_aggregation`) give their own
    ``(per_row, den_terms)``.

    ``rows="trajectory"`` aggregates as if each trajectory were one row holding every turn's tokens
    (verl's multi-turn agent loop lays out its batch so): the aggregation receives each trajectory's
    token count and weight, and its coefficient goes to every row of the trajectory, which is exact
    because a trajectory's sum of token values is the sum of its rows' sums. ``token_mean`` is the
    same under both layouts; the per-sequence modes are not once trajectories differ in tokens.
    """
    real = batch.token_mask & batch.valid[:, None]
    dtype = batch.logp_old.dtype
    n_tokens = real.sum(1).to(dtype)
    w = batch.weight.to(dtype) * batch.valid.to(dtype)
    if rows == "turn":
        per_row, den_terms = call_aggregation(aggregation_entry(mode), n_tokens, w)
        den = segment_sum(den_terms, batch.instance, batch.num_instances).clamp_min(torch.finfo(dtype).tiny)
        return per_row / den[batch.instance]
    if rows != "trajectory":
        raise ValueError(f"unknown aggregation rows {rows!r}; expected one of {get_args(AggregationRows)}")
    n_traj = batch.num_trajectories
    traj_tokens = segment_sum(n_tokens, batch.traj_id, n_traj)
    valid = batch.valid  # a trajectory's valid rows share its weight
    traj_weight = torch.zeros(n_traj, dtype=dtype, device=w.device).index_copy_(0, batch.traj_id[valid], w[valid])
    traj_instance = per_trajectory(batch.instance, batch)
    per_traj, den_terms = call_aggregation(aggregation_entry(mode), traj_tokens, traj_weight)
    den = segment_sum(den_terms, traj_instance, batch.num_instances).clamp_min(torch.finfo(dtype).tiny)
    return (per_traj / den[traj_instance])[batch.traj_id] * batch.valid.to(dtype)


def aggregate(values: Tensor, batch: SampleBatch, mode: Aggregation, coef: Tensor | None = None,
              rows: AggregationRows = "turn") -> Tensor:
    """Reduce ``[n, L]`` per-token values to a scalar: a weighted mean per instance, summed over instances.

    * ``token_mean``: every real token of every valid row counts once (times its row weight);
    * ``seq_mean_token_mean``: mean over tokens within a row, then mean over rows;
    * ``seq_mean_token_sum``: sum over tokens within a row, then mean over rows.

    Placeholder rows and padding tokens are left out of numerators and denominators.
    Summing (not averaging) over instances keeps each instance's gradient independent of
    how many instances share the call. ``coef`` (from :func:`row_coefficients` of the
    enclosing minibatch) replaces the normalisers of ``batch`` itself: pass it when ``batch``
    is a micro-batch. ``rows``: one row per (trajectory, turn) or per trajectory (:func:`row_coefficients`).
    """
    if coef is None:
        coef = row_coefficients(batch, mode, rows)
    real = batch.token_mask & batch.valid[:, None]
    row = torch.where(real, values, 0.0).sum(1)  # padding may hold anything, even -inf
    return (coef.to(values.dtype) * row).sum()


def ppo_surrogate(logp_new: Tensor, batch: SampleBatch, adv: Tensor, cfg: AlgorithmConfig) -> tuple[Tensor, Tensor]:
    """The clipped surrogate per token and which tokens' ratios were clipped (the ``"ppo"`` policy loss).

    Token ratio, or one ratio per sequence (a turn's response or the whole trajectory) applied
    to the mean of the sequence's token advantages. Placeholders and padding get ratio 1. Reads
    ``cfg``'s ``ratio_level``, ``ratio_scope``, ``length_norm``, ``clip_eps_low``, ``clip_eps_high``
    and ``dual_clip``.
    """
    mask = batch.token_mask & batch.valid[:, None]
    if cfg.ratio_level == "token":
        log_ratio = logp_new - batch.logp_old
        token_adv = adv
    elif cfg.ratio_level == "sequence":
        if cfg.ratio_scope == "turn":
            row_log_ratio = sequence_log_ratio(logp_new, batch.logp_old, mask, length_norm=cfg.length_norm)
        elif cfg.ratio_scope == "trajectory":
            row_log_ratio = trajectory_log_ratio(
                logp_new, batch.logp_old, mask, batch.traj_id, length_norm=cfg.length_norm
            )
        else:
            raise ValueError(f"unknown ratio scope {cfg.ratio_scope!r}; expected one of {get_args(RatioScope)}")
        log_ratio = row_log_ratio[:, None].expand_as(logp_new)
        # one advantage per sequence: the mean of its tokens' advantages
        row_adv = (adv * mask).sum(1) / mask.sum(1).clamp_min(1)
        token_adv = row_adv[:, None].expand_as(adv)
    else:
        raise ValueError(f"unknown ratio level {cfg.ratio_level!r}; expected one of {get_args(RatioLevel)}")
    # placeholders and padding: ratio 1, no gradient
    log_ratio = torch.where(mask, log_ratio, torch.zeros_like(log_ratio))
    ratio = torch.exp(log_ratio)
    obj = clipped_surrogate(ratio, token_adv, cfg.clip_eps_low, cfg.clip_eps_high, cfg.dual_clip)
    with torch.no_grad():
        clipped = (ratio < 1.0 - cfg.clip_eps_low) | (ratio > 1.0 + cfg.clip_eps_high)
    return obj, clipped


def policy_objective(
    logp_new: Tensor,
    batch: SampleBatch,
    adv: Tensor,
    cfg: AlgorithmConfig | None = None,
    *,
    coef: Tensor | None = None,
    token_coef: Tensor | None = None,
    **settings: object,
) -> tuple[Tensor, dict[str, float]]:
    """The per-batch policy objective (to maximise) and diagnostics.

    Args:
      logp_new: ``[n, L]`` differentiable log-probabilities of the batch's tokens under the policy being optimised.
      batch: the rows; ``batch.logp_old`` is the sampling policy.
      adv: ``[n, L]`` the advantage (or, in a sequential update, the HAML weight ``M``) per token.
      cfg: the algorithm; the registered policy loss ``cfg.update`` (``"reinforce"``: ``log pi * A``,
        whose gradient is the policy gradient; ``"ppo"``: the clipped surrogate) reads its settings
        (``ratio_level``, ``clip_eps_low``, ...) from it, and ``cfg.aggregation`` reduces the tokens.
      settings: :class:`~seeupo.core.config.AlgorithmConfig` fields replacing ``cfg``'s (or the default
        configuration's when ``cfg`` is ``None``): ``policy_objective(logp, batch, adv, update="ppo",
        ratio_level="sequence")``. The configuration is the one place these settings are spelled.
      coef, token_coef: :func:`row_coefficients` of the enclosing minibatch for ``cfg.aggregation``
        and for ``"token_mean"`` (the clip fraction), when ``batch`` is a micro-batch of it.

    Returns:
      ``(objective, stats)``; ``stats["clip_frac"]`` is the weighted share of tokens whose ratio was
      clipped (averaged over instances); ``stats["clipped_mass"]`` is the same before dividing by
      the number of instances, which micro-batches of one minibatch add up.
    """
    if cfg is None or settings:
        cfg = (cfg or AlgorithmConfig()).replace(**settings)
    obj, clipped = call_policy_loss(policy_loss(cfg.update), logp_new, batch, adv, cfg)
    if clipped is None:
        return aggregate(obj, batch, cfg.aggregation, coef, cfg.aggregation_rows), {"clip_frac": 0.0, "clipped_mass": 0.0}
    with torch.no_grad():
        clipped_mass = float(aggregate(clipped.to(logp_new.dtype), batch, "token_mean", token_coef))
    stats = {"clip_frac": clipped_mass / max(batch.num_instances, 1), "clipped_mass": clipped_mass}
    return aggregate(obj, batch, cfg.aggregation, coef, cfg.aggregation_rows), stats
