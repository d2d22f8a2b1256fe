"""The field's table: every catalogue algorithm's card, one table, one radar, and where a published claim disagrees.

:func:`build_field` measures each catalogue entry's card in its own worker process (each loads
only its entry's plugin) and writes ``cards/NAME/`` (each card with its evidence), ``field.md``
(the table, the claims), ``field.json`` and ``field.png``. :func:`comparison_cards` gives the cards
a new algorithm is drawn beside.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable, Sequence

from seeupo.experiments.scorecard.base import sweep_points
from seeupo.experiments.scorecard.capabilities import CAPABILITIES, NAMES, Sizes
from seeupo.experiments.scorecard.card import Card, radar, score_card, shown, write
from seeupo.experiments.scorecard.catalogue import CATALOGUE, claim_verdict, entry
from seeupo.tabular.behaviour import Rollouts

#: The committed field, relative to the working directory or the repository.
FIELD_DIR = "paper_repro/scorecard"
#: Wall time of the whole catalogue's field at the default sizes, measured on 2 CPU cores with 2 workers, two short
#: training runs beside it (2026-11-29: 836 s; 14 capabilities, the sweep at lr x 0.2, x 5 and epochs x 0.25); with
#: 17 capabilities, 1247 s with a full test run (5 min) and a verl test run beside it (2026-11-29, issue 42).
FIELD_MINUTES = 21
#: What the field writes in its folder (``--overwrite`` moves these aside, never deletes them).
FIELD_OUTPUTS = ("field.md", "field.json", "field.png", "cards")


def committed_card(name: str, sizes: Sizes, field_dir: str | Path = FIELD_DIR,
                   rollouts: Rollouts = Rollouts()) -> Card | None:
    """``name``'s committed card of the field when it was measured with ``sizes`` and ``rollouts`` and finished, else
    ``None``."""
    from seeupo.experiments.verdicts import resolve_dir
    from seeupo.validation.files import read_json

    path = resolve_dir(field_dir) / "cards" / name / "card.json"
    if not path.is_file():
        return None
    card = Card.from_dict(read_json(path))
    return card if card.sizes == sizes and card.rollouts == rollouts and not card.partial else None


def comparison_cards(names: Sequence[str] | None, sizes: Sizes, out: Path, *, exclude: str, plugins: tuple[str, ...] = (),
                     bridge: bool = True, say: Callable[[str], None] = print,
                     rollouts: Rollouts = Rollouts()) -> list[Card]:
    """The cards drawn beside a new one. ``names=None``: the catalogue's committed cards measured with
    ``sizes`` and ``rollouts`` (none measured now; the committed field is on policy). Else each named algorithm's
    committed card where it matches, or its card measured now into ``out/compare/NAME``."""
    if names is None:
        return [c for c in (committed_card(e.name, sizes, rollouts=rollouts) for e in CATALOGUE if e.name != exclude)
                if c is not None]
    cards = []
    for name in names:
        if name == exclude:
            continue
        card = committed_card(name, sizes, rollouts=rollouts)
        if card is None:
            say(f"--compare {name}: measuring its card now (no committed card with these sizes and rollouts)")
            card = score_card(name, sizes, out / "compare" / name, plugins=plugins, bridge=bridge, say=say,
                              rollouts=rollouts)
            write(card, out / "compare" / name)
        else:
            say(f"--compare {name}: the committed card of the field")
        cards.append(card)
    return cards


def _card_job(name: str, plugin: str | None, sizes: Sizes, out: str, bridge: bool) -> dict[str, Any]:
    """One catalogue card, in a worker process: load the entry's plugin, measure, write, return the card."""
    import torch

    from seeupo.plugins import load_plugins

    torch.set_num_threads(1)
    specs = load_plugins([plugin], "catalogue") if plugin else ()
    card = score_card(name, sizes, Path(out), plugins=specs, bridge=bridge, say=lambda m: None)
    write(card, Path(out))
    return card.to_dict()


