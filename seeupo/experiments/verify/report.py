"""The report of ``seeupo verify``: its headline, disagreements with the paper, ``verify.md`` and ``verify.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from seeupo.experiments.verdicts import NO_SIGNAL, refused_label
from seeupo.experiments.verify.cells import BASE_SETTINGS, setting_text
from seeupo.tabular.behaviour import Rollouts


def _cell_text(c: dict[str, Any], notes: list[str]) -> str:
    """A Table 1 cell's measured value, with a footnote when a counterexample decided it."""
    text = c["measured"]
    replaying = [e for e in c.get("counterexamples", []) if e["reproduces"]]
    if replaying:
        notes.append(
            f"random instances: {c['random_instances']}; J decreased in "
            + ", ".join(f"`{e['file']}` ({e['J'][0]:.4f} -> {e['J'][-1]:.4f})" for e in replaying)
            + (f" (claim {c['claim_id']})" if c.get("claim_id") else "")
        )
        text += f" [{len(notes)}]"
    return text


def disagreements(report: dict[str, Any]) -> list[str]:
    """One line per Table 1 cell whose measurement disagrees with the paper."""
    out = []
    for e in report["table1"]:
        for s in BASE_SETTINGS:
            c = e[s]
            if c["agreement"] != "disagrees":
                continue
            why = f"paper: {c['paper']}; measured: {c['measured']}"
            replaying = [x for x in c.get("counterexamples", []) if x["reproduces"]]
            if replaying:
                why += (f" (the random instances measured '{c['random_instances']}', but the saved counterexample"
                        + ("s " if len(replaying) > 1 else " ") + ", ".join(f"`{x['file']}`" for x in replaying)
                        + (" lower J and replay)" if len(replaying) > 1 else " lowers J and replays)"))
            out.append(f"{e['example']} ({s}): {why}" + (f"; see claim {c['claim_id']} in `seeupo claims`" if c.get("claim_id") else ""))
    return out


def _modes_run(report: dict[str, Any]) -> list[str]:
    """The modes whose cells actually ran (a refused exact cell did not run)."""
    return [m for m in ("exact", "sampled") if any(c["mode"] == m and not c.get("refused") for c in report["cells"])]


def _after_refusal(report: dict[str, Any], name: str) -> str:
    """What ran of an algorithm whose exact cells were refused: its sampled cells, or (``--quick``, ``--modes
    exact``) nothing, which the report must not call "only its sampled cells"."""
    ran = any(c.get("row") == name and c["mode"] == "sampled" and not c.get("refused") for c in report["cells"])
    return "only its sampled cells ran" if ran else "none of its cells ran (no sampled mode was requested)"


def headline(report: dict[str, Any]) -> list[str]:
    """What a reader must not miss, before any table: no signal, refusals, counterexamples, a partial run."""
    lines = []
    if report.get("partial"):
        lines.append("**Partial run** (interrupted): only the cells below finished.")
    silent = [c for c in report["cells"] if c["verdict"] == NO_SIGNAL]
    if silent:
        lines.append(f"**{NO_SIGNAL}** in {len(silent)} of {len(report['cells'])} cells ("
                     + ", ".join(f"{c['row']} {c['setting']} {c['mode']} {c['parameterization']}" for c in silent)
                     + "): the update never moved J there (advantages all zero or not finite, or J constant to 1e-12 "
                       "on every instance), so those cells measured nothing.")
    for name, reason in report.get("exact_refused", {}).items():
        lines.append(f"**{name}: {refused_label(reason)}**; {_after_refusal(report, name)}.")
    decreasing = [e for e in report.get("counterexamples", []) if e.get("decreases")]
    if decreasing:
        lines.append("**J decreased** in saved counterexamples that replay: " + "; ".join(
            f"{e['algorithm']} {e['setting']} {e['parameterization']}: J {e['J'][0]:.6f} -> {e['J'][-1]:.6f} (`{e['file']}`)"
            for e in decreasing) + ".")
    skipped = [e for e in report.get("counterexamples", []) if e.get("skipped")]
    if skipped:
        lines.append("Counterexample files not replayed (they count for nothing): "
                     + "; ".join(f"`{e['file']}`: {e['skipped']}" for e in skipped) + ".")
    return lines


