"""Running ``seeupo check``: its parts in order, for one algorithm (:func:`check`) or several (:func:`compare`).

Ctrl-C and SIGTERM are watched by a :class:`SignalWatch` that each run owns: they stop the run
where it is, and the report of what finished is written, marked partial. A budget in seconds is an
alarm the same watch holds: it stops the run the same way (``partial: "budget"``), and a check it
stopped before its plan finished is inconclusive unless ``J`` decreased first.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, Callable

from seeupo.experiments.check.field import replay_field
from seeupo.experiments.check.planning import (BRIDGE_BASELINES, Calibration, CheckBudget, Plan, bridge_presets,
                                               calibrate, plan, plan_text)
from seeupo.experiments.check.render import plural, write
from seeupo.experiments.check.report import (BUDGET, BridgeResult, FieldReplay, CheckReport, ComparePlan, CompareReport, Explanation,
                                             MonotonicityVerdict, SearchEntry, Warmup)
from seeupo.experiments.check.verdict import (BRIDGE_TOLERANCE, committed_counterexamples, learning, monotonicity,
                                              unfinished_parts)
from seeupo.experiments.verdicts import refused_label, search_outcome


class Interrupted(KeyboardInterrupt):
    """SIGTERM or the budget's alarm, raised as Ctrl-C's ``KeyboardInterrupt`` so that every part stops the same way."""


class SignalWatch:
    """The signals a running check receives, and its SIGTERM handler while it runs (a context manager).

    Entered in the main thread, it makes SIGTERM raise :class:`Interrupted` (Ctrl-C raises
    ``KeyboardInterrupt`` as ever) and records the signal's name; on exit it gives back the
    handlers it found. A Ctrl-C that lands inside the import of torch or numpy (a lazy import
    of torch's, as the first optimizer step makes) cannot be raised there
    (:mod:`seeupo.interrupts`): it is recorded and raised at the run's next checkpoint
    (:meth:`raise_if_signalled`), so that the report is still written. ``deadline`` (a
    :func:`time.monotonic` value) is an alarm, started by :meth:`arm` (inside the run's own ``try``,
    so that even a deadline already past lands where the run catches it), that raises
    :class:`Interrupted` when it passes, recorded as :data:`BUDGET` (deferred as Ctrl-C is inside a
    fragile import). In another thread it installs nothing (Python handles signals in the main
    thread only) and records nothing: a deadline there is :class:`ValueError`, not a silent no-op.
    """

    def __init__(self, deadline: float | None = None) -> None:
        self.received: list[str] = []  # the signals' names, in order
        self._active = threading.current_thread() is threading.main_thread()
        self._previous: Any = None
        self._previous_int: Any = None
        self._previous_alarm: Any = None
        self._deadline = deadline
        if deadline is not None and not self._active:
            raise ValueError("a budget needs the main thread (its alarm is a signal)")

    def __enter__(self) -> SignalWatch:
        if self._active:
            self._previous = signal.signal(signal.SIGTERM, self._raise)
            self._previous_int = signal.signal(signal.SIGINT, self._interrupt)
            if self._deadline is not None:
                self._previous_alarm = signal.signal(signal.SIGALRM, self._budget)
        return self

    def arm(self) -> None:
        """Start the budget's alarm (nothing without a deadline)."""
        if self._active and self._deadline is not None:
            # at least a microsecond (an interval of 0 would cancel the alarm instead of ringing it now) and at most
            # about three years (the timer's own limit is the platform's time_t: --budget 1e300 overflowed it)
            signal.setitimer(signal.ITIMER_REAL, min(1e8, max(1e-6, self._deadline - time.monotonic())))

    def __exit__(self, *exc: object) -> None:
        # left ignored (by hold), SIGTERM and SIGINT would stay ignored in this process and in every process it
        # starts later (a worker pool's terminate() could then not stop its workers: verify hung)
        if self._active:
            self._cancel_alarm()
            signal.signal(signal.SIGTERM, self._previous)
            signal.signal(signal.SIGINT, self._previous_int)

    def _cancel_alarm(self) -> None:
        if self._deadline is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous_alarm)
            self._deadline = None

    def _interrupt(self, _signum: int, frame: FrameType | None) -> None:
        from seeupo.interrupts import inside_fragile_import

        if inside_fragile_import(frame):
            self.received.append("SIGINT")  # raised at the next checkpoint
            return
        raise KeyboardInterrupt

    def _budget(self, _signum: int, frame: FrameType | None) -> None:
        from seeupo.interrupts import inside_fragile_import

        self.received.append(BUDGET)
        if not inside_fragile_import(frame):  # else raised at the next checkpoint, as a deferred Ctrl-C
            raise Interrupted(BUDGET)

    def _raise(self, signum: int, _frame: FrameType | None) -> None:
        self.received.append(signal.Signals(signum).name)
        raise Interrupted(self.received[-1])

    def raise_if_signalled(self) -> None:
        """Raise :class:`Interrupted` for a signal already received: the handler's own exception is lost when
        the signal lands inside a callback whose exceptions Python ignores (a garbage-collection callback of
        hypothesis's, seen once in CI), so the check looks again between its parts and searches."""
        if self.received:
            raise Interrupted(self.received[-1])

    def name(self, stop: KeyboardInterrupt) -> str:
        """The name of the signal that raised ``stop``: a search catches the interrupt to save its case, then
        raises a plain one, so the name is the last one received (Ctrl-C, by default, records none)."""
        return str(stop) if isinstance(stop, Interrupted) else (self.received[-1] if self.received else "SIGINT")

    def hold(self) -> None:
        """Ignore Ctrl-C, SIGTERM and the budget until the watch ends: the report is written whatever comes now."""
        if self._active:
            self._cancel_alarm()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)


