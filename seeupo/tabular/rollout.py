"""Batches for the algorithm core: sampled rollouts, and the exact (probability-weighted) batch.

Sampled mode rolls out ``B`` tasks x ``G`` trajectories per instance, as an LLM run does.
Exact mode enumerates every complete path once, weighted by its probability under the
sampling policy; the core functions then compute expectations instead of sample means.
:func:`exact_advantages` is the entry point: it returns the exact batch and its advantages.

A group estimator's advantage depends on the trajectory's random group-mates too, so exact
mode pairs each path with every configuration of its ``G - 1`` group-mates, weighted by its
exact probability, in one of two ways:

* generic (:func:`exact_group_batch`), for any estimator that is a symmetric function of its
  group's outcomes: the group-mates' outcome classes (distinct per-turn rewards and ends) are
  enumerated as multisets, and the estimator is called on real groups of ``G`` trajectories;
* closed form (:func:`exact_batch`), for estimators that accept the group's sufficient
  statistics (GRAE: the sum, and the sum of squares when the group std is used):
  :func:`group_mate_distribution` enumerates those, far fewer than the multisets.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.config import AlgorithmConfig
from seeupo.core.contract import require_exact_mode
from seeupo.core.registry import adv_estimator
from seeupo.core.update import compute_advantages
from seeupo.tabular.exact import evaluate
from seeupo.tabular.policies import TabularPolicy, token_digits
from seeupo.tabular.problems import DTYPE, TreeMDP

Tensor = torch.Tensor

MAX_ROWS = 2_000_000
"""The most rows an exact batch is built with by default (``max_rows``); larger ones are refused (the sampled mode runs)."""


class ExactBatchTooLarge(ValueError):
    """An exact batch would need more than ``max_rows`` rows (the sampled mode still runs)."""


def _build_batch(
    problem: TreeMDP,
    policy: TabularPolicy,
    hist: Tensor,
    action: Tensor,
    alive: Tensor,
    reward: Tensor,
    traj_weight: Tensor,
    traj_group: Tensor,
    traj_instance: Tensor,
    behaviour: TabularPolicy | None = None,
) -> SampleBatch:
    """Rows (trajectory-major) from per-turn ``[n_traj, T]`` tables; ``logp_old`` from ``policy``, and
    ``logp_behaviour`` from ``behaviour`` where the rows were drawn from it."""
    n_traj, num_turns = hist.shape
    discount = problem.gamma ** torch.arange(num_turns, dtype=DTYPE)
    traj_return = (reward * alive.to(DTYPE) * discount).sum(1)
    rep = lambda x: x[:, None].expand(n_traj, num_turns).reshape(-1)  # noqa: E731
    turn = torch.arange(num_turns).repeat(n_traj)
    lengths = torch.stack([problem.answer_lengths(t)[action[:, t]] for t in range(num_turns)], 1).reshape(-1)
    token_mask = torch.arange(problem.max_tokens)[None, :] < lengths[:, None]
    batch = SampleBatch(
        traj_id=rep(torch.arange(n_traj)),
        group_id=rep(traj_group),
        turn=turn,
        logp_old=torch.zeros(n_traj * num_turns, problem.max_tokens, dtype=DTYPE),
        token_mask=token_mask,
        valid=alive.reshape(-1),
        reward=(reward * alive.to(DTYPE)).reshape(-1),
        traj_return=rep(traj_return),
        weight=rep(traj_weight),
        instance=rep(traj_instance),
        data={"hist": hist.reshape(-1), "action": action.reshape(-1)},
    )
    with torch.no_grad():
        logp = policy.token_logps(batch)
        logp_behaviour = behaviour.token_logps(batch) * token_mask if behaviour is not None else None
    return batch.with_updates(logp_old=logp * token_mask, logp_behaviour=logp_behaviour)


@torch.no_grad()
def sample_batch(
    problem: TreeMDP, policy: TabularPolicy, tasks: int, group_size: int, generator: torch.Generator
) -> SampleBatch:
    """Roll out ``tasks`` initial states x ``group_size`` trajectories per instance.

    Trajectories that end early get placeholder rows (``valid=False``) for the later turns.
    Rewards get Gaussian noise of std ``problem.reward_noise``.
    """
    num_inst, num_turns = problem.num_instances, problem.num_turns
    n_traj = num_inst * tasks * group_size
    traj_instance = torch.arange(num_inst).repeat_interleave(tasks * group_size)
    traj_group = torch.arange(num_inst * tasks).repeat_interleave(group_size)
    s0 = torch.multinomial(problem.initial_state_probs, tasks, replacement=True, generator=generator)  # [I, B]
    h = s0.reshape(-1).repeat_interleave(group_size)
    probs = policy.action_probs()
    hist = torch.zeros(n_traj, num_turns, dtype=torch.long)
    action = torch.zeros_like(hist)
    alive = torch.zeros(n_traj, num_turns, dtype=torch.bool)
    reward = torch.zeros(n_traj, num_turns, dtype=DTYPE)
    live = torch.ones(n_traj, dtype=torch.bool)
    for t in range(num_turns):
        hist[:, t], alive[:, t] = h, live
        a = torch.multinomial(probs[t][traj_instance, h], 1, generator=generator).squeeze(1)
        o = torch.multinomial(problem.obs_probs[t][traj_instance, h, a], 1, generator=generator).squeeze(1)
        r = problem.rewards[t][traj_instance, h, a, o]
        if problem.reward_noise > 0:
            r = r + problem.reward_noise * torch.randn(n_traj, generator=generator, dtype=DTYPE)
        action[:, t], reward[:, t] = torch.where(live, a, 0), torch.where(live, r, 0.0)
        live = live & ~problem.terminal[t][traj_instance, h, a, o]
        h = torch.where(alive[:, t], (h * problem.actions_per_turn[t] + a) * problem.obs_per_turn[t] + o, 0)
    return _build_batch(problem, policy, hist, action, alive, reward, torch.ones(n_traj, dtype=DTYPE), traj_group, traj_instance)


@dataclass
class Paths:
    """Every complete path of every instance, as ``[I, P, T]`` tables (``P = N_T`` leaves)."""

    hist: Tensor
    action: Tensor
    alive: Tensor
    reward: Tensor
    prob: Tensor  # [I, P], probability of the path under the policy (0 if unreachable)
    s0: Tensor  # [P]


def enumerate_paths(problem: TreeMDP, probs: list[Tensor]) -> Paths:
    """All leaves of the history tree with their probabilities under ``probs``.

    A path that ends early is represented by every leaf below its end, each carrying a
    ``1 / (A_t O_t)`` share of its probability for every dead turn, so the leaf
    probabilities still sum to 1 and dead turns become placeholders.
    """
    num_inst, num_turns = problem.num_instances, problem.num_turns
    leaves = torch.arange(problem.num_histories(num_turns))
    sizes = [a * o for a, o in zip(problem.actions_per_turn, problem.obs_per_turn)]
    hist = torch.zeros(len(leaves), num_turns, dtype=torch.long)
    action = torch.zeros_like(hist)
    obs = torch.zeros_like(hist)
    below = 1
    for t in reversed(range(num_turns)):
        hist[:, t] = leaves // (below * sizes[t])
        ao = (leaves // below) % sizes[t]
        action[:, t], obs[:, t] = ao // problem.obs_per_turn[t], ao % problem.obs_per_turn[t]
        below *= sizes[t]
    s0 = hist[:, 0]
    inst = torch.arange(num_inst)[:, None]
    prob = problem.initial_state_probs[:, s0]
    alive = torch.ones(num_inst, len(leaves), num_turns, dtype=torch.bool)
    reward = torch.zeros(num_inst, len(leaves), num_turns, dtype=DTYPE)
    live = torch.ones(num_inst, len(leaves), dtype=torch.bool)
    for t in range(num_turns):
        h, a, o = hist[:, t], action[:, t], obs[:, t]
        alive[:, :, t] = live
        step = probs[t][inst, h, a] * problem.obs_probs[t][inst, h, a, o]
        prob = prob * torch.where(live, step, torch.full_like(step, 1.0 / sizes[t]))
        reward[:, :, t] = torch.where(live, problem.rewards[t][inst, h, a, o], 0.0)
        live = live & ~problem.terminal[t][inst, h, a, o]
    expand = lambda x: x[None].expand(num_inst, -1, -1)  # noqa: E731
    return Paths(expand(hist), torch.where(alive, expand(action), 0), alive, reward, prob, s0)


def group_mate_distribution(
    values: list[float], probs: list[float], num_mates: int, with_squares: bool
) -> list[tuple[float, float, float]]:
    """Exact distribution of ``(sum, sum of squares)`` of ``num_mates`` i.i.d. draws.

    ``values`` and ``probs`` give the return distribution of one trajectory from the task.
    Draws with equal statistics are merged, so the support stays small for discrete rewards.
    Without ``with_squares`` only the sum is tracked (the sum of squares is reported as 0).

    Returns:
      ``[(sum, sumsq, probability), ...]``.
    """
    state: dict[tuple[float, float], float] = {(0.0, 0.0): 1.0}
    for _ in range(num_mates):
        nxt: dict[tuple[float, float], float] = defaultdict(float)
        for (s, q), p in state.items():
            for v, pv in zip(values, probs):
                key = (round(s + v, 12), round(q + v * v, 12) if with_squares else 0.0)
                nxt[key] += p * pv
        state = nxt
    return [(s, q, p) for (s, q), p in state.items()]


def exact_advantages(
    problem: TreeMDP,
    policy: TabularPolicy,
    cfg: AlgorithmConfig,
    *,
    closed_form: bool = True,
    max_rows: int = MAX_ROWS,
    behaviour: TabularPolicy | None = None,
) -> tuple[SampleBatch, Tensor]:
    """The exact-mode batch for ``cfg`` and its per-token advantages: the expectation of a sampled update.

    ``behaviour``: the policy the rows are drawn from, where it is not ``policy`` (a stale policy, a
    truncated sampler): paths and group-mates are weighted by its probabilities, the batch carries its
    log-probabilities (``logp_behaviour``) beside ``policy``'s (``logp_old``), and an oracle or a critic
    still gives ``policy``'s values.

    Non-group estimators see every reachable path once, weighted by its probability (a perfect
    critic or the oracle supply exact values). Group estimators see each path with every
    configuration of its group-mates: the estimator's closed form (:func:`exact_batch`) when it
    declares ``group_stats_closed_form`` and ``closed_form`` is set, else the generic enumeration
    (:func:`exact_group_batch`). An estimator that exact mode refuses (registered with ``exact=False``,
    or failing a check of :func:`seeupo.core.contract.exact_mode_refusal`) is refused in one line
    (:class:`~seeupo.core.contract.ExactModeRefused`).
    """
    require_exact_mode(cfg)  # checked once per estimator and configuration in a process
    estimator = adv_estimator(cfg.advantage)
    if estimator.needs_group_stats and not (closed_form and estimator.group_stats_closed_form):
        batch, own = exact_group_batch(problem, policy, cfg, max_rows=max_rows, behaviour=behaviour)
        adv = batch_advantages(problem, policy, batch, cfg)
        return batch.select(own), adv[own]
    batch, group_stats = exact_batch(problem, policy, cfg, max_rows=max_rows, behaviour=behaviour)
    return batch, batch_advantages(problem, policy, batch, cfg, group_stats)


def batch_advantages(problem: TreeMDP, policy: TabularPolicy, batch: SampleBatch, cfg: AlgorithmConfig,
                     group_stats: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """``cfg``'s advantages of ``batch`` (exact or sampled), given the exact values of ``policy`` on ``problem`` where
    the estimator reads them (a perfect critic, the oracle)."""
    estimator = adv_estimator(cfg.advantage)
    critic = critic_values(problem, policy, batch) if estimator.needs_critic else None
    oracle = oracle_advantages(problem, policy, batch) if estimator.needs_oracle else None
    return compute_advantages(batch, cfg, critic_values=critic, oracle=oracle, group_stats=group_stats)


def exact_batch(
    problem: TreeMDP,
    policy: TabularPolicy,
    cfg: AlgorithmConfig,
    *,
    max_rows: int = MAX_ROWS,
    behaviour: TabularPolicy | None = None,
) -> tuple[SampleBatch, tuple[Tensor, Tensor] | None]:
    """The exact batch for a non-group estimator, or for a group estimator's closed form, and its group statistics.

    Without group statistics (oracle, GAE) every reachable path is one trajectory weighted by
    its probability. With them (an estimator that declares ``group_stats_closed_form``, like
    GRAE) every (path, group-mate statistics) pair is one trajectory, weighted by the product of
    the two probabilities, and the per-trajectory ``(group_sum, group_sumsq)`` include the path's
    own return. Other group estimators need :func:`exact_group_batch`.
    """
    estimator = adv_estimator(cfg.advantage)
    if not estimator.exact:
        raise ValueError(f"advantage {cfg.advantage!r} has no exact mode; use the sampled mode")
    if estimator.needs_group_stats and not estimator.group_stats_closed_form:
        raise ValueError(
            f"advantage {cfg.advantage!r} has no closed form over group statistics; use exact_group_batch "
            "(exact_advantages chooses)"
        )
    with torch.no_grad():
        probs = (behaviour if behaviour is not None else policy).action_probs()
    paths = enumerate_paths(problem, probs)
    num_inst, num_paths, num_turns = paths.hist.shape
    returns = path_returns(problem, paths)

    inst_idx, path_idx, weights, g_sum, g_sumsq = [], [], [], [], []
    for i in range(num_inst):
        reachable = paths.prob[i] > 0
        if not estimator.needs_group_stats:
            idx = reachable.nonzero().squeeze(1)
            inst_idx.append(torch.full_like(idx, i))
            path_idx.append(idx)
            weights.append(paths.prob[i, idx])
            continue
        for s in range(problem.num_initial_states):
            idx = (reachable & (paths.s0 == s)).nonzero().squeeze(1)
            if idx.numel() == 0:
                continue
            p_s = paths.prob[i, idx] / paths.prob[i, idx].sum()
            dist: dict[float, float] = defaultdict(float)
            for r, p in zip(returns[i, idx].tolist(), p_s.tolist()):
                dist[round(r, 12)] += p
            mates = group_mate_distribution(
                list(dist), list(dist.values()), cfg.group_size - 1, cfg.grae_scale == "group_std"
            )
            _check_rows(idx.numel() * len(mates) * num_turns, max_rows)
            m_sum = torch.tensor([m[0] for m in mates], dtype=DTYPE)
            m_sq = torch.tensor([m[1] for m in mates], dtype=DTYPE)
            m_p = torch.tensor([m[2] for m in mates], dtype=DTYPE)
            inst_idx.append(torch.full((idx.numel() * len(mates),), i))
            path_idx.append(idx.repeat_interleave(len(mates)))
            weights.append((paths.prob[i, idx][:, None] * m_p[None, :]).reshape(-1))
            own = returns[i, idx][:, None]
            g_sum.append((own + m_sum[None, :]).reshape(-1))
            g_sumsq.append((own**2 + m_sq[None, :]).reshape(-1))

    inst = torch.cat(inst_idx)
    path = torch.cat(path_idx)
    traj_group = torch.arange(inst.numel())  # each trajectory carries its own group statistics
    batch = _build_batch(
        problem, policy, paths.hist[inst, path], paths.action[inst, path], paths.alive[inst, path],
        paths.reward[inst, path], torch.cat(weights), traj_group, inst, behaviour,
    )
    stats = (torch.cat(g_sum), torch.cat(g_sumsq)) if estimator.needs_group_stats else None
    return batch, stats


def exact_group_batch(
    problem: TreeMDP, policy: TabularPolicy, cfg: AlgorithmConfig, *, max_rows: int = MAX_ROWS,
    behaviour: TabularPolicy | None = None,
) -> tuple[SampleBatch, Tensor]:
    """Every path with every configuration of its group-mates, as real groups: the generic exact mode.

    For each instance and initial state ``s0``, a path's *outcome* is what a group estimator may
    read of it: its per-turn rewards and which turns it was alive, and its histories for an
    estimator that ``reads_histories``. The ``G - 1`` group-mates are
    i.i.d. paths from the same ``s0``, so the multiset of their outcome classes has the
    multinomial distribution; each multiset ``c`` (of ``C(K + G - 2, G - 1)`` for ``K`` classes) is
    represented by one path per class. Every reachable path ``p`` then forms, with every ``c``,
    a group of ``G`` trajectories: ``p`` itself with weight ``P(p) P(c)`` and the group-mates with
    weight 0 (see :class:`~seeupo.core.registry.AdvantageEstimator` for what that asks of the
    estimator). The weights of the own trajectories sum to 1 per instance, as in sampled mode's
    mean over trajectories.

    Returns:
      ``(batch, own)``: the batch (own trajectories have ids ``0..m-1``, group-mates the ids
      after; group ``j`` is own trajectory ``j`` and its mates) and the bool mask of the own
      trajectories' rows, which the update uses after the advantages are computed.
    """
    with torch.no_grad():
        probs = (behaviour if behaviour is not None else policy).action_probs()
    paths = enumerate_paths(problem, probs)
    inst, path, mates, weight = group_draws(problem, paths, cfg, max_rows=max_rows)
    batch = group_batch(problem, policy, paths, inst, path, mates, weight[:, 0], behaviour)
    return batch, batch.traj_id < inst.numel()


def group_draws(problem: TreeMDP, paths: Paths, cfg: AlgorithmConfig, *, max_rows: int = MAX_ROWS,
                under: tuple[Paths, ...] = ()) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The groups :func:`exact_group_batch` enumerates: each reachable path with each multiset of its ``G - 1``
    group-mates' outcome classes. Returns ``(inst [m], path [m], mates [m, G - 1], weight [m, 1 + len(under)])``:
    the own path, a representative path of each mate's class, and the draw's probability ``P(path) P(multiset)``
    under ``paths``' probabilities, then under each of ``under`` (the same enumeration scored by other policies:
    the same paths and outcome classes, other probabilities), so that a draw's weight can follow whichever
    policy drew it."""
    num_inst, _, num_turns = paths.hist.shape
    mates_per_group = cfg.group_size - 1
    reads_histories = adv_estimator(cfg.advantage).reads_histories
    own_inst, own_path, own_weight, mate_path = [], [], [], []
    for i in range(num_inst):
        reachable = paths.prob[i] > 0
        for s in range(problem.num_initial_states):
            idx = (reachable & (paths.s0 == s)).nonzero().squeeze(1)
            if idx.numel() == 0:
                continue
            reps, _ = _outcome_classes(paths, i, idx, reads_histories)
            configs = list(itertools.combinations_with_replacement(range(len(reps)), mates_per_group))
            _check_rows(idx.numel() * len(configs) * cfg.group_size * num_turns, max_rows)
            weights = []
            for scored in (paths, *under):  # the same outcome classes, each policy's probabilities of them
                _, class_p = _outcome_classes(scored, i, idx, reads_histories)
                config_p = torch.tensor([_multinomial_probability(c, class_p) for c in configs], dtype=DTYPE)
                weights.append((scored.prob[i, idx][:, None] * config_p[None, :]).reshape(-1))
            config_paths = torch.tensor([[reps[k] for k in c] for c in configs], dtype=torch.long).reshape(len(configs), -1)
            own_inst.append(torch.full((idx.numel() * len(configs),), i))
            own_path.append(idx.repeat_interleave(len(configs)))
            own_weight.append(torch.stack(weights, 1))
            mate_path.append(config_paths.repeat(idx.numel(), 1))
    return torch.cat(own_inst), torch.cat(own_path), torch.cat(mate_path), torch.cat(own_weight)


