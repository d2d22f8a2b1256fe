"""The package computes in float64 whatever torch's default dtype is."""

import pytest
import torch

from seeupo.core import PRESETS
from seeupo.tabular.problems import random_tree_mdp
from seeupo.tabular.train import RunConfig, run


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("mode", ["exact", "sampled"])
def test_every_preset_runs_in_float64_under_a_float32_default(name, mode):
    torch.set_default_dtype(torch.float32)  # the autouse fixture restores it
    problem = random_tree_mdp(2, (2, 2), (2, 1), reward_levels=3, generator=torch.Generator().manual_seed(0))
    hist = run(problem, PRESETS[name].replace(epochs=2), RunConfig(mode=mode, iterations=2, tasks=2))
    assert hist.J.dtype == torch.float64
    assert all(p.dtype == torch.float64 for p in hist.policy.parameters())
    assert bool(torch.isfinite(hist.J).all())
