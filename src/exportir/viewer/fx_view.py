"""FX graphs (of a GraphModule, an ExportedProgram, an Edge or lowered program) -> GraphView.

Each FX node becomes one box. Placeholders an ExportedProgram lifted from parameters, buffers
and constants are labelled by their kind and placed in the module of their first user, so they
fold away with it. A delegate call opens the delegate's Edge subgraph and, when a decoder for
its backend is known (:mod:`exportir.viewer.delegates`), the program its blob holds; a
``get_attr`` of a submodule graph (control-flow branches and bodies) opens that graph.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from exportir.viewer.delegates import add_blob_graph
from exportir.viewer.model import GraphView, NodeView, PageModel

__all__ = ["add_exported_program", "add_fx_graph", "describe_value", "source_line"]

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in [^\n]*\n?(?:\s+([^\n]*))?')
_TORCH_DIR = "/torch/"
_KIND_OF_INPUT = {
    "USER_INPUT": "input", "PARAMETER": "param", "BUFFER": "param",
    "CONSTANT_TENSOR": "param", "CUSTOM_OBJ": "param", "TOKEN": "input",
}  # fmt: skip
_MAX_DETAIL = 2000


def source_line(stack_trace: str | None) -> str:
    """``file.py:12  code`` of the innermost frame outside torch itself ('' when unknown)."""
    frames = _FRAME.findall(stack_trace or "")
    if not frames:
        return ""
    outside = [f for f in frames if _TORCH_DIR not in f[0].replace("\\", "/")]
    filename, line, code = (outside or frames)[-1]
    return f"{filename}:{line}" + (f"  {code.strip()}" if code else "")


def describe_value(val: Any) -> tuple[str, str]:
    """(shapes, dtypes) of an example value: a tensor, a symbolic or plain scalar, or a
    list/tuple of them."""
    if isinstance(val, torch.Tensor):
        return str(list(val.shape)).replace("'", ""), str(val.dtype).removeprefix("torch.")
    if isinstance(val, (list, tuple)):
        parts = [describe_value(v) for v in val]
        return ("(" + ", ".join(p[0] for p in parts) + ")",
                "(" + ", ".join(p[1] for p in parts) + ")")
    if isinstance(val, (torch.SymInt, int)):
        return str(val), "int"
    if isinstance(val, (torch.SymFloat, float)):
        return str(val), "float"
    if isinstance(val, (torch.SymBool, bool)):
        return str(val), "bool"
    if val is None:
        return "", ""
    return type(val).__name__, ""


def type_text(val: Any) -> str:
    """``float32[2, 8]`` for a tensor, ``(float32[2], int64[])`` for a tuple of them."""
    if isinstance(val, torch.Tensor):
        return f"{str(val.dtype).removeprefix('torch.')}{list(val.shape)}".replace("'", "")
    if isinstance(val, (list, tuple)):
        return "(" + ", ".join(type_text(v) for v in val) + ")"
    shapes, dtypes = describe_value(val)
    return f"{dtypes} {shapes}".strip()


def _short(text: str) -> str:
    return text if len(text) <= _MAX_DETAIL else text[:_MAX_DETAIL] + " ..."


def _target_name(target: Any) -> str:
    name = getattr(target, "__name__", None) if not isinstance(target, str) else target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return str(name if name is not None else target)


def _label(node: Any) -> str:
    if node.op == "call_function":
        text = _target_name(node.target)
        for prefix in ("aten.", "aten::"):
            text = text.removeprefix(prefix)
        return text.removesuffix(".default")
    if node.op in ("call_module", "call_method", "get_attr"):
        return f"{node.op} {node.target}"
    return node.name


def _module_path(node: Any) -> list[tuple[str, str]]:
    stack = node.meta.get("nn_module_stack") or {}
    path = []
    for entry in stack.values():
        if not isinstance(entry, tuple) or len(entry) != 2:
            continue
        fqn, type_name = entry
        type_name = getattr(type_name, "__qualname__", type_name)
        if fqn:
            path.append((str(fqn), str(type_name).rsplit(".", 1)[-1]))
    return path


def _format_arg(arg: Any) -> str:
    if hasattr(arg, "op") and hasattr(arg, "name") and hasattr(arg, "meta"):
        return f"%{arg.name}"
    if isinstance(arg, (list, tuple)):
        inner = ", ".join(_format_arg(a) for a in arg)
        return f"[{inner}]" if isinstance(arg, list) else f"({inner}{',' if len(arg) == 1 else ''})"
    if isinstance(arg, dict):
        return "{" + ", ".join(f"{k!r}: {_format_arg(v)}" for k, v in arg.items()) + "}"
    return repr(arg)


def _details(node: Any, extra: list[tuple[str, str]]) -> list[tuple[str, str]]:
    shapes, dtypes = describe_value(node.meta.get("val"))
    rows = [("name", node.name), ("op", node.op)]
    if node.op not in ("placeholder", "output"):
        rows.append(("target", _target_name(node.target)))
    rows += extra
    rows += [("value", type_text(node.meta.get("val"))), ("shape", shapes), ("dtype", dtypes)]
    if node.args:
        rows.append(("args", _format_arg(tuple(node.args))))
    if node.kwargs:
        rows.append(("kwargs", _format_arg(dict(node.kwargs))))
    stack = node.meta.get("stack_trace")
    rows.append(("source", source_line(stack)))
    module = _module_path(node)
    if module:
        rows.append(("module", " / ".join(f"{p} ({t})" for p, t in module)))
    if stack:
        rows.append(("stack trace", stack))
    return [(k, _short(v)) for k, v in rows if v]


def _lookup(owner: Any, target: str) -> Any:
    value = owner
    for part in target.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


def _is_lowered(attr: Any) -> bool:
    return hasattr(attr, "backend_id") and hasattr(attr, "processed_bytes")


def _lowered_module_called(node: Any, owner: Any) -> Any:
    """The LoweredBackendModule a delegate call node runs (its first argument reads it)."""
    if node.op != "call_function" or not node.args:
        return None
    first = node.args[0]
    if getattr(first, "op", None) != "get_attr":
        return None
    attr = _lookup(owner, str(first.target))
    return attr if _is_lowered(attr) else None


def _input_nodes(node: Any) -> list[Any]:
    return list(getattr(node, "all_input_nodes", ()))


class _Adder:
    """Converts one FX graph; nested graphs (delegates, branches) go into the same page."""

    def __init__(self, page: PageModel, graph: GraphView, owner: Any, kinds: dict[str, Any]):
        self.page = page
        self.graph = graph
        self.owner = owner
        self.kinds = kinds  # placeholder name -> InputSpec
        self.ids: dict[Any, int] = {}

    def run(self, fx_graph: Any) -> None:
        views: dict[Any, NodeView] = {}
        for node in fx_graph.nodes:
            views[node] = self._node(node)
        self._place_state(fx_graph, views)

    def _node(self, node: Any) -> NodeView:
        extra: list[tuple[str, str]] = []
        kind = {"placeholder": "input", "output": "output"}.get(node.op, "op")
        spec = self.kinds.get(node.name)
        if spec is not None:
            kind = _KIND_OF_INPUT.get(getattr(spec.kind, "name", str(spec.kind)), "input")
            extra.append(("input kind", getattr(spec.kind, "name", str(spec.kind))))
            if spec.target:
                extra.append(("state", str(spec.target)))
        view = self.graph.add(node.name, _label(node), kind,
                              inputs=[self.ids[n] for n in _input_nodes(node) if n in self.ids],
                              module=_module_path(node), details=_details(node, extra))
        self.ids[node] = view.id
        self._opens(node, view)
        return view

    def _opens(self, node: Any, view: NodeView) -> None:
        """A delegate call opens its lowered module; a ``get_attr`` of a graph (a control-flow
        branch or body) opens that graph."""
        lowered = _lowered_module_called(node, self.owner)
        if lowered is not None:
            view.kind = "delegate"
            view.label = f"delegate {lowered.backend_id}"
            view.module = []  # it runs nodes of many modules
            add_lowered_module(self.page, self.graph.id, view, lowered, str(node.name))
            return
        attr = _lookup(self.owner, str(node.target)) if node.op == "get_attr" else None
        if hasattr(attr, "graph") and hasattr(attr.graph, "nodes") and not _is_lowered(attr):
            sub = self.page.new_graph(f"{self.graph.title} / {node.target}", self.graph.id)
            add_fx_graph(self.page, sub, attr.graph, attr)
            view.opens.append((f"graph {node.target}", sub.id))

    def _place_state(self, fx_graph: Any, views: dict[Any, NodeView]) -> None:
        """Parameters, buffers and constants join the module that owns them (by their state
        name), else the innermost module all their users share."""
        chain_of: dict[str, list[tuple[str, str]]] = {}
        for view in views.values():
            for depth, (path, _) in enumerate(view.module):
                chain_of.setdefault(path, view.module[: depth + 1])
        for node in fx_graph.nodes:
            view = views[node]
            if view.kind != "param":
                continue
            spec = self.kinds.get(node.name)
            owner = _owner(str(spec.target or "") if spec is not None else "", chain_of)
            if owner is not None:
                view.module = list(owner)
            elif node.users:
                chains = [views[user].module for user in node.users]
                shared = 0
                while all(len(c) > shared and c[shared] == chains[0][shared] for c in chains):
                    shared += 1
                view.module = list(chains[0][:shared])


def _owner(fqn: str, chain_of: dict[str, list[tuple[str, str]]]) -> list[tuple[str, str]] | None:
    """The module chain of the longest module path that prefixes ``fqn``."""
    parts = fqn.split(".")[:-1]
    while parts:
        chain = chain_of.get(".".join(parts))
        if chain is not None:
            return chain
        parts.pop()
    return None


def add_fx_graph(page: PageModel, graph: GraphView, fx_graph: Any, owner: Any,
                 input_specs: Any = ()) -> GraphView:
    """Fill ``graph`` from ``fx_graph``; ``owner`` resolves ``get_attr`` targets."""
    kinds = {spec.arg.name: spec for spec in input_specs if hasattr(spec.arg, "name")}
    _Adder(page, graph, owner, kinds).run(fx_graph)
    return graph


def add_exported_program(page: PageModel, title: str, ep: Any, parent: str | None = None
                         ) -> GraphView:
    """An ExportedProgram's graph, placeholders typed by its signature."""
    graph = page.new_graph(title, parent)
    signature = ep.graph_signature
    add_fx_graph(page, graph, ep.graph, ep.graph_module, signature.input_specs)
    graph.notes.append(("dialect", str(getattr(ep, "dialect", "") or "ATEN")))
    graph.notes += _signature_notes(signature)
    ranges = getattr(ep, "range_constraints", None) or {}
    if ranges:
        graph.notes.append(("ranges", ", ".join(f"{k}: {v}" for k, v in ranges.items())))
    return graph


