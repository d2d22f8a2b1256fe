"""``seeupo eval``: avg@k and pass@k of a checkpoint (or the config's model) on the evaluation tasks.

Ctrl-C keeps the finished episodes and says how to continue (``--resume``), with exit status 130.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from seeupo.cli.common import plugin_option, require_llm_extra
from seeupo.validation.arguments import int_range, path_arg, positive_int, writable_dir
from seeupo.validation.errors import InputError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="avg@k and pass@k of a checkpoint on the evaluation tasks",
                       description="Roll out every evaluation task of the config's environment k times and report "
                                   "avg@k and pass@k per category (seeupo.llm.evaluate).")
    p.add_argument("config", nargs="?", help="YAML run config (its model, env and rollout sections are used)")
    p.add_argument("--checkpoint", help="a run folder (its newest checkpoint) or a checkpoints/step_N folder "
                                        "(default: the config's model as it is)")
    p.add_argument("--k", type=int_range(1, 1000), default=4, help="samples per task (default 4, the paper's avg@4/pass@4)")
    p.add_argument("--max-tasks", type=positive_int, help="only the first N evaluation tasks (default: all)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field (repeatable)")
    p.add_argument("--out", type=path_arg, default="results/eval",
                   help="folder for episodes.jsonl, the settings and the summary (default: results/eval); "
                        "it must be empty unless --resume or --overwrite")
    p.add_argument("--batch", type=int_range(1, 100_000), default=1,
                   help="episodes rolled out together (default 1: each alone, written as it finishes; "
                        "raise it on a GPU to batch generation)")
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted evaluation in --out: keep its episodes, roll out the rest "
                        "(refused unless config, --k, --checkpoint, --max-tasks and --batch are the same)")
    p.add_argument("--overwrite", action="store_true", help="delete the evaluation files already in --out and start afresh")
    plugin_option(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    require_llm_extra()
    from seeupo.llm.build import check_model_name
    from seeupo.llm.checkpoint import latest_checkpoint, load_checkpoint, load_model_weights
    from seeupo.llm.config import load_train_config
    from seeupo.llm.evaluate import EPISODES, check_output, eval_settings, evaluate_policy, markdown, start_output
    from seeupo.llm.trainer import Trainer

    cfg = load_train_config(args.config, list(args.set), args.plugin)
    check_model_name(cfg.model.name)
    out = writable_dir(args.out, "--out")
    checkpoint = None
    if args.checkpoint is not None:
        path = Path(args.checkpoint)
        checkpoint = path if (path / "state.pt").exists() else latest_checkpoint(path / "checkpoints" if (path / "checkpoints").is_dir() else path)
        if checkpoint is None:
            raise InputError(None, f"argument --checkpoint: no checkpoint in {path} (expected a run folder or a checkpoints/step_N folder)")
    settings = eval_settings(cfg, args.k, checkpoint, args.max_tasks, args.batch)
    check_output(out, settings, resume=args.resume, overwrite=args.overwrite)  # before the model loads
    trainer = Trainer(cfg, prepare=checkpoint is None, progress=not args.no_progress)
    if checkpoint is not None:
        load_model_weights(checkpoint, trainer.model)
        trainer.step_count = load_checkpoint(checkpoint)["trainer"]["step"]
    start_output(out, settings, resume=args.resume)
    try:
        scores = evaluate_policy(trainer, args.k, out, batch=args.batch, max_tasks=args.max_tasks,
                                 progress=not args.no_progress, resume=args.resume)
    except KeyboardInterrupt:  # what finished is on disk; say how to continue instead of a traceback
        kept = sum(1 for _ in (out / EPISODES).open()) if (out / EPISODES).exists() else 0
        print(f"seeupo eval: interrupted; {kept} finished episodes are in {out / EPISODES}; "
              "the same command with --resume continues", file=sys.stderr)
        return 130
    print(markdown(scores, args.k), end="")
    print(f"Wrote {out / EPISODES}, {out / 'summary.json'} and {out / 'summary.md'}.")
    return 0
