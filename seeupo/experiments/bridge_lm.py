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
DEFAULT_TABLES = Path("paper_repro/bridge_lm")
DECREASE_TOL = 1e-6  # a step lowers J when J_k < J_{k-1} - tol (J is exact up to float32 scoring)

# the fixed problem: configs/bridge_tiny_seeupo.yaml (2 turns, 4 actions spelled as 2 symbols)
BRIDGE = {"kind": "sequential_bandit", "turns": 2, "actions": 4, "reward_levels": 3, "problem_seed": 0}


@dataclass(frozen=True)
class ModelSetting:
    """How one model is trained: learning rate, format warm-up, steps and seeds."""

    name: str
    lr: float
    warmup_steps: int
    warmup_lr: float
    steps: int
    seeds: tuple[int, ...]
    tasks_per_step: int = 8
    group_size: int = 8
    num_tasks: int = 64


@dataclass(frozen=True)
class Sweep:
    models: tuple[ModelSetting, ...]
    presets: tuple[str, ...] = PRESETS
    seeupo_variants: tuple[str, ...] = ("m_refresh", "equal_budget")
    epochs: int = 2
    kl_coef: float = 0.002
    temperature: float = 0.9
    bridge: dict[str, Any] = field(default_factory=lambda: dict(BRIDGE))


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
    return Sweep(models=(ModelSetting("tiny-qwen3", lr=3e-3, warmup_steps=5, warmup_lr=3e-3, steps=2, seeds=(0,),
                                      tasks_per_step=2, group_size=2, num_tasks=4),),
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
    if spec.preset == "seeupo":
        sets.append("logging.m_drift=true")
    if spec.variant == "m_refresh":
        sets.append("algorithm.m_refresh=true")
    if spec.variant == "equal_budget":  # the simultaneous presets' number of optimizer steps, shared by the turns
        sets.append("algorithm.equal_budget=true")
    return load_train_config(None, sets)


def is_complete(folder: Path, steps: int) -> bool:
    from seeupo.llm.metrics import read_metrics

    records = read_metrics(folder)
    return [r["step"] for r in records] == list(range(steps + 1))


_MODEL_CACHE: dict[str, Any] = {}


def _fresh_model(name: str):
    """A fresh copy of the model (loading SmolLM2 takes seconds: load once, copy the weights)."""
    import copy

    from seeupo.llm.trainer import load_model

    if name not in _MODEL_CACHE:
        _MODEL_CACHE[name] = load_model(name, "float32", 0)
    model, tokenizer = _MODEL_CACHE[name]
    return copy.deepcopy(model), tokenizer


_WARM_CACHE: dict[tuple[str, int, int, float, float], tuple[dict[str, Any], float]] = {}


def _warmed_model(spec: RunSpec, sweep: Sweep):
    """The fresh model after the bridge's format warm-up of seed ``spec.seed``, and the warm-up's log-likelihood.

    The warm-up is deterministic given (model, seed, steps, lr), so it runs once per seed and the
    presets start from the same weights (exactly what each run's own warm-up would give).
    """
    import copy

    from seeupo.llm.envs.bridge import BridgeOptions, Spelling, bridge_problem, format_warmup
    from seeupo.llm.policy import CausalLMPolicy

    m = spec.model
    model, tokenizer = _fresh_model(m.name)
    if m.warmup_steps == 0:
        return model, tokenizer, None
    key = (m.name, spec.seed, m.warmup_steps, m.warmup_lr, sweep.temperature)
    if key not in _WARM_CACHE:
        problem = bridge_problem(BridgeOptions(**sweep.bridge))
        spelling = Spelling.for_problem(problem, tokenizer, BridgeOptions().alphabet)
        policy = CausalLMPolicy(model, temperature=sweep.temperature)
        loglik = format_warmup(policy, tokenizer, problem, spelling, m.warmup_steps, m.warmup_lr, spec.seed)
        model.zero_grad(set_to_none=True)
        _WARM_CACHE[key] = (copy.deepcopy(model.state_dict()), loglik)
    state, loglik = _WARM_CACHE[key]
    model.load_state_dict(state)
    return model, tokenizer, loglik


def run_one(spec: RunSpec, sweep: Sweep, out: Path, log=print) -> Path:
    """Train one run (no checkpoints); metrics.jsonl gets step 0 (initial J) then every step."""
    import torch

    from seeupo.llm.metrics import MetricsLogger
    from seeupo.llm.trainer import Trainer

    folder = spec.folder(out)
    if is_complete(folder, spec.model.steps):
        log(f"skip {folder} (complete)")
        return folder
    torch.manual_seed(spec.seed)
    model, tokenizer, warmup_loglik = _warmed_model(spec, sweep)
    cfg = train_config(spec, sweep, out, warmup_done=True)
    trainer = Trainer(cfg, model=model, tokenizer=tokenizer)
    folder.mkdir(parents=True, exist_ok=True)
    # the config as run; the format warm-up (env.options.warmup_*) ran before, once per seed
    record = cfg.to_dict()
    record["env"]["options"] |= {"warmup_steps": spec.model.warmup_steps, "warmup_lr": spec.model.warmup_lr}
    (folder / "config.json").write_text(json.dumps(record, indent=1) + "\n")
    with MetricsLogger(folder) as logger:
        initial = {"bridge/warmup_loglik": warmup_loglik} if warmup_loglik is not None else {}
        logger.log(0, initial | trainer.env.metrics(trainer.policy))
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
        "valid_prob_turn0_final": records[-1].get("bridge/valid_prob_turn0"),
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m seeupo.experiments.bridge_lm", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smallest configuration: seeupo, tiny model, 2 steps")
    p.add_argument("--out", default="results/bridge_lm", help="per-run folders (not committed)")
    p.add_argument("--tables", default=None, help=f"where results.json/.md go (default {DEFAULT_TABLES}; --quick: OUT)")
    p.add_argument("--models", nargs="*", default=None, help="only these models (names as in the sweep)")
    p.add_argument("--presets", nargs="*", default=None, help="only these presets, in this order")
    p.add_argument("--tables-only", action="store_true", help="do not train; rebuild the tables from OUT")
    p.add_argument("--note", default="", help="text appended to results.md")
    p.add_argument("--ablations", nargs="*", default=None,
                   help=f"ablation sweeps to run after the main one (default: all of {sorted(ABLATIONS)}; none with --quick)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    args = parse_args(argv)
    torch.set_num_threads(1)
    sweep = quick_sweep() if args.quick else full_sweep()
    out = Path(args.out)
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
