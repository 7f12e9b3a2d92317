"""Fixtures of the backend tests: which int8 kernels this CPU runs (fused_cpu/int8_float.py)."""

from __future__ import annotations

import pytest

from exportir.runtime.backends.fused_cpu import dynamic_int8, int8_float, quantized

# the modules that ask int8_float.exact_int8_products() which kernels to run
_ASKERS = (int8_float, dynamic_int8, quantized)


def _force(monkeypatch: pytest.MonkeyPatch, exact: bool) -> None:
    for module in _ASKERS:
        monkeypatch.setattr(module, "exact_int8_products", lambda: exact)


@pytest.fixture
def saturating_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the test as on a CPU without VNNI, where oneDNN's and fbgemm's uint8 x int8
    products saturate and the backend computes int8 ops in float32 (any CPU can run that)."""
    _force(monkeypatch, False)


@pytest.fixture
def exact_cpu() -> None:
    """The test checks oneDNN's / fbgemm's own int8 kernels: it needs a CPU where their
    products are exact (AVX-512 VNNI or AMX)."""
    if not int8_float.exact_int8_products():
        pytest.skip("this CPU has no AVX-512 VNNI / AMX: oneDNN's and fbgemm's int8 products "
                    "saturate, so the backend does not run them (the saturating_cpu tests "
                    "cover what runs instead)")
