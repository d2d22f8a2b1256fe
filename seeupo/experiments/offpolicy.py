"""Exact answers to two questions of 2026: what each rollout correction does with rows of another policy, and
which gradient each KL estimator gives where it sits.

``python -m seeupo.experiments.offpolicy --out DIR`` writes ``corrections.md``, ``runs.md``, ``kl.md`` and
``admission.md`` (and their ``.json``):

* corrections: for each behaviour (an engine's sampler, or a stale policy) and each registered correction, the
  expected first step of an unbiased policy-gradient update (the exact advantage ``Q - V`` of the policy being
  updated, each trajectory's tokens summed) against ``grad J`` of that policy, on seeded random problems: the worst
  cosine, the largest error relative to ``|grad J|``, and the verdict (*unbiased*, *biased but uphill*, *points
  downhill*); the estimator is exact so that every bias is the correction's;
* runs: each correction's whole runs on policy, on rows one and four updates stale, at temperature 0.7 and through
  top-p 0.9:
  whether ``J`` ever fell, and where it stopped (``seeupo verify``'s words, the final gap to ``J*``);
* admission: an asynchronous trainer's stream, where an episode of ``n`` turns is read ``n`` updates late and a
  rule may drop long episodes (:func:`seeupo.tabular.behaviour.admitted_batch`), on the stop family; for GRPO, whole
  groups, as old as their longest episode;
* KL: for each estimator and placement, the expected gradient of the KL term against the exact gradients of
  ``KL(pi || ref)`` and ``KL(ref || pi)`` of the trajectory distributions, on one-token answers and on answers of
  two tokens over two turns (:mod:`seeupo.tabular.kl`).

Every number is exact (enumerated paths), a function of the seed; nothing is sampled.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from seeupo.core.config import preset
from seeupo.core.registry import KL_ESTIMATORS, ROLLOUT_CORRECTIONS
from seeupo.tabular.behaviour import Sampler, behaviour_policy
from seeupo.tabular.gradient import REL_TOL, policy_gradient, update_direction
from seeupo.tabular.kl import kl_gradients, reference_policy
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import TreeMDP, random_family, random_token_bandit
from seeupo.tabular.train import AlgorithmStep, RunConfig

#: The behaviours compared: an inference engine's sampler, token by token, or the policy some updates earlier.
SAMPLERS: dict[str, Sampler] = {
    "top-p 0.9": Sampler(top_p=0.9),
    "top-k 2": Sampler(top_k=2),
    "temperature 0.7": Sampler(temperature=0.7),
    "noise 0.3 (other kernels)": Sampler(noise=0.3, seed=1),
}
STALENESS = (1, 4)
KL_PLACEMENTS = ("loss", "loss_is", "reward")


def _problems(instances: int, seed: int) -> list[tuple[str, TreeMDP]]:
    gen = lambda k: torch.Generator().manual_seed(seed * 1009 + k)  # noqa: E731
    return [
        ("1 turn, answers of 3 tokens of 2", random_token_bandit(instances, 1, 2, 3, reward_levels=3, generator=gen(0))),
        ("2 turns, answers of 2 tokens of 3", random_token_bandit(instances, 2, 3, 2, reward_levels=3, generator=gen(1))),
        ("stop or continue, 2 turns of 2-token actions", random_family("tokens", instances, 2, reward_levels=3,
                                                                      generator=gen(2))),
    ]


def _against(step: torch.Tensor, true: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per instance, the cosine of ``step`` with ``true`` (``nan`` where either is zero) and ``|step - true| / |true|``."""
    cosines = [float(s @ g / (s.norm() * g.norm())) if s.norm() > 0 and g.norm() > 0 else math.nan
               for s, g in zip(step, true)]
    errors = [float((s - g).norm() / g.norm()) if g.norm() > 0 else 0.0 for s, g in zip(step, true)]
    return cosines, errors


def _worst_turn(step: list[torch.Tensor], true: list[torch.Tensor]) -> float | None:
    """The smallest cosine over turns and instances of each turn's step with that turn's ``grad J`` (turns where
    either is zero left out); ``None`` for one turn (the whole step's cosine says it)."""
    if len(step) < 2:
        return None
    found = [c for s, g in zip(step, true) for c in _against(s, g)[0] if not math.isnan(c)]
    return min(found) if found else None


