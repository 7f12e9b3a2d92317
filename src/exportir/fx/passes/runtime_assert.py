"""Materialize a ShapeEnv's deferred runtime asserts as ``aten._assert_scalar`` nodes.

``insert_deferred_runtime_asserts(gm, shape_env, name, export=False)`` has the signature of
``torch.fx.passes.runtime_assert.insert_deferred_runtime_asserts`` and the same observable
result on the graph. The ShapeEnv is duck-typed (this package may not import a symbolic-shapes
engine): the pass reads ``deferred_runtime_asserts`` (``symbol | None -> [assert with .expr]``),
``var_to_range``, ``unbacked_renamings`` and ``_default_unspecified_value_range()``.

Contract:
  * every free symbol is bound to the first graph value that defines it: a SymInt
    placeholder, a ``sym_size``/``sym_stride``/``sym_storage_offset`` node added right after the
    placeholders, or the node whose ``meta["unbacked_bindings"]`` introduces it;
  * an assert is lowered as soon as all its free symbols are bound, reusing already
    materialized subexpressions (one node per sympy expression), and is never emitted twice;
  * symbolic values recomputed from known symbols are CSE'd onto the existing node;
  * range constraints of unbacked symbols become ``>=``/``<=`` asserts after their binding.
"""

from __future__ import annotations

import dis
import operator
import sys
from collections.abc import Callable
from typing import Any

import sympy
import torch

from ..graph import Graph
from ..graph_module import GraphModule
from ..node import Node

__all__ = ["insert_deferred_runtime_asserts"]

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
_SPARSE_LAYOUTS = frozenset(
    {torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc}
)
_ASSERT = torch.ops.aten._assert_scalar.default
_ASSERT_TARGETS = (torch._check, torch._assert_scalar, _ASSERT)
_CONSTRAIN_RANGE = (
    torch.ops.aten.sym_constrain_range.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
)
_PRESERVE_KEY = "_fx_runtime_assert_preserve"
# sympy functions this pass refuses to reify (they have no faithful Python-int lowering)
_UNINTERPRETABLE = frozenset({"ToFloat", "TruncToInt", "CeilToInt"})

Value = Any  # a Node, or a Python constant


def _binary(target: Callable[..., Any]) -> Callable[..., tuple[Any, tuple[Any, ...]]]:
    return lambda a, b: (target, (a, b))


def _unary(target: Callable[..., Any]) -> Callable[..., tuple[Any, tuple[Any, ...]]]:
    return lambda a: (target, (a,))


# handler name -> (target, args) builder; names follow torch's sympy interpreter vocabulary
_HANDLERS: dict[str, Callable[..., tuple[Any, tuple[Any, ...]]]] = {
    "add": _binary(operator.add),
    "mul": _binary(operator.mul),
    "and_": _binary(operator.and_),
    "or_": _binary(operator.or_),
    "eq": _binary(operator.eq),
    "lt": _binary(operator.lt),
    "gt": _binary(operator.gt),
    "le": _binary(operator.le),
    "ge": _binary(operator.ge),
    "not_": _unary(torch.sym_not),
    "floordiv": _binary(operator.floordiv),
    "mod": _binary(operator.mod),
    "python_mod": _binary(operator.mod),
    "truediv": _binary(operator.truediv),
    "int_truediv": _binary(operator.truediv),
    "pow": _binary(operator.pow),
    "pow_by_natural": _binary(operator.pow),
    "minimum": _binary(torch.sym_min),
    "maximum": _binary(torch.sym_max),
    "abs": _unary(operator.abs),
    "sqrt": _unary(torch._sym_sqrt),
    "where": lambda c, a, b: (torch.sym_ite, (c, a, b)),
}
# `const < node` is evaluated by Python as `node > const` (comparisons have no reflected form)
_MIRRORED = {
    operator.lt: operator.gt,
    operator.gt: operator.lt,
    operator.le: operator.ge,
    operator.ge: operator.le,
    operator.eq: operator.eq,
}
_ASSOCIATIVE = frozenset({"minimum", "maximum", "mul", "add", "and_", "or_"})

# sympy class name -> handler name (torch's own sympy functions are matched by name too)
_HANDLER_OF: dict[str, str] = {
    "Or": "or_",
    "And": "and_",
    "Equality": "eq",
    "Unequality": "ne",
    "StrictLessThan": "lt",
    "StrictGreaterThan": "gt",
    "LessThan": "le",
    "GreaterThan": "ge",
    "Not": "not_",
    "IntTrueDiv": "int_truediv",
    "FloatTrueDiv": "truediv",
    "FloorDiv": "floordiv",
    "CleanDiv": "floordiv",
    "Where": "where",
    "Add": "add",
    "Mul": "mul",
    "FloatPow": "pow",
    "PowByNatural": "pow_by_natural",
    "Pow": "pow_by_natural",
    "Mod": "mod",
    "PythonMod": "python_mod",
    "Abs": "abs",
    "Min": "minimum",
    "Max": "maximum",
}


