"""Hostile input to ``seeupo train`` and ``seeupo eval`` (issue 16).

``seeupo train``: a mutated valid config, a bad ``--set``, a wrong run
folder or a resume with a changed config must give exit code 2 and exactly one stderr line
naming the key (or the flag), never a traceback, a hang or a silent acceptance, and must leave
every file of an earlier run folder as it was.

The valid configs are the shipped tiny-bridge demo and the short BFCL run (``configs/``); each
example applies one mutation that always makes them invalid: a value of a wrong type, a number
out of range or not finite, ``null`` for a field that takes none, an unknown key, a cross-field
conflict (``rollout.max_turns`` below the bridge's turns, ``optim.micro_batch_tokens`` below a
row, ``rollout.top_p < 1``, a size over the limits, an unknown BFCL category or split), an
existing run folder without ``--resume``, ``--resume`` where there is no checkpoint, or
``--resume`` of an earlier run with a field changed that may not change. Each runs
``seeupo.cli.main`` in-process (time bounded per example, memory by the process's peak); a few
cases also run as real subprocesses under an address-space limit, so a regression that
allocates what it should refuse fails instead of swapping.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")

from seeupo.cli import main  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BASES = {
    "bridge": yaml.safe_load((REPO / "configs" / "bridge_tiny_seeupo.yaml").read_text()),
    "bfcl": yaml.safe_load((REPO / "configs" / "bfcl_smollm2_seeupo_short.yaml").read_text()),
}
# leaves of the shipped configs whose field takes null (a null there is valid, not a mutation)
NULLABLE = {"keep", "max_grad_norm", "micro_batch_rows", "micro_batch_tokens", "wandb_project", "max_tasks", "instance",
            "max_observation_chars", "grae_clamp", "dual_clip", "custom_order"}
# the earlier run every example must leave untouched, made once per session (tiny, a few seconds)
SMALL = ["rollout.tasks_per_step=2", "algorithm.group_size=2", "env.options.warmup_steps=2", "env.options.num_tasks=2",
         "steps=1", "checkpoint.every=1", "logging.progress=false"]
SECONDS_PER_CALL = 20
PEAK_RSS_BYTES = 3 * 2**30


def _leaves(node, prefix=()):
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaves(value, (*prefix, key))
    else:
        yield prefix, node


def _set(doc, path, value):
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


def _key(path) -> str:
    return "config." + ".".join(path)


# (mutation as --set overrides, key the message must name); each is invalid for every base it is drawn for
CROSS = {
    "bridge": [
        (["rollout.max_turns=1"], "config.rollout.max_turns"),
        (["env.options.turns=5", "rollout.max_turns=4"], "config.rollout.max_turns"),
        (["optim.micro_batch_tokens=1"], "config.optim.micro_batch_tokens"),
        (["rollout.max_context=4096", "optim.micro_batch_tokens=4095"], "config.optim.micro_batch_tokens"),
        (["rollout.top_p=0.7"], "config.rollout.top_p"),
        (["algorithm.group_size=1000000"], "config.algorithm.group_size"),
        (["rollout.tasks_per_step=100000"], "config.rollout.tasks_per_step"),
        (["rollout.max_context=10000000"], "config.rollout.max_context"),
        (["env.options={kind: tree_mdp, turns: 6, actions: 16, observations: 4}", "rollout.max_turns=6"], "config.env.options"),
        (["rollout.max_context=12"], "config.rollout.max_context"),  # no prompt fits: found after the tiny model loads
        (["env.name=atari"], "config.env.name"),
        (["algorithm.preset=drgrpo"], "config.algorithm.preset"),
        (["algorithm.name=grpo"], "config.algorithm.name"),  # a preset's name on SeeUPO
    ],
    "bfcl": [
        (["env.options.categories=[multi_turn_nope]"], "config.env.options"),
        (["env.options.split=random"], "config.env.options.split"),
        (["env.options.subset=validation"], "config.env.options.subset"),
        (["rollout.top_p=0.5"], "config.rollout.top_p"),
        (["optim.micro_batch_tokens=4096"], "config.optim.micro_batch_tokens"),
        (["algorithm.group_size=1000000"], "config.algorithm.group_size"),
    ],
}
# fields that may not change on resume, and a new value for each (valid on its own)
NOT_RESUMABLE = [("algorithm.preset", "grpo"), ("model.dtype", "float64"), ("env.options.problem_seed", "5"),
                 ("optim.lr", "0.1"), ("seed", "7"), ("rollout.temperature", "0.5"), ("algorithm.epochs", "1")]


@st.composite
def hostile_train_calls(draw):
    """``(base, config dict or None, extra argv, key the line must name, folder case)``."""
    base = draw(st.sampled_from(sorted(BASES)))
    doc = copy.deepcopy(BASES[base])
    leaves = [(p, v) for p, v in _leaves(doc) if p != ("out_dir",)]
    mutation = draw(st.sampled_from(["type", "number", "null", "extra", "cross", "cross", "folder", "folder"]))
    extra, folder = [], None
    if mutation == "type":
        path, value = draw(st.sampled_from(leaves))
        _set(doc, path, [1, 2] if isinstance(value, dict) else {"zz": 1})
        key = _key(path)
    elif mutation == "number":
        path, _ = draw(st.sampled_from([(p, v) for p, v in leaves if type(v) in (int, float)]))
        _set(doc, path, draw(st.sampled_from([-1, 10**30, float("nan"), float("inf"), -float("inf")])))
        key = _key(path)
    elif mutation == "null":
        path, _ = draw(st.sampled_from([(p, v) for p, v in leaves if p[-1] not in NULLABLE]))
        _set(doc, path, None)
        key = _key(path)
    elif mutation == "extra":
        sections = [()] + [p for p in {q[:i] for q, _ in _leaves(doc) for i in range(1, len(q))}]
        where = draw(st.sampled_from(sorted(sections)))
        node = doc
        for k in where:
            node = node[k]
        node["zz_unknown"] = draw(st.sampled_from([0, "x", None, [1]]))
        key = "zz_unknown"
    elif mutation == "cross":
        sets, key = draw(st.sampled_from(CROSS[base]))
        extra = [a for s in sets for a in ("--set", s)]
    else:
        folder = draw(st.sampled_from(["exists", "resume_missing", "resume_empty", "resume_changed"]))
        if folder == "resume_changed":
            field, value = draw(st.sampled_from(NOT_RESUMABLE))
            extra, key = ["--set", f"{field}={value}"], field
        else:
            key = "--out" if folder == "exists" else "--resume"
        return "bridge", None, extra, key, folder
    return base, doc, extra, key, folder


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory):
    """A finished one-step run of the tiny bridge (config, metrics, a checkpoint)."""
    run = tmp_path_factory.mktemp("earlier") / "run"
    sets = [a for s in SMALL for a in ("--set", s)]
    assert main(["train", str(REPO / "configs" / "bridge_tiny_seeupo.yaml"), *sets, "--out", str(run), "--no-progress"]) == 0
    assert (run / "checkpoints").is_dir() and (run / "config.yaml").is_file()
    return run, sets


def _call(argv, capsys):
    start = time.perf_counter()
    try:
        rc = main(argv)
    except SystemExit as exit_:
        rc = exit_.code
    elapsed = time.perf_counter() - start
    out = capsys.readouterr()
    return rc, out.out, out.err, elapsed


HOSTILE = dict(suppress_health_check=[*settings.default.suppress_health_check, HealthCheck.function_scoped_fixture])


@settings(**HOSTILE, max_examples=max(12, settings.default.max_examples))
@given(case=hostile_train_calls())
def test_hostile_train_calls_exit_2_with_one_line_naming_the_key(case, earlier_run, tmp_path_factory, capsys):
    _check_refused(case, earlier_run, tmp_path_factory, capsys)


@pytest.mark.slow
@settings(**HOSTILE, max_examples=300)
@given(case=hostile_train_calls())
def test_many_hostile_train_calls(case, earlier_run, tmp_path_factory, capsys):
    _check_refused(case, earlier_run, tmp_path_factory, capsys)


def _check_refused(case, earlier_run, tmp_path_factory, capsys) -> None:
    base, doc, extra, key, folder = case
    event(f"{base}: {folder or ('cross' if extra else 'file')}")
    run, small = earlier_run
    before = _hashes(run)
    work = tmp_path_factory.mktemp("hostile_train")
    config = REPO / "configs" / ("bridge_tiny_seeupo.yaml" if base == "bridge" else "bfcl_smollm2_seeupo_short.yaml")
    if doc is not None:
        config = work / "run.yaml"
        config.write_text(yaml.safe_dump(doc))
    out = work / "out"
    if folder in ("exists", "resume_changed"):
        argv = ["train", str(config), *small, *extra, "--out", str(run)] + (["--resume"] if folder == "resume_changed" else [])
    elif folder == "resume_empty":
        out.mkdir()
        argv = ["train", str(config), *extra, "--out", str(out), "--resume"]
    else:
        argv = ["train", str(config), *extra, "--out", str(out)] + (["--resume"] if folder == "resume_missing" else [])
    rc, stdout, err, elapsed = _call(argv + ["--no-progress"], capsys)
    assert rc == 2, (argv, rc, stdout, err)
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("seeupo train: error: "), err
    assert key in err, (key, err)
    assert elapsed < SECONDS_PER_CALL, (argv, elapsed)
    assert _hashes(run) == before  # the earlier run is exactly as it was
    assert not out.exists() or not any(out.iterdir())  # nothing written for the refused run
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 < PEAK_RSS_BYTES


def _limited(argv: list[str], cwd: Path) -> tuple[int, str, float]:
    """``seeupo ARGV`` in a subprocess limited to 4 GiB of address space: (exit code, stderr, seconds)."""
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))\n"
        "from seeupo.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)})
    return proc.returncode, proc.stderr, time.perf_counter() - start


@pytest.mark.parametrize("sets,key", [
    (["algorithm.group_size=1000000"], "config.algorithm.group_size"),  # hung for minutes before issue 16
    (["rollout.max_context=10000000", "rollout.max_turns=1000"], "config.rollout.max"),
    (["rollout.max_context=12"], "config.rollout.max_context"),  # a NoPromptFits traceback after 27 s before
    (["env.options={turns: 6, actions: 16}", "rollout.max_turns=6"], "config.env.options"),
])
def test_size_errors_in_a_memory_limited_process(sets, key, tmp_path):
    argv = ["train", str(REPO / "configs" / "bridge_tiny_seeupo.yaml"), *[a for s in sets for a in ("--set", s)],
            "--out", str(tmp_path / "out"), "--no-progress"]
    rc, err, seconds = _limited(argv, tmp_path)
    assert rc == 2, err[-3000:]
    assert "Traceback" not in err and err.count("\n") == 1 and key in err, err
    assert seconds < 60


def test_resume_of_a_changed_run_in_a_subprocess_lists_every_change(earlier_run, tmp_path):
    run, small = earlier_run
    before = _hashes(run)
    argv = ["train", str(REPO / "configs" / "bridge_tiny_seeupo.yaml"), *small, "--set", "algorithm.preset=grpo",
            "--set", "model.dtype=float64", "--set", "steps=3", "--out", str(run), "--resume"]
    rc, err, _ = _limited(argv, tmp_path)
    assert rc == 2 and err.count("\n") == 1, err
    listed = re.findall(r"(\S+): \S+ -> \S+", err.split(" (only")[0])
    assert {"algorithm.preset", "algorithm.grae_scale", "model.dtype"} <= set(listed), err
    assert "steps" not in listed and "algorithm.name" not in listed, err
    assert _hashes(run) == before


# ---- seeupo eval ------------------------------------------------------------
# Hostile input to ``seeupo eval`` (issue 16): a mutated valid config, a bad flag or a wrong output,
# resume or checkpoint folder must give exit code 2 and exactly one stderr line naming the key (or
# the flag) — before any model loads, so within seconds — and must leave every file of an earlier
# evaluation as it was.
#
# The valid configs are the tiny-bridge demo and the shipped BFCL evaluation config; each example
# applies one mutation that always makes them invalid (the config mutations of
# the train section above, minus the training-only checks such as ``top_p < 1``), or one of the
# folder cases: ``--out`` an earlier evaluation's folder without ``--resume``/``--overwrite``,
# ``--resume`` where there is nothing to resume, ``--resume`` with ``--overwrite``, ``--resume`` of
# the earlier evaluation with another ``--k``/``--max-tasks``/``--batch``/sampling setting, and
# ``--checkpoint`` a folder without a checkpoint.

CONFIGS = {"bridge": REPO / "configs" / "bridge_tiny_seeupo.yaml", "bfcl": REPO / "configs" / "bfcl_smollm2_eval.yaml"}
EVAL_BASES = {name: yaml.safe_load(path.read_text()) for name, path in CONFIGS.items()}
# the earlier evaluation every example must leave untouched (tiny bridge, one task, k = 1)
EVAL_SMALL = ["env.options.warmup_steps=2", "env.options.num_tasks=2"]
EVAL_EARLIER_FLAGS = ["--k", "1", "--max-tasks", "1"]
EVAL_CROSS = {
    "bridge": [
        (["rollout.max_turns=1"], "config.rollout.max_turns"),
        (["env.name=atari"], "config.env.name"),
        (["algorithm.preset=drgrpo"], "config.algorithm.preset"),
        (["optim.micro_batch_tokens=1"], "config.optim.micro_batch_tokens"),
    ],
    "bfcl": [
        (["env.options.categories=[multi_turn_nope]"], "config.env.options"),
        (["env.options.split=random"], "config.env.options.split"),
        (["env.options.subset=validation"], "config.env.options.subset"),
    ],
}
# (flags of a resume of the earlier evaluation, a word the refusal must name)
EVAL_CHANGED_RESUME = [(["--k", "2", "--max-tasks", "1"], "k"), (["--k", "1", "--max-tasks", "2"], "max"),
                  (["--k", "1", "--max-tasks", "1", "--batch", "2"], "batch"),
                  (["--k", "1", "--max-tasks", "1", "--set", "rollout.temperature=0.5"], "temperature")]


@st.composite
def hostile_eval_calls(draw):
    """``(base, config dict or None, extra argv, key the line must name, folder case)``."""
    base = draw(st.sampled_from(sorted(EVAL_BASES)))
    doc = copy.deepcopy(EVAL_BASES[base])
    leaves = [(p, v) for p, v in _leaves(doc) if p != ("out_dir",)]
    mutation = draw(st.sampled_from(["type", "number", "null", "extra", "cross", "folder", "folder"]))
    if mutation == "type":
        path, value = draw(st.sampled_from(leaves))
        _set(doc, path, [1, 2] if isinstance(value, dict) else {"zz": 1})
        return base, doc, [], _key(path), None
    if mutation == "number":
        path, _ = draw(st.sampled_from([(p, v) for p, v in leaves if type(v) in (int, float)]))
        _set(doc, path, draw(st.sampled_from([-1, 10**30, float("nan"), float("inf"), -float("inf")])))
        return base, doc, [], _key(path), None
    if mutation == "null":
        path, _ = draw(st.sampled_from([(p, v) for p, v in leaves if p[-1] not in NULLABLE]))
        _set(doc, path, None)
        return base, doc, [], _key(path), None
    if mutation == "extra":
        sections = [()] + sorted({q[:i] for q, _ in _leaves(doc) for i in range(1, len(q))})
        node = doc
        for k in draw(st.sampled_from(sections)):
            node = node[k]
        node["zz_unknown"] = draw(st.sampled_from([0, "x", None, [1]]))
        return base, doc, [], "zz_unknown", None
    if mutation == "cross":
        sets, key = draw(st.sampled_from(EVAL_CROSS[base]))
        return base, None, [a for s in sets for a in ("--set", s)], key, None
    folder = draw(st.sampled_from(["exists", "resume_missing", "resume_overwrite", "resume_changed", "checkpoint_missing"]))
    if folder == "resume_changed":
        flags, word = draw(st.sampled_from(EVAL_CHANGED_RESUME))
        return "bridge", None, [*flags, "--resume"], word, folder
    flags = {"exists": ["--k", "1"], "resume_missing": ["--resume"], "resume_overwrite": ["--resume", "--overwrite"],
             "checkpoint_missing": ["--checkpoint", "NO_CHECKPOINT"]}[folder]
    key = {"exists": "--out", "checkpoint_missing": "--checkpoint"}.get(folder, "--resume")
    return "bridge", None, flags, key, folder


@pytest.fixture(scope="module")
def earlier_eval(tmp_path_factory):
    """A finished evaluation of the tiny bridge (settings, episodes, summary)."""
    out = tmp_path_factory.mktemp("earlier_eval") / "eval"
    sets = [a for s in EVAL_SMALL for a in ("--set", s)]
    assert main(["eval", str(CONFIGS["bridge"]), *sets, *EVAL_EARLIER_FLAGS, "--out", str(out), "--no-progress"]) == 0
    assert (out / "episodes.jsonl").is_file() and (out / "summary.json").is_file()
    return out, sets


def _check_eval_refused(case, earlier_eval, tmp_path_factory, capsys) -> None:
    base, doc, extra, key, folder = case
    event(f"{base}: {folder or ('cross' if extra else 'file')}")
    earlier, small = earlier_eval
    before = _hashes(earlier)
    work = tmp_path_factory.mktemp("hostile_eval")
    config = CONFIGS[base]
    if doc is not None:
        config = work / "eval.yaml"
        config.write_text(yaml.safe_dump(doc))
    out = work / "out"
    if folder == "checkpoint_missing":
        (work / "NO_CHECKPOINT").mkdir()
        extra = ["--checkpoint", str(work / "NO_CHECKPOINT")]
    # the earlier evaluation's --set overrides only for the folder cases: on a mutated config they would mask the mutation
    target = earlier if folder in ("exists", "resume_changed") else out
    argv = ["eval", str(config), *(small if folder else []), *extra, "--out", str(target), "--no-progress"]
    rc, stdout, err, elapsed = _call(argv, capsys)
    assert rc == 2, (argv, rc, stdout, err)
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("seeupo eval: error: "), err
    assert key in err, (key, err)
    assert elapsed < SECONDS_PER_CALL, (argv, elapsed)
    assert _hashes(earlier) == before  # the earlier evaluation is exactly as it was
    assert not out.exists() or not any(out.iterdir())  # nothing written for the refused evaluation
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 < PEAK_RSS_BYTES


@settings(**HOSTILE, max_examples=max(12, settings.default.max_examples))
@given(case=hostile_eval_calls())
def test_hostile_eval_calls_exit_2_with_one_line_naming_the_key(case, earlier_eval, tmp_path_factory, capsys):
    _check_eval_refused(case, earlier_eval, tmp_path_factory, capsys)


@pytest.mark.slow
@settings(**HOSTILE, max_examples=200)
@given(case=hostile_eval_calls())
def test_many_hostile_eval_calls(case, earlier_eval, tmp_path_factory, capsys):
    _check_eval_refused(case, earlier_eval, tmp_path_factory, capsys)
