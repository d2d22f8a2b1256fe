"""``seeupo check NAME``: the whole journey of one algorithm, from exact toy problems to a language model.

For a registered algorithm (a preset, built in or registered by a plugin) it runs, in order:

0. **gradient**: the estimator's expected update against the policy gradient, and the fixed
   point of plain exact ascent with it, on the agentic problem families (the agent stops when it
   chooses, intermediate rewards, stochastic tool results, token actions;
   :mod:`seeupo.experiments.gradient_check`): whether the estimator is biased and where it leads,
   the verdict that leads check.md;
1. **verify**: the verification cells of :mod:`seeupo.experiments.verify` for this algorithm
   alone (single and multi turn, exact and sampled, independent and shared parameters): the exact
   ``J`` after every iteration on random token bandits, judged with the verdict vocabulary;
2. **searches**: the generic monotonicity searches (:func:`seeupo.experiments.searches.algorithm_searches`):
   hypothesis looks for a case where one exact update lowers ``J``; a case found is shrunk, saved
   under ``OUT/counterexamples/`` with the plugins' hashes, and replayed before it is reported;
3. **bridge**: a short run of the language-model trainer on the 2-turn bridge problem
   (:mod:`seeupo.experiments.bridge_lm`), the tiny random Qwen3 for a few seeds, with the model's
   exact ``J`` after every step, beside the built-in ``grpo`` and ``seeupo`` on the same seeds,
   warm-up and steps (:func:`run_bridge`; needs the ``llm`` extra; skipped with the reason
   otherwise). A warm-up that leaves the model answering out of format makes it *vacuous*;

and writes ``OUT/check.md`` (a report to paste), ``OUT/check.json`` (everything measured) and
``OUT/check.png`` (exact ``J`` per iteration on the toy problems and per step on the bridge).

The verdict on monotonicity uses :data:`seeupo.experiments.verdicts.MEASURED`: ``J decreased``
when an exact update lowered ``J`` (a replaying counterexample or a random instance), ``no
learning signal`` when some exact cell or search never moved ``J`` (nothing was measured there),
else ``monotone`` with the budget that found nothing. It says what was measured, not that the
algorithm is monotone: a search that finds nothing bounds nothing beyond its cases. The
counterexamples the searches find are replayed into the verify cells too
(:func:`seeupo.experiments.verify.apply_counterexamples`): one report, one truth.

Time. Before it starts, ``check`` times one small unit of each part on this machine
(:func:`calibrate`: a two-iteration cell, three search cases), prints its plan with an estimate
(:func:`plan`) and, given a budget in seconds, fits it: fewer verify iterations first, then fewer
search cases; each search also stops at its share of the time left (a case found is kept, not
shrunk to the end). The bridge keeps its steps and warm-up (they are the bridge's own settings)
but may run fewer seeds, at least one: its estimate is a fixed figure measured on 2 CPU cores
(:data:`BRIDGE_SECONDS_PER_STEP`, ...).

Explanations. Each counterexample a search finds (and that replays) is explained
(:mod:`seeupo.experiments.explain`): the one-line cause goes next to it in check.md, the full text
into ``counterexamples/NAME.explain.md``; an explanation that fails is one line in the report.

Compare. ``check NAME --compare A,B`` (:func:`compare`) runs the same check for each algorithm
(the same problems, seeds, verify sizes and searches, and one bridge run in which all of them
train from the same warm-up) and reports them side by side; the budget covers them all, split
equally (the first algorithm's share holds the bridge of all).

Interruption. Ctrl-C or SIGTERM stops the check where it is and writes the report of what
finished, marked partial, with every counterexample found so far (a search interrupted while
shrinking keeps its last failing case). ``--overwrite`` never deletes: an earlier check's files
are moved into ``previous-<UTC time>/`` in the same folder, and the report lists them.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from seeupo.experiments.gradient_check import QUICK as QUICK_GRADIENT
from seeupo.experiments.gradient_check import GradientConfig
from seeupo.experiments.verdicts import NO_DECREASE_FOUND, NO_SIGNAL, refused_label, search_outcome
from seeupo.experiments.verify import QUICK as QUICK_VERIFY
from seeupo.experiments.verify import VerifyConfig

#: What ``seeupo check`` writes in its folder (``--overwrite`` moves these aside, never deletes them).
OUTPUTS = ("check.json", "check.md", "check.png", "gradient", "counterexamples", "bridge", "algorithms")


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
    seconds: the wall-clock time the whole check should fit (:func:`fit`); ``None``: the sizes as given.

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


#: The default fits 3 minutes on 2 CPU cores (benchmarks/check_time.py): 170 s planned, the rest
#: for starting Python and writing the report.
DEFAULT = CheckBudget(VerifyConfig(instances=12, iterations=15, counterexample_dir=""), max_examples=150,
                      bridge_steps=5, bridge_seeds=(0, 1, 2), bridge_warmup=100, seconds=170.0)
#: --quick: small sizes within a stated budget of a minute (the searches and their shrinking stop at their share).
QUICK = CheckBudget(dataclasses.replace(QUICK_VERIFY, counterexample_dir=""), max_examples=8,
                    bridge_steps=3, bridge_seeds=(0,), bridge_warmup=100, gradient=QUICK_GRADIENT, seconds=60.0)
#: The toolkit's committed counterexamples, consulted by ``check`` of a built-in algorithm as ``verify`` does.
COMMITTED_COUNTEREXAMPLES = "paper_repro/counterexamples"

#: The built-in algorithms run beside the checked one on the bridge, on the same settings.
BRIDGE_BASELINES = ("grpo", "seeupo")
#: A mean change of the exact ``J`` over the bridge's steps smaller than this leaves ``J`` where it
#: was. ``J`` is exact up to float32 scoring (~1e-6), and an update without signal (an estimator
#: of zeros) moves it by exactly 0; the built-ins raise it by >= 0.16 in the quick setting, so
#: 0.01 separates "learns" from "does not" with an order of magnitude to spare on each side.
BRIDGE_TOLERANCE = 0.01

MIN_ITERATIONS = 6  # fewer verify iterations than this say little about convergence
MIN_EXAMPLES = 2  # cases per search, whatever the budget (the deadline still stops it)
SAMPLED_COST = 0.5  # a sampled iteration (4 cheap updates) against an exact one (40 epochs): measured 0.4 on 2 cores
SHRINK_MARGIN = 1.0  # shrinking a case found costs more, but the calibrated cases include hypothesis's start-up, which
# overstates a case by about as much (measured: 26 planned cases ran in 1-2 s a search); the deadlines bound the rest
WRITE_SECONDS = 5.0  # the report, figure and replay at the end
# the bridge on 2 CPU cores shared with other work (2026-11-26, load 3-4, one torch thread): the default
# (3 seeds; a warm-up of about 25 steps each, then 3 algorithms x 5 steps) took 20-23 s, the quick one
# 9 s (CheckBudget); the estimate below is about 1.5x that, with the warm-up at its cap of steps
BRIDGE_SECONDS_PER_STEP = 0.3  # one training step of one algorithm (the algorithm and its baselines each train)
BRIDGE_SECONDS_PER_WARMUP_STEP = 0.05  # a format warm-up step, counted at the cap (it stops earlier at the target)
BRIDGE_LOAD_SECONDS = 3.0  # per seed: building the model and the trainers
BRIDGE_SHARE = 2 / 3  # the bridge may take this much of a budget (fewer seeds, at least one)
POOL_START_SECONDS = 5.0  # verify's worker processes import torch and the plugins


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C's ``KeyboardInterrupt`` so that every part stops the same way."""


