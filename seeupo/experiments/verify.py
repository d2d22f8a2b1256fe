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
  (``noisy: 18 J decreases, largest 4.5e-04``), never as a violation;
* either mode: ``no learning signal`` when ``J`` never moved (checked before anything else: a
  frozen run is neither monotone nor converged).

An exact cell is not run when exact mode refuses the estimator (``exact: refused (REASON)``,
:func:`exact_refusal`); its sampled cells still run.

Counterexamples are measurements too. For an algorithm run by name (``algorithms``), the
counterexample files of ``algorithm_counterexamples`` (a ``seeupo check`` folder, its
``counterexamples/`` folder, or any folder of counterexample files) whose algorithm is that
one are replayed; one that replays turns the exact cells of its setting and parameters into
``J decreased`` (:func:`apply_counterexamples`), with the random instances' outcome kept
beside it. No cell says ``converges`` next to a replaying decrease.

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
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

import torch

from seeupo.core.config import PRESETS, AlgorithmConfig, preset
from seeupo.core.contract import exact_mode_refusal
from seeupo.core.registry import adv_estimator, policy_loss
from seeupo.tabular.families import AGENTIC_FAMILIES, AGENTIC_FAMILY_TEXT
from seeupo.tabular.problems import TreeMDP, random_family, random_token_bandit
from seeupo.experiments.verdicts import (
    NO_SIGNAL, TABLE1_CLAIMS, TABLE1_SEARCHES, history_outcome, refused_label, saved_counterexamples, table1_verdict,
)
from seeupo.tabular.train import RunConfig, run
from seeupo.validation.errors import InputError


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
    families: the agentic problem families (:data:`seeupo.tabular.families.AGENTIC_FAMILIES`: the
      agent stops when it chooses, intermediate rewards, tool results, token actions), each a setting
      of its own beside ST and MT, run in exact mode only (sampled mode adds sampling noise and
      nothing the exact cell does not measure) with every parameterisation; ``()`` for none.
    turns_agentic: turns of the agentic settings (the agent may stop before the last).
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
    algorithm_counterexamples: folders of counterexample files (or ``seeupo check`` folders)
      consulted for the ``algorithms`` rows: each file whose algorithm is one of them is replayed
      (:func:`algorithm_counterexample_files`).
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
    families: tuple[str, ...] = tuple(AGENTIC_FAMILIES)
    turns_agentic: int = 2
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
    algorithm_counterexamples: tuple[str, ...] = ()
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
    refused: str | None = None  # exact mode refused the estimator: why (the cell did not run)
    random_instances: str = ""  # the random instances' own outcome, when a replaying counterexample decided the verdict
    counterexamples: list[str] = dataclasses.field(default_factory=list)  # files of those counterexamples


def refused_cell(row: Row, setting: str, parameterization: str, cfg: VerifyConfig, reason: str) -> CellResult:
    """The record of an exact cell that exact mode refused to run: no numbers, the reason."""
    return CellResult(row.name, setting, "exact", parameterization, 0, 0, 0, 0.0, float("nan"), float("nan"),
                      refused_label(reason), 0, [], float("nan"), 0.0, refused=reason)


def exact_refusal(config: AlgorithmConfig, group_size: int) -> str | None:
    """Why exact mode refuses ``config``'s estimator with groups of ``group_size``, or ``None`` when it runs it
    (:func:`seeupo.core.contract.exact_mode_refusal`: ``registered with exact=False``, or a failed check
    of what exact mode assumes, such as symmetry in the group)."""
    return exact_mode_refusal(config.replace(group_size=group_size))


BASE_SETTINGS = ("ST", "MT")
"""The paper's settings (Table 1): one turn, and ``turns_mt`` turns, on random token bandits."""


def settings(cfg: VerifyConfig) -> tuple[str, ...]:
    """Every setting a cell may have: :data:`BASE_SETTINGS`, then ``cfg.families``."""
    return (*BASE_SETTINGS, *cfg.families)


def setting_runs(cfg: VerifyConfig, setting: str, sequential: bool) -> list[tuple[str, str]]:
    """``(mode, parameterization)`` of the cells of ``setting``: none for a single turn of a sequential
    update (nothing to order), exact mode only for an agentic family (:class:`VerifyConfig`)."""
    if setting == "ST" and sequential:
        return []
    modes = [m for m in cfg.modes if setting in BASE_SETTINGS or m == "exact"]
    return [(mode, param) for mode in modes for param in cfg.parameterizations]


def setting_text(setting: str) -> str:
    """A setting in words (a family's from :data:`~seeupo.tabular.families.AGENTIC_FAMILY_TEXT`)."""
    return {"ST": "single turn", "MT": "multi-turn token bandit"}.get(setting) or AGENTIC_FAMILY_TEXT[setting]


