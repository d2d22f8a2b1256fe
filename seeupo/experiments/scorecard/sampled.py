"""The scorecard's graded capabilities: where the algorithm's own updates lead, how fast, and what one sampled update does.

=========================  ===============================================================  ===========================
capability                 the problems (exact)                                             the rule
=========================  ===============================================================  ===========================
``multi_turn_convergence`` 2-turn token bandits and the 4 agentic families from uniform:    mean share of the gap to
                           the algorithm's own exact updates (its schedule, optimizer,      ``J*`` closed (1 within 1%)
                           epochs), ``Sizes.convergence_updates`` of them
``convergence_speed``      the same runs                                                    mean of ``1 - k / K``, ``k``
                                                                                            the first update within 1%
``sampled_update_safety``  1-turn token bandits (G = 4), the stop family of 2 turns (G = 3) mean of ``1 - P(one sampled
                           and 2-turn token bandits (G = 2), uniform and random starts:     update lowers J)``
                           every group draw with its probability (:mod:`seeupo.tabular.draws`)
``sampled_update_signal``  the same draws                                                   mean of ``|E g|^2 / E|g|^2``
=========================  ===============================================================  ===========================

The first two replace plain ascent along an expected direction (which never runs a schedule: at ratio
1 every turn of a sequential sweep sees the same policy) with the updates a training run takes in
exact mode, so a reverse-order sequential schedule is run as such. The last two are exact finite-sample
quantities: a training run updates on one drawn group, not on the expected batch.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

from seeupo.core.config import registered_functions
from seeupo.experiments.gradient_check import policy_at, random_starts
from seeupo.experiments.scorecard import rules
from seeupo.experiments.scorecard.base import Context, Measured, Sizes, _generator, constant_J
from seeupo.tabular.families import AGENTIC_FAMILIES
from seeupo.tabular.problems import TreeMDP, random_family, random_token_bandit

#: A run has converged when its gap to ``J*`` is at most this share of the problem's largest ``|return|``
#: (as :func:`seeupo.tabular.gradient.plain_ascent`'s ``gap_tol``).
CONVERGED = 1e-2


def convergence_parts(s: Sizes) -> list[tuple[str, TreeMDP]]:
    """The problems of the convergence capabilities (seeded as before the capability ran the algorithm's own update)."""
    parts = [("2-turn token bandits", random_token_bandit(s.instances, 2, 2, 2, reward_levels=3,
                                                           generator=_generator(s, "multi_turn_convergence", 0)))]
    for k, family in enumerate(AGENTIC_FAMILIES, start=1):
        parts.append((f"{family} family, 2 turns", random_family(family, s.instances, 2, reward_levels=3,
                                                                  generator=_generator(s, "multi_turn_convergence", k))))
    return parts


def _updates(ctx: Context) -> int:
    return ctx.sizes.convergence_updates * ctx.iterations_factor + ctx.rollouts.staleness


@functools.lru_cache(maxsize=4)
def _convergence_runs(name: str, config: Any, optimizer: str, lr: float, factor: int, sizes: Sizes, rollouts: Any,
                      _functions: tuple[object, ...]) -> list[dict[str, Any]]:
    """Per problem instance (``J`` constant under every policy: left out): its words, ``J`` after each of the own
    exact updates, ``J*`` and the value scale. Memoised (per configuration and registered functions): both
    convergence capabilities read the same runs."""
    from seeupo.tabular.gradient import value_scale
    from seeupo.tabular.train import AlgorithmStep, RunConfig, TabularPolicy, track

    algorithm = config.replace(group_size=sizes.group_size)
    iterations = sizes.convergence_updates * factor + rollouts.staleness  # with staleness K, K more (stale) updates
    run_cfg = RunConfig(mode="exact", iterations=iterations, optimizer=optimizer, lr=lr, seed=sizes.seed,  # type: ignore[arg-type]
                        **rollouts.run_fields())
    out = []
    for words, problem in convergence_parts(sizes):
        history = track(problem, AlgorithmStep(algorithm, run_cfg), TabularPolicy(problem), iterations)
        scale, flat = value_scale(problem), constant_J(problem)
        for i in range(problem.num_instances):
            if not bool(flat[i]):
                out.append({"where": f"{words}, instance {i}", "J": history.J[:, i].tolist(),
                            "J_star": float(history.J_star[i]), "scale": max(float(scale[i]), 1e-300)})
    return out


def _runs(ctx: Context) -> list[dict[str, Any]]:
    return _convergence_runs(ctx.name, ctx.config, ctx.optimizer, ctx.lr, ctx.iterations_factor, ctx.sizes,
                             ctx.rollouts, registered_functions(ctx.config))


def first_converged(J: list[float], J_star: float, scale: float) -> int | None:
    """The first update after which ``J`` is within :data:`CONVERGED` of ``J*`` (0: the start), ``None`` if none."""
    return next((k for k, j in enumerate(J) if math.isfinite(j) and (J_star - j) / scale <= CONVERGED), None)


def gap_closed(J: list[float], J_star: float, scale: float) -> float:
    """The share of the start's gap to ``J*`` closed at the end, clipped to [0, 1]; 1 when the end is within
    :data:`CONVERGED` of ``J*``; 0 when ``J`` stopped being finite."""
    if not math.isfinite(J[-1]):
        return 0.0
    if (J_star - J[-1]) / scale <= CONVERGED:
        return 1.0
    return min(1.0, max(0.0, (J[-1] - J[0]) / (J_star - J[0])))


def _covered(ctx: Context) -> str:
    s = ctx.sizes
    return ("; ".join(f"{w} ({p.num_instances})" for w, p in convergence_parts(s))
            + f"; the algorithm's own exact updates from uniform ({_updates(ctx)} of them: its schedule, "
              f"{ctx.optimizer} at {ctx.lr:g}, {ctx.config.epochs} epochs), G = {s.group_size}; problems whose J no "
              "policy changes left out")


def multi_turn_convergence(ctx: Context) -> Measured:
    start, runs = time.perf_counter(), _runs(ctx)
    closed = [gap_closed(r["J"], r["J_star"], r["scale"]) for r in runs]
    worst = min(zip(closed, runs), key=lambda c: c[0], default=None)
    words = None
    if worst is not None and worst[0] < 1.0:
        r = worst[1]
        words = (f"{r['where']}: closed {worst[0]:.3f} of the gap (J {r['J'][0]:.4f} -> {r['J'][-1]:.4f} after "
                 f"{len(r['J']) - 1} updates, J* {r['J_star']:.4f})")
    return Measured(rules.mean_of(closed, what="problems"), _covered(ctx), words, seconds=time.perf_counter() - start)


def convergence_speed(ctx: Context) -> Measured:
    start, runs = time.perf_counter(), _runs(ctx)
    updates = _updates(ctx)
    reached = [first_converged(r["J"], r["J_star"], r["scale"]) for r in runs]
    speeds = [0.0 if k is None else 1.0 - k / updates for k in reached]
    slowest = max(zip(reached, runs), key=lambda c: updates + 1 if c[0] is None else c[0], default=None)
    words = None
    if slowest is not None and slowest[0] != 0:
        k, r = slowest
        words = f"{r['where']}: " + (f"not within 1% of J* after {updates} updates (J {r['J'][-1]:.4f}, J* "
                                     f"{r['J_star']:.4f})" if k is None else f"within 1% of J* after {k} updates")
        done = sorted(k for k in reached if k is not None)
        words += (f"; {len(done)} of {len(reached)} runs converged" + (f", median {done[len(done) // 2]} updates"
                                                                       if done else ""))
    return Measured(rules.mean_of(speeds, what="problems"), _covered(ctx), words, seconds=time.perf_counter() - start)


# ------------------------------------------------------------------------------------------ one sampled update


def draw_parts(s: Sizes) -> list[tuple[str, TreeMDP, int]]:
    """The problems whose every group draw is enumerated, with their ``G`` (a few hundred draws at most)."""
    return [("1-turn token bandits, G = 4", random_token_bandit(
                s.instances, 1, 2, 2, reward_levels=3, generator=_generator(s, "sampled_update_safety", 0)), 4),
            ("stop family, 2 turns, G = 3", random_family(
                "stop", s.instances, 2, reward_levels=3, generator=_generator(s, "sampled_update_safety", 1)), 3),
            ("2-turn token bandits, G = 2", random_token_bandit(
                s.instances, 2, 2, 2, reward_levels=3, generator=_generator(s, "sampled_update_safety", 2)), 2)]


@functools.lru_cache(maxsize=4)
def _laws(name: str, config: Any, optimizer: str, lr: float, sizes: Sizes,
          _functions: tuple[object, ...]) -> list[dict[str, Any]]:
    """Per case (problem instance and start; ``J`` constant under every policy: left out): the exact law of one
    sampled update (:func:`seeupo.tabular.draws.one_sampled_update`). Memoised (per configuration and registered
    functions): both draw capabilities read it."""
    from seeupo.tabular.draws import one_sampled_update

    out = []
    for k, (words, problem, group_size) in enumerate(draw_parts(sizes)):
        algorithm = config.replace(group_size=group_size)
        flat = constant_J(problem)
        for j, probs in enumerate(random_starts(problem, sizes.starts, _generator(sizes, "sampled_update_signal", k))):
            for i in range(problem.num_instances):
                if bool(flat[i]):
                    continue
                one = problem.instance(i)
                law = one_sampled_update(one, policy_at(one, [p[i: i + 1] for p in probs]), algorithm, optimizer, lr)
                where = f"{words}, instance {i}, {'uniform' if j == 0 else f'random start {j}'}"
                out.append({"where": where, "p_lower": law.p_lower(rules.DECREASE_TOL), "signal": law.signal_share,
                            "draws": len(law.prob), "J_before": law.J_before, "expected_J": law.expected_J})
    return out


def _draws_covered(ctx: Context) -> str:
    return ("; ".join(w for w, _, _ in draw_parts(ctx.sizes)) + f" ({ctx.sizes.instances} each, {1 + ctx.sizes.starts}"
            f" starts): every group draw with its probability, the algorithm's own update on each ({ctx.optimizer} at "
            f"{ctx.lr:g}, {ctx.config.epochs} epochs); problems whose J no policy changes left out")


def _law_cases(ctx: Context) -> list[dict[str, Any]]:
    return _laws(ctx.name, ctx.config, ctx.optimizer, ctx.lr, ctx.sizes, registered_functions(ctx.config))


def sampled_update_safety(ctx: Context) -> Measured:
    start, cases = time.perf_counter(), _law_cases(ctx)
    worst = max(cases, key=lambda c: c["p_lower"], default=None)
    words = None
    if worst is not None and worst["p_lower"] > 0:
        words = (f"{worst['where']}: one sampled update lowers J with probability {worst['p_lower']:.4f} "
                 f"({worst['draws']} draws; E[J] {worst['J_before']:.4f} -> {worst['expected_J']:.4f})")
    return Measured(rules.mean_of([1.0 - c["p_lower"] for c in cases], what="cases"), _draws_covered(ctx), words,
                    seconds=time.perf_counter() - start)


def sampled_update_signal(ctx: Context) -> Measured:
    start, cases = time.perf_counter(), [c for c in _law_cases(ctx) if math.isfinite(c["signal"])]
    worst = min(cases, key=lambda c: c["signal"], default=None)
    words = (f"{worst['where']}: |E g|^2 / E|g|^2 = {worst['signal']:.4f} over {worst['draws']} draws"
             if worst is not None and worst["signal"] < 1.0 - 1e-9 else None)
    return Measured(rules.mean_of([c["signal"] for c in cases], what="cases"), _draws_covered(ctx)
                    + "; cases where no draw moves the policy left out", words, seconds=time.perf_counter() - start)
