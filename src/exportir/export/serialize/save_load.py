"""``save`` / ``load`` of an ExportedProgram: a versioned, pickle-free file.

The file is a zip (see ``docs/format/exported-program.md``)::

    manifest.json               format name, version [major, minor], producer, size + SHA-256
                                of every other member
    program.json                graph, signature, range constraints, module call graph,
                                tensor descriptions, example-input structure, opset versions
    weights.safetensors         state_dict tensor data (safetensors layout)
    constants.safetensors       lifted constants / non-persistent buffers
    example_inputs.safetensors  tensor leaves of ``ep.example_inputs``
    extra/<name>                ``extra_files``

Loading never executes code from the file: no pickle, no ``eval``, no imports; call targets
resolve only against ``torch.ops`` and a fixed table of Python operators. Every problem with a
file raises :class:`SerializationError` (a ``ValueError``) naming the member and the field or
byte offset; allocations are bounded by the bytes actually present.
"""

from __future__ import annotations

import os
from typing import IO, Any

import torch

import exportir
from exportir.export.program.exported_program import ExportedProgram
from exportir.export.program.verifier import SpecViolationError, load_verifier
from exportir.export.serialize.archive import (
    DEFAULT_ARCHIVE_LIMITS,
    Archive,
    ArchiveLimitError,
    ArchiveLimits,
    _seekable,
    write_archive,
)
from exportir.export.serialize.common import (
    LIMITS,
    SerializationError,
    as_dict,
    as_int,
    as_str,
    check_keys,
    dumps_json,
    fail,
    loads_json,
)
from exportir.export.serialize.graph import decode_graph_module, encode_graph_module
from exportir.export.serialize.program import (
    decode_example_inputs,
    decode_module_call_graph,
    decode_range_constraints,
    decode_signature,
    decode_tensor_infos,
    encode_derived_ranges,
    encode_example_inputs,
    encode_module_call_graph,
    encode_range_constraints,
    encode_signature,
    encode_tensor_infos,
    rebuild_tensors,
)
from exportir.export.serialize.symbolic import decode_shape_env, encode_shape_env, shape_env_of
from exportir.export.serialize.tensors import decode_tensors, encode_tensors
from exportir.export.serialize.torch_archive import (
    is_torch_archive,
    load_torch_archive,
    save_torch_archive,
)
from exportir.export.serialize.torch_interop import as_exported_program, is_torch_program
from exportir.export.signature import ExportGraphSignature, InputKind
from exportir.fx.graph_module import GraphModule

__all__ = ["ArchiveLimitError", "ArchiveLimits", "SerializationError", "load", "save"]

PROGRAM = "program.json"
WEIGHTS = "weights.safetensors"
CONSTANTS = "constants.safetensors"
EXAMPLES = "example_inputs.safetensors"
EXTRA = "extra/"
_PROGRAM_KEYS = {"graph_module", "signature", "state_dict", "constants", "range_constraints",
                 "module_call_graph", "example_inputs", "opset_version", "dialect", "extra_files"}
_EXTRA_KINDS = {"str": lambda b: b.decode("utf-8"), "bytes": bytes}

FileLike = str | os.PathLike[str] | IO[bytes]


def _where(path: str) -> str:
    return f"{PROGRAM}:{path}"


# --------------------------------------------------------------------------- save


def _default_opset() -> dict[str, int]:
    return {"aten": int(torch._C._get_max_operator_version())}


def _extra_members(extra_files: dict[str, Any] | None) -> tuple[dict[str, bytes], dict[str, str]]:
    members: dict[str, bytes] = {}
    kinds: dict[str, str] = {}
    for name, content in (extra_files or {}).items():
        if not isinstance(name, str) or not name or len(name) > LIMITS.max_name:
            raise SerializationError(f"extra_files: invalid file name {name!r:.80}")
        if isinstance(content, str):
            members[EXTRA + name], kinds[name] = content.encode("utf-8"), "str"
        elif isinstance(content, (bytes, bytearray, memoryview)):
            members[EXTRA + name], kinds[name] = bytes(content), "bytes"
        else:
            raise SerializationError(f"extra_files[{name!r}]: expected str or bytes, got "
                                     f"{type(content).__qualname__}")
    return members, kinds


def _encode_program(ep: ExportedProgram, opset: dict[str, int],
                    extra_kinds: dict[str, str]) -> tuple[dict[str, Any], dict[str, bytes]]:
    state_infos, state_data = encode_tensor_infos(ep.state_dict, _where("/state_dict"))
    const_infos, const_data = encode_tensor_infos(ep.constants, _where("/constants"))
    examples, example_data = encode_example_inputs(ep.example_inputs, _where("/example_inputs"))
    program = {
        "graph_module": encode_graph_module(ep.graph_module, _where("/graph_module")),
        "signature": encode_signature(ep.graph_signature, _where("/signature")),
        "state_dict": state_infos,
        "constants": const_infos,
        "range_constraints": encode_range_constraints(ep.range_constraints,
                                                      _where("/range_constraints")),
        "module_call_graph": encode_module_call_graph(ep.module_call_graph,
                                                      _where("/module_call_graph")),
        "example_inputs": examples,
        "opset_version": opset,
        "dialect": ep.dialect,
        "extra_files": extra_kinds,
    }
    env = shape_env_of(n.meta.get("val") for n in ep.graph.nodes)
    if env is not None:  # symbolic shapes (format 1.1)
        section = encode_shape_env(env, _where("/shape_env"))
        section["derived_ranges"] = encode_derived_ranges(ep.range_constraints,
                                                          _where("/shape_env/derived_ranges"))
        program["shape_env"] = section
    tensors = {WEIGHTS: encode_tensors(state_data), CONSTANTS: encode_tensors(const_data)}
    if examples is not None:
        tensors[EXAMPLES] = encode_tensors(example_data)
    return program, tensors