def _example_value(node: Node) -> Any:
    if "example_value" in node.meta:
        return node.meta["example_value"]
    return node.meta.get("val")


def _sym_expr(node: Node) -> sympy.Basic | None:
    val = _example_value(node)
    return val.node.expr if isinstance(val, _SYM_TYPES) else None


def _uninterpretable(expr: sympy.Basic) -> bool:
    return any(type(a).__name__ in _UNINTERPRETABLE for a in sympy.preorder_traversal(expr))


def _free_symbols(expr: sympy.Basic) -> set[sympy.Symbol]:
    return set(expr.free_symbols) if isinstance(expr, sympy.Basic) else set()


def _is_single_symbol_bound(expr: sympy.Basic) -> bool:
    if len(expr.args) != 2 or expr.func not in (sympy.LessThan, sympy.GreaterThan):
        return False
    lhs, rhs = expr.args
    return (isinstance(lhs, sympy.Symbol) and isinstance(rhs, sympy.Number)) or (
        isinstance(rhs, sympy.Symbol) and isinstance(lhs, sympy.Number)
    )


def _default_msg(expr: Any, cond: Any) -> str:
    return f"Runtime assertion failed for expression {expr} on node '{cond}'"


_NO_OP_INSTRUCTIONS = frozenset({"CACHE", "COPY_FREE_VARS", "EXTENDED_ARG", "NOP", "RESUME"})


def _constant_string_of(fn: Callable[..., Any]) -> str | None:
    """The string a zero-argument message callable (``lambda: "text"``) returns, read from its
    bytecode so that user code never runs at compile time; ``None`` for anything else."""
    code = getattr(fn, "__code__", None)
    if code is None or code.co_argcount or code.co_posonlyargcount or code.co_kwonlyargcount:
        return None
    ops = [i for i in dis.get_instructions(fn) if i.opname not in _NO_OP_INSTRUCTIONS]
    shapes = (["RETURN_CONST"], ["LOAD_CONST", "RETURN_VALUE"])
    if [i.opname for i in ops] in shapes and isinstance(ops[0].argval, str):
        return ops[0].argval
    return None


class _Annotator:
    """Fills meta of nodes the pass creates: ``val`` by evaluating the op on the inputs'
    example values, plus the provenance keys of the node the pass is visiting."""

    __slots__ = ("source", "val_key")

    def __init__(self, val_key: str) -> None:
        self.val_key = val_key
        self.source: Node | None = None

    def __call__(self, node: Node) -> Node:
        if node.op != "call_function":
            return node
        args = tuple(_example_value(a) if isinstance(a, Node) else a for a in node.args)
        args = tuple(
            [_example_value(x) if isinstance(x, Node) else x for x in a]
            if isinstance(a, (list, tuple))
            else a
            for a in args
        )
        try:
            node.meta[self.val_key] = node.target(*args)
        except NotImplementedError:
            pass
        if self.source is not None:
            for key in ("stack_trace", "nn_module_stack", "custom"):
                if self.source.meta.get(key) is not None:
                    node.meta[key] = self.source.meta[key]
        return node


