"""seeupo's estimators and losses exported into verl 0.9.1's registries, called the way verl calls them.

Marked ``verl``: ``make test`` deselects these tests, ``make test-verl`` builds an environment
with verl and runs them (``pytest -m verl -rs``); without verl they skip with the reason.
Every exported entry, fetched back from verl's registry and called with verl's keyword
arguments on random batches (random groups, uids in random order, random masks), must equal
(a) the seeupo function on a SampleBatch built here, and (b) verl's own built-in of the same
meaning where there is one.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.verl

from seeupo.core.batch import SampleBatch
from seeupo.core.config import AlgorithmConfig, preset
from seeupo.core.losses import policy_objective
from seeupo.core.registry import ADV_ESTIMATORS, POLICY_LOSSES, register_adv_est, register_policy_loss
from seeupo.core.update import compute_advantages
from seeupo.integrations.layout import ROW_LAYOUTS, VERL_LOSS_AGG_MODES, verl_loss_agg_mode
from seeupo.validation.errors import InputError

try:
    from verl.trainer.ppo import core_algos
    from verl.workers.config import ActorConfig

    from seeupo.integrations.verl import LOSS_AGG_MODES, register_in_verl, verl_policy_loss
except ImportError:  # `make test` deselects this module; elsewhere each test skips with the reason
    core_algos = None

SEEDS = range(6)
# absolute tolerance of a comparison in each dtype (values are O(1)); float32: seeupo's group std comes
# from the group's sum and sum of squares, which cancel more than torch.std's two passes (measured: 2e-6)
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}
DTYPES = (torch.float32, torch.float64)
# verl's loss_agg_mode names that have a seeupo aggregation (the same name with "_" for "-")
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


@pytest.fixture(autouse=True)
def _float64_default():
    """Overrides the suite's float64 default dtype: verl runs under torch's float32 default (``.float()`` masks)."""
    yield


@pytest.fixture(autouse=True)
def _clean_verl_registries():
    """Each test starts from verl's own registries: what a test exports is removed after it."""
    if core_algos is None:
        pytest.skip("verl is not installed (make test-verl builds an environment with verl==0.9.1)")
    adv, loss = dict(core_algos.ADV_ESTIMATOR_REGISTRY), dict(core_algos.POLICY_LOSS_REGISTRY)
    yield
    for registry, before in ((core_algos.ADV_ESTIMATOR_REGISTRY, adv), (core_algos.POLICY_LOSS_REGISTRY, loss)):
        registry.clear()
        registry.update(before)


def random_rollouts(seed: int, dtype: torch.dtype, *, binary: bool = False):
    """verl-shaped rollouts: ``n_groups`` prompts x ``G`` responses, uids shuffled, random masks and rewards.

    Returns ``(token_level_rewards [n, L], response_mask [n, L] int, uids (object array), G)``.
    Some rows have no response token at all; rewards sit on masked and unmasked tokens alike
    (verl sums every token's reward).
    """
    g = torch.Generator().manual_seed(seed)
    size = int(torch.randint(2, 6, (), generator=g))
    n_groups = int(torch.randint(1, 6, (), generator=g))
    length = int(torch.randint(1, 9, (), generator=g))
    n = size * n_groups
    uids = np.array([f"prompt-{seed}-{k}" for k in range(n_groups) for _ in range(size)], dtype=object)
    uids = uids[torch.randperm(n, generator=g).numpy()]
    mask = (torch.rand(n, length, generator=g) < 0.7).to(torch.int64)
    mask[torch.rand(n, generator=g) < 0.15] = 0
    if binary:  # an outcome reward on one token: groups with equal rewards occur
        rewards = torch.zeros(n, length, dtype=dtype)
        rewards[torch.arange(n), torch.randint(0, length, (n,), generator=g)] = torch.randint(0, 2, (n,), generator=g).to(dtype)
    else:
        rewards = torch.randn(n, length, generator=g, dtype=torch.float64).to(dtype)
    return rewards, mask, uids, size


