"""ShapeEnv: the symbols of one export, what is known about them, and the guards taken.

- Backed symbols ``s0, s1, ...`` stand for input dimensions; each has a hint (its value in the
  example inputs), sources (``x.size()[0]``) and a value range (``[2, int_oo]`` by default).
- Unbacked symbols ``u0, u1, ...`` come from tensor data (``.item()``, ``nonzero``...): no hint.
- Deciding a symbolic condition (``if x.shape[0] > 3``) uses the ranges when they settle it,
  else the hints, and records a :class:`Guard` with the user's source line. Guards refine the
  ranges (``s0 > 3`` -> ``s0 in [4, ...]``) and add replacements (``Eq(s1, s0 + 1)`` -> every
  ``s1`` reads ``s0 + 1``), so graphs stay readable.
- A condition on unbacked symbols that the ranges and known facts cannot settle raises
  :class:`GuardOnDataDependentSymNode` naming the user's line and a ``torch._check`` fix.
- ``torch._check(cond)`` on unbacked symbols becomes a :class:`RuntimeAssert` (checked in the
  exported graph) and a known fact.
"""

from __future__ import annotations

import bisect
import dis
import enum
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from exportir.symbolic.data_dependent import Explanation, explain
from exportir.symbolic.functions import to_python
from exportir.symbolic.sym_node import SymNode
from exportir.symbolic.value_ranges import ValueRanges, bound

oo = sympy.oo


class DimDynamic(enum.Enum):
    """How an input dimension becomes a symbol."""

    DYNAMIC = "dynamic"  # its own symbol
    DUCK = "duck"  # shares the symbol of an earlier DUCK dim with the same hint
    STATIC = "static"  # stays an integer


@dataclass(frozen=True, slots=True)
class UserFrame:
    """The innermost user frame (not torch, not exportir, not sympy) of an event."""

    filename: str
    lineno: int
    name: str
    code: str

    def __str__(self) -> str:
        text = f'File "{self.filename}", line {self.lineno}, in {self.name}'
        return text + (f"\n    {self.code}" if self.code else "")


@dataclass(frozen=True, slots=True)
class Guard:
    """A condition the exported program assumes about its input shapes."""

    expr: sympy.Basic
    frame: UserFrame | None


@dataclass(frozen=True, slots=True)
class RuntimeAssert:
    """A condition on unbacked values, checked when the exported program runs."""

    expr: sympy.Basic
    frame: UserFrame | None


@dataclass(frozen=True, slots=True)
class SymbolOrigin:
    """Where an unbacked symbol was made: the user's expression (``t.item()``,
    ``x.nonzero().shape[0]``; "" when the line does not show it), the op and its frame."""

    expr: str
    op: str
    frame: UserFrame | None
    exact: bool = True  # False: ``expr`` reaches the op but its value is not the symbol's

    def describe(self, sym: sympy.Symbol, *, short: bool = False) -> str:
        what = f"`{self.expr}`" if self.expr else f"made by {self.op}"
        if self.expr and not self.exact:
            what = f"a size or value computed by `{self.expr}` ({self.op})"
        if self.frame is None:
            return f"{sym} is {what}"
        if short:
            return f"{sym} is {what} ({self.frame.filename.rsplit('/', 1)[-1]}:{self.frame.lineno})"
        return f"{sym} is {what}, at\n{_indent(str(self.frame), 4)}"


def _indent(text: str, n: int) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


@dataclass(frozen=True, slots=True)
class Assumption:
    """A data-dependent condition decided by the example inputs (draft_export) and checked by
    a runtime assert: what, the value taken, where, and the torch._check that states it."""

    expr: sympy.Basic
    value: Any
    frame: UserFrame | None
    check: str  # the torch._check(...) stating the decision in the user's names
    fix_at: str | None  # the line to put it before
    origins: str = ""  # where its unbacked symbols come from (SymbolOrigin.describe, joined)
    replaces_line: bool = False  # ``check`` is lines to put in place of the line (naming values)
    holds: str = ""  # the decision taken, in the user's names (``n > 2``)


