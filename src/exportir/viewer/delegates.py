"""What a delegate's blob holds, for backends whose blob format we can read.

``BLOB_DECODERS`` maps a backend id to a function that adds the blob's own program to the page
as a graph. Blobs come from files we did not write: each decoder goes through its backend's
validating decoder, and a blob that does not decode becomes a note on the page, not an error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exportir.viewer.model import GraphView, PageModel

__all__ = ["BLOB_DECODERS", "add_blob_graph"]


def _slot_text(blob: Any) -> dict[int, str]:
    """A type text for every slot whose example is known (constants)."""
    return {slot: f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
            for slot, t in blob.constants}


def _arg_text(arg: Any, ref: type) -> str:
    if isinstance(arg, ref):
        return f"%{arg.slot}"
    if isinstance(arg, (list, tuple)):
        return "[" + ", ".join(_arg_text(a, ref) for a in arg) + "]"
    return repr(arg)


def _fused_cpu(graph: GraphView, data: bytes) -> None:
    from exportir.runtime.backends.fused_cpu.format import decode_blob
    from exportir.runtime.backends.fused_cpu.kernels import Ref

    blob = decode_blob(data)
    consts = _slot_text(blob)
    producer: dict[int, int] = {}
    for k, slot in enumerate(blob.inputs):
        node = graph.add(f"input {k}", f"input %{slot}", "input",
                         details=[("slot", f"%{slot}"), ("delegate input", str(k))])
        producer[slot] = node.id
    for i, row in enumerate(blob.ops):
        reads = sorted({a.slot for a in _refs(row.args, Ref) + _refs(list(row.kwargs.values()), Ref)})
        label = row.name.removeprefix("aten.").removesuffix(".default")
        details = [("op", row.name), ("index", str(i)), ("from node", row.node),
                   ("args", _arg_text(list(row.args), Ref))]
        if row.kwargs:
            details.append(("kwargs", ", ".join(f"{k}={_arg_text(v, Ref)}"
                                                for k, v in row.kwargs.items())))
        details.append(("outputs", ", ".join(f"%{s}" for s in row.outs)))
        used = [f"%{s} {consts[s]}" for s in reads if s in consts]
        if used:
            details.append(("constants", ", ".join(used)))
        if row.inplace:
            details.append(("in place", "runs in place on its first argument"))
        node = graph.add(row.node or f"op {i}", label, "op",
                         inputs=sorted({producer[s] for s in reads if s in producer}),
                         details=details)
        for slot in row.outs:
            producer[slot] = node.id
    outs = sorted({producer[s] for s in blob.outputs if s in producer})
    graph.add("output", "output", "output", inputs=outs,
              details=[("slots", ", ".join(f"%{s}" for s in blob.outputs))])
    summary = (f"{len(data)} bytes, {len(blob.ops)} ops, {len(blob.constants)} constants, "
               f"{blob.num_values} slots")
    graph.notes.append(("blob", summary))


def _refs(args: Any, ref: type) -> list[Any]:
    found: list[Any] = []
    stack = list(args)
    while stack:
        a = stack.pop()
        if isinstance(a, ref):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            stack.extend(a)
    return found


BLOB_DECODERS: dict[str, Callable[[GraphView, bytes], None]] = {
    "FusedCpuBackend": _fused_cpu,
}


def add_blob_graph(page: PageModel, backend_id: str, data: bytes, title: str,
                   parent: str | None) -> GraphView | None:
    """The blob's program as a graph, or None when no decoder knows ``backend_id``. A blob the
    decoder rejects gives a graph with one note saying why."""
    decoder = BLOB_DECODERS.get(backend_id)
    if decoder is None:
        return None
    graph = page.new_graph(title, parent)
    try:
        decoder(graph, data)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        graph.nodes.clear()
        graph.notes.append(("cannot decode", f"{type(exc).__name__}: {exc}"))
    return graph
