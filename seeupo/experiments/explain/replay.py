""":func:`explain`: replay a counterexample up to the iteration where ``J`` fell most and take that iteration apart."""

from __future__ import annotations

import dataclasses

import torch

from seeupo.experiments.counterexamples import Counterexample
from seeupo.experiments.explain.cause import _cause, _name, _refine
from seeupo.experiments.explain.measure import _actions, _run_update, _Start, history_label
from seeupo.experiments.explain.records import Explanation
from seeupo.tabular.exact import evaluate, optimal
from seeupo.tabular.train import AlgorithmStep, build_batch, initial_policy, make_optimizer, mirror_step


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
