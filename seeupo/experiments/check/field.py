"""The field part of ``seeupo check``: every committed counterexample, replayed with the checked algorithm's own update.

The field's committed counterexamples (:func:`seeupo.experiments.counterexamples.field_counterexamples`:
the toolkit's searches and each published algorithm's check) are instances where some algorithm's
exact update lowered ``J``: hard cases, known in advance. Every check runs its own algorithm on each
of them, whatever algorithm and plugins recorded it: its own exact update (the verify row's optimizer,
step and epochs, the recorded group size) from the recorded start, for the recorded iterations. A
case in which ``J`` falls by more than the searches' tolerance is saved as a counterexample of this
algorithm (``counterexamples/field/``), replayed and explained as a search's case is.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from seeupo.experiments.check.report import FIELD_TOL, Explanation, FieldReplay

def replay_field(name: str, exact_epochs: int, out: Path, say: Callable[[str], None], results: list[FieldReplay],
                 explain: Callable[[Any, Path, Path], Explanation], rollouts: Any = None) -> None:
    """Run ``name``'s own exact update on every committed counterexample, appending to ``results`` as each finishes.

    ``exact_epochs``: the optimizer steps of a surrogate's update (the verify cells' own);
    ``explain(found, path, out)`` explains a case that lowered ``J`` (the check's
    :func:`~seeupo.experiments.check.run.explain_case`); ``rollouts``: the rows drawn this way
    (:class:`~seeupo.tabular.behaviour.Rollouts`; ``None``: as recorded, on policy).
    """
    from seeupo.experiments.counterexamples import case_setting, field_counterexamples, record, replay
    from seeupo.experiments.verify import algorithm_rows

    row = algorithm_rows([name], exact_epochs)[0]
    start = time.perf_counter()
    for file, instance in field_counterexamples():
        case = instance.case(row.config, row.optimizer, row.lr, row.iterations_factor, rollouts)
        found = record(case, "monotone", f"{name}: its own exact update on the field's counterexample {file}",
                       {"field": file} | ({"setting": instance.setting} if instance.setting else {}))
        drop = max((a - b for a, b in zip(found.J, found.J[1:])), default=0.0)
        decreased = drop > FIELD_TOL  # NaN is no decrease here; a J that stops being finite is found by the searches
        entry: dict[str, Any] = {}
        if decreased:
            path = out / "counterexamples" / "field" / f"{name}__{Path(file).parent.parent.name}__{Path(file).stem}.json"
            found.save(path)
            entry = {"case": str(path.relative_to(out)), "reproduces": replay(found).reproduces,
                     "explanation": explain(found, path, out)}
        results.append(FieldReplay(file=file, setting=case_setting(found), parameterization=case.run.parameterization,
                                   group_size=case.algorithm.group_size, iterations=case.iterations, J=found.J,
                                   largest_decrease=drop, decreased=decreased, **entry))
    lowered = [r for r in results if r.decreased]
    say(f"field: {len(lowered)} of {len(results)} committed counterexamples lowered J with {name}'s own update "
        f"({time.perf_counter() - start:.0f} s)")
