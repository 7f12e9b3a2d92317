"""Tracing one branch / loop body of a control-flow operator into a subgraph GraphModule.

Shared by the ``cond``, ``map_impl`` and ``while_loop`` rules of control_flow.py. A
:class:`SubgraphRecorder` is a :class:`~exportir.export.capture.recorder.Recorder` that records into its
own graph: the operator's explicit inputs (operands, mapped slices, carried values) are its
first placeholders, and every tensor of an enclosing graph that the function reaches through a
closure (an outer intermediate, a parameter, a buffer, a constant) is *lifted*: it becomes a
further placeholder here and an extra input of the operator node outside, as torch.export does.

A traced body is finished by :func:`finish`: all bodies of one operator get the same
placeholders in the same order (explicit inputs, then the lifted tensors in first-use order),
the body is checked (no input mutation, no aliasing between inputs and outputs), functionalized,
and becomes a GraphModule whose own nested subgraphs are attached with :func:`attach_subgraphs`.

While capture runs, an operator node names its subgraphs with strings (``"true_graph_0"``); the
GraphModules wait in ``Recorder.subgraphs`` until the graph is final, when
:func:`attach_subgraphs` registers them as submodules and replaces the names by ``get_attr``
nodes (torch's graph form).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from exportir import pytree
from exportir.export.capture._node_meta import innermost_user_frame
from exportir.export.capture.fake import FakeTensor, fake_like
from exportir.export.capture.functionalize import functionalize, view_base
from exportir.export.capture.recorder import CaptureMode, ExportError, Recorder
from exportir.fx import Graph, GraphModule, Node
from exportir.symbolic.data_dependent import SYM_TYPES as _SYM_TYPES

higher_order = torch.ops.higher_order


class ControlFlowError(ExportError):
    """A cond / map / while_loop that cannot be captured; the message says where and the fix."""


# operator -> positions of its subgraph arguments (the GraphModules read by get_attr)
SUBGRAPH_ARGS: dict[Any, tuple[int, ...]] = {
    higher_order.cond: (1, 2),
    higher_order.map_impl: (0,),
    higher_order.while_loop: (0, 1),
}

# operator -> position of the operand list its subgraphs' trailing placeholders read: tensors
# lifted into a body (closures, constants) are appended there and as trailing placeholders of
# every subgraph of the node (cond's operands, map's pos_args, while_loop's additional inputs)
LIFTED_OPERANDS_ARG: dict[Any, int] = {
    higher_order.cond: 3,
    higher_order.map_impl: 2,
    higher_order.while_loop: 3,
}


class SubgraphRecorder(Recorder):
    """Records one body; tensors of enclosing graphs are lifted to placeholders on first use."""

    def __init__(self, parent: Recorder, op: Any) -> None:
        super().__init__(decomposition_table=parent.decomposition_table)
        self.parent = parent
        self.shape_env = parent.shape_env
        # source_fn_stack of the body's nodes starts with the operator (seed 002's ['cond', ...])
        outer = getattr(parent, "source_prefix", [])
        self.source_prefix: list[tuple[str, Any]] = [*outer, (op.__name__, op)]
        self.converter = parent.converter  # state and constants belong to the root graph
        self.attr_constants = parent.attr_constants
        self.modules, self.functions = parent.modules, parent.functions
        self.explicit: list[Node] = []  # placeholders of the operator's explicit inputs
        self.free: dict[Node, tuple[Node, Any]] = {}  # outer node -> (placeholder, its value)

    def bind(self, name: str, fake: Any) -> Node:
        """A placeholder for an explicit input (an operand, a mapped slice, a carried value)."""
        if isinstance(fake, torch.Tensor) and id(fake) in self.nodes:
            fake = _fresh_fake(fake)  # the same tensor passed twice: two placeholders
        node = self.graph.placeholder(name)
        node.meta["val"] = fake
        if isinstance(fake, torch.Tensor):
            self.nodes[id(fake)] = (fake, node)
            self._track_sizes(fake, node)  # symbolic sizes -> sym_size of this placeholder
        self.explicit.append(node)
        return node

    def node_for(self, t: torch.Tensor) -> Node:
        if not isinstance(t, FakeTensor):
            t = self.converter.from_real(t)
        hit = self.nodes.get(id(t))
        if hit is not None and hit[0] is t:
            return hit[1]
        outer = self.parent.node_for(t)  # lifts through every enclosing body on the way
        return self.lift(outer, t)

    def _fill_meta(self, node: Node, func: Any, val: Any) -> None:
        super()._fill_meta(node, func, val)
        if self.origin is None:  # name the line inside the body, not only the call site
            node.meta["stack_trace"] = _with_body_frame(node.meta.get("stack_trace") or "")
            node.meta["source_fn_stack"] = [*self.source_prefix, *node.meta["source_fn_stack"]]

    def lift(self, outer: Node, value: Any) -> Node:
        known = self.free.get(outer)
        if known is not None:
            return known[0]
        node = self.graph.placeholder(outer.name)
        node.meta["val"] = value
        if isinstance(value, torch.Tensor):
            self.nodes[id(value)] = (value, node)
            self._track_sizes(value, node)
        elif isinstance(value, _SYM_TYPES):
            self._track_sym(value.node, node)
        self.free[outer] = (node, value)
        return node

    def sym_arg(self, x: Any) -> Any:
        """A symbolic value no size or arithmetic of this body computes is lifted from the
        enclosing graph (torch lifts SymInts to operands the same way)."""
        expr = x.node.expr
        known = id(x.node) in self.sym_nodes or expr in self.sym_by_expr
        if known or expr.is_number or expr.is_Boolean:
            return super().sym_arg(x)
        outer = self.parent.sym_arg(x)
        return self.lift(outer, x) if isinstance(outer, Node) else outer


def _with_body_frame(trace: str) -> str:
    """``trace`` (``forward`` frames, outer -> inner) with the body's own frame inserted
    before the first frame inside torch (an ``nn`` module called by the body)."""
    inner = innermost_user_frame()
    frames = trace.split("\n  ") if trace else []
    if inner in frames:
        return trace
    at = next((i for i, f in enumerate(frames) if "/torch/" in f.split("\n")[0]), len(frames))
    return "\n  ".join([*frames[:at], inner, *frames[at:]])


def _fresh_fake(t: torch.Tensor) -> FakeTensor:
    return fake_like(t, requires_grad=False)


@dataclass(slots=True)
class Traced:
    """A body traced but not finished: its recorder, flat outputs and output structure."""

    fn: Callable[..., Any]
    rec: SubgraphRecorder
    vals: list[Any]
    spec: pytree.TreeSpec
    outputs: list[Node] = field(default_factory=list)


def trace_body(
    parent: Recorder,
    op: Any,
    fn: Callable[..., Any],
    inputs: Sequence[tuple[str, Any]],
    call_args: tuple,
) -> Traced:
    """Run ``fn``, a body of ``op``, on ``call_args``, recording into a fresh subgraph whose
    first placeholders are ``inputs`` (name, fake); ``call_args`` holds the fakes of ``inputs``."""
    sub = SubgraphRecorder(parent, op)
    for name, fake in inputs:
        sub.bind(name, fake)
    call_args = _rebind(sub, inputs, call_args)
    env = sub.shape_env
    listener = env.op_listener
    if listener is not None:  # symbolic arithmetic in the body is recorded in the body
        env.op_listener = sub.on_sym_op
    try:
        with CaptureMode(sub):
            out = _call_body(sub, fn, call_args)
    finally:
        env.op_listener = listener
    vals, spec = pytree.tree_flatten(out)
    traced = Traced(fn, sub, vals, spec)
    for v in vals:
        if not isinstance(v, torch.Tensor):
            raise ControlFlowError(
                f"{describe(fn)} returns a {type(v).__name__} ({v!r}); the bodies of "
                f"torch.cond / map / while_loop may only return tensors.\n"
                f"  {innermost_user_frame()}\n"
                "Return a tensor instead (e.g. torch.tensor(value) or x.new_full((), value))."
            )
        traced.outputs.append(sub.node_for(v))
    return traced


def _rebind(sub: SubgraphRecorder, inputs: Sequence[tuple[str, Any]], call_args: tuple) -> tuple:
    """``bind`` gives a duplicated input a fresh fake; pass that fake to the function too."""
    fresh = {
        id(fake): ph.meta["val"]
        for (_, fake), ph in zip(inputs, sub.explicit)
        if ph.meta["val"] is not fake
    }
    if not fresh:
        return call_args
    seen: set[int] = set()

    def swap(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and id(x) in fresh:
            if id(x) in seen:
                return fresh[id(x)]
            seen.add(id(x))
        return x

    return pytree.tree_map(swap, call_args)


def _call_body(sub: SubgraphRecorder, fn: Callable[..., Any], args: tuple) -> Any:
    """Call the user's function, or re-run a captured GraphModule node by node (keeping each
    node's metadata, as capture.retrace does)."""
    if not isinstance(fn, GraphModule):
        return fn(*args)
    env: dict[Node, Any] = {}
    placeholders = list(fn.graph.find_nodes(op="placeholder"))
    if len(placeholders) != len(args):
        raise ControlFlowError(
            f"subgraph takes {len(placeholders)} inputs but {len(args)} were given"
        )
    env.update(zip(placeholders, args))
    for node in fn.graph.nodes:
        if node.op == "get_attr":
            env[node] = getattr(fn, node.target)
        elif node.op == "call_function":
            sub.origin = node
            args_, kwargs_ = _lookup((node.args, dict(node.kwargs)), env)
            env[node] = node.target(*args_, **kwargs_)
        elif node.op == "output":
            sub.origin = None
            return _lookup(node.args[0], env)
    raise ControlFlowError("subgraph has no output node")


