"""Counterexamples as measurements of ``seeupo verify``'s cells: the saved files replayed, and the cells and
Table 1 entries they turn into ``J decreased``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from seeupo.core.registry import shown_path
from seeupo.experiments.verdicts import TABLE1_CLAIMS, TABLE1_SEARCHES, saved_counterexamples, table1_verdict
from seeupo.experiments.verify.cells import BASE_SETTINGS, CellResult, VerifyConfig
from seeupo.experiments.verify.rows import Row
from seeupo.tabular.behaviour import Rollouts
from seeupo.validation.errors import InputError


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
    why exact mode refused the row's estimator (:func:`~seeupo.core.contract.exact_mode_refusal`). With rows off
    policy (``cfg.rollouts``) no claim is read and no saved counterexample replayed: both are on policy.
    """
    claim = row.claim_st if setting == "ST" else row.claim_mt
    off_policy = not cfg.rollouts.on_policy
    if off_policy:  # the paper's claims, and its searches' counterexamples, are on policy: not this setting
        claim, examples = None, []
    if cell is None:
        entry = {"paper": claim or "—", "measured": "—", "agreement": "not run" if claim else "no claim",
                 "claim_id": None if off_policy else TABLE1_CLAIMS.get((row.name, setting))}
        return entry | ({"measured": f"exact: refused ({refused})", "exact_refused": refused} if refused else {})
    cell = dataclasses.asdict(cell) if isinstance(cell, CellResult) else cell
    if cell.get("refused"):
        return {"paper": claim or "—", "measured": cell["verdict"], "agreement": "not run" if claim else "no claim",
                "exact_refused": cell["refused"],
                "claim_id": None if off_policy else TABLE1_CLAIMS.get((row.name, setting))}
    examples = table1_counterexamples(cfg, row.name, setting) if examples is None else examples
    replaying = [e for e in examples if e["reproduces"]]
    measured, agree = table1_verdict(claim, cell["verdict"], [e["search"] for e in replaying])
    return {
        "paper": claim or "—", "measured": measured, "agreement": agree,
        "random_instances": cell["verdict"], "counterexamples": examples,
        "claim_id": None if off_policy else TABLE1_CLAIMS.get((row.name, setting)),
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
                out.append({"file": shown_path(str(path)), "algorithm": name, "skipped": str(err), "reproduces": False,
                            "decreases": False})
                continue
            again = replay(example)
            J = list(again.recomputed)
            largest = max((a - b for a, b in zip(J, J[1:])), default=0.0)
            out.append({"file": shown_path(str(path)), "search": path.stem, "algorithm": name,
                        "setting": case_setting(example),
                        "parameterization": example.run.parameterization, "mode": example.run.mode,
                        "rollouts": Rollouts.of_run(example.run).words(),
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

    Each exact cell of the same algorithm, setting, parameters and rollouts becomes ``J decreased`` (its
    random instances' own outcome kept in ``random_instances``), and so does the Table 1 entry
    of the exact, independent cell; every example is listed in ``report["counterexamples"]``.
    """
    report.setdefault("counterexamples", [])
    known = {e["file"] for e in report["counterexamples"]}
    report["counterexamples"] += [e for e in examples if e["file"] not in known]
    rollouts = Rollouts.from_dict(report["config"].get("rollouts")).words()  # a run off policy is another setting
    decreasing = [e for e in report["counterexamples"] if e.get("decreases") and e.get("mode", "exact") == "exact"
                  and e.get("rollouts", "on policy") == rollouts]
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