# ----------------------------------------------------------------------------------- one algorithm


def check(name: str, budget: CheckBudget, out: Path, *, plugins: tuple[str, ...] = (), seed: int = 0,
          bridge: bool = True, say: Callable[[str], None] = print, moved_aside: list[str] | None = None,
          calibration: Calibration | None = None, report_dir: Path | None = None,
          deadline: float | None = None) -> CheckReport:
    """Plan, run the parts for ``name`` and write ``OUT/check.{json,md,png}``; returns the report.

    Ctrl-C or SIGTERM (handled here while it runs, in the main thread) stops it: the report of
    what finished is written with ``partial`` set to the signal's name, and returned. So does
    ``budget.seconds`` when it passes (``partial: "budget"``), or ``deadline`` (a
    :func:`time.monotonic` value, :func:`compare`'s for all its checks) when given.
    ``moved_aside``: an earlier check's files :func:`prepare_output` moved, listed in the report.
    ``calibration``: this machine's speed for ``name``, already measured (:func:`compare` times
    every algorithm first); ``None``: measured here. ``report_dir``: where check.{json,md,png}
    go (default ``out``; counterexamples and the bridge's runs always go under ``out``).
    """
    from seeupo.core.config import PRESETS
    from seeupo.experiments.gradient_check import run_gradient
    from seeupo.experiments.gradient_check import summarise as summarise_gradient
    from seeupo.experiments.searches import algorithm_searches
    from seeupo.experiments.verify import algorithm_rows, verify

    start = time.perf_counter()
    config = PRESETS[name]
    budget, refusal, consulted = _setting(name, budget, plugins, seed)
    exact = refusal is None
    no_exact = refused_label(refusal) if refusal else "the advantage estimator has no exact mode"
    n_searches = len(algorithm_searches(name)) if exact else 0
    verify_report: dict[str, Any] | None = None
    gradient: dict[str, Any] = {"skipped": "not reached"}
    gradient_families: list[dict[str, Any]] = []  # filled as each family finishes: kept when stopped
    searches: list[SearchEntry] = []  # likewise
    field: list[FieldReplay] = []  # likewise
    bridge_result = BridgeResult(skipped="not reached" if bridge else "--no-bridge")
    partial: str | None = None
    times: dict[str, float] = {}
    estimate: Plan | None = None
    if deadline is None and budget.seconds is not None:
        deadline = time.monotonic() + budget.seconds
    with SignalWatch(deadline) as watch:
        try:
            watch.arm()
            # plan: time this machine for the estimate (the sizes are the budget's own), say it
            if calibration is None:
                say(f"check {name}: timing one update of each part on this machine for the estimate ...")
            cal = calibration or calibrate(name, budget.verify, exact, budget.gradient)
            watch.raise_if_signalled()
            estimate = plan(name, budget, cal, exact=exact, bridge=bridge, searches=n_searches)
            say(plan_text(estimate))

            t = time.perf_counter()
            if exact:
                say(f"[1/5] field: the field's committed counterexamples with {name}'s own update")
                replay_field(name, budget.verify.exact_epochs, out, say, field, explain_case,
                             None if budget.verify.rollouts.on_policy else budget.verify.rollouts)
            else:
                say(f"[1/5] field: skipped ({no_exact})")
            times["field"] = time.perf_counter() - t
            watch.raise_if_signalled()

            t = time.perf_counter()
            if exact:
                g = budget.gradient
                say(f"[2/5] gradient: expected update and plain ascent on {len(g.families)} agentic families x "
                    f"{len(g.turns)} turn counts, {g.instances} problems each")
                gradient = run_gradient(name, g, out, plugins, say, gradient_families)
            else:
                gradient = {"skipped": no_exact}
                say(f"[2/5] gradient: skipped ({no_exact})")
            times["gradient"] = time.perf_counter() - t
            watch.raise_if_signalled()

            t = time.perf_counter()
            say(f"[3/5] verify: {name} on {budget.verify.instances} random problems per cell")
            verify_report = verify(budget.verify, progress=say)
            times["verify"] = time.perf_counter() - t
            if verify_report.get("partial"):
                raise KeyboardInterrupt
            watch.raise_if_signalled()

            t = time.perf_counter()
            if exact:
                say(f"[4/5] searches: {budget.max_examples} cases each")
                run_searches(name, budget, out, seed, say, searches, watch)
            else:
                say(f"[4/5] searches: skipped ({no_exact})")
            times["searches"] = time.perf_counter() - t

            if bridge:
                t = time.perf_counter()
                say(f"[5/5] bridge: tiny-qwen3, {budget.bridge_steps} steps x {plural(len(budget.bridge_seeds), 'seed')}")
                bridge_result = run_bridge(name, budget, out, plugins, say)
                times["bridge"] = time.perf_counter() - t
            watch.raise_if_signalled()
        except KeyboardInterrupt as stop:
            partial = watch.name(stop)
            say(f"interrupted ({partial}): writing the report of what finished")
        # an error (a plugin's one line) has left the watch, handlers given back, and no report follows
        watch.hold()

        # verdict
        if gradient_families and "skipped" in gradient:  # stopped during the gradient part: what finished
            gradient = summarise_gradient(gradient_families, budget.gradient, times.get("gradient", 0.0))
        if verify_report is None:
            verify_report = {"config": dataclasses.asdict(budget.verify), "table1": [], "cells": [], "counterexamples": [],
                             "partial": True, "seconds": 0.0}
        _apply_searches(verify_report, searches, field, name)
        # exact verify cells ran where only the larger problems were refused (too_large): they measure monotonicity
        exact_cells = any(c.get("mode") == "exact" and not c.get("refused") for c in verify_report["cells"])
        gradient_sets = len(budget.gradient.families) * len(budget.gradient.turns) if exact else 0
        unfinished = unfinished_parts(estimate, gradient_sets, gradient, verify_report, searches, partial) if estimate else []
        mono = monotonicity(verify_report, searches, unfinished, field) if exact or exact_cells else MonotonicityVerdict(None, [
            refused_label(refusal) if refusal else "no exact mode: the estimator is registered with exact=False"])
        if not exact and exact_cells:
            mono.evidence.append(f"the verify cells only (the gradient part and the searches: {refused_label(refusal)})")
        row = algorithm_rows([name], budget.verify.exact_epochs)[0]

        # write
        report = CheckReport(
            algorithm=name, out=str(out), config=config.to_dict(), plugins=list(plugins),
            budget=dataclasses.asdict(budget) | {"seed": seed}, plan=estimate, exact_mode=exact, exact_refused=refusal,
            monotonicity=mono, committed_counterexamples=consulted, field=field, gradient=gradient, verify=verify_report,
            table_row={"advantage": row.advantage, "update": row.update, "level": row.level}, searches=searches,
            bridge=bridge_result, partial=partial, moved_aside=list(moved_aside or []),
            # a report written elsewhere (compare's algorithms/NAME/) names the folder its files' paths start from
            files_in=None if report_dir in (None, out) else str(out), times=times, seconds=time.perf_counter() - start)
        write(report, report_dir or out)
    return report


