"""The published algorithms of ``examples/algorithms/`` (Dr. GRPO, DAPO, MT-GRPO, GiGPO), loaded as plugins:
their numbers against hand computations, and short tabular runs."""

from __future__ import annotations

import dataclasses

import math
from pathlib import Path

import pytest
import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.config import PRESETS, AlgorithmConfig, preset
from seeupo.core.losses import aggregate, policy_objective, row_coefficients
from seeupo.core.update import compute_advantages
from seeupo.tabular.problems import random_token_bandit, random_tree_mdp
from seeupo.tabular.train import RunConfig, run

ALGORITHMS = Path(__file__).resolve().parents[2] / "examples" / "algorithms"
DT = torch.float64
EPS = 1e-6  # the plugins' std epsilon, as the built-in GRPO's


def make_batch(*, traj_id, group_id, returns, tokens, turn=None, reward=None, valid=None, weight=None,
               instance=None) -> SampleBatch:
    """Rows with ``tokens[i]`` real tokens each (of ``max(tokens)`` slots); omitted fields: turn 0, valid, weight 1."""
    n = len(traj_id)
    length = max(max(tokens), 1)
    long = lambda x, default: torch.as_tensor(x if x is not None else [default] * n, dtype=torch.long)  # noqa: E731
    return SampleBatch(
        traj_id=long(traj_id, 0), group_id=long(group_id, 0), turn=long(turn, 0),
        logp_old=torch.zeros(n, length, dtype=DT),
        token_mask=torch.arange(length)[None, :] < torch.as_tensor(tokens)[:, None],
        valid=torch.as_tensor(valid if valid is not None else [True] * n),
        reward=torch.as_tensor(reward if reward is not None else [0.0] * n, dtype=DT),
        traj_return=torch.as_tensor(returns, dtype=DT),
        weight=torch.as_tensor(weight if weight is not None else [1.0] * n, dtype=DT),
        instance=long(instance, 0),
    )


def two_groups(returns, tokens=None, weight=None) -> SampleBatch:
    """Eight single-turn trajectories: 0-3 in group 0, 4-7 in group 1."""
    return make_batch(traj_id=list(range(8)), group_id=[0] * 4 + [1] * 4, returns=returns,
                      tokens=tokens or [1] * 8, weight=weight)


# ---- Dr. GRPO


def test_dr_grpo_aggregation_divides_token_sums_by_the_constant_budget(load):
    dr = load("dr_grpo")
    M = dr.MAX_TOKENS
    # instance 0: rows of 3 and 5 tokens; instance 1: a row of 2 tokens at weight 0.5 and a placeholder
    batch = make_batch(traj_id=[0, 1, 2, 3], group_id=[0, 0, 1, 1], returns=[0.0] * 4, tokens=[3, 5, 2, 0],
                       valid=[True, True, True, False], weight=[1.0, 1.0, 0.5, 0.5], instance=[0, 0, 1, 1])
    coef = row_coefficients(batch, "dr_grpo_token_sum")
    torch.testing.assert_close(coef, torch.tensor([1 / (2 * M), 1 / (2 * M), 0.5 / (0.5 * M), 0.0], dtype=DT))
    ones = torch.ones(4, 5, dtype=DT)
    expected = torch.tensor((3 + 5) / (2 * M) + 2 / M, dtype=DT)
    torch.testing.assert_close(aggregate(ones, batch, "dr_grpo_token_sum"), expected)
    # the same as the built-in sequence mean of token sums, divided by the constant
    torch.testing.assert_close(coef * M, row_coefficients(batch, "seq_mean_token_sum"))


def test_dr_grpo_config_has_no_std_scaling(load):
    load("dr_grpo")
    cfg = preset("dr_grpo")
    assert (cfg.name, cfg.preset, cfg.grae_scale, cfg.aggregation) == ("dr_grpo", "dr_grpo", "none", "dr_grpo_token_sum")
    batch = make_batch(traj_id=[0, 1, 2, 3], group_id=[0] * 4, returns=[1.0, 0.0, 0.0, 1.0], tokens=[1] * 4)
    torch.testing.assert_close(compute_advantages(batch, cfg)[:, 0], torch.tensor([0.5, -0.5, -0.5, 0.5], dtype=DT))


# ---- DAPO


