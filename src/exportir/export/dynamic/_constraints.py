"""Constraint solving after tracing: does the user's ``dynamic_shapes`` spec imply every guard?

Tracing with symbolic sizes records guards (``s0 > 5``, ``Eq(s1, s0 + 1)``, ``Eq(s0, 4)``) in
the ShapeEnv. :func:`solve` reads them back:

- equalities between input symbols become substitutions (``s1 -> s0 + 1``; ``s0 -> 4`` is a
  specialization);
- single-symbol inequalities become a range per remaining symbol;
- every named :class:`Dim` must then allow exactly what the guards allow: a range wider than
  the guards', an undeclared equality / linear relation, or a specialization is a violation.
  ``Dim.AUTO`` dims take whatever the guards imply; ``Dim.DYNAMIC`` dims may not specialize.

Violations raise ``UserError`` with torch.export's "Constraints violated (dx)!" text, the user's
``file:line`` of each guard, and *Suggested fixes* that are valid Python
(``dx = Dim('dx', min=3, max=6)``, ``dy = dx + 1``, ``dx = 4``).

The solver is pure: it takes a :class:`SymbolTable` and guard-like objects (``.expr``, ``.frame``)
and returns a :class:`Solution`, so it is tested on hand-made guard sets.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy

from exportir.export.dynamic.dims import Dim, DimSpec, UserError, UserErrorType

__all__ = ["Range", "Solution", "SymbolInfo", "SymbolTable", "solve"]

_INF = math.inf
_DEFAULT_LOW = 2  # backed sizes are traced assuming >= 2 (0 and 1 specialize)


@dataclass(frozen=True, slots=True)
class Range:
    """Closed integer range; ``upper`` is ``math.inf`` when unbounded."""

    lower: int
    upper: int | float

    def __and__(self, other: Range) -> Range:
        return Range(max(self.lower, other.lower), min(self.upper, other.upper))

    def contains(self, other: Range) -> bool:
        return self.lower <= other.lower and other.upper <= self.upper

    def map(self, scale: int, offset: int) -> Range:
        upper = _INF if self.upper == _INF else scale * self.upper + offset
        return Range(scale * self.lower + offset, upper)


@dataclass(frozen=True, slots=True)
class SymbolInfo:
    """One backed symbol of an input dimension and what the user said about it."""

    symbol: sympy.Symbol
    hint: int
    sources: tuple[str, ...]  # L['x'].size()[0], ... (first is the primary)
    spec: DimSpec
    phantom: bool = False  # the root of derived dims, not an input dimension itself

    @property
    def debug_name(self) -> str:
        """The user's Dim name, or the source text for hints (as torch names them)."""
        if self.spec.kind in ("named",) or self.phantom:
            return self.spec.name or self.sources[0]
        return self.sources[0]

    def user_range(self) -> Range:
        spec = self.spec
        if spec.kind in ("named", "derived") or self.phantom:
            low = spec.min if spec.min is not None else 0
        else:
            low = max(spec.min if spec.min is not None else 0, _DEFAULT_LOW)
        return Range(low, _INF if spec.max is None else spec.max)


@dataclass(frozen=True, slots=True)
class SymbolTable:
    """The symbols export created for the marked dims, in creation order."""

    symbols: tuple[SymbolInfo, ...]
    derived: tuple[tuple[sympy.Expr, DimSpec], ...] = ()  # input sizes given as 2*dx, dx + 1

    def info(self, symbol: sympy.Symbol) -> SymbolInfo | None:
        return next((i for i in self.symbols if i.symbol == symbol), None)


@dataclass(frozen=True, slots=True)
class Solution:
    """What the guards imply: substitutions for AUTO dims and the final ranges."""

    replacements: dict[sympy.Symbol, sympy.Expr]
    ranges: dict[sympy.Expr, Range]  # range_constraints, symbols and derived input sizes


@dataclass(slots=True)
class _Violation:
    name: str  # the debug name the header lists
    message: str
    frames: list[Any] = field(default_factory=list)


# ---------------------------------------------------------------------------- guards -> facts


