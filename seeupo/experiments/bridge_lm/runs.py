"""One run of the sweep trained: the seed's format warm-up (run once, shared by the presets), then the RL steps
with the exact ``J`` after each, into the run's ``metrics.jsonl``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from seeupo.experiments.bridge_lm.sweep import RunSpec, Sweep, train_config


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
