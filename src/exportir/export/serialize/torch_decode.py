"""torch.export's serialized-program JSON -> our ExportedProgram.

The JSON (``models/<name>.json`` of a .pt2, or what torch_encode.py makes of a torch
ExportedProgram) is translated, as data, into the JSON of our own format (program.json), which
the hardened decoders of our format then build: call targets resolve through the same table
and refusals as our own files (values.resolve_target), expressions through the same
constructor table (symbolic.decode_expr). A training-IR graph (torch.export.export's) is
made the ATen dialect by torch_training.py.
"""

from __future__ import annotations

import builtins
import keyword
import re
from typing import Any

import torch
from torch._ops import OpOverload

from exportir.export.program.exported_program import ExportedProgram
from exportir.export.serialize.common import (
    LIMITS,
    as_bool,
    as_dict,
    as_int,
    as_list,
    as_str,
    check_identifier,
    fail,
)
from exportir.export.serialize.graph import decode_graph_module
from exportir.export.serialize.program import (
    decode_module_call_graph,
    decode_range_constraints,
    decode_signature,
)
from exportir.export.serialize.symbolic import decode_shape_env
from exportir.export.serialize.torch_encode import (
    DTYPE_CODES,
    LAYOUT_CODES,
    MEMORY_FORMAT_CODES,
    SCHEMA_VERSION,
)
from exportir.export.serialize.torch_expr import parse_expr, parse_range_key
from exportir.export.serialize.torch_training import to_aten_dialect
from exportir.export.serialize.values import (
    _DTYPE_NAMES,
    _LAYOUT_NAMES,
    _MEMORY_FORMAT_NAMES,
    resolve_target,
)

__all__ = ["decode_torch_program", "dtype_of"]

_DTYPES = {code: _DTYPE_NAMES[d] for d, code in DTYPE_CODES.items()}
_LAYOUTS = {code: _LAYOUT_NAMES[x] for x, code in LAYOUT_CODES.items() if x in _LAYOUT_NAMES}
_MEMORY_FORMATS = {code: _MEMORY_FORMAT_NAMES[x] for x, code in MEMORY_FORMAT_CODES.items()}
_DTYPE_OBJECTS = {code: d for d, code in DTYPE_CODES.items()}
_CONSTANT_INPUTS = ("as_int", "as_float", "as_bool", "as_none", "as_string")
_FLOATS = {"Infinity": "inf", "-Infinity": "-inf", "NaN": "nan"}
_PY_MODULES = {"_operator": "operator", "operator": "operator", "math": "math", "torch": "torch",
               "builtins": "builtins"}
# torch's input / output spec union tag -> (our kind, field naming the target)
_INPUTS = {"parameter": ("PARAMETER", "parameter_name"), "buffer": ("BUFFER", "buffer_name"),
           "tensor_constant": ("CONSTANT_TENSOR", "tensor_constant_name")}
_OUTPUTS = {"buffer_mutation": ("BUFFER_MUTATION", "buffer_name"),
            "user_input_mutation": ("USER_INPUT_MUTATION", "user_input_name"),
            "parameter_mutation": ("PARAMETER_MUTATION", "parameter_name"),
            "gradient_to_parameter": ("GRADIENT_TO_PARAMETER", "parameter_name"),
            "gradient_to_user_input": ("GRADIENT_TO_USER_INPUT", "user_input_name")}


# names our FX never gives a node (keywords, builtins: torch's deserializer forces them, we
# cannot): renamed consistently wherever the file names a value
_RESERVED = frozenset(keyword.kwlist) | frozenset(dir(builtins))


def _ident(name: Any, where: str) -> str:
    text = check_identifier(name, where)
    return f"{text}_1" if text in _RESERVED else text


def dtype_of(code: Any, where: str) -> torch.dtype:
    found = _DTYPE_OBJECTS.get(as_int(code, where))
    if found is None:
        fail(where, f"unknown scalar type code {code}")
    return found


def _union(raw: Any, where: str) -> tuple[str, Any]:
    """torch's unions are one-key objects ``{tag: value}``."""
    spec = as_dict(raw, where)
    if len(spec) != 1:
        fail(where, f"expected a one-key union object, got keys {sorted(spec)[:6]}")
    ((tag, value),) = spec.items()
    return tag, value