def group_batch(problem: TreeMDP, policy: TabularPolicy, paths: Paths, inst: Tensor, path: Tensor, mates: Tensor,
                weight: Tensor, behaviour: TabularPolicy | None = None) -> SampleBatch:
    """The batch of :func:`group_draws`' groups: own trajectory ``j`` (ids ``0..m-1``) with ``weight[j]`` and its
    mates (the ids after) with weight 0; group ``j`` is own trajectory ``j`` and its mates."""
    m, mates_per_group = mates.shape
    all_inst = torch.cat([inst, inst.repeat_interleave(mates_per_group)])
    all_path = torch.cat([path, mates.reshape(-1)])
    all_weight = torch.cat([weight, torch.zeros(m * mates_per_group, dtype=DTYPE)])
    all_group = torch.cat([torch.arange(m), torch.arange(m).repeat_interleave(mates_per_group)])
    return _build_batch(
        problem, policy, paths.hist[all_inst, all_path], paths.action[all_inst, all_path],
        paths.alive[all_inst, all_path], paths.reward[all_inst, all_path], all_weight, all_group, all_inst, behaviour,
    )


def _outcome_classes(paths: Paths, i: int, idx: Tensor, reads_histories: bool) -> tuple[list[int], list[float]]:
    """The outcome classes of instance ``i``'s paths ``idx`` (one initial state): a representative path and the
    probability of each, the paths' probabilities renormalised. A path's outcome is its per-turn rewards and ends,
    and its histories where the estimator ``reads_histories`` (it tells group-mates apart by their states)."""
    classes: dict[tuple, list[float | int]] = {}  # outcome -> [representative path, probability]
    p_s = (paths.prob[i, idx] / paths.prob[i, idx].sum()).tolist()
    for path, p in zip(idx.tolist(), p_s):
        outcome = (tuple(round(r, 12) for r in paths.reward[i, path].tolist()), tuple(paths.alive[i, path].tolist()))
        if reads_histories:
            outcome += (tuple(paths.hist[i, path].tolist()),)
        classes.setdefault(outcome, [path, 0.0])[1] += p
    return [int(c[0]) for c in classes.values()], [float(c[1]) for c in classes.values()]


