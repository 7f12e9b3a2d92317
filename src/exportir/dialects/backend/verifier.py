"""The Backend dialect verifier: the Edge rules plus the delegate-call contract.

A Backend-dialect program is an Edge program some of whose subgraphs were replaced by delegate
calls. Beyond the Edge checks, every ``executorch_call_delegate`` node must:

1. take a ``get_attr`` of a :class:`LoweredBackendModule` as its first argument, with a
   non-empty ``backend_id`` and bytes ``processed_bytes``;
2. pass as many values as the lowered program has user inputs;
3. describe its result as a tuple in ``meta["val"]`` and be used only through
   ``operator.getitem`` with an index inside that tuple.

And a lowered module may only be read by delegate calls.
"""

from __future__ import annotations

import operator
from typing import Any

from exportir.dialects.backend.lowered import LoweredBackendModule, executorch_call_delegate
from exportir.dialects.edge.verifier import EdgeVerifier, user_source_line
from exportir.export.program.verifier import NodeSpecViolationError
from exportir.export.signature import InputKind
from exportir.fx.graph_module import GraphModule
from exportir.fx.node import Node

__all__ = ["BackendVerifier"]


def _fail(node: Node, what: str, way_out: str) -> None:
    message = (
        f"Backend dialect violation at node {node.name} (op {node.target}), from "
        f"{user_source_line(node)}:\n  {what}\n  Way out: {way_out}"
    )
    raise NodeSpecViolationError(message, node, node.graph)


_REBUILD = "build delegate calls with exportir.passes.to_backend.to_backend, not by hand"


def _lowered_of(gm: GraphModule, node: Node) -> LoweredBackendModule | None:
    first = node.args[0] if node.args else None
    if not (isinstance(first, Node) and first.op == "get_attr"):
        return None
    obj: Any = gm
    for atom in str(first.target).split("."):
        obj = getattr(obj, atom, None)
    return obj if isinstance(obj, LoweredBackendModule) else None


def _user_input_count(lowered: LoweredBackendModule) -> int | None:
    program = lowered.original_module
    signature = getattr(program, "graph_signature", None)
    if signature is None:
        return None
    return sum(1 for s in signature.input_specs if s.kind == InputKind.USER_INPUT)


def _check_delegate_call(gm: GraphModule, node: Node) -> None:
    lowered = _lowered_of(gm, node)
    if lowered is None:
        _fail(
            node,
            "the first argument of a delegate call must be a get_attr of a LoweredBackendModule.",
            _REBUILD,
        )
        return
    if not (isinstance(lowered.backend_id, str) and lowered.backend_id):
        _fail(node, f"the lowered module has backend_id {lowered.backend_id!r}.", _REBUILD)
    if not isinstance(lowered.processed_bytes, bytes):
        _fail(node, "the lowered module's processed_bytes are not bytes.", _REBUILD)
    expected = _user_input_count(lowered)
    if expected is not None and expected != len(node.args) - 1:
        _fail(
            node,
            f"the delegate call passes {len(node.args) - 1} values; the lowered "
            f"{lowered.backend_id} program takes {expected}.",
            _REBUILD,
        )
    val = node.meta.get("val")
    if not isinstance(val, (tuple, list)):
        _fail(
            node,
            f"meta['val'] of a delegate call must be the tuple of its outputs; got "
            f"{type(val).__name__}.",
            _REBUILD,
        )
        return
    for user in node.users:
        index = user.args[1] if user.target is operator.getitem and len(user.args) == 2 else None
        if user.op != "call_function" or not isinstance(index, int) or not (0 <= index < len(val)):
            _fail(
                user,
                f"the result of delegate call {node.name} is used by {user.name} "
                f"({user.op} {user.target}); it may only be indexed with "
                f"operator.getitem(call, i), 0 <= i < {len(val)}.",
                _REBUILD,
            )


def _check_lowered_reads(gm: GraphModule, node: Node) -> None:
    obj: Any = gm
    for atom in str(node.target).split("."):
        obj = getattr(obj, atom, None)
    if not isinstance(obj, LoweredBackendModule):
        return
    for user in node.users:
        if user.target is not executorch_call_delegate or user.args[0] is not node:
            _fail(
                user,
                f"lowered module {node.target} is read by {user.name} ({user.target}); "
                "only executorch_call_delegate may take a lowered module, as its first "
                "argument.",
                _REBUILD,
            )


class BackendVerifier(EdgeVerifier):
    """Verifier of the Backend dialect (see the module docstring)."""

    dialect = "BACKEND"

    def check_additional(self, gm: GraphModule) -> None:
        super().check_additional(gm)
        for module in gm.modules():
            if not isinstance(module, GraphModule):
                continue
            for node in module.graph.nodes:
                if node.op == "get_attr":
                    _check_lowered_reads(module, node)
                elif node.op == "call_function" and node.target is executorch_call_delegate:
                    _check_delegate_call(module, node)
