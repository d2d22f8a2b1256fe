"""The verdicts of ``seeupo check``: what its measurements say, in the vocabulary of :mod:`seeupo.experiments.verdicts`.

The verdict on monotonicity (:func:`monotonicity`) says what was measured, not that the algorithm
is monotone: a search that finds nothing bounds nothing beyond its cases. On the bridge,
:func:`learning` says what each algorithm did to the exact ``J``.
"""

from __future__ import annotations

import math
from typing import Any

from seeupo.experiments.check.planning import Plan
from seeupo.experiments.check.report import (DECREASED, INCONCLUSIVE, FieldReplay, Learning, MonotonicityVerdict,
                                             SearchEntry)
from seeupo.experiments.verdicts import NO_DECREASE_FOUND, NO_SIGNAL

#: The toolkit's committed counterexamples and the committed checks of published algorithms, consulted by every check.
COMMITTED_COUNTEREXAMPLES = "paper_repro/counterexamples"
COMMITTED_CHECKS = "paper_repro/algorithms"
#: A mean change of the exact ``J`` over the bridge's steps smaller than this leaves ``J`` where it
#: was. ``J`` is exact up to float32 scoring (~1e-6), and an update without signal (an estimator
#: of zeros) moves it by exactly 0; the built-ins raise it by >= 0.16 in the quick setting, so
#: 0.01 separates "learns" from "does not" with an order of magnitude to spare on each side.
BRIDGE_TOLERANCE = 0.01


def learning(runs: list[dict[str, Any]], tolerance: float = BRIDGE_TOLERANCE) -> Learning:
    """What one algorithm's bridge runs did to the exact ``J``: ``raised``, ``lowered`` or ``unchanged``.

    ``runs``: one dict per seed with ``J_initial`` and ``J_final``. The change is ``J_final -
    J_initial`` per seed, averaged over seeds; within ``tolerance`` of 0 ``J`` was left where it
    was (:data:`BRIDGE_TOLERANCE` says why 0.01).
    """
    changes = [r["J_final"] - r["J_initial"] for r in runs]
    j0 = sum(r["J_initial"] for r in runs) / len(runs)
    j1 = sum(r["J_final"] for r in runs) / len(runs)
    change = j1 - j0
    per_seed = ", ".join(f"{c:+.4f}" for c in changes)
    if abs(change) < tolerance:
        moved, words = "unchanged", (f"left J where it was: {j0:.4f} -> {j1:.4f} (change {change:+.4f}, within "
                                     f"{tolerance:g}; per seed {per_seed})")
    else:
        moved = "raised" if change > 0 else "lowered"
        words = f"{moved} J from {j0:.4f} to {j1:.4f} (change {change:+.4f}; per seed {per_seed})"
    return Learning(J_initial_mean=j0, J_final_mean=j1, change_mean=change, change_per_seed=changes, moved=moved,
                    words=words)


def committed_counterexamples(name: str) -> tuple[tuple[str, ...], str]:
    """The committed counterexample folders ``check name`` consults, built-in or a plugin's algorithm: the
    toolkit's own and every committed check's (each file recorded with ``name`` is replayed with its own
    recorded settings, by verify), and the words for the report. A file recorded with a plugin whose
    content differs from the one loaded now is listed as skipped, with the reason."""
    from seeupo.experiments.verdicts import resolve_dir

    folder = resolve_dir(COMMITTED_COUNTEREXAMPLES)
    if not folder.is_dir():
        return (), (f"not consulted: `{COMMITTED_COUNTEREXAMPLES}` is not here (an installed package without the "
                    "repository)")
    checks = resolve_dir(COMMITTED_CHECKS)
    folders = (str(folder), *(str(p) for p in sorted(checks.iterdir()) if (p / "counterexamples").is_dir())) \
        if checks.is_dir() else (str(folder),)
    return folders, (f"consulted: `{COMMITTED_COUNTEREXAMPLES}` and `{COMMITTED_CHECKS}/*/counterexamples` (each file "
                     f"recorded with {name} replayed with its recorded settings)")


def unfinished_parts(estimate: Plan, gradient_sets: int, gradient: dict[str, Any], verify_report: dict[str, Any],
                     searches: list[SearchEntry], partial: str | None) -> list[str]:
    """What of ``estimate``'s plan did not finish, one phrase per part (``[]``: the whole plan ran).

    ``gradient_sets``: the gradient part's planned problem sets (families x numbers of turns; 0 without it).

    A search finished when it ran its planned cases, found a case, or exhausted hypothesis's
    distinct cases (``stopped == ""``); its cases count in full then, else those it evaluated.
    """
    parts = []
    if gradient_sets and ("skipped" in gradient or not gradient.get("complete", False)):
        parts.append(f"{len(gradient.get('families', []))} of {gradient_sets} gradient problem sets")
    cells = [c for c in verify_report.get("cells", []) if not c.get("refused")]
    refused = len(verify_report.get("cells", [])) - len(cells)
    if verify_report.get("partial") or len(cells) + refused < estimate.cells:
        parts.append(f"{len(cells) + refused} of {estimate.cells} verify cells")
    if estimate.searches:
        planned = estimate.searches * estimate.max_examples
        done = sum(s.max_examples if not s.stopped else s.examples for s in searches)
        if len(searches) < estimate.searches or any(s.stopped for s in searches):
            parts.append(f"{done:,} of {planned:,} search cases")
    if partial and estimate.bridge_runs and not parts:
        parts.append("the bridge")
    return parts


