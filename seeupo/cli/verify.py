"""``seeupo verify``: the paper's Table 1 (or registered algorithms' cells) regenerated from exact measurements."""

from __future__ import annotations

import argparse
import math

from seeupo.cli.common import (CHECK_DIR, MAX_CELLS, UsageError, check_exact_contract, plugin_option, readable_dir,
                               require_algorithms, rollout_options, rollouts_from)
from seeupo.tabular.families import AGENTIC_FAMILIES
from seeupo.validation.arguments import (comma_list, int_range, move_earlier_outputs_aside, path_arg, positive_int, seed_int,
                                         writable_dir)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="regenerate the paper's Table 1 from tabular measurements",
                       description="Run the verification grid on random tabular problems and compare with the paper's Table 1.")
    p.add_argument("--quick", action="store_true", help="a small run (exact mode, independent parameters only)")
    p.add_argument("--grid", choices=["table1", "full"], help="table1 (default): the paper's rows; full: every advantage x every update")
    p.add_argument("--instances", type=int_range(1, 100_000), help="random problems per cell, 1 to 100000")
    p.add_argument("--iterations", type=int_range(1, 100_000), help="iterations per run, 1 to 100000")
    p.add_argument("--turns", type=positive_int, help="turns of the multi-turn setting")
    p.add_argument("--group-size", type=int_range(2, 1024), help="G, 2 to 1024, rollouts per task for GRAE")
    p.add_argument("--reward-levels", type=int_range(2, 10**6), help="rewards on this many levels in [0, 1] (2 = binary)")
    p.add_argument("--modes", type=comma_list(("exact", "sampled")), help="comma-separated: exact,sampled")
    p.add_argument("--params", type=comma_list(("independent", "shared")), help="comma-separated: independent,shared")
    p.add_argument("--families", type=comma_list((*AGENTIC_FAMILIES, "none")),
                   help="agentic problem families run beside ST and MT (exact mode), comma-separated: "
                        + ",".join(AGENTIC_FAMILIES) + " (default: all), or none")
    p.add_argument("--workers", type=int_range(1, 256), help="worker processes, 1 to 256 (default 2)")
    p.add_argument("--seed", type=seed_int, help="seed of the random problems and runs")
    p.add_argument("--out", type=path_arg, default="results/verify", help="folder for verify.json and verify.md (default: results/verify); an earlier report there is refused "
                        "unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="move an earlier report in --out into --out/previous-<time>/ (nothing is deleted) and write anew")
    p.add_argument("--algorithms", type=comma_list(None), metavar="NAME,...",
                   help="registered algorithms (presets; a plugin's too) to run instead of the grid")
    p.add_argument("--counterexamples", action="append", default=[], metavar="DIR",
                   help="with --algorithms: also replay the counterexamples in DIR (a folder of counterexample files, "
                        "or a seeupo check folder) whose algorithm is one of them; one that lowers J makes its cells "
                        "'J decreased' (repeatable; results/check/NAME is always consulted when it exists)")
    plugin_option(p)
    p.add_argument("--no-progress", action="store_true", help="do not print per-cell progress to stderr")
    rollout_options(p)


def run(args: argparse.Namespace) -> int:
    from seeupo.experiments.verify import (QUICK, VERIFY_OUTPUTS, VerifyConfig, markdown, stderr_progress, verify,
                                          write_report)

    base = QUICK if args.quick else VerifyConfig()
    overrides = {
        k: v
        for k, v in {
            "instances": args.instances, "iterations": args.iterations, "workers": args.workers, "seed": args.seed,
            "group_size": args.group_size, "reward_levels": args.reward_levels, "turns_mt": args.turns, "grid": args.grid,
            "modes": args.modes, "parameterizations": args.params,
            "families": None if args.families is None else tuple(f for f in args.families if f != "none"),
        }.items()
        if v is not None
    }
    if args.families is not None and "none" in args.families and len(args.families) > 1:
        raise UsageError("argument --families: 'none' stands alone (no agentic family), not beside a family")
    if args.algorithms:
        require_algorithms(args.algorithms, "--algorithms")
        # the algorithms' own counterexamples: --counterexamples, and each one's default check folder if it exists
        folders = [str(readable_dir(d, "--counterexamples")) for d in args.counterexamples]
        folders += [str(CHECK_DIR / n) for n in args.algorithms if (CHECK_DIR / n / "counterexamples").is_dir()]
        overrides |= {"algorithms": tuple(args.algorithms), "plugins": args.plugins_loaded,
                      "algorithm_counterexamples": tuple(dict.fromkeys(folders))}
    elif args.counterexamples:
        raise UsageError("argument --counterexamples: needs --algorithms (Table 1 replays the committed counterexamples)")
    rollouts = rollouts_from(args)
    if not rollouts.on_policy:
        if not args.algorithms:
            raise UsageError("argument --staleness/--temperature/--top-k/--top-p/--kernel-noise: Table 1's claims are "
                             "made on policy; rows off policy need --algorithms")
        overrides["rollouts"] = rollouts
    cfg = base.__class__(**{**base.__dict__, **overrides})
    histories = cfg.instances * (cfg.vocab_size ** cfg.length) ** cfg.turns_mt if cfg.turns_mt <= 32 else MAX_CELLS + 1
    if histories > MAX_CELLS:
        raise UsageError(f"argument --turns: {cfg.turns_mt} turns of {cfg.vocab_size ** cfg.length} actions for "
                         f"{cfg.instances} instances make more than {MAX_CELLS} histories")
    levels, g = cfg.reward_levels, cfg.group_size
    if math.comb(levels + g - 2, g - 1) > MAX_CELLS:
        raise UsageError(f"argument --group-size: an exact GRAE batch with G = {g} and {levels} reward levels could need "
                         f"more than {MAX_CELLS} rows; lower --group-size or --reward-levels")
    if args.algorithms:  # a broken estimator is named now, before a folder or a worker process exists
        check_exact_contract(args.algorithms, cfg.group_size)
    out = writable_dir(args.out, "--out")  # refused later (a plugin breaking its contract in a cell): removed again
    move_earlier_outputs_aside(out, VERIFY_OUTPUTS, args.overwrite, "verify", stderr_progress)
    report = verify(cfg, progress=None if args.no_progress else stderr_progress)
    json_path, md_path = write_report(report, out)
    print(markdown(report))
    print(f"Wrote {json_path} and {md_path}.")
    return 130 if report.get("partial") else 0  # Ctrl-C: the cells that finished are written, marked partial