def _setting(name: str, budget: CheckBudget, plugins: tuple[str, ...], seed: int) -> tuple[CheckBudget, str | None, str]:
    """``budget`` for ``name`` (its verify cells for this algorithm alone, with its plugins, seed and committed
    counterexamples; sampled cells only without an exact mode), why the exact mode is refused (``None``: it is
    not) and the words on the committed counterexamples."""
    from seeupo.core.config import PRESETS
    from seeupo.experiments.verify import exact_refusal

    refusal = exact_refusal(PRESETS[name], budget.verify.group_size)  # registered with exact=False, or a failed contract
    if refusal is None:
        refusal = _too_large(name, budget)
    folders, words = committed_counterexamples(name)
    cfg = dataclasses.replace(budget.verify, algorithms=(name,), plugins=plugins, seed=seed,
                              algorithm_counterexamples=budget.verify.algorithm_counterexamples + folders)
    if refusal is not None and "sampled" not in cfg.modes:  # the only cells it can have
        cfg = dataclasses.replace(cfg, modes=("sampled",))
    return dataclasses.replace(budget, verify=cfg), refusal, words


def _too_large(name: str, budget: CheckBudget) -> str | None:
    """Why the exact parts of ``name``'s check would exceed the exact batch's size limit, or ``None``.

    Only an estimator that ``reads_histories`` can: exact mode then classes group-mates by their whole
    paths, whose multisets grow as ``C(paths + G - 2, G - 1)``. The gradient part's largest problems (each
    family at its most turns, the uniform start, which reaches every path) are counted, not built."""
    from seeupo.core.config import PRESETS
    from seeupo.core.registry import adv_estimator
    from seeupo.experiments.gradient_check import family_problems
    from seeupo.tabular.policies import TabularPolicy
    from seeupo.tabular.rollout import MAX_ROWS, exact_group_rows

    config = PRESETS[name].replace(group_size=budget.gradient.group_size)
    if not adv_estimator(config.advantage).reads_histories or not budget.gradient.families:
        return None
    turns = max(budget.gradient.turns)
    for family in budget.gradient.families:
        problem = family_problems(budget.gradient, family, turns)
        rows = exact_group_rows(problem, TabularPolicy(problem), config)
        if rows > MAX_ROWS:
            return (f"exact batch too large: {rows:,} rows for a {turns}-turn {family} problem with G = {config.group_size} "
                    f"(at most {MAX_ROWS:,}: the estimator reads its group-mates' histories, so every path is a class)")
    return None


