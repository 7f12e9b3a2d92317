"""The fused CPU backend at run time: its blob format and the executor the runtime calls.

This package is the backend's device side, shipped with the runtime: the default delegate
registry (:func:`exportir.runtime.default_delegate_registry`) holds a :class:`FusedCpuRuntime`
under :data:`BACKEND_ID`. It imports only torch and the standard library. The compile side
(partitioner, ``preprocess``) is :mod:`exportir.backends.fused_cpu`, which uses the same backend
id and kernel table.

- :mod:`.format`: the blob layout (a JSON op list plus raw constant bytes) and its validation;
- :mod:`.kernels`: the closed kernel table (:data:`OPS`), each op's fastest torch entry;
  :mod:`.quantized` and :mod:`.qlinear` its int8 / int4 kernels, some made at load for ops
  whose weights and qparams are constants;
- :mod:`.plan`: value lifetimes, memory sharing and the in-place safety rule;
- :mod:`.executor`: the blob compiled into one straight-line function at ``init``.

Loading validates the blob fully and never executes code from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exportir.runtime.backends.fused_cpu.executor import (
    FusedCpuExecutionError,
    FusedProgram,
    build,
    run,
)
from exportir.runtime.backends.fused_cpu.format import (
    ALIGNMENT,
    BACKEND_ID,
    DTYPES,
    FORMAT_VERSION,
    MAGIC,
    FusedCpuBlobError,
    decode_blob,
)
from exportir.runtime.backends.fused_cpu.kernels import INPLACE, OPS
from exportir.runtime.backends.fused_cpu.limits import DEFAULT_MAX_BYTES, FusedAllocationError

__all__ = [
    "ALIGNMENT",
    "BACKEND_ID",
    "DTYPES",
    "FORMAT_VERSION",
    "INPLACE",
    "MAGIC",
    "OPS",
    "FusedAllocationError",
    "FusedCpuBlobError",
    "FusedCpuExecutionError",
    "FusedCpuRuntime",
    "FusedProgram",
    "backend_runtime",
    "decode",
    "run",
]


def decode(blob: bytes | memoryview, max_bytes: int = DEFAULT_MAX_BYTES) -> FusedProgram:
    """Validate a blob and compile it; raises :class:`FusedCpuBlobError` naming the bad field.
    Ops whose result size an argument decides allocate at most ``max_bytes`` per result."""
    return build(decode_blob(blob), max_bytes)


class FusedCpuRuntime:
    """The delegate-registry entry: ``init(processed, compile_specs)`` validates and compiles
    the blob, ``execute(handle, inputs)`` runs it. Its outputs are new tensors on every call
    (``fresh_outputs``): the runtime may hand them to the caller without copying. A call keeps
    its values in the frame of its own generated function, so calls from several threads run
    at once (``thread_safe``). ``init`` takes the program's ``LoadLimits`` (``accepts_limits``):
    its ``max_dynamic_bytes`` caps what an op allocates by argument (``full``, ``arange``, ...).
    """

    __slots__ = ()
    fresh_outputs = True
    thread_safe = True
    accepts_limits = True

    def init(
        self, processed: bytes | memoryview, compile_specs: Sequence[Any], limits: Any = None
    ) -> FusedProgram:
        cap = getattr(limits, "max_dynamic_bytes", DEFAULT_MAX_BYTES)
        return decode(processed, cap)

    def execute(self, handle: FusedProgram, inputs: Sequence[Any]) -> tuple[Any, ...]:
        return run(handle, inputs)

    def destroy(self, handle: FusedProgram) -> None:
        return None

    def debug_ops(self, handle: FusedProgram) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Per op of the blob: its name and graph nodes (profiles, numerical debugging)."""
        from exportir.runtime.backends.fused_cpu.instrument import op_table

        return op_table(handle)

    def instrument(self, handle: FusedProgram, hook: Any) -> Any:
        """``call(inputs)`` running the blob with ``hook(i, outs)`` after each op ``i``."""
        from exportir.runtime.backends.fused_cpu.instrument import instrument

        return instrument(handle, hook)


def backend_runtime() -> FusedCpuRuntime:
    """A runtime object to register: ``registry.register(BACKEND_ID, backend_runtime())``."""
    return FusedCpuRuntime()