def _verdict(cosines: list[float], errors: list[float]) -> str:
    """The gradient verdicts' words: unbiased (to ``REL_TOL``), unbiased up to a positive scale (parallel to
    ``grad J`` on every instance), biased but uphill, points downhill."""
    if max(errors) <= REL_TOL:
        return "unbiased"
    if all(c >= 1 - 1e-9 for c in cosines):
        return "unbiased up to a positive scale"
    return "points downhill" if min(cosines) < 0 else "biased but uphill"


def _stale(problem: TreeMDP, policy: TabularPolicy, updates: int) -> tuple[TabularPolicy, TabularPolicy]:
    """``(mu, pi)``: ``policy`` frozen, and a copy after ``updates`` exact RLOO updates (the trainer ahead of its data)."""
    mu = reference_policy(problem, policy)
    ahead = TabularPolicy(problem)
    ahead.set_action_probs([p.detach() for p in policy.action_probs()])
    step = AlgorithmStep(preset("rloo", advantage="oracle"), RunConfig(mode="exact", optimizer="sgd", lr=2.0))
    for _ in range(updates):
        step(problem, ahead)
    return mu, ahead


def corrections_table(instances: int = 4, seed: int = 0, say=lambda m: None) -> dict[str, Any]:
    """Every (behaviour, correction) on :func:`_problems`, from a random start per instance (module docstring)."""
    rows = []
    behaviours = [(name, ("sampler", s)) for name, s in SAMPLERS.items()] + [
        (f"stale by {k} update{'s' if k > 1 else ''}", ("stale", k)) for k in STALENESS]
    for words, problem in _problems(instances, seed):
        start = TabularPolicy(problem, init_scale=1.0, generator=torch.Generator().manual_seed(seed))
        for name, (kind, value) in behaviours:
            if kind == "sampler":
                policy, mu = start, behaviour_policy(problem, start, value)
            else:
                mu, policy = _stale(problem, start, value)
            true = torch.cat(policy_gradient(problem, policy), 1)
            for correction, settings in _corrections():
                cfg = preset("rloo", advantage="oracle", aggregation="seq_mean_token_sum", aggregation_rows="trajectory",
                             **settings)
                per_turn = update_direction(problem, policy, cfg, behaviour=mu)[0]
                cosines, errors = _against(torch.cat(per_turn, 1), true)
                rows.append({"problem": words, "behaviour": name, "correction": correction,
                             "worst_cosine": min(cosines), "largest_error": max(errors),
                             "verdict": _verdict(cosines, errors),
                             "worst_turn_cosine": _worst_turn(per_turn, policy_gradient(problem, policy))})
        say(f"corrections: {words} done")
    return {"instances": instances, "seed": seed, "rows": rows,
            "corrections": [c for c, _ in _corrections()], "behaviours": [b for b, _ in behaviours]}


def _corrections() -> list[tuple[str, dict[str, Any]]]:
    """Every registered correction at its defaults, and the trajectory's importance weight without its cap."""
    return [(c, {"correction": c}) for c in ROLLOUT_CORRECTIONS.names()] + [
        ("sequence_is, no cap", {"correction": "sequence_is", "correction_cap": math.inf})]


#: The admission settings compared: (words, admit episodes of at most this many turns (None: all), stale by length).
ADMISSIONS = (("every episode, fresh", None, False), ("only 1-turn episodes, fresh", 1, False),
              ("every episode, each read its length in updates late", None, True),
              ("episodes of at most T-1 turns, each read its length late", -1, True))


#: The runs of the runs table: (words, RunConfig's staleness and sampler).
RUN_BEHAVIOURS: tuple[tuple[str, int, Sampler | None], ...] = (
    ("on policy", 0, None), ("stale by 1 update", 1, None), ("stale by 4 updates", 4, None),
    ("temperature 0.7", 0, Sampler(temperature=0.7)), ("top-p 0.9", 0, Sampler(top_p=0.9)),
)


#: The runs' optimizer step (SGD): large enough that 100 exact updates come within a few thousandths of ``J*``.
RUN_LR = 10.0


