"""The language-model bridge: the exact ``J`` of a language model after every training step, every preset.

Data: the recorded sweep ``paper_repro/bridge_lm/results.json`` (``python -m
seeupo.experiments.bridge_lm --out results/bridge_lm`` regenerates it, about an hour on 2 CPU cores;
read here, not rerun). One panel per model; one line per preset and seed (the exact ``J`` of the
language model on the bridge's tabular problem, by teacher-forcing every action); a red triangle
marks each step where ``J`` fell (by more than the sweep's ``decrease_tol``). The ``m_refresh`` 3-turn
ablation is a third panel when recorded.
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


def compute(quick: bool = False, seed: int = 0) -> dict[str, Any]:
    path = paper_repro("bridge_lm", "results.json")
    if not path.exists():
        return {"source": None, "panels": [], "note": f"no recorded {rel(path)}: run python -m seeupo.experiments.bridge_lm"}
    return {"source": rel(path), "panels": _panels(read_json(path))}


def plot(data: dict[str, Any], path) -> None:
    plt = pyplot()
    panels = data["panels"]
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.2 * max(1, len(panels)), 3.8), squeeze=False)
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
    fig.suptitle("Language models on the bridge: exact J per step, every preset and seed (red: a step where J fell)")
    fig.tight_layout()
    save(fig, path)


if __name__ == "__main__":
    raise SystemExit(module_main("bridge_lm"))
