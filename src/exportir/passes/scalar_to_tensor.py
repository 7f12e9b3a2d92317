"""Python scalars in ``Tensor`` argument positions -> lifted constant tensors.

The Edge dialect has no scalar operands where an operator's schema expects a ``Tensor``
(``aten.mul.Tensor(x, 2)`` becomes ``aten.mul.Tensor(x, c)`` with ``c = torch.tensor(2)``), as
ExecuTorch's ScalarToTensorPass does: ``bool``/``int``/``float`` become 0-dim ``bool`` /
``int64`` / default-dtype tensors, so type promotion gives the same result dtype. ``Scalar``
arguments (``aten.add.Scalar``) are left alone: their schema asks for a scalar.

The constants are lifted like export lifts tensor constants: one placeholder per distinct
value (``c_lifted_tensor_constant<N>``), a ``CONSTANT_TENSOR`` input spec before the user
inputs, and the tensor in ``constants``. Only the top-level graph is rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch._ops import OpOverload

from exportir.export.fake import fake_like
from exportir.export.signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    TensorArgument,
)
from exportir.fx.graph import Graph
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

    def node_for(self, value: bool | float) -> Node:
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


def scalar_to_tensor(
    graph: Graph, signature: ExportGraphSignature, constants: dict[str, Any]
) -> ScalarToTensorResult:
    """Rewrite ``graph`` in place; returns the new input specs and constants to build with."""
    lifter = _Lifter(graph, list(signature.input_specs), dict(constants))
    modified = False
    for node in list(_calls(graph)):
        op = getattr(node.target, "aten_op", node.target)
        if not isinstance(op, OpOverload):
            continue
        positions, names = tensor_arg_positions(op)
        args = list(node.args)
        kwargs = dict(node.kwargs)
        changed = False
        for i, name in positions.items():
            if i < len(args) and is_scalar_operand(args[i]):
                args[i] = lifter.node_for(args[i])
                changed = True
        for name in names:
            if name in kwargs and is_scalar_operand(kwargs[name]):
                kwargs[name] = lifter.node_for(kwargs[name])
                changed = True
        if changed:
            node.args = tuple(args)
            node.kwargs = kwargs
            modified = True
    return ScalarToTensorResult(lifter.specs, lifter.constants, modified)
