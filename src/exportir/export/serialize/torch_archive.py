"""torch.export's .pt2 archive (``torch.export.save`` / ``torch.export.load``), both ways.

A .pt2 is a zip whose members all sit under one root folder::

    <root>/archive_format                  "pt2"
    <root>/archive_version, byteorder, .data/version, .data/serialization_id
    <root>/models/<name>.json              the program (torch's schema; torch_decode.py)
    <root>/data/weights/<name>_weights_config.json    fqn -> path_name, tensor_meta, use_pickle
    <root>/data/weights/weight_<i>         raw storage bytes
    <root>/data/constants/<name>_constants_config.json, tensor_<i>
    <root>/data/sample_inputs/<name>.pt    example inputs, pickled by torch.save
    <root>/extra/<file>

Reading never unpickles: a tensor stored pickled (``use_pickle``, custom objects, the legacy
``<name>.pt`` weights) is refused with a :class:`SerializationError` naming the member. The
sample inputs (a torch.save zip) are read by torch_pickle.py, which walks their pickle stream
without running it and accepts only plain tensors, numbers, strings and containers; anything
else is skipped with a warning (``example_inputs`` is ``None``). Sizes are
checked against the bytes present before any tensor is built; zip members go through the same
checks and :class:`ArchiveLimits` as our own format.
"""

from __future__ import annotations

import io
import os
import re
import secrets
import warnings
import zipfile
from typing import Any

import torch

from exportir.export.serialize.archive import (
    _ZIP_ERRORS,
    DEFAULT_ARCHIVE_LIMITS,
    ArchiveLimits,
    _check_inflation,
    _seekable,
    read_member,
)
from exportir.export.serialize.common import (
    LIMITS,
    SerializationError,
    as_bool,
    as_dict,
    as_int,
    as_list,
    as_str,
    dumps_json,
    fail,
    loads_json,
)
from exportir.export.serialize.torch_decode import decode_torch_program, dtype_of
from exportir.export.serialize.torch_encode import encode_torch_program, tensor_meta
from exportir.export.serialize.torch_pickle import pickle_inputs, read_pickled_inputs

__all__ = ["is_torch_archive", "load_torch_archive", "save_torch_archive"]

_PATH_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}\Z")
_MODEL = re.compile(r"models/([A-Za-z0-9_.-]{1,128})\.json\Z")
_MAX_ELEMENTS = 1 << 40


class _Zip:
    """A .pt2 opened for reading: members by path under the root folder, checked on read."""

    __slots__ = ("_owned", "_zf", "limits", "names", "root")

    def __init__(self, f: Any, limits: ArchiveLimits) -> None:
        self.limits = limits
        self._owned = open(os.fspath(f), "rb") if isinstance(f, (str, os.PathLike)) else None  # noqa: SIM115
        try:
            self._zf = zipfile.ZipFile(self._owned or _seekable(f), "r")
            infos = self._zf.infolist()
        except _ZIP_ERRORS as e:
            self.close()
            fail("archive", f"not a readable zip file ({type(e).__name__}: {e})")
        if len(infos) > LIMITS.max_entries + 16:
            self.close()
            fail("archive", f"{len(infos)} members exceed the limit {LIMITS.max_entries}")
        _check_inflation(infos, limits.max_inflated_bytes)
        names = [i.filename for i in infos]
        if len(set(names)) != len(names):
            self.close()
            fail("archive", "a member appears more than once")
        roots = {n.split("/", 1)[0] for n in names}
        if len(roots) != 1 or any("/" not in n for n in names):
            self.close()
            fail("archive", f"a .pt2 keeps every member under one root folder; found roots "
                            f"{sorted(roots)[:5]}")
        self.root = roots.pop()
        self.names = {n.split("/", 1)[1] for n in names}

    def close(self) -> None:
        if getattr(self, "_zf", None) is not None:
            self._zf.close()
        if self._owned is not None:
            self._owned.close()

    def has(self, name: str) -> bool:
        return name in self.names

    def read(self, name: str, size: int | None = None, *, json: bool = False) -> bytes:
        """Member ``name``; with ``size``, the zip entry must claim exactly that many bytes
        (checked before anything is inflated)."""
        if name not in self.names:
            fail(name, "member missing from the .pt2 archive")
        info = self._zf.getinfo(f"{self.root}/{name}")
        return read_member(self._zf, info, name, size, self.limits, json)

    def json(self, name: str) -> Any:
        return loads_json(self.read(name, json=True), name)