def exact_group_rows(problem: TreeMDP, policy: TabularPolicy, cfg: AlgorithmConfig) -> int:
    """The rows :func:`exact_group_batch` would build for ``cfg`` (counted without building them): a path times
    each multiset of its group-mates' outcome classes, ``G`` trajectories of ``T`` rows each."""
    with torch.no_grad():
        paths = enumerate_paths(problem, policy.action_probs())
    num_inst, _, num_turns = paths.hist.shape
    reads_histories = adv_estimator(cfg.advantage).reads_histories
    rows = 0
    for i in range(num_inst):
        for s in range(problem.num_initial_states):
            idx = ((paths.prob[i] > 0) & (paths.s0 == s)).nonzero().squeeze(1)
            if idx.numel():
                classes = len(_outcome_classes(paths, i, idx, reads_histories)[0])
                rows += idx.numel() * math.comb(classes + cfg.group_size - 2, cfg.group_size - 1) * cfg.group_size * num_turns
    return rows


def _multinomial_probability(config: tuple[int, ...], class_p: list[float]) -> float:
    """Probability that ``len(config)`` i.i.d. draws give the multiset ``config`` of classes."""
    counts = [config.count(k) for k in set(config)]
    ways = math.factorial(len(config)) // math.prod(math.factorial(c) for c in counts)
    return ways * math.prod(class_p[k] for k in config)


