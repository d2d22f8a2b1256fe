"""Training curves of language-model runs from their ``metrics.jsonl`` (verl's metric names), BFCL runs first.

Data: the run folders given (``seeupo figures training_curves --runs DIR [DIR ...]``; any run of
``seeupo train``), else every BFCL run found under ``runs/`` and ``results/`` (a folder with
``metrics.jsonl`` whose ``config.yaml`` has ``env.name: bfcl``). When there is none (no BFCL run of
this project finished a step on CPU: ``paper_repro/bfcl/README.md``), the figure says so and draws a
tiny run made now instead: ``seeupo train configs/bridge_tiny_seeupo.yaml`` (the bridge, tiny Qwen3;
4 steps of 4 tasks x 4 rollouts with ``--quick``, else 12 steps of the config's 8 x 8), labelled as such. Curves: ``critic/score/mean``, ``actor/pg_loss``,
``actor/kl_loss``, ``actor/pg_clipfrac``, ``bridge/J`` (bridge runs) and ``timing_s/step``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from seeupo.figures._common import REPO, module_main, pyplot, rel, save

KEYS = ("critic/score/mean", "actor/pg_loss", "actor/kl_loss", "actor/pg_clipfrac", "bridge/J", "timing_s/step")
DEMO_CONFIG = "configs/bridge_tiny_seeupo.yaml"


def _env_and_preset(folder: Path) -> tuple[str | None, str | None]:
    path = folder / "config.yaml"
    if not path.exists():
        return None, None
    from seeupo.llm.config import read_yaml

    try:
        cfg = read_yaml(path)
    except Exception:  # an unreadable config: the run is still drawn, unnamed
        return None, None
    return (cfg.get("env") or {}).get("name"), (cfg.get("algorithm") or {}).get("name") or (cfg.get("algorithm") or {}).get("preset")


def read_run(folder: str | Path, label: str | None = None) -> dict[str, Any]:
    """The curves of one run folder (lines that are not complete JSON objects, e.g. a torn last line, are skipped)."""
    folder = Path(folder)
    records = []
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "step" in rec:
            records.append(rec)
    env, preset = _env_and_preset(folder)
    curves = {k: [[r["step"], r[k]] for r in records if isinstance(r.get(k), (int, float))] for k in KEYS}
    return {"dir": rel(folder), "label": label or f"{folder.name} ({preset or '?'}, {env or '?'})", "env": env, "preset": preset,
            "steps": max((r["step"] for r in records), default=0), "curves": {k: v for k, v in curves.items() if v}}


def find_bfcl_runs(roots: tuple[str, ...] = ("runs", "results")) -> list[Path]:
    found = []
    for root in roots:
        for metrics in sorted(Path(root).glob("**/metrics.jsonl")):
            if _env_and_preset(metrics.parent)[0] == "bfcl":
                found.append(metrics.parent)
    return found


def _demo_run(steps: int, small: bool, log) -> dict[str, Any]:
    config = REPO / DEMO_CONFIG
    if not config.exists():
        raise FileNotFoundError(f"{DEMO_CONFIG} is not there (installed package without the repository)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "seeupo.cli", "train", str(config), "--set", f"steps={steps}", "--set", "checkpoint.every=1000",
               "--out", str(out), "--no-progress"]
        sets = ["rollout.tasks_per_step=4", "algorithm.group_size=4"] if small else []
        for s in sets:
            cmd += ["--set", s]
        log(f"  training_curves: no BFCL run found; training the bridge demo for {steps} steps ({DEMO_CONFIG})")
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=_env())
        if proc.returncode != 0:
            raise RuntimeError(f"seeupo train failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
        run = read_run(out, label=f"bridge demo (tiny Qwen3, seeupo, {steps} steps{', 4 tasks x 4' if small else ''}): NOT a BFCL run")
    return run | {"dir": None, "command": " ".join([f"seeupo train {DEMO_CONFIG} --set steps={steps}"] + [f"--set {s}" for s in sets])}


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # on a loaded machine, torch's threads waiting for each other cost far more than they bring
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def compute(quick: bool = False, seed: int = 0, runs: list[str] | None = None, log=print) -> dict[str, Any]:
    if runs:
        missing = [r for r in runs if not (Path(r) / "metrics.jsonl").exists()]
        if missing:
            from seeupo.validation.errors import InputError

            raise InputError(None, f"argument --runs: no metrics.jsonl in {', '.join(missing)}")
        return {"source": "given run folders", "runs": [read_run(r) for r in runs]}
    found = find_bfcl_runs()
    if found:
        return {"source": "BFCL runs found under runs/ and results/", "runs": [read_run(r) for r in found]}
    note = "no BFCL run with metrics found (none finished a step on CPU); drawn: a tiny bridge run made now"
    try:
        return {"source": "bridge demo", "runs": [_demo_run(4 if quick else 12, quick, log)], "note": note}
    except Exception as err:  # noqa: BLE001 - the figure says why it is empty rather than failing the whole regeneration
        return {"source": None, "runs": [], "note": f"no BFCL run found, and the demo run failed: {err}"}


def plot(data: dict[str, Any], path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(9, 4.8))
    for ax, key in zip(axes.flat, KEYS):
        for run in data["runs"]:
            pts = run["curves"].get(key)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=2.5, lw=1, label=run["label"])
        ax.set_title(key)
        ax.set_xlabel("step")
        if not ax.lines:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    title = "Training curves from metrics.jsonl"
    if data.get("note"):
        title += f"\n({data['note']})"
    if not data["runs"]:
        title += "\n(nothing to draw)"
    fig.suptitle(title, fontsize=8)
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.07 if handles else 0, 1, 1))
    save(fig, path)


if __name__ == "__main__":
    raise SystemExit(module_main("training_curves"))
