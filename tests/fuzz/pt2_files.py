"""Structure-aware mutation of saved ExportedPrograms (our .pt2 zip archives).

A file is taken apart into its members; a mutation edits ``program.json`` (node targets,
arguments, tensor metadata, the signature, pytree specs) or the safetensors header of the
weights, and :func:`assemble` writes the archive again through ``write_archive``, which
records every member's size and SHA-256 in the manifest -- so the loader's validation, not the
checksum, must catch what is wrong.
"""

from __future__ import annotations

import copy
import io
import json
import random
import struct
import zipfile
from collections.abc import Callable
from typing import Any

from xpt_files import get, interesting_int, paths, put

from exportir.export.serialize.archive import MANIFEST, write_archive

Members = dict[str, bytes]


def disassemble(data: bytes) -> tuple[Members, dict[str, str]]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        members = {n: zf.read(n) for n in zf.namelist() if n != MANIFEST}
        producer = json.loads(zf.read(MANIFEST)).get("producer", {})
    return members, producer


def assemble(members: Members, producer: dict[str, str]) -> bytes:
    out = io.BytesIO()
    write_archive(out, members, producer)
    return out.getvalue()


# Targets a mutation may name: ordinary ones, and what a hostile file would try.
TARGETS = [
    "aten::relu.default", "aten::add.Tensor", "aten::mul.Tensor", "aten::view.default",
    "aten::empty.memory_format", "aten::full.default", "aten::arange.start",
    "aten::from_file.default", "aten::_print.default", "aten::_reshape_alias.default",
    "aten::set_.source_Storage_storage_offset", "aten::relu_.default", "aten::copy_.default",
    "profiler::_record_function_enter.default", "_c10d_functional::all_reduce.default",
    "higher_order::cond", "higher_order::invoke_subgraph", "higher_order::nope",
    "operator.getitem", "operator.add", "math.ceil", "torch.sym_int", "builtins.eval",
    "__class__::__init__", "aten::__class__.default", "os::system.default", "aten::add",
]


def _program(members: Members) -> Any:
    return json.loads(members["program.json"])


def _nodes(program: Any) -> list[dict]:
    graph = program.get("graph_module") if isinstance(program, dict) else None
    nodes = graph.get("nodes") if isinstance(graph, dict) else None
    return [n for n in nodes if isinstance(n, dict)] if isinstance(nodes, list) else []


def m_int(program: Any, rng: random.Random) -> str:
    found = paths(program, lambda x: type(x) is int)
    if not found:
        return "no int"
    path = rng.choice(found)
    put(program, path, interesting_int(rng, get(program, path), 8))
    return f"int at {path[:6]}"


def m_target(program: Any, rng: random.Random) -> str:
    calls = [n for n in _nodes(program) if n.get("op") == "call_function"]
    if not calls:
        return "no call"
    node = rng.choice(calls)
    node["target"] = rng.choice(TARGETS)
    return f"target of {node.get('name')} -> {node['target']}"


def m_argument(program: Any, rng: random.Random) -> str:
    """Replace a node argument by another tagged value (another node, a literal, a list)."""
    nodes = _nodes(program)
    calls = [n for n in nodes if n.get("op") == "call_function" and n.get("args")]
    if not calls:
        return "no arguments"
    node = rng.choice(calls)
    names = [n.get("name") for n in nodes]
    k = rng.randrange(len(node["args"]))
    node["args"][k] = rng.choice([
        {"node": rng.choice(names)}, {"node": "undefined_name"}, {"int": rng.choice([0, -1, 2**40])},
        {"float": rng.choice([0.5, "nan", "inf"])}, {"str": "/etc/passwd"}, {"none": None},
        {"list": [{"int": 2}, {"int": -1}]}, {"dtype": "float64"}, {"op": rng.choice(TARGETS)},
        {"tuple": []}, {"bool": True},
    ])
    return f"argument {k} of {node.get('name')}"


