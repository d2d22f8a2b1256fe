"""seeupo's advantage estimators and policy losses in verl's registries (verl 0.9.1).

::

    from seeupo.core.config import preset
    from seeupo.integrations.verl import register_in_verl

    exported = register_in_verl(preset("grpo"), layout="trajectory")  # every estimator and loss that can run in verl
    # then, in verl's config: algorithm.adv_estimator=grae  actor_rollout_ref.actor.policy_loss.loss_mode=ppo

Each registered name of :data:`seeupo.core.registry.ADV_ESTIMATORS` and
:data:`~seeupo.core.registry.POLICY_LOSSES` (built-in or from a plugin) becomes an entry of
``verl.trainer.ppo.core_algos.ADV_ESTIMATOR_REGISTRY`` / ``POLICY_LOSS_REGISTRY`` under the
same name (or ``prefix + name``), wrapped in an adapter with verl's signature:

* an estimator gets verl's ``(token_level_rewards, response_mask, index, config, **kwargs)``
  and builds a :class:`~seeupo.core.batch.SampleBatch` of one row per response: its own
  trajectory, turn 0, the group of its prompt (verl's ``uid``), the return
  ``token_level_rewards.sum(-1)``; it returns ``(advantages, advantages)`` as verl's
  critic-free estimators do (``returns`` only train a critic);
* a policy loss gets verl's ``(old_log_prob, log_prob, advantages, response_mask,
  loss_agg_mode, config, rollout_is_weights)`` and returns ``(loss to minimise, metrics)``;
  the aggregation is verl's ``loss_agg_mode`` (:data:`LOSS_AGG_MODES`), normalised by verl's
  ``config.global_batch_info`` so that micro-batches add up as in verl, and refused in one line
  where verl's rows (``layout``) make it another loss than seeupo's on (trajectory, turn) rows
  (:func:`seeupo.integrations.layout.verl_loss_agg_mode`); the clip range is
  ``config.clip_ratio_low/high`` (``clip_ratio`` where unset) and the dual clip
  ``config.clip_ratio_c`` (always on, as in verl's ``vanilla`` loss).

Options verl has no key for (``grae_center``, ``grae_scale``, ``grae_clamp``, ``ratio_level``,
``ratio_scope``, ``length_norm``, and whatever a plugin estimator reads) come from the
:class:`~seeupo.core.config.AlgorithmConfig` passed to :func:`register_in_verl`; its clip,
aggregation, KL and epoch fields are not read (verl's own keys hold them). One verl row is one
sequence, so a sequence ratio is taken over the row's ``response_mask`` tokens whatever
``ratio_scope`` says (a turn's with ``layout="turn"``, the trajectory's with ``"trajectory"``).
SeeUPO's sequential per-turn update is not a loss (verl's actor updates all tokens at once): it
runs as verl's actor worker, :mod:`seeupo.integrations.verl_worker`.

This module needs verl; importing it without verl is a one-line ImportError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

try:
    from verl.trainer.ppo import core_algos as _verl
except ImportError:
    raise ImportError("seeupo.integrations.verl needs verl, which is not installed: pip install 'verl==0.9.1'") from None

import numpy as np
import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.config import AlgorithmConfig
from seeupo.core.boundary import call_aggregation
from seeupo.core.losses import policy_objective, row_coefficients
from seeupo.core.registry import ADV_ESTIMATORS, POLICY_LOSSES, AdvantageEstimator, adv_estimator, aggregation, policy_loss
from seeupo.core.update import compute_advantages
# verl_loss_agg_mode is re-exported: the map of an aggregation and a layout to verl's loss_agg_mode
from seeupo.integrations.layout import VERL_LOSS_AGG_MODES, RowLayout, check_layout, layout_refusal, verl_loss_agg_mode
from seeupo.validation.errors import InputError

Tensor = torch.Tensor

# verl's loss_agg_mode -> (our aggregation, the key of verl's config.global_batch_info holding the
# minibatch's denominator); the formulas are cited in seeupo.integrations.layout
LOSS_AGG_MODES: dict[str, tuple[str, str]] = VERL_LOSS_AGG_MODES

# marks our adapters in verl's registries, so that a second export replaces them (and nothing else)
_MARK = "_seeupo_export"


@dataclass(frozen=True)
class Exported:
    """What :func:`register_in_verl` did.

    adv_estimators, policy_losses: verl name -> seeupo name of each entry now in verl's registry.
    skipped: ``"advantage estimator 'gae'"`` (or ``"policy loss ..."``) -> why it was not exported.
    """

    adv_estimators: dict[str, str]
    policy_losses: dict[str, str]
    skipped: dict[str, str]


def register_in_verl(
    cfg: AlgorithmConfig | None = None,
    *,
    adv_estimators: Iterable[str] | None = None,
    policy_losses: Iterable[str] | None = None,
    prefix: str = "",
    layout: RowLayout | None = None,
) -> Exported:
    """Register seeupo's advantage estimators and policy losses in verl's registries.

    Args:
      cfg: the options of the exported pieces that verl has no key for (see the module
        docstring); ``None``: :class:`AlgorithmConfig`'s defaults. A ``schedule="sequential"``
        configuration is refused: verl's actor has no per-turn update (SeeUPO's worker,
        :mod:`seeupo.integrations.verl_worker`, runs it).
      adv_estimators, policy_losses: seeupo names to export; ``None``: every registered one
        that can run in verl, the others listed in ``skipped`` with the reason. A name given
        explicitly that cannot be exported is a ValueError.
      prefix: the verl name is ``prefix + name``.
      layout: what one verl row is (:mod:`seeupo.integrations.layout`): ``"turn"`` (single-turn
        rollouts) or ``"trajectory"`` (verl's multi-turn agent loop, every assistant turn in one
        response). The losses refuse, in one line at their call, a ``loss_agg_mode`` that is
        another loss than seeupo's in that layout: ``seq-mean-token-mean`` and
        ``seq-mean-token-sum`` need ``"turn"``; ``token-mean`` is exact in both. ``None`` (not
        told): only ``token-mean`` runs.

    A verl name that verl itself (or another package) already registers is never replaced:
    verl's ``register_adv_est`` refuses a second function under a name, and its
    ``register_policy_loss`` would silently replace verl's own loss, so both are skipped (or
    refused, if named) and ``prefix`` gives them another name. An entry of an earlier export is
    replaced, so exporting again picks up a new ``cfg`` or a newly registered plugin.

    Returns:
      :class:`Exported`.
    """
    cfg = _checked(cfg)
    if layout is not None:
        check_layout(layout)
    plan: list[tuple[str, str, str]] = []  # (kind, verl name, seeupo name), registered once all are checked
    skipped: dict[str, str] = {}
    kinds = (
        ("adv", "advantage estimator", ADV_ESTIMATORS.names(), adv_estimators, _verl.ADV_ESTIMATOR_REGISTRY),
        ("loss", "policy loss", POLICY_LOSSES.names(), policy_losses, _verl.POLICY_LOSS_REGISTRY),
    )
    for kind, label, registered, wanted, verl_registry in kinds:
        explicit = wanted is not None
        for name in list(wanted) if explicit else registered:
            if kind == "adv":
                reason = _adv_refusal(adv_estimator(name))
            else:
                policy_loss(name)  # an unknown name: one line listing the registered ones
                reason = None
            verl_name = prefix + name
            existing = verl_registry.get(verl_name)
            if reason is None and existing is not None and not hasattr(existing, _MARK):
                where = f"{getattr(existing, '__module__', '?')}.{getattr(existing, '__qualname__', existing)}"
                reason = f"verl already registers {verl_name!r} ({where}); export it with a prefix"
            if reason is None:
                plan.append((kind, verl_name, name))
            elif explicit:  # nothing is registered yet
                raise ValueError(f"{label} {name!r} cannot be exported to verl: {reason}")
            else:
                skipped[f"{label} {name!r}"] = reason
    exported: dict[str, dict[str, str]] = {"adv": {}, "loss": {}}
    for kind, verl_name, name in plan:
        if kind == "adv":
            # an earlier export of ours is replaced: verl's register_adv_est refuses any second function
            _verl.ADV_ESTIMATOR_REGISTRY.pop(verl_name, None)
            _verl.register_adv_est(verl_name)(verl_adv_estimator(name, cfg))
        else:
            _verl.POLICY_LOSS_REGISTRY.pop(verl_name, None)
            _verl.register_policy_loss(verl_name)(verl_policy_loss(name, cfg, layout=layout))
        exported[kind][verl_name] = name
    return Exported(exported["adv"], exported["loss"], skipped)


def verl_adv_estimator(name: str, cfg: AlgorithmConfig | None = None) -> Callable[..., tuple[Tensor, Tensor]]:
    """The seeupo advantage estimator ``name`` with verl's estimator signature (not registered).

    The adapter's ``index`` (verl's per-response prompt ``uid``) gives the groups; an estimator
    that declares ``needs_group_stats`` needs it, with every group of the same size ``>= 2``
    (that size is the ``group_size`` it runs with). verl's ``config`` (its ``AlgoConfig``) and
    other keyword arguments are not read.
    """
    entry = adv_estimator(name)
    reason = _adv_refusal(entry)
    if reason is not None:
        raise ValueError(f"advantage estimator {name!r} cannot run in verl: {reason}")
    base = _checked(cfg).replace(advantage=name)

    def estimator(
        token_level_rewards: Tensor,
        response_mask: Tensor,
        index: Any = None,
        config: Any = None,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor]:
        mask = response_mask.bool()
        n, device = mask.shape[0], mask.device
        run_cfg = base
        if entry.needs_group_stats:
            if index is None:
                raise ValueError(f"seeupo's {name!r} needs verl's prompt uids (index=...) to form groups")
            group_id, size = _groups(index, device)
            if size < 2:
                raise ValueError(f"seeupo's {name!r} needs at least 2 responses per prompt (verl's rollout.n), got {size}")
            run_cfg = base.replace(group_size=size)
        else:
            group_id = torch.arange(n, device=device)
        returns = token_level_rewards.sum(-1)
        zeros = torch.zeros(n, dtype=torch.long, device=device)
        batch = SampleBatch(
            traj_id=torch.arange(n, device=device),
            group_id=group_id,
            turn=zeros,
            logp_old=torch.zeros_like(token_level_rewards),
            token_mask=mask,
            valid=torch.ones(n, dtype=torch.bool, device=device),
            reward=returns,
            traj_return=returns,
            weight=torch.ones_like(returns),
            instance=zeros,
        )
        with torch.no_grad():
            adv = compute_advantages(batch, run_cfg)
        return adv, adv

    estimator.__doc__ = f"seeupo's advantage estimator {name!r} with verl's signature: {entry.doc}"
    setattr(estimator, _MARK, ("adv", name))
    return estimator


def verl_policy_loss(
    name: str, cfg: AlgorithmConfig | None = None, *, layout: RowLayout | None = None
) -> Callable[..., tuple[Tensor, dict[str, Any]]]:
    """The seeupo policy loss ``name`` with verl's policy-loss signature (not registered).

    ``layout``: what one verl row is, as in :func:`register_in_verl`; a ``loss_agg_mode`` that
    is not seeupo's aggregation in that layout is a one-line InputError at the call.

    The loss is the negated :func:`seeupo.core.losses.policy_objective` of one row per response
    (rows without response tokens left out, as verl does). Metrics: ``actor/ppo_kl``, verl's
    ``mean(old_log_prob - log_prob)`` over the response tokens, and ``actor/pg_clipfrac``,
    seeupo's clip fraction (the share of tokens whose ratio lies outside the clip range; verl's
    counts only those where the clipped term is the one taken). verl's rollout-correction
    weights (``rollout_is_weights``) are refused: seeupo's losses weight rows, not tokens.
    """
    entry = policy_loss(name)
    cfg = _checked(cfg)
    if layout is not None:
        check_layout(layout)

    def loss(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Any]]:
        if config is None:
            raise ValueError(f"seeupo's policy loss {name!r} needs verl's actor config (config=...)")
        if rollout_is_weights is not None:
            raise ValueError(
                f"seeupo's policy loss {name!r} takes no rollout correction weights; disable algorithm.rollout_correction"
            )
        if loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(
                f"loss_agg_mode={loss_agg_mode!r} has no seeupo aggregation; expected one of {tuple(LOSS_AGG_MODES)}"
            )
        agg, den_key = LOSS_AGG_MODES[loss_agg_mode]
        # a mean over verl's rows is seeupo's only where a row is what seeupo's row is (cfg.aggregation_rows)
        reason = layout_refusal(agg, layout, "verl", "loss_agg_mode=token-mean", cfg.aggregation_rows)
        if reason is not None:
            raise InputError("loss_agg_mode", f"{loss_agg_mode!r}: {reason}")
        mask = response_mask.bool()
        n, device = mask.shape[0], mask.device
        zeros = torch.zeros(n, dtype=torch.long, device=device)
        batch = SampleBatch(
            traj_id=torch.arange(n, device=device),
            group_id=zeros,
            turn=zeros,
            logp_old=old_log_prob.detach(),
            token_mask=mask,
            valid=mask.any(1),  # verl leaves fully masked rows out of its sequence counts
            reward=torch.zeros(n, dtype=log_prob.dtype, device=device),
            traj_return=torch.zeros(n, dtype=log_prob.dtype, device=device),
            weight=torch.ones(n, dtype=log_prob.dtype, device=device),
            instance=zeros,
        )
        clip = config.get("clip_ratio", 0.2)
        low, high = config.get("clip_ratio_low", None), config.get("clip_ratio_high", None)
        objective, stats = policy_objective(
            log_prob,
            batch,
            advantages,
            update=name,
            ratio_level=cfg.ratio_level,
            ratio_scope=cfg.ratio_scope,
            length_norm=cfg.length_norm,
            clip_eps_low=float(clip if low is None else low),
            clip_eps_high=float(clip if high is None else high),
            dual_clip=float(config.get("clip_ratio_c", 3.0)),
            aggregation=agg,
            coef=_coefficients(batch, agg, den_key, config.get("global_batch_info", None) or {}),
        )
        with torch.no_grad():
            ppo_kl = torch.where(mask, old_log_prob - log_prob, 0.0).sum() / mask.sum().clamp_min(1)
        return -objective, {"actor/pg_clipfrac": stats["clip_frac"], "actor/ppo_kl": float(ppo_kl)}

    loss.__doc__ = f"seeupo's policy loss {name!r} with verl's signature: {entry.doc}"
    setattr(loss, _MARK, ("loss", name))
    return loss


def _checked(cfg: AlgorithmConfig | None) -> AlgorithmConfig:
    cfg = AlgorithmConfig() if cfg is None else cfg
    if cfg.schedule == "sequential":
        raise ValueError(
            "AlgorithmConfig.schedule='sequential' is not a loss verl's actor can run (it updates every turn at once); "
            "run it with SeeUPO's verl worker (seeupo.integrations.verl_worker, docs/verl.md), or export a "
            "schedule='simultaneous' configuration"
        )
    return cfg


def _adv_refusal(entry: AdvantageEstimator) -> str | None:
    """Why the estimator cannot run in verl, or ``None``."""
    if not entry.lm:
        return "it is registered for the tabular engine only (lm=False)"
    if entry.needs_oracle:
        return "it needs the exact advantages (oracle), which only the tabular engine has"
    if entry.needs_critic:
        return "it needs critic values, which verl passes to its built-in 'gae' only"
    return None


def _groups(index: Any, device: torch.device) -> tuple[Tensor, int]:
    """Dense group ids from verl's per-response uids (in order of first appearance) and the common group size.

    ``index`` is verl's ``uid`` array (strings, dtype object) or any sequence of hashable ids, a
    tensor of ids included.
    """
    dense: dict[Any, int] = {}
    uids = index.tolist() if isinstance(index, (torch.Tensor, np.ndarray)) else list(index)  # tensors hash by identity
    ids = [dense.setdefault(uid, len(dense)) for uid in uids]
    group_id = torch.tensor(ids, dtype=torch.long, device=device)
    sizes = torch.bincount(group_id).unique().tolist()
    if len(sizes) != 1:
        raise ValueError(f"seeupo's group estimators need every prompt to have the same number of responses, got {sizes}")
    return group_id, sizes[0]


def _coefficients(batch: SampleBatch, agg: str, den_key: str, info: dict[str, Any]) -> Tensor:
    """Row coefficients of ``agg`` with verl's global normaliser, as verl's ``agg_loss`` uses it.

    With ``info[den_key]`` (the minibatch's token count or sequence count, summed over the
    data-parallel ranks) the denominator is that number divided by ``dp_size`` (each rank's
    gradient is averaged over the ranks); without it, the micro-batch's own, as verl does.
    """
    dp_size = int(info.get("dp_size") or 1)
    den = info.get(den_key)
    if den is None:
        if dp_size > 1:
            raise ValueError(f"verl's global_batch_info needs {den_key!r} when dp_size={dp_size}")
        return row_coefficients(batch, agg)
    dtype = batch.logp_old.dtype
    n_tokens = (batch.token_mask & batch.valid[:, None]).sum(1).to(dtype)
    per_row, _ = call_aggregation(aggregation(agg), n_tokens, batch.valid.to(dtype))
    return per_row * (dp_size / float(den))
