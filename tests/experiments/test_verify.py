import json

import pytest
import torch

from seeupo.experiments.verdicts import AGREEMENT, EXACT_MEASURED, MEASURED, SAMPLED_MEASURED, table1_verdict
from seeupo.experiments.verify import (
    QUICK,
    VerifyConfig,
    disagreements,
    full_grid_rows,
    markdown,
    run_cell,
    table1_entry,
    table1_rows,
    verify,
)


def test_table1_verdict_rules():
    assert table1_verdict("converges", "converges", []) == ("converges", "agrees")
    assert table1_verdict("converges", "J decreased", []) == ("J decreased", "disagrees")
    assert table1_verdict("converges", "monotone, stuck below J*", []) == ("monotone, stuck below J*", "disagrees")
    assert table1_verdict("converges", "monotone, still improving", []) == ("monotone, still improving", "inconclusive")
    # a saved counterexample is a measurement: it overrides the random instances' "converges"
    assert table1_verdict("converges", "converges", ["gspo_st_stochastic"]) == ("J decreased", "disagrees")
    assert table1_verdict("no guarantee", "J decreased", []) == ("J decreased", "agrees")
    assert table1_verdict("no guarantee", "converges", ["grpo_st_stochastic"]) == ("J decreased", "agrees")
    assert table1_verdict("no guarantee", "converges", []) == ("converges", "inconclusive")
    assert table1_verdict(None, "J decreased", []) == ("J decreased", "no claim")
    with pytest.raises(ValueError):
        table1_verdict("converges", "reaches J*", [])  # Table 1 compares exact cells only
    with pytest.raises(ValueError):
        table1_verdict("converges soon", "converges", [])


def test_table1_rows_cover_the_paper_rows():
    rows = {r.name: r for r in table1_rows(10)}
    assert {"ppo", "grpo", "rloo", "gspo", "seeupo"} <= set(rows)
    assert rows["seeupo"].claim_st is None and rows["seeupo"].claim_mt == "converges"
    assert rows["rloo"].config.update == "reinforce" and rows["ppo"].config.advantage == "gae"


def test_full_grid_is_every_advantage_times_every_update():
    rows = full_grid_rows(10)
    assert len(rows) == len({r.name for r in rows}) == 6 * 7  # GAE, 4 GRAE, REINFORCE++'s return-to-go
    assert {r.config.schedule for r in rows} == {"simultaneous", "sequential"}


def test_registered_estimators_and_losses_join_the_full_grid():
    from seeupo.core.builtins import reinforce
    from seeupo.core.registry import ADV_ESTIMATORS, POLICY_LOSSES, register_adv_est, register_policy_loss

    register_adv_est("grid_test_est", needs_group_stats=True)(lambda batch, cfg, **_: None)
    register_adv_est("grid_test_oracle", needs_oracle=True)(lambda batch, cfg, **_: None)  # needs the oracle: not an algorithm
    register_policy_loss("grid_test_loss", surrogate=False)(reinforce)
    try:
        rows = full_grid_rows(10)
        assert len(rows) == 7 * 8
        plugin_rows = [r for r in rows if r.config.advantage == "grid_test_est"]
        assert len(plugin_rows) == 8 and {r.config.update for r in plugin_rows} == {"ppo", "reinforce", "grid_test_loss"}
        loss_rows = [r for r in rows if r.config.update == "grid_test_loss"]
        assert len(loss_rows) == 7 and all(r.optimizer == "sgd" and r.config.epochs == 1 for r in loss_rows)
        assert not any(r.config.advantage == "grid_test_oracle" for r in rows)
    finally:
        ADV_ESTIMATORS.remove("grid_test_est")
        ADV_ESTIMATORS.remove("grid_test_oracle")
        POLICY_LOSSES.remove("grid_test_loss")