def m_fake(program: Any, rng: random.Random) -> str:
    """Edit tensor metadata (meta.val): dtype, shape, stride, offset, device."""
    found = paths(program, lambda x: isinstance(x, dict) and "fake" in x and len(x) == 1)
    if not found:
        return "no tensor metadata"
    fake = get(program, rng.choice(found))["fake"]
    key = rng.choice(["dtype", "shape", "stride", "storage_offset", "device", "requires_grad"])
    fake[key] = {
        "dtype": lambda: rng.choice(["int64", "bool", "float16", "complex64", "qint8", "nope"]),
        "shape": lambda: rng.choice([[], [2**40], [-1, 3], [0], fake.get("shape", [])[::-1]]),
        "stride": lambda: rng.choice([[], [0, 0], [1], [2**62]]),
        "storage_offset": lambda: rng.choice([0, 7, 2**62]),
        "device": lambda: rng.choice(["cuda", "meta", "cpu:3", "x" * 80]),
        "requires_grad": lambda: rng.choice([True, 1]),
    }[key]()
    return f"tensor metadata {key}"


def _spec_paths(program: Any) -> list[tuple]:
    return paths(program, lambda x: isinstance(x, str) and x.startswith("[1, {"))


def m_treespec(program: Any, rng: random.Random) -> str:
    """Edit a pytree spec inside its JSON text: node types, dict keys, contexts, children."""
    found = _spec_paths(program)
    if not found:
        return "no spec"
    path = rng.choice(found)
    spec = json.loads(get(program, path))
    nodes = paths(spec, lambda x: isinstance(x, dict) and "type" in x)
    node = get(spec, rng.choice(nodes))
    what = rng.choice(["type", "keys", "children", "context"])
    if what == "type":
        node["type"] = rng.choice(["builtins.dict", "collections.defaultdict", "builtins.eval",
                                   "collections.namedtuple", "collections.OrderedDict", None, 3])
    elif what == "keys":
        node["type"], node["context"] = "builtins.dict", json.dumps(
            [rng.choice([[1, 2], {"a": 1}, 1.5, None, "x", "not an identifier"])
             for _ in node.get("children_spec", [])])
    elif what == "children" and node.get("children_spec"):
        node["children_spec"].append(copy.deepcopy(node["children_spec"][0]))
    else:
        node["context"] = rng.choice(["null", "[", json.dumps({"__enum__": 1}), 7, None])
    put(program, path, json.dumps(spec))
    return f"spec {what} at {path[:3]}"


def m_signature(program: Any, rng: random.Random) -> str:
    found = paths(program.get("signature", {}), lambda x: isinstance(x, str))
    if not found:
        return "no signature strings"
    path = rng.choice(found)
    put(program["signature"], path, rng.choice([
        "USER_INPUT", "PARAMETER", "BUFFER", "CONSTANT_TENSOR", "BUFFER_MUTATION",
        "USER_INPUT_MUTATION", "nope", "x", "fc1.weight", "",
    ]))
    return f"signature {path}"


def m_nodes(program: Any, rng: random.Random) -> str:
    nodes = program.get("graph_module", {}).get("nodes")
    if not isinstance(nodes, list) or not nodes:
        return "no nodes"
    what = rng.choice(["delete", "duplicate", "swap", "rename"])
    i = rng.randrange(len(nodes))
    if what == "delete":
        del nodes[i]
    elif what == "duplicate":
        nodes.insert(rng.randrange(len(nodes) + 1), copy.deepcopy(nodes[i]))
    elif what == "swap" and len(nodes) > 1:
        j = rng.randrange(len(nodes))
        nodes[i], nodes[j] = nodes[j], nodes[i]
    elif isinstance(nodes[i], dict):
        nodes[i]["name"] = rng.choice(["x", "self", "__init__", "a b", "output", "torch"])
    return f"nodes {what}"


def m_weights_header(members: Members, rng: random.Random) -> str:
    """Edit the safetensors header of a tensor member (offsets, dtype, shape)."""
    names = [n for n in members if n.endswith(".safetensors") and len(members[n]) >= 8]
    if not names:
        return "no tensor member"
    name = rng.choice(names)
    data = members[name]
    (length,) = struct.unpack_from("<Q", data)
    try:
        header = json.loads(data[8:8 + length])
    except ValueError:
        return "header unreadable"
    entries = [k for k, v in header.items() if isinstance(v, dict)]
    if not entries:
        return "no entries"
    entry = header[rng.choice(entries)]
    key = rng.choice(["dtype", "shape", "data_offsets"])
    entry[key] = {
        "dtype": lambda: rng.choice(["F64", "I8", "BOOL", "F8_E4M3", "X"]),
        "shape": lambda: rng.choice([[], [2**40], [1, 2, 3], [-1]]),
        "data_offsets": lambda: rng.choice([[0, 0], [0, 2**62], [4, 2], [0, 4]]),
    }[key]()
    text = json.dumps(header).encode()
    members[name] = struct.pack("<Q", len(text)) + text + data[8 + length:]
    return f"{name} header {key}"


