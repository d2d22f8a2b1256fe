"""The summary table of paper_repro/algorithms/README.md, from each committed check's check.json.

    python scripts/algorithms_table.py            # prints the table (Markdown)
    python scripts/algorithms_table.py --swaps    # and each plugin counterexample replayed with GRPO's advantage
                                                  # and with mean-centred GRAE (no std), all else equal

One row per folder of paper_repro/algorithms/: the check's verdict on monotonicity (with its first
piece of evidence), the gradient verdict of the whole update and of its estimator alone, where
plain ascent along the update ends, the bridge's mean exact J before and after, and the check's
wall time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "paper_repro" / "algorithms"


def row(name: str, data: dict) -> str:
    mono = data.get("monotonicity") or {}
    evidence = (mono.get("evidence") or ["—"])[0]
    grad = data.get("gradient") or {}
    if grad.get("direction"):
        causes = f"; cause: {', '.join(grad['causes'])}" if grad.get("causes") else ""
        gradient = (f"**{grad['direction']}** (estimator alone: {grad.get('estimator_direction', '—')}{causes}); "
                    f"ascent {grad.get('fixed_point', '—')}")
    else:
        gradient = "not measured: " + str(grad.get("skipped") or grad.get("refused") or "see check.md")
    bridge = data.get("bridge") or {}
    learning = (bridge.get("learning") or {}).get(name)
    lm = (f"{learning['J_initial_mean']:.3f} -> {learning['J_final_mean']:.3f}" if learning
          else str(bridge.get("skipped") or "—"))
    return (f"| [`{name}`]({name}/check.md) | **{mono.get('measured', '—')}**: {evidence} | {gradient} | {lm} | "
            f"{data.get('seconds', 0) / 60:.1f} min |")


def table() -> str:
    lines = ["| Algorithm | Exact monotonicity (measured) | Gradient verdict of the whole update, agentic families | "
             "Bridge: mean exact J, 3 seeds x 5 steps | Check's wall time |", "|---|---|---|---|---|"]
    for path in sorted(FOLDER.glob("*/check.json")):
        lines.append(row(path.parent.name, json.loads(path.read_text())))
    return "\n".join(lines)


def swaps() -> str:
    """Each plugin algorithm's own counterexample (not the field's replays) replayed as recorded, with GRPO's advantage
    (group std) and with mean-centred GRAE (no std), all else equal: where a decrease needs the std scaling."""
    import dataclasses

    from seeupo.experiments.counterexamples import Counterexample
    from seeupo.plugins import forget_plugins, load_plugins

    lines = ["| Counterexample | As recorded | With GRPO's advantage | Mean-centred, no std |", "|---|---|---|---|"]
    plugins = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples" / "algorithms").glob("*.py"))
    forget_plugins()
    load_plugins(plugins, "--plugin")
    try:
        for path in sorted(FOLDER.glob("*/counterexamples/*.json")):
            example = Counterexample.load(path)
            if not example.plugins:
                continue
            cells = []
            for change in ({}, {"advantage": "grae", "grae_scale": "group_std"}, {"advantage": "grae", "grae_scale": "none"}):
                J = dataclasses.replace(example, algorithm=example.algorithm.replace(**change)).recompute() if change \
                    else example.recompute()
                low = min(range(len(J) - 1), key=lambda k: J[k + 1] - J[k])
                cells.append(f"{J[low]:.6f} -> {J[low + 1]:.6f}" if J[low + 1] < J[low] else f"{J[0]:.6f} -> {J[-1]:.6f} (no decrease)")
            lines.append(f"| `{path.relative_to(FOLDER).as_posix()}` | " + " | ".join(cells) + " |")
    finally:
        forget_plugins()
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(table() + "\n")
    if "--swaps" in sys.argv[1:]:
        sys.stdout.write("\n" + swaps() + "\n")
