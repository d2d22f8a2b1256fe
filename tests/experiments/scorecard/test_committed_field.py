"""The committed field (paper_repro/scorecard): every catalogue algorithm has its card, the table and the claims
are what the cards say, and the README shows the same table."""

import json
from pathlib import Path

import pytest

from seeupo.experiments.scorecard.capabilities import NAMES, Sizes
from seeupo.experiments.scorecard.card import Card
from seeupo.experiments.scorecard.catalogue import CATALOGUE
from seeupo.experiments.scorecard.field import field_markdown, score_table

ROOT = Path(__file__).resolve().parents[3]
FIELD = ROOT / "paper_repro" / "scorecard"


def committed_cards() -> list[Card]:
    return [Card.from_dict(json.loads((FIELD / "cards" / e.name / "card.json").read_text())) for e in CATALOGUE]


def test_every_catalogue_algorithm_has_a_finished_card_at_the_default_sizes():
    for card in committed_cards():
        assert card.sizes == Sizes() and not card.partial, card.algorithm
        assert set(card.measured) | set(card.skipped) == set(NAMES), card.algorithm
        for name, m in card.measured.items():  # a score or a reason, never a number from nothing
            assert (m.score.value is None) == (m.score.reason is not None), (card.algorithm, name)
            assert m.score.value is None or (0.0 <= m.score.value <= 1.0 and m.score.cases > 0)
            for path in m.evidence:
                assert (FIELD / "cards" / card.algorithm / path).exists(), (card.algorithm, path)


def test_the_committed_table_is_what_the_cards_say():
    field = json.loads((FIELD / "field.json").read_text())
    cards = committed_cards()
    assert (FIELD / "field.md").read_text() == field_markdown(cards, Sizes(), field["seconds"])
    assert field["scores"] == {c.algorithm: {n: c.score(n) for n in NAMES} for c in cards}
    assert field["missing"] == []


def test_the_readme_shows_the_field_table_in_its_first_screen():
    readme = (ROOT / "README.md").read_text().splitlines()
    table = score_table(committed_cards(), "paper_repro/scorecard/cards")
    start = readme.index(table[0])
    assert readme[start: start + len(table)] == table
    assert start + len(table) < 60  # the first screen


@pytest.mark.slow
def test_a_plugin_card_regenerates_its_committed_exact_scores(tmp_path):
    """The documented use, at the default sizes: a plugin's card beside the field, the same exact scores as
    the committed card (the problems are seeded; the bridge is left out: it is the slow part and the same code)."""
    import subprocess
    import sys

    out = tmp_path / "card"
    run = subprocess.run([sys.executable, "-m", "seeupo.cli", "scorecard", "dr_grpo", "--plugin",
                          str(ROOT / "examples" / "algorithms" / "dr_grpo.py"), "--no-bridge", "--no-progress",
                          "--out", str(out)], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    mine = json.loads((out / "card.json").read_text())["capabilities"]
    committed = json.loads((FIELD / "cards" / "dr_grpo" / "card.json").read_text())["capabilities"]
    for name in NAMES[:-1]:
        assert mine[name]["score"] == committed[name]["score"], name
    assert f"({len(CATALOGUE) - 1} cards beside it)" in run.stdout  # the field, itself left out