class _Symbols:
    """Every symbol the file's expressions name, with hints."""

    def __init__(self) -> None:
        self.names: dict[str, int | None] = {}

    def expr(self, raw: Any, where: str) -> Any:
        spec = as_dict(raw, where)
        expr = parse_expr(spec.get("expr_str"), f"{where}/expr_str")
        self._collect(expr)
        hint = spec.get("hint")
        if isinstance(expr, str) and hint is not None:
            tag, value = _union(hint, f"{where}/hint")
            if tag == "as_int":
                self.names[expr] = as_int(value, f"{where}/hint")
        return expr

    def _collect(self, expr: Any) -> None:
        if isinstance(expr, str) and expr not in ("oo", "-oo"):
            self.names.setdefault(expr, None)
        elif isinstance(expr, list) and expr and expr[0] not in ("q", "f"):
            for a in expr[1:]:
                self._collect(a)


class _GraphDecoder:
    """One torch graph -> our graph_module JSON (nodes and submodules)."""

    def __init__(self, raw: Any, where: str, symbols: _Symbols) -> None:
        self.where, self.symbols = where, symbols
        self.spec = as_dict(raw, where)
        self.nodes: list[dict[str, Any]] = []
        self.submodules: dict[str, Any] = {}
        self.vals: dict[str, Any] = {}
        self.meta: dict[str, Any] = {}
        self.alias: dict[str, Any] = {}  # value name -> argument JSON (inlined bodies)
        self._values()

    # -- values -------------------------------------------------------------------------

    def _size(self, raw: Any, where: str) -> Any:
        tag, value = _union(raw, where)
        if tag == "as_int":
            return as_int(value, where)
        if tag == "as_expr":
            return {"sym": self.symbols.expr(value, where)}
        fail(where, f"unknown size kind {tag!r:.40}")

    def _fake(self, raw: Any, where: str) -> dict[str, Any]:
        meta = as_dict(raw, where)
        sizes = as_list(meta.get("sizes"), f"{where}/sizes")
        if len(sizes) > LIMITS.max_rank:
            fail(f"{where}/sizes", f"rank {len(sizes)} exceeds {LIMITS.max_rank}")
        code = meta.get("dtype")
        dtype = _DTYPES.get(code) if type(code) is int else None
        if dtype is None:
            fail(f"{where}/dtype", f"unknown scalar type code {meta.get('dtype')!r:.20}")
        if meta.get("layout", 7) != 7:
            fail(f"{where}/layout", "only strided tensors are supported")
        device = as_dict(meta.get("device"), f"{where}/device")
        index = device.get("index")
        dev = as_str(device.get("type"), f"{where}/device/type")
        if index is not None:
            dev = f"{dev}:{as_int(index, f'{where}/device/index', lo=0, hi=1 << 16)}"
        return {"fake": {
            "dtype": dtype, "device": dev,
            "shape": [self._size(s, f"{where}/sizes/{i}") for i, s in enumerate(sizes)],
            "stride": [self._size(s, f"{where}/strides/{i}")
                       for i, s in enumerate(as_list(meta.get("strides"), f"{where}/strides"))],
            "storage_offset": self._size(meta.get("storage_offset"), f"{where}/storage_offset"),
            "requires_grad": as_bool(meta.get("requires_grad", False), f"{where}/requires_grad"),
        }}

    def _sym(self, raw: Any, where: str, kind: str) -> dict[str, Any]:
        tag, value = _union(raw, where)
        if tag == "as_expr":
            return {kind: self.symbols.expr(value, where)}
        plain = {"symint": "int", "symbool": "bool", "symfloat": "float"}[kind]
        return {plain: _FLOATS.get(value, value) if plain == "float" else value}

    def _values(self) -> None:
        w = self.where
        for name, meta in as_dict(self.spec.get("tensor_values", {}), f"{w}/tensor_values").items():
            self.vals[_ident(name, f"{w}/tensor_values")] = self._fake(
                meta, f"{w}/tensor_values/{name}")
        for key, kind in (("sym_int_values", "symint"), ("sym_bool_values", "symbool"),
                          ("sym_float_values", "symfloat")):
            for name, raw in as_dict(self.spec.get(key, {}), f"{w}/{key}").items():
                self.vals[_ident(name, f"{w}/{key}")] = self._sym(raw, f"{w}/{key}/{name}", kind)
        if as_dict(self.spec.get("custom_obj_values", {}), f"{w}/custom_obj_values"):
            fail(f"{w}/custom_obj_values", "custom objects (torchbind) are not supported")

    def val(self, name: str, where: str) -> Any:
        if name not in self.vals:
            fail(where, f"value {name!r:.60} has no entry in tensor_values / sym_*_values")
        return self.vals[name]

    # -- arguments ----------------------------------------------------------------------

    def ref(self, name: Any, where: str) -> dict[str, Any]:
        name = _ident(name, where)
        return self.alias.get(name) or {"node": name}

    def arg(self, raw: Any, where: str) -> dict[str, Any]:
        tag, v = _union(raw, where)
        at = f"{where}/{tag}"
        handler = _ARGS.get(tag)
        if handler is None:
            fail(at, f"argument kind {tag!r:.40} is not supported")
        return handler(self, v, at)

    def graph_arg(self, v: Any, where: str) -> dict[str, Any]:
        spec = as_dict(v, where)
        name = _ident(spec.get("name"), f"{where}/name")
        if name not in self.submodules:
            sub = _GraphDecoder(spec.get("graph"), f"{where}/graph", self.symbols)
            self.submodules[name] = sub.module()
            self.nodes.append(_node(name, "get_attr", name, [], {}, {}))
        return {"node": name}

    # -- nodes --------------------------------------------------------------------------

    def outputs(self, node_name: str, outs: list[Any], where: str, hop_single: Any) -> None:
        """Names the node's results; appends getitem nodes for each listed output."""
        if not outs:
            return
        if len(outs) == 1 and hop_single is not False:
            tag, v = _union(outs[0], f"{where}/0")
            if tag in ("as_tensor", "as_sym_int", "as_sym_bool", "as_sym_float", "as_none"):
                return  # the node itself is the value (named node_name)
        items = outs
        if len(outs) == 1 and _union(outs[0], f"{where}/0")[0] == "as_tensors" and hop_single is None:
            items = [{"as_tensor": t} for t in _union(outs[0], f"{where}/0")[1]]
        for i, raw in enumerate(items):
            tag, v = _union(raw, f"{where}/{i}")
            if tag == "as_none":
                continue
            if tag == "as_tensors":
                inner = f"{node_name}_list_{i}"
                vals = []
                self.nodes.append(_node(inner, "call_function", "operator.getitem",
                                        [{"node": node_name}, {"int": i}], {}, dict(self.meta)))
                for j, t in enumerate(as_list(v, f"{where}/{i}")):
                    name = _ident(as_dict(t, f"{where}/{i}/{j}").get("name"), where)
                    vals.append(self.val(name, f"{where}/{i}/{j}"))
                    self.nodes.append(_node(name, "call_function", "operator.getitem",
                                            [{"node": inner}, {"int": j}], {},
                                            {**self.meta, "val": self.val(name, where)}))
                self.nodes[-len(vals) - 1]["meta"]["val"] = {"list": vals}
                continue
            name = _value_name(tag, v, f"{where}/{i}")
            self.nodes.append(_node(name, "call_function", "operator.getitem",
                                    [{"node": node_name}, {"int": i}], {},
                                    {**self.meta, "val": self.val(name, f"{where}/{i}")}))

    def node_val(self, outs: list[Any], where: str, hop_single: Any) -> Any:
        if not outs:
            return {"none": None}
        if len(outs) == 1 and hop_single is not False:
            tag, v = _union(outs[0], where)
            if tag == "as_none":
                return {"none": None}
            if tag != "as_tensors":
                return self.val(_value_name(tag, v, where), where)
        items = outs
        if len(outs) == 1 and _union(outs[0], where)[0] == "as_tensors" and hop_single is None:
            return {"list": [self.val(as_dict(t, where).get("name"), where)
                             for t in _union(outs[0], where)[1]]}
        out = []
        for raw in items:
            tag, v = _union(raw, where)
            if tag == "as_none":
                out.append({"none": None})
            elif tag == "as_tensors":
                out.append({"list": [self.val(as_dict(t, where).get("name"), where) for t in v]})
            else:
                out.append(self.val(_value_name(tag, v, where), where))
        return {"tuple": out}

    def call(self, raw: Any, index: int) -> None:
        where = f"{self.where}/nodes/{index}"
        spec = as_dict(raw, where)
        target_text = _target(spec.get("target"), f"{where}/target")
        if target_text in _INLINED:
            self.inline(spec, where)
            return
        target = resolve_target(target_text, f"{where}/target")
        outs = as_list(spec.get("outputs", []), f"{where}/outputs")
        hop_single = spec.get("is_hop_single_tensor_return")
        name = spec.get("name") or _first_name(outs, where) or f"node_{index}"
        name = _ident(name, f"{where}/name")
        args, kwargs = self.inputs(target, as_list(spec.get("inputs", []), f"{where}/inputs"),
                                   f"{where}/inputs")
        meta = _metadata(spec.get("metadata", {}), f"{where}/metadata")
        self.meta = {k: v for k, v in meta.items() if k != "torch_fn"}
        meta["val"] = self.node_val(outs, f"{where}/outputs", hop_single)
        self.nodes.append(_node(name, "call_function", target_text, args, kwargs, meta))
        self.outputs(name, outs, f"{where}/outputs", hop_single)

    def inline(self, spec: dict[str, Any], where: str) -> None:
        """torch's training IR wraps ``torch.no_grad()`` / autocast regions in
        ``wrap_with_set_grad_enabled`` / ``wrap_with_autocast`` calls of a body graph; the ATen
        dialect has no such op (grad mode does not change what a functional graph computes), so
        the body's nodes are put in place of the call, as torch's run_decompositions does."""
        inputs = [as_dict(x, f"{where}/inputs/{i}")
                  for i, x in enumerate(as_list(spec.get("inputs", []), f"{where}/inputs"))]
        tags = [_union(x.get("arg"), f"{where}/inputs/{i}/arg")[0] for i, x in enumerate(inputs)]
        if "as_graph" not in tags:
            fail(f"{where}/inputs", "a wrapped region without its body graph (as_graph)")
        pos = tags.index("as_graph")
        body = as_dict(_union(inputs[pos]["arg"], where)[1], f"{where}/inputs/{pos}/arg")
        outer = [self.arg(x.get("arg"), f"{where}/inputs/{pos + 1 + i}/arg")
                 for i, x in enumerate(inputs[pos + 1:])]
        child = _GraphDecoder(body.get("graph"), f"{where}/inputs/{pos}/graph", self.symbols)
        params = as_list(child.spec.get("inputs", []), f"{child.where}/inputs")
        if len(params) != len(outer):
            fail(f"{where}/inputs", f"the body takes {len(params)} inputs, the call passes "
                                    f"{len(outer)}")
        for i, (raw, value) in enumerate(zip(params, outer)):
            tag, v = _union(raw, f"{child.where}/inputs/{i}")
            child.alias[_ident(_value_name(tag, v, child.where), child.where)] = value
        for i, raw in enumerate(as_list(child.spec.get("nodes", []), f"{child.where}/nodes")):
            child.call(raw, i)
        results = [child.arg(r, f"{child.where}/outputs/{i}") for i, r in
                   enumerate(as_list(child.spec.get("outputs", []), f"{child.where}/outputs"))]
        outs = as_list(spec.get("outputs", []), f"{where}/outputs")
        if len(outs) == 1 and _union(outs[0], where)[0] == "as_tensors":
            outs = [{"as_tensor": t} for t in _union(outs[0], where)[1]]
        names = [None if _union(o, where)[0] == "as_none" else
                 _ident(_value_name(*_union(o, f"{where}/outputs/{i}"), where), where)
                 for i, o in enumerate(outs)]
        self._splice(child, dict(zip(names, results)), where)

    def _splice(self, child: _GraphDecoder, results: dict[Any, Any], where: str) -> None:
        """Append ``child``'s nodes, named so that each result node takes the name the call's
        output had and no other name collides with this graph's."""
        taken = {n["name"] for n in self.nodes} | set(self.vals) | set(self.alias)
        renames: dict[str, str] = {}
        for outer, value in results.items():
            inner = value.get("node") if isinstance(value, dict) else None
            if outer is None:
                continue
            if inner is not None and inner not in child.alias and inner not in renames:
                renames[inner] = outer
            else:
                self.alias[outer] = value
        for n in child.nodes:
            if n["name"] in renames:
                continue
            fresh, k = n["name"], 1
            while fresh in taken or fresh in renames.values():
                fresh, k = f"{n['name']}_{k}", k + 1
            renames[n["name"]] = fresh
        for n in child.nodes:
            n["name"] = renames[n["name"]]
            n["args"] = _renamed(n["args"], renames)
            n["kwargs"] = _renamed(n["kwargs"], renames)
            self.nodes.append(n)
        self.submodules.update(child.submodules)

    def inputs(self, target: Any, raw: list[Any], where: str) -> tuple[list, dict]:
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        named = {}
        for i, item in enumerate(raw):
            spec = as_dict(item, f"{where}/{i}")
            value = self.arg(spec.get("arg"), f"{where}/{i}/arg")
            kind = spec.get("kind")
            pname = spec.get("name") or ""
            if not isinstance(target, OpOverload):
                if kind == 2 and pname:
                    kwargs[check_identifier(pname, f"{where}/{i}/name")] = value
                else:
                    args.append(value)
                continue
            named[as_str(pname, f"{where}/{i}/name")] = (value, kind)
        if isinstance(target, OpOverload):
            known = {a.name for a in target._schema.arguments}
            unknown = sorted(set(named) - known)
            if unknown:
                fail(where, f"{target} has no argument named {unknown[0]!r:.40}")
            for a in target._schema.arguments:
                if a.name not in named:
                    continue
                value, kind = named[a.name]
                positional = kind == 1 if kind in (1, 2) else (
                    not a.kwarg_only and not a.has_default_value())
                if positional and not kwargs and not a.kwarg_only:
                    args.append(value)
                else:
                    kwargs[a.name] = value
        return args, kwargs

    def module(self, constant_names: dict[int, str] | None = None) -> dict[str, Any]:
        """``constant_names``: input position -> name of the constant inputs (the signature's
        ``constant_input`` specs name them; the graph lists only their values)."""
        w = self.where
        for i, raw in enumerate(as_list(self.spec.get("inputs", []), f"{w}/inputs")):
            at = f"{w}/inputs/{i}"
            tag, v = _union(raw, at)
            if tag in _CONSTANT_INPUTS:
                name = _ident((constant_names or {}).get(i) or f"arg{i}", at)
                self.nodes.append(_node(name, "placeholder", name, [], {},
                                        {"val": self.arg(raw, at)}))
                continue
            if tag not in ("as_tensor", "as_sym_int", "as_sym_bool", "as_sym_float"):
                fail(at, f"graph input kind {tag!r:.40} is not supported")
            name = _ident(_value_name(tag, v, at), at)
            self.nodes.append(_node(name, "placeholder", name, [], {}, {"val": self.val(name, at)}))
        raw_nodes = as_list(self.spec.get("nodes", []), f"{w}/nodes")
        if len(raw_nodes) > LIMITS.max_entries * 64:
            fail(f"{w}/nodes", f"{len(raw_nodes)} nodes exceed the limit")
        for i, raw in enumerate(raw_nodes):
            self.call(raw, i)
        results = [self.arg(r, f"{w}/outputs/{i}")
                   for i, r in enumerate(as_list(self.spec.get("outputs", []), f"{w}/outputs"))]
        single = self.spec.get("is_single_tensor_return") is True and len(results) == 1
        self.nodes.append(_node("output", "output", "output",
                                [results[0] if single else {"tuple": results}], {}, {}))
        return {"nodes": self.nodes, "submodules": self.submodules}


