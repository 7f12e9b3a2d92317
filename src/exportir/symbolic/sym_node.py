"""SymNode: the Python object behind ``torch.SymInt`` / ``SymBool`` / ``SymFloat``.

torch calls into it from C++ (meta kernels computing sizes) and from Python (the magic
methods of ``torch.SymInt``: ``a * 2`` calls ``a.node.mul(b.node)``). Each node holds a sympy
expression over the symbols of its :class:`~exportir.symbolic.shape_env.ShapeEnv`, the Python
type it stands for, and (when every symbol has one) a hint: the concrete value at the example
inputs. Turning a node into a Python value (``guard_bool``, ``guard_int``) asks the ShapeEnv,
which decides with the hint and records a guard.

Every operation is reported to the ShapeEnv's op listener (the capture recorder), so symbolic
arithmetic done by user code can become graph nodes (``mul = sym_size_int * 2``).
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import sympy

from exportir.symbolic.functions import FloorDiv, IntTrueDiv, PyMod, RoundToInt, ToFloat, TruncToInt

if TYPE_CHECKING:
    from exportir.symbolic.shape_env import ShapeEnv

_NO_HINT = object()


def _sym_and(a: sympy.Basic, b: sympy.Basic) -> sympy.Basic:
    return sympy.And(a, b)


def _sym_or(a: sympy.Basic, b: sympy.Basic) -> sympy.Basic:
    return sympy.Or(a, b)


def _int_pow(a: sympy.Basic, b: sympy.Basic) -> sympy.Basic:
    return sympy.Pow(a, b)


# method -> (sympy builder, result type (None: same as the operands), Python operator)
_BINARY: dict[str, tuple[Callable[..., sympy.Basic], type | None, Callable[..., Any]]] = {
    "add": (operator.add, None, operator.add),
    "sub": (operator.sub, None, operator.sub),
    "mul": (operator.mul, None, operator.mul),
    "mod": (PyMod, None, operator.mod),
    "int_floordiv": (FloorDiv, None, operator.floordiv),
    "int_truediv": (IntTrueDiv, float, operator.truediv),
    "float_truediv": (operator.truediv, float, operator.truediv),
    "pow_by_natural": (_int_pow, None, operator.pow),
    "float_pow": (_int_pow, float, operator.pow),
    "eq": (sympy.Eq, bool, operator.eq),
    "ne": (sympy.Ne, bool, operator.ne),
    "lt": (sympy.Lt, bool, operator.lt),
    "le": (sympy.Le, bool, operator.le),
    "gt": (sympy.Gt, bool, operator.gt),
    "ge": (sympy.Ge, bool, operator.ge),
    "sym_min": (sympy.Min, None, min),
    "sym_max": (sympy.Max, None, max),
    "sym_and": (_sym_and, bool, operator.and_),
    "sym_or": (_sym_or, bool, operator.or_),
}
_BINARY_ALIASES = {
    "floordiv": "int_floordiv", "truediv": "int_truediv", "pow": "pow_by_natural",
    "and_": "sym_and", "or_": "sym_or",
}

# method -> (sympy builder, result type (None: same as the operand), Python function)
_UNARY: dict[str, tuple[Callable[..., sympy.Basic], type | None, Callable[..., Any]]] = {
    "neg": (operator.neg, None, operator.neg),
    "pos": (lambda a: a, None, operator.pos),
    "abs": (sympy.Abs, None, builtins.abs),
    "sym_not": (sympy.Not, bool, operator.not_),
    "sym_float": (ToFloat, float, float),
    "sym_int": (TruncToInt, int, int),
    "trunc": (TruncToInt, int, int),
    "floor": (sympy.floor, int, lambda v: int(v // 1)),
    "ceil": (sympy.ceiling, int, lambda v: -int(-v // 1)),
}


class SymNode:
    """A symbolic value: ``expr`` over the ShapeEnv's symbols, of Python type ``pytype``."""

    __slots__ = ("__weakref__", "_expr", "_hint", "constant", "pytype", "shape_env")

    def __init__(self, expr: sympy.Basic, shape_env: ShapeEnv, pytype: type, hint: Any = _NO_HINT) -> None:
        self._expr = expr
        self.shape_env = shape_env
        self.pytype = pytype
        self.constant = None  # torch's constant nodes set this; ours never do
        self._hint = shape_env.hint_of(expr, pytype) if hint is _NO_HINT else hint

    # -- what torch reads -------------------------------------------------------------------

    @property
    def expr(self) -> sympy.Basic:
        env = self.shape_env
        return env.replace(self._expr) if env.replacements else self._expr

    @property
    def hint(self) -> Any:
        return self._hint

    def has_hint(self) -> bool:
        return self._hint is not None

    def require_hint(self) -> Any:
        if self._hint is None:
            raise self.shape_env.data_dependent_error(self.expr)
        return self._hint

    def is_int(self) -> bool:
        return self.pytype is int

    def is_float(self) -> bool:
        return self.pytype is float

    def is_bool(self) -> bool:
        return self.pytype is bool

    def is_nested_int(self) -> bool:
        return False

    def nested_int(self) -> None:
        return None

    def nested_int_coeff(self) -> None:
        return None

    def is_symbolic(self) -> bool:
        return True

    def is_constant(self) -> bool:
        return False

    def maybe_as_int(self) -> int | None:
        e = self.expr
        return int(e) if isinstance(e, sympy.Integer) else None

    def maybe_as_float(self) -> float | None:
        e = self.expr
        return float(e) if isinstance(e, (sympy.Float, sympy.Integer)) else None

    def maybe_as_bool(self) -> bool | None:
        e = self.expr
        return bool(e) if e in (sympy.true, sympy.false) else None

    def wrap_int(self, num: int) -> SymNode:
        return SymNode(sympy.Integer(num), self.shape_env, int, num)

    def wrap_float(self, num: float) -> SymNode:
        return SymNode(sympy.Float(num), self.shape_env, float, num)

    def wrap_bool(self, num: bool) -> SymNode:
        return SymNode(sympy.true if num else sympy.false, self.shape_env, bool, num)

    def clone(self) -> SymNode:
        return self

    def with_shape_env(self, shape_env: ShapeEnv) -> SymNode:
        return SymNode(self._expr, shape_env, self.pytype, self._hint)

    def str(self) -> builtins.str:
        return builtins.str(self.expr)

    def _graph_repr(self) -> builtins.str:
        return builtins.str(self.expr)

    def __str__(self) -> builtins.str:
        return builtins.str(self.expr)

    def __repr__(self) -> builtins.str:
        return builtins.str(self.expr)

    # -- arithmetic -----------------------------------------------------------------------

    def _binary(self, method: str, other: SymNode) -> SymNode:
        build, rtype, py_op = _BINARY[method]
        pytype = rtype or _promote(self.pytype, other.pytype)
        env = self.shape_env
        a, b = self.expr, other.expr
        memo = env.build_memo  # meta kernels repeat the same arithmetic per layer
        key = (method, a, b)
        expr = memo.get(key)
        if expr is None:
            expr = memo[key] = build(a, b)
        hint = None
        if self._hint is not None and other._hint is not None:
            hint = py_op(self._hint, other._hint)
        out = SymNode(expr, env, pytype, hint)
        if env.op_listener is not None and not env.listener_paused:
            env.report_op(py_op_for_graph(method), (self, other), out)
        return out

    def _unary(self, method: str) -> SymNode:
        build, rtype, py_fn = _UNARY[method]
        out = SymNode(build(self.expr), self.shape_env, rtype or self.pytype,
                      None if self._hint is None else py_fn(self._hint))
        self.shape_env.report_op(py_op_for_graph(method), (self,), out)
        return out

    def sym_ite(self, then_node: SymNode, else_node: SymNode) -> SymNode:
        expr = sympy.Piecewise((then_node.expr, self.expr), (else_node.expr, True))
        hint = None
        if self._hint is not None:
            hint = then_node._hint if self._hint else else_node._hint
        return SymNode(expr, self.shape_env, then_node.pytype, hint)

    def round(self, ndigits: int | None = None) -> SymNode:
        if ndigits is not None:
            raise NotImplementedError("round(SymFloat, ndigits) is not supported during export")
        hint = None if self._hint is None else round(self._hint)
        out = SymNode(RoundToInt(self.expr), self.shape_env, int, hint)
        self.shape_env.report_op(round, (self,), out)
        return out

    def is_integer(self) -> SymNode:
        hint = None if self._hint is None else float(self._hint).is_integer()
        return SymNode(sympy.Eq(sympy.floor(self.expr), self.expr), self.shape_env, bool, hint)

    def sym_sum(self, args: list[SymNode]) -> SymNode:
        """The sum of ``args`` (``self`` only supplies the ShapeEnv, as in torch)."""
        out = self.wrap_int(0)
        for a in args:
            out = out.add(a)
        return out

    # -- layout predicates torch's TensorImpl asks of symbolic sizes -------------------------

    def is_contiguous(self, sizes: list[SymNode], strides: list[SymNode]) -> SymNode:
        return self._layout(sizes, strides, list(range(len(sizes) - 1, -1, -1)))

    def is_channels_last_contiguous_2d(self, sizes: list, strides: list) -> SymNode:
        return self._layout(sizes, strides, [1, 3, 2, 0])

    def is_channels_last_contiguous_3d(self, sizes: list, strides: list) -> SymNode:
        return self._layout(sizes, strides, [1, 4, 3, 2, 0])

    def is_channels_last_strides_2d(self, sizes: list, strides: list) -> SymNode:
        return self._layout(sizes, strides, [1, 3, 2, 0])

    def is_channels_last_strides_3d(self, sizes: list, strides: list) -> SymNode:
        return self._layout(sizes, strides, [1, 4, 3, 2, 0])

    def is_non_overlapping_and_dense(self, sizes: list, strides: list) -> SymNode:
        return self.shape_env.non_overlapping_and_dense(sizes, strides)

    def is_non_overlapping_and_dense_indicator(self, sizes: list, strides: list) -> SymNode:
        dense = self.shape_env.non_overlapping_and_dense(sizes, strides)
        return self.wrap_int(int(bool(dense.expr)))

    def _layout(self, sizes: list, strides: list, order: list[int]) -> SymNode:
        return self.shape_env.layout_predicate(sizes, strides, order)

    # -- becoming a Python value (guards) ---------------------------------------------------

    def evaluate(self, size_oblivious: bool = False) -> Any:
        return self.shape_env.evaluate_sym_node(self, size_oblivious=size_oblivious)

    def guard_int(self, file: builtins.str, line: int) -> int:
        return int(self.shape_env.evaluate_sym_node(self))

    def guard_float(self, file: builtins.str, line: int) -> float:
        return float(self.shape_env.evaluate_sym_node(self))

    def guard_bool(self, file: builtins.str, line: int) -> bool:
        return bool(self.shape_env.evaluate_sym_node(self))

    def guard_size_oblivious(self, file: builtins.str, line: int) -> bool:
        return bool(self.shape_env.evaluate_sym_node(self, size_oblivious=True))

    def guard_or_false(self, file: builtins.str, line: int) -> bool:
        return bool(self.shape_env.evaluate_sym_node(self, fallback_value=False))

    def guard_or_true(self, file: builtins.str, line: int) -> bool:
        return bool(self.shape_env.evaluate_sym_node(self, fallback_value=True))

    def statically_known_true(self, file: builtins.str, line: int) -> bool:
        return self.shape_env.evaluate_static(self.expr) is True

    def expect_true(self, file: builtins.str, line: int) -> bool:
        return self.shape_env.expect_true(self)

    def expect_size(self, file: builtins.str, line: int) -> bool:
        ok = self.ge(self.wrap_int(0)).expect_true(file, line)
        self.shape_env.constrain_size_like(self.expr)
        return ok

    def bool_(self) -> bool:
        return self.guard_bool("", 0)

    def int_(self) -> int:
        return self.guard_int("", 0)


