"""The language-model bridge: the exact ``J`` of a language model after every training step, every preset.

Data: the recorded sweep ``paper_repro/bridge_lm/results.json`` (``python -m
seeupo.experiments.bridge_lm --out results/bridge_lm`` regenerates it, about an hour on 2 CPU cores;
read here, not rerun). One panel per model; one line per preset and seed (the exact ``J`` of the
language model on the bridge's tabular problem, by teacher-forcing every action); a red triangle
marks each step where ``J`` fell (by more than the sweep's ``decrease_tol``). The ``m_refresh`` 3-turn
ablation is a third panel when recorded.

Three seeds show what can happen, not how often: the second row reads the seed grid's summary
``paper_repro/bridge_lm/grid.json`` (``python -m seeupo.experiments.bridge_lm --grid``) and draws,
per preset and learning rate, the rate of runs that collapse and of runs with a one-step drop, with
their 95% intervals, and the Fisher tests of the grid.
"""

from __future__ import annotations

from typing import Any

from seeupo.figures._common import module_main, paper_repro, pyplot, read_json, rel, save

COLORS = {"ppo": "#1f77b4", "grpo": "#ff7f0e", "gspo": "#2ca02c", "rloo": "#9467bd", "reinforce_pp": "#8c564b",
          "seeupo": "#d62728", "seeupo-m_refresh": "#e377c2", "seeupo-equal_budget": "#17becf"}


def _label(run: dict[str, Any]) -> str:
    return run["preset"] + (f"-{run['variant']}" if run.get("variant") else "")


def _panels(results: dict[str, Any]) -> list[dict[str, Any]]:
    tol = results["settings"].get("decrease_tol", 1e-6)
    sets = [("", results)] + [(f" ({name})", ab) for name, ab in results.get("ablations", {}).items()]
    panels = []
    for suffix, part in sets:
        turns = part["settings"]["bridge"]["turns"]
        for model in dict.fromkeys(r["model"] for r in part["runs"]):
            runs = [r for r in part["runs"] if r["model"] == model]
            panels.append({"title": f"{model}, {turns}-turn bridge{suffix}", "decrease_tol": tol, "J_star": runs[0]["J_star"],
                           "runs": [{"label": _label(r), "seed": r["seed"], "J": r["J"], "decreases": r["decreases"],
                                     "largest_decrease": r["largest_decrease"]} for r in runs]})
    return panels


def _rates(grid: dict[str, Any]) -> dict[str, Any]:
    """The grid's cells (rates with intervals) and tests, without its per-run rows."""
    keep = ("lr", "label", "seeds", "collapse", "drop")
    return {"settings": grid["settings"], "cells": [{k: c[k] for k in keep} for c in grid["cells"]], "tests": grid["tests"]}


def compute(quick: bool = False, seed: int = 0) -> dict[str, Any]:
    path = paper_repro("bridge_lm", "results.json")
    grid_path = paper_repro("bridge_lm", "grid.json")
    grid = {"grid_source": rel(grid_path), "grid": _rates(read_json(grid_path))} if grid_path.exists() else {"grid": None}
    if not path.exists():
        return {"source": None, "panels": [], "note": f"no recorded {rel(path)}: run python -m seeupo.experiments.bridge_lm"} | grid
    return {"source": rel(path), "panels": _panels(read_json(path))} | grid


