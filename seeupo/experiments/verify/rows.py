"""The rows of ``seeupo verify``: the paper's Table 1, the full grid, and registered algorithms by name."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from seeupo.core.config import PRESETS, TABLE1_CLIP, AlgorithmConfig, preset
from seeupo.core.registry import adv_estimator, policy_loss


@dataclass(frozen=True)
class Row:
    """One algorithm of the grid, and what the paper claims about it (``None``: no claim)."""

    name: str
    example: str
    advantage: str
    update: str
    level: str
    config: AlgorithmConfig
    claim_st: str | None
    claim_mt: str | None
    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = 0.05
    iterations_factor: int = 1  # one cheap step per iteration (REINFORCE) needs more iterations


def table1_rows(exact_epochs: int) -> list[Row]:
    """The paper's Table 1 rows, plus the order ablations of SeeUPO."""
    ppu = dict(epochs=exact_epochs)
    return [
        Row("ppo", "PPO", "GAE", "PPU", "token", preset("ppo", **ppu), "converges", "converges"),
        Row("grpo", "GRPO", "GRAE", "PPU", "token", preset("grpo", **ppu), "no guarantee", "no guarantee"),
        Row("reinforce_pp", "REINFORCE++", "GRAE", "PPU", "token", preset("reinforce_pp_baseline", **ppu), "no guarantee", "no guarantee"),
        Row("rloo", "RLOO", "GRAE", "REINFORCE", "sequence", preset("rloo"), "converges", "no guarantee", "sgd", 5.0, 10),
        Row("gspo", "GSPO", "GRAE", "PPU", "sequence", preset("gspo", **TABLE1_CLIP, **ppu), "converges", "no guarantee"),
        Row("seeupo", "SeeUPO", "GRAE", "HAML (reverse)", "sequence", preset("seeupo", **ppu), None, "converges"),
        Row("seeupo_forward", "SeeUPO, forward order", "GRAE", "HAML (forward)", "sequence", preset("seeupo", order="forward", **ppu), None, None),
        Row("seeupo_random", "SeeUPO, random order", "GRAE", "HAML (random)", "sequence", preset("seeupo", order="random", **ppu), None, None),
    ]


ADVANTAGES: dict[str, dict[str, object]] = {
    "GAE": dict(advantage="gae", gae_token_level=True),
    "GRAE mean": dict(advantage="grae", grae_center="mean", grae_scale="none"),
    "GRAE LOO": dict(advantage="grae", grae_center="loo", grae_scale="none"),
    "GRAE group-std": dict(advantage="grae", grae_center="mean", grae_scale="group_std"),
    "GRAE batch-z": dict(advantage="grae", grae_center="mean", grae_scale="batch_std"),
    "REINFORCE++": dict(advantage="reinforce_pp"),
}
UPDATES: dict[str, tuple[str, str, dict[str, object]]] = {
    "REINFORCE": ("REINFORCE", "sequence", dict(update="reinforce")),
    "PPU token": ("PPU", "token", dict(update="ppo", ratio_level="token")),
    "PPU seq (turn)": ("PPU", "sequence", dict(update="ppo", ratio_level="sequence", ratio_scope="turn", aggregation="seq_mean_token_mean")),
    "PPU seq (trajectory)": ("PPU", "sequence", dict(update="ppo", ratio_level="sequence", ratio_scope="trajectory", aggregation="seq_mean_token_mean")),
    "HAML reverse": ("HAML (reverse)", "sequence", dict(update="ppo", ratio_level="sequence", aggregation="seq_mean_token_mean", schedule="sequential", order="reverse")),
    "HAML forward": ("HAML (forward)", "sequence", dict(update="ppo", ratio_level="sequence", aggregation="seq_mean_token_mean", schedule="sequential", order="forward")),
    "HAML random": ("HAML (random)", "sequence", dict(update="ppo", ratio_level="sequence", aggregation="seq_mean_token_mean", schedule="sequential", order="random")),
}