def test_dapo_zeroes_degenerate_groups_and_rescales_by_the_informative_share(load):
    load("dapo")
    cfg = preset("dapo")
    settings = (cfg.advantage, cfg.clip_eps_low, cfg.clip_eps_high, cfg.aggregation, cfg.kl_coef)
    assert settings == ("dapo", 0.2, 0.28, "token_mean", 0.0)
    # group 0: returns 1, 0, 0, 0 (mean 1/4, unbiased std 1/2); group 1: all 1 (degenerate)
    adv = compute_advantages(two_groups([1.0, 0.0, 0.0, 0.0] + [1.0] * 4), cfg)[:, 0]
    grpo = torch.tensor([0.75, -0.25, -0.25, -0.25], dtype=DT) / (0.5 + EPS)
    torch.testing.assert_close(adv, torch.cat([grpo * 8 / 4, torch.zeros(4, dtype=DT)]))  # N / N_inf = 8 / 4
    # unequal lengths: group 0 rows of 2 tokens, group 1 rows of 1 token: N / N_inf = 12 / 8
    adv = compute_advantages(two_groups([1.0, 0.0, 0.0, 0.0] + [1.0] * 4, tokens=[2] * 4 + [1] * 4), cfg)
    torch.testing.assert_close(adv[:4, 0], grpo * 12 / 8)
    torch.testing.assert_close(adv[:4, 1], grpo * 12 / 8)
    assert not adv[4:].any()


def test_dapo_with_token_mean_is_the_objective_of_the_filtered_batch(load):
    load("dapo")
    cfg = preset("grpo", advantage="dapo", clip_eps_high=0.28)
    # informative group 0 (rows of 3, 1, 2, 2 tokens), degenerate group 1 (rows of 3 tokens)
    full = two_groups([1.0, 0.5, 0.0, 0.0] + [0.5] * 4, tokens=[3, 1, 2, 2] + [3] * 4)
    kept = full.select(torch.arange(4))
    logp = torch.randn(8, 3, dtype=DT, generator=torch.Generator().manual_seed(0)) * 0.3
    objectives, grads = [], []
    for batch, adv in ((full, compute_advantages(full, cfg)), (kept, compute_advantages(kept, preset("grpo")))):
        theta = logp[: batch.num_rows].clone().requires_grad_(True)
        obj, _ = policy_objective(
            theta, batch, adv, update="ppo", clip_eps_low=0.2, clip_eps_high=0.28, aggregation="token_mean"
        )
        obj.backward()
        objectives.append(obj.detach())
        grads.append(theta.grad * batch.token_mask)
    torch.testing.assert_close(objectives[0], objectives[1])
    torch.testing.assert_close(grads[0][:4], grads[1])
    assert not grads[0][4:].any()


def test_dapo_share_is_weighted_by_the_batch_weights(load):
    load("dapo")
    cfg = preset("grpo", advantage="dapo")
    # the exact-mode layout: one own trajectory per group (weight = its probability), group-mates at weight 0;
    # P(informative group) = 0.25, so the rescale is 4; the statistics count the weight-0 mates once each
    batch = two_groups([1.0, 0.0, 0.0, 0.0] + [1.0] * 4, weight=[0.25, 0, 0, 0, 0.75, 0, 0, 0])
    adv = compute_advantages(batch, cfg)[:, 0]
    torch.testing.assert_close(adv[0], torch.tensor(0.75 / (0.5 + EPS) * 4, dtype=DT))
    assert not adv[4:].any()


def test_dapo_group_stats_form_gives_the_same_advantages(load):
    dapo = load("dapo")
    returns = [1.0, 0.5, 0.0, 0.0] + [0.5] * 4
    batch = two_groups(returns, tokens=[2, 1, 1, 2] + [1] * 4)
    own_group = batch.with_updates(group_id=torch.arange(8))  # the tabular exact mode: one trajectory per "group"
    r = torch.tensor(returns, dtype=DT)
    stats = (torch.tensor([1.5] * 4 + [2.0] * 4, dtype=DT), torch.tensor([1.25] * 4 + [1.0] * 4, dtype=DT))
    assert torch.allclose(stats[0], torch.cat([r[:4].sum().repeat(4), r[4:].sum().repeat(4)]))
    from_stats = compute_advantages(own_group, preset("dapo"), group_stats=stats)
    torch.testing.assert_close(from_stats, compute_advantages(batch, preset("dapo")))
    with pytest.raises(ValueError, match="group_std"):  # without it the engine does not track the sum of squares
        compute_advantages(own_group, preset("grpo", advantage="dapo", grae_scale="none"), group_stats=stats)


