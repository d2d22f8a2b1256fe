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

The package, in the order of an explanation: :mod:`~seeupo.experiments.explain.records` (the
constants and the typed explanation), :mod:`~seeupo.experiments.explain.measure` (the instance's
table and the update measured step by step), :mod:`~seeupo.experiments.explain.cause` (the cause
named and made precise, with the changed updates that show it),
:mod:`~seeupo.experiments.explain.replay` (:func:`explain`) and
:mod:`~seeupo.experiments.explain.render` (the text, the restated verdicts, the command line).
"""

from seeupo.experiments.explain.cause import amplification, misordered
from seeupo.experiments.explain.measure import history_label
from seeupo.experiments.explain.records import (CAUSES, FLAT, FLAT_SIGNAL, SCALE_INVARIANT, SLOPE_TOL, VANISHING,
                                                ActionRow, AdvantageClass, Explanation, OptimizerRun, Outcome)
from seeupo.experiments.explain.render import BEGIN, END, main, render, restate, summary_line
from seeupo.experiments.explain.replay import explain

__all__ = [
    "BEGIN", "CAUSES", "END", "FLAT", "FLAT_SIGNAL", "SCALE_INVARIANT", "SLOPE_TOL", "VANISHING", "ActionRow",
    "AdvantageClass", "Explanation", "OptimizerRun", "Outcome", "amplification", "explain", "history_label", "main",
    "misordered", "render", "restate", "summary_line",
]
