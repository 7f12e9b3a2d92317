"""Structure-aware mutation of program files (.xpt).

A file is taken apart into its structure (the JSON tree the codec writes) and its data segment;
a mutation edits the tree (or a fused_cpu blob inside the segment, or the segment's bytes) the
way a hostile or damaged file could differ from an emitted one, and :func:`assemble` writes the
file again with a valid header and valid checksums -- so that the validator and the load-time
typing, not the CRC, must catch what is wrong. Everything is deterministic in the ``random.Random``
it is given.
"""

from __future__ import annotations

import copy
import json
import random
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exportir.program import schema, serialize
from exportir.runtime.backends.fused_cpu import format as blob_format
from exportir.runtime.kernel_table import KERNEL_TABLE

Tree = dict[str, Any]


@dataclass
class Parts:
    """A program file taken apart: the structure tree, constants and delegate blobs."""

    tree: Tree
    constants: list[bytes]
    blobs: list[bytes]


def disassemble(data: bytes) -> Parts:
    layout = serialize.read_layout(data)
    start = layout.structure_offset
    tree = json.loads(zlib.decompress(data[start:start + layout.structure_length]))
    segment = data[layout.data_offset:layout.data_offset + layout.data_length]
    constants = [bytes(segment[o:o + n]) for o, n in tree["constants"]]
    blobs = [bytes(segment[o:o + n]) for _, (o, n), _ in tree["delegates"]]
    return Parts(tree, constants, blobs)


def _segment(parts: Parts, alignment: int = 16) -> tuple[bytes, list, list]:
    """The data segment of ``parts`` and the (offset, size) ranges of constants and blobs."""
    chunks, ranges, cursor = [], [], 0
    for blob in (*parts.constants, *parts.blobs):
        ranges.append([cursor, len(blob)])
        padded = -(cursor + len(blob)) % alignment
        chunks += [blob, bytes(padded)]
        cursor += len(blob) + padded
    n = len(parts.constants)
    return b"".join(chunks), ranges[:n], ranges[n:]


def assemble(parts: Parts, keep_ranges: bool = False) -> bytes:
    """A file with a valid header and checksums around ``parts`` (ranges recomputed unless
    ``keep_ranges``: a mutation of the ranges themselves)."""
    tree = parts.tree
    segment, constants, blobs = _segment(parts)
    if not keep_ranges and isinstance(tree, dict):
        if isinstance(tree.get("constants"), list) and len(tree["constants"]) == len(constants):
            tree["constants"] = constants
        delegates = tree.get("delegates")
        if isinstance(delegates, list) and len(delegates) == len(blobs):
            for entry, r in zip(delegates, blobs):
                if isinstance(entry, list) and len(entry) == 3:
                    entry[1] = r
    raw = json.dumps(tree, sort_keys=True, separators=(",", ":")).encode()
    comp = zlib.compress(raw)
    head_size, align = serialize.HEADER_SIZE, serialize.SEGMENT_ALIGNMENT
    data_offset = (head_size + len(comp) + align - 1) // align * align
    fields = [serialize.MAGIC, schema.FORMAT_VERSION, 0, 0, data_offset + len(segment), head_size,
              len(comp), len(raw), data_offset, len(segment), zlib.crc32(comp),
              zlib.crc32(segment), 0]
    fields[-1] = zlib.crc32(serialize._HEADER.pack(*fields)[:serialize._HEADER_CRC_SPAN])
    head = serialize._HEADER.pack(*fields) + bytes(head_size - serialize._HEADER.size)
    return head + comp + bytes(data_offset - head_size - len(comp)) + segment


# ------------------------------------------------------------------------------ tree walking


