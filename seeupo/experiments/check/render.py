"""The files of ``seeupo check``: ``check.md`` (a report to paste), ``check.json`` (everything measured) and
``check.png`` (exact ``J`` per iteration on the toy problems and per step on the bridge), and the
one line printed at the end; for one algorithm (:class:`CheckReport`) or a comparison (:class:`CompareReport`).

``--overwrite`` never deletes: an earlier check's files are moved into ``previous-<UTC time>/`` in
the same folder (:func:`prepare_output`), and the report lists them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from seeupo.experiments.check.report import INCONCLUSIVE, BridgeResult, CheckReport, CompareReport, Learning, SearchEntry
from seeupo.experiments.verdicts import refused_label, search_outcome
from seeupo.tabular.behaviour import Rollouts

#: What ``seeupo check`` writes in its folder (``--overwrite`` moves these aside, never deletes them).
OUTPUTS = ("check.json", "check.md", "check.png", "gradient", "counterexamples", "bridge", "algorithms")


def plural(n: int, noun: str) -> str:
    """``"1 seed"``, ``"3 seeds"``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def prepare_output(out: Path, overwrite: bool, say: Callable[[str], None] = print) -> list[str]:
    """Make ``out`` ready for a check; returns what an earlier check left there, as moved (``previous-*/NAME``).

    A folder that holds anything is refused unless ``overwrite``; then the earlier check's files
    (:data:`OUTPUTS`) are moved into ``out/previous-<UTC time>/``
    (:func:`~seeupo.validation.arguments.move_earlier_outputs_aside`): nothing is deleted (a
    counterexample may have cost minutes of search). Other files stay.
    """
    from seeupo.validation.arguments import move_earlier_outputs_aside
    from seeupo.validation.errors import InputError

    if not out.exists() or not any(out.iterdir()):
        return []
    if not overwrite:
        raise InputError(None, f"argument --out: {out} is not empty; choose another folder or pass --overwrite "
                               "(which moves the earlier check's files into previous-<time>/, deleting nothing)")
    return move_earlier_outputs_aside(out, OUTPUTS, True, "check", say)


def write(report: CheckReport | CompareReport, out: Path) -> None:
    """``report`` as ``check.json``, ``check.md`` and ``check.png`` in ``out``."""
    from seeupo.validation.files import dumps

    out.mkdir(parents=True, exist_ok=True)
    (out / "check.json").write_text(dumps(report.to_dict(), indent=1) + "\n")
    if isinstance(report, CompareReport):
        (out / "check.md").write_text(compare_markdown(report))
        compare_figure(report, out / "check.png")
    else:
        (out / "check.md").write_text(markdown(report))
        figure(report, out / "check.png")


def summary_line(report: CheckReport) -> str:
    """One line for the terminal and for tables of several algorithms."""
    mono = report.monotonicity
    prefix = f"{report.algorithm}" + (f" (partial: stopped by {report.partial})" if report.partial else "")
    gradient = gradient_headline(report.gradient)
    if mono.measured is None:  # refused or nothing finished: the reason first, the gradient words where measured
        return f"{prefix}: " + mono.evidence[0] + ("" if "skipped" in report.gradient else f"; {gradient}")
    if mono.measured == INCONCLUSIVE:  # how much of the plan ran comes first: that is the verdict
        return f"{prefix}: {mono.measured}: {mono.evidence[0]}; {gradient}" + "".join(f"; {e}" for e in mono.evidence[1:])
    return f"{prefix}: {mono.measured}; {gradient}; " + "; ".join(mono.evidence)


# ----------------------------------------------------------------------------------- one algorithm


def explanation_line(entry: SearchEntry) -> str:
    """The bullet of check.md that says why ``J`` fell in a search's counterexample (or why it is not explained)."""
    e = entry.explanation
    if e is None:
        return f"* `{entry.file}`: not explained (" + (
            "found when interrupted, not replayed)" if entry.reproduces is None else "no explanation recorded)")
    if e.error is not None:
        return f"* `{entry.file}`: no explanation: {e.error}."
    return f"* `{entry.file}`: {e.summary} Full explanation: `{e.file}`."