def test_run_cell_detects_a_violation_with_shared_parameters():
    # the exact-mode SeeUPO cell with shared parameters lowered J in the default run; with
    # the same seed and settings a small batch must show a decrease, and the verdict says so
    cfg = VerifyConfig(instances=12, iterations=6, exact_epochs=40, workers=1)
    seeupo = next(r for r in table1_rows(cfg.exact_epochs) if r.name == "seeupo")
    cell = run_cell(seeupo, "MT", "exact", "shared", cfg)
    assert cell.violations > 0 and cell.verdict == "J decreased"
    assert len(cell.worst_J) == cfg.iterations + 1
    independent = run_cell(seeupo, "MT", "exact", "independent", cfg)
    assert independent.violations == 0 and independent.verdict in EXACT_MEASURED and independent.verdict != "J decreased"


def test_sampled_cell_reports_its_decreases_as_noise():
    cfg = VerifyConfig(instances=4, iterations=3, workers=1)
    ppo = next(r for r in table1_rows(cfg.exact_epochs) if r.name == "ppo")
    cell = run_cell(ppo, "ST", "sampled", "shared", cfg)
    assert cell.verdict in SAMPLED_MEASURED
    assert cell.note.startswith("noisy: ")
    assert (f"{cell.violations} J decreases" in cell.note) == (cell.violations > 0)


def _table1_gspo_st(counterexample_dir: str) -> dict:
    cfg = VerifyConfig(**{**QUICK.__dict__, "instances": 2, "iterations": 2, "workers": 1, "counterexample_dir": counterexample_dir})
    gspo = next(r for r in table1_rows(cfg.exact_epochs) if r.name == "gspo")
    cell = run_cell(gspo, "ST", "exact", "independent", cfg)
    return table1_entry(gspo, "ST", cell, cfg) | {"random": cell.verdict}


def test_table1_counts_the_saved_gspo_counterexample(tmp_path):
    # with the committed counterexamples GSPO ST disagrees with the paper whatever the random instances say
    entry = _table1_gspo_st("paper_repro/counterexamples")
    assert entry["measured"] == "J decreased" and entry["agreement"] == "disagrees"
    assert entry["claim_id"] == "T1-GSPO-ST"
    assert any(e["search"] == "gspo_st_stochastic" and e["reproduces"] for e in entry["counterexamples"])
    # without them, the same cell is judged on its random instances only
    bare = _table1_gspo_st(str(tmp_path))
    assert bare["counterexamples"] == [] and bare["measured"] == bare["random"]
    assert bare["agreement"] != "disagrees" or bare["random"] != "converges"


def test_rows_off_policy_read_no_paper_claim_and_replay_no_on_policy_counterexample():
    """With a stale or truncating engine the cell runs its rows as the setting says (its J differs from on policy);
    the paper's claims and its searches' counterexamples are on policy, so the entry reads none of them."""
    import dataclasses

    from seeupo.tabular.behaviour import Rollouts, Sampler

    on = VerifyConfig(**{**QUICK.__dict__, "instances": 2, "iterations": 3, "workers": 1,
                         "counterexample_dir": "paper_repro/counterexamples"})
    off = dataclasses.replace(on, rollouts=Rollouts(1, Sampler(top_p=0.7)))
    gspo = next(r for r in table1_rows(on.exact_epochs) if r.name == "gspo")
    cell_on, cell_off = run_cell(gspo, "ST", "exact", "independent", on), run_cell(gspo, "ST", "exact", "independent", off)
    assert (cell_on.max_final_gap, cell_on.mean_final_gap) != (cell_off.max_final_gap, cell_off.mean_final_gap)
    entry = table1_entry(gspo, "ST", cell_off, off)
    assert entry["paper"] == "—" and entry["agreement"] == "no claim" and entry["counterexamples"] == []
    assert table1_entry(gspo, "ST", cell_on, on)["agreement"] == "disagrees"  # on policy: the saved case counts


