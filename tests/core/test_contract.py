"""Exact mode's contract (seeupo.core.contract): each assumption of AdvantageEstimator is checked on random
batches, and an estimator that fails one is refused for exact mode with the reason."""

from __future__ import annotations

import pytest
import torch

from seeupo.core.advantages import broadcast_to_tokens
from seeupo.core.batch import per_trajectory, segment_sum
from seeupo.core.boundary import PluginError
from seeupo.core.config import PRESETS, AlgorithmConfig
from seeupo.core.contract import ExactModeRefused, exact_mode_refusal, require_exact_mode
from seeupo.core.registry import ADV_ESTIMATORS, register_adv_est


def _returns(batch):
    return per_trajectory(batch.traj_return, batch), per_trajectory(batch.group_id, batch)


def group_mean_baseline(batch, cfg, **_):
    """GRPO's advantage without scaling: symmetric, weight-free."""
    r, g = _returns(batch)
    mean = segment_sum(r, g, batch.num_groups) / cfg.group_size
    return broadcast_to_tokens((r - mean[g])[batch.traj_id], batch)


def first_in_group_baseline(batch, cfg, **_):
    """A_i = R_i - R_first: the first trajectory of the group is special."""
    r, g = _returns(batch)
    first = torch.full((batch.num_groups,), r.numel()).scatter_reduce(0, g, torch.arange(r.numel()), "amin")
    return broadcast_to_tokens((r - r[first][g])[batch.traj_id], batch)


def unweighted_batch_std(batch, cfg, **_):
    """The group-mean baseline over the batch's unweighted std: a batch statistic that ignores batch.weight."""
    a = group_mean_baseline(batch, cfg)
    centred = per_trajectory(a[:, 0], batch)
    return a / (centred.std() + 1e-6)


def mates_actions(batch, cfg, **_):
    """A baseline from the group-mates' returns when they took action 0: reads their actions."""
    r, g = _returns(batch)
    took0 = per_trajectory((batch.data["action"] == 0).to(r.dtype), batch)
    return broadcast_to_tokens((r - (segment_sum(r * took0, g, batch.num_groups) / cfg.group_size)[g])[batch.traj_id], batch)


def noisy(batch, cfg, **_):
    """The return plus noise."""
    r, _ = _returns(batch)
    return broadcast_to_tokens((r + torch.randn_like(r))[batch.traj_id], batch)


def median_baseline(batch, cfg, **_):
    """docs/new_algorithm.md's estimator: R_i minus its group's median return."""
    r, g = _returns(batch)
    order = torch.argsort(r, stable=True)
    order = order[torch.argsort(g[order], stable=True)]
    median = r[order].reshape(-1, cfg.group_size).quantile(0.5, dim=1)
    return broadcast_to_tokens((r - median[g])[batch.traj_id], batch)


@pytest.mark.parametrize("fn, reason", [
    (group_mean_baseline, None),
    (median_baseline, None),
    (first_in_group_baseline, "not symmetric in its group"),
    (unweighted_batch_std, "does not weight the batch as exact mode does"),
    (mates_actions, "reads its group-mates' actions, histories or log-probabilities"),
    (noisy, "not deterministic"),
])
@pytest.mark.parametrize("group_size", [2, 4])
def test_each_assumption_is_checked(fn, reason, group_size):
    register_adv_est("contract_test", needs_group_stats=True)(fn)
    try:
        cfg = AlgorithmConfig(advantage="contract_test", group_size=group_size)
        assert exact_mode_refusal(cfg) == reason
        if reason is not None:
            with pytest.raises(ExactModeRefused, match=rf"advantage estimator 'contract_test' \(tests/core/test_contract.py:\d+\): "
                                                       rf"exact: refused \({reason}\); the sampled mode still runs it"):
                require_exact_mode(cfg)
    finally:
        ADV_ESTIMATORS.remove("contract_test")


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("group_size", [2, 3, 5])
def test_every_builtin_preset_satisfies_exact_modes_contract(name, group_size):
    assert exact_mode_refusal(PRESETS[name].replace(group_size=group_size)) is None
    assert exact_mode_refusal(PRESETS[name].replace(advantage="oracle")) is None


def test_declared_exact_false_is_refused_without_calls_and_a_broken_estimator_is_one_line():
    calls = []
    register_adv_est("declared_inexact", exact=False)(lambda batch, cfg, **_: calls.append(1))
    register_adv_est("nan_contract")(lambda batch, cfg, **_: torch.full_like(batch.logp_old, float("nan")))
    try:
        assert exact_mode_refusal(AlgorithmConfig(advantage="declared_inexact")) == "registered with exact=False"
        assert calls == []
        with pytest.raises(PluginError, match=r"advantage estimator 'nan_contract' .* returned non-finite advantages"):
            exact_mode_refusal(AlgorithmConfig(advantage="nan_contract"))
    finally:
        ADV_ESTIMATORS.remove("declared_inexact")
        ADV_ESTIMATORS.remove("nan_contract")