def _exact_cells(report: CheckReport) -> list[dict[str, Any]]:
    """The verify cells that ran in exact mode."""
    return [c for c in report.verify["cells"] if c["mode"] == "exact" and not c.get("refused")]


def _modes(report: CheckReport) -> str:
    modes = [m for m in ("exact", "sampled") if any(c["mode"] == m and not c.get("refused") for c in report.verify["cells"])]
    return " and ".join(modes) if modes else "none ran"


def markdown(report: CheckReport) -> str:
    """The report to paste: the verdict first, then the evidence of each part (one plugin line, one total time)."""
    from seeupo.experiments.verify import headline
    from seeupo.experiments.verify import markdown as verify_markdown

    name, mono = report.algorithm, report.monotonicity
    row = report.table_row
    title = f"# `seeupo check {name}`" + (f" (partial: stopped by {report.partial})" if report.partial else "")
    lines = [title, "",
             f"Advantage: {row['advantage']}; update: {row['update']}; level: {row['level']}.", ""]
    if report.plugins:
        lines += ["Plugins: " + ", ".join(f"`{p}`" for p in report.plugins), ""]
    rollouts = Rollouts.from_dict(report.budget.get("verify", {}).get("rollouts"))
    if not rollouts.on_policy:
        lines += [f"**Rows off policy**: {rollouts.words()}, in the field replays, the verify cells and the searches "
                  f"(rollout correction: `{report.config.get('correction', 'none')}`); the gradient part and the bridge "
                  "are measured on policy.", ""]
    if report.partial:
        lines += [f"**Partial report**: the check was stopped ({report.partial}) before it finished; below is what "
                  "finished, with every counterexample found so far.", ""]
    if report.moved_aside:
        lines += ["An earlier check's files were moved aside (--overwrite deletes nothing): "
                  + ", ".join(f"`{m}`" for m in report.moved_aside) + ".", ""]
    lines += ["## Verdict", "", f"Committed counterexamples: {report.committed_counterexamples}.", ""]
    lines += gradient_markdown(report.gradient, report.plugins, report.out) + [""]
    if mono.measured is None:
        lines += ["Exact monotonicity: not measured (" + mono.evidence[0] + ")."]
    else:
        lines += [f"Exact monotonicity, measured: **{mono.measured}**."] + [f"* {e}" for e in mono.evidence]
    # the verdict's evidence already lists the counterexamples and says the run was partial
    extra = [h for h in headline(report.verify) if not h.startswith(("**Partial", "**J decreased**"))]
    if extra:
        lines += [""] + extra
    exact_cells = _exact_cells(report)
    if exact_cells:
        def cell_words(c: dict[str, Any]) -> str:
            words = c["verdict"] + (f" (counterexample; random instances: {c['random_instances']})" if c.get("random_instances") else "")
            return f"{c['setting']} {c['parameterization']}: {words} (final gap max {c['max_final_gap']:.1e})"
        lines += ["", "Convergence on random problems (exact; ST and MT: token bandits; the others: agentic families, "
                  "described under the verify cells): " + "; ".join(cell_words(c) for c in exact_cells) + "."]
    lines += ["", *bridge_markdown(report.bridge)]
    field = field_markdown(report)
    lines += ["", *field] if field else []
    # a report of before the fixed plans (no field part) counted shrinking in its cases, and said so
    cases = "Cases evaluated (planned)" if report.field else "Cases evaluated, shrinking included (budget)"
    lines += ["", "## Searches (exact mode)", "", f"| Search | {cases} | Outcome | Replays |", "|---|---|---|---|"]
    for s in report.searches:
        replays = ({True: "yes", False: "no"}.get(s.reproduces, "not replayed (interrupted)")) if s.found else "—"
        lines.append(f"| {s.description} | {s.examples} ({s.max_examples}) | {search_outcome(s.to_dict())} | {replays} |")
    if not report.searches:
        why = ("not reached" if report.partial and report.exact_mode else
               "none: " + (refused_label(report.exact_refused) if report.exact_refused else "no exact mode"))
        lines.append(f"| ({why}) | | | |")
    plugin_flags = "".join(f" --plugin {p.split('@sha256:')[0]}" for p in report.plugins)
    found = [s for s in report.searches if s.found]
    if found:
        where = f"in `{report.files_in}`" if report.files_in else "in this folder"
        lines += ["", f"Counterexample files ({where}): " + ", ".join(f"`{s.file}`" for s in found) + ". Replay them: `seeupo replay "
                  + " ".join(f"{report.out}/{s.file}" for s in found) + plugin_flags + "`."]
        lines += ["", "Why J fell (`seeupo.experiments.explain`; the full explanation is written beside each file):", ""]
        lines += [explanation_line(s) for s in found]
    lines.append("")
    if report.verify["table1"]:
        body = verify_markdown(report.verify, embedded=True).split("\n", 1)[1]
        lines += [f"## Verify cells ({_modes(report)})", body]
    else:
        lines += ["## Verify cells", "", "Not finished (the check was stopped during them).", ""]
    parts = ", ".join(f"{k} {v:.0f} s" for k, v in report.times.items())
    planned = report.plan
    lines += [f"Total time: {report.seconds:.0f} s" + (f" ({parts})" if parts else "")
              + (f"; estimated {planned.total:.0f} s" if planned and planned.total else "")
              + (f"; budget {planned.budget:.0f} s" if planned and planned.budget else "") + ".", ""]
    return "\n".join(lines)


