"""The plan of ``seeupo check``: how much it measures (:class:`CheckBudget`), how fast this machine is
(:func:`calibrate`) and what each part should cost (:func:`plan`).

The sizes are the budget's own, never this machine's: every part has a fixed, seeded number of
cases (the flags decide it), so that the verdict is a function of the algorithm, its plugins, the
flags and the seed. Each part is timed on this machine (a two-iteration cell, three search cases,
one expected direction) for the estimate only; the bridge's estimate is a fixed figure measured on
2 CPU cores (:data:`BRIDGE_SECONDS_PER_STEP`, ...). A budget in seconds stops the check when it
passes; it never changes what is planned, and a check it stops is inconclusive.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from seeupo.experiments.gradient_check import GradientConfig
from seeupo.experiments.verify import VerifyConfig

@dataclass(frozen=True)
class CheckBudget:
    """How much ``seeupo check`` measures.

    verify: the verification cells' size (its ``algorithms`` and ``plugins`` are filled in).
    max_examples: cases per search (hypothesis examples, shrinking not counted).
    bridge_steps, bridge_seeds, bridge_lr: the bridge run's training steps, seeds and learning rate
      (the same for the algorithm and for :data:`BRIDGE_BASELINES`).
    bridge_warmup: the cap on the format warm-up's steps (at ``bridge_warmup_lr``); the warm-up stops
      as soon as the exact probability of a valid first answer is at least ``bridge_warmup_target``
      (measured every 5 steps); below it after the cap, the bridge is vacuous.
    bridge_tasks_per_step, bridge_group_size: rollouts per step (tasks x group).
    bridge_also: more algorithms trained on the bridge beside the checked one and
      :data:`BRIDGE_BASELINES`, from the same warm-up (``check NAME --compare``: one bridge for all).

    The bridge's settings were chosen by measurement (tiny Qwen3, problem
    :data:`seeupo.experiments.bridge_lm.BRIDGE`, seeds 0-2): the warm-up at lr 3e-3 passes 0.9 after
    25 steps (P = 0.93, 0.93, 0.94); then at lr 1e-3 with 4 x 4 rollouts ``grpo`` raises the exact
    ``J`` by 0.22-0.26 in 3 steps and 0.33-0.39 in 5, ``seeupo`` by 0.16-0.24 in 3 and 0.32-0.42
    in 5, with no collapse (at lr 3e-3 and 8 x 8, ``seeupo`` fell to J = 0 in 2 of 3 seeds).
    seconds: a wall-clock limit: the check stops when it passes, with a partial report whose verdict is
      inconclusive unless a decrease was found (``None``: no limit, the plan runs to its end). It never
      changes the sizes above.

    Wall time of the bridge on a shared 2-core machine (load 3-4): 9 s quick, 20-23 s default
    (three algorithms x three seeds x five steps, model loading and warm-ups included).
    """

    verify: VerifyConfig
    max_examples: int
    bridge_steps: int
    bridge_seeds: tuple[int, ...]
    bridge_warmup: int
    bridge_lr: float = 1e-3
    bridge_warmup_lr: float = 3e-3
    bridge_warmup_target: float = 0.9
    bridge_tasks_per_step: int = 4
    bridge_group_size: int = 4
    bridge_also: tuple[str, ...] = ()
    seconds: float | None = None
    gradient: GradientConfig = GradientConfig()


#: The default check (benchmarks/RESULTS.md gives its time against the estimate).
DEFAULT = CheckBudget(VerifyConfig(instances=12, iterations=15, counterexample_dir=""), max_examples=150,
                      bridge_steps=5, bridge_seeds=(0, 1, 2), bridge_warmup=100)
#: --quick: a prefix of the default's evidence (the same problems, starts, epochs and search cases, fewer of them),
#: so that what it finds the default finds too.
#: Its problems are the default's (problems are drawn as a batch: fewer would be other problems), with fewer
#: iterations, exact independent-parameter cells only, fewer search cases, a shorter ascent on the 2-turn problems
#: only (a 3-turn ascent of an estimator that enumerates its group-mates takes minutes), and one bridge seed.
QUICK = CheckBudget(dataclasses.replace(DEFAULT.verify, iterations=8, modes=("exact",), parameterizations=("independent",)),
                    max_examples=8, bridge_steps=3, bridge_seeds=(0,), bridge_warmup=100,
                    gradient=dataclasses.replace(DEFAULT.gradient, ascent_steps=150, ascent_turns=(2,)))

#: The built-in algorithms run beside the checked one on the bridge, on the same settings.
BRIDGE_BASELINES = ("grpo", "seeupo")

SAMPLED_COST = 0.5  # a sampled iteration (4 cheap updates) against an exact one (40 epochs): measured 0.4 on 2 cores
SHRINK_MARGIN = 1.0  # shrinking a case found costs up to 200 more evaluations (SHRINK_CALLS): not priced, since
# whether a search finds a case is what it measures
SEARCH_UNIT = 12  # cases of the calibration's timed search: a search of 3 cases cost 0.2-0.46 s a case, a search of
# 150 cases 0.038 s a case (grpo, 2026-11-29): a few cases price hypothesis's start-up, not a case
WRITE_SECONDS = 5.0  # the report, figure and replay at the end
# the bridge on 2 CPU cores shared with other work (2026-11-26, load 3-4, one torch thread): the default
# (3 seeds; a warm-up of about 25 steps each, then 3 algorithms x 5 steps) took 20-23 s, the quick one
# 9 s (CheckBudget); the estimate below is about 1.5x that, with the warm-up at its cap of steps
BRIDGE_SECONDS_PER_STEP = 0.3  # one training step of one algorithm (the algorithm and its baselines each train)
BRIDGE_SECONDS_PER_WARMUP_STEP = 0.05  # a format warm-up step, counted at the cap (it stops earlier at the target)
BRIDGE_LOAD_SECONDS = 3.0  # per seed: building the model and the trainers
POOL_START_SECONDS = 5.0  # verify's worker processes import torch and the plugins


@dataclass(frozen=True)
class Calibration:
    """This machine's speed on this algorithm, measured by :func:`calibrate`.

    iteration: seconds per exact-mode iteration of one verify cell (two-turn, the dearer setting;
      with the row's own factor, e.g. RLOO's ten SGD steps). Without an exact mode, a sampled one.
    search_case: seconds per search case (two exact updates: as drawn and with a tightened inner loop).
    search_start: seconds a search takes before its first case (hypothesis's set-up), once per search.
    gradient_call: seconds per case of the gradient part: the estimator's direction and the update's on a batch
      of its instances (three turns, stochastic tool results: the dearest family); 0 without an exact mode.
    seconds: what the calibration itself took.
    agentic_iteration: seconds per exact-mode iteration of an agentic family's cell (tool results,
      the dearest family); 0 without an exact mode (no family cell runs).
    ascent_call: seconds per step of the gradient part's plain ascent (the update's direction on the
      ascent's problems, the mean over the families and numbers of turns it climbs); 0 without an exact mode.
    """

    iteration: float
    search_case: float
    seconds: float
    gradient_call: float = 0.0
    agentic_iteration: float = 0.0
    ascent_call: float = 0.0
    search_start: float = 0.0


def calibrate(name: str, cfg: VerifyConfig, exact: bool, gradient: GradientConfig = GradientConfig()) -> Calibration:
    """Time a two-iteration verify cell, three search cases and one expected direction of ``name`` (after one
    warm-up cell)."""
    from seeupo.experiments.counterexamples import robust_decrease, search
    from seeupo.experiments.searches import algorithm_searches
    from seeupo.experiments.verify import algorithm_rows, run_cell

    start = time.perf_counter()
    row = algorithm_rows([name], cfg.exact_epochs)[0]
    mode = "exact" if exact else "sampled"
    tiny = dataclasses.replace(cfg, instances=2, iterations=2, workers=1, sampled_iterations_factor=1)
    run_cell(row, "ST", mode, "independent", dataclasses.replace(tiny, iterations=1))  # first calls: imports, caches
    t = time.perf_counter()
    run_cell(row, "MT", mode, "independent", tiny)
    iteration = (time.perf_counter() - t) / 2
    search_case = search_start = gradient_call = agentic_iteration = ascent_call = 0.0
    if exact and cfg.families:
        t = time.perf_counter()
        run_cell(row, "tool" if "tool" in cfg.families else cfg.families[0], "exact", "independent", tiny)
        agentic_iteration = (time.perf_counter() - t) / 2
    if exact:
        # a case reads the estimator's direction and the update's (check_family), on the dearest batch
        gradient_call = (_time_gradient_call(name, gradient, ["tool"], max(gradient.turns), "estimator")
                         + _time_gradient_call(name, gradient, ["tool"], max(gradient.turns), "update"))
        if gradient.ascent_steps and gradient.ascent_turns:
            ascent_call = _time_ascent_step(name, gradient)
        spec = algorithm_searches(name)[3]  # two turns, stochastic outcomes: the dearest problems

        def timed_search(cases: int) -> float:
            t = time.perf_counter()
            # a condition that is never met: hypothesis draws the cases and never shrinks
            search(spec.cases(), claim=spec.claim, description=spec.description, max_examples=cases,
                   condition=lambda case: robust_decrease(case) and False)
            return time.perf_counter() - t

        # a search's start-up (hypothesis's set-up, 0.3 s) is paid once per search, not per case: time a search
        # of 1 case and one of SEARCH_UNIT cases (after an untimed one: imports) and tell the two apart
        timed_search(1)
        one, more = timed_search(1), timed_search(SEARCH_UNIT)
        search_case = max(more - one, 0.0) / (SEARCH_UNIT - 1)
        search_start = max(one - search_case, 0.0)
    return Calibration(iteration, search_case, time.perf_counter() - start, gradient_call, agentic_iteration, ascent_call,
                       search_start)


def _time_gradient_call(name: str, cfg: GradientConfig, families: list[str], turns: int, level: str) -> float:
    """Seconds of one direction verdict at ``level`` (the estimator's or the update's) on the gradient part's batch of
    ``turns`` turns, the mean over ``families``."""
    from seeupo.core.config import PRESETS
    from seeupo.experiments.gradient_check import family_problems
    from seeupo.tabular.gradient import gradient_directions
    from seeupo.tabular.policies import TabularPolicy

    seconds = []
    for family in families:
        problem = family_problems(cfg, family, turns)
        t = time.perf_counter()
        gradient_directions(problem, TabularPolicy(problem), PRESETS[name].replace(group_size=cfg.group_size), level)
        seconds.append(time.perf_counter() - t)
    return sum(seconds) / len(seconds)


def _time_ascent_step(name: str, cfg: GradientConfig) -> float:
    """Seconds of one step of the gradient part's plain ascent (:func:`seeupo.tabular.gradient.plain_ascent` with
    ``level="update"``: the update's direction, then ``J``), the mean over the families and numbers of turns it
    climbs, from the uniform start: there every path is reachable, so no later step builds a larger exact batch
    (measured 1.1-1.3x the mean step of grpo's ascents). Timed as the step itself: a whole verdict adds ``grad J``
    and its scale (1.25x a step), and the estimator's direction on 3 turns alone, the earlier price, is not what
    the ascent runs."""
    from seeupo.core.config import PRESETS
    from seeupo.experiments.gradient_check import family_problems
    from seeupo.tabular.exact import evaluate
    from seeupo.tabular.gradient import direction
    from seeupo.tabular.policies import TabularPolicy

    algorithm = PRESETS[name].replace(group_size=cfg.group_size)
    first = family_problems(cfg, cfg.families[0], cfg.ascent_turns[0])
    direction(first, TabularPolicy(first), algorithm, "update")  # untimed: first calls (imports, the linearity probe)
    seconds = []
    for family in cfg.families:
        for t in cfg.ascent_turns:
            problem = family_problems(cfg, family, t)
            policy = TabularPolicy(problem)
            start = time.perf_counter()
            direction(problem, policy, algorithm, "update")
            evaluate(problem, policy.action_probs())
            seconds.append(time.perf_counter() - start)
    return sum(seconds) / len(seconds)


def gradient_calls(cfg: GradientConfig) -> tuple[int, int]:
    """Expected directions the gradient part computes: ``(directions, ascent steps)``, one direction per family,
    number of turns and start, and one per step of plain ascent (at most ``ascent_steps``: the one estimated)."""
    directions = len(cfg.families) * len(cfg.turns) * (cfg.starts + 1)
    ascent = len(cfg.families) * len([t for t in cfg.ascent_turns if t in cfg.turns]) * cfg.ascent_steps
    return directions, ascent


def gradient_seconds(cfg: GradientConfig, cal: Calibration) -> float:
    """The gradient part's estimated seconds, from ``cal``."""
    directions, ascent = gradient_calls(cfg)
    return directions * cal.gradient_call + ascent * (cal.ascent_call or cal.gradient_call)


def _cells(name: str, cfg: VerifyConfig, exact: bool) -> list[tuple[str, str, str]]:
    """``(setting, mode, parameters)`` of the cells verify runs for ``name`` (as :func:`seeupo.experiments.verify.verify`)."""
    from seeupo.core.config import PRESETS
    from seeupo.experiments.verify import setting_runs, settings

    sequential = PRESETS[name].schedule == "sequential"
    return [(setting, mode, param) for setting in settings(cfg) for mode, param in setting_runs(cfg, setting, sequential)
            if mode == "sampled" or exact]


def _cell_seconds(setting: str, mode: str, cfg: VerifyConfig, cal: Calibration) -> float:
    """The estimated seconds of one verify cell, from ``cal``."""
    from seeupo.experiments.verify import BASE_SETTINGS

    if mode != "exact":
        return cfg.iterations * cal.iteration * cfg.sampled_iterations_factor * SAMPLED_COST
    per_iteration = cal.iteration if setting in BASE_SETTINGS else cal.agentic_iteration or cal.iteration
    return cfg.iterations * per_iteration



@dataclass(frozen=True)
class Plan:
    """What a check will measure and its estimated seconds, from a :class:`Calibration` (:func:`plan`).

    Sizes: ``cells`` (verify cells), ``instances`` (random problems per cell), ``iterations`` (per
    cell), ``searches``, ``max_examples`` (cases per search), ``bridge_seeds``, ``bridge_runs``
    (seeds trained, 0 without the bridge), ``bridge_steps``, ``gradient_calls`` (expected directions
    of the gradient part, its ascent steps included). Seconds: ``calibration`` (measured),
    ``gradient``, ``verify``, ``search_time``, ``bridge`` and ``total`` (estimated); ``budget``: the
    seconds the check should fit, ``None`` for none. The field names are check.json's keys.
    """

    cells: int
    instances: int
    iterations: int
    searches: int
    bridge_seeds: list[int]
    max_examples: int
    bridge_runs: int
    bridge_steps: int
    calibration: float
    verify: float
    search_time: float
    bridge: float
    gradient: float
    gradient_calls: int
    total: float
    budget: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        return cls(**d)


def plan(name: str, budget: CheckBudget, cal: Calibration, *, exact: bool, bridge: bool, searches: int) -> Plan:
    """The parts' sizes and estimated seconds for ``check name`` with ``budget``, from ``cal``."""
    cfg = budget.verify
    cells = _cells(name, cfg, exact)
    cell_seconds = [_cell_seconds(setting, mode, cfg, cal) for setting, mode, _ in cells]
    parallel = max(1, min(cfg.workers, len(cells)))
    verify_s = sum(cell_seconds) / parallel + (POOL_START_SECONDS if cfg.workers > 1 else 0.0)
    searches_s = searches * (cal.search_start + budget.max_examples * cal.search_case * SHRINK_MARGIN) if exact else 0.0
    algorithms = len(bridge_presets(name, budget))
    per_seed = (BRIDGE_LOAD_SECONDS + BRIDGE_SECONDS_PER_STEP * budget.bridge_steps * algorithms
                + BRIDGE_SECONDS_PER_WARMUP_STEP * budget.bridge_warmup)
    bridge_s = len(budget.bridge_seeds) * per_seed if bridge else 0.0
    gradient_s = gradient_seconds(budget.gradient, cal) if exact else 0.0
    total = cal.seconds + gradient_s + verify_s + searches_s + bridge_s + WRITE_SECONDS
    return Plan(cells=len(cells), instances=cfg.instances, iterations=cfg.iterations, searches=searches if exact else 0,
                bridge_seeds=list(budget.bridge_seeds), max_examples=budget.max_examples,
                bridge_runs=len(budget.bridge_seeds) if bridge else 0, bridge_steps=budget.bridge_steps,
                calibration=cal.seconds, verify=verify_s, search_time=searches_s, bridge=bridge_s, gradient=gradient_s,
                gradient_calls=sum(gradient_calls(budget.gradient)) if exact else 0, total=total, budget=budget.seconds)


def bridge_presets(name: str, budget: CheckBudget) -> tuple[str, ...]:
    """The algorithms the bridge trains for ``check name``: ``name``, :data:`BRIDGE_BASELINES`, ``budget.bridge_also``."""
    return tuple(dict.fromkeys((name, *BRIDGE_BASELINES, *budget.bridge_also)))


def plan_text(p: Plan) -> str:
    """The plan as printed before the check starts."""
    parts = [f"gradient {p.gradient_calls} exact directions ~{p.gradient:.0f} s"] if p.gradient_calls else []
    parts.append(f"verify {p.cells} cells x {p.instances} problems x {p.iterations} iterations ~{p.verify:.0f} s")
    if p.searches:
        parts.append(f"{p.searches} searches x {p.max_examples} cases ~{p.search_time:.0f} s")
    if p.bridge_runs:
        parts.append(f"bridge {p.bridge_runs} runs x {p.bridge_steps} steps ~{p.bridge:.0f} s")
    budget = f"; budget {p.budget:.0f} s" if p.budget else ""
    over = (" (over the budget: the check will stop there, inconclusive unless J decreased first)"
            if p.budget and p.total > p.budget else "")
    return ("plan: " + "; ".join(parts) + f"; estimate {p.total:.0f} s in all (calibrated on this machine in "
            f"{p.calibration:.0f} s){budget}{over}")
