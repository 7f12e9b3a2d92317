"""From a recorded graph to the ExportedProgram graph form (docs/dev/export-plan.md).

Functionalizes, appends the mutation outputs before the user outputs, orders the placeholders
(parameters, buffers, constants, user inputs), removes dead nodes and describes every input and
output with the signature classes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from exportir.export.capture._node_meta import AUTOGRAD_DETACH, node_name
from exportir.export.capture.functionalize import (
    Functionalizer,
    Unchanged,
    functionalize,
    needs_functionalization,
)
from exportir.export.signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    make_argument_spec,
)
from exportir.fx import Graph, GraphModule, Node
from exportir.fx._lazy_graph_module import _LazyGraphModule

if TYPE_CHECKING:
    from exportir.export.capture.recorder import Lifted, Recorder

_INPUT_KINDS = {
    "parameter": InputKind.PARAMETER,
    "buffer": InputKind.BUFFER,
    "constant": InputKind.CONSTANT_TENSOR,
    "user": InputKind.USER_INPUT,
}
_RANK = {"parameter": 0, "buffer": 1, "constant": 2, "user": 3}


def finalize(
    rec: Recorder, reassigned: dict[str, Node], *, appended: bool = False
) -> tuple[GraphModule, ExportGraphSignature]:
    """``appended``: every node of the recorded graph was appended as it was made (nothing
    inserted before others, as runtime asserts are): then a graph with nothing to functionalize
    is used as it is (see :class:`Unchanged`)."""
    fz, old_out = _functionalize(rec.graph, appended, _describer(rec))
    lifted_of = {fz.placeholders[old]: lifted for old, lifted in rec.inputs.items()}
    mutations = _mutations(fz, rec, reassigned)
    user_outputs = [fz.map_arg(a) for a in old_out.args[0]]
    graph = fz.new
    out = fz.output(tuple(v for _, v in mutations) + tuple(user_outputs))
    out.meta["val"] = tuple(_val(a) for a in out.args[0])
    _order_placeholders(graph, lifted_of)
    graph.eliminate_dead_code()
    _name_kept_detaches(graph)
    signature = _signature(graph, lifted_of, mutations, user_outputs)
    return _LazyGraphModule(torch.nn.Module(), graph), signature


def _name_kept_detaches(graph: Graph) -> None:
    """A detach recorded as autograd's (recorder.AUTOGRAD_DETACH) that the program uses after
    all was the user's: it gets a detach's name (the graph was used as recorded)."""
    for node in graph.find_nodes(op="call_function", target=torch.ops.aten.detach.default):
        if node.name.startswith(AUTOGRAD_DETACH):
            node._rename(node_name(node.target))


def _functionalize(
    graph: Graph, appended: bool, describe: Callable[[Node], str] | None = None
) -> tuple[Functionalizer | Unchanged, Node]:
    # (sizes are recorded as ``sym_size_int``, a name the pass's copy does not keep)
    sizes = graph.find_nodes(op="call_function", target=torch.ops.aten.sym_size.int)
    if appended and not sizes and not needs_functionalization(graph):
        return Unchanged(graph), graph.output_node()
    return functionalize(graph, describe)


def _describer(rec: Recorder) -> Callable[[Node], str]:
    """Names a captured placeholder in error messages: ``input 'x'``, ``buffer 'bn.running_mean'``."""

    def describe(placeholder: Node) -> str:
        lifted = rec.inputs.get(placeholder)
        if lifted is None or lifted.kind == "user":
            return f"input '{placeholder.name}'"
        return f"{lifted.kind} '{lifted.target}'"

    return describe


def _mutations(
    fz: Functionalizer, rec: Recorder, reassigned: dict[str, Node]
) -> list[tuple[Node, Node]]:
    """(new placeholder, final value) for each mutated buffer / user input, in input order."""
    by_target = {
        lifted.target: old for old, lifted in rec.inputs.items() if lifted.kind == "buffer"
    }
    assigned = {by_target[fqn]: node for fqn, node in reassigned.items()}
    found = []
    for old, new in fz.placeholders.items():
        if old in assigned:
            value = fz.read(assigned[old])
        elif fz.version.get(old, 0) > 0:
            value = fz.read(old)
        else:
            continue
        _check_mutable(rec.inputs[old], fz, old)
        found.append((new, value))
    return found


def _check_mutable(lifted: Lifted, fz: Functionalizer, old: Node) -> None:
    if lifted.kind in ("buffer", "user"):
        return
    what = "parameter" if lifted.kind == "parameter" else "tensor constant"
    raise RuntimeError(
        f"forward updates {what} '{lifted.target}'. Parameters and tensor constants may not be "
        "updated during export; keep state that changes in a buffer (self.register_buffer)."
    )


def _val(a: Any) -> Any:
    return a.meta.get("val") if isinstance(a, Node) else a


def _order_placeholders(graph: Graph, lifted_of: dict[Node, Lifted]) -> None:
    placeholders = list(graph.find_nodes(op="placeholder"))
    index = {n: i for i, n in enumerate(placeholders)}
    ordered = sorted(placeholders, key=lambda n: (_RANK[lifted_of[n].kind], index[n]))
    anchor = next(n for n in graph.nodes if n.op != "placeholder")
    for node in ordered:
        anchor.prepend(node)


def _signature(
    graph: Graph,
    lifted_of: dict[Node, Lifted],
    mutations: list[tuple[Node, Node]],
    user_outputs: list[Any],
) -> ExportGraphSignature:
    inputs = []
    for node in graph.find_nodes(op="placeholder"):
        lifted = lifted_of[node]
        kind = _INPUT_KINDS[lifted.kind]
        persistent = lifted.persistent if lifted.kind == "buffer" else None
        inputs.append(InputSpec(kind, make_argument_spec(node), lifted.target, persistent))
    outputs = []
    for placeholder, value in mutations:
        lifted = lifted_of[placeholder]
        if lifted.kind == "buffer":
            outputs.append(
                OutputSpec(OutputKind.BUFFER_MUTATION, make_argument_spec(value), lifted.target)
            )
        else:
            outputs.append(
                OutputSpec(
                    OutputKind.USER_INPUT_MUTATION, make_argument_spec(value), placeholder.name
                )
            )
    for value in user_outputs:
        outputs.append(OutputSpec(OutputKind.USER_OUTPUT, make_argument_spec(value), None))
    return ExportGraphSignature(inputs, outputs)


def finalize_retrace(rec: Recorder) -> GraphModule:
    """Functionalize a re-traced graph; its inputs must not be written to. (The recorder
    appends every node it makes: a graph with nothing to functionalize is used as it is.)"""
    fz, old_out = _functionalize(rec.graph, True)
    written = [old.name for old in fz.placeholders if fz.version.get(old, 0) > 0]
    if written:
        raise RuntimeError(
            f"re-tracing wrote to graph inputs {written}: a decomposition mutates its inputs; "
            "remove it from the decomposition table"
        )
    graph = fz.new
    out = fz.output(tuple(fz.map_arg(a) for a in old_out.args[0]))
    out.meta["val"] = tuple(_val(a) for a in out.args[0])
    graph.eliminate_dead_code()
    return _LazyGraphModule(torch.nn.Module(), graph)