def _linear(expr: sympy.Expr, symbols: Sequence[sympy.Symbol]) -> dict[Any, sympy.Rational] | None:
    """Coefficients of a linear ``expr`` in ``symbols`` (key 1: the constant), else None."""
    try:
        poly = sympy.Poly(sympy.expand(expr), *symbols)
    except sympy.PolynomialError:
        return None
    if poly.total_degree() > 1:
        return None
    coeffs: dict[Any, sympy.Rational] = {}
    for monom, coeff in poly.terms():
        if not coeff.is_Rational:
            return None
        index = next((i for i, p in enumerate(monom) if p), None)
        coeffs[1 if index is None else symbols[index]] = coeff
    return coeffs


def _relation_parts(expr: Any) -> tuple[str, sympy.Expr] | None:
    """``(op, lhs - rhs)`` of a relational guard (normalized so the relation is ``diff op 0``)."""
    if isinstance(expr, sympy.Not) and isinstance(expr.args[0], sympy.Rel):
        expr = expr.args[0].negated
    ops = {sympy.Eq: "==", sympy.Ne: "!=", sympy.Ge: ">=", sympy.Gt: ">", sympy.Le: "<=", sympy.Lt: "<"}
    for cls, op in ops.items():
        if isinstance(expr, cls):
            return op, expr.lhs - expr.rhs
    return None


class _Facts:
    """Substitutions and ranges built from the guards, over the table's symbols."""

    def __init__(self, table: SymbolTable) -> None:
        self.table = table
        self.order = {i.symbol: n for n, i in enumerate(table.symbols)}
        self.subst: dict[sympy.Symbol, sympy.Expr] = {}
        self.ranges: dict[sympy.Symbol, Range] = {
            i.symbol: Range(_DEFAULT_LOW if not i.phantom else 0, _INF) for i in table.symbols
        }
        self.bound_frames: dict[sympy.Symbol, list[Any]] = {}
        self.subst_frames: dict[sympy.Symbol, Any] = {}
        self.others: list[tuple[Any, Any]] = []  # guards on several symbols: (expr, frame)
        self.congruences: list[_Congruence] = []  # (x + a) % b == 0 on one symbol

    def resolve(self, expr: Any) -> Any:
        for _ in range(len(self.subst) + 1):
            new = expr.xreplace(self.subst) if self.subst else expr
            if new == expr:
                return expr
            expr = new
        return expr

    def add_equality(self, diff: sympy.Expr, frame: Any) -> bool:
        """Record ``diff == 0`` as a substitution if it is linear in one or two symbols."""
        diff = sympy.expand(self.resolve(diff))
        syms = sorted((s for s in diff.free_symbols if s in self.order), key=self.order.get)
        if len(syms) != len(diff.free_symbols) or not 1 <= len(syms) <= 2:
            return False
        coeffs = _linear(diff, syms)
        if coeffs is None:
            return False
        # as torch does: replace the symbol with the largest hint whose solution is integral
        hints = {i.symbol: i.hint for i in self.table.symbols}
        for target in sorted(syms, key=lambda x: (hints[x], self.order[x]), reverse=True):
            a = coeffs.get(target, 0)
            if a == 0:
                continue
            solved = sympy.expand(-(diff - a * target) / a)
            rest = [x for x in syms if x != target]
            terms = _linear(solved, rest) if rest else {1: solved}
            if terms is not None and all(c.is_integer for c in terms.values()):
                if rest and terms.get(rest[0], 0) <= 0:
                    continue  # only increasing relations are expressible as derived dims
                self._substitute(target, solved, frame)
                return True
        return False

    def add_replacement(self, symbol: sympy.Symbol, value: sympy.Expr, frame: Any) -> None:
        """A substitution the ShapeEnv already made (its orientation is the graph's)."""
        value = sympy.expand(self.resolve(value))
        if symbol in self.subst or symbol in value.free_symbols:
            return
        if value.free_symbols <= set(self.order) and len(value.free_symbols) <= 1:
            self._substitute(symbol, value, frame)
        else:
            self.add_equality(symbol - value, frame)

    def _substitute(self, target: sympy.Symbol, value: sympy.Expr, frame: Any) -> None:
        self.subst = {k: v.xreplace({target: value}) for k, v in self.subst.items()}
        self.subst[target] = value
        self.subst_frames[target] = frame
        # the substituted symbol's bounds now bound its replacement
        bounds = self.ranges.pop(target)
        self._bound_expr(value, bounds, frame)

    def _bound_expr(self, expr: sympy.Expr, bounds: Range, frame: Any) -> None:
        syms = [s for s in expr.free_symbols if s in self.order]
        if len(syms) != 1:
            return
        (root,) = syms
        coeffs = _linear(expr, [root])
        if coeffs is None or coeffs.get(root, 0) <= 0:
            return
        a, c = coeffs[root], coeffs.get(1, 0)
        low = math.ceil((bounds.lower - c) / a)
        high = _INF if bounds.upper == _INF else math.floor((bounds.upper - c) / a)
        self.narrow(root, Range(low, high), frame)

    def narrow(self, symbol: sympy.Symbol, bounds: Range, frame: Any) -> None:
        old = self.ranges.get(symbol)
        if old is None:
            return
        new = old & bounds
        if new != old and frame is not None:
            self.bound_frames.setdefault(symbol, []).append(frame)
        self.ranges[symbol] = new

    def add_inequality(self, op: str, diff: sympy.Expr, frame: Any) -> None:
        """``diff op 0`` for op in <, <=, >, >=: a bound on one symbol, else kept as is."""
        diff = sympy.expand(self.resolve(diff))
        syms = [s for s in diff.free_symbols if s in self.order]
        coeffs = _linear(diff, syms) if len(syms) == 1 and len(diff.free_symbols) == 1 else None
        if coeffs is None:
            if diff.free_symbols:
                self.others.append((_rebuild(op, diff), frame))
            return
        (s,) = syms
        a, c = coeffs[s], coeffs.get(1, 0)
        if op in ("<", "<="):  # flip to >= / >
            a, c, op = -a, -c, {"<": ">", "<=": ">="}[op]
        # a*s + c op 0  ->  s op' -c/a
        bound = -c / a
        strict = op == ">"
        if a > 0:
            low = math.floor(bound) + 1 if strict and bound == int(bound) else math.ceil(bound)
            self.narrow(s, Range(low, _INF), frame)
        else:
            high = math.ceil(bound) - 1 if strict and bound == int(bound) else math.floor(bound)
            self.narrow(s, Range(-(10**18), high), frame)