def _apply_searches(verify_report: dict[str, Any], searches: list[SearchEntry], field: list[FieldReplay],
                    name: str) -> None:
    """Make the verify cells agree with the searches' and the field's counterexamples: they are measurements of those
    cells too, one truth per report (:func:`seeupo.experiments.verify.apply_counterexamples`)."""
    from seeupo.experiments.verify import apply_counterexamples

    if not ((searches or field) and verify_report["table1"]):
        return
    apply_counterexamples(verify_report, [
        {"file": s.file, "search": s.search, "algorithm": name, "setting": s.setting or ("ST" if s.turns == 1 else "MT"),
         "parameterization": s.parameterization, "mode": "exact", "reproduces": bool(s.reproduces),
         "decreases": bool(s.reproduces), "J": s.J, "largest_decrease": s.largest_decrease}
        for s in searches if s.found and not s.on_flat_surrogate] + [
        {"file": f.case, "search": f"field: {f.file}", "algorithm": name, "setting": f.setting,
         "parameterization": f.parameterization, "mode": "exact", "reproduces": True, "decreases": True, "J": f.J,
         "largest_decrease": f.largest_decrease} for f in field if f.counts])


def run_searches(name: str, budget: CheckBudget, out: Path, seed: int, say: Callable[[str], None],
                 results: list[SearchEntry], watch: SignalWatch) -> None:
    """The generic searches of ``name``, appended to ``results`` as they finish; each case found is saved and replayed.

    Each search evaluates ``budget.max_examples`` cases from ``seed`` (the same on any machine). An
    interrupt (a signal or the budget's alarm) saves what the interrupted search had found, then goes
    on up; ``watch`` is looked at before each search.
    """
    from seeupo.experiments.counterexamples import case_setting, replay, search
    from seeupo.experiments.searches import algorithm_searches

    specs = algorithm_searches(name, budget.verify.rollouts)
    for spec in specs:
        watch.raise_if_signalled()
        start = time.perf_counter()
        result = search(spec.cases(), claim=spec.claim, description=spec.description,
                        max_examples=budget.max_examples, seed=seed, keep_on_interrupt=True, setting=spec.setting)
        stopped = BUDGET if result.stopped == "interrupted" and watch.received[-1:] == [BUDGET] else result.stopped
        found = result.found
        case: dict[str, Any] = {}
        if found is not None:
            path = out / "counterexamples" / f"{spec.name}.json"
            found.save(path)
            case = {"file": str(path.relative_to(out)), "J": found.J, "largest_decrease": found.largest_decrease,
                    "group_size": found.algorithm.group_size, "turns": found.problem.num_turns,
                    "setting": case_setting(found), "parameterization": found.run.parameterization}
            if result.stopped != "interrupted":  # replaying costs an update: not when asked to stop
                case |= {"reproduces": replay(found).reproduces, "explanation": explain_case(found, path, out)}
        entry = SearchEntry(search=spec.name, description=spec.description, max_examples=budget.max_examples,
                            examples=result.examples, moved=result.moved, seed=seed, found=found is not None,
                            stopped=stopped, exhausted=result.exhausted, seconds=time.perf_counter() - start, **case)
        results.append(entry)
        say(f"search {spec.name}: {search_outcome(entry.to_dict())} ({entry.seconds:.0f} s)")
        if result.stopped == "interrupted":
            raise KeyboardInterrupt


