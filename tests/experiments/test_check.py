"""Reports that mean what they say: no verdict from no signal, one truth per report, time and interruption.

The command-line runs are subprocesses: each loads its plugin into a fresh registry, and the
SIGTERM test needs a process to stop.
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from seeupo.experiments.verdicts import EXACT_MEASURED, NO_SIGNAL, SAMPLED_MEASURED, history_outcome, no_signal, table1_verdict

ROOT = Path(__file__).resolve().parents[2]

ZERO = '''
from seeupo.core.advantages import broadcast_to_tokens
from seeupo.core.batch import per_trajectory
from seeupo.core.config import preset, register_preset
from seeupo.core.registry import register_adv_est

@register_adv_est("zero_test", needs_group_stats=True)
def zero(batch, cfg, *, critic_values=None, oracle=None, group_stats=None):
    """No signal at all: every advantage 0."""
    return broadcast_to_tokens((per_trajectory(batch.traj_return, batch) * 0.0)[batch.traj_id], batch)

register_preset(preset("grpo", name="zero_grpo", advantage="zero_test", grae_scale="none"))
'''

# GRPO's advantage with the sign flipped: every exact update lowers J, so a search finds a case at once
ANTI = '''
from seeupo.core.advantages import broadcast_to_tokens
from seeupo.core.batch import per_trajectory, segment_sum
from seeupo.core.config import preset, register_preset
from seeupo.core.registry import register_adv_est

@register_adv_est("anti_test", needs_group_stats=True)
def anti(batch, cfg, *, critic_values=None, oracle=None, group_stats=None):
    r, g = per_trajectory(batch.traj_return, batch), per_trajectory(batch.group_id, batch)
    mean = segment_sum(r, g, batch.num_groups) / cfg.group_size
    return broadcast_to_tokens((mean[g] - r)[batch.traj_id], batch)

register_preset(preset("rloo", name="anti_pg", advantage="anti_test"))
'''


def seeupo(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "seeupo", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_a_frozen_J_is_no_learning_signal():
    frozen = torch.full((5, 3), 0.375, dtype=torch.float64)
    assert no_signal(frozen) and no_signal(torch.tensor([[0.5], [float("nan")]]))
    assert not no_signal(torch.tensor([[0.5, 0.5], [0.5, 0.6]]))  # one instance moved: a signal
    hist = SimpleNamespace(J=frozen, J_star=torch.ones(3, dtype=torch.float64), gap=1 - frozen,
                           violations=lambda tol: torch.zeros(4, 3))
    for mode in ("exact", "sampled"):
        assert history_outcome(hist, mode)["measured"] == NO_SIGNAL
    assert NO_SIGNAL in EXACT_MEASURED and NO_SIGNAL in SAMPLED_MEASURED
    assert table1_verdict("converges", NO_SIGNAL, []) == (NO_SIGNAL, "inconclusive")


@pytest.mark.slow
def test_a_zero_estimator_gets_no_learning_signal_in_verify_and_check(tmp_path):
    from seeupo.core.config import PRESETS, preset
    from seeupo.core.registry import ADV_ESTIMATORS, register_adv_est
    from seeupo.experiments.verify import VerifyConfig, algorithm_rows, run_cell

    from seeupo.core.advantages import broadcast_to_tokens
    from seeupo.core.batch import per_trajectory

    def zero(batch, cfg, **_):
        return broadcast_to_tokens((per_trajectory(batch.traj_return, batch) * 0.0)[batch.traj_id], batch)

    register_adv_est("zero_in_process", needs_group_stats=True)(zero)
    PRESETS["zero_in_process"] = preset("grpo", name="zero_in_process", advantage="zero_in_process")
    try:
        row = algorithm_rows(["zero_in_process"], 10)[0]
        cfg = VerifyConfig(instances=3, iterations=3, workers=1)
        for mode in ("exact", "sampled"):
            assert run_cell(row, "ST", mode, "independent", cfg).verdict == NO_SIGNAL
    finally:
        ADV_ESTIMATORS.remove("zero_in_process")
        del PRESETS["zero_in_process"]

    (tmp_path / "zero.py").write_text(ZERO)
    done = seeupo("check", "zero_grpo", "--plugin", "zero.py", "--quick", "--no-bridge", "--no-progress",
                  "--budget", "30", "--out", "out", cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # measured nothing: not a pass
    assert done.stdout.startswith(f"zero_grpo: {NO_SIGNAL}; ")
    report = json.loads((tmp_path / "out/check.json").read_text())
    assert report["monotonicity"]["measured"] == NO_SIGNAL
    assert {c["verdict"] for c in report["verify"]["cells"]} == {NO_SIGNAL}
    assert all(s["moved"] == 0 and not s["found"] for s in report["searches"])
    text = (tmp_path / "out/check.md").read_text()
    assert f"Exact monotonicity, measured: **{NO_SIGNAL}**" in text
    # one truth per report: one total time, one plugin line, headings as run, no internal field names
    assert text.count("Total time") == 1 and text.count("Plugins:") == 1
    assert "## Verify cells (exact)" in text and "## Searches (exact mode)" in text and "sampled)" not in text
    assert "counterexample_dir" not in text and "no violation" not in text
    assert "converges" not in text.split("## Verdict")[1].split("## Searches")[0]


def test_verify_with_an_algorithms_counterexamples_never_says_converges(tmp_path):
    # the committed DAPO counterexample lowers J in one exact single-turn update (independent parameters)
    done = seeupo("verify", "--quick", "--algorithms", "dapo", "--plugin", str(ROOT / "examples/algorithms/dapo.py"),
                  "--counterexamples", str(ROOT / "paper_repro/algorithms/dapo"), "--instances", "2", "--iterations", "3",
                  "--workers", "1", "--no-progress", "--out", "v", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "v/verify.json").read_text())
    st = next(c for c in report["cells"] if c["setting"] == "ST" and c["mode"] == "exact")
    assert st["verdict"] == "J decreased" and st["counterexamples"] and st["random_instances"]
    assert report["table1"][0]["ST"]["measured"] == "J decreased"
    assert any(e["decreases"] for e in report["counterexamples"])
    text = (tmp_path / "v/verify.md").read_text()
    assert "**J decreased** in saved counterexamples that replay" in text
    st_line = next(line for line in text.splitlines() if line.startswith("| dapo | ST | exact |"))
    assert st_line.split("|")[5].strip().startswith("J decreased")


@pytest.mark.slow
def test_sigterm_writes_a_partial_report_and_overwrite_keeps_the_counterexamples(tmp_path):
    (tmp_path / "anti.py").write_text(ANTI)
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "seeupo", "check", "anti_pg", "--plugin", "anti.py", "--quick", "--no-bridge",
           "--max-examples", "40", "--out", "out"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:  # stop it once a counterexample has been saved, while the other searches run
        seen.append(line)
        if line.startswith("search anti_pg_") and "J " in line:
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, "".join(seen) + err
    report = json.loads((tmp_path / "out/check.json").read_text())
    assert report["partial"] == "SIGTERM"
    found = [s for s in report["searches"] if s["found"]]
    assert found and all((tmp_path / "out" / s["file"]).exists() for s in found)
    assert len(report["searches"]) < 5
    text = (tmp_path / "out/check.md").read_text()
    assert "(partial: stopped by SIGTERM)" in text and "**Partial report**" in text and found[0]["file"] in text
    assert report["monotonicity"]["measured"] == "J decreased"

    # --overwrite moves the earlier files aside (the budget's logic is tested apart, with no clock: test_fit_*)
    again = seeupo("check", "anti_pg", "--plugin", "anti.py", "--quick", "--no-bridge", "--no-progress",
                   "--budget", "20", "--out", "out", "--overwrite", cwd=tmp_path)
    assert again.returncode == 0, again.stderr  # whatever the verdict, without --fail-on-decrease
    assert "moving the earlier check's files aside" in again.stderr
    previous = list((tmp_path / "out").glob("previous-*"))
    assert len(previous) == 1
    for s in found:
        assert (previous[0] / s["file"]).exists()
    report = json.loads((tmp_path / "out/check.json").read_text())
    assert f"{previous[0].name}/counterexamples" in report["moved_aside"]
    assert previous[0].name in (tmp_path / "out/check.md").read_text()


def test_a_refused_exact_mode_is_shown_and_its_sampled_cells_run(monkeypatch):
    # stand in for the contract check's answer on an estimator that fails it (seeupo.core.contract)
    from seeupo.experiments import verify as verify_module
    from seeupo.experiments.verify import VerifyConfig, markdown, verify

    monkeypatch.setattr(verify_module, "exact_mode_refusal", lambda cfg: "not symmetric in its group")
    cfg = VerifyConfig(instances=2, iterations=2, workers=1, algorithms=("grpo",), parameterizations=("independent",),
                       counterexample_dir="")
    report = verify(cfg)
    exact = [c for c in report["cells"] if c["mode"] == "exact"]
    assert exact and all(c["refused"] == "not symmetric in its group" for c in exact)
    assert all(c["verdict"] == "exact: refused (not symmetric in its group)" for c in exact)
    assert any(c["mode"] == "sampled" and not c["refused"] for c in report["cells"])
    assert report["table1"][0]["ST"]["measured"] == "exact: refused (not symmetric in its group)"
    text = markdown(report)
    assert "**grpo: exact: refused (not symmetric in its group)**" in text and "no exact cell ran" in text
    assert "## Every cell (sampled)" in text


@pytest.mark.slow
def test_a_found_counterexample_gets_its_cause_in_check_md_and_its_explanation_beside_it(tmp_path):
    (tmp_path / "anti.py").write_text(ANTI)
    done = seeupo("check", "anti_pg", "--plugin", "anti.py", "--quick", "--no-bridge", "--no-progress",
                  "--max-examples", "3", "--out", "out", "--fail-on-decrease", cwd=tmp_path)
    report = json.loads((tmp_path / "out/check.json").read_text())
    # J decreased: --fail-on-decrease makes that the exit status (without it, 0: test above)
    assert report["monotonicity"]["measured"] == "J decreased"
    assert done.returncode == 1 and done.stderr.strip().endswith("J decreased (--fail-on-decrease)"), done.stderr
    found = [s for s in report["searches"] if s["found"] and s.get("reproduces")]
    assert found
    text = (tmp_path / "out/check.md").read_text()
    for s in found:
        e = s["explanation"]
        assert e["cause"] == "advantage sign"  # the flipped sign favours the worse action in every pair
        assert (tmp_path / "out" / e["file"]).read_text().startswith("## ")
        line = next(line for line in text.splitlines() if line.startswith(f"* `{s['file']}`"))
        assert "cause: the advantage's sign" in line and e["file"] in line


def test_an_explanation_that_fails_is_one_line_in_the_report(tmp_path, monkeypatch):
    from seeupo.experiments import explain as explain_module
    from seeupo.experiments.check import Explanation, explain_case, explanation_line

    def broken(example):
        raise RuntimeError("cannot replay\nsecond line")

    monkeypatch.setattr(explain_module, "explain", broken)
    e = explain_case(object(), tmp_path / "counterexamples/x.json", tmp_path)
    assert e == Explanation(error="explain failed (RuntimeError: cannot replay)")
    assert e.to_dict() == {"error": "explain failed (RuntimeError: cannot replay)"}
    entry = _found("x", "unused")
    entry = dataclasses.replace(entry, file="counterexamples/x.json", explanation=e)
    assert explanation_line(entry) == (
        "* `counterexamples/x.json`: no explanation: explain failed (RuntimeError: cannot replay).")


@pytest.mark.slow
def test_compare_reports_both_algorithms_side_by_side(tmp_path):
    done = seeupo("check", "seeupo", "--compare", "grpo", "--quick", "--no-bridge", "--no-progress", "--budget", "30",
                  "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [line.split(":")[0] for line in done.stdout.splitlines()[:2]] == ["seeupo", "grpo"]
    report = json.loads((tmp_path / "out/check.json").read_text())
    assert report["compare"] == ["seeupo", "grpo"] and set(report["algorithms"]) == {"seeupo", "grpo"}
    seeupo_run, grpo_run = report["algorithms"]["seeupo"], report["algorithms"]["grpo"]
    # the same problems and sizes for both
    for key in ("instances", "iterations", "seed"):
        assert seeupo_run["verify"]["config"][key] == grpo_run["verify"]["config"][key]
    assert seeupo_run["budget"]["max_examples"] == grpo_run["budget"]["max_examples"]
    text = (tmp_path / "out/check.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| seeupo |") or line.startswith("| grpo |")]
    assert len(rows) == 2
    for row in rows:
        assert len(row.split("|")) == 9, row
    assert "| Algorithm | Gradient verdict (agentic problems) |" in text
    for row, run in zip(rows, (seeupo_run, grpo_run)):  # each row leads with its own gradient verdict
        assert row.split("|")[2].strip().startswith(f"expected update {run['gradient']['direction']}")
    assert (tmp_path / "out/check.png").stat().st_size > 0
    assert (tmp_path / "out/algorithms/grpo/check.md").exists() and (tmp_path / "out/algorithms/seeupo/check.json").exists()


def test_compare_with_an_unknown_name_is_one_line_and_exit_2(tmp_path):
    done = seeupo("check", "seeupo", "--compare", "grpo,not_an_algorithm", "--quick", "--no-bridge", "--out", "out",
                  cwd=tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "not_an_algorithm" in done.stderr
    assert not (tmp_path / "out").exists()  # nothing ran, no folder


def test_compare_stopped_while_timing_writes_a_partial_report(tmp_path, monkeypatch):
    from seeupo.experiments import check as check_module
    from seeupo.experiments.check import run as run_module

    def stopped(*args, **kwargs):  # SIGTERM arrives during the first calibration
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler raises here
        raise AssertionError("SIGTERM was not handled")

    monkeypatch.setattr(run_module, "calibrate", stopped)
    before = signal.getsignal(signal.SIGTERM)
    result = check_module.compare(["seeupo", "grpo"], check_module.QUICK, tmp_path / "out", bridge=False, say=lambda m: None)
    assert result.partial == "SIGTERM" and result.not_reached == ["seeupo", "grpo"]
    assert result.exit_status(fail_on_decrease=False) == (128 + signal.SIGTERM, None)
    assert "**Partial report**" in (tmp_path / "out/check.md").read_text()
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is given back
    assert json.loads((tmp_path / "out/check.json").read_text()) == json.loads(json.dumps(result.to_dict()))


def test_a_signal_watch_records_the_signal_and_gives_the_handlers_back():
    from seeupo.experiments.check import Interrupted, SignalWatch

    before = signal.getsignal(signal.SIGTERM)
    with SignalWatch() as watch:
        watch.raise_if_signalled()  # nothing received: nothing raised
        with pytest.raises(Interrupted, match="SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler raises here
        assert watch.received == ["SIGTERM"] and watch.name(KeyboardInterrupt()) == "SIGTERM"
        with pytest.raises(Interrupted):  # a signal whose exception was lost is raised again between parts
            watch.raise_if_signalled()
    assert signal.getsignal(signal.SIGTERM) is before
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert SignalWatch().name(KeyboardInterrupt()) == "SIGINT"  # Ctrl-C records nothing: its own name


@pytest.mark.parametrize("partial, vacuous, measured, fail_on_decrease, status, line", [
    (None, None, "J decreased", False, 0, None),
    (None, None, "J decreased", True, 1, "J decreased (--fail-on-decrease)"),
    (None, None, "monotone", True, 0, None),
    (None, None, "no learning signal", False, 1, None),
    (None, None, None, False, 0, None),  # refused: no verdict, no failure
    (None, "warm-up missed 0.9", "monotone", False, 1, "the bridge is vacuous: warm-up missed 0.9"),
    ("SIGTERM", None, "J decreased", True, 128 + 15, None),
    ("SIGINT", "warm-up missed 0.9", "J decreased", True, 128 + 2, None),
])
def test_exit_status(partial, vacuous, measured, fail_on_decrease, status, line):
    from seeupo.experiments.check import BridgeResult, MonotonicityVerdict, exit_status

    bridge = BridgeResult(skipped="--no-bridge") if vacuous is None else BridgeResult(vacuous=vacuous)
    verdict = MonotonicityVerdict(measured, ["evidence"])
    assert exit_status(partial, bridge, verdict, fail_on_decrease) == (status, line)


# ---- the typed reports: check.json as written, read back


COMMITTED = sorted((ROOT / "paper_repro").rglob("check.json")) + sorted((ROOT / "paper_repro").rglob("compare.json"))


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_committed_report_reads_back_and_writes_the_same_file(path):
    """The dataclasses hold all of check.json: a committed report read and written again is the same bytes, and its
    check.md is rendered again from it, the same too."""
    from seeupo.experiments.check import CheckReport, CompareReport, markdown
    from seeupo.validation.files import dumps

    assert COMMITTED, "no committed check.json under paper_repro/"
    text = path.read_text()
    data = json.loads(text)
    report = (CompareReport if "compare" in data else CheckReport).from_dict(data)
    assert report.to_dict() == data
    assert dumps(report.to_dict(), indent=1) + "\n" == text
    if isinstance(report, CheckReport) and (path.parent / "check.md").exists():
        assert markdown(report) == (path.parent / "check.md").read_text()


# ---- the budget's logic, with a calibration given (no clock: the test holds on any machine)


@pytest.mark.parametrize("which, seconds", [("QUICK", None), ("DEFAULT", None), ("DEFAULT", 600.0)])
def test_fit_brings_the_estimate_within_the_budget(which, seconds):
    """A calibration given by hand, of the order seen on 2 cores (`check grpo --quick` planned 616 directions at
    ~7 s): each budget's sizes fit it."""
    from seeupo.experiments import check

    start = getattr(check, which)
    if seconds is not None:
        start = start.__class__(**{**start.__dict__, "seconds": seconds})
    cal = check.Calibration(iteration=0.3, search_case=0.15, seconds=2.0, gradient_call=0.01)
    budget = check.fit("grpo", start, cal, exact=True, bridge=True, searches=5)
    estimate = check.plan("grpo", budget, cal, exact=True, bridge=True, searches=5)
    assert estimate.total <= start.seconds + 1e-9, estimate
    assert estimate.gradient == pytest.approx(cal.gradient_call * estimate.gradient_calls)
    assert budget.max_examples <= start.max_examples and budget.verify.iterations <= start.verify.iterations