def save(
    ep: ExportedProgram,
    f: FileLike,
    *,
    extra_files: dict[str, Any] | None = None,
    opset_version: dict[str, int] | None = None,
    pickle_protocol: int = 2,
    format: str = "exportir",
) -> None:
    """Save ``ep`` to the path or binary file ``f`` (same signature as ``torch.export.save``).

    ``extra_files`` maps file names to ``str`` or ``bytes`` contents stored alongside.
    ``opset_version`` adds opset versions to record (``aten`` defaults to torch's). The
    format uses no pickle; ``pickle_protocol`` is accepted for source compatibility and ignored.
    Raises :class:`SerializationError` if the program holds something the format cannot
    represent (naming the node or field).

    ``format="exportir"`` (the default) writes our own format; ``format="torch"`` writes the
    .pt2 archive ``torch.export.save`` writes, which ``torch.export.load`` reads (see
    docs/export.md, "torch .pt2 interop"). ``ep`` may also be a torch.export.ExportedProgram
    (converted with :func:`exportir.from_torch`).
    """
    del pickle_protocol  # nothing is pickled
    if format not in ("exportir", "torch"):
        raise ValueError(f"format={format!r} is not a program format; use format='exportir' "
                         "(the default, our pickle-free format) or format='torch' (the .pt2 "
                         "that torch.export.load reads)")
    if not (isinstance(ep, ExportedProgram) or is_torch_program(ep)):
        raise TypeError(f"The 'ep' parameter must be an instance of 'ExportedProgram' (an "
                        f"exportir ExportedProgram from exportir.export, or a "
                        f"torch.export.ExportedProgram), got '{type(ep).__name__}' instead.")
    ep = as_exported_program(ep, "exportir.save")
    if format == "torch":
        save_torch_archive(ep, f, extra_files=extra_files, opset_version=opset_version)
        return
    extra, kinds = _extra_members(extra_files)
    opset = {**_default_opset(), **(opset_version or {})}
    program, tensors = _encode_program(ep, opset, kinds)
    members = {PROGRAM: dumps_json(program), **tensors, **extra}
    producer = {"exportir": exportir.__version__, "torch": torch.__version__}
    write_archive(f, members, producer)


# --------------------------------------------------------------------------- load


def _check_opset(raw: Any, expected: dict[str, int] | None) -> dict[str, int]:
    where = _where("/opset_version")
    saved = {k: as_int(v, f"{where}/{k}") for k, v in as_dict(raw, where).items()}
    for namespace, version in (expected or {}).items():
        if namespace in saved and saved[namespace] != version:
            fail(where, f"the program was saved with {namespace} opset version "
                        f"{saved[namespace]}, but version {version} was expected; re-export the "
                        f"model with this torch, or load without expected_opset_version")
    return saved


def _tensors(ar: Archive, member: str, infos_raw: Any, key: str) -> dict[str, torch.Tensor]:
    infos = decode_tensor_infos(infos_raw, _where(f"/{key}"))
    data, _ = decode_tensors(ar.read(member), member)
    return rebuild_tensors(infos, data, member)


def _check_state_meta(gm: GraphModule, signature: ExportGraphSignature,
                      state: dict[str, torch.Tensor], constants: dict[str, torch.Tensor]) -> None:
    """Saved weights must have the shape, dtype and device the graph's placeholders declare."""
    placeholders = {n.name: n for n in gm.graph.nodes if n.op == "placeholder"}
    for spec in signature.input_specs:
        if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            continue
        node = placeholders.get(spec.arg.name)
        tensor = state.get(spec.target) if spec.target in state else constants.get(spec.target)
        val = None if node is None else node.meta.get("val")
        if not isinstance(tensor, torch.Tensor) or not isinstance(val, torch.Tensor):
            continue  # the verifier reports missing state / metadata
        saved = (list(tensor.shape), tensor.dtype, tensor.device)
        declared = (list(val.shape), val.dtype, val.device)
        if saved != declared:
            fail(f"{WEIGHTS}/{spec.target}",
                 f"tensor is {saved[0]} {saved[1]} on {saved[2]}, but placeholder "
                 f"{node.name!r} declares {declared[0]} {declared[1]} on {declared[2]}")


