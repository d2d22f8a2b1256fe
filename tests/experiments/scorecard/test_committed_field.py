"""The committed field (paper_repro/scorecard): every catalogue algorithm has its card, the table and the claims
are what the cards say, and the README shows the same table."""

import json
from pathlib import Path

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
