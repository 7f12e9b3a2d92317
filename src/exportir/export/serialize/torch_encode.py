"""An exported program -> torch.export's serialized-program JSON (``models/<name>.json``).

Works on anything shaped like an ExportedProgram: ours, or torch's (``exportir.from_torch``
encodes it here, then decodes the JSON with torch_decode.py). Everything is read by attribute:
``node.op / name / target / args / kwargs / meta["val"]``, ``spec.kind.name``, ``entry.fqn``;
nothing of torch.export or torch.fx is imported. The layout follows torch's schema
(torch/_export/serde/schema.py, schema version 8): multi-output operators list their outputs
(no ``getitem`` nodes), operator arguments are named after the schema, ``cond`` / ``map`` /
``while_loop`` bodies are ``as_graph`` arguments, sizes are ``srepr`` text.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
from torch._ops import HigherOrderOperator, OpOverload

from exportir import pytree
from exportir.export.serialize.common import fail
from exportir.export.serialize.symbolic import encode_expr
from exportir.export.serialize.torch_expr import print_expr
from exportir.export.serialize.values import _PY_TARGET_NAMES, _hashable

__all__ = ["DTYPE_CODES", "LAYOUT_CODES", "MEMORY_FORMAT_CODES", "SCHEMA_VERSION",
           "encode_torch_program", "torch_treespec_dumps"]

SCHEMA_VERSION = {"major": 8, "minor": 20}
DTYPE_CODES: dict[torch.dtype, int] = {
    torch.uint8: 1, torch.int8: 2, torch.int16: 3, torch.int32: 4, torch.int64: 5,
    torch.float16: 6, torch.float32: 7, torch.float64: 8, torch.complex32: 9,
    torch.complex64: 10, torch.complex128: 11, torch.bool: 12, torch.bfloat16: 13,
    torch.uint16: 28, torch.float8_e4m3fn: 29, torch.float8_e5m2: 30,
    torch.float8_e4m3fnuz: 31, torch.float8_e5m2fnuz: 32, torch.float8_e8m0fnu: 33,
    torch.uint32: 34, torch.uint64: 35,
}  # fmt: skip
LAYOUT_CODES: dict[torch.layout, int] = {
    torch.sparse_coo: 1, torch.sparse_csr: 2, torch.sparse_csc: 3, torch.sparse_bsr: 4,
    torch.sparse_bsc: 5, torch._mkldnn: 6, torch.strided: 7,  # type: ignore[attr-defined]  # torch's private layout
}  # fmt: skip
MEMORY_FORMAT_CODES: dict[torch.memory_format, int] = {
    torch.contiguous_format: 1, torch.channels_last: 2, torch.channels_last_3d: 3,
    torch.preserve_format: 4,
}  # fmt: skip
_INPUT_FIELDS = {"PARAMETER": ("parameter", "parameter_name"),
                 "BUFFER": ("buffer", "buffer_name"),
                 "CONSTANT_TENSOR": ("tensor_constant", "tensor_constant_name")}
_OUTPUT_FIELDS = {"BUFFER_MUTATION": ("buffer_mutation", "buffer_name"),
                  "USER_INPUT_MUTATION": ("user_input_mutation", "user_input_name"),
                  "PARAMETER_MUTATION": ("parameter_mutation", "parameter_name"),
                  "GRADIENT_TO_PARAMETER": ("gradient_to_parameter", "parameter_name"),
                  "GRADIENT_TO_USER_INPUT": ("gradient_to_user_input", "user_input_name")}


def _is_node(x: Any) -> bool:
    return hasattr(x, "op") and hasattr(x, "users") and hasattr(x, "meta")


def _float(x: float) -> Any:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


def _sym_text(value: Any, where: str) -> dict[str, Any]:
    node = value.node
    expr = encode_expr(node.expr, where)
    hint = getattr(node, "hint", None)
    kind = "as_bool" if isinstance(value, torch.SymBool) else (
        "as_float" if isinstance(value, torch.SymFloat) else "as_int")
    ok = isinstance(hint, (int, float, bool)) and not isinstance(hint, torch.SymInt)
    return {"expr_str": print_expr(expr), "hint": {kind: hint} if ok else None}


def _sym_int(s: Any, where: str) -> dict[str, Any]:
    if isinstance(s, int):
        return {"as_int": int(s)}
    if s.node.expr.is_Integer:
        return {"as_int": int(s.node.expr)}
    return {"as_expr": _sym_text(s, where)}


def tensor_meta(t: torch.Tensor, where: str) -> dict[str, Any]:
    dtype = DTYPE_CODES.get(t.dtype)
    if dtype is None:
        fail(where, f"dtype {t.dtype} has no code in torch's .pt2 schema")
    return {
        "dtype": dtype,
        "sizes": [_sym_int(s, where) for s in t.shape],
        "requires_grad": bool(t.requires_grad),
        "device": {"type": t.device.type, "index": t.device.index},
        "strides": [_sym_int(s, where) for s in t.stride()],
        "storage_offset": _sym_int(t.storage_offset(), where),
        "layout": LAYOUT_CODES.get(t.layout, 0),
    }


def _op_name(target: Any, where: str) -> str:
    if isinstance(target, OpOverload):
        return f"torch.ops.{target.namespace}.{target._opname}.{target._overloadname}"
    if isinstance(target, HigherOrderOperator):
        return f"torch.ops.higher_order.{target.name()}"
    name = _PY_TARGET_NAMES.get(target) if _hashable(target) else None
    if name is None:
        fail(where, f"call target {target!r:.80} cannot be written to a torch .pt2")
    module = getattr(target, "__module__", None) or name.rpartition(".")[0]
    return f"{module}.{target.__name__}"


def _our_treespec(spec: Any) -> pytree.TreeSpec:
    """Our TreeSpec for ours or torch's (read by attribute)."""
    if isinstance(spec, pytree.TreeSpec):
        return spec
    kids = spec.children() if callable(getattr(spec, "children", None)) else spec.children_specs
    children = [_our_treespec(c) for c in kids]
    kind = getattr(spec, "type", None)
    return pytree.TreeSpec(kind, None if kind is None else spec.context, children)


