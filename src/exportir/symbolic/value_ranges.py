"""Value ranges: the closed interval ``[lower, upper]`` a symbolic value may take.

Bounds are sympy numbers with ``sympy.oo`` / ``-sympy.oo`` for unbounded sides; boolean ranges
use ``sympy.false`` / ``sympy.true``. :func:`bound` computes the range of an expression from the
ranges of its symbols (interval arithmetic), which is how guards on unbacked symbols are decided
without a hint. Printed like torch: ``VR[2, 64]``, ``VR[0, int_oo]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import sympy

from exportir.symbolic.functions import (
    FloorDiv,
    IntTrueDiv,
    PyMod,
    RoundToInt,
    ToFloat,
    TruncToInt,
)

oo = sympy.oo


@dataclass(frozen=True, slots=True)
class ValueRanges:
    lower: sympy.Basic
    upper: sympy.Basic
    is_bool: bool = False

    @staticmethod
    def of(lower: object, upper: object) -> ValueRanges:
        return ValueRanges(_num(lower), _num(upper))

    @staticmethod
    def point(value: object) -> ValueRanges:
        if isinstance(value, bool) or value in (sympy.true, sympy.false):
            b = sympy.true if value else sympy.false
            return ValueRanges(b, b, True)
        return ValueRanges(_num(value), _num(value))

    @staticmethod
    def unknown() -> ValueRanges:
        return ValueRanges(-oo, oo)

    @staticmethod
    def unknown_bool() -> ValueRanges:
        return ValueRanges(sympy.false, sympy.true, True)

    def is_singleton(self) -> bool:
        return self.lower == self.upper

    def __and__(self, other: ValueRanges) -> ValueRanges:
        """Intersection."""
        if self.is_bool:
            return self if self.is_singleton() else other
        return ValueRanges(sympy.Max(self.lower, other.lower), sympy.Min(self.upper, other.upper))

    def __or__(self, other: ValueRanges) -> ValueRanges:
        """Smallest range containing both."""
        if self.is_bool:
            return self if self == other else ValueRanges.unknown_bool()
        return ValueRanges(sympy.Min(self.lower, other.lower), sympy.Max(self.upper, other.upper))

    def contains(self, value: object) -> bool:
        v = _num(value)
        return bool(self.lower <= v) and bool(v <= self.upper)

    def issubset(self, other: ValueRanges) -> bool:
        return bool(other.lower <= self.lower) and bool(self.upper <= other.upper)

    def __repr__(self) -> str:
        return f"VR[{_bound_str(self.lower)}, {_bound_str(self.upper)}]"

    __str__ = __repr__


def _num(x: object) -> sympy.Basic:
    if isinstance(x, sympy.Basic):
        return x
    if isinstance(x, float) and math.isinf(x):
        return oo if x > 0 else -oo
    return sympy.sympify(x)


def _bound_str(b: sympy.Basic) -> str:
    if b == oo:
        return "int_oo"
    if b == -oo:
        return "-int_oo"
    return str(b)


# --- interval arithmetic ------------------------------------------------------------------


def _mul_bounds(a: sympy.Basic, b: sympy.Basic) -> sympy.Basic:
    if a == 0 or b == 0:  # 0 * oo is 0 for the range of an integer product
        return sympy.S.Zero
    return a * b


def _add(x: ValueRanges, y: ValueRanges) -> ValueRanges:
    return ValueRanges(x.lower + y.lower, x.upper + y.upper)


def _mul(x: ValueRanges, y: ValueRanges) -> ValueRanges:
    corners = [_mul_bounds(a, b) for a in (x.lower, x.upper) for b in (y.lower, y.upper)]
    return ValueRanges(sympy.Min(*corners), sympy.Max(*corners))


def _floordiv(x: ValueRanges, y: ValueRanges) -> ValueRanges:
    if not bool(y.lower > 0):
        return ValueRanges.unknown()
    corners = [_floor_div_bound(a, b) for a in (x.lower, x.upper) for b in (y.lower, y.upper)]
    return ValueRanges(sympy.Min(*corners), sympy.Max(*corners))


def _floor_div_bound(a: sympy.Basic, b: sympy.Basic) -> sympy.Basic:
    if a in (oo, -oo):
        return a
    if b == oo:
        return sympy.S.Zero if bool(a >= 0) else sympy.S.NegativeOne
    return sympy.floor(a / b)


def _mod(x: ValueRanges, y: ValueRanges) -> ValueRanges:
    if not bool(y.lower > 0):
        return ValueRanges.unknown()
    upper = y.upper - 1
    if bool(x.lower >= 0):
        upper = sympy.Min(upper, x.upper)
    return ValueRanges(sympy.S.Zero, upper)


def _pow(x: ValueRanges, y: ValueRanges) -> ValueRanges:
    if not (y.is_singleton() and y.lower.is_Integer and bool(y.lower >= 0)):
        return ValueRanges.unknown()
    n = int(y.lower)
    if bool(x.lower >= 0):
        return ValueRanges(x.lower**n, x.upper**n)
    if n % 2 == 1:
        return ValueRanges(x.lower**n, x.upper**n)
    return ValueRanges(sympy.S.Zero, sympy.Max(x.lower**n, x.upper**n))


def _min(*rs: ValueRanges) -> ValueRanges:
    return ValueRanges(sympy.Min(*(r.lower for r in rs)), sympy.Min(*(r.upper for r in rs)))


def _max(*rs: ValueRanges) -> ValueRanges:
    return ValueRanges(sympy.Max(*(r.lower for r in rs)), sympy.Max(*(r.upper for r in rs)))


def _truediv(x: ValueRanges, y: ValueRanges) -> ValueRanges:
    if not bool(y.lower > 0):
        return ValueRanges.unknown()
    corners = [a / b if b != oo else sympy.S.Zero for a in (x.lower, x.upper) for b in (y.lower, y.upper)]
    return ValueRanges(sympy.Min(*corners), sympy.Max(*corners))


def _round_bound(b: sympy.Basic) -> sympy.Basic:
    return b if b in (oo, -oo) else RoundToInt(b)


def _bool(value: bool | None) -> ValueRanges:
    return ValueRanges.unknown_bool() if value is None else ValueRanges.point(value)


def _compare(diff: ValueRanges, rel: type) -> ValueRanges:
    """Range of ``lhs REL rhs`` from the range of ``lhs - rhs``."""
    lo, hi = diff.lower, diff.upper
    decide: dict[type, Callable[[], bool | None]] = {
        sympy.GreaterThan: lambda: True if bool(lo >= 0) else False if bool(hi < 0) else None,
        sympy.StrictGreaterThan: lambda: True if bool(lo > 0) else False if bool(hi <= 0) else None,
        sympy.LessThan: lambda: True if bool(hi <= 0) else False if bool(lo > 0) else None,
        sympy.StrictLessThan: lambda: True if bool(hi < 0) else False if bool(lo >= 0) else None,
        sympy.Eq: lambda: True if lo == hi == 0 else False if bool(lo > 0) or bool(hi < 0) else None,
        sympy.Ne: lambda: False if lo == hi == 0 else True if bool(lo > 0) or bool(hi < 0) else None,
    }
    return _bool(decide[rel]())


def _logic(args: list[ValueRanges], kind: str) -> ValueRanges:
    values = [r.lower if r.is_singleton() else None for r in args]
    if kind == "and":
        if any(v is sympy.false for v in values):
            return _bool(False)
        return _bool(True) if all(v is sympy.true for v in values) else _bool(None)
    if any(v is sympy.true for v in values):
        return _bool(True)
    return _bool(False) if all(v is sympy.false for v in values) else _bool(None)


def _not(r: ValueRanges) -> ValueRanges:
    return _bool(not bool(r.lower)) if r.is_singleton() else _bool(None)


# expression head -> how its range follows from the ranges of its arguments
_RULES: dict[type, Callable[..., ValueRanges]] = {
    FloorDiv: _floordiv,
    PyMod: _mod,
    sympy.Mod: _mod,
    sympy.Pow: _pow,
    sympy.Min: _min,
    sympy.Max: _max,
    IntTrueDiv: _truediv,
    ToFloat: lambda x: x,
    TruncToInt: lambda x: ValueRanges(sympy.ceiling(x.lower) if bool(x.lower < 0) else sympy.floor(x.lower),
                                      sympy.floor(x.upper) if bool(x.upper > 0) else sympy.ceiling(x.upper)),
    RoundToInt: lambda x: ValueRanges(_round_bound(x.lower), _round_bound(x.upper)),
    sympy.Not: _not,
    sympy.And: lambda *rs: _logic(list(rs), "and"),
    sympy.Or: lambda *rs: _logic(list(rs), "or"),
}


def bound(expr: sympy.Basic, ranges: Mapping[sympy.Symbol, ValueRanges]) -> ValueRanges:
    """The range of ``expr`` given the ranges of its symbols (unknown symbols are unbounded)."""
    if expr is sympy.true or expr is sympy.false:
        return ValueRanges.point(bool(expr))
    if expr.is_number:
        return ValueRanges.point(expr)
    if isinstance(expr, sympy.Symbol):
        return ranges.get(expr, ValueRanges.unknown_bool() if expr.is_Boolean else _symbol_default(expr))
    if isinstance(expr, sympy.Add):
        out = ValueRanges.point(0)
        for a in expr.args:
            out = _add(out, bound(a, ranges))
        return out
    if isinstance(expr, sympy.Mul):
        out = ValueRanges.point(1)
        for a in expr.args:
            out = _mul(out, bound(a, ranges))
        return out
    if isinstance(expr, sympy.Rel):
        return _relation(expr, ranges)
    rule = _RULES.get(type(expr))
    if rule is None:
        return ValueRanges.unknown()
    return rule(*(bound(a, ranges) for a in expr.args))


def _symbol_default(sym: sympy.Symbol) -> ValueRanges:
    if sym.is_positive:
        return ValueRanges(sympy.S.One, oo)
    if sym.is_nonnegative:
        return ValueRanges(sympy.S.Zero, oo)
    return ValueRanges.unknown()


# --- relations through rounding functions ---------------------------------------------------
#
# Intervals lose the link between ``round(s0/2)`` and ``s0``: each is bounded alone, so
# ``round(s0/2) <= s0`` is undecided ([1, oo] - [2, oo] is unbounded). Writing each rounding
# function as its argument plus a bounded error term (``round(e) = e + t``, ``t`` in
# ``[-1/2, 1/2]``; ``a // b = a/b - t``, ``t`` in ``[0, (b-1)/b]``) and expanding cancels the
# shared symbols: ``s0/2 + t - s0 = -s0/2 + t <= -1/2``.


def _relation(expr: sympy.Rel, ranges: Mapping[sympy.Symbol, ValueRanges]) -> ValueRanges:
    diff = expr.lhs - expr.rhs
    out = _compare(bound(diff, ranges), type(expr))
    if out.is_singleton():
        return out
    extra: dict[sympy.Symbol, ValueRanges] = {}
    linear = diff.replace(lambda e: type(e) in _ERROR_TERMS, lambda e: _with_error(e, extra))
    if not extra:
        return out
    return _compare(bound(sympy.expand(linear), {**ranges, **extra}), type(expr))


def _with_error(e: sympy.Basic, extra: dict[sympy.Symbol, ValueRanges]) -> sympy.Basic:
    rule = _ERROR_TERMS[type(e)]
    found = rule(*e.args)
    if found is None:
        return e
    value, error = found
    t = sympy.Dummy("t")
    extra[t] = error
    return value + t


def _floordiv_error(a: sympy.Basic, b: sympy.Basic) -> tuple[sympy.Basic, ValueRanges] | None:
    if not (b.is_Integer and bool(b > 0)):
        return None
    return a / b, ValueRanges(-sympy.Rational(int(b) - 1, int(b)), sympy.S.Zero)


def _truediv_exact(a: sympy.Basic, b: sympy.Basic) -> tuple[sympy.Basic, ValueRanges] | None:
    if not b.is_number or b == 0:
        return None
    return a / b, ValueRanges.point(0)


_ERROR_TERMS: dict[type, Callable[..., tuple[sympy.Basic, ValueRanges] | None]] = {
    RoundToInt: lambda a: (a, ValueRanges(-sympy.Rational(1, 2), sympy.Rational(1, 2))),
    FloorDiv: _floordiv_error,
    IntTrueDiv: _truediv_exact,
    ToFloat: lambda a: (a, ValueRanges.point(0)),
}
