"""Each capability end to end on hand-made algorithms whose scores are known: one must score 1, one 0.

``exact_pg`` (the exact advantage, plain policy gradient) must score 1 everywhere; ``anti_pg`` (its
negation) 0 on every capability of improvement, convergence and credit; ``range_flip_pg`` (correct only
on rewards spanning exactly [0, 1]) 0 on invariance; ``anti_bonus_pg`` 0 on groups with zero variance
(tests/experiments/scorecard/hand_algorithms.py).
"""

from pathlib import Path

from seeupo.experiments.scorecard.capabilities import CAPABILITIES, Sizes
from seeupo.experiments.scorecard.card import context

TINY = Sizes(instances=2, iterations=3, exact_epochs=10, starts=1, convergence_updates=10)
EXACT = [c for c in CAPABILITIES if c.exact]


def scores(name: str, capabilities=EXACT, out=None) -> dict:
    ctx = context(name, TINY, out)
    return {c.name: c.measure(ctx) for c in capabilities}


#: The capabilities of an expected update's sign and direction, where the exact policy gradient scores 1.
EXPECTED = ("single_turn_monotone", "multi_turn_monotone", "stochastic_outcomes", "shared_parameters",
            "agentic_credit", "reward_invariance", "zero_variance_groups", "difficulty_weighting", "length_weighting")


def test_the_exact_policy_gradient_scores_one_on_every_expected_update_capability(hand, tmp_path):
    measured = scores("exact_pg", out=tmp_path)
    assert {n: measured[n].score.value for n in EXPECTED} == {n: 1.0 for n in EXPECTED}
    assert all(measured[n].worst is None and not measured[n].evidence for n in EXPECTED)
    assert not any(tmp_path.iterdir())  # nothing failed, nothing to show
    # graded: its own updates close >= 99% of the gap in 10 updates (SGD at 5, 10 steps each), not at once;
    # a sampled update is noisy (RLOO-sized groups of one prompt) and lowers J on a few draws
    assert measured["multi_turn_convergence"].score.value > 0.99
    assert 0.0 < measured["convergence_speed"].score.value < 1.0
    assert 0.99 < measured["sampled_update_safety"].score.value < 1.0
    assert 0.3 < measured["sampled_update_signal"].score.value < 1.0


def test_its_negation_scores_zero_on_improvement_convergence_and_credit(hand, tmp_path):
    measured = scores("anti_pg", out=tmp_path)
    for name in ("single_turn_monotone", "multi_turn_monotone", "stochastic_outcomes", "shared_parameters",
                 "multi_turn_convergence", "convergence_speed", "agentic_credit", "difficulty_weighting",
                 "length_weighting"):
        assert measured[name].score.value == 0.0, name
        assert measured[name].worst
    assert measured["sampled_update_safety"].score.value < 0.01  # nearly every draw lowers J
    assert measured["reward_invariance"].score.value == 1.0  # minus the gradient is as invariant as the gradient
    # the evidence replays: each monotonicity capability's worst run is a counterexample file
    from seeupo.experiments.counterexamples import Counterexample, replay

    for name in ("single_turn_monotone", "shared_parameters"):
        (path,) = measured[name].evidence
        example = Counterexample.load(tmp_path / path)
        assert example.largest_decrease > 0 and replay(example).reproduces
    assert measured["agentic_credit"].evidence == ["gradient/anti_pg_agentic_credit.json"]


def test_an_update_that_assumes_rewards_in_0_1_scores_zero_on_invariance(hand):
    measured = scores("range_flip_pg", [c for c in EXACT if c.name == "reward_invariance"])
    assert measured["reward_invariance"].score.value == 0.0
    assert "cosine -1.000000" in measured["reward_invariance"].worst


def test_an_update_that_moves_without_signal_scores_zero_on_zero_variance_groups(hand):
    measured = scores("anti_bonus_pg", [c for c in EXACT if c.name == "zero_variance_groups"])
    assert measured["zero_variance_groups"].score.value == 0.0
    assert "every answer earns" in measured["zero_variance_groups"].worst


def test_instances_whose_J_no_policy_changes_are_left_out():
    import torch

    from seeupo.experiments.scorecard.capabilities import _constant_bandit, _needle_bandit, constant_J

    assert constant_J(_constant_bandit(3, 2, 0.5)).tolist() == [True] * 3
    assert constant_J(_needle_bandit(3, 2, torch.Generator().manual_seed(0))).tolist() == [False] * 3


def test_the_field_counterexamples_are_found_and_sorted_by_capability():
    from seeupo.experiments.counterexamples import field_counterexamples
    from seeupo.experiments.scorecard.capabilities import _counterexample_setting

    found = field_counterexamples()  # every file, whichever plugins this process loaded (here none of theirs)
    root = Path(__file__).resolve().parents[3] / "paper_repro"
    files = [*root.glob("counterexamples/*.json"), *root.glob("algorithms/*/counterexamples/*.json")]
    assert len(found) == len(files) and len(files) >= 12  # 17 committed on 2026-11-29
    names = [p for p, _ in found]
    assert "paper_repro/counterexamples/seeupo_mt_shared.json" in names and names == sorted(names)
    settings = {p.rsplit("/", 1)[1]: _counterexample_setting(ex) for p, ex in found}
    assert settings["seeupo_mt_shared.json"] == "shared_parameters"
    assert settings["grpo_st_stochastic.json"] == "stochastic_outcomes"