_INLINED = frozenset({"higher_order::wrap_with_set_grad_enabled",
                      "higher_order::wrap_with_autocast"})


def _renamed(value: Any, renames: dict[str, str]) -> Any:
    if isinstance(value, dict):
        if set(value) == {"node"} and value["node"] in renames:
            return {"node": renames[value["node"]]}
        return {k: _renamed(v, renames) for k, v in value.items()}
    if isinstance(value, list):
        return [_renamed(v, renames) for v in value]
    return value


def _value_name(tag: str, v: Any, where: str) -> str:
    if tag == "as_tensor":
        return _ident(as_dict(v, where).get("name"), where)
    if tag in ("as_sym_int", "as_sym_bool", "as_sym_float"):
        itag, name = _union(v, where)
        if itag != "as_name":
            fail(where, f"expected a named symbolic value, got {itag!r:.40}")
        return _ident(name, where)
    fail(where, f"output kind {tag!r:.40} is not supported")


def _first_name(outs: list[Any], where: str) -> str | None:
    if len(outs) != 1:
        return None
    tag, v = _union(outs[0], where)
    if tag in ("as_tensor", "as_sym_int", "as_sym_bool", "as_sym_float"):
        return _value_name(tag, v, where)
    return None


def _target(text: Any, where: str) -> str:
    """torch's ``torch.ops.ns.op.overload`` / ``_operator.add`` -> the name our table keys."""
    name = as_str(text, where)
    if name.startswith("torch.ops."):
        parts = name[len("torch.ops."):].split(".")
        if parts[0] == "higher_order" and len(parts) == 2:
            return f"higher_order::{parts[1]}"
        if len(parts) == 3:
            return f"{parts[0]}::{parts[1]}.{parts[2]}"
        fail(where, f"malformed operator name {name!r:.120}")
    module, _, fn = name.rpartition(".")
    ours = _PY_MODULES.get(module)
    if ours is None:
        fail(where, f"call target {name!r:.120} is not one a .pt2 graph may call (torch.ops "
                    "operators, higher-order cond/map/while_loop, and symbolic arithmetic)")
    return f"{ours}.{fn}"