def field_markdown(report: CheckReport) -> list[str]:
    """The field part's lines of check.md: how many committed counterexamples lowered ``J`` with this algorithm's own
    update, each that did (with its cause), and every file replayed."""
    if not report.field:
        return []
    lowered = [f for f in report.field if f.decreased]
    lines = [f"## The field's committed counterexamples, with {report.algorithm}'s own update", "",
             f"{len(lowered)} of {len(report.field)} lowered J (its own exact update: the verify row's optimizer, step and "
             "epochs, the recorded group size, from the recorded start, for the recorded iterations)."]
    if lowered:
        lines += ["", "| Committed case | Setting | J | This algorithm's case | Replays | Cause |", "|---|---|---|---|---|---|"]
        for f in lowered:
            cause = (f.explanation.cause or f.explanation.error or "") if f.explanation else ""
            lines.append(f"| `{f.file}` | {f.setting}, {f.parameterization} | {f.J[0]:.6f} -> {f.J[-1]:.6f} | `{f.case}` | "
                         f"{'yes' if f.reproduces else 'no'} | {cause} |")
    lines += ["", "Replayed: " + ", ".join(f"`{f.file}`" for f in report.field) + "."]
    return lines


def gradient_headline(gradient: dict[str, Any]) -> str:
    """The gradient verdict in one line: the expected update and where plain ascent with it ends."""
    if "skipped" in gradient:
        return f"expected update: not measured ({gradient['skipped']})"
    worst = _worst_family(gradient)
    where = f"{worst['family']}, T={worst['turns']}"
    turn = worst["worst"].get("downhill_turn")
    detail = (f" at turn {turn} (cosine {worst['worst']['turn_cosines'][turn]:.3f}; {where})" if turn is not None
              else f" ({where}; whole cosine {_num(worst['worst']['cosine'])})" if gradient["direction"] != "unbiased" else "")
    words = f"expected update {gradient['direction']}{detail}"
    estimator = gradient.get("estimator_direction")
    if estimator and estimator != gradient["direction"]:  # the update's own parts bias it: say which
        causes = " and ".join(gradient.get("causes") or ["its parts"])
        words += f" (the estimator alone: {estimator}; the difference is the {causes}'s)"
    if gradient.get("fixed_point"):
        words += f"; plain exact ascent with it {gradient['fixed_point']}"
    return words


def _num(x: float | None) -> str:
    return "undefined" if x is None else f"{x:.3f}"


def _worst_family(gradient: dict[str, Any]) -> dict[str, Any]:
    """The family entry whose case decided the gradient verdict (the lowest cosine among the worst verdict's)."""
    judged = [f for f in gradient["families"] if f["verdict"] == gradient["direction"]]
    return min(judged, key=lambda f: f["worst"]["cosine"] if f["worst"]["cosine"] is not None else 1.0)


