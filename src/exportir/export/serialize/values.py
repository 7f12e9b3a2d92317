"""Tagged JSON encoding of node arguments, metadata values and call targets.

Every value is a one-key JSON object ``{tag: payload}``; the tag names the Python type, so
nothing is guessed on load. Tags (see docs/format/exported-program.md):

    none bool int float complex str node dtype device layout memory_format
    list tuple dict slice ellipsis op fake

Call targets are stored by name and resolved on load only against ``torch.ops`` namespaces
(``"aten::add.Tensor"``, ``"mylib::op.default"``, ``"higher_order::cond"``) and a fixed table of
Python callables (``"operator.getitem"``, ``"math.ceil"``, ``"torch.sym_int"``). Nothing is
imported, unpickled or evaluated.
"""

from __future__ import annotations

import math
import operator
import re
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sympy
import torch
from torch._ops import (
    HigherOrderOperator,
    OpOverload,
    OpOverloadPacket,
    _HigherOrderNamespace,
    _OpNamespace,
)

from exportir.export.capture.fake import FakeTensor
from exportir.export.serialize.common import (
    LIMITS,
    SerializationError,
    as_bool,
    as_dict,
    as_int,
    as_list,
    as_str,
    check_keys,
    fail,
    guarded,
)
from exportir.fx.node import Node

__all__ = [
    "Decoder",
    "check_operator_ints",
    "encode_target",
    "encode_value",
    "lookup_loaded",
    "qualified_name",
    "resolve_qualified",
    "resolve_target",
]


def _named(kind: type) -> dict[str, Any]:
    """``{"float32": torch.float32, ...}`` for every public torch object of ``kind``."""
    return {name: obj for name, obj in sorted(vars(torch).items())
            if isinstance(obj, kind) and not name.startswith("_") and name != "legacy_contiguous_format"}


_DTYPES: dict[str, torch.dtype] = {str(d).removeprefix("torch."): d
                                   for d in _named(torch.dtype).values()}
_LAYOUTS: dict[str, torch.layout] = _named(torch.layout)
_MEMORY_FORMATS: dict[str, torch.memory_format] = _named(torch.memory_format)
_DTYPE_NAMES = {d: n for n, d in _DTYPES.items()}
_LAYOUT_NAMES = {v: k for k, v in _LAYOUTS.items()}
_MEMORY_FORMAT_NAMES = {v: k for k, v in _MEMORY_FORMATS.items()}

# Python callables a graph may call, by the name stored in the file.
_PY_TARGETS: dict[str, Callable[..., Any]] = {
    **{f"operator.{n}": getattr(operator, n) for n in (
        "getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos",
        "abs", "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "not_", "invert",
        "lshift", "rshift")},
    **{f"math.{n}": getattr(math, n) for n in ("ceil", "floor", "trunc", "sqrt")},
    **{f"torch.{n}": getattr(torch, n) for n in (
        "sym_int", "sym_float", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sum",
        "sym_sqrt", "sym_fresh_size") if hasattr(torch, n)},
}
_PY_TARGET_NAMES = {fn: name for name, fn in _PY_TARGETS.items()}
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_SAFE_ROOTS = ("torch", "operator", "math", "builtins")
_OP_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}\Z")


# --------------------------------------------------------------------------- targets


def encode_target(target: Any, where: str) -> str:
    """``"ns::op.overload"``, ``"higher_order::name"`` or an allowlisted Python name."""
    if isinstance(target, OpOverload):
        return f"{target.namespace}::{target._opname}.{target._overloadname}"
    if isinstance(target, HigherOrderOperator):
        return f"{target.namespace}::{target.name()}"
    name = _PY_TARGET_NAMES.get(target) if _hashable(target) else None
    if name is not None:
        return name
    hint = " (an OpOverloadPacket: pick an overload, e.g. .default)" if isinstance(
        target, OpOverloadPacket) else ""
    fail(where, f"target {target!r} cannot be saved{hint}; only torch.ops operator overloads, "
                f"higher-order ops and {sorted(_PY_TARGETS)} are supported")


def _hashable(obj: Any) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True


