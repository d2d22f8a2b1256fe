"""The gradient part of ``seeupo check``: an estimator's expected update and its fixed point on agentic problems.

For every agentic family (:data:`seeupo.tabular.families.AGENTIC_FAMILIES`: the agent stops when
it chooses, intermediate rewards, stochastic tool results, token actions) and number of turns,
on random instances, exactly (:mod:`seeupo.tabular.gradient`):

* the **direction**: the expected first step of the algorithm's whole update (its estimator,
  the loss's derivative at ratio 1, the aggregation's weights, the ``M`` factor's first value and
  the schedule: :func:`seeupo.tabular.gradient.update_direction`) at several start policies
  (uniform and random) against the policy gradient, per turn and whole; the family's verdict is
  the worst case's, and that case is saved (``gradient/NAME_FAMILY.json``, format :data:`FORMAT`)
  so that ``seeupo replay`` recomputes it. The estimator's own direction is measured beside it
  (a component), and where the update's verdict is worse, the part that biases it is named
  (:func:`seeupo.tabular.gradient.biasing_part`);
* the **fixed point**: plain exact ascent along the update from the uniform policy (no
  optimizer, no clipping), on problems of 2 and 3 turns: does it reach ``J*``, and if not, where
  does it stop.

The update's clipping beyond ratio 1 and its optimizer are judged by the monotonicity searches and
the verify cells.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from seeupo.core.config import AlgorithmConfig, PRESETS
from seeupo.tabular.gradient import (
    DIRECTIONS, FIXED_POINTS, LEVELS, REL_TOL, STATIONARY, biasing_part, gradient_directions, plain_ascent, worst,
)
from seeupo.tabular.instances import policy_from_dict, problem_from_dict, problem_to_dict
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.families import AGENTIC_FAMILIES, AGENTIC_FAMILY_TEXT
from seeupo.tabular.problems import DTYPE, TreeMDP, random_family
from seeupo.validation.errors import InputError
from seeupo.validation.files import dumps, read_json
from seeupo.validation.schemas import as_object, check_keys, dataclass_from_dict

FORMAT = "seeupo-gradient/1"


@dataclass(frozen=True)
class GradientConfig:
    """Sizes of the gradient part.

    families: the agentic families checked; turns: their numbers of turns (T up to 3).
    instances: random problems per family and number of turns; starts: random start policies
      per instance (logits drawn with scale 1), besides the uniform one.
    group_size: ``G`` of a group estimator; reward_levels: rewards on that many levels in [0, 1].
    ascent_steps, ascent_lr: plain exact ascent along the update from the uniform policy (0 steps:
      no fixed point); ascent_turns: the numbers of turns whose instances it climbs (the dearest part).
    """

    families: tuple[str, ...] = tuple(AGENTIC_FAMILIES)
    turns: tuple[int, ...] = (2, 3)
    instances: int = 6
    starts: int = 2
    group_size: int = 4
    reward_levels: int = 3
    ascent_steps: int = 300
    ascent_lr: float = 10.0
    ascent_turns: tuple[int, ...] = (2, 3)
    seed: int = 0


QUICK = GradientConfig(instances=3, starts=1, ascent_steps=150)


def family_problems(cfg: GradientConfig, family: str, turns: int) -> TreeMDP:
    """The random instances of one family and number of turns (seeded by ``cfg.seed``, the family and the turns)."""
    index = list(AGENTIC_FAMILIES).index(family)
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + 10 * index + turns)
    return random_family(family, cfg.instances, turns, reward_levels=cfg.reward_levels, generator=gen)


def start_policies(problem: TreeMDP, cfg: GradientConfig, family: str, turns: int) -> list[list[torch.Tensor]]:
    """The uniform policy and ``cfg.starts`` random ones (:func:`random_starts`), seeded by the family and turns."""
    gen = torch.Generator().manual_seed(cfg.seed * 7919 + list(AGENTIC_FAMILIES).index(family) * 31 + turns)
    return random_starts(problem, cfg.starts, gen)


def random_starts(problem: TreeMDP, starts: int, generator: torch.Generator) -> list[list[torch.Tensor]]:
    """The uniform policy and ``starts`` random ones (softmax of logits with scale 1), per turn ``[I, N_t, A_t]``."""
    out = [TabularPolicy(problem).action_probs()]
    for _ in range(starts):
        out.append(TabularPolicy(problem, init_scale=1.0, generator=generator).action_probs())
    return [[p.detach() for p in probs] for probs in out]


def _json_ready(value: Any) -> Any:
    """``value`` with every NaN (a cosine where a gradient is zero) as ``None``: strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_ready(v) for v in value]
    return value


def policy_at(problem: TreeMDP, probs: list[torch.Tensor]) -> TabularPolicy:
    """The independent tabular policy of ``problem`` whose action probabilities are ``probs``."""
    policy = TabularPolicy(problem)
    policy.set_action_probs(probs)
    return policy


