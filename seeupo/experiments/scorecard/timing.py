"""The scorecard's plan line: each capability's seconds on this machine, estimated by timing one small unit of it
(:func:`estimate_seconds`) before the card starts."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import torch

from seeupo.experiments.gradient_check import policy_at, random_starts
from seeupo.experiments.scorecard import sampled
from seeupo.experiments.scorecard.base import Context, _generator, constant_J
from seeupo.experiments.scorecard.capabilities import (
    TRANSFORMS,
    Part,
    _flat_direction,
    _needle_bandit,
    _part_run,
    monotone_parts,
)
from seeupo.tabular.problems import random_family, random_token_bandit


@dataclass(frozen=True)
class Unit:
    """A small piece of a capability that :func:`estimate_seconds` times: running ``run`` once stands for ``times``
    of it in the capability (one update of a part's runs, some steps of an ascent, one expected direction)."""

    run: Callable[[], object]
    times: float


def _monotone_units(ctx: Context, capability: str) -> list[Unit]:
    """One update of each distinct problem of the capability (a uniform and a random start share one), standing for
    every update of its runs; its ``J*`` and ``constant_J`` counted with each update (a small overestimate)."""
    from seeupo.tabular.train import AlgorithmStep, track

    groups: dict[tuple[int, str, int | None], tuple[Part, int]] = {}
    for part in monotone_parts(ctx.sizes, capability):
        key = (id(part.problem), part.parameterization, part.group_size)
        iterations = (part.iterations or ctx.sizes.iterations) * ctx.iterations_factor
        first, total = groups.get(key, (part, 0))
        groups[key] = (first, total + iterations)

    def one_update(part: Part) -> Callable[[], object]:
        def run() -> object:
            algorithm, run_cfg, _, policy = _part_run(ctx, part)
            constant_J(part.problem)
            return track(part.problem, AlgorithmStep(algorithm, run_cfg), policy, 1)
        return run

    return [Unit(one_update(part), total) for part, total in groups.values()]


def _convergence_units(ctx: Context) -> list[Unit]:
    """One own exact update of each convergence problem (all its instances at once), standing for every update of its
    run (``convergence_speed`` reads the same runs: no units of its own)."""
    from seeupo.tabular.train import AlgorithmStep, RunConfig, TabularPolicy, track

    s = ctx.sizes
    algorithm = ctx.config.replace(group_size=s.group_size)
    run_cfg = RunConfig(mode="exact", iterations=1, optimizer=ctx.optimizer, lr=ctx.lr, seed=s.seed,  # type: ignore[arg-type]
                        **ctx.rollouts.run_fields())
    return [Unit(lambda problem=problem: track(problem, AlgorithmStep(algorithm, run_cfg), TabularPolicy(problem), 1),
                 s.convergence_updates * ctx.iterations_factor) for _, problem in sampled.convergence_parts(s)]


def _draw_units(ctx: Context) -> list[Unit]:
    """One law of a sampled update (instance 0, uniform start) per problem, standing for every instance and start of it
    (``sampled_update_signal`` reads the same laws: no units of its own)."""
    from seeupo.tabular.draws import one_sampled_update

    s = ctx.sizes
    units = []
    for _, problem, group_size in sampled.draw_parts(s):
        one = problem.instance(0)
        uniform = random_starts(one, 0, torch.Generator())[0]
        algorithm = ctx.config.replace(group_size=group_size)
        units.append(Unit(lambda one=one, uniform=uniform, algorithm=algorithm: one_sampled_update(
            one, policy_at(one, uniform), algorithm, ctx.optimizer, ctx.lr), s.instances * (1 + s.starts)))
    return units


def _credit_units(ctx: Context) -> list[Unit]:
    """One expected direction (one instance, uniform start) per family and number of turns, standing for every
    instance and start of it."""
    from seeupo.tabular.gradient import gradient_directions

    s = ctx.sizes
    algorithm = ctx.config.replace(group_size=s.group_size)
    units = []
    for k, (family, turns) in enumerate([(f, t) for f in ("stop", "intermediate", "tool") for t in (2, 3)]):
        one = random_family(family, s.instances, turns, reward_levels=3,
                            generator=_generator(s, "agentic_credit", k)).instance(0)
        uniform = random_starts(one, 0, torch.Generator())[0]
        units.append(Unit(lambda one=one, uniform=uniform: gradient_directions(one, policy_at(one, uniform), algorithm,
                                                                                      level="update"),
                          s.instances * (1 + s.starts)))
    return units


def _invariance_units(ctx: Context) -> list[Unit]:
    """One expected direction of each problem, standing for its starts and transforms (zero-variance groups: for its
    constant and needle problems)."""
    s = ctx.sizes
    algorithm = ctx.config.replace(group_size=s.group_size)
    units = []
    for turns in (1, 2):
        problem = random_token_bandit(s.instances, turns, 2, 2, reward_levels=3,
                                      generator=_generator(s, "reward_invariance", turns - 1))
        uniform = random_starts(problem, 0, torch.Generator())[0]
        units.append(Unit(lambda problem=problem, uniform=uniform: _flat_direction(problem, uniform, algorithm),
                          (1 + s.starts) * (1 + len(TRANSFORMS))))
    return units


def _zero_variance_units(ctx: Context) -> list[Unit]:
    s = ctx.sizes
    algorithm = ctx.config.replace(group_size=s.group_size)
    units = []
    for turns in (1, 2):
        problem = _needle_bandit(s.instances, turns, _generator(s, "zero_variance_groups", turns))
        uniform = random_starts(problem, 0, torch.Generator())[0]
        units.append(Unit(lambda problem=problem, uniform=uniform: _flat_direction(problem, uniform, algorithm),
                          3 * (1 + s.starts)))
    return units


def _difficulty_units(ctx: Context) -> list[Unit]:
    """One expected first step of the prompts problem, standing for each of its starts."""
    from seeupo.experiments.scorecard.capabilities import _prompts_problem

    s = ctx.sizes
    algorithm = ctx.config.replace(group_size=s.group_size)
    problem = _prompts_problem(s)
    uniform = random_starts(problem, 0, torch.Generator())[0]
    return [Unit(lambda: _flat_direction(problem, uniform, algorithm), 1 + s.starts)]


def _length_units(ctx: Context) -> list[Unit]:
    """One expected first step of each answer-length problem, standing for each of its starts."""
    from seeupo.experiments.scorecard.capabilities import LENGTH_SPELLINGS

    s = ctx.sizes
    algorithm = ctx.config.replace(group_size=s.group_size)
    out = []
    for k, (vocab, length) in enumerate(LENGTH_SPELLINGS):
        problem = random_token_bandit(s.instances, 1, vocab, length, end_token=0, reward_levels=3,
                                      generator=_generator(s, "length_weighting", k))
        uniform = random_starts(problem, 0, torch.Generator())[0]
        out.append(Unit(lambda problem=problem, uniform=uniform: _flat_direction(problem, uniform, algorithm),
                        1 + s.starts))
    return out


def _uniform_start_only(ctx: Context) -> Context:
    return dataclasses.replace(ctx, sizes=dataclasses.replace(ctx.sizes, starts=0))


def _off_policy_units(ctx: Context) -> list[Unit]:
    """The capability from the uniform start alone (its on-policy step and one step per engine on each bandit),
    standing for each start."""
    from seeupo.experiments.scorecard import open_questions

    return [Unit(lambda: open_questions.off_policy_robustness(_uniform_start_only(ctx)), 1 + ctx.sizes.starts)]


def _kl_units(ctx: Context) -> list[Unit]:
    """The capability from the uniform policy alone, standing for each policy."""
    from seeupo.experiments.scorecard import open_questions

    return [Unit(lambda: open_questions.kl_gradient(_uniform_start_only(ctx)), 1 + ctx.sizes.starts)]


def _pass_at_k_units(ctx: Context) -> list[Unit]:
    """One own exact update of the pass@k problem, standing for every update of its run."""
    from seeupo.experiments.scorecard import open_questions

    one = dataclasses.replace(ctx, sizes=dataclasses.replace(ctx.sizes, convergence_updates=1), iterations_factor=1)
    return [Unit(lambda: open_questions.pass_at_k_runs(one), ctx.sizes.convergence_updates * ctx.iterations_factor)]


def units(ctx: Context, capability: str) -> list[Unit]:
    """The units :func:`estimate_seconds` times for ``capability`` (none for the bridge: a fixed figure prices it)."""
    if capability in ("single_turn_monotone", "multi_turn_monotone", "stochastic_outcomes", "shared_parameters"):
        return _monotone_units(ctx, capability)
    return {"multi_turn_convergence": _convergence_units, "convergence_speed": lambda ctx: [],
            "agentic_credit": _credit_units, "reward_invariance": _invariance_units,
            "zero_variance_groups": _zero_variance_units, "sampled_update_safety": _draw_units,
            "sampled_update_signal": lambda ctx: [], "difficulty_weighting": _difficulty_units,
            "length_weighting": _length_units, "off_policy_robustness": _off_policy_units, "kl_gradient": _kl_units,
            "pass_at_k_retention": _pass_at_k_units, "lm_bridge": lambda ctx: []}[capability](ctx)


def estimate_seconds(ctx: Context, capability: str, clock: Callable[[], float] = time.perf_counter) -> float:
    """``capability``'s seconds on this machine: each of its :func:`units` timed once and counted as often as the
    capability runs it. What the units take is part of the wall time a plan states (they are not reused)."""
    total = 0.0
    for unit in units(ctx, capability):
        t = clock()
        unit.run()
        total += (clock() - t) * unit.times
    return total