def _op_part(text: str, where: str, full: str) -> str:
    if not _OP_PART.match(text):
        fail(where, f"malformed operator name {full!r:.120}; expected 'ns::op.overload'")
    return text


# What a saved graph may call: what export produces. Operators of torch's namespaces that act
# outside the program (collectives, profiling, test and debug hooks), ATen operators that read
# files, print, or address memory without checking it, and higher-order operators export does
# not emit are refused by name, whatever torch knows. Custom ops (torch.library) of other
# namespaces load when their library is imported, as export needs them.
REFUSED_OPERATORS = frozenset({
    "aten::from_file", "aten::_print", "aten::_reshape_alias", "aten::_reshape_alias_copy",
    "aten::_nested_view_from_buffer", "aten::_nested_view_from_buffer_copy", "aten::set_",
    "aten::set", "aten::set_data", "aten::_cufft_set_plan_cache_max_size", "aten::record_stream",
})
REFUSED_NAMESPACES = frozenset({
    "c10d", "_c10d_functional", "_c10d_functional_autograd", "symm_mem", "_dtensor", "profiler",
    "static_runtime", "_test", "debugprims", "debug_mode_ops", "inductor", "inductor_prims",
    "rngprims", "_native",
})
HIGHER_ORDER_OPERATORS = frozenset({"cond", "map_impl", "while_loop"})


def _check_allowed(namespace: str, op_name: str, where: str, full: str) -> None:
    name = f"{namespace}::{op_name}"
    if name in REFUSED_OPERATORS or namespace in REFUSED_NAMESPACES:
        fail(where, f"operator {full!r:.120} is not one an exported program may call (it acts "
                    "outside the program: files, printing, unchecked memory, collectives or "
                    "profiling); refusing to load")
    if namespace == "higher_order" and op_name not in HIGHER_ORDER_OPERATORS:
        fail(where, f"higher-order operator {full!r:.120} is not one export emits "
                    f"({sorted(HIGHER_ORDER_OPERATORS)})")


def _resolve_op(full: str, where: str) -> Any:
    namespace, _, rest = full.partition("::")
    _op_part(namespace, where, full)
    _check_allowed(namespace, rest.partition(".")[0], where, full)
    ns_obj = getattr(torch.ops, namespace, None)
    if not isinstance(ns_obj, (_OpNamespace, _HigherOrderNamespace)):
        fail(where, f"unknown operator namespace {namespace!r} in {full!r:.120}")
    if namespace == "higher_order":
        hop = getattr(ns_obj, _op_part(rest, where, full), None)
        if not isinstance(hop, HigherOrderOperator):
            fail(where, f"unknown higher-order operator {full!r}")
        return hop
    op_name, dot, overload = rest.partition(".")
    if not dot:
        fail(where, f"operator {full!r} has no overload; expected 'ns::op.overload'")
    _op_part(op_name, where, full)
    _op_part(overload, where, full)
    try:
        packet = getattr(ns_obj, op_name)
        resolved = getattr(packet, overload)
    except (AttributeError, RuntimeError):
        resolved = None
    if not isinstance(resolved, OpOverload):
        fail(where, f"unknown operator {full!r}; if it is a custom op, import the module that "
                    f"registers it (torch.library) before loading")
    return resolved


def resolve_target(text: Any, where: str) -> Any:
    """The callable named by ``text`` (see module docstring); never imports anything."""
    name = as_str(text, where)
    if "::" in name:
        return _resolve_op(name, where)
    target = _PY_TARGETS.get(name)
    if target is None:
        fail(where, f"unknown call target {name!r}; allowed: torch.ops names "
                    f"('ns::op.overload') or {sorted(_PY_TARGETS)}")
    return target


def _name_candidates(obj: Any) -> list[str]:
    name = getattr(obj, "__name__", None)
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    owner = getattr(obj, "__objclass__", None)
    out = [f"{module}.{qualname}"] if isinstance(module, str) and isinstance(qualname, str) else []
    if isinstance(name, str):
        if owner is not None:
            out.append(f"{owner.__module__}.{owner.__qualname__}.{name}")
        out += [f"{prefix}.{name}" for prefix in _PUBLIC_HOMES]
    return out


