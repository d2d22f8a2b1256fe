"""Why ``J`` fell: a counterexample explained so that a student can follow it.

:func:`explain` replays a counterexample (:mod:`seeupo.experiments.counterexamples`) up to the
iteration where ``J`` fell most and takes that iteration apart:

* the instance at every reachable history: each action's outcomes (probability, reward, whether
  the episode ends), its exact ``Q`` and true advantage ``A = Q - V`` under the policy before the
  update, and its probability before and after the update;
* the advantages the algorithm gave: every *outcome class* (turn, history, action, the
  trajectory's return, the advantage value) with its weight, the probability of that trajectory
  together with its group-mates' configuration (in exact mode the batch holds every one of them);
  and the *expected advantage* ``E[A_hat | h, a] = sum w A_hat / sum w`` of each action;
* the update as it ran (``J`` after every optimizer step), and the same update with plain
  gradient ascent (``optimizer="sgd"``: same surrogate, batch, step size, number of steps, start).

It then names the cause, with numbers (:data:`CAUSES`):

* ``"advantage sign"``: the expected update direction itself lowers ``J``. The first optimizer
  step's expected gradient ``g`` (of the algorithm's surrogate, at the start) has
  ``grad J . g < 0``; the evidence is an action whose expected advantage has the wrong sign
  (a worse action, ``A < 0``, with ``E[A_hat] > 0``, or the reverse) or two actions in the wrong
  order.
* ``"optimizer"``: ``g`` points uphill (``grad J . g > 0``) but vanishes, and plain gradient ascent
  from the same start does not lower ``J``, while the optimizer used (Adam) does: Adam divides each
  step by the running size of the gradient, so a vanishing expected gradient still moves each
  parameter by about ``lr`` per step. "Vanishes" is measured: the optimizer's first step is at least
  :data:`VANISHING` times as long as plain gradient ascent's (:func:`amplification`).
* ``"step size"``: ``g`` points uphill, but the update goes past where ``J`` is highest: plain
  gradient ascent lowers ``J`` too, or the gradient is not vanishing and the optimizer's steps,
  longer than plain ascent's, overshoot. Neither of the two causes above.
* ``"no decrease"``: ``J`` did not fall in the explained iteration (nor, then, in any other).

With a sequential schedule ``g`` is the gradient of the first optimizer step, on the first
updated turn's rows only. The mirror update has no optimizer: its cause is the advantage's sign
when some action's expected advantage is misordered, else the step size.

:func:`render` writes the explanation as text (markdown). :func:`summary_line` is its one-sentence
verdict, and :func:`restate` the verdict block of several counterexamples
(``python -m seeupo.experiments.explain --plugin P FILE... [--readme README.md] [--out OUT.md]``
regenerates ``paper_repro/algorithms/explanations.md`` and the block in its README).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.config import AlgorithmConfig
from seeupo.core.update import UpdateSettings, policy_update
from seeupo.experiments.counterexamples import Counterexample
from seeupo.tabular.gradient import REL_TOL
from seeupo.tabular.exact import evaluate, optimal
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import DTYPE, TreeMDP
from seeupo.tabular.train import AlgorithmStep, RunConfig, build_batch, initial_policy, make_optimizer, mirror_step

CAUSES = ("flat surrogate", "M factor", "std scaling", "own-action baseline", "advantage sign", "optimizer",
          "step size", "no decrease")
FLAT = 1e-12  # a change of J smaller than this is round-off, not a decrease
VANISHING = 100.0
"""The expected gradient counts as vanishing when the optimizer's first step is at least this many times
longer than plain gradient ascent's (same lr): then the step's length is the optimizer's, not the gradient's."""
FLAT_SIGNAL = 1e-5
"""The expected advantages are *flat* (zero) when none exceeds this fraction of the largest advantage the batch
holds. Float64 round-off in these weighted means is about 1e-13 of that scale; what lies between is no signal of
the rewards but a stabilising constant, such as the 1e-6 added to a group's standard deviation (with it set to 0
the expected advantages of DAPO on the hand-made flat bandit vanish to 5.6e-17, tests/experiments/test_explain.py)."""
SLOPE_TOL = REL_TOL
"""``grad J . g`` counts as negative (zero) when below (within) this fraction of ``|grad J| |g|``
(:data:`seeupo.tabular.gradient.REL_TOL`: float64 sums of a few thousand terms)."""
SCALE_INVARIANT = 1e-3
"""An estimator is scale-normalised when doubling every reward changes no expected advantage by more than this
fraction (a std-scaled one moves by about its constant over the std, 1e-6; an unscaled one doubles)."""


@dataclass
class Outcome:
    """One observation after ``(h, a)``: its probability, the reward, and whether the episode ends."""

    observation: int
    probability: float
    reward: float
    ends: bool


@dataclass
class AdvantageClass:
    """Trajectories through ``(h, a)`` with the same return that received the same advantage.

    ``weight`` is the probability of such a trajectory together with its group-mates' configuration
    (summed over the class): the weight the update gives the class's advantage.
    """

    trajectory_return: float
    advantage: float
    weight: float


@dataclass
class ActionRow:
    """One action at one reachable history, before and after the update."""

    turn: int
    history: int
    history_label: str  # e.g. "s0=0, a0=1, o0=0"
    reach: float  # probability of reaching the history under the policy before the update
    action: int
    prob_before: float
    prob_after: float
    q: float  # exact Q_t(h, a) under the policy before the update
    true_advantage: float  # Q_t(h, a) - V_t(h)
    expected_advantage: float  # E[A_hat | h, a], weighted mean over the batch's rows at (h, a)
    outcomes: list[Outcome]
    classes: list[AdvantageClass]

    @property
    def wrong_sign(self) -> bool:
        """The expected advantage has the opposite sign of the true one (both nonzero)."""
        return self.true_advantage * self.expected_advantage < 0


@dataclass
class OptimizerRun:
    """The explained iteration's update with one optimizer: ``J`` before and after each step.

    ``gradient_norm`` and ``slope`` are those of the first step: the norm of the expected gradient
    of the surrogate at the start, and ``grad J . g``, the first-order change of ``J`` per unit
    step along the ascent direction ``g`` (negative: the expected update points downhill);
    ``first_step_length`` is the length of the parameters' first move (plain gradient ascent:
    ``lr |g|``; Adam: about ``lr`` per parameter).
    """

    optimizer: str
    lr: float
    J: list[float]  # J[0] before, J[k] after step k
    best_action_prob: list[float]  # P(Explanation.watched action) before and after each step
    gradient_norm: float
    slope: float
    first_step_length: float
    # (turn, grad J . g on that turn's parameters) at the first step that moved each turn, in the order the
    # turns were updated; independent parameters only (shared parameters do not split by turn)
    turn_slopes: list[tuple[int, float, float]] = field(default_factory=list)  # (turn, slope, |g| |grad J| there)
    slope_scale: float = 0.0  # |g| |grad J| at the first step: the size against which the slope's sign is read

    @property
    def steps(self) -> int:
        return len(self.J) - 1


@dataclass
class Explanation:
    """Everything :func:`render` prints about one counterexample (see the module docstring)."""

    description: str
    settings: str  # the algorithm and run settings in one line
    mode: str
    iteration: int  # 1-based, the iteration explained
    iterations: int
    J_before: float
    J_after: float
    J_star: float
    recorded_after: float
    actions: list[ActionRow]
    update: OptimizerRun | None  # None for the closed-form mirror step
    # plain gradient ascent from the same start; None if the update was plain already or a mirror step
    plain: OptimizerRun | None
    cause: str
    reasons: list[str] = field(default_factory=list)  # the numbers behind the cause, one sentence each
    watched: tuple[int, int, int] = (0, 0, 0)  # (turn, history, action) whose probability OptimizerRun traces
    watched_label: str = "s0=0"
    what_changes: str = ""  # the computed change that keeps J from falling (one sentence), or ""

    @property
    def reproduces(self) -> bool:
        return abs(self.J_after - self.recorded_after) <= 1e-8


def history_label(problem: TreeMDP, t: int, h: int) -> str:
    """``h`` (a flat turn-``t`` history index) spelled out: ``"s0=0, a0=1, o0=0"`` (one observation per turn is left out)."""
    parts: list[str] = []
    for k in reversed(range(t)):
        a_k, o_k = problem.actions_per_turn[k], problem.obs_per_turn[k]
        h, ao = divmod(h, a_k * o_k)
        a, o = divmod(ao, o_k)
        parts[:0] = [f"a{k}={a}"] + ([f"o{k}={o}"] if o_k > 1 else [])
    return ", ".join([f"s0={h}"] + parts)


def _row_values(batch: SampleBatch, adv: torch.Tensor) -> torch.Tensor:
    """Each row's advantage: its mean over the row's tokens (equal for sequence-level estimators)."""
    mask = batch.token_mask.to(DTYPE)
    return (adv * mask).sum(1) / mask.sum(1).clamp_min(1.0)


def _actions(
    problem: TreeMDP, before: list[torch.Tensor], after: list[torch.Tensor], batch: SampleBatch, adv: torch.Tensor
) -> list[ActionRow]:
    """The table of every action at every history the policy before the update reaches (instance 0)."""
    ev = evaluate(problem, before)
    reach = ev.reach
    row_adv = _row_values(batch, adv)
    keep = batch.valid & (batch.instance == 0) & (batch.weight > 0)
    turn, hist, act = batch.turn[keep], batch.data["hist"][keep], batch.data["action"][keep]
    w, a_hat, ret = batch.weight[keep].to(DTYPE), row_adv[keep], batch.traj_return[keep].to(DTYPE)
    rows = []
    for t in range(problem.num_turns):
        for h in range(problem.num_histories(t)):
            if float(reach[t][0, h]) <= 0:
                continue
            for a in range(problem.actions_per_turn[t]):
                at = (turn == t) & (hist == h) & (act == a)
                total = float(w[at].sum())
                expected = float((w[at] * a_hat[at]).sum()) / total if total > 0 else float("nan")
                classes: dict[tuple[float, float], float] = {}
                for r, x, p in zip(ret[at].tolist(), a_hat[at].tolist(), w[at].tolist()):
                    key = (round(r, 12), round(x, 12))
                    classes[key] = classes.get(key, 0.0) + p
                outcomes = [
                    Outcome(o, float(problem.obs_probs[t][0, h, a, o]), float(problem.rewards[t][0, h, a, o]),
                            bool(problem.terminal[t][0, h, a, o]))
                    for o in range(problem.obs_per_turn[t]) if float(problem.obs_probs[t][0, h, a, o]) > 0
                ]
                rows.append(ActionRow(
                    t, h, history_label(problem, t, h), float(reach[t][0, h]), a, float(before[t][0, h, a]),
                    float(after[t][0, h, a]), float(ev.Q[t][0, h, a]), float(ev.A[t][0, h, a]), expected, outcomes,
                    [AdvantageClass(r, x, p) for (r, x), p in sorted(classes.items())],
                ))
    return rows


def _j(problem: TreeMDP, policy: TabularPolicy) -> float:
    with torch.no_grad():
        return float(evaluate(problem, policy.action_probs()).J[0])


def _grad_j(problem: TreeMDP, policy: TabularPolicy) -> list[torch.Tensor]:
    """``grad J`` with respect to each parameter (zeros where ``J`` does not depend on it)."""
    params = list(policy.parameters())
    J = evaluate(problem, policy.action_probs()).J[0]
    grads = torch.autograd.grad(J, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


def _run_update(
    problem: TreeMDP, policy: TabularPolicy, cfg: AlgorithmConfig, run: RunConfig, batch: SampleBatch, adv: torch.Tensor,
    generator: torch.Generator, optimizer: torch.optim.Optimizer, watch: tuple[int, int, int],
) -> OptimizerRun:
    """``policy_update`` as :class:`~seeupo.tabular.train.AlgorithmStep` runs it, measuring every step.

    A pre-step hook reads the first step's gradient (the loss's, so the ascent direction is its
    negative); a post-step hook records ``J`` and the watched action's probability after each step.
    """
    grad_j = _grad_j(problem, policy)
    params = list(policy.parameters())
    turn_of = _param_turns(policy)
    t, h, a = watch
    J, best, first = [_j(problem, policy)], [], {}
    turns: dict[int, tuple[float, float]] = {}
    with torch.no_grad():
        best.append(float(policy.action_probs()[t][0, h, a]))

    def before_step(opt, args, kwargs) -> None:
        g = [torch.zeros_like(p) if p.grad is None else -p.grad.detach().clone() for p in params]
        if not first:
            first["norm"] = float(torch.sqrt(sum((x**2).sum() for x in g)))
            first["slope"] = float(sum((x * y).sum() for x, y in zip(g, grad_j)))
            first["scale"] = first["norm"] * float(torch.sqrt(sum((y**2).sum() for y in grad_j)))
            first["start"] = [p.detach().clone() for p in params]
        for turn in sorted(set(turn_of)) if turn_of else ():
            mine = [k for k, owner in enumerate(turn_of) if owner == turn]
            if turn in turns or not any(bool(g[k].abs().sum() > 0) for k in mine):
                continue
            slope = float(sum((g[k] * grad_j[k]).sum() for k in mine))
            size = float(torch.sqrt(sum((g[k] ** 2).sum() for k in mine)) * torch.sqrt(sum((grad_j[k] ** 2).sum() for k in mine)))
            turns[turn] = (slope, size)

    def after_step(opt, args, kwargs) -> None:
        if "length" not in first:
            moved = sum(((p.detach() - p0) ** 2).sum() for p, p0 in zip(params, first["start"]))
            first["length"] = float(torch.sqrt(moved))
        J.append(_j(problem, policy))
        with torch.no_grad():
            best.append(float(policy.action_probs()[t][0, h, a]))

    handles = [optimizer.register_step_pre_hook(before_step), optimizer.register_step_post_hook(after_step)]
    try:
        policy_update(policy, optimizer, batch, adv, cfg, UpdateSettings(generator=generator))
    finally:
        for handle in handles:
            handle.remove()
    return OptimizerRun(run.optimizer, run.lr, J, best, first.get("norm", 0.0), first.get("slope", 0.0),
                        first.get("length", 0.0), [(turn, *turns[turn]) for turn in turns], first.get("scale", 0.0))


def _param_turns(policy: TabularPolicy) -> list[int]:
    """The turn of each parameter tensor (in ``policy.parameters()`` order); ``[]`` for shared parameters."""
    if policy.parameterization != "independent":
        return []
    return [t for t, turn_shapes in enumerate(policy._shapes) for _ in turn_shapes]


def _settings(example: Counterexample) -> str:
    cfg, run = example.algorithm, example.run
    clip = f"clip {cfg.clip_eps_low:g}/{cfg.clip_eps_high:g}" if cfg.update == "ppo" else cfg.update
    minibatches = f"{cfg.minibatches} minibatch{'es' if cfg.minibatches > 1 else ''}"
    return (f"algorithm {cfg.name} (advantage {cfg.advantage}, G = {cfg.group_size}, update {cfg.update}, {clip}, "
            f"{cfg.schedule} schedule, {cfg.aggregation}, {cfg.epochs} epochs x {minibatches}); "
            f"{run.mode} mode, {run.update} update with {_name(run.optimizer)} lr {run.lr:g}, {run.parameterization} parameters")


def explain(example: Counterexample) -> Explanation:
    """Explain the iteration of ``example`` in which ``J`` fell most (if it never fell: rose least).

    The iterations before it are replayed exactly as :func:`~seeupo.experiments.counterexamples.replay`
    does (one :class:`~seeupo.tabular.train.AlgorithmStep`, whose generator and optimizer state carry
    over); the explained iteration is that step's code with measuring hooks, and plain gradient
    ascent starts from copies of the same policy, generator state and batch. Only instance 0 of
    the problem is read (a counterexample holds one instance).
    """
    problem, cfg, run = example.problem, example.algorithm, example.run
    recorded = example.J
    drops = [a - b for a, b in zip(recorded, recorded[1:])]
    k = max(range(len(drops)), key=drops.__getitem__) if drops else 0
    policy = example.policy()
    step = AlgorithmStep(cfg, run)
    for _ in range(k):
        step(problem, policy)

    state = {name: v.detach().clone() for name, v in policy.state_dict().items()}
    with torch.no_grad():
        before = [p.detach().clone() for p in policy.action_probs()]
    gen_state = step.generator.get_state()
    batch, adv = build_batch(problem, policy, cfg, run, step.generator)
    # the action whose probability the step traces: the optimal first action at the first history
    watch = (0, 0, int(optimal(problem).Q[0][0, 0].argmax()))
    plain = None
    if run.update == "mirror":
        mirror_step(policy, batch, adv, cfg, run.mirror_beta, step.generator)
        update = None
    else:
        if step.optimizer is None or run.reset_optimizer:
            step.optimizer = make_optimizer(policy.parameters(), run)
        # plain gradient ascent first, from copies: the same start, batch and generator state
        if run.optimizer != "sgd":
            sgd = dataclasses.replace(run, optimizer="sgd")
            twin = initial_policy(problem, sgd)
            twin.load_state_dict(state)
            twin_gen = torch.Generator().manual_seed(0)
            twin_gen.set_state(step.generator.get_state())
            plain = _run_update(problem, twin, cfg, sgd, batch, adv, twin_gen, make_optimizer(twin.parameters(), sgd),
                                watch)
        update = _run_update(problem, policy, cfg, run, batch, adv, step.generator, step.optimizer, watch)
    with torch.no_grad():
        after = [p.detach().clone() for p in policy.action_probs()]
    J_before, J_after = float(evaluate(problem, before).J[0]), float(evaluate(problem, after).J[0])
    actions = _actions(problem, before, after, batch, adv)
    start = _Start(problem, state, run, gen_state, watch, before)
    cause, reasons = _cause(J_before, J_after, actions, update, plain, run.parameterization == "shared")
    cause, reasons, what = _refine(cause, reasons, start, cfg, actions, batch, adv, update, plain, J_before)
    return Explanation(
        example.description, _settings(example), run.mode, k + 1, example.iterations, J_before, J_after,
        example.J_star, recorded[k + 1] if len(recorded) > k + 1 else float("nan"), actions, update, plain, cause,
        reasons, watch, history_label(problem, watch[0], watch[1]), what,
    )


def _name(optimizer: str) -> str:
    """An optimizer as people write it: ``"adam"`` -> ``"Adam"``, ``"sgd"`` -> ``"SGD"``."""
    return {"adam": "Adam", "sgd": "SGD"}.get(optimizer, optimizer)


def _fmt(x: float) -> str:
    """A signed number a student can read: 6 decimals, or 2 significant digits when it is tiny."""
    return f"{x:+.6f}" if x == 0 or abs(x) >= 1e-3 else f"{x:+.1e}"


def _largest(actions: list[ActionRow]) -> float:
    """The largest ``|E[A_hat | h, a]|`` (actions the batch never holds, of probability 0, are left out)."""
    return max((abs(r.expected_advantage) for r in actions if math.isfinite(r.expected_advantage)), default=0.0)


def _where(row: ActionRow) -> str:
    return f"turn {row.turn} ({row.history_label}), action {row.action}"


def _ranked_pairs(actions: list[ActionRow]) -> list[tuple[ActionRow, ActionRow]]:
    """Pairs ``(x, y)`` of actions at the same history with ``Q(x) < Q(y)``."""
    return [(x, y) for x in actions for y in actions if (x.turn, x.history) == (y.turn, y.history) and x.q < y.q - FLAT]


def misordered(actions: list[ActionRow]) -> list[tuple[ActionRow, ActionRow]]:
    """Pairs ``(x, y)`` of actions at the same history with ``Q(x) < Q(y)`` but ``E[A_hat | x] > E[A_hat | y]``."""
    return [(x, y) for x, y in _ranked_pairs(actions) if x.expected_advantage > y.expected_advantage]


def _cause(J_before: float, J_after: float, actions: list[ActionRow], update: OptimizerRun | None,
           plain: OptimizerRun | None, shared_parameters: bool = False) -> tuple[str, list[str]]:
    """The cause (one of :data:`CAUSES`) and the sentences with the numbers that show it."""
    if J_after >= J_before - FLAT:
        return "no decrease", [f"J did not fall: {J_before:.6f} -> {J_after:.6f}."]
    reasons: list[str] = []
    pairs = misordered(actions)
    for r in actions:
        if r.wrong_sign:
            kind = "worse" if r.true_advantage < 0 else "better"
            ranked = "" if any(r in pair for pair in pairs) else (
                "; it still ranks right against the other actions at this history, which is what moves a softmax policy")
            reasons.append(f"At {_where(r)}: a {kind} action (true advantage Q - V = {_fmt(r.true_advantage)}) receives "
                           f"expected advantage {_fmt(r.expected_advantage)}{ranked}.")
    for x, y in pairs:
        if not (x.wrong_sign and y.wrong_sign):  # else the two sentences above say it already
            reasons.append(f"At turn {x.turn} ({x.history_label}): action {x.action} (Q {x.q:.6f}) receives a "
                           f"larger expected advantage ({_fmt(x.expected_advantage)}) than action {y.action} "
                           f"(Q {y.q:.6f}, {_fmt(y.expected_advantage)}).")
    if update is None:  # the mirror step: no gradient, no optimizer to blame
        return ("advantage sign" if reasons else "step size"), reasons or [
            "The mirror step follows the expected advantages, whose order is right; the step is too large."]
    slope = (f"the expected gradient of the surrogate at the start has norm {update.gradient_norm:.1e} and "
             f"grad J . g = {update.slope:+.1e}")
    if _negative(update.slope, update.slope_scale):
        return "advantage sign", reasons + [f"So the expected update points downhill: {slope}."]
    if update.slope <= SLOPE_TOL * update.slope_scale:  # zero within float64 noise: neither uphill nor downhill
        slope += f" (zero within {SLOPE_TOL:g} of |g| |grad J|: orthogonal to grad J)"
    shared = (["The parameters are shared across turns and histories: each step on one turn's rows also moves "
               "the policy of the others."] if shared_parameters else [])
    if plain is None:
        return "step size", reasons + [f"The expected update does not point downhill ({slope}).", *shared,
                                       "The surrogate, maximised this far, leads past where J is highest."]
    plain_line = (f"Plain gradient ascent ({plain.steps} steps of lr {plain.lr:g} on the same surrogate, from the same "
                  f"start) moves J by {plain.J[-1] - J_before:+.1e} ({J_before:.6f} -> {plain.J[-1]:.6f}; one step: "
                  f"{plain.J[1] - J_before:+.1e}).")
    ratio = amplification(update, plain)
    longer = (f"its first step is {ratio:.2g} times as long as plain gradient ascent's" if math.isfinite(ratio) else
              "plain gradient ascent's first step does not move, its first step does")
    adam_line = (f"{_name(update.optimizer)} divides each step by the running size of the gradient, so each parameter moves by "
                 f"about lr = {update.lr:g} per step whatever the gradient's size: {longer} "
                 f"and moves J by {update.J[1] - J_before:+.1e}; its "
                 f"{update.steps} steps end at J = {update.J[-1]:.6f} (J {_peak(update)}).")
    if plain.J[-1] >= J_before - FLAT and ratio >= VANISHING:
        return "optimizer", [
            f"The expected advantages point uphill but are tiny: the largest |E[A_hat | h, a]| is "
            f"{_largest(actions):.1e}, and {slope} > 0.", plain_line, adam_line]
    if plain.J[-1] >= J_before - FLAT:
        return "step size", reasons + [
            f"The expected update does not point downhill ({slope}) and is not vanishing.", plain_line, adam_line, *shared,
            f"{_name(update.optimizer)}'s steps, longer than plain gradient ascent's, go past where J is highest."]
    return "step size", reasons + [f"The expected update does not point downhill ({slope}).", plain_line, *shared,
                                   "The surrogate, maximised this far, leads past where J is highest."]


@dataclass
class _Start:
    """The explained iteration's start, from which a changed update is run on a fresh copy (:meth:`what_if`)."""

    problem: TreeMDP
    state: dict[str, torch.Tensor]
    run: RunConfig
    generator_state: torch.Tensor
    watch: tuple[int, int, int]
    probs: list[torch.Tensor]  # the policy's action probabilities at the start

    def policy(self, run: RunConfig) -> TabularPolicy:
        twin = initial_policy(self.problem, run)
        twin.load_state_dict(self.state)
        return twin

    def what_if(self, cfg: AlgorithmConfig, run: RunConfig | None = None,
                problem: TreeMDP | None = None) -> tuple[float, OptimizerRun | None, list[ActionRow]]:
        """The iteration's update with ``cfg``/``run`` (a fresh optimizer; ``problem``: other rewards), from the
        same start and generator state: ``(J after, the run, the actions' table)``."""
        run, problem = run or self.run, problem or self.problem
        twin = self.policy(run)
        gen = torch.Generator().manual_seed(0)
        gen.set_state(self.generator_state)
        batch, adv = build_batch(problem, twin, cfg, run, gen)
        rows = _actions(problem, self.probs, self.probs, batch, adv)
        if run.update == "mirror":
            mirror_step(twin, batch, adv, cfg, run.mirror_beta, gen)
            return _j(self.problem, twin), None, rows
        result = _run_update(self.problem, twin, cfg, run, batch, adv, gen, make_optimizer(twin.parameters(), run), self.watch)
        return result.J[-1], result, rows


