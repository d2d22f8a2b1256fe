"""The paper's choices, as the registry's entries (:mod:`seeupo.core.registry`).

Each entry is a thin adapter from the registry's signature to the implementation in
:mod:`seeupo.core.advantages` / :mod:`seeupo.core.losses`, or a few lines of its own (turn
orders, ``M`` factors); the adapters import torch when called, so that registering (and
validating a configuration) stays light. This module imports nothing of the toolkit: the tables
at its end name each function and its entry options, and :mod:`seeupo.core.registry` registers
them before any other entry (a plugin writes the same with the ``register_*`` decorators).
"""

from __future__ import annotations

from typing import Any


# ---- advantage estimators: fn(batch, cfg, *, critic_values, oracle, group_stats) -> [n, L]


def oracle(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    """Exact advantages supplied by the caller (the tabular engine's ``A^pi``), masked to real tokens."""
    return oracle * (batch.token_mask & batch.valid[:, None])


def gae(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    """GAE with a critic (Schulman et al. 2016): ``gae_gamma``, ``gae_lambda``, ``gae_token_level``."""
    from seeupo.core.advantages import gae_for_batch

    return gae_for_batch(batch, critic_values, gamma=cfg.gae_gamma, lam=cfg.gae_lambda, token_level=cfg.gae_token_level)


def grae(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    """Group-relative, critic-free (docs/method.md §2): ``group_size``, ``grae_center``, ``grae_scale``, ``grae_clamp``."""
    from seeupo.core.advantages import grae as grae_impl

    return grae_impl(
        batch, group_size=cfg.group_size, center=cfg.grae_center, scale=cfg.grae_scale, clamp=cfg.grae_clamp,
        group_stats=group_stats,
    )


def reinforce_pp(batch: Any, cfg: Any, *, critic_values: Any = None, oracle: Any = None, group_stats: Any = None) -> Any:
    """REINFORCE++ (Hu 2025): each token's return-to-go (``gae_gamma``), no baseline, whitened over the batch's tokens."""
    from seeupo.core.advantages import reinforce_pp as reinforce_pp_impl

    return reinforce_pp_impl(batch, cfg.gae_gamma)


# ---- policy losses: fn(logp_new, batch, adv, cfg) -> (objective [n, L], clipped [n, L] | None)


def reinforce(logp_new: Any, batch: Any, adv: Any, cfg: Any) -> tuple[Any, Any]:
    """``log pi * A``: its gradient is the policy gradient (one step per batch)."""
    return logp_new * adv, None


def ppo(logp_new: Any, batch: Any, adv: Any, cfg: Any) -> tuple[Any, Any]:
    """The clipped surrogate ("PPU"), token or sequence ratio (``ratio_level``, ``ratio_scope``, ``length_norm``)."""
    from seeupo.core.losses import ppo_surrogate

    return ppo_surrogate(logp_new, batch, adv, cfg)


# ---- aggregations: fn(n_tokens, weight) -> (per_row, den_terms)


def token_mean(n_tokens: Any, weight: Any) -> tuple[Any, Any]:
    """Every real token of every valid row counts once (times its row weight): ``c_i = w_i / sum_k w_k n_k``."""
    return weight, weight * n_tokens


def seq_mean_token_mean(n_tokens: Any, weight: Any) -> tuple[Any, Any]:
    """Mean over tokens within a row, then mean over rows: ``c_i = w_i / (n_i sum_k w_k)``."""
    return weight / n_tokens.clamp_min(1), weight


def seq_mean_token_sum(n_tokens: Any, weight: Any) -> tuple[Any, Any]:
    """Sum over tokens within a row, then mean over rows: ``c_i = w_i / sum_k w_k``."""
    return weight, weight


# ---- turn orders: fn(num_turns, cfg, generator) -> a permutation of 0..num_turns-1


def reverse(num_turns: int, cfg: Any, generator: Any) -> list[int]:
    """Last turn first (SeeUPO): each turn is updated after every later turn."""
    return list(reversed(range(num_turns)))


def forward(num_turns: int, cfg: Any, generator: Any) -> list[int]:
    """First turn first."""
    return list(range(num_turns))


def random(num_turns: int, cfg: Any, generator: Any) -> list[int]:
    """A uniformly random permutation, drawn from the update's generator."""
    import torch

    return torch.randperm(num_turns, generator=generator).tolist()


def custom(num_turns: int, cfg: Any, generator: Any) -> list[int]:
    """``custom_order``, as given."""
    return list(cfg.custom_order or ())


# ---- M factors: fn(factor, ratio, cfg) -> the trajectories' new factor F[traj] after a turn


def no_factor(factor: Any, ratio: Any, cfg: Any) -> Any:
    """No factor: every turn is updated on the plain advantage (``M = A``)."""
    return factor


def happo(factor: Any, ratio: Any, cfg: Any) -> Any:
    """HAPPO's ``F <- F * pi_new(a_t|h_t) / pi_old(a_t|h_t)`` (Zhong et al. 2024; docs/method.md §4)."""
    return factor * ratio.to(factor.dtype)


def clipped(factor: Any, ratio: Any, cfg: Any) -> Any:
    """The reference code's variant: each turn's ratio and the running product clipped to ``m_clip``."""
    return (factor * ratio.clamp(*cfg.m_clip).to(factor.dtype)).clamp(*cfg.m_clip)


# ---- KL estimators: fn(logp, logp_ref) -> [n, L] per-token estimates of KL(pi || pi_ref) from samples of pi
# (Schulman 2020, "Approximating KL divergence"); with log r = logp_ref - logp. Their gradients in expectation,
# on policy: k1 in the loss 0, k2 grad KL(pi || ref) of one token's distribution, k3 grad KL(ref || pi); the
# sequence-level facts are measured by seeupo.tabular.kl.


def k1(logp: Any, logp_ref: Any) -> Any:
    """``log pi - log pi_ref`` (unbiased for the value; verl's ``kl``)."""
    return logp - logp_ref


def k2(logp: Any, logp_ref: Any) -> Any:
    """``(log pi - log pi_ref)^2 / 2`` (verl's ``mse``)."""
    return 0.5 * (logp - logp_ref) ** 2


def k3(logp: Any, logp_ref: Any) -> Any:
    """``r - log r - 1`` with ``r = pi_ref / pi``: unbiased and non-negative (verl's ``low_var_kl``, clamped there)."""
    import torch

    log_r = logp_ref - logp
    return torch.exp(log_r) - log_r - 1.0


# ---- rollout corrections: fn(batch, cfg) -> [n, L] weights >= 0 (seeupo.core.corrections has the formulas)


def no_correction(batch: Any, cfg: Any) -> Any:
    """No correction: the old log-probabilities recomputed, the behaviour policy ignored (weight 1)."""
    import torch

    return torch.ones_like(batch.logp_old)


def token_is(batch: Any, cfg: Any) -> Any:
    """Truncated importance sampling per token, ``min(pi_old / mu, correction_cap)`` (TIS)."""
    from seeupo.core.corrections import token_is as impl

    return impl(batch, cfg.correction_cap)


def sequence_is(batch: Any, cfg: Any) -> Any:
    """The trajectory's importance ratio, truncated at ``correction_cap``."""
    from seeupo.core.corrections import sequence_is as impl

    return impl(batch, cfg.correction_cap)


def geometric_is(batch: Any, cfg: Any) -> Any:
    """The geometric mean of the trajectory's token ratios, truncated at ``correction_cap``."""
    from seeupo.core.corrections import geometric_is as impl

    return impl(batch, cfg.correction_cap)


def token_mask(batch: Any, cfg: Any) -> Any:
    """Tokens whose ratio lies outside ``[correction_floor, correction_cap]`` masked (rejection per token)."""
    from seeupo.core.corrections import token_mask as impl

    return impl(batch, cfg.correction_floor, cfg.correction_cap)


def sequence_mask(batch: Any, cfg: Any) -> Any:
    """Trajectories whose ratio lies outside ``[correction_floor, correction_cap]`` masked (rejection sampling)."""
    from seeupo.core.corrections import sequence_mask as impl

    return impl(batch, cfg.correction_floor, cfg.correction_cap)


def decoupled(batch: Any, cfg: Any) -> Any:
    """Decoupled PPO's behaviour weight ``pi_prox / mu`` per token (``pi_old`` the proximal policy), 0 above ``correction_cap``."""
    from seeupo.core.corrections import decoupled as impl

    return impl(batch, cfg.correction_cap)


def m2po(batch: Any, cfg: Any) -> Any:
    """The tokens of largest ``(log pi_old / mu)^2`` masked until the rest's mean is at most ``m2_tau`` (M2PO)."""
    from seeupo.core.corrections import m2po as impl

    return impl(batch, cfg.m2_tau)


# ---- the entries: (name, function, entry options), registered in this order (the first is each menu's first)

ADV_ESTIMATORS = (
    ("oracle", oracle, dict(needs_oracle=True, lm=False)),
    ("gae", gae, dict(needs_critic=True)),
    ("grae", grae, dict(needs_group_stats=True, group_stats_closed_form=True)),
    ("reinforce_pp", reinforce_pp, dict()),
)
POLICY_LOSSES = (
    ("reinforce", reinforce, dict(surrogate=False)),
    ("ppo", ppo, dict()),
)
AGGREGATIONS = (
    ("token_mean", token_mean, dict()),
    ("seq_mean_token_mean", seq_mean_token_mean, dict()),
    ("seq_mean_token_sum", seq_mean_token_sum, dict()),
)
KL_ESTIMATORS = (
    ("k3", k3, dict()),
    ("k1", k1, dict()),
    ("k2", k2, dict()),
)
ROLLOUT_CORRECTIONS = (
    ("none", no_correction, dict()),
    ("token_is", token_is, dict()),
    ("sequence_is", sequence_is, dict()),
    ("geometric_is", geometric_is, dict()),
    ("token_mask", token_mask, dict()),
    ("sequence_mask", sequence_mask, dict()),
    ("decoupled", decoupled, dict()),
    ("m2po", m2po, dict()),
)
TURN_ORDERS = (
    ("reverse", reverse, dict()),
    ("forward", forward, dict()),
    ("random", random, dict()),
    ("custom", custom, dict()),
)
M_FACTORS = (
    ("none", no_factor, dict(uses_ratio=False)),
    ("happo", happo, dict()),
    ("clipped", clipped, dict()),
)