def check_family(algorithm: AlgorithmConfig, cfg: GradientConfig, family: str, turns: int) -> dict[str, Any]:
    """Directions (the update's and, as a component, the estimator's) and fixed points of one family and number of
    turns; the update's worst case with its instance, and the part of the update that biases it."""
    start = time.perf_counter()
    algorithm = algorithm.replace(group_size=cfg.group_size)
    problem = family_problems(cfg, family, turns)
    order = [*DIRECTIONS, STATIONARY]
    counts = {level: {v: 0 for v in order} for level in ("update", "estimator")}
    worst_case: dict[str, Any] | None = None
    for k, probs in enumerate(start_policies(problem, cfg, family, turns)):
        policy = policy_at(problem, probs)
        for d in gradient_directions(problem, policy, algorithm, "estimator"):
            counts["estimator"][d.verdict] += 1
        for i, d in enumerate(gradient_directions(problem, policy, algorithm, "update")):
            counts["update"][d.verdict] += 1
            rank = (order.index(d.verdict) if d.verdict != STATIONARY else -1, -(d.cosine if not math.isnan(d.cosine) else 1))
            if worst_case is None or rank > worst_case["rank"]:
                worst_case = {"rank": rank, "instance": i, "start": k, "probs": [p[i: i + 1] for p in probs],
                              "direction": _json_ready(dataclasses.asdict(d))}
    assert worst_case is not None
    verdicts = {level: worst([v for v, n in c.items() for _ in range(n)]) for level, c in counts.items()}
    result: dict[str, Any] = {
        "family": family, "turns": turns, "text": AGENTIC_FAMILY_TEXT[family], "instances": cfg.instances,
        "starts": cfg.starts + 1, "counts": {k: v for k, v in counts["update"].items() if v},
        "verdict": verdicts["update"],
        "worst": {"instance": worst_case["instance"], "start": "uniform" if worst_case["start"] == 0 else f"random {worst_case['start']}",
                  **worst_case["direction"]},
        "estimator": {"verdict": verdicts["estimator"], "counts": {k: v for k, v in counts["estimator"].items() if v}},
        "_case": (problem.instance(worst_case["instance"]), worst_case["probs"]),
    }
    if order.index(verdicts["update"]) > order.index(verdicts["estimator"]) and verdicts["update"] != STATIONARY:
        one, probs = result["_case"]
        result["cause"] = biasing_part(one, policy_at(one, probs), algorithm, 0)
    if cfg.ascent_steps and turns in cfg.ascent_turns:
        ascent = plain_ascent(problem, algorithm, lr=cfg.ascent_lr, steps=cfg.ascent_steps, level="update")
        fixed = {v: ascent.verdict.count(v) for v in FIXED_POINTS if ascent.verdict.count(v)}
        gaps = (ascent.J_star - ascent.J[-1]).tolist()
        i = max(range(cfg.instances), key=lambda j: gaps[j])
        result["fixed_point"] = {
            "counts": fixed, "steps": ascent.steps, "lr": ascent.lr, "gap_tol": ascent.gap_tol,
            "verdict": next((v for v in ("stops below J*", "still improving") if v in fixed), "reaches J*"),
            "worst": {"instance": i, "J_start": float(ascent.J[0, i]), "J_end": float(ascent.J[-1, i]),
                      "J_star": float(ascent.J_star[i]), "first_turn_probs": ascent.probs[0][i, 0].tolist()},
        }
    result["seconds"] = time.perf_counter() - start
    return result


