"""GraphModule <-> JSON: nodes in order, their arguments, the saved metadata, nested submodules.

A graph module is ``{"nodes": [...], "submodules": {target: graph module}}``; submodules are
the GraphModules that ``get_attr`` nodes read (cond / map branches). A node is

    {"name": "add", "op": "call_function", "target": "aten::add.Tensor",
     "args": [<value>...], "kwargs": {"alpha": <value>}, "meta": {...}}

Loading rebuilds the graph with ``exportir.fx.Graph.create_node`` and checks that FX kept every
name as written, so the loaded graph prints exactly as the saved one. Names, placeholder
targets and keyword names must be identifiers: they end up in the generated ``forward``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch._ops import HigherOrderOperator, OpOverload

from exportir.export.serialize.common import (
    as_dict,
    as_list,
    as_str,
    check_identifier,
    check_keys,
    fail,
    guarded,
)
from exportir.export.serialize.values import (
    Decoder,
    check_operator_ints,
    encode_target,
    encode_value,
    qualified_name,
    resolve_qualified,
    resolve_target,
)
from exportir.fx.graph import Graph
from exportir.fx.graph_module import GraphModule
from exportir.fx.node import Node

__all__ = ["decode_graph_module", "encode_graph_module"]


# --------------------------------------------------------------------------- node targets


def _enc_placeholder_target(node: Node, where: str) -> str:
    return check_identifier(node.target, where)


def _enc_output_target(node: Node, where: str) -> str:
    if node.target != "output":
        fail(where, f"output node target must be 'output', got {node.target!r}")
    return "output"


def _enc_get_attr_target(node: Node, where: str) -> str:
    return check_identifier(node.target, where, dotted=True)


_TARGET_ENCODERS: dict[str, Callable[[Node, str], str]] = {
    "placeholder": _enc_placeholder_target,
    "call_function": lambda node, where: encode_target(node.target, where),
    "get_attr": _enc_get_attr_target,
    "output": _enc_output_target,
}


def _dec_output_target(text: Any, where: str, submodules: dict[str, Any]) -> str:
    if text != "output":
        fail(where, f"output node target must be 'output', got {text!r:.60}")
    return "output"


def _dec_get_attr_target(text: Any, where: str, submodules: dict[str, Any]) -> str:
    target = check_identifier(text, where, dotted=True)
    if target not in submodules:
        fail(where, f"get_attr reads {target!r}, which is not among the saved submodules "
                    f"{sorted(submodules)[:10]}")
    return target


_TARGET_DECODERS: dict[str, Callable[[Any, str, dict[str, Any]], Any]] = {
    "placeholder": lambda text, where, subs: check_identifier(text, where),
    "call_function": lambda text, where, subs: resolve_target(text, where),
    "get_attr": _dec_get_attr_target,
    "output": _dec_output_target,
}


# --------------------------------------------------------------------------- metadata


def _enc_module_stack(stack: Any, where: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, entry in dict(stack).items():
        path, cls = entry
        out[str(key)] = [str(path), qualified_name(cls)]
    return out


def _dec_module_stack(raw: Any, where: str) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for key, entry in as_dict(raw, where).items():
        pair = as_list(entry, f"{where}/{key}")
        if len(pair) != 2:
            fail(f"{where}/{key}", "expected [module path, class name]")
        out[key] = (as_str(pair[0], f"{where}/{key}/0"), as_str(pair[1], f"{where}/{key}/1"))
    return out


def _enc_source_fn_stack(stack: Any, where: str) -> list[list[str]]:
    return [[str(name), qualified_name(fn)] for name, fn in stack]


def _dec_source_fn_stack(raw: Any, where: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for i, entry in enumerate(as_list(raw, where)):
        pair = as_list(entry, f"{where}/{i}")
        if len(pair) != 2:
            fail(f"{where}/{i}", "expected [name, qualified function or class name]")
        name = as_str(pair[0], f"{where}/{i}/0")
        out.append((name, resolve_qualified(as_str(pair[1], f"{where}/{i}/1"))))
    return out


def _dec_str_pair(raw: Any, where: str) -> tuple[str, str]:
    pair = as_list(raw, where)
    if len(pair) != 2:
        fail(where, "expected [name, qualified name]")
    return (as_str(pair[0], f"{where}/0"), as_str(pair[1], f"{where}/1"))


def _enc_custom(value: Any, where: str) -> Any:
    return encode_value(dict(value), where)


def _dec_custom(raw: Any, where: str) -> Any:
    return Decoder({}).value(raw, where)


# meta key -> (encode(value, where), decode(json, where, env)); other keys are not saved.
_META_CODECS: dict[str, tuple[Callable[[Any, str], Any], Callable[[Any, str, dict], Any]]] = {
    "val": (lambda v, w: encode_value(v, w, tensors=True),
            lambda r, w, env: Decoder(env, tensors=True).value(r, w)),
    "stack_trace": (lambda v, w: str(v), lambda r, w, env: as_str(r, w)),
    "nn_module_stack": (_enc_module_stack, lambda r, w, env: _dec_module_stack(r, w)),
    "source_fn_stack": (_enc_source_fn_stack, lambda r, w, env: _dec_source_fn_stack(r, w)),
    "torch_fn": (lambda v, w: [str(v[0]), str(v[1])], lambda r, w, env: _dec_str_pair(r, w)),
    "custom": (_enc_custom, lambda r, w, env: _dec_custom(r, w)),
}


def _encode_meta(meta: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, (enc, _) in _META_CODECS.items():
        if key in meta:
            value = meta[key]
            out[key] = None if value is None else enc(value, f"{where}/{key}")
    return out


def _decode_meta(raw: Any, where: str, env: dict[str, Node], shapes: Any = None
                 ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in as_dict(raw, where).items():
        codec = _META_CODECS.get(key)
        if codec is None:
            fail(f"{where}/{key}", f"unknown metadata key; known: {sorted(_META_CODECS)}")
        if key == "val" and value is not None:  # may hold symbolic sizes (format 1.1)
            out[key] = Decoder(env, tensors=True, shapes=shapes).value(value, f"{where}/{key}")
            continue
        out[key] = None if value is None else codec[1](value, f"{where}/{key}", env)
    return out


# --------------------------------------------------------------------------- encoding


def _encode_node(node: Node, where: str) -> dict[str, Any]:
    enc_target = _TARGET_ENCODERS.get(node.op)
    if enc_target is None:
        fail(where, f"node {node.name!r} has op {node.op!r}; Export IR graphs only have "
                    f"{sorted(_TARGET_ENCODERS)}")
    return {
        "name": check_identifier(node.name, f"{where}/name"),
        "op": node.op,
        "target": enc_target(node, f"{where}/target"),
        "args": [encode_value(a, f"{where}/args/{i}") for i, a in enumerate(node.args)],
        "kwargs": {check_identifier(k, f"{where}/kwargs"): encode_value(v, f"{where}/kwargs/{k}")
                   for k, v in node.kwargs.items()},
        "meta": _encode_meta(node.meta, f"{where}/meta"),
    }


def _attr(module: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def encode_graph_module(gm: GraphModule, where: str) -> dict[str, Any]:
    """JSON for ``gm``'s graph and the submodules its ``get_attr`` nodes read."""
    nodes = [_encode_node(n, f"{where}/nodes/{i}") for i, n in enumerate(gm.graph.nodes)]
    submodules: dict[str, Any] = {}
    for node in gm.graph.nodes:
        if node.op != "get_attr" or node.target in submodules:
            continue
        sub = _attr(gm, node.target)
        at = f"{where}/submodules/{node.target}"
        if not isinstance(sub, GraphModule):
            fail(at, f"get_attr node {node.name!r} reads a {type(sub).__qualname__}; Export IR "
                     "get_attr may only read GraphModule submodules (lift tensors to inputs)")
        submodules[node.target] = encode_graph_module(sub, at)
    return {"nodes": nodes, "submodules": submodules}


