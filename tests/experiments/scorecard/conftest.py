"""The scorecard tests' hand-made algorithms (hand_algorithms.py), loaded as a plugin for the test that asks."""

from pathlib import Path

import pytest

HAND = Path(__file__).with_name("hand_algorithms.py")


@pytest.fixture
def hand():
    from seeupo import plugins

    plugins.forget_plugins()
    plugins.load_plugin(str(HAND))
    yield
    plugins.forget_plugins()
