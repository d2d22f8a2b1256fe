"""The reports of ``seeupo check``, typed: what ``check.json`` holds, and the exit status it implies.

Every class has ``to_dict()``, exactly the JSON written to ``check.json`` (its field names are the
JSON keys, in the same order), and ``from_dict()``, its inverse: a committed report read back and
written again is the same file. The parts measured by other modules stay the JSON those modules
write: the verify report (:func:`seeupo.experiments.verify.verify`), the gradient part
(:func:`seeupo.experiments.gradient_check.run_gradient`), the bridge's tables
(:func:`seeupo.experiments.bridge_lm.build_tables`), the preset's settings and the budget as run.
"""

from __future__ import annotations

import signal
import dataclasses
from dataclasses import dataclass
from typing import Any

from seeupo.experiments.check.planning import Plan
from seeupo.experiments.verdicts import NO_SIGNAL

DECREASED = "J decreased"  # the verdict of :func:`seeupo.experiments.check.verdict.monotonicity` that a case lowered J
#: What a check stopped by its budget records as its ``partial`` (a signal's name otherwise).
BUDGET = "budget"
#: The verdict of a check whose plan did not finish (a budget or a signal stopped it) and that found no decrease.
INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class MonotonicityVerdict:
    """The verdict on exact monotonicity: ``measured`` (``J decreased``, ``inconclusive``, ``no learning signal``,
    ``monotone``; ``None`` when nothing was measured: refused, or stopped first) and its ``evidence``, one sentence
    each (an inconclusive verdict's first says how much of the plan was measured)."""

    measured: str | None
    evidence: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"measured": self.measured, "evidence": list(self.evidence)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MonotonicityVerdict:
        return cls(d["measured"], list(d["evidence"]))


@dataclass(frozen=True)
class Explanation:
    """Why ``J`` fell in a counterexample (:mod:`seeupo.experiments.explain`): its ``cause``, the one-line
    ``summary`` and the ``file`` of the full text (relative to the check's folder); or only ``error``, one
    line, when the explanation failed."""

    cause: str | None = None
    summary: str | None = None
    file: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        if self.error is not None:
            return {"error": self.error}
        return {"cause": self.cause, "summary": self.summary, "file": self.file}

    @classmethod
    def from_dict(cls, d: dict[str, str]) -> Explanation:
        return cls(**d)


def _on_flat_surrogate(explanation: Explanation | None) -> bool:
    """Whether an explained decrease is on a flat surrogate (its cause): the optimizer chose it, not the algorithm."""
    return explanation is not None and explanation.cause == "flat surrogate"


#: A fall of ``J`` larger than this in a field replay is a decrease (the searches' own tolerance).
FIELD_TOL = 1e-7


