"""The normalisation ablation: SeeUPO's GRAE scaled by the batch z-score (SeeUPO), the group std (GRPO) or not at all.

Measured here: SeeUPO (reverse order, HAPPO ``M``) with ``grae_scale`` = ``batch_std`` / ``group_std`` /
``none``, on the verify grid's 2-turn random token bandits (rewards on 3 levels, ``G = 4``),
independent parameters; exact mode (surrogate maximised, exact expectations) and sampled mode (4 tasks
x ``G`` rollouts per instance, 2 epochs x 2 minibatches, as an LLM run). The paper reports batch and
group normalisation about equal and both above none (on LLMs).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from seeupo.figures._common import module_main, plot_variants, variant_runs

VARIANTS = {"batch z-score (SeeUPO)": {"grae_scale": "batch_std"}, "group std (GRPO)": {"grae_scale": "group_std"},
            "none (mean-centred)": {"grae_scale": "none"}}
COLORS = dict(zip(VARIANTS, ("#d62728", "#ff7f0e", "#1f77b4")))


def compute(quick: bool = False, seed: int = 0) -> dict[str, Any]:
    from seeupo.experiments.verify import QUICK, VerifyConfig, make_problems

    cfg = dataclasses.replace(QUICK if quick else VerifyConfig(), seed=seed)
    problem = make_problems(cfg, cfg.turns_mt)
    modes = {"exact": {"epochs": cfg.exact_epochs, "group_size": cfg.group_size, "iterations": cfg.iterations},
             "sampled": {"epochs": 2, "minibatches": 2, "group_size": cfg.group_size, "iterations": cfg.iterations * 4, "tasks": cfg.tasks}}
    return {"setting": {"problems": "random token bandits (verify grid)", "turns": cfg.turns_mt, "instances": cfg.instances,
                        "reward_levels": cfg.reward_levels, "group_size": cfg.group_size, "seed": seed},
            "runs": variant_runs(problem, VARIANTS, modes, seed)}


def plot(data: dict[str, Any], path) -> None:
    s = data["setting"]
    plot_variants(data, path, f"Advantage normalisation in SeeUPO ({s['turns']}-turn token bandits, {s['reward_levels']} reward "
                              f"levels, G = {s['group_size']}, independent parameters)", COLORS)


if __name__ == "__main__":
    raise SystemExit(module_main("normalisation_ablation"))
