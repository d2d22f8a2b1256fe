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
    assert run["warmup_valid_prob"] >= 0.9 and run["warmup_steps"] <= 100  # the warm-up met its target
    assert run["J"][-1] > run["J"][0] + 0.05  # and the run learns (measured: 0.392 -> 0.568)
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


def _quick_base():
    return bridge_lm.quick_sweep().models[0]


def test_grid_records_each_run_once_and_resumes(tmp_path):
    out = tmp_path / "grid"
    specs = bridge_lm.grid_specs([3e-3, 1e-3], 1, ["seeupo", "grpo"], base=_quick_base())
    assert [(s.model.lr, s.label, s.seed) for s in specs] == [(3e-3, "seeupo", 0), (3e-3, "grpo", 0),
                                                              (1e-3, "seeupo", 0), (1e-3, "grpo", 0)]
    sweep = bridge_lm.quick_sweep()
    bridge_lm.run_grid(specs[:3], sweep, out, log=lambda *_: None)
    runs = bridge_lm.read_grid(out)
    assert sorted((r["lr"], r["label"]) for r in runs) == [(1e-3, "seeupo"), (3e-3, "grpo"), (3e-3, "seeupo")]
    for r in runs:
        assert len(r["J"]) == len(r["valid_prob_turn0"]) == len(r["actor/kl_loss"]) == 3
        assert all(0.0 <= j <= r["J_star"] + 1e-9 for j in r["J"]) and all(0.0 <= v <= 1.0 + 1e-9 for v in r["valid_prob_turn0"])
    by = {(r["lr"], r["label"]): r for r in runs}
    # same seed, same warm-up: every lr starts from the same weights
    assert by[(1e-3, "seeupo")]["J"][0] == by[(3e-3, "seeupo")]["J"][0]

    # a crash mid-write leaves a cut line: ignored, and the finished runs are not trained again
    lr3 = bridge_lm.grid_file(out, 3e-3)
    before = lr3.read_text()
    lr3.write_text(before + '{"model": "tiny-qwen3", "label": "gr')
    bridge_lm.run_grid(specs, sweep, out, log=lambda *_: None)
    assert lr3.read_text().startswith(before)
    runs = bridge_lm.read_grid(out)
    assert len(runs) == 4 and sorted(r["lr"] for r in runs) == [1e-3, 1e-3, 3e-3, 3e-3]
    assert {r["label"]: r["J"] for r in runs if r["lr"] == 3e-3} == {r["label"]: r["J"] for r in json_lines(before)}


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def _run(label: str, lr: float, seed: int, J: list[float], valid: list[float] | None = None) -> dict:
    return {"model": "m", "label": label, "lr": lr, "seed": seed, "steps": len(J) - 1, "J": J,
            "valid_prob_turn0": valid or [0.99] * len(J)}


def test_run_outcomes_thresholds():
    o = bridge_lm.run_outcomes(_run("seeupo", 1e-3, 0, [0.4, 0.04, 0.5, 0.9], [0.99, 0.1, 0.8, 0.99]))
    assert o["collapse"] and o["drop"] and o["J_min"] == 0.04 and o["valid_prob_at_J_min"] == 0.1
    assert math.isclose(o["largest_drop"], 0.36)
    o = bridge_lm.run_outcomes(_run("grpo", 1e-3, 0, [0.4, 0.5, 0.41, 0.06]))
    assert not o["collapse"] and o["drop"]  # 0.41 -> 0.06 is a drop of 0.35, and 0.06 is above 0.05
    o = bridge_lm.run_outcomes(_run("grpo", 1e-3, 0, [0.04, 0.3, 0.25, 0.9]))
    assert not o["collapse"] and not o["drop"]  # the initial J does not count; a drop of 0.05 is below 0.1


def test_summarise_grid_counts_and_tests_by_hand():
    collapse, fine = [0.4, 0.0, 0.9], [0.4, 0.6, 0.9]
    runs = [_run("seeupo", 3e-3, s, collapse if s < 3 else fine) for s in range(20)]
    runs += [_run("grpo", 3e-3, s, fine) for s in range(20)]
    runs += [_run("seeupo", 1e-3, s, fine) for s in range(10)] + [_run("grpo", 1e-3, s, collapse if s == 0 else fine) for s in range(10)]
    summary = bridge_lm.summarise_grid(runs)
    cells = {(c["lr"], c["label"]): c for c in summary["cells"]}
    assert (cells[(3e-3, "seeupo")]["collapse"]["k"], cells[(3e-3, "seeupo")]["collapse"]["n"]) == (3, 20)
    assert cells[(3e-3, "seeupo")]["drop"]["k"] == 3 and cells[(3e-3, "grpo")]["collapse"]["k"] == 0
    assert cells[(3e-3, "seeupo")]["valid_prob_at_collapse_max"] == 0.99 and cells[(3e-3, "grpo")]["valid_prob_at_collapse_max"] is None
    assert cells[(3e-3, "seeupo")]["collapses_format_lost"] == 0 and cells[(1e-3, "grpo")]["collapses_format_lost"] == 0
    lost = bridge_lm.summarise_grid([_run("grpo", 1e-3, 0, [0.4, 0.01, 0.9], [0.99, 0.2, 0.99]),
                                     _run("grpo", 1e-3, 1, [0.4, 0.01, 0.9], [0.99, 0.7, 0.99])])
    assert lost["cells"][0]["collapses_format_lost"] == 1 and lost["cells"][0]["valid_prob_at_collapse_max"] == 0.7
    tests = {(t["group"], t["event"]): t for t in summary["tests"]}
    t = tests[("lr 0.003", "collapse")]
    assert (t["a"], t["b"], t["a_k"], t["a_n"], t["b_k"], t["b_n"]) == ("seeupo", "grpo", 3, 20, 0, 20)
    assert math.isclose(t["p"], 2 * 1140 / 9880)  # the hand enumeration of tests/experiments/test_stats.py
    pooled = tests[("pooled lr 0.001..0.003", "collapse")]
    assert (pooled["a_k"], pooled["a_n"], pooled["b_k"], pooled["b_n"]) == (3, 30, 1, 30)
    assert all(t["test"] == "Fisher exact, two-sided" for t in summary["tests"])


@pytest.mark.parametrize("argv,needle", [
    (["--lr", "1e-3"], "--lr needs --grid"),
    (["--grid", "--lr", "0"], "--lr must lie in (0, 1]"),
    (["--grid", "--lr", "nan"], "--lr must lie in (0, 1]"),
    (["--grid", "--seeds", "0"], "--seeds must lie in 1.."),
    (["--grid", "--labels", "seeupo-nope"], "unknown preset label 'seeupo-nope'"),
    (["--grid", "--labels", "grpo-equal_budget"], "unknown preset label"),
    (["--grid", "--quick"], "--grid takes"),
    (["--seeds=3"], "--seeds needs --grid"),
    (["--grid", "--tables-only"], "no finished grid runs"),
])
def test_grid_arguments_are_checked_before_training(argv, needle, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        bridge_lm.main([*argv, "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_grid_lr_reaches_the_trainer_config(tmp_path):
    (spec,) = bridge_lm.grid_specs([1.5e-3], 1, ["seeupo-equal_budget"])
    cfg = bridge_lm.train_config(spec, bridge_lm.full_sweep(), tmp_path)
    assert cfg.optim.lr == 1.5e-3 and cfg.algorithm.equal_budget and cfg.steps == 12
