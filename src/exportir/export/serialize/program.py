"""JSON codecs for the non-graph parts of an ExportedProgram.

The graph signature, the module call graph (with the in/out TreeSpecs as
``exportir.pytree.treespec_dumps`` text), range constraints (symbol name -> bounds as strings),
the description of each saved tensor (its data lives in a tensor container), and the example
inputs (a TreeSpec plus one entry per leaf).
"""

from __future__ import annotations

import collections
import enum
import json
import re
from dataclasses import dataclass
from typing import Any

import torch

from exportir import pytree
from exportir.export.serialize.common import (
    SerializationError,
    as_bool,
    as_dict,
    as_list,
    as_str,
    check_identifier,
    check_keys,
    fail,
    guarded,
    loads_json,
)
from exportir.export.serialize.values import Decoder, encode_value
from exportir.export.signature import (
    ConstantArgument,
    CustomObjArgument,
    ExportGraphSignature,
    InputKind,
    InputSpec,
    ModuleCallEntry,
    ModuleCallSignature,
    OutputKind,
    OutputSpec,
    SymBoolArgument,
    SymFloatArgument,
    SymIntArgument,
    TensorArgument,
    TokenArgument,
)

__all__ = [
    "TensorInfo",
    "decode_example_inputs",
    "decode_module_call_graph",
    "decode_range_constraints",
    "decode_signature",
    "decode_tensor_infos",
    "encode_derived_ranges",
    "encode_example_inputs",
    "encode_module_call_graph",
    "encode_range_constraints",
    "encode_signature",
    "encode_tensor_infos",
    "rebuild_tensors",
]


# --------------------------------------------------------------------------- argument specs

_NAMED_ARGS: dict[str, type] = {
    "tensor": TensorArgument,
    "sym_int": SymIntArgument,
    "sym_float": SymFloatArgument,
    "sym_bool": SymBoolArgument,
    "token": TokenArgument,
}
_NAMED_TAGS = {cls: tag for tag, cls in _NAMED_ARGS.items()}


def _enc_arg(arg: Any, where: str) -> dict[str, Any]:
    tag = _NAMED_TAGS.get(type(arg))
    if tag is not None:
        return {tag: arg.name}
    if isinstance(arg, ConstantArgument):
        return {"constant": {"name": arg.name, "value": encode_value(arg.value, where)}}
    if isinstance(arg, CustomObjArgument):
        return {"custom_obj": {"name": arg.name, "class_fqn": arg.class_fqn}}
    fail(where, f"unknown argument spec {arg!r:.80}")


def _dec_arg(raw: Any, where: str) -> Any:
    spec = as_dict(raw, where)
    if len(spec) != 1:
        fail(where, "an argument spec must be a one-key object")
    ((tag, payload),) = spec.items()
    at = f"{where}/{tag}"
    if tag in _NAMED_ARGS:
        return _NAMED_ARGS[tag](as_str(payload, at))
    body = as_dict(payload, at)
    if tag == "constant":
        check_keys(body, {"name", "value"}, set(), at)
        value = Decoder({}).value(body["value"], f"{at}/value")
        return ConstantArgument(as_str(body["name"], f"{at}/name"), value)
    if tag == "custom_obj":
        check_keys(body, {"name", "class_fqn"}, set(), at)
        return CustomObjArgument(as_str(body["name"], f"{at}/name"),
                                 as_str(body["class_fqn"], f"{at}/class_fqn"))
    fail(where, f"unknown argument spec tag {tag!r:.40}")


def _kind(enum: type, raw: Any, where: str) -> Any:
    text = as_str(raw, where)
    if text not in enum.__members__:
        fail(where, f"unknown {enum.__name__} {text!r:.40}; expected one of {list(enum.__members__)}")
    return enum[text]


def _opt_str(raw: Any, where: str) -> str | None:
    return None if raw is None else as_str(raw, where)


# --------------------------------------------------------------------------- signature


def encode_signature(sig: ExportGraphSignature, where: str) -> dict[str, Any]:
    return {
        "input_specs": [
            {"kind": s.kind.name, "arg": _enc_arg(s.arg, f"{where}/input_specs/{i}"),
             "target": s.target, "persistent": s.persistent}
            for i, s in enumerate(sig.input_specs)],
        "output_specs": [
            {"kind": s.kind.name, "arg": _enc_arg(s.arg, f"{where}/output_specs/{i}"),
             "target": s.target}
            for i, s in enumerate(sig.output_specs)],
    }