def paths(node: Any, want: Callable[[Any], bool], at: tuple = ()) -> list[tuple]:
    """Paths (tuples of keys / indices) of every node of the tree ``want`` accepts."""
    found = [at] if want(node) else []
    if isinstance(node, dict):
        for k in sorted(node):
            found += paths(node[k], want, (*at, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += paths(v, want, (*at, i))
    return found


def get(tree: Any, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def put(tree: Any, path: tuple, value: Any) -> None:
    get(tree, path[:-1])[path[-1]] = value


def _is_int(x: Any) -> bool:
    return type(x) is int


def interesting_int(rng: random.Random, old: int, n_values: int) -> int:
    return rng.choice([
        0, 1, -1, 2, 3, 7, old + 1, old - 1, old * 2, old // 2, 255, 256, 4096, 2**31 - 1, 2**31,
        2**32, 2**40, 2**63 - 1, 2**63, -(2**63), 10**400, max(n_values - 1, 0), n_values,
        rng.randrange(max(n_values, 1)), rng.randrange(-4, 64),
    ])


# ------------------------------------------------------------------------------ mutations

# Operators a mutation may name: the table's, the runtime primitives, and names a hostile file
# would try (file readers, unchecked views, in-place ops, dunders, custom ops nobody registered).
HOSTILE_OPERATORS = [
    ["aten::from_file", "out"], ["aten::from_file", "default"], ["aten::_print", "default"],
    ["aten::_reshape_alias_copy", "out"], ["aten::view", "dtype"], ["aten::fill_", "Scalar"],
    ["aten::add", "default"], ["aten::add", "Tensor"], ["aten::add_", "Tensor"],
    ["__class__::__init__", ""], ["aten::__class__", "default"], ["builtins::eval", "default"],
    ["mylib::op", "default@functional"], ["aten::relu", "default@functional"],
    ["aten::set_", "source_Storage_storage_offset"], ["aten::empty", "memory_format"],
    ["exportir_prim::add", "Scalar"], ["exportir_prim::floordiv", "Scalar"],
    ["aten::sym_size", "int"], ["aten::sym_numel", ""],
]
_TABLE = sorted(KERNEL_TABLE)


def _random_operator(rng: random.Random) -> list[str]:
    if rng.random() < 0.5:
        return list(rng.choice(HOSTILE_OPERATORS))
    name, _, overload = rng.choice(_TABLE).rpartition(".")
    return [name, overload]


def _method(parts: Parts, rng: random.Random) -> dict | None:
    methods = parts.tree.get("methods") if isinstance(parts.tree, dict) else None
    if not isinstance(methods, list) or not methods or not isinstance(methods[0], dict):
        return None
    return rng.choice(methods)


def m_int(parts: Parts, rng: random.Random) -> str:
    candidates = paths(parts.tree, _is_int)
    if not candidates:
        return "no int"
    path = rng.choice(candidates)
    method = _method(parts, rng)
    n = len(method.get("values", [])) if method else 0
    put(parts.tree, path, interesting_int(rng, get(parts.tree, path), n))
    return f"int at {path}"


def m_index(parts: Parts, rng: random.Random) -> str:
    """Point an operand at another (valid) value: kinds, dtypes and sizes no longer agree."""
    method = _method(parts, rng)
    if method is None or not method.get("values"):
        return "no method"
    n = len(method["values"])
    slots = paths(method.get("instructions", []), _is_int)
    slots = [("instructions", *p) for p in slots if len(p) >= 2 and p[1] != 0]
    slots += [(key, i) for key in ("inputs", "outputs") for i in range(len(method[key]))]
    if not slots:
        return "no operand"
    path = rng.choice(slots)
    put(method, path, rng.randrange(n))
    return f"operand {path}"


def m_operator(parts: Parts, rng: random.Random) -> str:
    method = _method(parts, rng)
    if method is None or not method.get("operators"):
        return "no operator"
    k = rng.randrange(len(method["operators"]))
    method["operators"][k] = _random_operator(rng)
    return f"operator {k} -> {method['operators'][k]}"


_VALUE_FORMS: list[Callable[[random.Random, int], list]] = [
    lambda r, n: ["i", r.choice([0, 1, -1, 3, 2**40, 10**400])],
    lambda r, n: ["d", r.choice([0.0, -1.5, 1e300, float("inf")])],
    lambda r, n: ["b", r.random() < 0.5],
    lambda r, n: ["s", r.choice(["cpu", "cuda", "/etc/passwd", ""])],
    lambda r, n: ["n"],
    lambda r, n: ["il", [r.randrange(max(n, 1)) for _ in range(r.randrange(4))]],
    lambda r, n: ["tl", [r.randrange(max(n, 1)) for _ in range(r.randrange(4))]],
    lambda r, n: ["ol", [r.randrange(max(n, 1)) for _ in range(r.randrange(4))]],
    lambda r, n: ["dl", [1.0, 2.0]],
    lambda r, n: ["bl", [True, False]],
]


def m_value_kind(parts: Parts, rng: random.Random) -> str:
    method = _method(parts, rng)
    if method is None or not method.get("values"):
        return "no value"
    n = len(method["values"])
    k = rng.randrange(n)
    method["values"][k] = rng.choice(_VALUE_FORMS)(rng, n)
    return f"value {k} kind"


def _tensors(method: dict) -> list[int]:
    return [i for i, v in enumerate(method.get("values", []))
            if isinstance(v, list) and len(v) == 7 and v[0] == "T"]


def m_storage(parts: Parts, rng: random.Random) -> str:
    method = _method(parts, rng)
    tensors = _tensors(method) if method else []
    if not tensors:
        return "no tensor"
    k = rng.choice(tensors)
    n = len(method["values"])
    arenas = method.get("plan", [[0]])[0] or [0]
    method["values"][k][4] = rng.choice([
        ["C", rng.randrange(max(len(parts.constants), 1) + 1)],
        ["A", 0, rng.choice([0, 16, 64, arenas[0]]), rng.choice([0, 4, 16, 64, 2**20])],
        ["I"], ["D"],
        ["V", rng.randrange(n), rng.choice([0, 1, 5]), [rng.choice([0, 1, 2, 3]) for _ in
                                                       method["values"][k][2]]],
    ])
    return f"value {k} storage {method['values'][k][4][0]}"


def m_tensor_meta(parts: Parts, rng: random.Random) -> str:
    """Change a tensor's dtype, sizes or flags (and, to stay structurally valid, its
    allocation's size), so that only the operand typing can tell."""
    method = _method(parts, rng)
    tensors = _tensors(method) if method else []
    if not tensors:
        return "no tensor"
    t = method["values"][rng.choice(tensors)]
    what = rng.choice(["dtype", "sizes", "dynamic", "order", "initial"])
    if what == "dtype":
        t[1] = rng.choice([int(s) for s in schema.ScalarType])
    elif what == "sizes" and t[2]:
        d = rng.randrange(len(t[2]))
        t[2][d] = rng.choice([0, 1, t[2][d] * 2, t[2][d] + 1])
    elif what == "dynamic":
        t[5] = not t[5]
    elif what == "order" and len(t[3]) > 1:
        rng.shuffle(t[3])
    elif what == "initial":
        t[6] = rng.choice([None, 0, len(parts.constants)])
    storage = t[4]
    if isinstance(storage, list) and storage[:1] == ["A"] and len(storage) == 4:
        nbytes = schema.ELEMENT_SIZE.get(schema.ScalarType(t[1]), 1)
        for s in t[2]:
            nbytes *= max(s, 0) if type(s) is int else 1
        storage[3] = nbytes
        arenas = method["plan"][0]
        if arenas and storage[1] == 0 and storage[2] + nbytes > arenas[0]:
            arenas[0] = storage[2] + nbytes + 16
    return f"tensor {what}"


_INSTRUCTION_FORMS: list[Callable[[random.Random, int, int, int], list]] = [
    lambda r, n, ops, ins: ["K", r.randrange(max(ops, 1)), [r.randrange(max(n, 1)) for _ in
                                                           range(r.randrange(1, 6))], 0],
    lambda r, n, ops, ins: ["M", r.randrange(max(n, 1)), r.randrange(max(n, 1)), 0],
    lambda r, n, ops, ins: ["J", r.randrange(max(n, 1)), r.randrange(ins + 2), 0],
    lambda r, n, ops, ins: ["F", r.randrange(max(n, 1)), 0],
    lambda r, n, ops, ins: ["G", 0, [r.randrange(max(n, 1))], [r.randrange(max(n, 1))], 0],
]


def m_instructions(parts: Parts, rng: random.Random) -> str:
    method = _method(parts, rng)
    if method is None or not isinstance(method.get("instructions"), list):
        return "no instructions"
    ins = method["instructions"]
    what = rng.choice(["insert", "delete", "duplicate", "swap"])
    if what == "insert" or not ins:
        new = rng.choice(_INSTRUCTION_FORMS)(rng, len(method.get("values", [])),
                                             len(method.get("operators", [])), len(ins))
        ins.insert(rng.randrange(len(ins) + 1), new)
    elif what == "delete":
        del ins[rng.randrange(len(ins))]
    elif what == "duplicate":
        i = rng.randrange(len(ins))
        ins.insert(rng.randrange(len(ins) + 1), copy.deepcopy(ins[i]))
    elif len(ins) > 1:
        i, j = rng.sample(range(len(ins)), 2)
        ins[i], ins[j] = ins[j], ins[i]
    return f"instructions {what}"


def m_lists(parts: Parts, rng: random.Random) -> str:
    """Delete, duplicate or reorder an element of a random list (values shift every index)."""
    lists = paths(parts.tree, lambda x: isinstance(x, list) and len(x) > 0)
    path = rng.choice(lists)
    items = get(parts.tree, path)
    what = rng.choice(["delete", "duplicate", "reverse"])
    if what == "delete":
        del items[rng.randrange(len(items))]
    elif what == "duplicate":
        items.append(copy.deepcopy(rng.choice(items)))
    else:
        items.reverse()
    return f"list {what} at {path}"


def m_constant_bytes(parts: Parts, rng: random.Random) -> str:
    if not parts.constants:
        return "no constants"
    k = rng.randrange(len(parts.constants))
    data = bytearray(parts.constants[k])
    if data:
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    parts.constants[k] = bytes(data)
    return f"constant {k} bytes"


def m_blob(parts: Parts, rng: random.Random) -> str:
    """Edit a fused_cpu blob's header (op names, integer arguments, slots, constants)."""
    if not parts.blobs:
        return "no blob"
    k = rng.randrange(len(parts.blobs))
    blob = parts.blobs[k]
    try:
        magic, version, length = blob_format._PRELUDE.unpack_from(blob)
        header = json.loads(blob[blob_format._PRELUDE.size:blob_format._PRELUDE.size + length])
    except (struct.error, ValueError):
        return "blob unreadable"
    data = blob[-(-(blob_format._PRELUDE.size + length) // 16) * 16:]
    what = rng.choice(["int", "int", "op", "list"])
    if what == "op" and header.get("ops"):
        row = rng.choice(header["ops"])
        row[0] = rng.choice(sorted(blob_format.KERNELS))
    elif what == "list":
        lists = paths(header, lambda x: isinstance(x, list) and len(x) > 0)
        if lists:
            items = get(header, rng.choice(lists))
            del items[rng.randrange(len(items))]
    else:
        ints = paths(header, _is_int)
        if ints:
            path = rng.choice(ints)
            put(header, path, interesting_int(rng, get(header, path), header.get("values", 0)))
    text = json.dumps(header).encode()
    prelude = blob_format._PRELUDE.pack(magic, version, len(text))
    pad = -(len(prelude) + len(text)) % 16
    parts.blobs[k] = prelude + text + bytes(pad) + data
    return f"blob {what}"


MUTATIONS: list[tuple[Callable[[Parts, random.Random], str], int]] = [
    (m_int, 6), (m_index, 6), (m_operator, 3), (m_value_kind, 3), (m_storage, 3),
    (m_tensor_meta, 5), (m_instructions, 4), (m_lists, 2), (m_constant_bytes, 1), (m_blob, 4),
]


def mutate(seed: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One mutant of the file ``seed`` and what was done to it."""
    parts = disassemble(seed)
    done = []
    functions, weights = zip(*MUTATIONS)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        try:
            done.append(rng.choices(functions, weights)[0](parts, rng))
        except (IndexError, KeyError, TypeError, ValueError, AttributeError) as e:
            done.append(f"(mutation skipped: {type(e).__name__})")
    return assemble(parts), "; ".join(done)