class _Lowering:
    """Lowers sympy expressions to graph nodes, one node per distinct expression."""

    __slots__ = ("annotate", "env", "export", "graph")

    def __init__(self, graph: Graph, export: bool, annotate: _Annotator) -> None:
        self.graph = graph
        self.env: dict[sympy.Basic, Node] = {}
        self.export = export
        self.annotate = annotate

    def call(self, target: Any, args: tuple[Any, ...]) -> Node:
        return self.annotate(self.graph.call_function(target, args))

    def lower(self, expr: sympy.Basic) -> Value:
        if expr in self.env:
            return self.env[expr]
        if isinstance(expr, sympy.logic.boolalg.BooleanAtom):
            return bool(expr)
        if isinstance(expr, sympy.Integer):
            return int(expr)
        if isinstance(expr, sympy.Number):
            return float(expr)
        if isinstance(expr, sympy.Symbol):
            raise KeyError(expr)
        args = [self.lower(a) for a in expr.args]
        self.env[expr] = self._apply(expr, args)
        return self.env[expr]

    def _apply(self, expr: sympy.Basic, args: list[Value]) -> Value:
        if isinstance(expr, sympy.Pow) and isinstance(expr.args[1], sympy.core.numbers.Half):
            return self.call(torch._sym_sqrt, (args[0],))
        if expr.func is sympy.Add and expr.is_integer:
            return self._sum(args)
        name = getattr(expr.func, "_torch_handler_name", None) or _HANDLER_OF.get(
            type(expr).__name__
        )
        if name == "ne":
            return self.call(torch.sym_not, (self.call(operator.eq, tuple(args)),))
        if name not in _HANDLERS:
            raise NotImplementedError(
                f"insert_deferred_runtime_asserts: cannot lower sympy {type(expr).__name__} "
                f"in {expr}; add it to _HANDLERS in exportir/fx/passes/runtime_assert.py"
            )
        build = _HANDLERS[name]
        if name in _ASSOCIATIVE:
            acc = args[0]
            for a in args[1:]:
                acc = self._fold(build, acc, a)
            return acc
        return self._fold(build, *args)

    def _fold(self, build: Callable[..., Any], *args: Value) -> Value:
        target, call_args = build(*args)
        if not any(isinstance(a, Node) for a in call_args):
            return target(*call_args)
        if target in _MIRRORED and not isinstance(call_args[0], Node):
            target, call_args = _MIRRORED[target], (call_args[1], call_args[0])
        return self.call(target, call_args)

    def _sum(self, args: list[Value]) -> Value:
        if not self.export:
            return self.call(torch.sym_sum, (list(args),))
        if not args:
            return 0
        acc = args[0]
        for a in args[1:]:
            acc = self._fold(_HANDLERS["add"], acc, a)
        return acc


def _keypath_node(low: _Lowering, producer: Node, keypath: tuple[Any, ...]) -> Node:
    """The node reading an unbacked binding's value out of ``producer`` along ``keypath``
    (duck-typed keys: ``CallMethodKey``, ``SequenceKey``, ``ConvertIntKey``, ``DivideByKey``)."""
    graph, node, i = low.graph, producer, 0
    while i < len(keypath):
        k, kind = keypath[i], type(keypath[i]).__name__
        nxt = keypath[i + 1] if i + 1 < len(keypath) else None
        if kind == "CallMethodKey" and type(nxt).__name__ == "SequenceKey":
            creators = {"size": graph.create_size_node, "stride": graph.create_stride_node}
            make = creators.get(k.name)
            node = make(node, nxt.idx) if make else graph.call_method(k.name, (node, nxt.idx))
            i += 2
        elif kind == "CallMethodKey":
            if k.name == "storage_offset":
                node = graph.create_storage_offset_node(node)
            else:
                node = graph.call_method(k.name, (node,))
            i += 1
        elif kind == "SequenceKey":
            node, i = graph.call_function(operator.getitem, (node, k.idx)), i + 1
        elif kind == "ConvertIntKey":
            node, i = graph.call_function(torch.sym_ite, (node, 1, 0)), i + 1
        elif kind == "DivideByKey":
            div = k.divisor
            if isinstance(div, torch.SymInt):
                div = low.lower(div.node.expr)
            node, i = graph.call_function(operator.floordiv, (node, div)), i + 1
        else:
            raise NotImplementedError(
                f"insert_deferred_runtime_asserts: unbacked binding key {k!r} on node "
                f"{producer.name!r} is not supported"
            )
        low.annotate(node)
    return node


def insert_deferred_runtime_asserts(
    gm: GraphModule,
    shape_env: Any,
    name: str,
    export: bool = False,
) -> None:
    """Insert ``shape_env``'s deferred runtime asserts into ``gm`` (in place) as
    ``aten._assert_scalar`` nodes, CSE symbolic computations, and recompile ``gm``."""
    _AssertInserter(gm, shape_env, export).run()
    gm.recompile()


