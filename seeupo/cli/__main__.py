"""``python -m seeupo.cli``: the same as ``python -m seeupo`` (benchmarks and tests run it this way)."""

from seeupo.cli import console

console()
