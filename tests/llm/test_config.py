"""The train config: paper defaults, presets plus overrides, YAML quirks, one-line errors naming the key."""

import pytest

from seeupo.core.config import PRESETS
from seeupo.llm.config import PAPER_ALGORITHM, TrainConfig, load_train_config
from seeupo.validation import InputError


def test_defaults_are_the_papers_settings():
    cfg = load_train_config(None)
    assert cfg.algorithm == PRESETS["seeupo"].replace(**PAPER_ALGORITHM)
    assert (cfg.algorithm.group_size, cfg.algorithm.kl_coef, cfg.algorithm.kl_estimator) == (8, 0.002, "k3")
    assert (cfg.algorithm.clip_eps_low, cfg.algorithm.clip_eps_high) == (0.2, 0.2)
    assert (cfg.optim.lr, cfg.rollout.temperature, cfg.rollout.max_turns, cfg.rollout.tasks_per_step) == (1e-6, 0.9, 10, 32)


def test_yaml_file_with_overrides_and_round_trip(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algorithm:\n  preset: gspo\n  epochs: 2\noptim:\n  lr: 1e-5\nenv:\n  name: bridge\n  options: {turns: 3}\nsteps: 4\n")
    cfg = load_train_config(path, ["optim.warmup_steps=2", "algorithm.minibatches=4", "env.options.kind=tree_mdp"])
    assert cfg.algorithm == PRESETS["gspo"].replace(**PAPER_ALGORITHM, epochs=2, minibatches=4)
    assert cfg.optim.lr == 1e-5 and cfg.optim.warmup_steps == 2 and cfg.steps == 4  # 1e-5 is a float, not a string
    assert cfg.env.options == {"turns": 3, "kind": "tree_mdp"}
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("overrides,message", [
    (["optim.lrr=1"], "field 'config.optim.lrr': unknown field; expected ['beta1'"),
    (["algorithm.preset=nope"], "unknown preset 'nope'; expected one of ['grpo'"),
    (["algorithm.order=sideways"], "field 'config.algorithm.order': unknown value 'sideways'"),
    (["steps=true"], "field 'config.steps': must be an integer, got a boolean"),
    (["steps=0"], "field 'config.steps': must be in [1,"),
    (["rollout.temperature=hot"], "field 'config.rollout.temperature': must be a finite number, got a string"),
    (["optim=3"], "field 'config.optim': must be an object"),
    (["novalue"], "argument --set: expected KEY=VALUE"),
    (["rollout.vllm_sleep=true"], "field 'config.rollout.vllm_sleep': needs rollout.engine: vllm"),
    (["rollout.engine=sglang"], "field 'config.rollout.engine': unknown value 'sglang'"),
    (["parallel.mixed_precision=fp8"], "field 'config.parallel.mixed_precision': unknown value 'fp8'"),
    (["optim.micro_batch_tokens=0"], "field 'config.optim.micro_batch_tokens': must be in [1,"),
])
def test_bad_overrides_name_the_key(overrides, message):
    with pytest.raises(InputError) as err:
        load_train_config(None, overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("text,message", [
    ("steps: [1\n", "not valid YAML"),
    ("a: &x 1\nb: *x\n", "anchors and aliases"),
    ("- 1\n- 2\n", "must be a mapping of sections"),
    ("modle: {}\n", "field 'config.modle': unknown field"),
])
def test_bad_files_name_the_file(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        load_train_config(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_missing_file():
    with pytest.raises(InputError, match="no such file"):
        load_train_config("does/not/exist.yaml")