def torch_treespec_dumps(spec: Any) -> str:
    return pytree.treespec_dumps(_our_treespec(spec))


class _GraphEncoder:
    """One graph (the top one or a control-flow body) and its value tables."""

    def __init__(self, gm: Any, where: str) -> None:
        self.gm, self.where = gm, where
        self.tensor_values: dict[str, Any] = {}
        self.sym_int_values: dict[str, Any] = {}
        self.sym_bool_values: dict[str, Any] = {}
        self.sym_float_values: dict[str, Any] = {}

    # -- values -----------------------------------------------------------------------------

    def _declare(self, name: str, val: Any, where: str) -> dict[str, Any]:
        """Record ``val`` (a node's value) under ``name``; its Argument."""
        if isinstance(val, torch.Tensor):
            self.tensor_values[name] = tensor_meta(val, where)
            return {"as_tensor": {"name": name}}
        if isinstance(val, (torch.SymBool, bool)):
            self.sym_bool_values[name] = ({"as_bool": val} if isinstance(val, bool)
                                          else {"as_expr": _sym_text(val, where)})
            return {"as_sym_bool": {"as_name": name}}
        if isinstance(val, (torch.SymInt, int)):
            self.sym_int_values[name] = _sym_int(val, where)
            return {"as_sym_int": {"as_name": name}}
        if isinstance(val, (torch.SymFloat, float)):
            self.sym_float_values[name] = ({"as_float": _float(val)} if isinstance(val, float)
                                           else {"as_expr": _sym_text(val, where)})
            return {"as_sym_float": {"as_name": name}}
        if val is None:
            return {"as_none": True}
        fail(where, f"value {name!r} of type {type(val).__name__} cannot be written to a .pt2")

    def node_arg(self, n: Any, where: str) -> dict[str, Any]:
        if n.op == "get_attr":
            sub = self.gm
            for part in n.target.split("."):
                sub = getattr(sub, part)
            graph = _GraphEncoder(sub, f"{where}/{n.target}").graph()
            return {"as_graph": {"name": n.target, "graph": graph}}
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            return {"as_tensor": {"name": n.name}}
        if isinstance(val, (torch.SymBool, bool)):
            return {"as_sym_bool": {"as_name": n.name}}
        if isinstance(val, (torch.SymInt, int)):
            return {"as_sym_int": {"as_name": n.name}}
        if isinstance(val, (torch.SymFloat, float)):
            return {"as_sym_float": {"as_name": n.name}}
        fail(where, f"node {n.name!r} used as an argument has no tensor or symbolic value")

    def arg(self, a: Any, where: str, type_text: str = "") -> dict[str, Any]:
        if _is_node(a):
            return self.node_arg(a, where)
        if a is None:
            return {"as_none": True}
        if isinstance(a, bool):
            return {"as_bool": a}
        if isinstance(a, int):
            return {"as_int": a}
        if isinstance(a, float):
            return {"as_float": _float(a)}
        if isinstance(a, str):
            return {"as_string": a}
        if isinstance(a, complex):
            return {"as_complex": {"real": _float(a.real), "imag": _float(a.imag)}}
        if isinstance(a, torch.dtype):
            return {"as_scalar_type": DTYPE_CODES[a]}
        if isinstance(a, torch.layout):
            return {"as_layout": LAYOUT_CODES[a]}
        if isinstance(a, torch.memory_format):
            return {"as_memory_format": MEMORY_FORMAT_CODES[a]}
        if isinstance(a, torch.device):
            return {"as_device": {"type": a.type, "index": a.index}}
        if isinstance(a, OpOverload):
            return {"as_operator": _op_name(a, where)}
        if isinstance(a, (list, tuple)):
            return self.list_arg(list(a), where, type_text)
        fail(where, f"argument of type {type(a).__name__} cannot be written to a .pt2")

    def list_arg(self, items: list[Any], where: str, type_text: str) -> dict[str, Any]:
        nodes = [x for x in items if _is_node(x)]
        tensors = [x for x in nodes if isinstance(x.meta.get("val"), torch.Tensor)]
        if tensors or (not items and "Tensor" in type_text):
            if any(x is None for x in items) or "?" in type_text:
                return {"as_optional_tensors": [
                    {"as_none": True} if x is None else {"as_tensor": {"name": x.name}}
                    for x in items]}
            return {"as_tensors": [{"as_tensor": {"name": x.name}}["as_tensor"] for x in items]}
        if nodes or "SymInt" in type_text and any(not isinstance(x, int) for x in items):
            return {"as_sym_ints": [{"as_name": x.name} if _is_node(x) else {"as_int": x}
                                    for x in items]}
        if items and all(isinstance(x, bool) for x in items) or not items and "bool" in type_text:
            return {"as_bools": list(items)}
        if items and all(isinstance(x, int) and not isinstance(x, bool) for x in items):
            if "float" in type_text:
                return {"as_floats": [float(x) for x in items]}
            return {"as_ints": list(items)}
        if not items:
            return {"as_floats": []} if "float" in type_text else {"as_ints": []}
        if all(isinstance(x, (int, float)) for x in items):
            return {"as_floats": [_float(float(x)) for x in items]}
        if all(isinstance(x, str) for x in items):
            return {"as_strings": list(items)}
        fail(where, f"list argument {items!r:.80} cannot be written to a .pt2")

    # -- nodes ------------------------------------------------------------------------------

    def _getitem_names(self, n: Any) -> dict[int, str]:
        return {u.args[1]: u.name for u in n.users
                if u.op == "call_function" and u.target is _GETITEM}

    def _output(self, name: str, val: Any, where: str) -> dict[str, Any]:
        return self._declare(name, val, where)

    def op_outputs(self, n: Any, where: str) -> list[dict[str, Any]]:
        returns = n.target._schema.returns
        val = n.meta.get("val")
        if not returns:
            return []
        single_list = (len(returns) == 1 and isinstance(val, (list, tuple))
                       and str(returns[0].type).startswith("List[Tensor]"))
        if single_list:
            names = self._getitem_names(n)
            return [{"as_tensors": [
                self._declare(names.get(i, f"{n.name}_unused_{i}"), v, where)["as_tensor"]
                for i, v in enumerate(val)]}]
        if len(returns) == 1:
            return [self._output(n.name, val, where)]
        return self._multi(n, val, where)

    def _multi(self, n: Any, val: Any, where: str) -> list[dict[str, Any]]:
        names = self._getitem_names(n)
        out = []
        for i, v in enumerate(val):
            name = names.get(i, f"{n.name}_unused_{i}")
            if isinstance(v, (list, tuple)):
                sub = next((u for u in n.users if u.target is _GETITEM and u.args[1] == i), None)
                inner = self._getitem_names(sub) if sub is not None else {}
                out.append({"as_tensors": [
                    self._declare(inner.get(j, f"{name}_unused_{j}"), t, where)["as_tensor"]
                    for j, t in enumerate(v)]})
            else:
                out.append(self._output(name, v, where))
        return out

    def call(self, n: Any, where: str) -> dict[str, Any]:
        target = n.target
        node: dict[str, Any] = {"target": _op_name(target, where), "metadata": _metadata(n),
                                "is_hop_single_tensor_return": None, "name": n.name}
        if isinstance(target, OpOverload):
            node["inputs"] = self._op_inputs(n, where)
            node["outputs"] = self.op_outputs(n, where)
        elif isinstance(target, HigherOrderOperator):
            node["inputs"] = [{"name": "", "arg": self.arg(a, f"{where}/args/{i}"), "kind": 1}
                              for i, a in enumerate(n.args)]
            node["inputs"] += [{"name": k, "arg": self.arg(v, f"{where}/kwargs/{k}"), "kind": 2}
                               for k, v in n.kwargs.items()]
            val = n.meta.get("val")
            if isinstance(val, (list, tuple)):
                node["outputs"] = self._multi(n, val, where)
                node["is_hop_single_tensor_return"] = False
            else:
                node["outputs"] = [self._output(n.name, val, where)]
                node["is_hop_single_tensor_return"] = True
        else:
            node["inputs"] = [{"name": name, "arg": self.arg(a, f"{where}/args/{i}"), "kind": 1}
                              for i, (name, a) in enumerate(zip(_param_names(target, n.args),
                                                                n.args))]
            node["outputs"] = [self._output(n.name, n.meta.get("val"), where)]
        return node

    def _op_inputs(self, n: Any, where: str) -> list[dict[str, Any]]:
        out = []
        for i, schema_arg in enumerate(n.target._schema.arguments):
            type_text = str(schema_arg.type)
            if schema_arg.name in n.kwargs:
                value, kind = n.kwargs[schema_arg.name], 2
            elif not schema_arg.kwarg_only and i < len(n.args):
                value, kind = n.args[i], 1
            else:
                continue
            out.append({"name": schema_arg.name, "kind": kind,
                        "arg": self.arg(value, f"{where}/{schema_arg.name}", type_text)})
        return out

    def graph(self) -> dict[str, Any]:
        inputs, outputs, nodes, single = [], [], [], False
        for i, n in enumerate(self.gm.graph.nodes):
            where = f"{self.where}/nodes/{i} ({n.name})"
            if n.op == "placeholder":
                val = n.meta.get("val")
                symbolic = isinstance(val, (torch.Tensor, torch.SymInt, torch.SymBool,
                                            torch.SymFloat))
                inputs.append(self._declare(n.name, val, where) if symbolic
                              else self.arg(val, where))  # a constant input: its value
            elif n.op == "call_function":
                if n.target is _GETITEM and _is_node(n.args[0]) and n.args[0].op != "placeholder":
                    continue  # the producer lists its outputs
                nodes.append(self.call(n, where))
            elif n.op == "output":
                results = n.args[0]
                single = not isinstance(results, (list, tuple))
                results = [results] if single else results
                outputs = [self.arg(a, f"{where}/{k}") for k, a in enumerate(results)]
            elif n.op != "get_attr":
                fail(where, f"node op {n.op!r} cannot be written to a .pt2")
        return {"inputs": inputs, "outputs": outputs, "nodes": nodes,
                "tensor_values": self.tensor_values, "sym_int_values": self.sym_int_values,
                "sym_bool_values": self.sym_bool_values, "is_single_tensor_return": single,
                "custom_obj_values": {}, "sym_float_values": self.sym_float_values}


