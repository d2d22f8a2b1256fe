"""``seeupo figures``: regenerate the figures (``OUT/NAME.png`` and its data, ``OUT/NAME.json``)."""

from __future__ import annotations

import argparse
import time

from seeupo.cli.common import UsageError, plugin_option
from seeupo.validation.arguments import path_arg, seed_int, writable_dir


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("figures", help="regenerate the figures (PNG + JSON data) of the paper's artifacts",
                       description="Compute each figure's data (reading the recorded results in paper_repro/, measuring "
                                   "where a figure needs it) and draw it: OUT/NAME.json and OUT/NAME.png (seeupo.figures).")
    p.add_argument("names", nargs="*", help="figures to make (default: all, in the order of seeupo.figures.FIGURES)")
    p.add_argument("--quick", action="store_true", help="small budgets (the whole set in a few minutes on CPU)")
    p.add_argument("--out", type=path_arg, default="figures", help="output folder (default: figures)")
    p.add_argument("--plot-only", action="store_true", help="redraw the PNGs from the data files in --out")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the measured figures (default 0)")
    p.add_argument("--runs", nargs="+", metavar="DIR", help="run folders with metrics.jsonl for training_curves "
                                                           "(default: BFCL runs under runs/ and results/)")
    plugin_option(p)


def run(args: argparse.Namespace) -> int:
    from seeupo.figures import FIGURES
    from seeupo.figures._common import regenerate

    unknown = [n for n in args.names if n not in FIGURES]
    if unknown:
        raise UsageError(f"argument names: unknown figures {unknown}; choose from {list(FIGURES)}")
    out = writable_dir(args.out, "--out")
    start = time.perf_counter()
    names = args.names or list(FIGURES)
    regenerate(names, quick=args.quick, out=out, plot_only=args.plot_only, seed=args.seed, runs=args.runs,
               log=lambda m: print(m, flush=True))
    print(f"Wrote {len(names)} figure{'' if len(names) == 1 else 's'} (PNG and JSON) to {out} in {time.perf_counter() - start:.1f} s.")
    return 0