def explain_case(found: Any, path: Path, out: Path) -> Explanation:
    """Explain a counterexample (:func:`seeupo.experiments.explain.explain`) and write the full text beside its file
    (``NAME.explain.md``; the explanation's ``file`` is relative to ``out``). An explanation that fails is one
    line, its ``error``: a report is never lost to its explanation."""
    from seeupo.experiments.explain import explain, render, summary_line

    try:
        explanation = explain(found)
        text = render(explanation)
    except Exception as error:  # noqa: BLE001 - any failure of the explanation is reported, not raised
        return Explanation(error=f"explain failed ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})")
    target = path.with_name(path.stem + ".explain.md")
    target.write_text(text + ("" if text.endswith("\n") else "\n"))
    return Explanation(cause=explanation.cause, summary=summary_line(explanation), file=str(target.relative_to(out)))


def run_bridge(name: str, budget: CheckBudget, out: Path, plugins: tuple[str, ...], say: Callable[[str], None]) -> BridgeResult:
    """The bridge part of ``check``: ``name`` and :data:`BRIDGE_BASELINES` on the bridge, exact ``J`` per step.

    First the format warm-up of each seed (shared by every algorithm of the seed); if it leaves
    the exact probability of a valid first answer below ``budget.bridge_warmup_target`` for some
    seed, no algorithm can learn there (almost every return is 0) and the bridge is *vacuous*:
    nothing is trained. Otherwise ``name`` and each baseline train ``budget.bridge_steps`` steps
    from the same warmed weights with the same seeds, and each gets words for what it did to ``J``
    (:func:`seeupo.experiments.check.verdict.learning`). Also vacuous: no baseline raised ``J``
    (the settings give no signal). Skipped, with the reason, without the ``llm`` extra.
    """
    try:
        import transformers  # noqa: F401
    except ImportError:
        return BridgeResult(skipped="needs the language-model extra: pip install 'seeupo[llm]'")
    import torch

    from seeupo.core.config import PRESETS
    from seeupo.core.registry import adv_estimator

    advantage = PRESETS[name].advantage
    if not adv_estimator(advantage).lm:
        return BridgeResult(skipped=f"its advantage estimator {advantage!r} has no language-model form (registered "
                                    "with lm=False)")

    threads = torch.get_num_threads()
    # one thread: the tiny model's steps are too small to share, and on a busy 2-core machine two threads
    # oversubscribe it (the quick bridge took 66 s with two threads, 6-9 s with one, same load)
    torch.set_num_threads(1)
    try:
        return _run_bridge(name, budget, out, plugins, say)
    finally:
        torch.set_num_threads(threads)


