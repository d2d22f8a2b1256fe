"""The scorecard's capability experiments: each a named, tagged, seeded set of exact problems and its scoring rule.

A capability asks one question of an algorithm and answers it with a score in [0, 1]
(:mod:`seeupo.experiments.scorecard.rules`). Every algorithm takes its own exact update, the one
``seeupo verify`` gives it (its optimizer, step size, epochs and schedule), on the same problems; a
direction is the expected first step of that whole update (its loss, aggregation, ``M`` factor and
schedule: :func:`seeupo.tabular.gradient.update_direction`), not of its estimator alone:

==========================  =============================================================  ===========================
capability                  the problems (exact unless said; 2-token actions of 2 tokens)  the rule
==========================  =============================================================  ===========================
``single_turn_monotone``    1-turn token bandits, rewards on 2 / 3 / 11 levels, G = 2-5;    share of runs whose ``J``
                            uniform and random starts; the field's counterexamples          never fell and rose
``multi_turn_monotone``     2-turn token bandits, the stop / intermediate / tokens          as above
                            families (2 turns); the field's counterexamples
``stochastic_outcomes``     tree MDPs of 1 and 2 turns with stochastic observations, the    as above
                            tool family; the field's counterexamples
``shared_parameters``       as ``multi_turn_monotone``, one parameter table for every       as above
                            turn; the field's counterexamples
``agentic_credit``          stop / intermediate / tool families, 2 and 3 turns, uniform     mean of the worst turn's
                            and random starts: each turn's expected first step              cosine with grad J (>= 0)
``reward_invariance``       1- and 2-turn token bandits, returns ``a R + b`` for            share of cases whose first
                            (a, b) = (1, 0.5), (3, 0), (0.5, -1)                            step keeps its direction
``zero_variance_groups``    every answer earns 0 (or 1): every group has zero variance;     share of cases: a finite
                            one rewarded answer: most groups do (1 and 2 turns)             zero / uphill first step
``difficulty_weighting``    1-turn token bandits of 3 prompts whose rewards spread 0.1,     mean cosine of the first
                            0.5 and 1                                                       step with grad J (>= 0)
``length_weighting``        1-turn bandits of one prompt whose answers end at an end token   mean cosine of the first
                            (3 tokens of 3, 4 of 2: lengths 1 to 3 and 1 to 4)              step with grad J (>= 0)
``lm_bridge``               a tiny language model on the 2-turn bridge, exact ``J`` after   mean over seeds of the gap
                            each step, seeds after a format warm-up (sampled)               to ``J*`` closed
==========================  =============================================================  ===========================

The convergence capabilities (the algorithm's own updates to ``J*``, and how fast) and those of one
sampled update (every group draw enumerated) are in :mod:`seeupo.experiments.scorecard.sampled`; those of stale
rollouts, the KL term's gradient and pass@k in :mod:`seeupo.experiments.scorecard.open_questions`.

"The field's counterexamples" are the committed instances where a search found some algorithm's
exact update lowering ``J`` (``paper_repro/counterexamples``, ``paper_repro/algorithms/*/counterexamples``):
every algorithm runs its own update on them from the recorded start. Problems whose ``J`` no policy
changes are left out (no evidence either way). The problems are drawn from generators seeded by
``Sizes.seed``, the capability and the part, so two cards measure the same problems. Each
capability returns a :class:`Measured`: the score, what it covered, and the files that show its
worst case (a counterexample that ``seeupo replay`` reruns, the gradient case, the bridge runs).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seeupo.core.config import AlgorithmConfig
from seeupo.experiments.counterexamples import field_counterexamples
from seeupo.experiments.gradient_check import policy_at, random_starts, save_case
from seeupo.experiments.scorecard import open_questions, rules, sampled
from seeupo.experiments.scorecard.base import (  # noqa: F401 (QUICK re-exported: what a capability is built from)
    QUICK,
    Capability,
    Context,
    Measured,
    Sizes,
    _constant_bandit,
    _generator,
    _needle_bandit,
    _shifted,
    constant_J,
)
from seeupo.tabular.problems import TreeMDP, random_family, random_token_bandit, random_tree_mdp



# ------------------------------------------------------------------------------------------ measuring


@dataclass(frozen=True)
class Part:
    """Runs of the algorithm's own exact update: every instance of ``problem``, from the policy of
    ``run_cfg`` (uniform, or random logits of scale ``init_scale``) or, for a replayed counterexample,
    from ``state``; ``group_size`` (``None``: :attr:`Sizes.group_size`)."""

    words: str  # the problems, as the card says them
    problem: TreeMDP
    start: str = "uniform start"  # in words; "" for a counterexample's recorded start
    parameterization: str = "independent"
    init_scale: float = 0.0
    group_size: int | None = None
    state: dict[str, torch.Tensor] | None = None
    iterations: int | None = None
    feature_dim: int = 4


def _random_parts(words: str, problem: TreeMDP, parameterization: str = "independent",
                  group_size: int | None = None) -> list[Part]:
    """``problem`` from the uniform policy and from random logits of scale 1 (a start a search would try)."""
    return [Part(words, problem, "uniform start", parameterization, 0.0, group_size),
            Part(words, problem, "random start", parameterization, 1.0, group_size)]


#: Where the field's counterexamples are committed (relative to the working directory or the repository).
def _counterexample_setting(example: Any) -> str:
    """Which monotonicity capability a counterexample's instance belongs to."""
    if example.run.parameterization == "shared":
        return "shared_parameters"
    if any(o > 1 for o in example.problem.obs_per_turn):
        return "stochastic_outcomes"
    return "single_turn_monotone" if example.problem.num_turns == 1 else "multi_turn_monotone"


