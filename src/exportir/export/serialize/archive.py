"""The zip container: a manifest naming the format version and every member's size and SHA-256.

Writing is deterministic (fixed timestamps, members stored uncompressed in a fixed order), so
saving the same program twice gives identical bytes. Reading checks, before using a member:
the member exists once, its compression is ``stored`` or ``deflate``, its size is within the
limits (and, for ``deflate``, plausible for its compressed size), and its SHA-256 matches the
manifest. Any failure of the zip layer becomes a :class:`SerializationError` naming the member.
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any, Self

from exportir.export.serialize.common import (
    FORMAT_MAJOR,
    FORMAT_MINOR,
    FORMAT_NAME,
    LIMITS,
    SerializationError,
    as_dict,
    as_int,
    as_list,
    as_str,
    check_keys,
    dumps_json,
    fail,
    loads_json,
)

__all__ = ["DEFAULT_ARCHIVE_LIMITS", "MANIFEST", "Archive", "ArchiveLimitError", "ArchiveLimits",
           "write_archive"]

MANIFEST = "manifest.json"
_EPOCH = (1980, 1, 1, 0, 0, 0)
# Everything the zip layer may raise on a damaged file.
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, OSError, EOFError, struct.error, ValueError,
               NotImplementedError, KeyError, RuntimeError, OverflowError, IndexError,
               UnicodeDecodeError)



@dataclass(frozen=True, slots=True)
class ArchiveLimits:
    """What a saved program may make ``exportir.load`` read, beyond the file's own bytes.

    A stored member is read as the bytes the file holds (it cannot claim more than the
    archive's size); a deflated member can claim ~1000x its compressed size, so deflated
    members together may inflate to at most ``max_inflated_bytes`` (``exportir.save`` stores
    every member; deflated ones come from other zip tools). ``max_json_bytes`` bounds
    ``program.json`` and ``manifest.json``. Checked from the zip directory before any member
    is read; a breach is an :class:`ArchiveLimitError` naming the member and the field.
    """

    max_inflated_bytes: int = 1 << 30
    max_json_bytes: int = 1 << 28


DEFAULT_ARCHIVE_LIMITS = ArchiveLimits()


class ArchiveLimitError(SerializationError):
    """An archive asks for more than an :class:`ArchiveLimits` bound allows; ``limit`` names
    the field (``"max_inflated_bytes"``)."""

    def __init__(self, message: str, limit: str) -> None:
        self.limit = limit
        super().__init__(
            f"{message}; if you trust this file, load it with a larger "
            f"exportir.load(..., limits=ArchiveLimits({limit}=...)) "
            "(exportir.export.serialize.archive.ArchiveLimits)")


# --------------------------------------------------------------------------- writing


def _member(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_EPOCH)
    info.compress_type = zipfile.ZIP_STORED
    info.external_attr = 0o644 << 16
    zf.writestr(info, data)


def write_archive(f: str | os.PathLike[str] | IO[bytes], members: Mapping[str, bytes],
                  producer: Mapping[str, str]) -> None:
    """Write ``manifest.json`` then ``members`` (in order) to the path or binary file ``f``."""
    manifest = {
        "format": FORMAT_NAME,
        "version": [FORMAT_MAJOR, FORMAT_MINOR],
        "producer": dict(producer),
        "entries": {name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                    for name, data in members.items()},
    }
    target = os.fspath(f) if isinstance(f, (str, os.PathLike)) else f
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as zf:
        _member(zf, MANIFEST, dumps_json(manifest))
        for name, data in members.items():
            _member(zf, name, data)
    if hasattr(f, "flush"):
        f.flush()


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class _Expected:
    size: int
    sha256: str


def _check_version(manifest: dict[str, Any]) -> tuple[int, int]:
    fmt = as_str(manifest["format"], f"{MANIFEST}/format")
    if fmt != FORMAT_NAME:
        fail(f"{MANIFEST}/format", f"{fmt!r:.60} is not an exportir program ({FORMAT_NAME!r})")
    version = as_list(manifest["version"], f"{MANIFEST}/version")
    if len(version) != 2:
        fail(f"{MANIFEST}/version", "expected [major, minor]")
    major, minor = (as_int(v, f"{MANIFEST}/version/{i}", lo=0) for i, v in enumerate(version))
    if major != FORMAT_MAJOR or minor > FORMAT_MINOR:
        fail(f"{MANIFEST}/version", f"format version {major}.{minor} is not supported; this "
             f"exportir reads {FORMAT_MAJOR}.0 to {FORMAT_MAJOR}.{FORMAT_MINOR} (save the program "
             "again with this version, or upgrade exportir)")
    return major, minor


def _parse_entries(manifest: dict[str, Any]) -> dict[str, _Expected]:
    where = f"{MANIFEST}/entries"
    entries = as_dict(manifest["entries"], where)
    if len(entries) > LIMITS.max_entries:
        fail(where, f"{len(entries)} entries exceed the limit {LIMITS.max_entries}")
    out: dict[str, _Expected] = {}
    for name, raw in entries.items():
        spec = as_dict(raw, f"{where}/{name}")
        check_keys(spec, {"size", "sha256"}, set(), f"{where}/{name}")
        size = as_int(spec["size"], f"{where}/{name}/size", lo=0, hi=LIMITS.max_entry_bytes)
        digest = as_str(spec["sha256"], f"{where}/{name}/sha256")
        if len(digest) != 64:
            fail(f"{where}/{name}/sha256", "expected 64 hex digits")
        out[name] = _Expected(size, digest)
    return out


class Archive:
    """A zip opened for reading with the manifest already validated."""

    __slots__ = ("_expected", "_limits", "_owned", "_zf", "producer", "version")

    def __init__(
        self, f: str | os.PathLike[str] | IO[bytes], limits: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS
    ) -> None:
        self._limits = limits
        # A path is opened here, so that OSErrors (missing file, permissions) propagate as
        # such; everything after that is about the file's contents.
        self._owned: IO[bytes] | None = None
        if isinstance(f, (str, os.PathLike)):
            self._owned = open(os.fspath(f), "rb")  # noqa: SIM115  # closed in close()
        try:
            self._zf = zipfile.ZipFile(self._owned if self._owned else _seekable(f), "r")
        except _ZIP_ERRORS as e:
            self._close_owned()
            fail("archive", f"not a readable zip file ({type(e).__name__}: {e})")
        try:
            self._read_manifest()
        except BaseException:
            self.close()
            raise

    def _read_manifest(self) -> None:
        self._check_members()
        manifest = as_dict(loads_json(self._read(MANIFEST, None), MANIFEST), MANIFEST)
        check_keys(manifest, {"format", "version", "producer", "entries"}, set(), MANIFEST)
        self.version = _check_version(manifest)
        self.producer = as_dict(manifest["producer"], f"{MANIFEST}/producer")
        self._expected = _parse_entries(manifest)

    def close(self) -> None:
        self._zf.close()
        self._close_owned()

    def _close_owned(self) -> None:
        if self._owned is not None:
            self._owned.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_members(self) -> None:
        infos = self._zf.infolist()
        if len(infos) > LIMITS.max_entries + 1:
            fail("archive", f"{len(infos)} members exceed the limit {LIMITS.max_entries}")
        names = [i.filename for i in infos]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            fail("archive", f"member {dup!r:.80} appears more than once")
        _check_inflation(infos, self._limits.max_inflated_bytes)

    def names(self) -> list[str]:
        return list(self._expected)

    def has(self, name: str) -> bool:
        return name in self._expected

    def read_json(self, name: str) -> bytes:
        """A JSON member's bytes (:meth:`read`), at most ``max_json_bytes`` of them."""
        return self.read(name, json=True)

    def read(self, name: str, *, json: bool = False) -> bytes:
        """A member's bytes, checked against the manifest's size and SHA-256."""
        expected = self._expected.get(name)
        if expected is None:
            fail(name, "missing from the manifest (file truncated or not written by save())")
        data = self._read(name, expected.size, json)
        if hashlib.sha256(data).hexdigest() != expected.sha256:
            fail(name, "SHA-256 does not match the manifest (the file was modified or damaged)")
        return data

    def _read(self, name: str, size: int | None, json: bool = True) -> bytes:
        try:
            info = self._zf.getinfo(name)
        except KeyError:
            fail(name, "member missing from the archive (file truncated?)")
        return read_member(self._zf, info, name, size, self._limits, json)


def read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, size: int | None,
                limits: ArchiveLimits, json: bool) -> bytes:
    """Member ``info`` of ``zf`` (reported as ``name``), its directory entry checked against
    ``size`` (when known), the archive's size and ``limits`` first; never more than the
    claimed size is inflated, and a member shorter or longer than its claim is refused."""
    _check_info(info, size, archive_size(zf), limits, json)
    try:
        with zf.open(info) as member:
            data = member.read(info.file_size + 1)
    except _ZIP_ERRORS as e:
        fail(name, f"cannot read member ({type(e).__name__}: {e})")
    if len(data) != info.file_size:
        fail(name, f"member has {len(data)} bytes, the zip directory says {info.file_size}")
    return data