def _negative(slope: float, size: float) -> bool:
    """``slope`` below zero beyond float64 noise (:data:`SLOPE_TOL` of ``size``)."""
    return slope < -SLOPE_TOL * size


def _batch_scale(batch: SampleBatch, adv: torch.Tensor) -> float:
    """The largest ``|A_hat|`` of a row the update weights (instance 0)."""
    keep = batch.valid & (batch.instance == 0) & (batch.weight > 0)
    values = _row_values(batch, adv)[keep]
    return float(values.abs().max()) if values.numel() else 0.0


def _scale_normalised(start: _Start, cfg: AlgorithmConfig, actions: list[ActionRow]) -> bool:
    """Whether doubling every reward leaves every expected advantage unchanged (:data:`SCALE_INVARIANT`)."""
    doubled = dataclasses.replace(start.problem, rewards=[2 * r for r in start.problem.rewards])
    _, _, rows = start.what_if(cfg, problem=doubled)
    pairs = [(x.expected_advantage, y.expected_advantage) for x, y in zip(actions, rows)
             if math.isfinite(x.expected_advantage) and x.expected_advantage != 0]
    return bool(pairs) and all(abs(b - a) <= SCALE_INVARIANT * abs(a) for a, b in pairs)


def _ends(row: ActionRow) -> bool:
    return all(o.ends for o in row.outcomes)


