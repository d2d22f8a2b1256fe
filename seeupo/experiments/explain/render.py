"""An explanation as text: :func:`render` (markdown), :func:`summary_line` (its one-sentence verdict),
:func:`restate` (the verdicts of several counterexample files) and the command line (:func:`main`)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Sequence

from seeupo.experiments.counterexamples import Counterexample
from seeupo.experiments.explain.cause import _ends, _fmt, _largest, _name, _peak, _where, amplification, misordered
from seeupo.experiments.explain.records import Explanation
from seeupo.experiments.explain.replay import explain


def summary_line(explanation: Explanation) -> str:
    """One sentence: how ``J`` moved and why, with the key numbers."""
    e = explanation
    line = _summary(e)
    return f"{line} {e.what_changes}" if e.what_changes else line


def _summary(e: Explanation) -> str:
    head = f"J {e.J_before:.6f} -> {e.J_after:.6f}"
    if e.cause == "no decrease":
        return f"{head}: J did not fall, nothing to explain."
    if e.cause == "flat surrogate":
        return (f"{head}; cause: a flat surrogate — the expected advantages are at most {_largest(e.actions):.1e} in size "
                f"(zero up to a stabilising constant), so the decrease is the optimizer's choice, not the estimator's.")
    if e.cause in ("M factor", "std scaling", "own-action baseline"):
        wrong = [r for r in e.actions if r.wrong_sign]
        where = (f"; at {_where(wrong[0])} the {'worse' if wrong[0].true_advantage < 0 else 'better'} action (Q - V "
                 f"{_fmt(wrong[0].true_advantage)}) gets expected advantage {_fmt(wrong[0].expected_advantage)}"
                 if wrong else "")
        if e.cause == "M factor":
            turn = next(r for r in e.reasons if r.startswith("Turn"))
            turn = turn.split(", but")[0]
            return f"{head}; cause: the M factor — {turn[0].lower() + turn[1:]}, and not with the factor left out."
        if e.cause == "std scaling":
            what = ("with G = 2 the advantage only says who won the pair, so its expectation is a win rate"
                    if any("win rate" in r for r in e.reasons) else "each group's advantages are divided by its own spread")
            return f"{head}; cause: std scaling — {what}{where}."
        x, y = misordered(e.actions)[0]
        length = " (one of them ends the episode: the baseline or scale depends on the trajectory's length)" if (
            _ends(x) != _ends(y)) else ""
        return (f"{head}; cause: a baseline that depends on the trajectory's own actions — at turn {x.turn} "
                f"({x.history_label}) action {x.action} (Q {x.q:.6f}) gets a larger expected advantage "
                f"({_fmt(x.expected_advantage)}) than action {y.action} (Q {y.q:.6f}, {_fmt(y.expected_advantage)}){length}.")
    if e.cause == "advantage sign":
        pairs = misordered(e.actions)
        wrong = [r for r in e.actions if r.wrong_sign and any(r in pair for pair in pairs)]
        wrong = wrong or [r for r in e.actions if r.wrong_sign]
        if wrong:
            r = wrong[0]
            what = (f"at {_where(r)} the {'worse' if r.true_advantage < 0 else 'better'} action (Q - V "
                    f"{_fmt(r.true_advantage)}) gets expected advantage {_fmt(r.expected_advantage)}")
        elif pairs:
            x, y = pairs[0]
            what = (f"at turn {x.turn} ({x.history_label}) action {x.action} (Q {x.q:.6f}) gets a larger expected "
                    f"advantage ({_fmt(x.expected_advantage)}) than action {y.action} (Q {y.q:.6f}, "
                    f"{_fmt(y.expected_advantage)})")
        else:
            what = "the expected advantages, weighted as the update weights them, favour the wrong actions"
        downhill = f", so the expected update lowers J (grad J . g = {e.update.slope:+.1e})" if e.update else ""
        return f"{head}; cause: the advantage's sign — {what}{downhill}."
    if e.cause == "optimizer":
        big = _largest(e.actions)
        return (f"{head}; cause: the optimizer — the expected advantages are at most {big:.1e} in size (expected "
                f"gradient {e.update.gradient_norm:.1e}) and point uphill; plain gradient ascent moves J by "
                f"{e.plain.J[-1] - e.J_before:+.1e}, but {_name(e.update.optimizer)}'s normalised steps of lr {e.update.lr:g} "
                f"overshoot (J {_peak(e.update)}).")
    ratio = f"; {_name(e.update.optimizer)}'s first step is {amplification(e.update, e.plain):.2g} times as long" if (
        e.update and e.plain and math.isfinite(amplification(e.update, e.plain))) else ""
    plain = f" (plain gradient ascent: J -> {e.plain.J[-1]:.6f}{ratio})" if e.plain else ""
    uphill = f"the expected update does not point downhill (grad J . g = {e.update.slope:+.1e}) but " if e.update else ""
    return f"{head}; cause: the step size — {uphill}the update goes past where J is highest{plain}."


def render(explanation: Explanation) -> str:
    """The explanation as markdown text: the instance, the advantages, the update, the cause."""
    e = explanation
    out = [f"## {e.description}", "", e.settings + ".",
           f"Iteration {e.iteration} of {e.iterations}: J {e.J_before:.6f} -> {e.J_after:.6f} (J* = {e.J_star:.6f}; "
           f"recorded {e.recorded_after:.6f}, {'reproduced' if e.reproduces else 'NOT reproduced'}).", "",
           f"**Cause: {e.cause}.** {summary_line(e)}", ""]
    if e.mode == "sampled":
        out += ["Sampled mode: \"expected\" below means the mean over this iteration's batch of rollouts.", ""]
    out += [f"* {r}" for r in e.reasons] + [""]
    if e.what_changes:
        out += [f"**What changes the outcome:** {e.what_changes}", ""]
    out += ["### The instance, and the policy before and after the update", "",
            "Q and the true advantage A = Q - V are exact, under the policy before the update. "
            "E[A_hat] is the advantage the algorithm gives the action, averaged over its outcome classes below"
            + (" (sampled mode: a mean over the batch's rollouts, not the expectation)." if e.mode == "sampled" else "."),
            "",
            "| turn | history (reach) | action | outcomes: P(o) reward | Q | A = Q - V | E[A_hat] | P before | P after |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in e.actions:
        outs = "; ".join(f"o{o.observation}: {o.probability:g}, r {o.reward:g}{'' if o.ends else ', continues'}"
                         for o in r.outcomes)
        out.append(f"| {r.turn} | {r.history_label} ({r.reach:.4f}) | {r.action} | {outs} | {r.q:.6f} | "
                   f"{_fmt(r.true_advantage)} | {_fmt(r.expected_advantage)} | {r.prob_before:.6f} | {r.prob_after:.6f} |")
    out += ["", "### The advantage each outcome class received", "",
            "A class is the trajectories through (turn, history, action) with the same return that received the same "
            "advantage; its weight is their probability together with their group-mates' (the weights of one action "
            "sum to P(history) x P(action)).", "",
            "| turn | history | action | return | advantage | weight |", "|---|---|---|---|---|---|"]
    for r in e.actions:
        for c in r.classes:
            out.append(f"| {r.turn} | {r.history_label} | {r.action} | {c.trajectory_return:g} | {_fmt(c.advantage)} "
                       f"| {c.weight:.6f} |")
    for name, run in (("The update as it ran", e.update), ("Plain gradient ascent from the same start", e.plain)):
        if run is None:
            continue
        out += ["", f"### {name} ({_name(run.optimizer)}, lr {run.lr:g}, {run.steps} steps)", "",
                f"* Expected gradient at the start: norm {run.gradient_norm:.1e}; grad J . g = {run.slope:+.1e}.",
                "* J at the start and after each step: " + _series(run.J, 6),
                f"* P(action {e.watched[2]} at turn {e.watched[0]}, {e.watched_label}; the optimal first action) at the "
                f"start and after each step: " + _series(run.best_action_prob, 4)]
    return "\n".join(out) + "\n"


def _series(xs: list[float], digits: int, head: int = 8) -> str:
    """``xs[0], xs[1], ...`` (value after step 0, 1, ...), the middle of a long series left out but its
    extremes named; a series that moves less than the printed digits is shown as changes from ``xs[0]``."""
    if len(xs) > 1 and 0 < max(xs) - min(xs) < 10.0**-digits:
        prefix, shown = f"{xs[0]:.{digits}f}, then changes from it: ", [_fmt(x - xs[0]) for x in xs]
    else:
        prefix, shown = "", [f"{x:.{digits}f}" for x in xs]
    if len(xs) > 2 * head:
        hi = max(range(len(xs)), key=xs.__getitem__)
        lo = min(range(len(xs)), key=xs.__getitem__)
        shown = shown[:head] + [f"... (max {shown[hi]} after step {hi}, min {shown[lo]} after step {lo}) ..."] + shown[-3:]
    return prefix + ", ".join(shown)


def restate(paths: Sequence[str | Path]) -> tuple[str, str]:
    """The verdicts of several counterexample files with their causes: ``(block, full)``.

    ``block`` is one bullet per file (path, then :func:`summary_line`); ``full`` has each file's
    :func:`render` under its path. The plugins the files name must be loaded already.
    """
    bullets, sections = [], []
    for path in paths:
        e = explain(Counterexample.load(path))
        bullets.append(f"* `{Path(path).as_posix()}`: {summary_line(e)}")
        sections.append(f"# `{Path(path).as_posix()}`\n\n{render(e)}")
    return "\n".join(bullets) + "\n", "\n".join(sections)


BEGIN, END = "<!-- explain:begin (generated by python -m seeupo.experiments.explain) -->", "<!-- explain:end -->"


def main(argv: Sequence[str] | None = None) -> int:
    """Print (or write) the restated verdicts; ``--readme`` replaces the block between :data:`BEGIN` and :data:`END`."""
    from seeupo.plugins import load_plugins

    p = argparse.ArgumentParser(prog="python -m seeupo.experiments.explain", description=restate.__doc__)
    p.add_argument("files", nargs="+")
    p.add_argument("--plugin", action="append", default=[])
    p.add_argument("--out", help="write every file's full explanation here")
    p.add_argument("--readme", help="replace the generated block of this markdown file with the one-line verdicts")
    args = p.parse_args(argv)
    load_plugins(args.plugin, "--plugin")
    block, full = restate(args.files)
    if args.out:
        Path(args.out).write_text("# Why J fell: the counterexamples explained\n\n"
                                  "Generated by `python -m seeupo.experiments.explain` (the same text as "
                                  "`seeupo replay FILE --explain`).\n\n" + full)
    if args.readme:
        text = Path(args.readme).read_text()
        if BEGIN not in text or END not in text:
            print(f"{args.readme}: no generated block ({BEGIN} ... {END})", file=sys.stderr)
            return 2
        head, rest = text.split(BEGIN, 1)
        Path(args.readme).write_text(head + BEGIN + "\n" + block + END + rest.split(END, 1)[1])
    print(block, end="")
    return 0
