"""The fused CPU backend: ``FusedCpuPartitioner``, ``FusedCpuBackend`` (preprocess) and, in
``runtime``, the executor the program runtime calls.

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
        from exportir.backends.fused_cpu.runtime import FusedCpuRuntime

        return FusedCpuRuntime
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