def _count(n: int, noun: str) -> str:
    """``"1 seed"``, ``"3 seeds"``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def prepare_output(out: Path, overwrite: bool, say: Callable[[str], None] = print) -> list[str]:
    """Make ``out`` ready for a check; returns what an earlier check left there, as moved (``previous-*/NAME``).

    A folder that holds anything is refused unless ``overwrite``; then the earlier check's files
    (:data:`OUTPUTS`) are moved into ``out/previous-<UTC time>/``, said before it happens, and
    nothing is deleted (a counterexample may have cost minutes of search). Other files stay.
    """
    from seeupo.validation import InputError

    if not out.exists() or not any(out.iterdir()):
        return []
    if not overwrite:
        raise InputError(None, f"argument --out: {out} is not empty; choose another folder or pass --overwrite "
                               "(which moves the earlier check's files into previous-<time>/, deleting nothing)")
    present = [name for name in OUTPUTS if (out / name).exists()]
    if not present:
        return []
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder, k = out / f"previous-{stamp}", 1
    while folder.exists():
        folder, k = out / f"previous-{stamp}-{k}", k + 1
    moved = [f"{folder.name}/{name}" for name in present]
    say(f"--overwrite: moving the earlier check's files aside, nothing deleted: {', '.join(moved)}")
    folder.mkdir()
    for name in present:
        (out / name).rename(folder / name)
    return moved


# ----------------------------------------------------------------------------------- time


@dataclass(frozen=True)
class Calibration:
    """This machine's speed on this algorithm, measured by :func:`calibrate`.

    iteration: seconds per exact-mode iteration of one verify cell (two-turn, the dearer setting;
      with the row's own factor, e.g. RLOO's ten SGD steps). Without an exact mode, a sampled one.
    search_case: seconds per search case (two exact updates: as drawn and with a tightened inner loop).
    gradient_call: seconds per expected direction on a batch of the gradient part's instances (three
      turns, stochastic tool results: the dearest family); 0 without an exact mode.
    seconds: what the calibration itself took.
    agentic_iteration: seconds per exact-mode iteration of an agentic family's cell (tool results,
      the dearest family); 0 without an exact mode (no family cell runs).
    ascent_call: seconds per step of the gradient part's plain ascent (one expected direction on the
      ascent's problems, the mean over the families); 0 without an exact mode.
    """

    iteration: float
    search_case: float
    seconds: float
    gradient_call: float = 0.0
    agentic_iteration: float = 0.0
    ascent_call: float = 0.0


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
    search_case = gradient_call = agentic_iteration = ascent_call = 0.0
    if exact and cfg.families:
        t = time.perf_counter()
        run_cell(row, "tool" if "tool" in cfg.families else cfg.families[0], "exact", "independent", tiny)
        agentic_iteration = (time.perf_counter() - t) / 2
    if exact:
        gradient_call = _time_gradient_call(name, gradient, ["tool"], max(gradient.turns))
        if gradient.ascent_steps and gradient.ascent_turns:
            ascent_call = _time_gradient_call(name, gradient, list(gradient.families), max(gradient.ascent_turns))
        spec = algorithm_searches(name)[3]  # two turns, stochastic outcomes: the dearest problems
        t = time.perf_counter()
        # a condition that is never met: hypothesis draws the cases and never shrinks
        tried = search(spec.cases(), claim=spec.claim, description=spec.description, max_examples=3,
                       condition=lambda case: robust_decrease(case) and False).examples
        search_case = (time.perf_counter() - t) / max(1, tried)
    return Calibration(iteration, search_case, time.perf_counter() - start, gradient_call, agentic_iteration, ascent_call)


def _time_gradient_call(name: str, cfg: GradientConfig, families: list[str], turns: int) -> float:
    """Seconds of one expected direction on the gradient part's batch of ``turns`` turns, the mean over ``families``."""
    from seeupo.core.config import PRESETS
    from seeupo.experiments.gradient_check import family_problems
    from seeupo.tabular.gradient import gradient_directions
    from seeupo.tabular.policies import TabularPolicy

    seconds = []
    for family in families:
        problem = family_problems(cfg, family, turns)
        t = time.perf_counter()
        gradient_directions(problem, TabularPolicy(problem), PRESETS[name].replace(group_size=cfg.group_size))
        seconds.append(time.perf_counter() - t)
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


def plan(name: str, budget: CheckBudget, cal: Calibration, *, exact: bool, bridge: bool, searches: int) -> dict[str, Any]:
    """The parts' sizes and estimated seconds, from ``cal``: ``{"verify", "searches", "bridge", "total"}`` and the sizes."""
    cfg = budget.verify
    cells = _cells(name, cfg, exact)
    cell_seconds = [_cell_seconds(setting, mode, cfg, cal) for setting, mode, _ in cells]
    parallel = max(1, min(cfg.workers, len(cells)))
    verify_s = sum(cell_seconds) / parallel + (POOL_START_SECONDS if cfg.workers > 1 else 0.0)
    searches_s = searches * budget.max_examples * cal.search_case * SHRINK_MARGIN if exact else 0.0
    algorithms = len(bridge_presets(name, budget))
    per_seed = (BRIDGE_LOAD_SECONDS + BRIDGE_SECONDS_PER_STEP * budget.bridge_steps * algorithms
                + BRIDGE_SECONDS_PER_WARMUP_STEP * budget.bridge_warmup)
    bridge_s = len(budget.bridge_seeds) * per_seed if bridge else 0.0
    gradient_s = gradient_seconds(budget.gradient, cal) if exact else 0.0
    total = cal.seconds + gradient_s + verify_s + searches_s + bridge_s + WRITE_SECONDS
    return {"cells": len(cells), "instances": cfg.instances, "iterations": cfg.iterations, "searches": searches if exact else 0,
            "bridge_seeds": list(budget.bridge_seeds),
            "max_examples": budget.max_examples, "bridge_runs": len(budget.bridge_seeds) if bridge else 0,
            "bridge_steps": budget.bridge_steps, "calibration": cal.seconds, "verify": verify_s, "search_time": searches_s,
            "bridge": bridge_s, "gradient": gradient_s, "gradient_calls": sum(gradient_calls(budget.gradient)) if exact else 0,
            "total": total, "budget": budget.seconds}


def bridge_presets(name: str, budget: CheckBudget) -> tuple[str, ...]:
    """The algorithms the bridge trains for ``check name``: ``name``, :data:`BRIDGE_BASELINES`, ``budget.bridge_also``."""
    return tuple(dict.fromkeys((name, *BRIDGE_BASELINES, *budget.bridge_also)))


def fit(name: str, budget: CheckBudget, cal: Calibration, *, exact: bool, bridge: bool, searches: int) -> CheckBudget:
    """``budget`` scaled to fit ``budget.seconds`` by the estimate of :func:`plan` (unchanged without a budget).

    The bridge may take :data:`BRIDGE_SHARE` of it (fewer seeds, at least one: its steps and
    warm-up are the bridge's own settings); the verify cells at most a third of what the bridge
    leaves (fewer iterations, down to :data:`MIN_ITERATIONS`); the searches get the rest (fewer
    cases, down to :data:`MIN_EXAMPLES`). Sizes only shrink, never grow beyond ``budget``'s own.
    """
    if budget.seconds is None:
        return budget
    if bridge:
        per_seed = plan(name, dataclasses.replace(budget, bridge_seeds=(0,)), cal, exact=exact, bridge=True,
                        searches=searches)["bridge"]
        seeds = max(1, min(len(budget.bridge_seeds), math.floor(budget.seconds * BRIDGE_SHARE / per_seed)))
        budget = dataclasses.replace(budget, bridge_seeds=budget.bridge_seeds[:seeds])
    first = plan(name, budget, cal, exact=exact, bridge=bridge, searches=searches)
    free = budget.seconds - cal.seconds - WRITE_SECONDS - first["bridge"] - first["gradient"]
    cfg = budget.verify
    if first["verify"] > free / 3 and first["verify"] > 0:
        iterations = max(MIN_ITERATIONS, math.floor(cfg.iterations * (free / 3) / first["verify"]))
        cfg = dataclasses.replace(cfg, iterations=min(cfg.iterations, iterations))
    budget = dataclasses.replace(budget, verify=cfg)
    verify_s = plan(name, budget, cal, exact=exact, bridge=bridge, searches=searches)["verify"]
    if exact and searches and cal.search_case > 0:
        cases = math.floor((free - verify_s) / (searches * cal.search_case * SHRINK_MARGIN))
        budget = dataclasses.replace(budget, max_examples=max(MIN_EXAMPLES, min(budget.max_examples, cases)))
    return budget


