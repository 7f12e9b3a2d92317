"""The fused CPU blob: layout, decoding and validation (no execution here).

Blob layout (little-endian)::

    b"XFC1" | u32 version | u32 header length | header (UTF-8 JSON) | zero pad to 16 | data

The header is a JSON object:

- ``values``: number of value slots;
- ``inputs`` / ``outputs``: slot ids of the delegate's inputs (in call order) and outputs;
- ``constants``: ``[slot, dtype, shape, offset, nbytes]`` -- tensors stored in ``data``;
- ``ops``: ``[op, args, kwargs, outs, node]`` -- ``op`` names an entry of the kernel table
  (:data:`exportir.runtime.backends.fused_cpu.kernels.KERNELS`, e.g. ``"aten.linear.default"``),
  ``outs`` is a slot id or a list of them, ``node`` the graph node it came from (for errors).
  Arguments are JSON values where ``{"v": i}`` reads slot ``i``, ``{"dtype": "float32"}`` /
  ``{"device": ...}`` / ``{"layout": ...}`` / ``{"memory_format": ...}`` are torch enums,
  ``{"float": "inf"}`` a non-finite float;
- ``inplace``: per op, 1 when it runs in place on its first argument (the executor checks that
  this overwrites nothing still read: see :func:`exportir.runtime.backends.fused_cpu.plan`).

Version 2 (this one) dropped version 1's ``free`` list (the executor computes lifetimes) and
added ops the compile side fuses to (``aten.linear.default``, ``aten.matmul.default``, ...).
Decoding validates every field and never executes code from the blob.
"""

from __future__ import annotations

import json
import math
import struct
import warnings
from typing import Any

import torch

from exportir.runtime.backends.fused_cpu.kernels import KERNELS, Ref, SchemaMismatch, check_args
from exportir.runtime.backends.fused_cpu.records import record

__all__ = [
    "ALIGNMENT",
    "BACKEND_ID",
    "DTYPES",
    "FORMAT_VERSION",
    "MAGIC",
    "Blob",
    "FusedCpuBlobError",
    "OpRow",
    "Ref",
    "decode_blob",
]

BACKEND_ID = "FusedCpuBackend"
MAGIC = b"XFC1"
FORMAT_VERSION = 2
ALIGNMENT = 16
_PRELUDE = struct.Struct("<4sII")
_HEADER_KEYS = ("values", "inputs", "outputs", "constants", "ops", "inplace")

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16,
    "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
}  # fmt: skip
_ENUMS: dict[str, dict[str, Any]] = {
    "dtype": DTYPES,
    "layout": {"strided": torch.strided},
    "memory_format": {
        "contiguous_format": torch.contiguous_format,
        "preserve_format": torch.preserve_format,
        "channels_last": torch.channels_last,
    },
    "device": {"cpu": torch.device("cpu")},
}


class FusedCpuBlobError(ValueError):
    """A malformed blob; the message names the field."""


class OpRow(
    record("OpRow", "name node args kwargs outs multi inplace normalized", defaults=(None,))
):
    """One decoded op: table name, arguments (``Ref`` for slots), output slots. ``normalized``:
    the arguments as :func:`.kernels.normalize` gives them, when decoding already made them
    (the executor binds from them instead of normalizing again)."""

    __slots__ = ()
    name: str
    node: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outs: tuple[int, ...]
    multi: bool
    inplace: bool
    normalized: tuple[tuple[Any, ...], dict[str, Any]] | None


class Blob(record("Blob", "num_values inputs outputs constants ops")):
    """A decoded, validated blob."""

    __slots__ = ()
    num_values: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    constants: tuple[tuple[int, torch.Tensor], ...]
    ops: tuple[OpRow, ...]


def fail(field: str, why: str) -> FusedCpuBlobError:
    return FusedCpuBlobError(f"fused_cpu blob: {field}: {why}")


