"""What to tell the user when Python branches on a data-dependent (unbacked) value.

``u0`` means nothing to the user: it is the number of rows of ``boxes[keep]``, or the value of
``n = t.item()``. :func:`explain` finds, in the frames of the code being traced, the local
variables that hold each unbacked symbol (``n``, ``boxes.shape[0]``, ``sizes[1]``) and writes
the condition in those names, so the suggested ``torch._check(boxes.shape[0] != 0)`` works when
pasted on the line before the branch. The place named is the innermost frame outside torch and
exportir (a library's line, such as torchvision's); the fix goes in the innermost frame of the
user's own code (not under site-packages) where every symbol has a name, else in that library
frame.
"""

from __future__ import annotations

import linecache
import sys
from dataclasses import dataclass
from types import FrameType
from typing import Any

import sympy
import torch

from exportir.symbolic.printing import python_source

_INTERNAL = ("/torch/", "/exportir/", "/sympy/", "<frozen", "/contextlib.py", "/functools.py")
# torch ships example programs (ExportDB): they are user code, not torch's implementation
_NOT_INTERNAL = ("/torch/_export/db/examples/",)
_LIBRARY = ("/site-packages/", "/dist-packages/")
# torch's symbolic scalar types (each wraps a SymNode); shared by capture and control flow
SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
_SYM_TYPES = SYM_TYPES


@dataclass(frozen=True, slots=True)
class SourceLine:
    """One frame of the traced program: ``File "f.py", line 3, in forward`` and its code."""

    filename: str
    lineno: int
    name: str
    code: str

    def __str__(self) -> str:
        text = f'File "{self.filename}", line {self.lineno}, in {self.name}'
        return text + (f"\n    {self.code}" if self.code else "")


@dataclass(frozen=True, slots=True)
class Explanation:
    """Where a data-dependent condition was met and how to state it in the user's names."""

    where: SourceLine | None  # the innermost traced frame (user code or a library)
    fix_at: SourceLine | None  # where the suggested torch._check goes
    condition: str  # the condition in Python, over the names at ``fix_at`` (or u0...)
    negation: str | None  # its negation (None for a non-boolean expression)
    names: dict[str, str]  # symbol -> the Python expression naming it at ``fix_at``


def _is_internal(filename: str) -> bool:
    name = filename.replace("\\", "/")
    if any(m in name for m in _NOT_INTERNAL):
        return False
    return any(m in name for m in _INTERNAL) or name.startswith("<")


def _is_library(filename: str) -> bool:
    name = filename.replace("\\", "/")
    return any(m in name for m in _LIBRARY)


def traced_frames(start: FrameType | None = None) -> list[FrameType]:
    """Frames of the traced program, innermost first (torch's and exportir's left out)."""
    frame = start if start is not None else sys._getframe(1)
    out = []
    while frame is not None:
        if not _is_internal(frame.f_code.co_filename):
            out.append(frame)
        frame = frame.f_back
    return out


def source_line(frame: FrameType) -> SourceLine:
    code = frame.f_code
    text = linecache.getline(code.co_filename, frame.f_lineno).strip()
    return SourceLine(code.co_filename, frame.f_lineno, code.co_name, text)


# ---------------------------------------------------------------------------- naming symbols


def _scalar_symbol(value: Any) -> sympy.Symbol | None:
    if isinstance(value, _SYM_TYPES):
        expr = value.node.expr
        if isinstance(expr, sympy.Symbol):
            return expr
        if isinstance(value, torch.SymBool) and isinstance(expr, sympy.Eq):  # u0 == 1 of .item()
            sym = expr.lhs if isinstance(expr.lhs, sympy.Symbol) else None
            return sym if sym is not None and expr.rhs == 1 else None
    return None


def _names_in(name: str, value: Any, found: dict[sympy.Symbol, str], depth: int = 0) -> None:
    """Record ``symbol -> python expression`` for the symbols ``value`` holds directly."""
    sym = _scalar_symbol(value)
    if sym is not None:
        found.setdefault(sym, f"int({name})" if isinstance(value, torch.SymBool) else name)
        return
    if isinstance(value, torch.Tensor):
        for d, size in enumerate(value.shape):
            if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                found.setdefault(size.node.expr, f"{name}.shape[{d}]")
        return
    if depth == 0 and isinstance(value, (list, tuple)) and len(value) <= 64:
        for i, item in enumerate(value):
            _names_in(f"{name}[{i}]", item, found, depth + 1)


def symbol_names(frame: FrameType, symbols: set[sympy.Symbol]) -> dict[sympy.Symbol, str]:
    """Names of ``symbols`` among ``frame``'s local variables (scalars before tensor sizes)."""
    found: dict[sympy.Symbol, str] = {}
    local_vars = [(k, v) for k, v in frame.f_locals.items() if not k.startswith("__")]
    # plain scalars first: ``n`` reads better than ``t.shape[0]`` for the same symbol
    for name, value in local_vars:
        if isinstance(value, _SYM_TYPES):
            _names_in(name, value, found)
    for name, value in local_vars:
        if not isinstance(value, _SYM_TYPES):
            _names_in(name, value, found)
    return {s: found[s] for s in symbols if s in found}


# ---------------------------------------------------------------------------- the condition


def _normalized(expr: sympy.Basic) -> sympy.Basic:
    """``Eq(4*u0, 0)`` -> ``Eq(u0, 0)``: a relation with 0 divided by its positive content."""
    if isinstance(expr, sympy.Rel) and expr.rhs == 0 and not expr.lhs.is_number:
        content, rest = expr.lhs.primitive()
        if content.is_positive and content != 1:
            return type(expr)(rest, 0)
    return expr


def _render(expr: sympy.Basic, names: dict[sympy.Symbol, str]) -> str:
    named = {s: sympy.Symbol(n) for s, n in names.items()}
    return python_source(_normalized(expr).xreplace(named))


def explain(expr: sympy.Basic, unbacked: set[sympy.Symbol], is_bool: bool,
            start: FrameType | None = None) -> Explanation:
    """How to tell the user about ``expr`` met in the frames above ``start``."""
    frames = traced_frames(start if start is not None else sys._getframe(1))
    where = source_line(frames[0]) if frames else None
    fix_frame, names = _fix_frame(frames, unbacked)
    fix_at = source_line(fix_frame) if fix_frame is not None else where
    negation = _render(sympy.Not(expr), names) if is_bool else None
    return Explanation(where, fix_at, _render(expr, names), negation,
                       {str(s): n for s, n in names.items()})


def _fix_frame(
    frames: list[FrameType], unbacked: set[sympy.Symbol]
) -> tuple[FrameType | None, dict[sympy.Symbol, str]]:
    """The innermost user frame naming every symbol, else the innermost frame naming every
    symbol, else the innermost frame (with what it names)."""
    named = [(f, symbol_names(f, unbacked)) for f in frames]
    complete = [(f, n) for f, n in named if len(n) == len(unbacked)]
    for f, n in complete:
        if not _is_library(f.f_code.co_filename):
            return f, n
    if complete:
        return complete[0]
    if named:
        return named[0]
    return None, {}