def test_plan_prices_each_part_by_its_own_calibration():
    """Directions on the gradient part's dearest batch, ascent steps on the ascent's problems, agentic cells by their
    own iteration time: a check of 60 s overestimated by 4.6x when ascent steps were priced as three-turn directions."""
    from seeupo.experiments import check

    budget = check.QUICK
    cal = check.Calibration(iteration=0.2, search_case=0.1, seconds=1.0, gradient_call=0.02, agentic_iteration=0.5,
                            ascent_call=0.004)
    estimate = check.plan("grpo", budget, cal, exact=True, bridge=False, searches=9)
    directions, ascent = check.gradient_calls(budget.gradient)
    g = budget.gradient
    assert directions == len(g.families) * len(g.turns) * (g.starts + 1)
    assert ascent == len(g.families) * len(g.ascent_turns) * g.ascent_steps
    assert estimate.gradient == pytest.approx(directions * 0.02 + ascent * 0.004)
    cfg = budget.verify
    cells = 2 + len(cfg.families)  # ST and MT on token bandits, then each family (exact, independent: --quick)
    expected = (2 * 0.2 + len(cfg.families) * 0.5) * cfg.iterations / min(cfg.workers, cells) + check.POOL_START_SECONDS
    assert estimate.cells == cells and estimate.verify == pytest.approx(expected)


