"""The fused CPU backend at run time: its blob format, and the executor the runtime calls.

This module is the backend's device side, shipped with the runtime: the default delegate
registry (:func:`exportir.runtime.default_delegate_registry`) holds a :class:`FusedCpuRuntime`
under :data:`BACKEND_ID`. It imports only torch and the standard library. The compile side
(partitioner, ``preprocess``) is :mod:`exportir.backends.fused_cpu`, which uses the same backend
id and op table.

Blob layout (little-endian)::

    b"XFC1" | u32 version | u32 header length | header (UTF-8 JSON) | zero pad to 16 | data

The header is a JSON object:

- ``values``: number of value slots;
- ``inputs`` / ``outputs``: slot ids of the delegate's inputs (in call order) and outputs;
- ``constants``: ``[slot, dtype, shape, offset, nbytes]`` -- tensors stored in ``data``;
- ``ops``: ``[op, args, kwargs, outs, node]`` -- ``op`` names an entry of :data:`OPS`
  (``"aten.addmm.default"``), ``outs`` is a slot id or a list of them, ``node`` the graph node
  it came from (for errors). Arguments are JSON values where ``{"v": i}`` reads slot ``i``,
  ``{"dtype": "float32"}`` / ``{"device": ...}`` / ``{"layout": ...}`` /
  ``{"memory_format": ...}`` are torch enums, ``{"float": "inf"}`` a non-finite float.
- ``free``: per op, the slots whose last reader it is (released after it runs).
- ``inplace``: per op, 1 when it may overwrite its first argument (a dead intermediate).

Loading validates the blob fully and never executes code from it: op names are looked up in
:data:`OPS`, a closed table.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "BACKEND_ID",
    "FORMAT_VERSION",
    "INPLACE",
    "MAGIC",
    "OPS",
    "FusedCpuBlobError",
    "FusedCpuExecutionError",
    "FusedCpuRuntime",
    "FusedProgram",
    "decode",
]

BACKEND_ID = "FusedCpuBackend"
MAGIC = b"XFC1"
FORMAT_VERSION = 1
ALIGNMENT = 16
_PRELUDE = struct.Struct("<4sII")

# The ops the backend runs: ATen overload names (``aten.<op>.<overload>``).
OPS: frozenset[str] = frozenset({
    # elementwise
    "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor",
    "aten.div.Tensor_mode", "aten.pow.Tensor_Tensor", "aten.pow.Tensor_Scalar",
    "aten.maximum.default", "aten.minimum.default", "aten.where.self",
    "aten.eq.Tensor", "aten.ne.Tensor", "aten.lt.Tensor", "aten.le.Tensor", "aten.gt.Tensor",
    "aten.ge.Tensor", "aten.neg.default", "aten.abs.default", "aten.exp.default",
    "aten.log.default", "aten.sqrt.default", "aten.rsqrt.default", "aten.reciprocal.default",
    "aten.sin.default", "aten.cos.default", "aten.erf.default", "aten.clamp.default",
    "aten.clamp.Tensor",
    # activations
    "aten.relu.default", "aten.gelu.default", "aten.sigmoid.default", "aten.tanh.default",
    "aten.hardtanh.default", "aten.leaky_relu.default", "aten.silu.default",
    "aten.hardswish.default", "aten.hardsigmoid.default", "aten.elu.default",
    # softmax, normalization, reductions
    "aten._softmax.default", "aten._log_softmax.default", "aten.native_layer_norm.default",
    "aten.native_group_norm.default", "aten._native_batch_norm_legit_no_training.default",
    "aten.mean.dim", "aten.sum.dim_IntList", "aten.amax.default",
    # linear algebra, convolution, pooling
    "aten.addmm.default", "aten.mm.default", "aten.bmm.default", "aten.convolution.default",
    "aten.avg_pool2d.default", "aten.max_pool2d_with_indices.default",
    # layout (copy semantics)
    "aten.view_copy.default", "aten.permute_copy.default", "aten.expand_copy.default",
    "aten.unsqueeze_copy.default", "aten.squeeze_copy.dims", "aten.clone.default",
    "aten.cat.default", "aten.slice_copy.Tensor", "aten.select_copy.int", "aten._to_copy.default",
})  # fmt: skip

# Unary ops that may overwrite their input when it is a dead intermediate.
INPLACE: dict[str, str] = {
    "aten.relu.default": "relu_", "aten.gelu.default": "gelu_", "aten.sigmoid.default": "sigmoid_",
    "aten.tanh.default": "tanh_", "aten.neg.default": "neg_", "aten.abs.default": "abs_",
    "aten.exp.default": "exp_", "aten.log.default": "log_", "aten.sqrt.default": "sqrt_",
    "aten.rsqrt.default": "rsqrt_", "aten.reciprocal.default": "reciprocal_",
    "aten.sin.default": "sin_", "aten.cos.default": "cos_", "aten.erf.default": "erf_",
    "aten.hardtanh.default": "hardtanh_", "aten.leaky_relu.default": "leaky_relu_",
    "aten.silu.default": "silu_", "aten.hardswish.default": "hardswish_",
    "aten.hardsigmoid.default": "hardsigmoid_", "aten.elu.default": "elu_",
    "aten.clamp.default": "clamp_",
}  # fmt: skip

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16,
    "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
}  # fmt: skip
_LAYOUTS = {"strided": torch.strided}
_MEMORY_FORMATS = {
    "contiguous_format": torch.contiguous_format, "preserve_format": torch.preserve_format,
    "channels_last": torch.channels_last,
}  # fmt: skip


class FusedCpuBlobError(ValueError):
    """A malformed blob; the message names the field."""


class FusedCpuExecutionError(RuntimeError):
    """An op of the blob failed; the message names the op and its graph node."""


# ------------------------------------------------------------------------------ decoding


@dataclass(frozen=True, slots=True)
class _Ref:
    slot: int


@dataclass(frozen=True, slots=True)
class _Op:
    fn: Any
    name: str
    node: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outs: tuple[int, ...]
    multi: bool
    free: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class FusedProgram:
    """A decoded blob, ready to run (the runtime's delegate handle)."""

    num_values: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    constants: tuple[tuple[int, torch.Tensor], ...]
    ops: tuple[_Op, ...]


def _fail(field: str, why: str) -> FusedCpuBlobError:
    return FusedCpuBlobError(f"fused_cpu blob: {field}: {why}")


def _int(x: Any, field: str, limit: int | None = None) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or x < 0 or (limit is not None and x >= limit):
        raise _fail(field, f"expected an integer in [0, {limit}); got {x!r}")
    return x


def _list(x: Any, field: str) -> list[Any]:
    if not isinstance(x, list):
        raise _fail(field, f"expected a list; got {type(x).__name__}")
    return x


_ENUMS: dict[str, dict[str, Any]] = {
    "dtype": DTYPES, "layout": _LAYOUTS, "memory_format": _MEMORY_FORMATS,
    "device": {"cpu": torch.device("cpu")},
}  # fmt: skip


def _arg(x: Any, field: str, slots: int) -> Any:
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        return x
    if isinstance(x, list):
        return [_arg(v, f"{field}[{i}]", slots) for i, v in enumerate(x)]
    if isinstance(x, dict) and len(x) == 1:
        ((kind, value),) = x.items()
        if kind == "v":
            return _Ref(_int(value, field, slots))
        if kind == "float" and value in ("inf", "-inf", "nan"):
            return float(value)
        table = _ENUMS.get(kind)
        if table is not None and value in table:
            return table[value]
    raise _fail(field, f"unknown argument encoding {x!r}")


def _resolve_op(name: Any, field: str, inplace: bool) -> Any:
    if not isinstance(name, str) or name not in OPS:
        raise _fail(field, f"op {name!r} is not one the fused_cpu backend runs")
    _, packet, overload = name.split(".")
    if inplace and name in INPLACE:
        return getattr(torch.ops.aten, INPLACE[name]).default
    return getattr(getattr(torch.ops.aten, packet), overload)


def _op(entry: Any, i: int, slots: int, free: list[Any], inplace: list[Any]) -> _Op:
    field = f"ops[{i}]"
    row = _list(entry, field)
    if len(row) != 5:
        raise _fail(field, f"expected [op, args, kwargs, outs, node]; got {len(row)} items")
    name, args, kwargs, outs, node = row
    if not isinstance(kwargs, dict) or not isinstance(node, str):
        raise _fail(field, "kwargs must be an object and node a string")
    multi = isinstance(outs, list)
    out_slots = tuple(_int(o, f"{field}.outs", slots) for o in (outs if multi else [outs]))
    frees = tuple(_int(s, f"free[{i}]", slots) for s in _list(free[i], f"free[{i}]"))
    return _Op(
        fn=_resolve_op(name, f"{field}.op", bool(inplace[i])),
        name=name,
        node=node,
        args=tuple(
            _arg(a, f"{field}.args[{k}]", slots) for k, a in enumerate(_list(args, f"{field}.args"))
        ),
        kwargs={str(k): _arg(v, f"{field}.kwargs.{k}", slots) for k, v in kwargs.items()},
        outs=out_slots,
        multi=multi,
        free=frees,
    )


def _constant(entry: Any, i: int, slots: int, data: memoryview) -> tuple[int, torch.Tensor]:
    field = f"constants[{i}]"
    row = _list(entry, field)
    if len(row) != 5:
        raise _fail(field, "expected [slot, dtype, shape, offset, nbytes]")
    slot, dtype_name, shape, offset, nbytes = row
    slot = _int(slot, f"{field}.slot", slots)
    dtype = DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
    if dtype is None:
        raise _fail(f"{field}.dtype", f"unknown dtype {dtype_name!r}")
    dims = [_int(d, f"{field}.shape", 1 << 40) for d in _list(shape, f"{field}.shape")]
    offset, nbytes = _int(offset, f"{field}.offset"), _int(nbytes, f"{field}.nbytes")
    numel = math.prod(dims)
    if numel * dtype.itemsize != nbytes or offset + nbytes > len(data):
        raise _fail(
            field,
            f"{nbytes} bytes at offset {offset} do not hold {dims} {dtype_name} "
            f"inside the {len(data)}-byte data segment",
        )
    raw = bytearray(data[offset : offset + nbytes])  # copied: the blob may view a mapped file
    tensor = torch.frombuffer(raw, dtype=dtype) if nbytes else torch.empty(0, dtype=dtype)
    return slot, tensor.reshape(dims)


def _header(blob: bytes | memoryview) -> tuple[dict[str, Any], memoryview]:
    view = memoryview(blob).cast("B")
    if len(view) < _PRELUDE.size:
        raise _fail("header", f"blob of {len(view)} bytes is too short")
    magic, version, length = _PRELUDE.unpack_from(view)
    if magic != MAGIC:
        raise _fail("magic", f"expected {MAGIC!r}; got {bytes(magic)!r} (not a fused_cpu blob)")
    if version != FORMAT_VERSION:
        raise _fail("version", f"format version {version}; this runtime reads {FORMAT_VERSION}")
    start = _PRELUDE.size
    if start + length > len(view):
        raise _fail("header", f"header of {length} bytes runs past the blob end")
    try:
        header = json.loads(bytes(view[start : start + length]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _fail("header", f"not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise _fail("header", "expected a JSON object")
    data_start = -(-(start + length) // ALIGNMENT) * ALIGNMENT
    return header, view[min(data_start, len(view)) :]


def decode(blob: bytes | memoryview) -> FusedProgram:
    """Validate and decode a blob; raises :class:`FusedCpuBlobError` naming the bad field."""
    header, data = _header(blob)
    for key in ("values", "inputs", "outputs", "constants", "ops", "free", "inplace"):
        if key not in header:
            raise _fail(key, "missing")
    slots = _int(header["values"], "values", 1 << 24)
    ops = _list(header["ops"], "ops")
    free, inplace = _list(header["free"], "free"), _list(header["inplace"], "inplace")
    if len(free) != len(ops) or len(inplace) != len(ops):
        raise _fail("free", "free and inplace need one entry per op")
    return FusedProgram(
        num_values=slots,
        inputs=tuple(_int(s, "inputs", slots) for s in _list(header["inputs"], "inputs")),
        outputs=tuple(_int(s, "outputs", slots) for s in _list(header["outputs"], "outputs")),
        constants=tuple(
            _constant(c, i, slots, data)
            for i, c in enumerate(_list(header["constants"], "constants"))
        ),
        ops=tuple(_op(e, i, slots, free, inplace) for i, e in enumerate(ops)),
    )


# ------------------------------------------------------------------------------ execution


def _materialize(x: Any, values: list[Any]) -> Any:
    if isinstance(x, _Ref):
        return values[x.slot]
    if isinstance(x, list):
        return [_materialize(v, values) for v in x]
    return x


def run(program: FusedProgram, inputs: Sequence[Any]) -> list[Any]:
    """Run a decoded blob on ``inputs``; returns its outputs."""
    if len(inputs) != len(program.inputs):
        raise FusedCpuExecutionError(
            f"fused_cpu delegate takes {len(program.inputs)} inputs; got {len(inputs)}"
        )
    values: list[Any] = [None] * program.num_values
    for slot, tensor in program.constants:
        values[slot] = tensor
    for slot, value in zip(program.inputs, inputs):
        values[slot] = value
    for op in program.ops:
        args = [_materialize(a, values) for a in op.args]
        kwargs = {k: _materialize(v, values) for k, v in op.kwargs.items()} if op.kwargs else {}
        try:
            result = op.fn(*args, **kwargs)
        except Exception as e:
            raise FusedCpuExecutionError(
                f"fused_cpu op {op.name} (graph node {op.node}) failed: {type(e).__name__}: {e}"
            ) from e
        if op.multi:
            for slot, r in zip(op.outs, result):
                values[slot] = r
        else:
            values[op.outs[0]] = result
        for slot in op.free:
            values[slot] = None
    return [values[s] for s in program.outputs]


class FusedCpuRuntime:
    """The delegate-registry entry: ``init(processed, compile_specs)`` decodes the blob,
    ``execute(handle, inputs)`` runs it."""

    __slots__ = ()

    def init(self, processed: bytes | memoryview, compile_specs: Sequence[Any]) -> FusedProgram:
        return decode(processed)

    def execute(self, handle: FusedProgram, inputs: Sequence[Any]) -> list[Any]:
        with torch.no_grad():
            return run(handle, inputs)

    def destroy(self, handle: FusedProgram) -> None:
        return None


def backend_runtime() -> FusedCpuRuntime:
    """A runtime object to register: ``registry.register(BACKEND_ID, backend_runtime())``."""
    return FusedCpuRuntime()
