"""``python -m seeupo.experiments.bridge_lm`` (:func:`~seeupo.experiments.bridge_lm.cli.main`)."""

from seeupo.experiments.bridge_lm.cli import main

main()
