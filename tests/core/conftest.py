"""Shared helpers for the algorithm-core tests: build a SampleBatch from plain lists."""

from __future__ import annotations

import pytest
import torch

from seeupo.core.batch import SampleBatch

DT = torch.float64


def _long(x):
    return torch.as_tensor(x, dtype=torch.long)


def _float(x):
    return torch.as_tensor(x, dtype=DT)


def build_batch(
    *,
    traj_id,
    token_mask,
    group_id=None,
    turn=None,
    valid=None,
    reward=None,
    traj_return=None,
    weight=None,
    instance=None,
    logp_old=None,
    data=None,
) -> SampleBatch:
    """A SampleBatch from lists; omitted fields get neutral defaults (one group, turn 0, valid, unit weight)."""
    traj_id = _long(traj_id)
    n = traj_id.shape[0]
    token_mask = torch.as_tensor(token_mask, dtype=torch.bool)
    L = token_mask.shape[1]
    return SampleBatch(
        traj_id=traj_id,
        group_id=_long(group_id) if group_id is not None else torch.zeros(n, dtype=torch.long),
        turn=_long(turn) if turn is not None else torch.zeros(n, dtype=torch.long),
        logp_old=_float(logp_old) if logp_old is not None else torch.zeros(n, L, dtype=DT),
        token_mask=token_mask,
        valid=torch.as_tensor(valid, dtype=torch.bool) if valid is not None else torch.ones(n, dtype=torch.bool),
        reward=_float(reward) if reward is not None else torch.zeros(n, dtype=DT),
        traj_return=_float(traj_return) if traj_return is not None else torch.zeros(n, dtype=DT),
        weight=_float(weight) if weight is not None else torch.ones(n, dtype=DT),
        instance=_long(instance) if instance is not None else torch.zeros(n, dtype=torch.long),
        data=dict(data or {}),
    )


@pytest.fixture
def make_batch():
    """The :func:`build_batch` helper, as a fixture (avoids importing conftest by name)."""
    return build_batch


@pytest.fixture
def registered():
    """Names registered by a test, unregistered afterwards so that the built-in menu stays as shipped."""
    added: list[tuple[object, str]] = []
    yield added
    for registry, name in added:
        registry.remove(name)