def _metadata(raw: Any, where: str) -> dict[str, Any]:
    spec = as_dict(raw, where)
    out: dict[str, Any] = {}
    if "stack_trace" in spec:
        out["stack_trace"] = as_str(spec["stack_trace"], f"{where}/stack_trace")
    if "nn_module_stack" in spec:
        stack = {}
        for item in as_str(spec["nn_module_stack"], f"{where}/nn_module_stack").split(";"):
            key, _, rest = item.partition(",")
            path, _, kind = rest.rpartition(",")  # "key,path,type"
            stack[key] = [path, kind]
        out["nn_module_stack"] = stack
    if "torch_fn" in spec:
        pair = as_str(spec["torch_fn"], f"{where}/torch_fn").split(";")
        if len(pair) == 2:
            out["torch_fn"] = pair
    return out


def _node(name: str, op: str, target: str, args: list, kwargs: dict, meta: dict) -> dict:
    if op == "call_function":  # torch leaves these out when empty; the contract wants them
        meta.setdefault("stack_trace", "")
        meta.setdefault("nn_module_stack", {})
    return {"name": name, "op": op, "target": target, "args": args, "kwargs": kwargs,
            "meta": meta}


def _scalar(kind: str) -> Any:
    return lambda d, v, w: {kind: _FLOATS.get(v, v) if kind == "float" else v}


