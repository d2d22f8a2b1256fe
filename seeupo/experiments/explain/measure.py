"""The explained iteration measured: every reachable action's numbers, and the update's ``J`` after every step.

:func:`_run_update` runs the update as :class:`~seeupo.tabular.train.AlgorithmStep` does with
hooks that read each optimizer step; :class:`_Start` reruns the iteration changed (another
estimator, step size or rewards) from the same start, which the causes use as evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.config import AlgorithmConfig
from seeupo.core.update import UpdateSettings, policy_update
from seeupo.experiments.explain.records import ActionRow, AdvantageClass, OptimizerRun, Outcome
from seeupo.tabular.exact import evaluate
from seeupo.tabular.kl import start_as_reference
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import DTYPE, TreeMDP
from seeupo.tabular.train import RunConfig, build_batch, initial_policy, make_optimizer, mirror_step


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
        policy_update(policy, optimizer, batch, adv, cfg,
                      UpdateSettings(generator=generator, logp_ref=start_as_reference(batch, cfg)))
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
