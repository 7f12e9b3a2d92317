"""A safetensors-compatible tensor container, written and read without third-party code.

Layout (the safetensors format, https://github.com/huggingface/safetensors):

    u64 little-endian N | N bytes of UTF-8 JSON header | data buffer

The header maps each tensor name to ``{"dtype": "F32", "shape": [..], "data_offsets": [b, e]}``
(offsets relative to the data buffer) plus an optional ``"__metadata__"`` string->string map.
Tensors are row-major, little-endian, packed in header order with no holes or overlaps, exactly
as the safetensors library writes them, so ``safetensors.safe_open`` can read our files for the
dtypes it knows. A few dtypes safetensors has no name for get extension names (``C128``, ...).

Reading never allocates more than the bytes actually present: every claim in the header
(shape, dtype size, offsets) is checked against the buffer length before a tensor is built.
"""

from __future__ import annotations

import struct
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from exportir.export.serialize.common import (
    LIMITS,
    SerializationError,
    as_dict,
    as_int,
    as_list,
    as_str,
    check_keys,
    dumps_json,
    fail,
    guarded,
    loads_json,
)

__all__ = ["DTYPE_TO_TAG", "TAG_TO_DTYPE", "decode_tensors", "encode_tensors"]

# safetensors dtype tags; entries after the blank line are exportir extensions.
DTYPE_TO_TAG: dict[torch.dtype, str] = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.uint16: "U16",
    torch.int32: "I32",
    torch.uint32: "U32",
    torch.int64: "I64",
    torch.uint64: "U64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.float8_e8m0fnu: "F8_E8M0",
    torch.complex64: "C64",

    torch.complex32: "C32",
    torch.complex128: "C128",
    torch.float8_e4m3fnuz: "F8_E4M3FNUZ",
    torch.float8_e5m2fnuz: "F8_E5M2FNUZ",
}
TAG_TO_DTYPE: dict[str, torch.dtype] = {tag: dtype for dtype, tag in DTYPE_TO_TAG.items()}

_META_KEY = "__metadata__"


@dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


# --------------------------------------------------------------------------- writing


def _tensor_bytes(name: str, tensor: torch.Tensor) -> bytes:
    """Row-major little-endian bytes of a dense CPU-readable tensor."""
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        raise _save_error(name, f"tensor subclass {type(tensor).__qualname__} is not supported")
    if tensor.layout != torch.strided:
        raise _save_error(name, f"layout {tensor.layout} is not supported (only torch.strided)")
    if tensor.dtype not in DTYPE_TO_TAG:
        raise _save_error(name, f"dtype {tensor.dtype} is not supported")
    if tensor.device.type == "meta":
        raise _save_error(name, "it is a meta tensor and has no data")
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).numpy().tobytes()


def _save_error(name: str, what: str) -> SerializationError:
    return SerializationError(f"cannot save tensor {name!r}: {what}")


