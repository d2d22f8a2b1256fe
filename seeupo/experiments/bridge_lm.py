"""Every preset on the bridge with real language models, exact ``J`` per iteration (issue 9 §4).

The experiment the paper could not run: each preset (``ppo``, ``grpo``, ``gspo``, ``rloo``,
``reinforce_pp``, ``seeupo``, and ``seeupo`` with ``algorithm.m_refresh=true`` or
``algorithm.equal_budget=true``) trains a language
model (the tiny random Qwen3 and SmolLM2-135M-Instruct) on a fixed 2-turn bridge problem
(:mod:`seeupo.llm.envs.bridge`) for a few seeds; after every step the language model's exact
``J`` is computed by enumeration. The tables report, per (model, preset, variant) over seeds, the
initial and final ``J``, ``J*``, the final gap, the number and size of decreases of the exact
``J``, the staleness of SeeUPO's factor ``M`` (``seeupo/m_drift_max``: ``max |log F_recorded - log
F_current|`` at the end of the sweep; 0 with independent per-turn parameters) and the time per step.

The ablation ``m_refresh_3turn`` (:func:`m_refresh_sweep`, folders under ``OUT/turns3``) repeats
SeeUPO with and without ``m_refresh`` on a 3-turn bridge: with 2 turns the refresh is a no-op.

Each run writes ``OUT/<model>/<preset>[-variant]/seed<k>/metrics.jsonl`` (step 0 is the initial
``J``, after the format warm-up); a run whose file already holds every step is skipped, so an
interrupted sweep resumes where it stopped (an incomplete run is restarted from scratch). No
checkpoints are written (a SmolLM2 checkpoint with optimizer state is ~2 GB).

Usage::

    python -m seeupo.experiments.bridge_lm --out results/bridge_lm            # the full sweep
    python -m seeupo.experiments.bridge_lm --quick --out /tmp/bridge_lm_quick  # 1 preset, tiny model, 2 steps
    python -m seeupo.experiments.bridge_lm --grid --lr 1e-3 3e-3 --seeds 20    # rates over seeds (grid.json/.md)

The grid (``--grid``) is the statistics behind the claims: the tiny model's setting at each learning
rate with many seeds per preset; per (preset, lr) cell the rate of runs that collapse (exact J below
``COLLAPSE_J``) and of runs with a one-step drop above ``DROP_J``, each with a 95% interval, and
Fisher's exact test between presets (:mod:`seeupo.experiments.stats`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PRESETS = ("ppo", "grpo", "gspo", "rloo", "reinforce_pp", "seeupo")
VARIANTS = ("m_refresh", "equal_budget")  # SeeUPO's variants: algorithm.<variant>=true
DEFAULT_TABLES = Path("paper_repro/bridge_lm")
DECREASE_TOL = 1e-6  # a step lowers J when J_k < J_{k-1} - tol (J is exact up to float32 scoring)

# the fixed problem: configs/bridge_tiny_seeupo.yaml (2 turns, 4 actions spelled as 2 symbols)
BRIDGE = {"kind": "sequential_bandit", "turns": 2, "actions": 4, "reward_levels": 3, "problem_seed": 0}


@dataclass(frozen=True)
class ModelSetting:
    """How one model is trained: learning rate, format warm-up, steps and seeds.

    warmup_target: ``None``, exactly ``warmup_steps`` warm-up steps; else the warm-up stops once the
    exact probability of a valid first answer is at least this (``env.options.warmup_target``),
    with ``warmup_steps`` as a cap.
    """

    name: str
    lr: float
    warmup_steps: int
    warmup_lr: float
    steps: int
    seeds: tuple[int, ...]
    tasks_per_step: int = 8
    group_size: int = 8
    num_tasks: int = 64
    warmup_target: float | None = None


@dataclass(frozen=True)
class Sweep:
    models: tuple[ModelSetting, ...]
    presets: tuple[str, ...] = PRESETS
    seeupo_variants: tuple[str, ...] = VARIANTS
    epochs: int = 2
    kl_coef: float = 0.002
    temperature: float = 0.9
    bridge: dict[str, Any] = field(default_factory=lambda: dict(BRIDGE))
    plugins: tuple[str, ...] = ()  # plugins that register the presets (seeupo.plugins), recorded in each run's config


def full_sweep() -> Sweep:
    return Sweep(models=(
        ModelSetting("tiny-qwen3", lr=3e-3, warmup_steps=40, warmup_lr=3e-3, steps=12, seeds=(0, 1, 2)),
        ModelSetting("smollm2-135m", lr=5e-5, warmup_steps=3, warmup_lr=1e-4, steps=1, seeds=(0,), tasks_per_step=2),
    ))


def m_refresh_sweep() -> Sweep:
    """The m_refresh ablation on a 3-turn bridge (tiny model, seeupo only).

    With 2 turns in reverse order the refresh is a no-op by construction: the only factor a
    later turn reads (turn 2's, read by turn 1) is refreshed right after it was recorded, with
    no update in between; the drift of the final factor feeds no update. With 3 turns, turn 1
    reads turn 3's factor after turn 2's update has moved it.
    """
    return Sweep(models=(ModelSetting("tiny-qwen3", lr=3e-3, warmup_steps=40, warmup_lr=3e-3, steps=12, seeds=(0, 1, 2)),),
                 presets=("seeupo",), seeupo_variants=("m_refresh",), bridge=dict(BRIDGE, turns=3))


ABLATIONS = {"m_refresh_3turn": ("turns3", m_refresh_sweep)}


def quick_sweep() -> Sweep:
    """The smallest run that learns: ``check --quick``'s bridge settings (:class:`seeupo.experiments.check.CheckBudget`).

    The warm-up runs until the exact probability of a valid first answer is >= 0.9 (25 steps,
    0.932 for seed 0); with only 5 steps, as before, it was 0.001 and ``J`` stayed at 0.
    """
    return Sweep(models=(ModelSetting("tiny-qwen3", lr=1e-3, warmup_steps=100, warmup_lr=3e-3, warmup_target=0.9, steps=2,
                                      seeds=(0,), tasks_per_step=4, group_size=4, num_tasks=4),),
                 presets=("seeupo",), seeupo_variants=())


@dataclass(frozen=True)
class RunSpec:
    model: ModelSetting
    preset: str
    variant: str  # "", "m_refresh" or "equal_budget"
    seed: int

    @property
    def label(self) -> str:
        return self.preset + (f"-{self.variant}" if self.variant else "")

    def folder(self, out: Path) -> Path:
        return out / self.model.name / self.label / f"seed{self.seed}"


def runs_of(sweep: Sweep) -> list[RunSpec]:
    out = []
    for m in sweep.models:
        for p in sweep.presets:
            variants = ["", *sweep.seeupo_variants] if p == "seeupo" else [""]
            for v in variants:
                out.extend(RunSpec(m, p, v, s) for s in m.seeds)
    return out


def train_config(spec: RunSpec, sweep: Sweep, out: Path, *, warmup_done: bool = False):
    from seeupo.llm.config import load_train_config

    m = spec.model
    sets = [
        f"algorithm.preset={spec.preset}", f"algorithm.group_size={m.group_size}", f"algorithm.kl_coef={sweep.kl_coef}",
        f"algorithm.epochs={sweep.epochs}", f"model.name={m.name}", "model.dtype=float32", "env.name=bridge",
        *(f"env.options.{k}={v}" for k, v in sweep.bridge.items()),
        f"env.options.warmup_steps={0 if warmup_done else m.warmup_steps}", f"env.options.warmup_lr={m.warmup_lr}",
        f"env.options.num_tasks={m.num_tasks}",
        f"rollout.tasks_per_step={m.tasks_per_step}", f"rollout.temperature={sweep.temperature}",
        f"rollout.max_turns={sweep.bridge['turns']}",
        f"optim.lr={m.lr}", "optim.max_grad_norm=1.0", f"steps={m.steps}", f"seed={spec.seed}",
        f"out_dir={spec.folder(out)}", "logging.progress=false",
    ]
    from seeupo.core.config import PRESETS

    if PRESETS[spec.preset].schedule == "sequential":
        sets.append("logging.m_drift=true")
    if spec.variant == "m_refresh":
        sets.append("algorithm.m_refresh=true")
    if spec.variant == "equal_budget":  # the simultaneous presets' number of optimizer steps, shared by the turns
        sets.append("algorithm.equal_budget=true")
    return load_train_config(None, sets, list(sweep.plugins))


def is_complete(folder: Path, steps: int) -> bool:
    from seeupo.llm.metrics import read_metrics

    records = read_metrics(folder)
    return [r["step"] for r in records] == list(range(steps + 1))


_MODEL_CACHE: dict[str, Any] = {}


def _fresh_model(name: str):
    """A fresh copy of the model (loading SmolLM2 takes seconds: load once, copy the weights)."""
    import copy

    from seeupo.llm.build import load_model

    if name not in _MODEL_CACHE:
        _MODEL_CACHE[name] = load_model(name, "float32", 0)
    model, tokenizer = _MODEL_CACHE[name]
    return copy.deepcopy(model), tokenizer


_WARM_CACHE: dict[tuple[str, int, int, float, float, float | None], tuple[dict[str, Any], dict[str, float]]] = {}


def _warmed_model(spec: RunSpec, sweep: Sweep):
    """The fresh model after the bridge's format warm-up of seed ``spec.seed``, and the warm-up's metrics.

    The warm-up (the bridge's :class:`~seeupo.llm.envs.WarmUp`, run by
    :func:`seeupo.llm.trainer.warm_up`) is deterministic given (model, seed, steps, lr,
    temperature, target), so it runs once per seed and the presets start from the same weights
    (exactly what each run's own warm-up would give). The metrics are ``{"bridge/warmup_loglik":
    ...}`` (with a target also ``bridge/warmup_valid_prob`` and ``bridge/warmup_steps``), empty
    without a warm-up.
    """
    import copy

    from seeupo.llm.envs import make_environment
    from seeupo.llm.policy import CausalLMPolicy
    from seeupo.llm.trainer import warm_up

    m = spec.model
    model, tokenizer = _fresh_model(m.name)
    if m.warmup_steps == 0:
        return model, tokenizer, {}
    key = (m.name, spec.seed, m.warmup_steps, m.warmup_lr, sweep.temperature, m.warmup_target)
    if key not in _WARM_CACHE:
        options = dict(sweep.bridge, warmup_steps=m.warmup_steps, warmup_lr=m.warmup_lr, warmup_target=m.warmup_target)
        env = make_environment("bridge", options, tokenizer, spec.seed)
        logs = warm_up(CausalLMPolicy(model, temperature=sweep.temperature), env.warm_up, tokenizer)
        model.zero_grad(set_to_none=True)
        _WARM_CACHE[key] = (copy.deepcopy(model.state_dict()), logs)
    state, logs = _WARM_CACHE[key]
    model.load_state_dict(state)
    return model, tokenizer, logs


def warmup_result(spec: RunSpec, sweep: Sweep) -> dict[str, Any]:
    """What the format warm-up of ``spec``'s seed reached, before any RL step.

    ``{"seed", "steps", "p_valid", "loglik"}``: the warm-up steps taken (``warmup_steps`` without a
    target) and the exact probability of a valid first answer after them
    (:func:`seeupo.llm.envs.bridge.valid_first_answer_prob`; measured here when the warm-up did
    not, e.g. with no warm-up at all). Cached like the warmed model.
    """
    from seeupo.llm.envs.bridge import BridgeOptions, Spelling, bridge_problem, valid_first_answer_prob
    from seeupo.llm.policy import CausalLMPolicy

    model, tokenizer, logs = _warmed_model(spec, sweep)
    p_valid = logs.get("bridge/warmup_valid_prob")
    if p_valid is None:
        opts = BridgeOptions(**sweep.bridge)
        problem = bridge_problem(opts)
        spelling = Spelling.for_problem(problem, tokenizer, opts.alphabet)
        p_valid = valid_first_answer_prob(CausalLMPolicy(model, temperature=sweep.temperature), tokenizer, problem, spelling)
    steps = logs.get("bridge/warmup_steps", spec.model.warmup_steps)
    return {"seed": spec.seed, "steps": int(steps), "p_valid": float(p_valid), "loglik": logs.get("bridge/warmup_loglik")}


def _trainer(spec: RunSpec, sweep: Sweep, out: Path):
    """The trainer of one run, started from the seed's warmed model; and the warm-up's metrics."""
    import torch

    from seeupo.llm.trainer import Trainer

    torch.manual_seed(spec.seed)
    model, tokenizer, warmup_logs = _warmed_model(spec, sweep)
    cfg = train_config(spec, sweep, out, warmup_done=True)
    return Trainer(cfg, model=model, tokenizer=tokenizer), warmup_logs


def run_one(spec: RunSpec, sweep: Sweep, out: Path, log=print) -> Path:
    """Train one run (no checkpoints); metrics.jsonl gets step 0 (initial J) then every step."""
    from seeupo.llm.metrics import MetricsLogger

    folder = spec.folder(out)
    if is_complete(folder, spec.model.steps):
        log(f"skip {folder} (complete)")
        return folder
    trainer, warmup_logs = _trainer(spec, sweep, out)
    cfg = trainer.cfg
    folder.mkdir(parents=True, exist_ok=True)
    # the config as run; the format warm-up (env.options.warmup_*) ran before, once per seed
    record = cfg.to_dict()
    record["env"]["options"] |= {"warmup_steps": spec.model.warmup_steps, "warmup_lr": spec.model.warmup_lr,
                                 "warmup_target": spec.model.warmup_target}
    (folder / "config.json").write_text(json.dumps(record, indent=1) + "\n")
    with MetricsLogger(folder) as logger:
        logger.log(0, warmup_logs | trainer.env.metrics(trainer.policy))
        for _ in range(cfg.steps):
            metrics = trainer.step()
            logger.log(trainer.step_count, metrics)
            log(f"{spec.model.name} {spec.label} seed{spec.seed} step {trainer.step_count}: J={metrics['bridge/J']:.4f} "
                f"({metrics['timing_s/step']:.1f} s, load {os.getloadavg()[0]:.2f})")
    return folder


# ---------------------------------------------------------------------------------------- tables


def summarise_run(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-run numbers from its metrics.jsonl records (step 0 = initial J)."""
    J = [r["bridge/J"] for r in records]
    deltas = [b - a for a, b in zip(J, J[1:])]
    drops = [-d for d in deltas if d < -DECREASE_TOL]
    steps = records[1:]
    drift = [r["seeupo/m_drift_max"] for r in steps if r.get("seeupo/m_drift_max") is not None]
    return {
        "J": J,
        "J_initial": J[0],
        "J_final": J[-1],
        "J_star": records[0]["bridge/J_star"],
        "gap_final": records[0]["bridge/J_star"] - J[-1],
        "decreases": len(drops),
        "largest_decrease": max(drops, default=0.0),
        "m_drift_max_mean": statistics.fmean(drift) if drift else None,
        "step_seconds_mean": statistics.fmean(r["timing_s/step"] for r in steps) if steps else None,
        "update_seconds_mean": statistics.fmean(r["timing_s/update_actor"] for r in steps) if steps else None,
        "valid_prob_turn0_initial": records[0].get("bridge/valid_prob_turn0"),
        "valid_prob_turn0_final": records[-1].get("bridge/valid_prob_turn0"),
        "warmup_valid_prob": records[0].get("bridge/warmup_valid_prob"),
        "warmup_steps": records[0].get("bridge/warmup_steps"),
    }


def build_tables(sweep: Sweep, out: Path) -> dict[str, Any]:
    from seeupo.llm.metrics import read_metrics

    rows, runs = [], []
    groups: dict[tuple[str, str], list[tuple[RunSpec, dict[str, Any]]]] = {}
    for spec in runs_of(sweep):
        records = read_metrics(spec.folder(out))
        if [r["step"] for r in records] != list(range(spec.model.steps + 1)):
            continue  # missing or incomplete: not reported
        summary = summarise_run(records)
        runs.append({"model": spec.model.name, "preset": spec.preset, "variant": spec.variant, "seed": spec.seed} | summary)
        groups.setdefault((spec.model.name, spec.label), []).append((spec, summary))
    for (model, label), members in groups.items():
        spec = members[0][0]
        s = [m[1] for m in members]
        drift = [x["m_drift_max_mean"] for x in s if x["m_drift_max_mean"] is not None]
        rows.append({
            "model": model, "preset": spec.preset, "variant": spec.variant, "label": label,
            "seeds": [m[0].seed for m in members], "steps": spec.model.steps, "lr": spec.model.lr,
            "J_initial_mean": statistics.fmean(x["J_initial"] for x in s),
            "J_final_mean": statistics.fmean(x["J_final"] for x in s),
            "J_final_min": min(x["J_final"] for x in s), "J_final_max": max(x["J_final"] for x in s),
            "J_star": s[0]["J_star"],
            "gap_final_mean": statistics.fmean(x["gap_final"] for x in s),
            "decreases_total": sum(x["decreases"] for x in s),
            "step_transitions_total": sum(len(x["J"]) - 1 for x in s),
            "runs_with_a_decrease": sum(x["decreases"] > 0 for x in s),
            "largest_decrease": max(x["largest_decrease"] for x in s),
            "m_drift_max_mean": statistics.fmean(drift) if drift else None,
            "step_seconds_mean": statistics.fmean(x["step_seconds_mean"] for x in s),
        })
    return {
        "settings": {
            "bridge": sweep.bridge, "epochs": sweep.epochs, "kl_coef": sweep.kl_coef, "temperature": sweep.temperature,
            "decrease_tol": DECREASE_TOL,
            "models": [dataclasses.asdict(m) for m in sweep.models],
        },
        "rows": rows,
        "runs": runs,
    }


def _f(x: float | None, digits: int = 4) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def _row(r: dict[str, Any]) -> str:
    return (f"| {r['model']} | {r['label']} | {_f(r['J_initial_mean'])} | {_f(r['J_final_mean'])} "
            f"({_f(r['J_final_min'])}..{_f(r['J_final_max'])}) | {_f(r['J_star'])} | {_f(r['gap_final_mean'])} | "
            f"{r['decreases_total']}/{r['step_transitions_total']} | {_f(r['largest_decrease'])} | "
            f"{_f(r['m_drift_max_mean'])} | {_f(r['step_seconds_mean'], 1)} |")


def render_markdown(tables: dict[str, Any], note: str = "") -> str:
    st = tables["settings"]
    lines = [
        "# Every preset on the bridge with language models: exact J per iteration",
        "",
        "Generated by `python -m seeupo.experiments.bridge_lm` (`seeupo/experiments/bridge_lm.py`); the numbers "
        "are in `results.json` (per run: the exact J after every step).",
        "",
        f"Problem: bridge `{json.dumps(st['bridge'])}` (2-turn sequential bandit, 4 actions per turn spelled as 2 "
        f"symbols from {{a, b}}; an invalid answer ends the episode with reward 0). Every preset with the paper's "
        f"algorithm settings (group size as below, clip 0.2, k3 KL {st['kl_coef']}), epochs {st['epochs']}, "
        f"temperature {st['temperature']}, AdamW, grad-norm clip 1.0, float32. SeeUPO runs log "
        "`seeupo/m_drift_max`; `seeupo-m_refresh` recomputes M's factor from the current policy before each turn "
        "(`algorithm.m_refresh=true`); `seeupo-equal_budget` takes the simultaneous presets' number of optimizer steps, "
        "shared by the turns (`algorithm.equal_budget=true`: 1 step per turn here, against `epochs` = 2 per turn). "
        "A seed sets the format warm-up, the tasks and the sampling; the initial weights are the same for every seed "
        "(the tiny model's `model.seed` is 0). The format warm-up runs once per seed and every preset starts from its result.",
        "",
        "| model | lr | format warm-up (steps, lr) | tasks x group per step | steps | seeds |",
        "|---|---|---|---|---|---|",
    ]
    for m in st["models"]:
        lines.append(f"| {m['name']} | {m['lr']:g} | {m['warmup_steps']}, {m['warmup_lr']:g} | "
                     f"{m['tasks_per_step']} x {m['group_size']} | {m['steps']} | {', '.join(map(str, m['seeds']))} |")
    lines += [
        "",
        f"A *decrease* is a step with J_k < J_(k-1) - {st['decrease_tol']:g} (exact J of the sampling policy, not a "
        "sample estimate). Columns are means over seeds unless stated; `decreases` is the total over seeds / the number of "
        "steps over seeds; `M drift` is the mean over steps and seeds of max |log F_recorded - log F_current| over "
        "trajectories at the end of each sweep; `s/step` is the wall time of a whole step (rollout, scoring, update, "
        "exact J excluded), measured on a shared 2-core CPU machine (noisy).",
        "",
        "| model | preset | J initial | J final (min..max) | J* | final gap | decreases | largest decrease | M drift | s/step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row(r) for r in tables["rows"]]
    for name, ab in (tables.get("ablations") or {}).items():
        lines += ["", f"## Ablation `{name}`: bridge `{json.dumps(ab['settings']['bridge'])}`", "",
                  "| model | preset | J initial | J final (min..max) | J* | final gap | decreases | largest decrease | M drift | s/step |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [_row(r) for r in ab["rows"]]
    if note:
        lines += ["", note.strip()]
    return "\n".join(lines) + "\n"


def write_tables(sweep: Sweep, out: Path, tables_dir: Path, note: str = "",
                 ablations: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    tables = build_tables(sweep, out)
    if ablations:
        tables["ablations"] = ablations
    tables_dir.mkdir(parents=True, exist_ok=True)
    (tables_dir / "results.json").write_text(json.dumps(tables, indent=1) + "\n")
    (tables_dir / "results.md").write_text(render_markdown(tables, note))
    return tables


# ------------------------------------------------------------------------------ the seed grid

# Statistics over many seeds (issue 16 §6): three seeds per preset cannot tell a collapse rate of
# 3/20 from 0/20. The grid trains the tiny model's setting at several learning rates and many
# seeds per (preset, lr) cell and reports rates with confidence intervals and Fisher's exact test.
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m seeupo.experiments.bridge_lm", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smallest configuration: seeupo, tiny model, 2 steps")
    p.add_argument("--out", default=None, help="per-run folders, not committed (default results/bridge_lm; --grid: results/bridge_grid)")
    p.add_argument("--tables", default=None, help=f"where results.json/.md go (default {DEFAULT_TABLES}; --quick: OUT)")
    p.add_argument("--models", nargs="*", default=None, help="only these models (names as in the sweep)")
    p.add_argument("--presets", nargs="*", default=None, help="only these presets, in this order")
    p.add_argument("--tables-only", action="store_true", help="do not train; rebuild the tables from OUT")
    p.add_argument("--note", default="", help="text appended to results.md")
    p.add_argument("--ablations", nargs="*", default=None,
                   help=f"ablation sweeps to run after the main one (default: all of {sorted(ABLATIONS)}; none with --quick)")
    g = p.add_argument_group("seed grid (--grid): rates over many seeds per (preset, lr) cell, with intervals and tests")
    g.add_argument("--grid", action="store_true",
                   help="train the tiny model's setting at each --lr with --seeds seeds per preset label; one JSON line "
                        "per finished run in OUT/lr<lr>.jsonl (a re-invocation skips finished runs); grid.json/.md in TABLES")
    g.add_argument("--lr", nargs="+", type=float, default=None, help="learning rates of the RL steps (default: the setting's 3e-3)")
    g.add_argument("--seeds", type=int, default=None, help="seeds per cell: 0..N-1 (default 20)")
    g.add_argument("--labels", nargs="+", default=None,
                   help=f"preset labels (preset or seeupo-<variant>; default {' '.join(GRID_LABELS)})")
    args = p.parse_args(argv)
    problem = _grid_arg_problem(args)
    if problem:
        print(f"{p.prog}: error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    return args


def _grid_arg_problem(args: argparse.Namespace) -> str | None:
    """The first problem with the grid's arguments, or None (checked before any training); fills the grid's defaults."""
    if not args.grid:
        used = [flag for flag, value in (("--lr", args.lr), ("--seeds", args.seeds), ("--labels", args.labels)) if value is not None]
        return f"{used[0]} needs --grid" if used else None
    args.seeds = 20 if args.seeds is None else args.seeds
    args.labels = list(GRID_LABELS) if args.labels is None else args.labels
    if args.quick or args.ablations or args.models or args.presets:
        return "--grid takes --lr, --seeds and --labels, not --quick, --ablations, --models or --presets"
    for lr in args.lr or []:
        if not (math.isfinite(lr) and 0 < lr <= 1):
            return f"--lr must lie in (0, 1], got {lr!r}"
    if not 1 <= args.seeds <= MAX_GRID_SEEDS:
        return f"--seeds must lie in 1..{MAX_GRID_SEEDS}, got {args.seeds}"
    for label in args.labels:
        try:
            parse_label(label)
        except ValueError as err:
            return f"--labels: {err}"
    return None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.grid:
        out = Path(args.out or "results/bridge_grid")
        lrs = args.lr or [full_sweep().models[0].lr]
        if args.tables_only and not read_grid(out):
            print(f"python -m seeupo.experiments.bridge_lm: error: --tables-only: no finished grid runs under {out}", file=sys.stderr)
            raise SystemExit(2)
        if not args.tables_only:
            run_grid(grid_specs(lrs, args.seeds, list(dict.fromkeys(args.labels))), full_sweep(), out)
        return write_grid_tables(out, Path(args.tables) if args.tables else DEFAULT_TABLES, args.note)
    sweep = quick_sweep() if args.quick else full_sweep()
    out = Path(args.out or "results/bridge_lm")
    tables_dir = Path(args.tables) if args.tables else (out if args.quick else DEFAULT_TABLES)
    ablations = [] if args.quick else (sorted(ABLATIONS) if args.ablations is None else args.ablations)
    if not args.tables_only:
        _train(sweep, out, args)
        for name in ablations:
            sub, make = ABLATIONS[name]
            _train(make(), out / sub, args)
    extra = {name: build_tables(ABLATIONS[name][1](), out / ABLATIONS[name][0]) for name in ablations}
    return write_tables(sweep, out, tables_dir, args.note, extra)


def _train(sweep: Sweep, out: Path, args: argparse.Namespace) -> None:
    specs = runs_of(sweep)
    if args.presets:  # in the order given
        specs = sorted((s for s in specs if s.preset in args.presets), key=lambda s: args.presets.index(s.preset))
    for spec in specs:
        if args.models and spec.model.name not in args.models:
            continue
        start = time.perf_counter()
        run_one(spec, sweep, out)
        print(f"done {spec.folder(out)} in {time.perf_counter() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