class _AssertInserter:
    __slots__ = (
        "added",
        "annotate",
        "constrained",
        "first_non_placeholder",
        "gm",
        "graph",
        "low",
        "pending",
        "placeholders",
        "renamings",
        "shape_env",
        "user_exprs",
    )  # fmt: skip

    def __init__(self, gm: GraphModule, shape_env: Any, export: bool) -> None:
        self.gm, self.graph, self.shape_env = gm, gm.graph, shape_env
        deferred = shape_env.deferred_runtime_asserts
        if not isinstance(deferred, dict):
            raise NotImplementedError(
                "insert_deferred_runtime_asserts needs shape_env.deferred_runtime_asserts as a "
                "dict (unbacked symbol or None -> asserts), as torch's ShapeEnv keeps it; got "
                f"{type(deferred).__name__}. Key the asserts by symbol before calling this pass."
            )
        self.pending: dict[Any, list[Any]] = {k: list(v) for k, v in deferred.items()}
        val_key = "val"
        for node in self.graph.nodes:
            if "example_value" in node.meta:
                val_key = "example_value"
                break
            if "val" in node.meta:
                break
        self.annotate = _Annotator(val_key)
        self.low = _Lowering(self.graph, export, self.annotate)
        self.placeholders: set[Node] = set()
        self.first_non_placeholder: Node | None = None
        for node in self.graph.nodes:
            if node.op != "placeholder":
                self.first_non_placeholder = node
                break
            self.placeholders.add(node)
        self.added: set[Any] = set()
        self.constrained: set[Any] = set()
        self.renamings = getattr(shape_env, "unbacked_renamings", {})
        self.user_exprs = self._user_assert_exprs()

    # -- existing asserts ------------------------------------------------------------------

    @staticmethod
    def _condition(node: Node) -> Any:
        if node.args:
            return node.args[0]
        return node.kwargs.get("cond", node.kwargs.get("self"))

    @staticmethod
    def _is_user_assert(node: Node) -> bool:
        if node.target in (torch._check, torch._assert_scalar):
            return True
        return node.target is _ASSERT and node.meta.get(_PRESERVE_KEY) is True

    def _user_assert_exprs(self) -> set[Any]:
        found = set()
        for node in self.graph.nodes:
            if node.target in _ASSERT_TARGETS and self._is_user_assert(node):
                cond = self._condition(node)
                if isinstance(cond, Node) and (expr := _sym_expr(cond)) is not None:
                    found.add(expr)
        return found

    def _user_message(self, node: Node, cond: Any, expr: Any) -> str:
        if len(node.args) > 1:
            msg = node.args[1]
        elif node.target is torch._check:
            msg = node.kwargs.get("message")
        else:
            msg = node.kwargs.get("assert_msg")
        if isinstance(msg, str):
            return msg
        if isinstance(msg, Node) and msg.op == "get_attr":
            attr: Any = self.gm
            for atom in str(msg.target).split("."):
                attr = getattr(attr, atom)
            if callable(attr) and (text := _constant_string_of(attr)) is not None:
                return text
            if isinstance(attr, str):
                return attr
        return _default_msg(expr, cond)

    def _erase_assert(self, node: Node, cond: Any) -> None:
        self.graph.erase_node(node)
        if isinstance(cond, Node) and not cond.users:
            self.graph.erase_node(cond)

    def _visit_assert(self, node: Node) -> None:
        cond = self._condition(node)
        expr = _sym_expr(cond) if isinstance(cond, Node) else None
        if cond is True:
            self._erase_assert(node, cond)
            return
        if self._is_user_assert(node):
            if node.target is not _ASSERT:
                with self.graph.inserting_before(node):
                    new = self.graph.call_function(
                        _ASSERT, (cond, self._user_message(node, cond, expr))
                    )
                new.meta.update(node.meta)
                new.meta[_PRESERVE_KEY] = True
                node.replace_all_uses_with(new)
                self.graph.erase_node(node)
            if expr is not None:
                self.added.add(expr)
            return
        if expr is not None and expr in self.low.env and expr in self.added:
            self._erase_assert(node, cond)
            return
        if expr is not None:
            self.added.add(expr)

    # -- emitting asserts ------------------------------------------------------------------

    def _emit_assert(self, expr: Any) -> None:
        res = self.low.lower(expr)
        self.low.call(_ASSERT, (res, _default_msg(expr, res)))
        self.added.add(expr)

    def _add_asserts(self, ras: list[Any]) -> None:
        for ra in ras:
            expr = ra.expr
            if expr in self.user_exprs:
                self.added.add(expr)
                continue
            if expr in self.added or _uninterpretable(expr):
                continue
            fvs = _free_symbols(expr)
            single = len(fvs) == 1 and next(iter(fvs)) in self.constrained
            if single and _is_single_symbol_bound(expr):
                continue
            missing = fvs - self.low.env.keys()
            if missing:
                self.pending.setdefault(min(missing, key=str), []).append(ra)
                continue
            self._emit_assert(expr)

    def _range_asserts(self, sym: Any) -> None:
        vr = self.shape_env.var_to_range.get(sym)
        if vr is None:
            return
        lower, upper = vr.lower, vr.upper
        if getattr(vr, "is_int", True) and upper == sys.maxsize - 1:
            upper = None
        default = getattr(self.shape_env, "_default_unspecified_value_range", None)
        if default is not None and default().issubset(vr):
            return
        for bound, make in ((lower, operator.ge), (upper, operator.le)):
            value = self._finite(bound, vr)
            if value is None:
                continue
            bound_expr = make(sym, value)
            if bound_expr not in self.user_exprs:
                self._emit_assert(bound_expr)
            self.added.add(bound_expr)

    @staticmethod
    def _finite(bound: Any, vr: Any) -> int | float | None:
        # sympy's oo and torch's int_oo (matched by name: this package cannot import it)
        if bound is None or "Infinity" in type(bound).__name__:
            return None
        try:
            if getattr(vr, "is_int", True):
                return int(bound)
            if getattr(vr, "is_float", False):
                return float(bound)
        except (TypeError, OverflowError):
            return None
        return None

    # -- binding symbols -------------------------------------------------------------------

    def _bind_placeholder(self, node: Node) -> None:
        value = _example_value(node)
        if value is None:
            return

        def match(symint: Any, make: Callable[[], Node]) -> None:
            if not isinstance(symint, torch.SymInt):
                return
            sym_node = symint.node
            expr = getattr(sym_node, "_expr", None)
            if expr is None:
                return
            expr = self.renamings.get(expr, expr)
            if isinstance(expr, sympy.Symbol) and expr not in self.low.env:
                self.low.env[expr] = make()

        match(value, lambda: node)
        if not isinstance(value, torch.Tensor):
            return
        for i, s in enumerate(value.size()):
            match(s, lambda i=i: self.annotate(self.graph.create_size_node(node, i)))
        if value.layout in _SPARSE_LAYOUTS:
            return
        for i, s in enumerate(value.stride()):
            match(s, lambda i=i: self.annotate(self.graph.create_stride_node(node, i)))
        match(
            value.storage_offset(),
            lambda: self.annotate(self.graph.create_storage_offset_node(node)),
        )

    def _unbacked_bindings(self, node: Node) -> dict[Any, Any] | None:
        bindings = node.meta.get("unbacked_bindings")
        if bindings is None:
            return None
        return {self.renamings.get(k, k): v for k, v in bindings.items()}

    def _is_intermediate_sym_call(self, node: Node) -> bool:
        val = _sym_expr(node)
        return (
            val is not None
            and not isinstance(val, sympy.Number)
            and not _uninterpretable(val)
            and any(
                isinstance(a, Node)
                and isinstance(_example_value(a), (torch.Tensor, torch.Size))
                and a.op != "placeholder"
                for a in node.args
            )
        )

    def _cse(self, node: Node) -> None:
        expr = _sym_expr(node)
        if node.op == "placeholder" or expr is None:
            return
        env = self.low.env
        bindings = self._unbacked_bindings(node) or {}
        new_binding = any(k not in env for k in bindings)
        intermediate = self._is_intermediate_sym_call(node)
        untracked = any(s not in env for s in _free_symbols(expr))
        if (expr in env or (intermediate and not untracked)) and not new_binding:
            if intermediate:
                env[expr] = self.low.lower(expr)
            node.replace_all_uses_with(env[expr])
            self.graph.erase_node(node)
        elif expr not in env and not isinstance(
            expr, (sympy.Number, sympy.logic.boolalg.BooleanAtom)
        ):
            env[expr] = node

    def _bind_unbacked(self, node: Node) -> None:
        bindings = self._unbacked_bindings(node)
        if not bindings:
            return
        for sym, keypath in bindings.items():
            if sym not in self.low.env:
                self.low.env[sym] = _keypath_node(self.low, node, tuple(keypath))
        for sym in bindings:
            ras = self.pending.pop(sym, [])
            if sym in self.constrained:
                continue
            self._range_asserts(sym)
            self.constrained.add(sym)
            self._add_asserts(ras)

    def _visit(self, node: Node) -> None:
        self.annotate.source = node
        if node in self.placeholders:
            self._bind_placeholder(node)
        if node is self.first_non_placeholder:
            self._add_asserts(self.pending.pop(None, []))
        if node.target in _ASSERT_TARGETS:
            self._visit_assert(node)
        self._cse(node)
        if node.target in _CONSTRAIN_RANGE:
            self.graph.erase_node(node)
        self._bind_unbacked(node)

    def run(self) -> None:
        nodes = list(self.graph.nodes)
        for i, node in enumerate(nodes[:-1]):
            where = self.first_non_placeholder if node in self.placeholders else nodes[i + 1]
            with self.graph.inserting_before(where):
                self._visit(node)
        for expr, node in list(self.low.env.items()):
            if isinstance(expr, sympy.Symbol) and node.op != "placeholder" and not node.users:
                self.graph.erase_node(node)