def runs_table(instances: int = 4, seed: int = 0, updates: int = 100, say=lambda m: None) -> dict[str, Any]:
    """Where each correction's runs lead: the exact advantage's plain policy-gradient updates (SGD at :data:`RUN_LR`, each
    trajectory's tokens summed) from a random start, every update's rows from a stale policy or through an engine's
    sampler (:class:`seeupo.tabular.train.RunConfig`'s ``staleness`` and ``sampler``), judged in ``seeupo verify``'s
    words (:func:`seeupo.experiments.verdicts.history_outcome`: whether ``J`` ever fell, whether it reached ``J*``
    or stalled below it) with the largest final gap to ``J*`` (the fixed point) and the largest decrease."""
    from seeupo.experiments.verdicts import history_outcome
    from seeupo.tabular.train import run

    rows = []
    for words, problem in _problems(instances, seed)[:2]:
        for name, staleness, sampler in RUN_BEHAVIOURS:
            for correction, settings in _corrections():
                cfg = preset("rloo", advantage="oracle", aggregation="seq_mean_token_sum", aggregation_rows="trajectory",
                             **settings)
                run_cfg = RunConfig(mode="exact", optimizer="sgd", lr=RUN_LR, iterations=updates, init_scale=1.0,
                                    staleness=staleness, sampler=sampler, seed=seed)
                outcome = history_outcome(run(problem, cfg, run_cfg), "exact")
                rows.append({"problem": words, "behaviour": name, "correction": correction,
                             "measured": outcome["measured"], "max_final_gap": outcome["max_final_gap"],
                             "largest_decrease": outcome["largest_decrease"]})
        say(f"runs: {words} done")
    return {"instances": instances, "seed": seed, "updates": updates, "lr": RUN_LR, "rows": rows,
            "corrections": [c for c, _ in _corrections()], "behaviours": [b for b, _, _ in RUN_BEHAVIOURS]}


def runs_markdown(table: dict[str, Any]) -> str:
    lines = ["# Rollout corrections over whole runs: does J rise, and where does it stop?", "",
             f"Seed {table['seed']}, {table['instances']} random instances per problem from a random start; "
             f"{table['updates']} exact updates of the exact advantage (plain policy gradient, SGD at step {table['lr']:g}, each "
             "trajectory's tokens summed), every update's rows from the policy k updates earlier or through the "
             "engine's sampler. Cell: `seeupo verify`'s words (*converges*: within 1e-3 of J* on every instance; "
             "*J decreased*; *monotone, stuck below J\\**; *monotone, still improving*), then the largest final gap "
             "to J* over the instances and, where J fell, the largest single-update decrease.", ""]

    def cell(r: dict[str, Any]) -> str:
        fell = f", fell {r['largest_decrease']:.1e}" if r["measured"] == "J decreased" else ""
        return f"{r['measured']} (gap {r['max_final_gap']:.2g}{fell})"

    return "\n".join(lines + _behaviour_by_correction(table, "Rows", cell))


def _behaviour_by_correction(table: dict[str, Any], first: str, cell: Any) -> list[str]:
    """Per problem of ``table["rows"]``, a heading and a table with a row per behaviour and a column per correction,
    each cell ``cell(row)``."""
    lines: list[str] = []
    by_key = {(r["problem"], r["behaviour"], r["correction"]): r for r in table["rows"]}
    for problem in dict.fromkeys(r["problem"] for r in table["rows"]):
        lines += [f"## {problem}", "", f"| {first} | " + " | ".join(f"`{c}`" for c in table["corrections"]) + " |",
                  "|---|" + "---|" * len(table["corrections"])]
        lines += [f"| {behaviour} | " + " | ".join(cell(by_key[(problem, behaviour, c)]) for c in table["corrections"])
                  + " |" for behaviour in table["behaviours"]]
        lines.append("")
    return lines


#: The group estimator of the admission table: GRPO as its preset (no KL term), groups of this size enumerated.
ADMISSION_GROUP = 3


