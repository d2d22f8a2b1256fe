"""The figures (seeupo.figures): registry, deterministic data, plots of the committed data, the CLI."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from seeupo.cli import main
from seeupo.figures import FIGURES, module
from seeupo.figures._common import read_json, regenerate
from seeupo.figures.training_curves import read_run

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "figures"
# figures whose quick regeneration is cheap (reading recorded data, or a few seconds of tabular runs)
CHEAP = ["table1", "counterexamples", "bridge_lm", "step_time", "normalisation_ablation"]
# figures that only read recorded data (plus the replay of the counterexamples): their committed data must match
RECORDED = ["table1", "counterexamples", "bridge_lm"]
MEASURED = ["j_curves", "order_ablation", "m_ablation"]


def test_registry_lists_every_module_once_and_each_has_compute_plot_and_a_main():
    assert len(FIGURES) == len(set(FIGURES)) >= 9
    files = {p.stem for p in (REPO / "seeupo" / "figures").glob("*.py") if not p.stem.startswith("_")}
    assert files == set(FIGURES), "every figure module is registered, and only those"
    for name in FIGURES:
        mod = module(name)
        assert callable(mod.compute) and callable(mod.plot), name
        assert f'module_main("{name}")' in Path(mod.__file__).read_text(), f"python -m seeupo.figures.{name} must work"
    with pytest.raises(KeyError):
        module("no_such_figure")


@pytest.mark.slow
def test_two_quick_regenerations_give_identical_data_files(tmp_path):
    lines = []
    for run in ("a", "b"):
        regenerate(CHEAP, quick=True, out=tmp_path / run, log=lines.append)
    for name in CHEAP:
        a, b = (tmp_path / "a" / f"{name}.json").read_bytes(), (tmp_path / "b" / f"{name}.json").read_bytes()
        assert a == b, f"{name}: data differ between two regenerations"
        assert (tmp_path / "a" / f"{name}.png").stat().st_size > 5_000
    assert len(lines) == 2 * len(CHEAP) and all(" s  " in line for line in lines)  # one progress line per figure, with its time


@pytest.mark.slow
def test_measured_figures_are_deterministic_from_their_seed(tmp_path):
    for run in ("a", "b"):
        regenerate(MEASURED, quick=True, out=tmp_path / run, log=lambda m: None)
    for name in MEASURED:
        assert (tmp_path / "a" / f"{name}.json").read_bytes() == (tmp_path / "b" / f"{name}.json").read_bytes(), name
    other = module("j_curves").compute(quick=True, seed=1)
    assert other != read_json(tmp_path / "a" / "j_curves.json")  # the seed matters


def test_every_figure_is_committed_small_and_plots_from_its_recorded_data(tmp_path):
    for name in FIGURES:
        png, data = COMMITTED / f"{name}.png", COMMITTED / f"{name}.json"
        assert png.exists() and data.exists(), f"figures/{name}.png and .json are committed (seeupo figures --quick)"
        assert 5_000 < png.stat().st_size < 120_000, f"{png} should be a small PNG"
        module(name).plot(read_json(data), tmp_path / f"{name}.png")
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    readme = (COMMITTED / "README.md").read_text()
    top = (REPO / "README.md").read_text()
    for name in FIGURES:
        assert f"{name}.png" in readme and f"python -m seeupo.figures.{name}" in readme, f"figures/README.md describes {name}"
    for name in ("table1", "j_curves", "order_ablation", "counterexamples", "bridge_lm"):
        assert f"figures/{name}.png" in top, f"the README's gallery shows {name}"


def _close(a, b, path="data"):
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def test_committed_figure_data_is_current_with_the_recorded_results(tmp_path):
    regenerate(RECORDED, quick=True, out=tmp_path, log=lambda m: None)
    for name in RECORDED:
        _close(read_json(tmp_path / f"{name}.json"), read_json(COMMITTED / f"{name}.json"), name)


def test_table1_figure_shows_the_gspo_disagreement_and_the_counterexamples():
    data = read_json(COMMITTED / "table1.json")
    gspo = next(r for r in data["table1"] if r["row"] == "gspo")
    assert gspo["ST"]["paper"] == "converges" and gspo["ST"]["measured"] == "J decreased" and gspo["ST"]["agreement"] == "disagrees"
    assert gspo["ST"]["counterexamples"]
    assert len(data["cells"]) == 52  # 5 rows x 8 columns + 3 SeeUPO rows x 4 (multi-turn only)
    ce = read_json(COMMITTED / "counterexamples.json")["examples"]
    assert ce and all(e["J"][-1] < e["J"][0] for e in ce), "each saved counterexample lowers J when replayed"
    assert all(e["J"] == pytest.approx(e["J_recorded"], abs=1e-8) for e in ce)


def test_order_ablation_reverse_needs_one_sweep_and_forward_may_need_t():
    data = read_json(COMMITTED / "order_ablation.json")
    for T, per in data["mirror"].items():
        assert all(v is not None and v <= 1 for v in per["reverse"]), f"reverse order is backward induction: one sweep (T = {T})"
        assert all(v is not None and v <= int(T) for v in per["forward"]), "forward order needs at most T sweeps"
    assert data["worst_forward"]["2"]["forward"] == 2 and data["worst_forward"]["3"]["forward"] == 3


def test_training_curves_reads_any_run_folder_and_skips_torn_lines(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": 0, "bridge/J": 0.4}, {"step": 1, "critic/score/mean": 0.5, "actor/pg_loss": -0.1, "timing_s/step": 2.0, "bridge/J": 0.5},
            {"step": 2, "critic/score/mean": 0.75, "actor/pg_loss": -0.05, "timing_s/step": 2.1, "bridge/J": 0.6}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "rew')
    (run / "config.yaml").write_text("algorithm: {preset: grpo}\nenv: {name: bfcl}\n")
    got = read_run(run)
    assert got["steps"] == 2 and got["env"] == "bfcl" and got["preset"] == "grpo"
    assert got["curves"]["critic/score/mean"] == [[1, 0.5], [2, 0.75]] and got["curves"]["bridge/J"][0] == [0, 0.4]
    assert "actor/kl_loss" not in got["curves"]
    data = module("training_curves").compute(quick=True, runs=[str(run)])
    assert data["source"] == "given run folders" and "note" not in data
    module("training_curves").plot(json.loads(json.dumps(data)), tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 5_000


def test_training_curves_label_a_run_by_what_ran(tmp_path):
    """A modified preset is labelled by its saved ``algorithm.name``, not by the preset it started from."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "critic/score/mean": 0.5}) + "\n")
    (run / "config.yaml").write_text("algorithm: {preset: grpo, name: 'grpo+grae_scale=none'}\nenv: {name: bfcl}\n")
    got = read_run(run)
    assert got["preset"] == "grpo+grae_scale=none" and "grpo+grae_scale=none" in got["label"]