# Where builtin functions without a usable __module__ usually live (torch.tanh, ...).
_PUBLIC_HOMES = ("torch", "torch.nn.functional", "torch.Tensor", "torch.special", "torch.linalg",
                 "torch.fft", "operator", "math")


def qualified_name(obj: Any) -> str:
    """A dotted name that :func:`resolve_qualified` maps back to ``obj`` when there is one
    (classes, functions, torch builtins, Tensor methods); else the best available name."""
    if isinstance(obj, str):
        return obj
    if isinstance(obj, (OpOverload, HigherOrderOperator)):
        return encode_target(obj, "qualified_name")
    if isinstance(obj, OpOverloadPacket):
        return obj._qualified_op_name  # "ns::op"
    candidates = _name_candidates(obj)
    for text in candidates:
        if resolve_qualified(text) is obj:
            return text
    return candidates[0] if candidates else str(obj)


def _lookup(obj: Any, attr: str) -> Any:
    """Attribute through ``__dict__`` only: no ``__getattr__``, no descriptors run."""
    for holder in getattr(obj, "__mro__", None) or (obj,):
        found = vars(holder).get(attr, _MISSING) if hasattr(holder, "__dict__") else _MISSING
        if found is not _MISSING:
            return found
    return _MISSING


_MISSING = object()


def lookup_loaded(module: str, qualname: str) -> Any:
    """``module.qualname`` among already-imported modules, through ``__dict__``s only (no
    ``__getattr__``, so no lazy imports); ``None`` if it is not there."""
    obj = sys.modules.get(module)
    if obj is None:
        return None
    for attr in qualname.split("."):
        obj = _lookup(obj, attr)
        if obj is _MISSING:
            return None
    return obj


def check_operator_ints(value: Any, where: str) -> None:
    """An operator takes integers of 64 bits: a bigger one in its arguments (``10**400``)
    would fail only when the graph runs (OverflowError)."""
    if type(value) is int and not _INT64_MIN <= value <= _INT64_MAX:
        fail(where, f"an integer of {value.bit_length()} bits does not fit in the 64 bits an "
                    "operator argument holds")
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_operator_ints(item, f"{where}/{i}")
    elif isinstance(value, dict):
        for key, item in value.items():
            check_operator_ints(item, f"{where}/{key}")


def _resolve_op_or_packet(text: str) -> Any:
    namespace, _, op_name = text.partition("::")
    if "." in op_name or not (_OP_PART.match(namespace) and _OP_PART.match(op_name)):
        try:
            return _resolve_op(text, "")
        except SerializationError:
            return text
    ns_obj = getattr(torch.ops, namespace, None)
    if not isinstance(ns_obj, _OpNamespace):
        return text
    try:
        packet = getattr(ns_obj, op_name)
    except (AttributeError, RuntimeError):
        return text
    return packet if isinstance(packet, OpOverloadPacket) else text


def resolve_qualified(text: str) -> Any:
    """Best-effort: the already-imported object named ``text`` under an allowlisted root
    package, or ``text`` itself. Used for metadata only (``source_fn_stack``)."""
    if "::" in text:
        return _resolve_op_or_packet(text)
    parts = text.split(".")
    if parts[0] not in _SAFE_ROOTS:
        return text
    for cut in range(len(parts), 0, -1):
        obj = sys.modules.get(".".join(parts[:cut]))
        if obj is None:
            continue
        for attr in parts[cut:]:
            obj = _lookup(obj, attr)
            if obj is _MISSING:
                return text
        return obj
    return text


# --------------------------------------------------------------------------- encoding


def _enc_float(x: float) -> Any:
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _enc_size(size: Any, where: str) -> Any:
    """An int, or (format 1.1) ``{"sym": expression}`` of a symbolic size."""
    if isinstance(size, int):
        return size
    from exportir.export.serialize.symbolic import encode_expr

    return {"sym": encode_expr(size.node.expr, where)}


