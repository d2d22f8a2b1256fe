"""Running ``seeupo verify``: every cell of the grid in worker processes, Ctrl-C and SIGTERM included."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable

from seeupo.core.registry import adv_estimator
from seeupo.interrupts import ignore_interrupts_in_worker, interrupts_held_for_new_processes
from seeupo.experiments.verdicts import TABLE1_SEARCHES, refused_label
from seeupo.experiments.verify.cells import (BASE_SETTINGS, CellResult, VerifyConfig, _load_plugins, exact_refusal,
                                             refused_cell, run_cell, setting_runs, settings)
from seeupo.experiments.verify.consult import (_table1_replays, apply_counterexamples, consult_counterexamples,
                                               mark_cells, table1_entry)
from seeupo.tabular.families import AGENTIC_FAMILIES
from seeupo.experiments.verify.rows import Row, algorithm_rows, full_grid_rows, table1_rows


def verify(cfg: VerifyConfig, rows: list[Row] | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every cell of the grid and return the report (JSON-ready).

    Ctrl-C or SIGTERM (as ``KeyboardInterrupt``) while cells run ends the run early: the report of
    the cells that finished is returned with ``partial: True`` (the caller writes it).
    """
    if rows is None and cfg.algorithms:
        rows = algorithm_rows(cfg.algorithms, cfg.exact_epochs)
    elif rows is None:
        if cfg.grid not in ("table1", "full"):
            raise ValueError(f"unknown grid {cfg.grid!r}; expected 'table1' or 'full'")
        rows = table1_rows(cfg.exact_epochs) if cfg.grid == "table1" else full_grid_rows(cfg.exact_epochs)
    by_name = {r.name: r for r in rows}
    unknown = [f for f in cfg.families if f not in AGENTIC_FAMILIES]
    if unknown:
        raise ValueError(f"unknown problem family {unknown[0]!r}; expected some of {list(AGENTIC_FAMILIES)}")
    # exact mode's contract, checked here (once per algorithm) before any cell runs: a refused
    # estimator gets sampled cells only, and the reason is recorded (and shown where its exact cells would be)
    refused = {r.name: exact_refusal(r.config, cfg.group_size) for r in rows}
    cells = [
        (row, setting, mode, param, cfg)
        for row in rows
        for setting in settings(cfg)
        for mode, param in setting_runs(cfg, setting, row.config.schedule == "sequential")
        if mode == "sampled" or adv_estimator(row.config.advantage).exact  # a refused one: its exact cells say why
    ]
    tasks = [t for t in cells if not (t[2] == "exact" and refused[t[0].name])]
    start = time.perf_counter()
    results: list[CellResult] = [refused_cell(t[0], t[1], t[3], cfg, refused[t[0].name]) for t in cells if t not in tasks]
    say = progress or (lambda _msg: None)
    for name, reason in refused.items():
        if reason and "exact" in cfg.modes:
            say(f"{name}: {refused_label(reason)}; its sampled cells still run")

    def record(res: CellResult) -> None:
        results.append(res)
        say(
            f"[{len(results)}/{len(tasks)}] {res.row:15s} {res.setting:12s} {res.mode:7s} {res.parameterization:11s} "
            f"{res.verdict:22s} ({res.seconds:.1f}s)"
        )

    # the saved counterexamples of the Table 1 cells are replayed alongside the cells
    replay_keys = [(row.name, s) for row in rows for s in BASE_SETTINGS if TABLE1_SEARCHES.get((row.name, s))]
    partial = False
    replays: dict[tuple[str, str], list[dict[str, Any]]] = {}
    try:
        say(f"verify: {len(tasks)} cells on {min(cfg.workers, max(len(tasks), 1))} worker process(es), "
            f"{cfg.instances} problems and {cfg.iterations} iterations each")
        if cfg.workers > 1:
            # a process pool that notices a worker dying (BrokenProcessPool) instead of waiting for it forever,
            # and that drops the queued cells at the first error (a plugin's one line) or interrupt
            pool = ProcessPoolExecutor(cfg.workers, mp_context=mp.get_context("spawn"), initializer=_start_worker,
                                       initargs=(cfg.plugins,))
            try:
                with interrupts_held_for_new_processes():  # the pool starts its workers as tasks are submitted
                    pending = pool.submit(_table1_replays, cfg, replay_keys)
                    futures = [pool.submit(run_cell, *task) for task in tasks]
                for future in as_completed(futures):
                    record(future.result())
                replays = pending.result()
            except KeyboardInterrupt:
                _stop_workers(pool)
                raise
            finally:
                pool.shutdown(wait=False, cancel_futures=True)
        else:
            for task in tasks:
                record(run_cell(*task))
            replays = _table1_replays(cfg, replay_keys)
    except KeyboardInterrupt:  # the pool is terminated on leaving its block; keep what finished
        partial = True
        say(f"verify: interrupted after {len(results)} of {len(cells)} cells")
    order = {(t[0].name, t[1], t[2], t[3]): i for i, t in enumerate(cells)}
    results.sort(key=lambda r: order[(r.row, r.setting, r.mode, r.parameterization)])

    table = []
    for row in rows:
        entry: dict[str, Any] = {
            "row": row.name, "example": row.example, "advantage": row.advantage, "update": row.update, "level": row.level,
        }
        for setting in BASE_SETTINGS:
            cell = next((r for r in results if r.row == row.name and r.setting == setting and r.mode == "exact" and r.parameterization == "independent"), None)
            entry[setting] = table1_entry(row, setting, cell, cfg, replays.get((row.name, setting), []), refused[row.name])
        table.append(entry)
    report = {
        "config": dataclasses.asdict(cfg),
        "algorithms": {r.name: r.config.to_dict() | {"optimizer": r.optimizer, "lr": r.lr} for r in by_name.values()},
        "table1": table,
        "no_exact_mode": [name for name, reason in refused.items() if reason is not None],
        "exact_refused": {name: reason for name, reason in refused.items() if reason is not None},
        "cells": [dataclasses.asdict(r) for r in results],
        "counterexamples": [],
        "partial": partial,
        "seconds": time.perf_counter() - start,
    }
    # the Table 1 rows' saved counterexamples (all searched with independent parameters) decide their cells too
    mark_cells(report["cells"], [
        {"algorithm": row, "setting": setting, "parameterization": "independent", "file": e["file"]}
        for (row, setting), examples in replays.items() for e in examples
        if e["reproduces"] and e["largest_decrease"] > cfg.tol])
    if cfg.algorithms and cfg.algorithm_counterexamples and not partial:
        apply_counterexamples(report, consult_counterexamples(cfg.algorithms, cfg.algorithm_counterexamples, cfg.tol))
    report["seconds"] = time.perf_counter() - start
    return report


def _start_worker(plugins: tuple[str, ...]) -> None:
    """A worker leaves Ctrl-C to this process (which ends it), then imports the plugins."""
    ignore_interrupts_in_worker()
    _load_plugins(plugins)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """End ``pool``'s worker processes now, discarding their running cells (Ctrl-C, SIGTERM).

    ``shutdown(cancel_futures=True)`` drops the queued cells but lets each worker finish the cell
    it runs, and the interpreter waits for them at exit: a minute on a busy machine before the
    partial report is written. Python 3.14's ``terminate_workers`` does this; 3.11 has no public way.
    The pool's thread may still write to an ended worker's pipe: SIGPIPE is ignored from here on (the
    command line restores its default for ``seeupo ... | head``, which would end this process silently).
    """
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    for process in list((pool._processes or {}).values()):
        process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)  # quick now; it releases the queues' semaphores


def stderr_progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
