"""The law of one sampled update, exactly: every group a prompt can draw, with its probability.

A training run does not take the expected update: it draws ``G`` trajectories of a prompt and
updates on them. On a tabular problem the draws can be enumerated. A group is a multiset of ``G``
trajectories drawn i.i.d. from ``pi``, so there are ``C(P + G - 1, G)`` of them (``P`` the
trajectories with positive probability), and a multiset with counts ``n_1 .. n_P`` has the
multinomial probability ``G! / prod n_k! * prod p_k^n_k``. :func:`group_draws` lays every draw out
as one instance of a repeated problem, one group each, so the algorithm's own update
(:func:`seeupo.core.update.policy_update`, its loss, aggregation, ``M`` factor, schedule,
optimizer and epochs) runs on all of them at once, each on its own copy of the policy
(independent parameters per instance): :func:`one_sampled_update` gives every draw's exact ``J``
after the update and its first step (the direction at ratio 1), hence exactly

* the probability that one sampled update lowers ``J`` (:attr:`SampledUpdate.p_lower`), and
* how much of the sampled first step is its expectation (:attr:`SampledUpdate.signal_share`,
  ``|E g|^2 / E |g|^2``: 1 when every draw steps the same way, near 0 when noise dominates).

Independent parameters only (the copies must not share a table).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.config import AlgorithmConfig
from seeupo.core.registry import adv_estimator
from seeupo.core.update import UpdateSettings, compute_advantages, policy_update
from seeupo.tabular.exact import evaluate
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import DTYPE, TreeMDP
from seeupo.tabular.rollout import _build_batch, critic_values, enumerate_paths, oracle_advantages

Tensor = torch.Tensor

#: The most draws :func:`group_draws` lays out (each is a copy of the policy updated on its own).
MAX_DRAWS = 20_000


class TooManyDraws(ValueError):
    """The group draws of a problem exceed ``max_draws``."""


def repeat(problem: TreeMDP, copies: int) -> TreeMDP:
    """A one-instance ``problem`` repeated ``copies`` times (a batch of identical instances)."""
    if problem.num_instances != 1:
        raise ValueError(f"repeat takes a one-instance problem, got {problem.num_instances} instances")
    rep = lambda x: x.expand(copies, *x.shape[1:]).clone()  # noqa: E731
    return dataclasses.replace(problem, initial_state_probs=rep(problem.initial_state_probs),
                               obs_probs=[rep(x) for x in problem.obs_probs], rewards=[rep(x) for x in problem.rewards],
                               terminal=[rep(x) for x in problem.terminal])


@dataclass(frozen=True)
class Trajectories:
    """The distinct trajectories of a one-instance problem with positive probability, ``[P, T]`` tables."""

    hist: Tensor
    action: Tensor
    alive: Tensor
    reward: Tensor
    prob: Tensor  # [P]


def trajectories(problem: TreeMDP, probs: list[Tensor]) -> Trajectories:
    """Every trajectory of the one-instance ``problem`` under ``probs`` with its probability: the leaves of
    :func:`seeupo.tabular.rollout.enumerate_paths` merged where an episode that ended early is the same trajectory."""
    paths = enumerate_paths(problem, [p.detach() for p in probs])
    merged: dict[tuple, int] = {}
    keep: list[int] = []
    prob: list[float] = []
    for leaf in range(paths.hist.shape[1]):
        p = float(paths.prob[0, leaf])
        if p <= 0.0:
            continue
        alive = paths.alive[0, leaf]
        key = (tuple((paths.hist[0, leaf] * alive).tolist()), tuple(paths.action[0, leaf].tolist()), tuple(alive.tolist()))
        if key in merged:
            prob[merged[key]] += p
        else:
            merged[key] = len(keep)
            keep.append(leaf)
            prob.append(p)
    idx = torch.tensor(keep)
    return Trajectories(paths.hist[0, idx] * paths.alive[0, idx], paths.action[0, idx], paths.alive[0, idx],
                        paths.reward[0, idx], torch.tensor(prob, dtype=DTYPE))


@dataclass(frozen=True)
class Draws:
    """Every group of ``G`` trajectories a one-instance problem can draw: draw ``d`` is instance ``d`` of
    ``problem`` (the original repeated), with group ``d`` of ``batch``; ``prob[d]`` its probability (summing to 1);
    ``policy`` the drawing policy repeated on every instance (each draw's own copy, to update)."""

    problem: TreeMDP
    batch: SampleBatch
    prob: Tensor
    policy: TabularPolicy


def group_draws(problem: TreeMDP, policy: TabularPolicy, group_size: int, max_draws: int = MAX_DRAWS) -> Draws:
    """Every multiset of ``group_size`` trajectories of the one-instance ``problem`` under ``policy``, laid out as one
    group per instance of the repeated problem, with its multinomial probability (module docstring)."""
    with torch.no_grad():
        paths = trajectories(problem, policy.action_probs())
    count = len(paths.prob)
    n_draws = math.comb(count + group_size - 1, group_size)
    if n_draws > max_draws:
        raise TooManyDraws(f"{n_draws} group draws ({count} trajectories, G = {group_size}) exceed {max_draws}")
    draws = list(itertools.combinations_with_replacement(range(count), group_size))
    members = torch.tensor(draws).reshape(-1)
    log_p = paths.prob.log()
    prob = []
    for draw in draws:
        counts = [draw.count(k) for k in set(draw)]
        ways = math.factorial(group_size) // math.prod(math.factorial(c) for c in counts)
        prob.append(ways * math.exp(sum(float(log_p[k]) for k in draw)))
    repeated = repeat(problem, n_draws)
    copies = TabularPolicy(repeated)
    with torch.no_grad():
        copies.set_action_probs([p.expand(n_draws, *p.shape[1:]).clone() for p in policy.action_probs()])
    group = torch.arange(n_draws).repeat_interleave(group_size)
    batch = _build_batch(repeated, copies, paths.hist[members], paths.action[members], paths.alive[members],
                         paths.reward[members], torch.ones(len(members), dtype=DTYPE), group, group)
    return Draws(repeated, batch, torch.tensor(prob, dtype=DTYPE), copies)


@dataclass(frozen=True)
class SampledUpdate:
    """The law of one sampled update of a one-instance problem (:func:`one_sampled_update`).

    J_before: ``J`` at the start; J_after: ``[D]``, ``J`` after the update on each draw; prob: ``[D]``;
    first_step: ``[D, P]``, each draw's first step (the ascent direction of its loss at ratio 1, every parameter).
    """

    J_before: float
    J_after: Tensor
    prob: Tensor
    first_step: Tensor

    def p_lower(self, tol: float) -> float:
        """The probability that one sampled update lowers ``J`` by more than ``tol`` (at most 1: the draws'
        probabilities sum to 1 up to rounding)."""
        return min(1.0, float(self.prob[self.J_after < self.J_before - tol].sum()))

    @property
    def expected_J(self) -> float:
        """``E[J]`` after one sampled update."""
        return float((self.prob * self.J_after).sum())

    @property
    def signal_share(self) -> float:
        """``|E g|^2 / E |g|^2`` of the first step ``g`` (``nan`` where every draw's step is zero)."""
        mean = (self.prob[:, None] * self.first_step).sum(0)
        second = float((self.prob * (self.first_step ** 2).sum(1)).sum())
        return float((mean ** 2).sum()) / second if second > 0 else math.nan


def one_sampled_update(problem: TreeMDP, policy: TabularPolicy, cfg: AlgorithmConfig, optimizer: str, lr: float,
                       max_draws: int = MAX_DRAWS) -> SampledUpdate:
    """Every group draw of the one-instance ``problem`` at ``policy`` (``cfg.group_size`` trajectories), and the
    algorithm's own update on each, each from its own copy of ``policy`` with a fresh ``optimizer`` (``"adam"`` or
    ``"sgd"``) of step ``lr``: the exact law of one sampled update (:class:`SampledUpdate`)."""
    from seeupo.tabular.gradient import _first_step
    from seeupo.tabular.kl import start_as_reference
    from seeupo.tabular.train import RunConfig, make_optimizer

    if policy.parameterization != "independent":
        raise ValueError("the law of one sampled update needs independent parameters (each draw updates its own copy)")
    draws = group_draws(problem, policy, cfg.group_size, max_draws)
    copies = draws.policy
    with torch.no_grad():
        start = policy.action_probs()
    batch = draws.batch
    estimator = adv_estimator(cfg.advantage)
    critic = critic_values(draws.problem, copies, batch) if estimator.needs_critic else None
    oracle = oracle_advantages(draws.problem, copies, batch) if estimator.needs_oracle else None
    adv = compute_advantages(batch, cfg, critic_values=critic, oracle=oracle)
    ascent = _first_step(copies, batch, adv, cfg)
    first = torch.cat([ascent[p].reshape(len(draws.prob), -1) for p in copies.parameters()], dim=1)
    step = make_optimizer(copies.parameters(), RunConfig(optimizer=optimizer, lr=lr))  # type: ignore[arg-type]
    policy_update(copies, step, batch, adv, cfg, UpdateSettings(generator=torch.Generator().manual_seed(0),
                                                                logp_ref=start_as_reference(batch, cfg)))
    with torch.no_grad():
        after = evaluate(draws.problem, copies.action_probs()).J
        before = float(evaluate(problem, start).J[0])
    return SampledUpdate(before, after.detach(), draws.prob, first.detach())
