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
                  "--max-examples", "4", "--out", "out", cwd=tmp_path)
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


@pytest.mark.slow
def test_a_check_off_policy_says_so_and_runs_its_cells_searches_and_field_replays_that_way(tmp_path):
    done = seeupo("check", "rloo", "--quick", "--no-bridge", "--no-progress", "--max-examples", "2", "--staleness", "1",
                  "--top-p", "0.8", "--out", "out", cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    report = json.loads((tmp_path / "out/check.json").read_text())
    assert report["budget"]["verify"]["rollouts"] == {"staleness": 1, "sampler": {"temperature": 1.0, "top_k": 0,
                                                                                   "top_p": 0.8, "noise": 0.0, "seed": 0}}
    text = (tmp_path / "out/check.md").read_text()
    assert "**Rows off policy**: rows 1 update stale; engine: top-p 0.8, in the field replays, the verify cells" in text
    assert "| — |" in text and "no claim" in text  # the paper's claims are on policy: none is read
    assert all(not e.get("found") or e.get("reproduces") for e in report["searches"])
    with_bad = seeupo("check", "rloo", "--quick", "--top-k", "-1", "--out", "bad", cwd=tmp_path)
    assert with_bad.returncode == 2 and with_bad.stderr.count("\n") == 1 and not (tmp_path / "bad").exists()


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

    # --overwrite moves the earlier files aside
    again = seeupo("check", "anti_pg", "--plugin", "anti.py", "--quick", "--no-bridge", "--no-progress",
                   "--max-examples", "4", "--out", "out", "--overwrite", cwd=tmp_path)
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
    from seeupo.experiments.verify import cells as verify_cells
    from seeupo.experiments.verify import VerifyConfig, markdown, verify

    monkeypatch.setattr(verify_cells, "exact_mode_refusal", lambda cfg: "not symmetric in its group")
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
    done = seeupo("check", "seeupo", "--compare", "grpo", "--quick", "--no-bridge", "--no-progress", "--max-examples",
                  "4", "--out", "out", cwd=tmp_path)
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

    before, before_int = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with SignalWatch() as watch:
        watch.raise_if_signalled()  # nothing received: nothing raised
        with pytest.raises(Interrupted, match="SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler raises here
        assert watch.received == ["SIGTERM"] and watch.name(KeyboardInterrupt()) == "SIGTERM"
        with pytest.raises(Interrupted):  # a signal whose exception was lost is raised again between parts
            watch.raise_if_signalled()
    assert signal.getsignal(signal.SIGTERM) is before
    assert signal.getsignal(signal.SIGINT) is before_int  # Python's own (or what the shell set: a background job ignores it)
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


# ---- the plan and the budget, with a calibration given (no clock: the tests hold on any machine)


@pytest.mark.parametrize("which", ["QUICK", "DEFAULT"])
def test_the_plan_is_the_budgets_own_whatever_the_machine(which):
    """A machine 10,000 times slower plans the same cases (only the estimate differs): what is measured is a function
    of the flags, never of the machine's speed or load."""
    from seeupo.experiments import check

    budget = getattr(check, which)
    fast = check.Calibration(iteration=1e-4, search_case=1e-4, seconds=0.1, gradient_call=1e-5)
    slow = check.Calibration(iteration=1.0, search_case=1.0, seconds=100.0, gradient_call=0.1)
    a, b = (check.plan("grpo", budget, cal, exact=True, bridge=True, searches=9) for cal in (fast, slow))
    sizes = ("cells", "instances", "iterations", "searches", "bridge_seeds", "max_examples", "bridge_runs",
             "bridge_steps", "gradient_calls")
    assert {k: getattr(a, k) for k in sizes} == {k: getattr(b, k) for k in sizes}
    assert b.total > 10 * a.total  # the estimate follows the machine (the bridge's is a fixed figure)
    assert (a.max_examples, a.iterations, a.instances) == (budget.max_examples, budget.verify.iterations,
                                                           budget.verify.instances)


def test_the_quick_plan_is_a_prefix_of_the_default():
    """--quick draws the default's problems and starts (the same instances and seeds), runs the same update (epochs)
    and evaluates the first of the default's search cases: fewer iterations, cells, cases and ascent steps."""
    from seeupo.experiments.check import DEFAULT, QUICK

    q, d = QUICK.verify, DEFAULT.verify
    same = ("instances", "exact_epochs", "turns_mt", "families", "turns_agentic", "vocab_size", "length", "reward_levels",
            "group_size", "seed", "tol")
    assert {k: getattr(q, k) for k in same} == {k: getattr(d, k) for k in same}
    assert q.iterations <= d.iterations and set(q.modes) <= set(d.modes)
    assert set(q.parameterizations) <= set(d.parameterizations)
    qg, dg = QUICK.gradient, DEFAULT.gradient
    assert dataclasses.replace(qg, ascent_steps=dg.ascent_steps, ascent_turns=dg.ascent_turns) == dg
    assert qg.ascent_steps <= dg.ascent_steps and set(qg.ascent_turns) <= set(dg.ascent_turns)
    assert QUICK.max_examples <= DEFAULT.max_examples and QUICK.seconds is None and DEFAULT.seconds is None


def _plan(**sizes):
    from seeupo.experiments.check import Plan

    base = dict(cells=2, instances=3, iterations=4, searches=2, bridge_seeds=[0], max_examples=10, bridge_runs=0,
                bridge_steps=5, calibration=0.0, verify=0.0, search_time=0.0, bridge=0.0, gradient=0.0, gradient_calls=0,
                total=0.0, budget=None)
    return Plan(**base | sizes)


def _searched(search: str, examples: int, stopped: str = ""):
    from seeupo.experiments.check import SearchEntry

    return SearchEntry(search=search, description=search, max_examples=10, examples=examples, moved=examples, seed=0,
                       found=False, stopped=stopped, seconds=0.0)


def test_an_unfinished_plan_is_inconclusive_and_a_decrease_found_still_decides():
    from seeupo.experiments.check import INCONCLUSIVE, monotonicity, unfinished_parts

    cells = [_moved_cell(), _moved_cell()]
    report = {"cells": cells, "counterexamples": []}
    done = [_searched("a", 10), _searched("b", 10)]
    assert unfinished_parts(_plan(), 0, {"skipped": "no exact mode"}, report, done, None) == []
    # stopped before the gradient part: none of its planned sets, whatever the rest did
    assert unfinished_parts(_plan(), 8, {"skipped": "not reached"}, report, done, "SIGINT") == ["0 of 8 gradient problem sets"]
    assert monotonicity(report, done, []).measured == "monotone"
    cut = [_searched("a", 10), _searched("b", 3, "budget")]
    parts = unfinished_parts(_plan(), 0, {}, report, cut, "budget")
    assert parts == ["13 of 20 search cases"]
    verdict = monotonicity(report, cut, parts)
    assert verdict.measured == INCONCLUSIVE and verdict.evidence[0].startswith("13 of 20 search cases measured")
    # a search not reached, a verify part stopped after one of two cells
    short = {"cells": cells[:1], "counterexamples": [], "partial": True}
    assert unfinished_parts(_plan(), 0, {}, short, done[:1], "SIGINT") == ["1 of 2 verify cells", "10 of 20 search cases"]
    # a counterexample found before the stop is still one
    assert monotonicity(report, [*cut, _found("c", "std scaling")], parts).measured == "J decreased"


@pytest.mark.parametrize("partial, measured, fail_on_decrease, status", [
    ("budget", "inconclusive", False, 1),
    ("budget", None, False, 1),  # stopped before anything finished
    ("budget", "J decreased", False, 0),  # what it found is evidence enough
    ("budget", "J decreased", True, 1),
])
def test_a_budget_stop_is_judged_by_its_verdict(partial, measured, fail_on_decrease, status):
    from seeupo.experiments.check import BridgeResult, MonotonicityVerdict, exit_status

    verdict = MonotonicityVerdict(measured, ["3 of 20 search cases measured"])
    got, line = exit_status(partial, BridgeResult(skipped="--no-bridge"), verdict, fail_on_decrease)
    assert got == status
    if measured != "J decreased":
        assert line.startswith("inconclusive: ") and line.endswith("(stopped by its --budget)")


def test_a_budget_that_passes_at_once_is_a_partial_inconclusive_report(tmp_path):
    """--budget stops the check wherever it is (here before its calibration ends): a partial report, no verdict,
    exit 1 with one line; never a traceback."""
    done = seeupo("check", "grpo", "--quick", "--no-bridge", "--no-progress", "--budget", "0.001", "--out", "out",
                  cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("seeupo check: inconclusive: ") and "Traceback" not in done.stderr
    assert done.stderr.rstrip().endswith("(stopped by its --budget)")
    report = json.loads((tmp_path / "out/check.json").read_text())
    assert report["partial"] == "budget" and report["monotonicity"]["measured"] in (None, "inconclusive")


def test_the_budget_is_an_alarm_that_stops_the_run_as_a_signal_does():
    """The watch's alarm raises Interrupted('budget') in the main thread and records it; leaving the watch cancels it."""
    from seeupo.experiments.check import BUDGET, Interrupted, SignalWatch

    with SignalWatch(time.monotonic() + 0.05) as watch:
        with pytest.raises(Interrupted, match=BUDGET):
            watch.arm()
            time.sleep(5)
    assert watch.received == [BUDGET] and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    with SignalWatch(time.monotonic() + 60) as watch:
        watch.arm()
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    with SignalWatch(time.monotonic() + 1e300) as watch:  # a budget longer than the timer can hold never rings
        watch.arm()
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 1e7
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # an alarm not rung is cancelled on the way out


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


# ---- a verdict is a function of its inputs, and more work only adds evidence


def _verdict_fields(report: dict) -> dict:
    """What a check concluded, without its times: the verdicts, the cases they rest on, the field's replays."""
    g = report["gradient"]
    return {
        "monotonicity": report["monotonicity"], "field": report.get("field"),
        "gradient": [g["direction"], g["fixed_point"], [(f["family"], f["turns"], f["verdict"], f["counts"],
                                                        f.get("fixed_point", {}).get("counts")) for f in g["families"]]],
        "cells": sorted((c["setting"], c["mode"], c["parameterization"], c["verdict"], c["violations"], c["worst_J"])
                        for c in report["verify"]["cells"]),
        "searches": [(s["search"], s["examples"], s["found"], s.get("J"), s.get("stopped")) for s in report["searches"]],
    }


@pytest.mark.slow
def test_a_check_gives_the_same_verdict_beside_cpu_bound_processes(tmp_path):
    """The same check twice, the second beside two processes that keep every core busy: the same verdict, cells,
    search cases and field replays (no time is asserted: only what was measured)."""
    args = ("check", "grpo", "--quick", "--no-bridge", "--no-progress", "--max-examples", "4")
    quiet = seeupo(*args, "--out", "quiet", cwd=tmp_path)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        busy = seeupo(*args, "--out", "busy", cwd=tmp_path)
    finally:
        for p in burners:
            p.kill()
            p.wait()
    assert quiet.returncode == busy.returncode == 0, quiet.stderr[-2000:] + busy.stderr[-2000:]
    a, b = (json.loads((tmp_path / out / "check.json").read_text()) for out in ("quiet", "busy"))
    assert _verdict_fields(a) == _verdict_fields(b)
    assert a["partial"] is None and b["partial"] is None


@pytest.mark.slow
def test_what_the_quick_check_finds_the_default_finds(tmp_path):
    """--quick's evidence is a prefix of the default's: every case a quick search found, the default's search finds
    (the same case), the gradient directions are the same cases, and the quick cells' J are the first iterations of
    the default's cells."""
    from seeupo.experiments.check import DEFAULT, QUICK, check

    def run(budget, out):
        return check("grpo", budget, tmp_path / out, bridge=False, say=lambda m: None).to_dict()

    quick, default = run(QUICK, "quick"), run(DEFAULT, "default")
    assert quick["monotonicity"]["measured"] == "J decreased"
    assert default["monotonicity"]["measured"] == "J decreased"
    found = {s["search"]: s for s in default["searches"]}
    for s in quick["searches"]:
        if s["found"]:
            assert found[s["search"]]["found"] and found[s["search"]]["J"] == s["J"]
            assert found[s["search"]]["examples"] == s["examples"]
    qg, dg = quick["gradient"]["families"], default["gradient"]["families"]
    assert [(f["family"], f["turns"], f["counts"], f["worst"]) for f in qg] == \
           [(f["family"], f["turns"], f["counts"], f["worst"]) for f in dg]
    cells = {(c["setting"], c["mode"], c["parameterization"]): c for c in default["verify"]["cells"]}
    for c in quick["verify"]["cells"]:
        mine = cells[(c["setting"], c["mode"], c["parameterization"])]
        if mine["worst_instance"] == c["worst_instance"]:
            assert mine["worst_J"][: len(c["worst_J"])] == pytest.approx(c["worst_J"], abs=1e-12)
    assert quick["field"] == default["field"]  # the same update on the same committed cases


def test_a_search_pays_its_start_up_once_and_each_case_after():
    """The searches' estimate: each search's start-up (hypothesis's set-up) once, then its planned cases."""
    from seeupo.experiments import check
    from seeupo.experiments.check.planning import SHRINK_MARGIN

    cal = check.Calibration(iteration=0.2, search_case=0.05, seconds=1.0, gradient_call=0.02, ascent_call=0.004,
                            search_start=0.3)
    for budget in (check.QUICK, check.DEFAULT):
        estimate = check.plan("grpo", budget, cal, exact=True, bridge=False, searches=9)
        assert estimate.search_time == pytest.approx(9 * (0.3 + budget.max_examples * 0.05 * SHRINK_MARGIN))