def test_fit_never_grows_the_sizes_and_keeps_the_minimums():
    from seeupo.experiments.check import DEFAULT, MIN_EXAMPLES, MIN_ITERATIONS, Calibration, fit

    slow = Calibration(iteration=50.0, search_case=50.0, seconds=2.0, gradient_call=0.01)
    budget = fit("grpo", DEFAULT, slow, exact=True, bridge=False, searches=5)
    assert budget.max_examples == MIN_EXAMPLES and budget.verify.iterations == MIN_ITERATIONS
    fast = Calibration(iteration=1e-4, search_case=1e-4, seconds=0.1, gradient_call=1e-4)
    budget = fit("grpo", DEFAULT, fast, exact=True, bridge=False, searches=5)
    assert budget.max_examples == DEFAULT.max_examples and budget.verify.iterations == DEFAULT.verify.iterations


# ---- the gradient part


@pytest.mark.slow
def test_check_leads_with_the_gradient_verdict_and_its_cases_replay(tmp_path):
    """The biased per-turn estimator of examples/algorithms points downhill and plain ascent with it stops short."""
    from seeupo.experiments.gradient_check import GradientConfig

    plugin = str(ROOT / "examples/algorithms/turn_mean_rtg.py")
    done = seeupo("check", "turn_mean_rtg", "--plugin", plugin, "--quick", "--no-bridge", "--no-progress",
                  "--max-examples", "2", "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr  # J decreased, evidence in hand: 0 without --fail-on-decrease
    report = json.loads((tmp_path / "out/check.json").read_text())
    gradient = report["gradient"]
    assert gradient["direction"] == "points downhill" and gradient["fixed_point"] == "stops below J*"
    assert len(gradient["families"]) == len(GradientConfig().families) * len(GradientConfig().turns)
    text = (tmp_path / "out/check.md").read_text()
    verdict = text.split("## Verdict")[1]
    assert verdict.index("Gradient verdict") < verdict.index("Exact monotonicity")
    assert "expected update points downhill" in done.stdout
    files = [str(tmp_path / "out" / f["file"]) for f in gradient["families"]]
    replayed = seeupo("replay", *files, "--plugin", plugin, cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert replayed.stdout.count("reproduced: expected update") == len(files)


def test_a_gradient_part_stopped_before_any_family_gives_no_verdict():
    from seeupo.experiments.gradient_check import GradientConfig, summarise

    assert "skipped" in summarise([], GradientConfig(), 0.0) and "direction" not in summarise([], GradientConfig(), 0.0)


def _moved_cell() -> dict:
    return {"row": "x", "setting": "MT", "mode": "exact", "parameterization": "independent", "violations": 0,
            "max_violation": 0.0, "verdict": "converges", "instances": 2, "iterations": 3}


def _found(search: str, cause: str):
    from seeupo.experiments.check import Explanation, SearchEntry

    return SearchEntry(search=search, description=search, max_examples=5, examples=5, moved=5, seed=0, found=True,
                       stopped="", seconds=0.0, file=f"counterexamples/{search}.json", J=[0.125, 0.123288],
                       largest_decrease=0.001712, group_size=2, turns=1, setting="ST", parameterization="independent",
                       reproduces=True, explanation=Explanation(cause=cause, summary="", file=""))


def test_a_decrease_on_a_flat_surrogate_is_reported_apart_and_not_counted():
    from seeupo.experiments.check import monotonicity
    from seeupo.experiments.verdicts import search_outcome

    report = {"cells": [_moved_cell()], "counterexamples": []}
    flat = _found("x_st_stochastic", "flat surrogate")
    alone = monotonicity(report, [flat])
    assert alone.measured == "monotone"
    assert any(e.startswith("not counted: J fell on a flat surrogate in x_st_stochastic") for e in alone.evidence)
    assert "on a flat surrogate (the optimizer's choice, not counted" in search_outcome(flat.to_dict())
    # an estimator's own decrease still decides, and the flat one is still named apart
    both = monotonicity(report, [flat, _found("x_mt_stochastic", "std scaling")])
    assert both.measured == "J decreased"
    assert both.evidence[0].startswith("x_mt_stochastic: J 0.125000 -> 0.123288")
    assert both.evidence[-1].startswith("not counted: J fell on a flat surrogate in x_st_stochastic")