def _enc_fake(t: torch.Tensor, where: str) -> dict[str, Any]:
    if t.layout != torch.strided:
        fail(where, f"tensor metadata with layout {t.layout} is not supported")
    return {
        "dtype": _DTYPE_NAMES[t.dtype],
        "shape": [_enc_size(s, f"{where}/shape") for s in t.shape],
        "stride": [_enc_size(s, f"{where}/stride") for s in t.stride()],
        "storage_offset": _enc_size(t.storage_offset(), f"{where}/storage_offset"),
        "device": str(t.device),
        "requires_grad": t.requires_grad,
    }


def _enc_seq(items: Any, where: str, tensors: bool) -> list[Any]:
    return [encode_value(v, f"{where}/{i}", tensors=tensors) for i, v in enumerate(items)]


_Enc = Callable[[Any, str, bool], Any]
_ENCODERS: dict[type, tuple[str, _Enc]] = {
    type(None): ("none", lambda x, w, t: None),
    bool: ("bool", lambda x, w, t: x),
    int: ("int", lambda x, w, t: int(x)),
    float: ("float", lambda x, w, t: _enc_float(x)),
    complex: ("complex", lambda x, w, t: [_enc_float(x.real), _enc_float(x.imag)]),
    str: ("str", lambda x, w, t: str(x)),
    Node: ("node", lambda x, w, t: x.name),
    torch.dtype: ("dtype", lambda x, w, t: _DTYPE_NAMES[x]),
    torch.device: ("device", lambda x, w, t: str(x)),
    torch.layout: ("layout", lambda x, w, t: _LAYOUT_NAMES[x]),
    torch.memory_format: ("memory_format", lambda x, w, t: _MEMORY_FORMAT_NAMES[x]),
    list: ("list", _enc_seq),
    tuple: ("tuple", _enc_seq),
    dict: ("dict", lambda x, w, t: [[encode_value(k, f"{w}/{i}/key", tensors=False),
                                     encode_value(v, f"{w}/{i}/value", tensors=t)]
                                    for i, (k, v) in enumerate(x.items())]),
    slice: ("slice", lambda x, w, t: _enc_seq((x.start, x.stop, x.step), w, False)),
    type(Ellipsis): ("ellipsis", lambda x, w, t: None),
    OpOverload: ("op", lambda x, w, t: encode_target(x, w)),
    HigherOrderOperator: ("op", lambda x, w, t: encode_target(x, w)),
    types.BuiltinFunctionType: ("op", lambda x, w, t: encode_target(x, w)),  # operator.*, math.*
}


def encode_value(value: Any, where: str, *, tensors: bool = False) -> dict[str, Any]:
    """``{tag: payload}`` for ``value``. With ``tensors=True`` (metadata), tensors are stored
    as their metadata (tag ``fake``); in arguments a tensor is an error."""
    if isinstance(value, torch.Tensor):
        if not tensors:
            fail(where, "a tensor constant inside node arguments cannot be saved; lift it to a "
                        "graph input (constants of an ExportedProgram are placeholders)")
        return {"fake": _enc_fake(value, where)}
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        from exportir.export.serialize.symbolic import encode_expr

        return {_SYM_TAGS[type(value)]: encode_expr(value.node.expr, where)}
    for cls in type(value).__mro__:
        entry = _ENCODERS.get(cls)
        if entry is not None:
            tag, enc = entry
            return {tag: enc(value, where, tensors)}
    fail(where, f"cannot save a value of type {type(value).__qualname__}: {value!r:.80}")


# --------------------------------------------------------------------------- decoding


def _dec_float(payload: Any, where: str) -> float:
    if isinstance(payload, str):
        special = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}.get(payload)
        if special is None:
            fail(where, f"expected a number or 'inf'/'-inf'/'nan', got {payload!r:.40}")
        return special
    if isinstance(payload, bool) or not isinstance(payload, (int, float)):
        fail(where, "expected a number")
    try:
        return float(payload)
    except OverflowError:
        fail(where, f"number of {payload.bit_length()} bits does not fit in a double")


def _from_table(table: dict[str, Any], kind: str) -> Callable[[Any, str], Any]:
    def dec(payload: Any, where: str) -> Any:
        found = table.get(as_str(payload, where))
        if found is None:
            fail(where, f"unknown {kind} {payload!r:.60}")
        return found

    return dec


