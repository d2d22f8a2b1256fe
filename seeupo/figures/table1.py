"""Table 1 as measured: a heat map of verdicts, algorithm x {ST, MT} x {exact, sampled} x {independent, shared}.

Data: the recorded ``seeupo verify`` run, ``paper_repro/table1/verify.json`` (read, not recomputed;
``seeupo verify --out paper_repro/table1`` regenerates it). Without that file, ``compute`` runs a
small verify grid (every mode and parameterisation) instead.

Each cell's colour is what was measured (green: converges / reaches J*; light green: monotone,
still improving; yellow: stuck below J* / gap remains; red: J decreased). The exact,
independent-parameter column is the one the paper's Table 1 speaks of: it shows the paper's claim
and Table 1's verdict (which counts the saved counterexamples), and a thick red frame marks a
disagreement with the paper. Sampled cells print their (noise) J decreases.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from seeupo.figures._common import BAD, GOOD, MEH, NONE, module_main, paper_repro, pyplot, read_json, rel, save

COLUMNS = [(s, m, p) for s in ("ST", "MT") for m in ("exact", "sampled") for p in ("independent", "shared")]
COLOR = {"converges": GOOD, "reaches J*": GOOD, "monotone, still improving": "#c5e1a5",
         "monotone, stuck below J*": MEH, "gap remains": MEH, "J decreased": BAD}
SHORT = {"converges": "converges", "reaches J*": "reaches J*", "monotone, still improving": "still\nimproving",
         "monotone, stuck below J*": "stuck\nbelow J*", "gap remains": "gap\nremains", "J decreased": "J\ndecreased"}


def _from_report(report: dict[str, Any], source: str) -> dict[str, Any]:
    # Table 1's own settings; the agentic families' cells have their own table in verify.md
    cells = [{k: c[k] for k in ("row", "setting", "mode", "parameterization", "verdict", "note", "violations",
                                "max_final_gap")} for c in report["cells"] if c["setting"] in ("ST", "MT")]
    table = []
    for e in report["table1"]:
        entry = {"row": e["row"], "example": e["example"]}
        for s in ("ST", "MT"):
            v = e.get(s) or {}
            entry[s] = {"paper": v.get("paper"), "measured": v.get("measured"), "agreement": v.get("agreement"),
                        "counterexamples": [c["file"] for c in v.get("counterexamples", [])]}
        table.append(entry)
    cfg = report["config"]
    return {"source": source, "config": {k: cfg[k] for k in ("instances", "iterations", "turns_mt", "group_size", "reward_levels")},
            "cells": cells, "table1": table}


def compute(quick: bool = False, seed: int = 0) -> dict[str, Any]:
    path = paper_repro("table1", "verify.json")
    if path.exists():
        return _from_report(read_json(path), rel(path))
    from seeupo.experiments.verify import QUICK, VerifyConfig, verify

    cfg = dataclasses.replace(QUICK if quick else VerifyConfig(), modes=("exact", "sampled"),
                              parameterizations=("independent", "shared"), seed=seed)
    data = _from_report(verify(cfg), "computed now (no recorded paper_repro/table1/verify.json)")
    return data | {"note": "no recorded verify.json: computed a verify grid now"}


def plot(data: dict[str, Any], path) -> None:
    from matplotlib.patches import Patch, Rectangle

    plt = pyplot()
    rows = data["table1"]
    cells = {(c["row"], c["setting"], c["mode"], c["parameterization"]): c for c in data["cells"]}
    fig, ax = plt.subplots(figsize=(9.5, 0.62 * len(rows) + 1.9))
    for i, r in enumerate(rows):
        for j, (s, m, p) in enumerate(COLUMNS):
            c = cells.get((r["row"], s, m, p))
            t1 = r[s] if (m, p) == ("exact", "independent") else None
            measured = (t1 or {}).get("measured") or (c or {}).get("verdict")
            measured = None if measured in ("—", "") else measured
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=COLOR.get(measured, NONE), edgecolor="white", lw=1))
            if measured is None:
                ax.text(j + 0.5, i + 0.5, "—", ha="center", va="center")
                continue
            text = SHORT.get(measured, measured)
            if t1 is not None and t1.get("paper") not in (None, "", "—"):
                text = f"{text}\npaper: {t1['paper']}\n-> {t1.get('agreement')}"
            if t1 is not None and t1.get("counterexamples"):
                text += f"\n({len(t1['counterexamples'])} cx)"
            if m == "sampled" and c and c.get("violations"):
                text += f"\n{c['violations']} noisy dec."
            ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=5.5)
            if t1 is not None and t1.get("agreement") == "disagrees":
                ax.add_patch(Rectangle((j + 0.04, i + 0.04), 0.92, 0.92, fill=False, edgecolor="black", lw=2.5))
    ax.set_xlim(0, len(COLUMNS))
    ax.set_ylim(len(rows), 0)
    ax.set_yticks([i + 0.5 for i in range(len(rows))], [r["example"] for r in rows])
    ax.set_xticks([j + 0.5 for j in range(len(COLUMNS))], [f"{s}\n{m}\n{p[:5]}." for s, m, p in COLUMNS])
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    ax.axvline(4, color="black", lw=1)
    cfg = data["config"]
    legend = [Patch(color=GOOD, label="converges / reaches J*"), Patch(color="#c5e1a5", label="monotone, still improving"),
              Patch(color=MEH, label="stuck below J* / gap remains"), Patch(color=BAD, label="J decreased"),
              Patch(facecolor="white", edgecolor="black", lw=2.5, label="disagrees with the paper")]
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.01), ncol=5, frameon=False)
    fig.suptitle(f"Table 1 as measured ({cfg['instances']} random token bandits per cell, {cfg['iterations']} iterations, "
                 f"MT = {cfg['turns_mt']} turns, G = {cfg['group_size']}; cx = saved counterexamples)", fontsize=8, y=0.995)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    save(fig, path)


if __name__ == "__main__":
    raise SystemExit(module_main("table1"))
