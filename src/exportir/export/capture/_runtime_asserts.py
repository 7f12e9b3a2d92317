"""Runtime asserts on data-dependent (unbacked) values, and the program's range constraints.

After capture, every unbacked symbol ``u`` is *bound* by the first node producing it (an
``.item()`` node, or a ``sym_size.int`` of a tensor with an unbacked size). Right after that
node this pass emits, as torch.export does:

- the range facts of ``u`` (``u >= lower``, ``u <= upper``) when finite, and
- every ``torch._check`` condition recorded on it (``ShapeEnv.deferred_runtime_asserts``) once all
  its unbacked symbols are bound,

each as ``cond = <operator>(...)`` followed by
``aten._assert_scalar.default(cond, "Runtime assertion failed for expression <expr> on node
'<cond>'")``. Duplicates (a check implied by an emitted range fact) are emitted once.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import sympy
import torch

from exportir.fx import Graph, GraphModule, Node
from exportir.symbolic import FloorDiv, PyMod, ShapeEnv, ValueRanges

aten = torch.ops.aten
_META_KEYS = ("stack_trace", "nn_module_stack", "source_fn_stack")

_RELATIONS: dict[type, Callable[..., Any]] = {
    sympy.GreaterThan: operator.ge,
    sympy.StrictGreaterThan: operator.gt,
    sympy.LessThan: operator.le,
    sympy.StrictLessThan: operator.lt,
    sympy.Eq: operator.eq,
    sympy.Ne: operator.ne,
}
_BINARY: dict[type, Callable[..., Any]] = {
    FloorDiv: operator.floordiv,
    PyMod: operator.mod,
    sympy.Max: torch.sym_max,
    sympy.Min: torch.sym_min,
}
_LOGIC: dict[type, Callable[..., Any]] = {sympy.And: operator.and_, sympy.Or: operator.or_}
_UNARY: dict[type, Callable[..., Any]] = {sympy.Not: torch.sym_not}


class _Emitter:
    """Builds graph nodes computing sympy expressions, after a given anchor node."""

    def __init__(self, graph: Graph, env: ShapeEnv) -> None:
        self.graph = graph
        self.env = env
        self.symbols: dict[sympy.Symbol, Node | tuple[Node, int]] = {}
        self.anchor: Node | None = None
        self.made = 0  # nodes inserted

    def node_for_symbol(self, sym: sympy.Symbol) -> Node:
        where = self.symbols[sym]
        if isinstance(where, Node):
            return where
        tensor, dim = where
        node = self.call(aten.sym_size.int, (tensor, dim), "sym_size_int")
        self.symbols[sym] = node
        return node

    def call(self, target: Any, args: tuple, name: str) -> Node:
        with self.graph.inserting_after(self.anchor):
            node = self.graph.create_node("call_function", target, args, {}, name=name)
        for key in _META_KEYS:
            if self.anchor is not None and key in self.anchor.meta:
                node.meta[key] = self.anchor.meta[key]
        vals = [a.meta["val"] if isinstance(a, Node) else a for a in args]
        node.meta["val"] = None if target is aten._assert_scalar.default else target(*vals)
        self.anchor = node
        self.made += 1
        return node

    def value(self, expr: sympy.Basic) -> Any:
        if isinstance(expr, sympy.Integer):
            return int(expr)
        if isinstance(expr, sympy.Symbol):
            return self.node_for_symbol(expr)
        if isinstance(expr, sympy.Add):
            return self._fold(operator.add, expr.args)
        if isinstance(expr, sympy.Mul):
            return self._fold(operator.mul, expr.args)
        if isinstance(expr, (sympy.And, sympy.Or)):  # one assert of the whole, as torch's
            return self._fold(_LOGIC[type(expr)], expr.args)
        rel = (_RELATIONS.get(type(expr)) or _BINARY.get(type(expr))
               or _UNARY.get(type(expr)))
        if rel is None:
            raise NotImplementedError(f"cannot emit a runtime check of {expr}")
        args = tuple(self.value(a) for a in expr.args)
        return self.call(rel, args, rel.__name__)

    def _fold(self, op: Callable[..., Any], args: tuple) -> Any:
        ordered = sorted(args, key=lambda a: a.is_number)  # symbols first: u0 * 2, u0 + 1
        out = self.value(ordered[0])
        for a in ordered[1:]:
            out = self.call(op, (out, self.value(a)), op.__name__)
        return out

    def assert_true(self, expr: sympy.Basic) -> None:
        cond = self.value(expr)
        if not isinstance(cond, Node):
            return
        msg = f"Runtime assertion failed for expression {expr} on node '{cond.name}'"
        self.call(aten._assert_scalar.default, (cond, msg), "_assert_scalar_default")


def _range_facts(sym: sympy.Symbol, vr: ValueRanges) -> list[sympy.Basic]:
    facts = []
    if vr.lower.is_finite:
        facts.append(sympy.Ge(sym, vr.lower))
    if vr.upper.is_finite:
        facts.append(sympy.Le(sym, vr.upper))
    return facts


def _raw_expr(x: Any) -> sympy.Basic:
    """The symbol a value was made with, before later replacements (a draft_export decision
    ``u0 == 3`` replaces ``u0`` by 3; the node producing it still binds ``u0`` for the assert)."""
    return getattr(x.node, "_expr", x.node.expr)


def _new_unbacked(node: Node, env: ShapeEnv, known: dict) -> list[tuple[sympy.Symbol, Any]]:
    val = node.meta.get("val")
    found: list[tuple[sympy.Symbol, Any]] = []

    def fresh(expr: sympy.Basic) -> bool:
        return (
            isinstance(expr, sympy.Symbol)
            and env.is_unbacked_symint(expr)
            and expr not in known
            and expr not in env.constant_symbols
        )

    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        expr = _raw_expr(val)
        if fresh(expr):
            found.append((expr, node))
    elif isinstance(val, torch.Tensor):
        for dim, size in enumerate(val.shape):
            if isinstance(size, torch.SymInt) and fresh(_raw_expr(size)):
                found.append((_raw_expr(size), (node, dim)))
    return found


def insert_runtime_asserts(graph: Graph, env: ShapeEnv) -> bool:
    """Add the range facts and ``torch._check`` conditions of unbacked symbols to ``graph``
    (the recorded graph, before dead-code elimination: asserts keep their inputs alive).
    Returns whether it added nodes."""
    emitter = _Emitter(graph, env)
    pending = list(dict.fromkeys(ra.expr for ra in env.deferred_runtime_asserts))
    done: set[sympy.Basic] = set()
    for node in list(graph.nodes):
        if node.op in ("placeholder", "output"):
            _bind_backed(node, env, emitter.symbols)
            continue
        new = _new_unbacked(node, env, emitter.symbols)
        if not new:
            continue
        emitter.anchor = node
        for sym, where in new:
            emitter.symbols[sym] = where
        for sym, _ in new:
            for fact in _range_facts(sym, env.var_to_range.get(sym, ValueRanges.unknown())):
                if fact not in done:
                    done.add(fact)
                    emitter.assert_true(fact)
        for expr in list(pending):
            if all(s in emitter.symbols for s in expr.free_symbols):
                pending.remove(expr)
                if expr not in done:
                    done.add(expr)
                    emitter.assert_true(expr)
    if emitter.made:
        graph.lint()
    return emitter.made > 0


def _bind_backed(node: Node, env: ShapeEnv, symbols: dict) -> None:
    val = node.meta.get("val")
    if node.op != "placeholder":
        return
    if isinstance(val, torch.Tensor):
        for dim, size in enumerate(val.shape):
            if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                symbols.setdefault(size.node.expr, (node, dim))
    elif isinstance(val, torch.SymInt) and isinstance(val.node.expr, sympy.Symbol):
        symbols.setdefault(val.node.expr, node)


def range_constraints(gm: GraphModule, env: ShapeEnv) -> dict[sympy.Basic, ValueRanges]:
    """Ranges of the symbolic input dimensions (and derived sizes) and of unbacked symbols."""
    out: dict[sympy.Basic, ValueRanges] = {}
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        sizes = list(val.shape) if isinstance(val, torch.Tensor) else [val]
        for size in sizes:
            if not isinstance(size, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                continue
            expr = size.node.expr
            if node.op == "placeholder" and not expr.is_number:
                out.setdefault(expr, env.bound(expr))
            for sym in env.unbacked_symbols(expr):
                if sym not in env.constant_symbols:
                    out.setdefault(sym, env.var_to_range.get(sym, ValueRanges.unknown()))
    return out
