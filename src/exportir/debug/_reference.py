"""The reference side of a numerical comparison: an Edge program's graph run node by node in
eager PyTorch, every node's value kept by name.

Delegate calls are run through the delegated subgraph they replaced (the lowered module's
``original_module``), so the nodes a delegate's ops came from have reference values too; node
names are unique across a program and its delegated subgraphs (the subgraphs are cut out of
one graph), so one name -> value table serves both.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch

from exportir.fx import Node
from exportir.fx.node import map_arg

_STATE_KINDS = ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")


class ReferenceRun:
    """Node values of one eager run: ``values[name]`` (a tensor, a tuple of results, or a
    scalar), ``items_read[name]`` the result indices of a multi-result node that some
    ``getitem`` reads, ``nodes[name]`` the graph node itself and ``order[name]`` when it ran."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.items_read: dict[str, set[int]] = {}
        self.nodes: dict[str, Node] = {}
        self.order: dict[str, int] = {}  # name -> position in the run
        self.tables: dict[int, dict[tuple[int, str], Any]] = {}  # debug node tables, indexed
        self.outputs: tuple[Any, ...] = ()


def _state(ep: Any, spec: Any) -> Any:
    target = spec.target
    for table in (ep.state_dict, ep.constants):
        if target in table:
            value = table[target]
            return value.detach().clone() if isinstance(value, torch.Tensor) else value
    raise KeyError(f"the program has no state named {target!r} (input {spec.arg.name})")


def _bind_placeholders(ep: Any, user_inputs: Sequence[Any]) -> dict[str, Any]:
    """Placeholder name -> value: state from the program, user inputs in order."""
    bound: dict[str, Any] = {}
    users = iter(user_inputs)
    for spec in ep.graph_signature.input_specs:
        name = getattr(spec.arg, "name", None)
        kind = getattr(spec.kind, "name", str(spec.kind))
        if kind in _STATE_KINDS:
            bound[name] = _state(ep, spec)
        elif kind == "USER_INPUT":
            try:
                bound[name] = next(users)
            except StopIteration:
                raise ValueError(
                    f"the program takes more user inputs than the {len(user_inputs)} given"
                ) from None
        else:
            raise NotImplementedError(f"comparing a program with a {kind} input")
    return bound


def run_reference(ep: Any, user_inputs: Sequence[Any], run: ReferenceRun | None = None
                  ) -> ReferenceRun:
    """Run ``ep``'s graph node by node (eager ATen ops) on ``user_inputs`` (flat)."""
    run = run if run is not None else ReferenceRun()
    bound = _bind_placeholders(ep, user_inputs)
    env: dict[Node, Any] = {}
    gm = ep.graph_module
    with torch.no_grad():
        for node in ep.graph.nodes:
            if node.op == "placeholder":
                env[node] = bound[node.name]
            elif node.op == "get_attr":
                env[node] = _attr(gm, str(node.target))
            elif node.op == "call_function":
                env[node] = _call(node, env, run)
                run.values[node.name] = env[node]
                run.nodes[node.name] = node
                run.order[node.name] = len(run.order)
                if node.target is operator.getitem and isinstance(node.args[0], Node):
                    run.items_read.setdefault(node.args[0].name, set()).add(node.args[1])
            elif node.op == "output":
                run.outputs = tuple(map_arg(node.args[0], lambda n: env[n]))
    return run


def _attr(gm: Any, target: str) -> Any:
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _call(node: Node, env: dict[Node, Any], run: ReferenceRun) -> Any:
    args = map_arg(node.args, lambda n: env[n])
    kwargs = map_arg(node.kwargs, lambda n: env[n])
    lowered = args[0] if args else None
    if getattr(node.target, "__name__", "") == "executorch_call_delegate" and hasattr(
        lowered, "original_module"
    ):
        inner = run_reference(lowered.original_module, list(args[1:]), run)
        return inner.outputs
    return node.target(*args, **kwargs)