def make_problems(cfg: VerifyConfig, turns: int) -> TreeMDP:
    """The random token bandits of the ST (``turns`` 1) and MT settings."""
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + turns)
    return random_token_bandit(cfg.instances, turns, cfg.vocab_size, cfg.length, reward_levels=cfg.reward_levels, generator=gen)


def setting_problems(cfg: VerifyConfig, setting: str) -> TreeMDP:
    """The batch of random problems a cell of ``setting`` trains on (seeded by the config and the setting)."""
    if setting in BASE_SETTINGS:
        return make_problems(cfg, 1 if setting == "ST" else cfg.turns_mt)
    index = list(AGENTIC_FAMILIES).index(setting)
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + 100 + 10 * index + cfg.turns_agentic)
    return random_family(setting, cfg.instances, cfg.turns_agentic, reward_levels=cfg.reward_levels, generator=gen)


def run_cell(row: Row, setting: str, mode: str, parameterization: str, cfg: VerifyConfig) -> CellResult:
    """Train ``row`` on a batch of random problems and judge the run."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    problem = setting_problems(cfg, setting)
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
    # where J is not finite, argmax of a NaN gap is arbitrary: show the first instance then
    finite_gap = torch.nan_to_num(gap, nan=-1.0)
    worst = int((viol.max(0).values if bool((viol > 0).any()) else finite_gap).argmax())
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
    if cell.get("refused"):
        return {"paper": claim or "—", "measured": cell["verdict"], "agreement": "not run" if claim else "no claim",
                "exact_refused": cell["refused"],
                "claim_id": TABLE1_CLAIMS.get((row.name, setting))}
    examples = table1_counterexamples(cfg, row.name, setting) if examples is None else examples
    replaying = [e for e in examples if e["reproduces"]]
    measured, agree = table1_verdict(claim, cell["verdict"], [e["search"] for e in replaying])
    return {
        "paper": claim or "—", "measured": measured, "agreement": agree,
        "random_instances": cell["verdict"], "counterexamples": examples,
        "claim_id": TABLE1_CLAIMS.get((row.name, setting)),
    }


def algorithm_counterexample_files(directory: str | Path) -> list[Path]:
    """The counterexample files in ``directory``: a folder of them, or a ``seeupo check`` folder
    (its ``counterexamples/`` and those of the earlier runs it moved aside, ``previous-*/counterexamples/``)."""
    from seeupo.experiments.counterexamples import FORMAT
    from seeupo.validation.files import read_json

    base = Path(directory)
    folders = [base]
    if (base / "counterexamples").is_dir():
        folders = [base / "counterexamples", *sorted(base.glob("previous-*/counterexamples"))]
    files = []
    for folder in folders:
        for path in sorted(folder.glob("*.json")):
            try:
                data = read_json(path)
            except Exception:  # not a counterexample file (searches.json, a report): not ours to judge
                continue
            if isinstance(data, dict) and data.get("format") == FORMAT:
                files.append(path)
    return files


def consult_counterexamples(names: list[str] | tuple[str, ...], directories: list[str] | tuple[str, ...],
                            tol: float = 1e-7) -> list[dict[str, Any]]:
    """Replay every counterexample file in ``directories`` whose algorithm is one of ``names``.

    Each entry: the file, the algorithm, the setting (``ST``/``MT`` or an agentic family), parameters and mode of its
    run, whether it reproduces and lowers ``J`` by more than ``tol`` (``decreases``), and the
    recomputed ``J``; a file that cannot be loaded (say, recorded with another version of a
    plugin) is listed with ``skipped`` and the reason, and counts for nothing.
    """
    from seeupo.experiments.counterexamples import Counterexample, case_setting, replay
    from seeupo.validation.files import read_json

    out: list[dict[str, Any]] = []
    for directory in directories:
        for path in algorithm_counterexample_files(directory):
            name = (read_json(path).get("algorithm") or {}).get("name")
            if name not in names:
                continue
            try:
                example = Counterexample.load(path)
            except InputError as err:
                out.append({"file": str(path), "algorithm": name, "skipped": str(err), "reproduces": False, "decreases": False})
                continue
            again = replay(example)
            J = list(again.recomputed)
            largest = max((a - b for a, b in zip(J, J[1:])), default=0.0)
            out.append({"file": str(path), "search": path.stem, "algorithm": name,
                        "setting": case_setting(example),
                        "parameterization": example.run.parameterization, "mode": example.run.mode,
                        "reproduces": bool(again.reproduces), "decreases": bool(again.reproduces and largest > tol),
                        "J": J, "largest_decrease": largest})
    return out


def mark_cells(cells: list[dict[str, Any]], decreasing: list[dict[str, Any]]) -> None:
    """Each exact cell with a counterexample in ``decreasing`` of its algorithm, setting and parameters
    becomes ``J decreased``; its random instances' own outcome is kept in ``random_instances``."""
    for c in cells:
        if c["mode"] != "exact" or c.get("refused"):
            continue
        hits = [e for e in decreasing if (e["algorithm"], e["setting"], e["parameterization"]) ==
                (c["row"], c["setting"], c["parameterization"])]
        if not hits:
            continue
        if c["verdict"] != "J decreased":
            c["random_instances"] = c.get("random_instances") or c["verdict"]
            c["verdict"] = "J decreased"
        c["counterexamples"] = sorted(set(c.get("counterexamples", [])) | {e["file"] for e in hits})