def archive_size(zf: zipfile.ZipFile) -> int:
    """The size of ``zf``'s file (the largest any member may claim); the entry limit when the
    file cannot tell."""
    fp = zf.fp
    try:
        here = fp.tell()
        end = fp.seek(0, io.SEEK_END)
        fp.seek(here)
    except (OSError, AttributeError, ValueError):
        return LIMITS.max_entry_bytes
    return end


def _check_inflation(infos: list[zipfile.ZipInfo], cap: int) -> None:
    """Deflated members together inflate to at most ``cap`` bytes (from the zip directory's
    claims; reading stops at a member's claimed size, so the claims bound what is inflated)."""
    total = 0
    for info in infos:
        if info.compress_type != zipfile.ZIP_DEFLATED:
            continue
        total += info.file_size
        if total > cap:
            raise ArchiveLimitError(
                f"{info.filename}: deflated members inflate to more than {total} bytes (this "
                f"one: {info.file_size} from {info.compress_size}), more than "
                f"max_inflated_bytes ({cap})", "max_inflated_bytes")


def _check_info(
    info: zipfile.ZipInfo, size: int | None, archive_size: int, limits: ArchiveLimits, json: bool
) -> None:
    name = info.filename
    if info.flag_bits & 0x1:
        fail(name, "member is encrypted")
    if info.compress_type == zipfile.ZIP_STORED:
        if info.compress_size != info.file_size or info.file_size > archive_size:
            fail(name, f"stored member claims {info.file_size} bytes "
                       f"({info.compress_size} compressed, archive {archive_size})")
    elif info.compress_type == zipfile.ZIP_DEFLATED:
        if info.file_size > info.compress_size * LIMITS.max_deflate_ratio + 1024:
            fail(name, f"deflated member claims {info.file_size} bytes from "
                       f"{info.compress_size}: implausible compression ratio")
    else:
        fail(name, f"unsupported compression method {info.compress_type} (use stored or deflate)")
    if size is not None and info.file_size != size:
        fail(name, f"member has {info.file_size} bytes, the manifest says {size}")
    if json and info.file_size > limits.max_json_bytes:
        raise ArchiveLimitError(f"{name}: member of {info.file_size} bytes exceeds "
                                f"max_json_bytes ({limits.max_json_bytes})", "max_json_bytes")
    if info.file_size > LIMITS.max_entry_bytes:
        fail(name, f"member of {info.file_size} bytes exceeds the limit {LIMITS.max_entry_bytes}")


def _seekable(f: IO[bytes]) -> IO[bytes]:
    """``f`` itself if it can seek, else its remaining bytes in memory."""
    try:
        if f.seekable():
            return f
    except (AttributeError, OSError, ValueError):
        pass
    return io.BytesIO(f.read())