def plan_text(p: dict[str, Any]) -> str:
    """The plan as printed before the check starts."""
    parts = [f"gradient {p['gradient_calls']} exact directions ~{p['gradient']:.0f} s"] if p.get("gradient_calls") else []
    parts.append(f"verify {p['cells']} cells x {p['instances']} problems x {p['iterations']} iterations ~{p['verify']:.0f} s")
    if p["searches"]:
        parts.append(f"{p['searches']} searches x {p['max_examples']} cases ~{p['search_time']:.0f} s")
    if p["bridge_runs"]:
        parts.append(f"bridge {p['bridge_runs']} runs x {p['bridge_steps']} steps ~{p['bridge']:.0f} s")
    budget = f"; budget {p['budget']:.0f} s" if p["budget"] else ""
    over = " (over the budget: the searches stop at their share of it)" if p["budget"] and p["total"] > p["budget"] else ""
    return ("plan: " + "; ".join(parts) + f"; estimate {p['total']:.0f} s in all (calibrated on this machine in "
            f"{p['calibration']:.0f} s){budget}{over}")


# ----------------------------------------------------------------------------------- parts


def run_searches(name: str, budget: CheckBudget, out: Path, seed: int, say: Callable[[str], None],
                 results: list[dict[str, Any]], deadline: float | None = None) -> None:
    """The generic searches of ``name``, appended to ``results`` as they finish; each case found is saved and replayed.

    ``deadline`` (``time.monotonic()``) is shared out: each search may use an equal part of what is
    left when it starts. An interrupt saves what the interrupted search had found, then goes on up.
    """
    from seeupo.experiments.counterexamples import case_setting, replay, search
    from seeupo.experiments.searches import algorithm_searches

    specs = algorithm_searches(name)
    for i, spec in enumerate(specs):
        _stop_if_signalled()
        start = time.perf_counter()
        mine = None if deadline is None else time.monotonic() + (deadline - time.monotonic()) / (len(specs) - i)
        result = search(spec.cases(), claim=spec.claim, description=spec.description,
                        max_examples=budget.max_examples, seed=seed, deadline=mine, keep_on_interrupt=True,
                        setting=spec.setting)
        found = result.found
        entry: dict[str, Any] = {"search": spec.name, "description": spec.description, "max_examples": budget.max_examples,
                                 "examples": result.examples, "moved": result.moved, "seed": seed,
                                 "found": found is not None, "stopped": result.stopped}
        if found is not None:
            path = out / "counterexamples" / f"{spec.name}.json"
            found.save(path)
            entry |= {"file": str(path.relative_to(out)), "J": found.J, "largest_decrease": found.largest_decrease,
                      "group_size": found.algorithm.group_size, "turns": found.problem.num_turns,
                      "setting": case_setting(found),
                      "parameterization": found.run.parameterization}
            if result.stopped != "interrupted":  # replaying costs an update: not when asked to stop
                entry["reproduces"] = replay(found).reproduces
                entry["explanation"] = explain_case(found, path, out)
        entry["seconds"] = time.perf_counter() - start
        results.append(entry)
        say(f"search {spec.name}: {search_outcome(entry)} ({entry['seconds']:.0f} s)")
        if result.stopped == "interrupted":
            raise KeyboardInterrupt


def explain_case(found: Any, path: Path, out: Path) -> dict[str, str]:
    """Explain a counterexample (:func:`seeupo.experiments.explain.explain`) and write the full text beside its file.

    Returns ``{"cause", "summary", "file"}`` (``file``: the rendered text, ``NAME.explain.md``,
    relative to ``out``), or ``{"error": one line}`` when the explanation fails: a report is
    never lost to its explanation.
    """
    from seeupo.experiments.explain import explain, render, summary_line

    try:
        explanation = explain(found)
        text = render(explanation)
    except Exception as error:  # noqa: BLE001 - any failure of the explanation is reported, not raised
        return {"error": f"explain failed ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"}
    target = path.with_name(path.stem + ".explain.md")
    target.write_text(text + ("" if text.endswith("\n") else "\n"))
    return {"cause": explanation.cause, "summary": summary_line(explanation), "file": str(target.relative_to(out))}


def explanation_line(entry: dict[str, Any]) -> str:
    """The bullet of check.md that says why ``J`` fell in a search's counterexample (or why it is not explained)."""
    e = entry.get("explanation")
    if e is None:
        return f"* `{entry['file']}`: not explained (" + (
            "found when interrupted, not replayed)" if entry.get("reproduces") is None else "no explanation recorded)")
    if "error" in e:
        return f"* `{entry['file']}`: no explanation: {e['error']}."
    return f"* `{entry['file']}`: {e['summary']} Full explanation: `{e['file']}`."


def run_bridge(name: str, budget: CheckBudget, out: Path, plugins: tuple[str, ...], say: Callable[[str], None]) -> dict[str, Any]:
    """The bridge part of ``check``: ``name`` and :data:`BRIDGE_BASELINES` on the bridge, exact ``J`` per step.

    First the format warm-up of each seed (shared by every algorithm of the seed); if it leaves
    the exact probability of a valid first answer below ``budget.bridge_warmup_target`` for some
    seed, no algorithm can learn there (almost every return is 0) and the bridge is *vacuous*:
    nothing is trained. Otherwise ``name`` and each baseline train ``budget.bridge_steps`` steps
    from the same warmed weights with the same seeds, and each gets words for what it did to ``J``
    (:func:`learning`). Also vacuous: no baseline raised ``J`` (the settings give no signal).

    Returns, or ``{"skipped": why}`` without the ``llm`` extra:

    * ``algorithm``: ``name``; ``baselines_run``: the baselines trained (those other than ``name``);
    * ``warmup``: ``{"threshold", "max_steps", "lr", "p_valid" (the lowest over seeds), "steps"
      (the most over seeds), "seeds": [{"seed", "steps", "p_valid", "loglik"}, ...]}``;
    * ``vacuous``: ``None``, or the reason in words (the probability reached);
    * ``tolerance``: :data:`BRIDGE_TOLERANCE`;
    * ``learning``: per algorithm run, :func:`learning`'s numbers and words;
    * ``summary``: one sentence on ``name`` beside the baselines;
    * ``row``, ``runs``: ``name``'s table row and per-seed runs (:func:`seeupo.experiments.bridge_lm.build_tables`);
      ``baselines``: ``{preset: {"row": ..., "runs": [...]}}``; ``settings``: the sweep's settings;
    * ``seconds``: the bridge's wall time.
    """
    try:
        import transformers  # noqa: F401
    except ImportError:
        return {"skipped": "needs the language-model extra: pip install 'seeupo[llm]'"}
    import torch

    threads = torch.get_num_threads()
    # one thread: the tiny model's steps are too small to share, and on a busy 2-core machine two threads
    # oversubscribe it (the quick bridge took 66 s with two threads, 6-9 s with one, same load)
    torch.set_num_threads(1)
    try:
        return _run_bridge(name, budget, out, plugins, say)
    finally:
        torch.set_num_threads(threads)