_GETITEM = __import__("operator").getitem


def _param_names(target: Any, args: tuple) -> list[str]:
    try:
        names = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        names = []
    return (names + [f"arg{i}" for i in range(len(names), len(args))])[: len(args)]


def _metadata(n: Any) -> dict[str, str]:
    meta, out = n.meta, {}
    if meta.get("stack_trace"):
        out["stack_trace"] = str(meta["stack_trace"])
    stack = meta.get("nn_module_stack")
    if stack:
        out["nn_module_stack"] = ";".join(f"{k},{v[0]},{_type_name(v[1])}" for k, v in stack.items())
    source = meta.get("source_fn_stack")
    if source:
        out["source_fn_stack"] = ";".join(f"{a},{_type_name(b)}" for a, b in source)
    if meta.get("torch_fn"):
        out["torch_fn"] = ";".join(str(x) for x in meta["torch_fn"])
    return out


def _type_name(x: Any) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, OpOverload):
        return _op_name(x, "")
    module, qual = getattr(x, "__module__", None), getattr(x, "__qualname__", None)
    return f"{module}.{qual}" if module and qual else str(x)


# --------------------------------------------------------------------------- program


def _spec_arg(arg: Any, where: str) -> dict[str, Any]:
    kind = type(arg).__name__
    if kind == "TensorArgument":
        return {"as_tensor": {"name": arg.name}}
    if kind == "SymIntArgument":
        return {"as_sym_int": {"as_name": arg.name}}
    if kind == "SymBoolArgument":
        return {"as_sym_bool": {"as_name": arg.name}}
    if kind == "SymFloatArgument":
        return {"as_sym_float": {"as_name": arg.name}}
    if kind == "ConstantArgument":
        value = arg.value
        if value is None:
            return {"as_none": True}
        return _GraphEncoder(None, where).arg(value, where)
    fail(where, f"argument spec {kind} cannot be written to a .pt2")


