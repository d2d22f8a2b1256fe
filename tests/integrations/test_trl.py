"""seeupo.integrations.trl: TRL's loss_type for each seeupo aggregation and row layout, or a one-line refusal.

TRL is not installed for the tests: its reduction is transcribed below from its source.
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from seeupo.core.registry import AGGREGATIONS
from seeupo.integrations.layout import ROW_LAYOUTS
from seeupo.integrations.trl import TRL_LOSS_TYPES, trl_loss_type
from seeupo.validation.errors import InputError

# TRL's loss types whose per-token loss is the clipped surrogate (the reduction is what differs)
TRL_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
MICRO_BATCHES = 2  # gradient accumulation steps; the hand-made batch's halves hold 12 and 9 tokens
MAX_COMPLETION_LENGTH = 16


def trl_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, loss_type: str) -> torch.Tensor:
    """TRL 1.16.0, trl/trainer/grpo_trainer.py, ``GRPOTrainer._compute_loss``: its reduction, summed over the micro-batches.

    Transcribed for one process (``num_processes = 1``), ``MICRO_BATCHES`` micro-batches of equal row
    counts (``per_device_train_batch_size``), training mode, and ``steps_per_generation ==
    gradient_accumulation_steps`` (``GRPOConfig.__post_init__``'s default), so that
    ``num_items_in_batch`` (``_generate_and_score_completions``: the gathered ``loss_mask.sum()``)
    is the token count of the whole batch. The gradient accumulation adds the micro-batches' losses.
    """
    mask = mask.to(per_token_loss.dtype)
    accumulation = steps_per_generation = MICRO_BATCHES
    num_processes = 1
    num_items_in_batch = mask.sum()
    total = torch.zeros((), dtype=per_token_loss.dtype)
    for loss_mb, mask_mb in zip(per_token_loss.chunk(MICRO_BATCHES), mask.chunk(MICRO_BATCHES)):
        if loss_type in ["grpo", "sapo"]:
            loss = ((loss_mb * mask_mb).sum(-1) / mask_mb.sum(-1).clamp(min=1.0)).mean() / accumulation
        elif loss_type == "bnpo":
            loss = (loss_mb * mask_mb).sum() / mask_mb.sum().clamp(min=1.0) / accumulation
        elif loss_type == "dr_grpo":
            loss = (loss_mb * mask_mb).sum() / (loss_mb.size(0) * MAX_COMPLETION_LENGTH) / accumulation
        elif loss_type in ["cispo", "dapo", "vespo"]:
            normalizer = num_items_in_batch.clamp(min=1.0) / num_processes
            normalizer = normalizer * accumulation / steps_per_generation
            loss = (loss_mb * mask_mb).sum() / normalizer
        elif loss_type == "luspo":
            loss = (loss_mb * mask_mb).sum(-1).mean() / accumulation
        else:
            raise ValueError(f"Unknown loss type: {loss_type}")
        total = total + loss
    return total


@pytest.mark.parametrize("rows", ROW_LAYOUTS)
@pytest.mark.parametrize("layout", ROW_LAYOUTS)
@pytest.mark.parametrize("aggregation", AGGREGATIONS.names())
def test_trl_loss_type_equals_the_checked_aggregation_or_is_refused(two_layouts, aggregation, layout, rows):
    assert two_layouts.turn_shape[0] % MICRO_BATCHES == two_layouts.traj_shape[0] % MICRO_BATCHES == 0
    equal = two_layouts.equal_reductions(aggregation, layout, trl_loss, TRL_TYPES, rows)
    assert bool(equal) == (layout == rows or aggregation == "token_mean")
    try:
        loss_type = trl_loss_type(aggregation, layout, rows)
    except InputError as err:
        assert equal == set()  # the refusal is right: no loss type reduces the checked loss on these rows
        message = str(err)
        assert "\n" not in message and message.startswith("field 'aggregation': ")
        for word in (repr(aggregation), f"layout={layout!r}", "token_mean", "loss_type='dapo'"):
            assert word in message, (word, message)
    else:
        assert equal == {loss_type}


def test_what_maps_where():
    # the table of docs/training.md
    found = {}
    for aggregation in TRL_LOSS_TYPES:
        for layout in (*ROW_LAYOUTS, None):
            try:
                found[aggregation, layout] = trl_loss_type(aggregation, layout)
            except InputError:
                found[aggregation, layout] = None
    assert found == {
        ("token_mean", "turn"): "dapo", ("token_mean", "trajectory"): "dapo", ("token_mean", None): "dapo",
        ("seq_mean_token_mean", "turn"): "grpo", ("seq_mean_token_mean", "trajectory"): None,
        ("seq_mean_token_mean", None): None,
        ("seq_mean_token_sum", "turn"): "luspo", ("seq_mean_token_sum", "trajectory"): None,
        ("seq_mean_token_sum", None): None,
    }


def test_unknown_aggregation_is_one_line_error():
    with pytest.raises(InputError, match=r"^field 'aggregation': aggregation 'median_of_tokens' has no TRL loss_type \(known: "):
        trl_loss_type("median_of_tokens", "turn")


def test_module_does_not_import_trl(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # None in sys.modules: "import trl" raises ImportError
    monkeypatch.delitem(sys.modules, "seeupo.integrations.trl", raising=False)
    module = importlib.import_module("seeupo.integrations.trl")
    assert module.trl_loss_type("token_mean", "trajectory") == "dapo"