# Expressions a hostile format 1.1 file may hold where a symbolic size or a shape_env entry
# goes: undeclared symbols, heads outside the table, huge numbers and powers, deep nesting.
HOSTILE_EXPRESSIONS = [
    "s9", "u99", "__import__", ["eval", "s0"], ["*", 10**400, "s0"], ["**", 2, 10**9],
    ["**", "s0", "s0"], ["q", 1, 0], ["f", 1.5], ["//", "s0", 0], ["%", "s0", 0],
    ["max"], ["+"] + ["s0"] * 300, True, "oo", ["-", "s0"], [], [["+"]],
]


def _nest(depth: int) -> Any:
    expr: Any = "s0"
    for _ in range(depth):
        expr = ["+", 1, expr]
    return expr


def m_symbolic(program: Any, rng: random.Random) -> str:
    """Format 1.1: edit a symbolic size (``{"sym": ...}``), a symbol entry (name, hint, range),
    a replacement, guard or runtime assert, or a derived range."""
    env = program.get("shape_env") if isinstance(program, dict) else None
    if not isinstance(env, dict):
        return "no shape_env"
    hostile = [*HOSTILE_EXPRESSIONS, _nest(rng.choice([70, 300]))]
    sizes = paths(program, lambda x: isinstance(x, dict) and "sym" in x and len(x) == 1)
    choice = rng.choice(["size", "symbol", "guard", "assert", "replacement", "derived"])
    if choice == "size" and sizes:
        get(program, rng.choice(sizes))["sym"] = rng.choice(hostile)
    elif choice == "symbol" and env.get("symbols"):
        entry = rng.choice(env["symbols"])
        key = rng.choice(["name", "hint", "range", "dim", "size_like", "sources"])
        entry[key] = rng.choice({
            "name": ["s0", "x", "s" * 300, 7, None], "hint": [-1, 2**70, 10**400, "3", None],
            "range": [[5, 2], ["s0", 9], [0, 10**400], [2], [-(2**63), 2**63]],
            "dim": [7, "x" * 80, None], "size_like": [1, "yes", None], "sources": [[1], "x"],
        }[key])
    elif choice in ("guard", "assert"):
        key = "guards" if choice == "guard" else "runtime_asserts"
        env.setdefault(key, []).append([rng.choice([False, *hostile]),
                                        rng.choice([None, ["f.py", -1, "f", ""], [1, 2]])])
    elif choice == "replacement":
        env.setdefault("replacements", []).append([rng.choice(["s0", "u0", 3]),
                                                   rng.choice(hostile)])
    else:
        env.setdefault("derived_ranges", []).append([rng.choice(hostile),
                                                     rng.choice([["4", "2"], ["x", "1"], [1]])])
    return f"symbolic {choice}"


PROGRAM_MUTATIONS: list[tuple[Callable[[Any, random.Random], str], int]] = [
    (m_int, 5), (m_target, 5), (m_argument, 5), (m_fake, 4), (m_treespec, 4),
    (m_signature, 2), (m_nodes, 3), (m_symbolic, 4),
]


def mutate(seed: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One mutant of the archive ``seed`` and what was done to it."""
    members, producer = disassemble(seed)
    program = _program(members)
    done = []
    functions, weights = zip(*PROGRAM_MUTATIONS)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        try:
            if rng.random() < 0.1:
                done.append(m_weights_header(members, rng))
            else:
                done.append(rng.choices(functions, weights)[0](program, rng))
        except (IndexError, KeyError, TypeError, ValueError, AttributeError) as e:
            done.append(f"(mutation skipped: {type(e).__name__})")
    members["program.json"] = json.dumps(program).encode()
    return assemble(members, producer), "; ".join(done)