def is_torch_archive(f: Any) -> bool:
    """Whether ``f`` (a path or a seekable binary file, left at its position) is a .pt2 zip
    written by torch.export.save (it has ``<root>/archive_format`` and no manifest.json)."""
    try:
        if isinstance(f, (str, os.PathLike)):
            with zipfile.ZipFile(os.fspath(f)) as zf:
                names = zf.namelist()
        else:
            if not f.seekable():
                return False
            here = f.tell()
            try:
                with zipfile.ZipFile(f) as zf:
                    names = zf.namelist()
            finally:
                f.seek(here)
    except (*_ZIP_ERRORS, AttributeError):
        return False
    return "manifest.json" not in names and any(
        n.count("/") == 1 and n.endswith("/archive_format") for n in names)


# --------------------------------------------------------------------------- tensors


def _meta_ints(raw: Any, where: str) -> list[int]:
    out = []
    for i, item in enumerate(as_list(raw, where)):
        spec = as_dict(item, f"{where}/{i}")
        if set(spec) != {"as_int"}:
            fail(f"{where}/{i}", "a stored tensor's sizes must be plain integers")
        out.append(as_int(spec["as_int"], f"{where}/{i}", lo=0, hi=LIMITS.max_dim))
    return out


def _rebuild(data: bytes, meta: Any, where: str) -> torch.Tensor:
    spec = as_dict(meta, where)
    dtype = dtype_of(spec.get("dtype"), f"{where}/dtype")
    if spec.get("layout", 7) != 7:
        fail(f"{where}/layout", "only strided tensors are read")
    sizes = _meta_ints(spec.get("sizes"), f"{where}/sizes")
    strides = _meta_ints(spec.get("strides"), f"{where}/strides")
    if len(sizes) != len(strides) or len(sizes) > LIMITS.max_rank:
        fail(where, f"sizes {sizes[:8]} and strides {strides[:8]} do not describe a tensor")
    offset = _meta_ints([spec.get("storage_offset")], f"{where}/storage_offset")[0]
    item = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for s in sizes:
        numel *= s
    if numel > _MAX_ELEMENTS:
        fail(f"{where}/sizes", f"{numel} elements exceed the limit")
    extent = 0 if numel == 0 else offset + 1 + sum((s - 1) * st for s, st in zip(sizes, strides))
    if extent * item > len(data):
        fail(where, f"the tensor needs {extent * item} bytes of storage, the member has "
                    f"{len(data)}")
    if len(data) % item:
        fail(where, f"{len(data)} bytes are not a whole number of {dtype} elements")
    flat = torch.frombuffer(bytearray(data), dtype=dtype) if data else torch.empty(0, dtype=dtype)
    tensor = torch.as_strided(flat, sizes, strides, offset) if numel else torch.empty(
        sizes, dtype=dtype)
    return tensor