def apply_counterexamples(report: dict[str, Any], examples: list[dict[str, Any]]) -> None:
    """Make ``report`` agree with the replaying counterexamples ``examples`` (of its algorithm rows).

    Each exact cell of the same algorithm, setting and parameters becomes ``J decreased`` (its
    random instances' own outcome kept in ``random_instances``), and so does the Table 1 entry
    of the exact, independent cell; every example is listed in ``report["counterexamples"]``.
    """
    report.setdefault("counterexamples", [])
    known = {e["file"] for e in report["counterexamples"]}
    report["counterexamples"] += [e for e in examples if e["file"] not in known]
    decreasing = [e for e in report["counterexamples"] if e.get("decreases") and e.get("mode", "exact") == "exact"]
    mark_cells(report["cells"], decreasing)
    for entry in report["table1"]:
        for setting in BASE_SETTINGS:
            t = entry[setting]
            hits = [e for e in decreasing if (e["algorithm"], e["setting"], e["parameterization"]) ==
                    (entry["row"], setting, "independent")]
            if not hits or t.get("random_instances") in (None, "—") or t["measured"] == "—":
                continue
            mine = [{"search": e["search"], "file": e["file"], "reproduces": True, "J": e["J"],
                     "largest_decrease": e["largest_decrease"]} for e in hits]
            t["counterexamples"] = [x for x in t.get("counterexamples", []) if x["file"] not in {m["file"] for m in mine}] + mine
            paper = None if t["paper"] == "—" else t["paper"]
            t["measured"], t["agreement"] = table1_verdict(
                paper, t["random_instances"], [x["search"] for x in t["counterexamples"] if x["reproduces"]])


