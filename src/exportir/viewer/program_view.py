"""A program (``schema.Program``: a to_program result or a loaded program file) -> graphs.

Each method becomes a graph of its instructions: an instruction reads the tensors an earlier
instruction (or the method's inputs) wrote, and writes the tensors it names first (out
variants name their outputs last; a delegate call lists its outputs). Views read their base.
The memory plan is drawn from the values' ``Allocation`` s: every planned tensor is live from
the first to the last instruction naming it (through views and lists too); method outputs stay
live to the end.
"""

from __future__ import annotations

from typing import Any

from exportir.format import schema
from exportir.program.printer import (
    format_instruction,
    format_tensor_type,
    format_value,
    human_bytes,
)
from exportir.viewer.delegates import add_blob_graph
from exportir.viewer.model import Buffer, GraphView, MemoryView, PageModel

__all__ = ["add_program"]


def _named(ins: schema.Instruction) -> tuple[int, ...]:
    """Every value id an instruction names, in order."""
    match ins:
        case schema.KernelCall(args=args):
            return args
        case schema.DelegateCall(args=args, outputs=outs):
            return args + outs
        case schema.MoveCall(src=s, dst=d):
            return (s, d)
        case schema.JumpFalseCall(cond_value=c):
            return (c,)
        case schema.FreeCall(value=v):
            return (v,)
    return ()


def _tensors(m: schema.Method, ids: tuple[int, ...]) -> list[int]:
    """Tensor value ids behind ``ids`` (list values expanded; views mapped to their base)."""
    found: list[int] = []
    for i in ids:
        v = m.values[i] if 0 <= i < len(m.values) else None
        if isinstance(v, (schema.TensorList, schema.OptionalTensorList)):
            found += _tensors(m, tuple(j for j in v.items if j >= 0))
        elif isinstance(v, schema.Tensor):
            found.append(v.storage.base if isinstance(v.storage, schema.ViewOf) else i)
    return found


def _defined_up_front(m: schema.Method) -> set[int]:
    ready = set(m.inputs)
    for i, v in enumerate(m.values):
        if isinstance(v, schema.Tensor) and (
            isinstance(v.storage, schema.ConstantData) or v.initial is not None
        ):
            ready.add(i)
    return ready


def _type_text(m: schema.Method, i: int) -> str:
    v = m.values[i] if 0 <= i < len(m.values) else None
    return format_value(v) if v is not None else "?"


def _short_type(m: schema.Method, ids: list[int]) -> str:
    """``f32[2, 8]`` of the tensors ``ids`` name (a tuple text for several)."""
    texts = [format_tensor_type(m.values[i]) for i in ids
             if 0 <= i < len(m.values) and isinstance(m.values[i], schema.Tensor)]
    return texts[0] if len(texts) == 1 else "(" + ", ".join(texts) + ")" if texts else ""


def _label(m: schema.Method, p: schema.Program, ins: schema.Instruction) -> str:
    match ins:
        case schema.KernelCall(op_index=op):
            if 0 <= op < len(m.operators):
                o = m.operators[op]
                name = o.name.removeprefix("aten::")
                return f"{name}.{o.overload}" if o.overload else name
        case schema.DelegateCall(delegate_index=d):
            backend = p.delegates[d].backend_id if 0 <= d < len(p.delegates) else "?"
            return f"delegate {backend}"
    return type(ins).__name__.removesuffix("Call").lower()