def _dec_input_spec(raw: Any, where: str) -> InputSpec:
    spec = as_dict(raw, where)
    check_keys(spec, {"kind", "arg", "target", "persistent"}, set(), where)
    persistent = None if spec["persistent"] is None else as_bool(spec["persistent"], f"{where}/persistent")
    return guarded(where, lambda: InputSpec(
        _kind(InputKind, spec["kind"], f"{where}/kind"), _dec_arg(spec["arg"], f"{where}/arg"),
        _opt_str(spec["target"], f"{where}/target"), persistent), "invalid input spec")


def _dec_output_spec(raw: Any, where: str) -> OutputSpec:
    spec = as_dict(raw, where)
    check_keys(spec, {"kind", "arg", "target"}, set(), where)
    return guarded(where, lambda: OutputSpec(
        _kind(OutputKind, spec["kind"], f"{where}/kind"), _dec_arg(spec["arg"], f"{where}/arg"),
        _opt_str(spec["target"], f"{where}/target")), "invalid output spec")


def decode_signature(raw: Any, where: str) -> ExportGraphSignature:
    spec = as_dict(raw, where)
    check_keys(spec, {"input_specs", "output_specs"}, set(), where)
    ins = [_dec_input_spec(s, f"{where}/input_specs/{i}")
           for i, s in enumerate(as_list(spec["input_specs"], f"{where}/input_specs"))]
    outs = [_dec_output_spec(s, f"{where}/output_specs/{i}")
            for i, s in enumerate(as_list(spec["output_specs"], f"{where}/output_specs"))]
    return ExportGraphSignature(ins, outs)


# --------------------------------------------------------------------------- tree specs

# defaultdict factories a loaded spec may name (anything else could be arbitrary code): the
# same allowlist treespec_loads enforces, checked here first so the error names the field.
_SAFE_FACTORIES = frozenset(pytree.SAFE_DEFAULTDICT_FACTORIES)


def _check_enum_ref(obj: dict[str, Any]) -> dict[str, Any]:
    if "__enum__" in obj:
        module, _, qualname = str(obj.get("fqn", "")).partition(":")
        try:  # the lookup treespec_loads does: namespaces of loaded modules only, Enum classes
            pytree._resolve_loaded_class(module, qualname, "enum", enum.Enum)
        except pytree.TreeSpecSerializationError as e:
            raise SerializationError(f"enum {module}:{qualname} is not an already-imported "
                                     f"class; import it before loading ({e})") from None
    return obj


def _precheck_spec_node(node: Any, where: str) -> None:
    """Vet the names a TreeSpec node makes ``treespec_loads`` look up, before it looks them up.
    Defence in depth: ``treespec_loads`` enforces the same rules (same allowlist, same lookup);
    this layer reports them with the archive path."""
    if not isinstance(node, dict):
        return  # treespec_loads reports malformed nodes
    ctx = node.get("context")
    if node.get("type") == "collections.defaultdict" and isinstance(ctx, dict):
        factory = (ctx.get("default_factory_module"), ctx.get("default_factory_name"))
        if not all(isinstance(part, str) for part in factory) or factory not in _SAFE_FACTORIES:
            fail(where, f"defaultdict factory {factory!r:.80} is not allowed; allowed: "
                        f"{sorted(f'{m}.{n}' for m, n in _SAFE_FACTORIES)}")
    if isinstance(ctx, str) and "__enum__" in ctx:
        try:
            json.loads(ctx, object_hook=_check_enum_ref)
        except SerializationError as e:
            fail(where, str(e))
        except ValueError:
            pass  # treespec_loads reports bad context JSON
    children = node.get("children_spec")
    for child in children if isinstance(children, list) else ():
        _precheck_spec_node(child, where)


def encode_treespec(spec: pytree.TreeSpec, where: str) -> str:
    try:
        return pytree.treespec_dumps(spec)
    except (ValueError, NotImplementedError, TypeError) as e:
        fail(where, f"cannot save the TreeSpec {spec}: {e}")


def decode_treespec(raw: Any, where: str) -> pytree.TreeSpec:
    text = as_str(raw, where)
    decoded = loads_json(text.encode(), where)
    if isinstance(decoded, list) and len(decoded) == 2:
        _precheck_spec_node(decoded[1], where)
    try:
        spec = pytree.treespec_loads(text)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as e:
        fail(where, f"bad TreeSpec: {e}")
    _check_mapping_keys(spec, where)
    return spec


