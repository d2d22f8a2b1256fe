"""TRL's GRPOTrainer ``loss_type`` that aggregates token losses as a seeupo aggregation does.

::

    from seeupo.integrations.trl import trl_loss_type

    trl_loss_type("token_mean", layout="trajectory")  # 'dapo'

TRL's ``loss_type`` names both a per-token loss and a reduction. This module maps only the
reduction, among the loss types whose per-token loss is the clipped surrogate (TRL 1.16.0,
``trl/trainer/grpo_trainer.py``, ``GRPOTrainer._compute_loss``: ``"grpo"``, ``"bnpo"``,
``"dr_grpo"``, ``"dapo"`` and ``"luspo"`` share ``-min(coef_1 * A, clamp(coef_1) * A)``). In
``_compute_loss``, with ``mask`` the completion mask (times the tool mask in multi-turn runs),
``G`` = ``current_gradient_accumulation_steps`` micro-batches of ``per_device_train_batch_size``
rows each, and the data-parallel ranks' gradients averaged:

* ``"grpo"``: ``((loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean() / G`` per micro-batch,
  a mean over rows of each row's token mean: seeupo's ``seq_mean_token_mean`` (the micro-batches
  have equal row counts, so their means add up to the batch's);
* ``"luspo"``: ``(loss * mask).sum(-1).mean() / G``: seeupo's ``seq_mean_token_sum``;
* ``"dapo"``: ``(loss * mask).sum() / normalizer`` with ``normalizer = num_items_in_batch /
  num_processes * G / steps_per_generation`` and ``num_items_in_batch`` the token count of the
  whole generation batch (``_generate_and_score_completions``): with ``steps_per_generation ==
  gradient_accumulation_steps`` (TRL's default, ``GRPOConfig.__post_init__``) the token count of
  the optimizer step's batch, seeupo's ``token_mean``;
* ``"bnpo"``: ``(loss * mask).sum() / mask.sum() / G``: each micro-batch's own token mean, a
  token mean of the batch only when every micro-batch has the same token count; no seeupo equal;
* ``"dr_grpo"``: ``(loss * mask).sum() / (rows * max_completion_length) / G``:
  ``seq_mean_token_sum / max_completion_length``, a constant factor away from seeupo's; no equal.

Rows are turns (``layout="turn"``: single-turn GRPO) or trajectories (``"trajectory"``: TRL's
multi-turn tool calling, one completion per conversation); :mod:`seeupo.integrations.layout`
says why only ``token_mean`` is exact in both. Runtime code never needs TRL; this module does
not import it.
"""

from __future__ import annotations

from seeupo.integrations.layout import layout_refusal
from seeupo.validation.errors import InputError

# seeupo aggregation -> TRL 1.16.0 GRPOConfig.loss_type of the same reduction on the same rows
# (formulas and source: the module docstring; tested in tests/integrations/test_trl.py)
TRL_LOSS_TYPES: dict[str, str] = {
    "token_mean": "dapo",
    "seq_mean_token_mean": "grpo",
    "seq_mean_token_sum": "luspo",
}


def trl_loss_type(aggregation: str, layout: str | None, rows: str = "turn") -> str:
    """TRL's ``GRPOConfig.loss_type`` reducing token losses on rows of ``layout`` as seeupo's ``aggregation`` over
    its ``rows`` (``AlgorithmConfig.aggregation_rows``).

    ``token_mean`` -> ``"dapo"`` in both layouts; ``seq_mean_token_mean`` -> ``"grpo"`` and
    ``seq_mean_token_sum`` -> ``"luspo"`` where ``layout`` is ``rows`` (TRL's ``luspo`` warns unless
    ``importance_sampling_level="sequence"``, and its reduction is ``seq_mean_token_sum`` either way).
    Anything else is a one-line :class:`~seeupo.validation.errors.InputError` naming the aggregation,
    the layout and what to use instead.
    """
    if aggregation in TRL_LOSS_TYPES:
        reason = layout_refusal(aggregation, layout, "TRL", "loss_type='dapo'", rows)
    else:
        reason = f"aggregation {aggregation!r} has no TRL loss_type (known: {', '.join(TRL_LOSS_TYPES)})"
    if reason is not None:
        raise InputError("aggregation", reason)
    return TRL_LOSS_TYPES[aggregation]