def _field_parts(capability: str) -> list[Part]:
    return [Part(f"the field's counterexample {path}", ex.problem, "", ex.run.parameterization, ex.run.init_scale,
                 ex.group_size, ex.policy_state, ex.iterations, ex.run.feature_dim)
            for path, ex in field_counterexamples() if _counterexample_setting(ex) == capability]


def _part_run(ctx: Context, part: Part) -> tuple[AlgorithmConfig, Any, int, Any]:
    """``(algorithm, run config, iterations, start policy)`` of one part's runs."""
    from seeupo.tabular.train import RunConfig, initial_policy

    algorithm = ctx.config.replace(group_size=part.group_size or ctx.sizes.group_size)
    # with staleness K, K more updates: the run's own updates then read rows K updates old
    iterations = (part.iterations or ctx.sizes.iterations) * ctx.iterations_factor + ctx.rollouts.staleness
    run_cfg = RunConfig(mode="exact", iterations=iterations, optimizer=ctx.optimizer, lr=ctx.lr,  # type: ignore[arg-type]
                        parameterization=part.parameterization, init_scale=part.init_scale,  # type: ignore[arg-type]
                        feature_dim=part.feature_dim, seed=ctx.sizes.seed, **ctx.rollouts.run_fields())  # type: ignore[arg-type]
    policy = initial_policy(part.problem, run_cfg)
    if part.state is not None:
        policy.load_state_dict(part.state)
    return algorithm, run_cfg, iterations, policy


def _monotone_runs(ctx: Context, parts: list[Part], capability: str) -> Measured:
    """The algorithm's own exact update, ``iterations`` times, on every instance of every part; each
    run's largest single-update decrease of ``J`` goes to
    :func:`~seeupo.experiments.scorecard.rules.share_without_decrease`. The worst run is saved as a
    counterexample that ``seeupo replay`` reruns."""
    from seeupo.experiments.counterexamples import Counterexample
    from seeupo.plugins import loaded_plugins
    from seeupo.tabular.train import AlgorithmStep, track

    start = time.perf_counter()
    decreases: list[float] = []
    moved: list[bool] = []
    still: list[str] = []
    worst: tuple[float, Counterexample] | None = None
    left_out = 0
    for part in parts:
        algorithm, run_cfg, iterations, policy = _part_run(ctx, part)
        where = f"{part.words}, {part.start}" if part.start else part.words
        state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
        history = track(part.problem, AlgorithmStep(algorithm, run_cfg), policy, iterations)
        drops = (history.J[:-1] - history.J[1:]).amax(0)
        finite = torch.isfinite(history.J).all(0)
        flat = constant_J(part.problem)
        lowered = 0
        for i in range(part.problem.num_instances):
            if bool(flat[i]):
                left_out += 1
                continue
            d = float(drops[i]) if bool(finite[i]) else math.nan
            decreases.append(d)
            at_optimum = float(history.J_star[i] - history.J[0, i]) <= rules.DECREASE_TOL
            moved.append(at_optimum or float(history.J[-1, i] - history.J[0, i]) > rules.DECREASE_TOL)
            if not moved[-1] and d <= rules.DECREASE_TOL:
                still.append(f"{where}, instance {i}: J did not move in {iterations} updates")
            lowered += not d <= rules.DECREASE_TOL
            bad = math.inf if math.isnan(d) else d
            if bad > rules.DECREASE_TOL and (worst is None or bad > worst[0]):
                one = {k: (v if k.startswith("features_") else v[i: i + 1]) for k, v in state.items()}  # per instance
                worst = (bad, Counterexample(
                    f"scorecard {capability}", f"{ctx.name}: {where}, instance {i}", part.problem.instance(i), one,
                    algorithm, run_cfg, iterations, history.J[:, i].tolist(), float(history.J_star[i]),
                    {"capability": capability}, tuple(p.spec for p in loaded_plugins())))
        ctx.say(f"  {capability}: {where}: {lowered} of {part.problem.num_instances - int(flat.sum())} runs lowered J")
    covered = (f"{len(decreases)} runs: " + "; ".join(dict.fromkeys(p.words for p in parts if p.state is None))
               + f" ({ctx.sizes.instances} each, uniform and random starts, {ctx.sizes.iterations * ctx.iterations_factor}"
               + " exact updates)")
    field_runs = sum(1 for p in parts if p.state is not None)
    covered += f"; the field's {field_runs} committed counterexamples of this setting" if field_runs else ""
    covered += f"; {left_out} instances whose J no policy changes left out" if left_out else ""
    measured = Measured(rules.share_improving(decreases, moved), covered)
    if worst is None and still:
        measured.worst = still[0] + (
            f" (and {len(still) - 1} more runs)" if len(still) > 1 else "")
    if worst is not None:
        bad, example = worst
        measured.worst = (f"{example.description.split(': ', 1)[1]}: " + (
            f"J fell by {example.largest_decrease:.3g} ({_trajectory(example.J)})" if math.isfinite(bad)
            else "J stopped being finite"))
        if ctx.out is not None:
            path = Path("counterexamples") / f"{ctx.name}_{capability}.json"
            example.save(ctx.out / path)
            measured.evidence.append(str(path))
    measured.seconds = time.perf_counter() - start
    return measured