def _run_bridge(name: str, budget: CheckBudget, out: Path, plugins: tuple[str, ...], say: Callable[[str], None]) -> dict[str, Any]:
    from seeupo.experiments import bridge_lm

    start = time.perf_counter()
    model = bridge_lm.ModelSetting("tiny-qwen3", lr=budget.bridge_lr, warmup_steps=budget.bridge_warmup,
                                   warmup_lr=budget.bridge_warmup_lr, warmup_target=budget.bridge_warmup_target,
                                   steps=budget.bridge_steps, seeds=budget.bridge_seeds,
                                   tasks_per_step=budget.bridge_tasks_per_step, group_size=budget.bridge_group_size)
    baselines = bridge_presets(name, budget)[1:]
    sweep = bridge_lm.Sweep(models=(model,), presets=(name, *baselines), seeupo_variants=(), plugins=plugins)
    result: dict[str, Any] = {"algorithm": name, "baselines_run": list(baselines), "tolerance": BRIDGE_TOLERANCE}

    seeds = [bridge_lm.warmup_result(bridge_lm.RunSpec(model, name, "", seed), sweep) for seed in model.seeds]
    worst = min(seeds, key=lambda w: w["p_valid"])
    result["warmup"] = {"threshold": budget.bridge_warmup_target, "max_steps": budget.bridge_warmup,
                        "lr": budget.bridge_warmup_lr, "p_valid": worst["p_valid"],
                        "steps": max(w["steps"] for w in seeds), "seeds": seeds}
    say("bridge warm-up: P(valid first answer) " + ", ".join(f"{w['p_valid']:.3f} (seed {w['seed']}, {w['steps']} steps)"
                                                              for w in seeds) + f"; target {budget.bridge_warmup_target:g}")
    if worst["p_valid"] < budget.bridge_warmup_target:
        result["vacuous"] = (f"the format warm-up reached P(valid first answer) = {worst['p_valid']:.4f} (seed {worst['seed']}, "
                             f"{worst['steps']} of at most {budget.bridge_warmup} steps), below {budget.bridge_warmup_target:g}: "
                             "almost every answer is invalid and scores 0, so no algorithm gets a learning signal")
        result |= {"learning": {}, "summary": "not trained: " + result["vacuous"], "row": None, "runs": [], "baselines": {},
                   "settings": None, "seconds": time.perf_counter() - start}
        say(f"bridge: vacuous ({result['vacuous']})")
        return result

    folder = out / "bridge"
    for spec in bridge_lm.runs_of(sweep):
        bridge_lm.run_one(spec, sweep, folder, log=say)
    tables = bridge_lm.build_tables(sweep, folder)
    rows = {r["preset"]: r for r in tables["rows"]}
    runs = {p: [r for r in tables["runs"] if r["preset"] == p] for p in sweep.presets}
    result["learning"] = {p: learning(runs[p]) for p in sweep.presets}
    result["vacuous"] = None
    base_moved = [p for p in BRIDGE_BASELINES if result["learning"][p]["moved"] == "raised"]
    if not base_moved:
        result["vacuous"] = ("the built-in " + " and ".join(BRIDGE_BASELINES) + " did not raise J either ("
                             + "; ".join(f"{p}: {result['learning'][p]['words']}" for p in BRIDGE_BASELINES)
                             + "): these bridge settings give no learning signal")
    mine = result["learning"][name]
    others = "; ".join(f"{p} {result['learning'][p]['words']}" for p in BRIDGE_BASELINES if p != name)
    result["summary"] = f"{name} {mine['words']}" + (f" (same seeds, warm-up and steps: {others})" if others else "")
    result |= {"settings": tables["settings"], "row": rows.get(name), "runs": runs[name],
               "baselines": {p: {"row": rows.get(p), "runs": runs[p]} for p in baselines},
               "seconds": time.perf_counter() - start}
    say(f"bridge: {result['summary']}" + (f"; vacuous: {result['vacuous']}" if result["vacuous"] else ""))
    return result


def learning(runs: list[dict[str, Any]], tolerance: float = BRIDGE_TOLERANCE) -> dict[str, Any]:
    """What one algorithm's bridge runs did to the exact ``J``: ``raised``, ``lowered`` or ``unchanged``.

    The change is ``J_final - J_initial`` per seed, averaged over seeds; within ``tolerance`` of 0
    ``J`` was left where it was (:data:`BRIDGE_TOLERANCE` says why 0.01).
    """
    changes = [r["J_final"] - r["J_initial"] for r in runs]
    j0 = sum(r["J_initial"] for r in runs) / len(runs)
    j1 = sum(r["J_final"] for r in runs) / len(runs)
    change = j1 - j0
    per_seed = ", ".join(f"{c:+.4f}" for c in changes)
    if abs(change) < tolerance:
        moved, words = "unchanged", (f"left J where it was: {j0:.4f} -> {j1:.4f} (change {change:+.4f}, within "
                                     f"{tolerance:g}; per seed {per_seed})")
    else:
        moved = "raised" if change > 0 else "lowered"
        words = f"{moved} J from {j0:.4f} to {j1:.4f} (change {change:+.4f}; per seed {per_seed})"
    return {"J_initial_mean": j0, "J_final_mean": j1, "change_mean": change, "change_per_seed": changes,
            "moved": moved, "words": words}


def committed_counterexamples(name: str) -> dict[str, Any]:
    """The committed counterexample folder ``check name`` consults (a built-in algorithm's, as ``verify`` does),
    and the words for the report: ``{"folders": (...), "words": ...}``."""
    from seeupo.core.config import BUILTIN_PRESETS
    from seeupo.experiments.verdicts import resolve_dir

    if name not in BUILTIN_PRESETS:
        return {"folders": (), "words": f"none consulted: the committed counterexamples are of the built-in algorithms, and "
                                        f"{name} is not one"}
    folder = resolve_dir(COMMITTED_COUNTEREXAMPLES)
    if not folder.is_dir():
        return {"folders": (), "words": f"not consulted: `{COMMITTED_COUNTEREXAMPLES}` is not here (an installed package "
                                        "without the repository)"}
    return {"folders": (str(folder),), "words": f"consulted: `{COMMITTED_COUNTEREXAMPLES}` (each file of {name} replayed)"}


def monotonicity(verify_report: dict[str, Any], searches: list[dict[str, Any]]) -> dict[str, Any]:
    """The verdict on exact monotonicity, with its evidence.

    ``J decreased`` (a replaying counterexample, found now or committed, or a decrease on a random
    instance) over ``no learning signal`` (no exact cell and no search ever moved ``J``: nothing
    was measured) over ``monotone`` (with the budget that found nothing; parts that moved nothing
    are named in its evidence, never counted as evidence). Nothing finished (a check stopped
    first): ``measured`` is ``None``, no verdict.
    """
    exact = [c for c in verify_report["cells"] if c["mode"] == "exact" and not c.get("refused")]
    decreased_cells = [c for c in exact if c["violations"] > 0]
    flat = [s for s in searches if s["found"] and s.get("reproduces", True) and on_flat_surrogate(s)]
    found = [s for s in searches if s["found"] and s.get("reproduces", True) and s not in flat]
    apart = ([f"not counted: J fell on a flat surrogate in {', '.join(s['search'] for s in flat)} (no expected advantage "
              "above 1e-5 of the batch's scale: the optimizer chose the step, not the estimator; see the explanation)"]
             if flat else [])
    own = {s.get("file") for s in searches}  # the searches' own cases are listed once, above
    committed = [e for e in verify_report.get("counterexamples", [])
                 if e.get("decreases") and e.get("mode", "exact") == "exact" and e["file"] not in own]
    if found or decreased_cells or committed:
        evidence = [f"{s['search']}: J {s['J'][0]:.6f} -> {s['J'][-1]:.6f} (`{s['file']}`, "
                    + ("replays" if s.get("reproduces") else "found when interrupted, not replayed yet") + ")" for s in found]
        evidence += [f"random instances, {c['setting']} {c['parameterization']}: {c['violations']} decreases, "
                     f"largest {c['max_violation']:.2e}" for c in decreased_cells]
        evidence += [f"{e['search']} ({e['setting']}, {e['parameterization']} parameters): J {e['J'][0]:.6f} -> {e['J'][-1]:.6f} "
                     f"(`{e['file']}`, a saved counterexample that replays)" for e in committed]
        return {"measured": "J decreased", "evidence": evidence + apart}
    searched = [s for s in searches if s.get("examples")]
    if not exact and not searched:
        return {"measured": None, "evidence": ["nothing finished before the check was stopped: no exact cell and no search, "
                                               "so no verdict on monotonicity"]}
    silent_cells = [c for c in exact if c["verdict"] == NO_SIGNAL]
    silent_searches = [s for s in searched if s.get("moved") == 0]
    silence = (f"the update never moved J in {len(silent_cells)} of {len(exact)} exact cells"
               + (" (" + ", ".join(f"{c['setting']} {c['parameterization']}" for c in silent_cells) + ")" if silent_cells else "")
               + f" and in every case of {len(silent_searches)} of {len(searched)} searches")
    if len(silent_cells) == len(exact) and len(silent_searches) == len(searched):
        return {"measured": NO_SIGNAL, "evidence": [silence + ": the advantages are zero or not finite, or the loss has no "
                                                    "gradient; no verdict on monotonicity or convergence"]}
    moved_cells, moved_searches = len(exact) - len(silent_cells), [s for s in searched if s not in silent_searches]
    cases = sum(s.get("examples", s["max_examples"]) for s in moved_searches)
    updates = sum(c["instances"] * c["iterations"] for c in exact if c["verdict"] != NO_SIGNAL)
    evidence = [f"{NO_DECREASE_FOUND} in {len(moved_searches)} searches ({cases} cases in all) and in {updates} exact updates on "
                f"random instances ({moved_cells} cells)"]
    if silent_cells or silent_searches:
        evidence.append(silence + ": those measured nothing and count for nothing here")
    return {"measured": "monotone", "evidence": evidence + apart}