_MAPPING_TYPES = (dict, collections.OrderedDict, collections.defaultdict)
_KEY_TYPES = (str, int, float, bool, type(None))


def _check_mapping_keys(spec: pytree.TreeSpec, where: str) -> None:
    """A dict node's keys are strings, numbers, bools or None (what JSON holds): a list key
    would fail only when the spec is used (``unhashable type``)."""
    stack = [spec]
    while stack:
        node = stack.pop()
        if node.type in _MAPPING_TYPES:
            keys = node.context
            if node.type is collections.defaultdict:  # [default_factory, keys]
                keys = keys[1] if isinstance(keys, (list, tuple)) and len(keys) == 2 else ()
            for key in keys if isinstance(keys, (list, tuple)) else ():
                if not isinstance(key, _KEY_TYPES):
                    fail(where, f"bad TreeSpec: dict key {key!r:.60} is not a string, number, "
                                "bool or null")
        stack.extend(node.children_specs)


def _check_keyword_names(spec: pytree.TreeSpec, where: str) -> None:
    """The keyword-argument dict of a call signature's ``(args, kwargs)`` spec has identifier
    keys (they become parameter names of the generated ``forward``)."""
    if spec.type is tuple and spec.num_children == 2 and spec.child(1).type is dict:
        for i, key in enumerate(spec.child(1).context or ()):
            check_identifier(key, f"{where}/kwargs/{i}")


# --------------------------------------------------------------------------- module call graph


def _enc_call_signature(sig: ModuleCallSignature | None, where: str) -> Any:
    if sig is None:
        return None
    return {
        "inputs": [_enc_arg(a, f"{where}/inputs/{i}") for i, a in enumerate(sig.inputs)],
        "outputs": [_enc_arg(a, f"{where}/outputs/{i}") for i, a in enumerate(sig.outputs)],
        "in_spec": encode_treespec(sig.in_spec, f"{where}/in_spec"),
        "out_spec": encode_treespec(sig.out_spec, f"{where}/out_spec"),
        "forward_arg_names": None if sig.forward_arg_names is None else list(sig.forward_arg_names),
    }


def _dec_call_signature(raw: Any, where: str) -> ModuleCallSignature | None:
    if raw is None:
        return None
    spec = as_dict(raw, where)
    check_keys(spec, {"inputs", "outputs", "in_spec", "out_spec", "forward_arg_names"}, set(), where)
    names = spec["forward_arg_names"]
    if names is not None:
        names = [as_str(n, f"{where}/forward_arg_names/{i}")
                 for i, n in enumerate(as_list(names, f"{where}/forward_arg_names"))]
    return ModuleCallSignature(
        inputs=[_dec_arg(a, f"{where}/inputs/{i}")
                for i, a in enumerate(as_list(spec["inputs"], f"{where}/inputs"))],
        outputs=[_dec_arg(a, f"{where}/outputs/{i}")
                 for i, a in enumerate(as_list(spec["outputs"], f"{where}/outputs"))],
        in_spec=_call_in_spec(spec["in_spec"], f"{where}/in_spec"),
        out_spec=decode_treespec(spec["out_spec"], f"{where}/out_spec"),
        forward_arg_names=names,
    )


def _call_in_spec(raw: Any, where: str) -> pytree.TreeSpec:
    spec = decode_treespec(raw, where)
    _check_keyword_names(spec, where)
    return spec


def encode_module_call_graph(entries: list[ModuleCallEntry], where: str) -> list[Any]:
    return [{"fqn": e.fqn, "signature": _enc_call_signature(e.signature, f"{where}/{i}/signature")}
            for i, e in enumerate(entries)]


def decode_module_call_graph(raw: Any, where: str) -> list[ModuleCallEntry]:
    out: list[ModuleCallEntry] = []
    for i, item in enumerate(as_list(raw, where)):
        spec = as_dict(item, f"{where}/{i}")
        check_keys(spec, {"fqn", "signature"}, set(), f"{where}/{i}")
        out.append(ModuleCallEntry(as_str(spec["fqn"], f"{where}/{i}/fqn"),
                                   _dec_call_signature(spec["signature"], f"{where}/{i}/signature")))
    return out


# --------------------------------------------------------------------------- range constraints

_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
_BOUND = re.compile(r"-?(\d{1,40}|oo|int_oo)\Z")


