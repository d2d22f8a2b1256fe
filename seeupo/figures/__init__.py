"""Figures of the paper's artifacts and of the toolkit's own results (``seeupo figures``).

One module per figure, each with

* ``compute(quick: bool = False, seed: int = 0) -> dict``: the figure's data, JSON-ready. Recorded
  results under ``paper_repro/`` (Table 1, the counterexamples, the language-model bridge) are
  *read*; a figure that needs its own measurement (the J curves, the ablations) runs it with the
  tabular engine, deterministic from ``seed``;
* ``plot(data: dict, path) -> None``: a small PNG from that data only (matplotlib, Agg backend).

``FIGURES`` is the registry (the order of ``seeupo figures``); each module also runs alone,
``python -m seeupo.figures.<name> [--quick] [--out DIR] [--plot-only]``. Outputs go to
``figures/<name>.json`` and ``figures/<name>.png``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: Every figure, in the order ``seeupo figures`` makes them (module ``seeupo.figures.<name>``).
FIGURES: tuple[str, ...] = (
    "table1",
    "j_curves",
    "order_ablation",
    "normalisation_ablation",
    "m_ablation",
    "counterexamples",
    "bridge_lm",
    "training_curves",
    "step_time",
)


def module(name: str) -> ModuleType:
    """The module of figure ``name`` (``KeyError`` for a name not in :data:`FIGURES`)."""
    if name not in FIGURES:
        raise KeyError(name)
    return importlib.import_module(f"seeupo.figures.{name}")
