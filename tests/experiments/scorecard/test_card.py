"""``seeupo scorecard``: the card's files, its refusals, Ctrl-C, --compare, and the field's table and claims."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from seeupo.cli import main
from seeupo.experiments.scorecard.capabilities import NAMES, Measured, Sizes
from seeupo.experiments.scorecard.card import Card, markdown
from seeupo.experiments.scorecard.rules import Score

HAND = str(Path(__file__).with_name("hand_algorithms.py"))
SMALL = ["--quick", "--no-bridge", "--instances", "1", "--iterations", "2", "--no-progress"]


@pytest.fixture
def seeupo(capsys):
    from seeupo import plugins

    plugins.forget_plugins()

    def call(*args):
        try:
            rc = main(list(args))
        except SystemExit as exit_:
            rc = exit_.code
        out = capsys.readouterr()
        return SimpleNamespace(returncode=rc, stdout=out.out, stderr=out.err)

    yield call
    plugins.forget_plugins()


def test_a_plugin_gets_a_card_with_its_files(seeupo, tmp_path):
    out = seeupo("scorecard", "anti_pg", "--plugin", HAND, *SMALL, "--out", str(tmp_path / "card"))
    assert out.returncode == 0, out.stderr
    card = json.loads((tmp_path / "card" / "card.json").read_text())
    assert card["format"] == "seeupo-scorecard/1" and card["algorithm"] == "anti_pg"
    assert len(card["plugins"]) == 1 and "hand_algorithms.py@sha256:" in card["plugins"][0]
    assert card["capabilities"]["single_turn_monotone"]["score"]["value"] == 0.0
    assert card["capabilities"]["lm_bridge"]["not_measured"] == "--no-bridge"
    assert card["sizes"]["instances"] == 1 and card["sizes"]["iterations"] == 2
    text = (tmp_path / "card" / "card.md").read_text()
    assert "| Single-turn monotone improvement | 0.00 (0 of" in text and "counterexamples/anti_pg_single_turn_monotone.json" in text
    assert (tmp_path / "card" / "card.png").stat().st_size > 10_000
    assert "single_turn_monotone     0.00" in out.stdout
    again = seeupo("scorecard", "anti_pg", "--plugin", HAND, *SMALL, "--out", str(tmp_path / "card"))
    assert again.returncode == 2 and "--overwrite" in again.stderr and again.stderr.count("\n") == 1


def test_a_plugin_that_breaks_the_contract_is_one_line_and_no_folder(seeupo, tmp_path):
    out = seeupo("scorecard", "nan_grpo", "--plugin", HAND, *SMALL, "--out", str(tmp_path / "card"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "non-finite advantages" in out.stderr
    assert not (tmp_path / "card").exists()


def test_bad_input_is_one_line(seeupo, tmp_path):
    for args, words in ((["no_such_algorithm"], "no_such_algorithm"), ([], "required"),
                        (["grpo", "--compare", ","], "comma-separated"), (["--field", "grpo"], "takes no NAME"),
                        (["--field", "--staleness", "1"], "scored on policy"), (["grpo", "--top-p", "0"], "--top-p"),
                        (["grpo", "--staleness", "-1"], "--staleness"), (["grpo", "--temperature", "0"], "--temperature")):
        out = seeupo("scorecard", *args, "--out", str(tmp_path / "x"))
        assert out.returncode == 2 and words in out.stderr and out.stderr.count("\n") == 1, (args, out.stderr)


def replace_measure(monkeypatch, index: int, measure) -> None:
    """The card measures capability ``index`` with ``measure`` instead (the others as they are)."""
    import dataclasses

    from seeupo.experiments.scorecard.capabilities import CAPABILITIES

    caps = list(CAPABILITIES)
    caps[index] = dataclasses.replace(caps[index], measure=measure)
    monkeypatch.setattr("seeupo.experiments.scorecard.card.CAPABILITIES", tuple(caps))


def test_ctrl_c_keeps_the_finished_capabilities(seeupo, tmp_path, monkeypatch):
    def interrupted(ctx):
        raise KeyboardInterrupt

    replace_measure(monkeypatch, 2, interrupted)
    out = seeupo("scorecard", "grpo", *SMALL, "--out", str(tmp_path / "card"))
    assert out.returncode == 130
    card = json.loads((tmp_path / "card" / "card.json").read_text())
    assert card["partial"] is True
    measured = [n for n, c in card["capabilities"].items() if "score" in c]
    assert measured == list(NAMES[:2])
    assert card["capabilities"][NAMES[2]]["not_measured"].startswith("not reached")


def test_compare_measures_the_others_on_the_same_problems(seeupo, tmp_path):
    out = seeupo("scorecard", "exact_pg", "--plugin", HAND, "--compare", "anti_pg", *SMALL, "--out", str(tmp_path / "c"))
    assert out.returncode == 0, out.stderr
    other = json.loads((tmp_path / "c" / "compare" / "anti_pg" / "card.json").read_text())
    mine = json.loads((tmp_path / "c" / "card.json").read_text())
    assert other["sizes"] == mine["sizes"]
    assert other["capabilities"]["agentic_credit"]["score"]["value"] == 0.0
    assert mine["capabilities"]["agentic_credit"]["score"]["value"] == 1.0
    assert "(1 cards beside it)" in out.stdout


def _card(name: str, values: dict, worst: str = "instance 3") -> Card:
    measured = {n: Measured(Score(v, 4, round(4 * v)), "four problems", None if v == 1 else worst)  # shares
                for n, v in values.items()}
    return Card(name, {}, [], Sizes(), measured, {n: "--no-bridge" for n in NAMES if n not in values})


def test_card_round_trips_through_json():
    card = _card("grpo", {"single_turn_monotone": 0.5, "agentic_credit": 1.0})
    again = Card.from_dict(json.loads(json.dumps(card.to_dict())))
    assert again.to_dict() == card.to_dict() and again.sizes == Sizes()
    assert "not measured: --no-bridge" in markdown(card)


def test_a_card_off_policy_records_its_rollouts_and_an_on_policy_one_is_written_as_before():
    from seeupo.tabular.behaviour import Rollouts, Sampler

    card = _card("grpo", {"single_turn_monotone": 0.5})
    assert "rollouts" not in card.to_dict() and "off policy" not in markdown(card)
    card.rollouts = Rollouts(2, Sampler(temperature=0.7, top_p=0.9))
    again = Card.from_dict(json.loads(json.dumps(card.to_dict())))
    assert again.rollouts == card.rollouts and again.to_dict() == card.to_dict()
    text = markdown(again)
    assert "**Rows off policy**: rows 2 updates stale; engine: temperature 0.7, top-p 0.9" in text
    assert "Multi-turn convergence to J*" in text.split("**Rows off policy**")[1].split("\n")[0]


def test_the_runs_of_the_own_updates_draw_their_rows_as_the_rollouts_say(hand):
    """Context.rollouts reaches the RunConfig of every capability that reads it: a stale run and a top-p run of the
    convergence problems differ from the on-policy one (and from each other), and are memoised apart."""
    import dataclasses

    from seeupo.experiments.scorecard import capabilities as caps
    from seeupo.experiments.scorecard import sampled
    from seeupo.experiments.scorecard.card import context
    from seeupo.tabular.behaviour import Rollouts, Sampler

    tiny = Sizes(instances=2, iterations=3, exact_epochs=10, starts=1, convergence_updates=4)
    on = context("exact_pg", tiny, None)
    stale = dataclasses.replace(on, rollouts=Rollouts(1))
    truncated = dataclasses.replace(on, rollouts=Rollouts(0, Sampler(top_p=0.6)))
    part = caps.monotone_parts(tiny, "single_turn_monotone")[0]
    _, run_cfg, _, _ = caps._part_run(truncated, part)
    assert run_cfg.sampler == Sampler(top_p=0.6) and run_cfg.staleness == 0
    assert caps._part_run(stale, part)[1].staleness == 1 and caps._part_run(on, part)[1].sampler is None
    assert caps._part_run(stale, part)[2] == caps._part_run(on, part)[2] + 1  # one more update: its own read stale rows
    js = [[r["J"] for r in sampled._runs(ctx)] for ctx in (on, stale, truncated)]
    assert js[0] != js[1] and js[0] != js[2] and js[1] != js[2]
    assert [r["J"] for r in sampled._runs(on)] == js[0]


def test_claims_agree_disagree_have_no_evidence_or_lie_outside_what_is_measured():
    from seeupo.experiments.scorecard.catalogue import VERDICTS, Claim, claim_verdict

    claim = Claim("its paper", "monotone", "one turn, stochastic outcomes", ("single_turn_monotone", "stochastic_outcomes"))
    assert claim_verdict(claim, {"single_turn_monotone": 1.0, "stochastic_outcomes": 1.0}, {})[0] == "agrees"
    verdict, words = claim_verdict(claim, {"single_turn_monotone": 1.0, "stochastic_outcomes": 0.9},
                                   {"stochastic_outcomes": "tool family, instance 2: J fell by 0.01"})
    assert verdict == "disagrees" and "stochastic_outcomes 0.90: tool family, instance 2" in words
    assert claim_verdict(claim, {"single_turn_monotone": 1.0, "stochastic_outcomes": None}, {})[0] == "no evidence"
    outside = Claim("its paper", "monotone with a learned critic", "a learned critic")
    assert claim_verdict(outside, {"single_turn_monotone": 0.0}, {})[0] == "outside the claim's model"
    untestable = Claim("its paper", "no length bias", "answers of different lengths", ("single_turn_monotone",),
                       untestable="every answer has one length")
    assert claim_verdict(untestable, {"single_turn_monotone": 0.0}, {}) == ("not testable", "every answer has one length")
    assert set(VERDICTS) == {"agrees", "disagrees", "outside the claim's model", "not testable", "no evidence"}


def test_every_catalogue_claim_names_its_model_and_only_capabilities_that_exist():
    from seeupo.experiments.scorecard.catalogue import CATALOGUE

    claims = [c for e in CATALOGUE for c in e.claims]
    assert claims and all(c.model and c.source and c.text for c in claims)
    assert all(set(c.capabilities) <= set(NAMES) for c in claims)
    assert all(c.capabilities or c.untestable for c in claims)
    seeupo = {c.source: c for e in CATALOGUE if e.name == "seeupo" for c in e.claims}
    # Theorem 1 is read in its deterministic model: neither stochastic outcomes nor shared parameters
    assert seeupo["its paper, Theorem 1"].capabilities == ("multi_turn_monotone",)
    # Theorem 2 is read on the algorithm's own updates, its reverse sequential schedule run as such
    assert seeupo["its paper, Theorem 2"].capabilities == ("multi_turn_convergence",)
    assert not any(e.name == "reinforce_pp" and e.claims for e in CATALOGUE)  # Table 1 says "no guarantee" for it


def test_the_field_table_marks_scores_below_one_and_reads_the_claims(tmp_path):
    from seeupo.experiments.scorecard.field import claims_table, write_field

    cards = [_card("seeupo", {n: 1.0 for n in NAMES if n != "lm_bridge"} | {"shared_parameters": 0.9}),
             _card("gspo", {n: 1.0 for n in NAMES if n != "lm_bridge"} | {"stochastic_outcomes": 0.5},
                   "the field's counterexample gspo_st_stochastic.json: J fell")]
    write_field(tmp_path, cards, Sizes(), 12.0)
    text = (tmp_path / "field.md").read_text()
    assert "| [SeeUPO](cards/seeupo/card.md) |" in text and "**0.90**" in text and "**0.50**" in text
    rows = {(r["algorithm"], r["source"]): r for r in claims_table(cards)}
    assert rows[("seeupo", "its paper, Theorem 1")]["verdict"] == "agrees"  # shared parameters are outside its claim
    gspo = next(r for r in rows.values() if r["algorithm"] == "gspo")
    assert gspo["verdict"] == "agrees"  # Table 1's single-turn claim: stochastic outcomes lie outside its model
    data = json.loads((tmp_path / "field.json").read_text())
    assert data["scores"]["gspo"]["stochastic_outcomes"] == 0.5 and "ppo" in data["missing"]
    assert "**Incomplete**: no card for ppo, grpo," in text  # two cards of the catalogue: the table says so
    # the columns are defined on the page; a column where both cards score 1 says it separates nothing
    assert "| 1-turn monotone (`single_turn_monotone`) |" in text
    assert "no: every algorithm scores 1.00" in text and data["ties"]["single_turn_monotone"] == 1.0
    assert "stochastic_outcomes" not in data["ties"]
    assert (tmp_path / "field.png").stat().st_size > 10_000


def test_every_catalogue_algorithm_is_registered_by_its_plugin_or_built_in():
    import subprocess
    import sys

    from seeupo.experiments.scorecard.catalogue import CATALOGUE

    assert len(CATALOGUE) >= 11
    code = ("from seeupo.plugins import load_plugin\nfrom seeupo.core.config import PRESETS\n"
            "from seeupo.experiments.scorecard.catalogue import CATALOGUE\n"
            "for e in CATALOGUE:\n    load_plugin(e.plugin) if e.plugin else None\n    assert e.name in PRESETS, e.name\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[3])
    assert run.returncode == 0, run.stderr[-2000:]


def test_an_exact_batch_too_large_is_no_score_with_its_reason(seeupo, tmp_path, monkeypatch):
    from seeupo.tabular.rollout import ExactBatchTooLarge

    def too_large(ctx):
        raise ExactBatchTooLarge("3,000,000 rows (at most 2,000,000)")

    replace_measure(monkeypatch, 0, too_large)
    out = seeupo("scorecard", "grpo", *SMALL, "--out", str(tmp_path / "card"))
    assert out.returncode == 0, out.stderr
    first = json.loads((tmp_path / "card" / "card.json").read_text())["capabilities"][NAMES[0]]["score"]
    assert first["value"] is None and "too large to build: 3,000,000 rows" in first["reason"]
    assert "no score (an exact batch is too large" in out.stdout


def test_sigterm_keeps_the_finished_capabilities_and_exits_143(seeupo, tmp_path, monkeypatch):
    import os
    import signal

    def terminated(ctx):
        os.kill(os.getpid(), signal.SIGTERM)  # the card's handler turns it into a stop, as Ctrl-C
        raise AssertionError("SIGTERM did not stop the card")

    replace_measure(monkeypatch, 1, terminated)
    out = seeupo("scorecard", "grpo", *SMALL, "--out", str(tmp_path / "card"))
    assert out.returncode == 143
    card = json.loads((tmp_path / "card" / "card.json").read_text())
    assert card["partial"] is True and [n for n, c in card["capabilities"].items() if "score" in c] == [NAMES[0]]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handler is given back


def test_the_plan_line_states_the_calibrated_estimate():
    """The estimate is the timing, each capability's calibrated seconds, the bridge's fixed figure and the writing."""
    from seeupo.experiments.scorecard.card import BRIDGE_SECONDS_PER_SEED, WRITE_SECONDS, Calibration, estimate, plan_line

    cal = Calibration({"single_turn_monotone": 10.0, "multi_turn_convergence": 20.0}, seconds=2.0)
    sizes = Sizes(sweep_lr=(), sweep_epochs=())
    # the protocol sweep measures both again (they run the optimizer) at each of its 2 step sizes and 1 epochs factor
    assert estimate(Sizes(), cal, bridge=False) == pytest.approx(32.0 + 3 * 30.0 + WRITE_SECONDS)
    assert estimate(sizes, cal, bridge=False) == pytest.approx(32.0 + WRITE_SECONDS)
    assert estimate(sizes, cal, bridge=True) == pytest.approx(32.0 + WRITE_SECONDS + 5 * BRIDGE_SECONDS_PER_SEED)
    line = plan_line("grpo", sizes, cal, bridge=False)
    assert f"estimate {32 + WRITE_SECONDS:.0f} s in all (calibrated on this machine in 2 s)" in line
    assert f"{len(NAMES) - 1} capabilities" in line and "bridge" not in line


def test_each_unit_counts_as_often_as_its_capability_runs_it(monkeypatch):
    """A clock that advances 1 s per reading makes every unit take 1 s: a capability's estimate is then the sum of its
    units' counts; a monotonicity capability's counts are every update of its runs (a problem timed once for both
    starts)."""
    from seeupo.experiments.scorecard import capabilities as caps
    from seeupo.experiments.scorecard import timing
    from seeupo.experiments.scorecard.card import context

    ctx = context("grpo", caps.QUICK, None)
    ticks = iter(range(10_000))
    monkeypatch.setattr(timing, "units", lambda ctx, c: [timing.Unit(lambda: None, 3.0), timing.Unit(lambda: None, 0.5)])
    assert timing.estimate_seconds(ctx, "agentic_credit", clock=lambda: float(next(ticks))) == 3.5
    monkeypatch.undo()
    parts = caps.monotone_parts(ctx.sizes, "multi_turn_monotone")
    counted = timing.units(ctx, "multi_turn_monotone")
    assert sum(u.times for u in counted) == sum((p.iterations or ctx.sizes.iterations) * ctx.iterations_factor for p in parts)
    assert len(counted) == len({id(p.problem) for p in parts})
    for name in NAMES:
        assert isinstance(timing.units(ctx, name), list)


def test_a_card_runs_on_one_thread_and_gives_the_count_back(monkeypatch):
    import torch

    from seeupo.experiments.scorecard import card as card_module

    seen = []
    monkeypatch.setattr(card_module, "_measure", lambda cap, ctx: seen.append(torch.get_num_threads()) or Measured(
        Score(1.0, 1, 1, None, None), ""))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        card_module.score_card("grpo", Sizes(), None, bridge=False, only=["reward_invariance"], say=lambda m: None)
        assert seen == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_one_thread_measures_what_two_measure():
    """The card's one thread changes no number: the exact runs of a monotonicity part (GRPO's closed form and the
    generic enumeration) and a plain ascent give the same J on one thread and on two, to 1e-12."""
    import torch

    from seeupo.core.config import preset
    from seeupo.experiments.scorecard import capabilities as caps
    from seeupo.experiments.scorecard.card import context, one_thread
    from seeupo.tabular.gradient import plain_ascent
    from seeupo.tabular.train import AlgorithmStep, RunConfig, track

    ctx = context("grpo", caps.QUICK, None)
    part = caps.monotone_parts(ctx.sizes, "stochastic_outcomes")[4]  # 2-turn tree MDPs, stochastic observations

    def measured() -> list[torch.Tensor]:
        out = []
        for closed_form in (True, False):
            algorithm, run_cfg, _, policy = caps._part_run(ctx, part)
            run_cfg = RunConfig(**{**run_cfg.__dict__, "exact_closed_form": closed_form})
            out.append(track(part.problem, AlgorithmStep(algorithm, run_cfg), policy, 2).J)
        out.append(plain_ascent(part.problem, preset("grpo"), steps=5).J)
        return out

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        two = measured()
        with one_thread():
            one = measured()
    finally:
        torch.set_num_threads(before)
    for a, b in zip(one, two):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_the_protocol_sweep_measures_the_optimizer_capabilities_again(monkeypatch):
    """Each capability that runs the optimizer is measured at lr x f for every step-size factor and at epochs x f for
    every epochs factor; the others are not. An epochs factor that leaves one step per update is the protocol itself:
    its scores are the card's, not measured again."""
    from seeupo.experiments.scorecard import card as card_module
    from seeupo.experiments.scorecard.capabilities import CAPABILITIES

    seen = []

    def fake(cap, ctx):
        seen.append((cap.name, ctx.lr, ctx.config.epochs))
        return Measured(Score(ctx.lr / 10 + ctx.config.epochs / 1000, 1, None), "")

    monkeypatch.setattr(card_module, "_measure", fake)
    sizes = Sizes(sweep_lr=(0.5, 2.0), sweep_epochs=(0.25,))
    only = ["single_turn_monotone", "agentic_credit", "sampled_update_safety"]
    card = card_module.score_card("grpo", sizes, None, bridge=False, only=only, say=lambda m: None)
    lr, epochs = 0.05, 40
    swept = ("single_turn_monotone", "sampled_update_safety")
    assert sorted(seen) == sorted([(n, lr, epochs) for n in only] + [(n, lr * f, epochs) for n in swept
                                                                     for f in (0.5, 2.0)] + [(n, lr, 10) for n in swept])
    points = {"lr x 0.5": lr * 0.5 / 10 + 0.04, "lr x 2": lr * 2 / 10 + 0.04, "epochs x 0.25": lr / 10 + 0.01}
    assert card.sweep == {n: points for n in swept}
    assert card_module.sweep_range(card, "single_turn_monotone") == (lr / 10 + 0.01, lr * 2 / 10 + 0.04)
    assert card_module.sweep_range(card, "agentic_credit") is None
    again = Card.from_dict(json.loads(json.dumps(card.to_dict())))
    assert again.sweep == card.sweep and "| single_turn_monotone |" in markdown(card)
    assert {c.name for c in CAPABILITIES if c.protocol} >= set(card.sweep)


def test_an_epochs_factor_that_leaves_one_step_is_the_card_s_own_score(monkeypatch):
    """RLOO takes one gradient step per update: epochs x 0.25 is still 1, the same computation, not measured again."""
    from seeupo.experiments.scorecard import card as card_module

    seen = []

    def fake(cap, ctx):
        seen.append(ctx.config.epochs)
        return Measured(Score(0.5, 1, None), "")

    monkeypatch.setattr(card_module, "_measure", fake)
    card = card_module.score_card("rloo", Sizes(sweep_lr=(), sweep_epochs=(0.25,)), None, bridge=False,
                                  only=["single_turn_monotone"], say=lambda m: None)
    assert seen == [1] and card.sweep == {"single_turn_monotone": {"epochs x 0.25": 0.5}}
