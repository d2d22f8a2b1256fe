"""``seeupo.experiments.explain``: the numbers of an explanation against hand computations, the
flat surrogate of GRPO and DAPO by hand, the committed MT-GRPO and turn_mean_rtg counterexamples (paper_repro/algorithms), and ``seeupo replay --explain``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from seeupo import plugins
from seeupo.cli import main
from seeupo.core.config import preset
from seeupo.experiments.counterexamples import Case, Counterexample, record
from seeupo.experiments.explain import BEGIN, END, FLAT_SIGNAL, VANISHING, amplification, explain, render, restate, summary_line
from seeupo.tabular.problems import DTYPE, TreeMDP
from seeupo.tabular.train import RunConfig

ROOT = Path(__file__).resolve().parents[2]
ALGORITHMS = ROOT / "examples" / "algorithms"
CHECKS = ROOT / "paper_repro" / "algorithms"
MT_GRPO = CHECKS / "mt_grpo" / "counterexamples" / "mt_grpo_mt_stochastic.json"
EPS = 1e-6  # the std constant of GRPO and of the plugins


def one_turn_bandit() -> TreeMDP:
    """Action 0 pays 0.4 with probability 2/3, else 0 (Q = 0.8/3); action 1 pays 0.3 for sure (Q = 0.3)."""
    obs = torch.tensor([[[[2 / 3, 1 / 3], [0.5, 0.5]]]], dtype=DTYPE)
    rew = torch.tensor([[[[0.4, 0.0], [0.3, 0.3]]]], dtype=DTYPE)
    return TreeMDP(torch.ones(1, 1, dtype=DTYPE), (2,), (2,), [obs], [rew], [torch.ones(1, 1, 2, 2, dtype=torch.bool)])


def pair_advantage(d: float) -> float:
    """GRPO's advantage of the winner of a pair of returns ``d`` apart: ``(d / 2) / (d / sqrt 2 + eps)``
    (the unbiased std of two numbers ``d`` apart is ``d / sqrt 2``); the loser gets its negative."""
    return (d / 2) / (d / math.sqrt(2) + EPS)


def test_hand_made_bandit_grpo_g2_gives_the_worse_action_a_positive_expected_advantage():
    # GRPO, G = 2, uniform start, one plain SGD step of lr 1 on the surrogate
    cfg = preset("grpo").replace(group_size=2, epochs=1)
    run = RunConfig(optimizer="sgd", lr=1.0, init_scale=0.0)
    example = record(Case(one_turn_bandit(), None, cfg, run, 1), "monotone", "hand-made one-turn bandit")
    e = explain(example)

    # the returns under the uniform policy: 0.4 w.p. 1/3, 0 w.p. 1/6, 0.3 w.p. 1/2
    q0, q1 = 0.8 / 3, 0.3
    v = (q0 + q1) / 2
    assert e.J_before == pytest.approx(v, abs=1e-15)
    a0, a1 = e.actions
    assert (a0.q, a1.q) == (pytest.approx(q0), pytest.approx(q1))
    assert (a0.true_advantage, a1.true_advantage) == (pytest.approx(q0 - v), pytest.approx(q1 - v))  # -1/60, +1/60

    # E[A_hat | a]: the own return against the group-mate's (a tie gives 0)
    c = pair_advantage
    e0 = 2 / 3 * (1 / 6 * c(0.4) + 1 / 2 * c(0.1)) - 1 / 3 * (1 / 3 * c(0.4) + 1 / 2 * c(0.3))
    e1 = 1 / 3 * -c(0.1) + 1 / 6 * c(0.3)
    assert a0.expected_advantage == pytest.approx(e0, rel=1e-9)
    assert a1.expected_advantage == pytest.approx(e1, rel=1e-9)
    assert e0 == pytest.approx(1 / (6 * math.sqrt(2)), abs=1e-5)  # +0.1178: the worse action is favoured
    assert f"{a0.expected_advantage:+.6f}" == "+0.117848"
    # each class's advantage and weight: action 0 with return 0.4 against a mate of 0 (1/2 x 2/3 x 1/6)
    assert any(cl.trajectory_return == 0.4 and cl.advantage == pytest.approx(c(0.4)) and cl.weight == pytest.approx(1 / 18)
               for cl in a0.classes)
    assert sum(cl.weight for cl in a0.classes) == pytest.approx(0.5)

    # the surrogate (token mean of r A) is sum_a pi'(a) E[A_hat | a]; at the start its gradient in the logit
    # of b is pi(b) (E[A_hat | b] - sum_a pi(a) E[A_hat | a]), and grad J there is pi(b) (Q(b) - V)
    g = [0.5 * (e0 - (e0 + e1) / 2), 0.5 * (e1 - (e0 + e1) / 2)]
    grad_j = [0.5 * (q0 - v), 0.5 * (q1 - v)]
    assert e.update.slope == pytest.approx(g[0] * grad_j[0] + g[1] * grad_j[1], rel=1e-9)
    assert e.update.gradient_norm == pytest.approx(math.hypot(*g), rel=1e-9)
    # one SGD step of lr 1 moves the logits by g: pi(1) = sigmoid(g1 - g0)
    p1 = 1 / (1 + math.exp(-(g[1] - g[0])))
    assert a1.prob_after == pytest.approx(p1, rel=1e-9)
    assert e.J_after == pytest.approx((1 - p1) * q0 + p1 * q1, rel=1e-12)
    assert e.J_after < e.J_before

    # G = 2 and a scale-normalised advantage: only who won the pair counts, a win rate, which the riskier action wins
    assert e.cause == "std scaling"
    assert e.plain is None  # the update is plain gradient ascent already
    line = summary_line(e)
    assert "win rate" in line and "the worse action (Q - V -0.016667) gets expected advantage +0.117848" in line
    # what changes it: mean-centred advantages, E[A_hat | b] = (Q(b) - V) / 2 (G = 2), so one SGD step of lr 1
    # moves the logit of b by pi(b) (Q(b) - V) / 2 and pi(1) = sigmoid(1/120)
    p1_mean = 1 / (1 + math.exp(-(0.25 * (q1 - v) - 0.25 * (q0 - v))))
    J_mean = (1 - p1_mean) * q0 + p1_mean * q1
    assert J_mean > e.J_before
    assert f"With mean-centred advantages (GRAE, mean, no scaling; the same G and update), J goes to {J_mean:.6f}." in line


def test_hand_made_bandit_with_the_oracle_advantage_has_no_decrease():
    cfg = preset("grpo").replace(advantage="oracle", epochs=1)
    run = RunConfig(optimizer="sgd", lr=1.0, init_scale=0.0)
    e = explain(record(Case(one_turn_bandit(), None, cfg, run, 1), "monotone", "oracle"))
    # the oracle's expected advantage is the true one
    for row in e.actions:
        assert row.expected_advantage == pytest.approx(row.true_advantage, abs=1e-15)
    assert e.cause == "no decrease" and e.J_after > e.J_before


def flat_bandit() -> TreeMDP:
    """Action 0 pays 0.1 for sure; action 1 pays 0 or 0.3 with probability 1/2 each (Q 0.15 = J*). With G = 2 and
    the group std, each action beats its group-mate as often as it loses to it: the expected advantages are 0, up
    to the constant added to the std. (DAPO's committed counterexample of 2026-11-26, made by hand.)"""
    obs = torch.tensor([[[[0.5, 0.5], [0.5, 0.5]]]], dtype=DTYPE)
    rew = torch.tensor([[[[0.1, 0.1], [0.0, 0.3]]]], dtype=DTYPE)
    return TreeMDP(torch.ones(1, 1, dtype=DTYPE), (2,), (2,), [obs], [rew], [torch.ones(1, 1, 2, 2, dtype=torch.bool)])


def _flat_example(algorithm: str):
    cfg = preset(algorithm, group_size=2, epochs=40)
    return record(Case(flat_bandit(), None, cfg, RunConfig(lr=0.2, init_scale=0.0), 1), "monotone", f"{algorithm}, flat")


def test_dapo_on_a_flat_surrogate(load):
    load("dapo")
    e = explain(_flat_example("dapo"))
    assert (f"{e.J_before:.6f}", f"{e.J_after:.6f}") == ("0.125000", "0.123288")
    # the expected advantages (2e-6) are below FLAT_SIGNAL of the batch's scale (1.6 / sqrt 2): no signal, the
    # optimizer chose the step (with the std constant at 0 they vanish: the next test)
    assert e.reproduces and e.cause == "flat surrogate"
    assert max(abs(row.expected_advantage) for row in e.actions) <= FLAT_SIGNAL * 1.6 / math.sqrt(2)
    worse, better = e.actions
    assert (worse.true_advantage, better.true_advantage) == (pytest.approx(-0.025), pytest.approx(0.025))
    # both expected advantages are about -+2e-6, of the right sign
    assert (f"{worse.expected_advantage:.1e}", f"{better.expected_advantage:.1e}") == ("-2.0e-06", "2.0e-06")
    # G = 2: the std-scaled advantage only records who won the pair: +-(1/sqrt 2) / P(informative pair) = 1.6 / sqrt 2,
    # up to the std constant
    for row in e.actions:
        for cl in row.classes:
            assert cl.advantage == 0 or abs(abs(cl.advantage) - 1.6 / math.sqrt(2)) < 2e-5
    # plain gradient ascent, same 40 steps of lr 0.2 from the same start: J rises by 2e-7
    assert f"{e.plain.J[-1] - e.J_before:.1e}" == "2.0e-07"
    assert e.plain.slope > 0 and e.update.slope > 0
    assert amplification(e.update, e.plain) > 1e5  # Adam's first step: about lr per parameter, whatever the gradient
    # Adam's normalised steps: up first, past the surrogate's optimum, and back below the start
    assert max(e.update.J) > 0.134 and e.update.J[-1] == pytest.approx(e.J_after)
    text = render(e)
    assert "**Cause: flat surrogate.**" in text and "the decrease is the optimizer's choice" in text
    assert "**What changes the outcome:** Plain gradient ascent on the same surrogate (40 steps of lr 0.2) moves J by +2.0e-07." in text


def test_dapo_without_the_std_constant_leaves_j_at_its_start(load, monkeypatch):
    """The issue's statement that the +-2e-6 come from the 1e-6 added to the std: with 0 there, nothing moves."""
    module = load("dapo")
    monkeypatch.setattr(module, "EPS", 0.0)
    example = _flat_example("dapo")
    e = explain(example)
    # the two expected advantages cancel up to round-off (5.6e-17), which Adam's own epsilon (1e-8) keeps from
    # becoming full steps: J moves by 6e-10, upwards
    assert all(abs(row.expected_advantage) < 1e-15 for row in e.actions)
    assert f"{example.recompute()[-1]:.6f}" == f"{e.J_after:.6f}" == "0.125000"
    assert 0 <= e.J_after - e.J_before < 1e-9
    assert e.cause == "no decrease"


def test_built_in_grpo_on_the_same_flat_surrogate():
    """The built-in GRPO (group std, its own 1e-6) lowers J on the same problem for the same reason."""
    e = explain(_flat_example("grpo"))
    assert e.reproduces and e.J_after < e.J_before and e.cause == "flat surrogate"
    assert 0 < max(abs(row.expected_advantage) for row in e.actions) < 1e-5
    assert e.plain.J[-1] >= e.J_before  # plain ascent on the same surrogate does not lower J


def test_committed_two_turn_mt_grpo_counterexample_is_an_own_action_baseline(load):
    """MT-GRPO as its authors assign its advantages: its turn term at turn 0 is a z-score of the turn's own reward
    (0 when the episode stopped there), so the baseline of turn 0 depends on turn 0's own action."""
    load("mt_grpo")
    e = explain(Counterexample.load(MT_GRPO))
    assert (f"{e.J_before:.6f}", f"{e.J_after:.6f}") == ("0.121443", "0.118202")
    assert e.reproduces and e.cause == "own-action baseline" and e.update.slope < 0
    first = [row for row in e.actions if row.turn == 0]
    weaker = min(first, key=lambda row: row.q)
    assert weaker.true_advantage < 0 and f"{weaker.expected_advantage:+.3f}" == "+0.185"
    assert e.plain.J[-1] < e.J_before  # plain gradient ascent lowers J too
    assert "+0.184741" in summary_line(e) and "own actions" in summary_line(e)
    J_exact = float(e.what_changes.split("J goes to ")[1].rstrip("."))
    assert J_exact > e.J_before  # the exact advantages raise J from the same start


@pytest.mark.parametrize("stem, path, cause", [("mt_grpo", MT_GRPO, "own-action baseline")])
def test_replay_explain_on_the_command_line(capsys, stem, path, cause):
    plugins.forget_plugins()
    try:
        code = main(["replay", str(path), "--plugin", str(ALGORITHMS / f"{stem}.py"), "--explain"])
    finally:
        plugins.forget_plugins()
    out = capsys.readouterr().out
    assert code == 0
    assert "reproduced" in out and f"**Cause: {cause}.**" in out
    assert "| turn | history | action | return | advantage | weight |" in out


def test_committed_seeupo_shared_counterexample_is_neither_sign_nor_vanishing_gradient():
    """paper_repro/counterexamples/seeupo_mt_shared.json: the expected update points uphill and plain gradient ascent
    raises J, but the gradient is not vanishing (Adam's first step only about 7 times plain ascent's): "step size"."""
    e = explain(Counterexample.load(ROOT / "paper_repro" / "counterexamples" / "seeupo_mt_shared.json"))
    assert e.reproduces and e.J_after < e.J_before
    assert e.update.slope > 0 and e.plain.J[-1] > e.J_before
    assert 1 < amplification(e.update, e.plain) < VANISHING
    assert e.cause == "step size"
    assert any("shared across turns" in r for r in e.reasons)


@pytest.mark.slow
def test_paper_repro_algorithms_readme_block_and_explanations_are_regenerated(monkeypatch):
    """The causes restated in paper_repro/algorithms/README.md and explanations.md are what the code says now."""
    monkeypatch.chdir(ROOT)
    plugins.forget_plugins()
    try:
        plugins.load_plugins([f"examples/algorithms/{p.stem}.py" for p in sorted(ALGORITHMS.glob("*.py"))], "--plugin")
        files = sorted(str(p.relative_to(ROOT)) for p in CHECKS.glob("*/counterexamples/*.json"))
        block, full = restate(files)
    finally:
        plugins.forget_plugins()
    readme = (CHECKS / "README.md").read_text()
    assert readme.split(BEGIN, 1)[1].split(END, 1)[0] == "\n" + block
    assert (CHECKS / "explanations.md").read_text().endswith(full)
    assert "mt_grpo_mt_stochastic.json`: J 0.121443 -> 0.118202; cause: a baseline that depends on the trajectory's own" in block
    # its ranked pairs are all reversed: a negative scale or an own-action baseline, which one instance cannot tell apart
    assert "turn_mean_rtg_mt_stochastic.json`: J 0.125000 -> 0.120101; cause: the advantage's sign" in block
    assert "turn_mean_rtg_agentic_stop.json`" in block and "cause: a baseline that depends on the trajectory's own actions" in block


def test_a_negative_m_factor_reverses_a_turn_and_every_turn_is_read():
    """A plugin M factor ``-F * ratio``: reverse order updates turn 1 first (F = 1), then turn 0 with F < 0. The
    explanation reads each updated turn's first step: turn 1 uphill, turn 0 downhill, and not without the factor."""
    from seeupo.core.registry import M_FACTORS, register_m_factor
    from seeupo.tabular.problems import sequential_bandit

    register_m_factor("explain_test_negate", uses_ratio=True)(lambda factor, ratio, cfg: -factor * ratio.to(factor.dtype))
    try:
        problem = sequential_bandit(torch.ones(1), (2, 2), torch.tensor([[[0.0, 0.0], [0.0, 1.0]]]))  # 1 for (1, 1) only
        cfg = preset("seeupo").replace(m_factor="explain_test_negate", group_size=2, epochs=1, grae_scale="none")
        e = explain(record(Case(problem, None, cfg, RunConfig(optimizer="sgd", lr=1.0, init_scale=0.0), 1), "monotone", "negate"))
        assert e.J_after < e.J_before and e.cause == "M factor"
        (first, slope1, _), (second, slope0, _) = e.update.turn_slopes
        # turn 1 at the uniform start (J = 1/4): after a0 = 1 (reach 1/2) Q = (0, 1), V = 1/2, so grad J in the
        # two logits is reach x pi x (Q - V) = (-1/8, +1/8); with G = 2 mean-centred, E[A_hat | h, a] = (Q - J) / 2 =
        # (-1/8, 3/8) and the surrogate's gradient is reach x pi x (E[A_hat] - sum pi E[A_hat]) = (-1/16, +1/16);
        # after a0 = 0 every reward is 0 and both vanish. grad J . g = 1/128 + 1/128 = 1/64
        assert (first, second) == (1, 0) and slope1 == pytest.approx(1 / 64, rel=1e-12) and slope0 < 0
        assert "the factor 'explain_test_negate' reverses turn 0's update" in " ".join(e.reasons)
        assert "turn 1 +1.6e-02, turn 0 -1.7e-02" in " ".join(e.reasons)  # every updated turn read
        assert e.what_changes.startswith("With m_factor = none") and "J goes to 0.282183" in e.what_changes
        assert "inf times" not in render(e)
    finally:
        M_FACTORS._entries.pop("explain_test_negate", None)


def test_a_baseline_that_depends_on_the_trajectory_length_on_stop_or_continue(load):
    """turn_mean_rtg on the stop-or-continue problem (stop 0.6; continue 0.3 then 0.5 or 0), at pi_0 = (1/2, 1/2),
    pi_1 = (9/10, 1/10), G = 2: continuing is better at turn 0 (Q 0.75 against 0.6), yet the estimator, which
    divides the return-to-go by the turns left, gives stopping the larger expected advantage."""
    from seeupo.core.config import PRESETS
    from seeupo.tabular.problems import stop_or_continue

    load("turn_mean_rtg")
    start = [torch.tensor([[[0.5, 0.5]]], dtype=DTYPE), torch.tensor([[[0.9, 0.1], [0.9, 0.1]]], dtype=DTYPE)]
    cfg = PRESETS["turn_mean_rtg"].replace(group_size=2)
    example = record(Case(stop_or_continue(0.6, 0.3, (0.5, 0.0)), start, cfg, RunConfig(optimizer="sgd", lr=1.0), 1),
                     "monotone", "stop or continue")
    e = explain(example)
    assert e.J_before == pytest.approx(0.675) and e.J_after < e.J_before
    assert e.cause == "own-action baseline"
    stop, go = [row for row in e.actions if row.turn == 0]
    assert (stop.q, go.q) == (pytest.approx(0.6), pytest.approx(0.75))
    assert stop.expected_advantage == pytest.approx(9 / 160) and go.expected_advantage == pytest.approx(-9 / 160)
    line = summary_line(e)
    assert "one of them ends the episode" in line and "trajectory's length" in line
    J_oracle = float(e.what_changes.rsplit("J goes to ", 1)[1].rstrip("."))
    assert J_oracle > e.J_before  # the exact advantages raise J from the same start
