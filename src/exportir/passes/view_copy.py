"""Views -> view_copy: the Edge dialect has copy semantics, no aliasing outputs.

Every call of a view operator (an ``OpOverload`` whose first return aliases an input without
writing it: ``aten.view``, ``aten.permute``, ``aten.select``...) is retargeted to its ``*_copy``
sibling with the same overload (``aten.view_copy.default``, ``aten.select_copy.int``), which
has the same arguments and returns fresh memory. Metadata and node names are kept.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch._ops import OpOverload

from exportir.fx.graph_module import GraphModule
from exportir.fx.passes.infra.pass_base import PassBase, PassResult

__all__ = ["ReplaceViewOpsWithViewCopyPass", "is_view_op", "view_copy_of"]


def _calls(graph: Any) -> list[Any]:
    """The graph's call_function nodes, in order."""
    return [n for n in graph.nodes if n.op == "call_function"]


def is_view_op(op: OpOverload) -> bool:
    """True when ``op``'s first return is an alias of an input that it does not write."""
    returns = op._schema.returns
    if not returns:
        return False
    alias = returns[0].alias_info
    return alias is not None and not alias.is_write


@functools.cache
def view_copy_of(op: OpOverload) -> OpOverload | None:
    """``aten.<name>_copy.<overload>`` for a view ``op``; None if torch defines none."""
    if not is_view_op(op):
        return None
    name = op._schema.name.split("::", 1)[1]
    packet = getattr(getattr(torch.ops, op.namespace), f"{name}_copy", None)
    copy = getattr(packet, op._overloadname, None) if packet is not None else None
    return copy if isinstance(copy, OpOverload) else None


class ReplaceViewOpsWithViewCopyPass(PassBase):
    """Retarget view-op nodes (top level and nested graphs) to their ``*_copy`` ops."""

    def call(self, graph_module: GraphModule) -> PassResult:
        modified = False
        for module in graph_module.modules():
            if not isinstance(module, GraphModule):
                continue
            changed = False
            for node in _calls(module.graph):
                if not isinstance(node.target, OpOverload):
                    continue
                copy = view_copy_of(node.target)
                if copy is not None:
                    node.target = copy
                    changed = True
            if changed:
                module.recompile()
                modified = True
        return PassResult(graph_module, modified)