def _method_graph(page: PageModel, graph: GraphView, m: schema.Method, p: schema.Program,
                  delegate_graphs: dict[int, str], modules: dict[str, list[tuple[str, str]]]
                  ) -> None:
    producer: dict[int, int] = {}
    for k, i in enumerate(m.inputs):
        name = m.input_names[k] if k < len(m.input_names) else f"input {k}"
        node = graph.add(name, name, "input", details=[("value", _short_type(m, [i])),
                                                       ("value id", f"%{i}"),
                                                       ("type", _type_text(m, i))])
        producer[i] = node.id
    ready = _defined_up_front(m)
    node_of_pc = []
    for pc, ins in enumerate(m.instructions):
        debug = m.debug[ins.debug] if 0 <= ins.debug < len(m.debug) else None
        named = _tensors(m, _named(ins))
        reads = [v for v in named if v in producer or v in ready]
        if isinstance(ins, schema.DelegateCall):
            reads = _tensors(m, ins.args)
        inputs = sorted({producer[v] for v in reads if v in producer})
        kind = "delegate" if isinstance(ins, schema.DelegateCall) else "op"
        writes = [v for v in named if v not in reads]
        if isinstance(ins, schema.DelegateCall):
            writes = _tensors(m, ins.outputs)
        details = [("value", _short_type(m, writes)),
                   ("instruction", f"@{pc}  {format_instruction(m, p, ins)}")]
        if isinstance(ins, schema.DelegateCall) and 0 <= ins.delegate_index < len(p.delegates):
            blob = p.delegates[ins.delegate_index]
            specs = ", ".join(f"{s.key}={s.value!r}" for s in blob.compile_specs)
            details += [("backend", blob.backend_id), ("blob", f"{blob.nbytes} bytes"),
                        ("compile specs", specs)]
        if debug is not None:
            details += [("node", debug.node_name), ("source", debug.source)]
        details += [("values", "\n".join(f"%{i}: {_type_text(m, i)}" for i in _named(ins)))]
        name = debug.node_name if debug else f"@{pc}"
        node = graph.add(name, _label(m, p, ins), kind, inputs=inputs,
                         details=[d for d in details if d[1]], module=list(modules.get(name, [])))
        node_of_pc.append(node.id)
        if isinstance(ins, schema.DelegateCall) and ins.delegate_index in delegate_graphs:
            node.opens.append(("blob program", delegate_graphs[ins.delegate_index]))
        for v in writes + ([ins.dst] if isinstance(ins, schema.MoveCall) else []):
            producer[v] = node.id
    outs = sorted({producer[v] for v in _tensors(m, m.outputs) if v in producer})
    names = ", ".join(m.output_names) or ", ".join(f"%{i}" for i in m.outputs)
    graph.add("output", "output", "output", inputs=outs, details=[("outputs", names)])
    graph.memory = _memory(m)
    graph.memory.nodes = node_of_pc
    total = sum(m.plan.arenas)
    summary = (f"{len(m.plan.arenas)} arena(s), {human_bytes(total)} "
               f"(lower bound {human_bytes(m.plan.lower_bound)})")
    graph.notes.append(("memory plan", summary))


def _memory(m: schema.Method) -> MemoryView:
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for pc, ins in enumerate(m.instructions):
        for v in _tensors(m, _named(ins)):
            first.setdefault(v, pc)
            last[v] = pc
    end = max(len(m.instructions) - 1, 0)
    for v in _tensors(m, m.outputs):
        first.setdefault(v, end)
        last[v] = end
    buffers = []
    for i, v in enumerate(m.values):
        if not (isinstance(v, schema.Tensor) and isinstance(v.storage, schema.Allocation)):
            continue
        a = v.storage
        start = 0 if v.initial is not None else first.get(i, 0)
        stop = end if v.initial is not None else last.get(i, start)
        buffers.append(Buffer(f"%{i}", a.arena, a.offset, a.nbytes, start, stop,
                              format_value(v)))
    labels = []
    for pc, ins in enumerate(m.instructions):
        debug = m.debug[ins.debug] if 0 <= ins.debug < len(m.debug) else None
        labels.append(f"@{pc} {debug.node_name if debug else type(ins).__name__}")
    return MemoryView(list(m.plan.arenas), labels, buffers)


def add_program(page: PageModel, program: schema.Program, title: str,
                parent: str | None = None,
                modules: dict[str, dict[str, list[tuple[str, str]]]] | None = None,
                ) -> list[GraphView]:
    """One graph per method (with its memory plan); delegates whose backend has a decoder
    (:mod:`exportir.viewer.delegates`) open their blob's program. ``modules`` (method -> node
    name -> module chain, from the Edge graphs the program came from) groups instructions by
    module; a file alone does not record modules."""
    graphs = []
    delegate_graphs: dict[int, str] = {}
    for m in program.methods:
        graph = page.new_graph(f"{title}: {m.name}", parent)
        graphs.append(graph)
        for ins in m.instructions:
            if isinstance(ins, schema.DelegateCall) and ins.delegate_index not in delegate_graphs:
                d = ins.delegate_index
                if not 0 <= d < len(program.delegates):
                    continue
                blob = program.delegates[d]
                sub = add_blob_graph(page, blob.backend_id, bytes(blob.data),
                                     f"delegate#{d}: {blob.backend_id} blob", graph.id)
                if sub is not None:
                    specs = ", ".join(f"{s.key}={s.value!r}" for s in blob.compile_specs)
                    sub.notes.append(("compile specs", specs or "(none)"))
                    delegate_graphs[d] = sub.id
        _method_graph(page, graph, m, program, delegate_graphs, (modules or {}).get(m.name, {}))
    return graphs


def describe_program(program: Any) -> str:
    return (f"format {program.version}, {len(program.methods)} method(s), "
            f"{len(program.constants)} constant buffer(s), {len(program.delegates)} delegate(s)")
