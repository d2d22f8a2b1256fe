"""``seeupo train``: train a causal LM with any preset on a multi-turn environment (also under torchrun).

Every check (the config, a broken plugin, the run folder and resume policy of
:func:`seeupo.llm.run_folder.plan_run`, the model name, liger where it cannot run) comes before the
run folder is created or a model is loaded.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from seeupo.cli.common import plugin_option, require_llm_extra
from seeupo.validation.arguments import path_arg, writable_dir

if TYPE_CHECKING:
    from seeupo.llm.config import TrainConfig
    from seeupo.llm.trainer import Trainer


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a language model on a multi-turn environment",
                       description="Train a causal LM with any preset (seeupo.llm.trainer). The YAML config and "
                                   "its fields are documented in seeupo/llm/config.py; configs/ has examples.")
    p.add_argument("config", nargs="?", help="YAML run config (default: the built-in defaults)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set optim.lr=1e-5 (repeatable)")
    p.add_argument("--out", type=path_arg, help="the run folder (overrides out_dir)")
    plugin_option(p)
    resume = p.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_true",
                        help="continue the run in the run folder from its newest checkpoint (an error when there is none); "
                             "the config may differ from the run's only in the fields of seeupo.llm.config.RESUMABLE_FIELDS")
    resume.add_argument("--resume-if-possible", action="store_true",
                        help="--resume when the run folder has a checkpoint, else start the run fresh there")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    require_llm_extra()
    from seeupo.core.contract import dry_run
    from seeupo.llm.build import check_model_name
    from seeupo.llm.config import check_for_training, load_train_config
    from seeupo.llm.distributed import launched_by_torchrun, shutdown
    from seeupo.llm.kernels import refuse_liger_where_it_cannot_run
    from seeupo.llm.run_folder import plan_run
    from seeupo.llm.trainer import Trainer

    overrides = list(args.set) + ([f"out_dir={args.out}"] if args.out else [])
    cfg = load_train_config(args.config, overrides, args.plugin)
    check_for_training(cfg)
    # a broken plugin is named before the run folder exists (else it would hold a config and a partial log)
    dry_run(cfg.algorithm)
    plan = plan_run(cfg, resume=args.resume, resume_if_possible=args.resume_if_possible)
    if plan.complete:
        print(f"seeupo train: {Path(cfg.out_dir)} is complete (its newest checkpoint is step {plan.step} of "
              f"steps {cfg.steps}); nothing to train, nothing written. --set steps=N continues it to step N.")
        return 0
    check_model_name(cfg.model.name)
    refuse_liger_where_it_cannot_run(cfg)
    out = writable_dir(Path(cfg.out_dir), "--out")
    env = None
    if launched_by_torchrun():  # torchrun --nproc-per-node N -m seeupo train ...: FSDP2 data parallelism
        from seeupo.llm.distributed import init_distributed

        env = init_distributed()
    try:
        progress = not args.no_progress and cfg.logging.progress
        trainer = Trainer(cfg, dist=env, check_prompts=True, progress=progress)
        return _train(cfg, args, trainer, out, resume=plan.checkpoint is not None)
    finally:
        if env is not None:
            shutdown()


def _train(cfg: TrainConfig, args: argparse.Namespace, trainer: Trainer, out: Path, *, resume: bool) -> int:
    """Run the training loop, printing a line per step (on the main process); 1 when training diverged."""
    from seeupo.core.boundary import PluginError
    from seeupo.llm.metrics import METRICS_FILE
    from seeupo.llm.run_folder import FAILED_FILE
    from seeupo.llm.trainer import TrainingDiverged

    say = print if trainer.is_main else (lambda *a, **k: None)
    progress = not args.no_progress and cfg.logging.progress
    if progress and trainer.is_main:
        from tqdm import tqdm

        say = tqdm.write
    try:
        for metrics in trainer.run(resume=resume, progress=progress):
            shown = {k: metrics[k] for k in ("critic/score/mean", "bridge/J", "bridge/J_star", "actor/kl_loss") if k in metrics}
            say("  ".join([f"step {trainer.step_count}"] + [f"{k} {v:.4f}" for k, v in shown.items()]))
    except TrainingDiverged as err:
        if trainer.is_main:
            print(f"seeupo train: stopped: {err}", file=sys.stderr)
        return 1
    except PluginError as err:
        # a plugin that broke only after the run began (the dry run before it passed): the folder already holds
        # config.yaml and the steps logged so far, so it is marked as a finished, failed run
        if trainer.is_main and out.is_dir():
            (out / FAILED_FILE).write_text(f"failed at step {trainer.step_count + 1}: {err}\n")
        raise
    say(f"Wrote {out / METRICS_FILE} and checkpoints under {out / 'checkpoints'}.")
    return 0