def test_a_counterexample_marks_only_the_cells_of_its_own_rollouts():
    import dataclasses

    from seeupo.experiments.verify import apply_counterexamples
    from seeupo.tabular.behaviour import Rollouts

    def report(rollouts):
        return {"config": {"rollouts": dataclasses.asdict(rollouts)}, "table1": [],
                "cells": [{"row": "grpo", "setting": "ST", "parameterization": "independent", "mode": "exact",
                           "verdict": "converges"}]}

    example = {"file": "a.json", "search": "a", "algorithm": "grpo", "setting": "ST", "parameterization": "independent",
               "mode": "exact", "rollouts": "on policy", "decreases": True, "reproduces": True, "J": [0.5, 0.4],
               "largest_decrease": 0.1}
    on, off = report(Rollouts()), report(Rollouts(1))
    apply_counterexamples(on, [example])
    apply_counterexamples(off, [example])
    assert on["cells"][0]["verdict"] == "J decreased" and off["cells"][0]["verdict"] == "converges"
    stale = example | {"file": "b.json", "rollouts": Rollouts(1).words()}
    apply_counterexamples(off, [stale])
    assert off["cells"][0]["verdict"] == "J decreased"


@pytest.mark.slow
def test_quick_verify_report_and_markdown():
    cfg = VerifyConfig(**{**QUICK.__dict__, "instances": 2, "iterations": 2, "workers": 1})
    report = verify(cfg)
    json.dumps(report)
    for e in report["table1"]:
        for s in ("ST", "MT"):
            assert e[s]["agreement"] in AGREEMENT
            assert e[s]["measured"] in MEASURED or e[s]["measured"] == "—"
    for c in report["cells"]:
        assert c["verdict"] in (EXACT_MEASURED if c["mode"] == "exact" else SAMPLED_MEASURED)
    text = markdown(report)
    assert "| PPO |" in text and "Every cell" in text
    # Table 1 names the GSPO single-turn disagreement and the claim that carries it
    found = disagreements(report)
    assert any(d.startswith("GSPO (ST)") and "T1-GSPO-ST" in d and "gspo_st_stochastic.json" in d for d in found)
    assert "Disagreements with the paper:** none" not in text
    assert "GSPO (ST)" in text.split("Disagreements with the paper:")[1]


@pytest.mark.slow
def test_default_verify_run_end_to_end():
    report = verify(VerifyConfig())
    cells = report["cells"]
    # every row in both settings (sequential rows only MT) x modes x parameterisations
    rows = table1_rows(VerifyConfig().exact_epochs)
    expected = sum(2 if r.config.schedule == "simultaneous" else 1 for r in rows) * 2 * 2
    families = len(VerifyConfig().families) * len(rows) * 2  # exact mode only, both parameterisations
    assert len(cells) == expected + families
    for entry in report["table1"]:
        for setting in ("ST", "MT"):
            if entry[setting]["paper"] != "—":
                assert entry[setting]["measured"] != "—"
    assert report["table1"][[e["row"] for e in report["table1"]].index("gspo")]["ST"]["agreement"] == "disagrees"


def test_agentic_families_are_settings_of_their_own_in_exact_mode_only():
    from seeupo.experiments.verify import BASE_SETTINGS, setting_problems, setting_runs, settings
    from seeupo.tabular.families import AGENTIC_FAMILIES

    cfg = VerifyConfig()
    assert settings(cfg) == (*BASE_SETTINGS, *AGENTIC_FAMILIES)
    assert setting_runs(cfg, "MT", False) == [(m, p) for m in ("exact", "sampled") for p in ("independent", "shared")]
    assert setting_runs(cfg, "tool", False) == [("exact", "independent"), ("exact", "shared")]
    assert setting_runs(cfg, "ST", True) == [] and setting_runs(cfg, "stop", True) != []
    for family in AGENTIC_FAMILIES:
        problem = setting_problems(cfg, family)
        assert problem.num_turns == cfg.turns_agentic and problem.num_instances == cfg.instances
        # action 0 stops before the last turn; every other action continues
        assert bool(problem.terminal[0][..., 0, :].all()) and not bool(problem.terminal[0][..., 1:, :].any())
    assert problem.tokens == ((2, 2),) * cfg.turns_agentic  # the last family: actions of 2 tokens
    # each setting has its own problems, the same on every call
    assert not torch.equal(setting_problems(cfg, "stop").rewards[-1], setting_problems(cfg, "intermediate").rewards[-1])
    assert torch.equal(setting_problems(cfg, "tool").obs_probs[0], setting_problems(cfg, "tool").obs_probs[0])