def _payloads(z: _Zip, folder: str, config_name: str, prefix: str, kind: str
              ) -> dict[str, torch.Tensor]:
    if not z.has(config_name):
        fail(config_name, "member missing from the .pt2 archive")
    config = as_dict(as_dict(z.json(config_name), config_name).get("config"),
                     f"{config_name}/config")
    files: dict[str, torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}
    for fqn, raw in config.items():
        at = f"{config_name}/config/{fqn}"
        spec = as_dict(raw, at)
        path = as_str(spec.get("path_name"), f"{at}/path_name")
        if not _PATH_NAME.match(path):
            fail(f"{at}/path_name", f"{path!r:.60} is not a member name")
        member = f"{folder}{path}"
        if as_bool(spec.get("use_pickle", False), f"{at}/use_pickle") or not path.startswith(
                prefix):
            fail(member, f"{kind} {fqn!r} is stored pickled ({path}); exportir never unpickles "
                         "a file. Save plain tensors (no tensor subclasses or custom objects)")
        if path not in files:
            files[path] = z.read(member)
        tensor = _rebuild(files[path], spec.get("tensor_meta"), f"{at}/tensor_meta")
        if as_bool(spec.get("is_param", False), f"{at}/is_param"):
            grad = as_bool(as_dict(spec.get("tensor_meta"), at).get("requires_grad", True), at)
            tensor = torch.nn.Parameter(tensor, requires_grad=grad)
        out[fqn] = tensor
    return out


# --------------------------------------------------------------------------- example inputs


def _skip_samples(member: str, why: str) -> None:
    warnings.warn(f"{member}: the example inputs were skipped (ep.example_inputs is None): "
                  f"{why}. exportir never unpickles a file; it reads only the plain tensors, "
                  "numbers and containers torch.export.save writes", stacklevel=4)


def _sample_inputs(z: _Zip, member: str) -> Any:
    """``(args, kwargs)`` from torch.save's zip in ``member`` (torch_pickle.py walks its pickle
    stream without unpickling), or None, with a warning, when it holds anything else."""
    if not z.has(member):
        return None
    data = z.read(member)
    if not data:  # torch writes an empty member for a program without example inputs
        return None
    try:
        inner = _Zip(io.BytesIO(data), z.limits)
        try:
            if inner.has("byteorder") and inner.read("byteorder").strip() != b"little":
                fail("byteorder", "only little-endian storages are read")
            return read_pickled_inputs(inner.read("data.pkl"), inner, "data.pkl")
        finally:
            inner.close()
    except SerializationError as e:
        _skip_samples(member, str(e))
    return None


# --------------------------------------------------------------------------- load


def _model_name(z: _Zip) -> str:
    models = sorted(m.group(1) for n in z.names if (m := _MODEL.match(n)))
    if not models:
        fail("models/", "the .pt2 holds no exported program (no models/<name>.json); it may "
                        "hold only AOTInductor artifacts, which exportir does not read")
    if len(models) > 1:
        fail("models/", f"the .pt2 holds {len(models)} programs ({models[:5]}); exportir.load "
                        "reads archives of one program")
    return models[0]


def _check_opset(model: Any, expected: dict[str, int] | None, where: str) -> None:
    saved = as_dict(as_dict(model, where).get("opset_version", {}), f"{where}/opset_version")
    for namespace, version in (expected or {}).items():
        if namespace in saved and as_int(saved[namespace], f"{where}/opset_version") != version:
            fail(f"{where}/opset_version", f"the program was saved with {namespace} opset "
                 f"version {saved[namespace]}, but version {version} was expected")


def load_torch_archive(f: Any, *, extra_files: dict[str, Any] | None = None,
                       limits: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS,
                       expected_opset_version: dict[str, int] | None = None) -> Any:
    """Our ExportedProgram for the .pt2 ``f`` (see the module docstring for what is read)."""
    z = _Zip(f, limits)
    try:
        fmt = z.read("archive_format").decode("utf-8", "replace").strip()
        if fmt != "pt2":
            fail("archive_format", f"{fmt[:40]!r} is not a pt2 archive")
        name = _model_name(z)
        legacy = f"data/weights/{name}.pt"
        if z.has(legacy) or z.has(f"data/constants/{name}.pt"):
            fail(legacy, "legacy .pt2 weights are pickled; exportir never unpickles a file "
                         "(save the program again with torch.export.save of torch >= 2.6)")
        state = _payloads(z, "data/weights/", f"data/weights/{name}_weights_config.json",
                          "weight_", "weight")
        constants = _payloads(z, "data/constants/",
                              f"data/constants/{name}_constants_config.json", "tensor_",
                              "constant")
        samples = _sample_inputs(z, f"data/sample_inputs/{name}.pt")
        model = z.json(f"models/{name}.json")
        _check_opset(model, expected_opset_version, f"models/{name}.json")
        ep = decode_torch_program(model, state, constants, f"models/{name}.json")
        if samples is not None:
            try:
                ep.example_inputs = samples  # checked against the program's input structure
            except ValueError as e:
                _skip_samples(f"data/sample_inputs/{name}.pt", f"they do not fit the program's "
                                                               f"inputs ({str(e)[:200]})")
        for key in list(extra_files or {}):
            member = f"extra/{key}"
            if not z.has(member):
                fail(member, f"extra file {key!r} is not in this archive")
            extra_files[key] = z.read(member).decode("utf-8", "replace")
        return ep
    except RecursionError as e:
        fail("models/", f"nested too deeply ({e})")
    finally:
        z.close()