def _refine(cause: str, reasons: list[str], start: _Start, cfg: AlgorithmConfig, actions: list[ActionRow],
            batch: SampleBatch, adv: torch.Tensor, update: OptimizerRun | None, plain: OptimizerRun | None,
            J_before: float) -> tuple[str, list[str], str]:
    """The cause made precise, and what changes the outcome (computed): ``(cause, reasons, what_changes)``.

    In this order: a *flat surrogate* (no expected advantage above :data:`FLAT_SIGNAL` of the batch's
    scale: the decrease is the optimizer's choice); an *M factor* that reverses a turn's update (a turn
    whose first step points downhill, where the same update with ``m_factor="none"`` does not); for an
    update that points downhill, *std scaling* (a scale-normalised estimator, :func:`_scale_normalised`:
    with ``G = 2`` its advantage is a win rate), the *advantage sign* reversed (every ranked pair of
    actions ordered against ``Q``: a negative scale), or an *own-action baseline* (some pair at one
    history ordered against ``Q`` and not all: no baseline independent of the trajectory's own actions,
    with a positive scale, can do that). Each ends with the update changed and ``J`` after it.
    """
    if cause == "no decrease":
        return cause, reasons, ""
    run = start.run
    scale = _batch_scale(batch, adv)
    if scale > 0 and _largest(actions) <= FLAT_SIGNAL * scale:
        flat = [f"The surrogate is flat: the largest expected advantage |E[A_hat | h, a]| is {_largest(actions):.1e}, "
                f"below {FLAT_SIGNAL:g} of the largest advantage the batch holds ({scale:.2g}); that much is a "
                "stabilising constant (such as the 1e-6 added to a standard deviation), not the rewards' signal. "
                "J fell because the optimizer took full-size steps on it: the decrease is the optimizer's choice, "
                "not the estimator's."]
        if plain is not None:
            what = (f"Plain gradient ascent on the same surrogate ({plain.steps} steps of lr {plain.lr:g}) moves J by "
                    f"{plain.J[-1] - J_before:+.1e}.")
        else:
            J_sgd, _, _ = start.what_if(cfg, dataclasses.replace(run, lr=run.lr / 10))
            what = f"With a tenth of the step size (lr {run.lr / 10:g}) J moves by {J_sgd - J_before:+.1e}."
        return "flat surrogate", flat + [r for r in reasons if r.startswith("Plain")], what
    reversed_turns = [(t, slope) for t, slope, size in (update.turn_slopes if update else []) if _negative(slope, size)]
    if reversed_turns and cfg.schedule == "sequential" and cfg.m_factor != "none":
        J_none, plain_m, _ = start.what_if(cfg.replace(m_factor="none"))
        still = {t for t, slope, size in (plain_m.turn_slopes if plain_m else []) if _negative(slope, size)}
        turns = [(t, slope) for t, slope in reversed_turns if t not in still]
        if turns:
            t, slope = turns[0]
            return "M factor", [
                f"Turn {t}'s update points downhill (grad J . g on its parameters = {slope:+.1e} at its first step), "
                f"but with the M factor left out (m_factor = none) it does not: the factor {cfg.m_factor!r} reverses "
                f"turn {t}'s update (every updated turn read: "
                + ", ".join(f"turn {u} {s:+.1e}" for u, s, _ in update.turn_slopes) + ")."], (
                f"With m_factor = none (the same update otherwise, a fresh optimizer), J goes to {J_none:.6f}.")
    downhill = cause == "advantage sign"
    if not downhill:
        what = (f"Plain gradient ascent on the same surrogate moves J by {plain.J[-1] - J_before:+.1e}." if plain is not None
                else _fewer_steps(start, cfg, J_before))
        return cause, reasons, what
    J_oracle, _, _ = start.what_if(cfg.replace(advantage="oracle"))
    oracle = f"With the exact advantages Q - V in place of the estimator's (the same update), J goes to {J_oracle:.6f}."
    pairs = misordered(actions)
    if (reasons or pairs) and _scale_normalised(start, cfg, actions):
        J_mean, _, _ = start.what_if(cfg.replace(advantage="grae", grae_center="mean", grae_scale="none"))
        if cfg.group_size == 2:
            why = ("The estimator is scale-normalised (doubling every reward leaves its expected advantages unchanged), "
                   "and with G = 2 such an advantage is only who won the pair: +c to the better return, -c to the worse, "
                   "0 on a tie. Its expectation is a win rate, P(beat the group-mate) - P(lose to it), which an action "
                   "with a rare large reward and a frequent small one can win while its mean (Q) is lower.")
        else:
            why = ("The estimator is scale-normalised (doubling every reward leaves its expected advantages unchanged): "
                   "each group's advantages are divided by its own spread, so groups whose returns differ little "
                   "weigh as much as groups whose returns differ a lot, and the expectation no longer follows Q.")
        return "std scaling", reasons + [why], (
            f"With mean-centred advantages (GRAE, mean, no scaling; the same G and update), J goes to {J_mean:.6f}. {oracle}")
    ranked = _ranked_pairs(actions)
    if pairs and len(pairs) == len(ranked):
        return cause, reasons + [
            f"The expected advantages are ordered against Q in every pair of actions the policy reaches ({len(pairs)} "
            "of them): a reversed sign (a negative scale) does that, and so can a baseline that depends on the "
            "trajectory's own actions; this instance does not tell the two apart."], oracle
    if pairs:
        x, y = pairs[0]
        length = ""
        if _ends(x) != _ends(y):
            stop, go = (x, y) if _ends(x) else (y, x)
            length = (f" Action {stop.action} ends the episode at turn {x.turn} and action {go.action} continues: the "
                      "trajectories through them differ in length, and the estimator's baseline or scale depends on it.")
        return "own-action baseline", reasons + [
            f"At turn {x.turn} ({x.history_label}) the expected advantages are ordered against Q. A baseline that does not "
            "depend on the trajectory's own actions, with a positive scale, keeps that order (E[A_hat | h, a] = c (Q(h, a) "
            "- b(h))); so this estimator's baseline or scale depends on the trajectory's own actions." + length], oracle
    return cause, reasons, oracle


