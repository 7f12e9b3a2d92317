"""Errors raised by the runtime.

Every failure that happens while a method is prepared or executed is a :class:`RuntimeFailure`
that names where it happened in terms the user knows: the instruction index, the operator (or
delegate), the graph node the instruction was emitted from and the user's source line recorded in
the method's debug table. Problems with the caller's inputs are :class:`MethodInputError`.
Problems with the file itself are ``exportir.format.validate.ProgramLoadError`` (raised by
``Program.load`` before anything runs); :class:`MissingKernelError` and
:class:`MissingBackendError` are both: load errors that also name the instruction.
"""

from __future__ import annotations

from dataclasses import dataclass

from exportir.format.validate import ProgramLoadError


@dataclass(frozen=True, slots=True)
class FailureSite:
    """Where in a method a failure happened (all fields optional but ``method``)."""

    method: str
    instruction: int | None = None
    op: str | None = None
    node: str | None = None
    source: str | None = None

    def describe(self) -> str:
        parts = [f"method {self.method!r}"]
        if self.instruction is not None:
            parts.append(f"instruction {self.instruction}")
        if self.op:
            parts.append(f"op {self.op}")
        if self.node:
            parts.append(f"node {self.node!r}")
        text = ", ".join(parts)
        if self.source:
            text += f"\n  from user code: {self.source}"
        return text


class RuntimeFailure(RuntimeError):
    """A method failed to prepare or to execute.

    ``site`` says where (instruction, op, node, source line); ``reason`` says what; ``hint`` (may
    be empty) says what to do about it. The original exception, if any, is chained as
    ``__cause__``.
    """

    def __init__(self, site: FailureSite, reason: str, hint: str = "") -> None:
        self.site = site
        self.reason = reason
        self.hint = hint
        message = f"{site.describe()}\n  {reason}"
        if hint:
            message += f"\n  hint: {hint}"
        super().__init__(message)

    # Convenience accessors so callers (and tests) need not reach into ``site``.
    @property
    def instruction(self) -> int | None:
        return self.site.instruction

    @property
    def op(self) -> str | None:
        return self.site.op

    @property
    def node(self) -> str | None:
        return self.site.node

    @property
    def source(self) -> str | None:
        return self.site.source


class _LoadFailure(RuntimeFailure, ProgramLoadError):
    """A :class:`RuntimeFailure` found while loading: also a ``ProgramLoadError`` (``field``
    names the structure path)."""

    def __init__(self, site: FailureSite, reason: str, hint: str = "", field: str | None = None
                 ) -> None:
        RuntimeFailure.__init__(self, site, reason, hint)
        self.field = field
        self.offset = None
        if field:
            self.args = (f"{self.args[0]}\n  field: {field}",)


class MissingKernelError(_LoadFailure):
    """The program names an operator no kernel in the registry implements (raised by
    ``Program.load``: the operator is outside the kernel table and not registered)."""


class MissingBackendError(_LoadFailure):
    """A delegate names a backend id the delegate registry does not know."""


class DelegateInitError(_LoadFailure):
    """A backend refused a delegate's blob at load (its validation found it malformed) or
    failed to initialise it; the backend's own error is chained as ``__cause__``."""


class MethodInputError(ValueError):
    """The inputs given to a method do not match what the method was compiled for."""


class UnknownMethodError(KeyError):
    """``program.method(name)`` for a name the program does not define."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class ResourceLimitExceeded(RuntimeFailure):
    """A call needed more of a resource than the program's ``LoadLimits`` allow (``limit``
    names the field, e.g. ``"max_dynamic_bytes"``); nothing was allocated beyond the limit."""

    def __init__(self, site: FailureSite, reason: str, hint: str = "", *, limit: str) -> None:
        self.limit = limit
        super().__init__(site, reason, hint)


class LimitBreach(ValueError):
    """Raised inside a step when a limit is reached; the method reports it as
    :class:`ResourceLimitExceeded` naming the instruction."""

    def __init__(self, reason: str, limit: str) -> None:
        self.limit = limit
        super().__init__(reason)


def limit_hint(limit: str) -> str:
    return (f"if you trust this program, load it with a larger limit: "
            f"Program.load(..., limits=LoadLimits({limit}=...))")