def test_cli_figures_unknown_name_missing_runs_and_plot_only(tmp_path, capsys):
    assert main(["figures", "table1", "nosuch", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "seeupo figures: error:" in err and "nosuch" in err and "table1" in err
    assert main(["figures", "training_curves", "--runs", str(tmp_path / "none"), "--out", str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
    assert main(["figures", "bridge_lm", "--plot-only", "--out", str(tmp_path / "empty")]) == 2
    assert "--plot-only" in capsys.readouterr().err
    assert main(["figures", "bridge_lm", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("bridge_lm") and (tmp_path / "bridge_lm.png").exists()
    before = (tmp_path / "bridge_lm.json").read_bytes()
    assert main(["figures", "bridge_lm", "--plot-only", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "bridge_lm.json").read_bytes() == before


def test_module_main_runs_as_a_script(tmp_path):
    out = subprocess.run([sys.executable, "-m", "seeupo.figures.step_time", "--out", str(tmp_path)], capture_output=True, text=True,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "step_time.png").exists() and "step_time" in out.stdout


@pytest.mark.slow
def test_training_curves_without_runs_says_so_and_trains_the_bridge_demo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no runs/ or results/ here
    lines = []
    data = module("training_curves").compute(quick=True, log=lines.append)
    assert "no BFCL run" in data["note"] and lines and "no BFCL run found" in lines[0]
    assert data["runs"] and "NOT a BFCL run" in data["runs"][0]["label"] and len(data["runs"][0]["curves"]["bridge/J"]) == 5


def test_step_time_reads_update_time_benchmark_files(tmp_path, monkeypatch):
    bench = tmp_path / "benchmarks" / "results"
    bench.mkdir(parents=True)
    (bench / "update_time_tiny-qwen3.json").write_text(json.dumps({
        "model": "tiny-qwen3", "median_seconds": {"grpo": 40.0, "seeupo": 48.0, "seeupo_equal_budget": 27.0},
        "ratio_seeupo_over_grpo": [1.41, 0.76, 1.21], "ratio_seeupo_equal_budget_over_grpo": [0.83, 0.39, 0.69],
        "load_average_1min": [9.2, 10.0, 11.0]}))
    monkeypatch.chdir(tmp_path)
    data = module("step_time").compute()
    assert [u["model"] for u in data["update_time"]] == ["tiny-qwen3"] and "note" not in data
    assert data["bridge"], "the committed bridge sweep is read from the repository"
    module("step_time").plot(json.loads(json.dumps(data)), tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 5_000


def test_step_time_reads_the_committed_multiturn_cost_records():
    data = module("step_time").compute()
    rows = {(r["turns"], r["context"], r["layout"]): r for r in data["layouts"] if not r["early_end"] and r["device"] == "CPU"}
    # the GPU records (benchmarks/gpu_step.py on an H100): SeeUPO / GRPO step time, prefix-shared, T = 10
    gpu = {(Path(r["file"]).parent.name, r["turns"], r["layout"]): r for r in data["layouts"] if r["device"] != "CPU"}
    assert gpu[("h100_2026-11-26", 10, "prefix_shared")]["seconds_ratio"] == pytest.approx(17.06 / 3.35, rel=2e-3)
    # a record with arms: the default arm's steps (13.68 s / 2.21 s), not the as_needed arm's (12.91 s / 2.12 s)
    third = gpu[("h100_2026-11-26-third-pass", 10, "prefix_shared")]
    assert third["device"] == "H100" and third["seconds_ratio"] == pytest.approx(13.68 / 2.21, rel=2e-3)
    # the fourth pass (a checkpointed layer keeps its attention): 12.495 s / 2.094 s, its default arm
    kept = gpu[("h100_2026-11-27-keep-attention", 10, "prefix_shared")]
    assert kept["seconds_ratio"] == pytest.approx(12.4951 / 2.0941, rel=1e-3)
    # the recorded step at T = 10, first context 5,833: tokens exact, seconds measured (paper_repro/step_cost)
    shared, packed = rows[(10, 5833, "prefix_shared")], rows[(10, 5833, "packed")]
    assert shared["tokens_ratio"] == pytest.approx(286_017 / 96_720) and packed["tokens_ratio"] == pytest.approx(775_968 / 219_192)
    assert shared["seconds_ratio"] > 1.0 and packed["seconds_ratio"] > shared["seconds_ratio"]
    assert rows[(5, 5833, "per_row")]["tokens_ratio"] == pytest.approx(1_021_416 / 801_960)
