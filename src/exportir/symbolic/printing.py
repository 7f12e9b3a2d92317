"""Printing symbolic expressions.

``str(expr)`` (sympy's printer plus the ``_sympystr`` hooks of functions.py) is the text torch
shows in graph annotations, guards and runtime-assert messages: ``s0``, ``2*s0``, ``s0 + 1``,
``Eq(u0, 1)``, ``(s0//2)``. :func:`python_source` renders an expression as Python source, for
suggested fixes such as ``torch._check(u0 == 1)``.
"""

from __future__ import annotations

import sympy
from sympy.printing.str import StrPrinter

from exportir.symbolic.functions import FloorDiv, IntTrueDiv, PyMod, RoundToInt, ToFloat, TruncToInt


class _PythonPrinter(StrPrinter):
    def _print_Equality(self, e: sympy.Eq) -> str:
        return f"{self._print(e.lhs)} == {self._print(e.rhs)}"

    def _print_Unequality(self, e: sympy.Ne) -> str:
        return f"{self._print(e.lhs)} != {self._print(e.rhs)}"

    def _print_And(self, e: sympy.And) -> str:
        return " and ".join(f"({self._print(a)})" for a in e.args)

    def _print_Or(self, e: sympy.Or) -> str:
        return " or ".join(f"({self._print(a)})" for a in e.args)

    def _print_Not(self, e: sympy.Not) -> str:
        return f"not ({self._print(e.args[0])})"

    def _print_Function(self, e: sympy.Basic) -> str:
        rule = _FUNCTIONS.get(type(e))
        if rule is not None:
            return rule(self, e)
        return super()._print_Function(e)

    def _print_Max(self, e: sympy.Basic) -> str:
        return f"max({', '.join(self._print(a) for a in e.args)})"

    def _print_Min(self, e: sympy.Basic) -> str:
        return f"min({', '.join(self._print(a) for a in e.args)})"

    def _print_BooleanTrue(self, e: sympy.Basic) -> str:
        return "True"

    def _print_BooleanFalse(self, e: sympy.Basic) -> str:
        return "False"


def _binary(op: str):
    def rule(p: _PythonPrinter, e: sympy.Basic) -> str:
        a, b = (p.parenthesize(x, 50) for x in e.args)
        return f"({a} {op} {b})"

    return rule


_FUNCTIONS = {
    FloorDiv: _binary("//"),
    PyMod: _binary("%"),
    IntTrueDiv: _binary("/"),
    ToFloat: lambda p, e: f"float({p._print(e.args[0])})",
    TruncToInt: lambda p, e: f"int({p._print(e.args[0])})",
    RoundToInt: lambda p, e: f"round({p._print(e.args[0])})",
}


def python_source(expr: sympy.Basic) -> str:
    """``Eq(u0, 1)`` -> ``u0 == 1``; ``(s0//2)`` -> ``(s0 // 2)``."""
    return _PythonPrinter().doprint(expr)
