"""CRC-32 for the program file's checksums.

ISA-L's ``crc32`` (the ``isal`` package) computes the same CRC-32 as ``zlib.crc32`` (same
polynomial, same ``value`` chaining), about ten times faster on x86-64 and arm64 (carry-less
multiply): 24 GB/s against zlib 1.2.13's 2.2 GB/s measured here. It is what a load spends
checking a program's weights (docs/runtime.md, "Load time and memory"). Without the package,
zlib's is used; files are the same either way.
"""

from __future__ import annotations

try:
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - the package is a dependency; this keeps a bare install working
    from zlib import crc32

__all__ = ["crc32"]
