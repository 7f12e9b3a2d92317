"""Program files: :class:`schema.Program` <-> bytes. Layout (all integers little-endian)::

    [header, 80 bytes][structure: zlib(compact JSON)][zero pad to 64][data segment]

The header carries the magic, the format version, the offsets and lengths of both sections and
CRC-32 checksums of the header, the structure and the data. The structure is canonical JSON
(sorted keys, no spaces) of tagged arrays; it names byte ranges of the data segment for the
constant buffers and delegate blobs. Each range starts at a multiple of ``buffer_alignment`` from
the segment start, which is 64-byte aligned in the file: the segment can be memory-mapped and
its tensors used in place. Reading never runs code from the file (no pickle), bounds every
allocation by the header's declared and checked lengths, and validates the whole program
(:mod:`validate`) before returning it. See ``docs/format/program-file.md``.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
import zlib
from dataclasses import dataclass
from typing import Any, BinaryIO

from exportir.format import _codec, schema
from exportir.format._checksum import crc32
from exportir.format.validate import (
    DEFAULT_LIMITS,
    LoadLimits,
    ProgramLoadError,
    ResourceLimitError,
    validate_program,
)

__all__ = [
    "FileLayout",
    "ProgramLoadError",
    "deserialize_program",
    "load",
    "read_layout",
    "save",
    "serialize_program",
]

MAGIC = b"EXPORTIR"
FORMAT_MINOR = schema.MINOR_VERSIONS[schema.FORMAT_VERSION]  # 2.1: symbolic input sizes
SEGMENT_ALIGNMENT = 64
_HEADER = struct.Struct("<8sHHIQQQQQQIII")  # see FileLayout
HEADER_SIZE = 80
_HEADER_CRC_SPAN = _HEADER.size - 4  # the header CRC covers everything before it
_PAD = HEADER_SIZE - _HEADER.size


@dataclass(frozen=True, slots=True)
class FileLayout:
    """Where the sections of a program file are (from its header) and what the data holds."""

    major: int
    minor: int
    flags: int
    file_size: int
    structure_offset: int
    structure_length: int
    structure_raw_length: int
    data_offset: int
    data_length: int
    structure_crc: int
    data_crc: int
    header_crc: int

    @property
    def header_size(self) -> int:
        return HEADER_SIZE


def _align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


# ------------------------------------------------------------------------------ writing


def _data_layout(
    program: schema.Program, alignment: int
) -> tuple[list[tuple[int, int]], list[tuple[int, int]], int]:
    """Offsets (relative to the data segment) of constants then delegate blobs, and the size."""
    cursor = 0
    constants, delegates = [], []
    for c in program.constants:
        constants.append((cursor, c.nbytes))
        cursor = _align(cursor + c.nbytes, alignment)
    for d in program.delegates:
        delegates.append((cursor, d.nbytes))
        cursor = _align(cursor + d.nbytes, alignment)
    return constants, delegates, cursor


def _major(program: schema.Program) -> int:
    """The header's major version: the program's (3 for loops), 2 for anything older."""
    return max(program.version, schema.FORMAT_VERSION)


def _minor(program: schema.Program) -> int:
    """The header's minor version: 2.2 / 3.1 when a method shares state, else the major's."""
    major = _major(program)
    if any(m.shared_state for m in program.methods):
        return schema.SHARED_STATE_MINOR.get(major, 0)
    return schema.MINOR_VERSIONS.get(major, 0)


def _blobs(program: schema.Program) -> list[bytes | memoryview]:
    return [c.data for c in program.constants] + [d.data for d in program.delegates]


def _encode(program: schema.Program, buffer_alignment: int) -> tuple[bytes, int, int, list[Any]]:
    if buffer_alignment <= 0 or SEGMENT_ALIGNMENT % buffer_alignment:
        raise ValueError(f"buffer_alignment must divide {SEGMENT_ALIGNMENT}; got {buffer_alignment}")
    constants, delegates, data_len = _data_layout(program, buffer_alignment)
    tree = _codec.encode_program(program, constants, delegates)
    raw = json.dumps(tree, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()
    return raw, data_len, buffer_alignment, constants + delegates


def _write_sections(
    out: BinaryIO | Any, program: schema.Program, buffer_alignment: int
) -> None:
    raw, data_len, _, ranges = _encode(program, buffer_alignment)
    compressed = zlib.compress(raw, 9)
    structure_offset = HEADER_SIZE
    data_offset = _align(structure_offset + len(compressed), SEGMENT_ALIGNMENT)
    data_crc = 0
    chunks: list[bytes | memoryview] = []
    cursor = 0
    for (offset, nbytes), blob in zip(ranges, _blobs(program)):
        if offset > cursor:
            chunks.append(bytes(offset - cursor))
        chunks.append(blob)
        cursor = offset + nbytes
    if data_len > cursor:
        chunks.append(bytes(data_len - cursor))
    for chunk in chunks:
        data_crc = crc32(chunk, data_crc)
    fields = [
        MAGIC, _major(program), _minor(program), 0,
        data_offset + data_len, structure_offset,
        len(compressed), len(raw), data_offset, data_len, crc32(compressed), data_crc, 0,
    ]
    head = _HEADER.pack(*fields)
    fields[-1] = crc32(head[:_HEADER_CRC_SPAN])
    out.write(_HEADER.pack(*fields) + bytes(_PAD))
    out.write(compressed)
    out.write(bytes(data_offset - structure_offset - len(compressed)))
    for chunk in chunks:
        out.write(chunk)


class _Collect:
    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []

    def write(self, b: bytes | memoryview) -> None:
        self.parts.append(b)


def serialize_program(program: schema.Program, *, buffer_alignment: int = 16) -> bytes:
    """The bytes of ``program``'s file. Deterministic: equal programs give equal bytes."""
    sink = _Collect()
    _write_sections(sink, program, buffer_alignment)
    return b"".join(sink.parts)


