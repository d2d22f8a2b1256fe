"""The README's Python examples run as written (and its test functions pass)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.slow
def test_readme_examples_run_and_their_tests_pass():
    from seeupo.core.config import REGISTRIES

    blocks = python_blocks()
    assert len(blocks) >= 2
    before = [set(r.names()) for r in REGISTRIES]
    try:
        for k, source in enumerate(blocks):
            namespace: dict = {"__name__": f"readme_block_{k}"}
            exec(compile(source, f"README.md python block {k}", "exec"), namespace)
            for name, fn in namespace.items():
                if name.startswith("test_") and callable(fn):
                    fn()  # hypothesis runs each @given test with its own settings
    finally:  # what the examples registered is not left to the tests after this one
        for registry, names in zip(REGISTRIES, before):
            for name in set(registry.names()) - names:
                registry.remove(name)


def test_readme_train_configs_are_valid(tmp_path):
    from seeupo.llm.config import load_train_config

    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks
    for k, text in enumerate(blocks):
        path = tmp_path / f"block{k}.yaml"
        path.write_text(text)
        assert load_train_config(path).steps >= 1


def test_distributed_doc_configs_are_valid(tmp_path):
    from seeupo.llm.config import load_train_config

    doc = README.parent / "docs" / "distributed.md"
    blocks = re.findall(r"```yaml\n(.*?)```", doc.read_text(), flags=re.S)
    assert len(blocks) >= 2
    for k, text in enumerate(blocks):
        path = tmp_path / f"block{k}.yaml"
        path.write_text(text)
        load_train_config(path)


def test_relative_links_of_the_docs_exist():
    root = README.parent
    for page in [README, *sorted((root / "docs").glob("*.md")), root / "paper_repro" / "README.md"]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


def test_readme_names_every_resumable_field():
    """The README's list of what may change on resume is RESUMABLE_FIELDS (a section's fields by `section.*`)."""
    from seeupo.llm.config import RESUMABLE_FIELDS

    text = README.read_text()
    missing = [f for f in RESUMABLE_FIELDS if f"`{f}`" not in text and f"`{f.split('.')[0]}.*`" not in text]
    assert not missing, f"README.md does not name these resumable fields: {missing}"
