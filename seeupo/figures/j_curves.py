"""Exact ``J`` over iterations for every Table 1 algorithm, on one chosen instance and averaged over random ones.

Measured here (the recorded ``verify.json`` keeps only each cell's worst instance): the Table 1
rows of ``seeupo verify`` (same presets, step sizes and exact-mode settings) on the multi-turn
setting's random token bandits (2 turns, actions of 2 tokens from a vocabulary of 2, rewards on 3
levels, ``G = 4``; ``seeupo verify``'s problems for the seed), exact mode, independent parameters.
RLOO takes one REINFORCE step per iteration and runs 10x the iterations in ``seeupo verify``; it
is drawn every 10th step so that one tick is the same budget unit as in the verify grid.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from seeupo.figures._common import PRESET_COLORS, decreases, j_history, mean_curve, module_main, pyplot, save

INSTANCE = 0  # the chosen instance drawn in the left panel


def compute(quick: bool = False, seed: int = 0) -> dict[str, Any]:
    from seeupo.experiments.verify import QUICK, VerifyConfig, make_problems, table1_rows
    from seeupo.tabular.train import RunConfig

    cfg = dataclasses.replace(QUICK if quick else VerifyConfig(), seed=seed)
    problem = make_problems(cfg, cfg.turns_mt)
    algorithms = []
    for row in table1_rows(cfg.exact_epochs):
        factor = row.iterations_factor
        h = j_history(problem, row.config.replace(group_size=cfg.group_size),
                      RunConfig(mode="exact", iterations=cfg.iterations * factor, optimizer=row.optimizer, lr=row.lr, seed=seed))
        J = h["J"][::factor]
        algorithms.append({"row": row.name, "label": row.example, "steps_per_tick": factor, "J": J,
                           "J_decreases": decreases(h["J"]), "final_gap_mean": sum(s - j for s, j in zip(h["J_star"], J[-1])) / len(J[-1])})
    return {"setting": {"turns": cfg.turns_mt, "instances": cfg.instances, "iterations": cfg.iterations,
                        "vocab_size": cfg.vocab_size, "length": cfg.length, "reward_levels": cfg.reward_levels,
                        "group_size": cfg.group_size, "exact_epochs": cfg.exact_epochs, "seed": seed, "mode": "exact",
                        "parameterization": "independent"},
            "instance": INSTANCE, "J_star": h["J_star"], "algorithms": algorithms}


def plot(data: dict[str, Any], path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=False)
    i, j_star = data["instance"], data["J_star"]
    for a in data["algorithms"]:
        color = PRESET_COLORS.get(a["row"])
        style = "--" if a["row"] in ("seeupo_forward", "seeupo_random") else "-"
        label = a["label"] + (f" (x{a['steps_per_tick']} steps/tick)" if a["steps_per_tick"] > 1 else "")
        axes[0].plot([row[i] for row in a["J"]], style, color=color, label=label, lw=1.2)
        axes[1].plot(mean_curve(a["J"]), style, color=color, label=f"{label}: gap {a['final_gap_mean']:.1e}", lw=1.2)
    axes[0].axhline(j_star[i], color="black", ls=":", lw=1, label=f"J* = {j_star[i]:.3g}")
    axes[1].axhline(sum(j_star) / len(j_star), color="black", ls=":", lw=1, label="mean J*")
    s = data["setting"]
    axes[0].set_title(f"instance #{i}")
    axes[1].set_title(f"mean over {s['instances']} random instances (legend: final mean gap)")
    for ax in axes:
        ax.set_xlabel("iteration")
        ax.set_ylabel("exact J")
    axes[0].legend(loc="lower right")
    axes[1].legend(loc="lower right")
    fig.suptitle(f"J over iterations, exact mode, independent parameters: {s['turns']}-turn token bandits "
                 f"({s['vocab_size']}^{s['length']} actions/turn, {s['reward_levels']} reward levels, G = {s['group_size']})")
    fig.tight_layout()
    save(fig, path)


if __name__ == "__main__":
    raise SystemExit(module_main("j_curves"))
