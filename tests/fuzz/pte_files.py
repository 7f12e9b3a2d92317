"""Mutation of ExecuTorch .pte files: the flatbuffer's integers (offsets, lengths, indices,
enums, sizes), its bytes, the extended header and the segments, the way a hostile or damaged
file could differ from a written one. Deterministic in the ``random.Random`` it is given."""

from __future__ import annotations

import random
import struct

_INTERESTING = (0, 1, 2, 3, 4, 7, 8, 16, 255, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000,
                0xFFFFFFFF, 0xFFFFFFF0)


def _program_size(data: bytes) -> int:
    if data[8:12] == b"eh00":
        return min(len(data), struct.unpack_from("<Q", data, 16)[0])
    return len(data)


def _set_u32(data: bytearray, rng: random.Random, end: int) -> str:
    at = rng.randrange(0, max(end - 4, 1)) & ~3
    old = struct.unpack_from("<I", data, at)[0]
    new = rng.choice((*_INTERESTING, old + rng.choice((-8, -4, -1, 1, 4, 8)) & 0xFFFFFFFF))
    struct.pack_into("<I", data, at, new)
    return f"u32 at {at}: {old} -> {new}"


def _set_u16(data: bytearray, rng: random.Random, end: int) -> str:
    at = rng.randrange(0, max(end - 2, 1)) & ~1
    new = rng.choice((0, 2, 4, 6, 0xFFFF, 0x8000, rng.randrange(0, 64)))
    struct.pack_into("<H", data, at, new)
    return f"u16 at {at} -> {new}"


def _flip(data: bytearray, rng: random.Random, end: int) -> str:
    at = rng.randrange(0, end)
    data[at] ^= 1 << rng.randrange(8)
    return f"bit flip at {at}"


def _header(data: bytearray, rng: random.Random, end: int) -> str:
    field = rng.choice((16, 24, 32))  # program size, segment base, segment data size
    value = rng.choice((0, 1, len(data), len(data) + 1, 2**40, 2**63))
    if field + 8 <= len(data):
        struct.pack_into("<Q", data, field, value)
    return f"header u64 at {field} -> {value}"


def _truncate(data: bytearray, rng: random.Random, end: int) -> str:
    keep = rng.randrange(0, len(data))
    del data[keep:]
    return f"truncated to {keep} bytes"


def _segment_bytes(data: bytearray, rng: random.Random, end: int) -> str:
    if end >= len(data):
        return _flip(data, rng, end)
    at = rng.randrange(end, len(data))
    data[at] = rng.randrange(256)
    return f"segment byte at {at}"


_MUTATIONS = ((_set_u32, 6), (_set_u16, 2), (_flip, 2), (_header, 1), (_truncate, 1),
              (_segment_bytes, 1))


def mutate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    out = bytearray(data)
    end = _program_size(data)
    notes = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        fn = rng.choices([m for m, _ in _MUTATIONS], [w for _, w in _MUTATIONS])[0]
        if not out:
            break
        notes.append(fn(out, rng, min(end, len(out))))
    return bytes(out), "; ".join(notes)