def test_family_cells_run_and_have_their_own_table():
    cfg = VerifyConfig(**{**QUICK.__dict__, "instances": 2, "iterations": 2, "workers": 1, "algorithms": ("rloo",),
                          "families": ("stop", "tool")})
    report = verify(cfg)
    assert [c["setting"] for c in report["cells"]] == ["ST", "MT", "stop", "tool"]
    assert all(c["mode"] == "exact" and c["verdict"] in EXACT_MEASURED for c in report["cells"])
    text = markdown(report)
    table = text.split("## Agentic problem families (exact)")[1].split("## Every cell")[0]
    assert "| Algorithm | stop (independent) | tool (independent) |" in table
    verdicts = {c["setting"]: c["verdict"] for c in report["cells"]}
    assert f"| RLOO | {verdicts['stop']} | {verdicts['tool']} |" in table
    assert "stochastic tool results" in table  # each family said in words
    # Table 1 stays on its own problems
    assert set(report["table1"][0]) >= {"ST", "MT"} and "stop" not in report["table1"][0]
    none = verify(VerifyConfig(**{**cfg.__dict__, "families": ()}))
    assert [c["setting"] for c in none["cells"]] == ["ST", "MT"] and "Agentic problem families" not in markdown(none)


def test_unknown_family_is_refused():
    with pytest.raises(ValueError, match="unknown problem family 'chess'"):
        verify(VerifyConfig(**{**QUICK.__dict__, "families": ("chess",), "algorithms": ("rloo",)}))


# an estimator that hangs in verify's worker processes (the main process's contract check passes at once)
HANGING = '''
import multiprocessing
import os
import pathlib
import time

from seeupo.core.advantages import broadcast_to_tokens
from seeupo.core.batch import per_trajectory
from seeupo.core.config import preset, register_preset
from seeupo.core.registry import register_adv_est

@register_adv_est("hanging_test")
def hanging(batch, cfg, *, critic_values=None, oracle=None, group_stats=None):
    """The return as the advantage, after an hour's sleep in a worker process."""
    if multiprocessing.current_process().name != "MainProcess":
        pathlib.Path(os.environ["HANGING_MARKER"]).touch()  # the test signals once a worker sleeps here
        time.sleep(3600)
    return broadcast_to_tokens(per_trajectory(batch.traj_return, batch)[batch.traj_id], batch)

register_preset(preset("rloo", name="hanging_pg", advantage="hanging_test"))
'''


def test_ctrl_c_stops_verify_while_its_workers_are_busy(tmp_path):
    """Ctrl-C ends the worker processes instead of waiting for their cells (which here sleep for an hour):
    exit 130, a partial report, one line saying so. The generous timeout fails only a hang."""
    import os
    import signal
    import subprocess
    import sys
    import time

    plugin = tmp_path / "hanging.py"
    plugin.write_text(HANGING)
    out, marker = tmp_path / "verify", tmp_path / "a worker sleeps"
    proc = subprocess.Popen(
        [sys.executable, "-m", "seeupo", "verify", "--algorithms", "hanging_pg", "--plugin", str(plugin), "--quick",
         "--modes", "exact", "--workers", "2", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "HANGING_MARKER": str(marker)})
    while not marker.exists() and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C in a terminal: the whole process group
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert len(err.splitlines()) == 2, err
    plan, stopped = err.splitlines()  # nothing else: no traceback, no leaked-semaphore warning
    assert plan.startswith("verify: 6 cells") and stopped.startswith("verify: interrupted after 0 of 6 cells")
    assert json.loads((out / "verify.json").read_text())["partial"] is True
