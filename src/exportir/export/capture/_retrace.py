"""Re-tracing a captured graph: how ``run_decompositions`` (and node-level decomposition) work.

The graph's nodes are re-run, one by one, through a fresh :class:`~exportir.export.capture.recorder.
Recorder` whose decomposition table decides, op by op, what is replaced by its decomposition;
composite ops the table does not name stay whole (``_composite.composite_plan``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from torch._ops import HigherOrderOperator

from exportir import pytree
from exportir.export.capture._finalize import finalize_retrace
from exportir.export.capture._outputs import _output_value
from exportir.export.capture._redecide import Reshapes, in_place_variant
from exportir.export.capture._runtime_asserts import insert_runtime_asserts
from exportir.export.capture._view_replay import ViewReplay, mutation_roots
from exportir.export.capture.extension import NO_EXTENSION, CaptureExtension
from exportir.export.capture.fake import fake_like, shape_env_of
from exportir.export.capture.recorder import (
    CaptureMode,
    Lifted,
    Recorder,
    TraceSettings,
)
from exportir.fx import GraphModule, Node

aten = torch.ops.aten


def retrace(
    gm: GraphModule,
    flat_fake_inputs: list,
    *,
    decomposition_table: dict | None = None,
    mutation_outputs: frozenset[str] = frozenset(),
    extension: CaptureExtension = NO_EXTENSION,
) -> GraphModule:
    """Re-run a captured graph through the recorder, decomposing ops found in the table.

    See :func:`_retrace_once`; ``extension`` re-traces what the rooms above capture recorded
    (control flow: pass its extension when the graph may hold cond / map / while_loop). Functionalizing the result can make ops the table names (the
    view ops of in-place view ops a decomposition used: ``stft``'s ``transpose_`` becomes a
    ``transpose``); as torch's decomposition decomposes what its functionalization makes, a
    second pass over the (now functional) graph decomposes those.
    """
    out = _retrace_once(
        gm, flat_fake_inputs, decomposition_table=decomposition_table,
        mutation_outputs=mutation_outputs, extension=extension,
    )  # fmt: skip
    if not decomposition_table or not _calls_any(out, decomposition_table):
        return out
    fakes = [n.meta["val"] for n in out.graph.find_nodes(op="placeholder")]
    return _retrace_once(
        out, fakes, decomposition_table=decomposition_table, extension=extension
    )


def _calls_any(gm: GraphModule, table: dict) -> bool:
    return any(n.op == "call_function" and n.target in table for n in gm.graph.nodes)


def _retrace_once(
    gm: GraphModule,
    flat_fake_inputs: list,
    *,
    decomposition_table: dict | None = None,
    mutation_outputs: frozenset[str] = frozenset(),
    extension: CaptureExtension = NO_EXTENSION,
) -> GraphModule:
    """Re-run a captured graph through the recorder, decomposing ops found in the table.

    Placeholders keep their names and order and outputs keep their order, so the graph
    signature carries over position by position. Every recorded node copies ``stack_trace``,
    ``nn_module_stack`` and ``source_fn_stack`` from the node it came from. The result is
    functionalized again (decompositions may use in-place ops on fresh tensors).
    ``mutation_outputs`` names the nodes holding mutated inputs' new values: views of them are
    regenerated before each use, as torch's functionalization does (_view_replay.py).
    """
    table = dict(decomposition_table or {})
    if table:
        table = {**_ALWAYS_DECOMPOSED, **table}
    # symbolic inputs keep their symbols: the program's ShapeEnv (ranges, replacements) goes on
    rec = Recorder(decomposition_table=table, shape_env=shape_env_of(flat_fake_inputs))
    env: dict[Node, Any] = {}
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    if len(placeholders) != len(flat_fake_inputs):
        raise ValueError(
            f"retrace: the graph has {len(placeholders)} placeholders but "
            f"{len(flat_fake_inputs)} inputs were given"
        )
    for ph, val in zip(placeholders, flat_fake_inputs):
        fake = fake_like(val) if isinstance(val, torch.Tensor) else val
        node = rec.add_input(ph.name, fake, Lifted("user", ph.name, None, val))
        node.meta.update({k: v for k, v in ph.meta.items() if k != "val"})
        env[ph] = fake
    output = None
    replay = ViewReplay(mutation_roots(gm, mutation_outputs))
    reshapes = Reshapes(gm)

    def rerun_view(view: Node) -> None:
        env[view] = _rerun(view, env)

    rec.shape_env.op_listener = rec.on_sym_op  # symbolic arithmetic nodes are re-recorded
    try:
        # as torch's re-trace: no autograd (parameters still require grad, what they compute
        # does not -- composite kernels such as matmul's branch on it)
        # (the extension's mode sees operator calls: only a graph calling one needs it)
        calls_operators = any(isinstance(n.target, HigherOrderOperator) for n in gm.graph.nodes)
        ext_mode = extension.mode() if calls_operators else nullcontext()
        with torch.no_grad(), TraceSettings(rec.whole), CaptureMode(rec), ext_mode:
            for node in gm.graph.nodes:
                if node.op == "call_function":
                    if reshapes.skips(node):
                        continue
                    rec.origin = node
                    replay.before(node, rerun_view)
                    out = reshapes.rerun(node, lambda a: _lookup(a, env))
                    env[node] = _rerun(node, env, rec) if out is None else out
                    replay.after(node)
                elif node.op == "get_attr":  # a cond/map/while_loop body
                    env[node] = getattr(gm, node.target)
                elif node.op == "output":
                    output = node
    finally:
        rec.shape_env.op_listener = None
    results = output.args[0] if isinstance(output.args[0], (list, tuple)) else (output.args[0],)
    flat_out = []
    for result in results:
        # a node made only now (the sym_size of a returned size) takes the meta of the node
        # it stands for; the output node has no stack_trace / nn_module_stack to give
        known = isinstance(result, Node) and "stack_trace" in result.meta
        rec.origin = result if known else output
        flat_out.extend(_output_value(rec, o) for o in pytree.tree_leaves(_lookup(result, env)))
    rec.graph.output(tuple(flat_out))
    insert_runtime_asserts(rec.graph, rec.shape_env)
    return extension.finish(finalize_retrace(rec), rec.subgraphs)


def _lift_fresh_copy(t: torch.Tensor) -> torch.Tensor:
    return aten.clone.default(t)


# non-core ops that torch's decomposition leaves as something else without a table entry
_ALWAYS_DECOMPOSED: dict[Any, Callable[..., Any]] = {
    aten.lift_fresh_copy.default: _lift_fresh_copy,
}


def _lookup(a: Any, env: dict[Node, Any]) -> Any:
    if isinstance(a, Node):
        return env[a]
    if isinstance(a, list):
        return [_lookup(x, env) for x in a]
    if isinstance(a, tuple):
        return tuple(_lookup(x, env) for x in a)
    if isinstance(a, dict):
        return {k: _lookup(v, env) for k, v in a.items()}
    return a


def _rerun(node: Node, env: dict[Node, Any], rec: Recorder | None = None) -> Any:
    args = _lookup(node.args, env)
    kwargs = _lookup(dict(node.kwargs), env)
    if rec is not None and args and isinstance(args[0], torch.Tensor):
        hit = rec.nodes.get(id(args[0]))
        made_by = hit[1] if hit is not None and hit[0] is args[0] else None
        in_place = in_place_variant(node, made_by, lambda v: any(v is e for e in env.values()))
        if in_place is not None:
            return in_place(*args, **kwargs)
    return node.target(*args, **kwargs)