def markdown(report: dict[str, Any], *, embedded: bool = False) -> str:
    """The report as markdown: the headline, Table 1 (paper vs measured) and every cell.

    ``embedded``: a section of another report (``seeupo check``), which states the headline, the
    plugins and the total time once itself: none is repeated here.
    """
    cfg = report["config"]
    if cfg.get("algorithms"):
        title = "Algorithms " + ", ".join(cfg["algorithms"]) + ", measured"
    elif cfg.get("grid", "table1") == "table1":
        title = "Table 1, regenerated from measurements"
    else:
        title = "Every advantage estimator x every update, measured"
    modes = _modes_run(report)
    consulted = []
    if cfg.get("counterexample_dir") and not cfg.get("algorithms"):
        consulted.append(f"the saved counterexamples of each Table 1 row (replayed from `{cfg['counterexample_dir']}`)")
    if cfg.get("algorithms") and (cfg.get("algorithm_counterexamples") or report.get("counterexamples")):
        places = cfg.get("algorithm_counterexamples") or sorted({str(Path(e["file"]).parent) for e in report["counterexamples"]})
        consulted.append("the algorithms' own counterexamples (replayed from " + ", ".join(f"`{d}`" for d in places) + ")")
    problems = (f"{cfg['instances']} random token bandits per cell (actions of {cfg['length']} tokens from a vocabulary of "
                f"{cfg['vocab_size']}, rewards on {cfg['reward_levels']} levels, G = {cfg['group_size']}), "
                f"{cfg['iterations']} iterations; MT has {cfg['turns_mt']} turns.")
    rollouts = Rollouts.from_dict(cfg.get("rollouts"))
    if not rollouts.on_policy:
        problems += f" Rows off policy: {rollouts.words()} (the algorithm's correction reweights them)."
    if "exact" in modes:
        table_text = "Table: exact mode, independent (tabular) parameters; " + problems
    else:
        table_text = ("Table: no exact cell ran (" + ("exact mode refused" if report.get("exact_refused") else
                      "only sampled mode was run") + "), so its measured column is empty; the sampled cells are below. "
                      + problems)
    lines = [
        f"# {title}" + (" (partial)" if report.get("partial") else ""),
        "",
        *([] if embedded else [line + "\n" for line in headline(report)]),
        table_text + f" A J decrease is a decrease of J by more than {cfg['tol']:g}; converged means within "
        f"{cfg['gap_tol']:g} of J*. "
        + ("*Measured* also counts " + " and ".join(consulted) + ": one that lowers J makes the cell 'J decreased'."
           if consulted else "No saved counterexamples were consulted."),
        "",
        "Vocabulary (`seeupo/experiments/verdicts.py`). *Measured*: converges | J decreased | monotone, stuck "
        f"below J* | monotone, still improving | {NO_SIGNAL} (J never moved: nothing measured). *Agreement*: agrees | "
        "disagrees | partly | inconclusive (e.g. 'no guarantee' and no counterexample found) | no claim | not run.",
        "",
        "| Algorithm | Advantage | Update | Level | ST paper | ST measured | ST agreement | MT paper | MT measured | MT agreement |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes: list[str] = []
    bold = lambda a: f"**{a}**" if a == "disagrees" else a  # noqa: E731
    for e in report["table1"]:
        st_text = _cell_text(e["ST"], notes)
        mt_text = _cell_text(e["MT"], notes)
        lines.append(
            f"| {e['example']} | {e['advantage']} | {e['update']} | {e['level']} | {e['ST']['paper']} | {st_text} "
            f"| {bold(e['ST']['agreement'])} | {e['MT']['paper']} | {mt_text} | {bold(e['MT']['agreement'])} |"
        )
    lines.append("")
    lines += [f"[{k}] {n}" + "  " for k, n in enumerate(notes, 1)]
    refused = report.get("exact_refused") or {name: "registered with exact=False" for name in report.get("no_exact_mode", [])}
    if refused:
        lines += ["", "; ".join(f"{name}: exact: refused ({reason}); {_after_refusal(report, name)}"
                                for name, reason in refused.items()) + ".", ""]
    if cfg.get("plugins") and not embedded:
        lines += ["", "Plugins: " + ", ".join(f"`{p}`" for p in cfg["plugins"]), ""]
    found = disagreements(report)
    lines += ["", "**Disagreements with the paper:** " + ("none." if not found else ""), ""]
    lines += [f"* {d}" for d in found]
    lines += ["", "Random instances rarely contain the cases where an update fails; the targeted counterexample searches "
              "(`seeupo search`) and the verdict on every claim, with the same vocabulary, are in `seeupo claims`.", ""]
    lines += agentic_markdown(report, embedded=embedded)
    heading = {("exact",): "exact", ("sampled",): "sampled", ("exact", "sampled"): "exact and sampled"}.get(tuple(modes), "none ran")
    lines += [
        ("### " if embedded else "## ") + f"Every cell ({heading})",
        "",
        f"*Measured*: exact mode as above; sampled mode: reaches J* | gap remains | {NO_SIGNAL}, judged on the final "
        "gap only. In sampled mode each update is estimated from B x G rollouts, so J moves with the sampling noise: "
        "the J decreases of a sampled cell are noise (shown in the note), not a failure of a monotonicity claim, which "
        "is about exact updates. A cell marked with counterexamples measured 'J decreased' through them; its random "
        "instances' own outcome is given beside it.",
        "",
        "| Algorithm | Setting | Mode | Parameters | Measured | J decreases | Largest decrease | Final gap (max / mean) | Worst instance: J over iterations (J*) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in report["cells"]:
        if c.get("refused"):
            lines.append(f"| {c['row']} | {c['setting']} | {c['mode']} | {c['parameterization']} | {c['verdict']} "
                         "| — | — | — | not run |")
            continue
        js = ", ".join(f"{x:.3f}" for x in c["worst_J"][:: max(1, len(c["worst_J"]) // 6)])
        measured = c["verdict"]
        if c.get("random_instances"):
            measured += (f" (counterexample{'s' if len(c['counterexamples']) > 1 else ''} "
                         + ", ".join(f"`{f}`" for f in c["counterexamples"]) + f"; random instances: {c['random_instances']})")
        if c.get("note"):
            measured += f" ({c['note']})"
        lines.append(
            f"| {c['row']} | {c['setting']} | {c['mode']} | {c['parameterization']} | {measured} | {c['violations']} "
            f"| {c['max_violation']:.2e} | {c['max_final_gap']:.2e} / {c['mean_final_gap']:.2e} "
            f"| #{c['worst_instance']}: {js} ({c['J_star_worst']:.3f}) |"
        )
    if not embedded:
        lines += ["", f"Total time: {report['seconds']:.1f} s.", ""]
    return "\n".join(lines) + ("\n" if embedded else "")


def agentic_markdown(report: dict[str, Any], *, embedded: bool = False) -> list[str]:
    """The agentic families' table (exact mode, one column per family and parameterisation that ran), or nothing."""
    cfg = report["config"]
    families = [f for f in cfg.get("families", ()) if any(c["setting"] == f for c in report["cells"])]
    if not families:
        return []
    params = [p for p in cfg["parameterizations"] if any(c["setting"] in families and c["parameterization"] == p
                                                         for c in report["cells"])]
    columns = [(f, p) for f in families for p in params]
    lines = [("### " if embedded else "## ") + "Agentic problem families (exact)", "",
             f"{cfg['instances']} random problems per cell of {cfg['turns_agentic']} turns, where the agent stops when it "
             "chooses (action 0 ends the episode before the last turn), rewards on "
             f"{cfg['reward_levels']} levels, G = {cfg['group_size']}, {cfg['iterations']} iterations: "
             + "; ".join(f"*{f}*: {setting_text(f)}" for f in families)
             + ". Same vocabulary as above; the paper makes no claim about these problems.", "",
             "| Algorithm | " + " | ".join(f"{f} ({p})" for f, p in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for row in report["table1"]:
        words = []
        for f, p in columns:
            cell = next((c for c in report["cells"] if (c["row"], c["setting"], c["mode"], c["parameterization"]) ==
                         (row["row"], f, "exact", p)), None)
            words.append("—" if cell is None else cell["verdict"] + (" (counterexample)" if cell.get("random_instances") else ""))
        lines.append(f"| {row['example']} | " + " | ".join(words) + " |")
    return lines + [""]


#: What ``seeupo verify`` writes in its ``--out`` folder (``--overwrite`` moves these aside, never deletes them).
VERIFY_OUTPUTS = ("verify.json", "verify.md")


def write_report(report: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """``report`` as ``out_dir``'s :data:`VERIFY_OUTPUTS`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = (out_dir / name for name in VERIFY_OUTPUTS)
    json_path.write_text(json.dumps(report, indent=1))
    md_path.write_text(markdown(report))
    return json_path, md_path
