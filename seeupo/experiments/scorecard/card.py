"""One algorithm's scorecard: every capability measured, written as ``card.json`` and ``card.md``, drawn as a radar.

:func:`score_card` runs the capabilities of
:data:`~seeupo.experiments.scorecard.capabilities.CAPABILITIES` in order and returns a
:class:`Card`; an interrupted card (Ctrl-C) keeps the capabilities that finished and says which
did not. :func:`write` puts it in a folder beside its evidence (counterexamples, gradient cases,
bridge runs), :func:`radar` draws it over other cards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from seeupo.experiments.scorecard.base import sweep_points
from seeupo.experiments.scorecard.capabilities import CAPABILITIES, NAMES, Capability, Context, Measured, Sizes
from seeupo.experiments.scorecard.catalogue import entry as catalogue_entry
from seeupo.experiments.scorecard.rules import Score, no_evidence
from seeupo.tabular.behaviour import Rollouts

FORMAT = "seeupo-scorecard/1"
#: What a card writes in its folder (``--overwrite`` moves these aside, never deletes them).
OUTPUTS = ("card.json", "card.md", "card.png", "counterexamples", "gradient", "bridge")


@dataclass
class Card:
    """One algorithm's scores: ``measured`` per capability name (the finished ones, in order)."""

    algorithm: str
    config: dict[str, Any]
    plugins: list[str]
    sizes: Sizes
    measured: dict[str, Measured]
    skipped: dict[str, str] = field(default_factory=dict)  # capability -> why it was not measured
    partial: bool = False
    seconds: float = 0.0
    stopped_by: str | None = None  # the signal that stopped a partial card (SIGINT, SIGTERM); not written
    sweep: dict[str, dict[str, float | None]] = field(default_factory=dict)  # capability -> {sweep point: score}
    rollouts: Rollouts = Rollouts()  # where the rows of its runs came from (on policy unless a flag said otherwise)

    def score(self, capability: str) -> float | None:
        m = self.measured.get(capability)
        return m.score.value if m is not None else None

    def to_dict(self) -> dict[str, Any]:
        caps = {}
        for cap in CAPABILITIES:
            entry: dict[str, Any] = {"title": cap.title, "tags": list(cap.tags), "question": cap.question,
                                     "rule": cap.rule, "exact": cap.exact}
            if cap.name in self.measured:
                entry |= self.measured[cap.name].to_dict()
            else:
                entry["not_measured"] = self.skipped.get(cap.name, "not reached (the card was stopped first)")
            caps[cap.name] = entry
        out = {"format": FORMAT, "algorithm": self.algorithm, "config": self.config, "plugins": self.plugins,
               "sizes": dataclasses.asdict(self.sizes), "capabilities": caps, "partial": self.partial,
               "seconds": self.seconds, "sweep": self.sweep}
        # an on-policy card (every committed one) is written as before there was a setting
        return out if self.rollouts.on_policy else out | {"rollouts": dataclasses.asdict(self.rollouts)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Card":
        """A card read back from its JSON (as :meth:`to_dict` wrote it)."""
        sizes = Sizes(**{k: tuple(v) if isinstance(v, list) else v for k, v in data["sizes"].items()})
        measured, skipped = {}, {}
        for name, entry in data["capabilities"].items():
            if "not_measured" in entry:
                skipped[name] = entry["not_measured"]
                continue
            s = entry["score"]
            score = Score(s["value"], s["cases"], s["passed"], tuple(s["interval"]) if s["interval"] else None, s["reason"])
            measured[name] = Measured(score, entry["covered"], entry["worst"], list(entry["evidence"]), entry["seconds"])
        return cls(data["algorithm"], data["config"], list(data["plugins"]), sizes, measured, skipped,
                   bool(data["partial"]), float(data["seconds"]), sweep=dict(data.get("sweep", {})),
                   rollouts=Rollouts.from_dict(data.get("rollouts")))


def context(name: str, sizes: Sizes, out: Path | None, plugins: tuple[str, ...] = (),
            say: Callable[[str], None] = lambda m: None, rollouts: Rollouts = Rollouts()) -> Context:
    """What the capabilities measure ``name`` with: its exact-mode row of ``seeupo verify`` (optimizer,
    step size, iterations per update), so that every algorithm takes the update ``verify`` gives it, with a
    catalogue algorithm's published settings on top (its KL term: :attr:`~seeupo.experiments.scorecard.catalogue.Entry.published`);
    ``rollouts``: where the rows of its runs come from."""
    from seeupo.experiments.verify import algorithm_rows

    row = algorithm_rows([name], sizes.exact_epochs)[0]
    published = catalogue_entry(name)
    config = row.config.replace(**dict(published.published)) if published is not None else row.config
    return Context(name, config, row.optimizer, row.lr, row.iterations_factor, sizes, out, plugins, say, rollouts)


def exact_refusal(ctx: Context) -> str | None:
    """Why exact mode cannot run ``ctx``'s estimator (the capabilities that are exact get no score), or ``None``."""
    from seeupo.experiments.verify import exact_refusal as refusal

    return refusal(ctx.config, ctx.sizes.group_size)


def score_card(name: str, sizes: Sizes, out: Path | None, *, plugins: tuple[str, ...] = (), bridge: bool = True,
               only: Sequence[str] | None = None, say: Callable[[str], None] = print,
               rollouts: Rollouts = Rollouts()) -> Card:
    """Measure every capability of ``name`` (``only``: these) and return its card.

    A capability that cannot run says why instead of a score (``Card.skipped``): the bridge with
    ``bridge=False``; the exact ones when exact mode refuses the estimator. Ctrl-C stops the card:
    the finished capabilities are kept and the card is marked partial (so does SIGTERM;
    ``Card.stopped_by`` names the signal). ``rollouts``: the capabilities that run the algorithm's own updates
    (``Capability.reads_rollouts``) draw their rows this way; the card records it.
    """
    from seeupo.experiments.check.run import SignalWatch

    start = time.perf_counter()
    ctx = context(name, sizes, out, plugins, say, rollouts)
    card = Card(name, ctx.config.to_dict(), list(plugins), sizes, {}, rollouts=rollouts)
    refused = exact_refusal(ctx)
    chosen = [c for c in CAPABILITIES if only is None or c.name in only]
    with SignalWatch() as watch, one_thread():  # SIGTERM stops a card as Ctrl-C does
        for k, cap in enumerate(chosen, start=1):
            why = _why_not(cap, refused, bridge)
            if why is not None:
                card.skipped[cap.name] = why
                say(f"[{k}/{len(chosen)}] {cap.name}: not measured ({why})")
                continue
            say(f"[{k}/{len(chosen)}] {cap.name}: {cap.question}")
            try:
                card.measured[cap.name] = _measure(cap, ctx)
                watch.raise_if_signalled()
            except KeyboardInterrupt as stop:
                card.partial, card.stopped_by = True, watch.name(stop)
                card.measured.pop(cap.name, None)
                say(f"interrupted ({card.stopped_by}) in {cap.name}: the card keeps the {len(card.measured)} "
                    "capabilities that finished")
                break
            m = card.measured[cap.name]
            say(f"[{k}/{len(chosen)}] {cap.name}: {format_score(m.score)} ({m.seconds:.1f} s)")
        if not card.partial:
            protocol_sweep(card, ctx, watch, say)
    for cap in CAPABILITIES:
        if only is not None and cap.name not in only and cap.name not in card.skipped:
            card.skipped[cap.name] = "not asked for"
    card.seconds = time.perf_counter() - start
    return card


def protocol_sweep(card: Card, ctx: Context, watch: Any, say: Callable[[str], None]) -> None:
    """The capabilities of ``card`` that run the exact mode's optimizer (``Capability.protocol``) measured again at
    each point of :func:`~seeupo.experiments.scorecard.base.sweep_points`: the step size ``lr x f`` for ``f`` in
    ``Sizes.sweep_lr``, then the optimizer steps per update ``epochs x f`` (rounded, at least 1) for ``f`` in
    ``Sizes.sweep_epochs``; no evidence written (the card's own runs have it), into ``card.sweep[capability][point]``.
    The card's own score is the protocol itself. Ctrl-C keeps the finished points and marks the card partial."""
    swept = [c for c in CAPABILITIES if c.protocol and c.name in card.measured and card.score(c.name) is not None]
    for point in sweep_points(card.sizes):
        kind, factor = point.split(" x ")[0], float(point.split(" x ")[1])
        if kind == "lr":
            moved = dataclasses.replace(ctx, lr=ctx.lr * factor, out=None)
            words = f"{point} ({moved.lr:g})"
        else:
            epochs = max(1, round(ctx.config.epochs * factor))
            if epochs == ctx.config.epochs:  # one step per update already: the same computation as the card's own
                say(f"protocol sweep: {point} is the protocol itself ({epochs} step per update): its scores are the card's")
                for cap in swept:
                    card.sweep.setdefault(cap.name, {})[point] = card.score(cap.name)
                continue
            moved = dataclasses.replace(ctx, config=ctx.config.replace(epochs=epochs), out=None)
            words = f"{point} ({epochs} steps per update)"
        say(f"protocol sweep: {words} on {len(swept)} capabilities")
        for cap in swept:
            try:
                card.sweep.setdefault(cap.name, {})[point] = _measure(cap, moved).score.value
                watch.raise_if_signalled()
            except KeyboardInterrupt as stop:
                card.partial, card.stopped_by = True, watch.name(stop)
                say(f"interrupted ({card.stopped_by}) in the protocol sweep: the card keeps the points that finished")
                return


def sweep_range(card: Card, capability: str) -> tuple[float, float] | None:
    """The least and largest score of ``capability`` over the protocol sweep and the card's own (``None``: not swept)."""
    points = [v for v in card.sweep.get(capability, {}).values() if v is not None]
    own = card.score(capability)
    if not points or own is None:
        return None
    return min(points + [own]), max(points + [own])


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one thread inside, the previous count restored after.

    The exact problems' tensors are small (tens to a few hundred thousand rows), and on a machine
    with other work torch's threads waiting for each other cost far more than they bring: one part
    of 8 updates (6 one-turn bandits, GRPO) took 11.6 s with two threads and 1.2 s with one, beside
    one other busy process on 2 cores (benchmarks/RESULTS.md, 2026-11-29). ``--field`` runs each
    card on one thread already."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


#: The bridge's seconds per seed on 2 idle CPU cores (three algorithms: the card's and the two baselines), scaled by
#: the steps. A fixed figure: it is not timed before a card. Measured 2026-11-29, `seeupo scorecard grpo` alone: 13.9 s
#: for 5 seeds (2.8 s a seed; 6.5 s a seed in the field of 2026-11-28, two cards at once on the same 2 cores).
BRIDGE_SECONDS_PER_SEED = 3.0
#: Drawing the radar over the field's cards and writing the files, after the last capability (measured 2-3 s).
WRITE_SECONDS = 3.0


@dataclass(frozen=True)
class Calibration:
    """This machine's speed on one algorithm's card (:func:`calibrate`).

    capabilities: each exact capability's estimated seconds (its units timed, :func:`~seeupo.experiments.scorecard.
    timing.estimate_seconds`); seconds: what the timing itself took (part of the wall time).
    """

    capabilities: dict[str, float]
    seconds: float


def calibrate(name: str, sizes: Sizes, *, plugins: tuple[str, ...] = (), only: Sequence[str] | None = None,
              clock: Callable[[], float] = time.perf_counter, rollouts: Rollouts = Rollouts()) -> Calibration:
    """Time a unit of each exact capability of ``name``'s card on this machine (one update of each problem, a few
    ascent steps, one direction of each problem) after one untimed unit (first calls: imports, caches), on one
    thread as the card runs (:func:`one_thread`)."""
    from seeupo.experiments.scorecard.timing import estimate_seconds, units

    start = clock()
    ctx = context(name, sizes, None, plugins, rollouts=rollouts)
    chosen = [c.name for c in CAPABILITIES if c.exact and (only is None or c.name in only)]
    seconds: dict[str, float] = {}
    with one_thread():
        if chosen and exact_refusal(ctx) is None:
            first = units(ctx, chosen[0])
            if first:
                first[0].run()
            seconds = {c: estimate_seconds(ctx, c, clock) for c in chosen}
    return Calibration(seconds, clock() - start)


def estimate(sizes: Sizes, cal: Calibration, *, bridge: bool) -> float:
    """The card's seconds from ``cal``: the timing, the capabilities, the bridge (a fixed figure) and the writing."""
    lm = BRIDGE_SECONDS_PER_SEED * len(sizes.bridge_seeds) * sizes.bridge_steps / Sizes().bridge_steps if bridge else 0.0
    protocol = {c.name for c in CAPABILITIES if c.protocol}
    swept = len(sweep_points(sizes)) * sum(v for k, v in cal.capabilities.items() if k in protocol)
    return cal.seconds + sum(cal.capabilities.values()) + swept + lm + WRITE_SECONDS


def plan_line(name: str, sizes: Sizes, cal: Calibration, *, bridge: bool) -> str:
    """The plan said before a card starts: the capabilities, the sizes and the estimate from ``cal``."""
    return (f"scorecard {name}: {len(CAPABILITIES) - (0 if bridge else 1)} capabilities on fixed seeded problems "
            f"({sizes.instances} per part, {sizes.iterations} exact updates per run)"
            + (f", the protocol sweep ({', '.join(sweep_points(sizes))})" if sweep_points(sizes) else "")
            + (f" and the bridge ({len(sizes.bridge_seeds)} seeds x {sizes.bridge_steps} steps)" if bridge else "")
            + f"; estimate {estimate(sizes, cal, bridge=bridge):.0f} s in all (calibrated on this machine in "
              f"{cal.seconds:.0f} s)")


def _why_not(cap: Capability, refused: str | None, bridge: bool) -> str | None:
    if cap.name == "lm_bridge" and not bridge:
        return "--no-bridge"
    if cap.exact and refused is not None:
        return f"exact mode refuses the estimator: {refused}"
    return None


def _measure(cap: Capability, ctx: Context) -> Measured:
    """``cap.measure(ctx)``; an exact batch too large to build is no evidence (the reason, no score)."""
    from seeupo.tabular.rollout import ExactBatchTooLarge

    try:
        return cap.measure(ctx)
    except ExactBatchTooLarge as err:
        return Measured(no_evidence(f"an exact batch is too large to build: {err}"), "")


def shown(value: float) -> str:
    """A score with two decimals, rounded down: a score below 1 never reads 1.00."""
    return f"{math.floor(value * 100 + 1e-9) / 100:.2f}"


def format_score(score: Score) -> str:
    """``0.96 (49 of 51)``, ``0.74 [0.61, 0.88]`` or ``no score (why)``."""
    if score.value is None:
        return f"no score ({score.reason})"
    text = shown(score.value)
    if score.passed is not None:
        text += f" ({score.passed} of {score.cases})"
    if score.interval is not None:
        text += f" [{score.interval[0]:.2f}, {score.interval[1]:.2f}]"
    return text


def markdown(card: Card) -> str:
    """The card as Markdown: one row per capability (score, what it covered, the worst case, its evidence)."""
    lines = [f"# Scorecard: {card.algorithm}", ""]
    if card.partial:
        lines += ["**Partial**: stopped before every capability was measured.", ""]
    if card.plugins:
        lines += ["Plugins: " + ", ".join(f"`{p}`" for p in card.plugins), ""]
    published = catalogue_entry(card.algorithm)
    if not card.rollouts.on_policy:
        lines += [f"**Rows off policy**: {card.rollouts.words()} (rollout correction: `{card.config.get('correction', 'none')}`), "
                  "in the runs of the algorithm's own updates: " + ", ".join(
                      c.title for c in CAPABILITIES if c.reads_rollouts) + ". The others measure expected steps on "
                  "policy (the stale-rollouts capability draws from its own fixed engines).", ""]
    if published is not None and published.published:
        lines += ["As published, on top of the preset: " + ", ".join(f"`{k}={v}`" for k, v in published.published)
                  + " (the KL term's reference: the run's start policy).", ""]
    lines += ["| Capability | Score | Rule | Worst case | Evidence |", "|---|---|---|---|---|"]
    for cap in CAPABILITIES:
        if cap.name in card.measured:
            m = card.measured[cap.name]
            evidence = ", ".join(f"[{e}]({e})" for e in m.evidence) or "—"
            lines.append(f"| {cap.title} | {format_score(m.score)} | {cap.rule} | {m.worst or '—'} | {evidence} |")
        else:
            lines.append(f"| {cap.title} | not measured: {card.skipped.get(cap.name, 'stopped first')} | {cap.rule} | — | — |")
    if card.sweep:
        points = sweep_points(card.sizes)
        lines += ["", "Protocol sweep (the exact mode's step size, then its optimizer steps per update, times each "
                      "factor; the card's own score is the protocol itself; a score that moves across it rests on the "
                      "protocol as much as on the algorithm):", "",
                  "| Capability | own | " + " | ".join(points) + " |", "|---|---|" + "---|" * len(points)]
        for name, measured in card.sweep.items():
            lines.append(f"| {name} | {shown(card.score(name))} | " + " | ".join(
                "—" if measured.get(p) is None else shown(measured[p]) for p in points) + " |")
    definition = departures_lines(card.algorithm)
    if definition:
        lines += ["", *definition]
    lines += ["", "What each capability covered:", ""]
    lines += [f"- **{cap.title}** (`{cap.name}`; {', '.join(cap.tags)}): {card.measured[cap.name].covered}"
              for cap in CAPABILITIES if cap.name in card.measured]
    sizes = ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(card.sizes).items())
    lines += ["", f"Sizes: {sizes}. Measured in {card.seconds:.0f} s.", ""]
    return "\n".join(lines)