def _trajectory(J: list[float]) -> str:
    k = max(range(len(J) - 1), key=lambda i: J[i] - J[i + 1])
    return f"update {k + 1}: {J[k]:.6f} -> {J[k + 1]:.6f}"


def _single_turn_parts(s: Sizes) -> list[Part]:
    parts = []
    for k, (levels, g) in enumerate([(2, 2), (3, 3), (11, 4), (2, 5)]):
        problem = random_token_bandit(s.instances, 1, 2, 2, reward_levels=levels, generator=_generator(s, "single_turn_monotone", k))
        parts += _random_parts(f"1-turn token bandits, rewards on {levels} levels, G = {g}", problem, group_size=g)
    return parts


def _multi_turn_parts(s: Sizes, capability: str = "multi_turn_monotone", parameterization: str = "independent") -> list[Part]:
    bandit = random_token_bandit(s.instances, 2, 2, 2, reward_levels=3, generator=_generator(s, capability, 0))
    parts = _random_parts("2-turn token bandits", bandit, parameterization)
    for k, family in enumerate(("stop", "intermediate", "tokens"), start=1):
        problem = random_family(family, s.instances, 2, reward_levels=3, generator=_generator(s, capability, k))
        parts += _random_parts(f"{family} family, 2 turns", problem, parameterization)
    return parts


def _stochastic_parts(s: Sizes) -> list[Part]:
    parts = []
    for k, (actions, obs, g) in enumerate([((4,), (3,), 2), ((4,), (3,), 4), ((2, 2), (2, 2), 3)]):
        problem = random_tree_mdp(s.instances, actions, obs, reward_levels=3, generator=_generator(s, "stochastic_outcomes", k))
        turns = f"{len(actions)} turn{'s' if len(actions) > 1 else ''}"
        parts += _random_parts(f"tree MDPs of {turns} with stochastic observations, G = {g}", problem, group_size=g)
    tool = random_family("tool", s.instances, 2, reward_levels=3, generator=_generator(s, "stochastic_outcomes", 9))
    return parts + _random_parts("tool family, 2 turns", tool)


def monotone_parts(s: Sizes, capability: str) -> list[Part]:
    """The runs of a monotonicity capability: its seeded problems, then the field's counterexamples of its setting."""
    seeded = {"single_turn_monotone": lambda: _single_turn_parts(s),
              "multi_turn_monotone": lambda: _multi_turn_parts(s),
              "stochastic_outcomes": lambda: _stochastic_parts(s),
              "shared_parameters": lambda: _multi_turn_parts(s, "shared_parameters", "shared")}[capability]()
    return seeded + _field_parts(capability)


def single_turn_monotone(ctx: Context) -> Measured:
    return _monotone_runs(ctx, monotone_parts(ctx.sizes, "single_turn_monotone"), "single_turn_monotone")


