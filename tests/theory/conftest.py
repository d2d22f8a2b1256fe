"""Shared helpers for the theory tests: float64 by default, one torch thread, random policies."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from seeupo.tabular.problems import DTYPE, TreeMDP





def _random_probs(problem: TreeMDP, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t, a in enumerate(problem.actions_per_turn):
        x = -torch.log(torch.rand((problem.num_instances, problem.num_histories(t), a), generator=gen, dtype=DTYPE))
        out.append(x / x.sum(-1, keepdim=True))
    return out


@pytest.fixture
def random_probs() -> Callable[[TreeMDP, int], list[torch.Tensor]]:
    """``random_probs(problem, seed)``: a random strictly positive policy per turn ``[I, N_t, A_t]``."""
    return _random_probs