def _seq(kind: str) -> Any:
    return lambda d, v, w: {"list": [{kind: _FLOATS.get(x, x) if kind == "float" else x}
                                     for x in as_list(v, w)]}


def _sym_arg(d: _GraphDecoder, v: Any, w: str) -> dict[str, Any]:
    tag, x = _union(v, w)
    if tag == "as_name":
        return d.ref(x, w)
    kind = {"as_int": "int", "as_bool": "bool", "as_float": "float"}.get(tag)
    if kind is None:
        fail(w, f"unknown symbolic argument kind {tag!r:.40}")
    return {kind: _FLOATS.get(x, x) if kind == "float" else x}


def _opt_tensor(d: _GraphDecoder, v: Any, w: str) -> dict[str, Any]:
    tag, x = _union(v, w)
    return {"none": None} if tag == "as_none" else d.ref(as_dict(x, w).get("name"), w)


def _table(table: dict[int, str], kind: str) -> Any:
    def dec(d: _GraphDecoder, v: Any, w: str) -> dict[str, Any]:
        found = table.get(v) if type(v) is int else None
        if found is None:
            fail(w, f"unknown {kind} code {v!r:.20}")
        return {kind: found}
    return dec


def _device(d: _GraphDecoder, v: Any, w: str) -> dict[str, Any]:
    spec = as_dict(v, w)
    text = as_str(spec.get("type"), f"{w}/type")
    if spec.get("index") is not None:
        text = f"{text}:{as_int(spec['index'], f'{w}/index', lo=0, hi=1 << 16)}"
    return {"device": text}


