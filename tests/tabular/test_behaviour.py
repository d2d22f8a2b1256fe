"""Behaviour policies and rollout corrections in the exact engine, against hand computations in fractions.

One turn, three answers paying R = (1, 0, 1/2); the policy pi = (1/2, 1/4, 1/4), so J = 5/8 and A = (3/8, -5/8, -1/8);
the rows are drawn from mu = (1/4, 1/4, 1/2). With the exact advantage and one plain policy-gradient step the
expected update on the logits is sum_a mu(a) w(a) A(a) (e_a - pi), for the correction's weight w(a): the policy
gradient sum_a pi(a) A(a) (e_a - pi) exactly when w = pi / mu.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction as Fr

import pytest
import torch

from seeupo.core.config import preset
from seeupo.tabular.behaviour import Rollouts, Sampler, behaviour_policy, sampled_conditional
from seeupo.tabular.gradient import policy_gradient, update_direction
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import random_token_bandit, sequential_bandit

DT = torch.float64
PI, MU, R = (Fr(1, 2), Fr(1, 4), Fr(1, 4)), (Fr(1, 4), Fr(1, 4), Fr(1, 2)), (Fr(1), Fr(0), Fr(1, 2))


def _expected(weights: tuple[Fr, Fr, Fr]) -> list[Fr]:
    """sum_a mu(a) w(a) A(a) (e_a - pi), on the three logits."""
    J = sum(p * r for p, r in zip(PI, R))
    A = [r - J for r in R]
    return [sum(MU[a] * weights[a] * A[a] * ((1 if a == b else 0) - PI[b]) for a in range(3)) for b in range(3)]


def _setting():
    problem = sequential_bandit(torch.ones(1, 1), (3,), torch.tensor([[[float(r) for r in R]]], dtype=DT))
    policy, mu = TabularPolicy(problem), TabularPolicy(problem)
    policy.set_action_probs([torch.tensor([[[float(p) for p in PI]]], dtype=DT)])
    mu.set_action_probs([torch.tensor([[[float(p) for p in MU]]], dtype=DT)])
    return problem, policy, mu


def _step(problem, policy, mu, **correction):
    cfg = preset("rloo", advantage="oracle", **correction)
    (step,), _ = update_direction(problem, policy, cfg, behaviour=mu)
    return step[0]


@pytest.mark.parametrize("correction, weights", [
    (dict(correction="none"), (Fr(1), Fr(1), Fr(1))),
    (dict(correction="sequence_is", correction_cap=10.0), (Fr(2), Fr(1), Fr(1, 2))),
    (dict(correction="token_is", correction_cap=1.5), (Fr(3, 2), Fr(1), Fr(1, 2))),
    (dict(correction="token_mask", correction_floor=0.75, correction_cap=1.5), (Fr(0), Fr(1), Fr(0))),
    (dict(correction="decoupled", correction_cap=1.5), (Fr(0), Fr(1), Fr(1, 2))),
])
def test_the_expected_off_policy_update_is_the_hand_computed_one(correction, weights):
    problem, policy, mu = _setting()
    step = _step(problem, policy, mu, **correction)
    expected = torch.tensor([float(x) for x in _expected(weights)], dtype=DT)
    torch.testing.assert_close(step, expected, rtol=0, atol=1e-12)


def test_no_correction_is_biased_and_untruncated_sequence_is_is_the_policy_gradient():
    problem, policy, mu = _setting()
    true = policy_gradient(problem, policy)[0][0]
    torch.testing.assert_close(true, torch.tensor([float(x) for x in _expected((Fr(2), Fr(1), Fr(1, 2)))], dtype=DT),
                               rtol=0, atol=1e-12)
    biased = _step(problem, policy, mu, correction="none")  # (5, -4, -1) / 32 against (6, -5, -1) / 32: turned
    assert float((biased / biased.norm() - true / true.norm()).abs().max()) > 1e-2
    truncated = _step(problem, policy, mu, correction="token_is", correction_cap=1.5)
    assert float((truncated - true).abs().max()) > 1e-3  # TIS is biased where it truncates (pi / mu = 2 at answer 0)


def test_over_several_tokens_only_the_sequence_weight_is_unbiased():
    """Answers of 2 tokens of 3, mu a random policy: the trajectory's ratio gives grad J exactly; the per-token ratio,
    untruncated, reweights each token's choice but not the prefixes that led to it, and is biased."""
    problem = random_token_bandit(2, 1, 3, 2, reward_levels=3, generator=torch.Generator().manual_seed(0))
    policy = TabularPolicy(problem, init_scale=1.0, generator=torch.Generator().manual_seed(1))
    mu = TabularPolicy(problem, init_scale=1.0, generator=torch.Generator().manual_seed(2))
    cfg = preset("rloo", advantage="oracle", correction_cap=1e6, aggregation="seq_mean_token_sum")  # a token sum per answer
    true = torch.cat(policy_gradient(problem, policy), 1)
    scale = None
    for correction, unbiased in (("sequence_is", True), ("token_is", False), ("none", False)):
        (step,), _ = update_direction(problem, policy, cfg.replace(correction=correction), behaviour=mu)
        gap = float((step - true).abs().max())
        assert (gap < 1e-12) == unbiased, (correction, gap)
        scale = scale or float(true.abs().max())
        assert unbiased or gap > 1e-3 * scale


