"""The verification engine: run a grid of algorithms on batches of random problems and judge each cell.

A **cell** is one algorithm (a point of :class:`AlgorithmConfig`) on one setting (single- or
multi-turn), in one mode (exact or sampled), with one parameterisation (independent or
shared). Each cell trains a policy on every instance of a batch of random problems for a
number of iterations and records, per iteration and instance, the exact ``J``, the gap to
``J*`` and every decrease of ``J``. What a cell measured is one value of
:data:`seeupo.experiments.verdicts.MEASURED`:

* exact mode: ``converges`` (``J`` never decreased beyond ``tol`` and every instance ended
  within ``gap_tol`` of ``J*``), ``J decreased``, ``monotone, stuck below J*`` (some instance
  short of ``J*`` improved by less than ``stall_ratio`` of its gap over the last third of the
  run), or ``monotone, still improving`` (inconclusive);
* sampled mode: ``reaches J*`` or ``gap remains``. The update is estimated from samples, so
  ``J`` moves with the sampling noise: its decreases are counted and shown as a note
  (``noisy: 18 J decreases, largest 4.5e-04``), never as a violation.

Table 1 compares the paper with the exact, independent-parameter cells **and** the saved
counterexamples of each cell's algorithm (:data:`~seeupo.experiments.verdicts.TABLE1_SEARCHES`,
replayed from ``counterexample_dir``), with the rules of
:func:`seeupo.experiments.verdicts.table1_verdict` that ``seeupo claims`` uses too. The
other cells measure how far practice strays from the theory.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

import torch

from seeupo.core.config import PRESETS, AlgorithmConfig, preset
from seeupo.core.contract import exact_mode_refusal
from seeupo.core.registry import adv_estimator, policy_loss
from seeupo.tabular.problems import TreeMDP, random_token_bandit
from seeupo.experiments.verdicts import TABLE1_CLAIMS, TABLE1_SEARCHES, history_outcome, saved_counterexamples, table1_verdict
from seeupo.tabular.train import RunConfig, run


@dataclass(frozen=True)
class Row:
    """One algorithm of the grid, and what the paper claims about it (``None``: no claim)."""

    name: str
    example: str
    advantage: str
    update: str
    level: str
    config: AlgorithmConfig
    claim_st: str | None
    claim_mt: str | None
    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = 0.05
    iterations_factor: int = 1  # one cheap step per iteration (REINFORCE) needs more iterations


def table1_rows(exact_epochs: int) -> list[Row]:
    """The paper's Table 1 rows, plus the order ablations of SeeUPO."""
    ppu = dict(epochs=exact_epochs)
    return [
        Row("ppo", "PPO", "GAE", "PPU", "token", preset("ppo", **ppu), "converges", "converges"),
        Row("grpo", "GRPO", "GRAE", "PPU", "token", preset("grpo", **ppu), "no guarantee", "no guarantee"),
        Row("reinforce_pp", "REINFORCE++", "GRAE", "PPU", "token", preset("reinforce_pp", **ppu), "no guarantee", "no guarantee"),
        Row("rloo", "RLOO", "GRAE", "REINFORCE", "sequence", preset("rloo"), "converges", "no guarantee", "sgd", 5.0, 10),
        Row("gspo", "GSPO", "GRAE", "PPU", "sequence", preset("gspo", **ppu), "converges", "no guarantee"),
        Row("seeupo", "SeeUPO", "GRAE", "HAML (reverse)", "sequence", preset("seeupo", **ppu), None, "converges"),
        Row("seeupo_forward", "SeeUPO, forward order", "GRAE", "HAML (forward)", "sequence", preset("seeupo", order="forward", **ppu), None, None),
        Row("seeupo_random", "SeeUPO, random order", "GRAE", "HAML (random)", "sequence", preset("seeupo", order="random", **ppu), None, None),
    ]