def on_flat_surrogate(entry: dict[str, Any]) -> bool:
    """Whether a search's counterexample lowered ``J`` on a flat surrogate (its explanation's cause): a decrease the
    optimizer chose, reported apart from the algorithm's own (:data:`seeupo.experiments.explain.FLAT_SIGNAL`)."""
    return (entry.get("explanation") or {}).get("cause") == "flat surrogate"


_SIGNALS: list[str] = []  # the signals received by the running check, in order


def _raise_interrupted(signum: int, _frame: Any) -> None:
    _SIGNALS.append(signal.Signals(signum).name)
    raise Interrupted(_SIGNALS[-1])


def _stop_if_signalled() -> None:
    """Raise :class:`Interrupted` for a signal already received: the handler's own exception is lost when
    the signal lands inside a callback whose exceptions Python ignores (a garbage-collection callback of
    hypothesis's, seen once in CI), so the check looks again between its parts and searches."""
    if _SIGNALS:
        raise Interrupted(_SIGNALS[-1])


def check(name: str, budget: CheckBudget, out: Path, *, plugins: tuple[str, ...] = (), seed: int = 0,
          bridge: bool = True, say: Callable[[str], None] = print, moved_aside: list[str] | None = None,
          calibration: Calibration | None = None, report_dir: Path | None = None) -> dict[str, Any]:
    """Plan, run the three parts for ``name`` and write ``OUT/check.{json,md,png}``; returns the report.

    Ctrl-C or SIGTERM (handled here while it runs, in the main thread) stops it: the report of
    what finished is written with ``partial`` set to the signal's name, and returned.
    ``moved_aside``: an earlier check's files :func:`prepare_output` moved, listed in the report.
    ``calibration``: this machine's speed for ``name``, already measured (:func:`compare` times
    every algorithm first); ``None``: measured here. ``report_dir``: where check.{json,md,png}
    go (default ``out``; counterexamples and the bridge's runs always go under ``out``).
    """
    from seeupo.core.config import PRESETS
    from seeupo.experiments.gradient_check import run_gradient
    from seeupo.experiments.gradient_check import summarise as summarise_gradient
    from seeupo.experiments.searches import algorithm_searches
    from seeupo.experiments.verify import algorithm_rows, apply_counterexamples, exact_refusal, verify

    start = time.perf_counter()
    _SIGNALS.clear()
    main_thread = threading.current_thread() is threading.main_thread()
    config = PRESETS[name]
    refusal = exact_refusal(config, budget.verify.group_size)  # registered with exact=False, or a failed contract check
    exact = refusal is None
    consulted = committed_counterexamples(name)
    cfg = dataclasses.replace(budget.verify, algorithms=(name,), plugins=plugins, seed=seed,
                              algorithm_counterexamples=budget.verify.algorithm_counterexamples + consulted["folders"])
    if not exact and "sampled" not in cfg.modes:  # the only cells it can have
        cfg = dataclasses.replace(cfg, modes=("sampled",))
    budget = dataclasses.replace(budget, verify=cfg)
    n_searches = len(algorithm_searches(name)) if exact else 0
    verify_report: dict[str, Any] | None = None
    gradient: dict[str, Any] = {"skipped": "not reached"}
    gradient_families: list[dict[str, Any]] = []
    searches: list[dict[str, Any]] = []
    bridge_result: dict[str, Any] = {"skipped": "--no-bridge"} if not bridge else {"skipped": "not reached"}
    partial: str | None = None
    times: dict[str, float] = {}
    estimate: dict[str, Any] = {}
    previous_handler = signal.signal(signal.SIGTERM, _raise_interrupted) if main_thread else None
    failed = False
    try:
        cal = calibration or calibrate(name, cfg, exact, budget.gradient)
        budget = fit(name, budget, cal, exact=exact, bridge=bridge, searches=n_searches)
        cfg = budget.verify
        estimate = plan(name, budget, cal, exact=exact, bridge=bridge, searches=n_searches)
        say(plan_text(estimate))
        deadline = None if budget.seconds is None else time.monotonic() + budget.seconds - (time.perf_counter() - start)
        t = time.perf_counter()
        if exact:
            g = budget.gradient
            say(f"[0/3] gradient: expected update and plain ascent on {len(g.families)} agentic families x "
                f"{len(g.turns)} turn counts, {g.instances} problems each")
            gradient = run_gradient(name, g, out, plugins, say, gradient_families)
        else:
            gradient = {"skipped": refused_label(refusal) if refusal else "the advantage estimator has no exact mode"}
            say(f"[0/3] gradient: skipped ({gradient['skipped']})")
        times["gradient"] = time.perf_counter() - t
        _stop_if_signalled()
        t = time.perf_counter()
        say(f"[1/3] verify: {name} on {cfg.instances} random problems per cell")
        verify_report = verify(cfg, progress=say)
        times["verify"] = time.perf_counter() - t
        if verify_report.get("partial"):
            raise KeyboardInterrupt
        _stop_if_signalled()
        t = time.perf_counter()
        if exact:
            say(f"[2/3] searches: {budget.max_examples} cases each")
            search_deadline = None if deadline is None else deadline - estimate["bridge"] - WRITE_SECONDS
            run_searches(name, budget, out, seed, say, searches, search_deadline)
        else:
            say("[2/3] searches: skipped (" + (refused_label(refusal) if refusal else "the advantage estimator has no exact mode") + ")")
        times["searches"] = time.perf_counter() - t
        if bridge:
            t = time.perf_counter()
            say(f"[3/3] bridge: tiny-qwen3, {budget.bridge_steps} steps x {_count(len(budget.bridge_seeds), 'seed')}")
            bridge_result = run_bridge(name, budget, out, plugins, say)
            times["bridge"] = time.perf_counter() - t
        _stop_if_signalled()
    except KeyboardInterrupt as stop:
        # a search catches the interrupt to save its case, then raises a plain one: the name is kept here
        partial = str(stop) if isinstance(stop, Interrupted) else (_SIGNALS[-1] if _SIGNALS else "SIGINT")
        say(f"interrupted ({partial}): writing the report of what finished")
    except BaseException:
        failed = True
        raise
    finally:
        if main_thread and failed:
            # an error (a plugin's one line) propagates and no report follows: the handlers as they were. Left
            # ignored, SIGTERM and SIGINT would stay ignored in this process and in every process it starts later
            # (a worker pool's terminate() could then not stop its workers: verify hung)
            signal.signal(signal.SIGTERM, previous_handler)
            signal.signal(signal.SIGINT, signal.default_int_handler)
        elif main_thread:  # the report is written whatever comes now; a second signal waits for it
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        if gradient_families and "skipped" in gradient:  # stopped during the gradient part: what finished
            gradient = summarise_gradient(gradient_families, budget.gradient, times.get("gradient", 0.0))
        if verify_report is None:
            verify_report = {"config": dataclasses.asdict(cfg), "table1": [], "cells": [], "counterexamples": [],
                             "partial": True, "seconds": 0.0}
        if searches and verify_report["table1"]:
            # the searches' counterexamples are measurements of the verify cells too: one truth per report
            apply_counterexamples(verify_report, [
                {"file": s["file"], "search": s["search"], "algorithm": name,
                 "setting": s.get("setting") or ("ST" if s["turns"] == 1 else "MT"),
                 "parameterization": s["parameterization"], "mode": "exact", "reproduces": bool(s.get("reproduces")),
                 "decreases": bool(s.get("reproduces")), "J": s["J"], "largest_decrease": s["largest_decrease"]}
                for s in searches if s["found"] and not on_flat_surrogate(s)])
        row = algorithm_rows([name], cfg.exact_epochs)[0]
        if not exact:
            mono = {"measured": None, "evidence": [refused_label(refusal) if refusal else
                                                   "no exact mode: the estimator is registered with exact=False"]}
        else:
            mono = monotonicity(verify_report, searches)
        report = {
            "algorithm": name,
            "out": str(out),
            "config": config.to_dict(),
            "plugins": list(plugins),
            "budget": dataclasses.asdict(budget) | {"seed": seed},
            "plan": estimate,
            "exact_mode": exact,
            "exact_refused": refusal,
            "monotonicity": mono,
            "committed_counterexamples": consulted["words"],
            "gradient": gradient,
            "verify": verify_report,
            "table_row": {"advantage": row.advantage, "update": row.update, "level": row.level},
            "searches": searches,
            "bridge": bridge_result,
            "partial": partial,
            "moved_aside": list(moved_aside or []),
            # a report written elsewhere (compare's algorithms/NAME/) names the folder its files' paths start from
            "files_in": None if report_dir in (None, out) else str(out),
            "times": times,
            "seconds": time.perf_counter() - start,
        }
        write(report, report_dir or out)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous_handler)
            signal.signal(signal.SIGINT, signal.default_int_handler)
    return report