class GuardOnDataDependentSymNode(RuntimeError):
    """A Python decision needs the value of a data-dependent (unbacked) symbol."""

    def __init__(
        self, message: str, cond: sympy.Basic | None = None, frame: UserFrame | None = None
    ) -> None:
        super().__init__(message)
        self.cond = cond
        self.frame = frame


_LIBRARY_MARKERS = ("/torch/", "/exportir/", "/sympy/", "<frozen", "/contextlib.py", "/functools.py")


def user_frame() -> UserFrame | None:
    """The innermost frame of the caller's own code."""
    import linecache

    frame = _user_code_frame()
    if frame is None:
        return None
    code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return UserFrame(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name, code)


def _user_code_frame() -> Any:
    """The innermost frame of the caller's own code (not torch, exportir, sympy or generated
    code), the frame object itself."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if not any(m in name for m in _LIBRARY_MARKERS) and not name.startswith("<"):
            return frame
        frame = frame.f_back
    return None


# the jump an ``assert`` statement makes past its raise when the condition holds
_JUMPS_IF_TRUE = frozenset({"POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE",
                            "POP_JUMP_IF_TRUE"})


def in_assert_statement() -> bool:
    """Whether the user's code is deciding the condition of an ``assert`` statement right now:
    its current instruction jumps when the value is true and the next one loads
    ``AssertionError`` (``assert cond`` and ``assert cond, message`` alike)."""
    frame = _user_code_frame()
    if frame is None:
        return False
    insts = list(dis.get_instructions(frame.f_code))
    cur = bisect.bisect_left([i.offset for i in insts], frame.f_lasti)
    if sys.version_info >= (3, 13) and cur < len(insts) and insts[cur].opname in (
            "TO_BOOL", "COMPARE_OP"):
        cur += 1
    return (cur + 1 < len(insts) and insts[cur].opname in _JUMPS_IF_TRUE
            and insts[cur + 1].opname == "LOAD_ASSERTION_ERROR")


def _what_symbols_are(symbols: list[sympy.Symbol], names: dict[str, str]) -> str:
    named = [f"{s} is `{names[str(s)]}`" for s in symbols if str(s) in names]
    unnamed = [s for s in symbols if str(s) not in names]
    parts = []
    if named:
        parts.append("here " + ", ".join(named) + ";")
    if unnamed:
        parts.append(f"{', '.join(map(str, unnamed))} has no name in the code here (assign it "
                     "to a variable where it is computed and state the fix on that variable);")
    return (
        " ".join(parts) + " such values come from tensor data (.item(), .tolist(), nonzero, "
        "x[mask], unique, ...) and are unknown while exporting, so Python cannot decide this "
        "condition."
    )


def _naming_lines(
    why: Explanation, symbols: list[sympy.Symbol], origins: dict[sympy.Symbol, SymbolOrigin]
) -> tuple[list[str], str] | None:
    """For symbols the code has no name for, made on the very line of the decision
    (``if x.nonzero().shape[0] > 2:``): the assignments naming them (``u0 =
    x.nonzero().shape[0]``) and the line rewritten to use the names. None when that is not
    possible (a symbol made elsewhere, an expression not found verbatim)."""
    at = why.fix_at
    unnamed = [s for s in symbols if str(s) not in why.names]
    if at is None or not unnamed or not at.code:
        return None
    line = at.code
    assignments = []
    for sym in unnamed:
        origin = origins.get(sym)
        if origin is None or not origin.expr or not origin.exact or origin.frame is None:
            return None
        if (origin.frame.filename, origin.frame.lineno) != (at.filename, at.lineno):
            return None
        if line.count(origin.expr) != 1:
            return None
        assignments.append(f"{sym} = {origin.expr}")
        line = line.replace(origin.expr, str(sym))
    return assignments, line


def _fixes(why: Explanation, naming: tuple[list[str], str] | None = None) -> str:
    if naming is not None:
        assignments, line = naming
        checks = [f"torch._check({why.condition})   # if it always holds"]
        if why.negation is not None:
            checks.append(f"torch._check({why.negation})   # or this, if it never holds")
        body = "\n".join(f"    {text}" for text in [*assignments, *checks, line])
        return (
            f"Fix: tell export what holds, naming the value first. Replace the line\n"
            f"  {why.fix_at}\nwith\n{body}\n"
            "or, if both outcomes are needed at run time, express the branch with "
            "torch.cond(pred, true_fn, false_fn, operands); or export with exportir.draft_export("
            "...) to keep the branch the example inputs take, checked by a runtime assert."
        )
    lines = [f"    torch._check({why.condition})   # if it always holds"]
    if why.negation is not None:
        lines.append(f"    torch._check({why.negation})   # if it never holds")
    at = f" Before this line\n  {why.fix_at}\nadd" if why.fix_at is not None else " Add"
    return (
        f"Fix: tell export what holds.{at} one of:\n" + "\n".join(lines) + "\n"
        "or, if both outcomes are needed at run time, express the branch with "
        "torch.cond(pred, true_fn, false_fn, operands); or export with exportir.draft_export("
        "...) to keep the branch the example inputs take, checked by a runtime assert."
    )


def _is_bool(expr: sympy.Basic) -> bool:
    boolalg = sympy.logic.boolalg  # (a sympy Symbol is a Boolean too: check the heads)
    return isinstance(expr, (sympy.Rel, boolalg.BooleanFunction, boolalg.BooleanAtom))


# listener(target, operand nodes, result node): the capture recorder records symbolic arithmetic
OpListener = Callable[[Any, tuple, SymNode], None]


class ShapeEnv:
    """Symbols, hints, ranges, guards, replacements and runtime asserts of one export."""

    def __init__(self) -> None:
        self.var_to_hint: dict[sympy.Symbol, int] = {}
        self.var_to_range: dict[sympy.Symbol, ValueRanges] = {}
        self.var_to_sources: dict[sympy.Symbol, list[str]] = {}
        self.var_to_name: dict[sympy.Symbol, str] = {}  # the user's Dim name of a symbol
        self.guards: list[Guard] = []
        self.deferred_runtime_asserts: list[RuntimeAssert] = []
        self.replacements: dict[sympy.Symbol, sympy.Expr] = {}
        self.size_like: set[sympy.Symbol] = set()
        self.facts: dict[sympy.Basic, bool] = {}  # conditions known to hold (or not)
        self.op_listener: OpListener | None = None
        self.listener_paused = 0
        self._duck: dict[int, sympy.Symbol] = {}
        self._backed = 0
        self._unbacked = 0
        # Memo tables (see "caches" below). Knowledge only grows: a decided value stays
        # decided, an undecided one is re-examined once ranges, replacements or facts change.
        self._version = 0
        self._replace_memo: dict[sympy.Basic, sympy.Basic] = {}
        self._static_memo: dict[tuple[sympy.Basic, bool], tuple[Any, int]] = {}
        self.build_memo: dict[tuple, sympy.Basic] = {}  # SymNode arithmetic: (op, a, b) -> expr
        self.op_memo: dict[tuple, Any] = {}  # clients' memo of op results on these symbols
        # the value of an expression on the example inputs (None: unknown), used by
        # draft_export (``draft``) and inside assume_constant_result functions
        self.example_value: Callable[[sympy.Basic], Any] | None = None
        self.draft = False
        self.constant_depth = 0
        self.assumptions: list[Assumption] = []  # data-dependent decisions taken that way
        self.constant_symbols: set[sympy.Symbol] = set()  # specialized unbacked symbols
        # the expression and line that made each unbacked symbol (filled by capture)
        self.unbacked_origins: dict[sympy.Symbol, SymbolOrigin] = {}

    # -- caches -----------------------------------------------------------------------------
    # Every change to what is known goes through these setters, so memoized answers are
    # invalidated exactly when they could change.

    def _changed(self) -> None:
        self._version += 1

    def _set_range(self, sym: sympy.Symbol, r: ValueRanges) -> None:
        if self.var_to_range.get(sym) != r:
            self.var_to_range[sym] = r
            self._changed()

    def _set_replacement(self, sym: sympy.Symbol, expr: sympy.Basic) -> None:
        self.replacements[sym] = expr
        self._replace_memo.clear()
        self._changed()

    def _set_fact(self, expr: sympy.Basic, value: bool) -> None:
        if self.facts.get(expr) is not value:
            self.facts[expr] = value
            self._changed()

    # -- symbols ----------------------------------------------------------------------------

    def create_backed_symbol(
        self,
        hint: int,
        source: str,
        *,
        dynamic: DimDynamic = DimDynamic.DYNAMIC,
        vr: ValueRanges | None = None,
    ) -> sympy.Expr:
        """A symbol for an input dimension of size ``hint`` (an Integer for STATIC dims)."""
        if dynamic is DimDynamic.STATIC:
            return sympy.Integer(hint)
        if dynamic is DimDynamic.DUCK and hint in self._duck:
            sym = self._duck[hint]
            self.var_to_sources[sym].append(source)
            return sym
        sym = sympy.Symbol(f"s{self._backed}", integer=True, positive=True)
        self._backed += 1
        self.var_to_hint[sym] = int(hint)
        self.var_to_sources[sym] = [source]
        default = ValueRanges.of(2, oo) if hint >= 2 else ValueRanges.of(0, oo)
        self._set_range(sym, default if vr is None else (vr & ValueRanges.of(0, oo)))
        if dynamic is DimDynamic.DUCK:
            self._duck[hint] = sym
        return sym

    def symint(self, expr: sympy.Expr) -> torch.SymInt | int:
        """``expr`` as a ``torch.SymInt`` (a plain int when it is a number)."""
        expr = self.replace(sympy.sympify(expr))
        if expr.is_number:
            return int(expr)
        return torch.SymInt(SymNode(expr, self, int))

    create_symint = symint

    def create_unbacked_symint(self) -> torch.SymInt:
        sym = sympy.Symbol(f"u{self._unbacked}", integer=True)
        self._unbacked += 1
        self._set_range(sym, ValueRanges.unknown())
        return torch.SymInt(SymNode(sym, self, int, None))

    def create_unbacked_symfloat(self) -> torch.SymFloat:
        sym = sympy.Symbol(f"zuf{self._unbacked}", real=True)
        self._unbacked += 1
        return torch.SymFloat(SymNode(sym, self, float, None))

    def create_unbacked_symbool(self) -> torch.SymBool:
        u = self.create_unbacked_symint()
        self._set_range(u.node.expr, ValueRanges.of(0, 1))
        return torch.SymBool(SymNode(sympy.Eq(u.node.expr, 1), self, bool, None))

    def is_unbacked_symint(self, sym: sympy.Symbol) -> bool:
        return isinstance(sym, sympy.Symbol) and sym.name.startswith("u")

    def unbacked_symbols(self, expr: sympy.Basic) -> list[sympy.Symbol]:
        return sorted((s for s in expr.free_symbols if self.is_unbacked_symint(s)), key=str)

    def constrain_range(self, sym: sympy.Symbol, lower: object = -oo, upper: object = oo) -> None:
        """Narrow ``sym``'s range to ``[lower, upper]`` (intersected with what is known)."""
        old = self.var_to_range.get(sym, ValueRanges.unknown())
        new = old & ValueRanges.of(lower, upper)
        if bool(new.lower > new.upper):
            raise ValueError(f"{sym}: range {old} and [{lower}, {upper}] do not intersect")
        self._set_range(sym, new)
        if new.is_singleton() and new.lower.is_Integer:
            self._set_replacement(sym, new.lower)

    def constrain_size_like(self, expr: sympy.Basic, max: object = oo) -> None:
        """A size-like unbacked symbol: ``>= 0`` (and treated as ``>= 2`` size-obliviously)."""
        if isinstance(expr, sympy.Symbol) and self.is_unbacked_symint(expr):
            self.size_like.add(expr)
            self._changed()
            self.constrain_range(expr, 0, max)

    # -- expressions ------------------------------------------------------------------------

    def replace(self, expr: sympy.Basic) -> sympy.Basic:
        if not self.replacements:
            return expr
        hit = self._replace_memo.get(expr)
        if hit is not None:
            return hit
        out = expr
        for _ in range(8):  # replacements may chain (s2 -> s1 + 1, s1 -> s0)
            new = out.xreplace(self.replacements)
            if new == out:
                break
            out = new
        self._replace_memo[expr] = out
        return out

    def simplify(self, expr: sympy.Basic) -> sympy.Basic:
        expr = self.replace(sympy.sympify(expr))
        static = self.evaluate_static(expr)
        if static is not None:
            return sympy.sympify(static)
        return expr

    def bound(self, expr: sympy.Basic, *, size_oblivious: bool = False) -> ValueRanges:
        ranges = self.var_to_range
        if size_oblivious and self.size_like:
            ranges = {**ranges, **{s: ranges[s] & ValueRanges.of(2, oo) for s in self.size_like}}
        return bound(self.replace(expr), ranges)

    bound_sympy = bound

    def hint_of(self, expr: sympy.Basic, pytype: type = int) -> Any:
        key = ("hint", expr, pytype)  # hints never change: the memo is never invalidated
        memo = self.build_memo
        if key in memo:
            return memo[key]
        value = memo[key] = self._hint_of(expr, pytype)
        return value

    def _hint_of(self, expr: sympy.Basic, pytype: type) -> Any:
        expr = self.replace(expr)
        if expr.free_symbols - self.var_to_hint.keys():
            return None
        value = to_python(expr.xreplace({s: sympy.Integer(h) for s, h in self.var_to_hint.items()}))
        if isinstance(value, sympy.Basic):
            return None
        return pytype(value) if pytype in (int, float, bool) else value

    def size_hint(self, expr: sympy.Basic) -> int | None:
        return self.hint_of(sympy.sympify(expr))

    def evaluate_static(self, expr: sympy.Basic, *, size_oblivious: bool = False) -> Any:
        """The value of ``expr`` if ranges and known facts settle it, else None (no guard)."""
        key = (expr, size_oblivious)
        hit = self._static_memo.get(key)
        if hit is not None and (hit[0] is not None or hit[1] == self._version):
            return hit[0]
        value = self._evaluate_static(expr, size_oblivious)
        self._static_memo[key] = (value, self._version)
        return value

    def _evaluate_static(self, expr: sympy.Basic, size_oblivious: bool) -> Any:
        expr = self.replace(expr)
        if expr.is_number or expr in (sympy.true, sympy.false):
            value = to_python(expr)
            return None if isinstance(value, sympy.Basic) else value
        if expr in self.facts:
            return self.facts[expr]
        r = self.bound(expr, size_oblivious=size_oblivious)
        if r.is_singleton() and (r.is_bool or r.lower.is_number):
            return to_python(r.lower)
        return None

    def _maybe_evaluate_static(self, expr: sympy.Basic, **_: Any) -> sympy.Basic | None:
        value = self.evaluate_static(expr)
        return None if value is None else sympy.sympify(value)

    # -- guards ----------------------------------------------------------------------------

    def evaluate_sym_node(
        self, node: SymNode, *, size_oblivious: bool = False, fallback_value: Any = None
    ) -> Any:
        return self.evaluate_expr(
            node.expr, hint=node.hint, size_oblivious=size_oblivious, fallback_value=fallback_value
        )

    def evaluate_expr(
        self,
        expr: sympy.Basic,
        *,
        hint: Any = None,
        frame: UserFrame | None = None,
        size_oblivious: bool = False,
        fallback_value: Any = None,
    ) -> Any:
        """Decide ``expr``: statically if possible, else by its hint, recording a guard."""
        expr = self.replace(expr)
        static = self.evaluate_static(expr, size_oblivious=size_oblivious)
        if static is not None:
            return static
        if hint is None:
            hint = self.hint_of(expr, bool if _is_bool(expr) else int)
        if fallback_value is not None and hint == fallback_value:
            # guard_or_true / guard_or_false: the caller is correct whichever way an undecided
            # condition goes, and its default is the example's answer: no guard needed. (torch
            # records one, narrowing the range: a `mask[:T]` contiguity check on a 128-row
            # buffer made T=128 unreachable although the program is valid there.)
            return fallback_value
        if hint is None:
            if fallback_value is not None:
                return fallback_value
            if self.constant_depth:
                return self._specialize_by_example(expr, frame)
            if self.draft:
                return self._decide_by_example(expr, frame)
            if _is_bool(expr) and in_assert_statement():
                # ``assert cond`` on tensor data: the program checks it when it runs, as
                # torch.export (non-strict) does, and the capture goes on with it holding
                self.defer_runtime_assert(expr, frame)
                return True
            raise self.data_dependent_error(expr, frame)
        frame = frame or user_frame()
        if _is_bool(expr):
            fact = expr if hint else sympy.Not(expr)
            self._set_fact(expr, bool(hint))
        else:
            fact = sympy.Eq(expr, hint)
        self._learn(fact)
        self.guards.append(Guard(fact, frame))
        return hint

    def _decide_by_example(self, expr: sympy.Basic, frame: UserFrame | None) -> Any:
        """Draft mode (``example_value`` set): decide a data-dependent ``expr`` by its value on
        the example inputs and check that at run time; otherwise the data-dependent error."""
        value = self._example(expr)
        if value is None:
            raise self.data_dependent_error(expr, frame)
        is_bool = _is_bool(expr)
        fact = (expr if value else sympy.Not(expr)) if is_bool else sympy.Eq(expr, value)
        why = explain(fact, set(self.unbacked_symbols(expr)), True)
        where = why.where
        frame = frame or (UserFrame(where.filename, where.lineno, where.name, where.code)
                          if where is not None else None)
        fix_at = str(why.fix_at) if why.fix_at is not None else None
        symbols = self.unbacked_symbols(expr)
        check = f"torch._check({why.condition})"
        naming = _naming_lines(why, symbols, self.unbacked_origins)
        if naming is not None:  # the names first; the line then uses them
            check = "\n".join([*naming[0], check, naming[1]])
        self.assumptions.append(
            Assumption(expr, bool(value) if is_bool else value, frame, check, fix_at,
                       self.describe_origins(symbols, short=True), naming is not None,
                       why.condition)
        )
        self.defer_runtime_assert(fact, frame)
        return bool(value) if is_bool else value

    def _example(self, expr: sympy.Basic) -> Any:
        return None if self.example_value is None else self.example_value(expr)

    def _specialize_by_example(self, expr: sympy.Basic, frame: UserFrame | None) -> Any:
        """Inside an ``assume_constant_result`` function everything is a constant: the
        unbacked symbols of ``expr`` become their example values."""
        for sym in sorted(expr.free_symbols - self.var_to_hint.keys(), key=str):  # u0, zuf0
            value = self._example(sym)
            if value is None:
                raise self.data_dependent_error(expr, frame)
            self.specialize(sym, value)
        value = self.evaluate_static(expr)
        if value is None:
            raise self.data_dependent_error(expr, frame)
        return value

    def specialize(self, sym: sympy.Symbol, value: Any) -> None:
        """Make unbacked ``sym`` the constant ``value`` (``assume_constant_result``): it is
        replaced everywhere and gets no runtime assert."""
        self.constant_symbols.add(sym)
        self._set_range(sym, ValueRanges.point(value))
        self._set_replacement(sym, sympy.sympify(value))

    def expect_true(self, node: SymNode) -> bool:
        """``torch._check(cond)``: a runtime assert when ``cond`` is data-dependent."""
        expr = node.expr
        static = self.evaluate_static(expr)
        if static is not None:
            return bool(static)
        if node.hint is not None or not self.unbacked_symbols(expr):
            return bool(self.evaluate_expr(expr, hint=node.hint))
        self.deferred_runtime_asserts.append(RuntimeAssert(expr, user_frame()))
        self._set_fact(expr, True)
        self._learn(expr)
        return True

    def defer_runtime_assert(self, expr: sympy.Basic, frame: UserFrame | None = None) -> None:
        expr = self.replace(expr)
        if self.evaluate_static(expr) is True:
            return
        self.deferred_runtime_asserts.append(RuntimeAssert(expr, frame or user_frame()))
        self._set_fact(expr, True)
        self._learn(expr)

    def _learn(self, fact: sympy.Basic) -> None:
        """Refine ranges / replacements from a condition known to hold."""
        if isinstance(fact, sympy.And):
            for a in fact.args:
                self._learn(a)
            return
        if isinstance(fact, sympy.Not) and isinstance(fact.args[0], sympy.Rel):
            fact = fact.args[0].negated
        if not isinstance(fact, sympy.Rel):
            return
        self._set_fact(fact, True)
        diff = sympy.expand(fact.lhs - fact.rhs)
        syms = list(diff.free_symbols)
        if len(syms) == 1:
            self._learn_bound(syms[0], diff, type(fact))
        elif isinstance(fact, sympy.Eq):
            self._learn_equality(diff)

    def _learn_bound(self, sym: sympy.Symbol, diff: sympy.Basic, rel: type) -> None:
        poly = sympy.Poly(diff, sym) if diff.is_polynomial(sym) else None
        if poly is None or poly.degree() != 1:
            return
        a, b = (int(c) if c.is_Integer else None for c in poly.all_coeffs())
        if a is None or b is None:
            return
        # a*sym + b REL 0  ->  bounds on sym
        lo, hi = -oo, oo
        flip = a < 0
        ge = {sympy.GreaterThan: 0, sympy.StrictGreaterThan: 1}
        le = {sympy.LessThan: 0, sympy.StrictLessThan: 1}
        if rel in ge or rel in le:
            strict = ge.get(rel, le.get(rel))
            lower_side = (rel in ge) != flip
            limit = sympy.Rational(-b, a)
            if lower_side:
                lo = sympy.floor(limit) + 1 if strict or not limit.is_integer else limit
                lo = limit + strict if limit.is_integer else sympy.ceiling(limit)
            else:
                hi = limit - strict if limit.is_integer else sympy.floor(limit)
        elif rel is sympy.Eq:
            limit = sympy.Rational(-b, a)
            if not limit.is_integer:
                return
            lo = hi = limit
        elif rel is sympy.Ne:
            self._learn_not_equal(sym, sympy.Rational(-b, a))
            return
        try:
            self.constrain_range(sym, lo, hi)
        except ValueError:
            return

    def _learn_not_equal(self, sym: sympy.Symbol, value: sympy.Basic) -> None:
        r = self.var_to_range.get(sym)
        if r is None:
            return
        if r.lower == value:
            self._set_range(sym, ValueRanges(r.lower + 1, r.upper))
        elif r.upper == value:
            self._set_range(sym, ValueRanges(r.lower, r.upper - 1))

    def _learn_equality(self, diff: sympy.Basic) -> None:
        """``s1 - s0 - 1 == 0`` -> replace the newest backed symbol with unit coefficient."""
        candidates = sorted(
            (s for s in diff.free_symbols if s not in self.replacements),
            key=lambda s: (not self.is_unbacked_symint(s), int(str(s)[1:]) if str(s)[1:].isdigit() else 0),
            reverse=True,
        )
        for sym in candidates:
            coeff = diff.coeff(sym)
            if coeff in (1, -1) and sym not in (diff - coeff * sym).free_symbols:
                solution = sympy.expand(-(diff - coeff * sym) / coeff)
                self._set_replacement(sym, solution)
                return

    # -- errors -----------------------------------------------------------------------------

    def data_dependent_error(
        self, expr: sympy.Basic, frame: UserFrame | None = None
    ) -> GuardOnDataDependentSymNode:
        """The error for a Python decision on unbacked symbols, with a ``torch._check`` fix
        written in the names the user's code has for them (data_dependent.py)."""
        hinted = expr.xreplace({s: sympy.Integer(h) for s, h in self.var_to_hint.items()})
        size_like = ", ".join(str(s) for s in sorted(self.size_like, key=str)) or "none"
        unbacked = set(self.unbacked_symbols(expr))
        why = explain(expr, unbacked, _is_bool(expr))
        if frame is None and why.where is not None:
            w = why.where
            frame = UserFrame(w.filename, w.lineno, w.name, w.code)
        where = f"  {why.where}" if why.where else "  <unknown location>"
        symbols = sorted(unbacked, key=str)
        origins = self.describe_origins(symbols)
        origins = f"where {origins}\n" if origins else ""
        return GuardOnDataDependentSymNode(
            f"Could not guard on data-dependent expression {hinted} (unhinted: {expr}).  "
            f"(Size-like symbols: {size_like})\n\n{where}\n\n{origins}"
            f"{_what_symbols_are(symbols, why.names)}\n"
            f"{_fixes(why, _naming_lines(why, symbols, self.unbacked_origins))}",
            expr,
            frame,
        )

    def describe_origins(self, symbols: list[sympy.Symbol], *, short: bool = False) -> str:
        """``u0 is `t.item()`, at File ...`` for each symbol whose origin capture noted
        (``short``: ``u0 is `t.item()` (model.py:14)``)."""
        origins = self.unbacked_origins
        known = [origins[s].describe(s, short=short) for s in symbols if s in origins]
        return ("; " if short else ";\n").join(known)

    # -- layout predicates ------------------------------------------------------------------

    def layout_predicate(self, sizes: list[SymNode], strides: list[SymNode], order: list[int]) -> SymNode:
        sz = tuple(s.expr for s in sizes)
        st = tuple(s.expr for s in strides)
        if len(order) != len(sz):
            return SymNode(sympy.false, self, bool, False)
        key = ("layout", sz, st, tuple(order))  # every new tensor asks; most ask alike
        expr = self.build_memo.get(key)
        if expr is None:
            expr = self.build_memo[key] = self._layout_expr(sz, st, order)
        return SymNode(expr, self, bool)

    def _layout_expr(self, sz: tuple, st: tuple, order: list[int]) -> sympy.Basic:
        ok: sympy.Basic = sympy.true
        expected: sympy.Basic = sympy.S.One
        for d in order:
            ok = sympy.And(ok, sympy.Or(sympy.Eq(sz[d], 1), sympy.Eq(st[d], expected)))
            expected = expected * sz[d]
        return sympy.Or(ok, *(sympy.Eq(s, 0) for s in sz))

    def non_overlapping_and_dense(self, sizes: list[SymNode], strides: list[SymNode]) -> SymNode:
        hints = [s.hint if s.hint is not None else i for i, s in enumerate(strides)]
        order = sorted(range(len(sizes)), key=lambda i: (hints[i], -i))
        return self.layout_predicate(sizes, strides, order)

    # -- graph recording ----------------------------------------------------------------------

    def report_op(self, target: Any, operands: tuple, out: SymNode) -> None:
        if self.op_listener is not None and not self.listener_paused:
            self.op_listener(target, operands, out)