def build_field(out: Path, sizes: Sizes, *, workers: int = 2, bridge: bool = True, names: Sequence[str] | None = None,
                say: Callable[[str], None] = print) -> list[Card]:
    """Measure the catalogue's cards (``names``: these) with ``workers`` processes and write the field's
    files in ``out``. Each card is written as it finishes; Ctrl-C keeps the finished ones (the table
    says which are missing)."""
    from seeupo.experiments.verdicts import resolve_dir

    chosen = [e for e in CATALOGUE if names is None or e.name in names]
    start, cards = time.perf_counter(), {}
    say(f"field: {len(chosen)} cards ({', '.join(e.name for e in chosen)}) with {workers} workers; each card is said "
        f"as it finishes (the whole catalogue took {FIELD_MINUTES} min on 2 cores with 2 workers)")
    pool = ProcessPoolExecutor(max_workers=workers, max_tasks_per_child=1)  # one process per card: its plugin alone
    try:
        futures = {pool.submit(_card_job, e.name, str(resolve_dir(e.plugin)) if e.plugin else None, sizes,
                               str(out / "cards" / e.name), bridge): e.name for e in chosen}
        for k, future in enumerate(as_completed(futures), start=1):
            card = Card.from_dict(future.result())
            cards[card.algorithm] = card
            say(f"[{k}/{len(chosen)}] {card.algorithm}: " + ", ".join(
                f"{n} {card.score(n):.2f}" for n in NAMES if card.score(n) is not None) + f" ({card.seconds:.0f} s)")
    except KeyboardInterrupt:
        say(f"interrupted: the field keeps the {len(cards)} cards that finished")
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        ordered = [cards[e.name] for e in chosen if e.name in cards]
        if ordered:
            write_field(out, ordered, sizes, time.perf_counter() - start)
    return ordered


def claims_table(cards: Sequence[Card]) -> list[dict[str, str]]:
    """Every catalogue claim read against its algorithm's card (:func:`claim_verdict`)."""
    rows = []
    for card in cards:
        e = entry(card.algorithm)
        for claim in e.claims if e is not None else ():
            scores = {n: card.score(n) for n in NAMES}
            worst = {n: card.measured[n].worst if n in card.measured else None for n in NAMES}
            verdict, words = claim_verdict(claim, scores, worst)
            rows.append({"algorithm": card.algorithm, "source": claim.source, "claim": claim.text,
                         "model": claim.model, "verdict": verdict, "evidence": words})
    return rows


def score_table(cards: Sequence[Card], cards_dir: str) -> list[str]:
    """The table's lines: one row per card (its name linked to ``cards_dir/NAME/card.md``), one column per
    capability; a share below 1 in bold (some case failed its rule: the card names the worst; a graded score, a
    mean of per-case values, is never bold), ``—`` where there is no score. The bridge's score is a share of a gap closed in a few steps, never bold, with its
    95% interval over seeds."""
    lines = ["| Algorithm | " + " | ".join(c.short for c in CAPABILITIES) + " |", "|---|" + "---|" * len(NAMES)]
    for card in cards:
        e = entry(card.algorithm)
        name = f"[{e.title if e else card.algorithm}]({cards_dir}/{card.algorithm}/card.md)"
        cells = []
        for cap in CAPABILITIES:
            m = card.measured.get(cap.name)
            if m is None or m.score.value is None:
                cells.append("—")
            elif not cap.exact:
                interval = m.score.interval
                cells.append(shown(m.score.value) + (f" ({shown(interval[0])}–{shown(interval[1])})" if interval else ""))
            else:
                failed = m.score.passed is not None and m.score.value < 1 - 1e-9
                cells.append(f"**{shown(m.score.value)}**" if failed else shown(m.score.value))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def graded_columns(cards: Sequence[Card]) -> list[str]:
    """The exact columns whose scores are means of per-case values (no pass or fail), as the table names them."""
    return [cap.short for cap in CAPABILITIES if cap.exact and any(
        card.measured.get(cap.name) is not None and card.measured[cap.name].score.passed is None for card in cards)]


def ties(cards: Sequence[Card]) -> dict[str, float]:
    """The exact capabilities on which every card scores the same (the column does not separate the field), with
    that score; a column with a card not measured is not a tie."""
    out = {}
    for cap in CAPABILITIES:
        values = {card.score(cap.name) for card in cards}
        if cap.exact and len(cards) > 1 and len(values) == 1 and None not in values:
            out[cap.name] = values.pop()  # type: ignore[assignment]
    return out


def columns_markdown(cards: Sequence[Card]) -> list[str]:
    """What each column of the table measures, its rule, the hand-made algorithm that must fail it, and whether it
    separates the field (a column where every algorithm ties says so)."""
    tied = ties(cards)
    lines = ["| Column | Question | Rule | Must fail it | Separates the field? |", "|---|---|---|---|---|"]
    for cap in CAPABILITIES:
        separates = (f"no: every algorithm scores {shown(tied[cap.name])}" if cap.name in tied
                     else "—" if not cap.exact else "yes")
        lines.append(f"| {cap.short} (`{cap.name}`) | {cap.question} | {cap.rule} | {cap.fails or '—'} | {separates} |")
    return lines