def _run_bridge(name: str, budget: CheckBudget, out: Path, plugins: tuple[str, ...], say: Callable[[str], None]) -> BridgeResult:
    from seeupo.experiments import bridge_lm

    start = time.perf_counter()
    model = bridge_lm.ModelSetting("tiny-qwen3", lr=budget.bridge_lr, warmup_steps=budget.bridge_warmup,
                                   warmup_lr=budget.bridge_warmup_lr, warmup_target=budget.bridge_warmup_target,
                                   steps=budget.bridge_steps, seeds=budget.bridge_seeds,
                                   tasks_per_step=budget.bridge_tasks_per_step, group_size=budget.bridge_group_size)
    baselines = bridge_presets(name, budget)[1:]
    sweep = bridge_lm.Sweep(models=(model,), presets=(name, *baselines), seeupo_variants=(), plugins=plugins)
    seeds = [bridge_lm.warmup_result(bridge_lm.RunSpec(model, name, "", seed), sweep) for seed in model.seeds]
    worst = min(seeds, key=lambda w: w["p_valid"])
    warmup = Warmup(threshold=budget.bridge_warmup_target, max_steps=budget.bridge_warmup, lr=budget.bridge_warmup_lr,
                    p_valid=worst["p_valid"], steps=max(w["steps"] for w in seeds), seeds=seeds)
    say("bridge warm-up: P(valid first answer) " + ", ".join(f"{w['p_valid']:.3f} (seed {w['seed']}, {w['steps']} steps)"
                                                              for w in seeds) + f"; target {budget.bridge_warmup_target:g}")
    if worst["p_valid"] < budget.bridge_warmup_target:
        vacuous = (f"the format warm-up reached P(valid first answer) = {worst['p_valid']:.4f} (seed {worst['seed']}, "
                   f"{worst['steps']} of at most {budget.bridge_warmup} steps), below {budget.bridge_warmup_target:g}: "
                   "almost every answer is invalid and scores 0, so no algorithm gets a learning signal")
        say(f"bridge: vacuous ({vacuous})")
        return BridgeResult(algorithm=name, baselines_run=list(baselines), tolerance=BRIDGE_TOLERANCE, warmup=warmup,
                            learning={}, vacuous=vacuous, summary="not trained: " + vacuous, settings=None, row=None,
                            runs=[], baselines={}, seconds=time.perf_counter() - start)

    folder = out / "bridge"
    for spec in bridge_lm.runs_of(sweep):
        bridge_lm.run_one(spec, sweep, folder, log=say)
    tables = bridge_lm.build_tables(sweep, folder)
    rows = {r["preset"]: r for r in tables["rows"]}
    runs = {p: [r for r in tables["runs"] if r["preset"] == p] for p in sweep.presets}
    learnt = {p: learning(runs[p]) for p in sweep.presets}
    vacuous = None
    if not any(learnt[p].moved == "raised" for p in BRIDGE_BASELINES):
        vacuous = ("the built-in " + " and ".join(BRIDGE_BASELINES) + " did not raise J either ("
                   + "; ".join(f"{p}: {learnt[p].words}" for p in BRIDGE_BASELINES)
                   + "): these bridge settings give no learning signal")
    others = "; ".join(f"{p} {learnt[p].words}" for p in BRIDGE_BASELINES if p != name)
    summary = f"{name} {learnt[name].words}" + (f" (same seeds, warm-up and steps: {others})" if others else "")
    say(f"bridge: {summary}" + (f"; vacuous: {vacuous}" if vacuous else ""))
    return BridgeResult(algorithm=name, baselines_run=list(baselines), tolerance=BRIDGE_TOLERANCE, warmup=warmup,
                        learning=learnt, vacuous=vacuous, summary=summary, settings=tables["settings"],
                        row=rows.get(name), runs=runs[name],
                        baselines={p: {"row": rows.get(p), "runs": runs[p]} for p in baselines},
                        seconds=time.perf_counter() - start)


# ----------------------------------------------------------------------------------- several algorithms