def _modes(report: dict[str, Any]) -> str:
    modes = [m for m in ("exact", "sampled") if any(c["mode"] == m and not c.get("refused") for c in report["verify"]["cells"])]
    return " and ".join(modes) if modes else "none ran"


def markdown(report: dict[str, Any]) -> str:
    """The report to paste: the verdict first, then the evidence of each part (one plugin line, one total time)."""
    from seeupo.experiments.verify import headline
    from seeupo.experiments.verify import markdown as verify_markdown

    name, mono = report["algorithm"], report["monotonicity"]
    row = report["table_row"]
    title = f"# `seeupo check {name}`" + (f" (partial: stopped by {report['partial']})" if report.get("partial") else "")
    lines = [title, "",
             f"Advantage: {row['advantage']}; update: {row['update']}; level: {row['level']}.", ""]
    if report["plugins"]:
        lines += ["Plugins: " + ", ".join(f"`{p}`" for p in report["plugins"]), ""]
    if report.get("partial"):
        lines += [f"**Partial report**: the check was stopped ({report['partial']}) before it finished; below is what "
                  "finished, with every counterexample found so far.", ""]
    if report.get("moved_aside"):
        lines += ["An earlier check's files were moved aside (--overwrite deletes nothing): "
                  + ", ".join(f"`{m}`" for m in report["moved_aside"]) + ".", ""]
    lines += ["## Verdict", "", f"Committed counterexamples: {report.get('committed_counterexamples', 'not recorded')}.", ""]
    lines += gradient_markdown(report.get("gradient", {"skipped": "not run"}), report.get("plugins", []), report["out"]) + [""]
    if mono["measured"] is None:
        lines += ["Exact monotonicity: not measured (" + mono["evidence"][0] + ")."]
    else:
        lines += [f"Exact monotonicity, measured: **{mono['measured']}**."] + [f"* {e}" for e in mono["evidence"]]
    # the verdict's evidence already lists the counterexamples and says the run was partial
    extra = [h for h in headline(report["verify"]) if not h.startswith(("**Partial", "**J decreased**"))]
    if extra:
        lines += [""] + extra
    exact_cells = [c for c in report["verify"]["cells"] if c["mode"] == "exact" and not c.get("refused")]
    if exact_cells:
        def cell_words(c: dict[str, Any]) -> str:
            words = c["verdict"] + (f" (counterexample; random instances: {c['random_instances']})" if c.get("random_instances") else "")
            return f"{c['setting']} {c['parameterization']}: {words} (final gap max {c['max_final_gap']:.1e})"
        lines += ["", "Convergence on random problems (exact; ST and MT: token bandits; the others: agentic families, "
                  "described under the verify cells): " + "; ".join(cell_words(c) for c in exact_cells) + "."]
    lines += ["", *bridge_markdown(report["bridge"])]
    lines += ["", "## Searches (exact mode)", "", "| Search | Cases evaluated, shrinking included (budget) | Outcome | Replays |", "|---|---|---|---|"]
    for s in report["searches"]:
        replays = ({True: "yes", False: "no"}.get(s.get("reproduces"), "not replayed (interrupted)")) if s["found"] else "—"
        lines.append(f"| {s['description']} | {s.get('examples', s['max_examples'])} ({s['max_examples']}) "
                     f"| {search_outcome(s)} | {replays} |")
    if not report["searches"]:
        why = ("not reached" if report.get("partial") and report["exact_mode"] else
               "none: " + (refused_label(report["exact_refused"]) if report.get("exact_refused") else "no exact mode"))
        lines.append(f"| ({why}) | | | |")
    plugin_flags = "".join(f" --plugin {p.split('@sha256:')[0]}" for p in report["plugins"])
    found = [s["file"] for s in report["searches"] if s["found"]]
    if found:
        where = f"in `{report['files_in']}`" if report.get("files_in") else "in this folder"
        lines += ["", f"Counterexample files ({where}): " + ", ".join(f"`{f}`" for f in found) + ". Replay them: `seeupo replay "
                  + " ".join(f"{report['out']}/{f}" for f in found) + plugin_flags + "`."]
        lines += ["", "Why J fell (`seeupo.experiments.explain`; the full explanation is written beside each file):", ""]
        lines += [explanation_line(s) for s in report["searches"] if s["found"]]
    lines.append("")
    if report["verify"]["table1"]:
        body = verify_markdown(report["verify"], embedded=True).split("\n", 1)[1]
        lines += [f"## Verify cells ({_modes(report)})", body]
    else:
        lines += ["## Verify cells", "", "Not finished (the check was stopped during them).", ""]
    times = report.get("times", {})
    parts = ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
    planned = report.get("plan") or {}
    lines += [f"Total time: {report['seconds']:.0f} s" + (f" ({parts})" if parts else "")
              + (f"; estimated {planned['total']:.0f} s" if planned.get("total") else "")
              + (f"; budget {planned['budget']:.0f} s" if planned.get("budget") else "") + ".", ""]
    return "\n".join(lines)


def gradient_headline(gradient: dict[str, Any]) -> str:
    """The gradient verdict in one line: the expected update and where plain ascent with it ends."""
    if "skipped" in gradient:
        return f"expected update: not measured ({gradient['skipped']})"
    worst = _worst_family(gradient)
    where = f"{worst['family']}, T={worst['turns']}"
    turn = worst["worst"].get("downhill_turn")
    detail = (f" at turn {turn} (cosine {worst['worst']['turn_cosines'][turn]:.3f}; {where})" if turn is not None
              else f" ({where}; whole cosine {_num(worst['worst']['cosine'])})" if gradient["direction"] != "unbiased" else "")
    words = f"expected update {gradient['direction']}{detail}"
    if gradient.get("fixed_point"):
        words += f"; plain exact ascent with it {gradient['fixed_point']}"
    return words


def _num(x: float | None) -> str:
    return "undefined" if x is None else f"{x:.3f}"


def _worst_family(gradient: dict[str, Any]) -> dict[str, Any]:
    """The family entry whose case decided the gradient verdict (the lowest cosine among the worst verdict's)."""
    judged = [f for f in gradient["families"] if f["verdict"] == gradient["direction"]]
    return min(judged, key=lambda f: f["worst"]["cosine"] if f["worst"]["cosine"] is not None else 1.0)


def gradient_markdown(gradient: dict[str, Any], plugins: list[str], out: str) -> list[str]:
    """The gradient verdict's lines of check.md: the headline, then one row per family and number of turns."""
    from seeupo.tabular.gradient import DIRECTIONS

    if "skipped" in gradient:
        return [f"Gradient verdict (agentic problems): not measured ({gradient['skipped']})."]
    c = gradient["config"]
    lines = [f"Gradient verdict, exact, on agentic problems: **{gradient['direction']}**. "
             f"{DIRECTIONS.get(gradient['direction'], '')}."]
    if gradient.get("fixed_point"):
        fixed = [f for f in gradient["families"] if "fixed_point" in f]
        short = sum(f["fixed_point"]["counts"].get("stops below J*", 0) for f in fixed)
        total = sum(f["instances"] for f in fixed)
        lines += [f"Plain exact ascent with the expected update (lr {c['ascent_lr']:g}, at most {c['ascent_steps']} steps, from "
                  f"the uniform policy; no optimizer, no clipping): **{gradient['fixed_point']}**"
                  + (f" on {short} of {total} problems" if short else "") + "."]
    lines += ["", f"{c['instances']} random problems per family and number of turns, {c['starts'] + 1} start policies each "
              f"(uniform and random), G = {c['group_size']}, rewards on {c['reward_levels']} levels; tolerance "
              f"{gradient['tolerance']:g} (float64). The direction is the estimator's, "
              "`E[sum_t A_t grad log pi(a_t|h_t)]` against `grad J`, before the loss's clipping and aggregation.", "",
              "| Family | T | Expected update (worst case) | Cases | Worst case: cosine (per turn) | Plain ascent |",
              "|---|---|---|---|---|---|"]
    flags = "".join(f" --plugin {p.split('@sha256:')[0]}" for p in plugins)
    for f in gradient["families"]:
        w = f["worst"]
        cases = ", ".join(f"{v} {n}" for v, n in f["counts"].items())
        per_turn = ", ".join(_num(x) for x in w["turn_cosines"])
        ascent = "—"
        if "fixed_point" in f:
            fp = f["fixed_point"]
            ascent = (f"{fp['verdict']} ({', '.join(f'{v} {n}' for v, n in fp['counts'].items())}; worst J "
                      f"{fp['worst']['J_start']:.3f} -> {fp['worst']['J_end']:.3f}, J* {fp['worst']['J_star']:.3f})")
        file = f" `{f['file']}`" if f.get("file") else ""
        lines.append(f"| {f['text']} | {f['turns']} | {f['verdict']}{file} | {cases} | {_num(w['cosine'])} ({per_turn}) | {ascent} |")
    files = [f["file"] for f in gradient["families"] if f.get("file")]
    if files:
        lines += ["", f"Each worst case replays: `seeupo replay {out}/{files[0]}{flags}` (one file per row)."]
    return lines


