"""Python scalars in ``Tensor`` argument positions -> lifted constant tensors.

The Edge dialect has no scalar operands where an operator's schema expects a ``Tensor``
(``aten.mul.Tensor(x, 2)`` becomes ``aten.mul.Tensor(x, c)`` with ``c = torch.tensor(2)``), as
ExecuTorch's ScalarToTensorPass does: ``bool``/``int``/``float`` become 0-dim ``bool`` /
``int64`` / default-dtype tensors, so type promotion gives the same result dtype. ``Scalar``
arguments (``aten.add.Scalar``) are left alone: their schema asks for a scalar.

The constants are lifted like export lifts tensor constants: one placeholder per distinct
value (``c_lifted_tensor_constant<N>``), a ``CONSTANT_TENSOR`` input spec before the user
inputs, and the tensor in ``constants``. Control-flow bodies (``cond`` branches, ``map`` and
``while_loop`` bodies, nested to any depth) are rewritten too: a constant a body needs is
threaded down to it as torch.export threads closures, i.e. appended to the operand list of
each enclosing control-flow node (``LIFTED_OPERANDS_ARG``) and as a trailing placeholder of
every subgraph of that node (both branches of a cond take the same inputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch._ops import OpOverload

from exportir.export.capture.fake import fake_like
from exportir.export.control_flow.rules import LIFTED_OPERANDS_ARG, SUBGRAPH_ARGS
from exportir.export.signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    TensorArgument,
)
from exportir.fx.graph import Graph
from exportir.fx.graph_module import GraphModule
from exportir.fx.node import Node

__all__ = ["ScalarToTensorResult", "is_scalar_operand", "scalar_to_tensor", "tensor_arg_positions"]


def _calls(graph: Any) -> list[Any]:
    """The graph's call_function nodes, in order."""
    return [n for n in graph.nodes if n.op == "call_function"]


_SCALARS = (bool, int, float)


@dataclass(frozen=True, slots=True)
class ScalarToTensorResult:
    """What the pass produced: new input specs (in order), new constants, whether it changed."""

    input_specs: list[InputSpec]
    constants: dict[str, Any]
    modified: bool


def is_scalar_operand(value: Any) -> bool:
    """A Python number (not a SymInt/SymFloat, not a node)."""
    return isinstance(value, _SCALARS)


def tensor_arg_positions(op: OpOverload) -> tuple[dict[int, str], set[str]]:
    """Positional indices and kwarg names of ``op``'s plain ``Tensor`` arguments."""
    positions: dict[int, str] = {}
    names: set[str] = set()
    for i, arg in enumerate(op._schema.arguments):
        if isinstance(arg.type, torch.TensorType):
            names.add(arg.name)
            if not arg.kwarg_only:
                positions[i] = arg.name
    return positions, names


def _constant_tensor(value: bool | float) -> torch.Tensor:
    return torch.tensor(value)


class _Lifter:
    """Creates (and reuses) one constant placeholder per distinct scalar value."""

    def __init__(self, graph: Graph, specs: list[InputSpec], constants: dict[str, Any]) -> None:
        self.graph = graph
        self.specs = specs
        self.constants = constants
        self.by_value: dict[tuple[type, str], Node] = {}
        self.counter = 0
        self.taken = {n.name for n in graph.nodes} | set(constants)

    def _fresh(self) -> str:
        while True:
            name = f"_lifted_tensor_constant{self.counter}"
            self.counter += 1
            if name not in self.taken and f"c{name}" not in self.taken:
                self.taken.update((name, f"c{name}"))
                return name

    def node_for(self, value: bool | float, graph: Graph | None = None) -> Node:
        """The top-level constant placeholder holding ``value`` (``graph`` is the top graph)."""
        key = (type(value), repr(value))
        hit = self.by_value.get(key)
        if hit is not None:
            return hit
        target = self._fresh()
        tensor = _constant_tensor(value)
        first_user = next(
            (i for i, s in enumerate(self.specs) if s.kind == InputKind.USER_INPUT), len(self.specs)
        )
        placeholders = self.graph.find_nodes(op="placeholder")
        anchor = placeholders[first_user] if first_user < len(placeholders) else None
        if anchor is None:
            anchor = next((n for n in self.graph.nodes if n.op != "placeholder"), None)
        with self.graph.inserting_before(anchor):
            node = self.graph.placeholder(f"c{target}")
        node.meta["val"] = fake_like(tensor)
        self.specs.insert(
            first_user, InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(node.name), target)
        )
        self.constants[target] = tensor
        self.by_value[key] = node
        return node


