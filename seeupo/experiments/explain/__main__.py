"""``python -m seeupo.experiments.explain``: restate the verdicts of counterexample files (:func:`~seeupo.experiments.explain.render.main`)."""

from seeupo.experiments.explain.render import main

raise SystemExit(main())