@dataclass(frozen=True, slots=True)
class _Congruence:
    """``(symbol + offset) % divisor == 0``: a guard a derived dim ``divisor*_x - offset`` meets."""

    symbol: sympy.Symbol
    offset: int
    divisor: int
    frame: Any


def _congruence(expr: Any, facts: _Facts, frame: Any) -> _Congruence | None:
    """``Eq(Mod(x + a, b), 0)`` with ``x`` a table symbol and integers ``a``, ``b`` (the
    congruences torch's solver turns into derived dims), else None."""
    if not isinstance(expr, sympy.Eq) or expr.rhs != 0:
        return None
    mod = expr.lhs
    if getattr(mod.func, "__name__", "") not in ("PyMod", "Mod") or len(mod.args) != 2:
        return None
    base, divisor = facts.resolve(mod.args[0]), mod.args[1]
    if not isinstance(divisor, sympy.Integer) or int(divisor) < 2:
        return None
    syms = [x for x in base.free_symbols if x in facts.order]
    coeffs = _linear(base, syms) if len(syms) == 1 == len(base.free_symbols) else None
    if coeffs is None or coeffs.get(syms[0]) != 1 or not coeffs.get(1, sympy.S.Zero).is_integer:
        return None
    return _Congruence(syms[0], int(coeffs.get(1, 0)), int(divisor), frame)


def _rebuild(op: str, diff: sympy.Expr) -> Any:
    return {"<": sympy.Lt, "<=": sympy.Le, ">": sympy.Gt, ">=": sympy.Ge}[op](diff, 0)


@dataclass(frozen=True, slots=True)
class _Part:
    expr: Any
    frame: Any


def _split(guards: Iterable[Any]) -> Iterable[_Part]:
    """Each conjunct of each guard (``And(a, b)`` guards two things)."""
    for guard in guards:
        stack = [guard.expr]
        while stack:
            expr = stack.pop()
            if isinstance(expr, sympy.And):
                stack.extend(reversed(expr.args))
            else:
                yield _Part(expr, getattr(guard, "frame", None))


