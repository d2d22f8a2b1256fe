"""The tutorial's code runs: every ```python block of docs/tutorial.md, in order, in one namespace.

The blocks are the project's own documentation, executed from the repository root (they
read ``paper_repro/counterexamples/*.json`` by relative path). A failing block is reported
with its number, its first line in the markdown file, its source and the traceback.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial.md"
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
MIN_BLOCKS = 8


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(line number of the opening fence, source)`` of every ```python block, in order."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in FENCE.finditer(text)]


def test_block_extraction():
    text = "intro\n```python\nx = 1\n```\ntext\n```\nnot python\n```\n```python\ny = x + 1\n```\n"
    assert python_blocks(text) == [(2, "x = 1\n"), (9, "y = x + 1\n")]


def test_tutorial_has_enough_python_blocks():
    blocks = python_blocks(TUTORIAL.read_text())
    assert len(blocks) >= MIN_BLOCKS, f"docs/tutorial.md has {len(blocks)} python blocks, expected at least {MIN_BLOCKS}"


@pytest.mark.slow
def test_tutorial_blocks_run(monkeypatch):
    monkeypatch.chdir(ROOT)
    blocks = python_blocks(TUTORIAL.read_text())
    assert len(blocks) >= MIN_BLOCKS
    namespace: dict[str, object] = {"__name__": "tutorial"}
    for number, (line, source) in enumerate(blocks, 1):
        error = None
        try:
            code = compile(source, f"docs/tutorial.md, block {number} (line {line})", "exec")
            exec(code, namespace)  # noqa: S102 - the project's own documentation
        except Exception:  # noqa: BLE001 - report any failure with the block that raised it
            error = traceback.format_exc()
        if error is not None:
            numbered = "\n".join(f"{k:4d} | {src}" for k, src in enumerate(source.splitlines(), 1))
            pytest.fail(
                f"tutorial block {number} of {len(blocks)} (docs/tutorial.md line {line}) failed:\n{numbered}\n\n{error}",
                pytrace=False,
            )
