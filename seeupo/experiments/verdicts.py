"""The verdict vocabulary shared by ``seeupo verify`` (Table 1), ``seeupo check``, ``seeupo search`` and ``seeupo claims``.

Every verdict has three parts, each from a small fixed set defined here and nowhere else:

* **paper** — what the paper (or, for the toolkit's own lemmas, the toolkit) says: one of
  :data:`PAPER` for a Table 1 cell; the claim's statement for a registered claim.
* **measured** — what the toolkit measured, one of :data:`MEASURED`.
* **agreement** — whether the two agree, one of :data:`AGREEMENT`. ``partly`` always comes
  with a ``condition`` that names where the statement holds and where it does not.

The rules that turn a Table 1 measurement into an agreement are :func:`table1_verdict`, used
by both :mod:`seeupo.experiments.verify` and :mod:`seeupo.experiments.claims`, so that Table
1 and the claims report tell the same story: a saved counterexample that replays counts as
a measurement ("J decreased") even when the random instances of a cell all converged.

No verdict is cleaner than its evidence: a run in which the update never moved ``J`` (the
advantages all zero or not finite, or ``J`` constant to :data:`SIGNAL_TOL` on every instance)
measured :data:`NO_SIGNAL`, never ``converges`` or ``monotone``. Exact mode may also be refused
for an estimator (:data:`REFUSED`, with the reason), and the language-model bridge of ``check``
may be :data:`VACUOUS` (its warm-up failed, so its steps measure nothing). The phrases a person
reads for the same thing are the constants below (:data:`NO_DECREASE_FOUND`, ...), so that
``search``, ``check`` and ``verify`` say the same words.

Sampled mode: ``J`` is still computed exactly, but each update is estimated from ``B x G``
rollouts, so ``J`` can fall by sampling noise. A sampled cell is judged on its final gap only
(``reaches J*`` / ``gap remains``); its decreases of ``J`` are reported next to it as noise,
never as a violation of a monotonicity claim (those are about exact updates).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: What the paper's Table 1 says about a cell (``None`` in code, "—" in reports: no claim).
PAPER: dict[str, str] = {
    "converges": "monotonic improvement and convergence to the global optimum J*",
    "no guarantee": "the paper gives no convergence guarantee",
}

NO_SIGNAL = "no learning signal"
REFUSED = "exact: refused"
VACUOUS = "vacuous"
SIGNAL_TOL = 1e-12  # J moving less than this on every instance, every iteration, is no movement

#: What a search that found nothing says, in every report and on the terminal.
NO_DECREASE_FOUND = "no J decrease found"
#: A search whose cases never moved J: it searched nothing.
SEARCH_NO_SIGNAL = "no learning signal: no case moved J"

#: What the toolkit measured. The first five are exact-mode outcomes (``J`` computed and the
#: update taken exactly); the next three are sampled-mode outcomes (``no learning signal`` is
#: both); ``monotone`` is the searches' outcome; the last two are for statements checked
#: symbolically or by exact construction (the toolkit's lemmas).
MEASURED: dict[str, str] = {
    "converges": "J never decreased and every instance ended within gap_tol of J*",
    "J decreased": "an exact update lowered J (on a random instance, or in a saved counterexample that replays)",
    "monotone, stuck below J*": "J never decreased, but some instance stopped improving short of J*",
    "monotone, still improving": "J never decreased; some instance is short of J* and still closing the gap (inconclusive)",
    NO_SIGNAL: "the update never moved J (advantages all zero or not finite, or J constant to 1e-12 on every "
               "instance): nothing was measured, neither monotonicity nor convergence",
    "reaches J*": "sampled mode: every instance ended within gap_tol of J* (J decreases are sampling noise)",
    "gap remains": "sampled mode: some instance ended short of J* (J decreases are sampling noise)",
    "monotone": "no exact update lowered J in the cases tried (single steps from random policies: convergence not measured)",
    "proved": "the statement was proved (sympy) or verified by exact construction",
    "disproved": "the symbolic or exact check of the statement failed",
}

#: Whether the statement and the measurement agree.
AGREEMENT: dict[str, str] = {
    "agrees": "the measurement supports the statement",
    "disagrees": "the measurement contradicts the statement under its own assumptions",
    "partly": "the statement holds under the named condition only (the condition is always given)",
    "inconclusive": "the measurement neither supports nor contradicts the statement (e.g. no counterexample found "
                    "to a 'no guarantee', or a run still improving)",
    "no claim": "nothing is claimed (an ablation, or a measurement of a reference-code defect)",
    "not run": "Table 1 only: the exact, independent-parameter cell was not part of this run",
}

EXACT_MEASURED = ("converges", "J decreased", "monotone, stuck below J*", "monotone, still improving", NO_SIGNAL)
SAMPLED_MEASURED = ("reaches J*", "gap remains", NO_SIGNAL)

#: Words for a cell that did not run as asked, shown where its verdict would be (not measurements).
NOT_MEASURED: dict[str, str] = {
    REFUSED: "exact mode refused the estimator (the reason follows in parentheses); its sampled cells still run",
    VACUOUS: "the language-model bridge measured nothing: its warm-up did not make valid answers likely",
}

#: The registered searches whose counterexamples bear on each Table 1 cell (row, setting):
#: searches of that row's algorithm as the preset defines it. Controls (a variant with another
#: advantage estimator) are not listed: they are not counterexamples to the row.
TABLE1_SEARCHES: dict[tuple[str, str], tuple[str, ...]] = {
    ("grpo", "ST"): ("grpo_st_stochastic",),
    ("grpo", "MT"): ("grpo_mt_bandit", "grpo_mt_stochastic"),
    ("reinforce_pp", "MT"): ("reinforce_pp_mt_stochastic",),
    ("rloo", "MT"): ("rloo_mt_small_step", "rloo_mt_large_step"),
    ("gspo", "ST"): ("gspo_st_stochastic", "gspo_st_stochastic_tokens"),
    ("gspo", "MT"): ("gspo_mt_token",),
    ("seeupo", "MT"): ("seeupo_mt_stochastic",),
}

#: Table 1 cells and the claim of the registry that checks each (seeupo.experiments.claims).
TABLE1_CLAIMS: dict[tuple[str, str], str] = {
    ("ppo", "ST"): "T1-PPO-ST", ("ppo", "MT"): "T1-PPO-MT",
    ("grpo", "ST"): "T1-GRPO-ST", ("grpo", "MT"): "T1-GRPO-MT",
    ("rloo", "ST"): "T1-RLOO-ST", ("rloo", "MT"): "T1-RLOO-MT",
    ("gspo", "ST"): "T1-GSPO-ST", ("gspo", "MT"): "T1-GSPO-MT",
    ("seeupo", "MT"): "T1-SeeUPO-MT",
}


@dataclass
class Verdict:
    """A verdict: what was measured, whether it agrees with the statement, and the evidence.

    ``condition`` is required for ``partly`` and may qualify any other agreement.
    """

    measured: str
    agreement: str
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    condition: str = ""

    def __post_init__(self) -> None:
        check(self.measured, self.agreement, self.condition)

    @property
    def status(self) -> str:
        """One line for a report: ``agreement (condition); measured: ...``."""
        return label(self.agreement, self.measured, self.condition)


def check(measured: str, agreement: str, condition: str = "") -> None:
    """Raise ``ValueError`` unless the parts are from the vocabulary (and ``partly`` names its condition)."""
    if measured not in MEASURED:
        raise ValueError(f"measured {measured!r} is not one of {list(MEASURED)}")
    if agreement not in AGREEMENT:
        raise ValueError(f"agreement {agreement!r} is not one of {list(AGREEMENT)}")
    if agreement == "partly" and not condition.strip():
        raise ValueError("a 'partly' verdict must name its condition")


def label(agreement: str, measured: str, condition: str = "") -> str:
    return f"{agreement}{f' ({condition})' if condition else ''}; measured: {measured}"


def search_outcome(entry: dict[str, Any]) -> str:
    """A search's outcome in words, the same in ``seeupo search``, ``seeupo check`` and their reports.

    ``entry``: ``found``, ``examples`` (cases tried), and where known ``J`` (of the case found),
    ``moved`` (cases in which ``J`` moved at all) and ``stopped`` (why it ended early).
    """
    stopped = entry.get("stopped") or ""
    if entry["found"]:
        text = f"J decreased: {entry['J'][0]:.6f} -> {entry['J'][-1]:.6f}"
        if (entry.get("explanation") or {}).get("cause") == "flat surrogate":
            text += " on a flat surrogate (the optimizer's choice, not counted against the algorithm)"
        return text + (f" (stopped: {stopped}; the case is not shrunk to the end)" if stopped else "")
    words = SEARCH_NO_SIGNAL if entry.get("moved") == 0 and entry["examples"] else NO_DECREASE_FOUND
    return f"{words} in {entry['examples']} cases" + (f" (stopped: {stopped})" if stopped else "")


def refused_label(reason: str) -> str:
    """How every report shows a refused exact mode: ``exact: refused (REASON)``."""
    return f"{REFUSED} ({reason})"


def no_signal(J: Any, tol: float = SIGNAL_TOL) -> bool:
    """``J`` (``[iterations + 1, instances]``) never moved: not finite, or constant to ``tol`` on every instance.

    Zero advantages, NaN advantages (Adam skips nothing: the parameters do not move, or turn NaN)
    and a loss without gradient all end here; so does a start already at the optimum on every
    instance, which measures nothing either.
    """
    import torch

    J = torch.as_tensor(J, dtype=torch.float64)
    if not bool(torch.isfinite(J).all()):
        return True
    return bool(((J - J[:1]).abs() <= tol).all())


def exact_outcome(decreases: int, reached: bool, stalled: bool, moved: bool = True) -> str:
    """The exact-mode measurement of a run (one of :data:`EXACT_MEASURED`)."""
    if not moved:
        return NO_SIGNAL
    if decreases:
        return "J decreased"
    if reached:
        return "converges"
    return "monotone, stuck below J*" if stalled else "monotone, still improving"


GAP_TOL = 1e-3  # "reached J*"
STALL_RATIO = 0.05  # an instance whose gap fell by less than this fraction over the last third of a run has stalled
TOL = 1e-7  # a decrease of J larger than this is a decrease


def history_outcome(hist: Any, mode: str, *, tol: float = TOL, gap_tol: float = GAP_TOL,
                    stall_ratio: float = STALL_RATIO) -> dict[str, Any]:
    """What a run (a :class:`seeupo.tabular.train.History`) measured: a :data:`MEASURED` value and its numbers."""
    viol = hist.violations(tol)
    gap = hist.gap[-1]
    iterations = hist.J.shape[0] - 1
    decreases, largest = int((viol > 0).sum()), float(viol.max()) if viol.numel() else 0.0
    reached = bool((gap <= gap_tol).all())
    moved = not no_signal(hist.J)
    if mode == "exact":
        earlier = hist.gap[-1 - max(1, iterations // 3)]
        stalled = bool(((gap > gap_tol) & (earlier - gap < stall_ratio * earlier)).any())
        measured, note = exact_outcome(decreases, reached, stalled, moved), ""
    elif not moved:
        measured, note = NO_SIGNAL, ""
    else:
        measured, note = ("reaches J*" if reached else "gap remains"), sampled_note(decreases, largest)
    return {"measured": measured, "note": note, "J_decreases": decreases, "largest_decrease": largest,
            "max_final_gap": float(gap.max()), "mean_final_gap": float(gap.mean()),
            "mean_initial_gap": float(hist.gap[0].mean()), "iterations": iterations}


def sampled_note(decreases: int, largest: float) -> str:
    """What a sampled cell's decreases of ``J`` are: noise, with their count and size."""
    return f"noisy: {decreases} J decreases, largest {largest:.1e}" if decreases else "noisy: no J decrease"


