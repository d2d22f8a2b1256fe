"""A training run's folder before the run starts: resume it, start it fresh, or refuse.

``seeupo train`` decides with :func:`plan_run` before the folder is created or a model is
loaded, so that every refusal is one line and leaves nothing behind. A run folder holds the run's
``config.yaml``, its ``metrics.jsonl``, ``checkpoints/step_N`` and, when a plugin broke its
contract during the run, :data:`FAILED_FILE`.

Nothing here imports torch at import time (the checkpoint helpers are imported when called).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from seeupo.validation.errors import InputError

if TYPE_CHECKING:
    from seeupo.llm.config import TrainConfig

FAILED_FILE = "failed.txt"
"""Written into a run folder when a plugin broke its contract during the run: the error's one line and the step."""


@dataclass(frozen=True)
class RunPlan:
    """What a training command does with its run folder.

    ``checkpoint``: the newest checkpoint to resume from, ``None`` for a fresh run. ``complete``:
    that checkpoint already reached the config's ``steps`` (there is nothing to train), with
    ``step`` its step."""

    checkpoint: Path | None
    step: int | None = None
    complete: bool = False


def holds_run(out: Path) -> bool:
    """Whether ``out`` holds (part of) a run: its metrics, config or checkpoints."""
    from seeupo.llm.metrics import METRICS_FILE

    return any((out / name).exists() for name in (METRICS_FILE, "config.yaml", "checkpoints"))


def plan_run(cfg: TrainConfig, *, resume: bool, resume_if_possible: bool) -> RunPlan:
    """Decide what to do with ``cfg.out_dir``, touching nothing, or refuse with an :class:`InputError`.

    * ``resume`` (``--resume``): continue from the newest checkpoint; a folder that is missing or holds
      none is refused (there is nothing to resume).
    * ``resume_if_possible`` (``--resume-if-possible``): resume when there is a checkpoint, else start fresh.
    * neither: a folder that already holds a run (a config, metrics or checkpoints) is refused, so that
      no run is overwritten or mixed with another.

    When resuming a run whose saved config is known, ``cfg`` may differ from it only in
    :data:`seeupo.llm.config.RESUMABLE_FIELDS` (:func:`seeupo.llm.config.resume_changes` refuses the
    rest). A checkpoint at or past ``cfg.steps`` gives ``complete=True``: the caller trains nothing.
    """
    from seeupo.llm.checkpoint import checkpoint_step, latest_checkpoint, saved_run_config
    from seeupo.llm.config import resume_changes

    out = Path(cfg.out_dir)
    checkpoint = latest_checkpoint(out / "checkpoints") if out.is_dir() else None
    if resume and checkpoint is None:
        what = "does not exist" if not out.exists() else "holds no checkpoint"
        raise InputError(None, f"argument --resume: {out} {what}, so there is nothing to resume; "
                               "--resume-if-possible starts a fresh run when there is no checkpoint")
    saved = saved_run_config(out) if out.is_dir() else None
    if saved is not None or holds_run(out):
        if not (resume or resume_if_possible):
            raise InputError(None, f"argument --out: {out} already holds a run; pass --resume to continue it or choose another out_dir")
        if saved is not None:
            resume_changes(saved, cfg)  # refuses a config that would make it another run
    if checkpoint is None:
        return RunPlan(None)
    step = checkpoint_step(checkpoint)
    return RunPlan(checkpoint, step, complete=step >= cfg.steps)