# --------------------------------------------------------------------------- decoding


def _decode_node(graph: Graph, raw: Any, where: str, env: dict[str, Node],
                 submodules: dict[str, Any], shapes: Any = None) -> Node:
    spec = as_dict(raw, where)
    check_keys(spec, {"name", "op", "target", "args", "kwargs"}, {"meta"}, where)
    name = check_identifier(spec["name"], f"{where}/name")
    if name in env:
        fail(f"{where}/name", f"duplicate node name {name!r}")
    op = as_str(spec["op"], f"{where}/op")
    dec_target = _TARGET_DECODERS.get(op)
    if dec_target is None:
        fail(f"{where}/op", f"unknown op {op!r:.40}; expected one of {sorted(_TARGET_DECODERS)}")
    target = dec_target(spec["target"], f"{where}/target (node {name})", submodules)
    values = Decoder(env)
    args = tuple(values.seq(spec["args"], f"{where}/args"))
    kwargs = {check_identifier(k, f"{where}/kwargs"): values.value(v, f"{where}/kwargs/{k}")
              for k, v in as_dict(spec["kwargs"], f"{where}/kwargs").items()}
    if isinstance(target, (OpOverload, HigherOrderOperator)):
        check_operator_ints(args, f"{where}/args")
        check_operator_ints(kwargs, f"{where}/kwargs")
    node = graph.create_node(op, target, args, kwargs, name=name)
    if node.name != name:
        fail(f"{where}/name", f"{name!r} is not a name FX keeps (it became {node.name!r})")
    node.meta.update(_decode_meta(spec.get("meta", {}), f"{where}/meta", env, shapes))
    env[name] = node
    return node


def _check_single_output(nodes: list[Node], where: str) -> None:
    outputs = [i for i, n in enumerate(nodes) if n.op == "output"]
    if outputs != [len(nodes) - 1]:
        fail(where, f"a graph needs exactly one output node, last; found output nodes at "
                    f"positions {outputs[:5]} of {len(nodes)}")


def decode_graph_module(raw: Any, where: str, shapes: Any = None) -> GraphModule:
    """Rebuild a GraphModule (and its submodules) from :func:`encode_graph_module` JSON.
    ``shapes``: the ``(ShapeEnv, Symbols)`` of a program with symbolic shapes."""
    spec = as_dict(raw, where)
    check_keys(spec, {"nodes", "submodules"}, set(), where)
    subs_raw = as_dict(spec["submodules"], f"{where}/submodules")
    submodules = {check_identifier(k, f"{where}/submodules", dotted=True):
                  decode_graph_module(v, f"{where}/submodules/{k}", shapes)
                  for k, v in subs_raw.items()}
    graph = Graph()
    env: dict[str, Node] = {}
    nodes = [_decode_node(graph, raw_node, f"{where}/nodes/{i}", env, submodules, shapes)
             for i, raw_node in enumerate(as_list(spec["nodes"], f"{where}/nodes"))]
    _check_single_output(nodes, f"{where}/nodes")
    return guarded(where, lambda: GraphModule(submodules, graph), "cannot build the GraphModule")