def _plot_rates(ax, grid: dict[str, Any], event: str, title: str) -> None:
    labels = list(dict.fromkeys(c["label"] for c in grid["cells"]))
    lrs = sorted({c["lr"] for c in grid["cells"]})
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        cells = {c["lr"]: c[event] for c in grid["cells"] if c["label"] == label}
        xs = [j + (i - (len(labels) - 1) / 2) * width for j, lr in enumerate(lrs) if lr in cells]
        rs = [cells[lr] for lr in lrs if lr in cells]
        ax.errorbar(xs, [r["rate"] for r in rs], yerr=[[r["rate"] - r["lo"] for r in rs], [r["hi"] - r["rate"] for r in rs]],
                    fmt="o", color=COLORS.get(label), capsize=3, ms=5, label=label)
        for x, r in zip(xs, rs):
            ax.annotate(f"{r['k']}/{r['n']}", (x, r["hi"]), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=5)
    ax.set_xticks(range(len(lrs)), [f"{lr:g}" for lr in lrs])
    ax.set_ylim(-0.03, 1.08)
    ax.set_xlabel("learning rate of the RL steps")
    ax.set_ylabel("fraction of runs (95% CI)")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=6, loc="upper left")


def _tests_text(grid: dict[str, Any]) -> str:
    lines = [f"Fisher's exact test, two-sided, {grid['settings']['reference']} vs each preset", "(p not adjusted for multiple tests)", ""]
    for t in grid["tests"]:
        lines.append(f"{t['group']}, {t['event']}: {t['a_k']}/{t['a_n']} vs {t['b']} {t['b_k']}/{t['b_n']}: p = {t['p']:.2g}")
    return "\n".join(lines)


def plot(data: dict[str, Any], path) -> None:
    plt = pyplot()
    panels, grid = data["panels"], data.get("grid")
    cols = max(1, len(panels), 3 if grid else 1)
    rows = 2 if grid else 1
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.8 * rows), squeeze=False)
    for ax in axes[0][len(panels):]:
        ax.axis("off")
    if not panels:
        axes[0][0].text(0.5, 0.5, data.get("note", "no data"), ha="center", va="center", wrap=True)
        axes[0][0].axis("off")
    for ax, panel in zip(axes[0], panels):
        totals: dict[str, list[int]] = {}
        for r in panel["runs"]:
            color = COLORS.get(r["label"])
            first = r["label"] not in totals
            totals.setdefault(r["label"], []).append(r["decreases"])
            ax.plot(r["J"], color=color, lw=1, alpha=0.8, label=r["label"] if first else None)
            drops = [k + 1 for k, (a, b) in enumerate(zip(r["J"], r["J"][1:])) if a - b > panel["decrease_tol"]]
            ax.plot(drops, [r["J"][k] for k in drops], "v", color="red", ms=4, mec="black", mew=0.4)
        ax.axhline(panel["J_star"], color="black", ls=":", lw=1)
        handles, labels = ax.get_legend_handles_labels()
        labels = [f"{lab}: {sum(totals[lab])} dec." for lab in labels]
        ax.plot([], [], "v", color="red", mec="black", mew=0.4, label="J fell")
        h2, l2 = ax.get_legend_handles_labels()
        ax.legend(handles + h2[-1:], labels + l2[-1:], fontsize=6, loc="lower right")
        ax.set_title(panel["title"], fontsize=8)
        ax.set_xlabel("training step")
        ax.set_ylabel("exact J of the language model (J* dotted)")
    if grid:
        st = grid["settings"]
        _plot_rates(axes[1][0], grid, "collapse", f"runs whose exact J fell below {st['collapse_below_J']:g} (collapse)")
        _plot_rates(axes[1][1], grid, "drop", f"runs with a one-step drop of J above {st['drop_above']:g}")
        axes[1][2].axis("off")
        axes[1][2].text(0, 1, _tests_text(grid), va="top", ha="left", fontsize=5.5, family="monospace",
                        transform=axes[1][2].transAxes)
        for ax in axes[1][3:]:
            ax.axis("off")
    fig.suptitle("Language models on the bridge. Top: exact J per step, every preset, 3 seeds (red: a step where J fell). "
                 + ("Bottom: over many seeds per (preset, lr), how often J collapses or drops" if grid else ""), fontsize=9)
    fig.tight_layout()
    save(fig, path)


if __name__ == "__main__":
    raise SystemExit(module_main("bridge_lm"))