def bridge_markdown(bridge: dict[str, Any]) -> list[str]:
    """The bridge's paragraph of check.md: the warm-up reached, then vacuous (why) or each algorithm's change of ``J``."""
    if "skipped" in bridge:
        return [f"Bridge: skipped ({bridge['skipped']})."]
    w = bridge["warmup"]
    warm = (f"format warm-up: P(valid first answer) {w['p_valid']:.3f} (lowest over seeds) after at most {w['steps']} "
            f"steps, target {w['threshold']:g}")
    if bridge["vacuous"] and bridge["row"] is None:
        return [f"Bridge (tiny-qwen3): **vacuous**: {bridge['vacuous']}."]
    b = bridge["row"]
    lines = [f"Bridge (tiny-qwen3, exact J of the language model, {_count(len(b['seeds']), 'seed')} x {b['steps']} steps at lr "
             f"{b['lr']:g}; {warm}): {bridge['summary']}. J* {b['J_star']:.4f}; {b['decreases_total']} of "
             f"{b['step_transitions_total']} steps lowered J (largest {b['largest_decrease']:.4f}); sampled updates: "
             "decreases there are expected noise, not violations."]
    if bridge["vacuous"]:
        lines += ["", f"The bridge is **vacuous**: {bridge['vacuous']}."]
    return lines


def figure(report: dict[str, Any], path: Path) -> None:
    """Exact ``J`` per iteration on the toy problems (worst instance of each exact cell) and per bridge step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for c in report["verify"]["cells"]:
        if c["mode"] == "exact" and not c.get("refused"):
            line, = ax1.plot(c["worst_J"], label=f"{c['setting']} {c['parameterization']}")
            ax1.axhline(c["J_star_worst"], color=line.get_color(), ls=":", lw=0.8)
    ax1.set(title=f"{report['algorithm']}: exact J, worst random instance", xlabel="iteration", ylabel="J")
    if ax1.lines:
        ax1.legend(fontsize=8)
    runs = report["bridge"].get("runs") or []
    for r in runs:
        ax2.plot(r["J"], marker=".", label=f"seed {r['seed']}")
    for preset, base in (report["bridge"].get("baselines") or {}).items():  # the built-ins, same seeds and settings
        for k, r in enumerate(base["runs"]):
            ax2.plot(r["J"], ls="--", lw=0.8, color="C7" if preset == "grpo" else "C9",
                     label=f"{preset} (built-in)" if k == 0 else None)
    if runs:
        ax2.axhline(runs[0]["J_star"], color="k", ls=":", lw=0.8, label="J*")
        ax2.legend(fontsize=8)
    ax2.set(title="bridge: exact J of the language model", xlabel="step", ylabel="J")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(report: dict[str, Any], out: Path) -> None:
    """``check.json``, ``check.md`` and ``check.png`` in ``out``."""
    _write_outputs(report, out, markdown, figure)


def _write_outputs(report: dict[str, Any], out: Path, render: Callable[[dict[str, Any]], str],
                   draw: Callable[[dict[str, Any], Path], None]) -> None:
    """``report`` as ``check.json``, ``render(report)`` as ``check.md`` and ``draw``'s ``check.png``, in ``out``."""
    from seeupo.validation import dumps

    out.mkdir(parents=True, exist_ok=True)
    (out / "check.json").write_text(dumps(report, indent=1) + "\n")
    (out / "check.md").write_text(render(report))
    draw(report, out / "check.png")


def summary_line(report: dict[str, Any]) -> str:
    """One line for the terminal and for tables of several algorithms."""
    mono = report["monotonicity"]
    prefix = f"{report['algorithm']}" + (f" (partial: stopped by {report['partial']})" if report.get("partial") else "")
    part = report.get("gradient", {"skipped": "not run"})
    gradient = gradient_headline(part)
    if mono["measured"] is None:  # refused or nothing finished: the reason first, the gradient words where measured
        return f"{prefix}: " + mono["evidence"][0] + ("" if "skipped" in part else f"; {gradient}")
    return f"{prefix}: {mono['measured']}; {gradient}; " + "; ".join(mono["evidence"])


# ----------------------------------------------------------------------------------- compare


def compare(names: list[str], budget: CheckBudget, out: Path, *, plugins: tuple[str, ...] = (), seed: int = 0,
            bridge: bool = True, say: Callable[[str], None] = print, moved_aside: list[str] | None = None) -> dict[str, Any]:
    """``check names[0] --compare names[1:]``: the same check for each algorithm, reported side by side.

    Same measurements for all: every algorithm gets the same random problems (``seed``), the same
    verify sizes, the same searches with the same number of cases, and one bridge run in which all
    of them train from the same warm-up, seeds and steps (it runs inside the first algorithm's
    check: ``bridge_also``). Sizes: each algorithm is timed first (:func:`calibrate`) and fitted to
    an equal share of ``budget.seconds`` (the first one's share also holds the bridge of all); then
    every algorithm runs the smallest of the fitted sizes, so that no algorithm is measured on less.
    The estimate printed covers the whole comparison.

    Writes ``OUT/check.{json,md,png}`` (the comparison; check.json keyed by algorithm), each
    algorithm's own report in ``OUT/algorithms/NAME/``, and every counterexample under
    ``OUT/counterexamples/`` (the search names start with the algorithm's name). An interrupt
    stops the comparison after the algorithm it hit; the report says which were not reached.
    """
    from seeupo.core.config import PRESETS
    from seeupo.experiments.searches import algorithm_searches
    from seeupo.experiments.verify import exact_refusal

    start = time.perf_counter()
    share = None if budget.seconds is None else budget.seconds / len(names)
    budget = dataclasses.replace(budget, bridge_also=tuple(names[1:]) if bridge else ())
    say(f"compare: {', '.join(names)}; timing each on this machine first")
    cals: dict[str, Calibration] = {}
    fitted: dict[str, CheckBudget] = {}
    estimates: dict[str, dict[str, Any]] = {}
    reports: dict[str, dict[str, Any]] = {}
    shared, total, partial = dataclasses.replace(budget, seconds=share), 0.0, None  # as reported if stopped while timing
    _SIGNALS.clear()
    main_thread = threading.current_thread() is threading.main_thread()
    # SIGTERM between the checks (each check handles it itself while it runs) stops the comparison with a report
    previous_handler = signal.signal(signal.SIGTERM, _raise_interrupted) if main_thread else None
    try:
        for i, n in enumerate(names):
            exact = exact_refusal(PRESETS[n], budget.verify.group_size) is None
            searches = len(algorithm_searches(n)) if exact else 0
            cfg = dataclasses.replace(budget.verify, algorithms=(n,), plugins=plugins, seed=seed)
            cals[n] = calibrate(n, cfg, exact, budget.gradient)
            mine = dataclasses.replace(budget, verify=cfg, seconds=share)
            fitted[n] = fit(n, mine, cals[n], exact=exact, bridge=bridge and i == 0, searches=searches)
            estimates[n] = plan(n, fitted[n], cals[n], exact=exact, bridge=bridge and i == 0, searches=searches)
        shared = dataclasses.replace(
            budget, seconds=share, bridge_seeds=fitted[names[0]].bridge_seeds,
            max_examples=min(f.max_examples for f in fitted.values()),
            verify=dataclasses.replace(budget.verify, iterations=min(f.verify.iterations for f in fitted.values())))
        total = sum(e["total"] for e in estimates.values())
        say(f"compare plan: {len(names)} algorithms x ({shared.verify.instances} problems x {shared.verify.iterations} "
            f"iterations per cell; {shared.max_examples} cases per search); "
            + (f"one bridge for all ({_count(len(shared.bridge_seeds), 'seed')} x {shared.bridge_steps} steps)" if bridge else "no bridge"))
        say(f"compare estimate: {total:.0f} s in all" + (f"; budget {budget.seconds:.0f} s, {share:.0f} s per algorithm "
                                                         "(the first one's share holds the bridge of all)" if share else ""))
        for i, n in enumerate(names):
            say(f"== {n} ({i + 1} of {len(names)})")
            reports[n] = check(n, shared, out, plugins=plugins, seed=seed, bridge=bridge and i == 0, say=say,
                               calibration=cals[n], report_dir=out / "algorithms" / n)
            if reports[n].get("partial"):
                partial = reports[n]["partial"]
                break
    except KeyboardInterrupt as stop:
        partial = str(stop) if isinstance(stop, Interrupted) else (_SIGNALS[-1] if _SIGNALS else "SIGINT")
        say(f"interrupted ({partial}): writing the report of what finished")
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous_handler)
    result = {
        "compare": list(names),
        "algorithms": reports,
        "not_reached": [n for n in names if n not in reports],
        "bridge": reports[names[0]]["bridge"] if names[0] in reports else {"skipped": "not reached"},
        "budget": dataclasses.asdict(shared) | {"seed": seed, "seconds_in_all": budget.seconds},
        "plan": {"per_algorithm": estimates, "total": total, "budget": budget.seconds},
        "plugins": list(plugins),
        "out": str(out),
        "partial": partial,
        "moved_aside": list(moved_aside or []),
        "seconds": time.perf_counter() - start,
    }
    write_compare(result, out)
    return result