def _dec_device(payload: Any, where: str) -> torch.device:
    text = as_str(payload, where)
    if len(text) > 64:
        fail(where, "device string too long")
    return guarded(where, lambda: torch.device(text), "bad device")


def _dim(raw: Any, where: str, shapes: Any, lo: int) -> Any:
    """An int size, or (format 1.1) ``{"sym": expression}``: a SymInt of the loaded
    ShapeEnv (``shapes``: its ``(ShapeEnv, Symbols)``)."""
    if isinstance(raw, dict):
        if shapes is None:
            fail(where, "a symbolic size in a program without a shape_env section")
        spec = as_dict(raw, where)
        check_keys(spec, {"sym"}, set(), where)
        from exportir.export.serialize.symbolic import decode_expr

        env, symbols = shapes
        expr = decode_expr(spec["sym"], f"{where}/sym", symbols)
        if expr.is_integer is not True:
            fail(f"{where}/sym", f"{expr!s:.60} is not an integer size")
        return guarded(where, lambda: env.symint(expr), "invalid symbolic size")
    return as_int(raw, where, lo=lo, hi=LIMITS.max_dim)


def _dims(payload: Any, where: str, shapes: Any = None) -> list[Any]:
    dims = as_list(payload, where)
    if len(dims) > LIMITS.max_rank:
        fail(where, f"rank {len(dims)} exceeds {LIMITS.max_rank}")
    return [_dim(d, f"{where}/{i}", shapes, -LIMITS.max_dim) for i, d in enumerate(dims)]


def _dec_fake(payload: Any, where: str, shapes: Any = None) -> torch.Tensor:
    spec = as_dict(payload, where)
    fields = {"dtype", "shape", "stride", "storage_offset", "device", "requires_grad"}
    check_keys(spec, fields, set(), where)
    dtype = _from_table(_DTYPES, "dtype")(spec["dtype"], f"{where}/dtype")
    shape = _dims(spec["shape"], f"{where}/shape", shapes)
    stride = _dims(spec["stride"], f"{where}/stride", shapes)
    if len(stride) != len(shape) or min((s for s in shape if isinstance(s, int)), default=0) < 0:
        fail(where, f"shape {shape} and stride {stride} do not describe a tensor")
    offset = _dim(spec["storage_offset"], f"{where}/storage_offset", shapes, 0)
    device = _dec_device(spec["device"], f"{where}/device")
    grad = as_bool(spec["requires_grad"], f"{where}/requires_grad")
    return guarded(where, lambda: make_fake(shape, stride, offset, dtype, device, grad),
                   "cannot rebuild tensor metadata")


def make_fake(shape: list[int], stride: list[int], offset: int, dtype: torch.dtype,
              device: torch.device, requires_grad: bool) -> torch.Tensor:
    """A :class:`FakeTensor` with the given metadata (meta storage, reports ``device``)."""
    meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    if offset:
        meta = meta.as_strided(shape, stride, offset)
    return FakeTensor(meta, device, requires_grad=requires_grad)


@dataclass(slots=True)
class Decoder:
    """Decodes tagged values; ``env`` maps node names already defined to their nodes."""

    env: dict[str, Node]
    tensors: bool = False  # accept the ``fake`` tag (metadata)
    depth: int = 0
    shapes: Any = None  # (ShapeEnv, Symbols) of a program with symbolic shapes (format 1.1)

    def value(self, obj: Any, where: str) -> Any:
        spec = as_dict(obj, where)
        if len(spec) != 1:
            fail(where, f"a value must be a one-key object {{tag: payload}}, got keys {sorted(spec)[:8]}")
        ((tag, payload),) = spec.items()
        rule = _DECODERS.get(tag)
        if rule is None or (tag == "fake" and not self.tensors):
            fail(where, f"unknown value tag {tag!r:.40}")
        if self.depth >= LIMITS.max_depth:
            fail(where, f"values nested deeper than {LIMITS.max_depth}")
        self.depth += 1
        try:
            return rule(self, payload, f"{where}/{tag}")
        finally:
            self.depth -= 1

    def seq(self, payload: Any, where: str) -> list[Any]:
        return [self.value(v, f"{where}/{i}") for i, v in enumerate(as_list(payload, where))]

    def node(self, payload: Any, where: str) -> Node:
        name = as_str(payload, where)
        found = self.env.get(name)
        if found is None:
            fail(where, f"refers to node {name!r:.80}, which is not defined before this node")
        return found

    def mapping(self, payload: Any, where: str) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for i, pair in enumerate(as_list(payload, where)):
            item = as_list(pair, f"{where}/{i}")
            if len(item) != 2:
                fail(f"{where}/{i}", "expected a [key, value] pair")
            key = self.value(item[0], f"{where}/{i}/0")
            if not _hashable(key):
                fail(f"{where}/{i}/0", "dict key is not hashable")
            out[key] = self.value(item[1], f"{where}/{i}/1")
        return out

    def slice_(self, payload: Any, where: str) -> slice:
        parts = self.seq(payload, where)
        if len(parts) != 3:
            fail(where, "expected [start, stop, step]")
        return slice(*parts)