def run_gradient(name: str, cfg: GradientConfig, out: Path | None, plugins: tuple[str, ...] = (),
                 say: Callable[[str], None] = print, families: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The gradient part of ``check name``: every family and number of turns; the worst case of each saved under ``out``.

    Each family's entry is appended to ``families`` as it finishes (an interrupted check reports
    those: :func:`summarise`). Returns :func:`summarise` of them all.
    """
    start = time.perf_counter()
    algorithm = PRESETS[name]
    families = [] if families is None else families
    for family in cfg.families:
        for turns in cfg.turns:
            entry = check_family(algorithm, cfg, family, turns)
            problem, probs = entry.pop("_case")
            if out is not None:
                path = out / "gradient" / f"{name}_{family}_T{turns}.json"
                save_case(path, problem, probs, algorithm.replace(group_size=cfg.group_size), plugins, entry["worst"])
                entry["file"] = str(path.relative_to(out))
            families.append(entry)
            say(f"gradient {family} T={turns}: {entry['verdict']}" + (
                f"; ascent {entry['fixed_point']['verdict']}" if "fixed_point" in entry else "") + f" ({entry['seconds']:.1f} s)")
    return summarise(families, cfg, time.perf_counter() - start)


def summarise(families: list[dict[str, Any]], cfg: GradientConfig, seconds: float) -> dict[str, Any]:
    """The gradient part's report from its finished families: ``{"direction", "fixed_point", "families", ...}``.

    ``direction`` is the worst over families (:func:`seeupo.tabular.gradient.worst`); ``fixed_point``
    ``"stops below J*"`` if any instance's ascent stopped short, ``"still improving"`` if any was
    inconclusive, else ``"reaches J*"`` (``None`` without ascent). No family finished: ``{"skipped": ...}``,
    never a verdict.
    """
    if not families:
        return {"skipped": "no family finished (the check was stopped first)"}
    fixed = [f["fixed_point"]["verdict"] for f in families if "fixed_point" in f]
    planned = len(cfg.families) * len(cfg.turns)
    causes = sorted({f["cause"] for f in families if "cause" in f})
    return {
        "direction": worst([f["verdict"] for f in families]),
        "estimator_direction": worst([f["estimator"]["verdict"] for f in families if "estimator" in f]),
        "causes": causes,
        "fixed_point": next((v for v in ("stops below J*", "still improving") if v in fixed), "reaches J*" if fixed else None),
        "families": families,
        "complete": len(families) == planned,
        "config": dataclasses.asdict(cfg),
        "tolerance": REL_TOL,
        "seconds": seconds,
    }


# ---------------------------------------------------------------------------- files


def save_case(path: Path, problem: TreeMDP, probs: list[torch.Tensor], algorithm: AlgorithmConfig,
              plugins: tuple[str, ...], recorded: dict[str, Any]) -> None:
    """A replayable gradient case: the instance, the start policy, the algorithm, what was measured."""
    data = {
        "format": FORMAT,
        "instance": problem_to_dict(problem),
        "start": {"action_probs": [p[0].tolist() for p in probs]},
        "algorithm": algorithm.to_dict(),
        "recorded": {k: recorded[k] for k in ("verdict", "cosine", "turn_cosines", "turn_scales", "downhill_turn")}
        | {"level": "update"},
    } | ({"plugins": list(plugins)} if plugins else {})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(data, indent=1) + "\n")


@dataclass
class GradientCase:
    """A gradient case read back from its file (:func:`load_case`)."""

    problem: TreeMDP
    start: list[torch.Tensor]
    algorithm: AlgorithmConfig
    recorded: dict[str, Any]
    plugins: tuple[str, ...] = ()


def is_gradient_file(path: str | Path) -> bool:
    """Whether ``path`` holds a gradient case (its ``format`` field); a file that cannot be read is not one (the
    counterexample loader then reports it)."""
    try:
        data = read_json(path)
    except InputError:
        return False
    return isinstance(data, dict) and data.get("format") == FORMAT


def load_case(path: str | Path) -> GradientCase:
    """Read and validate a gradient case file; errors name the file and the field (:class:`InputError`)."""
    from seeupo.experiments.counterexamples import LIMITS, _recorded_plugins

    try:
        data = as_object(read_json(path), None)
        if data.get("format") != FORMAT:
            raise InputError("format", f"not a gradient case file (expected \"format\": \"{FORMAT}\")")
        check_keys(data, {"format", "instance", "start", "algorithm", "recorded"}, {"plugins"})
        plugins = _recorded_plugins(data.get("plugins", []))
        try:
            problem = problem_from_dict(data["instance"])
        except InputError as err:
            raise err.inside("instance") from None
        try:
            start = policy_from_dict(data["start"], problem)
        except InputError as err:
            raise err.inside("start") from None
        algorithm = dataclass_from_dict(AlgorithmConfig, data["algorithm"], "algorithm", LIMITS)
        recorded = as_object(data["recorded"], "recorded")
        check_keys(recorded, {"verdict", "cosine", "turn_cosines", "turn_scales", "downhill_turn"}, {"level"}, "recorded")
        if recorded.get("level", "estimator") not in LEVELS:
            raise InputError("recorded.level", f"unknown level {recorded['level']!r}; expected one of {list(LEVELS)}")
        return GradientCase(problem, start, algorithm, recorded, plugins)
    except InputError as err:
        raise err.in_file(path) from None


def replay_case(case: GradientCase) -> tuple[bool, dict[str, Any]]:
    """Recompute a gradient case: ``(reproduces, recomputed)``; it reproduces when the verdict is the same and
    the cosines agree to 1e-9."""
    # a case recorded before the update-level verdict is the estimator's
    level = case.recorded.get("level", "estimator")
    d = dataclasses.asdict(gradient_directions(case.problem, policy_at(case.problem, [p.to(DTYPE) for p in case.start]),
                                               case.algorithm, level)[0])

    def same(a: Any, b: Any) -> bool:
        a, b = float("nan") if a is None else a, float("nan") if b is None else b
        return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-9

    ok = (d["verdict"] == case.recorded["verdict"] and same(d["cosine"], case.recorded["cosine"])
          and all(same(a, b) for a, b in zip(d["turn_cosines"], case.recorded["turn_cosines"])))
    return ok, d
