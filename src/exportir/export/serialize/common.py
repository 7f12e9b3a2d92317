"""Shared pieces of the ExportedProgram file format: the error type, limits, checked JSON access.

Every decoder in ``serialize_*`` reads untrusted JSON through the helpers here, so that a
malformed file always ends in :class:`SerializationError` naming the offending field (a
JSON-pointer-like path such as ``program.json:/graph_module/graph/nodes/3/args/0``).
"""

from __future__ import annotations

import json
import keyword
import re
from collections.abc import Callable
from typing import Any, NoReturn

__all__ = [
    "FORMAT_MAJOR",
    "FORMAT_MINOR",
    "FORMAT_NAME",
    "LIMITS",
    "Limits",
    "SerializationError",
    "as_bool",
    "as_dict",
    "as_int",
    "as_list",
    "as_str",
    "check_identifier",
    "check_keys",
    "dumps_json",
    "fail",
    "guarded",
    "loads_json",
]

FORMAT_NAME = "exportir.exported_program"
FORMAT_MAJOR = 1
FORMAT_MINOR = 1  # 1.1: symbolic shapes (the shape_env section, sym values and sizes)


class SerializationError(ValueError):
    """A program could not be saved or loaded.

    Raised for every malformed, truncated, tampered, oversized or unsupported file (and for
    programs that the format cannot represent). The message names the archive entry and the
    field path or byte offset. Subclasses :class:`ValueError`, so ``except ValueError`` also
    catches it.
    """


class _Limits:
    """Upper bounds on what a file may claim; checked before anything is allocated."""

    __slots__ = ()
    max_entries = 4096  # zip members
    max_json_bytes = 1 << 30  # program.json / manifest.json
    max_entry_bytes = 1 << 40  # any member, after decompression
    max_deflate_ratio = 1100  # a deflated member may not claim more than this x its size
    max_depth = 256  # nesting of JSON values
    max_rank = 64  # tensor dimensions
    max_dim = (1 << 63) - 1  # one tensor dimension / stride
    max_tensor_header = 100 << 20  # safetensors JSON header (same bound as safetensors)
    max_name = 4096  # node / tensor / extra-file names


Limits = _Limits
LIMITS = _Limits()

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def fail(where: str, what: str) -> NoReturn:
    """Raise ``SerializationError("<where>: <what>")``."""
    raise SerializationError(f"{where}: {what}")


def _type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def _expect(value: Any, types: type | tuple[type, ...], want: str, where: str) -> Any:
    if type(value) is bool and bool not in (types if isinstance(types, tuple) else (types,)):
        fail(where, f"expected {want}, got boolean")
    if not isinstance(value, types):
        fail(where, f"expected {want}, got {_type_name(value)}")
    return value


def as_dict(value: Any, where: str) -> dict[str, Any]:
    return _expect(value, dict, "an object", where)


def as_list(value: Any, where: str) -> list[Any]:
    return _expect(value, list, "an array", where)


def as_str(value: Any, where: str) -> str:
    return _expect(value, str, "a string", where)


def as_bool(value: Any, where: str) -> bool:
    return _expect(value, bool, "a boolean", where)


def as_int(value: Any, where: str, *, lo: int | None = None, hi: int | None = None) -> int:
    number = _expect(value, int, "an integer", where)
    shown = f"an integer of {number.bit_length()} bits" if number.bit_length() > 64 else number
    if lo is not None and number < lo:
        fail(where, f"{shown} is below the minimum {lo}")
    if hi is not None and number > hi:
        fail(where, f"{shown} is above the maximum {hi}")
    return number


def check_keys(obj: dict[str, Any], required: set[str], optional: set[str], where: str) -> None:
    """Reject missing required keys and keys the format does not define."""
    missing = required - obj.keys()
    if missing:
        fail(where, f"missing field(s) {sorted(missing)}")
    unknown = obj.keys() - required - optional
    if unknown:
        fail(where, f"unknown field(s) {sorted(unknown)}")


def check_identifier(name: Any, where: str, *, dotted: bool = False) -> str:
    """A Python identifier (or dotted path of them) that is not a keyword.

    Names end up in generated Python source, so nothing else is accepted.
    """
    text = as_str(name, where)
    parts = text.split(".") if dotted else [text]
    for part in parts:
        if not _IDENT.match(part) or keyword.iskeyword(part) or len(text) > LIMITS.max_name:
            fail(where, f"{text!r} is not a valid identifier")
    return text


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise SerializationError(f"duplicate JSON key {key!r}")
        out[key] = value
    return out


def _reject_constant(name: str) -> NoReturn:
    raise SerializationError(f"non-standard JSON constant {name}")


def loads_json(data: bytes, where: str) -> Any:
    """Parse strict JSON (UTF-8, no NaN/Infinity, no duplicate keys, bounded nesting)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(where, f"not UTF-8 at byte offset {e.start}")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except SerializationError as e:
        fail(where, str(e))
    except json.JSONDecodeError as e:
        fail(where, f"invalid JSON at line {e.lineno} column {e.colno} (char {e.pos}): {e.msg}")
    except RecursionError:
        fail(where, "JSON nested too deeply")
    except ValueError as e:  # e.g. an integer literal beyond the int-string conversion limit
        fail(where, f"invalid JSON: {e}")


def dumps_json(obj: Any) -> bytes:
    """Deterministic compact JSON (keys in insertion order) as UTF-8."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def guarded(where: str, fn: Callable[[], Any], what: str) -> Any:
    """Build something from checked file data (a tensor, a spec, a GraphModule); whatever the
    builder raises means the file is bad, so it becomes a SerializationError (chained)."""
    try:
        return fn()
    except SerializationError:
        raise
    except Exception as e:  # untrusted input: every failure is a load error
        raise SerializationError(f"{where}: {what}: {type(e).__name__}: {e}") from e
