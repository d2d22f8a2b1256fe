"""The scorecard: an algorithm's score in [0, 1] on each capability experiment, beside the field's.

:mod:`~seeupo.experiments.scorecard.rules` holds the scoring rules (pure functions),
:mod:`~seeupo.experiments.scorecard.capabilities` the experiments, and
:mod:`~seeupo.experiments.scorecard.card` one algorithm's card (run, files, radar plot).
"""