def _signature_notes(signature: Any) -> list[tuple[str, str]]:
    """User inputs and outputs by name, state inputs and mutated outputs counted by kind."""
    notes = [("user inputs", ", ".join(str(x) for x in signature.user_inputs) or "(none)"),
             ("user outputs", ", ".join(str(x) for x in signature.user_outputs) or "(none)")]
    for specs, what in ((signature.input_specs, "inputs"), (signature.output_specs, "outputs")):
        counts: dict[str, int] = {}
        for spec in specs:
            kind = getattr(spec.kind, "name", str(spec.kind))
            if kind not in ("USER_INPUT", "USER_OUTPUT"):
                counts[kind.lower()] = counts.get(kind.lower(), 0) + 1
        if counts:
            notes.append((f"other {what}", ", ".join(f"{n} {k}" for k, n in counts.items())))
    return notes


def add_lowered_module(page: PageModel, parent: str, view: NodeView, lowered: Any,
                       name: str) -> None:
    """What a LoweredBackendModule holds: its Edge program, its blob (size, compile specs),
    and the blob's own program when its backend has a decoder."""
    blob = bytes(lowered.processed_bytes)
    specs = ", ".join(f"{s.key}={s.value!r}" for s in lowered.compile_specs)
    view.details[2:2] = [("backend", str(lowered.backend_id)), ("blob", f"{len(blob)} bytes")] + (
        [("compile specs", specs)] if specs else [])
    original = getattr(lowered, "original_module", None)
    if original is not None:
        sub = add_exported_program(page, f"{name}: {lowered.backend_id} Edge subgraph",
                                   original, parent)
        view.opens.append(("Edge subgraph", sub.id))
    blob_graph = add_blob_graph(page, str(lowered.backend_id), blob,
                                f"{name}: {lowered.backend_id} blob", parent)
    if blob_graph is not None:
        view.opens.append(("blob program", blob_graph.id))