def encode_tensors(
    tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> bytes:
    """The container bytes for ``tensors`` (names in the given order)."""
    if sys.byteorder != "little":
        raise _save_error("*", "big-endian hosts are not supported")
    header: dict[str, object] = {}
    if metadata:
        header[_META_KEY] = dict(metadata)
    chunks: list[bytes] = []
    offset = 0
    for name, tensor in tensors.items():
        data = _tensor_bytes(name, tensor)
        header[name] = {
            "dtype": DTYPE_TO_TAG[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    head = dumps_json(header)
    head += b" " * (-len(head) % 8)  # the data buffer starts 8-byte aligned
    return b"".join([struct.pack("<Q", len(head)), head, *chunks])


# --------------------------------------------------------------------------- reading


def _parse_entry(name: str, raw: object, where: str) -> _Entry:
    spec = as_dict(raw, f"{where}/{name}")
    check_keys(spec, {"dtype", "shape", "data_offsets"}, set(), f"{where}/{name}")
    tag = as_str(spec["dtype"], f"{where}/{name}/dtype")
    dtype = TAG_TO_DTYPE.get(tag)
    if dtype is None:
        fail(f"{where}/{name}/dtype", f"unknown dtype {tag!r} (known: {sorted(TAG_TO_DTYPE)})")
    dims = as_list(spec["shape"], f"{where}/{name}/shape")
    if len(dims) > LIMITS.max_rank:
        fail(f"{where}/{name}/shape", f"rank {len(dims)} exceeds {LIMITS.max_rank}")
    shape = tuple(as_int(d, f"{where}/{name}/shape/{i}", lo=0, hi=LIMITS.max_dim)
                  for i, d in enumerate(dims))
    offsets = as_list(spec["data_offsets"], f"{where}/{name}/data_offsets")
    if len(offsets) != 2:
        fail(f"{where}/{name}/data_offsets", "expected [begin, end]")
    begin, end = (as_int(o, f"{where}/{name}/data_offsets/{i}", lo=0) for i, o in enumerate(offsets))
    return _Entry(name, dtype, shape, begin, end)


def _check_layout(entries: list[_Entry], buffer_len: int, where: str) -> None:
    """Offsets must tile the buffer exactly; each tensor's byte size must match its shape."""
    cursor = 0
    for entry in sorted(entries, key=lambda e: (e.begin, e.end)):
        at = f"{where}/{entry.name}/data_offsets"
        if entry.begin != cursor:
            what = "overlaps the previous tensor" if entry.begin < cursor else "leaves a hole"
            fail(at, f"[{entry.begin}, {entry.end}] {what} (expected begin {cursor})")
        numel = 1
        for d in entry.shape:
            numel *= d
        want = numel * entry.dtype.itemsize
        if entry.end - entry.begin != want:
            fail(at, f"{entry.end - entry.begin} bytes, but shape {list(entry.shape)} of "
                     f"{entry.dtype} needs {want}")
        cursor = entry.end
    if cursor != buffer_len:
        fail(where, f"data buffer is {buffer_len} bytes but tensors cover {cursor}")


def _build(entry: _Entry, data: memoryview) -> torch.Tensor:
    if entry.begin == entry.end:
        return torch.empty(entry.shape, dtype=entry.dtype)
    raw = torch.frombuffer(bytearray(data[entry.begin:entry.end]), dtype=torch.uint8)
    return raw.view(entry.dtype).reshape(entry.shape)


def _split_header(blob: bytes, where: str) -> tuple[bytes, memoryview]:
    if len(blob) < 8:
        fail(where, f"truncated: {len(blob)} bytes, the 8-byte header length is missing")
    (head_len,) = struct.unpack_from("<Q", blob, 0)
    if head_len > LIMITS.max_tensor_header:
        fail(f"{where}@0", f"header length {head_len} exceeds {LIMITS.max_tensor_header}")
    if 8 + head_len > len(blob):
        fail(f"{where}@0", f"header length {head_len} runs past the end ({len(blob)} bytes)")
    return blob[8:8 + head_len], memoryview(blob)[8 + head_len:]


def _read_header(buffer: Any, where: str) -> tuple[list[_Entry], dict[str, str], Any]:
    """The checked entries, the ``__metadata__`` map and the data bytes of a container."""
    head, data = _split_header(buffer, where)
    header = as_dict(loads_json(bytes(head), f"{where} header"), f"{where} header")
    metadata = as_dict(header.pop(_META_KEY, {}), f"{where}/{_META_KEY}")
    for key, value in metadata.items():
        as_str(value, f"{where}/{_META_KEY}/{key}")
    entries = [_parse_entry(name, raw, where) for name, raw in header.items()]
    _check_layout(entries, len(data), where)
    return entries, metadata, data


def decode_tensors(blob: bytes, where: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors (in header order) and the ``__metadata__`` map of a container."""
    entries, metadata, data = _read_header(blob, where)
    tensors = {e.name: guarded(f"{where}/{e.name}", lambda e=e: _build(e, data), "bad tensor")
               for e in entries}
    return tensors, metadata


def _view(entry: _Entry, data: memoryview) -> torch.Tensor:
    if entry.begin == entry.end:
        return torch.empty(entry.shape, dtype=entry.dtype)
    with warnings.catch_warnings():  # a read-only mapping: the tensors are only read
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        raw = torch.frombuffer(data[entry.begin:entry.end], dtype=torch.uint8)
    return raw.view(entry.dtype).reshape(entry.shape)


def open_tensors(buffer: Any, where: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Like :func:`decode_tensors` over ``buffer`` (bytes or a memory map), but each tensor is a
    view of the buffer's bytes (nothing copied; read-only when the buffer is). The header is
    checked whole before any tensor is made."""
    entries, metadata, data = _read_header(buffer, where)
    tensors = {e.name: guarded(f"{where}/{e.name}", lambda e=e: _view(e, data), "bad tensor")
               for e in entries}
    return tensors, metadata
