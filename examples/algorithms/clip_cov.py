"""Clip-Cov as a plugin: GRPO whose clipped surrogate gives no gradient to a drawn share of high-covariance tokens.

Cui, Zhang, Chen, Yuan, Wang, Zuo, Li, Fan, Chen, Chen, Liu, Peng, Bai, Ouyang, Cheng, Zhou, Ding (2025), "The
Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", arXiv:2505.22617, §4.2 (Eqs. 10-12);
the code read: verl ``verl/trainer/ppo/core_algos.py`` ``compute_policy_loss_clip_cov`` (merged in verl PR #1830,
the same logic at b178a3cd).

Each valid token's centred covariance of its log-probability under the current policy and its advantage,
``cov_i = (A_i - mean A)(log pi_i - mean log pi)`` (:func:`seeupo.core.losses.token_covariance`), picks the tokens:
``max(int(CLIP_COV_RATIO * N), 1)`` of those with ``CLIP_COV_LB < cov < CLIP_COV_UB`` whose clip is not already
active, drawn uniformly, get no gradient; ``N`` is the batch's valid-token count (verl: the micro-batch's). verl
draws them with ``torch.randperm``; here each candidate's term is multiplied by ``1 - q``, ``q`` the share of the
candidates drawn: the same expected gradient without a draw (a registered loss must be deterministic for the exact
mode). The exact mode's batch stands for one sampled batch: its means are weighted by the rows' probabilities, its
``N`` is its own token count; with the tabular engine's small batches ``int(2e-4 N)`` is 0 and one token is drawn,
as verl's ``max(., 1)`` does.

The constants are the paper's §4.3 settings (r = 2e-4, bounds 1 and 5; verl's defaults too); a run records the
plugin's SHA-256, so an edited constant is a recorded change. The preset ``clip_cov`` is GRPO with this loss and the
authors' clip of 1 / 1 (``recipe/entropy/7b_clip_cov.sh``; the lower one ``1 - 1e-6`` here, as the configuration keeps
the ratio's lower bound above 0). The authors' recipes start from DAPO (clip-higher, dynamic sampling); this is the
loss alone, on GRPO.

Use: ``seeupo check clip_cov --plugin examples/algorithms/clip_cov.py``.
"""

from __future__ import annotations

from typing import Any

from seeupo.core.config import preset, register_preset
from seeupo.core.registry import register_policy_loss

CLIP_COV_RATIO = 2e-4
CLIP_COV_LB = 1.0
CLIP_COV_UB = 5.0


@register_policy_loss("clip_cov")
def clip_cov(logp_new: Any, batch: Any, adv: Any, cfg: Any) -> tuple[Any, Any]:
    """Clip-Cov (Cui et al. 2025): the clipped surrogate, the expected share of mid-covariance tokens without gradient."""
    import torch

    from seeupo.core.losses import clipped_surrogate, token_covariance

    valid = batch.token_mask & batch.valid[:, None]
    ratio = torch.exp(torch.where(valid, logp_new - batch.logp_old, 0.0))
    obj = clipped_surrogate(ratio, adv, cfg.clip_eps_low, cfg.clip_eps_high)
    clip_active = (obj < ratio * adv) & valid  # verl's clip_by_origin: the clipped term is the one taken
    cov = token_covariance(logp_new, batch, adv)
    candidates = valid & ~clip_active & (cov > CLIP_COV_LB) & (cov < CLIP_COV_UB)
    drawn = max(int(CLIP_COV_RATIO * int(valid.sum())), 1)
    count = int(candidates.sum())
    keep = 1.0 - (min(drawn, count) / count if count else 0.0)  # the expected mask of a uniform draw
    obj = torch.where(candidates, obj * keep, obj)
    with torch.no_grad():
        clipped = ((ratio < 1 - cfg.clip_eps_low) | (ratio > 1 + cfg.clip_eps_high)) & valid
    return obj, clipped


register_preset(preset("grpo", name="clip_cov", update="clip_cov", clip_eps_low=1 - 1e-6, clip_eps_high=1.0))
