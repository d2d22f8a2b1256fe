"""``python -m seeupo.experiments.bridge_lm``: the sweep, its ablations and the seed grid from the command line."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

from seeupo.experiments.bridge_lm.grid import (GRID_LABELS, MAX_GRID_SEEDS, grid_specs, parse_label, read_grid, run_grid,
                                               write_grid_tables)
from seeupo.experiments.bridge_lm.runs import run_one
from seeupo.experiments.bridge_lm.sweep import ABLATIONS, DEFAULT_TABLES, Sweep, full_sweep, quick_sweep, runs_of
from seeupo.experiments.bridge_lm.tables import build_tables, write_tables


def _package_summary() -> str:
    """The first paragraph of the package's docstring (this module's is about the command line only)."""
    return (sys.modules[__package__].__doc__ or "").split("\n\n")[0]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m seeupo.experiments.bridge_lm", description=_package_summary())
    p.add_argument("--quick", action="store_true", help="smallest configuration: seeupo, tiny model, 2 steps")
    p.add_argument("--out", default=None, help="per-run folders, not committed (default results/bridge_lm; --grid: results/bridge_grid)")
    p.add_argument("--tables", default=None, help=f"where results.json/.md go (default {DEFAULT_TABLES}; --quick: OUT)")
    p.add_argument("--models", nargs="*", default=None, help="only these models (names as in the sweep)")
    p.add_argument("--presets", nargs="*", default=None, help="only these presets, in this order")
    p.add_argument("--tables-only", action="store_true", help="do not train; rebuild the tables from OUT")
    p.add_argument("--note", default="", help="text appended to results.md")
    p.add_argument("--ablations", nargs="*", default=None,
                   help=f"ablation sweeps to run after the main one (default: all of {sorted(ABLATIONS)}; none with --quick)")
    g = p.add_argument_group("seed grid (--grid): rates over many seeds per (preset, lr) cell, with intervals and tests")
    g.add_argument("--grid", action="store_true",
                   help="train the tiny model's setting at each --lr with --seeds seeds per preset label; one JSON line "
                        "per finished run in OUT/lr<lr>.jsonl (a re-invocation skips finished runs); grid.json/.md in TABLES")
    g.add_argument("--lr", nargs="+", type=float, default=None, help="learning rates of the RL steps (default: the setting's 3e-3)")
    g.add_argument("--seeds", type=int, default=None, help="seeds per cell: 0..N-1 (default 20)")
    g.add_argument("--labels", nargs="+", default=None,
                   help=f"preset labels (preset or seeupo-<variant>; default {' '.join(GRID_LABELS)})")
    args = p.parse_args(argv)
    problem = _grid_arg_problem(args)
    if problem:
        print(f"{p.prog}: error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    return args


def _grid_arg_problem(args: argparse.Namespace) -> str | None:
    """The first problem with the grid's arguments, or None (checked before any training); fills the grid's defaults."""
    if not args.grid:
        used = [flag for flag, value in (("--lr", args.lr), ("--seeds", args.seeds), ("--labels", args.labels)) if value is not None]
        return f"{used[0]} needs --grid" if used else None
    args.seeds = 20 if args.seeds is None else args.seeds
    args.labels = list(GRID_LABELS) if args.labels is None else args.labels
    if args.quick or args.ablations or args.models or args.presets:
        return "--grid takes --lr, --seeds and --labels, not --quick, --ablations, --models or --presets"
    for lr in args.lr or []:
        if not (math.isfinite(lr) and 0 < lr <= 1):
            return f"--lr must lie in (0, 1], got {lr!r}"
    if not 1 <= args.seeds <= MAX_GRID_SEEDS:
        return f"--seeds must lie in 1..{MAX_GRID_SEEDS}, got {args.seeds}"
    for label in args.labels:
        try:
            parse_label(label)
        except ValueError as err:
            return f"--labels: {err}"
    return None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.grid:
        out = Path(args.out or "results/bridge_grid")
        lrs = args.lr or [full_sweep().models[0].lr]
        if args.tables_only and not read_grid(out):
            print(f"python -m seeupo.experiments.bridge_lm: error: --tables-only: no finished grid runs under {out}", file=sys.stderr)
            raise SystemExit(2)
        if not args.tables_only:
            run_grid(grid_specs(lrs, args.seeds, list(dict.fromkeys(args.labels))), full_sweep(), out)
        return write_grid_tables(out, Path(args.tables) if args.tables else DEFAULT_TABLES, args.note)
    sweep = quick_sweep() if args.quick else full_sweep()
    out = Path(args.out or "results/bridge_lm")
    tables_dir = Path(args.tables) if args.tables else (out if args.quick else DEFAULT_TABLES)
    ablations = [] if args.quick else (sorted(ABLATIONS) if args.ablations is None else args.ablations)
    if not args.tables_only:
        _train(sweep, out, args)
        for name in ablations:
            sub, make = ABLATIONS[name]
            _train(make(), out / sub, args)
    extra = {name: build_tables(ABLATIONS[name][1](), out / ABLATIONS[name][0]) for name in ablations}
    return write_tables(sweep, out, tables_dir, args.note, extra)


def _train(sweep: Sweep, out: Path, args: argparse.Namespace) -> None:
    specs = runs_of(sweep)
    if args.presets:  # in the order given
        specs = sorted((s for s in specs if s.preset in args.presets), key=lambda s: args.presets.index(s.preset))
    for spec in specs:
        if args.models and spec.model.name not in args.models:
            continue
        start = time.perf_counter()
        run_one(spec, sweep, out)
        print(f"done {spec.folder(out)} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
