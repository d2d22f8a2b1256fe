"""seeupo.core.execution: the fused ratio passes make the reference sweep's update, on configurations drawn by hypothesis.

The exact tabular engine runs the execution path a language model runs: a tabular policy whose
parameters are shared across turns (``parameterization="shared"``) takes the fused ratio passes,
as a language model does. Here hypothesis draws problems (agentic families, token actions,
stochastic observations), sequential configurations, optimizers and micro-batch limits, and the
fused update is compared with the reference :func:`seeupo.core.update.sequential_sweep` (a
separate no-gradient ratio pass per turn), step by step and parameter by parameter.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seeupo.core.config import preset
from seeupo.core.execution import UpdateSettings
from seeupo.core.update import fusion_blocker, policy_update
from seeupo.tabular.families import AGENTIC_FAMILIES
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import random_tree_mdp
from seeupo.tabular.rollout import exact_advantages
from seeupo.tabular.train import RunConfig, initial_policy, make_optimizer
from seeupo.testing import agentic_mdps, token_bandits, tree_mdps

TOL = 1e-12  # float64; the two paths score the same rows under the same parameters, in different passes

PROBLEMS = st.one_of(
    tree_mdps(max_turns=3, max_actions=2, max_observations=2, reward_levels=3),
    token_bandits(max_turns=3, reward_levels=3),
    st.sampled_from(tuple(AGENTIC_FAMILIES)).flatmap(lambda family: agentic_mdps(family, max_turns=3)),
)


@st.composite
def sequential_configs(draw: st.DrawFn):
    """Sequential configurations whose ``M`` reads the ratio and whose turns take one minibatch (fusable)."""
    return dataclasses.replace(
        preset("seeupo"),
        order=draw(st.sampled_from(["reverse", "forward", "random"])),
        epochs=draw(st.integers(1, 3)),
        m_length_norm=draw(st.booleans()),
        m_factor=draw(st.sampled_from(["happo", "clipped"])),
        ratio_level=draw(st.sampled_from(["token", "sequence"])),
        aggregation=draw(st.sampled_from(["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])),
        grae_scale=draw(st.sampled_from(["none", "batch_std"])),
        group_size=draw(st.integers(2, 3)),
    )


def _update(policy: TabularPolicy, batch, adv, cfg, run_cfg: RunConfig, fuse: bool, micro_batch_rows: int | None):
    policy = copy.deepcopy(policy)
    settings = UpdateSettings(generator=torch.Generator().manual_seed(7), fuse_ratio_passes=fuse,
                              micro_batch_rows=micro_batch_rows)
    stats = policy_update(policy, make_optimizer(policy.parameters(), run_cfg), batch, adv, cfg, settings)
    return policy, stats


@settings(max_examples=25, deadline=None, database=None, derandomize=True)
@given(
    problem=PROBLEMS,
    cfg=sequential_configs(),
    optimizer=st.sampled_from(["adam", "sgd"]),
    lr=st.sampled_from([0.05, 0.5, 2.0]),
    micro_batch_rows=st.sampled_from([None, 1, 3]),
    seed=st.integers(0, 2**16),
)
def test_fused_ratio_passes_make_the_reference_update(problem, cfg, optimizer, lr, micro_batch_rows, seed):
    run_cfg = RunConfig(parameterization="shared", init_scale=1.0, optimizer=optimizer, lr=lr, seed=seed)
    policy = initial_policy(problem, run_cfg)
    batch, adv = exact_advantages(problem, policy, cfg)
    assert fusion_blocker(policy, batch, cfg, UpdateSettings()) is None  # the exact engine takes the fused path

    fused_policy, fused = _update(policy, batch, adv, cfg, run_cfg, True, micro_batch_rows)
    ref_policy, ref = _update(policy, batch, adv, cfg, run_cfg, False, micro_batch_rows)

    assert (fused.fused_ratio_passes, ref.fused_ratio_passes) == (True, False)
    assert fused.turn_order == ref.turn_order and fused.steps == ref.steps
    assert torch.allclose(fused.factor, ref.factor, rtol=0.0, atol=TOL)
    assert max(abs(a - b) for a, b in zip(fused.objective, ref.objective)) <= TOL
    assert (fused_policy.weights - ref_policy.weights).abs().max() <= TOL
    if adv.abs().max() > 1e-6:  # not a vacuous comparison: the update moved the parameters
        assert (fused_policy.weights - policy.weights).abs().max() > 0


@pytest.mark.parametrize("parameterization, blocked", [("shared", False), ("independent", True)])
def test_only_a_policy_whose_turns_share_parameters_takes_the_fused_path(parameterization, blocked):
    """Independent tables would give the finished turn's table a zero gradient instead of none, which
    Adam's momentum still moves: they keep the reference sweep."""
    problem = random_tree_mdp(2, (3, 2), (2, 1), reward_levels=3, generator=torch.Generator().manual_seed(0))
    policy = initial_policy(problem, RunConfig(parameterization=parameterization))
    cfg = preset("seeupo")
    batch, _ = exact_advantages(problem, policy, cfg)
    assert (fusion_blocker(policy, batch, cfg) is not None) == blocked
