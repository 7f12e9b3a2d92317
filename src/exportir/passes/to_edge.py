"""ATen -> Edge operator replacement, and removal of graph assertion ops.

``OpReplacePass`` retargets every ``OpOverload`` call (ATen and custom namespaces) to the edge
operator specialising it (``aten.add.Tensor`` -> ``ops.edge.aten.add.Tensor``); symbolic-shape
queries (``aten.sym_size.int``...) stay ATen ops, as ExecuTorch keeps them outside the edge op
set. ``RemoveGraphAssertsPass`` drops runtime assertion ops that have no users (the edge
program is specialised already; a runtime does not execute them).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._ops import OpOverload

from exportir.dialects.edge.ops import EdgeOpOverload, to_edge_op
from exportir.fx.graph_module import GraphModule
from exportir.fx.passes.infra.pass_base import PassBase, PassResult

__all__ = ["ASSERT_OPS", "SYMBOLIC_OPS", "OpReplacePass", "RemoveGraphAssertsPass"]


def _calls(graph: Any) -> list[Any]:
    """The graph's call_function nodes, in order."""
    return [n for n in graph.nodes if n.op == "call_function"]


aten = torch.ops.aten

# Ops on symbolic sizes, and the assertions kept on data-dependent values (checks_data): they
# stay ATen ops in the Edge dialect.
SYMBOLIC_OPS: frozenset[OpOverload] = frozenset({
    aten.sym_size.int, aten.sym_numel.default, aten.sym_stride.int,
    aten.sym_storage_offset.default, aten._assert_scalar.default,
})  # fmt: skip

# Assertion ops removed on the way to the Edge dialect.
ASSERT_OPS: frozenset[OpOverload] = frozenset({
    aten._assert_async.default, aten._assert_async.msg, aten._assert_scalar.default,
    aten._assert_tensor_metadata.default, aten.sym_constrain_range.default,
    aten.sym_constrain_range_for_size.default,
})  # fmt: skip


def _graph_modules(gm: GraphModule) -> list[GraphModule]:
    return [m for m in gm.modules() if isinstance(m, GraphModule)]


class OpReplacePass(PassBase):
    """Replace ATen/custom ``OpOverload`` targets with edge operators (nested graphs too)."""

    def call(self, graph_module: GraphModule) -> PassResult:
        modified = False
        for module in _graph_modules(graph_module):
            changed = False
            for node in _calls(module.graph):
                target = node.target
                if isinstance(target, EdgeOpOverload) or not isinstance(target, OpOverload):
                    continue
                if target in SYMBOLIC_OPS:
                    continue
                node.target = to_edge_op(target)
                changed = True
            if changed:
                module.recompile()
                modified = True
        return PassResult(graph_module, modified)


def checks_data(node: Any) -> bool:
    """Whether assertion ``node`` checks a value read from tensor data (``Tensor.item()``, i.e.
    ``aten._local_scalar_dense``): no input binding can check those, so the program keeps the
    assertion and the runtime evaluates it (``torch._check(n.item() <= x.shape[0])``)."""
    target = node.target.aten_op if isinstance(node.target, EdgeOpOverload) else node.target
    if target is not aten._assert_scalar.default:
        return False
    seen: set[Any] = set()
    todo = [a for a in node.args if hasattr(a, "op")]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        t = n.target.aten_op if isinstance(n.target, EdgeOpOverload) else n.target
        if t is aten._local_scalar_dense.default:
            return True
        if n.op == "call_function" and not isinstance(n.meta.get("val"), torch.Tensor):
            todo.extend(a for a in n.args if hasattr(a, "op"))  # scalar arithmetic only
    return False


class RemoveGraphAssertsPass(PassBase):
    """Erase unused assertion-op nodes (``aten._assert_tensor_metadata``...), except the
    assertions on values read from tensor data (:func:`checks_data`)."""

    def call(self, graph_module: GraphModule) -> PassResult:
        modified = False
        for module in _graph_modules(graph_module):
            changed = False
            for node in reversed(_calls(module.graph)):
                target = node.target
                aten_op = target.aten_op if isinstance(target, EdgeOpOverload) else target
                if aten_op in ASSERT_OPS and not node.users and not checks_data(node):
                    module.graph.erase_node(node)
                    changed = True
            if changed:
                module.recompile()
                modified = True
        return PassResult(graph_module, modified)