ADVANTAGES: dict[str, dict[str, object]] = {
    "GAE": dict(advantage="gae", gae_token_level=True),
    "GRAE mean": dict(advantage="grae", grae_center="mean", grae_scale="none"),
    "GRAE LOO": dict(advantage="grae", grae_center="loo", grae_scale="none"),
    "GRAE group-std": dict(advantage="grae", grae_center="mean", grae_scale="group_std"),
    "GRAE batch-z": dict(advantage="grae", grae_center="mean", grae_scale="batch_std"),
}
UPDATES: dict[str, tuple[str, str, dict[str, object]]] = {
    "REINFORCE": ("REINFORCE", "sequence", dict(update="reinforce")),
    "PPU token": ("PPU", "token", dict(update="ppo", ratio_level="token")),
    "PPU seq (turn)": ("PPU", "sequence", dict(update="ppo", ratio_level="sequence", ratio_scope="turn", aggregation="seq_mean_token_mean")),
    "PPU seq (trajectory)": ("PPU", "sequence", dict(update="ppo", ratio_level="sequence", ratio_scope="trajectory", aggregation="seq_mean_token_mean")),
    "HAML reverse": ("HAML (reverse)", "sequence", dict(update="ppo", ratio_level="sequence", aggregation="seq_mean_token_mean", schedule="sequential", order="reverse")),
    "HAML forward": ("HAML (forward)", "sequence", dict(update="ppo", ratio_level="sequence", aggregation="seq_mean_token_mean", schedule="sequential", order="forward")),
    "HAML random": ("HAML (random)", "sequence", dict(update="ppo", ratio_level="sequence", aggregation="seq_mean_token_mean", schedule="sequential", order="random")),
}


def grid_choices() -> tuple[dict[str, dict[str, object]], dict[str, tuple[str, str, dict[str, object]]]]:
    """The full grid's advantage estimators and updates: :data:`ADVANTAGES` and :data:`UPDATES`, plus
    every other registered estimator (that the tabular engine runs without an oracle) and policy
    loss, with their own options at their defaults, so that a plugin's entries join the grid."""
    from seeupo.core.registry import ADV_ESTIMATORS, POLICY_LOSSES

    advantages = dict(ADVANTAGES)
    covered = {str(a["advantage"]) for a in ADVANTAGES.values()}
    for name in ADV_ESTIMATORS.names():
        entry = adv_estimator(name)
        if name not in covered and entry.tabular and not entry.needs_oracle:
            advantages[name] = dict(advantage=name)
    updates = dict(UPDATES)
    covered = {str(u[2]["update"]) for u in UPDATES.values()}
    for name in POLICY_LOSSES.names():
        if name not in covered:
            updates[name] = (name, "token" if policy_loss(name).surrogate else "sequence", dict(update=name))
    return advantages, updates


def full_grid_rows(exact_epochs: int) -> list[Row]:
    """Every advantage estimator x every policy update (no paper claims attached); see :func:`grid_choices`."""
    advantages, updates = grid_choices()
    rows = []
    for adv_name, adv in advantages.items():
        for upd_name, (update, level, upd) in updates.items():
            name = f"{adv_name} + {upd_name}".lower().replace(" ", "_").replace("+", "").replace("(", "").replace(")", "").replace("__", "_")
            config = AlgorithmConfig(name=name, **adv, **upd)
            if not policy_loss(config.update).surrogate:  # a plain policy gradient: one SGD step
                rows.append(Row(name, f"{adv_name} + {upd_name}", adv_name, update, level, config, None, None, "sgd", 5.0, 10))
            else:
                rows.append(Row(name, f"{adv_name} + {upd_name}", adv_name, update, level, config.replace(epochs=exact_epochs), None, None))
    return rows


def describe(cfg: AlgorithmConfig) -> tuple[str, str, str]:
    """``(advantage, update, level)`` of a table row, in the words of Table 1."""
    if cfg.advantage == "grae":
        scale = {"none": "", "group_std": ", group std", "batch_std": ", batch z-score"}.get(cfg.grae_scale, f", {cfg.grae_scale}")
        advantage = f"GRAE ({cfg.grae_center}{scale})"
    else:
        advantage = cfg.advantage.upper() if cfg.advantage in ("gae",) else cfg.advantage
    surrogate = policy_loss(cfg.update).surrogate
    update = {"ppo": "PPU", "reinforce": "REINFORCE"}.get(cfg.update, cfg.update)
    if cfg.schedule == "sequential":
        update = f"HAML ({cfg.order}, {update})"
    level = cfg.ratio_level if surrogate else "sequence"
    if cfg.aggregation != "token_mean":
        level += f", {cfg.aggregation}"
    return advantage, update, level


