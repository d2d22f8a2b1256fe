"""Adapters from seeupo's registries to other training frameworks.

Each submodule needs its framework installed and is imported only where it is:
:mod:`seeupo.integrations.verl` (verl 0.9.1, see ``docs/verl.md``).
:mod:`seeupo.integrations.layout` (which aggregations survive another trainer's rows) and
:mod:`seeupo.integrations.trl` (TRL's ``loss_type`` of an aggregation) need neither.
"""