def seeupo_advantages(rewards, mask, uids, size, cfg: AlgorithmConfig, seed: int):
    """Our estimator called directly, on a SampleBatch whose rows are a permutation of verl's."""
    n = rewards.shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1000 + seed))
    names = sorted(set(uids.tolist()), reverse=True)  # group ids in another order than the adapter's
    group_id = torch.tensor([names.index(u) for u in uids[perm.numpy()]])
    returns = rewards[perm].sum(-1)
    zeros = torch.zeros(n, dtype=torch.long)
    batch = SampleBatch(
        traj_id=torch.arange(n), group_id=group_id, turn=zeros, logp_old=torch.zeros_like(rewards),
        token_mask=mask[perm].bool(), valid=torch.ones(n, dtype=torch.bool), reward=returns, traj_return=returns,
        weight=torch.ones_like(returns), instance=zeros,
    )
    adv = compute_advantages(batch, cfg.replace(group_size=size))
    out = torch.empty_like(adv)
    out[perm] = adv
    return out


def assert_close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    assert a.dtype == b.dtype == dtype and a.shape == b.shape
    assert torch.allclose(a, b, rtol=0.0, atol=TOL[dtype]), float((a - b).abs().max())


# ---- advantage estimators

# (our grae options, verl's built-in estimator and its keyword arguments) of the same meaning
GRAE_VS_VERL = [
    (dict(grae_center="mean", grae_scale="group_std"), "grpo", {}),
    (dict(grae_center="mean", grae_scale="none"), "grpo", {"norm_adv_by_std_in_grpo": False}),
    (dict(grae_center="loo", grae_scale="none"), "rloo", {}),
]


def test_reinforce_pp_through_verl_is_verls_reinforce_plus_plus_but_for_bessel():
    """REINFORCE++ (outcome rewards on the last response token, gamma 1): seeupo's estimator through the adapter against
    verl's own ``reinforce_plus_plus``. Both whiten the return over every response token of the batch; verl divides
    by the Bessel-corrected variance (``masked_var``, unbiased), seeupo by the population one (OpenRLHF's
    ``var.clamp(min=1e-8).rsqrt()``): verl's times sqrt(N / (N - 1)) is seeupo's, N the response tokens."""
    from types import SimpleNamespace

    register_in_verl(AlgorithmConfig(advantage="reinforce_pp"), adv_estimators=["reinforce_pp"])
    ours_fn = core_algos.get_adv_estimator_fn("reinforce_pp")
    verl_fn = core_algos.get_adv_estimator_fn("reinforce_plus_plus")
    compared = 0
    for seed in SEEDS:
        rewards, mask, uids, _ = random_rollouts(seed, torch.float64, binary=True)
        outcome = torch.zeros_like(rewards)
        has = mask.sum(1) > 0
        last = (mask * torch.arange(1, mask.shape[1] + 1)).argmax(1)
        outcome[has, last[has]] = rewards.sum(1)[has]
        n = int(mask.sum())
        if n < 2:
            continue
        ours, _ = ours_fn(token_level_rewards=outcome, response_mask=mask, config=None, index=uids)
        theirs, _ = verl_fn(token_level_rewards=outcome, response_mask=mask, config=SimpleNamespace(gamma=1.0))
        torch.testing.assert_close(ours * mask, theirs * mask * math.sqrt(n / (n - 1)), rtol=1e-6, atol=1e-6)
        compared += 1
    assert compared >= 3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("options, verl_name, verl_kwargs", GRAE_VS_VERL)