_ARGS: dict[str, Any] = {
    "as_none": lambda d, v, w: {"none": None},
    "as_tensor": lambda d, v, w: d.ref(as_dict(v, w).get("name"), w),
    "as_tensors": lambda d, v, w: {"list": [d.ref(as_dict(t, w).get("name"), w)
                                            for t in as_list(v, w)]},
    "as_int": _scalar("int"), "as_float": _scalar("float"), "as_bool": _scalar("bool"),
    "as_string": _scalar("str"),
    "as_ints": _seq("int"), "as_floats": _seq("float"), "as_bools": _seq("bool"),
    "as_strings": _seq("str"),
    "as_sym_int": _sym_arg, "as_sym_bool": _sym_arg, "as_sym_float": _sym_arg,
    "as_sym_ints": lambda d, v, w: {"list": [_sym_arg(d, x, w) for x in as_list(v, w)]},
    "as_sym_bools": lambda d, v, w: {"list": [_sym_arg(d, x, w) for x in as_list(v, w)]},
    "as_sym_floats": lambda d, v, w: {"list": [_sym_arg(d, x, w) for x in as_list(v, w)]},
    "as_optional_tensors": lambda d, v, w: {"list": [_opt_tensor(d, x, w)
                                                     for x in as_list(v, w)]},
    "as_optional_tensor": _opt_tensor,
    "as_scalar_type": _table(_DTYPES, "dtype"),
    "as_layout": _table(_LAYOUTS, "layout"),
    "as_memory_format": _table(_MEMORY_FORMATS, "memory_format"),
    "as_device": _device,
    "as_graph": _GraphDecoder.graph_arg,
    "as_complex": lambda d, v, w: {"complex": [as_dict(v, w).get("real"),
                                               as_dict(v, w).get("imag")]},
    "as_int_lists": lambda d, v, w: {"list": [_seq("int")(d, x, w) for x in as_list(v, w)]},
    "as_operator": lambda d, v, w: {"op": _target(v, w)},
}


# --------------------------------------------------------------------------- program


def _spec_arg(raw: Any, where: str) -> dict[str, Any]:
    tag, v = _union(raw, where)
    if tag == "as_tensor":
        return {"tensor": _value_name(tag, v, where)}
    if tag in ("as_sym_int", "as_sym_bool", "as_sym_float"):
        return {tag[3:]: _value_name(tag, v, where)}
    scalar = {"as_none": "none", "as_int": "int", "as_float": "float", "as_bool": "bool",
              "as_string": "str"}.get(tag)
    if scalar is None:
        fail(where, f"argument kind {tag!r:.40} is not supported here")
    return {"constant": {"name": "", "value": {scalar: None if scalar == "none" else v}}}