def _int(x: Any, field: str, limit: int | None = None) -> int:
    if type(x) is not int or x < 0 or (limit is not None and x >= limit):  # JSON: no subclasses
        raise fail(field, f"expected an integer in [0, {limit}); got {x!r}")
    return x


def _list(x: Any, field: str) -> list[Any]:
    if not isinstance(x, list):
        raise fail(field, f"expected a list; got {type(x).__name__}")
    return x


# the types JSON decodes scalars to (exactly these: json.loads makes no subclasses)
_SCALARS = frozenset({type(None), bool, int, str, float})


def _arg(x: Any, field: str, slots: int) -> Any:
    if type(x) in _SCALARS:
        return x
    if type(x) is list:
        if all(type(v) in _SCALARS for v in x):  # sizes, strides, ...: no per-item fields
            return list(x)
        return [_arg(v, f"{field}[{i}]", slots) for i, v in enumerate(x)]
    if isinstance(x, dict) and len(x) == 1:
        ((kind, value),) = x.items()
        if kind == "v":
            return Ref(_int(value, field, slots))
        if kind == "float" and value in ("inf", "-inf", "nan"):
            return float(value)
        table = _ENUMS.get(kind)
        if table is not None and isinstance(value, str) and value in table:
            return table[value]
    raise fail(field, f"unknown argument encoding {x!r}")


def _op(entry: Any, i: int, slots: int, inplace: Any) -> OpRow:
    field = f"ops[{i}]"
    row = _list(entry, field)
    if len(row) != 5:
        raise fail(field, f"expected [op, args, kwargs, outs, node]; got {len(row)} items")
    name, args, kwargs, outs, node = row
    if not isinstance(name, str) or name not in KERNELS:
        raise fail(f"{field}.op", f"op {name!r} is not one the fused_cpu backend runs")
    if not isinstance(kwargs, dict) or not isinstance(node, str):
        raise fail(field, "kwargs must be an object and node a string")
    multi = isinstance(outs, list)
    out_slots = tuple(_int(o, f"{field}.outs", slots) for o in (outs if multi else [outs]))
    decoded_args = tuple(
        _arg(a, f"{field}.args[{k}]", slots) for k, a in enumerate(_list(args, f"{field}.args"))
    )
    decoded_kwargs = {str(k): _arg(v, f"{field}.kwargs.{k}", slots) for k, v in kwargs.items()}
    try:
        normalized = check_args(name, decoded_args, decoded_kwargs, len(out_slots), multi)
    except SchemaMismatch as e:
        raise fail(field, f"{name}: {e}") from None
    if inplace not in (0, 1) or isinstance(inplace, float):
        raise fail(f"inplace[{i}]", f"expected 0 or 1; got {inplace!r}")
    if inplace and KERNELS[name].inplace is None:
        raise fail(f"inplace[{i}]", f"{name} has no in-place form")
    return OpRow(name, node, decoded_args, decoded_kwargs, out_slots, multi, bool(inplace),
                 normalized)


def _constant(
    entry: Any, i: int, slots: int, data: torch.Tensor, start: tuple[int, int]
) -> tuple[int, torch.Tensor]:
    """Constant ``i``: a view of ``data``, the blob's data segment as bytes (:func:`_bytes`);
    ``start``: ``data``'s address and storage offset."""
    field = f"constants[{i}]"
    row = _list(entry, field)
    if len(row) != 5:
        raise fail(field, "expected [slot, dtype, shape, offset, nbytes]")
    slot, dtype_name, shape, offset, nbytes = row
    slot = _int(slot, f"{field}.slot", slots)
    dtype = DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
    if dtype is None:
        raise fail(f"{field}.dtype", f"unknown dtype {dtype_name!r}")
    shape_field = f"{field}.shape"
    dims = [_int(d, shape_field, 1 << 40) for d in _list(shape, shape_field)]
    offset, nbytes = _int(offset, f"{field}.offset"), _int(nbytes, f"{field}.nbytes")
    numel = math.prod(dims)
    if numel * dtype.itemsize != nbytes or offset + nbytes > len(data):
        raise fail(
            field,
            f"{nbytes} bytes at offset {offset} do not hold {dims} {dtype_name} "
            f"inside the {len(data)}-byte data segment",
        )
    if not nbytes:
        return slot, torch.empty(dims, dtype=dtype)
    # A view of the blob, not a copy: the blob views the program's bytes or its mapped file,
    # which the loaded program keeps alive (and the tensor keeps its buffer alive). The
    # executor never writes a constant (plan.inplace_hazard), so read-only memory is fine.
    raw = data[offset : offset + nbytes]
    if (start[0] + offset) % dtype.itemsize or (start[1] + offset) % dtype.itemsize:
        raw = raw.clone()  # a blob not laid out by preprocess: own copy
    return slot, raw.view(dtype).view(dims)