def table1_verdict(paper: str | None, cell_measured: str, counterexamples: list[str]) -> tuple[str, str]:
    """``(measured, agreement)`` of a Table 1 cell.

    ``cell_measured`` is the exact, independent-parameter cell's outcome on random instances;
    ``counterexamples`` names the saved counterexamples of the cell's algorithm that replay.
    A counterexample is a measurement: the cell then measured ``J decreased``.
    """
    measured = "J decreased" if counterexamples else cell_measured
    if measured not in EXACT_MEASURED:
        raise ValueError(f"a Table 1 cell is measured in exact mode, got {measured!r}")
    if paper is None:
        return measured, "no claim"
    if measured == NO_SIGNAL:
        return measured, "inconclusive"
    if paper == "converges":
        if measured == "converges":
            return measured, "agrees"
        return measured, "inconclusive" if measured == "monotone, still improving" else "disagrees"
    if paper == "no guarantee":
        return measured, "agrees" if measured == "J decreased" else "inconclusive"
    raise ValueError(f"unknown paper claim {paper!r}; expected one of {list(PAPER)}")


def resolve_dir(path: str | Path) -> Path:
    """``path`` relative to the working directory if it exists there, else to the repository root."""
    path = Path(path)
    if path.is_absolute() or path.exists():
        return path
    root = Path(__file__).resolve().parents[2] / path
    return root if root.exists() else path


def saved_counterexamples(names: tuple[str, ...] | list[str], directory: str | Path) -> list[dict[str, Any]]:
    """Replay the saved counterexample file of each search in ``names`` that has one, in ``directory``."""
    from seeupo.experiments.counterexamples import Counterexample, replay

    out = []
    base = resolve_dir(directory)
    for name in names:
        path = base / f"{name}.json"
        if not path.exists():
            continue
        example = Counterexample.load(path)
        result = replay(example)
        out.append({"search": name, "file": str(Path(directory) / f"{name}.json"), "claim": example.claim,
                    "reproduces": bool(result.reproduces), "J": list(result.recomputed),
                    "largest_decrease": float(example.largest_decrease)})
    return out
