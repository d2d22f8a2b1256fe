"""``seeupo claims``: run the check of every registered claim and report the verdicts with evidence."""

from __future__ import annotations

import argparse
import sys

from seeupo.cli.common import UsageError
from seeupo.validation.arguments import move_earlier_outputs_aside, path_arg, writable_dir
from seeupo.validation.files import dumps


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("claims", help="check every claim and print its verdict with evidence",
                       description="Run the check of every registered claim (seeupo.experiments.claims) and report the verdicts.")
    p.add_argument("ids", nargs="*", help="only these claims (default: all)")
    p.add_argument("--quick", action="store_true", help="small budgets (for a quick look; verdicts may be inconclusive)")
    p.add_argument("--out", type=path_arg, default="results/claims", help="folder for claims.json and claims.md (default: results/claims); an earlier report there is refused "
                        "unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="move an earlier report in --out into --out/previous-<time>/ (nothing is deleted) and write anew")
    p.add_argument("--no-progress", action="store_true", help="do not print per-claim progress to stderr")


def run(args: argparse.Namespace) -> int:
    from seeupo.experiments.claims import CLAIMS, DEFAULT, QUICK, check_all, markdown

    unknown = sorted(set(args.ids) - {c.id for c in CLAIMS})
    if unknown:
        raise UsageError(f"argument ids: unknown claims {unknown}; choose from {[c.id for c in CLAIMS]}")
    out = writable_dir(args.out, "--out")
    move_earlier_outputs_aside(out, ("claims.json", "claims.md"), args.overwrite, "claims run",
                               lambda m: print(m, file=sys.stderr, flush=True))
    budget = QUICK if args.quick else DEFAULT
    report = check_all(budget, ids=args.ids or None, progress=None if args.no_progress else (lambda m: print(m, file=sys.stderr, flush=True)))
    (out / "claims.json").write_text(dumps(report, indent=1) + "\n")
    (out / "claims.md").write_text(markdown(report))
    width = max(len(e["id"]) for e in report["claims"])
    for e in report["claims"]:
        print(f"{e['id']:{width}s}  {e['status']}\n{'':{width}s}  {e['summary']}")
    print(f"Wrote {out / 'claims.json'} and {out / 'claims.md'}.")
    return 0
