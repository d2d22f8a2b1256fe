"""Plugins: a user's file registers an advantage estimator that ``seeupo train`` then trains with;
missing files, clashes and edited plugins are one-line errors, the user's own bug a traceback."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from seeupo import plugins
from seeupo.cli import main
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


@pytest.fixture(autouse=True)
def fresh_registries():
    """What a new process sees: only the built-in entries, nothing loaded."""
    plugins.forget_plugins()
    yield
    plugins.forget_plugins()


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
    plugins.forget_plugins()
    plugin.write_text(plugin.read_text() + "# edited\n")
    capsys.readouterr()
    assert main(_train(tmp_path, "--set", "algorithm.advantage=plugin_median", "--plugin", str(plugin),
                       "--set", "steps=2", "--resume")) == 2
    err = _one_line_error(capsys)
    assert "argument --resume" in err and "plugins" in err and digest in err
    # the saved config itself pins the hash: running it again names the change
    plugins.forget_plugins()
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


def test_an_error_in_the_plugin_is_one_line_with_its_own_frames(tmp_path):
    plugin = tmp_path / "buggy.py"
    plugin.write_text("x = 1\n\ndef helper():\n    return {}['missing_key']\n\nhelper()\n")
    proc = subprocess.run([sys.executable, "-m", "seeupo.cli", "train", "--plugin", str(plugin), "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)
    # one line (exit 2) that keeps the user's own frames, not the toolkit's traceback
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "failed to import: KeyError: 'missing_key'" in proc.stderr
    assert "buggy.py:6 in <module>, " in proc.stderr and "buggy.py:4 in helper)" in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------------
# a plugin algorithm in verify, search, replay, presets and check
# ---------------------------------------------------------------------------------------------

# an estimator that credits the worse trajectories: every exact update lowers J
ANTI = '''
from seeupo.core.advantages import broadcast_to_tokens
from seeupo.core.batch import per_trajectory, segment_sum
from seeupo.core.config import preset, register_preset
from seeupo.core.registry import register_adv_est

@register_adv_est("anti_test", needs_group_stats=True)
def anti(batch, cfg, *, critic_values=None, oracle=None, group_stats=None):
    """The group mean minus the return: GRPO's advantage with the sign flipped."""
    r, g = per_trajectory(batch.traj_return, batch), per_trajectory(batch.group_id, batch)
    mean = segment_sum(r, g, batch.num_groups) / cfg.group_size
    return broadcast_to_tokens((mean[g] - r)[batch.traj_id], batch)

