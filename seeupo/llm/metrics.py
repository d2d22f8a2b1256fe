"""Training metrics: one JSON object per step in ``metrics.jsonl``, optionally TensorBoard and W&B.

Names follow verl's dashboards (``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/kl_loss``,
``critic/vf_loss``, ``critic/score/mean``, ``response_length/mean``, ``timing_s/gen``,
``timing_s/update_actor``, ``perf/throughput``), so a user reads them where they already look.

The JSONL file is the record of the run: every line is flushed as it is written, a
non-finite value is written as ``null`` (JSON has no NaN), and on resume the lines after the
checkpoint's step are dropped so that the file holds each step once.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


class MetricsLogger:
    """Writes each step's metrics to ``out_dir/metrics.jsonl`` and to the optional back-ends.

    Args:
      out_dir: the run folder (created if missing).
      tensorboard: also write TensorBoard event files under ``out_dir/tensorboard`` (needs
        the ``tensorboard`` package; a clear error otherwise).
      wandb_project: also log to this W&B project (needs ``wandb``).
      resume_step: drop the lines of steps after this one (the run resumes from a checkpoint
        taken at ``resume_step``); ``None`` starts a new file.
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        tensorboard: bool = False,
        wandb_project: str | None = None,
        resume_step: int | None = None,
        run_name: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / METRICS_FILE
        if resume_step is None:
            self.path.write_text("")
        else:
            kept = [m for m in read_metrics(self.path) if m["step"] <= resume_step]
            self.path.write_text("".join(json.dumps(m) + "\n" for m in kept))
        self._file = self.path.open("a")
        self._tb = None
        self._wandb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:  # torch ships the writer, the tensorboard package does the work
                raise RuntimeError("logging.tensorboard needs the tensorboard package: pip install tensorboard") from err
            self._tb = SummaryWriter(str(self.out_dir / "tensorboard"), purge_step=resume_step)
        if wandb_project is not None:
            try:
                import wandb
            except ImportError as err:
                raise RuntimeError("logging.wandb_project needs the wandb package: pip install wandb") from err
            # the run's files live in the run folder; WANDB_MODE=offline keeps them there only
            self._wandb = wandb.init(project=wandb_project, name=run_name, config=config, dir=str(self.out_dir),
                                     resume="allow")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` of training step ``step``."""
        record = {"step": step, **{k: _finite_or_none(float(v)) for k, v in metrics.items()}}
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in metrics.items():
                self._tb.add_scalar(key, float(value), step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(dict(metrics), step=step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file (a run folder or the file itself); a torn last line is ignored."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # the process died while writing this line
            break
    return records
