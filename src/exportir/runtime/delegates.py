"""The delegate registry: backend id -> backend runtime.

A program's delegates carry a backend id, the bytes the backend's ``preprocess`` produced and
the compile specs it was given. When a method is prepared, each delegate it calls is initialised
once with ``backend.init(processed, compile_specs) -> handle``; every ``DelegateCall`` then runs
``backend.execute(handle, inputs) -> outputs``.

``DelegateRegistry`` is an explicit object handed to ``Program.load``; nothing registers itself
at import time. :func:`default_delegate_registry` returns a fresh registry holding the builtin
backends: those whose executors ship in :mod:`exportir.runtime.backends` (the fused CPU backend,
``"FusedCpuBackend"``). Other backends are registered by the caller::

    delegates = default_delegate_registry()
    delegates.register("MyBackend", my_backend_runtime)
    program = Program.load("model.xpt", delegates=delegates)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class BackendRuntime(Protocol):
    """What the runtime needs from a backend.

    ``init`` receives the processed bytes (a read-only buffer that may view the mapped program
    file: copy what must outlive the program) and the compile specs as stored in the file, and
    returns an opaque handle. ``execute`` receives the handle and the delegate's input values
    (tensors and scalars in the order the delegate was lowered with) and returns its outputs as a
    sequence of tensors in the same order. ``destroy`` (optional) releases a handle.

    A backend whose ``execute`` returns new tensors on every call (never a buffer it reuses,
    an input or a constant) may say so with a class attribute ``fresh_outputs = True``: a
    result that is only a method output is then handed to the caller as it is, without a
    copy into the arena and a clone out of it. Without it, results are always copied.

    A backend whose ``init`` and ``execute`` may run from several threads at once (a call keeps
    nothing in the backend or the handle that another call could see) says so with
    ``thread_safe = True``. Without it, the runtime runs one call of each delegate at a time
    (per delegate, across every thread calling the method) and copies its results out before
    the next call starts.

    A backend that takes the program's ``LoadLimits`` declares ``accepts_limits = True``; its
    ``init`` is then called as ``init(processed, compile_specs, limits=limits)``, and it should
    keep what a call allocates by argument within ``limits.max_dynamic_bytes``, raising an
    exception with a ``limit`` attribute naming the field (the runtime reports it as
    ``ResourceLimitExceeded``).
    """

    def init(self, processed: bytes | memoryview, compile_specs: Sequence[object]) -> object: ...

    def execute(self, handle: object, inputs: Sequence[object]) -> Sequence[object]: ...


class DelegateRegistry:
    """Backend id -> :class:`BackendRuntime`."""

    __slots__ = ("_backends",)

    def __init__(self, backends: dict[str, BackendRuntime] | None = None) -> None:
        self._backends: dict[str, BackendRuntime | _Builtin] = {}
        for backend_id, backend in (backends or {}).items():
            if isinstance(backend, _Builtin):
                self._backends[backend_id] = backend
            else:
                self.register(backend_id, backend)

    def register(self, backend_id: str, backend: BackendRuntime) -> None:
        """Add (or replace) the backend runtime for ``backend_id``."""
        if not isinstance(backend, BackendRuntime):
            raise TypeError(
                f"backend {backend_id!r}: {type(backend).__name__} lacks init(processed, "
                "compile_specs) and execute(handle, inputs)"
            )
        self._backends[backend_id] = backend

    def get(self, backend_id: str) -> BackendRuntime | None:
        found = self._backends.get(backend_id)
        if isinstance(found, _Builtin):  # imported on first use (see _builtin_backends)
            found = self._backends[backend_id] = found.make()
        return found

    def __contains__(self, backend_id: object) -> bool:
        return backend_id in self._backends

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._backends))

    def copy(self) -> DelegateRegistry:
        return DelegateRegistry(dict(self._backends))


def registration_hint(backend_id: str) -> str:
    """What to do when ``backend_id`` is not registered."""
    if backend_id in _builtin_backends():
        return (
            f"{backend_id} ships with the runtime: load with the default registry "
            "(Program.load(...) or delegates=default_delegate_registry()), or add it with "
            f"registry.register({backend_id!r}, default_delegate_registry().get({backend_id!r}))"
        )
    return "registry.register(backend_id, backend), then Program.load(..., delegates=registry)"


def default_delegate_registry() -> DelegateRegistry:
    """A fresh registry with the builtin backends (:mod:`exportir.runtime.backends`)."""
    return DelegateRegistry(dict(_builtin_backends()))


class _Builtin:
    """A builtin backend not imported yet: its module is imported (and the backend made) the
    first time the registry is asked for it, so loading a program without delegates never
    imports a backend's executor."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], BackendRuntime]) -> None:
        self.make = make


def _fused_cpu() -> BackendRuntime:
    from exportir.runtime.backends import fused_cpu

    return fused_cpu.FusedCpuRuntime()


def _builtin_backends() -> dict[str, Any]:
    # backend id -> _Builtin; the ids are spelled here so that naming them imports nothing
    # (tests/runtime/test_delegates.py checks they match the backends' own BACKEND_ID)
    return {"FusedCpuBackend": _Builtin(_fused_cpu)}
