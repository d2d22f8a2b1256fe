"""Exact mode's contract with an advantage estimator, checked before any exact cell runs.

The tabular exact mode takes the expectation of a sampled update by calling the estimator on
enumerated, probability-weighted batches (:func:`seeupo.tabular.rollout.exact_advantages`). That
is the expectation only if the estimator satisfies the assumptions listed in
:class:`~seeupo.core.registry.AdvantageEstimator`. :func:`exact_mode_refusal` checks each of them
on small random batches (to 1e-12, in float64) and returns the reason exact mode must refuse the
estimator, or ``None``; the sampled mode runs it either way. Every call goes through the
boundary (:mod:`seeupo.core.boundary`), so a broken estimator is named here in one line before
any cell starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.boundary import (PluginError, call_aggregation, call_estimator, call_m_factor, call_policy_loss,
                                  call_turn_order, label)
from seeupo.core.registry import M_FACTORS, TURN_ORDERS, AdvantageEstimator, adv_estimator, aggregation, policy_loss

Tensor = torch.Tensor
DTYPE = torch.float64
TOL = 1e-12

# the refusals, one per assumption (AdvantageEstimator's docstring lists them with their checks)
DECLARED = "registered with exact=False"
NOT_DETERMINISTIC = "not deterministic"
NOT_SYMMETRIC = "not symmetric in its group"
READS_MATES = "reads its group-mates' actions, histories or log-probabilities"
WEIGHTS = "does not weight the batch as exact mode does"


class ExactModeRefused(PluginError):
    """Exact mode was asked to run an estimator that :func:`exact_mode_refusal` refuses (one line)."""


def exact_mode_refusal(cfg: Any) -> str | None:
    """Why exact mode must refuse the advantage estimator ``cfg.advantage`` under ``cfg``, or ``None``.

    ``cfg`` is the :class:`~seeupo.core.config.AlgorithmConfig` (the estimator reads its options
    and ``group_size``). The reason is a short phrase (``"not symmetric in its group"``) for
    reports to print as ``exact: refused (REASON)``. Computed once per estimator and configuration
    in a process (a few calls on batches of a few hundred rows). A function that breaks the
    boundary's checks, or raises, raises :class:`~seeupo.core.boundary.PluginError` instead.
    """
    entry = adv_estimator(cfg.advantage)
    key = (entry.fn, cfg)
    if key not in _CACHE:
        _CACHE[key] = DECLARED if not entry.exact else _first_failure(entry, cfg)
    return _CACHE[key]


def require_exact_mode(cfg: Any) -> None:
    """Raise :class:`ExactModeRefused` (one line) when :func:`exact_mode_refusal` refuses ``cfg``'s estimator."""
    reason = exact_mode_refusal(cfg)
    if reason is not None:
        raise ExactModeRefused(f"{label(adv_estimator(cfg.advantage))}: exact: refused ({reason}); "
                               "the sampled mode still runs it")


_CACHE: dict[tuple[Any, Any], str | None] = {}


@dataclass
class Trajectories:
    """Per-trajectory tables of a test batch (``m`` trajectories, ``T`` turns, ``L`` tokens per row)."""

    reward: Tensor  # [m, T]
    alive: Tensor  # [m, T] bool, a prefix of the turns
    hist: Tensor  # [m, T] long, the history (state) of each turn: group-mates share some
    action: Tensor  # [m, T] long
    logp: Tensor  # [m, T, L]
    critic: Tensor  # [m, T, L]
    oracle: Tensor  # [m, T, L]
    group: Tensor  # [m] dense group ids
    instance: Tensor  # [m]
    weight: Tensor  # [m]

    def take(self, idx: Tensor, group: Tensor, weight: Tensor) -> "Trajectories":
        """Trajectories ``idx`` (in that order) with new group ids and weights."""
        return Trajectories(self.reward[idx], self.alive[idx], self.hist[idx], self.action[idx], self.logp[idx],
                            self.critic[idx], self.oracle[idx], group, self.instance[idx], weight)


TOKENS = torch.tensor([[True, True], [True, False]])  # turn 0: two tokens; turn 1: one token and padding


