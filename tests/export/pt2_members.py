"""torch .pt2 archives in tests: saved into memory, loaded quietly, and as ``{member name:
bytes}`` and back for tests that hand-edit them."""

from __future__ import annotations

import io
import warnings
import zipfile
from typing import Any


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


def torch_saved(ep: Any) -> io.BytesIO:
    """``torch.export.save(ep)`` into memory, rewound."""
    import torch.export

    buf = io.BytesIO()
    torch.export.save(ep, buf)
    buf.seek(0)
    return buf


def load_quietly(f: Any) -> Any:
    """``exportir.load(f)`` without the UserWarnings a torch archive raises (skipped members)."""
    import exportir

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return exportir.load(f)
