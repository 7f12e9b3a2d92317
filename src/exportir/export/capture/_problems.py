"""What ``draft_export`` found on its way: one :class:`FailureReport` per problem.

``export`` stops at the first problem; ``draft_export`` notes it here and keeps going with what
the example inputs show. Each report says what happened, where in the user's code, and the fix
that, once applied, lets ``export`` produce the program (a ``torch._check`` line, a ``Dim``, a
``register_fake`` function, a ``register_buffer`` call). The kinds and their numbers are
torch.export.draft_export's ``FailureType`` (``MISMATCHED_FAKE_KERNEL`` is never reported here:
exportir does not compare fake kernels with real ones), plus ``STATE_UPDATE`` for state changes
an exported program cannot carry.
"""

from __future__ import annotations

import enum
import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from exportir.symbolic import UserFrame

__all__ = ["FailureReport", "FailureType", "assignment_frame", "fake_kernel_snippet"]


class FailureType(enum.IntEnum):
    """The kind of a draft_export problem (torch's numbering)."""

    MISSING_FAKE_KERNEL = 1
    DATA_DEPENDENT_ERROR = 2
    GUARD_ADDED = 3
    STATE_UPDATE = 5

    def __str__(self) -> str:
        return self.name


_TITLES = {
    FailureType.MISSING_FAKE_KERNEL: "Missing fake kernel",
    FailureType.DATA_DEPENDENT_ERROR: "Data-dependent decision",
    FailureType.GUARD_ADDED: "Guard added (dynamic_shapes violated)",
    FailureType.STATE_UPDATE: "State update",
}


@dataclass(frozen=True, slots=True)
class FailureReport:
    """One problem: ``what`` happened at ``frame``; ``fix`` (code) placed as ``fix_how`` says."""

    failure_type: FailureType
    what: str
    frame: UserFrame | None
    fix: str
    fix_how: str  # "on the line before it", "in dynamic_shapes", ...
    data: Mapping[str, Any] = field(default_factory=dict)  # kind-specific facts (expr, op, ...)
    xfail: bool = False

    def print(self) -> str:
        """The report's text (numbered by :class:`DraftExportReport`)."""
        at = _indent(str(self.frame), 5) if self.frame is not None else "     <unknown location>"
        return (
            f"{_TITLES[self.failure_type]}: {self.what}, at\n{at}\n"
            f"   fix ({self.fix_how}):\n{_indent(self.fix, 5)}"
        )


def _indent(text: str, n: int) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


# ---------------------------------------------------------------------------- fake kernels


def fake_kernel_snippet(op: Any, args: tuple, kwargs: dict, outputs: list[torch.Tensor]) -> str:
    """A ``@torch.library.register_fake`` function for ``op`` that gives ``outputs``' metadata:
    an output shaped like a tensor argument is made from it (so it follows dynamic sizes);
    another gets the example's sizes."""
    schema = op._schema
    params = [a.name for a in schema.arguments]
    bound = dict(zip(params, args)) | dict(kwargs)
    tensors = [(n, v) for n, v in bound.items() if isinstance(v, torch.Tensor)]
    results = [_make_like(out, tensors) for out in outputs]
    body = results[0] if len(results) == 1 else "(" + ", ".join(results) + ",)"
    name = f"{schema.name}"  # "ns::op"
    return (
        f'@torch.library.register_fake("{name}")\n'
        f"def _({', '.join(params)}):\n"
        f"    return {body}"
    )


def _make_like(out: torch.Tensor, tensors: list[tuple[str, torch.Tensor]]) -> str:
    for name, t in tensors:
        if tuple(t.shape) == tuple(out.shape):
            if t.dtype == out.dtype:
                return f"torch.empty_like({name})"
            return f"{name}.new_empty({name}.shape, dtype={out.dtype})"
    shape = tuple(int(s) for s in out.shape)
    if tensors:
        first = tensors[0][0]
        return f"{first}.new_empty({shape}, dtype={out.dtype})"
    return f"torch.empty({shape}, dtype={out.dtype})"


# ---------------------------------------------------------------------------- state updates


def assignment_frame(module: torch.nn.Module, attr: str) -> UserFrame | None:
    """The line of ``type(module).forward`` that assigns ``self.<attr>`` (the first one), if its
    source is available: the assignment itself leaves no trace in the graph."""
    forward = type(module).forward
    try:
        lines, first = inspect.getsourcelines(forward)
        filename = inspect.getsourcefile(forward)
    except (OSError, TypeError):
        return None
    if filename is None:
        return None
    params = list(inspect.signature(forward).parameters)
    me = re.escape(params[0] if params else "self")
    pattern = re.compile(rf"\b{me}\.{re.escape(attr)}\s*(=[^=]|[-+*/@]=)")
    for i, line in enumerate(lines):
        if pattern.search(line):
            return UserFrame(filename, first + i, forward.__name__, line.strip())
    return None
