"""Metrics JSONL: one record per step, flushed, valid JSON for non-finite values, resumable; a step's
metrics from hand-made batches and update statistics."""

import json
import math

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.config import PRESETS
from seeupo.core.update import UpdateStats
from seeupo.llm.metrics import (
    METRICS_FILE, MetricsLogger, critic_metrics, m_metrics, read_metrics, timing_metrics, update_metrics,
)


def test_records_are_flushed_and_valid_json(tmp_path):
    logger = MetricsLogger(tmp_path)
    logger.log(1, {"actor/pg_loss": 0.5, "critic/score/mean": math.nan})
    # flushed: readable before close
    lines = (tmp_path / METRICS_FILE).read_text().splitlines()
    assert [json.loads(x) for x in lines] == [{"step": 1, "actor/pg_loss": 0.5, "critic/score/mean": None}]
    logger.log(2, {"actor/pg_loss": math.inf})
    logger.close()
    assert read_metrics(tmp_path) == [{"step": 1, "actor/pg_loss": 0.5, "critic/score/mean": None}, {"step": 2, "actor/pg_loss": None}]


def test_resume_drops_the_steps_after_the_checkpoint(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        for step in range(1, 6):
            logger.log(step, {"x": float(step)})
    with MetricsLogger(tmp_path, resume_step=3) as logger:
        logger.log(4, {"x": 40.0})
    assert [(m["step"], m["x"]) for m in read_metrics(tmp_path)] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


def test_a_torn_last_line_is_ignored(tmp_path):
    (tmp_path / METRICS_FILE).write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x"')
    assert read_metrics(tmp_path) == [{"step": 1, "x": 1.0}]
    with MetricsLogger(tmp_path, resume_step=1) as logger:
        logger.log(2, {"x": 2.0})
    assert read_metrics(tmp_path) == [{"step": 1, "x": 1.0}, {"step": 2, "x": 2.0}]


def test_new_run_starts_an_empty_file(tmp_path):
    (tmp_path / METRICS_FILE).write_text('{"step": 7}\n')
    MetricsLogger(tmp_path).close()
    assert read_metrics(tmp_path) == []


def test_tensorboard_backend_writes_the_scalars(tmp_path):
    import pytest

    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path, tensorboard=True) as logger:
        logger.log(1, {"actor/pg_loss": 0.5})
        logger.log(2, {"actor/pg_loss": 0.25})
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("actor/pg_loss")] == [(1, 0.5), (2, 0.25)]


def test_wandb_backend_offline_run_lives_in_the_run_folder(tmp_path, monkeypatch):
    import pytest

    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    with MetricsLogger(tmp_path, wandb_project="seeupo-test", run_name="t", config={"steps": 2}) as logger:
        logger.log(1, {"critic/score/mean": 0.5})
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0


def _batch(shift: list[float] | None = None) -> SampleBatch:
    """2 trajectories x 2 turns, 3 token slots. Trajectory 0: both turns valid (3 and 1 real tokens),
    return 1.0; trajectory 1: turn 0 valid (2 tokens), turn 1 a placeholder whose mask still has a
    token (left out of every metric), return 0.5. ``shift``: per-row log-ratio of a fake policy."""
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    data = {"shift": torch.tensor(shift, dtype=torch.float64)} if shift is not None else {}
    return SampleBatch(
        traj_id=torch.tensor([0, 0, 1, 1]), group_id=torch.tensor([0, 0, 0, 0]), turn=torch.tensor([0, 1, 0, 1]),
        logp_old=torch.zeros(4, 3, dtype=torch.float64), token_mask=mask, valid=torch.tensor([True, True, True, False]),
        reward=torch.zeros(4, dtype=torch.float64), traj_return=torch.tensor([1.0, 1.0, 0.5, 0.5], dtype=torch.float64),
        weight=torch.ones(4, dtype=torch.float64), instance=torch.zeros(4, dtype=torch.long), data=data,
    )


