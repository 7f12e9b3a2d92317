"""What a backend implements ahead of time, and the registry ``to_backend`` finds it in.

A backend subclasses :class:`BackendDetails` and implements
``preprocess(edge_program, compile_specs) -> PreprocessResult``: it receives the Edge-dialect
``ExportedProgram`` of one partition (or of a whole program) and returns the bytes its runtime
executes. ``backend_id`` (by default the class name, as in ExecuTorch) names the backend both here
and in the runtime's delegate registry. ``runtime()`` may return the backend's runtime object
(``init(processed, compile_specs) -> handle``, ``execute(handle, inputs) -> outputs``) so that a
lowered module can run in Python exactly as the runtime would run it. ``preprocess`` must not
decide symbolic sizes of a dynamic program (``to_backend`` refuses one that adds guards).

:class:`BackendRegistry` maps backend ids to backends. It is an explicit object;
:func:`default_backend_registry` builds a fresh one holding every ``BackendDetails`` subclass
defined so far (ExecuTorch's rule: a backend is found by id among the imported backends).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from exportir.dialects.backend.specs import CompileSpec

__all__ = ["BackendDetails", "BackendRegistry", "PreprocessResult", "default_backend_registry"]


@dataclass(frozen=True, slots=True)
class PreprocessResult:
    """The blob a backend's runtime executes, and (optionally) the backend's debug map
    (debug handle -> node names of the partition)."""

    processed_bytes: bytes = b""
    debug_handle_map: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        data = self.processed_bytes
        if isinstance(data, (bytearray, memoryview)):
            object.__setattr__(self, "processed_bytes", bytes(data))
        elif not isinstance(data, bytes):
            raise TypeError(
                f"PreprocessResult.processed_bytes must be bytes; got {type(data).__name__}"
            )
        object.__setattr__(self, "debug_handle_map", MappingProxyType(dict(self.debug_handle_map)))


class BackendDetails:
    """Base class of a backend's ahead-of-time side (see the module docstring)."""

    backend_id: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "backend_id" not in cls.__dict__:
            cls.backend_id = cls.__name__

    @classmethod
    def preprocess(
        cls, edge_program: Any, compile_specs: Sequence[CompileSpec]
    ) -> PreprocessResult:
        """Compile ``edge_program`` (an Edge ``ExportedProgram``) into the runtime's blob."""
        raise NotImplementedError(
            f"{cls.__name__} must implement preprocess(edge_program, "
            "compile_specs) -> PreprocessResult"
        )

    @classmethod
    def runtime(cls) -> Any | None:
        """The backend's runtime object, used to run lowered modules in Python (None: run the
        original program instead)."""
        return None


class BackendRegistry:
    """Backend id -> :class:`BackendDetails` subclass."""

    __slots__ = ("_backends",)

    def __init__(self, backends: Iterable[type[BackendDetails]] = ()) -> None:
        self._backends: dict[str, type[BackendDetails]] = {}
        for backend in backends:
            self.register(backend)

    def register(self, backend: type[BackendDetails]) -> None:
        """Add (or replace) ``backend`` under its ``backend_id``."""
        if not (isinstance(backend, type) and issubclass(backend, BackendDetails)):
            raise TypeError(
                f"{backend!r} is not a BackendDetails subclass; a backend subclasses "
                "exportir.dialects.backend.BackendDetails and implements preprocess()"
            )
        self._backends[backend.backend_id] = backend

    def get(self, backend_id: str) -> type[BackendDetails]:
        """The backend registered as ``backend_id``; ``KeyError`` naming the way out."""
        found = self._backends.get(backend_id)
        if found is None:
            known = ", ".join(sorted(self._backends)) or "none"
            raise KeyError(
                f"no backend {backend_id!r} is registered (known: {known}). Import the module "
                "defining its BackendDetails subclass, or pass registry=BackendRegistry([...]) "
                "to to_backend."
            )
        return found

    def __contains__(self, backend_id: object) -> bool:
        return backend_id in self._backends

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._backends))


def _all_subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def default_backend_registry() -> BackendRegistry:
    """A fresh registry of every ``BackendDetails`` subclass defined so far."""
    return BackendRegistry(_all_subclasses(BackendDetails))