def _promote(a: type, b: type) -> type:
    if a is float or b is float:
        return float
    return int


def _make_binary(method: str) -> Callable[[SymNode, SymNode], SymNode]:
    def op(self: SymNode, other: SymNode) -> SymNode:
        return self._binary(method, other)

    op.__name__ = method
    return op


def _make_unary(method: str) -> Callable[[SymNode], SymNode]:
    def op(self: SymNode) -> SymNode:
        return self._unary(method)

    op.__name__ = method
    return op


for _name in _BINARY:
    setattr(SymNode, _name, _make_binary(_name))
for _alias, _name in _BINARY_ALIASES.items():
    setattr(SymNode, _alias, _make_binary(_name))
for _name in _UNARY:
    setattr(SymNode, _name, _make_unary(_name))


# how an operation is written in a graph (torch records the Python operator / torch function)
def _graph_targets() -> dict[str, Any]:
    import math

    import torch

    return {
        "add": operator.add, "sub": operator.sub, "mul": operator.mul, "mod": operator.mod,
        "int_floordiv": operator.floordiv, "int_truediv": operator.truediv,
        "float_truediv": operator.truediv, "pow_by_natural": operator.pow,
        "float_pow": operator.pow, "eq": operator.eq, "ne": operator.ne, "lt": operator.lt,
        "le": operator.le, "gt": operator.gt, "ge": operator.ge, "sym_min": torch.sym_min,
        "sym_max": torch.sym_max, "sym_and": operator.and_, "sym_or": operator.or_,
        "neg": operator.neg, "pos": operator.pos, "abs": operator.abs,
        "sym_not": torch.sym_not, "sym_float": torch.sym_float, "sym_int": torch.sym_int,
        "trunc": math.trunc, "floor": math.floor, "ceil": math.ceil,
    }


_TARGETS: dict[str, Any] = {}


def py_op_for_graph(method: str) -> Any:
    if not _TARGETS:
        _TARGETS.update(_graph_targets())
    return _TARGETS[method]