def _lookup(a: Any, env: dict[Node, Any]) -> Any:
    if isinstance(a, Node):
        return env[a]
    if isinstance(a, (list, tuple)):
        return type(a)(_lookup(x, env) for x in a)
    if isinstance(a, dict):
        return {k: _lookup(v, env) for k, v in a.items()}
    return a


def lifted_union(bodies: Sequence[Traced]) -> list[tuple[Node, Any]]:
    """The tensors every body lifted, deduplicated, in first-use order (body by body)."""
    seen: dict[Node, Any] = {}
    for body in bodies:
        for outer, (_, value) in body.rec.free.items():
            seen.setdefault(outer, value)
    return list(seen.items())


def finish(
    body: Traced,
    lifted: Sequence[tuple[Node, Any]],
    *,
    names: Sequence[str] | None = None,
    single_output: bool = False,
) -> GraphModule:
    """The finished subgraph: placeholders explicit + ``lifted``, checked, functional."""
    sub = body.rec
    order = list(sub.explicit) + [sub.lift(outer, value) for outer, value in lifted]
    _order_placeholders(sub.graph, order)
    sub.graph.output(body.outputs[0] if single_output else tuple(body.outputs))
    fz, old_out = functionalize(sub.graph)
    written = [old for old in order if fz.version.get(old, 0) > 0]
    if written:
        raise _mutation_error(body, written)
    _check_aliasing(body, order)
    graph = fz.new
    result = old_out.args[0]
    mapped = fz.map_arg(result) if single_output else tuple(fz.map_arg(a) for a in result)
    out = graph.output(mapped)
    out.meta["val"] = _val(mapped)
    graph.eliminate_dead_code()
    if names is not None:
        for node, name in zip(graph.find_nodes(op="placeholder"), names):
            node._rename(name)
    gm = GraphModule(torch.nn.Module(), graph)
    return attach_subgraphs(gm, sub.subgraphs)


