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
    assert "optimal_actions" not in result and out.stdout.count("\n") == 1  # compact: one line, summary only
    tables = json.loads(seeupo("exact", str(inst), "--tables").stdout)
    assert tables["optimal_actions"][0] == [1] and tables["J"] == result["J"]
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
        ("[1, 2", None),
    ],
)
def test_exact_malformed_file_one_line_exit_2(tmp_path, seeupo, content, field):
    inst = tmp_path / "inst.json"
    inst.write_text(content)
    out = seeupo("exact", str(inst))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith(f"seeupo exact: error: {inst}: ")  # names the file
    assert f"field '{field}'" in out.stderr if field else "not valid JSON" in out.stderr


def test_generate_then_exact(tmp_path, seeupo):
    for args in (["--turns", "3", "--actions", "2"], ["--kind", "tree_mdp", "--gamma", "0.9"], ["--length", "2", "--vocab-size", "2"]):
        path = tmp_path / "g.json"
        generated = seeupo("generate", *args, "--seed", "4", "--out", str(path))
        assert generated.returncode == 0 and generated.stdout == f"Wrote {path}.\n"
        result = json.loads(seeupo("exact", str(path)).stdout)
        assert result["J_star"] >= result["J"] - 1e-12


@pytest.mark.parametrize(
    "args, flag",
    [
        (["verify", "--modes", "exact,magic"], "--modes"),
        (["verify", "--modes", ""], "--modes"),
        (["verify", "--params", "independent,tied"], "--params"),
        (["verify", "--instances", "0"], "--instances"),
        (["verify", "--group-size", "1"], "--group-size"),
        (["verify", "--turns", "40"], "--turns"),
        (["verify", "--group-size", "1024", "--reward-levels", "1000"], "--group-size"),
        (["verify", "--workers", "100000"], "--workers"),
        (["verify", "--seed", "-1"], "--seed"),
        (["verify", "--families", "stop,chess"], "--families"),
        (["verify", "--families", "none,stop"], "--families"),
        (["search", "--max-examples", "0"], "--max-examples"),
        (["search", "--max-examples", "-5"], "--max-examples"),
        (["search", "no_such_search"], "names"),
        (["claims", "NO-SUCH-CLAIM"], "ids"),
        (["generate", "--gamma", "5"], "--gamma"),
        (["generate", "--gamma", "nan"], "--gamma"),
        (["generate", "--terminate-prob", "2"], "--terminate-prob"),
        (["generate", "--length", "0"], "--length"),
        (["generate", "--vocab-size", "0"], "--vocab-size"),
        (["generate", "--observations", "0"], "--observations"),
        (["generate", "--turns", "1e3"], "--turns"),
        (["generate", "--length", "1000000000000", "--vocab-size", "2"], "--length"),
        (["generate", "--turns", "12", "--actions", "10"], "--max-cells"),
        (["generate", "--turns", "8", "--actions", "8"], "--max-cells"),
        (["replay", "x.json", "--atol", "-1"], "--atol"),
        (["replay", "x.json", "--atol", "nan"], "--atol"),
        (["exact", "x.json", "--max-cells", "0"], "--max-cells"),
        (["presets", "nope"], "name"),
    ],
)
def test_bad_flags_one_line_naming_the_flag_before_any_work(args, flag, seeupo, tmp_path):
    if args[0] in ("verify", "claims", "search"):
        args = [*args, "--out", str(tmp_path / "out")]
    out = seeupo(*args)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(f"seeupo {args[0]}: error: ")
    assert flag in out.stderr
    assert not (tmp_path / "out").exists()  # refused before any work (the output folder is made first)


