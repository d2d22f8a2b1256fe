"""Plugins: a user's file registers an advantage estimator that ``seeupo train`` then trains with;
missing files, clashes and edited plugins are one-line errors, the user's own bug a traceback."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from seeupo import plugins
from seeupo.cli import main
from seeupo.core.config import REGISTRIES
from seeupo.core.registry import AGGREGATIONS, TURN_ORDERS, adv_estimator

SMALL = ["rollout.tasks_per_step=2", "algorithm.group_size=2", "env.options.warmup_steps=0", "env.options.num_tasks=4",
         "logging.progress=false", "steps=1", "checkpoint.every=1"]

# the README's estimator; every call appends a line to CALLS so the test can see the trainer used it
MEDIAN = '''
import torch

from seeupo.core.advantages import broadcast_to_tokens
from seeupo.core.batch import per_trajectory
from seeupo.core.registry import register_adv_est

CALLS = {calls!r}

@register_adv_est("plugin_median", needs_group_stats=True, exact=False)
def plugin_median(batch, cfg, *, critic_values=None, oracle=None, group_stats=None):
    """R_i minus the median return of its group, on every token of the trajectory."""
    with open(CALLS, "a") as f:
        f.write("called\\n")
    r, g = per_trajectory(batch.traj_return, batch), per_trajectory(batch.group_id, batch)
    med = torch.stack([r[g == k].median() for k in g.tolist()])
    return broadcast_to_tokens((r - med)[batch.traj_id], batch)
'''


def _forget_plugins() -> None:
    """What a new process sees: only the built-in entries, nothing loaded."""
    for registry in REGISTRIES:
        for name in registry.names():
            if _module_of(registry, name).startswith("seeupo_plugin_"):
                registry.remove(name)
    plugins._LOADED.clear()


def _module_of(registry, name: str) -> str:
    return getattr(registry.get(name).fn, "__module__", "")


@pytest.fixture(autouse=True)
def fresh_registries():
    _forget_plugins()
    yield
    _forget_plugins()


def _train(tmp_path, *extra: str) -> list[str]:
    sets = [a for s in SMALL for a in ("--set", s)]
    return ["train", "--out", str(tmp_path / "run"), "--no-progress", *sets, *extra]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_plugin_estimator_trains_and_the_saved_config_records_it(tmp_path, capsys):
    calls = tmp_path / "calls.txt"
    plugin = tmp_path / "median.py"
    plugin.write_text(MEDIAN.format(calls=str(calls)))
    args = _train(tmp_path, "--set", "algorithm.advantage=plugin_median", "--plugin", str(plugin), "--plugin", str(plugin))
    assert main(args) == 0
    assert calls.read_text().count("called") >= 1  # the trainer's advantages came from the plugin
    import yaml

    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    digest = hashlib.sha256(plugin.read_bytes()).hexdigest()
    assert saved["algorithm"]["advantage"] == "plugin_median"
    assert saved["plugins"] == [f"{plugin.resolve()}@sha256:{digest}"]  # given twice, loaded and recorded once

    # a resume in a new process with the plugin edited is refused by the config comparison
    _forget_plugins()
    plugin.write_text(plugin.read_text() + "# edited\n")
    capsys.readouterr()
    assert main(_train(tmp_path, "--set", "algorithm.advantage=plugin_median", "--plugin", str(plugin),
                       "--set", "steps=2", "--resume")) == 2
    err = _one_line_error(capsys)
    assert "argument --resume" in err and "plugins" in err and digest in err
    # the saved config itself pins the hash: running it again names the change
    _forget_plugins()
    assert main(["train", str(tmp_path / "run" / "config.yaml"), "--out", str(tmp_path / "other")]) == 2
    err = _one_line_error(capsys)
    assert "config.plugins[0]" in err and "has changed" in err and digest[:12] in err


def test_plugin_in_the_config_file_is_loaded_before_the_algorithm_is_checked(tmp_path):
    plugin = tmp_path / "median.py"
    plugin.write_text(MEDIAN.format(calls=str(tmp_path / "calls.txt")))
    config = tmp_path / "run.yaml"
    config.write_text(f"plugins: [{plugin}]\nalgorithm: {{preset: grpo, advantage: plugin_median}}\n")
    from seeupo.llm.config import load_train_config

    cfg = load_train_config(config)
    assert cfg.algorithm.advantage == "plugin_median"
    assert cfg.plugins == (f"{plugin.resolve()}@sha256:{hashlib.sha256(plugin.read_bytes()).hexdigest()}",)


def test_without_the_plugin_the_estimator_is_unknown(tmp_path, capsys):
    assert main(_train(tmp_path, "--set", "algorithm.advantage=plugin_median")) == 2
    err = _one_line_error(capsys)
    assert "plugin_median" in err and "grae" in err and "gae" in err
    assert not (tmp_path / "run").exists()


def test_missing_plugin_file_or_module_is_one_line(tmp_path, capsys):
    assert main(_train(tmp_path, "--plugin", str(tmp_path / "nope.py"))) == 2
    err = _one_line_error(capsys)
    assert "--plugin" in err and "nope.py" in err
    assert main(_train(tmp_path, "--plugin", "no_such_plugin_module")) == 2
    assert "no_such_plugin_module" in _one_line_error(capsys)
    config = tmp_path / "run.yaml"
    config.write_text("plugins: [missing.py]\n")
    assert main(["eval", str(config), "--out", str(tmp_path / "eval")]) == 2
    err = _one_line_error(capsys)
    assert "config.plugins[0]" in err and "missing.py" in err
    (tmp_path / "plugin.txt").write_text("x = 1\n")  # importlib has no loader for this suffix
    assert main(_train(tmp_path, "--plugin", str(tmp_path / "plugin.txt"))) == 2
    assert "must be a .py file" in _one_line_error(capsys)


def test_clash_with_a_builtin_is_one_line_naming_both_and_leaves_nothing_behind(tmp_path, capsys):
    plugin = tmp_path / "clash.py"
    plugin.write_text(
        "from seeupo.core.registry import register_adv_est, register_aggregation, register_turn_order\n"
        "@register_aggregation('my_sum')\ndef my_sum(n_tokens, weight):\n    return weight, weight\n"
        "@register_turn_order('my_order')\ndef my_order(num_turns, cfg, generator):\n    return list(range(num_turns))\n"
        "@register_adv_est('grae')\ndef grae(batch, cfg, **kw):\n    return None\n"
    )
    builtin = adv_estimator("grae").fn
    assert main(_train(tmp_path, "--plugin", str(plugin))) == 2
    err = _one_line_error(capsys)
    assert "'grae' is already registered" in err and "seeupo.core.builtins.grae" in err and str(plugin.resolve()) in err
    assert adv_estimator("grae").fn is builtin
    assert "my_sum" not in AGGREGATIONS and "my_order" not in TURN_ORDERS  # the plugin's earlier registrations were undone


def test_loading_the_same_file_twice_is_a_no_op(tmp_path):
    plugin = tmp_path / "median.py"
    plugin.write_text(MEDIAN.format(calls=str(tmp_path / "calls.txt")))
    first = plugins.load_plugin(str(plugin))
    fn = adv_estimator("plugin_median").fn
    assert plugins.load_plugin(str(tmp_path / "." / "median.py")) == first
    assert adv_estimator("plugin_median").fn is fn
    assert first.sha256 == hashlib.sha256(plugin.read_bytes()).hexdigest()


def test_an_error_in_the_plugin_shows_its_traceback(tmp_path):
    plugin = tmp_path / "buggy.py"
    plugin.write_text("x = 1\n\ndef helper():\n    return {}['missing_key']\n\nhelper()\n")
    proc = subprocess.run([sys.executable, "-m", "seeupo.cli", "train", "--plugin", str(plugin), "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and f'File "{plugin.resolve()}", line 4, in helper' in proc.stderr
    assert "KeyError: 'missing_key'" in proc.stderr
