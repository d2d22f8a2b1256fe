"""The command line: in-process calls of ``main`` (fast), and one real subprocess for exit codes."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from seeupo.cli import build_parser, main


@pytest.fixture
def seeupo(capsys):
    def call(*args):
        try:
            rc = main(list(args))
        except SystemExit as exit_:  # argparse: --help and usage errors
            rc = exit_.code
        out = capsys.readouterr()
        return SimpleNamespace(returncode=rc, stdout=out.out, stderr=out.err)

    return call


def test_every_subcommand_has_help(seeupo):
    commands = build_parser()._subparsers._group_actions[0].choices
    assert set(commands) >= {"verify", "exact", "generate", "presets"}
    for name in commands:
        out = seeupo(name, "--help")
        assert out.returncode == 0 and "usage: seeupo " + name in out.stdout


def test_subprocess_malformed_file_exit_code_and_no_traceback(tmp_path):
    inst = tmp_path / "inst.json"
    inst.write_text('{"kind": "sequential_bandit", "initial_state_probs": [0.3], "actions_per_turn": [2], "rewards": [[1, 0]]}')
    out = subprocess.run([sys.executable, "-m", "seeupo.cli", "exact", str(inst)], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "Traceback" not in out.stderr
    assert "field 'initial_state_probs'" in out.stderr


def test_exact_uniform_and_policy(tmp_path, seeupo):
    inst = tmp_path / "inst.json"
    inst.write_text(json.dumps({
        "kind": "sequential_bandit", "initial_state_probs": [1.0], "actions_per_turn": [2, 2],
        "rewards": [[[0.6, 0.6], [1.0, 0.0]]],
    }))
    out = seeupo("exact", str(inst))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["J_star"] == pytest.approx(1.0)
    assert result["J"] == pytest.approx((0.6 + 0.6 + 1.0 + 0.0) / 4)
    assert result["optimal_actions"][0] == [1]
    pol = tmp_path / "pol.json"
    pol.write_text(json.dumps({"action_probs": [[[1.0, 0.0]], [[0.5, 0.5], [1.0, 0.0]]]}))
    result = json.loads(seeupo("exact", str(inst), "--policy", str(pol)).stdout)
    assert result["J"] == pytest.approx(0.6)


@pytest.mark.parametrize(
    "content, field",
    [
        ('{"kind": "sequential_bandit", "initial_state_probs": [0.3], "actions_per_turn": [2], "rewards": [[1, 0]]}', "initial_state_probs"),
        ('{"kind": "sequential_bandit", "initial_state_probs": [1], "actions_per_turn": [2], "rewards": [[1, 0, 3]]}', "rewards"),
        ('{"kind": "sequential_bandit", "initial_state_probs": [1], "actions_per_turn": [2], "rewards": [[NaN, 0]]}', "rewards"),
        ('{"kind": "mdp"}', "kind"),
        ("[1, 2", "file"),
    ],
)
def test_exact_malformed_file_one_line_exit_2(tmp_path, seeupo, content, field):
    inst = tmp_path / "inst.json"
    inst.write_text(content)
    out = seeupo("exact", str(inst))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert f"field '{field}'" in out.stderr


def test_generate_then_exact(tmp_path, seeupo):
    for args in (["--turns", "3", "--actions", "2"], ["--kind", "tree_mdp", "--gamma", "0.9"], ["--length", "2", "--vocab-size", "2"]):
        path = tmp_path / "g.json"
        assert seeupo("generate", *args, "--seed", "4", "--out", str(path)).returncode == 0
        result = json.loads(seeupo("exact", str(path)).stdout)
        assert result["J_star"] >= result["J"] - 1e-12


def test_verify_bad_options_exit_2(tmp_path, seeupo):
    out = seeupo("verify", "--quick", "--modes", "exact,magic", "--out", str(tmp_path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    out = seeupo("verify", "--quick", "--params", "independent,tied", "--out", str(tmp_path))
    assert out.returncode == 2 and "--params accepts" in out.stderr
    out = seeupo("verify", "--quick", "--instances", "0", "--out", str(tmp_path))
    assert out.returncode == 2 and "Traceback" not in out.stderr


def test_verify_tiny_run_writes_report(tmp_path, seeupo):
    out = seeupo("verify", "--quick", "--instances", "2", "--iterations", "2", "--workers", "1", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "verify.json").read_text())
    assert {e["row"] for e in report["table1"]} >= {"ppo", "grpo", "gspo", "rloo", "seeupo"}
    assert "Table 1" in (tmp_path / "verify.md").read_text()
    assert "[1/" in out.stderr  # progress
