"""Dr. GRPO as a plugin: GRPO without its two biased normalisers.

Liu, Chen, Li, Pang, Du, Lee, Lin (2025), "Understanding R1-Zero-Like Training: A Critical
Perspective", arXiv:2503.20783, §3.2 ("Dr. GRPO: Group Relative Policy Optimization Done Right").

Dr. GRPO removes two normalisers from GRPO's objective:

1. the group std of the advantage (a question-level difficulty bias): ``A_i = R_i - mean_j R_j``.
   That is the built-in ``grae`` estimator with ``grae_scale="none"``: nothing to register.
2. the per-response length ``1/|o_i|`` (a response-level length bias): the objective sums the
   tokens of each response instead of averaging them, and the authors' code divides that sum by
   a constant, the generation budget (``masked_sum(..., constant_normalizer=generate_max_length)``
   per response, then a mean over responses). That is the aggregation registered here, in the
   registry's ``(per_row, den_terms)`` form::

       aggregate = sum_i w_i sum_j x_ij / (MAX_TOKENS * sum_k w_k)      (c_i = w_i / (MAX_TOKENS sum_k w_k))

   with ``k`` over the valid rows of the instance. A row is one turn's response, so
   ``MAX_TOKENS`` is the budget of one turn (the language-model trainer's
   ``rollout.max_new_tokens``, 512 by default).

What it is not: the built-in ``seq_mean_token_sum`` has ``c_i = w_i / sum_k w_k``, the same up to
the constant factor ``1 / MAX_TOKENS``. The direction of every update is the same; the constant
sets the step size (exactly so for SGD; Adam is nearly invariant to it) and keeps a per-token
scale comparable to ``token_mean`` when responses fill the budget, which is why the paper divides
by it. The aggregation receives only the rows' token counts and weights, so the constant cannot
come from the run's config: it is the module constant below (a run records the plugin's SHA-256,
so an edited constant is a recorded change).

Left out, and why: nothing of the method on single-turn data. On multi-turn data ``sum_k w_k``
counts valid *turns*, so an episode that ends early lowers the denominator: a trajectory-level
constant (``trajectories x turns x MAX_TOKENS``) would need the rows' trajectory ids, which an
aggregation does not receive. On the toy problems (sequential bandits: every episode has all
``T`` turns, every action the same number of tokens) the denominator is that constant exactly.

Use: the plugin registers the preset ``dr_grpo``, ``preset("grpo", name="dr_grpo",
grae_scale="none", aggregation="dr_grpo_token_sum")``::

    seeupo train run.yaml --plugin examples/algorithms/dr_grpo.py --set algorithm.preset=dr_grpo
    seeupo check dr_grpo --plugin examples/algorithms/dr_grpo.py

and in Python, after :func:`seeupo.plugins.load_plugin`, ``preset("dr_grpo", epochs=2)``.
"""

from __future__ import annotations

from typing import Any

from seeupo.core.config import preset, register_preset
from seeupo.core.registry import register_aggregation

MAX_TOKENS = 512
"""The constant normaliser: the generation budget of one turn (the LM trainer's default ``max_new_tokens``)."""

AGGREGATION = "dr_grpo_token_sum"


@register_aggregation(AGGREGATION)
def dr_grpo_token_sum(n_tokens: Any, weight: Any) -> tuple[Any, Any]:
    """Dr. GRPO: token sum per row over a constant budget, mean over rows: ``c_i = w_i / (MAX_TOKENS sum_k w_k)``."""
    return weight, weight * MAX_TOKENS


PRESET = register_preset(preset("grpo", name="dr_grpo", grae_scale="none", aggregation=AGGREGATION))