def departures_lines(name: str) -> list[str]:
    """Where the card's algorithm departs from its source (:mod:`seeupo.experiments.scorecard.provenance`), and the
    protocol every exact capability runs."""
    from seeupo.experiments.scorecard.provenance import PROTOCOL, definition, departures

    if not definition(name):
        return []
    lines = [f"Definition: every setting against its source in docs/algorithms.md#{name}. Protocol: "
             f"{PROTOCOL}."]
    lines += [f"- Departs in {s.aspect}: the source has {s.published}; the toolkit {s.toolkit}; because {s.departs}."
              for s in departures(name)]
    return lines


def write(card: Card, out: Path, others: Sequence[Card] = ()) -> None:
    """``card`` as ``out/card.json``, ``card.md`` and ``card.png`` (the radar, ``others`` drawn beneath)."""
    from seeupo.validation.files import dumps

    out.mkdir(parents=True, exist_ok=True)
    (out / "card.json").write_text(dumps(card.to_dict(), indent=1) + "\n")
    (out / "card.md").write_text(markdown(card))
    radar([card, *others], out / "card.png", highlight=card.algorithm)


def radar(cards: Sequence[Card], path: Path, highlight: str | None = None) -> None:
    """A radar of the cards' scores, one axis per capability; ``highlight`` drawn bold over the others.
    A capability without a score is a gap in that card's line (never a 0 it did not measure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    angles = [2 * math.pi * k / len(NAMES) for k in range(len(NAMES))]
    fig = plt.figure(figsize=(7.5, 7.5))
    ax = fig.add_subplot(projection="polar")
    colours = plt.get_cmap("tab20").colors  # 20 distinct colours: a field of 11 never repeats one
    ordered = sorted(cards, key=lambda c: c.algorithm == highlight)  # the highlighted card is drawn last, on top
    for k, card in enumerate(ordered):
        values = [math.nan if card.score(n) is None else card.score(n) for n in NAMES]
        bold = card.algorithm == highlight
        colour = "black" if bold else colours[(2 * k) % 20 if k < 10 else (2 * k + 1) % 20]
        ax.plot([*angles, angles[0]], [*values, values[0]], color=colour, linewidth=2.5 if bold else 1.0,
                alpha=1.0 if bold else 0.75, label=card.algorithm + (" (partial)" if card.partial else ""),
                zorder=3 if bold else 2)
        if bold:
            ax.fill([*angles, angles[0]], [*values, values[0]], color=colour, alpha=0.1)
    ax.set_xticks(angles)
    ax.set_xticklabels([c.short.replace(" ", "\n", 1) for c in CAPABILITIES], fontsize=8)
    ax.set_ylim(0, 1.0)
    ax.set_yticks([0.25, 0.5, 0.75, 1.0])
    ax.legend(loc="upper right", bbox_to_anchor=(1.3, 1.1), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