@pytest.mark.parametrize("binary", [False, True])
def test_grae_through_verl_equals_seeupo_and_verl_builtin(options, verl_name, verl_kwargs, dtype, binary):
    cfg = AlgorithmConfig(**options)
    exported = register_in_verl(cfg)
    assert exported.adv_estimators == {"grae": "grae", "reinforce_pp": "reinforce_pp"}  # every built-in that runs in verl
    fn = core_algos.get_adv_estimator_fn("grae")
    for seed in SEEDS:
        rewards, mask, uids, size = random_rollouts(seed, dtype, binary=binary)
        # the keyword arguments of verl's ray_trainer.compute_advantage for a registered estimator
        adv, returns = fn(token_level_rewards=rewards, response_mask=mask, config=None, index=uids)
        assert_close(adv, seeupo_advantages(rewards, mask, uids, size, cfg, seed), dtype)
        theirs, _ = core_algos.get_adv_estimator_fn(verl_name)(
            token_level_rewards=rewards.clone(), response_mask=mask, index=uids, **verl_kwargs
        )
        assert_close(adv, theirs.to(dtype), dtype)
        assert torch.equal(returns, adv)
        assert bool((adv[mask == 0] == 0).all())


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_zscore_grae_through_verl_equals_seeupo(dtype):
    # SeeUPO's estimator (no verl built-in: verl's reinforce_plus_plus_baseline whitens over tokens)
    cfg = preset("seeupo").replace(schedule="simultaneous", grae_clamp=1.5)
    register_in_verl(cfg, adv_estimators=["grae"], policy_losses=[])
    for seed in SEEDS:
        rewards, mask, uids, size = random_rollouts(seed, dtype)
        adv, _ = core_algos.get_adv_estimator_fn("grae")(token_level_rewards=rewards, response_mask=mask, index=uids)
        assert_close(adv, seeupo_advantages(rewards, mask, uids, size, cfg, seed), dtype)
        assert float(adv.abs().max()) <= 1.5


def test_plugin_estimator_appears_in_verl():
    name = "median_baseline_verl_test"

    @register_adv_est(name, needs_group_stats=True, exact=False)
    def median_baseline(batch, cfg, *, critic_values=None, oracle=None, group_stats=None):
        """Return minus the group's median return, on every token."""
        n_groups = int(batch.group_id.max()) + 1
        medians = torch.stack([batch.traj_return[batch.group_id == k].median() for k in range(n_groups)])
        return (batch.traj_return - medians[batch.group_id])[:, None] * batch.token_mask

    try:
        exported = register_in_verl()
        assert exported.adv_estimators[name] == name
        fn = core_algos.get_adv_estimator_fn(name)
        for seed in SEEDS:
            rewards, mask, uids, size = random_rollouts(seed, torch.float64)
            adv, _ = fn(token_level_rewards=rewards, response_mask=mask, index=uids, config=None)
            assert_close(adv, seeupo_advantages(rewards, mask, uids, size, AlgorithmConfig(advantage=name), seed), torch.float64)
            # by hand: the median of each uid's returns
            returns = rewards.sum(-1)
            for uid in set(uids.tolist()):
                rows = torch.from_numpy(uids == uid)
                want = (returns[rows] - returns[rows].median())[:, None] * mask[rows]
                assert torch.allclose(adv[rows], want.to(adv.dtype), rtol=0, atol=1e-12)
    finally:
        ADV_ESTIMATORS.remove(name)


def test_estimators_that_cannot_run_in_verl_are_skipped_or_refused():
    exported = register_in_verl()
    assert set(exported.skipped) == {"advantage estimator 'oracle'", "advantage estimator 'gae'"}
    assert "critic" in exported.skipped["advantage estimator 'gae'"]
    assert "oracle" not in core_algos.ADV_ESTIMATOR_REGISTRY
    assert core_algos.get_adv_estimator_fn("gae") is core_algos.compute_gae_advantage_return  # verl's own, untouched
    before = dict(core_algos.ADV_ESTIMATOR_REGISTRY), dict(core_algos.POLICY_LOSS_REGISTRY)
    with pytest.raises(ValueError, match="'gae' cannot be exported to verl: it needs critic values"):
        register_in_verl(adv_estimators=["grae", "gae"], policy_losses=["ppo"], prefix="x_")
    assert (core_algos.ADV_ESTIMATOR_REGISTRY, core_algos.POLICY_LOSS_REGISTRY) == before  # nothing half-exported
    with pytest.raises(ValueError, match="not a registered advantage estimator"):
        register_in_verl(adv_estimators=["no_such_estimator"])
    with pytest.raises(ValueError, match="schedule='sequential' is not a loss verl's actor can run"):
        register_in_verl(preset("seeupo"))