def random_trajectories(group_size: int, generator: torch.Generator, *, groups: int = 4, instances: int = 2) -> Trajectories:
    """``groups`` groups of ``group_size`` trajectories over ``instances`` instances, 2 turns; rewards on the
    levels 0, 1/2, 1 (so that returns tie), some trajectories ending after turn 0."""
    m, turns = groups * group_size, TOKENS.shape[0]
    rand = lambda *shape: torch.rand(*shape, generator=generator, dtype=DTYPE)  # noqa: E731
    alive = torch.ones(m, turns, dtype=torch.bool)
    alive[:, 1] = rand(m) < 0.7
    mask = TOKENS[None].expand(m, -1, -1) & alive[:, :, None]
    return Trajectories(
        reward=torch.randint(0, 3, (m, turns), generator=generator).to(DTYPE) / 2 * alive,
        alive=alive,
        action=torch.randint(0, 4, (m, turns), generator=generator),
        logp=-rand(m, turns, 2) * mask,
        critic=rand(m, turns, 2) * mask,
        oracle=(rand(m, turns, 2) - 0.5) * mask,
        group=torch.arange(groups).repeat_interleave(group_size),
        instance=(torch.arange(groups) % instances).repeat_interleave(group_size),
        weight=torch.ones(m, dtype=DTYPE),
        hist=torch.randint(0, 2, (m, turns), generator=generator),  # two states per turn: step groups form; drawn last
    )


def to_batch(tr: Trajectories) -> tuple[SampleBatch, Tensor, Tensor]:
    """The batch (trajectory-major rows, trajectory ids in table order) and its critic values and oracle."""
    m, turns = tr.reward.shape
    rep = lambda x: x[:, None].expand(m, turns).reshape(-1)  # noqa: E731
    batch = SampleBatch(
        traj_id=rep(torch.arange(m)), group_id=rep(tr.group), turn=torch.arange(turns).repeat(m),
        logp_old=tr.logp.reshape(m * turns, -1), token_mask=TOKENS.repeat(m, 1), valid=tr.alive.reshape(-1),
        reward=tr.reward.reshape(-1), traj_return=rep(tr.reward.sum(1)), weight=rep(tr.weight),
        instance=rep(tr.instance), data={"hist": tr.hist.reshape(-1), "action": tr.action.reshape(-1)},
    )
    return batch, tr.critic.reshape(m * turns, -1), tr.oracle.reshape(m * turns, -1)


def advantages(entry: AdvantageEstimator, cfg: Any, tr: Trajectories) -> Tensor:
    """``[m, T, L]`` the estimator's advantages of the trajectories, through the boundary."""
    batch, critic, oracle = to_batch(tr)
    adv = call_estimator(entry, batch, cfg, critic_values=critic if entry.needs_critic else None,
                         oracle=oracle if entry.needs_oracle else None)
    m, turns = tr.reward.shape
    return torch.where(batch.token_mask & batch.valid[:, None], adv, 0.0).reshape(m, turns, -1)


def _close(a: Tensor, b: Tensor) -> bool:
    return bool(torch.allclose(a.to(DTYPE), b.to(DTYPE), rtol=TOL, atol=TOL))