def admission_table(instances: int = 4, seed: int = 0) -> dict[str, Any]:
    """An asynchronous trainer's admission rule (:func:`seeupo.tabular.behaviour.admitted_batch`): episodes of ``n``
    turns take ``n`` updates to finish, so they are ``n`` updates stale when read, and a rule may drop the long
    ones. On the stop family (the agent chooses when to stop), the exact advantage's expected first step against
    ``grad J``, without a correction and with the uncapped trajectory weight, and the admitted mean episode length;
    and GRPO (groups of :data:`ADMISSION_GROUP`, admitted whole and as old as their longest episode) against its own
    step on every group, fresh."""
    from seeupo.tabular.behaviour import admitted_batch, admitted_direction

    rows, group_rows = [], []
    for turns in (2, 3):
        problem = random_family("stop", instances, turns, reward_levels=3,
                                generator=torch.Generator().manual_seed(seed * 1009 + 20 + turns))
        start = TabularPolicy(problem, init_scale=1.0, generator=torch.Generator().manual_seed(seed))
        snapshots = [reference_policy(problem, start)]
        ahead = TabularPolicy(problem)
        ahead.set_action_probs([p.detach() for p in start.action_probs()])
        step = AlgorithmStep(preset("rloo", advantage="oracle"), RunConfig(mode="exact", optimizer="sgd", lr=2.0))
        for _ in range(turns):
            step(problem, ahead)
            snapshots.append(reference_policy(problem, ahead))
        policy, past = ahead, snapshots[:-1]
        true = torch.cat(policy_gradient(problem, policy), 1)
        grpo = preset("grpo", group_size=ADMISSION_GROUP)
        grpo_fresh = torch.cat(admitted_direction(problem, policy, grpo, None, turns), 1)
        for words, max_turns, stale in ADMISSIONS:
            age = turns if max_turns is None else (turns - 1 if max_turns < 0 else max_turns)
            for correction, settings in (("none", {"correction": "none"}),
                                         ("sequence_is, no cap", {"correction": "sequence_is", "correction_cap": math.inf})):
                cfg = preset("rloo", advantage="oracle", aggregation="seq_mean_token_sum", aggregation_rows="trajectory",
                             **settings)
                step_ = torch.cat(admitted_direction(problem, policy, cfg, past if stale else None, age), 1)
                cosines, errors = _against(step_, true)
                batch, _ = admitted_batch(problem, policy, cfg, past if stale else None, age)
                length = float((batch.weight * batch.valid).sum() / batch.num_instances)
                rows.append({"problem": f"stop or continue, {turns} turns", "admission": words, "correction": correction,
                             "worst_cosine": min(cosines), "largest_error": max(errors),
                             "verdict": _verdict(cosines, errors), "mean_turns": length})
                grouped = torch.cat(admitted_direction(problem, policy, grpo.replace(**settings), past if stale else None,
                                                       age), 1)
                own_cosines, _ = _against(grouped, grpo_fresh)
                true_cosines, _ = _against(grouped, true)
                batch, _ = admitted_batch(problem, policy, grpo, past if stale else None, age)
                group_rows.append({"problem": f"stop or continue, {turns} turns", "admission": words,
                                   "correction": correction, "worst_cosine_fresh": _worst(own_cosines),
                                   "worst_cosine_grad_J": _worst(true_cosines),
                                   "mean_turns": float((batch.weight * batch.valid).sum() / batch.num_instances)})
    return {"instances": instances, "seed": seed, "rows": rows, "group_size": ADMISSION_GROUP, "grpo_rows": group_rows}


def _worst(cosines: list[float]) -> dict[str, Any]:
    """The smallest cosine over the instances with a step (``None`` when none has one) and how many have none (a zero
    step: ``nan``)."""
    moving = [c for c in cosines if not math.isnan(c)]
    return {"cosine": min(moving) if moving else None, "zero": len(cosines) - len(moving), "of": len(cosines)}


