"""Step time of SeeUPO against the baselines, from recorded benchmarks (the paper: SeeUPO about 1.2-1.9x).

Data (read, never timed here):

* ``benchmarks/results/update_time_<model>.json`` when present (``python benchmarks/update_time.py
  --model tiny-qwen3``: the controlled comparison, only ``policy_update`` timed at equal tokens,
  configurations interleaved within each repeat): SeeUPO / GRPO per repeat and the median. These
  files are not committed (``results/`` is ignored); the numbers of the recorded runs are in
  ``benchmarks/RESULTS.md``;
* ``benchmarks/results/trainer_throughput.json`` when present (median ``timing_s/step`` per preset);
* the committed bridge sweep ``paper_repro/bridge_lm/results.json``: mean wall time of a training
  step per preset and model. Those runs ran at different times under a 1-minute load of 3-11 from
  other work on a shared 2-core machine, so their ratios mix the algorithm with the load;
* the committed records of ``benchmarks/multiturn_cost.py`` in ``paper_repro/step_cost/``: one
  training step of SeeUPO and GRPO on a BFCL-shaped batch in each scoring layout (per row, packed
  trajectories, and the default prefix-shared), tokens forwarded (exact) and seconds (CPU), and the
  GPU records of ``benchmarks/gpu_step.py`` in ``paper_repro/step_cost/*/gpu_step.jsonl`` (one step at
  the Qwen3-1.7B shape, the device named).

Left: seconds per step per preset (bridge sweep). Middle: SeeUPO's time over each baseline's, with
the paper's 1.2-1.9x band. Right: SeeUPO / GRPO per scoring layout, tokens and seconds, against
the paper's band and the ``(T + 1) / 2`` of sequential updates against a packed baseline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from seeupo.figures._common import REPO, module_main, paper_repro, pyplot, read_json, rel, save

BASELINES = ("ppo", "grpo", "gspo", "rloo", "reinforce_pp")
PAPER_RATIO = (1.2, 1.9)


def _benchmark_dir() -> Path:
    local = Path("benchmarks", "results")
    return local if local.exists() else REPO / "benchmarks" / "results"


def compute(quick: bool = False, seed: int = 0) -> dict[str, Any]:
    data: dict[str, Any] = {"paper_ratio": list(PAPER_RATIO), "update_time": [], "trainer_throughput": None, "bridge": []}
    bench = _benchmark_dir()
    for path in sorted(bench.glob("update_time_*.json")):
        r = read_json(path)
        data["update_time"].append({"file": rel(path), "model": r.get("model"), "median_seconds": r.get("median_seconds"),
                                    "ratio_seeupo_over_grpo": r.get("ratio_seeupo_over_grpo"),
                                    "ratio_seeupo_equal_budget_over_grpo": r.get("ratio_seeupo_equal_budget_over_grpo"),
                                    "load_average_1min": r.get("load_average_1min")})
    tp = bench / "trainer_throughput.json"
    if tp.exists():
        data["trainer_throughput"] = {"file": rel(tp), "rows": [{k: row.get(k) for k in ("model", "preset", "step_s_median", "steps_measured")}
                                                               for row in read_json(tp).get("rows", [])]}
    bridge = paper_repro("bridge_lm", "results.json")
    if bridge.exists():
        data["bridge_source"] = rel(bridge)
        for row in read_json(bridge)["rows"]:
            data["bridge"].append({"model": row["model"], "preset": row["label"], "step_seconds_mean": row.get("step_seconds_mean"),
                                   "seeds": len(row.get("seeds", []))})
    data["layouts"] = _layout_ratios(paper_repro("step_cost"))
    notes = []
    if not data["update_time"]:
        notes.append("no benchmarks/results/update_time_*.json here (python benchmarks/update_time.py writes one)")
    if not data["bridge"]:
        notes.append(f"no {rel(bridge)}")
    if notes:
        data["note"] = "; ".join(notes)
    return data


def _layout_ratios(folder: Path) -> list[dict[str, Any]]:
    """SeeUPO / GRPO per scoring layout in each ``multiturn_cost`` record of ``folder`` (tokens; seconds if timed)."""
    rows: dict[tuple, dict[str, Any]] = {}
    for path in sorted(folder.glob("multiturn_cost_*.json")) if folder.exists() else []:
        record = read_json(path)
        by = {(r["preset"], r["layout"]): r for r in record["results"]}
        s = record["settings"]
        for layout in ("per_row", "packed", "prefix_shared"):
            see, grpo = by.get(("seeupo", layout)), by.get(("grpo", layout))
            if see is None or grpo is None:
                continue
            row = {"file": rel(path), "turns": s["turns"], "context": s["context"], "early_end": s.get("early_end", 0.0),
                   "device": "CPU", "layout": layout,
                   "tokens_ratio": sum(see["tokens"].values()) / sum(grpo["tokens"].values())}
            if "seconds" in see and "seconds" in grpo:
                row["seconds_ratio"] = sum(see["seconds"].values()) / sum(grpo["seconds"].values())
            key = (row["turns"], row["context"], row["early_end"], layout)
            # a timed record of a shape is kept over a count-only one (the same exact token counts)
            if key not in rows or "seconds_ratio" in row:
                rows[key] = row
    return list(rows.values()) + _gpu_layout_ratios(folder)


def _gpu_layout_ratios(folder: Path) -> list[dict[str, Any]]:
    """SeeUPO / GRPO per scoring layout in the GPU records ``folder/*/gpu_step.jsonl`` (``benchmarks/gpu_step.py``):
    the timed steps of the fused ``seeupo`` and of ``grpo`` at the trainer's defaults (the ``default``
    arm; the other arms pull levers), tokens and seconds, the device named."""
    rows = []
    for path in sorted(folder.glob("*/gpu_step.jsonl")) if folder.exists() else []:
        steps = [r for r in map(json.loads, path.read_text().splitlines())
                 if r.get("event") == "step" and r.get("rep") == "timed" and "error" not in r
                 and r.get("arm", "default") == "default"]
        by = {(r["T"], r["preset"], r["layout"]): r for r in steps}
        for (turns, preset, layout), see in by.items():
            grpo = by.get((turns, "grpo", layout))
            if preset != "seeupo" or grpo is None:
                continue
            device = see["device"].replace("NVIDIA ", "").split()[0]
            rows.append({"file": rel(path), "turns": turns, "context": 5833, "early_end": 0.0, "device": device,
                         "layout": layout, "tokens_ratio": sum(see["tokens"].values()) / sum(grpo["tokens"].values()),
                         "seconds_ratio": see["step_seconds"] / grpo["step_seconds"]})
    return rows


