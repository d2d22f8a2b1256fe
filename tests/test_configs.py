"""The shipped configs: the paper's runs hold the paper's settings, and each one dry-runs with the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

from seeupo.llm.config import load_train_config  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PAPER = sorted((CONFIGS / "paper").glob("*.yaml"))


def test_the_paper_grid_is_complete_and_holds_the_papers_settings():
    names = {p.stem for p in PAPER}
    assert names == {f"{m}_{e}_{p}" for m in ("qwen3-14b", "qwen2.5-14b") for e in ("appworld", "bfcl")
                     for p in ("ppo", "grpo", "gspo", "rloo", "seeupo")}
    for path in PAPER:
        cfg = load_train_config(path)
        model, env, preset = path.stem.split("_")
        a, r = cfg.algorithm, cfg.rollout
        assert a.name == preset and cfg.env.name == env
        assert (a.group_size, a.kl_coef, a.kl_estimator, a.clip_eps_low, a.clip_eps_high) == (8, 0.002, "k3", 0.2, 0.2)
        assert (cfg.optim.lr, r.temperature, r.max_turns, r.tasks_per_step) == (1e-6, 0.9, 10, 32)
        assert cfg.env.options["max_steps"] == 10
        # epochs x training tasks / tasks per step: AppWorld 75 x 90 / 32, BFCL 50 x 100 / 32
        assert cfg.steps == {"appworld": 211, "bfcl": 157}[env]
        assert cfg.model.name.endswith({"qwen3-14b": "Qwen3-14B", "qwen2.5-14b": "Qwen2.5-14B-Instruct"}[model])


@pytest.mark.parametrize("path", PAPER, ids=lambda p: p.stem)
def test_paper_config_environment_builds(path):
    from seeupo.llm.envs import make_environment
    from seeupo.llm.models import train_bpe_tokenizer

    cfg = load_train_config(path)
    if cfg.env.name == "bfcl":
        pytest.importorskip("bfcl_eval", reason="BFCL configs need bfcl-eval (the Makefile installs it)")
    if cfg.env.name == "appworld":
        from seeupo.validation.errors import InputError

        try:
            spec = make_environment(cfg.env.name, cfg.env.options, train_bpe_tokenizer(), cfg.seed)
        except InputError as err:  # no AppWorld environment here, or no data bundle (never downloadable here)
            if "no AppWorld interpreter" not in str(err) and "data bundle not installed" not in str(err):
                raise
            pytest.skip(f"AppWorld configs need an AppWorld environment with its data bundle: {err}")
    else:
        spec = make_environment(cfg.env.name, cfg.env.options, train_bpe_tokenizer(), cfg.seed)
    assert len(spec.tasks) == {"bfcl": 100, "appworld": 90}[cfg.env.name]
    env = spec.make(None)
    messages = env.reset(spec.tasks[0])
    assert messages and all({"role", "content"} <= set(m) for m in messages)


@pytest.mark.slow
def test_every_paper_algorithm_dry_runs_with_the_tiny_model(tmp_path):
    """One trainer step with each distinct algorithm and optimizer section, the tiny model and the bridge."""
    from seeupo.llm.trainer import Trainer

    small = ["model.name=tiny-qwen3", "model.dtype=float32", "env.name=bridge", "env.options={}", "rollout.engine=hf", "rollout.vllm_sleep=false",
             "rollout.tasks_per_step=2", "algorithm.group_size=2", "rollout.max_turns=2", "steps=1", "logging.progress=false"]
    seen = {}
    for path in PAPER:
        cfg = load_train_config(path, small + [f"out_dir={tmp_path / path.stem}"])
        key = repr((cfg.algorithm, cfg.optim))
        if key not in seen:
            seen[key] = Trainer(cfg).train()[-1]
    assert len(seen) == 5  # one per preset: the configs differ only in the algorithm's preset
    for metrics in seen.values():
        assert all(v == v for v in metrics.values())  # finite or at least not NaN
