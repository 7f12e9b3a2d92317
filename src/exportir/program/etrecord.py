"""ETRecord: what a numerical comparison needs next to a program file, saved to a file.

A program file carries its own debug tables (per instruction and per delegated node: the graph
node, ``file:line``, ``nn.Module``), which is all a profile needs. Comparing a program's values
with eager PyTorch also needs the graph the program was emitted from. An :class:`ETRecord`
holds, per method, that graph as a *reference program*: the Edge program with every delegate
call replaced by the subgraph it delegated and every Edge op by its ATen op, node names kept
(they are the names the program's debug tables use), so it saves as an ordinary
``ExportedProgram`` (``exportir.save``, no pickle) and runs in eager PyTorch. It also records
the SHA-256 of the program file it belongs to.

File: an ``exportir.save`` archive of the first method's reference program, with extra files
``exportir_etrecord.json`` (``{"format": "exportir-etrecord", "version": 1, "program_sha256",
"methods"}``) and ``exportir_etrecord/<method>.pt2`` for every other method.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
from dataclasses import dataclass
from typing import Any

from exportir.fx import Graph, GraphModule, Node

__all__ = ["ETRecord", "ETRecordError", "load_etrecord", "reference_program"]

_MANIFEST = "exportir_etrecord.json"
_FORMAT = "exportir-etrecord"
_VERSION = 1
_STATE_KINDS = ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")


class ETRecordError(ValueError):
    """A file that is not a readable ETRecord, or one used with another program."""


def _aten(target: Any) -> Any:
    return getattr(target, "_op", target)  # EdgeOpOverload -> its ATen OpOverload


def _is_delegate_call(node: Node) -> bool:
    return (node.op == "call_function"
            and getattr(node.target, "__name__", "") == "executorch_call_delegate")


def _kind(spec: Any) -> str:
    return getattr(spec.kind, "name", str(spec.kind))


def reference_program(edge: Any) -> Any:
    """``edge`` (an Edge or Backend dialect ``ExportedProgram``) as a flat ATen program with the
    same node names: delegate calls inlined, Edge ops replaced by their ATen ops."""
    from exportir.export import ExportedProgram
    from exportir.export.signature import ExportGraphSignature, InputSpec, TensorArgument

    gm = edge.graph_module
    graph = Graph()
    env: dict[Node, Node] = {}
    state = dict(edge.state_dict)
    constants = dict(edge.constants)
    specs = {getattr(s.arg, "name", None): s for s in edge.graph_signature.input_specs}
    inlined_state: list[tuple[Node, Any, Any]] = []  # (sub placeholder, spec, subprogram)
    for node in edge.graph.nodes:
        if _is_delegate_call(node):
            sub = _attr(gm, node.args[0].target).original_module
            for s, p in zip(sub.graph_signature.input_specs,
                            sub.graph.find_nodes(op="placeholder")):
                if _kind(s) in _STATE_KINDS:
                    inlined_state.append((p, s, sub))
    input_specs = []
    placeholders = list(edge.graph.find_nodes(op="placeholder"))
    first_user = next((i for i, p in enumerate(placeholders)
                       if _kind(specs[p.name]) == "USER_INPUT"), len(placeholders))
    for i, p in enumerate(placeholders):
        if i == first_user:
            _add_state(graph, inlined_state, input_specs, state, constants, env,
                       InputSpec, TensorArgument)
        env[p] = graph.node_copy(p)
        input_specs.append(specs[p.name])
    if first_user == len(placeholders):
        _add_state(graph, inlined_state, input_specs, state, constants, env, InputSpec,
                   TensorArgument)
    results: dict[Node, tuple[Any, ...]] = {}
    for node in edge.graph.nodes:
        if node.op == "placeholder" or (node.op == "get_attr" and _is_lowered(gm, node)):
            continue
        if _is_delegate_call(node):
            results[node] = _inline(graph, _attr(gm, node.args[0].target).original_module,
                                    [env[a] for a in node.args[1:]], env)
            continue
        if node.op == "call_function" and node.args and node.args[0] in results:
            env[node] = results[node.args[0]][node.args[1]]  # getitem of a delegate call
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
        env[node].target = _aten(node.target)
    root = GraphModule(_submodules(gm, graph), graph)
    signature = ExportGraphSignature(input_specs, _output_specs(edge, env, TensorArgument))
    return ExportedProgram(root, graph, signature, state, copy.deepcopy(edge.range_constraints),
                           copy.deepcopy(edge.module_call_graph), constants=constants)


def _output_specs(edge: Any, env: dict[Node, Node], tensor_argument: Any) -> list[Any]:
    """The edge program's output specs naming the reference graph's nodes (a delegate's
    results are now the inlined nodes that compute them)."""
    from exportir.export.signature import OutputSpec

    returned = edge.graph.output_node().args[0]
    returned = returned if isinstance(returned, (tuple, list)) else (returned,)
    specs = []
    for spec, value in zip(edge.graph_signature.output_specs, returned):
        arg = spec.arg
        if isinstance(value, Node) and isinstance(arg, tensor_argument):
            arg = tensor_argument(env[value].name)
        specs.append(OutputSpec(spec.kind, arg, spec.target))
    return specs


def _add_state(graph: Graph, inlined: list[tuple[Node, Any, Any]], input_specs: list[Any],
               state: dict[str, Any], constants: dict[str, Any], env: dict[Node, Node],
               input_spec: Any, tensor_argument: Any) -> None:
    """Placeholders for the state delegates owned (moved into their blobs)."""
    for p, spec, sub in inlined:
        new = graph.node_copy(p)
        env[p] = new
        input_specs.append(input_spec(spec.kind, tensor_argument(new.name), spec.target,
                                      spec.persistent))
        if spec.target in sub.state_dict:
            state[spec.target] = sub.state_dict[spec.target]
        else:
            constants[spec.target] = sub.constants[spec.target]


def _inline(graph: Graph, sub: Any, args: list[Node], env: dict[Node, Node]) -> tuple[Any, ...]:
    """Copy ``sub``'s nodes into ``graph`` (its user inputs are ``args``); its outputs."""
    users = iter(args)
    for s, p in zip(sub.graph_signature.input_specs, sub.graph.find_nodes(op="placeholder")):
        if _kind(s) not in _STATE_KINDS:
            env[p] = next(users)
    for node in sub.graph.nodes:
        if node.op == "output":
            out = node.args[0]
            return tuple(env[n] if isinstance(n, Node) else n
                         for n in (out if isinstance(out, (tuple, list)) else (out,)))
        if node.op == "call_function":
            env[node] = graph.node_copy(node, lambda n: env[n])
            env[node].target = _aten(node.target)
        elif node.op == "get_attr":
            raise NotImplementedError("a delegated subgraph reading a submodule (control flow "
                                      "inside a delegate) has no reference program yet")
    return ()