def _read_extra(ar: Archive, raw: Any, extra_files: dict[str, Any] | None) -> None:
    kinds = {k: as_str(v, _where(f"/extra_files/{k}"))
             for k, v in as_dict(raw, _where("/extra_files")).items()}
    for name in list(extra_files or {}):
        kind = kinds.get(name)
        if kind not in _EXTRA_KINDS:
            fail(EXTRA + str(name), f"extra file {name!r} is not in this program "
                                    f"(saved: {sorted(kinds)[:20]})")
        data = ar.read(EXTRA + name)
        try:
            extra_files[name] = _EXTRA_KINDS[kind](data)
        except UnicodeDecodeError as e:
            fail(EXTRA + name, f"not UTF-8 at byte offset {e.start}")


def _build(parts: dict[str, Any]) -> ExportedProgram:
    try:
        return ExportedProgram(**parts)
    except SpecViolationError as e:
        raise SerializationError(f"{PROGRAM}: the saved program is not valid Export IR: {e}") from e
    except Exception as e:  # untrusted input: every failure is a load error
        raise SerializationError(f"{PROGRAM}: cannot rebuild the ExportedProgram "
                                 f"({type(e).__name__}: {e})") from e


def _decode(ar: Archive, expected_opset: dict[str, int] | None) -> tuple[ExportedProgram, Any]:
    program = as_dict(loads_json(ar.read_json(PROGRAM), PROGRAM), PROGRAM)
    check_keys(program, _PROGRAM_KEYS, {"shape_env"}, PROGRAM)
    if "shape_env" in program and ar.version < (1, 1):
        fail(_where("/shape_env"), f"a format {ar.version[0]}.{ar.version[1]} file has no "
             "shape_env section (symbolic shapes need format 1.1)")
    shapes, derived = _shape_env(program.get("shape_env"))
    _check_opset(program["opset_version"], expected_opset)
    dialect = as_str(program["dialect"], _where("/dialect"))
    try:
        verifier = load_verifier(dialect)
    except SpecViolationError as e:
        fail(_where("/dialect"), str(e))
    gm = decode_graph_module(program["graph_module"], _where("/graph_module"), shapes)
    signature = decode_signature(program["signature"], _where("/signature"))
    state = _tensors(ar, WEIGHTS, program["state_dict"], "state_dict")
    constants = _tensors(ar, CONSTANTS, program["constants"], "constants")
    _check_state_meta(gm, signature, state, constants)
    example_tensors = decode_tensors(ar.read(EXAMPLES), EXAMPLES)[0] if ar.has(EXAMPLES) else {}
    ep = _build({
        "root": gm, "graph": gm.graph, "graph_signature": signature, "state_dict": state,
        "range_constraints": decode_range_constraints(
            program["range_constraints"], _where("/range_constraints"),
            shapes[1] if shapes else None, derived),
        "module_call_graph": decode_module_call_graph(program["module_call_graph"],
                                                      _where("/module_call_graph")),
        "example_inputs": decode_example_inputs(program["example_inputs"], example_tensors,
                                                _where("/example_inputs")),
        "constants": constants, "verifiers": [verifier],
    })
    return ep, program["extra_files"]


def _shape_env(raw: Any) -> tuple[Any, Any]:
    """``((ShapeEnv, Symbols), derived ranges)`` of a program with symbolic shapes (1.1)."""
    if raw is None:
        return None, None
    where = _where("/shape_env")
    spec = dict(as_dict(raw, where))
    derived = spec.pop("derived_ranges", [])
    return decode_shape_env(spec, where), derived


def load(
    f: FileLike,
    *,
    extra_files: dict[str, Any] | None = None,
    expected_opset_version: dict[str, int] | None = None,
    limits: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS,
) -> ExportedProgram:
    """Load a program written by :func:`save` (``torch.export.load``'s signature, plus
    ``limits``).

    ``extra_files``: the names given are filled in place with the saved contents (``str`` or
    ``bytes``, as saved). ``expected_opset_version``: for each namespace given that the file
    also records, the versions must be equal. Raises :class:`SerializationError` for any
    malformed, truncated, tampered or unsupported file (an :class:`ArchiveLimitError` when it
    asks for more than ``limits`` allow: deflated members inflating beyond
    ``max_inflated_bytes``, JSON beyond ``max_json_bytes``); ``FileNotFoundError`` if ``f`` is
    a path that does not exist.

    A .pt2 written by ``torch.export.save`` is recognised (by its ``archive_format`` member)
    and read without unpickling anything (docs/export.md, "torch .pt2 interop").
    """
    if not isinstance(f, (str, os.PathLike)):
        f = _seekable(f)
    if is_torch_archive(f):
        return load_torch_archive(f, extra_files=extra_files, limits=limits,
                                  expected_opset_version=expected_opset_version)
    with Archive(f, limits) as ar:
        try:
            ep, extra_raw = _decode(ar, expected_opset_version)
        except RecursionError as e:
            raise SerializationError(f"{PROGRAM}: nested too deeply") from e
        _read_extra(ar, extra_raw, extra_files)
    return ep