def compare(names: list[str], budget: CheckBudget, out: Path, *, plugins: tuple[str, ...] = (), seed: int = 0,
            bridge: bool = True, say: Callable[[str], None] = print, moved_aside: list[str] | None = None) -> CompareReport:
    """``check names[0] --compare names[1:]``: the same check for each algorithm, reported side by side.

    Same measurements for all: every algorithm gets the same random problems (``seed``), the same
    verify sizes, the same searches with the same number of cases, and one bridge run in which all
    of them train from the same warm-up, seeds and steps (it runs inside the first algorithm's
    check: ``bridge_also``). Every algorithm runs the same sizes, ``budget``'s own; each is timed
    first (:func:`calibrate`) for the estimate, which covers the whole comparison. ``budget.seconds``
    is one alarm for the whole comparison: when it passes, the algorithm under way stops with a
    partial report and the others are not reached.

    Writes ``OUT/check.{json,md,png}`` (the comparison; check.json keyed by algorithm), each
    algorithm's own report in ``OUT/algorithms/NAME/``, and every counterexample under
    ``OUT/counterexamples/`` (the search names start with the algorithm's name). An interrupt
    stops the comparison after the algorithm it hit; the report says which were not reached.
    """
    from seeupo.core.config import PRESETS
    from seeupo.experiments.searches import algorithm_searches
    from seeupo.experiments.verify import exact_refusal

    start = time.perf_counter()
    deadline = None if budget.seconds is None else time.monotonic() + budget.seconds
    shared = dataclasses.replace(budget, bridge_also=tuple(names[1:]) if bridge else ())
    say(f"compare: {', '.join(names)}; timing each on this machine first, for the estimate")
    cals: dict[str, Calibration] = {}
    estimates: dict[str, Plan] = {}
    reports: dict[str, CheckReport] = {}
    total, partial = 0.0, None
    # SIGTERM between the checks (each check watches its own, and the budget's alarm, while it runs) stops it
    # with a report; the budget is looked at between them
    with SignalWatch() as watch:
        try:
            for i, n in enumerate(names):
                exact = exact_refusal(PRESETS[n], budget.verify.group_size) is None
                searches = len(algorithm_searches(n)) if exact else 0
                cfg = dataclasses.replace(budget.verify, algorithms=(n,), plugins=plugins, seed=seed)
                cals[n] = calibrate(n, cfg, exact, budget.gradient)
                estimates[n] = plan(n, dataclasses.replace(shared, verify=cfg), cals[n], exact=exact,
                                    bridge=bridge and i == 0, searches=searches)
            total = sum(e.total for e in estimates.values())
            say(f"compare plan: {len(names)} algorithms x ({shared.verify.instances} problems x {shared.verify.iterations} "
                f"iterations per cell; {shared.max_examples} cases per search); "
                + (f"one bridge for all ({plural(len(shared.bridge_seeds), 'seed')} x {shared.bridge_steps} steps)" if bridge
                   else "no bridge"))
            say(f"compare estimate: {total:.0f} s in all" + (f"; budget {budget.seconds:.0f} s for all" if deadline else ""))
            for i, n in enumerate(names):
                watch.raise_if_signalled()
                if deadline is not None and time.monotonic() > deadline:
                    partial = BUDGET
                    say(f"the budget has passed: {', '.join(names[i:])} not reached")
                    break
                say(f"== {n} ({i + 1} of {len(names)})")
                reports[n] = check(n, shared, out, plugins=plugins, seed=seed, bridge=bridge and i == 0, say=say,
                                   calibration=cals[n], report_dir=out / "algorithms" / n, deadline=deadline)
                if reports[n].partial:
                    partial = reports[n].partial
                    break
        except KeyboardInterrupt as stop:
            partial = watch.name(stop)
            say(f"interrupted ({partial}): writing the report of what finished")
    result = CompareReport(
        compare=list(names), algorithms=reports, not_reached=[n for n in names if n not in reports],
        bridge=reports[names[0]].bridge if names[0] in reports else BridgeResult(skipped="not reached"),
        budget=dataclasses.asdict(shared) | {"seed": seed, "seconds_in_all": budget.seconds},
        plan=ComparePlan(per_algorithm=estimates, total=total, budget=budget.seconds), plugins=list(plugins),
        out=str(out), partial=partial, moved_aside=list(moved_aside or []), seconds=time.perf_counter() - start)
    write(result, out)
    return result
