"""``exportir.load`` bounds what a .pt2 makes it read (``ArchiveLimits``): the issue's "a 1.5 MiB
.pt2 whose weights inflate to 1.5 GiB (the per-member limit is 1 TiB)" is refused from the zip
directory, before anything is inflated, with a typed error naming the member and the limit."""

from __future__ import annotations

import io
import os
import zipfile

import pytest
import torch

import exportir
from exportir.export.serialize import ArchiveLimitError, ArchiveLimits


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).relu()


def _saved() -> bytes:
    buf = io.BytesIO()
    exportir.save(exportir.export(Net(), (torch.randn(2, 4),)), buf)
    return buf.getvalue()


def _rezip(data: bytes, replace: dict[str, object] | None = None, deflate: bool = False) -> bytes:
    """The archive with every member copied (deflated if asked) and some replaced by a
    callable writing their new contents, deflated."""
    out = io.BytesIO()
    kind = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            if replace and info.filename in replace:
                member = zipfile.ZipInfo(info.filename)
                member.compress_type = zipfile.ZIP_DEFLATED
                with dst.open(member, "w", force_zip64=True) as f:
                    replace[info.filename](f)
                continue
            dst.writestr(info.filename, src.read(info.filename), compress_type=kind)
    return out.getvalue()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _bomb(name: str) -> bytes:
    """The saved archive with member ``name`` replaced by 1.5 GiB of zeros, deflated
    (~1.5 MiB)."""

    def gigabytes(f):
        chunk = bytes(64 << 20)
        for _ in range(24):
            f.write(chunk)

    return _rezip(_saved(), {name: gigabytes})


def test_weights_inflating_to_gigabytes_are_refused_before_inflating():
    data = _bomb("weights.safetensors")
    assert len(data) < 2 << 20
    before = _rss() if os.path.exists("/proc/self/statm") else 0
    with pytest.raises(ArchiveLimitError) as info:
        exportir.load(io.BytesIO(data))
    assert info.value.limit == "max_inflated_bytes"
    assert "weights.safetensors" in str(info.value) and "ArchiveLimits" in str(info.value)
    if before:
        assert _rss() - before < 256 << 20


def test_deflated_archives_within_the_limits_load():
    saved = _saved()
    data = _rezip(saved, deflate=True)
    ep = exportir.load(io.BytesIO(data))
    x = torch.randn(2, 4)
    torch.testing.assert_close(ep.module()(x), exportir.load(io.BytesIO(saved)).module()(x))
    with pytest.raises(ArchiveLimitError, match="max_inflated_bytes"):
        exportir.load(io.BytesIO(data), limits=ArchiveLimits(max_inflated_bytes=100))


def test_the_json_limit_is_settable():
    data = _saved()
    exportir.load(io.BytesIO(data), limits=ArchiveLimits(max_json_bytes=1 << 20))
    with pytest.raises(ArchiveLimitError) as info:
        exportir.load(io.BytesIO(data), limits=ArchiveLimits(max_json_bytes=100))
    assert info.value.limit == "max_json_bytes"