def _bytes(data: memoryview) -> torch.Tensor:
    """The data segment as one uint8 tensor viewing it (constants slice it: one
    ``frombuffer``, and one warning filter, per blob instead of per constant)."""
    if not len(data):
        return torch.empty(0, dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        return torch.frombuffer(data, dtype=torch.uint8)


def _header(blob: bytes | memoryview) -> tuple[dict[str, Any], memoryview]:
    view = memoryview(blob).cast("B")
    if len(view) < _PRELUDE.size:
        raise fail("header", f"blob of {len(view)} bytes is too short")
    magic, version, length = _PRELUDE.unpack_from(view)
    if magic != MAGIC:
        raise fail("magic", f"expected {MAGIC!r}; got {bytes(magic)!r} (not a fused_cpu blob)")
    if version != FORMAT_VERSION:
        raise fail(
            "version",
            f"format version {version}; this runtime reads {FORMAT_VERSION} "
            "(re-lower the program with the matching exportir)",
        )
    start = _PRELUDE.size
    if start + length > len(view):
        raise fail("header", f"header of {length} bytes runs past the blob end")
    try:
        header = json.loads(bytes(view[start : start + length]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise fail("header", f"not valid JSON ({type(e).__name__}: {e})") from None
    if not isinstance(header, dict):
        raise fail("header", "expected a JSON object")
    data_start = -(-(start + length) // ALIGNMENT) * ALIGNMENT
    return header, view[min(data_start, len(view)) :]


def decode_blob(blob: bytes | memoryview) -> Blob:
    """Validate and decode a blob; raises :class:`FusedCpuBlobError` naming the bad field."""
    header, data = _header(blob)
    try:
        return _decode(header, data)
    except RecursionError:
        raise fail("header", "arguments nested too deeply") from None


def _decode(header: dict[str, Any], data: memoryview) -> Blob:
    for key in _HEADER_KEYS:
        if key not in header:
            raise fail(key, "missing")
    slots = _int(header["values"], "values", 1 << 24)
    ops = _list(header["ops"], "ops")
    inplace = _list(header["inplace"], "inplace")
    if len(inplace) != len(ops):
        raise fail("inplace", f"needs one entry per op ({len(ops)}); got {len(inplace)}")
    return Blob(
        num_values=slots,
        inputs=tuple(_int(s, "inputs", slots) for s in _list(header["inputs"], "inputs")),
        outputs=tuple(_int(s, "outputs", slots) for s in _list(header["outputs"], "outputs")),
        constants=_constants(_list(header["constants"], "constants"), slots, data),
        ops=tuple(_op(e, i, slots, inplace[i]) for i, e in enumerate(ops)),
    )


def _constants(entries: list[Any], slots: int, data: memoryview) -> tuple[tuple[int, Any], ...]:
    if not entries:
        return ()
    segment = _bytes(data)
    start = (segment.data_ptr(), segment.storage_offset())
    return tuple(_constant(c, i, slots, segment, start) for i, c in enumerate(entries))
