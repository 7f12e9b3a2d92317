"""Which expression of the user's code made each unbacked symbol.

``u0`` means nothing to a reader; ``t.item()`` at line 14, or ``x.nonzero().shape[0]``, does.
When the recorder records an op whose value holds new unbacked symbols, :func:`note_origins`
stores a :class:`SymbolOrigin` for each in the ShapeEnv: the user-level expression (found in the
source line of the innermost traced frame, by the names the op goes by: ``.item()``,
``nonzero``, ``x[mask]``, ...), the op, and the frame. Error messages and draft_export's report
print it.
"""

from __future__ import annotations

import ast
from typing import Any

import sympy
import torch

from exportir.symbolic import ShapeEnv, SymbolOrigin, UserFrame
from exportir.symbolic.data_dependent import source_line, traced_frames

__all__ = ["note_origins"]

aten = torch.ops.aten

# op name (overload packet) -> (names of Python calls whose value is the op's value, so the
# symbol's access path applies to them; names of calls that reach the op otherwise, through a
# decomposition or with another result structure); "[]" is a subscript
_CALL_NAMES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "_local_scalar_dense": (("item", "int", "float", "bool"), ("tolist",)),
    "item": (("item", "int", "float", "bool"), ("tolist",)),
    "nonzero": (("nonzero", "argwhere"), ("where",)),
    "nonzero_numpy": ((), ("where", "nonzero")),
    "index": (("[]",), ()),
    "masked_select": (("masked_select",), ()),
    "_unique2": ((), ("unique",)),
    "unique_dim": ((), ("unique",)),
    "unique_consecutive": ((), ("unique_consecutive",)),
    "repeat_interleave": (("repeat_interleave",), ()),
    "bincount": (("bincount",), ()),
    "slice": (("[]",), ()),
}


def note_origins(env: ShapeEnv, func: Any, val: Any) -> None:
    """Record where the unbacked symbols first seen in ``val`` (an op's value) come from."""
    found = list(_new_symbols(env, val))
    if not found:
        return
    frames = traced_frames()
    line = source_line(frames[0]) if frames else None
    frame = UserFrame(line.filename, line.lineno, line.name, line.code) if line else None
    call, exact = _call_text(line.code if line else "", _op_name(func))
    for sym, path in found:
        expr = f"{call}{path}" if exact else call
        env.unbacked_origins[sym] = SymbolOrigin(expr, str(func), frame, exact)


def _op_name(func: Any) -> str:
    packet = getattr(func, "overloadpacket", None)
    return getattr(packet, "__name__", str(func)).split(".")[-1]


def _new_symbols(env: ShapeEnv, val: Any, path: str = "") -> Any:
    """``(symbol, access path)`` for each unbacked symbol of ``val`` not noted yet."""
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        yield from _fresh(env, val.node.expr, path)
    elif isinstance(val, torch.Tensor):
        for d, size in enumerate(val.shape):
            if isinstance(size, torch.SymInt):
                yield from _fresh(env, size.node.expr, f"{path}.shape[{d}]")
    elif isinstance(val, (tuple, list)):
        for i, item in enumerate(val):
            yield from _new_symbols(env, item, f"{path}[{i}]")


def _fresh(env: ShapeEnv, expr: sympy.Basic, path: str) -> Any:
    if isinstance(expr, sympy.Eq) and isinstance(expr.lhs, sympy.Symbol):  # a bool: Eq(u, 1)
        expr = expr.lhs
    if isinstance(expr, sympy.Symbol) and env.is_unbacked_symint(expr) \
            and expr not in env.unbacked_origins:
        yield expr, path


def _call_text(code: str, op: str) -> tuple[str, bool]:
    """The one sub-expression of ``code`` that reaches ``op`` ("" when there is none, or
    several), and whether its value is the op's value."""
    exact, other = _CALL_NAMES.get(op, ((op,), ()))
    tree = _parse(code.strip())
    if tree is None:
        return "", False
    for names, is_exact in ((exact, True), (other, False)):
        hits = [n for n in ast.walk(tree) if _matches(n, names)]
        if len(hits) == 1:
            return ast.unparse(hits[0]), is_exact
        if hits:
            return "", False
    return "", False


def _parse(code: str) -> ast.AST | None:
    """One source line as a statement; a compound statement's header (``if ...:``,
    ``elif ...:``, ``for ...:``) gets a body."""
    if code.startswith("elif "):
        code = code[2:]
    for text in (code, code + " pass"):
        try:
            return ast.parse(text)
        except SyntaxError:
            continue
    return None


def _matches(node: ast.AST, names: tuple[str, ...]) -> bool:
    if isinstance(node, ast.Subscript):
        return "[]" in names and not isinstance(node.slice, ast.Constant)
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in names