def test_on_policy_every_correction_is_the_plain_update():
    problem, policy, _ = _setting()
    plain = _step(problem, policy, None, correction="none")
    for name in ("token_is", "sequence_is", "geometric_is", "token_mask", "sequence_mask", "decoupled", "m2po"):
        torch.testing.assert_close(_step(problem, policy, policy, correction=name), plain, rtol=0, atol=1e-12)


def test_an_engine_s_sampler_by_hand():
    """probs (1/2, 3/10, 1/5): top-p 0.7 keeps the tokens whose more likely tokens hold < 0.7 (the first two,
    renormalised to 5/8, 3/8); top-k 1 keeps the first; temperature 2 gives probabilities proportional to sqrt(p)."""
    log_p = torch.tensor([0.5, 0.3, 0.2], dtype=DT).log()
    top_p = sampled_conditional(log_p, Sampler(top_p=0.7)).exp()
    torch.testing.assert_close(top_p, torch.tensor([5 / 8, 3 / 8, 0.0], dtype=DT), rtol=0, atol=1e-12)
    torch.testing.assert_close(sampled_conditional(log_p, Sampler(top_k=1)).exp(), torch.tensor([1.0, 0, 0], dtype=DT))
    root = torch.tensor([0.5, 0.3, 0.2], dtype=DT).sqrt()
    torch.testing.assert_close(sampled_conditional(log_p, Sampler(temperature=2.0)).exp(), root / root.sum())
    with pytest.raises(ValueError, match="top_p must be in"):
        Sampler(top_p=0.0)


def test_a_behaviour_policy_is_the_policy_drawn_through_the_sampler_token_by_token():
    problem = random_token_bandit(1, 1, 3, 2, generator=torch.Generator().manual_seed(0))
    policy = TabularPolicy(problem, init_scale=1.0, generator=torch.Generator().manual_seed(3))
    mu = behaviour_policy(problem, policy, Sampler(top_k=2))
    p, q = policy.action_probs()[0][0, 0], mu.action_probs()[0][0, 0]
    assert int((q > 0).sum()) == 4 and math.isclose(float(q.sum()), 1.0, abs_tol=1e-12)  # 2 x 2 of 9 answers
    kept = q > 0
    assert bool((p[kept] > 0).all()) and not any(p.requires_grad for p in mu.parameters())
    same = behaviour_policy(problem, policy, Sampler())
    torch.testing.assert_close(same.action_probs()[0], policy.action_probs()[0].detach(), rtol=0, atol=1e-12)