def _val(a: Any) -> Any:
    if isinstance(a, Node):
        return a.meta.get("val")
    if isinstance(a, tuple):
        return tuple(_val(x) for x in a)
    return a


def _order_placeholders(graph: Graph, order: list[Node]) -> None:
    anchor = next((n for n in graph.nodes if n.op != "placeholder"), None)
    if anchor is None:
        return
    for node in order:
        anchor.prepend(node)


def _root_of(node: Node) -> Node:
    while True:
        base = view_base(node)
        if base is None:
            return node
        node = base


def _check_aliasing(body: Traced, inputs: list[Node]) -> None:
    placeholders = set(inputs)
    roots: dict[Node, int] = {}
    for i, out in enumerate(body.outputs):
        root = _root_of(out)
        if root in placeholders:
            raise _alias_error(body, f"output {i} is (a view of) its input '{root.name}'")
        if root in roots:
            raise _alias_error(
                body, f"outputs {roots[root]} and {i} are (views of) the same tensor"
            )
        roots[root] = i


def describe(fn: Callable[..., Any]) -> str:
    """``true_fn`` (``File "m.py", line 12``) for error messages."""
    fn = _user_function(fn)
    code = getattr(fn, "__code__", None)
    name = getattr(fn, "__name__", type(fn).__name__)
    if code is None:
        return f"'{name}'"
    return f"'{name}' (File \"{code.co_filename}\", line {code.co_firstlineno})"