def algorithm_rows(names: list[str] | tuple[str, ...], exact_epochs: int) -> list[Row]:
    """Rows for the registered algorithms ``names`` (presets, built in or from plugins).

    A row of the paper's Table 1 keeps its claims; any other algorithm has none. A plain policy
    gradient (a loss that is not a surrogate) takes one SGD step per iteration, as RLOO's row.
    """
    paper = {row.name: row for row in table1_rows(exact_epochs)}
    rows = []
    for name in names:
        if name in paper:
            rows.append(paper[name])
            continue
        if name not in PRESETS:
            raise ValueError(f"unknown algorithm {name!r}; choose from {sorted(PRESETS)} (a plugin registers more)")
        config = preset(name)
        advantage, update, level = describe(config)
        if not policy_loss(config.update).surrogate:
            rows.append(Row(name, name, advantage, update, level, config, None, None, "sgd", 5.0, 10))
        else:
            rows.append(Row(name, name, advantage, update, level, config.replace(epochs=exact_epochs), None, None))
    return rows


@dataclass(frozen=True)
class VerifyConfig:
    """Size of a verification run.

    instances: random problems per cell (batched in one call).
    iterations: outer iterations per run.
    exact_epochs: optimizer steps per update of a PPU row in exact mode ("maximised to convergence").
    sampled_epochs, sampled_minibatches, tasks: the sampled mode's update, as an LLM run.
    sampled_iterations_factor: sampled runs take this many times more (cheaper, noisier) iterations.
    turns_mt: turns of the multi-turn setting (single-turn has 1).
    vocab_size, length: actions are ``length`` tokens from ``vocab_size``.
    reward_levels: rewards on that many evenly spaced levels in [0, 1] (2 = binary).
    group_size: ``G`` for GRAE.
    modes, parameterizations: which columns to run.
    tol, gap_tol: a decrease larger than ``tol`` is a violation; ``gap_tol`` is "reached J*".
    stall_ratio: an instance whose gap fell by less than this fraction over the last third of
      the run has stopped improving.
    workers: processes.
    counterexample_dir: saved counterexamples replayed for Table 1 (relative to the working
      directory, else to the repository root); ``""`` to ignore them.
    grid: ``"table1"`` (the paper's rows and SeeUPO's order ablations) or ``"full"`` (every
      advantage estimator x every update; see :func:`full_grid_rows`).
    algorithms: registered algorithms (preset names) to run instead of ``grid``
      (:func:`algorithm_rows`); an estimator that exact mode refuses
      (:func:`seeupo.core.contract.exact_mode_refusal`) gets sampled cells only.
    plugins: the plugins that registered them (``NAME@sha256:HEX``, :mod:`seeupo.plugins`),
      loaded by every worker process and recorded in the report.
    """

    instances: int = 12
    iterations: int = 15
    exact_epochs: int = 40
    sampled_epochs: int = 2
    sampled_minibatches: int = 2
    tasks: int = 4
    sampled_iterations_factor: int = 4
    turns_mt: int = 2
    vocab_size: int = 2
    length: int = 2
    reward_levels: int = 3
    group_size: int = 4
    modes: tuple[str, ...] = ("exact", "sampled")
    parameterizations: tuple[str, ...] = ("independent", "shared")
    tol: float = 1e-7
    gap_tol: float = 1e-3
    stall_ratio: float = 0.05
    workers: int = 2
    seed: int = 0
    grid: str = "table1"
    counterexample_dir: str = "paper_repro/counterexamples"
    algorithms: tuple[str, ...] = ()
    plugins: tuple[str, ...] = ()


