"""The bridge_lm runner: its smallest configuration trains, writes consistent tables, and resumes."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("transformers")

from seeupo.experiments import bridge_lm  # noqa: E402
from seeupo.llm.metrics import read_metrics  # noqa: E402


def test_quick_sweep_writes_consistent_tables(tmp_path):
    out = tmp_path / "runs"
    tables = bridge_lm.main(["--quick", "--out", str(out), "--tables", str(tmp_path / "tables")])
    on_disk = json.loads((tmp_path / "tables" / "results.json").read_text())
    assert on_disk == json.loads(json.dumps(tables))
    md = (tmp_path / "tables" / "results.md").read_text()
    assert "| tiny-qwen3 | seeupo |" in md

    (row,) = tables["rows"]
    assert (row["model"], row["preset"], row["variant"], row["seeds"], row["steps"]) == ("tiny-qwen3", "seeupo", "", [0], 2)
    numbers = [v for k, v in row.items() if isinstance(v, float)]
    assert numbers and all(math.isfinite(v) for v in numbers)
    assert row["J_final_min"] <= row["J_final_mean"] <= row["J_final_max"] <= row["J_star"] + 1e-9
    assert row["J_initial_mean"] <= row["J_star"] + 1e-9
    assert math.isclose(row["gap_final_mean"], row["J_star"] - row["J_final_mean"], abs_tol=1e-12)
    assert 0 <= row["decreases_total"] <= row["step_transitions_total"] == 2
    assert row["largest_decrease"] >= 0.0
    assert row["m_drift_max_mean"] is not None and row["m_drift_max_mean"] >= 0.0  # seeupo logs the drift

    (run,) = tables["runs"]
    assert len(run["J"]) == 3 and all(0.0 <= j <= run["J_star"] + 1e-9 for j in run["J"])
    deltas = [b - a for a, b in zip(run["J"], run["J"][1:])]
    assert run["decreases"] == sum(d < -bridge_lm.DECREASE_TOL for d in deltas)

    # resumable: a complete run is skipped (its metrics file is left as it is)
    folder = out / "tiny-qwen3" / "seeupo" / "seed0"
    before = (folder / "metrics.jsonl").read_text()
    assert bridge_lm.is_complete(folder, 2)
    again = bridge_lm.main(["--quick", "--out", str(out), "--tables", str(tmp_path / "tables")])
    assert (folder / "metrics.jsonl").read_text() == before
    assert again["rows"] == tables["rows"]
    assert [r["step"] for r in read_metrics(folder)] == [0, 1, 2]


def test_summary_counts_decreases():
    records = [{"step": 0, "bridge/J": 0.5, "bridge/J_star": 1.0}]
    records += [{"step": k + 1, "bridge/J": j, "timing_s/step": 1.0, "timing_s/update_actor": 0.5, "seeupo/m_drift_max": 0.1}
                for k, j in enumerate([0.6, 0.4, 0.4 - 1e-9, 0.7, 0.65])]
    s = bridge_lm.summarise_run(records)
    assert s["decreases"] == 2 and math.isclose(s["largest_decrease"], 0.2)
    assert math.isclose(s["gap_final"], 0.35) and math.isclose(s["m_drift_max_mean"], 0.1)
