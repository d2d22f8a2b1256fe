"""Shared by every test: one intra-op torch thread, and float64 as the default dtype.

The tests work on tiny tensors; one thread is as fast alone and much faster when other
processes share a 2-core machine, where torch's worker threads would spin-wait. The package
uses float64 explicitly; the default dtype only spares the tests from spelling it out
(``tests/test_dtypes.py`` runs the package under the float32 default to catch leaks).
"""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)