register_preset(preset("rloo", name="anti_pg", advantage="anti_test"))
'''


def _anti_plugin(tmp_path):
    plugin = tmp_path / "anti.py"
    plugin.write_text(ANTI)
    return plugin


def test_verify_runs_a_plugin_algorithm_in_worker_processes(tmp_path, capsys):
    plugin = _anti_plugin(tmp_path)
    out = tmp_path / "verify"
    args = ["verify", "--algorithms", "anti_pg,grpo", "--plugin", str(plugin), "--quick", "--instances", "2",
            "--iterations", "2", "--workers", "2", "--no-progress", "--out", str(out)]
    assert main(args) == 0
    import json

    report = json.loads((out / "verify.json").read_text())
    assert [e["row"] for e in report["table1"]] == ["anti_pg", "grpo"]
    anti = [c for c in report["cells"] if c["row"] == "anti_pg"]
    assert {c["verdict"] for c in anti} == {"J decreased"} and all(c["violations"] > 0 for c in anti)
    assert report["table1"][1]["MT"]["paper"] == "no guarantee"  # a paper row keeps its claim
    assert report["config"]["plugins"] == [plugins.loaded_plugins()[0].spec]
    capsys.readouterr()
    plugins.forget_plugins()  # a new process without the plugin
    assert main(["verify", "--algorithms", "anti_pg", "--quick", "--out", str(out)]) == 2
    err = _one_line_error(capsys)
    assert "argument --algorithms: unknown algorithms ['anti_pg']" in err and "--plugin" in err


def test_search_finds_a_plugin_counterexample_and_replay_needs_the_same_plugin(tmp_path, capsys):
    plugin = _anti_plugin(tmp_path)
    out = tmp_path / "search"
    assert main(["search", "--algorithm", "anti_pg", "--plugin", str(plugin), "--max-examples", "3", "--out", str(out)]) == 0
    files = sorted(out.glob("anti_pg_*.json"))
    from seeupo.experiments.searches import algorithm_searches

    assert len(files) == len(algorithm_searches("anti_pg")) == 9  # every generic search finds it, the agentic ones too
    import json

    recorded = json.loads(files[0].read_text())
    assert recorded["plugins"] == [plugins.loaded_plugins()[0].spec]
    assert recorded["algorithm"]["advantage"] == "anti_test"
    assert all(e["plugins"] == recorded["plugins"] for e in json.loads((out / "searches.json").read_text()))
    assert main(["replay", str(files[0]), "--plugin", str(plugin)]) == 0
    assert "reproduced" in capsys.readouterr().out

    plugins.forget_plugins()  # a new process: the file alone does not import the plugin it names
    assert main(["replay", str(files[0])]) == 2
    err = _one_line_error(capsys)
    assert "field 'plugins'" in err and "recorded with plugin" in err and "--plugin" in err
    plugin.write_text(ANTI + "# edited\n")  # an edited plugin does not pass for the recorded one
    assert main(["replay", str(files[0]), "--plugin", str(plugin)]) == 2
    assert "is not loaded with that content" in _one_line_error(capsys)


def test_search_algorithm_errors_are_one_line(tmp_path, capsys):
    assert main(["search", "--algorithm", "nope", "--out", str(tmp_path)]) == 2
    assert "argument --algorithm: unknown algorithm 'nope'" in _one_line_error(capsys)
    assert main(["search", "--algorithm", "grpo", "grpo_st_stochastic", "--out", str(tmp_path)]) == 2
    assert "not both" in _one_line_error(capsys)
    assert main(["search", "--staleness", "1", "--out", str(tmp_path)]) == 2
    assert "rows off policy need --algorithm" in _one_line_error(capsys)


def test_an_algorithm_s_search_off_policy_saves_cases_that_replay_their_rows(tmp_path, capsys):
    plugin = _anti_plugin(tmp_path)
    out = tmp_path / "search"
    assert main(["search", "--algorithm", "anti_pg", "--plugin", str(plugin), "--max-examples", "2", "--staleness", "1",
                 "--top-p", "0.9", "--out", str(out)]) == 0
    import json

    files = sorted(out.glob("anti_pg_*.json"))
    recorded = json.loads(files[0].read_text())
    assert recorded["run"]["staleness"] == 1 and recorded["run"]["sampler"]["top_p"] == 0.9
    assert main(["replay", str(files[0]), "--plugin", str(plugin)]) == 0
    assert "reproduced" in capsys.readouterr().out


def test_presets_of_a_plugin_and_of_an_installed_package(tmp_path, monkeypatch, capsys):
    plugin = _anti_plugin(tmp_path)
    assert main(["presets", "anti_pg", "--plugin", str(plugin)]) == 0
    assert "advantage = anti_test" in capsys.readouterr().out
    # an installed package offers its plugin through the entry-point group
    package = tmp_path / "site" / "fake_seeupo_algos"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(ANTI.replace("anti_test", "anti_ep").replace("anti_pg", "anti_ep_pg"))
    info = tmp_path / "site" / "fake_seeupo_algos-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-seeupo-algos\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[seeupo.plugins]\nfake = fake_seeupo_algos\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert plugins.entry_point_plugins() == ["fake_seeupo_algos"]
    assert main(["presets", "anti_ep_pg"]) == 0
    assert "advantage = anti_ep" in capsys.readouterr().out
    assert [p.name for p in plugins.loaded_plugins()][-1] == "fake_seeupo_algos"


def test_a_package_plugin_hash_covers_every_file(tmp_path, monkeypatch):
    package = tmp_path / "pkg_hash_test"
    package.mkdir()
    (package / "__init__.py").write_text("from pkg_hash_test import impl  # noqa: F401\n")
    (package / "impl.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = plugins.load_plugin("pkg_hash_test").sha256
    plugins.forget_plugins()
    (package / "impl.py").write_text("X = 2\n")
    assert plugins.load_plugin("pkg_hash_test").sha256 != before


@pytest.mark.slow
def test_check_reports_the_counterexamples_of_a_plugin_algorithm(tmp_path, capsys):
    plugin = _anti_plugin(tmp_path)
    out = tmp_path / "check"
    args = ["check", "anti_pg", "--plugin", str(plugin), "--quick", "--no-bridge", "--max-examples", "2",
            "--no-progress", "--out", str(out)]
    assert main(args) == 0
    assert capsys.readouterr().out.startswith("anti_pg: J decreased; ")
    import json

    report = json.loads((out / "check.json").read_text())
    assert report["monotonicity"]["measured"] == "J decreased"
    # two cases a search: hypothesis's first draws are its simplest (a flat reward table moves nothing), so not every
    # search finds one; each that does replays
    found = [s for s in report["searches"] if s["found"]]
    assert found and all(s["reproduces"] for s in found)
    assert report["plugins"] == [plugins.loaded_plugins()[0].spec]
    text = (out / "check.md").read_text()
    assert "Exact monotonicity, measured: **J decreased**" in text and "--plugin" in text
    assert (out / "check.png").stat().st_size > 1000
    for s in found:
        assert main(["replay", str(out / s["file"]), "--plugin", str(plugin)]) == 0
    capsys.readouterr()
    assert main(args) == 2  # one check per folder
    assert "is not empty" in _one_line_error(capsys)
    (out / "notes.txt").write_text("mine")
    assert main([*args, "--overwrite"]) == 0
    assert (out / "notes.txt").read_text() == "mine"  # --overwrite moves only the check's own files aside
    assert list(out.glob("previous-*/counterexamples/*.json"))  # and deletes none


def test_check_of_an_estimator_without_exact_mode_runs_sampled_cells_only(tmp_path, capsys):
    plugin = tmp_path / "inexact.py"
    plugin.write_text(ANTI.replace("needs_group_stats=True)", "needs_group_stats=True, exact=False)"))
    out = tmp_path / "check"
    assert main(["check", "anti_pg", "--plugin", str(plugin), "--quick", "--no-bridge", "--no-progress",
                 "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith("anti_pg: exact: refused (registered with exact=False)")  # the report's words
    import json

    report = json.loads((out / "check.json").read_text())
    assert report["searches"] == [] and report["verify"]["no_exact_mode"] == ["anti_pg"]
    assert {c["mode"] for c in report["verify"]["cells"]} == {"sampled"}


def test_search_and_check_refuse_to_replace_an_earlier_run_and_a_file_as_out(tmp_path, capsys):
    out = tmp_path / "search"
    out.mkdir()
    (out / "seeupo_mt_bandit.json").write_text("an earlier search's counterexample")
    assert main(["search", "--algorithm", "seeupo", "--max-examples", "1", "--out", str(out)]) == 2
    assert "seeupo_mt_bandit.json already exist" in _one_line_error(capsys)
    assert (out / "seeupo_mt_bandit.json").read_text() == "an earlier search's counterexample"
    (tmp_path / "file").write_text("x")
    assert main(["check", "seeupo", "--quick", "--no-bridge", "--out", str(tmp_path / "file")]) == 2
    assert "is not a folder" in _one_line_error(capsys)


# ---------------------------------------------------------------------------------------------
# broken plugins: one line naming the function and where it was registered, exit 2, no folder left
# ---------------------------------------------------------------------------------------------

BROKEN = '''import torch
from seeupo.core.advantages import broadcast_to_tokens
from seeupo.core.batch import per_trajectory, segment_sum
from seeupo.core.config import preset, register_preset
from seeupo.core.registry import register_adv_est, register_policy_loss


