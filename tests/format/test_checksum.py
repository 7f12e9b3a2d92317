"""The program file's CRC-32 is zlib's, whichever library computes it."""

from __future__ import annotations

import os
import zlib

from exportir.format import _checksum


def test_the_fast_crc32_is_zlibs_crc32_including_chaining_and_views() -> None:
    data = os.urandom(1 << 20) + b"tail"
    view = memoryview(data)[5:]
    assert _checksum.crc32(view) == zlib.crc32(view)
    assert _checksum.crc32(b"") == zlib.crc32(b"") == 0
    running = 0
    for i in range(0, len(data), 65537):
        running = _checksum.crc32(data[i:i + 65537], running)
    assert running == zlib.crc32(data)


def test_the_fast_library_is_the_one_in_use() -> None:
    """``isal`` is a dependency (pyproject.toml): a load checks weights with ISA-L, not zlib."""
    assert _checksum.crc32.__module__.startswith("isal"), _checksum.crc32.__module__