def save(program: schema.Program, path: str | os.PathLike[str], *, buffer_alignment: int = 16
         ) -> None:
    """Write ``program`` to ``path`` (streamed: weights are not copied into one buffer)."""
    replace_file(path, lambda f: _write_sections(f, program, buffer_alignment))


def replace_file(path: str | os.PathLike[str], write: Any) -> None:
    """Call ``write(f)`` on a new file beside ``path``, then move it over ``path`` in one step.

    A loaded program maps its file; truncating that file in place would make the mapped pages
    vanish under a running method (SIGBUS on the next read). Writing a new file and renaming
    it leaves the old file alive for whoever still maps it, and never leaves a half-written
    file at ``path`` when writing fails.
    """
    target = os.fspath(path)
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


# ------------------------------------------------------------------------------ reading


def read_layout(data: bytes | bytearray | memoryview | mmap.mmap) -> FileLayout:
    """Parse and check the header against the buffer; raise :class:`ProgramLoadError`."""
    view = memoryview(data)
    size = view.nbytes
    if size < HEADER_SIZE:
        raise ProgramLoadError(f"file is {size} bytes; a program header needs {HEADER_SIZE}",
                               "header", 0)
    fields = _HEADER.unpack_from(view, 0)
    if fields[0] != MAGIC:
        raise ProgramLoadError(f"bad magic {bytes(fields[0])!r} (expected {MAGIC!r}): not an "
                               "exportir program file", "header.magic", 0)
    layout = FileLayout(*fields[1:])
    if crc32(view[:_HEADER_CRC_SPAN]) != layout.header_crc:
        raise ProgramLoadError("header checksum mismatch (corrupted header)", "header.crc",
                               _HEADER_CRC_SPAN)
    if layout.major not in schema.READABLE_VERSIONS:
        readable = " and ".join(f"{v}.x" for v in schema.READABLE_VERSIONS)
        raise ProgramLoadError(f"format version {layout.major}.{layout.minor} is not supported "
                               f"(this reader reads {readable})", "header.version", 8)
    if layout.file_size != size:
        raise ProgramLoadError(f"header says the file has {layout.file_size} bytes; it has {size} "
                               "(truncated or extended)", "header.file_size", 16)
    _check_range("structure", layout.structure_offset, layout.structure_length, size, 24)
    _check_range("data", layout.data_offset, layout.data_length, size, 56)
    if layout.data_offset % SEGMENT_ALIGNMENT:
        raise ProgramLoadError(f"data segment offset {layout.data_offset} is not "
                               f"{SEGMENT_ALIGNMENT}-byte aligned", "header.data_offset", 56)
    if layout.structure_offset < HEADER_SIZE or (
        layout.structure_offset + layout.structure_length > layout.data_offset
        and layout.data_length
    ):
        raise ProgramLoadError("structure section overlaps the header or the data segment",
                               "header.structure_offset", 24)
    return layout