@dataclass(frozen=True)
class FieldReplay:
    """One committed counterexample run with the checked algorithm's own update.

    ``file``: the committed file (from ``paper_repro`` on); ``setting``, ``parameterization``,
    ``group_size``, ``iterations``: the run; ``J``: the exact ``J`` after each update;
    ``largest_decrease``: the largest fall of ``J`` in one update (negative when it only rose);
    ``decreased``: above :data:`FIELD_TOL`. A decrease adds ``case`` (this algorithm's
    counterexample, relative to the check's folder), ``reproduces`` (its replay) and its
    ``explanation``.
    """

    file: str
    setting: str
    parameterization: str
    group_size: int
    iterations: int
    J: list[float]
    largest_decrease: float
    decreased: bool
    case: str | None = None
    reproduces: bool | None = None
    explanation: Explanation | None = None

    @property
    def on_flat_surrogate(self) -> bool:
        """As :attr:`SearchEntry.on_flat_surrogate`: a decrease the optimizer chose."""
        return _on_flat_surrogate(self.explanation)

    @property
    def counts(self) -> bool:
        """Whether this replay is evidence that the algorithm lowers ``J``: a decrease that replays and is not on a
        flat surrogate."""
        return self.decreased and self.reproduces is not False and not self.on_flat_surrogate

    def to_dict(self) -> dict[str, Any]:
        d = {"file": self.file, "setting": self.setting, "parameterization": self.parameterization,
             "group_size": self.group_size, "iterations": self.iterations, "J": self.J,
             "largest_decrease": self.largest_decrease, "decreased": self.decreased}
        if self.decreased:
            d |= {"case": self.case, "reproduces": self.reproduces,
                  "explanation": None if self.explanation is None else self.explanation.to_dict()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FieldReplay:
        e = d.get("explanation")
        return cls(**{k: v for k, v in d.items() if k != "explanation"},
                   explanation=None if e is None else Explanation.from_dict(e))


@dataclass(frozen=True)
class SearchEntry:
    """One monotonicity search of a check.

    ``search``, ``description``: the search; ``max_examples``: its planned cases; ``examples``:
    cases evaluated, shrinking not counted; ``moved``: cases in which the update moved ``J`` at all;
    ``seed``; ``found``: whether a case lowered ``J``; ``stopped``: why it ended before its plan
    (``""``: it did not, ``"budget"``, ``"interrupted"``); ``exhausted``: hypothesis had no more
    distinct cases before ``max_examples`` (the plan is complete); ``seconds``. A case found adds its ``file`` (relative to the
    check's folder), ``J`` per iteration, ``largest_decrease``, ``group_size``, ``turns``,
    ``setting`` and ``parameterization``; and, unless the search was interrupted, ``reproduces``
    (its replay) and its ``explanation``.
    """

    search: str
    description: str
    max_examples: int
    examples: int
    moved: int
    seed: int
    found: bool
    stopped: str
    seconds: float
    exhausted: bool = False
    file: str | None = None
    J: list[float] | None = None
    largest_decrease: float | None = None
    group_size: int | None = None
    turns: int | None = None
    setting: str | None = None
    parameterization: str | None = None
    reproduces: bool | None = None
    explanation: Explanation | None = None

    @property
    def on_flat_surrogate(self) -> bool:
        """Whether the case lowered ``J`` on a flat surrogate (its explanation's cause): a decrease the optimizer
        chose, reported apart from the algorithm's own (:data:`seeupo.experiments.explain.FLAT_SIGNAL`)."""
        return _on_flat_surrogate(self.explanation)

    @property
    def counts(self) -> bool:
        """Whether the case is evidence that the algorithm lowers ``J``: found, not refuted by its replay (a case
        found when interrupted is not replayed yet, and counts), and not on a flat surrogate."""
        return self.found and self.reproduces is not False and not self.on_flat_surrogate

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"search": self.search, "description": self.description, "max_examples": self.max_examples,
                             "examples": self.examples, "moved": self.moved, "seed": self.seed, "found": self.found,
                             "stopped": self.stopped} | ({"exhausted": True} if self.exhausted else {})
        if self.found:
            d |= {"file": self.file, "J": self.J, "largest_decrease": self.largest_decrease, "group_size": self.group_size,
                  "turns": self.turns, "setting": self.setting, "parameterization": self.parameterization}
            if self.reproduces is not None:
                d |= {"reproduces": self.reproduces,
                      "explanation": None if self.explanation is None else self.explanation.to_dict()}
        return d | {"seconds": self.seconds}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SearchEntry:
        e = d.get("explanation")
        return cls(**{k: v for k, v in d.items() if k != "explanation"},
                   explanation=None if e is None else Explanation.from_dict(e))


@dataclass(frozen=True)
class Warmup:
    """The bridge's format warm-up: the target probability of a valid first answer (``threshold``), the cap on
    its steps (``max_steps``), its ``lr``; the lowest ``p_valid`` and the most ``steps`` over ``seeds`` (one dict
    per seed: ``seed``, ``steps``, ``p_valid``, ``loglik``)."""

    threshold: float
    max_steps: int
    lr: float
    p_valid: float
    steps: int
    seeds: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "max_steps": self.max_steps, "lr": self.lr, "p_valid": self.p_valid,
                "steps": self.steps, "seeds": self.seeds}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Warmup:
        return cls(**d)


@dataclass(frozen=True)
class Learning:
    """What one algorithm's bridge runs did to the exact ``J`` (:func:`seeupo.experiments.check.verdict.learning`):
    the means over seeds of the first and last ``J`` and of the change, the change per seed, ``moved``
    (``raised``, ``lowered``, ``unchanged``) and the same in ``words``."""

    J_initial_mean: float
    J_final_mean: float
    change_mean: float
    change_per_seed: list[float]
    moved: str
    words: str

    def to_dict(self) -> dict[str, Any]:
        return {"J_initial_mean": self.J_initial_mean, "J_final_mean": self.J_final_mean, "change_mean": self.change_mean,
                "change_per_seed": self.change_per_seed, "moved": self.moved, "words": self.words}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Learning:
        return cls(**d)


