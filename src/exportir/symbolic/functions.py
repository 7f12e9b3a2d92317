"""Integer functions sympy lacks with Python semantics: floor division, modulo, true division.

They print the way torch prints its own symbolic expressions (``(s0//2)``, ``Mod(s0, 2)``),
so graph annotations and guard texts read the same in both systems.
"""

from __future__ import annotations

import sympy


def _is_int(x: sympy.Basic) -> bool:
    return isinstance(x, sympy.Integer)


class FloorDiv(sympy.Function):
    """``a // b`` on integers (rounds toward negative infinity)."""

    nargs = (2,)
    is_integer = True
    precedence = 50  # like Mul: printed in parentheses

    @classmethod
    def eval(cls, a: sympy.Basic, b: sympy.Basic) -> sympy.Basic | None:
        if b == 0:
            raise ZeroDivisionError("division by zero")
        if a == 0:
            return sympy.S.Zero
        if b == 1:
            return a
        if _is_int(a) and _is_int(b):
            return sympy.Integer(int(a) // int(b))
        if isinstance(a, FloorDiv) and _is_int(b) and _is_int(a.args[1]):  # (x//2)//3 = x//6
            return FloorDiv(a.args[0], a.args[1] * b)
        if _is_int(b):
            return _divide_exact_terms(a, int(b))
        if a == b:
            return sympy.S.One
        quotient = sympy.cancel(a / b)  # (6*s0)//(2*s0) = 3
        if quotient.is_integer:
            return quotient
        return None

    def _sympystr(self, printer: sympy.printing.StrPrinter) -> str:
        a, b = (printer.parenthesize(x, 50) for x in self.args)
        return f"({a}//{b})"


def _divide_exact_terms(a: sympy.Basic, b: int) -> sympy.Basic | None:
    """``(2*s0 + 4) // 2 = s0 + 2``: when every term's coefficient is a multiple of ``b``."""
    terms = sympy.Add.make_args(a)
    exact = []
    for t in terms:
        coeff, rest = t.as_coeff_Mul()
        if not _is_int(coeff) or int(coeff) % b != 0 or not rest.is_integer:
            return None
        exact.append((int(coeff) // b) * rest)
    return sympy.Add(*exact)


class PyMod(sympy.Function):
    """``a % b`` with Python's sign rule (the result has the sign of ``b``)."""

    nargs = (2,)
    is_integer = True

    @classmethod
    def eval(cls, a: sympy.Basic, b: sympy.Basic) -> sympy.Basic | None:
        if b == 0:
            raise ZeroDivisionError("integer modulo by zero")
        if a == 0 or b == 1 or a == b:
            return sympy.S.Zero
        if _is_int(a) and _is_int(b):
            return sympy.Integer(int(a) % int(b))
        if sympy.cancel(a / b).is_integer:
            return sympy.S.Zero
        if _is_int(b):
            terms = [t for t in sympy.Add.make_args(a) if not _multiple_of(t, int(b))]
            if len(terms) < len(sympy.Add.make_args(a)):
                return PyMod(sympy.Add(*terms), b)
        return None

    def _sympystr(self, printer: sympy.printing.StrPrinter) -> str:
        return f"Mod({printer.doprint(self.args[0])}, {printer.doprint(self.args[1])})"


def _multiple_of(term: sympy.Basic, b: int) -> bool:
    coeff, rest = term.as_coeff_Mul()
    return _is_int(coeff) and int(coeff) % b == 0 and bool(rest.is_integer)


class IntTrueDiv(sympy.Function):
    """``a / b`` of two integers, a float."""

    nargs = (2,)
    is_real = True

    @classmethod
    def eval(cls, a: sympy.Basic, b: sympy.Basic) -> sympy.Basic | None:
        if b == 0:
            raise ZeroDivisionError("division by zero")
        if _is_int(a) and _is_int(b):
            return sympy.Float(int(a) / int(b))
        return None

    def _sympystr(self, printer: sympy.printing.StrPrinter) -> str:
        a, b = (printer.parenthesize(x, 50) for x in self.args)
        return f"({a}/{b})"


class ToFloat(sympy.Function):
    """``float(a)`` of an integer expression."""

    nargs = (1,)
    is_real = True

    @classmethod
    def eval(cls, a: sympy.Basic) -> sympy.Basic | None:
        if _is_int(a):
            return sympy.Float(int(a))
        return None


class TruncToInt(sympy.Function):
    """``int(x)`` of a float expression (rounds toward zero)."""

    nargs = (1,)
    is_integer = True

    @classmethod
    def eval(cls, a: sympy.Basic) -> sympy.Basic | None:
        if isinstance(a, (sympy.Float, sympy.Integer, sympy.Rational)):
            return sympy.Integer(int(a))
        if isinstance(a, ToFloat):
            return a.args[0]
        return None


class RoundToInt(sympy.Function):
    """``round(x)`` of a float expression: Python's rounding, half to even (``round(2.5) == 2``)."""

    nargs = (1,)
    is_integer = True

    @classmethod
    def eval(cls, a: sympy.Basic) -> sympy.Basic | None:
        if isinstance(a, sympy.Integer):
            return a
        if isinstance(a, (sympy.Float, sympy.Rational)):
            return sympy.Integer(round(float(a)) if isinstance(a, sympy.Float) else _round_rational(a))
        if isinstance(a, ToFloat):
            return a.args[0]
        return None


def _round_rational(q: sympy.Rational) -> int:
    """Python's ``round`` of an exact fraction (no float error: ``round(5/2) == 2``)."""
    from fractions import Fraction

    return round(Fraction(int(q.p), int(q.q)))


def evaluate(expr: sympy.Basic, values: dict[sympy.Symbol, int | float | bool]) -> object:
    """Value of ``expr`` with every free symbol replaced by a Python number."""
    out = expr.xreplace({s: _number(v) for s, v in values.items()})
    return to_python(out)


def _number(v: float | bool) -> sympy.Basic:
    if isinstance(v, bool):
        return sympy.true if v else sympy.false
    return sympy.Integer(v) if isinstance(v, int) else sympy.Float(v)


def to_python(expr: sympy.Basic) -> object:
    """``sympy.Integer(3)`` -> ``3``, ``sympy.true`` -> ``True``; else the expression itself."""
    if expr is sympy.true or expr is sympy.false:
        return bool(expr)
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Float) or (expr.is_number and expr.is_real):
        return float(expr)
    return expr
