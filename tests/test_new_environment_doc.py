"""docs/new_environment.md runs as written: every line of its ```bash blocks is a ``seeupo`` command, run
in-process, in order, from a folder holding a copy of examples/environments/, and must exit 0; then the
files the page names exist with sane content. The example plugin's code shown in the page is the file's."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from seeupo import plugins  # noqa: E402
from seeupo.cli import main  # noqa: E402
from seeupo.llm.checkpoint import checkpoint_step, latest_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "new_environment.md"
EXAMPLE = ROOT / "examples" / "environments"


def fenced(text: str, language: str) -> list[str]:
    """The sources of the ``language`` fenced blocks of ``text``, in order."""
    return re.findall(rf"^```{language}[ \t]*\n(.*?)^```[ \t]*$", text, re.DOTALL | re.MULTILINE)


@pytest.fixture
def fresh_plugins():
    plugins.forget_plugins()
    yield
    plugins.forget_plugins()


def test_the_pages_code_is_the_example_plugins():
    source = (EXAMPLE / "guess_number.py").read_text()
    for block in fenced(DOC.read_text(), "python"):
        for line in block.splitlines():
            assert line.strip() in ("...", "") or line.strip().startswith("return [{") or line in source, line


def test_new_environment_doc_runs(tmp_path, monkeypatch, fresh_plugins):
    shutil.copytree(EXAMPLE, tmp_path / "examples" / "environments")
    monkeypatch.chdir(tmp_path)
    commands = [c.strip() for block in fenced(DOC.read_text(), "bash") for c in block.splitlines() if c.strip()]
    assert [c.split()[1] for c in commands] == ["train", "train", "eval"]
    for command in commands:
        assert command.startswith("seeupo "), command
        plugins.forget_plugins()  # each command as in a new process
        assert main(shlex.split(command)[1:]) == 0, command
    run = tmp_path / "runs" / "guess_number"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    scores = [m["critic/score/mean"] for m in steps if "critic/score/mean" in m]
    assert len(scores) == 3 and all(0.0 <= s <= 1.0 for s in scores)  # two steps, then one resumed
    assert checkpoint_step(latest_checkpoint(run / "checkpoints")) == 3
    summary = json.loads((tmp_path / "results" / "guess_number_eval" / "summary.json").read_text())
    assert summary["checkpoint_step"] == 3 and summary["episodes"] == 8
    (row,) = summary["categories"]
    assert row["tasks"] == 4 and 0.0 <= row["avg_at_k"] <= row["pass_at_k"] <= 1.0
    episodes = (tmp_path / "results" / "guess_number_eval" / "episodes.jsonl").read_text().splitlines()
    assert len(episodes) == 8 and all(1 <= len(json.loads(e)["turns"]) <= 3 for e in episodes)
