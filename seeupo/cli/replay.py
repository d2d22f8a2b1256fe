"""``seeupo replay``: recompute counterexample (or gradient case) files and check the recorded numbers.

Every file is reported; the exit status is 2 if any file was bad input, else 1 if any recorded
run did not reproduce, else 0.
"""

from __future__ import annotations

import argparse
import sys

from seeupo.cli.common import plugin_option
from seeupo.validation.arguments import nonnegative_float
from seeupo.validation.errors import InputError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="recompute counterexample files and check the recorded numbers",
                       description="Recompute each counterexample from scratch and report every file. Exit code: 2 if any "
                                   "file was bad input, else 1 if any recorded J did not reproduce, else 0.")
    p.add_argument("files", nargs="+", help="counterexample JSON files")
    p.add_argument("--atol", type=nonnegative_float, default=1e-8, help="tolerance on each J, >= 0 (default 1e-8)")
    p.add_argument("--explain", action="store_true",
                   help="also explain each file: the instance, the advantages, the update, and why J fell")
    plugin_option(p)


def run(args: argparse.Namespace) -> int:
    from seeupo.experiments.counterexamples import Counterexample, replay
    from seeupo.experiments.gradient_check import is_gradient_file

    bad = failed = 0
    for path in args.files:
        if is_gradient_file(path):  # a gradient case (seeupo check's gradient/ folder)
            outcome = _replay_gradient(path)
            bad, failed = bad + (outcome == 2), failed + (outcome == 1)
            continue
        try:
            example = Counterexample.load(path)
        except InputError as err:
            bad += 1
            print(f"seeupo replay: error: {err}", file=sys.stderr)
            continue
        result = replay(example, atol=args.atol)
        j = " -> ".join(f"{x:.9f}" for x in result.recomputed)
        if result.reproduces:
            print(f"{path}: reproduced (claim {example.claim}): J {j}, J* {example.J_star:.6f}, "
                  f"largest decrease {example.largest_decrease:.3e}")
        else:
            failed += 1
            rec = " -> ".join(f"{x:.9f}" for x in result.recorded)
            print(f"{path}: DOES NOT REPRODUCE: recorded J {rec}, recomputed {j} (max difference {result.max_abs_diff:.3e})")
        if args.explain:  # why J fell, step by step (seeupo.experiments.explain)
            from seeupo.experiments.explain import explain, render

            print("\n" + render(explain(example)))
    return 2 if bad else 1 if failed else 0


def _replay_gradient(path: str) -> int:
    """Recompute one gradient case file and print the outcome: 0 reproduced, 1 not, 2 bad input."""
    from seeupo.experiments.gradient_check import load_case, replay_case

    try:
        case = load_case(path)
    except InputError as err:
        print(f"seeupo replay: error: {err}", file=sys.stderr)
        return 2
    ok, now = replay_case(case)
    cosines = ", ".join("undefined" if c is None or c != c else f"{c:.6f}" for c in now["turn_cosines"])
    if ok:
        print(f"{path}: reproduced: expected update {now['verdict']} (cosine per turn {cosines})")
        return 0
    print(f"{path}: DOES NOT REPRODUCE: recorded {case.recorded['verdict']}, recomputed {now['verdict']} "
          f"(cosine per turn {cosines})")
    return 1