@dataclass(frozen=True)
class BridgeResult:
    """The bridge part of a check (:func:`seeupo.experiments.check.run.run_bridge`).

    ``skipped``: why it did not run (then every other field is ``None``). Else: ``algorithm`` (the
    checked one); ``baselines_run`` (the others trained); ``tolerance``
    (:data:`seeupo.experiments.check.verdict.BRIDGE_TOLERANCE`); ``warmup``; ``learning`` per
    algorithm trained (empty when the warm-up failed: nothing trained); ``vacuous``: ``None``, or
    why the bridge is no evidence; ``summary``: one sentence on ``algorithm`` beside the
    baselines; ``settings``, ``row`` and ``runs`` (``algorithm``'s table row and per-seed runs) and
    ``baselines`` (``{preset: {"row", "runs"}}``): :func:`seeupo.experiments.bridge_lm.build_tables`'s
    JSON, ``None``/empty when nothing was trained; ``seconds``.
    """

    skipped: str | None = None
    algorithm: str | None = None
    baselines_run: list[str] | None = None
    tolerance: float | None = None
    warmup: Warmup | None = None
    learning: dict[str, Learning] | None = None
    vacuous: str | None = None
    summary: str | None = None
    settings: dict[str, Any] | None = None
    row: dict[str, Any] | None = None
    runs: list[dict[str, Any]] | None = None
    baselines: dict[str, dict[str, Any]] | None = None
    seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.skipped is not None:
            return {"skipped": self.skipped}
        assert self.warmup is not None and self.learning is not None
        return {"algorithm": self.algorithm, "baselines_run": self.baselines_run, "tolerance": self.tolerance,
                "warmup": self.warmup.to_dict(), "learning": {p: w.to_dict() for p, w in self.learning.items()},
                "vacuous": self.vacuous, "summary": self.summary, "settings": self.settings, "row": self.row,
                "runs": self.runs, "baselines": self.baselines, "seconds": self.seconds}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BridgeResult:
        if "skipped" in d:
            return cls(skipped=d["skipped"])
        return cls(**d | {"warmup": Warmup.from_dict(d["warmup"]),
                          "learning": {p: Learning.from_dict(w) for p, w in d["learning"].items()}})


@dataclass(frozen=True)
class CheckReport:
    """What ``seeupo check NAME`` measured: ``check.json``.

    ``algorithm``; ``out``: the folder its files' paths start from; ``config``: the preset's
    settings; ``plugins`` (with their hashes); ``budget``: the :class:`CheckBudget` as run, with the
    ``seed`` (JSON); ``plan``: the estimate (``None``: stopped before it); ``exact_mode`` and
    ``exact_refused`` (why not, or ``None``); ``monotonicity``; ``committed_counterexamples``: in
    words, which were consulted; ``gradient``: the gradient part (JSON, ``{"skipped": why}`` when
    not run); ``verify``: the verify report (JSON); ``table_row``: ``advantage``, ``update``,
    ``level``; ``searches``; ``bridge``; ``partial``: the signal that stopped the check, or ``None``;
    ``moved_aside``: an earlier check's files moved by ``--overwrite``; ``field``: the field's committed
    counterexamples replayed with the algorithm's own update (:mod:`~seeupo.experiments.check.field`); ``files_in``: the folder the
    files' paths start from when the report is written elsewhere (``compare``), else ``None``;
    ``times``: seconds per part; ``seconds``: in all.
    """

    algorithm: str
    out: str
    config: dict[str, Any]
    plugins: list[str]
    budget: dict[str, Any]
    plan: Plan | None
    exact_mode: bool
    exact_refused: str | None
    monotonicity: MonotonicityVerdict
    committed_counterexamples: str
    gradient: dict[str, Any]
    verify: dict[str, Any]
    table_row: dict[str, str]
    searches: list[SearchEntry]
    bridge: BridgeResult
    partial: str | None
    moved_aside: list[str]
    files_in: str | None
    times: dict[str, float]
    seconds: float
    field: list[FieldReplay] = dataclasses.field(default_factory=list)

    def exit_status(self, fail_on_decrease: bool) -> tuple[int, str | None]:
        """``seeupo check``'s exit status and the line to print on stderr, if any (:func:`exit_status`)."""
        return exit_status(self.partial, self.bridge, self.monotonicity, fail_on_decrease)

    def to_dict(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "out": self.out, "config": self.config, "plugins": self.plugins,
                "budget": self.budget, "plan": {} if self.plan is None else self.plan.to_dict(),
                "exact_mode": self.exact_mode, "exact_refused": self.exact_refused,
                "monotonicity": self.monotonicity.to_dict(), "committed_counterexamples": self.committed_counterexamples,
                # a report of before the field part has none (kept as written)
                **({"field": [f.to_dict() for f in self.field]} if self.field else {}),
                "gradient": self.gradient, "verify": self.verify, "table_row": self.table_row,
                "searches": [s.to_dict() for s in self.searches], "bridge": self.bridge.to_dict(), "partial": self.partial,
                "moved_aside": self.moved_aside, "files_in": self.files_in, "times": self.times, "seconds": self.seconds}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CheckReport:
        return cls(**d | {"plan": Plan.from_dict(d["plan"]) if d["plan"] else None,
                          "monotonicity": MonotonicityVerdict.from_dict(d["monotonicity"]),
                          "searches": [SearchEntry.from_dict(s) for s in d["searches"]],
                          "field": [FieldReplay.from_dict(f) for f in d.get("field", [])],
                          "bridge": BridgeResult.from_dict(d["bridge"])})


