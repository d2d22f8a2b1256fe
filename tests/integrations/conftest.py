"""One hand-made multi-turn batch in both row layouts (seeupo.integrations.layout).

Four trajectories of 1, 3, 2 and 2 turns, turns of 1 to 5 tokens, two tool tokens between
turns. In the ``"turn"`` layout each row is a (trajectory, turn), as seeupo's SampleBatch; in
the ``"trajectory"`` layout each row is a whole trajectory, its turns in one response with the
tool tokens masked out, as verl's multi-turn agent loop builds it. Masked slots hold a finite
junk value, so that a formula that reads them shows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import pytest
import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.losses import aggregate

TURN_TOKENS = ((4,), (2, 5, 1), (3, 3), (1, 2))  # tokens of each turn of each trajectory
TOOL_TOKENS = 2  # between two turns of a trajectory
JUNK = 1e3


@dataclass(frozen=True)
class TwoLayouts:
    """Where each assistant token sits in either layout; tokens are numbered in (trajectory, turn, position) order."""

    turn_slots: list[tuple[int, int]]  # token k -> (row, column) among the turn rows
    traj_slots: list[tuple[int, int]]  # token k -> (row, column) among the trajectory rows
    turn_shape: tuple[int, int]
    traj_shape: tuple[int, int]
    traj_of_turn_row: list[int]
    turn_of_turn_row: list[int]

    @property
    def n_tokens(self) -> int:
        return len(self.turn_slots)

    def rows(self, layout: str, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``tokens`` (one value per assistant token) laid out as ``(values [n, L], mask [n, L] bool)``."""
        slots, shape = (self.turn_slots, self.turn_shape) if layout == "turn" else (self.traj_slots, self.traj_shape)
        values = torch.full(shape, JUNK, dtype=tokens.dtype)
        mask = torch.zeros(shape, dtype=torch.bool)
        index = torch.tensor(slots)
        values[index[:, 0], index[:, 1]] = tokens
        mask[index[:, 0], index[:, 1]] = True
        return values, mask

    def batch(self, logp_old: torch.Tensor | None = None) -> SampleBatch:
        """seeupo's SampleBatch of the turn rows (one group, instance 0, weights 1); ``logp_old`` per token."""
        tokens = torch.zeros(self.n_tokens, dtype=torch.float64) if logp_old is None else logp_old
        old, mask = self.rows("turn", tokens)
        n = self.turn_shape[0]
        zeros = torch.zeros(n, dtype=torch.long)
        return SampleBatch(
            traj_id=torch.tensor(self.traj_of_turn_row), group_id=zeros, turn=torch.tensor(self.turn_of_turn_row),
            logp_old=old, token_mask=mask, valid=torch.ones(n, dtype=torch.bool), reward=torch.zeros(n, dtype=old.dtype),
            traj_return=torch.zeros(n, dtype=old.dtype), weight=torch.ones(n, dtype=old.dtype), instance=zeros,
        )

    def equal_reductions(
        self,
        aggregation: str,
        layout: str,
        reduce: Callable[[torch.Tensor, torch.Tensor, str], torch.Tensor],
        modes: Iterable[str],
        rows: str = "turn",
    ) -> set[str]:
        """The trainer's reductions (``reduce(values, mask, mode)``) equal to seeupo's ``aggregation`` here.

        seeupo's checked loss aggregates its turn rows, as rows of one turn or of one trajectory (``rows``,
        ``AlgorithmConfig.aggregation_rows``); the trainer's reduces the rows of ``layout`` holding the same
        per-token values (random, so that two different formulas differ).
        """
        tokens = torch.randn(self.n_tokens, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        checked = aggregate(self.rows("turn", tokens)[0], self.batch(), aggregation, rows=rows)
        values, mask = self.rows(layout, tokens)
        # rtol: verl's seq-mean-token-mean divides by (token count + 1e-8); different formulas differ by O(1)
        return {mode for mode in modes if torch.isclose(reduce(values, mask, mode).double(), checked, rtol=1e-6, atol=0)}


def make_two_layouts() -> TwoLayouts:
    turn_slots, traj_slots, traj_of_turn_row, turn_of_turn_row = [], [], [], []
    traj_width = 0
    for traj, turns in enumerate(TURN_TOKENS):
        column = 0
        for turn, length in enumerate(turns):
            row = len(traj_of_turn_row)
            traj_of_turn_row.append(traj)
            turn_of_turn_row.append(turn)
            turn_slots += [(row, j) for j in range(length)]
            traj_slots += [(traj, column + j) for j in range(length)]
            column += length + TOOL_TOKENS
        traj_width = max(traj_width, column - TOOL_TOKENS)
    turn_width = max(max(turns) for turns in TURN_TOKENS)
    # one padding column more than needed in each layout, as a batch padded to a longer row has
    return TwoLayouts(
        turn_slots, traj_slots, (len(traj_of_turn_row), turn_width + 1), (len(TURN_TOKENS), traj_width + 1),
        traj_of_turn_row, turn_of_turn_row,
    )


@pytest.fixture
def two_layouts() -> TwoLayouts:
    return make_two_layouts()

