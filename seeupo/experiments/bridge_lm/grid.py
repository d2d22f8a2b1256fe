"""The seed grid (``--grid``): rates over many seeds per (preset, lr) cell, with intervals and tests.

Statistics over many seeds (issue 16 §6): three seeds per preset cannot tell a collapse rate of
3/20 from 0/20. The grid trains the tiny model's setting at several learning rates and many
seeds per (preset, lr) cell and reports rates with confidence intervals and Fisher's exact test.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from seeupo.experiments.bridge_lm.runs import _trainer
from seeupo.experiments.bridge_lm.sweep import PRESETS, VARIANTS, ModelSetting, RunSpec, Sweep, full_sweep
from seeupo.experiments.bridge_lm.tables import _f


GRID_LABELS = ("seeupo", "seeupo-equal_budget", "grpo")
COLLAPSE_J = 0.05  # a run collapses when the exact J falls below this after some step
DROP_J = 0.1  # a one-step drop: J_(k-1) - J_k above this
FORMAT_LOST = 0.5  # a collapse is the format being lost when a valid first answer is less likely than this
POOL_MAX_LR = 3e-3  # the pooled comparison takes every lr up to this one (where no preset collapses often)
MAX_GRID_SEEDS = 10_000


def parse_label(label: str) -> tuple[str, str]:
    """``"seeupo-equal_budget"`` -> ``("seeupo", "equal_budget")``; ValueError for an unknown label."""
    preset, _, variant = label.partition("-")
    if preset not in PRESETS or (variant and (preset != "seeupo" or variant not in VARIANTS)):
        known = [*PRESETS, *(f"seeupo-{v}" for v in VARIANTS)]
        raise ValueError(f"unknown preset label {label!r}; choose from {', '.join(known)}")
    return preset, variant


def grid_specs(lrs: list[float], seeds: int, labels: list[str], base: ModelSetting | None = None) -> list[RunSpec]:
    """Every run of the grid, lr by lr, then seed by seed, then label: an interrupted grid has its
    cells of one lr filled evenly, and the seed's warm-up (shared by all runs of a seed) is reused."""
    base = base or full_sweep().models[0]
    out = []
    for lr in lrs:
        model = dataclasses.replace(base, lr=lr, seeds=tuple(range(seeds)))
        for seed in range(seeds):
            for label in labels:
                preset, variant = parse_label(label)
                out.append(RunSpec(model, preset, variant, seed))
    return out


def grid_file(out: Path, lr: float) -> Path:
    """One JSONL file per lr, so that grids of disjoint lrs can run in parallel into one folder."""
    return out / f"lr{lr:g}.jsonl"


def _run_key(r: dict[str, Any]) -> tuple[str, str, float, int, int]:
    return (r["model"], r["label"], float(r["lr"]), int(r["seed"]), int(r["steps"]))