def _bounds(sym: Any, vr: Any, where: str) -> list[str]:
    lower, upper = str(getattr(vr, "lower", "")), str(getattr(vr, "upper", ""))
    if not (_BOUND.match(lower) and _BOUND.match(upper)):
        fail(f"{where}/{sym}", f"cannot save range {sym}: {vr!r:.80} (expected integer or "
                               "infinite bounds)")
    return [lower, upper]


def encode_range_constraints(ranges: dict[Any, Any], where: str) -> dict[str, Any]:
    """Ranges of plain symbols (``{"s0": ["2", "128"]}``); see :func:`encode_derived_ranges`
    for those of expressions (``2*s0``)."""
    out: dict[str, Any] = {}
    for sym, vr in ranges.items():
        if getattr(sym, "is_Symbol", False) and _SYMBOL.match(str(sym)):
            out[str(sym)] = _bounds(sym, vr, where)
        elif not getattr(sym, "free_symbols", None):
            fail(f"{where}/{sym}", f"cannot save range {sym}: {vr!r:.80} (expected a symbol or "
                                   "an expression of symbols)")
    return out


def encode_derived_ranges(ranges: dict[Any, Any], where: str) -> list[Any]:
    """Ranges of derived sizes (format 1.1): ``[[expression, [lower, upper]], ...]``."""
    from exportir.export.serialize.symbolic import encode_expr

    return [[encode_expr(expr, f"{where}/{i}"), _bounds(expr, vr, where)]
            for i, (expr, vr) in enumerate(ranges.items())
            if not getattr(expr, "is_Symbol", False)]


def _bound(text: str) -> Any:
    import sympy

    sign = -1 if text.startswith("-") else 1
    magnitude = text.lstrip("-")
    if magnitude in ("oo", "int_oo"):
        return sympy.oo if sign > 0 else -sympy.oo
    return sympy.Integer(sign * int(magnitude))


def _range(pair: Any, at: str) -> Any:
    from exportir.symbolic import ValueRanges

    bounds = as_list(pair, at)
    if len(bounds) != 2:
        fail(at, "expected [lower, upper]")
    lower, upper = (as_str(b, f"{at}/{i}") for i, b in enumerate(bounds))
    if not (_BOUND.match(lower) and _BOUND.match(upper)):
        fail(at, f"bounds [{lower!r:.40}, {upper!r:.40}] are not integers or +-oo")
    return guarded(at, lambda: ValueRanges(_bound(lower), _bound(upper)), "invalid range")


def decode_range_constraints(raw: Any, where: str, symbols: Any = None,
                             derived: Any = None) -> dict[Any, Any]:
    """The ranges by symbol (``symbols``: the loaded shape environment's, format 1.1) and, for
    ``derived`` (1.1), by expression."""
    spec = as_dict(raw, where)
    if not spec and not derived:
        return {}
    import sympy

    out: dict[Any, Any] = {}
    for name, pair in spec.items():
        at = f"{where}/{name}"
        if not _SYMBOL.match(name):
            fail(at, "expected a symbol name mapped to [lower, upper]")
        symbol = symbols.get(name, at) if symbols is not None else sympy.Symbol(name, integer=True)
        out[symbol] = _range(pair, at)
    if derived:
        from exportir.export.serialize.symbolic import decode_expr

        for i, item in enumerate(as_list(derived, f"{where}/derived")):
            at = f"{where}/derived/{i}"
            pair = as_list(item, at)
            if len(pair) != 2 or symbols is None:
                fail(at, "expected [expression, [lower, upper]] with a shape_env section")
            out[decode_expr(pair[0], f"{at}/0", symbols)] = _range(pair[1], f"{at}/1")
    return out


# --------------------------------------------------------------------------- tensors


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """How to rebuild a saved tensor around its data: Parameter or plain, grad flag, device,
    and (for tied weights) the name of the entry whose data it shares."""

    parameter: bool
    requires_grad: bool
    device: str
    alias_of: str | None


