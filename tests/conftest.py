"""Shared pytest setup: make ``corpus`` and ``exportir`` importable from a plain checkout.

``EXPORTIR_FX_IMPL`` names the module the parity tests treat as "ours" (default
``exportir.fx``). Setting it to ``torch.fx`` runs the harness against the oracle itself,
which is how the harness is sanity-checked: every parity test must pass in that mode.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
_SRC = _TESTS.parent / "src"

if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))
if _SRC.is_dir() and str(_SRC) not in sys.path:
    sys.path.append(str(_SRC))

OURS_ENV = "EXPORTIR_FX_IMPL"


def ours_fx_name() -> str:
    return os.environ.get(OURS_ENV, "exportir.fx")


def import_ours_fx():
    """The FX implementation under test (``exportir.fx`` unless overridden)."""
    return importlib.import_module(ours_fx_name())


@pytest.fixture(scope="session")
def ours_fx():
    return import_ours_fx()