def _input_spec(spec: Any, where: str) -> dict[str, Any]:
    kind = spec.kind.name
    if kind == "USER_INPUT":
        arg = spec.arg
        if type(arg).__name__ == "ConstantArgument":
            value = _GraphEncoder(None, where).arg(arg.value, where)
            ((vk, vv),) = value.items()
            return {"constant_input": {"name": arg.name, "value": {vk: vv}}}
        return {"user_input": {"arg": _spec_arg(arg, where)}}
    if kind == "TOKEN":
        return {"token": {"arg": {"name": spec.arg.name}}}
    fields = _INPUT_FIELDS.get(kind)
    if fields is None:
        fail(where, f"input kind {kind} cannot be written to a .pt2")
    body = {"arg": {"name": spec.arg.name}, fields[1]: spec.target}
    if kind == "BUFFER":
        body["persistent"] = bool(spec.persistent)
    return {fields[0]: body}


def _output_spec(spec: Any, where: str) -> dict[str, Any]:
    kind = spec.kind.name
    if kind == "USER_OUTPUT":
        return {"user_output": {"arg": _spec_arg(spec.arg, where)}}
    if kind == "LOSS_OUTPUT":
        return {"loss_output": {"arg": {"name": spec.arg.name}}}
    if kind == "TOKEN":
        return {"token": {"arg": {"name": spec.arg.name}}}
    fields = _OUTPUT_FIELDS.get(kind)
    if fields is None:
        fail(where, f"output kind {kind} cannot be written to a .pt2")
    return {fields[0]: {"arg": {"name": spec.arg.name}, fields[1]: spec.target}}


