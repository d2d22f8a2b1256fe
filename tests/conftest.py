"""Shared by every test: one intra-op torch thread, and float64 as the default dtype.

The tests work on tiny tensors; one thread is as fast alone and much faster when other
processes share a 2-core machine, where torch's worker threads would spin-wait. The package
uses float64 explicitly; the default dtype only spares the tests from spelling it out
(``tests/test_dtypes.py`` runs the package under the float32 default to catch leaks).
"""

import sys
from pathlib import Path

import pytest
import torch

EXAMPLE_ALGORITHMS = Path(__file__).resolve().parents[1] / "examples" / "algorithms"

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


@pytest.fixture
def load():
    """Load an example plugin of ``examples/algorithms/`` by its stem and return its module; afterwards
    unregister what it registered, and forget it."""
    from seeupo import plugins

    plugins.forget_plugins()

    def _load(stem: str):
        path = EXAMPLE_ALGORITHMS / f"{stem}.py"
        plugins.load_plugin(str(path))
        return next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == str(path.resolve()))

    yield _load
    plugins.forget_plugins()
