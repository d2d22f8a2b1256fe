"""The off-policy and KL report (seeupo.experiments.offpolicy): the facts its tables must show, on one instance."""

from __future__ import annotations

import pytest

from seeupo.experiments.offpolicy import corrections_markdown, corrections_table, kl_markdown, kl_table


def test_the_corrections_table_shows_which_correction_is_exact_where():
    table = corrections_table(instances=1, seed=0)
    verdict = {(r["problem"], r["behaviour"], r["correction"]): r["verdict"] for r in table["rows"]}
    problems = {r["problem"] for r in table["rows"]}
    for problem in problems:
        # the trajectory's importance weight, uncapped, is exact wherever mu covers what pi plays
        for behaviour in ("temperature 0.7", "noise 0.3 (other kernels)", "stale by 1 update", "stale by 4 updates"):
            assert verdict[(problem, behaviour, "sequence_is, no cap")] == "unbiased", (problem, behaviour)
            assert verdict[(problem, behaviour, "none")] != "unbiased", (problem, behaviour)
        # top-p drops answers pi plays: no weight on the rows mu draws can bring them back
        assert all(verdict[(problem, "top-p 0.9", c)] != "unbiased" for c in table["corrections"])
    text = corrections_markdown(table)
    assert text.count("## ") == len(problems) and "`sequence_is, no cap`" in text


def test_the_kl_table_shows_the_gradient_of_each_estimator_and_placement():
    table = kl_table(instances=1, seed=0)
    row = {(r["problem"], r["estimator"], r["placement"]): r for r in table["rows"]}
    one, many = "one token of 4", "2 turns of 2 tokens of 3"
    assert row[(one, "k1", "loss")]["zero"] < 1e-12 and row[(many, "k1", "loss")]["zero"] < 1e-12
    assert row[(one, "k2", "loss")]["reverse"] < 1e-9 and row[(one, "k3", "loss")]["forward"] < 1e-9
    assert row[(one, "k3", "loss_is")]["reverse"] < 1e-9
    assert row[(many, "k1", "reward")]["reverse"] < 1e-9
    assert row[(many, "k2", "loss")]["reverse"] > 1e-3 and row[(many, "k3", "loss")]["forward"] > 1e-3
    assert "| one token of 4 | `k3` | grad KL(ref || pi) | grad KL(pi || ref) |" in kl_markdown(table)


def test_the_runs_table_shows_the_uncapped_trajectory_weight_runs_as_on_policy_and_top_p_does_not():
    """Whole runs: on policy every correction is 1 (one run); on stale rows and at temperature 0.7 the uncapped
    trajectory weight makes each update the on-policy one, so its run is the on-policy run (the same final gap);
    through top-p 0.9 it is not (answers the engine never draws)."""
    from seeupo.experiments.offpolicy import runs_markdown, runs_table

    table = runs_table(instances=1, seed=0, updates=6)
    row = {(r["problem"], r["behaviour"], r["correction"]): r for r in table["rows"]}
    for problem in ("1 turn, answers of 3 tokens of 2", "2 turns, answers of 2 tokens of 3"):
        on = row[(problem, "on policy", "none")]["max_final_gap"]
        assert {round(row[(problem, "on policy", c)]["max_final_gap"], 12) for c in table["corrections"]} == {round(on, 12)}
        for behaviour in ("stale by 1 update", "stale by 4 updates", "temperature 0.7"):
            assert row[(problem, behaviour, "sequence_is, no cap")]["max_final_gap"] == pytest.approx(on, abs=1e-10)
        assert abs(row[(problem, "top-p 0.9", "sequence_is, no cap")]["max_final_gap"] - on) > 1e-4
    assert "| top-p 0.9 |" in runs_markdown(table)


def test_the_admission_table_shows_that_dropping_long_episodes_biases_the_update_beyond_correction():
    from seeupo.experiments.offpolicy import admission_markdown, admission_table

    table = admission_table(instances=1, seed=0)
    row = {(r["problem"], r["admission"], r["correction"]): r for r in table["rows"]}
    for turns in (2, 3):
        problem = f"stop or continue, {turns} turns"
        assert row[(problem, "every episode, fresh", "none")]["verdict"] == "unbiased"
        stale = "every episode, each read its length in updates late"
        assert row[(problem, stale, "none")]["verdict"] != "unbiased"
        assert row[(problem, stale, "sequence_is, no cap")]["verdict"].startswith("unbiased")  # up to the stream's scale
        dropped = row[(problem, "only 1-turn episodes, fresh", "sequence_is, no cap")]
        assert dropped["verdict"] in ("biased but uphill", "points downhill") and dropped["mean_turns"] == 1.0
    assert "| stop or continue, 2 turns | every episode, fresh |" in admission_markdown(table)
    # GRPO's groups, admitted whole: all admitted and fresh is its own fresh step; keeping only groups of stoppers
    # (equal returns: zero advantage) leaves no step at all
    group = {(r["problem"], r["admission"], r["correction"]): r for r in table["grpo_rows"]}
    fresh = group[("stop or continue, 2 turns", "every episode, fresh", "none")]["worst_cosine_fresh"]
    assert fresh["zero"] == 0 and fresh["cosine"] > 1 - 1e-9
    stoppers = group[("stop or continue, 2 turns", "only 1-turn episodes, fresh", "none")]
    assert stoppers["worst_cosine_fresh"] == {"cosine": None, "zero": 1, "of": 1} and stoppers["mean_turns"] == 1.0
    assert "## GRPO: groups of 3 admitted whole" in admission_markdown(table) and "zero step" in admission_markdown(table)


def test_the_report_command_refuses_a_bad_count_and_keeps_an_earlier_report(tmp_path, capsys):
    import pytest

    from seeupo.experiments.offpolicy import main

    for argv in (["--out", str(tmp_path), "--instances", "0"], ["--out", str(tmp_path), "--instances", "two"]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2 and "expected an integer >= 1" in capsys.readouterr().err
    (tmp_path / "kl.md").write_text("an earlier report\n")
    with pytest.raises(SystemExit) as stop:
        main(["--out", str(tmp_path), "--instances", "1"])
    assert stop.value.code == 2 and "holds an earlier report" in capsys.readouterr().err
    assert (tmp_path / "kl.md").read_text() == "an earlier report\n"