def test_unequal_groups_and_missing_uids_are_one_line_errors():
    register_in_verl(adv_estimators=["grae"], policy_losses=[])
    fn = core_algos.get_adv_estimator_fn("grae")
    rewards, mask = torch.randn(5, 3), torch.ones(5, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"same number of responses, got \[2, 3\]"):
        fn(token_level_rewards=rewards, response_mask=mask, index=np.array(list("aabbb"), dtype=object))
    with pytest.raises(ValueError, match=r"same number of responses, got \[2, 3\]"):
        fn(token_level_rewards=rewards, response_mask=mask, index=torch.tensor([7, 7, 3, 3, 3]))
    # a tensor of ids groups like verl's uid strings
    six, six_mask = torch.randn(6, 3), torch.ones(6, 3, dtype=torch.int64)
    by_tensor, _ = fn(token_level_rewards=six, response_mask=six_mask, index=torch.tensor([5, 2, 5, 2, 5, 2]))
    by_uid, _ = fn(token_level_rewards=six, response_mask=six_mask, index=np.array(list("ababab"), dtype=object))
    assert torch.equal(by_tensor, by_uid)
    with pytest.raises(ValueError, match="needs verl's prompt uids"):
        fn(token_level_rewards=rewards, response_mask=mask)
    with pytest.raises(ValueError, match="at least 2 responses per prompt"):
        fn(token_level_rewards=rewards, response_mask=mask, index=np.array(list("abcde"), dtype=object))


# ---- policy losses


def actor_config(seed: int, **overrides) -> ActorConfig:
    """verl's actor config with a random clip range and dual-clip constant."""
    g = torch.Generator().manual_seed(seed)
    low, high = (0.05 + 0.3 * torch.rand(2, generator=g)).tolist()
    kwargs = dict(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=low, clip_ratio_high=high,
                  clip_ratio_c=1.5 + 2.5 * float(torch.rand((), generator=g)))
    kwargs.update(overrides)
    return ActorConfig(**kwargs)


def random_step(seed: int, dtype: torch.dtype, *, row_advantage: bool = False):
    """``(old_log_prob, log_prob (requires grad), advantages, response_mask)`` of a random micro-batch.

    Ratios spread over about ``[0.5, 2]`` so that every branch of the clip is taken.
    """
    rewards, mask, _, _ = random_rollouts(seed, dtype)
    g = torch.Generator().manual_seed(500 + seed)
    shape = mask.shape
    old = (-3.0 * torch.rand(shape, generator=g, dtype=torch.float64)).to(dtype)
    new = (old + 0.4 * torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)).requires_grad_(True)
    if row_advantage:
        adv = torch.randn(shape[0], 1, generator=g, dtype=torch.float64).to(dtype) * mask
    else:
        adv = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype) * mask
    return old, new, adv, mask


def call(fn, old, new, adv, mask, mode, config):
    """A policy loss called as verl's workers/utils/losses.ppo_loss calls it; the loss and d loss / d log_prob."""
    new = new.detach().requires_grad_(True)
    if fn is core_algos.compute_policy_loss_reinforce:  # its first argument is named rollout_log_prob
        loss, metrics = fn(old, new, adv, mask.bool(), mode, config, None)
    else:
        loss, metrics = fn(
            old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask.bool(), loss_agg_mode=mode, config=config,
            rollout_is_weights=None,
        )
    (grad,) = torch.autograd.grad(loss, new)
    return loss.detach(), grad, metrics


def global_info(mask: torch.Tensor, seed: int) -> dict:
    """verl's global_batch_info of a micro-batch that is part of a larger minibatch on 2 ranks."""
    g = torch.Generator().manual_seed(900 + seed)
    return {
        "dp_size": 2,
        "batch_num_tokens": int(mask.sum()) + int(torch.randint(1, 50, (), generator=g)),
        "global_batch_size": mask.shape[0] + int(torch.randint(1, 20, (), generator=g)),
        "loss_scale_factor": None,
    }


