"""The fused CPU backend's compile side: ``FusedCpuPartitioner`` and ``FusedCpuBackend``
(preprocess). Its executor ships with the runtime, :mod:`exportir.runtime.backends.fused_cpu`
(same backend id), and is in the runtime's default delegate registry; ``runtime`` here
re-exports it.

The compile-side names load on first use, so importing ``exportir.backends.fused_cpu.runtime``
(which imports this package first) loads nothing of the compiler.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BACKEND_ID", "FusedCpuBackend", "FusedCpuPartitioner", "FusedCpuRuntime"]

BACKEND_ID = "FusedCpuBackend"


def __getattr__(name: str) -> Any:
    if name == "FusedCpuBackend":
        from exportir.backends.fused_cpu.backend import FusedCpuBackend

        return FusedCpuBackend
    if name == "FusedCpuPartitioner":
        from exportir.backends.fused_cpu.partitioner import FusedCpuPartitioner

        return FusedCpuPartitioner
    if name == "FusedCpuRuntime":
        from exportir.runtime.backends.fused_cpu import FusedCpuRuntime

        return FusedCpuRuntime
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
