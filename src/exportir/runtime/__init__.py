"""exportir.runtime: load program files and run their methods.

::

    from exportir.runtime import Program

    program = Program.load("model.xpt")       # mmap + full validation
    forward = program.method("forward")       # kernels bound, arenas allocated once
    out = forward(x)                          # outputs are copies, safe across calls

The runtime imports only torch, the standard library and the program format
(``exportir.format.schema`` / ``serialize`` / ``validate``) — never the capture stack.
Kernels come from a :class:`KernelRegistry` (ATen out variants by default) and delegates from a
:class:`DelegateRegistry`; both are explicit objects passed to :meth:`Program.load`.
"""

from exportir.format.validate import ProgramLoadError
from exportir.runtime.delegates import BackendRuntime, DelegateRegistry, default_delegate_registry
from exportir.runtime.errors import (
    DelegateInitError,
    FailureSite,
    MethodInputError,
    MissingBackendError,
    MissingKernelError,
    RuntimeFailure,
    UnknownMethodError,
)
from exportir.runtime.generate import LLMInfo, generate, llm_info
from exportir.runtime.kernels import Kernel, KernelRegistry, default_kernel_registry
from exportir.runtime.method import Method
from exportir.runtime.program import Program, load

__all__ = [
    "BackendRuntime",
    "DelegateInitError",
    "DelegateRegistry",
    "FailureSite",
    "Kernel",
    "KernelRegistry",
    "LLMInfo",
    "Method",
    "MethodInputError",
    "MissingBackendError",
    "MissingKernelError",
    "Program",
    "ProgramLoadError",
    "RuntimeFailure",
    "UnknownMethodError",
    "default_delegate_registry",
    "default_kernel_registry",
    "generate",
    "llm_info",
    "load",
]
