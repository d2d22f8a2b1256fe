"""What a row is in each trainer, and which seeupo aggregations survive a change of rows.

seeupo's batch has one row per (trajectory, turn) (:class:`seeupo.core.batch.SampleBatch`), and
its aggregations (:func:`seeupo.core.losses.aggregate`) reduce over those rows. A trainer that
seeupo's pieces are exported to reduces over its own rows, in one of two layouts:

* ``"turn"``: one row per turn, as in seeupo. Single-turn rollouts (a trajectory is one turn),
  and verl's rows once :mod:`seeupo.integrations.verl_sequential` has split them into turns
  (what SeeUPO's verl worker trains on).
* ``"trajectory"``: one row per trajectory, every assistant turn in one response and the tokens
  between turns (tool results, user messages) masked out. verl's multi-turn agent loop
  (verl 0.9.1, ``verl/experimental/agent_loop/agent_loop.py``,
  ``AgentLoopWorker.generate_sequences``: "response_mask: 1 for LLM generated tokens, 0 for
  observation/padding tokens") and TRL's GRPOTrainer with tools (TRL 1.16.0,
  ``trl/trainer/grpo_trainer.py``, ``GRPOTrainer._tool_call_loop`` builds a ``tool_mask`` that
  ``_compute_loss`` multiplies into the completion mask).

A mean over every token of the batch does not see rows: both layouts hold the same assistant
tokens, so ``token_mean`` is the same number in either. A mean over rows does: in the trajectory
layout a trajectory's turns share one row (one weight in the row mean, one token count in the
token mean), so ``seq_mean_token_mean`` and ``seq_mean_token_sum`` there are another loss than
the one seeupo checks on turn rows. seeupo computes that other loss too, with
``AlgorithmConfig.aggregation_rows="trajectory"`` (:func:`seeupo.core.losses.row_coefficients`):
a mean over rows maps to a trainer's only where the trainer's layout is the configuration's rows.
The maps of :mod:`seeupo.integrations.verl` and :mod:`seeupo.integrations.trl` refuse the other
pairs, in one line.

This module imports neither verl nor TRL.
"""

from __future__ import annotations

from typing import get_args

from seeupo.core.config import AggregationRows as RowLayout
from seeupo.validation.errors import InputError

ROW_LAYOUTS: tuple[str, ...] = get_args(RowLayout)

# seeupo aggregation on turn rows -> the layouts in which a trainer's loss of the same formula equals it
# (why: the module docstring; tested in tests/integrations/test_layout.py on one hand-made batch)
EXACT_LAYOUTS: dict[str, tuple[str, ...]] = {
    "token_mean": ("turn", "trajectory"),
    "seq_mean_token_mean": ("turn",),
    "seq_mean_token_sum": ("turn",),
}

# verl's loss_agg_mode -> (seeupo's aggregation of the same formula on the same rows, the key of
# verl's actor config.global_batch_info holding the minibatch's denominator). verl 0.9.1,
# verl/trainer/ppo/core_algos.py, agg_loss:
#   token-mean:          masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
#   seq-mean-token-mean: sum over sequences of (row's token sum / row's token count) / global_batch_size * dp_size
#   seq-mean-token-sum:  sum over sequences of the row's token sum / global_batch_size * dp_size
# (global_batch_size counts the rows with at least one token). verl's "token-sum" (no
# denominator) and "seq-mean-token-sum-norm" (seq-mean-token-sum / loss_scale_factor, the
# response length by default) have no seeupo aggregation.
VERL_LOSS_AGG_MODES: dict[str, tuple[str, str]] = {
    "token-mean": ("token_mean", "batch_num_tokens"),
    "seq-mean-token-mean": ("seq_mean_token_mean", "global_batch_size"),
    "seq-mean-token-sum": ("seq_mean_token_sum", "global_batch_size"),
}


def check_layout(layout: str) -> RowLayout:
    """``layout`` if it is one of :data:`ROW_LAYOUTS`, else a one-line :class:`InputError`."""
    if layout not in ROW_LAYOUTS:
        raise InputError("layout", f"unknown row layout {layout!r}; expected one of {ROW_LAYOUTS}")
    return layout  # type: ignore[return-value]


def layout_refusal(aggregation: str, layout: str | None, trainer: str, token_mean: str, rows: str = "turn") -> str | None:
    """Why ``trainer``'s loss of seeupo's ``aggregation`` on rows of ``layout`` is not seeupo's, or ``None``.

    ``rows``: what seeupo's aggregation averages over (``AlgorithmConfig.aggregation_rows``). A mean
    over every token is the same in every layout; a mean over rows only where ``layout`` is ``rows``.
    ``layout=None``: the layout is not known, so only an aggregation exact in every layout passes.
    An aggregation this module does not know (a plugin's) is refused: its exactness is unknown.
    ``token_mean`` is the trainer's setting for seeupo's ``token_mean``, offered instead.
    """
    layouts = EXACT_LAYOUTS.get(aggregation)
    if layouts is None:
        return f"aggregation {aggregation!r} has no {trainer} equal (known: {', '.join(EXACT_LAYOUTS)})"
    row_free = set(layouts) == set(ROW_LAYOUTS)
    check_layout(rows)
    if layout is None:
        if row_free:
            return None
        return (f"aggregation {aggregation!r} averages over {trainer}'s rows and the row layout was not given: "
                f"pass layout={rows!r} if each row is one {rows}, or use token_mean ({token_mean}, "
                "exact in every layout)")
    if check_layout(layout) == rows or row_free:
        return None
    words = {"turn": "one row per turn", "trajectory": "one row per trajectory"}
    return (f"aggregation {aggregation!r} on {trainer} rows of layout={layout!r} ({words[layout]}) "
            f"is not seeupo's mean over its {rows} rows (aggregation_rows={rows!r}); use token_mean ({token_mean}, "
            f"exact in every layout), or rows of one {rows} (layout={rows!r})")


def verl_loss_agg_mode(aggregation: str, layout: str | None, rows: str = "turn") -> str:
    """verl's ``actor.loss_agg_mode`` computing seeupo's ``aggregation`` (over its ``rows``) on verl rows of
    ``layout``, or a one-line InputError.

    ``token_mean`` -> ``token-mean`` in both layouts; ``seq_mean_token_mean`` ->
    ``seq-mean-token-mean`` and ``seq_mean_token_sum`` -> ``seq-mean-token-sum`` where ``layout``
    is ``rows`` (:data:`VERL_LOSS_AGG_MODES` cites verl's formulas).
    """
    reason = layout_refusal(aggregation, layout, "verl", "loss_agg_mode=token-mean", rows)
    if reason is not None:
        raise InputError("aggregation", reason)
    return next(mode for mode, (agg, _) in VERL_LOSS_AGG_MODES.items() if agg == aggregation)