def _user_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """torch's wrappers (``flat_body_fn``, ``functools.partial``) -> the user's function."""
    for _ in range(4):
        keywords = getattr(fn, "keywords", None) or {}  # functools.partial (map's wrapper)
        inner = keywords.get("f", getattr(fn, "func", None))
        code = getattr(fn, "__code__", None)
        if inner is None and (code is None or "/torch/" not in code.co_filename):
            return fn
        if inner is None:
            cells = [c.cell_contents for c in fn.__closure__ or () if _filled(c)]
            inner = next((c for c in cells if callable(c) and hasattr(c, "__code__")), None)
            if inner is None:
                return fn
        fn = inner
    return fn


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018  # an empty cell raises
    except ValueError:
        return False
    return True


def _alias_error(body: Traced, what: str) -> ControlFlowError:
    return ControlFlowError(
        "Encountered aliasing during higher order op tracing: Higher order ops do not support "
        f"aliasing. In {describe(body.fn)}, {what}.\n  {innermost_user_frame()}\n"
        "Replace `return input` with `return input.clone()` to avoid aliasing."
    )


def _mutation_error(body: Traced, written: list[Node]) -> ControlFlowError:
    names = ", ".join(f"'{n.name}'" for n in written)
    return ControlFlowError(
        "Encountered input mutation during higher order op tracing: Higher order ops do not "
        f"support input mutation. {describe(body.fn)} writes in place to its input(s) {names} "
        f"(an operand, or a tensor it closes over).\n  {innermost_user_frame()}\n"
        "Compute a new tensor instead (x = x + 1 rather than x.add_(1)) and return it; in-place "
        "ops on tensors created inside the function are fine."
    )


# --- attaching subgraphs ---------------------------------------------------------------------


def fresh_index(rec: Recorder, *prefixes: str) -> int:
    """The smallest ``i`` such that no ``{prefix}_{i}`` subgraph exists yet."""
    i = 0
    while any(f"{p}_{i}" in rec.subgraphs for p in prefixes):
        i += 1
    return i


def attach_subgraphs(gm: GraphModule, subgraphs: dict[str, GraphModule]) -> GraphModule:
    """Register ``subgraphs`` on ``gm`` and turn the operators' subgraph names into get_attr
    nodes (inserted right before the operator node, as torch.export places them)."""
    if not subgraphs:
        return gm
    graph = gm.graph
    for node in list(graph.nodes):
        positions = SUBGRAPH_ARGS.get(node.target) if node.op == "call_function" else None
        for pos in positions or ():
            name = node.args[pos]
            if not isinstance(name, str) or name not in subgraphs:
                continue
            gm.add_submodule(name, subgraphs[name])
            with graph.inserting_before(node):
                attr = graph.get_attr(name)
            for key in ("stack_trace", "nn_module_stack"):
                if key in node.meta:
                    attr.meta[key] = node.meta[key]
            node.update_arg(pos, attr)
    gm.recompile()
    return gm