def seeupo_loss(old, new, adv, mask, mode, config, cfg: AlgorithmConfig, update: str):
    """Our policy objective called directly, negated (no global info: the micro-batch's own normalisers)."""
    new = new.detach().requires_grad_(True)
    m = mask.bool()
    n = m.shape[0]
    zeros = torch.zeros(n, dtype=torch.long)
    batch = SampleBatch(
        traj_id=torch.arange(n), group_id=zeros, turn=zeros, logp_old=old, token_mask=m, valid=m.any(1),
        reward=torch.zeros(n, dtype=old.dtype), traj_return=torch.zeros(n, dtype=old.dtype),
        weight=torch.ones(n, dtype=old.dtype), instance=zeros,
    )
    objective, stats = policy_objective(
        new, batch, adv, update=update, ratio_level=cfg.ratio_level, ratio_scope=cfg.ratio_scope,
        length_norm=cfg.length_norm, clip_eps_low=config.clip_ratio_low, clip_eps_high=config.clip_ratio_high,
        dual_clip=config.clip_ratio_c, aggregation=mode.replace("-", "_"),
    )
    (grad,) = torch.autograd.grad(-objective, new)
    return -objective.detach(), grad, stats


def assert_loss_close(a, b, dtype, mode):
    # verl's seq-mean-token-mean divides by (token count + 1e-8), an integer tensor plus a float: in
    # torch's float32 default dtype (verl's) the 1e-8 is rounded away, and the exact mean is compared
    assert a.dtype == b.dtype == dtype and a.shape == b.shape
    assert torch.allclose(a, b, rtol=TOL[dtype], atol=TOL[dtype]), float((a - b).abs().max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_global_info", [False, True])
def test_token_ppo_through_verl_equals_seeupo_and_vanilla(mode, dtype, with_global_info):
    cfg = AlgorithmConfig(update="ppo", ratio_level="token")
    register_in_verl(cfg, layout="turn")  # random_step's rows are turns
    ours_in_verl = core_algos.get_policy_loss_fn("ppo")
    for seed in SEEDS:
        old, new, adv, mask = random_step(seed, dtype)
        config = actor_config(seed)
        if with_global_info:
            config.global_batch_info.update(global_info(mask, seed))
        loss, grad, metrics = call(ours_in_verl, old, new, adv, mask, mode, config)
        theirs, their_grad, their_metrics = call(core_algos.get_policy_loss_fn("vanilla"), old, new, adv, mask, mode, config)
        assert_loss_close(loss, theirs, dtype, mode)
        assert_loss_close(grad, their_grad, dtype, mode)
        assert math.isclose(metrics["actor/ppo_kl"], their_metrics["actor/ppo_kl"], rel_tol=1e-6, abs_tol=1e-7)
        if not with_global_info:
            direct, direct_grad, stats = seeupo_loss(old, new, adv, mask, mode, config, cfg, "ppo")
            assert_loss_close(loss, direct, dtype, "token-mean")
            assert_loss_close(grad, direct_grad, dtype, "token-mean")
            assert metrics["actor/pg_clipfrac"] == stats["clip_frac"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_sequence_ppo_through_verl_equals_seeupo_and_gspo(mode, dtype):
    # GSPO: our length-normalised sequence ratio; verl's "gspo" has no dual clip, so clip_ratio_c is
    # set out of reach; the advantage is one value per response (outcome estimators)
    cfg = preset("gspo")  # its per-sequence mean is over trajectory rows: each verl row here is one (one-turn) trajectory
    register_in_verl(cfg, layout="trajectory")
    for seed in SEEDS:
        old, new, adv, mask = random_step(seed, dtype, row_advantage=True)
        config = actor_config(seed, clip_ratio_c=1e9)
        loss, grad, _ = call(core_algos.get_policy_loss_fn("ppo"), old, new, adv, mask, mode, config)
        theirs, their_grad, _ = call(core_algos.get_policy_loss_fn("gspo"), old, new, adv, mask, mode, config)
        assert_loss_close(loss, theirs, dtype, mode)
        assert_loss_close(grad, their_grad, dtype, mode)
        direct, direct_grad, _ = seeupo_loss(old, new, adv, mask, mode, config, cfg, "ppo")
        assert_loss_close(loss, direct, dtype, "token-mean")
        assert_loss_close(grad, direct_grad, dtype, "token-mean")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_reinforce_through_verl_equals_seeupo_and_verl_reinforce(mode, dtype):
    cfg = AlgorithmConfig(update="reinforce")
    exported = register_in_verl(cfg, layout="turn")
    assert exported.policy_losses == {"reinforce": "reinforce", "ppo": "ppo"}
    for seed in SEEDS:
        old, new, adv, mask = random_step(seed, dtype)
        config = actor_config(seed)
        config.global_batch_info.update(global_info(mask, seed))
        loss, grad, _ = call(core_algos.get_policy_loss_fn("reinforce"), old, new, adv, mask, mode, config)
        # verl's REINFORCE loss (not registered in verl 0.9.1; its first argument is the rollout's log-probs)
        theirs, their_grad, _ = call(core_algos.compute_policy_loss_reinforce, old, new, adv, mask, mode, config)
        assert_loss_close(loss, theirs, dtype, mode)
        assert_loss_close(grad, their_grad, dtype, mode)


def test_loss_refuses_what_does_not_map():
    assert {mode: agg for mode, (agg, _) in LOSS_AGG_MODES.items()} == {m: m.replace("-", "_") for m in MODES}
    register_in_verl()
    fn = core_algos.get_policy_loss_fn("ppo")
    old, new, adv, mask = random_step(0, torch.float64)
    config = actor_config(0)
    for mode in ("token-sum", "seq-mean-token-sum-norm"):
        with pytest.raises(ValueError, match=f"loss_agg_mode='{mode}' has no seeupo aggregation"):
            fn(old, new, adv, mask, mode, config)
    for mode in ("seq-mean-token-mean", "seq-mean-token-sum"):  # a mean over rows: the export was not told what a row is
        with pytest.raises(InputError, match=f"^field 'loss_agg_mode': '{mode}': .* the row layout was not given: "):
            fn(old, new, adv, mask, mode, config)
    with pytest.raises(ValueError, match="takes no rollout correction weights"):
        fn(old, new, adv, mask, "token-mean", config, torch.ones_like(old))
    with pytest.raises(ValueError, match="needs verl's actor config"):
        fn(old, new, adv, mask, "token-mean", None)
    config.global_batch_info.update(dp_size=2, batch_num_tokens=None, global_batch_size=None)
    with pytest.raises(ValueError, match="needs 'batch_num_tokens' when dp_size=2"):
        fn(old, new, adv, mask, "token-mean", config)


# ---- row layouts: verl's own reduction on the hand-made multi-turn batch of conftest.py (both layouts)

VERL_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean")


@pytest.mark.parametrize("layout", ROW_LAYOUTS)
@pytest.mark.parametrize("aggregation", sorted({agg for agg, _ in VERL_LOSS_AGG_MODES.values()}))
def test_verl_agg_loss_equals_the_checked_aggregation_or_is_refused(two_layouts, aggregation, layout):
    # verl's own agg_loss, where test_layout.py runs a transcription of it
    def reduce(values, mask, mode):
        return core_algos.agg_loss(values, mask.to(values.dtype), mode)

    equal = two_layouts.equal_reductions(aggregation, layout, reduce, VERL_MODES)
    try:
        mode = verl_loss_agg_mode(aggregation, layout)
    except InputError:
        assert equal == set()
    else:
        assert equal == {mode}


EXACT = [("turn", "token-mean"), ("turn", "seq-mean-token-mean"), ("turn", "seq-mean-token-sum"), ("trajectory", "token-mean")]


@pytest.mark.parametrize("update", ["ppo", "reinforce"])
@pytest.mark.parametrize("layout, mode", EXACT)
def test_exported_loss_is_the_checked_loss_on_a_multi_turn_batch(two_layouts, layout, mode, update):
    """verl's call of the exported loss on verl's rows of ``layout`` equals seeupo's objective on its (trajectory, turn) rows."""
    g = torch.Generator().manual_seed(7)
    n = two_layouts.n_tokens
    old = -3.0 * torch.rand(n, generator=g, dtype=torch.float64)
    new = (old + 0.4 * torch.randn(n, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    config = actor_config(0)
    register_in_verl(AlgorithmConfig(update=update), layout=layout)
    fn = core_algos.get_policy_loss_fn(update)
    mask = two_layouts.rows(layout, old)[1]
    loss, _ = fn(
        old_log_prob=two_layouts.rows(layout, old)[0], log_prob=two_layouts.rows(layout, new)[0],
        advantages=two_layouts.rows(layout, adv)[0] * mask, response_mask=mask, loss_agg_mode=mode, config=config,
        rollout_is_weights=None,
    )
    (grad,) = torch.autograd.grad(loss, new)
    objective, _ = policy_objective(
        two_layouts.rows("turn", new)[0], two_layouts.batch(old), two_layouts.rows("turn", adv)[0], update=update,
        clip_eps_low=config.clip_ratio_low, clip_eps_high=config.clip_ratio_high, dual_clip=config.clip_ratio_c,
        aggregation=LOSS_AGG_MODES[mode][0],
    )
    (checked_grad,) = torch.autograd.grad(-objective, new)
    assert torch.allclose(loss, -objective, rtol=1e-12, atol=1e-12), (float(loss), float(-objective))
    assert torch.allclose(grad, checked_grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum"])
def test_exported_loss_refuses_a_row_mean_over_trajectory_rows_in_one_line(two_layouts, mode):
    register_in_verl(layout="trajectory")
    fn = core_algos.get_policy_loss_fn("ppo")
    old, mask = two_layouts.rows("trajectory", torch.zeros(two_layouts.n_tokens, dtype=torch.float64))
    with pytest.raises(InputError) as info:
        fn(old, old.clone(), old.clone(), mask, mode, actor_config(0))
    assert str(info.value) == (
        f"field 'loss_agg_mode': '{mode}': aggregation '{LOSS_AGG_MODES[mode][0]}' on verl rows of layout='trajectory' "
        "(one row per trajectory) is not seeupo's mean over its turn rows (aggregation_rows='turn'); use token_mean "
        "(loss_agg_mode=token-mean, exact in every layout), or rows of one turn (layout='turn')"
    )
    with pytest.raises(InputError, match=r"^field 'layout': unknown row layout 'rows'"):
        register_in_verl(layout="rows")
    with pytest.raises(InputError, match=r"^field 'layout': unknown row layout 'rows'"):
        verl_policy_loss("ppo", layout="rows")

def test_verl_names_are_not_replaced_and_prefix_exports_under_another_name():
    name = "vanilla"  # a seeupo plugin loss that happens to share a verl name

    @register_policy_loss(name)
    def vanilla(logp_new, batch, adv, settings):
        """``log pi * A`` under a clashing name."""
        return logp_new * adv, None

    try:
        exported = register_in_verl()
        assert "policy loss 'vanilla'" in exported.skipped and "verl already registers 'vanilla'" in exported.skipped["policy loss 'vanilla'"]
        assert core_algos.get_policy_loss_fn("vanilla") is core_algos.compute_policy_loss_vanilla
        with pytest.raises(ValueError, match="policy loss 'vanilla' cannot be exported to verl: verl already registers"):
            register_in_verl(adv_estimators=[], policy_losses=["vanilla"])
        exported = register_in_verl(adv_estimators=[], policy_losses=["vanilla"], prefix="seeupo_")
        assert exported.policy_losses == {"seeupo_vanilla": "vanilla"}
        old, new, adv, mask = random_step(1, torch.float64)
        ours, _, _ = call(core_algos.get_policy_loss_fn("seeupo_vanilla"), old, new, adv, mask, "token-mean", actor_config(1))
        verl_reinforce, _, _ = call(core_algos.compute_policy_loss_reinforce, old, new, adv, mask, "token-mean", actor_config(1))
        assert torch.allclose(ours, verl_reinforce, rtol=0, atol=1e-12)
        # exporting again replaces our own earlier entry (a new cfg is picked up), never verl's
        register_in_verl(AlgorithmConfig(grae_center="loo"), adv_estimators=["grae"], policy_losses=[])
        register_in_verl(AlgorithmConfig(grae_center="mean"), adv_estimators=["grae"], policy_losses=[])
        rewards, mask, uids, _ = random_rollouts(2, torch.float64)
        adv, _ = core_algos.get_adv_estimator_fn("grae")(token_level_rewards=rewards, response_mask=mask, index=uids)
        theirs, _ = core_algos.compute_grpo_outcome_advantage(rewards.clone(), mask, uids, norm_adv_by_std_in_grpo=False)
        assert torch.allclose(adv, theirs, rtol=0, atol=1e-12)
    finally:
        POLICY_LOSSES.remove(name)


def test_export_module_named_in_verl_use_external_modules_registers_on_import_verl(tmp_path):
    # how docs/verl.md makes verl's other processes (Ray workers) export too: verl imports the
    # modules named in VERL_USE_EXTERNAL_MODULES when `import verl` runs
    (tmp_path / "my_seeupo_verl.py").write_text(textwrap.dedent("""
        from seeupo.core.config import preset
        from seeupo.integrations.verl import register_in_verl

        register_in_verl(preset("grpo"))
    """))
    probe = (
        "import verl\n"
        "from verl.trainer.ppo import core_algos\n"
        "print(core_algos.get_adv_estimator_fn('grae').__doc__.split(':')[0])\n"
        "print(core_algos.get_policy_loss_fn('ppo').__doc__.split(':')[0])\n"
    )
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES="my_seeupo_verl",
               PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == [
        "seeupo's advantage estimator 'grae' with verl's signature",
        "seeupo's policy loss 'ppo' with verl's signature",
    ]


def test_new_algorithm_doc_export_block_runs(tmp_path):
    """docs/new_algorithm.md §5: its plugin, exported by its own verl block, runs in verl's registry."""
    import re
    from pathlib import Path

    from seeupo import plugins

    doc = (Path(__file__).resolve().parents[2] / "docs" / "new_algorithm.md").read_text()
    python = re.findall(r"^```python[ \t]*\n(.*?)^```[ \t]*$", doc, re.DOTALL | re.MULTILINE)
    plugin = next(b for b in python if "register_adv_est" in b)
    export = next(b for b in python if b.startswith("# needs verl"))
    (tmp_path / "my_median.py").write_text(plugin)
    plugins.forget_plugins()
    try:
        plugins.load_plugin(str(tmp_path / "my_median.py"))
        namespace: dict[str, object] = {}
        exec(compile(export, "docs/new_algorithm.md (verl block)", "exec"), namespace)  # noqa: S102 - our own docs
        assert namespace["exported"].adv_estimators == {"median_baseline": "median_baseline"}
        fn = core_algos.get_adv_estimator_fn("median_baseline")
        rewards, mask, uids, size = random_rollouts(0, torch.float64)
        adv, _ = fn(token_level_rewards=rewards, response_mask=mask, index=uids, config=None)
        returns = rewards.sum(-1)
        for uid in set(uids.tolist()):
            rows = torch.from_numpy(uids == uid)
            want = (returns[rows] - returns[rows].quantile(0.5))[:, None] * mask[rows]
            assert torch.allclose(adv[rows], want.to(adv.dtype), rtol=0, atol=1e-12)
    finally:
        plugins.forget_plugins()