def _signature(raw: Any, where: str) -> dict[str, Any]:
    spec = as_dict(raw, where)
    inputs, outputs = [], []
    for i, item in enumerate(as_list(spec.get("input_specs"), f"{where}/input_specs")):
        at = f"{where}/input_specs/{i}"
        tag, v = _union(item, at)
        body = as_dict(v, f"{at}/{tag}")
        if tag == "user_input":
            inputs.append({"kind": "USER_INPUT", "arg": _spec_arg(body.get("arg"), at),
                           "target": None, "persistent": None})
        elif tag in _INPUTS:
            kind, field = _INPUTS[tag]
            persistent = as_bool(body.get("persistent", True), at) if kind == "BUFFER" else None
            inputs.append({"kind": kind, "arg": {"tensor": _name(body.get("arg"), at)},
                           "target": as_str(body.get(field), f"{at}/{field}"),
                           "persistent": persistent})
        elif tag == "token":
            inputs.append({"kind": "TOKEN", "arg": {"token": _name(body.get("arg"), at)},
                           "target": None, "persistent": None})
        elif tag == "constant_input":
            value = _spec_arg(body.get("value"), f"{at}/value")
            value["constant"]["name"] = _ident(body.get("name"), f"{at}/name")
            inputs.append({"kind": "USER_INPUT", "arg": value, "target": None,
                           "persistent": None})
        else:
            fail(at, f"input kind {tag!r:.40} is not supported (custom objects and constant "
                     "inputs are not read)")
    for i, item in enumerate(as_list(spec.get("output_specs"), f"{where}/output_specs")):
        at = f"{where}/output_specs/{i}"
        tag, v = _union(item, at)
        body = as_dict(v, f"{at}/{tag}")
        if tag == "user_output":
            outputs.append({"kind": "USER_OUTPUT", "arg": _spec_arg(body.get("arg"), at),
                            "target": None})
        elif tag == "loss_output":
            outputs.append({"kind": "LOSS_OUTPUT", "arg": {"tensor": _name(body.get("arg"), at)},
                            "target": None})
        elif tag in _OUTPUTS:
            kind, field = _OUTPUTS[tag]
            outputs.append({"kind": kind, "arg": {"tensor": _name(body.get("arg"), at)},
                            "target": as_str(body.get(field), f"{at}/{field}")})
        elif tag == "token":
            outputs.append({"kind": "TOKEN", "arg": {"token": _name(body.get("arg"), at)},
                            "target": None})
        else:
            fail(at, f"output kind {tag!r:.40} is not supported")
    return {"input_specs": inputs, "output_specs": outputs}


def _name(raw: Any, where: str) -> str:
    return _ident(as_dict(raw, where).get("name"), f"{where}/name")


def _call_graph(raw: Any, where: str) -> list[Any]:
    out = []
    for i, item in enumerate(as_list(raw, where)):
        at = f"{where}/{i}"
        entry = as_dict(item, at)
        sig = entry.get("signature")
        if sig is not None:
            s = as_dict(sig, f"{at}/signature")
            sig = {
                "inputs": [_spec_arg(a, f"{at}/signature/inputs/{k}")
                           for k, a in enumerate(as_list(s.get("inputs"), f"{at}/inputs"))],
                "outputs": [_spec_arg(a, f"{at}/signature/outputs/{k}")
                            for k, a in enumerate(as_list(s.get("outputs"), f"{at}/outputs"))],
                "in_spec": s.get("in_spec"), "out_spec": s.get("out_spec"),
                "forward_arg_names": s.get("forward_arg_names"),
            }
        out.append({"fqn": entry.get("fqn"), "signature": sig})
    return out


_SYMBOL_KEY = re.compile(r"(s|u|zuf)[0-9]{1,9}\Z")


def _ranges(raw: Any, where: str) -> tuple[dict[str, list[str]], dict[str, tuple[Any, list[str]]]]:
    """(ranges of plain symbols by name, {key: (JSON expression, range)} of derived sizes such
    as ``s0 + 1``, whose keys are sympy ``str`` text: parsed, never evaluated)."""
    plain, derived = {}, {}
    for name, item in as_dict(raw, where).items():
        spec = as_dict(item, f"{where}/{name}")
        lo, hi = spec.get("min_val"), spec.get("max_val")
        bounds = ["-oo" if lo is None else str(as_int(lo, f"{where}/{name}/min_val")),
                  "oo" if hi is None else str(as_int(hi, f"{where}/{name}/max_val"))]
        if _SYMBOL_KEY.match(name):
            plain[name] = bounds
        else:
            derived[name] = (parse_range_key(name, f"{where}/{name}"), bounds)
    return plain, derived


