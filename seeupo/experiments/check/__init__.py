"""``seeupo check NAME``: the whole journey of one algorithm, from exact toy problems to a language model.

For a registered algorithm (a preset, built in or registered by a plugin) it runs, in order:

0. **gradient**: the estimator's expected update against the policy gradient, and the fixed
   point of plain exact ascent with it, on the agentic problem families (the agent stops when it
   chooses, intermediate rewards, stochastic tool results, token actions;
   :mod:`seeupo.experiments.gradient_check`): whether the estimator is biased and where it leads,
   the verdict that leads check.md;
1. **verify**: the verification cells of :mod:`seeupo.experiments.verify` for this algorithm
   alone (single and multi turn, exact and sampled, independent and shared parameters): the exact
   ``J`` after every iteration on random token bandits, judged with the verdict vocabulary;
2. **searches**: the generic monotonicity searches (:func:`seeupo.experiments.searches.algorithm_searches`):
   hypothesis looks for a case where one exact update lowers ``J``; a case found is shrunk, saved
   under ``OUT/counterexamples/`` with the plugins' hashes, and replayed before it is reported;
3. **bridge**: a short run of the language-model trainer on the 2-turn bridge problem
   (:mod:`seeupo.experiments.bridge_lm`), the tiny random Qwen3 for a few seeds, with the model's
   exact ``J`` after every step, beside the built-in ``grpo`` and ``seeupo`` on the same seeds,
   warm-up and steps (:func:`~seeupo.experiments.check.run.run_bridge`; needs the ``llm`` extra; skipped with the reason
   otherwise). A warm-up that leaves the model answering out of format makes it *vacuous*;

and writes ``OUT/check.md`` (a report to paste), ``OUT/check.json`` (everything measured) and
``OUT/check.png`` (exact ``J`` per iteration on the toy problems and per step on the bridge).

The verdict on monotonicity uses :data:`seeupo.experiments.verdicts.MEASURED`: ``J decreased``
when an exact update lowered ``J`` (a replaying counterexample or a random instance), ``no
learning signal`` when some exact cell or search never moved ``J`` (nothing was measured there),
``inconclusive`` when the plan did not finish, else ``monotone`` with the plan that found nothing. It says what was measured, not that the
algorithm is monotone: a search that finds nothing bounds nothing beyond its cases. The
counterexamples the searches find are replayed into the verify cells too
(:func:`seeupo.experiments.verify.apply_counterexamples`): one report, one truth.

Plan and time. What a check measures is a function of the algorithm, its plugins' content, the
flags and the seed: every part has a fixed, seeded number of cases (gradient problems and starts,
verify problems and iterations, search cases), printed in the plan, the same on any machine, and
the quick check's are a prefix of the default's, so more work only adds evidence. Before it starts,
``check`` times one small unit of each part on this machine (a two-iteration cell, three search
cases) for the estimate it prints. ``--budget SECONDS`` is an alarm: when it passes, the check
stops where it is and writes a partial report whose verdict is ``inconclusive: k of n planned ...
measured`` unless a decrease was already found (a counterexample found is still one). It never
makes the plan smaller (:mod:`~seeupo.experiments.check.planning`).

Explanations. Each counterexample a search finds (and that replays) is explained
(:mod:`seeupo.experiments.explain`): the one-line cause goes next to it in check.md, the full text
into ``counterexamples/NAME.explain.md``; an explanation that fails is one line in the report.

Compare. ``check NAME --compare A,B`` (:func:`compare`) runs the same check for each algorithm
(the same problems, seeds, verify sizes and searches, and one bridge run in which all of them
train from the same warm-up) and reports them side by side; the budget covers them all, split
equally (the first algorithm's share holds the bridge of all).

Interruption. Ctrl-C or SIGTERM stops the check where it is and writes the report of what
finished, marked partial, with every counterexample found so far (a search interrupted while
shrinking keeps its last failing case; :class:`SignalWatch`). ``--overwrite`` never deletes: an earlier check's files
are moved into ``previous-<UTC time>/`` in the same folder, and the report lists them.

The package, in the order of a check: :mod:`~seeupo.experiments.check.planning` (the sizes, this
machine's speed and the estimate), :mod:`~seeupo.experiments.check.run` (the
parts, :func:`check` and :func:`compare`), :mod:`~seeupo.experiments.check.verdict` (what the
measurements say), :mod:`~seeupo.experiments.check.report` (the typed reports, check.json, the exit
status) and :mod:`~seeupo.experiments.check.render` (check.md, check.png, the summary line).
"""

from seeupo.experiments.check.planning import (BRIDGE_BASELINES, DEFAULT, POOL_START_SECONDS, QUICK, Calibration,
                                               CheckBudget, Plan, bridge_presets, calibrate, gradient_calls,
                                               gradient_seconds, plan, plan_text)
from seeupo.experiments.check.render import (OUTPUTS, bridge_markdown, compare_markdown, explanation_line,
                                             gradient_headline, gradient_markdown, markdown, prepare_output,
                                             summary_line, write)
from seeupo.experiments.check.report import (BUDGET, INCONCLUSIVE, BridgeResult, CheckReport, ComparePlan, CompareReport, Explanation,
                                             Learning, MonotonicityVerdict, SearchEntry, Warmup, exit_status)
from seeupo.experiments.check.run import (Interrupted, SignalWatch, check, compare, explain_case, run_bridge,
                                          run_searches)
from seeupo.experiments.check.verdict import (BRIDGE_TOLERANCE, COMMITTED_COUNTEREXAMPLES, committed_counterexamples,
                                              learning, monotonicity, unfinished_parts)

__all__ = [
    "BRIDGE_BASELINES", "BRIDGE_TOLERANCE", "BUDGET", "COMMITTED_COUNTEREXAMPLES", "DEFAULT", "INCONCLUSIVE",
    "OUTPUTS", "POOL_START_SECONDS", "QUICK", "BridgeResult", "Calibration", "CheckBudget", "CheckReport",
    "ComparePlan", "CompareReport", "Explanation", "Interrupted", "Learning", "MonotonicityVerdict", "Plan",
    "SearchEntry", "SignalWatch", "Warmup", "bridge_markdown", "bridge_presets", "calibrate", "check",
    "committed_counterexamples", "compare", "compare_markdown", "exit_status", "explain_case", "explanation_line", "gradient_calls",
    "gradient_headline", "gradient_markdown", "gradient_seconds", "learning", "markdown", "monotonicity", "plan",
    "plan_text", "prepare_output", "run_bridge", "run_searches", "summary_line", "unfinished_parts", "write",
]
