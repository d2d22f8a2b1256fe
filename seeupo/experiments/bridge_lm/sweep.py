"""What the bridge sweep trains: the fixed problem, each model's settings, the runs, and each run's training config."""

from __future__ import annotations

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