def _attr(gm: Any, target: str) -> Any:
    obj = gm
    for part in str(target).split("."):
        obj = getattr(obj, part)
    return obj


def _is_lowered(gm: Any, node: Node) -> bool:
    return hasattr(_attr(gm, node.target), "original_module")


def _submodules(gm: Any, graph: Graph) -> dict[str, Any]:
    """The submodules the reference graph's get_attr nodes read (control-flow branches)."""
    return {str(n.target): _attr(gm, n.target) for n in graph.find_nodes(op="get_attr")}


# ------------------------------------------------------------------------------ the record


@dataclass(slots=True)
class ETRecord:
    """Per method, the reference program of a program (see the module docstring), and the
    SHA-256 of that program's file."""

    reference_programs: dict[str, Any]
    program_sha256: str

    @classmethod
    def of(cls, manager: Any) -> ETRecord:
        """The record of a ``ProgramManager`` (what ``EdgeProgramManager.to_program()`` returns)."""
        return cls({m: reference_program(manager.exported_program(m)) for m in
                    sorted(manager.methods)}, hashlib.sha256(manager.buffer).hexdigest())

    def belongs_to(self, program_bytes: bytes | memoryview) -> bool:
        return hashlib.sha256(program_bytes).hexdigest() == self.program_sha256

    def save(self, path: str | os.PathLike[str]) -> None:
        import exportir

        methods = list(self.reference_programs)
        manifest = {"format": _FORMAT, "version": _VERSION, "program_sha256": self.program_sha256,
                    "methods": methods}
        extra: dict[str, Any] = {_MANIFEST: json.dumps(manifest)}
        for name in methods[1:]:
            buffer = io.BytesIO()
            exportir.save(self.reference_programs[name], buffer)
            extra[f"exportir_etrecord/{name}.pt2"] = buffer.getvalue()
        exportir.save(self.reference_programs[methods[0]], path, extra_files=extra)


def load_etrecord(path: str | os.PathLike[str]) -> ETRecord:
    """Read an ETRecord written by :meth:`ETRecord.save` (the archive checks of
    ``exportir.load`` apply: no pickle, bounded sizes); raises :class:`ETRecordError`."""
    import exportir
    from exportir.export.serialize import SerializationError

    extra: dict[str, Any] = {_MANIFEST: ""}
    try:
        first = exportir.load(path, extra_files=extra)
    except SerializationError as e:
        raise ETRecordError(f"{os.fspath(path)} is not an exportir ETRecord ({e})") from None
    try:
        manifest = json.loads(extra[_MANIFEST])
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT:
        raise ETRecordError(f"{os.fspath(path)} is not an exportir ETRecord (no valid {_MANIFEST})")
    if manifest.get("version") != _VERSION:
        raise ETRecordError(f"ETRecord version {manifest.get('version')!r} is not supported "
                            f"(this reader reads {_VERSION})")
    methods, digest = manifest.get("methods"), manifest.get("program_sha256")
    if (not isinstance(methods, list) or not methods or not all(isinstance(m, str) for m in methods)
            or not isinstance(digest, str)):
        raise ETRecordError(f"{_MANIFEST}: expected a list of method names and a program_sha256")
    programs = {methods[0]: first}
    if methods[1:]:
        others = {f"exportir_etrecord/{m}.pt2": b"" for m in methods[1:]}
        exportir.load(path, extra_files=others)
        for m in methods[1:]:
            data = others[f"exportir_etrecord/{m}.pt2"]
            if not isinstance(data, bytes) or not data:
                raise ETRecordError(f"the ETRecord lists method {m!r} but holds no program for it")
            programs[m] = exportir.load(io.BytesIO(data))
    return ETRecord(programs, digest)