def grid_choices() -> tuple[dict[str, dict[str, object]], dict[str, tuple[str, str, dict[str, object]]]]:
    """The full grid's advantage estimators and updates: :data:`ADVANTAGES` and :data:`UPDATES`, plus
    every other registered estimator (that the tabular engine runs without an oracle) and policy
    loss, with their own options at their defaults, so that a plugin's entries join the grid."""
    from seeupo.core.registry import ADV_ESTIMATORS, POLICY_LOSSES

    advantages = dict(ADVANTAGES)
    covered = {str(a["advantage"]) for a in ADVANTAGES.values()}
    for name in ADV_ESTIMATORS.names():
        entry = adv_estimator(name)
        if name not in covered and entry.tabular and not entry.needs_oracle:
            advantages[name] = dict(advantage=name)
    updates = dict(UPDATES)
    covered = {str(u[2]["update"]) for u in UPDATES.values()}
    for name in POLICY_LOSSES.names():
        if name not in covered:
            updates[name] = (name, "token" if policy_loss(name).surrogate else "sequence", dict(update=name))
    return advantages, updates


def full_grid_rows(exact_epochs: int) -> list[Row]:
    """Every advantage estimator x every policy update (no paper claims attached); see :func:`grid_choices`."""
    advantages, updates = grid_choices()
    rows = []
    for adv_name, adv in advantages.items():
        for upd_name, (update, level, upd) in updates.items():
            name = f"{adv_name} + {upd_name}".lower().replace(" ", "_").replace("+", "").replace("(", "").replace(")", "").replace("__", "_")
            config = AlgorithmConfig(name=name, **adv, **upd)
            if not policy_loss(config.update).surrogate:  # a plain policy gradient: one SGD step
                rows.append(Row(name, f"{adv_name} + {upd_name}", adv_name, update, level, config, None, None, "sgd", 5.0, 10))
            else:
                rows.append(Row(name, f"{adv_name} + {upd_name}", adv_name, update, level, config.replace(epochs=exact_epochs), None, None))
    return rows


def describe(cfg: AlgorithmConfig) -> tuple[str, str, str]:
    """``(advantage, update, level)`` of a table row, in the words of Table 1."""
    if cfg.advantage == "grae":
        scale = {"none": "", "group_std": ", group std", "batch_std": ", batch z-score"}.get(cfg.grae_scale, f", {cfg.grae_scale}")
        advantage = f"GRAE ({cfg.grae_center}{scale})"
    else:
        advantage = cfg.advantage.upper() if cfg.advantage in ("gae",) else cfg.advantage
    surrogate = policy_loss(cfg.update).surrogate
    update = {"ppo": "PPU", "reinforce": "REINFORCE"}.get(cfg.update, cfg.update)
    if cfg.schedule == "sequential":
        update = f"HAML ({cfg.order}, {update})"
    level = cfg.ratio_level if surrogate else "sequence"
    if cfg.aggregation != "token_mean":
        level += f", {cfg.aggregation}"
    return advantage, update, level


def algorithm_rows(names: list[str] | tuple[str, ...], exact_epochs: int) -> list[Row]:
    """Rows for the registered algorithms ``names`` (presets, built in or from plugins).

    A row of the paper's Table 1 keeps its claims, and runs the preset of its name: where Table 1's
    row runs another configuration (its GSPO row at the common clip 0.2, its REINFORCE++ row the
    -baseline variant) the preset's own replaces it. Any other algorithm has no claims. A plain
    policy gradient (a loss that is not a surrogate) takes one SGD step per iteration, as RLOO's row.
    """
    paper = {row.name: row for row in table1_rows(exact_epochs)}
    rows = []
    for name in names:
        if name in paper:
            row = paper[name]
            own = preset(name).replace(epochs=row.config.epochs)
            if row.config != own:
                advantage, update, level = describe(own)
                row = dataclasses.replace(row, config=own, advantage=advantage, update=update, level=level)
            rows.append(row)
            continue
        if name not in PRESETS:
            raise ValueError(f"unknown algorithm {name!r}; choose from {sorted(PRESETS)} (a plugin registers more)")
        config = preset(name)
        advantage, update, level = describe(config)
        if not policy_loss(config.update).surrogate:
            rows.append(Row(name, name, advantage, update, level, config, None, None, "sgd", 5.0, 10))
        else:
            rows.append(Row(name, name, advantage, update, level, config.replace(epochs=exact_epochs), None, None))
    return rows
