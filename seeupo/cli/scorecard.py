"""``seeupo scorecard``: one algorithm scored on every capability, drawn over the field's cards.

Exit status: 0 when the card is written; 128 + the signal's number when Ctrl-C (130) or SIGTERM (143) stopped
it (the partial card is written).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from seeupo.cli.common import (UsageError, check_exact_contract, plugin_option, require_algorithms, rollout_options,
                               rollouts_from)
from seeupo.validation.arguments import int_range, move_earlier_outputs_aside, path_arg, seed_int, writable_dir

if TYPE_CHECKING:
    from seeupo.experiments.scorecard.capabilities import Sizes

SCORECARD_DIR = Path("results/scorecard")  # seeupo scorecard NAME writes to SCORECARD_DIR / NAME by default


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scorecard", help="score one algorithm on every capability (exact problems, a bridge run) "
                                         "beside the field's algorithms",
                       description="Score a registered algorithm (a preset, or one a --plugin registers) in [0, 1] on "
                                   "each capability experiment of seeupo.experiments.scorecard (fixed, seeded exact "
                                   "problems; the language-model bridge over seeds), and write OUT/card.md, card.json "
                                   "and card.png: a radar drawn over the field's committed cards (or --compare's).")
    p.add_argument("name", nargs="?", help="the algorithm: a preset name (seeupo presets lists them)")
    plugin_option(p)
    p.add_argument("--field", action="store_true",
                   help="instead of NAME: every catalogue algorithm's card, the field's table (field.md, field.json) "
                        "and radar (field.png); `seeupo scorecard --field --out paper_repro/scorecard --overwrite` "
                        "regenerates the committed one")
    p.add_argument("--workers", type=int_range(1, 64), default=2, help="with --field: cards measured at once (default 2)")
    p.add_argument("--compare", metavar="A,B",
                   help="draw these algorithms beside it (comma-separated): their committed cards where the sizes "
                        "match, else measured now on the same problems (default: the whole committed catalogue)")
    p.add_argument("--quick", action="store_true", help="smaller sets (about half a minute without the bridge)")
    p.add_argument("--instances", type=int_range(1, 64), help="random problems per part of each capability (default 6; "
                                                              "--quick 3); the field's committed cards use the default")
    p.add_argument("--iterations", type=int_range(1, 100), help="exact updates per monotonicity run (default 8; --quick 5)")
    p.add_argument("--no-bridge", action="store_true", help="skip the language-model bridge (its capability gets no score)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of every problem set (default 0: the field's cards')")
    p.add_argument("--out", type=path_arg, help="the card's folder (default: results/scorecard/NAME); an earlier card "
                                                "there is refused unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="move an earlier card in --out into previous-<time>/ first (nothing is deleted)")
    p.add_argument("--no-progress", action="store_true", help="do not print progress to stderr")
    rollout_options(p)


def run(args: argparse.Namespace) -> int:
    from seeupo.experiments.scorecard.card import OUTPUTS, calibrate, format_score, plan_line, score_card, write
    from seeupo.experiments.scorecard.field import comparison_cards

    if args.field:
        return _field(args)
    if args.name is None:
        raise UsageError("argument name: the algorithm to score is required (or --field for the whole catalogue)")
    require_algorithms(args.name, "name")
    others: list[str] = []
    if args.compare is not None:
        others = [n.strip() for n in args.compare.split(",") if n.strip()]
        if not others:
            raise UsageError("argument --compare: expected a comma-separated list of algorithms, e.g. grpo,seeupo")
        require_algorithms(others, "--compare")
    sizes = _sizes(args)
    rollouts = rollouts_from(args)
    check_exact_contract([args.name, *others], sizes.group_size)  # a broken estimator: one line, no folder
    out = writable_dir(args.out or str(SCORECARD_DIR / args.name), "--out")
    err = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    move_earlier_outputs_aside(out, OUTPUTS, args.overwrite, "scorecard", err)
    say = (lambda m: None) if args.no_progress else err
    if not args.no_progress:  # the estimate is only said, so it is only measured when progress is shown
        say(f"scorecard {args.name}: timing a unit of each capability on this machine for the estimate ...")
        say(plan_line(args.name, sizes, calibrate(args.name, sizes, plugins=args.plugins_loaded, rollouts=rollouts),
                      bridge=not args.no_bridge))
        if not rollouts.on_policy:
            say(f"scorecard {args.name}: rows off policy ({rollouts.words()}) in the runs of its own updates")
    card = score_card(args.name, sizes, out, plugins=args.plugins_loaded, bridge=not args.no_bridge, say=say,
                      rollouts=rollouts)
    beside = comparison_cards(others or None, sizes, out, exclude=args.name, plugins=args.plugins_loaded,
                              bridge=not args.no_bridge, say=say, rollouts=rollouts) if not card.partial else []
    if not beside and not others and not card.partial:
        say("drawn alone: no committed card of the field has these sizes and rollouts (the field's use the defaults, "
            "on policy; --compare NAME measures others the same way)")
    write(card, out, beside)
    for name, m in card.measured.items():
        print(f"{name:24s} {format_score(m.score)}")
    for name, why in card.skipped.items():
        print(f"{name:24s} not measured: {why}")
    print(f"Wrote {out / 'card.md'}, {out / 'card.json'} and {out / 'card.png'}"
          + (f" ({len(beside)} cards beside it)." if beside else "."))
    if card.partial:
        import signal

        return 128 + int(signal.Signals[card.stopped_by or "SIGINT"])
    return 0


def _sizes(args: argparse.Namespace) -> "Sizes":
    import dataclasses

    from seeupo.experiments.scorecard.capabilities import QUICK, Sizes

    sizes = dataclasses.replace(QUICK if args.quick else Sizes(), seed=args.seed)
    given = {"instances": args.instances, "iterations": args.iterations}
    return dataclasses.replace(sizes, **{k: v for k, v in given.items() if v is not None})


def _field(args: argparse.Namespace) -> int:
    from seeupo.experiments.scorecard.field import FIELD_OUTPUTS, build_field

    if args.name is not None or args.compare is not None or args.plugin:
        raise UsageError("argument --field: scores the catalogue; it takes no NAME, --compare or --plugin")
    if not rollouts_from(args).on_policy:
        raise UsageError("argument --field: the field is scored on policy; score one algorithm with "
                         "--staleness/--temperature/--top-k/--top-p/--kernel-noise (and --compare the others)")
    sizes = _sizes(args)
    out = writable_dir(args.out or str(SCORECARD_DIR / "field"), "--out")
    err = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    move_earlier_outputs_aside(out, FIELD_OUTPUTS, args.overwrite, "field", err)
    try:
        cards = build_field(out, sizes, workers=args.workers, bridge=not args.no_bridge,
                            say=(lambda m: None) if args.no_progress else err)
    except KeyboardInterrupt:
        print(f"Wrote the finished cards' table to {out / 'field.md'} (partial).")
        return 130
    print(f"Wrote {out / 'field.md'}, {out / 'field.json'}, {out / 'field.png'} and {len(cards)} cards in {out / 'cards'}.")
    return 0