def _frame_mentioning(parts: Sequence[_Part], symbol: sympy.Symbol) -> Any:
    """The frame of the first guard about ``symbol`` that fixed it (an equality, else any)."""
    about = [p for p in parts if symbol in getattr(p.expr, "free_symbols", ())]
    eq = [p for p in about if isinstance(p.expr, sympy.Eq)]
    for p in (*eq, *about):
        if p.frame is not None:
            return p.frame
    return None


def _collect(table: SymbolTable, guards: Iterable[Any], replacements: Mapping, *, follow_env: bool) -> _Facts:
    facts = _Facts(table)
    parts = list(_split(guards))
    for symbol, value in replacements.items():  # the ShapeEnv's orientation: the graph uses it
        if symbol in facts.order:
            frame = _frame_mentioning(parts, symbol)
            if follow_env:
                facts.add_replacement(symbol, value, frame)
            else:
                facts.add_equality(symbol - value, frame)
    pending = []
    for guard in parts:
        parts = _relation_parts(guard.expr)
        if parts is None:
            continue
        op, diff = parts
        frame = getattr(guard, "frame", None)
        congruence = _congruence(guard.expr, facts, frame) if op == "==" else None
        if congruence is not None:
            facts.congruences.append(congruence)
        elif op == "==":
            if not facts.add_equality(diff, frame) and facts.resolve(diff).free_symbols:
                pending.append((guard.expr, frame))
        elif op != "!=":
            pending.append((guard.expr, frame, op, diff))
    for item in pending:  # inequalities after all equalities are known
        if len(item) == 4:
            facts.add_inequality(item[2], item[3], item[1])
        else:
            facts.others.append(item)
    return facts


# ---------------------------------------------------------------------------- checking


def _where(frame: Any) -> str:
    if frame is None:
        return ""
    code = getattr(frame, "code", "") or ""
    code = f": {code.strip()}" if code else ""
    return f"{frame.filename}:{frame.lineno} in {frame.name}{code}"


def _fmt_bound(v: Any) -> str:
    return "IntInfinity()" if v == _INF else str(v)