def admission_markdown(table: dict[str, Any]) -> str:
    lines = ["# Admission of stale episodes: the expected update against grad J, exactly", "",
             f"Seed {table['seed']}, {table['instances']} random stop-or-continue problems per row (the agent chooses when "
             "to stop); the policy after T exact RLOO updates from a random start, the earlier policies its history. An "
             "episode of n turns took n updates, so it is read n updates late (\"each read its length late\"); a rule "
             "may drop long episodes. The exact advantage, each trajectory's tokens summed, so that every bias is the "
             "stream's. \"mean turns\": the admitted episodes' mean length. Cell: verdict (worst cosine, largest relative "
             "error).", "",
             "| Problem | Admitted | mean turns | no correction | sequence_is, no cap |", "|---|---|---|---|---|"]
    by_key = {(r["problem"], r["admission"], r["correction"]): r for r in table["rows"]}
    for problem in dict.fromkeys(r["problem"] for r in table["rows"]):
        for words, _, _ in ADMISSIONS:
            cells = []
            for correction in ("none", "sequence_is, no cap"):
                r = by_key[(problem, words, correction)]
                cells.append(f"{r['verdict']} ({r['worst_cosine']:.3f}, {r['largest_error']:.2g})")
            mean_turns = by_key[(problem, words, "none")]["mean_turns"]
            lines.append(f"| {problem} | {words} | {mean_turns:.3f} | " + " | ".join(cells) + " |")
    if table.get("grpo_rows"):
        lines += ["", f"## GRPO: groups of {table['group_size']} admitted whole", "",
                  "A group's episodes start together, drawn by one policy, and the group is read when its longest "
                  "episode ends: it is as old as that episode and, under a rule that drops stale groups (tinker-cookbook's; "
                  "its PR #822), dropped whole. GRPO's preset (no KL term), every group draw enumerated. Cell: the worst "
                  "cosine of the admitted step with GRPO's own step on every group, fresh; then with grad J, over the "
                  "problems where the step is not zero (\"zero step\": on every problem the admitted groups carry no "
                  "signal; \"k of n zero\": on k of them).", "",
                  "| Problem | Admitted | mean turns | no correction: vs fresh, vs grad J | sequence_is, no cap: vs fresh, "
                  "vs grad J |", "|---|---|---|---|---|"]

        def shown(worst: dict[str, Any]) -> str:
            if worst["cosine"] is None:
                return "zero step"
            return f"{worst['cosine']:.3f}" + (f" ({worst['zero']} of {worst['of']} zero)" if worst["zero"] else "")

        by_group = {(r["problem"], r["admission"], r["correction"]): r for r in table["grpo_rows"]}
        for problem in dict.fromkeys(r["problem"] for r in table["grpo_rows"]):
            for words, _, _ in ADMISSIONS:
                cells = [f"{shown(by_group[(problem, words, c)]['worst_cosine_fresh'])}, "
                         f"{shown(by_group[(problem, words, c)]['worst_cosine_grad_J'])}"
                         for c in ("none", "sequence_is, no cap")]
                lines.append(f"| {problem} | {words} | {by_group[(problem, words, 'none')]['mean_turns']:.3f} | "
                             + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def kl_table(instances: int = 4, seed: int = 0) -> dict[str, Any]:
    """Every (estimator, placement): its expected gradient against both KL directions (module docstring)."""
    gen = lambda k: torch.Generator().manual_seed(seed * 1009 + k)  # noqa: E731
    settings = [("one token of 4", random_token_bandit(instances, 1, 4, 1, generator=gen(10))),
                ("2 turns of 2 tokens of 3", random_token_bandit(instances, 2, 3, 2, generator=gen(11)))]
    rows = []
    for words, problem in settings:
        policy = TabularPolicy(problem, init_scale=1.0, generator=gen(12))
        reference = reference_policy(problem, TabularPolicy(problem, init_scale=1.0, generator=gen(13)))
        for estimator in KL_ESTIMATORS.names():
            for placement in KL_PLACEMENTS:
                found = kl_gradients(problem, policy, reference, estimator, placement)
                term = torch.cat(found.term, 1)
                out = {"problem": words, "estimator": estimator, "placement": placement}
                for direction, exact in (("reverse", found.reverse), ("forward", found.forward)):
                    exact = torch.cat(exact, 1)
                    out[direction] = max(float((t - e).norm() / e.norm()) for t, e in zip(term, exact))
                out["zero"] = float(term.norm(dim=1).max())
                rows.append(out)
    return {"instances": instances, "seed": seed, "rows": rows}


def _gradient_words(row: dict[str, Any]) -> str:
    if row["zero"] < 1e-12:
        return "0"
    if row["reverse"] < 1e-9:
        return "grad KL(pi || ref)"
    if row["forward"] < 1e-9:
        return "grad KL(ref || pi)"
    return f"neither (error {min(row['reverse'], row['forward']):.2g} to the nearer)"


def kl_markdown(table: dict[str, Any]) -> str:
    lines = ["# KL estimators and placements: the gradient each gives, exactly", "",
             f"Seed {table['seed']}, {table['instances']} random instances per problem, a random policy and reference; "
             "the expected gradient of the KL term (on policy) against the exact gradients of both KL directions of "
             "the trajectory distributions (`seeupo.tabular.kl`). \"neither\" gives the largest relative error to the "
             "nearer direction over the instances.", "",
             "| Problem | Estimator | In the loss | In the loss, times pi/pi_old | In the reward |", "|---|---|---|---|---|"]
    by_key = {(r["problem"], r["estimator"], r["placement"]): r for r in table["rows"]}
    for problem in dict.fromkeys(r["problem"] for r in table["rows"]):
        for estimator in dict.fromkeys(r["estimator"] for r in table["rows"]):
            cells = [_gradient_words(by_key[(problem, estimator, p)]) for p in KL_PLACEMENTS]
            lines.append(f"| {problem} | `{estimator}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def corrections_markdown(table: dict[str, Any]) -> str:
    lines = ["# Rollout corrections: the expected update against grad J, exactly", "",
             f"Seed {table['seed']}, {table['instances']} random instances per problem, one random start each; the "
             "exact advantage `Q - V` of the policy being updated and one plain policy-gradient step with each "
             "trajectory's tokens summed (its expectation is `grad J` on policy), so that every bias below is the "
             "correction's. Each cell: the verdict, the "
             "worst cosine with `grad J` and the largest error relative to `|grad J|` over the instances (with several "
             "turns, then the worst cosine of one turn's step with that turn's `grad J`). Defaults: "
             "`correction_cap` 2, `correction_floor` 0.5, `m2_tau` 0.04 (`docs/off_policy.md`).", ""]

    def cell(r: dict[str, Any]) -> str:
        turn = "" if r.get("worst_turn_cosine") is None else f"; {r['worst_turn_cosine']:.3f}"
        return f"{r['verdict']} ({r['worst_cosine']:.3f}, {r['largest_error']:.2g}{turn})"

    return "\n".join(lines + _behaviour_by_correction(table, "Behaviour", cell))


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (a bad value is argparse's one-line error, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def report_folder(parser: argparse.ArgumentParser, out: str, names: tuple[str, ...], overwrite: bool) -> Path:
    """``out`` made ready for a report's ``names``: an earlier report's files there are kept unless ``overwrite``
    (a one-line error, exit 2, names the first)."""
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        parser.error(f"argument --out: {folder} is a file, not a folder")
    earlier = [n for n in names if (folder / n).exists()]
    if earlier and not overwrite:
        parser.error(f"{folder / earlier[0]} holds an earlier report; pass --overwrite to replace it")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


#: The report's files (each as ``.md`` and ``.json``).
REPORTS = ("corrections", "runs", "kl", "admission")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seeupo.experiments.offpolicy", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the folder for corrections, runs, kl and admission (.md and .json)")
    parser.add_argument("--instances", type=positive_int, default=4)
    parser.add_argument("--updates", type=positive_int, default=100, help="exact updates per run of the runs table")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier report in --out")
    args = parser.parse_args(argv)
    out = report_folder(parser, args.out, tuple(f"{n}.{e}" for n in REPORTS for e in ("md", "json")), args.overwrite)
    start = time.perf_counter()
    tables = {"corrections": corrections_table(args.instances, args.seed, say=print),
              "runs": runs_table(args.instances, args.seed, args.updates, say=print),
              "kl": kl_table(args.instances, args.seed), "admission": admission_table(args.instances, args.seed)}
    seconds = time.perf_counter() - start
    writers = {"corrections": corrections_markdown, "runs": runs_markdown, "kl": kl_markdown,
               "admission": admission_markdown}
    for name, table in tables.items():
        table["seconds"] = round(seconds, 1)
        (out / f"{name}.json").write_text(json.dumps(table, indent=1) + "\n")
        (out / f"{name}.md").write_text(writers[name](table))
    print(f"wrote {', '.join(f'{out}/{n}.md' for n in REPORTS)} ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
