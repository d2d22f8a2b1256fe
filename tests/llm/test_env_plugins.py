"""Environments as plugins: the one registry (built-ins, clashes, unknown names), a plugin's environment
trained and resumed through ``seeupo train``, and a hostile plugin's environment refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from seeupo import plugins  # noqa: E402
from seeupo.cli import main  # noqa: E402
from seeupo.core.boundary import PluginError  # noqa: E402
from seeupo.core.registry import NameClash  # noqa: E402
from seeupo.llm.checkpoint import checkpoint_step, latest_checkpoint  # noqa: E402
from seeupo.llm.config import load_train_config  # noqa: E402
from seeupo.llm.envs import ENVIRONMENTS, make_environment, register_env  # noqa: E402
from seeupo.validation.errors import InputError  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "environments"
SMALL = ["--set", "steps=1", "--set", "checkpoint.every=1", "--set", "rollout.tasks_per_step=1",
         "--set", "algorithm.group_size=2", "--no-progress"]

# a plugin environment; BODY is its step's return, so each test breaks one thing
HOSTILE = '''
import torch

from seeupo.llm.agent import StepResult
from seeupo.llm.envs import EnvSpec, register_env


class Echo:
    def reset(self, task):
        return {reset}

    def step(self, text, token_ids):
        return {step}


@register_env("hostile")
def make_hostile(opts, tokenizer, seed):
    """An environment that breaks its contract."""
    return {spec}
'''
GOOD = {"reset": '[{"role": "user", "content": "say something"}]', "step": 'StepResult(None, 1.0, True, {})',
        "spec": "EnvSpec(tasks=[0, 1], make=lambda generator: Echo())"}


@pytest.fixture(autouse=True)
def fresh_registries():
    """What a new process sees: only the built-in entries, nothing loaded."""
    plugins.forget_plugins()
    yield
    plugins.forget_plugins()


def _hostile(tmp_path: Path, **broken: str) -> Path:
    path = tmp_path / "hostile.py"
    path.write_text(HOSTILE.format(**{**GOOD, **broken}))
    return path


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


# ---------------------------------------------------------------------------------------------- the registry


def test_builtins_are_registered_and_importing_the_registry_loads_none_of_them():
    assert ENVIRONMENTS.names()[:3] == ("bridge", "bfcl", "appworld")
    code = ("import sys, seeupo.llm.envs as e; assert e.ENVIRONMENTS.names() == ('bridge', 'bfcl', 'appworld'); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('seeupo.llm.envs.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_taken_name_is_refused_builtin_or_not(tmp_path, capsys):
    with pytest.raises(NameClash, match="environment 'bridge' is (built in|already registered)"):  # imported or not
        register_env("bridge")(lambda opts, tokenizer, seed: None)
    plugin = tmp_path / "again.py"
    plugin.write_text("from seeupo.llm.envs import register_env\n\n"
                      "@register_env('twice')\ndef first(opts, tokenizer, seed):\n    pass\n\n"
                      "@register_env('twice')\ndef second(opts, tokenizer, seed):\n    pass\n")
    assert main(["train", "--plugin", str(plugin), "--out", str(tmp_path / "run")]) == 2
    err = _one_line_error(capsys)
    assert "environment 'twice' is already registered" in err and "again.py" in err
    assert "twice" not in ENVIRONMENTS  # the failed import left nothing behind
    assert not (tmp_path / "run").exists()


def test_an_unknown_environment_is_one_line_listing_the_registered_ones(tmp_path):
    with pytest.raises(InputError) as err:
        load_train_config(None, ["env.name=nope"])
    assert "\n" not in str(err.value) and "unknown environment 'nope'" in str(err.value)
    assert "['appworld', 'bfcl', 'bridge']" in str(err.value)
    load_train_config(None, ["env.name=guess_number"], [str(EXAMPLE / "guess_number.py")])  # a plugin's name is known
    with pytest.raises(InputError, match=r"'bridge', 'guess_number'\]"):  # and listed with the others
        load_train_config(None, ["env.name=nope"])


def test_register_env_checks_its_options_and_bounds():
    from dataclasses import dataclass

    @dataclass
    class Opts:
        size: int = 1

    with pytest.raises(TypeError, match="must be a dataclass"):
        register_env("bad_options", options=dict)(lambda opts, tokenizer, seed: None)
    with pytest.raises(TypeError, match=r"bounds name no field of its options: \['sise'\]"):
        register_env("bad_bounds", options=Opts, bounds={"sise": (1, 2)})(lambda opts, tokenizer, seed: None)
    assert "bad_bounds" not in ENVIRONMENTS


def test_plugin_options_are_checked_before_any_model_loads():
    example = [str(EXAMPLE / "guess_number.py")]
    with pytest.raises(InputError, match=r"config.env.options.max_steps.*\[1, 20\]"):
        load_train_config(None, ["env.name=guess_number", "env.options.max_steps=0"], example)
    with pytest.raises(InputError, match="rollout.max_turns"):  # max_steps is the environment's budget
        load_train_config(None, ["env.name=guess_number", "env.options.max_steps=12"], example)
    with pytest.raises(InputError, match="unknown"):
        load_train_config(None, ["env.name=guess_number", "env.options.colour=1"], example)


# ---------------------------------------------------------------------------------------------- end to end


def test_a_plugin_environment_trains_resumes_and_evaluates(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config, plugin = EXAMPLE / "guess_number.yaml", EXAMPLE / "guess_number.py"
    run = tmp_path / "run"
    assert main(["train", str(config), "--plugin", str(plugin), "--out", str(run), *SMALL]) == 0
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if "critic/score/mean" in m] == [1]
    assert 0.0 <= lines[-1]["critic/score/mean"] <= 1.0
    import yaml

    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["env"]["name"] == "guess_number" and saved["plugins"][0].startswith(f"{plugin}@sha256:")
    # a new process resumes from the saved config alone: it loads the recorded plugin
    plugins.forget_plugins()
    assert "guess_number" not in ENVIRONMENTS
    assert main(["train", str(run / "config.yaml"), "--out", str(run), "--resume", "--set", "steps=2", "--no-progress"]) == 0
    assert checkpoint_step(latest_checkpoint(run / "checkpoints")) == 2
    plugins.forget_plugins()
    assert main(["eval", str(run / "config.yaml"), "--checkpoint", str(run), "--k", "1", "--max-tasks", "2",
                 "--out", str(tmp_path / "eval"), "--no-progress"]) == 0
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["checkpoint_step"] == 2 and summary["episodes"] == 2


# ---------------------------------------------------------------------------------------------- hostile plugins


@pytest.mark.parametrize("broken,expected", [
    ({"spec": "{'tasks': [0]}"}, "its builder returned dict {'tasks': [0]}; expected an EnvSpec"),
    ({"spec": "EnvSpec(tasks=[], make=lambda generator: Echo())"}, "expected EnvSpec.tasks as a non-empty list"),
    ({"spec": "EnvSpec(tasks=[0], make=lambda generator: Echo(), max_new_tokens=0)"}, "max_new_tokens a positive int"),
    ({"spec": "EnvSpec(tasks=[0], make=lambda generator: 3)"}, "EnvSpec.make returned int 3; expected an environment"),
    ({"reset": "'hello'"}, "reset returned str 'hello'; expected a non-empty list"),
    ({"step": "StepResult(None, float('nan'), True, {})"}, "step returned float nan; expected a reward that is a finite"),
    ({"step": "StepResult(None, torch.tensor(1.0), True, {})"}, "expected a reward that is a finite number"),
    ({"step": "StepResult(123, 1.0, True, {})"}, "step returned int 123; expected an observation that is a str or None"),
    ({"step": "StepResult(None, 1.0, 1, {})"}, "step returned int 1; expected done as a bool"),
    ({"step": "StepResult(None, 1.0, True, None)"}, "expected info as a dict"),
    ({"step": "(None, 1.0, True, {})"}, "step returned tuple (None, 1.0, True, {}); expected a StepResult"),
    ({"step": "1 / 0"}, "step raised ZeroDivisionError: division by zero (at hostile.py:13 in step)"),
])
def test_a_hostile_environment_is_refused_in_one_line_naming_the_plugin(broken, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plugins.load_plugin(str(_hostile(tmp_path, **broken)))
    with pytest.raises(PluginError) as err:
        spec = make_environment("hostile", {}, None, 0)
        env = spec.make(None)
        env.reset(spec.tasks[0])
        env.step("a guess", [1, 2])
    text = str(err.value)
    assert "\n" not in text and text.startswith("environment 'hostile' (hostile.py:16): "), text
    assert expected in text, text


def test_a_sound_plugin_environment_passes_the_checks_unchanged(tmp_path):
    plugins.load_plugin(str(_hostile(tmp_path)))
    spec = make_environment("hostile", {}, None, 0)
    env = spec.make(None)
    assert env.reset(0) == [{"role": "user", "content": "say something"}]
    result = env.step("x", [1])
    assert (result.observation, result.reward, result.done, result.info) == (None, 1.0, True, {})
    assert getattr(env, "truncate", None) is None and getattr(env, "gamma", None) is None  # as the environment has them
    with pytest.raises(InputError, match="takes no options"):
        make_environment("hostile", {"size": 1}, None, 0)


@pytest.mark.parametrize("broken,expected", [
    ({"spec": "None"}, "its builder returned NoneType None; expected an EnvSpec"),
    ({"step": "StepResult(None, float('inf'), True, {})"}, "step returned float inf; expected a reward that is a finite"),
])
def test_train_with_a_hostile_environment_exits_2_with_one_line(broken, expected, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _hostile(tmp_path, **broken)
    args = ["train", "--plugin", "hostile.py", "--set", "env.name=hostile", "--out", "run", *SMALL]
    assert main(args) == 2
    err = _one_line_error(capsys)
    assert err.startswith("seeupo train: error: environment 'hostile' (hostile.py:16): ") and expected in err, err
    # a builder's error comes before the run starts; a step's during it, which marks the run folder failed
    assert (tmp_path / "run" / "failed.txt").exists() == ("step" in expected)