def _first_failure(entry: AdvantageEstimator, cfg: Any) -> str | None:
    """The first assumption of exact mode that ``entry`` fails on random batches, or ``None``."""
    g = cfg.group_size
    generator = torch.Generator().manual_seed(20231)
    tr = random_trajectories(g, generator)
    m = tr.reward.shape[0]
    base = advantages(entry, cfg, tr)
    if not _close(advantages(entry, cfg, tr), base):  # 1. deterministic
        return NOT_DETERMINISTIC
    for _ in range(3):  # 2. symmetric: permute each group's members (their rows and their ids)
        within = torch.argsort(tr.group.to(DTYPE) + torch.rand(m, generator=generator, dtype=DTYPE))
        if not _close(advantages(entry, cfg, tr.take(within, tr.group, tr.weight)), base[within]):
            return NOT_SYMMETRIC
    if entry.needs_group_stats:  # 3. blind to group-mates' actions, log-probabilities (and histories)
        position = torch.arange(m) % g  # the members at odd positions get other actions and log-probabilities
        mates = (position % 2 == 1)[:, None]
        other = random_trajectories(g, generator)
        # their histories too, unless the estimator declares it reads them (exact mode then classes by them)
        hist = tr.hist if entry.reads_histories else torch.where(mates, other.hist, tr.hist)
        changed = Trajectories(tr.reward, tr.alive, hist, torch.where(mates, other.action, tr.action),
                               torch.where(mates[:, :, None], other.logp * tr.alive[:, :, None], tr.logp),
                               tr.critic, tr.oracle, tr.group, tr.instance, tr.weight)
        own = position % 2 == 0
        if not _close(advantages(entry, cfg, changed)[own], base[own]):
            return READS_MATES
    # 4. weights: each group copied m_g times with weight 1, against one copy per member with that member
    # weighted m_g and its group-mates 0 (exact mode's construction)
    groups = int(tr.group.max()) + 1
    copies = torch.randint(1, 4, (groups,), generator=generator)
    members = [torch.nonzero(tr.group == k).squeeze(1) for k in range(groups)]
    repeated = torch.cat([members[k] for k in range(groups) for _ in range(int(copies[k]))])
    reference = advantages(entry, cfg, tr.take(repeated, torch.arange(repeated.numel()) // g,
                                               torch.ones(repeated.numel(), dtype=DTYPE)))
    first_copy = {}
    for pos, j in enumerate(repeated.tolist()):
        first_copy.setdefault(j, pos)
    idx, own_pos = [], []
    for k in range(groups):
        for r in range(g):
            own_pos.append(len(idx) + r)
            idx += members[k].tolist()
    idx_t = torch.tensor(idx)
    weight = torch.zeros(len(idx), dtype=DTYPE)
    own_t = torch.tensor(own_pos)
    weight[own_t] = copies[tr.group[idx_t[own_t]]].to(DTYPE)
    weighted = advantages(entry, cfg, tr.take(idx_t, torch.arange(len(idx)) // g, weight))
    expected = reference[torch.tensor([first_copy[j] for j in idx_t[own_t].tolist()])]
    if not _close(weighted[own_t], expected):
        return WEIGHTS
    return None


def dry_run(cfg: Any) -> None:
    """Call each user-registered piece of the algorithm ``cfg`` once, through the boundary, on a small random batch.

    ``cfg`` is the :class:`~seeupo.core.config.AlgorithmConfig`. The pieces are those a run of ``cfg``
    calls: the advantage estimator, the policy loss (on advantages of the estimator and a ``logp_new``
    that requires grad, as in an update) and the aggregation; with ``schedule="sequential"`` also the
    turn order and the ``M`` factor (when it reads the ratio). The built-in entries are skipped (the
    test suite checks them). A broken piece raises :class:`~seeupo.core.boundary.PluginError`, the
    one line of the boundary, so that a command can refuse before it creates its output folder or
    loads a model: ``seeupo train`` calls it first. The batch is random, so a function broken only on
    some inputs (a NaN when all returns tie) may pass here and still be stopped by the boundary later.
    """
    generator = torch.Generator().manual_seed(20232)
    estimator, loss, agg = adv_estimator(cfg.advantage), policy_loss(cfg.update), aggregation(cfg.aggregation)
    order, m_factor = TURN_ORDERS.get(cfg.order), M_FACTORS.get(cfg.m_factor)
    sequential = cfg.schedule == "sequential"  # only a sequential update calls a turn order and an M factor
    used = [estimator, loss, agg] + ([order, m_factor] if sequential else [])
    if all(entry.builtin for entry in used):
        return
    batch, critic, oracle = to_batch(random_trajectories(max(2, cfg.group_size), generator))
    if not estimator.builtin or not loss.builtin:
        adv = call_estimator(estimator, batch, cfg, critic_values=critic if estimator.needs_critic else None,
                             oracle=oracle if estimator.needs_oracle else None)
        if not loss.builtin:
            noise = 0.01 * torch.randn(batch.logp_old.shape, generator=generator, dtype=DTYPE)
            logp_new = (batch.logp_old + noise * batch.token_mask).requires_grad_()
            call_policy_loss(loss, logp_new, batch, adv.detach(), cfg)
    if not agg.builtin:
        call_aggregation(agg, batch.token_mask.sum(1).to(DTYPE), batch.valid.to(DTYPE))
    if sequential and not order.builtin:
        call_turn_order(order, 2, cfg, generator)
    if sequential and m_factor.uses_ratio and not m_factor.builtin:
        k = batch.num_trajectories
        call_m_factor(m_factor, torch.ones(k, dtype=DTYPE), 1.0 + 0.1 * torch.rand(k, generator=generator, dtype=DTYPE), cfg)