def test_update_metrics_by_hand():
    stats = UpdateStats(steps=2, skipped_steps=1, objective=[0.2, 0.4], clip_frac=[0.1, 0.3], kl=[], grad_norm=[1.0, 3.0])
    m = update_metrics(_batch(), stats, torch.tensor([0.1, 0.5, 0.2]), lr=1e-3, prep_s=2.0, update_s=3.0)
    assert math.isclose(m["actor/pg_loss"], -0.3) and math.isclose(m["actor/pg_clipfrac"], 0.2)
    assert math.isnan(m["actor/kl_loss"])  # no KL term was recorded: no mean
    assert m["actor/grad_norm"] == 2.0 and m["actor/lr"] == 1e-3
    assert (m["actor/optimizer_steps"], m["actor/skipped_steps"]) == (2.0, 1.0)
    assert (m["critic/score/mean"], m["critic/score/max"], m["critic/score/min"]) == (0.75, 1.0, 0.5)
    assert m["response_length/mean"] == 2.0  # (3 + 1 + 2) / 3 valid turns; the placeholder's token is not counted
    assert m["episode/turns_mean"] == 1.5  # 2 and 1 valid turns
    assert m["rollout/logp_diff_max"] == 0.5
    assert (m["timing_s/prep"], m["timing_s/update_actor"], m["perf/total_num_tokens"]) == (2.0, 3.0, 6.0)
    assert update_metrics(_batch(), stats, torch.zeros(0), lr=0.0, prep_s=0.0, update_s=0.0)["rollout/logp_diff_max"] == 0.0
    assert "actor/fused_ratio_passes" not in m  # not a sequential update whose M reads the ratio
    for fused in (True, False):
        stats.fused_ratio_passes = fused
        assert update_metrics(_batch(), stats, torch.zeros(0), lr=0.0, prep_s=0.0, update_s=0.0)["actor/fused_ratio_passes"] == float(fused)


def test_critic_and_timing_metrics_by_hand():
    values = torch.arange(12, dtype=torch.float64).reshape(4, 3)
    # real tokens: row 0: 0, 1, 2; row 1: 3; row 2: 6, 7 (row 3 is a placeholder)
    assert critic_metrics(0.25, values, _batch()) == {"critic/vf_loss": 0.25, "critic/values/mean": 19.0 / 6.0}
    assert timing_metrics(6.0, gen_s=1.0, step_s=4.0) == {"timing_s/gen": 1.0, "timing_s/step": 4.0, "perf/throughput": 1.5}


class _ShiftedPolicy:
    """Log-probabilities ``logp_old + shift`` per row: every turn ratio is ``exp(shift)`` (one-token rows here)."""

    def token_logps(self, batch: SampleBatch) -> torch.Tensor:
        return batch.logp_old + batch.data["shift"][:, None]


def test_m_metrics_by_hand():
    # one-token rows: ratio exp(shift) per row; turn 0: traj 0 x2, traj 1 x1; turn 1: traj 0 x3, traj 1 x0.5
    batch = _batch([math.log(2.0), math.log(3.0), 0.0, math.log(0.5)])
    batch = batch.with_updates(token_mask=torch.tensor([[1, 0, 0]] * 4, dtype=torch.bool), valid=torch.ones(4, dtype=torch.bool))
    seeupo = PRESETS["seeupo"]
    recorded = UpdateStats(turn_order=[0, 1], factor=torch.tensor([2.0, 0.5], dtype=torch.float64))
    m = m_metrics(_ShiftedPolicy(), batch, seeupo, recorded, drift=True)
    # after the sweep: the recorded factor times the last turn's ratio, [2 x 3, 0.5 x 0.5] = [6, 0.25];
    # under the current policy both turns' ratios: [2 x 3, 1 x 0.5] = [6, 0.5], so the drift is log 2
    assert math.isclose(m["seeupo/m_final_mean"], 3.125) and math.isclose(m["seeupo/m_final_max"], 6.0)
    assert math.isclose(m["seeupo/m_drift_max"], math.log(2.0))
    assert "seeupo/m_drift_max" not in m_metrics(_ShiftedPolicy(), batch, seeupo, recorded, drift=False)
    assert m_metrics(_ShiftedPolicy(), batch, seeupo, UpdateStats(steps=1), drift=True) == {}  # a simultaneous update
