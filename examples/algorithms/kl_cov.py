"""KL-Cov as a plugin: GRPO's unclipped surrogate with an absolute log-ratio penalty on the tokens of largest covariance.

Cui, Zhang, Chen, Yuan, Wang, Zuo, Li, Fan, Chen, Chen, Liu, Peng, Bai, Ouyang, Cheng, Zhou, Ding (2025), "The
Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", arXiv:2505.22617, §4.2 (Eqs. 10, 13-14);
the code read: verl ``verl/trainer/ppo/core_algos.py`` ``compute_policy_loss_kl_cov`` (merged in verl PR #1830, the
same logic at b178a3cd).

Each valid token's centred covariance of its log-probability under the current policy and its advantage
(:func:`seeupo.core.losses.token_covariance`) ranks the tokens; the ``max(int(KL_COV_RATIO * N), 1)`` largest get
``- KL_COV_COEF * |log pi - log pi_old|`` added to the unclipped surrogate ``r A`` (no clip anywhere, as verl's
code: the paper writes ``D_KL(pi_old || pi)``, verl and the authors' Listing 1 the absolute log-ratio). ``N`` is the
batch's valid-token count (verl: the micro-batch's); the exact mode's batch stands for one sampled batch (weighted
means, its own token count), and with the tabular engine's small batches one token is penalised.

The constants are the paper's §4.3 settings (k = 2e-4, beta = 1; verl's config has ``ppo_kl_coef`` 0.1); a run
records the plugin's SHA-256. The preset ``kl_cov`` is GRPO with this loss; the authors' recipes start from DAPO.

Use: ``seeupo check kl_cov --plugin examples/algorithms/kl_cov.py``.
"""

from __future__ import annotations

from typing import Any

from seeupo.core.config import preset, register_preset
from seeupo.core.registry import register_policy_loss

KL_COV_RATIO = 2e-4
KL_COV_COEF = 1.0


@register_policy_loss("kl_cov")
def kl_cov(logp_new: Any, batch: Any, adv: Any, cfg: Any) -> tuple[Any, Any]:
    """KL-Cov (Cui et al. 2025): the unclipped surrogate, ``- |log r|`` on the tokens of largest covariance."""
    import torch

    from seeupo.core.losses import token_covariance

    valid = batch.token_mask & batch.valid[:, None]
    log_ratio = torch.where(valid, logp_new - batch.logp_old, 0.0)
    obj = torch.exp(log_ratio) * adv
    cov = token_covariance(logp_new, batch, adv)
    n = int(valid.sum())
    k = min(max(int(KL_COV_RATIO * n), 1), n)
    chosen = torch.zeros_like(valid)
    if k > 0:
        chosen.view(-1)[torch.topk(cov.reshape(-1), k).indices] = True
    return torch.where(chosen, obj - KL_COV_COEF * log_ratio.abs(), obj), None


register_preset(preset("grpo", name="kl_cov", update="kl_cov"))