def bridge_of(result: dict[str, Any], name: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """``name``'s words (:func:`learning`) and per-seed runs in the shared bridge of :func:`compare` (``None, []`` if none)."""
    bridge = result["bridge"]
    runs = bridge.get("runs") if name == bridge.get("algorithm") else (bridge.get("baselines") or {}).get(name, {}).get("runs")
    return (bridge.get("learning") or {}).get(name), runs or []


def _cell_words(report: dict[str, Any], mode: str) -> str:
    cells = [c for c in report["verify"]["cells"] if c["mode"] == mode]
    if not cells:
        return "none ran"
    return "; ".join(f"{c['setting']} {c['parameterization']}: {c['verdict']}" for c in cells)


def _decreases(report: dict[str, Any]) -> str:
    found = [s for s in report["searches"] if s["found"] and s.get("reproduces", True) and not on_flat_surrogate(s)]
    flat = [s for s in report["searches"] if s["found"] and on_flat_surrogate(s)]
    exact = [c for c in report["verify"]["cells"] if c["mode"] == "exact" and not c.get("refused")]
    if not report["exact_mode"]:
        return "not measured (no exact mode)"
    words = f"{len(found)} of {len(report['searches'])} searches"
    if found:
        words += " (largest " + f"{max(s['J'][0] - s['J'][-1] for s in found):.2e})"
    if flat:
        words += f" (and {len(flat)} on a flat surrogate, not counted)"
    random = sum(c["violations"] for c in exact)
    return words + f"; {random} on random instances" + (
        f" (largest {max(c['max_violation'] for c in exact):.2e})" if random else "")


def compare_markdown(result: dict[str, Any]) -> str:
    """The comparison's check.md: one table row per algorithm, then each one's counterexamples with their cause."""
    names = list(result["algorithms"])
    first = result["compare"][0]
    title = f"# `seeupo check {first} --compare {','.join(result['compare'][1:])}`" + (
        f" (partial: stopped by {result['partial']})" if result.get("partial") else "")
    b = result["budget"]
    lines = [title, "",
             f"The same check for each algorithm: the same {b['verify']['instances']} random problems per cell (seed "
             f"{b['seed']}), {b['verify']['iterations']} iterations, the same searches with {b['max_examples']} cases each"
             + (", and one bridge run in which all of them train from the same warm-up, seeds and steps."
                if "skipped" not in result["bridge"] else "; no bridge."), ""]
    if result["plugins"]:
        lines += ["Plugins: " + ", ".join(f"`{p}`" for p in result["plugins"]), ""]
    if result.get("partial"):
        lines += [f"**Partial report**: stopped ({result['partial']}); not reached: "
                  + (", ".join(result["not_reached"]) or "none") + ".", ""]
    if result.get("moved_aside"):
        lines += ["An earlier check's files were moved aside (--overwrite deletes nothing): "
                  + ", ".join(f"`{m}`" for m in result["moved_aside"]) + ".", ""]
    lines += ["| Algorithm | Gradient verdict (agentic problems) | Exact monotonicity, measured | Exact cells | Sampled cells "
              "| J decreases found | Bridge: exact J, first -> last step (mean over seeds) |", "|---|---|---|---|---|---|---|"]
    for n in names:
        r = result["algorithms"][n]
        mono = r["monotonicity"]
        verdict = mono["measured"] or mono["evidence"][0]
        words, _ = bridge_of(result, n)
        bridge = (f"{words['J_initial_mean']:.4f} -> {words['J_final_mean']:.4f} ({words['moved']})" if words else
                  "skipped" if "skipped" in result["bridge"] else "not trained")
        gradient = gradient_headline(r.get("gradient", {"skipped": "not run"}))
        lines.append(f"| {n} | {gradient} | {verdict} | {_cell_words(r, 'exact')} | {_cell_words(r, 'sampled')} | {_decreases(r)} "
                     f"| {bridge} |")
    lines += [""]
    bridge = result["bridge"]
    lines += bridge_markdown(bridge) if "skipped" in bridge or bridge.get("vacuous") else [
        "Bridge: " + "; ".join(f"{n} {bridge['learning'][n]['words']}" for n in bridge["learning"]) + "."]
    for n in names:
        r = result["algorithms"][n]
        lines += ["", f"## {n}", ""]
        lines += [f"* {e}" for e in r["monotonicity"]["evidence"]]
        found = [s for s in r["searches"] if s["found"]]
        if found:
            lines += ["", "Why J fell (the full explanation is written beside each file):", ""]
            lines += [explanation_line(s) for s in found]
        lines += ["", f"Its own report: `algorithms/{n}/check.md`."]
    lines += ["", f"Total time: {result['seconds']:.0f} s; estimated {result['plan']['total']:.0f} s"
              + (f"; budget {result['plan']['budget']:.0f} s" if result["plan"].get("budget") else "") + ".", ""]
    return "\n".join(lines)


def compare_figure(result: dict[str, Any], path: Path) -> None:
    """Exact ``J`` per iteration (toy problems) and per bridge step, every compared algorithm on the same two axes.

    One colour per algorithm; on the left one line style per exact cell (its worst random
    instance), on the right one line per bridge seed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {("ST", "independent"): "-", ("ST", "shared"): "--", ("MT", "independent"): "-.", ("MT", "shared"): ":"}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for k, n in enumerate(result["algorithms"]):
        color = f"C{k}"
        for c in result["algorithms"][n]["verify"]["cells"]:
            if c["mode"] == "exact" and not c.get("refused"):
                ax1.plot(c["worst_J"], color=color, ls=styles.get((c["setting"], c["parameterization"]), "-"),
                         label=f"{n} {c['setting']} {c['parameterization']}")
        _, runs = bridge_of(result, n)
        for j, r in enumerate(runs):
            ax2.plot(r["J"], color=color, marker=".", label=n if j == 0 else None)
    ax1.set(title="exact J, worst random instance of each cell", xlabel="iteration", ylabel="J")
    ax2.set(title="bridge: exact J of the language model", xlabel="step", ylabel="J")
    for ax in (ax1, ax2):
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_compare(result: dict[str, Any], out: Path) -> None:
    """The comparison's ``check.json``, ``check.md`` and ``check.png`` in ``out``."""
    _write_outputs(result, out, compare_markdown, compare_figure)