def test_an_admission_rule_that_drops_long_episodes_by_hand():
    """stop_or_continue(3/5, 3/10, (1/2, 0)) at the uniform policy: paths stop (1/2), continue-a (1/4), continue-b
    (1/4); A_0 = (1/40, -1/40), A_1 = (1/4, -1/4) after continuing. All admitted (max_age 2), the exact advantage's
    step is grad J over the expected token count 3/2: turn 0 (1/120, -1/120), turn 1 (1/24, -1/24). Admitting only
    1-turn episodes (max_age 1) keeps the stop path alone, weight 1: turn 0 (1/80, -1/80), turn 1 nothing."""
    from seeupo.tabular.behaviour import admitted_batch, admitted_direction
    from seeupo.tabular.problems import stop_or_continue

    problem = stop_or_continue(0.6, 0.3, (0.5, 0.0))
    policy = TabularPolicy(problem)
    cfg = preset("rloo", advantage="oracle")
    every = admitted_direction(problem, policy, cfg, None, max_age=2)
    torch.testing.assert_close(every[0][0], torch.tensor([1 / 120, -1 / 120], dtype=DT), rtol=0, atol=1e-12)
    torch.testing.assert_close(every[1][0][2:], torch.tensor([1 / 24, -1 / 24], dtype=DT), rtol=0, atol=1e-12)
    for a, b in zip(every, update_direction(problem, policy, cfg)[0]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    short = admitted_direction(problem, policy, cfg, None, max_age=1)
    torch.testing.assert_close(short[0][0], torch.tensor([1 / 80, -1 / 80], dtype=DT), rtol=0, atol=1e-12)
    assert float(short[1].abs().max()) == 0.0
    batch, _ = admitted_batch(problem, policy, cfg, None, max_age=1)
    assert float(batch.weight[batch.turn == 0].sum()) == pytest.approx(1.0) and batch.logp_behaviour is None


def test_a_stale_stream_draws_each_episode_from_the_policy_its_length_ago():
    """past = [older, current]: a 1-turn episode is read from the current policy, a 2-turn one from the older."""
    from seeupo.tabular.behaviour import admitted_batch
    from seeupo.tabular.problems import stop_or_continue

    problem = stop_or_continue(0.6, 0.3, (0.5, 0.0))
    policy, older = TabularPolicy(problem), TabularPolicy(problem)
    older.set_action_probs([torch.tensor([[[0.2, 0.8]]], dtype=DT), torch.tensor([[[0.5, 0.5], [0.9, 0.1]]], dtype=DT)])
    batch, _ = admitted_batch(problem, policy, preset("rloo", advantage="oracle"), [older, policy], max_age=2)
    turns = torch.zeros(batch.num_trajectories, dtype=torch.long).index_add_(0, batch.traj_id, batch.valid.long())
    long_rows = turns[batch.traj_id] == 2
    torch.testing.assert_close(batch.logp_behaviour[long_rows], older.token_logps(batch)[long_rows] * batch.token_mask[long_rows])
    torch.testing.assert_close(batch.logp_behaviour[~long_rows], batch.logp_old[~long_rows])
    # weights: stop 1/2 (current; the engine keeps a path that ended early as its leaves, two of 1/4), continue-a
    # 0.8 * 0.9 and continue-b 0.8 * 0.1 (older), renormalised over 1.3
    first = batch.weight[batch.turn == 0]
    assert sorted(first.tolist()) == pytest.approx(sorted([0.25 / 1.3, 0.25 / 1.3, 0.72 / 1.3, 0.08 / 1.3]))


def test_a_group_estimator_s_groups_are_admitted_whole_and_as_old_as_their_longest_episode():
    """GRPO (G = 2, its group statistics enumerated) on stop_or_continue(1/5, 3/10, (1/2, 0)). All admitted and fresh:
    the expected step of the on-policy update. Groups of 1-turn episodes only (max_age 1): both stop, the same reward,
    advantage 0: the update is zero, though the on-policy one is not (the stale-group rule keeps only what it cannot
    learn from here). Stale (past = [older, current]): a group with a 2-turn episode is drawn by the older policy, a
    group of two stops by the current; weights by hand (classes stop 1/2, a 1/4, b 1/4 now; 0.2, 0.72, 0.08 before)."""
    from seeupo.tabular.behaviour import admitted_batch, admitted_direction
    from seeupo.tabular.problems import stop_or_continue

    problem = stop_or_continue(0.2, 0.3, (0.5, 0.0))
    policy, older = TabularPolicy(problem), TabularPolicy(problem)
    older.set_action_probs([torch.tensor([[[0.2, 0.8]]], dtype=DT), torch.tensor([[[0.5, 0.5], [0.9, 0.1]]], dtype=DT)])
    cfg = preset("grpo", group_size=2)
    every = admitted_direction(problem, policy, cfg, None, max_age=2)
    on_policy = update_direction(problem, policy, cfg)[0]
    assert float(torch.cat(on_policy, 1).abs().max()) > 1e-3
    for a, b in zip(every, on_policy):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    short = admitted_direction(problem, policy, cfg, None, max_age=1)
    assert all(float(t.abs().max()) == 0.0 for t in short)

    batch, _ = admitted_batch(problem, policy, cfg, [older, policy], max_age=2)
    stop_leaf = [0.25 * 0.5, 0.1 * 0.72, 0.1 * 0.08]  # with a stop (now), with a (before), with b (before)
    want = sorted(stop_leaf * 2 + [0.72 * 0.2, 0.72 * 0.72, 0.72 * 0.08, 0.08 * 0.2, 0.08 * 0.72, 0.08 * 0.08])
    first = batch.weight[batch.turn == 0]
    assert sorted(first.tolist()) == pytest.approx([w / 1.21 for w in want])
    turns = torch.zeros(batch.num_trajectories, dtype=torch.long).index_add_(0, batch.traj_id, batch.valid.long())
    fresh_rows = (turns[batch.traj_id] == 1) & torch.isclose(batch.weight, torch.tensor(0.125 / 1.21, dtype=DT))
    assert bool(fresh_rows.any())
    torch.testing.assert_close(batch.logp_behaviour[fresh_rows], batch.logp_old[fresh_rows])
    long_rows = turns[batch.traj_id] == 2
    torch.testing.assert_close(batch.logp_behaviour[long_rows], older.token_logps(batch)[long_rows] * batch.token_mask[long_rows])


@pytest.mark.parametrize("rollouts", [Rollouts(), Rollouts(2), Rollouts(0, Sampler(top_p=0.9)),
                                      Rollouts(1, Sampler(temperature=0.7, noise=0.3, seed=5))])
def test_a_run_config_draws_its_rows_as_the_rollouts_setting_says(rollouts):
    from seeupo.tabular.train import RunConfig

    run = RunConfig(**rollouts.run_fields())  # type: ignore[arg-type]
    assert (run.sampler is None) == rollouts.sampler.on_policy  # an on-policy engine is written as no engine
    assert Rollouts.of_run(run) == rollouts
    assert Rollouts.from_dict(dataclasses.asdict(rollouts)) == rollouts