def multi_turn_monotone(ctx: Context) -> Measured:
    return _monotone_runs(ctx, monotone_parts(ctx.sizes, "multi_turn_monotone"), "multi_turn_monotone")


def stochastic_outcomes(ctx: Context) -> Measured:
    return _monotone_runs(ctx, monotone_parts(ctx.sizes, "stochastic_outcomes"), "stochastic_outcomes")


def shared_parameters(ctx: Context) -> Measured:
    return _monotone_runs(ctx, monotone_parts(ctx.sizes, "shared_parameters"), "shared_parameters")


def agentic_credit(ctx: Context) -> Measured:
    from seeupo.tabular.gradient import gradient_directions

    s, start = ctx.sizes, time.perf_counter()
    algorithm = ctx.config.replace(group_size=s.group_size)
    cases: list[tuple[list[float], list[float]]] = []
    worst: tuple[float, str, TreeMDP, list[torch.Tensor], dict[str, Any]] | None = None
    parts = []
    for k, (family, turns) in enumerate([(f, t) for f in ("stop", "intermediate", "tool") for t in (2, 3)]):
        problem = random_family(family, s.instances, turns, reward_levels=3, generator=_generator(s, "agentic_credit", k))
        parts.append((f"{family} family, {turns} turns", problem))
        for j, probs in enumerate(random_starts(problem, s.starts, _generator(s, "agentic_credit", 50 + k))):
            for i in range(problem.num_instances):  # one at a time: a history reader's exact batch grows with them
                one, start_i = problem.instance(i), [p[i: i + 1] for p in probs]
                (d,) = gradient_directions(one, policy_at(one, start_i), algorithm, level="update")
                cases.append((d.turn_cosines, d.turn_scales))
                credit = rules.worst_turn_cosine(d.turn_cosines, d.turn_scales)
                if credit is not None and (worst is None or credit < worst[0]):
                    where = f"{family} family, {turns} turns, instance {i}, {'uniform' if j == 0 else f'random start {j}'}"
                    worst = (credit, where, one, start_i,
                             {"verdict": d.verdict, "cosine": d.cosine, "turn_cosines": d.turn_cosines,
                              "turn_scales": d.turn_scales, "downhill_turn": d.downhill_turn})
    score = rules.mean_worst_turn_cosine(cases)
    covered = ("; ".join(f"{w} ({p.num_instances})" for w, p in parts)
               + f"; {1 + s.starts} start policies each (uniform and random), G = {s.group_size}")
    measured = Measured(score, covered, seconds=0.0)
    if worst is not None and worst[0] < 1 - rules.INVARIANCE_TOL:
        credit, where, problem, probs, direction = worst
        turns = ", ".join("-" if math.isnan(c) else f"{c:.3f}" for c in direction["turn_cosines"])
        measured.worst = f"{where}: {direction['verdict']} (turn cosines {turns})"
        if ctx.out is not None:
            path = Path("gradient") / f"{ctx.name}_agentic_credit.json"
            save_case(ctx.out / path, problem, probs, algorithm, ctx.plugins,
                      {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in direction.items()}
                      | {"turn_cosines": [None if math.isnan(c) else c for c in direction["turn_cosines"]],
                         "turn_scales": [None if math.isnan(c) else c for c in direction["turn_scales"]]})
            measured.evidence.append(str(path))
    measured.seconds = time.perf_counter() - start
    return measured


def _flat_direction(problem: TreeMDP, probs: list[torch.Tensor], algorithm: AlgorithmConfig) -> torch.Tensor:
    """The expected first step of the algorithm's whole update (its loss, aggregation, ``M`` factor and schedule on
    the exact batch, :func:`seeupo.tabular.gradient.update_direction`), every turn's parameters in one row per instance."""
    from seeupo.tabular.gradient import update_direction

    expected, _ = update_direction(problem, policy_at(problem, probs), algorithm)
    return torch.cat(expected, dim=1)