def _names(expr: Any) -> set[str]:
    if isinstance(expr, str):
        return set() if expr in ("oo", "-oo") else {expr}
    if isinstance(expr, list) and expr and expr[0] not in ("q", "f"):
        return set().union(*(_names(a) for a in expr[1:]))
    return set()


def _range_constraints(order: list[str], ranges: dict[str, list[str]],
                       derived: dict[str, list[Any]], where: str, symbols: Any) -> dict[Any, Any]:
    """The range constraints, in the file's key order."""
    plain = decode_range_constraints(ranges, where, symbols)
    by_name = {str(k): (k, v) for k, v in plain.items()}
    out: dict[Any, Any] = {}
    for key in order:
        if key in derived:
            out.update(decode_range_constraints({}, f"{where}/{key}", symbols, [derived[key]]))
        elif key in by_name:
            out.setdefault(by_name[key][0], by_name[key][1])
    return out


def _shape_env(symbols: _Symbols, ranges: dict[str, list[str]]) -> dict[str, Any]:
    entries = []
    for name, hint in sorted(symbols.names.items()):
        lo, hi = ranges.get(name, ["-oo", "oo"] if not name.startswith("s") else ["2", "oo"])
        lo_v = lo if lo in ("-oo", "oo") else int(lo)
        hi_v = hi if hi in ("-oo", "oo") else int(hi)
        if name.startswith("s") and isinstance(lo_v, int) and lo_v < 2 and (
                hint is None or hint >= 2) and (hi_v == "oo" or hi_v >= 2):
            lo_v = 2  # as export's ShapeEnv: 0 and 1 are specialized, not symbolic
        if name.startswith("s") and lo_v == "-oo":
            lo_v = 0
        entries.append({"name": name, "hint": hint, "range": [lo_v, hi_v], "sources": [],
                        "dim": None, "size_like": False})
    return {"symbols": entries, "replacements": [], "guards": [], "runtime_asserts": []}


def _check_version(model: dict[str, Any], where: str) -> None:
    version = as_dict(model.get("schema_version"), f"{where}/schema_version")
    major = as_int(version.get("major"), f"{where}/schema_version/major")
    if major != SCHEMA_VERSION["major"]:
        fail(f"{where}/schema_version/major",
             f"schema version {major} is not supported; this exportir reads torch's serialized "
             f"program schema {SCHEMA_VERSION['major']}.x (torch 2.13)")


def decode_torch_program(
    model: Any, state: dict[str, torch.Tensor], constants: dict[str, Any],
    where: str = "models/model.json", example_inputs: Any = None,
) -> ExportedProgram:
    """Our ExportedProgram for torch's serialized-program JSON object and its tensors."""
    root = as_dict(model, where)
    _check_version(root, where)
    gm_raw = as_dict(root.get("graph_module"), f"{where}/graph_module")
    symbols = _Symbols()
    sig_json = _signature(gm_raw.get("signature"), f"{where}/graph_module/signature")
    constant_names = {i: s["arg"]["constant"]["name"] for i, s in enumerate(sig_json["input_specs"])
                      if "constant" in s["arg"]}
    graph_json = _GraphDecoder(gm_raw.get("graph"), f"{where}/graph_module/graph",
                               symbols).module(constant_names)
    ranges, derived = _ranges(root.get("range_constraints", {}), f"{where}/range_constraints")
    # as torch's reader: a range of a symbol the graph does not hold is dropped
    ranges = {k: v for k, v in ranges.items() if k in symbols.names}
    derived = {k: [e, b] for k, (e, b) in derived.items()
               if _names(e) and _names(e) <= symbols.names.keys()}
    shapes = decode_shape_env(_shape_env(symbols, ranges), f"{where}/range_constraints") \
        if symbols.names else None
    gm = decode_graph_module(graph_json, f"{where}/graph_module/graph", shapes)
    signature = decode_signature(sig_json, f"{where}/graph_module/signature")
    call_graph = decode_module_call_graph(
        _call_graph(gm_raw.get("module_call_graph", []), f"{where}/graph_module/module_call_graph"),
        f"{where}/graph_module/module_call_graph")
    range_constraints = _range_constraints(list(root.get("range_constraints", {})), ranges,
                                           derived, f"{where}/range_constraints",
                                           shapes[1] if shapes else None)
    return to_aten_dialect(gm, signature, state, range_constraints, call_graph, constants,
                           where, example_inputs)
