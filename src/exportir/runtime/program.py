"""A loaded program file: ``Program.load(path_or_bytes)``.

Loading reads and **fully validates** the file (``exportir.format.serialize`` /
``exportir.format.validate``: header, checksums, every index, value kind, tensor size, storage
range and the memory plan) and **types** every method against the kernels it calls
(:mod:`exportir.runtime.typecheck`: operators in the kernel table, operand kinds, no write to a
constant or a view, define before use) before anything runs; a malformed file raises
``ProgramLoadError`` naming the field or byte offset. Files are memory-mapped read-only: constant
tensors are ``torch.frombuffer`` views of the mapped data segment (zero-copy weights), shared by
all methods. Then every delegate the program carries is initialised once through the delegate
registry (``backend.init(processed, compile_specs)``).

Methods are prepared on first use (``program.method(name)``) and cached: each owns its planned
arenas, allocated once.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch

from exportir.format import pte_read, schema, serialize
from exportir.format.validate import (
    DEFAULT_LIMITS,
    LoadLimits,
    ProgramLoadError,
    validate_program,
)
from exportir.runtime import memory, typecheck
from exportir.runtime.delegates import (
    BackendRuntime,
    DelegateRegistry,
    default_delegate_registry,
    registration_hint,
)
from exportir.runtime.errors import (
    DelegateInitError,
    FailureSite,
    MissingBackendError,
    RuntimeFailure,
    UnknownMethodError,
)
from exportir.runtime.kernels import KernelRegistry, default_kernel_registry
from exportir.runtime.method import Method

__all__ = ["Program", "ProgramLoadError"]


class Program:
    """An executable program. Build with :meth:`load` (from a file or bytes) or
    :meth:`from_schema` (an in-memory ``schema.Program``, validated the same way)."""

    __slots__ = (
        "_constants",
        "_handles",
        "_locks",
        "_mapping",
        "_methods",
        "_methods_lock",
        "_shared",
        "_shared_lock",
        "delegates",
        "kernels",
        "limits",
        "schema",
        "source",
    )

    def __init__(
        self,
        program: schema.Program,
        *,
        kernels: KernelRegistry | None = None,
        delegates: DelegateRegistry | None = None,
        mapping: mmap.mmap | None = None,
        source: str = "<memory>",
        limits: LoadLimits = DEFAULT_LIMITS,
    ) -> None:
        """Wrap an already validated ``schema.Program``; prefer :meth:`load`/:meth:`from_schema`."""
        self.schema = program
        self.limits = limits
        self.kernels = kernels if kernels is not None else default_kernel_registry()
        self.delegates = delegates if delegates is not None else default_delegate_registry()
        self.source = source
        self._mapping = mapping  # keeps the file mapped while constants view it
        self._constants: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}
        self._handles: list[tuple[BackendRuntime, Any] | None] = [None] * len(program.delegates)
        self._methods: dict[str, Method] = {}
        self._methods_lock = threading.Lock()
        self._locks: list[threading.Lock | contextlib.nullcontext[None]] = []
        # shared state (schema.SharedState): name -> the one tensor every method naming it uses;
        # calls of methods sharing state run one at a time under _shared_lock
        self._shared: dict[str, torch.Tensor] = {}
        self._shared_lock = threading.Lock()
        for i, c in enumerate(program.constants):  # a program still waiting for its weights
            if not isinstance(c.data, (bytes, bytearray, memoryview)):
                raise ProgramLoadError(
                    f"constant buffer {i} has no data ({type(c.data).__name__}); a program "
                    "exported on the meta device needs ProgramManager.attach_weights(...) first",
                    f"constants[{i}]")
        typecheck.check_program(program, self.kernels, limits)
        self._init_delegates()

    # -- construction ----------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        source: str | os.PathLike[str] | bytes | bytearray | memoryview,
        *,
        kernels: KernelRegistry | None = None,
        delegates: DelegateRegistry | None = None,
        verify_data: bool = True,
        limits: LoadLimits = DEFAULT_LIMITS,
    ) -> Program:
        """Load a program file (a path, memory-mapped) or its bytes, validating it fully: an
        exportir ``.xpt`` or an ExecuTorch ``.pte`` of portable kernels (told apart by content).

        ``kernels`` / ``delegates`` default to fresh default registries. ``verify_data`` checks
        the data segment's checksum (it reads every weight page once; skip it for huge,
        trusted files). Raises ``ProgramLoadError`` for a malformed file and
        :class:`RuntimeFailure` (e.g. :class:`MissingBackendError`) for one this runtime cannot
        run.
        """
        if isinstance(source, (bytes, bytearray, memoryview)):
            data: Any = source
            mapping = None
            name = "<bytes>"
        else:
            name = os.fspath(source)
            data = mapping = _map_file(name)
        with collector_paused():
            if pte_read.is_pte(data):  # ExecuTorch's format (docs/format/pte.md)
                program = pte_read.read_pte(data, limits)
                validate_program(program, limits)
            else:
                program = serialize.deserialize_program(data, verify_data=verify_data,
                                                        limits=limits)  # fmt: skip
            loaded = cls(program, kernels=kernels, delegates=delegates, mapping=mapping,
                         source=name, limits=limits)  # fmt: skip
        if mapping is not None:
            _release_pages(mapping)
        return loaded

    @classmethod
    def from_schema(
        cls,
        program: schema.Program,
        *,
        kernels: KernelRegistry | None = None,
        delegates: DelegateRegistry | None = None,
        limits: LoadLimits = DEFAULT_LIMITS,
    ) -> Program:
        """Run an in-memory ``schema.Program`` (validated exactly as a loaded file is)."""
        with collector_paused():
            validate_program(program, limits)
            return cls(program, kernels=kernels, delegates=delegates, limits=limits)

    # -- methods ---------------------------------------------------------------------------------

    @property
    def method_names(self) -> tuple[str, ...]:
        return self.schema.method_names

    def method(self, name: str = "forward") -> Method:
        """The prepared method ``name`` (kernels bound, arenas allocated; cached)."""
        found = self._methods.get(name)
        if found is not None:
            return found
        for meta in self.schema.methods:
            if meta.name == name:
                with self._methods_lock, collector_paused():  # threads share one Method
                    found = self._methods.get(name)
                    if found is None:
                        found = self._methods[name] = Method(self, meta)
                return found
        names = ", ".join(repr(n) for n in self.method_names) or "none"
        raise UnknownMethodError(f"program has no method {name!r}; its methods: {names}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Shorthand for ``program.method("forward")(*args, **kwargs)``."""
        return self.method("forward")(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Program({self.source!r}, methods={list(self.method_names)})"

    # -- shared state used by methods ------------------------------------------------------------

    def _constant(self, buffer: int, t: schema.Tensor) -> torch.Tensor:
        """Constant buffer ``buffer`` viewed as ``t`` (zero-copy, cached, never written)."""
        key = (buffer, int(t.dtype), tuple(t.sizes), tuple(t.dim_order))
        found = self._constants.get(key)
        if found is None:
            data = self.schema.constants[buffer].data
            found = self._constants[key] = memory.buffer_tensor(data, t)
        return found

    def _backend_id(self, index: int) -> str:
        delegates = self.schema.delegates
        return delegates[index].backend_id if 0 <= index < len(delegates) else f"#{index}"

    def _shared_state(self, name: str, t: schema.Tensor) -> torch.Tensor:
        """The program's state tensor ``name``, made (from ``t.initial``) by the first method
        prepared that names it. Methods are prepared under ``_methods_lock``."""
        found = self._shared.get(name)
        if found is None:
            found = self._shared[name] = memory.state_tensor(t)
            if t.initial is not None:
                found.copy_(self._constant(t.initial, t))
        return found

    def reset_state(self) -> None:
        """Put every shared state tensor back to its initial value (a new conversation for an
        LLM program's KV cache). Waits for running calls of methods sharing state."""
        with self._shared_lock:
            for meta in self.schema.methods:
                for entry in meta.shared_state:
                    t = meta.values[entry.value]
                    found = self._shared.get(entry.name)
                    if found is not None and isinstance(t, schema.Tensor) and t.initial is not None:
                        found.copy_(self._constant(t.initial, t))

    def _delegate_lock(self, index: int) -> threading.Lock | contextlib.nullcontext[None]:
        """What a call of delegate ``index`` holds while it runs: the delegate's own lock,
        unless its backend declares ``thread_safe = True``."""
        return self._locks[index]

    def _delegate(self, index: int, site: FailureSite) -> tuple[BackendRuntime, Any]:
        entry = self._handles[index]
        if entry is None:  # cannot happen after _init_delegates; kept for direct callers
            raise RuntimeFailure(site, f"delegate {index} was not initialised")
        return entry

    def _init_delegates(self) -> None:
        for index, d in enumerate(self.schema.delegates):
            backend = self.delegates.get(d.backend_id)
            site = self._delegate_site(index)
            if backend is None:
                known = ", ".join(self.delegates) or "none"
                raise MissingBackendError(
                    site,
                    f"the program delegates to backend {d.backend_id!r}, which the delegate "
                    f"registry does not have (registered: {known})",
                    registration_hint(d.backend_id),
                    field=f"delegates[{index}].backend_id",
                )
            try:
                if getattr(backend, "accepts_limits", False):
                    handle = backend.init(d.data, d.compile_specs, limits=self.limits)
                else:
                    handle = backend.init(d.data, d.compile_specs)
            except Exception as exc:
                raise DelegateInitError(
                    site, f"backend {d.backend_id!r} failed to initialise delegate {index}: "
                    f"{type(exc).__name__}: {exc}", field=f"delegates[{index}].data",
                ) from exc
            self._handles[index] = (backend, handle)
            self._locks.append(
                _UNLOCKED if getattr(backend, "thread_safe", False) else threading.Lock()
            )

    def _delegate_site(self, index: int) -> FailureSite:
        """The first instruction calling delegate ``index`` (for error messages)."""
        for meta in self.schema.methods:
            for pc, ins in enumerate(meta.instructions):
                if isinstance(ins, schema.DelegateCall) and ins.delegate_index == index:
                    entry = meta.debug[ins.debug] if 0 <= ins.debug < len(meta.debug) else None
                    return FailureSite(
                        meta.name, pc, f"delegate {self._backend_id(index)}",
                        entry.node_name if entry else None, entry.source if entry else None,
                    )
        return FailureSite("<program>", None, f"delegate {self._backend_id(index)}")


_UNLOCKED = contextlib.nullcontext()

_collector = {"pauses": 0, "was_enabled": False}
_collector_lock = threading.Lock()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a program or method is loaded (restored
    after; nested and concurrent loads count). Decoding and preparing allocate tens of
    thousands of containers and nothing cyclic to collect, and each collection they would
    trigger walks every object of the process (torch alone: ~170k): a full one cost ~90 ms,
    three quarters of a ResNet-18 load."""
    with _collector_lock:
        if _collector["pauses"] == 0:
            _collector["was_enabled"] = gc.isenabled()
            gc.disable()
        _collector["pauses"] += 1
    try:
        yield
    finally:
        with _collector_lock:
            _collector["pauses"] -= 1
            if _collector["pauses"] == 0 and _collector["was_enabled"]:
                gc.enable()


def _release_pages(mapping: mmap.mmap | bytes) -> None:
    """Take the mapped file's pages out of this process's resident memory once loading has
    read them (checksum, validation, weight packing). The mapping is read-only and shared,
    so nothing is lost: the pages stay in the kernel's page cache and are mapped again by
    the next read of them (a constant a call reads). Resident memory then holds what the
    program uses (packed weights, the constants calls read), not the whole file next to
    its packed copy."""
    if isinstance(mapping, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        with contextlib.suppress(OSError, ValueError):
            mapping.madvise(mmap.MADV_DONTNEED)


def _map_file(path: str) -> mmap.mmap | bytes:
    """Map ``path`` read-only (an empty file cannot be mapped: its bytes, which fail to load)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def load(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview,
    *,
    kernels: KernelRegistry | None = None,
    delegates: DelegateRegistry | None = None,
) -> Program:
    """``Program.load(source, ...)``."""
    return Program.load(source, kernels=kernels, delegates=delegates)