def test_an_estimator_without_a_language_model_form_gets_no_bridge_score(hand, tmp_path):
    (bridge,) = [c for c in CAPABILITIES if c.name == "lm_bridge"]
    measured = bridge.measure(context("exact_pg", TINY, tmp_path))
    assert measured.score.value is None and "no language-model form" in measured.score.reason


def test_an_update_that_never_moves_fails_monotone_improvement(hand):
    """It never lowers J, and it never raises it either: not an improvement (the rule before issue 41 passed it)."""
    measured = scores("frozen_pg", [c for c in EXACT if c.name in ("single_turn_monotone", "sampled_update_safety")])
    assert measured["single_turn_monotone"].score.value == 0.0
    assert "J did not move" in measured["single_turn_monotone"].worst
    assert measured["sampled_update_safety"].score.value == 1.0  # no draw lowers J: safety alone is not progress


def test_a_loss_that_never_updates_turn_0_has_no_credit(hand):
    """Its estimator is the exact advantage (the estimator-level credit is 1); its loss weighs turn 0 by 0, and the
    credit capability reads the whole update."""
    from seeupo.experiments.scorecard.capabilities import agentic_credit
    from seeupo.experiments.scorecard.card import context
    import torch

    from seeupo.tabular.gradient import gradient_directions
    from seeupo.tabular.policies import TabularPolicy
    from seeupo.tabular.problems import random_family

    ctx = context("turn0_frozen_pg", TINY, None)
    measured = agentic_credit(ctx)
    assert measured.score.value == 0.0 and "turn cosines -, " in measured.worst  # turn 0: no step where grad J is not 0
    one = random_family("tool", 1, 2, reward_levels=3, generator=torch.Generator().manual_seed(0))
    start = TabularPolicy(one, init_scale=1.0, generator=torch.Generator().manual_seed(1))
    (estimator,) = gradient_directions(one, start, ctx.config, level="estimator")
    (update,) = gradient_directions(one, start, ctx.config, level="update")
    assert estimator.verdict == "unbiased" and update.verdict != "unbiased"


def test_noise_without_bias_scores_low_on_signal_only(hand):
    """The exact advantage plus 100: every expected quantity is the exact policy gradient's, but a sampled update is
    almost all noise."""
    names = ("agentic_credit", "sampled_update_signal", "sampled_update_safety")
    shifted = scores("shifted_pg", [c for c in EXACT if c.name in names])
    exact = scores("exact_pg", [c for c in EXACT if c.name in names])
    assert shifted["agentic_credit"].score.value == exact["agentic_credit"].score.value == 1.0
    assert shifted["sampled_update_signal"].score.value < 0.05 < 0.3 < exact["sampled_update_signal"].score.value
    assert shifted["sampled_update_safety"].score.value < exact["sampled_update_safety"].score.value


def test_a_group_std_weighs_prompts_by_their_spread_and_dr_grpo_does_not():
    """Dr. GRPO's difficulty bias, measured: prompts whose rewards spread 0.1, 0.5 and 1 apart; GRPO's group std
    weighs the narrow prompt up (the update turns away from grad J), mean-centring alone does not."""
    from seeupo import plugins
    from seeupo.experiments.scorecard.capabilities import difficulty_weighting
    from seeupo.experiments.scorecard.card import context

    plugins.forget_plugins()
    plugins.load_plugin(str(Path(__file__).resolve().parents[3] / "examples" / "algorithms" / "dr_grpo.py"))
    try:
        grpo, dr = (difficulty_weighting(context(n, TINY, None)) for n in ("grpo", "dr_grpo"))
    finally:
        plugins.forget_plugins()
    assert dr.score.value == 1.0 and dr.worst is None
    assert grpo.score.value < 0.95 and "cosine with grad J" in grpo.worst


def test_averaging_each_answer_s_tokens_turns_the_update_only_where_answers_differ_in_length(hand):
    """Dr. GRPO's length bias, measured: the exact advantage with each answer's tokens averaged (1/|o|) is the policy
    gradient on every problem whose answers have one length, and turns away from it where they end at an end token;
    summing them over a constant (Dr. GRPO's aggregation, loaded from its plugin) does not."""
    from seeupo import plugins
    from seeupo.experiments.scorecard.capabilities import difficulty_weighting, length_weighting, reward_invariance

    averaged = context("length_mean_pg", TINY, None)
    assert difficulty_weighting(averaged).score.value == 1.0 and reward_invariance(averaged).score.value == 1.0
    measured = length_weighting(averaged)
    assert measured.score.value < 0.99 and "ending at token 0" in measured.worst and "cosine with grad J" in measured.worst
    plugins.load_plugin(str(Path(__file__).resolve().parents[3] / "examples" / "algorithms" / "dr_grpo.py"))
    dr = length_weighting(context("dr_grpo", TINY, None))
    assert dr.score.value == 1.0 and dr.worst is None