def sweep_markdown(cards: Sequence[Card]) -> list[str]:
    """The protocol sweep: each protocol capability's least and largest score over the step sizes, per card."""
    from seeupo.experiments.scorecard.card import sweep_range

    swept = [c for c in CAPABILITIES if c.protocol and any(card.sweep.get(c.name) for card in cards)]
    if not swept:
        return []
    points = next(sweep_points(card.sizes) for card in cards if card.sweep)
    lines = ["## The protocol sweep", "",
             "The exact capabilities that run an optimizer take `seeupo verify`'s protocol (the expected batch, 40 Adam "
             f"epochs at lr 0.05; RLOO 10 SGD steps at 5). Each was measured again at {', '.join(points)}: "
             f"the least and largest score over these {len(points) + 1} protocols (one number: it did not move).", "",
             "| Algorithm | " + " | ".join(c.short for c in swept) + " |", "|---|" + "---|" * len(swept)]
    for card in cards:
        cells = []
        for cap in swept:
            span = sweep_range(card, cap.name)
            cells.append("—" if span is None else shown(span[0]) if shown(span[0]) == shown(span[1])
                         else f"{shown(span[0])}–{shown(span[1])}")
        lines.append(f"| {card.algorithm} | " + " | ".join(cells) + " |")
    return lines + [""]


def field_markdown(cards: Sequence[Card], sizes: Sizes, seconds: float) -> str:
    """The field's table (one row per algorithm, one column per capability), the columns defined, the protocol sweep
    and the claims read against it."""
    from seeupo.experiments.scorecard.catalogue import VERDICTS

    lines = ["# The field, scored", "",
             "Each algorithm's card (`cards/NAME/card.md`, with its evidence) on the same fixed, seeded problems. "
             "A score is in [0, 1]; the columns are defined below. `—`: no score (the card says why). Each algorithm's "
             "definition, setting by setting against its authors' code or paper, is in docs/algorithms.md.", "",
             *score_table(cards, "cards"), "",
             "Bold: a share below 1, some case failed the rule (the card names the worst); the graded columns (a mean "
             f"of per-case values: {', '.join(graded_columns(cards))}) are never bold. "
             "Scores are rounded down. The bridge column "
             "is the share of the gap to J* closed in 5 steps, mean of 5 seeds, with its 95% t interval over the seeds: "
             "it says the code learns on a language model, not which algorithm learns faster.", "",
             "## The columns", "", *columns_markdown(cards), "", *sweep_markdown(cards),
             "## Published claims against the cards", "",
             "Each claim in its source's words, read only against capabilities whose problems lie inside its model. "
             + " ".join(f"*{k}*: {v}." for k, v in VERDICTS.items()), "",
             "| Algorithm | Source | Claim | Model | Verdict | Evidence |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['algorithm']} | {r['source']} | {r['claim']} | {r['model']} | {r['verdict']} | {r['evidence']} |"
              for r in claims_table(cards)]
    sizes_text = ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(sizes).items())
    missing = [e.name for e in CATALOGUE if e.name not in {c.algorithm for c in cards}]
    partial = [c.algorithm for c in cards if c.partial]
    lines += ["", f"Sizes: {sizes_text}. {len(cards)} cards in {seconds:.0f} s."]
    if missing or partial:  # a field stopped early says what it lacks
        lines.append("**Incomplete**: " + "; ".join(
            ([f"no card for {', '.join(missing)}"] if missing else []) + ([f"partial: {', '.join(partial)}"] if partial else []))
            + ".")
    lines.append("")
    return "\n".join(lines)


def write_field(out: Path, cards: Sequence[Card], sizes: Sizes, seconds: float) -> None:
    """``field.md``, ``field.json`` and ``field.png`` in ``out``, and each card's radar redrawn over the field
    (the cards are in ``out/cards``)."""
    from seeupo.validation.files import dumps

    out.mkdir(parents=True, exist_ok=True)
    (out / "field.md").write_text(field_markdown(cards, sizes, seconds))
    data = {"format": "seeupo-field/1", "sizes": dataclasses.asdict(sizes), "seconds": seconds,
            "scores": {c.algorithm: {n: c.score(n) for n in NAMES} for c in cards}, "claims": claims_table(cards),
            "sweep": {c.algorithm: c.sweep for c in cards}, "ties": ties(cards),
            "missing": [e.name for e in CATALOGUE if e.name not in {c.algorithm for c in cards}]}
    (out / "field.json").write_text(dumps(data, indent=1) + "\n")
    radar(cards, out / "field.png")
    for card in cards:  # each card drawn over the rest of the field
        if (out / "cards" / card.algorithm).is_dir():
            radar(cards, out / "cards" / card.algorithm / "card.png", highlight=card.algorithm)
