"""``seeupo search``: run the registered counterexample searches (or an algorithm's generic ones) and save what they find.

The searches are listed in the help from :data:`seeupo.experiments.search_catalog.PAPER_SEARCHES`,
which imports neither hypothesis nor torch; the loop itself is
:func:`seeupo.experiments.searches.run_searches`. Exit status 130 when Ctrl-C stopped it, after
writing what finished.
"""

from __future__ import annotations

import argparse

from seeupo.cli.common import PAPER_REPRO, UsageError, plugin_option, require_algorithms, rollout_options, rollouts_from
from seeupo.experiments.search_catalog import PAPER_SEARCHES
from seeupo.validation.arguments import path_arg, positive_int, seed_int, writable_dir


def add_parser(sub: argparse._SubParsersAction) -> None:
    listing = "\n".join(f"  {entry.name}\n      {entry.description}" for entry in PAPER_SEARCHES)
    p = sub.add_parser("search", help="search for counterexamples with hypothesis",
                       description="Run the registered counterexample searches and save what they find.",
                       epilog=f"searches:\n{listing}", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help="searches to run (default: all; listed below)")
    p.add_argument("--algorithm", metavar="NAME",
                   help="run the generic monotonicity searches of this registered algorithm (a preset; a plugin's too) "
                        "instead of the paper's searches")
    plugin_option(p)
    p.add_argument("--max-examples", type=positive_int, help="cases per search, >= 1 (default: each search's own budget)")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--out", type=path_arg, default="results/search",
                   help="folder for the counterexample files and searches.json, the summary of every search run (default: results/search)")
    p.add_argument("--update-paper-repro", action="store_true",
                   help=f"write into the committed {PAPER_REPRO}/counterexamples and {PAPER_REPRO}/searches.json instead of --out")
    rollout_options(p)


def run(args: argparse.Namespace) -> int:
    if args.algorithm is not None:
        require_algorithms(args.algorithm, "--algorithm")
        from seeupo.core.config import PRESETS
        from seeupo.core.contract import exact_mode_refusal

        reason = exact_mode_refusal(PRESETS[args.algorithm])  # the searches run exact mode only
        if reason is not None:
            raise UsageError(f"argument --algorithm: {args.algorithm}: exact: refused ({reason}); the searches run "
                             "exact mode only (seeupo verify --algorithms runs its sampled cells)")
        if args.names:
            raise UsageError("argument names: give search names or --algorithm, not both")
        if args.update_paper_repro:
            raise UsageError("argument --update-paper-repro: the committed searches are the paper's; "
                             "write an algorithm's searches to --out")
    rollouts = rollouts_from(args)
    if args.algorithm is None and not rollouts.on_policy:
        raise UsageError("argument --staleness/--temperature/--top-k/--top-p/--kernel-noise: the paper's searches test "
                         "its claims, made on policy; rows off policy need --algorithm")
    known = [entry.name for entry in PAPER_SEARCHES]
    unknown = [n for n in args.names if n not in known]
    if unknown:
        raise UsageError(f"argument names: unknown searches {unknown}; choose from {known}")
    if args.update_paper_repro:
        out_dir, index = PAPER_REPRO / "counterexamples", PAPER_REPRO / "searches.json"
        writable_dir(out_dir, "--update-paper-repro")
    else:
        out_dir = writable_dir(args.out, "--out")
        index = out_dir / "searches.json"

    from seeupo.experiments.searches import SEARCHES, algorithm_searches, earlier_counterexamples, get, read_search_index, run_searches

    read_search_index(index)  # a malformed index is refused before any search runs
    if args.algorithm is not None:
        specs = algorithm_searches(args.algorithm, rollouts)
    else:
        specs = [get(name) for name in args.names] if args.names else SEARCHES
    if not args.update_paper_repro:  # an earlier run's counterexample is never replaced (the committed ones are, on purpose)
        taken = earlier_counterexamples(specs, out_dir)
        if taken:
            raise UsageError(f"argument --out: {', '.join(map(str, taken))} already exist (an earlier search); choose another --out")
    summary = run_searches(specs, out_dir, index, seed=args.seed, max_examples=args.max_examples, plugins=args.plugins_loaded)
    return 130 if summary and summary[-1].get("stopped") == "interrupted" else 0