def read_grid(out: Path) -> list[dict[str, Any]]:
    """Every finished run recorded under ``out`` (a line cut by a crash is ignored; the first of duplicates wins)."""
    runs: dict[tuple, dict[str, Any]] = {}
    for path in sorted(out.glob("lr*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            runs.setdefault(_run_key(r), r)
    return list(runs.values())


def grid_run(spec: RunSpec, sweep: Sweep, scratch: Path) -> dict[str, Any]:
    """Train one run; its record: the exact J and the probability of a valid first answer after
    every step (index 0: before training), and the logged KL term per step."""
    start = time.perf_counter()
    trainer, _ = _trainer(spec, sweep, scratch)
    initial = trainer.env.metrics(trainer.policy)
    J, valid, kl = [initial["bridge/J"]], [initial["bridge/valid_prob_turn0"]], [None]
    for _ in range(spec.model.steps):
        m = trainer.step()
        J.append(m["bridge/J"])
        valid.append(m["bridge/valid_prob_turn0"])
        kl.append(m.get("actor/kl_loss"))
    return {"model": spec.model.name, "label": spec.label, "preset": spec.preset, "variant": spec.variant,
            "lr": spec.model.lr, "seed": spec.seed, "steps": spec.model.steps, "J_star": initial["bridge/J_star"],
            "J": J, "valid_prob_turn0": valid, "actor/kl_loss": kl, "seconds": time.perf_counter() - start}


def run_grid(specs: list[RunSpec], sweep: Sweep, out: Path, log=print) -> None:
    """Train the runs of ``specs`` not yet recorded under ``out``; each finished run is appended
    (flushed and synced) as one line, so a crash loses at most the run in progress."""
    out.mkdir(parents=True, exist_ok=True)
    done = {_run_key(r) for r in read_grid(out)}
    for spec in specs:
        key = (spec.model.name, spec.label, float(spec.model.lr), spec.seed, spec.model.steps)
        if key in done:
            continue
        record = grid_run(spec, sweep, out / "scratch")
        with grid_file(out, spec.model.lr).open("a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        done.add(key)
        log(f"lr {spec.model.lr:g} {spec.label} seed{spec.seed}: J min {min(record['J']):.4f} final {record['J'][-1]:.4f} "
            f"({record['seconds']:.0f} s, load {os.getloadavg()[0]:.2f})")


def run_outcomes(r: dict[str, Any]) -> dict[str, Any]:
    """Per-run events: collapse (J below COLLAPSE_J after some step) and a one-step drop above DROP_J."""
    J, valid = r["J"], r["valid_prob_turn0"]
    drops = [a - b for a, b in zip(J, J[1:])]
    k_min = min(range(1, len(J)), key=J.__getitem__) if len(J) > 1 else 0
    return {"collapse": min(J[1:], default=J[0]) < COLLAPSE_J, "drop": max(drops, default=0.0) > DROP_J,
            "J_min": J[k_min], "largest_drop": max(drops, default=0.0), "J_final": J[-1],
            "valid_prob_at_J_min": valid[k_min], "valid_prob_initial": valid[0]}


def summarise_grid(runs: list[dict[str, Any]], method: str = "wilson", reference: str = "seeupo") -> dict[str, Any]:
    """Per (lr, label) cell: rates of collapse and of a one-step drop with intervals; Fisher's exact
    test (two-sided) of ``reference`` against every other label, per lr and pooled over lr <= POOL_MAX_LR."""
    from seeupo.experiments.stats import fisher_two_sided, rate

    cells: dict[tuple[float, str], list[dict[str, Any]]] = {}
    for r in runs:
        cells.setdefault((float(r["lr"]), r["label"]), []).append(run_outcomes(r) | {"seed": r["seed"]})
    rows = []
    for (lr, label), outs in sorted(cells.items()):
        collapsed = [o for o in outs if o["collapse"]]
        rows.append({"lr": lr, "label": label, "seeds": sorted(o["seed"] for o in outs),
                     "collapse_seeds": sorted(o["seed"] for o in collapsed),
                     "drop_seeds": sorted(o["seed"] for o in outs if o["drop"]),
                     "collapse": rate(sum(o["collapse"] for o in outs), len(outs), method),
                     "drop": rate(sum(o["drop"] for o in outs), len(outs), method),
                     "J_final_mean": statistics.fmean(o["J_final"] for o in outs),
                     "J_final_median": statistics.median(o["J_final"] for o in outs),
                     "valid_prob_initial_mean": statistics.fmean(o["valid_prob_initial"] for o in outs),
                     "collapses_format_lost": sum(o["valid_prob_at_J_min"] < FORMAT_LOST for o in collapsed),
                     "valid_prob_at_collapse_max": max((o["valid_prob_at_J_min"] for o in collapsed), default=None)})

    def counts(rows_: list[dict[str, Any]], event: str) -> tuple[int, int]:
        return sum(x[event]["k"] for x in rows_), sum(x[event]["n"] for x in rows_)

    tests = []
    lrs = sorted({lr for lr, _ in cells})
    labels = sorted({label for _, label in cells}, key=lambda x: (x != reference, x))
    groups = [(f"lr {lr:g}", [lr]) for lr in lrs]
    pooled = [lr for lr in lrs if lr <= POOL_MAX_LR]
    if len(pooled) > 1:
        groups.append((f"pooled lr {pooled[0]:g}..{pooled[-1]:g}", pooled))
    for name, group in groups:
        for other in labels:
            if other == reference:
                continue
            for event in ("collapse", "drop"):
                a = [x for x in rows if x["lr"] in group and x["label"] == reference]
                b = [x for x in rows if x["lr"] in group and x["label"] == other]
                if not a or not b:
                    continue
                (k1, n1), (k2, n2) = counts(a, event), counts(b, event)
                tests.append({"group": name, "lrs": group, "event": event, "a": reference, "b": other,
                              "a_k": k1, "a_n": n1, "b_k": k2, "b_n": n2, "test": "Fisher exact, two-sided",
                              "p": fisher_two_sided(k1, n1, k2, n2)})
    return {"settings": {"collapse_below_J": COLLAPSE_J, "drop_above": DROP_J, "format_lost_below": FORMAT_LOST,
                         "interval": method, "confidence": 0.95,
                         "pool_max_lr": POOL_MAX_LR, "reference": reference},
            "cells": rows, "tests": tests}


def render_grid_markdown(summary: dict[str, Any], runs_setting: str) -> str:
    from seeupo.experiments.stats import format_rate

    st = summary["settings"]
    lines = [
        "# The bridge over seeds and learning rates: collapse and drop rates",
        "",
        "Generated by `python -m seeupo.experiments.bridge_lm --grid` (the per-run records stay in the output "
        "folder; this summary is `grid.json`).",
        "",
        runs_setting,
        "",
        f"*Collapse*: the exact J falls below {st['collapse_below_J']:g} after some step. *Drop*: some step lowers "
        f"the exact J by more than {st['drop_above']:g}. Rates are k/n runs with a {round(100 * st['confidence'])}% "
        f"{st['interval'].replace('_', '-').title()} interval. `valid p at collapse` is the largest, over the collapsed "
        "runs, of the probability of a well-formatted first answer at the run's lowest J (computed exactly, as J); "
        f"`format lost` counts the collapses where that probability is below {FORMAT_LOST:g}.",
        "",
        "| lr | preset | runs | collapse | one-step drop | mean final J | valid p initial | format lost / collapses | valid p at collapse (max) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in summary["cells"]:
        lines.append(f"| {c['lr']:g} | {c['label']} | {len(c['seeds'])} | {format_rate(c['collapse'])} | "
                     f"{format_rate(c['drop'])} | {c['J_final_mean']:.3f} | {c['valid_prob_initial_mean']:.3f} | "
                     f"{c['collapses_format_lost']}/{c['collapse']['k']} | {_f(c['valid_prob_at_collapse_max'], 3)} |")
    lines += ["", f"Fisher's exact test, two-sided, of `{st['reference']}` against each other preset, per lr and "
              f"pooled over every lr up to {st['pool_max_lr']:g}; p-values are not adjusted for the number of tests "
              f"({len(summary['tests'])} here).", "",
              "| group | event | a | b | a: k/n | b: k/n | p |", "|---|---|---|---|---|---|---|"]
    for t in summary["tests"]:
        lines.append(f"| {t['group']} | {t['event']} | {t['a']} | {t['b']} | {t['a_k']}/{t['a_n']} | "
                     f"{t['b_k']}/{t['b_n']} | {t['p']:.3g} |")
    return "\n".join(lines) + "\n"


def write_grid_tables(out: Path, tables_dir: Path, note: str = "") -> dict[str, Any]:
    """``grid.json`` (cells with their collapsed and dropped seeds, tests, settings; no per-run data: that stays in
    ``out``) and ``grid.md`` from the runs under ``out``."""
    runs = read_grid(out)
    if not runs:
        raise FileNotFoundError(f"no finished grid runs under {out}")
    summary = summarise_grid(runs)
    base = full_sweep()
    m = base.models[0]
    setting = (f"Setting: the tiny model's runs of `results.md` (bridge `{json.dumps(base.bridge)}`, {m.steps} steps, "
               f"{m.tasks_per_step} x {m.group_size} rollouts per step, epochs {base.epochs}, k3 KL {base.kl_coef}, "
               f"temperature {base.temperature}, format warm-up {m.warmup_steps} steps at lr {m.warmup_lr:g}), "
               "with the learning rate of the RL steps and the seeds varied.")
    summary["settings"] |= {"bridge": base.bridge, "steps": m.steps, "epochs": base.epochs, "kl_coef": base.kl_coef,
                            "temperature": base.temperature, "warmup_steps": m.warmup_steps, "warmup_lr": m.warmup_lr}
    tables_dir.mkdir(parents=True, exist_ok=True)
    (tables_dir / "grid.json").write_text(json.dumps(summary, indent=1) + "\n")
    md = render_grid_markdown(summary, setting)
    (tables_dir / "grid.md").write_text(md + (("\n" + note.strip() + "\n") if note else ""))
    return summary