@dataclass(frozen=True)
class ComparePlan:
    """The estimate of a comparison: each algorithm's :class:`Plan`, their ``total`` and the ``budget`` for all."""

    per_algorithm: dict[str, Plan]
    total: float
    budget: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"per_algorithm": {n: p.to_dict() for n, p in self.per_algorithm.items()}, "total": self.total,
                "budget": self.budget}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ComparePlan:
        return cls({n: Plan.from_dict(p) for n, p in d["per_algorithm"].items()}, d["total"], d["budget"])


@dataclass(frozen=True)
class CompareReport:
    """What ``seeupo check NAME --compare A,B`` measured: the comparison's ``check.json``.

    ``compare``: the names, the checked one first; ``algorithms``: each one's report, in order, those
    reached; ``not_reached``; ``bridge``: the one bridge of all (the first algorithm's); ``budget``:
    the sizes all ran (JSON, with ``seed`` and ``seconds_in_all``); ``plan``; ``plugins``; ``out``;
    ``partial``; ``moved_aside``; ``seconds``.
    """

    compare: list[str]
    algorithms: dict[str, CheckReport]
    not_reached: list[str]
    bridge: BridgeResult
    budget: dict[str, Any]
    plan: ComparePlan
    plugins: list[str]
    out: str
    partial: str | None
    moved_aside: list[str]
    seconds: float

    def exit_status(self, fail_on_decrease: bool) -> tuple[int, str | None]:
        """As :meth:`CheckReport.exit_status`, with the verdict of the first (the checked) algorithm."""
        checked = self.algorithms.get(self.compare[0])
        return exit_status(self.partial, self.bridge, checked and checked.monotonicity, fail_on_decrease)

    def to_dict(self) -> dict[str, Any]:
        return {"compare": self.compare, "algorithms": {n: r.to_dict() for n, r in self.algorithms.items()},
                "not_reached": self.not_reached, "bridge": self.bridge.to_dict(), "budget": self.budget,
                "plan": self.plan.to_dict(), "plugins": self.plugins, "out": self.out, "partial": self.partial,
                "moved_aside": self.moved_aside, "seconds": self.seconds}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompareReport:
        return cls(**d | {"algorithms": {n: CheckReport.from_dict(r) for n, r in d["algorithms"].items()},
                          "bridge": BridgeResult.from_dict(d["bridge"]), "plan": ComparePlan.from_dict(d["plan"])})


def exit_status(partial: str | None, bridge: BridgeResult, verdict: MonotonicityVerdict | None,
                fail_on_decrease: bool) -> tuple[int, str | None]:
    """``seeupo check``'s exit status and the line it prints on stderr (``None``: nothing to say).

    128 + N when signal N stopped the check (as the shell reports it); 1 when the evidence is
    empty or incomplete (``inconclusive``, a vacuous bridge, ``no learning signal``) or, with
    ``fail_on_decrease``, when ``J`` decreased; else 0. A check its budget stopped is judged by
    its verdict: one that found a decrease is as complete as it needs to be. ``verdict``: the checked algorithm's (``None`` only when stopped first).
    """
    measured = verdict.measured if verdict else None
    if partial and partial != BUDGET:
        return 128 + int(getattr(signal, partial, signal.SIGINT)), None
    if measured == INCONCLUSIVE or (partial and measured != DECREASED):  # a plan cut short is no pass either
        return 1, (f"{INCONCLUSIVE}: " + (verdict.evidence[0] if verdict else "nothing measured")
                   + (" (stopped by its --budget)" if partial else ""))
    if bridge.vacuous:  # a bridge that could not learn is no evidence: say so in the exit status
        return 1, f"the bridge is vacuous: {bridge.vacuous}"
    if measured == NO_SIGNAL:  # a check that measured nothing is no pass either
        return 1, None
    if fail_on_decrease and measured == DECREASED:
        return 1, f"{DECREASED} (--fail-on-decrease)"
    return 0, None