def encode_tensor_infos(tensors: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(JSON infos, the tensors whose data must be stored) for a state_dict / constants."""
    infos: dict[str, Any] = {}
    stored: dict[str, torch.Tensor] = {}
    seen: dict[int, str] = {}
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            fail(f"{where}/{name}", f"only tensors can be saved, got {type(value).__qualname__} "
                                   "(custom objects are not supported by format 1.0)")
        alias = seen.get(id(value))
        if alias is None:
            seen[id(value)] = name
            stored[name] = value
        # A loaded tensor is a leaf: a non-leaf buffer (computed under autograd) is saved as
        # plain data, since a leaf requiring grad could not be updated in place by module().
        infos[name] = {"parameter": isinstance(value, torch.nn.Parameter),
                       "requires_grad": value.requires_grad and value.is_leaf,
                       "device": str(value.device), "alias_of": alias}
    return infos, stored


def decode_tensor_infos(raw: Any, where: str) -> dict[str, TensorInfo]:
    out: dict[str, TensorInfo] = {}
    for name, item in as_dict(raw, where).items():
        at = f"{where}/{name}"
        spec = as_dict(item, at)
        check_keys(spec, {"parameter", "requires_grad", "device", "alias_of"}, set(), at)
        alias = _opt_str(spec["alias_of"], f"{at}/alias_of")
        if alias is not None and (alias not in out or out[alias].alias_of is not None):
            fail(f"{at}/alias_of", f"{alias!r:.80} is not an earlier stored tensor")
        out[name] = TensorInfo(as_bool(spec["parameter"], f"{at}/parameter"),
                               as_bool(spec["requires_grad"], f"{at}/requires_grad"),
                               as_str(spec["device"], f"{at}/device"), alias)
    return out


def _place(t: torch.Tensor, info: TensorInfo, where: str) -> torch.Tensor:
    if info.device != "cpu":
        t = guarded(where, lambda: t.to(torch.device(info.device)),
                    f"cannot move the tensor to {info.device!r:.40}")
    if info.parameter:
        return guarded(where, lambda: torch.nn.Parameter(t, requires_grad=info.requires_grad),
                       "cannot make a Parameter")
    return guarded(where, lambda: t.requires_grad_(info.requires_grad), "bad requires_grad")


def rebuild_tensors(infos: dict[str, TensorInfo], data: dict[str, torch.Tensor],
                    where: str) -> dict[str, torch.Tensor]:
    """The saved dict, each tensor from its container data (aliases share one object)."""
    expected = {n for n, i in infos.items() if i.alias_of is None}
    if set(data) != expected:
        missing, extra = sorted(expected - set(data)), sorted(set(data) - expected)
        fail(where, f"tensor container does not match the program: missing {missing[:10]}, "
                    f"unexpected {extra[:10]}")
    out: dict[str, torch.Tensor] = {}
    for name, info in infos.items():
        out[name] = out[info.alias_of] if info.alias_of else _place(data[name], info, f"{where}/{name}")
    return out


# --------------------------------------------------------------------------- example inputs


def encode_example_inputs(example: Any, where: str) -> tuple[Any, dict[str, torch.Tensor]]:
    """JSON ``{"spec", "leaves"}`` (tensor leaves as ``{"tensor": key}``) and the tensors."""
    if example is None:
        return None, {}
    leaves, spec = pytree.tree_flatten(example)
    tensors: dict[str, torch.Tensor] = {}
    encoded: list[Any] = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            tensors[str(i)] = leaf
            encoded.append({"tensor": str(i)})
        else:
            encoded.append(encode_value(leaf, f"{where}/leaves/{i}"))
    return {"spec": encode_treespec(spec, f"{where}/spec"), "leaves": encoded}, tensors


def decode_example_inputs(raw: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if raw is None:
        return None
    spec = as_dict(raw, where)
    check_keys(spec, {"spec", "leaves"}, set(), where)
    tree = decode_treespec(spec["spec"], f"{where}/spec")
    leaves = [_dec_leaf(leaf, tensors, f"{where}/leaves/{i}")
              for i, leaf in enumerate(as_list(spec["leaves"], f"{where}/leaves"))]
    if len(leaves) != tree.num_leaves:
        fail(f"{where}/leaves", f"{len(leaves)} leaves, the spec has {tree.num_leaves}")
    value = guarded(where, lambda: pytree.tree_unflatten(leaves, tree), "cannot rebuild inputs")
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], tuple)
            and isinstance(value[1], dict)):
        fail(f"{where}/spec", f"example inputs must be (args tuple, kwargs dict); the spec "
                              f"gives a {type(value).__name__}")
    return value


def _dec_leaf(raw: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    spec = as_dict(raw, where)
    if set(spec) == {"tensor"}:
        key = as_str(spec["tensor"], f"{where}/tensor")
        if key not in tensors:
            fail(f"{where}/tensor", f"example input tensor {key!r:.40} is missing")
        return tensors[key]
    return Decoder({}).value(spec, where)