def monotonicity(verify_report: dict[str, Any], searches: list[SearchEntry],
                 unfinished: list[str] | None = None, field: list[FieldReplay] | None = None) -> MonotonicityVerdict:
    """The verdict on exact monotonicity, with its evidence.

    ``J decreased`` (a replaying counterexample, found now or committed, a field's committed
    counterexample on which the algorithm's own update lowers ``J``, or a decrease on a random
    instance) over ``inconclusive`` (``unfinished``, :func:`unfinished_parts`, names parts of the
    plan that did not finish: no verdict beyond what they found) over ``no learning signal`` (no
    exact cell and no search ever moved ``J``: nothing was measured) over ``monotone`` (with the
    plan that found nothing; parts that moved nothing are named in its evidence, never counted as
    evidence). Nothing finished (a check stopped first): ``measured`` is ``None``, no verdict.
    ``verify_report``: the verify part's report (JSON).
    """
    exact = [c for c in verify_report["cells"] if c["mode"] == "exact" and not c.get("refused")]
    decreased_cells = [c for c in exact if c["violations"] > 0]
    flat = [s for s in searches if s.found and s.reproduces is not False and s.on_flat_surrogate]
    found = [s for s in searches if s.counts]
    apart = ([f"not counted: J fell on a flat surrogate in {', '.join(s.search for s in flat)} (no expected advantage "
              "above 1e-5 of the batch's scale: the optimizer chose the step, not the estimator; see the explanation)"]
             if flat else [])
    field = field or []
    lowered = [f for f in field if f.counts]
    flat_field = [f for f in field if f.decreased and f.on_flat_surrogate]
    if flat_field:
        apart.append(f"not counted: J fell on a flat surrogate in the field's {', '.join(f.file for f in flat_field)}")
    unfinite = [f for f in field if not all(math.isfinite(j) for j in f.J)]
    if unfinite:  # no decrease to count, but no clean verdict either
        apart.append(f"J stopped being finite with this algorithm's own update on the field's "
                     f"{', '.join(f.file for f in unfinite)}")
    own = {s.file for s in searches} | {f.case for f in field}  # the searches' and the field's cases are listed once
    committed = [e for e in verify_report.get("counterexamples", [])
                 if e.get("decreases") and e.get("mode", "exact") == "exact" and e["file"] not in own]
    if found or decreased_cells or committed or lowered:
        evidence = [f"{s.search}: J {s.J[0]:.6f} -> {s.J[-1]:.6f} (`{s.file}`, "
                    + ("replays" if s.reproduces else "found when interrupted, not replayed yet") + ")" for s in found]
        evidence += [f"the field's counterexample {f.file}, with this algorithm's own update: J {f.J[0]:.6f} -> "
                     f"{f.J[-1]:.6f} (`{f.case}`, replays)" for f in lowered]
        evidence += [f"random instances, {c['setting']} {c['parameterization']}: {c['violations']} decreases, "
                     f"largest {c['max_violation']:.2e}" for c in decreased_cells]
        evidence += [f"{e['search']} ({e['setting']}, {e['parameterization']} parameters): J {e['J'][0]:.6f} -> {e['J'][-1]:.6f} "
                     f"(`{e['file']}`, a saved counterexample that replays)" for e in committed]
        return MonotonicityVerdict(DECREASED, evidence + apart)
    searched = [s for s in searches if s.examples]
    if not exact and not searched:
        return MonotonicityVerdict(None, ["nothing finished before the check was stopped: no exact cell and no search, "
                                          "so no verdict on monotonicity"])
    if unfinished:
        measured = (", ".join(unfinished[:-1]) + " and " if len(unfinished) > 1 else "") + unfinished[-1]
        return MonotonicityVerdict(INCONCLUSIVE, [
            f"{measured} measured: the plan did not finish, and what finished found no decrease "
            f"({sum(s.examples for s in searched):,} search cases, "
            f"{sum(c['instances'] * c['iterations'] for c in exact):,} exact updates on random instances)"] + apart)
    silent_cells = [c for c in exact if c["verdict"] == NO_SIGNAL]
    silent_searches = [s for s in searched if s.moved == 0]
    silence = (f"the update never moved J in {len(silent_cells)} of {len(exact)} exact cells"
               + (" (" + ", ".join(f"{c['setting']} {c['parameterization']}" for c in silent_cells) + ")" if silent_cells else "")
               + f" and in every case of {len(silent_searches)} of {len(searched)} searches")
    if len(silent_cells) == len(exact) and len(silent_searches) == len(searched):
        return MonotonicityVerdict(NO_SIGNAL, [silence + ": the advantages are zero or not finite, or the loss has no "
                                               "gradient; no verdict on monotonicity or convergence"])
    moved_cells, moved_searches = len(exact) - len(silent_cells), [s for s in searched if s not in silent_searches]
    cases = sum(s.examples for s in moved_searches)
    updates = sum(c["instances"] * c["iterations"] for c in exact if c["verdict"] != NO_SIGNAL)
    evidence = [f"{NO_DECREASE_FOUND} in {len(moved_searches)} searches ({cases} cases in all) and in {updates} exact updates on "
                f"random instances ({moved_cells} cells)"]
    if silent_cells or silent_searches:
        evidence.append(silence + ": those measured nothing and count for nothing here")
    return MonotonicityVerdict("monotone", evidence + apart)