QUICK = VerifyConfig(instances=6, iterations=8, exact_epochs=25, modes=("exact",), parameterizations=("independent",))


@dataclass
class CellResult:
    row: str
    setting: str
    mode: str
    parameterization: str
    instances: int
    iterations: int
    violations: int
    max_violation: float
    max_final_gap: float
    mean_final_gap: float
    verdict: str
    worst_instance: int
    worst_J: list[float]
    J_star_worst: float
    seconds: float
    note: str = ""  # sampled mode: the J decreases, which are sampling noise


def make_problems(cfg: VerifyConfig, turns: int) -> TreeMDP:
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + turns)
    return random_token_bandit(cfg.instances, turns, cfg.vocab_size, cfg.length, reward_levels=cfg.reward_levels, generator=gen)


def run_cell(row: Row, setting: str, mode: str, parameterization: str, cfg: VerifyConfig) -> CellResult:
    """Train ``row`` on a batch of random problems and judge the run."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    problem = make_problems(cfg, 1 if setting == "ST" else cfg.turns_mt)
    algo = row.config.replace(group_size=cfg.group_size)
    if mode == "sampled" and policy_loss(algo.update).surrogate:
        algo = algo.replace(epochs=cfg.sampled_epochs, minibatches=cfg.sampled_minibatches)
    iterations = cfg.iterations * row.iterations_factor * (cfg.sampled_iterations_factor if mode == "sampled" else 1)
    run_cfg = RunConfig(
        mode=mode, iterations=iterations, tasks=cfg.tasks, optimizer=row.optimizer, lr=row.lr,
        parameterization=parameterization, seed=cfg.seed,
    )
    hist = run(problem, algo, run_cfg)
    viol = hist.violations(cfg.tol)
    gap = hist.gap[-1]
    worst = int((viol.max(0).values if bool((viol > 0).any()) else gap).argmax())
    outcome = history_outcome(hist, mode, tol=cfg.tol, gap_tol=cfg.gap_tol, stall_ratio=cfg.stall_ratio)
    n_viol, verdict, note = outcome["J_decreases"], outcome["measured"], outcome["note"]
    return CellResult(
        row.name, setting, mode, parameterization, cfg.instances, iterations, n_viol, float(viol.max()),
        float(gap.max()), float(gap.mean()), verdict, worst, hist.J[:, worst].tolist(), float(hist.J_star[worst]),
        time.perf_counter() - start, note,
    )


def _load_plugins(specs: tuple[str, ...]) -> None:
    """A worker process imports the plugins (pinned to their recorded hashes) before it runs a cell."""
    from seeupo.plugins import load_plugins

    load_plugins(list(specs), "--plugin")


def _run_cell_args(args: tuple) -> CellResult:
    return run_cell(*args)


def table1_counterexamples(cfg: VerifyConfig, row: str, setting: str) -> list[dict[str, Any]]:
    """The saved counterexamples of ``row``'s algorithm in ``setting`` (replayed), or ``[]``."""
    if not cfg.counterexample_dir:
        return []
    return saved_counterexamples(TABLE1_SEARCHES.get((row, setting), ()), cfg.counterexample_dir)