def verify(cfg: VerifyConfig, rows: list[Row] | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every cell of the grid and return the report (JSON-ready).

    Ctrl-C or SIGTERM (as ``KeyboardInterrupt``) while cells run ends the run early: the report of
    the cells that finished is returned with ``partial: True`` (the caller writes it).
    """
    if rows is None and cfg.algorithms:
        rows = algorithm_rows(cfg.algorithms, cfg.exact_epochs)
    elif rows is None:
        if cfg.grid not in ("table1", "full"):
            raise ValueError(f"unknown grid {cfg.grid!r}; expected 'table1' or 'full'")
        rows = table1_rows(cfg.exact_epochs) if cfg.grid == "table1" else full_grid_rows(cfg.exact_epochs)
    by_name = {r.name: r for r in rows}
    unknown = [f for f in cfg.families if f not in AGENTIC_FAMILIES]
    if unknown:
        raise ValueError(f"unknown problem family {unknown[0]!r}; expected some of {list(AGENTIC_FAMILIES)}")
    # exact mode's contract, checked here (once per algorithm) before any cell runs: a refused
    # estimator gets sampled cells only, and the reason is recorded (and shown where its exact cells would be)
    refused = {r.name: exact_refusal(r.config, cfg.group_size) for r in rows}
    cells = [
        (row, setting, mode, param, cfg)
        for row in rows
        for setting in settings(cfg)
        for mode, param in setting_runs(cfg, setting, row.config.schedule == "sequential")
        if mode == "sampled" or adv_estimator(row.config.advantage).exact  # a refused one: its exact cells say why
    ]
    tasks = [t for t in cells if not (t[2] == "exact" and refused[t[0].name])]
    start = time.perf_counter()
    results: list[CellResult] = [refused_cell(t[0], t[1], t[3], cfg, refused[t[0].name]) for t in cells if t not in tasks]
    say = progress or (lambda _msg: None)
    for name, reason in refused.items():
        if reason and "exact" in cfg.modes:
            say(f"{name}: {refused_label(reason)}; its sampled cells still run")

    def record(res: CellResult) -> None:
        results.append(res)
        say(
            f"[{len(results)}/{len(tasks)}] {res.row:15s} {res.setting:12s} {res.mode:7s} {res.parameterization:11s} "
            f"{res.verdict:22s} ({res.seconds:.1f}s)"
        )

    # the saved counterexamples of the Table 1 cells are replayed alongside the cells
    replay_keys = [(row.name, s) for row in rows for s in BASE_SETTINGS if TABLE1_SEARCHES.get((row.name, s))]
    partial = False
    replays: dict[tuple[str, str], list[dict[str, Any]]] = {}
    try:
        say(f"verify: {len(tasks)} cells on {min(cfg.workers, max(len(tasks), 1))} worker process(es), "
            f"{cfg.instances} problems and {cfg.iterations} iterations each")
        if cfg.workers > 1:
            # a process pool that notices a worker dying (BrokenProcessPool) instead of waiting for it forever,
            # and that drops the queued cells at the first error (a plugin's one line) or interrupt
            pool = ProcessPoolExecutor(cfg.workers, mp_context=mp.get_context("spawn"), initializer=_load_plugins,
                                       initargs=(cfg.plugins,))
            try:
                pending = pool.submit(_table1_replays, cfg, replay_keys)
                for future in as_completed([pool.submit(run_cell, *task) for task in tasks]):
                    record(future.result())
                replays = pending.result()
            except KeyboardInterrupt:
                _stop_workers(pool)
                raise
            finally:
                pool.shutdown(wait=False, cancel_futures=True)
        else:
            for task in tasks:
                record(run_cell(*task))
            replays = _table1_replays(cfg, replay_keys)
    except KeyboardInterrupt:  # the pool is terminated on leaving its block; keep what finished
        partial = True
        say(f"verify: interrupted after {len(results)} of {len(cells)} cells")
    order = {(t[0].name, t[1], t[2], t[3]): i for i, t in enumerate(cells)}
    results.sort(key=lambda r: order[(r.row, r.setting, r.mode, r.parameterization)])

    table = []
    for row in rows:
        entry: dict[str, Any] = {
            "row": row.name, "example": row.example, "advantage": row.advantage, "update": row.update, "level": row.level,
        }
        for setting in BASE_SETTINGS:
            cell = next((r for r in results if r.row == row.name and r.setting == setting and r.mode == "exact" and r.parameterization == "independent"), None)
            entry[setting] = table1_entry(row, setting, cell, cfg, replays.get((row.name, setting), []), refused[row.name])
        table.append(entry)
    report = {
        "config": dataclasses.asdict(cfg),
        "algorithms": {r.name: r.config.to_dict() | {"optimizer": r.optimizer, "lr": r.lr} for r in by_name.values()},
        "table1": table,
        "no_exact_mode": [name for name, reason in refused.items() if reason is not None],
        "exact_refused": {name: reason for name, reason in refused.items() if reason is not None},
        "cells": [dataclasses.asdict(r) for r in results],
        "counterexamples": [],
        "partial": partial,
        "seconds": time.perf_counter() - start,
    }
    # the Table 1 rows' saved counterexamples (all searched with independent parameters) decide their cells too
    mark_cells(report["cells"], [
        {"algorithm": row, "setting": setting, "parameterization": "independent", "file": e["file"]}
        for (row, setting), examples in replays.items() for e in examples
        if e["reproduces"] and e["largest_decrease"] > cfg.tol])
    if cfg.algorithms and cfg.algorithm_counterexamples and not partial:
        apply_counterexamples(report, consult_counterexamples(cfg.algorithms, cfg.algorithm_counterexamples, cfg.tol))
    report["seconds"] = time.perf_counter() - start
    return report


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


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """End ``pool``'s worker processes now, discarding their running cells (Ctrl-C, SIGTERM).

    ``shutdown(cancel_futures=True)`` drops the queued cells but lets each worker finish the cell
    it runs, and the interpreter waits for them at exit: a minute on a busy machine before the
    partial report is written. Python 3.14's ``terminate_workers`` does this; 3.11 has no public way.
    The pool's thread may still write to an ended worker's pipe: SIGPIPE is ignored from here on (the
    command line restores its default for ``seeupo ... | head``, which would end this process silently).
    """
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    for process in list((pool._processes or {}).values()):
        process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)  # quick now; it releases the queues' semaphores


#: What ``seeupo verify`` writes in its ``--out`` folder (``--overwrite`` moves these aside, never deletes them).
VERIFY_OUTPUTS = ("verify.json", "verify.md")


def write_report(report: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """``report`` as ``out_dir``'s :data:`VERIFY_OUTPUTS`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = (out_dir / name for name in VERIFY_OUTPUTS)
    json_path.write_text(json.dumps(report, indent=1))
    md_path.write_text(markdown(report))
    return json_path, md_path


def stderr_progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
