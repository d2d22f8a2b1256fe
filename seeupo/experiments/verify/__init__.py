"""The verification engine: run a grid of algorithms on batches of random problems and judge each cell.

A **cell** is one algorithm (a point of :class:`AlgorithmConfig`) on one setting (single- or
multi-turn), in one mode (exact or sampled), with one parameterisation (independent or
shared). Each cell trains a policy on every instance of a batch of random problems for a
number of iterations and records, per iteration and instance, the exact ``J``, the gap to
``J*`` and every decrease of ``J``. What a cell measured is one value of
:data:`seeupo.experiments.verdicts.MEASURED`:

* exact mode: ``converges`` (``J`` never decreased beyond ``tol`` and every instance ended
  within ``gap_tol`` of ``J*``), ``J decreased``, ``monotone, stuck below J*`` (some instance
  short of ``J*`` improved by less than ``stall_ratio`` of its gap over the last third of the
  run), or ``monotone, still improving`` (inconclusive);
* sampled mode: ``reaches J*`` or ``gap remains``. The update is estimated from samples, so
  ``J`` moves with the sampling noise: its decreases are counted and shown as a note
  (``noisy: 18 J decreases, largest 4.5e-04``), never as a violation;
* either mode: ``no learning signal`` when ``J`` never moved (checked before anything else: a
  frozen run is neither monotone nor converged).

An exact cell is not run when exact mode refuses the estimator (``exact: refused (REASON)``,
:func:`exact_refusal`); its sampled cells still run.

Counterexamples are measurements too. For an algorithm run by name (``algorithms``), the
counterexample files of ``algorithm_counterexamples`` (a ``seeupo check`` folder, its
``counterexamples/`` folder, or any folder of counterexample files) whose algorithm is that
one are replayed; one that replays turns the exact cells of its setting and parameters into
``J decreased`` (:func:`apply_counterexamples`), with the random instances' outcome kept
beside it. No cell says ``converges`` next to a replaying decrease.

Table 1 compares the paper with the exact, independent-parameter cells **and** the saved
counterexamples of each cell's algorithm (:data:`~seeupo.experiments.verdicts.TABLE1_SEARCHES`,
replayed from ``counterexample_dir``), with the rules of
:func:`seeupo.experiments.verdicts.table1_verdict` that ``seeupo claims`` uses too. The
other cells measure how far practice strays from the theory.

The package, in the order of a run: :mod:`~seeupo.experiments.verify.rows` (the algorithms: Table 1's
rows, the full grid, registered names), :mod:`~seeupo.experiments.verify.cells` (the sizes, settings,
problems and one cell's run), :mod:`~seeupo.experiments.verify.consult` (counterexamples as
measurements), :mod:`~seeupo.experiments.verify.run` (:func:`verify`, every cell in worker processes)
and :mod:`~seeupo.experiments.verify.report` (the headline, the disagreements, verify.md and verify.json).
"""

from seeupo.experiments.verify.cells import (BASE_SETTINGS, QUICK, CellResult, VerifyConfig, exact_refusal, make_problems,
                                             refused_cell, run_cell, setting_problems, setting_runs, setting_text,
                                             settings)
from seeupo.experiments.verify.consult import (algorithm_counterexample_files, apply_counterexamples,
                                               consult_counterexamples, mark_cells, table1_counterexamples, table1_entry)
from seeupo.experiments.verify.report import (VERIFY_OUTPUTS, agentic_markdown, disagreements, headline, markdown,
                                              write_report)
from seeupo.experiments.verify.rows import Row, algorithm_rows, describe, full_grid_rows, grid_choices, table1_rows
from seeupo.experiments.verify.run import stderr_progress, verify

__all__ = [
    "BASE_SETTINGS", "QUICK", "VERIFY_OUTPUTS", "CellResult", "Row", "VerifyConfig", "agentic_markdown",
    "algorithm_counterexample_files", "algorithm_rows", "apply_counterexamples", "consult_counterexamples", "describe",
    "disagreements", "exact_refusal", "full_grid_rows", "grid_choices", "headline", "make_problems", "mark_cells",
    "markdown", "refused_cell", "run_cell", "setting_problems", "setting_runs", "setting_text", "settings",
    "stderr_progress", "table1_counterexamples", "table1_entry", "table1_rows", "verify", "write_report",
]