def _table1_replays(cfg: VerifyConfig, keys: list[tuple[str, str]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    torch.set_num_threads(1)
    return {key: table1_counterexamples(cfg, *key) for key in keys}


def table1_entry(row: Row, setting: str, cell: CellResult | dict[str, Any] | None, cfg: VerifyConfig,
                 examples: list[dict[str, Any]] | None = None, refused: str | None = None) -> dict[str, Any]:
    """One Table 1 cell: the paper's claim, what was measured, whether they agree, and why.

    ``examples``: the cell's saved counterexamples, replayed (default: replay them now). ``refused``:
    why exact mode refused the row's estimator (:func:`~seeupo.core.contract.exact_mode_refusal`).
    """
    claim = row.claim_st if setting == "ST" else row.claim_mt
    if cell is None:
        entry = {"paper": claim or "—", "measured": "—", "agreement": "not run" if claim else "no claim",
                 "claim_id": TABLE1_CLAIMS.get((row.name, setting))}
        return entry | ({"measured": f"exact: refused ({refused})", "exact_refused": refused} if refused else {})
    cell = dataclasses.asdict(cell) if isinstance(cell, CellResult) else cell
    examples = table1_counterexamples(cfg, row.name, setting) if examples is None else examples
    replaying = [e for e in examples if e["reproduces"]]
    measured, agree = table1_verdict(claim, cell["verdict"], [e["search"] for e in replaying])
    return {
        "paper": claim or "—", "measured": measured, "agreement": agree,
        "random_instances": cell["verdict"], "counterexamples": examples,
        "claim_id": TABLE1_CLAIMS.get((row.name, setting)),
    }


def verify(cfg: VerifyConfig, rows: list[Row] | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every cell of the grid and return the report (JSON-ready)."""
    if rows is None and cfg.algorithms:
        rows = algorithm_rows(cfg.algorithms, cfg.exact_epochs)
    elif rows is None:
        if cfg.grid not in ("table1", "full"):
            raise ValueError(f"unknown grid {cfg.grid!r}; expected 'table1' or 'full'")
        rows = table1_rows(cfg.exact_epochs) if cfg.grid == "table1" else full_grid_rows(cfg.exact_epochs)
    by_name = {r.name: r for r in rows}
    # exact mode's contract, checked here (once per algorithm) before any cell runs: a refused
    # estimator gets sampled cells only, and the reason is recorded
    refused = {r.name: exact_mode_refusal(r.config.replace(group_size=cfg.group_size)) for r in rows}
    tasks = [
        (row, setting, mode, param, cfg)
        for row in rows
        for setting in ("ST", "MT")
        if not (setting == "ST" and row.config.schedule == "sequential")
        for mode in cfg.modes
        if mode == "sampled" or refused[row.name] is None
        for param in cfg.parameterizations
    ]
    start = time.perf_counter()
    results: list[CellResult] = []
    say = progress or (lambda _msg: None)

    def record(res: CellResult) -> None:
        results.append(res)
        say(
            f"[{len(results)}/{len(tasks)}] {res.row:15s} {res.setting} {res.mode:7s} {res.parameterization:11s} "
            f"{res.verdict:22s} ({res.seconds:.1f}s)"
        )

    # the saved counterexamples of the Table 1 cells are replayed alongside the cells
    replay_keys = [(row.name, s) for row in rows for s in ("ST", "MT") if TABLE1_SEARCHES.get((row.name, s))]
    if cfg.workers > 1:
        with mp.get_context("spawn").Pool(cfg.workers, initializer=_load_plugins, initargs=(cfg.plugins,)) as pool:
            pending = pool.apply_async(_table1_replays, (cfg, replay_keys))
            for res in pool.imap_unordered(_run_cell_args, tasks):
                record(res)
            replays = pending.get()
    else:
        for task in tasks:
            record(run_cell(*task))
        replays = _table1_replays(cfg, replay_keys)
    order = {(t[0].name, t[1], t[2], t[3]): i for i, t in enumerate(tasks)}
    results.sort(key=lambda r: order[(r.row, r.setting, r.mode, r.parameterization)])

    table = []
    for row in rows:
        entry: dict[str, Any] = {
            "row": row.name, "example": row.example, "advantage": row.advantage, "update": row.update, "level": row.level,
        }
        for setting in ("ST", "MT"):
            cell = next((r for r in results if r.row == row.name and r.setting == setting and r.mode == "exact" and r.parameterization == "independent"), None)
            entry[setting] = table1_entry(row, setting, cell, cfg, replays.get((row.name, setting), []), refused[row.name])
        table.append(entry)
    return {
        "config": dataclasses.asdict(cfg),
        "algorithms": {r.name: r.config.to_dict() | {"optimizer": r.optimizer, "lr": r.lr} for r in by_name.values()},
        "table1": table,
        "no_exact_mode": [name for name, reason in refused.items() if reason is not None],
        "exact_refused": {name: reason for name, reason in refused.items() if reason is not None},
        "cells": [dataclasses.asdict(r) for r in results],
        "seconds": time.perf_counter() - start,
    }


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
        for s in ("ST", "MT"):
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


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown: Table 1 (paper vs measured) and every cell."""
    cfg = report["config"]
    if cfg.get("algorithms"):
        title = "Algorithms " + ", ".join(cfg["algorithms"]) + ", measured"
    elif cfg.get("grid", "table1") == "table1":
        title = "Table 1, regenerated from measurements"
    else:
        title = "Every advantage estimator x every update, measured"
    lines = [
        f"# {title}",
        "",
        f"Exact mode, independent (tabular) parameters; {cfg['instances']} random token bandits per cell "
        f"(actions of {cfg['length']} tokens from a vocabulary of {cfg['vocab_size']}, rewards on "
        f"{cfg['reward_levels']} levels, G = {cfg['group_size']}), {cfg['iterations']} iterations; "
        f"MT has {cfg['turns_mt']} turns. A J decrease is a decrease of J by more than {cfg['tol']:g}; "
        f"converged means within {cfg['gap_tol']:g} of J*. "
        + (f"*Measured* also counts the saved counterexamples of each algorithm (replayed from "
           f"`{cfg['counterexample_dir']}`): one that lowers J makes the cell 'J decreased'."
           if cfg.get("counterexample_dir") else "Saved counterexamples were not consulted (`counterexample_dir` empty)."),
        "",
        "Vocabulary (`seeupo/experiments/verdicts.py`). *Measured*: converges | J decreased | monotone, stuck "
        "below J* | monotone, still improving. *Agreement*: agrees | disagrees | partly | inconclusive "
        "(e.g. 'no guarantee' and no counterexample found) | no claim.",
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
        lines += ["", "; ".join(f"{name}: exact: refused ({reason})" for name, reason in refused.items())
                  + "; only sampled cells were run.", ""]
    if cfg.get("plugins"):
        lines += ["", "Plugins: " + ", ".join(f"`{p}`" for p in cfg["plugins"]), ""]
    found = disagreements(report)
    lines += ["", "**Disagreements with the paper:** " + ("none." if not found else ""), ""]
    lines += [f"* {d}" for d in found]
    lines += ["", "Random instances rarely contain the cases where an update fails; the targeted counterexample searches "
              "(`seeupo search`) and the verdict on every claim, with the same vocabulary, are in `seeupo claims`.", ""]
    lines += [
        "## Every cell",
        "",
        "*Measured*: exact mode as above; sampled mode: reaches J* | gap remains, judged on the final gap only. In "
        "sampled mode each update is estimated from B x G rollouts, so J moves with the sampling noise: the J "
        "decreases of a sampled cell are noise (shown in the note), not a failure of a monotonicity claim, which "
        "is about exact updates.",
        "",
        "| Algorithm | Setting | Mode | Parameters | Measured | J decreases | Largest decrease | Final gap (max / mean) | Worst instance: J over iterations (J*) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in report["cells"]:
        js = ", ".join(f"{x:.3f}" for x in c["worst_J"][:: max(1, len(c["worst_J"]) // 6)])
        measured = f"{c['verdict']} ({c['note']})" if c.get("note") else c["verdict"]
        lines.append(
            f"| {c['row']} | {c['setting']} | {c['mode']} | {c['parameterization']} | {measured} | {c['violations']} "
            f"| {c['max_violation']:.2e} | {c['max_final_gap']:.2e} / {c['mean_final_gap']:.2e} "
            f"| #{c['worst_instance']}: {js} ({c['J_star_worst']:.3f}) |"
        )
    lines += ["", f"Total time: {report['seconds']:.1f} s.", ""]
    return "\n".join(lines)


def write_report(report: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "verify.json", out_dir / "verify.md"
    json_path.write_text(json.dumps(report, indent=1))
    md_path.write_text(markdown(report))
    return json_path, md_path


def stderr_progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