def test_dapo_with_every_group_degenerate_is_zero(load):
    load("dapo")
    adv = compute_advantages(two_groups([0.0] * 4 + [1.0] * 4), preset("grpo", advantage="dapo"))
    assert torch.equal(adv, torch.zeros_like(adv))


# ---- MT-GRPO


def mt_batch() -> SampleBatch:
    """A group of 4 over 3 turns; trajectory 3 ends after turn 0 (placeholders at turns 1 and 2)."""
    rewards = [[1.0, 0.5, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    returns = [sum(r) for r in rewards]  # 2.5, 1, 1, 0
    return make_batch(
        traj_id=[i for i in range(4) for _ in range(3)], group_id=[0] * 12, turn=[0, 1, 2] * 4,
        returns=[returns[i] for i in range(4) for _ in range(3)], reward=[x for r in rewards for x in r],
        valid=[True] * 9 + [True, False, False], tokens=[1] * 12,
    )


def test_mt_grpo_assigns_turn_outcome_and_combined_advantages_as_its_authors(load):
    """The authors' ``_assign_advantages``: before the first tool result, outcome + turn; after it, outcome; an episode
    with no tool result (trajectory 3 stopped at turn 0), the combined advantage on every token."""
    mt = load("mt_grpo")
    adv = compute_advantages(mt_batch(), preset("mt_grpo")).reshape(4, 3)
    eps = mt.EPS
    # turn rewards: r_0 of the episodes that continued (0, 1, 2), 0 for the one that stopped: 1, 1, 0, 0
    z_turn = torch.tensor([0.5, 0.5, -0.5, -0.5], dtype=DT) / (math.sqrt(1 / 3) + eps)
    # outcomes R - R^T: 1.5, 0, 1, 0: mean 0.625, unbiased variance 1.6875 / 3 = 0.5625
    z_out = torch.tensor([0.875, -0.625, 0.375, -0.625], dtype=DT) / (0.75 + eps)
    # combined R: 2.5, 1, 1, 0: mean 1.125, unbiased variance 3.1875 / 3
    z_all = torch.tensor([1.375, -0.125, -0.125, -1.125], dtype=DT) / (math.sqrt(3.1875 / 3) + eps)
    torch.testing.assert_close(adv[:3, 0], z_out[:3] + mt.LAMBDA * z_turn[:3])
    torch.testing.assert_close(adv[:3, 1], z_out[:3])
    torch.testing.assert_close(adv[:3, 2], z_out[:3])
    torch.testing.assert_close(adv[3, 0], z_all[3])
    assert adv[3, 1] == 0 and adv[3, 2] == 0  # placeholders


def test_mt_grpo_on_a_bandit_is_grpo_with_grpos_epsilon(load, monkeypatch):
    """No turn rewards and no early ends: R^T = 0, R^O = R; only the epsilon differs (the authors' 1e-4)."""
    mt = load("mt_grpo")
    monkeypatch.setattr(mt, "EPS", 1e-6)
    batch = two_groups([1.0, 0.0, 0.5, 0.5, 0.0, 1.0, 1.0, 0.0])
    torch.testing.assert_close(compute_advantages(batch, preset("mt_grpo")), compute_advantages(batch, preset("grpo")))


# ---- tabular runs


def bandit():
    return random_token_bandit(3, 2, 2, 2, reward_levels=3, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("stem", ["dr_grpo", "dapo", "mt_grpo"])
def test_sampled_run_on_a_token_bandit_completes_and_improves(load, stem):
    load(stem)
    cfg = preset(stem)
    history = run(bandit(), cfg, RunConfig(mode="sampled", iterations=6, tasks=8, seed=0))
    assert history.J.shape == (7, 3) and bool(torch.isfinite(history.J).all())
    assert float(history.J[-1].mean()) > float(history.J[0].mean())  # Adam, lr 0.1: measured 0.573 -> 0.816 to 0.829


def test_mt_grpo_is_grpo_without_turn_rewards_and_differs_with_them(load, monkeypatch):
    monkeypatch.setattr(load("mt_grpo"), "EPS", 1e-6)  # GRPO's
    cfg = preset("mt_grpo")
    # SGD: Adam's first step from a fresh state is lr * sign(gradient), blind to most changes of scale
    sgd = RunConfig(mode="sampled", iterations=4, tasks=8, seed=0, optimizer="sgd", lr=1.0)
    # a token bandit pays only after the last turn: every turn term is 0
    assert torch.equal(run(bandit(), cfg, sgd).J, run(bandit(), preset("grpo"), sgd).J)
    tree = random_tree_mdp(3, (2, 2), (2, 1), reward_levels=3, generator=torch.Generator().manual_seed(0))
    j_mt, j_grpo = run(tree, cfg, sgd).J, run(tree, preset("grpo"), sgd).J
    assert bool(torch.isfinite(j_mt).all()) and not torch.allclose(j_mt, j_grpo)


def test_dapo_rescale_changes_an_sgd_run(load):
    load("dapo")
    cfg = preset("dapo")
    sgd = RunConfig(mode="sampled", iterations=4, tasks=8, seed=0, optimizer="sgd", lr=1.0)
    j_dapo, j_grpo = run(bandit(), cfg, sgd).J, run(bandit(), preset("grpo"), sgd).J
    assert not torch.allclose(j_dapo, j_grpo)  # some groups of 4 have equal returns, so N / N_inf > 1


def tree():
    """Two turns, per-turn rewards, episodes that may end after the first turn."""
    return random_tree_mdp(2, (2, 2), (2, 1), reward_levels=3, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("stem", ["dr_grpo", "dapo", "mt_grpo"])
def test_exact_run_completes_and_improves(load, stem):
    load(stem)
    cfg = preset(stem)
    history = run(bandit(), cfg, RunConfig(mode="exact", iterations=4, seed=0))
    assert bool(torch.isfinite(history.J).all()) and float(history.J[-1].mean()) > float(history.J[0].mean())


def test_dapo_closed_form_and_generic_exact_modes_agree(load):
    load("dapo")
    cfg = preset("dapo", epochs=3)
    runs = [run(tree(), cfg, RunConfig(mode="exact", iterations=2, exact_closed_form=c, init_scale=1.0, seed=3))
            for c in (True, False)]
    assert torch.allclose(runs[0].J, runs[1].J, atol=1e-10, rtol=0)
    assert bool((runs[0].J[-1] > runs[0].J[0] + 1e-3).all())  # the update moved J: the comparison can fail


def test_mt_grpo_exact_mode_is_grpo_without_turn_rewards(load, monkeypatch):
    monkeypatch.setattr(load("mt_grpo"), "EPS", 1e-6)  # GRPO's
    cfg = preset("mt_grpo")
    exact = RunConfig(mode="exact", iterations=2, init_scale=1.0, seed=3)
    assert torch.allclose(run(bandit(), cfg, exact).J, run(bandit(), preset("grpo"), exact).J, atol=1e-10, rtol=0)


def advantage_moments(batch: SampleBatch, adv: torch.Tensor) -> torch.Tensor:
    """Per group, ``sum_i w_i A_i,t 1(h_t = h, a_t = a)`` over its rows, for every (instance, turn, history, action)."""
    num_turns, num_hist = int(batch.turn.max()) + 1, int(batch.data["hist"].max()) + 1
    num_act = int(batch.data["action"].max()) + 1
    key = ((batch.instance * num_turns + batch.turn) * num_hist + batch.data["hist"]) * num_act + batch.data["action"]
    cell = batch.group_id * (batch.num_instances * num_turns * num_hist * num_act) + key
    row = adv[:, 0] * batch.weight * batch.valid
    out = torch.zeros(batch.num_groups * batch.num_instances * num_turns * num_hist * num_act, dtype=DT)
    return out.index_add_(0, cell, row).reshape(batch.num_groups, -1)


@pytest.mark.parametrize("stem", ["dapo", "mt_grpo"])
def test_generic_exact_advantages_are_the_expectation_of_sampled_ones(load, stem):
    """``E[A_t 1(h_t = h, a_t = a)]`` per trajectory: the exact batch against 6000 sampled groups per instance."""
    from seeupo.tabular.rollout import exact_advantages, sample_batch
    from seeupo.tabular.train import initial_policy

    load(stem)
    cfg = preset(stem, group_size=3)
    problem = tree()
    policy = initial_policy(problem, RunConfig(init_scale=1.0, seed=3))
    batch, adv = exact_advantages(problem, policy, cfg, closed_form=False)
    exact = advantage_moments(batch, adv).sum(0)  # own trajectories' weights sum to 1 per instance
    sampled = sample_batch(problem, policy, 6000, cfg.group_size, torch.Generator().manual_seed(0))
    per_group = advantage_moments(sampled, compute_advantages(sampled, cfg)) / cfg.group_size
    per_group = per_group.reshape(per_group.shape[0], problem.num_instances, -1)
    inst = torch.arange(per_group.shape[0]) // 6000  # groups are instance-major
    draws = per_group[torch.arange(per_group.shape[0]), inst]  # [groups, cells of the group's instance]
    mean = torch.stack([draws[inst == i].mean(0) for i in range(problem.num_instances)]).reshape(-1)
    stderr = torch.stack([draws[inst == i].std(0) / 6000**0.5 for i in range(problem.num_instances)]).reshape(-1)
    assert exact.abs().max() > 0.05  # the comparison can fail
    assert bool(((exact - mean).abs() <= 5 * stderr + 1e-9).all()), ((exact - mean).abs() / stderr).max()


# ---- GiGPO


def gigpo_batch() -> SampleBatch:
    """A group of 4 over 2 turns: all start at history 0; at turn 1 trajectories 0 and 1 share history 3,
    trajectory 2 is alone at history 0, and trajectory 3 has ended (its placeholder carries history 0 too)."""
    rewards = [[1.0, 1.0], [0.0, 0.5], [0.0, 1.0], [1.0, 0.0]]
    returns = [sum(r) for r in rewards]  # 2, 0.5, 1, 1
    batch = make_batch(
        traj_id=[i for i in range(4) for _ in range(2)], group_id=[0] * 8, turn=[0, 1] * 4,
        returns=[returns[i] for i in range(4) for _ in range(2)], reward=[x for r in rewards for x in r],
        valid=[True] * 7 + [False], tokens=[2] * 8,
    )
    hist = torch.tensor([0, 3, 0, 3, 0, 0, 0, 0])
    return batch.with_updates(data={"hist": hist, "action": torch.zeros(8, dtype=torch.long)})


def test_gigpo_adds_the_step_return_centred_within_its_anchor_state(load):
    """The authors' default, ``mode="mean_norm"``: both levels centred, neither divided by a std."""
    gi = load("gigpo")
    assert (gi.OMEGA, gi.GAMMA) == (1.0, 0.95)
    adv = compute_advantages(gigpo_batch(), preset("gigpo"))[:, 0].reshape(4, 2)
    a_e = torch.tensor([0.875, -0.625, -0.125, -0.125], dtype=DT)  # returns 2, 0.5, 1, 1 less their mean 1.125
    a_s0 = torch.tensor([0.85625, -0.61875, -0.14375, -0.09375], dtype=DT)  # to-go 1.95, 0.475, 0.95, 1 less 1.09375
    torch.testing.assert_close(adv[:, 0], a_e + a_s0)
    torch.testing.assert_close(adv[:2, 1], a_e[:2] + torch.tensor([0.25, -0.25], dtype=DT))  # to-go 1, 0.5 at history 3
    torch.testing.assert_close(adv[2, 1], a_e[2])
    assert adv[3, 1] == 0


def test_gigpo_std_adds_the_step_return_standardised_within_its_anchor_state(load):
    """``mode="mean_std_norm"`` (the ``gigpo_std`` preset): each level divided by its group's std plus EPS."""
    load("gigpo")
    adv = compute_advantages(gigpo_batch(), preset("gigpo_std"))
    assert torch.equal(adv[:, 0], adv[:, 1])  # every token of a row
    adv = adv[:, 0].reshape(4, 2)
    # episode: returns 2, 0.5, 1, 1: mean 1.125, unbiased variance 1.1875 / 3
    a_e = torch.tensor([0.875, -0.625, -0.125, -0.125], dtype=DT) / (math.sqrt(1.1875 / 3) + EPS)
    # turn 0, one step group (the initial state): to-go r_0 + 0.95 r_1 = 1.95, 0.475, 0.95, 1: mean 1.09375
    dev0 = [0.85625, -0.61875, -0.14375, -0.09375]
    a_s0 = torch.tensor(dev0, dtype=DT) / (math.sqrt(sum(d * d for d in dev0) / 3) + EPS)
    # turn 1, history 3: trajectories 0 and 1, to-go 1 and 0.5: mean 0.75, unbiased std sqrt(0.125)
    a_s1 = torch.tensor([0.25, -0.25], dtype=DT) / (math.sqrt(0.125) + EPS)
    torch.testing.assert_close(adv[:, 0], a_e + a_s0)
    torch.testing.assert_close(adv[:2, 1], a_e[:2] + a_s1)
    torch.testing.assert_close(adv[2, 1], a_e[2])  # alone at its state (the placeholder is not a member): no step term
    assert adv[3, 1] == 0  # placeholder


def test_gigpo_with_omega_0_is_its_episode_advantage(load, monkeypatch):
    gi = load("gigpo")
    batch = gigpo_batch()
    monkeypatch.setattr(gi, "OMEGA", 0.0)
    torch.testing.assert_close(compute_advantages(batch, preset("gigpo_std")), compute_advantages(batch, preset("grpo")))
    torch.testing.assert_close(compute_advantages(batch, preset("gigpo")),
                               compute_advantages(batch, preset("grpo", grae_scale="none")))


def test_gigpo_refuses_a_batch_without_states_and_is_not_for_language_models(load):
    from seeupo.core.registry import adv_estimator

    load("gigpo")
    entry = adv_estimator("gigpo")
    assert not entry.lm and entry.exact and entry.reads_histories
    batch = gigpo_batch().with_updates(data={})
    with pytest.raises(Exception, match=r"hist"):  # the boundary may wrap the ValueError; the message names the field
        compute_advantages(batch, preset("gigpo"))


def _exact_and_sampled(cfg: AlgorithmConfig, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The generic exact batch's advantage moments, and the mean and standard error of ``n`` sampled groups' per instance."""
    from seeupo.tabular.rollout import exact_group_batch, sample_batch
    from seeupo.tabular.train import initial_policy

    problem = tree()
    policy = initial_policy(problem, RunConfig(init_scale=1.0, seed=3))
    batch, own = exact_group_batch(problem, policy, cfg)
    exact = advantage_moments(batch.select(own), compute_advantages(batch, cfg)[own]).sum(0)
    sampled = sample_batch(problem, policy, n, cfg.group_size, torch.Generator().manual_seed(0))
    per_group = advantage_moments(sampled, compute_advantages(sampled, cfg)) / cfg.group_size
    per_group = per_group.reshape(per_group.shape[0], problem.num_instances, -1)
    inst = torch.arange(per_group.shape[0]) // n
    draws = per_group[torch.arange(per_group.shape[0]), inst]
    mean = torch.stack([draws[inst == i].mean(0) for i in range(problem.num_instances)]).reshape(-1)
    stderr = torch.stack([draws[inst == i].std(0) / n**0.5 for i in range(problem.num_instances)]).reshape(-1)
    return exact, mean, stderr


def test_gigpo_exact_batch_is_the_expectation_of_sampled_ones_and_needs_its_histories(load, monkeypatch):
    """With ``reads_histories`` exact mode tells group-mates apart by their paths: its advantage moments lie within
    5 standard errors of 30,000 sampled groups' in every cell. Classed by outcome alone (the flag off), some cell
    lies more than 8 standard errors away: the flag is what makes GiGPO's exact mode exact."""
    from seeupo.core.registry import ADV_ESTIMATORS

    load("gigpo")
    cfg = preset("gigpo", group_size=3)
    exact, mean, stderr = _exact_and_sampled(cfg, 30000)
    assert bool(((exact - mean).abs() <= 5 * stderr + 1e-9).all()), ((exact - mean).abs() / stderr.clamp_min(1e-12)).max()
    entry = ADV_ESTIMATORS.get("gigpo")
    monkeypatch.setitem(ADV_ESTIMATORS._entries, "gigpo", dataclasses.replace(entry, reads_histories=False))
    blind, _, _ = _exact_and_sampled(cfg, 1)
    assert bool(((blind - mean).abs() > 8 * stderr + 1e-9).any())


def test_an_estimator_reading_histories_without_saying_so_is_refused_for_exact_mode(load, monkeypatch):
    from seeupo.core.contract import READS_MATES, _first_failure
    from seeupo.core.registry import ADV_ESTIMATORS

    load("gigpo")
    cfg = preset("gigpo")
    entry = ADV_ESTIMATORS.get("gigpo")
    assert _first_failure(entry, cfg) is None
    assert _first_failure(dataclasses.replace(entry, reads_histories=False), cfg) == READS_MATES


def test_seeupo_check_gigpo_quick(tmp_path):
    """The quick check without the bridge (about 9 s on 2 cores): the sampled cells run, the exact parts say why not."""
    from seeupo import plugins
    from seeupo.cli import main

    plugins.forget_plugins()
    try:
        code = main(["check", "gigpo", "--plugin", str(ALGORITHMS / "gigpo.py"), "--quick", "--no-bridge",
                     "--no-progress", "--max-examples", "1", "--out", str(tmp_path / "check")])
    finally:
        plugins.forget_plugins()
    assert code == 0 and (tmp_path / "check" / "check.json").exists()


# ---- the command line of each docstring


SMALL = ["rollout.tasks_per_step=2", "algorithm.group_size=2", "env.options.warmup_steps=0", "env.options.num_tasks=4",
         "steps=1"]
FLAGS = {  # as the docstrings give them
    "dr_grpo": ["algorithm.preset=dr_grpo"],
    "dapo": ["algorithm.preset=dapo"],  # its own clip range and KL: a registered preset keeps its settings
    "mt_grpo": ["algorithm.preset=mt_grpo"],
}


@pytest.mark.parametrize("stem", sorted(FLAGS))
def test_seeupo_train_runs_with_the_plugin(load, tmp_path, stem):
    import yaml

    from seeupo.cli import main

    load(stem)  # the fixture unregisters it afterwards; the command line finds it loaded
    plugin = str(ALGORITHMS / f"{stem}.py")
    sets = [a for s in SMALL + FLAGS[stem] for a in ("--set", s)]
    assert main(["train", "--plugin", plugin, "--out", str(tmp_path / "run"), "--no-progress", *sets]) == 0
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["algorithm"]
    registered = PRESETS[stem]
    assert (saved["preset"], saved["name"], saved["advantage"], saved["aggregation"], saved["grae_scale"]) == (
        stem, stem, registered.advantage, registered.aggregation, registered.grae_scale)
    # the preset's own hyperparameters (DAPO's clip-higher, no KL) survive the run config
    assert (saved["clip_eps_high"], saved["kl_coef"]) == (registered.clip_eps_high, registered.kl_coef)


# ---- the committed checks (paper_repro/algorithms)

CHECKS = Path(__file__).resolve().parents[2] / "paper_repro" / "algorithms"


@pytest.mark.parametrize("path", sorted(CHECKS.glob("*/counterexamples/*.json")), ids=lambda p: p.name)
def test_committed_counterexamples_replay_with_their_plugin(load, path):
    from seeupo.experiments.counterexamples import Counterexample, replay

    name = path.parent.parent.name
    if (ALGORITHMS / f"{name}.py").exists():  # a built-in algorithm's check has no plugin
        load(name)  # the plugin of the same name, as it is now: the recorded hash must match
    example = Counterexample.load(path)
    result = replay(example)
    assert result.reproduces, result
    assert example.largest_decrease > 1e-7


def test_every_committed_check_has_its_report():
    from seeupo.experiments.scorecard.catalogue import CATALOGUE

    names = sorted(p.name for p in CHECKS.iterdir() if p.is_dir())
    # every example plugin's, and every catalogue algorithm's (built in or not)
    assert names == sorted({p.stem for p in ALGORITHMS.glob("*.py")} | {e.name for e in CATALOGUE})
    for name in names:
        import json

        report = json.loads((CHECKS / name / "check.json").read_text())
        assert report["algorithm"] == name and report["monotonicity"]["measured"] in ("monotone", "J decreased")
        assert (CHECKS / name / "check.md").exists() and (CHECKS / name / "check.png").exists()


def test_gigpo_std_downhill_turn_comes_from_its_discount(load, monkeypatch):
    """The worst per-turn credit case of GiGPO's card when its std normalisation was always on (before issue 41;
    ``tests/examples/data/gigpo_std_credit_case.json``): with ``mode="mean_std_norm"`` (``gigpo_std``) turn 0 points
    downhill with GAMMA = 0.95 (the authors' scripts') and is unbiased per turn with GAMMA = 1: the discounted step
    return-to-go, scaled by its group's std, turns turn 0's update where J barely depends on it. The authors' default
    (``gigpo``, no std) is unbiased per turn on the same case."""
    from seeupo.experiments.gradient_check import load_case
    from seeupo.tabular.gradient import gradient_directions
    from seeupo.tabular.policies import TabularPolicy

    gigpo = load("gigpo")
    case = load_case(Path(__file__).with_name("data") / "gigpo_std_credit_case.json")

    def direction(name: str):
        policy = TabularPolicy(case.problem)
        policy.set_action_probs(case.start)
        return gradient_directions(case.problem, policy, preset(name, group_size=case.algorithm.group_size))[0]

    assert gigpo.GAMMA == 0.95
    assert direction("gigpo_std").verdict == "points downhill" and direction("gigpo_std").downhill_turn == 0
    assert direction("gigpo").verdict != "points downhill"
    monkeypatch.setattr(gigpo, "GAMMA", 1.0)
    assert direction("gigpo_std").verdict == "unbiased per turn up to a positive scale"


# ---- Clip-Cov and KL-Cov (Cui et al. 2025), by hand

ADV4 = torch.tensor([[1.0], [-1.0], [2.0], [0.0]], dtype=DT)
LOGP4 = torch.tensor([[-1.0], [-2.0], [-0.5], [-3.0]], dtype=DT)
# centred: A - 1/2 = (1/2, -3/2, 3/2, -1/2); log pi + 13/8 = (5/8, -3/8, 9/8, -11/8); their products
COV4 = [5 / 16, 9 / 16, 27 / 16, 11 / 16]


def _four_tokens(**changes):
    return make_batch(traj_id=[0, 1, 2, 3], group_id=[0] * 4, returns=[0.0] * 4, tokens=[1] * 4).with_updates(**changes)


def test_the_token_covariance_by_hand_and_weighted_as_the_exact_mode_weighs():
    from seeupo.core.losses import token_covariance

    torch.testing.assert_close(token_covariance(LOGP4, _four_tokens(), ADV4)[:, 0], torch.tensor(COV4, dtype=DT))
    heavy = _four_tokens(weight=torch.tensor([10.0, 1.0, 1.0, 1.0], dtype=DT))  # token 0 moves the centre
    mean_a, mean_l = (10 - 1 + 2 + 0) / 13, (-10 - 2 - 0.5 - 3) / 13
    torch.testing.assert_close(token_covariance(LOGP4, heavy, ADV4)[:, 0],
                               (ADV4[:, 0] - mean_a) * (LOGP4[:, 0] - mean_l))


def test_kl_cov_penalises_the_token_of_largest_covariance_by_its_absolute_log_ratio(load):
    kl_cov = load("kl_cov")
    old = LOGP4 - 0.1  # every ratio e^0.1; int(2e-4 * 4) = 0 tokens, so max(., 1) = 1: token 2 (cov 27/16)
    obj, clipped = kl_cov.kl_cov(LOGP4, _four_tokens(logp_old=old), ADV4, preset("grpo"))
    expected = math.exp(0.1) * ADV4[:, 0]
    expected[2] -= kl_cov.KL_COV_COEF * 0.1
    torch.testing.assert_close(obj[:, 0], expected)
    assert clipped is None


def test_clip_cov_removes_the_expected_share_of_mid_covariance_tokens(load):
    """At ratio 1 no clip is active; the candidates are the tokens with 1 < cov < 5: token 2 alone (27/16), and the
    one token verl draws from one candidate is it, so its term is 0 and the others are the plain A."""
    clip_cov = load("clip_cov")
    obj, _ = clip_cov.clip_cov(LOGP4, _four_tokens(logp_old=LOGP4.clone()), ADV4, preset("grpo"))
    torch.testing.assert_close(obj[:, 0], torch.tensor([1.0, -1.0, 0.0, 0.0], dtype=DT))
