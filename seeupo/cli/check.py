"""``seeupo check``: one algorithm end to end (verify cells, searches, a bridge run) and its report.

Exit status (:func:`seeupo.experiments.check.exit_status`): 1 when it measured nothing (``no learning signal``, or a
``vacuous`` bridge), when ``--budget`` stopped it before its plan finished (``inconclusive``) or, with
``--fail-on-decrease``, when ``J`` decreased; 128 + the signal's
number when Ctrl-C or SIGTERM stopped it (the partial report is written); else 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from seeupo.cli.common import (CHECK_DIR, UsageError, check_exact_contract, plugin_option, require_algorithms,
                               rollout_options, rollouts_from)
from seeupo.validation.arguments import path_arg, positive_float, positive_int, seed_int, writable_dir


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="check one algorithm: verify cells, counterexample searches, a bridge run; a report",
                       description="For a registered algorithm (a preset, or one a --plugin registers): the verify cells "
                                   "(exact J on random problems), the generic monotonicity searches, and a short "
                                   "language-model run on the bridge with exact J per step; writes OUT/check.md, "
                                   "check.json and check.png (seeupo.experiments.check).")
    p.add_argument("name", help="the algorithm: a preset name (seeupo presets lists them)")
    plugin_option(p)
    p.add_argument("--quick", action="store_true", help="small sizes (about a minute without the bridge): for a first look")
    p.add_argument("--max-examples", type=positive_int, help="cases per search (default 150; --quick 8): the same cases on "
                                                              "any machine, and a smaller number's are the first of a "
                                                              "larger's")
    p.add_argument("--no-bridge", action="store_true", help="skip the language-model run")
    p.add_argument("--compare", metavar="A,B",
                   help="also check these algorithms (comma-separated) on the same problems, seeds, searches and bridge, "
                        "and report them side by side; one --budget covers them all")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the problems, searches and runs (default 0)")
    p.add_argument("--out", type=path_arg, help="the report's folder (default: results/check/NAME); it must be empty unless --overwrite")
    p.add_argument("--budget", type=positive_float, metavar="SECONDS",
                   help="stop after this many seconds (default: no limit): the report is then partial and its verdict "
                        "'inconclusive' unless J had already decreased; the plan itself never shrinks")
    p.add_argument("--overwrite", action="store_true",
                   help="move an earlier check's files in --out into previous-<time>/ first (nothing is deleted)")
    p.add_argument("--fail-on-decrease", action="store_true",
                   help="exit 1 when the measured verdict is 'J decreased' (default: 0 whatever the verdict, 1 only "
                        "when the evidence is empty), to gate a CI job on it")
    p.add_argument("--no-progress", action="store_true", help="do not print progress to stderr")
    rollout_options(p)


def run(args: argparse.Namespace) -> int:
    from seeupo.experiments.check import DEFAULT, QUICK, check, compare, prepare_output, summary_line

    require_algorithms(args.name, "name")
    names = [args.name]
    if args.compare is not None:  # every name is checked before anything runs or a folder is made
        others = [n.strip() for n in args.compare.split(",") if n.strip()]
        if not others:
            raise UsageError("argument --compare: expected a comma-separated list of algorithms, e.g. grpo,seeupo")
        require_algorithms(others, "--compare")
        names = list(dict.fromkeys([args.name, *others]))
    budget = QUICK if args.quick else DEFAULT
    check_exact_contract(names, budget.verify.group_size)  # a broken estimator: one line, no folder
    out_arg = args.out or str(CHECK_DIR / args.name)
    out = writable_dir(out_arg, "--out")  # a file there is one line, not a traceback; removed again if refused
    say = (lambda m: None) if args.no_progress else (lambda m: print(m, file=sys.stderr, flush=True))
    moved = prepare_output(out, args.overwrite, lambda m: print(m, file=sys.stderr, flush=True))  # said even with --no-progress
    if args.max_examples:
        budget = dataclasses.replace(budget, max_examples=args.max_examples)
    if args.budget is not None:
        budget = dataclasses.replace(budget, seconds=args.budget)
    budget = dataclasses.replace(budget, verify=dataclasses.replace(budget.verify, rollouts=rollouts_from(args)))
    if len(names) > 1:
        result = compare(names, budget, out, plugins=args.plugins_loaded, seed=args.seed, bridge=not args.no_bridge,
                         say=say, moved_aside=moved)
        for report in result.algorithms.values():
            print(summary_line(report))
        print(f"Wrote {out / 'check.md'}, {out / 'check.json'} and {out / 'check.png'} (each algorithm's own report in "
              f"{out / 'algorithms'}).")
    else:
        result = check(args.name, budget, out, plugins=args.plugins_loaded, seed=args.seed, bridge=not args.no_bridge,
                       say=say, moved_aside=moved)
        print(summary_line(result))
        print(f"Wrote {out / 'check.md'}, {out / 'check.json'} and {out / 'check.png'}.")
    status, line = result.exit_status(args.fail_on_decrease)  # the checked (first) algorithm's verdict decides
    if line is not None:
        print(f"seeupo check: {line}", file=sys.stderr)
    return status