def _call_graph(entries: Any, where: str) -> list[dict[str, Any]]:
    out = []
    for i, e in enumerate(entries):
        sig = e.signature
        at = f"{where}/{i}"
        out.append({"fqn": e.fqn, "signature": None if sig is None else {
            "inputs": [_spec_arg(a, at) for a in sig.inputs],
            "outputs": [_spec_arg(a, at) for a in sig.outputs],
            "in_spec": torch_treespec_dumps(sig.in_spec),
            "out_spec": torch_treespec_dumps(sig.out_spec),
            "forward_arg_names": (None if getattr(sig, "forward_arg_names", None) is None
                                  else list(sig.forward_arg_names)),
        }})
    return out


def _bound(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if abs(number) < (1 << 62) else None


def _ranges(ranges: dict[Any, Any]) -> dict[str, Any]:
    """Keyed by ``str(expr)``, as torch writes them: symbols (``s0``) and derived sizes
    (``s0 + 1``, ``2*s0``), which torch's reader matches against the ``str`` of the
    expressions in the graph."""
    return {str(sym): {"min_val": _bound(vr.lower), "max_val": _bound(vr.upper)}
            for sym, vr in ranges.items() if getattr(sym, "free_symbols", None)}


def encode_torch_program(ep: Any, opset: dict[str, int], verifier: str = "ATEN",
                         where: str = "models/model.json") -> dict[str, Any]:
    """The ``models/<name>.json`` object for ``ep`` (ours or torch's)."""
    sig = ep.graph_signature
    graph = _GraphEncoder(ep.graph_module, f"{where}/graph_module/graph").graph()
    return {
        "graph_module": {
            "graph": graph,
            "signature": {
                "input_specs": [_input_spec(s, f"{where}/signature/input_specs/{i}")
                                for i, s in enumerate(sig.input_specs)],
                "output_specs": [_output_spec(s, f"{where}/signature/output_specs/{i}")
                                 for i, s in enumerate(sig.output_specs)],
            },
            "module_call_graph": _call_graph(ep.module_call_graph, f"{where}/module_call_graph"),
            "metadata": {},
            "treespec_namedtuple_fields": {},
        },
        "opset_version": dict(opset),
        "range_constraints": _ranges(ep.range_constraints),
        "schema_version": dict(SCHEMA_VERSION),
        "verifiers": [verifier],
        "torch_version": torch.__version__,
        "guards_code": [],
    }
