"""seeupo.integrations.layout: verl's loss_agg_mode for each seeupo aggregation and row layout, or a one-line refusal.

Runs without verl: verl's reduction is transcribed below from its source. ``test_verl.py``
(marked ``verl``) runs verl's own ``agg_loss`` on the same hand-made batch.
"""

from __future__ import annotations

import pytest
import torch

from seeupo.core.registry import AGGREGATIONS
from seeupo.integrations.layout import EXACT_LAYOUTS, ROW_LAYOUTS, VERL_LOSS_AGG_MODES, verl_loss_agg_mode
from seeupo.validation.errors import InputError

VERL_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean")


def verl_agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """verl 0.9.1, verl/trainer/ppo/core_algos.py, ``agg_loss`` with ``dp_size=1`` and no global batch info.

    Transcribed (``verl_F.masked_sum(v, m)`` is ``(v * m).sum()`` with NaNs outside the mask zeroed).
    """
    loss_mask = loss_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        loss = (loss_mat * loss_mask).sum() / loss_mask.sum()
    elif loss_agg_mode == "token-sum":
        loss = (loss_mat * loss_mask).sum()
    elif loss_agg_mode in ["seq-mean-token-sum", "seq-mean-token-sum-norm"]:
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()
        loss = (seq_losses * seq_mask).sum() / seq_mask.sum()
        if loss_agg_mode == "seq-mean-token-sum-norm":
            loss /= loss_mask.shape[-1]  # loss_scale_factor None: the horizon
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
        seq_mask = (seq_mask > 0).float()
        loss = (seq_losses * seq_mask).sum() / seq_mask.sum()
    else:
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")
    return loss


def assert_one_line_refusal(err: InputError, *words: str) -> None:
    message = str(err)
    assert "\n" not in message and message.startswith("field 'aggregation': "), message
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize("rows", ROW_LAYOUTS)
@pytest.mark.parametrize("layout", ROW_LAYOUTS)
@pytest.mark.parametrize("aggregation", AGGREGATIONS.names())
def test_verl_mode_equals_the_checked_aggregation_or_is_refused(two_layouts, aggregation, layout, rows):
    """Every (aggregation, seeupo's rows, verl's layout): the mode given computes seeupo's loss on verl's rows, and
    where none is given none does. seeupo's trajectory rows (aggregation_rows) are verl's multi-turn layout."""
    equal = two_layouts.equal_reductions(aggregation, layout, verl_agg_loss, VERL_MODES, rows)
    try:
        mode = verl_loss_agg_mode(aggregation, layout, rows)
    except InputError as err:
        assert equal == set()  # the refusal is right: no verl mode computes the checked loss on these rows
        assert_one_line_refusal(err, repr(aggregation), f"layout={layout!r}", "token_mean", "loss_agg_mode=token-mean",
                                f"aggregation_rows={rows!r}")
    else:
        assert equal == {mode}
    assert bool(equal) == (layout == rows or aggregation == "token_mean")


def test_what_maps_where():
    # the table of docs/verl.md
    assert {(agg, layout): _mode_or_none(agg, layout) for agg in EXACT_LAYOUTS for layout in ROW_LAYOUTS} == {
        ("token_mean", "turn"): "token-mean",
        ("token_mean", "trajectory"): "token-mean",
        ("seq_mean_token_mean", "turn"): "seq-mean-token-mean",
        ("seq_mean_token_mean", "trajectory"): None,
        ("seq_mean_token_sum", "turn"): "seq-mean-token-sum",
        ("seq_mean_token_sum", "trajectory"): None,
    }
    assert set(EXACT_LAYOUTS) == set(AGGREGATIONS.names()) == {agg for agg, _ in VERL_LOSS_AGG_MODES.values()}


def _mode_or_none(aggregation: str, layout: str) -> str | None:
    try:
        return verl_loss_agg_mode(aggregation, layout)
    except InputError:
        return None


def test_layout_not_given_maps_only_what_is_exact_in_every_layout():
    assert verl_loss_agg_mode("token_mean", None) == "token-mean"
    for aggregation in ("seq_mean_token_mean", "seq_mean_token_sum"):
        with pytest.raises(InputError) as info:
            verl_loss_agg_mode(aggregation, None)
        assert_one_line_refusal(info.value, repr(aggregation), "row layout was not given", "layout='turn'")


def test_unknown_aggregation_and_layout_are_one_line_errors():
    with pytest.raises(InputError) as info:
        verl_loss_agg_mode("median_of_tokens", "turn")
    assert_one_line_refusal(info.value, "'median_of_tokens' has no verl equal")
    with pytest.raises(InputError, match=r"^field 'layout': unknown row layout 'row'; expected one of \('turn', 'trajectory'\)$"):
        verl_loss_agg_mode("token_mean", "row")