def _dec_complex(payload: Any, where: str) -> complex:
    parts = as_list(payload, where)
    if len(parts) != 2:
        fail(where, "expected [real, imag]")
    return complex(_dec_float(parts[0], f"{where}/0"), _dec_float(parts[1], f"{where}/1"))


def _dec_none(payload: Any, where: str) -> None:
    if payload is not None:
        fail(where, "expected null")


def _dec_ellipsis(payload: Any, where: str) -> Any:
    _dec_none(payload, where)
    return Ellipsis


_DECODERS: dict[str, Callable[[Decoder, Any, str], Any]] = {
    "none": lambda d, p, w: _dec_none(p, w),
    "bool": lambda d, p, w: as_bool(p, w),
    "int": lambda d, p, w: as_int(p, w),
    "float": lambda d, p, w: _dec_float(p, w),
    "complex": lambda d, p, w: _dec_complex(p, w),
    "str": lambda d, p, w: as_str(p, w),
    "node": Decoder.node,
    "dtype": lambda d, p, w: _from_table(_DTYPES, "dtype")(p, w),
    "device": lambda d, p, w: _dec_device(p, w),
    "layout": lambda d, p, w: _from_table(_LAYOUTS, "layout")(p, w),
    "memory_format": lambda d, p, w: _from_table(_MEMORY_FORMATS, "memory format")(p, w),
    "list": Decoder.seq,
    "tuple": lambda d, p, w: tuple(d.seq(p, w)),
    "dict": Decoder.mapping,
    "slice": Decoder.slice_,
    "ellipsis": lambda d, p, w: _dec_ellipsis(p, w),
    "op": lambda d, p, w: resolve_target(p, w),
    "fake": lambda d, p, w: _dec_fake(p, w, d.shapes),
    "symint": lambda d, p, w: _dec_sym(d, p, w, "symint"),
    "symfloat": lambda d, p, w: _dec_sym(d, p, w, "symfloat"),
    "symbool": lambda d, p, w: _dec_sym(d, p, w, "symbool"),
}
_SYM_TAGS: dict[type, str] = {torch.SymInt: "symint", torch.SymFloat: "symfloat",
                              torch.SymBool: "symbool"}


def _dec_sym(d: Decoder, payload: Any, where: str, tag: str) -> Any:
    """A symbolic value of the loaded ShapeEnv (format 1.1; metadata only)."""
    if d.shapes is None or not d.tensors:
        fail(where, f"a {tag} value outside the metadata of a program with symbolic shapes")
    from exportir.export.serialize.symbolic import decode_expr
    from exportir.symbolic import SymNode

    env, symbols = d.shapes
    expr = decode_expr(payload, where, symbols)
    pytype, wrap = {"symint": (int, torch.SymInt), "symfloat": (float, torch.SymFloat),
                    "symbool": (bool, torch.SymBool)}[tag]
    if expr.is_number or expr in (sympy.true, sympy.false):
        return guarded(where, lambda: pytype(expr), f"invalid {tag}")
    return guarded(where, lambda: wrap(SymNode(expr, env, pytype)), f"invalid {tag}")