@register_adv_est("user_adv", needs_group_stats=True)
def user_adv(batch, cfg, *, critic_values=None, oracle=None, group_stats=None):
    """GRPO's centred return, broken below on purpose."""
    r, g = per_trajectory(batch.traj_return, batch), per_trajectory(batch.group_id, batch)
    mean = segment_sum(r, g, batch.num_groups) / cfg.group_size
    good = broadcast_to_tokens((r - mean[g])[batch.traj_id], batch)
{body}


@register_policy_loss("user_loss", surrogate=False)
def user_loss(logp_new, batch, adv, cfg):
    """REINFORCE, broken below on purpose."""
{loss}


register_preset(preset("rloo", name="user_algo", advantage="user_adv", update="user_loss"))
'''
GOOD_ADV, GOOD_LOSS = "    return good", "    return logp_new * adv, None"
# the broken plugins of issue 23's table: (estimator body, loss body) -> the one line (after "error: ")
BROKEN_CASES = {
    "nan": ("    return broadcast_to_tokens(((r - r.mean()) / (r - r))[batch.traj_id], batch)", GOOD_LOSS,
            "advantage estimator 'user_adv' ({file}:8) returned non-finite advantages at "),
    "n_traj": ("    return r - mean[g]", GOOD_LOSS,
               "advantage estimator 'user_adv' ({file}:8): expected advantages of shape [n, L] = [32, 2], got shape [16]"),
    "list": ("    return good.tolist()", GOOD_LOSS,
             "advantage estimator 'user_adv' ({file}:8): expected advantages as a torch.Tensor [n, L] = [32, 2], got a list of 32"),
    "none": ("    return None", GOOD_LOSS,
             "advantage estimator 'user_adv' ({file}:8): expected advantages as a torch.Tensor [n, L] = [32, 2], got None"),
    "int": ("    return good.round().long()", GOOD_LOSS,
            "advantage estimator 'user_adv' ({file}:8): expected advantages of a floating dtype, got dtype torch.int64"),
    "mutate": ("    batch.traj_return.mul_(2.0)\n    return good", GOOD_LOSS,
               "advantage estimator 'user_adv' ({file}:8): expected its inputs left unchanged, got changed in place: "
               "batch.traj_return"),
    "raise": ("    return {{}}['missing']", GOOD_LOSS,
              "advantage estimator 'user_adv' ({file}:8) raised KeyError: 'missing' (at {file}:14 in user_adv)"),
    "no_grad": (GOOD_ADV, "    return (logp_new * adv).detach(), None",
                "policy loss 'user_loss' ({file}:17): expected an objective that requires grad (logp_new does; the "
                "update differentiates it), got an objective without grad"),
}


def _broken_plugin(tmp_path, case: str):
    body, loss, _ = BROKEN_CASES[case]
    plugin = tmp_path / f"broken_{case}.py"
    plugin.write_text(BROKEN.format(body=body.replace("{{}}", "{}"), loss=loss))
    return plugin


@pytest.mark.parametrize("case", sorted(BROKEN_CASES))
def test_a_broken_plugin_is_one_line_in_check_with_no_folder_left(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the line names the plugin relative to the working directory
    plugin = _broken_plugin(tmp_path, case)
    out = tmp_path / "check"
    assert main(["check", "user_algo", "--quick", "--no-bridge", "--no-progress", "--plugin", plugin.name,
                 "--out", str(out)]) == 2
    err = _one_line_error(capsys)
    assert err.startswith("seeupo check: error: " + BROKEN_CASES[case][2].format(file=plugin.name)), err
    assert not out.exists()


@pytest.mark.parametrize("case", ["n_traj", "no_grad"])
def test_a_broken_plugin_is_one_line_from_verify_worker_processes(case, tmp_path):
    # a real process: the estimator is named by the contract check before any worker starts; the loss is
    # called in the spawned workers' cells, and its line must reach the parent, with no traceback anywhere
    plugin = _broken_plugin(tmp_path, case)
    out = tmp_path / "verify"
    proc = subprocess.run([sys.executable, "-m", "seeupo", "verify", "--algorithms", "user_algo", "--plugin", plugin.name,
                           "--quick", "--instances", "2", "--iterations", "2", "--workers", "2", "--no-progress",
                           "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("seeupo verify: error: " + BROKEN_CASES[case][2].format(file=plugin.name)), lines[0]
    assert not out.exists()


# A_i = R_i - R_first (the group's first trajectory): depends on the rows' order in the group
FIRST_MATE = BROKEN.format(body="    first = torch.full((batch.num_groups,), r.numel()).scatter_reduce(0, g, "
                                "torch.arange(r.numel()), 'amin')\n"
                                "    return broadcast_to_tokens((r - r[first][g])[batch.traj_id], batch)", loss=GOOD_LOSS)


@pytest.mark.slow
def test_a_position_dependent_estimator_is_refused_for_exact_mode_and_runs_sampled(tmp_path, capsys):
    import json

    plugin = tmp_path / "first.py"
    plugin.write_text(FIRST_MATE)
    out = tmp_path / "check"
    assert main(["check", "user_algo", "--quick", "--no-bridge", "--no-progress", "--plugin", str(plugin),
                 "--out", str(out)]) == 0
    report = json.loads((out / "check.json").read_text())
    assert report["exact_refused"] == "not symmetric in its group"
    assert report["monotonicity"]["evidence"] == ["exact: refused (not symmetric in its group)"]
    assert report["verify"]["exact_refused"] == {"user_algo": "not symmetric in its group"}
    assert report["verify"]["table1"][0]["MT"]["measured"] == "exact: refused (not symmetric in its group)"
    assert {c["mode"] for c in report["verify"]["cells"]} == {"sampled"}  # the sampled cells still ran
    assert "exact: refused (not symmetric in its group)" in (out / "check.md").read_text()
    capsys.readouterr()
    # the searches run exact mode only: refused in one line
    assert main(["search", "--algorithm", "user_algo", "--out", str(tmp_path / "search")]) == 2
    assert "argument --algorithm: user_algo: exact: refused (not symmetric in its group)" in _one_line_error(capsys)


def test_register_preset_with_a_builtin_name_and_other_settings_is_one_line(tmp_path, capsys):
    plugin = tmp_path / "clash_preset.py"
    plugin.write_text("from seeupo.core.config import preset, register_preset\n"
                      "register_preset(preset('grpo', name='grpo', grae_scale='none'))\n")
    out = tmp_path / "verify"
    assert main(["verify", "--algorithms", "grpo", "--plugin", str(plugin), "--quick", "--out", str(out)]) == 2
    err = _one_line_error(capsys)
    assert "argument --plugin" in err and "name 'grpo' is the name of a preset whose grae_scale differ" in err
    assert not out.exists()


DYING = ANTI.replace('''    """The group mean minus the return: GRPO's advantage with the sign flipped."""''', '''    """The group mean minus the return, except in a worker process, which it kills (a crash, not an error)."""
    import multiprocessing
    import os

    if multiprocessing.parent_process() is not None:
        os._exit(3)''')


def test_a_worker_process_that_dies_stops_verify_instead_of_hanging(tmp_path):
    # a worker killed mid-cell (here by os._exit; in life by the out-of-memory killer) used to leave
    # verify's pool waiting for its cell forever
    plugin = tmp_path / "dying.py"
    plugin.write_text(DYING)
    proc = subprocess.run([sys.executable, "-m", "seeupo", "verify", "--algorithms", "anti_pg", "--plugin", plugin.name,
                           "--quick", "--instances", "2", "--iterations", "2", "--workers", "2", "--no-progress",
                           "--modes", "sampled", "--out", str(tmp_path / "verify")],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode != 0 and "BrokenProcessPool" in proc.stderr, proc.stderr[-2000:]


def test_a_plugin_that_fails_to_import_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plugin = tmp_path / "typo.py"
    plugin.write_text("from seeupo.core.config import preset, register_preset\n\n"
                      "register_preset(preset('grpo', name='typo_grpo', clip_eps=0.3))\n")
    assert main(["check", "typo_grpo", "--quick", "--no-bridge", "--no-progress", "--plugin", "typo.py",
                 "--out", str(tmp_path / "check")]) == 2
    err = _one_line_error(capsys)
    assert "plugin typo.py failed to import: TypeError:" in err and "clip_eps" in err and err.endswith("(at typo.py:3 in <module>)"), err
    assert "typo_grpo" not in plugins.loaded_plugins() and not (tmp_path / "check").exists()


@pytest.mark.parametrize("case", ["n_traj", "nan", "mutate", "raise", "no_grad"])
def test_a_broken_plugin_is_one_line_in_train_before_the_run_folder_exists(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plugin = _broken_plugin(tmp_path, case)
    assert main(_train(tmp_path, "--plugin", plugin.name, "--set", "algorithm.preset=user_algo")) == 2
    err = _one_line_error(capsys)
    name = "policy loss 'user_loss' ({file}:17)" if case == "no_grad" else "advantage estimator 'user_adv' ({file}:8)"
    assert err.startswith("seeupo train: error: " + name.format(file=plugin.name)), err
    assert not (tmp_path / "run").exists()  # the dry run named it before the folder was created


def test_a_plugin_that_breaks_during_the_run_marks_the_run_folder_failed(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plugin = tmp_path / "late.py"  # sound on the dry run's call, broken on every later one (the run's)
    plugin.write_text(BROKEN.format(body="    CALLS.append(1)\n    return good if len(CALLS) == 1 else good.sum(1)",
                                    loss=GOOD_LOSS).replace("import torch\n", "import torch\nCALLS = []\n", 1))
    assert main(_train(tmp_path, "--plugin", plugin.name, "--set", "algorithm.preset=user_algo")) == 2
    err = _one_line_error(capsys)
    assert err.startswith("seeupo train: error: advantage estimator 'user_adv' (late.py:9): expected advantages"), err
    run = tmp_path / "run"
    assert (run / "config.yaml").exists()
    assert (run / "failed.txt").read_text() == "failed at step 1: " + err.removeprefix("seeupo train: error: ") + "\n"


def test_verify_quick_of_a_refused_estimator_says_that_none_of_its_cells_ran(tmp_path, capsys):
    # --quick runs exact cells only: the refused algorithm ran nothing, and the report must not say "sampled cells ran"
    plugin = tmp_path / "first.py"
    plugin.write_text(FIRST_MATE)
    out = tmp_path / "verify"
    assert main(["verify", "--algorithms", "user_algo", "--plugin", str(plugin), "--quick", "--instances", "2",
                 "--iterations", "2", "--workers", "1", "--no-progress", "--out", str(out)]) == 0
    text = (out / "verify.md").read_text()
    assert "exact: refused (not symmetric in its group)**; none of its cells ran (no sampled mode was requested)." in text
    assert "sampled cells ran" not in text


def test_train_names_a_broken_turn_order_and_m_factor_before_the_run_folder_exists(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plugin = tmp_path / "pieces.py"
    plugin.write_text("from seeupo.core.config import preset, register_preset\n"
                      "from seeupo.core.registry import register_m_factor, register_turn_order\n"
                      "@register_turn_order('stuck')\n"
                      "def stuck(num_turns, cfg, generator):\n    return [0] * num_turns\n"
                      "@register_m_factor('shrinking')\n"
                      "def shrinking(factor, ratio, cfg):\n    return factor[:-1]\n"
                      "register_preset(preset('seeupo', name='stuck_seeupo', order='stuck'))\n"
                      "register_preset(preset('seeupo', name='shrinking_seeupo', m_factor='shrinking'))\n")
    for algorithm, line in (("stuck_seeupo", "turn order 'stuck' (pieces.py:3): expected a permutation"),
                            ("shrinking_seeupo", "M factor 'shrinking' (pieces.py:6): expected factor of shape")):
        assert main(_train(tmp_path, "--plugin", plugin.name, "--set", f"algorithm.preset={algorithm}")) == 2
        err = _one_line_error(capsys)
        assert err.startswith("seeupo train: error: " + line), err
        assert not (tmp_path / "run").exists()


def test_check_stopped_by_a_plugin_error_leaves_the_signal_handlers_as_they_were(tmp_path, capsys):
    # the loss breaks inside the cells, after check installed its SIGTERM handler: a check that left SIGTERM and SIGINT
    # ignored made every later process of this one ignore them too (a verify pool's terminate() then hung)
    import signal

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    plugin = _broken_plugin(tmp_path, "no_grad")
    assert main(["check", "user_algo", "--quick", "--no-bridge", "--no-progress", "--plugin", str(plugin),
                 "--out", str(tmp_path / "check")]) == 2
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