def gradient_markdown(gradient: dict[str, Any], plugins: list[str], out: str) -> list[str]:
    """The gradient verdict's lines of check.md: the headline, then one row per family and number of turns.

    ``gradient``: the gradient part's report (:func:`seeupo.experiments.gradient_check.run_gradient`).
    """
    from seeupo.tabular.gradient import DIRECTIONS

    if "skipped" in gradient:
        return [f"Gradient verdict (agentic problems): not measured ({gradient['skipped']})."]
    c = gradient["config"]
    lines = [f"Gradient verdict, exact, on agentic problems: **{gradient['direction']}**. "
             f"{DIRECTIONS.get(gradient['direction'], '')}."]
    if gradient.get("estimator_direction"):
        causes = gradient.get("causes") or []
        lines += [f"The advantage estimator alone: **{gradient['estimator_direction']}**"
                  + (f"; the part of the update that biases it: **{', '.join(causes)}** (the first whose neutral choice "
                     "gives the update the estimator's verdict back)" if causes else "") + "."]
    if gradient.get("fixed_point"):
        fixed = [f for f in gradient["families"] if "fixed_point" in f]
        short = sum(f["fixed_point"]["counts"].get("stops below J*", 0) for f in fixed)
        total = sum(f["instances"] for f in fixed)
        lines += [f"Plain exact ascent with the expected update (lr {c['ascent_lr']:g}, at most {c['ascent_steps']} steps, from "
                  f"the uniform policy; no optimizer, no clipping): **{gradient['fixed_point']}**"
                  + (f" on {short} of {total} problems" if short else "") + "."]
    whole = "estimator_direction" in gradient  # a report of before the update-level verdict read the estimator alone
    lines += ["", f"{c['instances']} random problems per family and number of turns, {c['starts'] + 1} start policies each "
              f"(uniform and random), G = {c['group_size']}, rewards on {c['reward_levels']} levels; tolerance "
              f"{gradient['tolerance']:g} (float64). "
              + ("The direction is the expected first step of the whole update (the estimator, the loss's derivative at "
                 "ratio 1, the aggregation's weights, the M factor's first value, the schedule) against `grad J`."
                 if whole else "The direction is the estimator's, `E[sum_t A_t grad log pi(a_t|h_t)]` against `grad J`, "
                 "before the loss's clipping and aggregation."), "",
              "| Family | T | Expected update (worst case) | Estimator alone | Cases | Worst case: cosine (per turn) | "
              "Plain ascent |" if whole else
              "| Family | T | Expected update (worst case) | Cases | Worst case: cosine (per turn) | Plain ascent |",
              "|---|---|---|---|---|---|---|" if whole else "|---|---|---|---|---|---|"]
    flags = "".join(f" --plugin {p.split('@sha256:')[0]}" for p in plugins)
    for f in gradient["families"]:
        w = f["worst"]
        cases = ", ".join(f"{v} {n}" for v, n in f["counts"].items())
        per_turn = ", ".join(_num(x) for x in w["turn_cosines"])
        ascent = "—"
        if "fixed_point" in f:
            fp = f["fixed_point"]
            ascent = (f"{fp['verdict']} ({', '.join(f'{v} {n}' for v, n in fp['counts'].items())}; worst J "
                      f"{fp['worst']['J_start']:.3f} -> {fp['worst']['J_end']:.3f}, J* {fp['worst']['J_star']:.3f})")
        file = f" `{f['file']}`" if f.get("file") else ""
        estimator = (f" {f['estimator']['verdict']}" + (f" (the difference: the {f['cause']})" if f.get("cause") else "") + " |"
                     if whole else "")
        lines.append(f"| {f['text']} | {f['turns']} | {f['verdict']}{file} |{estimator} {cases} | {_num(w['cosine'])} "
                     f"({per_turn}) | {ascent} |")
    files = [f["file"] for f in gradient["families"] if f.get("file")]
    if files:
        lines += ["", f"Each worst case replays: `seeupo replay {out}/{files[0]}{flags}` (one file per row)."]
    return lines


