"""Hypothesis profiles for the property tests.

* ``ci`` (default): deterministic (``derandomize=True``, no example database), few examples,
  no deadline. Every run of the suite draws the same examples, so a failure is reproducible
  and the default run stays fast.
* ``thorough``: many more examples, freshly randomised on every run (``make test-thorough``).

Choose with the environment variable ``SEEUPO_HYPOTHESIS_PROFILE`` (default ``ci``). A test
that wants a fraction of the profile's examples reads ``settings.default.max_examples`` at
import time, which is the loaded profile's.
"""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, settings

# tiny tensors: one intra-op thread avoids spin-waiting on a shared 2-core machine
torch.set_num_threads(1)

_SUPPRESSED = [HealthCheck.too_slow, HealthCheck.data_too_large]

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=15,
    print_blob=True,
    suppress_health_check=_SUPPRESSED,
)
settings.register_profile(
    "thorough",
    derandomize=False,
    database=None,
    deadline=None,
    max_examples=200,
    print_blob=True,
    suppress_health_check=_SUPPRESSED,
)

PROFILE = os.environ.get("SEEUPO_HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)  # an unknown name raises InvalidArgument, listing none silently


def pytest_report_header(config) -> str:
    return f"hypothesis profile: {PROFILE} (SEEUPO_HYPOTHESIS_PROFILE)"
