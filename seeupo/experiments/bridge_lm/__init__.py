"""Every preset on the bridge with real language models, exact ``J`` per iteration (issue 9 §4).

The experiment the paper could not run: each preset (``ppo``, ``grpo``, ``gspo``, ``rloo``,
``reinforce_pp``, ``seeupo``, and ``seeupo`` with ``algorithm.m_refresh=true`` or
``algorithm.equal_budget=true``) trains a language
model (the tiny random Qwen3 and SmolLM2-135M-Instruct) on a fixed 2-turn bridge problem
(:mod:`seeupo.llm.envs.bridge`) for a few seeds; after every step the language model's exact
``J`` is computed by enumeration. The tables report, per (model, preset, variant) over seeds, the
initial and final ``J``, ``J*``, the final gap, the number and size of decreases of the exact
``J``, the staleness of SeeUPO's factor ``M`` (``seeupo/m_drift_max``: ``max |log F_recorded - log
F_current|`` at the end of the sweep; 0 with independent per-turn parameters) and the time per step.

The ablation ``m_refresh_3turn`` (:func:`m_refresh_sweep`, folders under ``OUT/turns3``) repeats
SeeUPO with and without ``m_refresh`` on a 3-turn bridge: with 2 turns the refresh is a no-op.

Each run writes ``OUT/<model>/<preset>[-variant]/seed<k>/metrics.jsonl`` (step 0 is the initial
``J``, after the format warm-up); a run whose file already holds every step is skipped, so an
interrupted sweep resumes where it stopped (an incomplete run is restarted from scratch). No
checkpoints are written (a SmolLM2 checkpoint with optimizer state is ~2 GB).

Usage::

    python -m seeupo.experiments.bridge_lm --out results/bridge_lm            # the full sweep
    python -m seeupo.experiments.bridge_lm --quick --out /tmp/bridge_lm_quick  # 1 preset, tiny model, 2 steps
    python -m seeupo.experiments.bridge_lm --grid --lr 1e-3 3e-3 --seeds 20    # rates over seeds (grid.json/.md)

The grid (``--grid``) is the statistics behind the claims: the tiny model's setting at each learning
rate with many seeds per preset; per (preset, lr) cell the rate of runs that collapse (exact J below
``COLLAPSE_J``) and of runs with a one-step drop above ``DROP_J``, each with a 95% interval, and
Fisher's exact test between presets (:mod:`seeupo.experiments.stats`).

The package: :mod:`~seeupo.experiments.bridge_lm.sweep` (the problem, the models' settings, the
runs and their training configs), :mod:`~seeupo.experiments.bridge_lm.runs` (the shared warm-up and
one run trained), :mod:`~seeupo.experiments.bridge_lm.tables` (results.json/.md from the runs'
metrics), :mod:`~seeupo.experiments.bridge_lm.grid` (the seed grid) and
:mod:`~seeupo.experiments.bridge_lm.cli` (the command line, :func:`main`).
"""

from seeupo.experiments.bridge_lm.cli import main, parse_args
from seeupo.experiments.bridge_lm.grid import (COLLAPSE_J, DROP_J, FORMAT_LOST, GRID_LABELS, MAX_GRID_SEEDS, POOL_MAX_LR,
                                               grid_file, grid_run, grid_specs, parse_label, read_grid,
                                               render_grid_markdown, run_grid, run_outcomes, summarise_grid,
                                               write_grid_tables)
from seeupo.experiments.bridge_lm.runs import is_complete, run_one, warmup_result
from seeupo.experiments.bridge_lm.sweep import (ABLATIONS, BRIDGE, DECREASE_TOL, DEFAULT_TABLES, PRESETS, VARIANTS,
                                                ModelSetting, RunSpec, Sweep, full_sweep, m_refresh_sweep, quick_sweep,
                                                runs_of, train_config)
from seeupo.experiments.bridge_lm.tables import build_tables, render_markdown, summarise_run, write_tables

__all__ = [
    "ABLATIONS", "BRIDGE", "COLLAPSE_J", "DECREASE_TOL", "DEFAULT_TABLES", "DROP_J", "FORMAT_LOST", "GRID_LABELS",
    "MAX_GRID_SEEDS", "POOL_MAX_LR", "PRESETS", "VARIANTS", "ModelSetting", "RunSpec", "Sweep", "build_tables",
    "full_sweep", "grid_file", "grid_run", "grid_specs", "is_complete", "m_refresh_sweep", "main", "parse_args",
    "parse_label", "quick_sweep", "read_grid", "render_grid_markdown", "render_markdown", "run_grid", "run_one",
    "run_outcomes", "runs_of", "summarise_grid", "summarise_run", "train_config", "warmup_result", "write_grid_tables",
    "write_tables",
]