# --------------------------------------------------------------------------- save


def _raw(t: torch.Tensor) -> tuple[bytes, torch.Tensor]:
    dense = t.detach().to("cpu").contiguous().clone()
    data = dense.reshape(-1).view(torch.uint8).numpy().tobytes() if dense.numel() else b""
    return data, dense


def _write_payloads(tensors: dict[str, Any], prefix: str, where: str,
                    params: set[str]) -> tuple[dict[str, bytes], dict[str, Any]]:
    members: dict[str, bytes] = {}
    config: dict[str, Any] = {}
    for i, (fqn, t) in enumerate(tensors.items()):
        if not isinstance(t, torch.Tensor) or type(t) not in (torch.Tensor, torch.nn.Parameter):
            fail(f"{where}/{fqn}", f"{type(t).__name__} cannot be written to a .pt2 without "
                                   "pickle; only plain tensors are written")
        data, dense = _raw(t)
        path = f"{prefix}{i}"
        members[path] = data
        meta = tensor_meta(dense, f"{where}/{fqn}")
        # a buffer is written back in place by torch's module(): it must not require grad
        meta["requires_grad"] = bool(t.requires_grad) and fqn in params
        config[fqn] = {"path_name": path, "is_param": fqn in params, "use_pickle": False,
                       "tensor_meta": meta}
    return members, {"config": config}


def save_torch_archive(ep: Any, f: Any, *, extra_files: dict[str, Any] | None = None,
                       opset_version: dict[str, int] | None = None) -> None:
    """Write ``ep`` (ours) as a .pt2 that ``torch.export.load`` reads."""
    opset = {"aten": int(torch._C._get_max_operator_version()), **(opset_version or {})}
    model = encode_torch_program(ep, opset)
    params = {s.target for s in ep.graph_signature.input_specs if s.kind.name == "PARAMETER"}
    weights, wconfig = _write_payloads(dict(ep.state_dict), "weight_", "state_dict", params)
    consts, cconfig = _write_payloads(dict(ep.constants), "tensor_", "constants", set())
    members: list[tuple[str, bytes]] = [("archive_format", b"pt2"), ("archive_version", b"0")]
    members += [(f"data/weights/{k}", v) for k, v in weights.items()]
    members.append(("data/weights/model_weights_config.json", dumps_json(wconfig)))
    members += [(f"data/constants/{k}", v) for k, v in consts.items()]
    members.append(("data/constants/model_constants_config.json", dumps_json(cconfig)))
    members.append(("models/model.json", dumps_json(model)))
    members.append(("data/sample_inputs/model.pt",  # empty (no inputs) reads as none
                    pickle_inputs(ep.example_inputs, "data/sample_inputs/model.pt")))
    for key, content in (extra_files or {}).items():
        data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
        members.append((f"extra/{key}", data))
    members += [(".data/version", b"6\n"), ("byteorder", b"little"),
                (".data/serialization_id", str(secrets.randbelow(10**40)).zfill(40).encode())]
    target = os.fspath(f) if isinstance(f, (str, os.PathLike)) else f
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members:
            info = zipfile.ZipInfo(f"archive/{name}", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    if hasattr(f, "flush"):
        f.flush()

