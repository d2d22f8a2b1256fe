"""Training metrics: one JSON object per step in ``metrics.jsonl``, optionally TensorBoard and W&B.

Names follow verl's dashboards (``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/kl_loss``,
``critic/vf_loss``, ``critic/score/mean``, ``response_length/mean``, ``timing_s/gen``,
``timing_s/update_actor``, ``perf/throughput``), so a user reads them where they already look.

The JSONL file is the record of the run: every line is flushed as it is written, a
non-finite value is written as ``null`` (JSON has no NaN), and on resume the lines after the
checkpoint's step are dropped so that the file holds each step once.

What a training step reports is computed here from what the step produced
(:func:`update_metrics`, :func:`m_metrics`, :func:`critic_metrics`, :func:`timing_metrics`), so
that :class:`seeupo.llm.trainer.Trainer` holds the loop and this module the names.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable

import torch

from seeupo.core.batch import SampleBatch, per_trajectory, segment_sum
from seeupo.core.config import AlgorithmConfig
from seeupo.core.parallel import DataParallel, owner_scored
from seeupo.core.update import UpdateStats, current_factor, final_factor

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


class NullLogger:
    """The metrics logger of processes other than process 0: logs nothing."""

    def __enter__(self) -> "NullLogger":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        return None


def progress_bar(iterable: Iterable, enabled: bool, **kwargs: Any) -> Iterable:
    """``iterable`` with a tqdm progress bar (``kwargs`` go to tqdm), or as it is when not ``enabled``."""
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, unit="step", dynamic_ncols=True, **kwargs)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def update_metrics(batch: SampleBatch, stats: UpdateStats, logp_diff: torch.Tensor, *, lr: float, prep_s: float,
                   update_s: float) -> dict[str, float]:
    """The metrics of one update on a rollout ``batch`` (the global batch under data parallelism).

    ``actor/*`` are the means over the update's optimizer steps of :class:`UpdateStats` (NaN when
    none was taken; ``actor/pg_loss`` is the negative objective) and ``actor/lr`` the rate they
    used; ``critic/score/*`` are over trajectories' returns, ``response_length/mean`` over valid
    turns' real tokens, ``episode/turns_mean`` the valid turns per trajectory;
    ``rollout/logp_diff_max`` is the largest ``|log p_policy - log p_engine|`` over real tokens
    (``logp_diff``, one entry per real token; 0 when there is none). ``prep_s``: seconds of scoring
    and advantages; ``update_s``: of the update, the critic's and the weight sync. A sequential
    update whose ``M`` reads the ratio adds ``actor/fused_ratio_passes``: 1 when its ratio passes
    were fused into the next turns' steps, 0 when not (``stats.fusion_blocker`` says why). With an entropy
    bonus, ``actor/entropy`` is the aggregated entropy of the response tokens' conditionals (verl's name).
    """
    real = batch.token_mask & batch.valid[:, None]
    returns = per_trajectory(batch.traj_return, batch)
    turns = segment_sum(batch.valid.to(torch.float64), batch.traj_id, batch.num_trajectories)
    response_tokens = real.sum(1)[batch.valid].to(torch.float64)
    optional = {} if stats.fused_ratio_passes is None else {"actor/fused_ratio_passes": float(stats.fused_ratio_passes)}
    optional |= {"actor/entropy": _mean(stats.entropy)} if stats.entropy else {}
    return optional | {
        "actor/pg_loss": -_mean(stats.objective),
        "actor/pg_clipfrac": _mean(stats.clip_frac),
        "actor/kl_loss": _mean(stats.kl),
        "actor/grad_norm": _mean(stats.grad_norm),
        "actor/lr": lr,
        "actor/optimizer_steps": float(stats.steps),
        "actor/skipped_steps": float(stats.skipped_steps),
        "critic/score/mean": float(returns.mean()),
        "critic/score/max": float(returns.max()),
        "critic/score/min": float(returns.min()),
        "response_length/mean": float(response_tokens.mean()) if response_tokens.numel() else 0.0,
        "episode/turns_mean": float(turns.mean()),
        "rollout/logp_diff_max": float(logp_diff.max()) if logp_diff.numel() else 0.0,
        "timing_s/prep": prep_s,
        "timing_s/update_actor": update_s,
        "perf/total_num_tokens": float(real.sum()),
    }


def m_metrics(policy: Any, batch: SampleBatch, algo: AlgorithmConfig, stats: UpdateStats, *, drift: bool,
              dp: DataParallel | None = None) -> dict[str, float]:
    """The diagnostics of SeeUPO's factor ``M`` after a sequential update (``logging.m_final``, ``logging.m_drift``).

    Computed after the update and outside it: ``seeupo/m_final_mean``, ``seeupo/m_final_max`` of
    the factor after the whole sweep (one no-grad pass over the last turn's rows) and, with
    ``drift``, ``seeupo/m_drift_max``, the largest ``|log F_recorded - log F_current|`` against the
    factor under the final ``policy`` (one more pass over every row). Empty after a simultaneous update.
    With ``dp`` each row is scored on the process that owns it (:class:`~seeupo.core.parallel.OwnerScoring`).
    """
    policy = owner_scored(policy, dp)
    m_final = final_factor(policy, batch, algo, stats)
    if m_final is None:
        return {}
    out = {"seeupo/m_final_mean": float(m_final.mean()), "seeupo/m_final_max": float(m_final.max())}
    if drift:
        m_current = current_factor(policy, batch, stats.turn_order, algo)
        out["seeupo/m_drift_max"] = float((m_final.log() - m_current.log()).abs().max())
    return out


def critic_metrics(vf_loss: float, values: torch.Tensor, batch: SampleBatch) -> dict[str, float]:
    """``critic/vf_loss`` and ``critic/values/mean``, the mean value before the update over real tokens."""
    real = batch.token_mask & batch.valid[:, None]
    return {"critic/vf_loss": vf_loss, "critic/values/mean": float(values[real].mean())}


def timing_metrics(num_tokens: float, gen_s: float, step_s: float) -> dict[str, float]:
    """A step's ``timing_s/gen`` (the rollout), ``timing_s/step`` (all of it) and ``perf/throughput``
    (``num_tokens`` real tokens per second of the step)."""
    return {"timing_s/gen": gen_s, "timing_s/step": step_s, "perf/throughput": num_tokens / max(step_s, 1e-9)}