def _ratios(rows: list[dict[str, Any]], time_key: str) -> dict[str, dict[str, float]]:
    """Per model, SeeUPO's time over each baseline's (and the equal-budget variant's)."""
    out: dict[str, dict[str, float]] = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        t = {r["preset"]: r[time_key] for r in rows if r["model"] == model and r.get(time_key)}
        for sv in ("seeupo", "seeupo-equal_budget"):
            if sv in t:
                for b in BASELINES:
                    if b in t:
                        out.setdefault(f"{model}: {sv}", {})[b] = t[sv] / t[b]
    return out


def plot(data: dict[str, Any], path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    ax = axes[0]
    models = list(dict.fromkeys(r["model"] for r in data["bridge"]))
    presets = list(dict.fromkeys(r["preset"] for r in data["bridge"]))
    width = 0.8 / max(1, len(models))
    for k, model in enumerate(models):
        t = {r["preset"]: r["step_seconds_mean"] for r in data["bridge"] if r["model"] == model}
        xs = [i + k * width for i, p in enumerate(presets) if t.get(p)]
        ax.bar(xs, [t[p] for p in presets if t.get(p)], width, label=model)
    ax.set_yscale("log")
    ax.set_xticks([i + width * (len(models) - 1) / 2 for i in range(len(presets))], presets, rotation=35, ha="right")
    ax.set_ylabel("mean seconds per training step (log)")
    ax.set_title("bridge sweep (recorded; uncontrolled load 3-11)")
    if models:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no bridge sweep recorded", ha="center", va="center", transform=ax.transAxes)
    ax = axes[1]
    ax.axhspan(*data["paper_ratio"], color="#ffe082", alpha=0.6, label=f"paper: {data['paper_ratio'][0]}-{data['paper_ratio'][1]}x")
    ax.axhline(1.0, color="black", lw=0.8)
    labels = []
    for y, (name, per) in enumerate(_ratios(data["bridge"], "step_seconds_mean").items()):
        labels.append(f"{name}\n(step, bridge)")
        for b, v in per.items():
            ax.plot(y, v, "o", color="C%d" % BASELINES.index(b), ms=4, label=f"over {b}" if y == 0 else None)
    for u in data["update_time"]:
        for key, name in (("ratio_seeupo_over_grpo", "seeupo"), ("ratio_seeupo_equal_budget_over_grpo", "seeupo-equal_budget")):
            vals = u.get(key) or []
            if vals:
                y = len(labels)
                labels.append(f"{u['model']}: {name}\n(update only, vs grpo)")
                ax.plot([y] * len(vals), vals, "_", color="black", ms=10)
                ax.plot(y, sorted(vals)[len(vals) // 2], "D", color="black", ms=5)
    ax.set_xticks(range(len(labels)), labels, rotation=35, ha="right", fontsize=6)
    ax.set_yscale("log")
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.set_yticks([t for t in (0.1, 0.2, 0.5, 1, 2, 5, 10)])
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel("SeeUPO time / baseline time (log)")
    ax.set_title("ratios" + ("" if data["update_time"] else " (no update_time benchmark file here)"))
    ax.legend(fontsize=6, loc="upper right")
    _plot_layouts(axes[2], data)
    fig.suptitle("Step time: SeeUPO vs the baselines (CPU: tiny models; GPUs: Qwen3-1.7B shape; the paper: 14B models on GPUs)")
    fig.tight_layout()
    save(fig, path)


def _plot_layouts(ax, data: dict[str, Any]) -> None:
    """SeeUPO / GRPO per scoring layout: what the comparison depends on. Per GPU, the last record in
    name order only (``<device>_<date>[-pass]``: the newest), so that one device's bars come from one run."""
    rows = data.get("layouts") or []
    newest = {r["device"]: r["file"] for r in rows if r.get("device", "CPU") != "CPU"}
    rows = [r for r in rows if r.get("device", "CPU") == "CPU" or r["file"] == newest[r["device"]]]
    ax.axhspan(*data["paper_ratio"], color="#ffe082", alpha=0.6, label="paper (both unpacked)")
    ax.axhline(1.0, color="black", lw=0.8)
    shape_of = lambda r: (r["turns"], r["context"], r["early_end"], r.get("device", "CPU"))  # noqa: E731
    shapes = list(dict.fromkeys(shape_of(r) for r in rows))
    layouts = ("per_row", "packed", "prefix_shared")
    width = 0.8 / max(1, 2 * len(shapes))
    for k, (turns, context, early, device) in enumerate(shapes):
        name = f"{device}, T={turns}, context {context}" + (f", {early:g} end early" if early else "")
        for j, key in enumerate(("tokens_ratio", "seconds_ratio")):
            vals = {r["layout"]: r.get(key) for r in rows if shape_of(r) == (turns, context, early, device)}
            xs = [i + (2 * k + j) * width for i, lay in enumerate(layouts) if vals.get(lay)]
            if xs:
                ax.bar(xs, [vals[lay] for lay in layouts if vals.get(lay)], width, color=f"C{k}",
                       alpha=1.0 if j else 0.45, label=f"{name}: {key.split('_')[0]}")
        ax.axhline((turns + 1) / 2, color=f"C{k}", ls=":", lw=1)
    if not rows:
        ax.text(0.5, 0.5, "no paper_repro/step_cost records", ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([i + width * (2 * len(shapes) - 1) / 2 for i in range(len(layouts))],
                  ["per row (paper)", "packed", "prefix-shared (default)"])
    ax.set_ylabel("SeeUPO / GRPO, one training step")
    ax.set_title("by scoring layout (dotted: (T+1)/2)", fontsize=9)
    top = max([r.get("seconds_ratio") or r["tokens_ratio"] for r in rows] + [(t + 1) / 2 for t, *_ in shapes] + [2.0])
    ax.set_ylim(0, 1.6 * top)  # room for the legend above the bars
    ax.legend(fontsize=6, loc="upper left", ncol=2)


if __name__ == "__main__":
    raise SystemExit(module_main("step_time"))