def bridge_markdown(bridge: BridgeResult) -> list[str]:
    """The bridge's paragraph of check.md: the warm-up reached, then vacuous (why) or each algorithm's change of ``J``."""
    if bridge.skipped is not None:
        return [f"Bridge: skipped ({bridge.skipped})."]
    if bridge.vacuous and bridge.row is None:
        return [f"Bridge (tiny-qwen3): **vacuous**: {bridge.vacuous}."]
    w, b = bridge.warmup, bridge.row
    warm = (f"format warm-up: P(valid first answer) {w.p_valid:.3f} (lowest over seeds) after at most {w.steps} "
            f"steps, target {w.threshold:g}")
    lines = [f"Bridge (tiny-qwen3, exact J of the language model, {plural(len(b['seeds']), 'seed')} x {b['steps']} steps at lr "
             f"{b['lr']:g}; {warm}): {bridge.summary}. J* {b['J_star']:.4f}; {b['decreases_total']} of "
             f"{b['step_transitions_total']} steps lowered J (largest {b['largest_decrease']:.4f}); sampled updates: "
             "decreases there are expected noise, not violations."]
    if bridge.vacuous:
        lines += ["", f"The bridge is **vacuous**: {bridge.vacuous}."]
    return lines


def figure(report: CheckReport, path: Path) -> None:
    """Exact ``J`` per iteration on the toy problems (worst instance of each exact cell) and per bridge step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for c in _exact_cells(report):
        line, = ax1.plot(c["worst_J"], label=f"{c['setting']} {c['parameterization']}")
        ax1.axhline(c["J_star_worst"], color=line.get_color(), ls=":", lw=0.8)
    ax1.set(title=f"{report.algorithm}: exact J, worst random instance", xlabel="iteration", ylabel="J")
    if ax1.lines:
        ax1.legend(fontsize=8)
    runs = report.bridge.runs or []
    for r in runs:
        ax2.plot(r["J"], marker=".", label=f"seed {r['seed']}")
    for preset, base in (report.bridge.baselines or {}).items():  # the built-ins, same seeds and settings
        for k, r in enumerate(base["runs"]):
            ax2.plot(r["J"], ls="--", lw=0.8, color="C7" if preset == "grpo" else "C9",
                     label=f"{preset} (built-in)" if k == 0 else None)
    if runs:
        ax2.axhline(runs[0]["J_star"], color="k", ls=":", lw=0.8, label="J*")
        ax2.legend(fontsize=8)
    ax2.set(title="bridge: exact J of the language model", xlabel="step", ylabel="J")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------------- comparison


def bridge_of(result: CompareReport, name: str) -> tuple[Learning | None, list[dict[str, Any]]]:
    """``name``'s words (:func:`seeupo.experiments.check.verdict.learning`) and per-seed runs in the shared bridge of
    a comparison (``None, []`` if none)."""
    bridge = result.bridge
    runs = bridge.runs if name == bridge.algorithm else (bridge.baselines or {}).get(name, {}).get("runs")
    return (bridge.learning or {}).get(name), runs or []


def _cell_words(report: CheckReport, mode: str) -> str:
    cells = [c for c in report.verify["cells"] if c["mode"] == mode]
    if not cells:
        return "none ran"
    return "; ".join(f"{c['setting']} {c['parameterization']}: {c['verdict']}" for c in cells)


def _decreases(report: CheckReport) -> str:
    found = [s for s in report.searches if s.counts]
    flat = [s for s in report.searches if s.found and s.on_flat_surrogate]
    exact = _exact_cells(report)
    if not report.exact_mode:
        return "not measured (no exact mode)"
    words = f"{len(found)} of {len(report.searches)} searches"
    if found:
        words += " (largest " + f"{max(s.J[0] - s.J[-1] for s in found):.2e})"
    if flat:
        words += f" (and {len(flat)} on a flat surrogate, not counted)"
    random = sum(c["violations"] for c in exact)
    return words + f"; {random} on random instances" + (
        f" (largest {max(c['max_violation'] for c in exact):.2e})" if random else "")


def compare_markdown(result: CompareReport) -> str:
    """The comparison's check.md: one table row per algorithm, then each one's counterexamples with their cause."""
    names = list(result.algorithms)
    first = result.compare[0]
    title = f"# `seeupo check {first} --compare {','.join(result.compare[1:])}`" + (
        f" (partial: stopped by {result.partial})" if result.partial else "")
    b = result.budget
    bridge = result.bridge
    lines = [title, "",
             f"The same check for each algorithm: the same {b['verify']['instances']} random problems per cell (seed "
             f"{b['seed']}), {b['verify']['iterations']} iterations, the same searches with {b['max_examples']} cases each"
             + (", and one bridge run in which all of them train from the same warm-up, seeds and steps."
                if bridge.skipped is None else "; no bridge."), ""]
    if result.plugins:
        lines += ["Plugins: " + ", ".join(f"`{p}`" for p in result.plugins), ""]
    if result.partial:
        lines += [f"**Partial report**: stopped ({result.partial}); not reached: "
                  + (", ".join(result.not_reached) or "none") + ".", ""]
    if result.moved_aside:
        lines += ["An earlier check's files were moved aside (--overwrite deletes nothing): "
                  + ", ".join(f"`{m}`" for m in result.moved_aside) + ".", ""]
    lines += ["| Algorithm | Gradient verdict (agentic problems) | Exact monotonicity, measured | Exact cells | Sampled cells "
              "| J decreases found | Bridge: exact J, first -> last step (mean over seeds) |", "|---|---|---|---|---|---|---|"]
    for n in names:
        r = result.algorithms[n]
        verdict = r.monotonicity.measured or r.monotonicity.evidence[0]
        words, _ = bridge_of(result, n)
        moved = (f"{words.J_initial_mean:.4f} -> {words.J_final_mean:.4f} ({words.moved})" if words else
                 "skipped" if bridge.skipped is not None else "not trained")
        lines.append(f"| {n} | {gradient_headline(r.gradient)} | {verdict} | {_cell_words(r, 'exact')} | "
                     f"{_cell_words(r, 'sampled')} | {_decreases(r)} | {moved} |")
    lines += [""]
    lines += bridge_markdown(bridge) if bridge.skipped is not None or bridge.vacuous else [
        "Bridge: " + "; ".join(f"{n} {w.words}" for n, w in bridge.learning.items()) + "."]
    for n in names:
        r = result.algorithms[n]
        lines += ["", f"## {n}", ""]
        lines += [f"* {e}" for e in r.monotonicity.evidence]
        found = [s for s in r.searches if s.found]
        if found:
            lines += ["", "Why J fell (the full explanation is written beside each file):", ""]
            lines += [explanation_line(s) for s in found]
        lines += ["", f"Its own report: `algorithms/{n}/check.md`."]
    lines += ["", f"Total time: {result.seconds:.0f} s; estimated {result.plan.total:.0f} s"
              + (f"; budget {result.plan.budget:.0f} s" if result.plan.budget else "") + ".", ""]
    return "\n".join(lines)


def compare_figure(result: CompareReport, path: Path) -> None:
    """Exact ``J`` per iteration (toy problems) and per bridge step, every compared algorithm on the same two axes.

    One colour per algorithm; on the left one line style per exact cell (its worst random
    instance), on the right one line per bridge seed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {("ST", "independent"): "-", ("ST", "shared"): "--", ("MT", "independent"): "-.", ("MT", "shared"): ":"}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for k, n in enumerate(result.algorithms):
        color = f"C{k}"
        for c in _exact_cells(result.algorithms[n]):
            ax1.plot(c["worst_J"], color=color, ls=styles.get((c["setting"], c["parameterization"]), "-"),
                     label=f"{n} {c['setting']} {c['parameterization']}")
        _, runs = bridge_of(result, n)
        for j, r in enumerate(runs):
            ax2.plot(r["J"], color=color, marker=".", label=n if j == 0 else None)
    ax1.set(title="exact J, worst random instance of each cell", xlabel="iteration", ylabel="J")
    ax2.set(title="bridge: exact J of the language model", xlabel="step", ylabel="J")
    for ax in (ax1, ax2):
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
