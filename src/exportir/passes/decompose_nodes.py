"""Decompose chosen nodes of a program, leaving every other node as it is.

``run_decompositions`` decides per *op* (a decomposition table); ``decompose_nodes`` decides per
*node*: each node ``select(node)`` picks is re-traced alone through the table (a one-node graph
whose placeholders carry the node's input values, symbolic sizes included) and the resulting
graph is spliced in where the node was. This is what ``to_edge_transform_and_lower`` needs:

- on an ATen program, to decompose the nodes of a preserved op a partitioner's filter declined;
- on an Edge or Backend program (delegate calls and all: nothing else is re-traced), to
  decompose the preserved nodes no partitioner claimed. With ``edge=True`` the spliced ops then
  go through the rest of the ATen -> Edge road: view ops become ``*_copy`` ops, Python scalars in
  ``Tensor`` positions become lifted constants, ATen ops become edge ops.

Nodes in control-flow bodies (``cond``/``map``/``while_loop`` subgraphs) are considered too;
programs inside lowered backend modules are not (they belong to their backend).
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable
from typing import Any

from exportir import pytree
from exportir.export.program.exported_program import (
    ExportedProgram,
    _rename_call_graph,
    _signature_after_rewrite,
)
from exportir.export.signature import ExportGraphSignature
from exportir.fx.graph import Graph
from exportir.fx.graph_module import GraphModule
from exportir.fx.node import Node, map_arg
from exportir.passes.scalar_to_tensor import scalar_to_tensor
from exportir.passes.to_edge import OpReplacePass, RemoveGraphAssertsPass
from exportir.passes.view_copy import ReplaceViewOpsWithViewCopyPass

__all__ = ["aten_op_of", "decompose_nodes"]

_CARRIED_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "val")


def aten_op_of(target: Any) -> Any:
    """The ATen ``OpOverload`` behind a node target (edge ops wrap one); else the target."""
    return getattr(target, "aten_op", target)


def decompose_nodes(
    program: ExportedProgram,
    select: Callable[[Node], bool],
    decomposition_table: dict[Any, Callable[..., Any]],
    *,
    edge: bool = False,
) -> ExportedProgram:
    """A new program in which every ``call_function`` node ``select`` picks is replaced by its
    decomposition through ``decomposition_table`` (see the module docstring). ``program`` is
    left untouched; it is returned as is when ``select`` picks nothing."""
    gm = copy.deepcopy(program.graph_module)
    modules = [m for m in gm.modules() if isinstance(m, GraphModule)]
    picked = {
        id(m): [n for n in m.graph.nodes if n.op == "call_function" and select(n)] for m in modules
    }
    if not any(picked.values()):
        return program
    for module in modules:
        for node in picked[id(module)]:
            _expand(module.graph, node, decomposition_table, edge)
        module.recompile()
    signature, renames = _signature_after_rewrite(program.graph_signature, gm)
    constants = dict(program.constants)
    if edge:
        lifted = scalar_to_tensor(gm, signature, constants)
        OpReplacePass()(gm)
        signature = ExportGraphSignature(lifted.input_specs, list(signature.output_specs))
        constants = lifted.constants
    gm.recompile()
    call_graph = copy.deepcopy(program.module_call_graph)
    _rename_call_graph(call_graph, renames)
    return ExportedProgram(
        root=gm,
        graph=gm.graph,
        graph_signature=signature,
        state_dict=program.state_dict,
        range_constraints=copy.deepcopy(program.range_constraints),
        module_call_graph=call_graph,
        example_inputs=program.example_inputs,
        constants=constants,
        verifiers=list(program.verifiers),
    )


def _node_inputs(node: Node) -> list[Node]:
    seen: dict[Node, None] = {}
    for leaf in pytree.tree_leaves((node.args, dict(node.kwargs))):
        if isinstance(leaf, Node):
            seen.setdefault(leaf, None)
    return list(seen)


def _one_node_graph(node: Node, inputs: list[Node]) -> GraphModule:
    """``node`` (as its ATen op) alone in a graph: one placeholder per input, flat outputs."""
    graph = Graph()
    env: dict[Node, Node] = {}
    for i, inp in enumerate(inputs):
        env[inp] = graph.placeholder(f"arg{i}")
        env[inp].meta["val"] = inp.meta.get("val")
    call = graph.call_function(
        aten_op_of(node.target), map_arg(node.args, env.__getitem__),
        map_arg(dict(node.kwargs), env.__getitem__),
    )  # fmt: skip
    call.meta.update({k: node.meta[k] for k in _CARRIED_META if k in node.meta})
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):
        outs = [graph.call_function(operator.getitem, (call, i)) for i in range(len(val))]
        graph.output(tuple(outs))
    else:
        graph.output((call,))
    return GraphModule({}, graph)


def _decomposed(
    node: Node, inputs: list[Node], table: dict[Any, Callable[..., Any]], edge: bool
) -> GraphModule:
    from exportir.export.capture._decompositions import KERNEL_LAYOUT
    from exportir.export.capture._retrace import retrace  # capture builds on export, not on passes
    from exportir.export.control_flow.rules import CONTROL_FLOW

    # nothing after the node is re-traced: its users' views were recorded against the kernel's
    # result layout, which these keep (torch's SDPA decomposition lays its result out otherwise)
    table = {**table, **{op: fn for op, fn in KERNEL_LAYOUT.items() if op in table}}
    one = _one_node_graph(node, inputs)
    fakes = [inp.meta.get("val") for inp in inputs]
    sub = retrace(one, fakes, decomposition_table=table, extension=CONTROL_FLOW)
    if any(n.op == "get_attr" for n in sub.graph.nodes):
        raise NotImplementedError(
            f"decomposing node {node.name} ({node.target}) creates tensor constants, which a "
            "node-level decomposition cannot lift; decompose the op with run_decompositions "
            "(or to_edge) instead"
        )
    if edge:
        for gm_pass in (RemoveGraphAssertsPass(), ReplaceViewOpsWithViewCopyPass()):
            gm_pass(sub)
    return sub


def _expand(graph: Graph, node: Node, table: dict[Any, Callable[..., Any]], edge: bool) -> None:
    """Replace ``node`` in ``graph`` by its decomposition (see the module docstring)."""
    inputs = _node_inputs(node)
    sub = _decomposed(node, inputs, table, edge)
    env: dict[Node, Node] = dict(zip(sub.graph.find_nodes(op="placeholder"), inputs))
    inserted: list[Node] = []
    with graph.inserting_before(node):
        for sub_node in sub.graph.nodes:
            if sub_node.op == "call_function":
                env[sub_node] = graph.node_copy(sub_node, env.__getitem__)
                inserted.append(env[sub_node])
    outputs = [env[o] if isinstance(o, Node) else o for o in sub.graph.output_node().args[0]]
    if isinstance(node.meta.get("val"), (tuple, list)):
        for user in list(node.users):
            if user.target is not operator.getitem:
                raise NotImplementedError(
                    f"node {user.name} uses the tuple result of {node.name} other than by "
                    "operator.getitem; cannot decompose it node by node"
                )
            user.replace_all_uses_with(outputs[user.args[1]])
            graph.erase_node(user)
    else:
        node.replace_all_uses_with(outputs[0])
    graph.erase_node(node)
    for new in reversed(inserted):  # results nobody reads (an unused logsumexp...)
        if not new.users and not new.is_impure():
            graph.erase_node(new)