@pytest.mark.parametrize("command", ["verify", "claims", "search", "check", "train", "eval", "figures", "generate"])
def test_an_empty_out_is_refused_not_read_as_the_current_folder(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [command, *(["grpo"] if command == "check" else []), "--out", ""]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().endswith("argument --out: expected a path, got ''")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["verify", "claims", "search", "generate"])
def test_unusable_out_fails_first(command, seeupo, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    bad = {"verify": a_file, "claims": a_file, "search": a_file, "generate": tmp_path / "missing" / "g.json"}[command]
    extra = ["--quick"] if command in ("verify", "claims") else []
    out = seeupo(command, *extra, "--out", str(bad))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--out" in out.stderr
    assert out.stdout == ""  # nothing ran
    out = seeupo("generate", "--out", str(tmp_path))  # a folder where a file goes
    assert out.returncode == 2 and "--out" in out.stderr


def test_search_help_lists_every_registered_search(seeupo):
    # the help lists the torch-free catalog; the registry must be built from all of it, in its order
    from seeupo.experiments.search_catalog import PAPER_SEARCHES
    from seeupo.experiments.searches import SEARCHES

    assert [(e.name, e.claim, e.description, e.max_examples) for e in PAPER_SEARCHES] == [
        (s.name, s.claim, s.description, s.max_examples) for s in SEARCHES]
    out = seeupo("search", "--help")
    assert all(f"  {s.name}\n      {s.description}\n" in out.stdout for s in SEARCHES)


def test_presets_table_shows_only_differing_fields(seeupo):
    out = seeupo("presets")
    assert out.returncode == 0
    header = out.stdout.splitlines()[0].split()
    assert header[0] == "preset" and "advantage" in header and "schedule" in header
    assert "kl_coef" not in header  # the same in every preset
    one = seeupo("presets", "seeupo").stdout
    assert one.startswith("seeupo\n") and "kl_coef = 0.0" in one and "grpo" not in one
    from seeupo.core.config import PRESETS

    assert seeupo("presets", "--all").stdout.count("kl_coef = ") == len(PRESETS)
    # the `preset` a configuration started from is bookkeeping, not a setting: one column "preset", the names
    assert header.count("preset") == 1 and "preset = " not in one
    assert [line.split()[0] for line in out.stdout.splitlines()[1:len(PRESETS) + 1]] == list(PRESETS)


def test_train_help_documents_both_resume_flags(seeupo):
    out = seeupo("train", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "--resume " in text and "an error when there is none" in text
    assert "--resume-if-possible" in text and "else start the run fresh there" in text


def test_help_does_not_import_torch():
    code = ("import sys; from seeupo.cli import main\n"
            "for argv in (['--help'], ['search', '--help'], ['exact', '--help']):\n"
            "    try: main(argv)\n"
            "    except SystemExit: pass\n"
            "assert 'torch' not in sys.modules and 'hypothesis' not in sys.modules, sorted(sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


def test_verify_tiny_run_writes_report(tmp_path, seeupo):
    out = seeupo("verify", "--quick", "--instances", "2", "--iterations", "2", "--workers", "1", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "verify.json").read_text())
    assert {e["row"] for e in report["table1"]} >= {"ppo", "grpo", "gspo", "rloo", "seeupo"}
    assert "Table 1" in (tmp_path / "verify.md").read_text()
    assert "[1/" in out.stderr  # progress
    families = {c["setting"] for c in report["cells"]} - {"ST", "MT"}
    assert families == {"stop", "intermediate", "tool", "tokens"}  # the agentic families, by default
    first = (tmp_path / "verify.json").read_text()
    again = seeupo("verify", "--quick", "--instances", "1", "--iterations", "1", "--workers", "1", "--out", str(tmp_path))
    assert again.returncode == 2 and again.stderr.strip().count("\n") == 0 and "--overwrite" in again.stderr
    assert (tmp_path / "verify.json").read_text() == first  # refused before any work: the earlier report stands
    again = seeupo("verify", "--quick", "--instances", "1", "--iterations", "1", "--workers", "1", "--out", str(tmp_path),
                   "--overwrite", "--families", "none")
    assert again.returncode == 0, again.stderr
    (previous,) = tmp_path.glob("previous-*")
    assert (previous / "verify.json").read_text() == first and "nothing deleted" in again.stderr
    assert len(json.loads((tmp_path / "verify.json").read_text())["cells"]) < len(report["cells"])


def test_claims_keep_an_earlier_report(tmp_path, seeupo):
    (tmp_path / "claims.md").write_text("an earlier run\n")
    out = seeupo("claims", "--out", str(tmp_path), "--no-progress")
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0
    assert "holds an earlier claims run's claims.md" in out.stderr and "--overwrite" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["claims.md"]


def test_verify_families_option(tmp_path, seeupo):
    out = seeupo("verify", "--algorithms", "rloo", "--quick", "--instances", "1", "--iterations", "1", "--workers", "1",
                 "--families", "stop,tokens", "--out", str(tmp_path / "two"))
    assert out.returncode == 0, out.stderr
    assert [c["setting"] for c in json.loads((tmp_path / "two" / "verify.json").read_text())["cells"]] == ["ST", "MT", "stop", "tokens"]
    out = seeupo("verify", "--algorithms", "rloo", "--quick", "--instances", "1", "--iterations", "1", "--workers", "1",
                 "--families", "none", "--out", str(tmp_path / "none"))
    assert out.returncode == 0, out.stderr
    assert [c["setting"] for c in json.loads((tmp_path / "none" / "verify.json").read_text())["cells"]] == ["ST", "MT"]


def test_presets_choices_lists_every_registered_entry(seeupo):
    from seeupo.core.config import REGISTRIES, choices

    out = seeupo("presets", "--choices")
    assert out.returncode == 0, out.stderr
    listed = {line.split()[0] for line in out.stdout.splitlines() if line.startswith("  ")}
    for registry in REGISTRIES:
        assert f"{registry.field} (registry: {registry.kind})" in out.stdout
        assert set(registry.names()) <= listed
    assert "schedule: simultaneous, sequential" in out.stdout  # a fixed choice: its Literal
    assert len([line for line in out.stdout.splitlines() if not line.startswith("  ")]) == len(choices())


def test_a_refused_command_leaves_no_empty_output_folder(tmp_path, capsys):
    """`eval` creates --out before it reads --checkpoint; refused, it removes the folders it made
    (and only those: a folder that was there stays, and so does one with a file in it)."""
    existing = tmp_path / "existing"
    existing.mkdir()
    argv = ["eval", "configs/bridge_tiny_seeupo.yaml", "--checkpoint", str(tmp_path / "no_run")]
    assert main([*argv, "--out", str(existing / "a" / "b")]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    assert existing.is_dir() and list(existing.iterdir()) == []
    assert main([*argv, "--out", str(existing)]) == 2
    assert existing.is_dir()
