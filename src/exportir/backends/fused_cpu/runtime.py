"""The fused CPU backend's run-time side, re-exported from where the runtime ships it:
:mod:`exportir.runtime.backends.fused_cpu` (blob format, ``FusedCpuRuntime``). The runtime's
default delegate registry already holds it; this module keeps the compile side's imports and
older code working and, like its source, imports only torch and the standard library."""

from __future__ import annotations

from exportir.runtime.backends.fused_cpu import (
    ALIGNMENT,
    BACKEND_ID,
    DTYPES,
    FORMAT_VERSION,
    INPLACE,
    MAGIC,
    OPS,
    FusedCpuBlobError,
    FusedCpuExecutionError,
    FusedCpuRuntime,
    FusedProgram,
    backend_runtime,
    decode,
    run,
)

__all__ = [
    "ALIGNMENT",
    "BACKEND_ID",
    "DTYPES",
    "FORMAT_VERSION",
    "INPLACE",
    "MAGIC",
    "OPS",
    "FusedCpuBlobError",
    "FusedCpuExecutionError",
    "FusedCpuRuntime",
    "FusedProgram",
    "backend_runtime",
    "decode",
    "run",
]
