"""seeupo.integrations.verl without verl: a one-line ImportError saying how to install it.

Runs in the default suite (with or without verl installed: verl's modules are hidden here).
"""

from __future__ import annotations

import importlib
import sys

import pytest


def test_import_without_verl_is_one_line_error(monkeypatch):
    for name in [m for m in sys.modules if m == "verl" or m.startswith("verl.")] + ["verl"]:
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: "import verl" raises ImportError
    monkeypatch.delitem(sys.modules, "seeupo.integrations.verl", raising=False)
    with pytest.raises(ImportError) as info:
        importlib.import_module("seeupo.integrations.verl")
    message = str(info.value)
    assert message == "seeupo.integrations.verl needs verl, which is not installed: pip install 'verl==0.9.1'"
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no chained traceback
    assert "seeupo.integrations.verl" not in sys.modules


def test_integrations_package_imports_without_verl():
    import seeupo.integrations

    assert "verl" in seeupo.integrations.__doc__
