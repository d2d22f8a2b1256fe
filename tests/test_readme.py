"""The README and the docs it links: their Python examples run as written (and their test functions pass),
their configs load, their links resolve, and the README stays a front door of one page."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
LIBRARY = README.parent / "docs" / "library.md"  # the Python examples moved here from the README
TRAINING = README.parent / "docs" / "training.md"  # and the training configs here


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", LIBRARY.read_text(), flags=re.S)


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

    blocks = re.findall(r"```yaml\n(.*?)```", TRAINING.read_text(), flags=re.S)
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
    """docs/training.md's list of what may change on resume is RESUMABLE_FIELDS (a section's fields by `section.*`)."""
    from seeupo.llm.config import RESUMABLE_FIELDS

    text = TRAINING.read_text()
    missing = [f for f in RESUMABLE_FIELDS if f"`{f}`" not in text and f"`{f.split('.')[0]}.*`" not in text]
    assert not missing, f"docs/training.md does not name these resumable fields: {missing}"


def test_the_readme_is_one_page_that_defines_its_terms_and_links_each_doc_once():
    text = README.read_text()
    assert len(text.encode()) < 15_000, f"README.md is {len(text.encode())} bytes; move detail to docs/"
    for term in ("**`J`**", "**`J*`**", "**GRAE**", "**The bridge**"):
        assert term in text, f"README.md defines {term}"
    quick = text.split("## Quick start")[1].split("##")[0]
    assert quick.index("seeupo check") < quick.index("make test"), "seeupo check comes first in the quick start"
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert links and len(links) == len(set(links)), "each page of docs/ is linked once from the README"
    assert {f"docs/{p.name}" for p in (README.parent / "docs").glob("*.md")} <= set(links), "every doc is linked"