class _Checker:
    """Compares the facts with the user's spec; collects violations and suggested fixes."""

    def __init__(self, table: SymbolTable, facts: _Facts) -> None:
        self.table = table
        self.facts = facts
        self.violations: list[_Violation] = []
        self.dims: dict[str, str] = {}  # name -> "dx = Dim('dx', ...)"
        self.others: dict[str, str] = {}  # name -> "dy = dx + 1" / "dx = 4"

    def run(self) -> None:
        for info in self.table.symbols:
            value = self.facts.subst.get(info.symbol)
            if value is None:
                self._check_range(info)
            elif value.is_number:
                self._check_specialized(info, int(value))
            else:
                self._check_relation(info, value)
        for congruence in self.facts.congruences:
            self._check_congruence(congruence)

    def _check_congruence(self, c: _Congruence) -> None:
        """A named dim must be derived to meet ``(dx + a) % b == 0``: ``dx = b*_dx - a``."""
        info = self.table.info(c.symbol)
        if info is None or info.spec.kind != "named" or c.symbol in self.facts.subst:
            return
        name, src = info.debug_name, info.sources[0]
        # torch's text: (L['x'].size()[0] % 2) == 0, (((-1) + L['x'].size()[0]) % 2) == 0
        base = src if not c.offset else f"({c.offset if c.offset > 0 else f'({c.offset})'} + {src})"
        user = info.user_range()
        spec_text = _spec_text(name, user)
        self.violations.append(_Violation(
            name,
            f"Not all values of {name} = {src} in the specified range{spec_text} satisfy the "
            f"generated guard ({base} % {c.divisor}) == 0.",
            [c.frame] if c.frame is not None else [],
        ))
        implied = self.facts.ranges.get(c.symbol, user) & Range(max(user.lower, _DEFAULT_LOW), user.upper)
        low = max(1, -(-(implied.lower + c.offset) // c.divisor))
        high = _INF if implied.upper == _INF else (implied.upper + c.offset) // c.divisor
        root = f"_{name}"
        root_dim = Dim._readable(root, low, "int_oo" if high == _INF else high)
        self.dims[root] = f"{root} = " + root_dim.replace(", max=int_oo", "")
        derived = c.divisor * sympy.Symbol(root, integer=True) - c.offset
        self.others[name] = f"{name} = {derived}"

    def _name_of(self, symbol: sympy.Symbol) -> str:
        info = self.table.info(symbol)
        return info.debug_name if info is not None else str(symbol)

    def _check_range(self, info: SymbolInfo) -> None:
        if info.spec.kind not in ("named",) and not info.phantom:
            return
        implied = self.facts.ranges[info.symbol]
        user = info.user_range()
        effective = Range(max(user.lower, _DEFAULT_LOW), user.upper)
        if implied.contains(effective):
            return
        both = implied & effective
        name, src = info.debug_name, info.sources[0]
        spec_text = _spec_text(name, user)
        self.violations.append(_Violation(
            name,
            f"Not all values of {name} = {src} in the specified range{spec_text} satisfy the "
            f"generated guard {both.lower} <= {src} and {src} <= {_fmt_bound(both.upper)}",
            self.facts.bound_frames.get(info.symbol, []),
        ))
        max_ = "int_oo" if both.upper == _INF else both.upper
        self.dims[name] = f"{name} = " + Dim._readable(name, both.lower, max_).replace(
            ", max=int_oo", ""
        )

    def _check_specialized(self, info: SymbolInfo, value: int) -> None:
        kind = info.spec.kind
        if kind == "auto":
            return
        frame = self.facts.subst_frames.get(info.symbol)
        name = info.debug_name
        if kind == "derived" and not info.phantom:
            return  # reported on its root
        self.violations.append(_Violation(
            name,
            f"You marked {name} as dynamic but your code specialized it to be a constant "
            f"({value}). If you're using mark_dynamic, either remove it or use maybe_mark_dynamic. "
            "If you're using Dim.DYNAMIC, replace it with either Dim.STATIC or Dim.AUTO."
            + _example_hint(info, value),
            [frame] if frame is not None else [],
        ))
        if kind == "named" or info.phantom:
            self.others[name] = f"{name} = {value}"

    def _check_relation(self, info: SymbolInfo, value: sympy.Expr) -> None:
        if info.spec.kind not in ("named", "dynamic"):
            return
        frame = self.facts.subst_frames.get(info.symbol)
        frames = [frame] if frame is not None else []
        (root,) = value.free_symbols
        root_info = self.table.info(root)
        name, src = info.debug_name, info.sources[0]
        root_name = self._name_of(root)
        root_src = root_info.sources[0] if root_info is not None else str(root)
        if value == root:
            self.violations.append(_Violation(
                name,
                f"The values of {name} = {src} and {root_name} = {root_src} must always be equal.",
                frames,
            ))
        else:
            rel = value.xreplace({root: sympy.Symbol(root_name, integer=True)})
            self.violations.append(_Violation(
                name,
                f"The values of {name} = {src} must always be related to the values of "
                f"{root_name} = {root_src} by {name} = {rel}.",
                frames,
            ))
            value = rel
        if info.spec.kind == "named" and _root_is_named(root_info):
            self.others[name] = f"{name} = {value.xreplace({root: sympy.Symbol(root_name)})}"

    def message(self) -> str:
        names = sorted({v.name for v in self.violations})
        header = (
            f"Constraints violated ({', '.join(names)})! "
            'For more information, run with TORCH_LOGS="+dynamic".'
        )
        lines = [header]
        for v in self.violations:
            lines.append(f"  - {v.message}")
            for frame in v.frames:
                lines.append(f"    (guard added at {_where(frame)})")
        fixes = [self.dims[k] for k in sorted(self.dims)] + [self.others[k] for k in sorted(self.others)]
        if fixes:
            lines.append("Suggested fixes:")
            lines.extend(f"  {fix}" for fix in fixes)
        return "\n".join(lines)


def _example_hint(info: SymbolInfo, value: int) -> str:
    """Why a dim specialized to its own example size 0 or 1, and the fix that keeps it dynamic."""
    if value not in (0, 1) or info.hint != value:
        return ""
    return (
        f" The example input has size {value} at {info.sources[0]}, and export treats sizes 0 "
        "and 1 as constants (a size-1 dim broadcasts); to keep the dim dynamic, pass an example "
        "of size 2 or more there."
    )


def _spec_text(name: str, user: Range) -> str:
    """`` 3 <= dx <= 64`` / `` dx <= 64`` / ``""``: the user's bounds as torch quotes them."""
    low = None if user.lower <= _DEFAULT_LOW else user.lower
    high = None if user.upper == _INF else user.upper
    return {
        (False, False): "",
        (True, False): f" {low} <= {name}",
        (False, True): f" {name} <= {high}",
        (True, True): f" {low} <= {name} <= {high}",
    }[(low is not None, high is not None)]


def _root_is_named(info: SymbolInfo | None) -> bool:
    return info is not None and (info.spec.kind == "named" or info.phantom)


# ---------------------------------------------------------------------------- entry point


def solve(
    table: SymbolTable, guards: Iterable[Any], replacements: Mapping[Any, Any] | None = None
) -> Solution:
    """Check the guards against the spec; the solution (or ``UserError`` with suggested fixes).

    ``guards`` are objects with ``.expr`` (a sympy relational) and ``.frame`` (the user's frame,
    with ``filename``, ``lineno``, ``name``, ``code``; may be None). ``replacements`` are
    substitutions the ShapeEnv already made (``s1 -> s0``), treated as equality guards.
    """
    guards = list(guards)
    facts = _collect(table, guards, replacements or {}, follow_env=True)
    checker = _Checker(table, facts)
    checker.run()
    if checker.violations:
        # explain with torch's orientation of relations (the symbol with the larger hint is
        # expressed through the other: dx = dy + 1), whatever the ShapeEnv chose
        checker = _Checker(table, _collect(table, guards, replacements or {}, follow_env=False))
        checker.run()
        error = UserError(UserErrorType.CONSTRAINT_VIOLATION, checker.message())
        # the parts of the message, for draft_export's report: each violation and the fixes
        # (``dims``: name -> "dx = Dim('dx', ...)", others: "dy = dx + 1" / "dx = 4")
        error.violations = tuple(checker.violations)
        error.fixes = {**checker.dims, **checker.others}
        raise error
    return Solution(dict(facts.subst), _final_ranges(table, facts))


def _final_ranges(table: SymbolTable, facts: _Facts) -> dict[sympy.Expr, Range]:
    ranges: dict[sympy.Expr, Range] = {}
    for info in table.symbols:
        if info.symbol in facts.subst:
            continue
        implied = facts.ranges[info.symbol]
        user = info.user_range()
        if info.phantom:
            ranges[info.symbol] = Range(max(user.lower, _DEFAULT_LOW), user.upper)
        elif info.spec.kind == "named":
            ranges[info.symbol] = user  # the spec implies the guards: it is the range
        else:
            ranges[info.symbol] = user & implied
    substituted = [(info.symbol, info.spec) for info in table.symbols if info.symbol in facts.subst]
    for expr, spec in [*table.derived, *substituted]:
        expr = facts.resolve(expr)
        if expr.is_number or expr in ranges:
            continue
        (root,) = expr.free_symbols
        root_info = table.info(root)
        base = ranges.get(root, Range(0, _INF))
        if root_info is not None and (root_info.spec.kind == "named" or root_info.phantom):
            base = root_info.user_range()
        coeffs = _linear(expr, [root]) or {root: 1}
        ranges[expr] = base.map(int(coeffs.get(root, 1)), int(coeffs.get(1, 0)))
    return ranges


def ordered_ranges(
    ranges: Mapping[sympy.Expr, Range], input_sizes: Iterable[Any]
) -> dict[sympy.Expr, Range]:
    """``ranges`` in order of first appearance among the input sizes (torch's order), then the
    rest (phantom roots)."""
    ordered: dict[sympy.Expr, Range] = {}
    for size in input_sizes:
        expr = getattr(getattr(size, "node", None), "expr", size)
        if isinstance(expr, sympy.Expr) and expr in ranges and expr not in ordered:
            ordered[expr] = ranges[expr]
    for expr, r in ranges.items():
        ordered.setdefault(expr, r)
    return ordered
