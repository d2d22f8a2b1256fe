"""The cause of a decrease (one of :data:`~seeupo.experiments.explain.records.CAUSES`), with the numbers that show it.

:func:`_cause` reads the measured iteration (the expected advantages, the first step's slope, plain
gradient ascent beside the optimizer); :func:`_refine` makes it precise by running the iteration
changed from the same start (:class:`~seeupo.experiments.explain.measure._Start`) and says what
changes the outcome.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.config import AlgorithmConfig
from seeupo.experiments.explain.measure import _row_values, _Start
from seeupo.experiments.explain.records import (FLAT, FLAT_SIGNAL, SCALE_INVARIANT, SLOPE_TOL, VANISHING, ActionRow,
                                                OptimizerRun)


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