def _check_range(name: str, offset: int, length: int, size: int, at: int) -> None:
    if offset > size or length > size - offset:
        raise ProgramLoadError(f"{name} section [{offset}, {offset + length}) lies outside the "
                               f"{size}-byte file", f"header.{name}", at)


_INFLATE_CHUNK = 1 << 20
_ITEM_MARKS = (b"[", b"{", b",")  # every JSON array, object and item but a container's first


def _inflate(compressed: memoryview, raw_length: int, limits: LoadLimits, at: int) -> bytes:
    """The structure's JSON, inflated a chunk at a time: stops as soon as it outgrows the
    header's length or ``max_structure_bytes``, or holds more than ``max_structure_items``
    arrays, objects and items (what parsing would turn into Python objects)."""
    cap = limits.max_structure_bytes
    if raw_length > cap:
        raise ResourceLimitError(
            f"the structure inflates to {raw_length} bytes (header), which exceeds the limit "
            f"max_structure_bytes ({cap})", "header.structure_raw_length",
            "max_structure_bytes", 40)
    d = zlib.decompressobj()
    chunks: list[bytes] = []
    size = items = 0
    pending = compressed
    try:
        while True:
            chunk = d.decompress(pending, min(_INFLATE_CHUNK, raw_length + 1 - size))
            pending = d.unconsumed_tail
            size += len(chunk)
            items += sum(chunk.count(mark) for mark in _ITEM_MARKS)
            chunks.append(chunk)
            if size > raw_length or d.eof or not chunk:
                break
            _check_items(items, limits, at)
    except zlib.error as e:
        raise ProgramLoadError(f"structure does not decompress: {e}", "structure", at) from None
    _check_items(items, limits, at)
    if size != raw_length or not d.eof or d.unused_data:
        raise ProgramLoadError(f"structure decompresses to a different length than the header's "
                               f"{raw_length} bytes", "structure", at)
    return b"".join(chunks)


def _check_items(items: int, limits: LoadLimits, at: int) -> None:
    if items > limits.max_structure_items:
        raise ResourceLimitError(
            f"the structure holds more than {limits.max_structure_items} JSON arrays, objects "
            "and items (max_structure_items)", "structure", "max_structure_items", at)


def deserialize_program(
    data: bytes | bytearray | memoryview | mmap.mmap,
    *,
    verify_data: bool = True,
    limits: LoadLimits = DEFAULT_LIMITS,
) -> schema.Program:
    """Read and fully validate a program; constant and delegate bytes are zero-copy views of
    ``data``. Any malformation raises :class:`ProgramLoadError` naming the field or offset."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    layout = read_layout(view)
    s0, s1 = layout.structure_offset, layout.structure_offset + layout.structure_length
    compressed = view[s0:s1]
    if crc32(compressed) != layout.structure_crc:
        raise ProgramLoadError("structure checksum mismatch (corrupted file)", "structure", s0)
    segment = view[layout.data_offset:layout.data_offset + layout.data_length]
    if verify_data and crc32(segment) != layout.data_crc:
        raise ProgramLoadError("data segment checksum mismatch (corrupted weights)", "data",
                               layout.data_offset)
    raw = _inflate(compressed, layout.structure_raw_length, limits, s0)
    try:
        tree = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise ProgramLoadError(f"structure is not valid JSON: {e}", "structure", s0) from None
    program = _codec.decode_program(tree, segment)
    validate_program(program, limits)
    return program


def load(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview,
    *,
    use_mmap: bool = True,
    verify_data: bool = True,
    limits: LoadLimits = DEFAULT_LIMITS,
) -> schema.Program:
    """Load a program from a path (memory-mapped by default) or from bytes."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return deserialize_program(source, verify_data=verify_data, limits=limits)
    with open(source, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise ProgramLoadError("file is empty", "header", 0)
        if use_mmap:
            data: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        else:
            data = f.read()
    return deserialize_program(data, verify_data=verify_data, limits=limits)
