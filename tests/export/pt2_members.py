"""A .pt2 archive as ``{member name: bytes}`` and back, for tests that hand-edit archives."""

from __future__ import annotations

import io
import zipfile


def members(buf: io.BytesIO) -> dict[str, bytes]:
    with zipfile.ZipFile(buf) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def zip_members(parts: dict[str, bytes]) -> io.BytesIO:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in parts.items():
            zf.writestr(name, data)
    out.seek(0)
    return out
