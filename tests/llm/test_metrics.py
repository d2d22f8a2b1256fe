"""Metrics JSONL: one record per step, flushed, valid JSON for non-finite values, resumable."""

import json
import math

from seeupo.llm.metrics import METRICS_FILE, MetricsLogger, read_metrics


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