def _cosines(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    """Per instance, the cosine of two directions; 1 where both are zero, ``nan`` where one is or either is not finite."""
    out = []
    for x, y in zip(a, b):
        nx, ny = float(x.norm()), float(y.norm())
        if not (math.isfinite(nx) and math.isfinite(ny)):
            out.append(math.nan)
        elif nx == 0 and ny == 0:
            out.append(1.0)
        else:
            out.append(float((x * y).sum()) / (nx * ny) if nx > 0 and ny > 0 else math.nan)
    return out


#: An update is zero when its norm is below this (rewards in [0, 1], probabilities as parameters).
ZERO_UPDATE = 1e-9


#: The return transforms ``(a, b)``: ``R -> a R + b``.
TRANSFORMS = ((1.0, 0.5), (3.0, 0.0), (0.5, -1.0))


def reward_invariance(ctx: Context) -> Measured:
    s, start = ctx.sizes, time.perf_counter()
    algorithm = ctx.config.replace(group_size=s.group_size)
    cosines: list[float] = []
    worst: tuple[float, str] | None = None
    for k, turns in enumerate((1, 2)):
        problem = random_token_bandit(s.instances, turns, 2, 2, reward_levels=3, generator=_generator(s, "reward_invariance", k))
        for j, probs in enumerate(random_starts(problem, s.starts, _generator(s, "reward_invariance", 50 + k))):
            base = _flat_direction(problem, probs, algorithm)
            moving = (base.norm(dim=1) > ZERO_UPDATE) | ~torch.isfinite(base).all(1)  # no direction: nothing to turn
            for a, b in TRANSFORMS:
                found = _cosines(base, _flat_direction(_shifted(problem, a, b), probs, algorithm))
                cosines += [c for c, m in zip(found, moving) if m]
                for i, c in enumerate(found):
                    if not bool(moving[i]):
                        continue
                    bad = 2.0 if math.isnan(c) else 1 - c
                    if bad > rules.INVARIANCE_TOL and (worst is None or bad > worst[0]):
                        worst = (bad, f"{turns}-turn token bandit, instance {i}, {'uniform' if j == 0 else f'random start {j}'}: "
                                      f"returns {a:g} R {b:+g} turn the update by cosine "
                                      + ("nan (not finite, or one of them zero)" if math.isnan(c) else f"{c:.6f}"))
    covered = (f"1- and 2-turn token bandits ({s.instances} each), {1 + s.starts} start policies, returns a R + b for "
               + ", ".join(f"(a, b) = ({a:g}, {b:g})" for a, b in TRANSFORMS) + f"; G = {s.group_size}; cases where "
               "the update is zero on the original returns left out (no direction to keep)")
    return Measured(rules.share_invariant(cosines), covered, worst[1] if worst else None, seconds=time.perf_counter() - start)


def zero_variance_groups(ctx: Context) -> Measured:
    from seeupo.tabular.gradient import policy_gradient

    s, start = ctx.sizes, time.perf_counter()
    algorithm = ctx.config.replace(group_size=s.group_size)
    flags: list[bool] = []
    failures: list[str] = []
    for turns in (1, 2):
        for value in (0.0, 1.0):
            problem = _constant_bandit(s.instances, turns, value)
            for j, probs in enumerate(random_starts(problem, s.starts, _generator(s, "zero_variance_groups", turns * 10 + int(value)))):
                direction = _flat_direction(problem, probs, algorithm)
                for i, row in enumerate(direction):
                    ok = bool(torch.isfinite(row).all()) and float(row.norm()) <= ZERO_UPDATE
                    flags.append(ok)
                    if not ok:
                        failures.append(f"{turns}-turn bandit where every answer earns {value:g}, instance {i}: the update is "
                                        + ("not finite" if not bool(torch.isfinite(row).all()) else f"of norm {float(row.norm()):.3g}, not 0"))
        problem = _needle_bandit(s.instances, turns, _generator(s, "zero_variance_groups", turns))
        for j, probs in enumerate(random_starts(problem, s.starts, _generator(s, "zero_variance_groups", 100 + turns))):
            direction = _flat_direction(problem, probs, algorithm)
            true = torch.cat(policy_gradient(problem, policy_at(problem, probs)), dim=1)
            for i, (row, grad) in enumerate(zip(direction, true)):
                finite = bool(torch.isfinite(row).all())
                ok = finite and float((row * grad).sum()) > 0
                flags.append(ok)
                if not ok:
                    failures.append(f"{turns}-turn bandit with one rewarded answer, instance {i}: the update is "
                                    + ("not finite" if not finite else "not uphill"))
    covered = (f"1- and 2-turn token bandits ({s.instances} each) where every answer earns 0 or 1 (the update must be 0), "
               f"and where one answer earns 1 (uphill); {1 + s.starts} start policies, G = {s.group_size}")
    worst = f"{failures[0]}" + (f" (and {len(failures) - 1} more)" if len(failures) > 1 else "") if failures else None
    return Measured(rules.share(flags), covered, worst, seconds=time.perf_counter() - start)


#: The reward spreads of the prompts of a difficulty problem: the same rewards scaled per prompt, so that a per-prompt
#: normaliser (a group std) weighs the prompts unlike J does.
PROMPT_SCALES = (0.1, 0.5, 1.0)


def _prompts_problem(s: Sizes) -> TreeMDP:
    """1-turn token bandits with one prompt per scale of :data:`PROMPT_SCALES`, drawn uniformly: rewards on 3 levels
    times the prompt's scale (a prompt whose rewards barely differ is one whose groups look alike)."""
    from seeupo.tabular.problems import random_sequential_bandit

    base = random_sequential_bandit(s.instances, (4,), num_initial_states=len(PROMPT_SCALES), reward_levels=3,
                                    tokens=(2, 2), generator=_generator(s, "difficulty_weighting", 0))
    scale = torch.tensor(PROMPT_SCALES, dtype=base.rewards[-1].dtype)[None, :, None, None]
    uniform = torch.full_like(base.initial_state_probs, 1.0 / len(PROMPT_SCALES))
    return dataclasses.replace(base, rewards=[base.rewards[-1] * scale], initial_state_probs=uniform)


def _gradient_alignment(problem: TreeMDP, starts: list[list[torch.Tensor]], algorithm: AlgorithmConfig
                        ) -> tuple[list[float], str | None]:
    """Per (start, instance), the cosine between the whole update's expected first step and grad J, floored at 0
    (1 when parallel within float noise); and the worst case's words when one falls short of 1 - 1e-6."""
    from seeupo.tabular.gradient import REL_TOL, policy_gradient

    cosines: list[float] = []
    worst: tuple[float, str] | None = None
    for j, probs in enumerate(starts):
        update = _flat_direction(problem, probs, algorithm)
        true = torch.cat(policy_gradient(problem, policy_at(problem, probs)), dim=1)
        for i, c in enumerate(_cosines(update, true)):
            credit = 0.0 if math.isnan(c) else 1.0 if c >= 1 - REL_TOL else max(0.0, c)  # parallel within float noise
            cosines.append(credit)
            if credit < 1 - rules.INVARIANCE_TOL and (worst is None or credit < worst[0]):
                worst = (credit, f"instance {i}, {'uniform' if j == 0 else f'random start {j}'}: the update's cosine "
                                 f"with grad J is " + ("nan (one of them zero or not finite)" if math.isnan(c) else f"{c:.4f}"))
    return cosines, worst[1] if worst else None


def difficulty_weighting(ctx: Context) -> Measured:
    s, start = ctx.sizes, time.perf_counter()
    problem = _prompts_problem(s)
    starts = random_starts(problem, s.starts, _generator(s, "difficulty_weighting", 1))
    cosines, worst = _gradient_alignment(problem, starts, ctx.config.replace(group_size=s.group_size))
    covered = (f"1-turn token bandits ({s.instances}) of {len(PROMPT_SCALES)} prompts drawn uniformly, rewards on 3 levels "
               f"scaled per prompt by {', '.join(f'{x:g}' for x in PROMPT_SCALES)}; {1 + s.starts} start policies, "
               f"G = {s.group_size}")
    return Measured(rules.mean_of(cosines, what="cases"), covered, worst, seconds=time.perf_counter() - start)


#: The answer spellings of the length capability: ``(V, L)`` tokens, ending at token 0 (lengths 1 to ``L``).
LENGTH_SPELLINGS = ((3, 3), (2, 4))


def length_weighting(ctx: Context) -> Measured:
    s, start = ctx.sizes, time.perf_counter()
    algorithm = ctx.config.replace(group_size=s.group_size)
    cosines: list[float] = []
    worst: list[str] = []
    for k, (vocab, length) in enumerate(LENGTH_SPELLINGS):
        problem = random_token_bandit(s.instances, 1, vocab, length, end_token=0, reward_levels=3,
                                      generator=_generator(s, "length_weighting", k))
        starts = random_starts(problem, s.starts, _generator(s, "length_weighting", 10 + k))
        found, words = _gradient_alignment(problem, starts, algorithm)
        if words is not None and (not worst or min(found) < min(cosines)):
            worst = [f"answers of {vocab} tokens ending at token 0 (lengths 1 to {length}), {words}"]
        cosines += found
    covered = (f"1-turn bandits ({s.instances} each) of one prompt whose answers end at an end token: "
               + ", ".join(f"{v} tokens, lengths 1 to {n}" for v, n in LENGTH_SPELLINGS)
               + f"; rewards on 3 levels, whatever the length; {1 + s.starts} start policies, G = {s.group_size}")
    return Measured(rules.mean_of(cosines, what="cases"), covered, worst[0] if worst else None,
                    seconds=time.perf_counter() - start)


def lm_bridge(ctx: Context) -> Measured:
    from seeupo.experiments.check.planning import DEFAULT
    from seeupo.experiments.check.run import run_bridge

    s, start = ctx.sizes, time.perf_counter()
    if ctx.out is None:
        return Measured(rules.no_evidence("the bridge writes its runs to the card's folder, and there is none"), "")
    budget = dataclasses.replace(DEFAULT, bridge_seeds=s.bridge_seeds, bridge_steps=s.bridge_steps)
    result = run_bridge(ctx.name, budget, ctx.out, ctx.plugins, lambda m: ctx.say("  " + m))
    covered = (f"the tiny random Qwen3 on the 2-turn bridge, {len(s.bridge_seeds)} seeds x {s.bridge_steps} steps after a "
               f"format warm-up, exact J after each step (sampled rollouts: the interval is over seeds)")
    if result.skipped is not None:
        return Measured(rules.no_evidence(result.skipped), covered, seconds=time.perf_counter() - start)
    if result.vacuous is not None:
        return Measured(rules.no_evidence("vacuous: " + result.vacuous), covered, evidence=["bridge"],
                        seconds=time.perf_counter() - start)
    runs = result.runs or []
    score = rules.mean_gain_fraction([r["J_initial"] for r in runs], [r["J_final"] for r in runs],
                                     [r["J_star"] for r in runs])
    return Measured(score, covered, result.summary, evidence=["bridge"], seconds=time.perf_counter() - start)


MONOTONE_RULE = ("share of runs whose exact J never fell by more than 1e-7 in one update and rose where it could "
                 "(an update that never moves J fails)")

COSINE_RULE = "mean over cases of the cosine between the whole update's expected first step and grad J, floored at 0"

CAPABILITIES: tuple[Capability, ...] = (
    Capability("single_turn_monotone", "Single-turn monotone improvement", "1-turn monotone",
               ("monotonicity", "single-turn"), "Does an exact update ever lower J on one turn?",
               MONOTONE_RULE, True, single_turn_monotone, True,
               "anti_pg (minus the exact policy gradient): 0; frozen_pg (never moves): 0", reads_rollouts=True),
    Capability("multi_turn_monotone", "Multi-turn monotone improvement", "multi-turn monotone",
               ("monotonicity", "multi-turn", "agentic"),
               "Does an exact update ever lower J over several turns, where the agent stops when it chooses?",
               MONOTONE_RULE, True, multi_turn_monotone, True, "anti_pg: 0", reads_rollouts=True),
    Capability("stochastic_outcomes", "Stochastic outcomes", "stochastic outcomes", ("monotonicity", "stochastic"),
               "Does an exact update lower J when observations and episode ends are random?",
               MONOTONE_RULE, True, stochastic_outcomes, True, "anti_pg: 0", reads_rollouts=True),
    Capability("shared_parameters", "Parameters shared across turns", "shared parameters",
               ("monotonicity", "shared", "multi-turn"),
               "Does an exact update lower J when every turn reads one parameter table (as a language model's)?",
               MONOTONE_RULE, True, shared_parameters, True, "anti_pg: 0", reads_rollouts=True),
    Capability("multi_turn_convergence", "Multi-turn convergence to J*", "reaches J*",
               ("convergence", "multi-turn", "agentic"),
               "Where do the algorithm's own exact updates (its schedule, optimizer and epochs) lead: to J*, or short?",
               "mean over problems of the share of the gap to J* closed after its updates (1 when within 1% of J*)",
               True, sampled.multi_turn_convergence, True, "anti_pg: 0", reads_rollouts=True),
    Capability("convergence_speed", "Updates to J*", "speed to J*", ("convergence", "multi-turn", "graded"),
               "How many of its own exact updates does the algorithm take to come within 1% of J*?",
               "mean over problems of 1 - k / K, k the first update within 1% of J* (0 when it never is), K the updates",
               True, sampled.convergence_speed, True, "anti_pg: 0", reads_rollouts=True),
    Capability("agentic_credit", "Per-turn credit on agentic problems", "per-turn credit",
               ("gradient", "agentic", "credit"),
               "Does every turn's expected first step (the whole update: loss, aggregation, M factor, schedule) point "
               "up the policy gradient of that turn (stopping, intermediate rewards, tool results)?",
               "mean over cases of the smallest per-turn cosine between the update's expected first step and grad J, "
               "floored at 0", True, agentic_credit, False,
               "anti_pg: 0; turn0_frozen_pg (its loss never updates turn 0; estimator credit 1): 0"),
    Capability("reward_invariance", "Invariance to reward shift and scale", "reward shift/scale",
               ("robustness", "rewards"),
               "Does the whole update's expected first step keep its direction when every return becomes a R + b (a > 0)?",
               "share of (problem, start, transform) whose expected first step keeps its direction (cosine >= 1 - 1e-6)",
               True, reward_invariance, False,
               "range_flip_pg (correct only on rewards spanning [0, 1]): 0"),
    Capability("zero_variance_groups", "Groups with zero variance", "zero-variance groups",
               ("robustness", "groups", "sparse reward"),
               "Is the update finite and zero when no group has signal, and uphill when most groups have none?",
               "share of cases: constant rewards give a finite zero first step; one rewarded answer a finite uphill one",
               True, zero_variance_groups, False,
               "anti_bonus_pg (moves where no reward differs): 0"),
    Capability("sampled_update_safety", "One sampled update keeps J", "sampled-update safety",
               ("finite sample", "monotonicity", "graded"),
               "A run updates on one drawn group, not on the expectation: how likely is one sampled update to lower J?",
               "mean over cases of 1 - P(one sampled update lowers J by more than 1e-7), every group draw enumerated",
               True, sampled.sampled_update_safety, True, "anti_pg: < 0.01"),
    Capability("sampled_update_signal", "Signal in a sampled update", "sampled-update signal",
               ("finite sample", "variance", "graded"),
               "How much of one sampled update's first step is its expectation, and how much noise?",
               "mean over cases of |E g|^2 / E|g|^2 of the first step g over every group draw (1: no noise)",
               True, sampled.sampled_update_signal, False,
               "shifted_pg (the exact advantage plus 100: unbiased, almost all noise): < 0.05"),
    Capability("difficulty_weighting", "Prompts weighted as J weighs them", "prompt weighting",
               ("gradient", "prompts", "graded"),
               "With prompts whose rewards spread differently, does the update weigh each prompt as grad J does?",
               COSINE_RULE,
               True, difficulty_weighting, False, "anti_pg: 0"),
    Capability("length_weighting", "Answers weighted as J weighs them, whatever their length", "answer lengths",
               ("gradient", "lengths", "graded"),
               "With answers of different lengths (one prompt), does the update weigh each answer as grad J does?",
               COSINE_RULE,
               True, length_weighting, False,
               "anti_pg: 0; length_mean_pg (the exact advantage, each answer's tokens averaged): < 1"),
    Capability("off_policy_robustness", "Stale and mismatched rollouts", "stale rollouts",
               ("off policy", "robustness", "graded"),
               "When the rows come from a policy one update stale, or through an engine that samples them otherwise, "
               "does the whole update (its rollout correction included) keep the step it takes on policy?",
               "mean over cases of the cosine between the whole update's expected first step on rows from the behaviour "
               "policy and on rows from the policy itself, floored at 0",
               True, open_questions.off_policy_robustness, False,
               "exact_pg (no correction): < 1; exact_pg_sequence_is (the uncapped trajectory weight): 1"),
    Capability("kl_gradient", "KL term down grad KL(pi || ref)", "KL gradient", ("KL", "regularisation", "graded"),
               "Does the algorithm's KL term, as it places, estimates and aggregates it, pull the policy down the "
               "gradient of KL(pi || ref) over whole trajectories (the regularised objective J - beta KL)?",
               "mean over cases of the cosine between the whole update's expected first step where every reward is 0 "
               "and -grad KL(pi || ref), floored at 0; no score without a KL term",
               True, open_questions.kl_gradient, False,
               "k1_loss_pg (k1 in the loss: expected gradient 0): 0; k1_reward_pg: 1"),
    Capability("pass_at_k_retention", "pass@64 kept while pass@1 rises", "pass@k kept",
               ("diversity", "pass@k", "shared", "graded"),
               "With prompts sharing parameters, does the algorithm raise pass@1 without making some prompt's right "
               "answers unreachable (pass@64 falling)?",
               "mean over runs whose pass@1 rose of pass@64 after the algorithm's own exact updates (1 at the start); "
               "no score when none rose",
               True, open_questions.pass_at_k_retention, True,
               "sharpened_pg (the exact advantage plus 10 log pi: also down the entropy): < 0.8", reads_rollouts=True),
    Capability("lm_bridge", "Language-model bridge", "LM bridge", ("language model", "sampled"),
               "Does the algorithm's code, run on a tiny language model, raise its exact J?",
               "mean over seeds of the share of the gap to J* closed (clipped to [0, 1]), with a t interval over seeds",
               False, lm_bridge),
)
NAMES = tuple(c.name for c in CAPABILITIES)
