"""Counterexamples: self-contained, replayable records of an update that lowers ``J``.

A counterexample file (JSON, ``"format": "seeupo-counterexample/1"``) holds everything needed
to recompute it from scratch: the instance (the format of :mod:`seeupo.tabular.instances`), the
initial policy's parameters, the algorithm and run settings, and the recorded exact ``J``
after each iteration. :func:`replay` recomputes the run and compares.

:meth:`Counterexample.load` validates a file strictly before anything runs: unknown or missing
fields, values of the wrong type, ``policy_state`` tables whose names or shapes do not match
the policy the run settings build, and settings outside :data:`LIMITS` (at most
:data:`MAX_STEPS` optimizer steps in all, batches of at most :data:`MAX_BATCH`) raise :class:`~seeupo.validation.errors.InputError` naming
the file and the field. A file that is valid but whose recorded ``J`` differ from the
recomputed ones is not an error: :func:`replay` reports it.

:func:`search` looks for one with hypothesis: it draws (problem, initial policy, settings)
cases from a strategy, keeps those where ``J`` decreases by more than ``tol``, and shrinks
the first one found to a minimal case.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from seeupo.core.config import AlgorithmConfig
from seeupo.tabular.behaviour import Rollouts
from seeupo.tabular.instances import MAX_ABS_VALUE, InstanceError, problem_from_dict, problem_to_dict
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import DTYPE, TreeMDP
from seeupo.tabular.train import AlgorithmStep, RunConfig, initial_policy, track
from seeupo.validation.errors import InputError
from seeupo.validation.files import dumps, read_json
from seeupo.validation.schemas import (
    as_object,
    check_keys,
    dataclass_from_dict,
    float_field,
    int_field,
    is_number,
    str_field,
    type_name,
)

FORMAT = "seeupo-counterexample/1"
# Ranges of the numeric settings a counterexample file may hold (why: a file must not be able
# to ask for a run of hours); MAX_STEPS bounds iterations x epochs x minibatches.
LIMITS: dict[str, tuple[float, float]] = {
    "iterations": (1, 1000), "epochs": (1, 10_000), "minibatches": (1, 1000), "group_size": (1, 1000),
    "tasks": (1, 10_000), "feature_dim": (1, 1024), "seed": (0, 2**63 - 1), "lr": (1e-12, 1e6),
    "mirror_beta": (0.0, 1e6), "init_scale": (0.0, 1e3), "gae_gamma": (0.0, 1.0), "gae_lambda": (0.0, 1.0),
    "clip_eps_low": (0.0, 1.0), "clip_eps_high": (0.0, 1e6), "dual_clip": (1.0, 1e6), "kl_coef": (0.0, 1e6),
    "grae_clamp": (0.0, 1e9), "entropy_coef": (0.0, 1e6), "correction_cap": (1.0, 1e12),
    "correction_floor": (0.0, 1.0), "m2_tau": (0.0, 1e6),
}
MAX_STEPS = 100_000
MAX_BATCH = 10**6  # rollouts (sampled) or group-mate outcomes (exact GRAE) per iteration


def _stop_inside(error: BaseException) -> "_PlanDone | _ShrinkDone | KeyboardInterrupt | None":
    """The stop of ours (plan done, shrinking done, interrupt) that ``error`` is or holds: hypothesis wraps one that
    comes while it replays the case it found (a ``FlakyFailure``, an exception group) instead of letting it
    through."""
    if isinstance(error, (_PlanDone, _ShrinkDone, KeyboardInterrupt)):
        return error
    for inner in getattr(error, "exceptions", ()):
        found = _stop_inside(inner)
        if found is not None:
            return found
    return None


def case_setting(example: "Counterexample") -> str:
    """The verify setting a counterexample bears on: the one its search recorded (an agentic family),
    else ``ST`` (one turn) or ``MT``."""
    recorded = example.search.get("setting")
    if isinstance(recorded, str) and recorded:
        return recorded
    return "ST" if example.problem.num_turns == 1 else "MT"


@dataclass
class Case:
    """One candidate: a single-instance problem, the initial policy, and the settings."""

    problem: TreeMDP
    start: list[torch.Tensor] | None  # per-turn probabilities (independent parameters), or None for run's initial policy
    algorithm: AlgorithmConfig
    run: RunConfig
    iterations: int = 1

    def initial_policy(self) -> TabularPolicy:
        policy = initial_policy(self.problem, self.run)
        if self.start is not None:
            policy.set_action_probs(self.start)
        return policy


@dataclass
class Counterexample:
    """A recorded run in which ``J`` decreased (or stayed below ``J*``)."""

    claim: str
    description: str
    problem: TreeMDP
    policy_state: dict[str, torch.Tensor]
    algorithm: AlgorithmConfig
    run: RunConfig
    iterations: int
    J: list[float]
    J_star: float
    search: dict[str, Any] = field(default_factory=dict)
    plugins: tuple[str, ...] = ()  # NAME@sha256:HEX of each plugin loaded when it was found (seeupo.plugins)

    @property
    def largest_decrease(self) -> float:
        return max((a - b for a, b in zip(self.J, self.J[1:])), default=0.0)

    def policy(self) -> TabularPolicy:
        policy = initial_policy(self.problem, self.run)
        policy.load_state_dict(self.policy_state)
        return policy

    def recompute(self) -> list[float]:
        """The exact ``J`` before and after each iteration, recomputed from scratch."""
        hist = track(self.problem, AlgorithmStep(self.algorithm, self.run), self.policy(), self.iterations)
        return hist.J[:, 0].tolist()

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "claim": self.claim,
            "description": self.description,
            "instance": problem_to_dict(self.problem),
            "policy_state": {k: v.tolist() for k, v in self.policy_state.items()},
            "algorithm": self.algorithm.to_dict(),
            "run": dataclasses.asdict(self.run),
            "iterations": self.iterations,
            "recorded": {"J": self.J, "J_star": self.J_star, "largest_decrease": self.largest_decrease},
            "search": self.search,
        } | ({"plugins": list(self.plugins)} if self.plugins else {})

    @classmethod
    def from_dict(cls, data: Any) -> "Counterexample":
        """Validate a parsed counterexample file (every field type-checked, within :data:`LIMITS`)."""
        data = as_object(data, None)
        if data.get("format") != FORMAT:
            raise InstanceError("format", f"not a counterexample file (expected \"format\": \"{FORMAT}\")")
        check_keys(data, {"format", "claim", "description", "instance", "policy_state", "algorithm", "run", "iterations", "recorded"},
                   {"search", "plugins"})
        plugins = _recorded_plugins(data.get("plugins", []))  # before the algorithm, which may name their entries
        try:
            problem = problem_from_dict(data["instance"])
        except InputError as err:
            raise err.inside("instance") from None
        algorithm = dataclass_from_dict(AlgorithmConfig, data["algorithm"], "algorithm", LIMITS)
        run = dataclass_from_dict(RunConfig, data["run"], "run", LIMITS)
        iterations = int_field(data["iterations"], "iterations", *LIMITS["iterations"])
        work = iterations * algorithm.epochs * algorithm.minibatches
        if work > MAX_STEPS:
            raise InstanceError("iterations", f"iterations x algorithm.epochs x algorithm.minibatches = {work}, more than {MAX_STEPS}")
        _check_batch_size(problem, algorithm, run)
        if algorithm.custom_order is not None and len(algorithm.custom_order) != problem.num_turns:
            raise InstanceError("algorithm.custom_order", f"must order the {problem.num_turns} turns")
        if run.update == "mirror" and run.parameterization != "independent":
            raise InstanceError("run.update", "the closed-form mirror step needs independent parameters")
        recorded = as_object(data["recorded"], "recorded")
        check_keys(recorded, {"J", "J_star"}, {"largest_decrease"}, "recorded")
        if "largest_decrease" in recorded:
            float_field(recorded["largest_decrease"], "recorded.largest_decrease")
        J = recorded["J"]
        if not isinstance(J, list) or len(J) != iterations + 1:
            raise InstanceError("recorded.J", f"must be a list of iterations + 1 = {iterations + 1} numbers")
        search = as_object(data.get("search", {}), "search")
        try:
            dumps(search)
        except ValueError:
            raise InstanceError("search", "must hold only finite numbers") from None
        return cls(
            claim=str_field(data["claim"], "claim"),
            description=str_field(data["description"], "description"),
            problem=problem,
            policy_state=_policy_state(data["policy_state"], problem, run),
            algorithm=algorithm,
            run=run,
            iterations=iterations,
            J=[float_field(x, f"recorded.J[{i}]") for i, x in enumerate(J)],
            J_star=float_field(recorded["J_star"], "recorded.J_star"),
            search=search,
            plugins=plugins,
        )

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Counterexample":
        """Read and validate a counterexample file; errors name the file and the field."""
        try:
            return cls.from_dict(read_json(path))
        except InputError as err:
            raise err.in_file(path) from None


@dataclass
class Instance:
    """The data of a counterexample file without its algorithm: the problem, the start, the step settings.

    What another algorithm needs to run its own update where the recorded one lowered ``J``
    (the scorecard runs every algorithm on the field's counterexamples). Reading it neither
    builds the recorded algorithm nor asks for its plugins, so every process reads every file.
    """

    problem: TreeMDP
    policy_state: dict[str, torch.Tensor]
    run: RunConfig
    iterations: int
    group_size: int
    setting: str = ""  # the verify setting its search recorded (an agentic family), "" for none

    @classmethod
    def load(cls, path: str | Path) -> "Instance":
        """Read and validate the instance of a counterexample file; errors name the file and the field."""
        try:
            data = as_object(read_json(path), None)
            if data.get("format") != FORMAT:
                raise InstanceError("format", f"not a counterexample file (expected \"format\": \"{FORMAT}\")")
            try:
                problem = problem_from_dict(data.get("instance"))
            except InputError as err:
                raise err.inside("instance") from None
            run = dataclass_from_dict(RunConfig, data.get("run"), "run", LIMITS)
            algorithm = as_object(data.get("algorithm"), "algorithm")
            setting = as_object(data.get("search", {}), "search").get("setting", "")
            return cls(problem, _policy_state(data.get("policy_state"), problem, run), run,
                       int_field(data.get("iterations"), "iterations", *LIMITS["iterations"]),
                       int_field(algorithm.get("group_size"), "algorithm.group_size", *LIMITS["group_size"]),
                       str_field(setting, "search.setting"))
        except InputError as err:
            raise err.in_file(path) from None

    def case(self, algorithm: AlgorithmConfig, optimizer: str, lr: float, iterations_factor: int = 1,
             rollouts: Rollouts | None = None) -> Case:
        """This instance with another algorithm's own exact update: ``algorithm`` (with the recorded group size),
        its ``optimizer`` and ``lr``, from the recorded start, for the recorded iterations times
        ``iterations_factor`` (a REINFORCE row's many small steps). The start is the recorded policy:
        its probabilities with independent parameters; with shared ones the recorded run's own seeded
        initialisation, which is what the recorded state holds. ``rollouts``: the rows drawn this way instead
        of as recorded (with staleness ``k``, ``k`` more iterations: the recorded ones read stale rows)."""
        run = dataclasses.replace(self.run, mode="exact", optimizer=optimizer, lr=lr,
                                  iterations=self.iterations * iterations_factor + (rollouts.staleness if rollouts else 0),
                                  **(rollouts.run_fields() if rollouts is not None else {}))  # type: ignore[arg-type]
        start = None
        if self.run.parameterization == "independent":
            policy = initial_policy(self.problem, self.run)
            policy.load_state_dict(self.policy_state)
            with torch.no_grad():
                start = [p.detach() for p in policy.action_probs()]
        return Case(self.problem, start, algorithm.replace(group_size=self.group_size), run, run.iterations)


#: Where the field's committed counterexamples are: the toolkit's searches and each published algorithm's check.
FIELD_COUNTEREXAMPLES = ("paper_repro/counterexamples", "paper_repro/algorithms")


def field_counterexamples() -> list[tuple[str, Instance]]:
    """Every committed counterexample of the field, ``(file, Instance)``, sorted by path: the instances a
    search found where some algorithm's exact update lowered ``J``. ``seeupo check`` and the scorecard
    run every algorithm on them (its own update, from the recorded start and step): hard cases, the
    same for all. Only the instance is read (:class:`Instance`), not the recorded algorithm, so every
    file reads whichever plugins are loaded; a file that does not read is an error. ``file`` is the
    path from ``paper_repro`` on: the same words wherever the command runs."""
    from seeupo.experiments.verdicts import resolve_dir

    found = []
    for folder in FIELD_COUNTEREXAMPLES:
        base = resolve_dir(folder)
        if base.is_dir():
            found += [f for f in base.rglob("*.json") if f.parent.name == "counterexamples"
                      and not any(part.startswith("previous-") for part in f.parts)]  # an earlier run moved aside
    return [(str(path)[str(path).rindex("paper_repro"):], Instance.load(path)) for path in sorted(found)]


def _recorded_plugins(specs: Any) -> tuple[str, ...]:
    """The plugins a file was recorded with, each of which must be loaded now with the same content.

    A counterexample is data: the plugins it names are never imported from it (that would run code
    named by a file); the user loads them (``seeupo replay --plugin FILE``) and this checks that a
    loaded plugin has each recorded SHA-256, so that an edited plugin cannot pass for the recorded one.
    """
    from seeupo.plugins import HASH_TAG, loaded_plugins

    if not isinstance(specs, list) or not all(isinstance(x, str) and HASH_TAG in x for x in specs):
        raise InstanceError("plugins", f"must be a list of 'NAME{HASH_TAG}HEX' strings")
    loaded = {p.sha256: p.name for p in loaded_plugins()}
    for spec in specs:
        name, _, digest = spec.partition(HASH_TAG)
        if digest not in loaded:
            now = ", ".join(f"{p.name} ({p.sha256[:12]}...)" for p in loaded_plugins()) or "none"
            raise InstanceError("plugins", f"recorded with plugin {name} (sha256 {digest[:12]}...), which is not loaded "
                                f"with that content (loaded: {now}); pass --plugin with the file as it was")
    return tuple(specs)


def _check_batch_size(problem: TreeMDP, algorithm: AlgorithmConfig, run: RunConfig) -> None:
    """Refuse settings whose batch would not fit (before building it): sampled mode has ``tasks x G``
    rollouts per iteration; exact mode enumerates a group estimator's group-mates' outcomes, at most
    ``C(K + G - 2, G - 1)`` outcomes for ``K`` distinct returns (``K`` at most the number of paths)."""
    if run.mode == "sampled" and run.tasks * algorithm.group_size > MAX_BATCH:
        raise InstanceError("run.tasks", f"tasks x algorithm.group_size = {run.tasks * algorithm.group_size}, more than {MAX_BATCH}")
    from seeupo.core.registry import adv_estimator

    if run.mode == "exact" and adv_estimator(algorithm.advantage).needs_group_stats:
        t = problem.num_turns - 1
        paths = problem.num_histories(t) * problem.actions_per_turn[t] * problem.obs_per_turn[t]
        if math.comb(paths + algorithm.group_size - 2, algorithm.group_size - 1) > MAX_BATCH:
            raise InstanceError("algorithm.group_size", f"an exact group batch with {algorithm.group_size} rollouts per task over "
                                f"{paths} paths could need more than {MAX_BATCH} rows")


def _policy_state(data: Any, problem: TreeMDP, run: RunConfig) -> dict[str, torch.Tensor]:
    """``policy_state`` checked against the parameters ``run`` gives ``problem``: same names and shapes, finite numbers."""
    expected = initial_policy(problem, run).state_dict()
    data = as_object(data, "policy_state")
    check_keys(data, set(expected), where="policy_state")
    out = {}
    for key, like in expected.items():
        field = f"policy_state.{key}"
        if not isinstance(data[key], list):
            raise InstanceError(field, f"must be a nested list of numbers, got {type_name(data[key])}")
        try:
            arr = np.array(data[key], dtype=object)
        except ValueError:
            raise InstanceError(field, "must be a rectangular nested list") from None
        if arr.shape != tuple(like.shape):
            raise InstanceError(field, f"expected shape {list(like.shape)}, got {list(arr.shape)}")
        if not all(is_number(x) and abs(x) <= MAX_ABS_VALUE for x in arr.flat):
            raise InstanceError(field, f"must hold only numbers of magnitude at most {MAX_ABS_VALUE:g}")
        out[key] = torch.tensor(arr.astype(float), dtype=DTYPE)
    return out


@dataclass
class Replay:
    recorded: list[float]
    recomputed: list[float]
    max_abs_diff: float
    reproduces: bool


def replay(example: Counterexample, atol: float = 1e-8) -> Replay:
    """Recompute ``example`` and compare every recorded ``J`` within ``atol``."""
    again = example.recompute()
    diff = max(abs(a - b) for a, b in zip(again, example.J)) if len(again) == len(example.J) else float("inf")
    return Replay(example.J, again, diff, diff <= atol)


def record(case: Case, claim: str, description: str, search_info: dict[str, Any] | None = None) -> Counterexample:
    """Run ``case`` and record it as a counterexample (whatever the outcome; callers check it).

    The plugins loaded in this process are recorded with their hashes, so that a replay must load
    the same code (:func:`_recorded_plugins`).
    """
    from seeupo.plugins import loaded_plugins

    policy = case.initial_policy()
    state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    hist = track(case.problem, AlgorithmStep(case.algorithm, case.run), policy, case.iterations)
    return Counterexample(
        claim, description, case.problem, state, case.algorithm, case.run, case.iterations,
        hist.J[:, 0].tolist(), float(hist.J_star[0]), search_info or {}, tuple(p.spec for p in loaded_plugins()),
    )


def decrease(case: Case) -> float:
    """The largest single-iteration decrease of ``J`` in ``case`` (negative if ``J`` only rose)."""
    hist = track(case.problem, AlgorithmStep(case.algorithm, case.run), case.initial_policy(), case.iterations)
    return float((hist.J[:-1, 0] - hist.J[1:, 0]).max())


def tightened(case: Case, factor: int = 5) -> Case:
    """The same case with a more careful inner loop: step size / ``factor``, epochs x ``factor``."""
    run = dataclasses.replace(case.run, lr=case.run.lr / factor)
    return dataclasses.replace(case, algorithm=case.algorithm.replace(epochs=case.algorithm.epochs * factor), run=run)


def robust_decrease(case: Case, tol: float = 1e-7) -> bool:
    """``J`` drops by more than ``tol`` both as drawn and with a :func:`tightened` inner loop.

    A drop that vanishes when the surrogate is maximised more carefully is an artefact of
    the optimizer (overshooting), not of the update rule; this test keeps only the others.
    """
    return decrease(case) > tol and decrease(tightened(case)) > tol


@dataclass
class SearchResult:
    found: Counterexample | None
    examples: int  # cases drawn and evaluated (the plan's cases; shrinking not counted)
    seed: int
    moved: int = -1  # cases in which the update moved J at all (-1: not counted, a custom condition)
    stopped: str = ""  # "interrupted" (Ctrl-C, SIGTERM, a budget's alarm); "" when it ran its plan
    shrink_calls: int = 0  # evaluations spent shrinking the case found
    exhausted: bool = False  # hypothesis ran out of distinct cases before ``max_examples``: the plan is complete


class _PlanDone(Exception):
    """Raised inside hypothesis's loop when the planned cases have all been evaluated and none failed."""


class _ShrinkDone(Exception):
    """Raised inside hypothesis's loop when shrinking has spent its evaluations."""


def moved(case: Case, tol: float = 1e-12) -> tuple[float, bool]:
    """``(largest decrease of J, whether J moved by more than tol at all)`` in ``case``."""
    hist = track(case.problem, AlgorithmStep(case.algorithm, case.run), case.initial_policy(), case.iterations)
    steps = hist.J[:-1, 0] - hist.J[1:, 0]
    finite = bool(torch.isfinite(hist.J).all())
    return float(steps.max()), finite and bool((steps.abs() > tol).any())


#: Hypothesis's own ``max_examples`` in every search, whatever the cases planned: hypothesis changes how it draws
#: with its ``max_examples`` (its first tenth, up to 50, are small cases), so a search stops itself after its
#: planned cases instead, and the first ``n`` cases of any plan are the same: a plan of 8 is a prefix of one of 150.
GENERATION_EXAMPLES = 100_000
#: A search shrinks the case it found with at most this many more evaluations, then keeps the smallest failing case
#: so far (said in its info): a count, not a time, so that the case reported is the same on any machine.
SHRINK_CALLS = 200


def search(
    cases: Any,
    *,
    claim: str,
    description: str,
    tol: float = 1e-7,
    max_examples: int = 100,
    seed: int = 0,
    condition: Callable[[Case], bool] | None = None,
    keep_on_interrupt: bool = False,
    shrink_calls: int | None = SHRINK_CALLS,
    setting: str = "",
) -> SearchResult:
    """Search the hypothesis strategy ``cases`` for a case where ``J`` drops by more than ``tol``.

    The search evaluates exactly ``max_examples`` cases drawn by hypothesis from ``seed`` (fewer only
    when hypothesis has no more distinct cases: ``exhausted``) and stops at the first failing one,
    which hypothesis then shrinks (fewer turns and actions, simpler rewards and settings) with at
    most ``shrink_calls`` more evaluations (``None``: no limit). What is evaluated is a function of
    the strategy, ``seed`` and ``max_examples`` alone, never of the machine's speed, and the cases of
    a plan of ``n`` are the first ``n`` of any larger plan (:data:`GENERATION_EXAMPLES`).

    ``condition`` replaces the default test, :func:`robust_decrease`; the default test also counts
    the cases in which ``J`` moved at all (``moved``: a search whose cases never move ``J`` measured
    nothing). Returns the recorded minimal counterexample, or ``None`` with the number of cases tried.

    No clock stops a search. With ``keep_on_interrupt``, Ctrl-C, SIGTERM or a budget's alarm
    (``KeyboardInterrupt``) stops it instead of propagating: the last failing case seen is recorded
    (not shrunk to the end, said in its ``search`` info) so that no counterexample found is lost, and
    ``stopped`` is ``"interrupted"``: the plan did not finish. The caller then stops.

    Hypothesis's own messages (such as its warning about slow shrinking, which asks the reader to
    report to hypothesis) are kept from the terminal; the result says what happened instead.

    ``setting`` (a verify setting, e.g. an agentic family) is recorded in the counterexample's
    ``search`` info, so that whoever consults the file knows which cells it bears on
    (:func:`case_setting`).
    """
    from hypothesis import HealthCheck, Phase, find, settings
    from hypothesis.errors import NoSuchExample
    from hypothesis.reporting import with_reporter

    count = moved_count = shrinking = 0
    last_failing: Case | None = None

    def default_test(case: Case) -> bool:
        nonlocal moved_count
        drop, did_move = moved(case)
        moved_count += did_move
        return drop > tol and decrease(tightened(case)) > tol

    test = condition or default_test

    def counted(case: Case) -> bool:
        nonlocal count, last_failing, shrinking
        if last_failing is None:
            if count >= max_examples:
                raise _PlanDone
            count += 1
        else:
            if shrink_calls is not None and shrinking >= shrink_calls:
                raise _ShrinkDone
            shrinking += 1
        failing = test(case)
        if failing:
            last_failing = case
        return failing

    config = settings(
        max_examples=GENERATION_EXAMPLES, database=None, deadline=None, phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    info = {"examples": count, "seed": seed, "max_examples": max_examples, "tol": tol} | ({"setting": setting} if setting else {})

    def result(found: Counterexample | None, stopped: str = "", exhausted: bool = False) -> SearchResult:
        return SearchResult(found, count, seed, -1 if condition else moved_count, stopped, shrinking, exhausted)

    try:
        with with_reporter(lambda _message: None):
            case = find(cases, counted, settings=config, random=random.Random(seed))
    except NoSuchExample:  # hypothesis ran out of distinct cases: every one was evaluated
        return result(None, exhausted=True)
    except BaseException as error:  # noqa: BLE001 - only a stop of ours is handled; anything else is raised again
        stop = _stop_inside(error)
        if stop is None or (isinstance(stop, KeyboardInterrupt) and not keep_on_interrupt):
            raise
        if isinstance(stop, _PlanDone):
            return result(None)
        why = "" if isinstance(stop, _ShrinkDone) else "interrupted"
        found = None
        if last_failing is not None:
            words = f"shrinking stopped after {shrink_calls} evaluations" if why == "" else f"{why} while shrinking"
            info |= {"examples": count, "stopped": f"{words}: this case is not minimal"}
            found = record(last_failing, claim, description, info)
        return result(found, why)
    info["examples"] = count
    return result(record(case, claim, description, info))