class _BodyScope:
    """The constants the subgraphs of one control-flow node read: one trailing placeholder per
    constant in every subgraph (same order in each), and one operand of the node outside."""

    def __init__(
        self, outer: _Lifter | _BodyScope, outer_graph: Graph, graphs: list[Graph]
    ) -> None:
        self.outer = outer
        self.outer_graph = outer_graph  # the graph holding the control-flow node
        self.graphs = graphs
        self.values: list[bool | float] = []
        self.placeholders: dict[tuple[type, str], dict[Graph, Node]] = {}

    def node_for(self, value: bool | float, graph: Graph) -> Node:
        key = (type(value), repr(value))
        if key not in self.placeholders:
            outer_node = self.outer.node_for(value, self.outer_graph)
            self.placeholders[key] = {g: _append_placeholder(g, outer_node) for g in self.graphs}
            self.values.append(value)
        return self.placeholders[key][graph]


def _append_placeholder(graph: Graph, like: Node) -> Node:
    """A new placeholder after ``graph``'s last one, named and typed like ``like``."""
    placeholders = graph.find_nodes(op="placeholder")
    if placeholders:
        with graph.inserting_after(placeholders[-1]):
            node = graph.placeholder(like.name)
    else:
        with graph.inserting_before(next(iter(graph.nodes), None)):
            node = graph.placeholder(like.name)
    node.meta["val"] = like.meta.get("val")
    return node


def _rewrite_node(node: Node, scope: _Lifter | _BodyScope, graph: Graph) -> bool:
    """Scalars in ``node``'s ``Tensor`` arguments -> constant nodes of ``scope``."""
    op = getattr(node.target, "aten_op", node.target)
    if not isinstance(op, OpOverload):
        return False
    positions, names = tensor_arg_positions(op)
    args = list(node.args)
    kwargs = dict(node.kwargs)
    changed = False
    for i in positions:
        if i < len(args) and is_scalar_operand(args[i]):
            args[i] = scope.node_for(args[i], graph)
            changed = True
    for name in names:
        if name in kwargs and is_scalar_operand(kwargs[name]):
            kwargs[name] = scope.node_for(kwargs[name], graph)
            changed = True
    if changed:
        node.args = tuple(args)
        node.kwargs = kwargs
    return changed


def _rewrite_control_flow(
    owner: GraphModule, node: Node, scope: _Lifter | _BodyScope, graph: Graph
) -> bool:
    """Rewrite the subgraphs of control-flow ``node`` (in ``owner``), then pass the constants
    they now read as extra operands of ``node``."""
    bodies = [getattr(owner, node.args[pos].target) for pos in SUBGRAPH_ARGS[node.target]]
    inner = _BodyScope(scope, graph, [body.graph for body in bodies])
    modified = False
    for body in bodies:
        modified |= _rewrite_module(body, inner)
    if not inner.values:
        return modified
    for body in bodies:  # siblings got placeholders too, used or not
        body.recompile()
    pos = LIFTED_OPERANDS_ARG[node.target]
    operands = node.args[pos]
    extra = [scope.node_for(value, graph) for value in inner.values]
    node.update_arg(pos, type(operands)([*operands, *extra]))
    return True


def _rewrite_module(gm: GraphModule, scope: _Lifter | _BodyScope) -> bool:
    modified = False
    for node in list(_calls(gm.graph)):
        if node.target in SUBGRAPH_ARGS:
            modified |= _rewrite_control_flow(gm, node, scope, gm.graph)
        else:
            modified |= _rewrite_node(node, scope, gm.graph)
    if modified:
        gm.recompile()
    return modified


def scalar_to_tensor(
    gm: GraphModule, signature: ExportGraphSignature, constants: dict[str, Any]
) -> ScalarToTensorResult:
    """Rewrite ``gm`` (and its control-flow bodies) in place; returns the new input specs and
    constants to build the program with."""
    lifter = _Lifter(gm.graph, list(signature.input_specs), dict(constants))
    modified = _rewrite_module(gm, lifter)
    return ScalarToTensorResult(lifter.specs, lifter.constants, modified)