def path_returns(problem: TreeMDP, paths: Paths) -> Tensor:
    """``[I, P]``: each path's discounted return."""
    discount = problem.gamma ** torch.arange(paths.hist.shape[-1], dtype=DTYPE)
    return (paths.reward * discount).sum(-1)  # [I, P]


def _check_rows(rows: int, max_rows: int) -> None:
    if rows > max_rows:
        raise ExactBatchTooLarge(
            f"the exact batch would need {rows} rows (> max_rows={max_rows}); use reward levels, a smaller group "
            "or problem, or the sampled mode"
        )


def critic_values(problem: TreeMDP, policy: TabularPolicy, batch: SampleBatch) -> Tensor:
    """Exact ``[n, L]`` values of the state before each token under ``policy`` (a perfect critic).

    Before token ``j`` of the turn-``t`` action the state is ``(h_t, y_<j)`` and its value is
    ``E[Q_t(h_t, a) | y_<j]``; before token 0 it is ``V_t(h_t)``.
    """
    with torch.no_grad():
        probs = policy.action_probs()
        ev = evaluate(problem, probs)
    out = torch.zeros(batch.num_rows, problem.max_tokens, dtype=DTYPE)
    hist, action = batch.data["hist"], batch.data["action"]
    for t, (vocab, length) in enumerate(problem.tokens):
        rows = (batch.turn == t).nonzero().squeeze(1)
        prefix, _ = token_digits(action[rows], vocab, length)
        pq = probs[t] * ev.Q[t]  # [I, N, A]
        for j in range(length):
            # group actions by their first j tokens: [I, N, V^j, V^(L-j)]
            shape = (*pq.shape[:2], vocab**j, vocab ** (length - j))
            value = pq.reshape(shape).sum(-1) / probs[t].reshape(shape).sum(-1).clamp_min(1e-300)
            out[rows, j] = value[batch.instance[rows], hist[rows], prefix[:, j]]
    return out * batch.token_mask


def oracle_advantages(problem: TreeMDP, policy: TabularPolicy, batch: SampleBatch) -> Tensor:
    """Exact ``A_t(h_t, a_t)`` of the sampling policy, broadcast over the row's tokens."""
    with torch.no_grad():
        ev = evaluate(problem, policy.action_probs())
    adv = torch.zeros(batch.num_rows, dtype=DTYPE)
    for t, a_t in enumerate(ev.A):
        rows = batch.turn == t
        adv[rows] = a_t[batch.instance[rows], batch.data["hist"][rows], batch.data["action"][rows]]
    return adv[:, None] * batch.token_mask