def _fewer_steps(start: _Start, cfg: AlgorithmConfig, J_before: float) -> str:
    """What one optimizer step (or a tenth of the step size) does instead, computed."""
    if cfg.epochs * cfg.minibatches > 1:
        J_one, _, _ = start.what_if(cfg.replace(epochs=1, minibatches=1))
        return f"With one optimizer step instead of {cfg.epochs * cfg.minibatches}, J moves by {J_one - J_before:+.1e}."
    J_small, _, _ = start.what_if(cfg, dataclasses.replace(start.run, lr=start.run.lr / 10))
    return f"With a tenth of the step size (lr {start.run.lr / 10:g}), J moves by {J_small - J_before:+.1e}."


def amplification(update: OptimizerRun, plain: OptimizerRun) -> float:
    """How many times longer the update's first step is than plain gradient ascent's (``inf`` if that is 0)."""
    return update.first_step_length / plain.first_step_length if plain.first_step_length > 0 else math.inf


def _peak(run: OptimizerRun) -> str:
    """Where the update's ``J`` peaked and where it ended, e.g. ``"0.134408 after step 2, 0.123288 after step 40"``."""
    hi = max(range(len(run.J)), key=run.J.__getitem__)
    return f"{run.J[hi]:.6f} after step {hi}, {run.J[-1]:.6f} after step {run.steps}"


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


if __name__ == "__main__":
    raise SystemExit(main())
