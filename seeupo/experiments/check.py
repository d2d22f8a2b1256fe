"""``seeupo check NAME``: the whole journey of one algorithm, from exact toy problems to a language model.

For a registered algorithm (a preset, built in or registered by a plugin) it runs, in order:

1. **verify**: the verification cells of :mod:`seeupo.experiments.verify` for this algorithm
   alone (single and multi turn, exact and sampled, independent and shared parameters): the exact
   ``J`` after every iteration on random token bandits, judged with the verdict vocabulary;
2. **searches**: the generic monotonicity searches (:func:`seeupo.experiments.searches.algorithm_searches`):
   hypothesis looks for a case where one exact update lowers ``J``; a case found is shrunk, saved
   under ``OUT/counterexamples/`` with the plugins' hashes, and replayed before it is reported;
3. **bridge**: a short run of the language-model trainer on the 2-turn bridge problem
   (:mod:`seeupo.experiments.bridge_lm`), the tiny random Qwen3 for a few seeds, with the model's
   exact ``J`` after every step (needs the ``llm`` extra; skipped with the reason otherwise);

and writes ``OUT/check.md`` (a report to paste), ``OUT/check.json`` (everything measured) and
``OUT/check.png`` (exact ``J`` per iteration on the toy problems and per step on the bridge).

The verdict on monotonicity uses :data:`seeupo.experiments.verdicts.MEASURED`: ``J decreased``
when an exact update lowered ``J`` (a replaying counterexample or a random instance), else
``monotone`` with the budget that found nothing. It says what was measured, not that the
algorithm is monotone: a search that finds nothing bounds nothing beyond its cases.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from seeupo.experiments.verify import QUICK as QUICK_VERIFY
from seeupo.experiments.verify import VerifyConfig

#: What ``seeupo check`` writes in its folder (``--overwrite`` deletes these and nothing else).
OUTPUTS = ("check.json", "check.md", "check.png", "counterexamples", "bridge")


@dataclass(frozen=True)
class CheckBudget:
    """How much ``seeupo check`` measures.

    verify: the verification cells' size (its ``algorithms`` and ``plugins`` are filled in).
    max_examples: cases per search (hypothesis examples, shrinking not counted).
    bridge_steps, bridge_seeds, bridge_warmup: the bridge run: training steps, seeds, and format
      warm-up steps before step 0 (as :func:`seeupo.experiments.bridge_lm.full_sweep`'s tiny model).
    """

    verify: VerifyConfig
    max_examples: int
    bridge_steps: int
    bridge_seeds: tuple[int, ...]
    bridge_warmup: int


DEFAULT = CheckBudget(VerifyConfig(instances=12, iterations=15, counterexample_dir=""), max_examples=150,
                      bridge_steps=8, bridge_seeds=(0, 1, 2), bridge_warmup=40)
QUICK = CheckBudget(dataclasses.replace(QUICK_VERIFY, counterexample_dir=""), max_examples=8,
                    bridge_steps=2, bridge_seeds=(0,), bridge_warmup=5)


def check_output(out: Path, overwrite: bool) -> None:
    """Refuse a folder that already holds anything unless ``overwrite`` (then delete only :data:`OUTPUTS`).

    A check folder is the record of one check: two checks never share one.
    """
    from seeupo.validation import InputError

    if not out.exists() or not any(out.iterdir()):
        return
    if not overwrite:
        raise InputError(None, f"argument --out: {out} is not empty; choose another folder or pass --overwrite")
    for name in OUTPUTS:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def run_searches(name: str, budget: CheckBudget, out: Path, seed: int, say: Callable[[str], None]) -> list[dict[str, Any]]:
    """The generic searches of ``name``; each counterexample found is saved and replayed."""
    from seeupo.experiments.counterexamples import replay, search
    from seeupo.experiments.searches import algorithm_searches

    results = []
    for spec in algorithm_searches(name):
        start = time.perf_counter()
        found = search(spec.cases(), claim=spec.claim, description=spec.description,
                       max_examples=budget.max_examples, seed=seed).found
        entry: dict[str, Any] = {"search": spec.name, "description": spec.description, "max_examples": budget.max_examples,
                                 "seed": seed, "found": found is not None}
        if found is not None:
            path = out / "counterexamples" / f"{spec.name}.json"
            found.save(path)
            again = replay(found)
            entry |= {"file": str(path.relative_to(out)), "J": found.J, "largest_decrease": found.largest_decrease,
                      "reproduces": again.reproduces, "group_size": found.algorithm.group_size,
                      "turns": found.problem.num_turns}
        entry["seconds"] = time.perf_counter() - start
        say(f"search {spec.name}: " + (f"J {found.J[0]:.6f} -> {found.J[-1]:.6f}" if found else
                                        f"no J decrease in {budget.max_examples} cases") + f" ({entry['seconds']:.0f} s)")
        results.append(entry)
    return results


def run_bridge(name: str, budget: CheckBudget, out: Path, plugins: tuple[str, ...], say: Callable[[str], None]) -> dict[str, Any]:
    """A short language-model run on the bridge with exact ``J`` per step, or why it was skipped."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return {"skipped": "needs the language-model extra: pip install 'seeupo[llm]'"}
    from seeupo.experiments import bridge_lm

    model = bridge_lm.ModelSetting("tiny-qwen3", lr=3e-3, warmup_steps=budget.bridge_warmup, warmup_lr=3e-3,
                                   steps=budget.bridge_steps, seeds=budget.bridge_seeds)
    sweep = bridge_lm.Sweep(models=(model,), presets=(name,), seeupo_variants=(), plugins=plugins)
    folder = out / "bridge"
    for spec in bridge_lm.runs_of(sweep):
        bridge_lm.run_one(spec, sweep, folder, log=say)
    tables = bridge_lm.build_tables(sweep, folder)
    return {"settings": tables["settings"], "runs": tables["runs"], "row": tables["rows"][0] if tables["rows"] else None}


def monotonicity(verify_report: dict[str, Any], searches: list[dict[str, Any]]) -> dict[str, Any]:
    """The verdict on exact monotonicity: ``J decreased`` (with the evidence) or ``monotone`` (with the budget)."""
    exact = [c for c in verify_report["cells"] if c["mode"] == "exact"]
    decreased_cells = [c for c in exact if c["violations"] > 0]
    found = [s for s in searches if s["found"] and s.get("reproduces")]
    if found or decreased_cells:
        evidence = [f"{s['search']}: J {s['J'][0]:.6f} -> {s['J'][-1]:.6f} (`{s['file']}`, replays)" for s in found]
        evidence += [f"random instances, {c['setting']} {c['parameterization']}: {c['violations']} decreases, "
                     f"largest {c['max_violation']:.2e}" for c in decreased_cells]
        return {"measured": "J decreased", "evidence": evidence}
    cases = sum(s["max_examples"] for s in searches)
    instances = sum(c["instances"] * c["iterations"] for c in exact)
    return {"measured": "monotone", "evidence": [
        f"no exact update lowered J in {len(searches)} searches of {searches[0]['max_examples'] if searches else 0} "
        f"cases each ({cases} cases) and {instances} exact updates on random instances"]}


def check(name: str, budget: CheckBudget, out: Path, *, plugins: tuple[str, ...] = (), seed: int = 0,
          bridge: bool = True, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the three parts for ``name`` and write ``OUT/check.{json,md,png}``; returns the report."""
    from seeupo.core.config import PRESETS
    from seeupo.core.contract import exact_mode_refusal
    from seeupo.experiments.verify import algorithm_rows, verify

    start = time.perf_counter()
    config = PRESETS[name]
    refused = exact_mode_refusal(config.replace(group_size=budget.verify.group_size))
    exact = refused is None
    cfg = dataclasses.replace(budget.verify, algorithms=(name,), plugins=plugins, seed=seed)
    if not exact and "sampled" not in cfg.modes:  # the only cells it can have
        cfg = dataclasses.replace(cfg, modes=("sampled",))
    say(f"[1/3] verify: {name} on {cfg.instances} random problems per cell")
    verify_report = verify(cfg, progress=say)
    if exact:
        say(f"[2/3] searches: {budget.max_examples} cases each")
        searches = run_searches(name, budget, out, seed, say)
    else:
        searches = []
        say(f"[2/3] searches: skipped (exact: refused ({refused}))")
    if bridge:
        say(f"[3/3] bridge: tiny-qwen3, {budget.bridge_steps} steps x {len(budget.bridge_seeds)} seeds")
        bridge_result = run_bridge(name, budget, out, plugins, say)
    else:
        bridge_result = {"skipped": "--no-bridge"}
    row = algorithm_rows([name], cfg.exact_epochs)[0]
    report = {
        "algorithm": name,
        "out": str(out),
        "config": config.to_dict(),
        "plugins": list(plugins),
        "budget": dataclasses.asdict(budget) | {"seed": seed},
        "exact_mode": exact,
        "exact_refused": refused,
        "monotonicity": monotonicity(verify_report, searches) if exact else
        {"measured": None, "evidence": [f"exact: refused ({refused})"]},
        "verify": verify_report,
        "table_row": {"advantage": row.advantage, "update": row.update, "level": row.level},
        "searches": searches,
        "bridge": bridge_result,
        "seconds": time.perf_counter() - start,
    }
    write(report, out)
    return report


def markdown(report: dict[str, Any]) -> str:
    """The report to paste: the verdict first, then the evidence of each part."""
    from seeupo.experiments.verify import markdown as verify_markdown

    name, mono = report["algorithm"], report["monotonicity"]
    row = report["table_row"]
    lines = [f"# `seeupo check {name}`", "",
             f"Advantage: {row['advantage']}; update: {row['update']}; level: {row['level']}.", ""]
    if report["plugins"]:
        lines += ["Plugins: " + ", ".join(f"`{p}`" for p in report["plugins"]), ""]
    lines += ["## Verdict", ""]
    if mono["measured"] is None:
        lines += ["Exact monotonicity: not measured (" + mono["evidence"][0] + ")."]
    else:
        lines += [f"Exact monotonicity, measured: **{mono['measured']}**."] + [f"* {e}" for e in mono["evidence"]]
    exact_cells = [c for c in report["verify"]["cells"] if c["mode"] == "exact"]
    if exact_cells:
        lines += ["", "Convergence on random token bandits (exact): " + "; ".join(
            f"{c['setting']} {c['parameterization']}: {c['verdict']} (final gap max {c['max_final_gap']:.1e})" for c in exact_cells) + "."]
    bridge = report["bridge"]
    if bridge.get("row"):
        b = bridge["row"]
        lines += ["", f"Bridge (tiny-qwen3, exact J of the language model, {len(b['seeds'])} seeds x {b['steps']} steps): "
                  f"J {b['J_initial_mean']:.4f} -> {b['J_final_mean']:.4f} (J* {b['J_star']:.4f}); "
                  f"{b['decreases_total']} of {b['step_transitions_total']} steps lowered J (largest {b['largest_decrease']:.4f}). "
                  "Sampled updates: decreases there are expected noise, not violations."]
    else:
        lines += ["", f"Bridge: skipped ({bridge.get('skipped', 'no complete run')})."]
    lines += ["", "## Searches", "", "| Search | Cases | Found | J | Replays |", "|---|---|---|---|---|"]
    for s in report["searches"]:
        j = f"{s['J'][0]:.6f} -> {s['J'][-1]:.6f}" if s["found"] else "—"
        lines.append(f"| {s['description']} | {s['max_examples']} | {'yes' if s['found'] else 'no'} | {j} "
                     f"| {s.get('reproduces', '—')} |")
    if not report["searches"]:
        lines.append("| (none: no exact mode) | | | | |")
    plugin_flags = "".join(f" --plugin {p.split('@sha256:')[0]}" for p in report["plugins"])
    found = [s["file"] for s in report["searches"] if s["found"]]
    if found:
        lines += ["", "Replay the counterexamples: `seeupo replay "
                  + " ".join(f"{report['out']}/{f}" for f in found) + plugin_flags + "`."]
    lines.append("")
    body = verify_markdown(report["verify"]).split("\n", 1)[1]
    lines += ["## Verify cells", body, f"Total time: {report['seconds']:.0f} s.", ""]
    return "\n".join(lines)


def figure(report: dict[str, Any], path: Path) -> None:
    """Exact ``J`` per iteration on the toy problems (worst instance of each exact cell) and per bridge step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for c in report["verify"]["cells"]:
        if c["mode"] == "exact":
            line, = ax1.plot(c["worst_J"], label=f"{c['setting']} {c['parameterization']}")
            ax1.axhline(c["J_star_worst"], color=line.get_color(), ls=":", lw=0.8)
    ax1.set(title=f"{report['algorithm']}: exact J, worst random instance", xlabel="iteration", ylabel="J")
    if ax1.lines:
        ax1.legend(fontsize=8)
    runs = report["bridge"].get("runs") or []
    for r in runs:
        ax2.plot(r["J"], marker=".", label=f"seed {r['seed']}")
    if runs:
        ax2.axhline(runs[0]["J_star"], color="k", ls=":", lw=0.8, label="J*")
        ax2.legend(fontsize=8)
    ax2.set(title="bridge: exact J of the language model", xlabel="step", ylabel="J")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(report: dict[str, Any], out: Path) -> None:
    from seeupo.validation import dumps

    out.mkdir(parents=True, exist_ok=True)
    (out / "check.json").write_text(dumps(report, indent=1) + "\n")
    (out / "check.md").write_text(markdown(report))
    figure(report, out / "check.png")


def summary_line(report: dict[str, Any]) -> str:
    """One line for the terminal and for tables of several algorithms."""
    mono = report["monotonicity"]
    if mono["measured"] is None:
        return f"{report['algorithm']}: no exact mode"
    return f"{report['algorithm']}: {mono['measured']}; " + "; ".join(mono["evidence"])
