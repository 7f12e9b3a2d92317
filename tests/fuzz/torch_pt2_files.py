"""Structure-aware mutation of torch.export's .pt2 archives (``torch.export.save``).

A file is taken apart into its members; a mutation edits ``models/model.json`` (node targets,
argument kinds and values, tensor metadata, symbolic expressions, ``range_constraints`` keys,
the signature, pytree specs), a payload config (dtype, sizes, strides, ``use_pickle``), a raw
weight's bytes, or the pickled example inputs (``data/sample_inputs/<name>.pt``, a torch.save
zip: its ``data.pkl`` opcodes and arguments, injected ``GLOBAL os system`` / ``builtins eval``
calls that would touch a canary file, or its storages' bytes), and the zip is written again.
torch's archive has no checksums, so every edit reaches the loader's checks.
"""

from __future__ import annotations

import io
import json
import pickletools
import random
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xpt_files import get, interesting_int, paths, put

Members = dict[str, bytes]

_TARGETS = ("torch.ops.aten.from_file.default", "torch.ops.aten.add.Tensor",
            "torch.ops.higher_order.cond", "torch.ops.higher_order.invoke_subgraph", "os.system",
            "builtins.eval", "torch.ops.aten.relu.default", "torch.ops.nope.nope.default",
            "torch.ops.aten.add", "_operator.getitem", "torch.ops.c10d.barrier.default")
_EXPRS = ("Symbol('s0', integer=True, positive=True)", "Integer(7)", "__import__('os')",
          "Add(Symbol('s77', integer=True, positive=True), Integer(" + "9" * 50 + "))",
          "Mul(" * 80 + "Integer(1)" + ")" * 80, "FloorDiv(Symbol('u0', integer=True), Integer(0))",
          "Pow(Symbol('s77', integer=True, positive=True), Integer(100000))", "oo", "lambda: 0")


def disassemble(data: bytes) -> Members:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def assemble(members: Members) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return out.getvalue()


def _json_member(members: Members, suffix: str) -> str:
    return next(n for n in members if n.endswith(suffix))


def _any(value: Any) -> bool:
    return True


def m_value(tree: Any, rng: random.Random) -> str:
    """Any leaf or subtree replaced by a value of another kind."""
    path = rng.choice(paths(tree, _any)[1:])
    old = get(tree, path)
    new = rng.choice([None, -1, 0, 2**63, 10**30, "", "x" * 300, [], {}, {"as_int": 1},
                      {"as_tensor": {"name": "nope"}}, [old, old], True, 1.5,
                      interesting_int(rng, old if type(old) is int else 3, 8)])
    put(tree, path, new)
    return f"{'/'.join(map(str, path))}: {str(old)[:40]} -> {str(new)[:40]}"


def m_drop(tree: Any, rng: random.Random) -> str:
    found = paths(tree, lambda v: isinstance(v, dict) and v)
    path = rng.choice(found)
    key = rng.choice(sorted(get(tree, path)))
    del get(tree, path)[key]
    return f"drop {'/'.join(map(str, (*path, key)))}"


def m_target(tree: Any, rng: random.Random) -> str:
    found = paths(tree, lambda v: isinstance(v, dict) and "target" in v and "inputs" in v)
    path = rng.choice(found)
    target = rng.choice(_TARGETS)
    get(tree, path)["target"] = target
    return f"target -> {target}"


def m_expr(tree: Any, rng: random.Random) -> str:
    found = paths(tree, lambda v: isinstance(v, dict) and "expr_str" in v)
    found = found or paths(tree, lambda v: isinstance(v, dict) and "as_int" in v)
    path = rng.choice(found)
    expr = rng.choice(_EXPRS)
    put(tree, path, {"expr_str": expr, "hint": None} if "expr_str" in get(tree, path)
        else {"as_expr": {"expr_str": expr, "hint": None}})
    return f"expr -> {expr[:40]}"


def m_int(tree: Any, rng: random.Random) -> str:
    path = rng.choice(paths(tree, lambda v: type(v) is int))
    old = get(tree, path)
    put(tree, path, interesting_int(rng, old, 16))
    return f"int {'/'.join(map(str, path))}"


def m_swap_names(tree: Any, rng: random.Random) -> str:
    found = paths(tree, lambda v: isinstance(v, dict) and set(v) == {"name"})
    a, b = rng.sample(found, 2)
    va, vb = get(tree, a), get(tree, b)
    put(tree, a, vb)
    put(tree, b, va)
    return "swap tensor names"


_KEYS = ("s0 + 1", "2*s0", "__import__('os').system('true')", "(" * 200 + "s0" + ")" * 200,
         "s0/0", "Max(s0, " + "9" * 60 + ")", "s99 + 1", "s0**100000", "FloorDiv(s0, 0)", "")


def m_range_key(tree: Any, rng: random.Random) -> str:
    ranges = tree.get("range_constraints")
    if not isinstance(ranges, dict):
        raise KeyError("range_constraints")
    key = rng.choice(_KEYS)
    value = rng.choice([{"min_val": 0, "max_val": 10}, {"min_val": None, "max_val": 2**70},
                        {"min_val": 5, "max_val": 1}, "x"])
    if ranges and rng.random() < 0.5:
        ranges.pop(rng.choice(sorted(ranges)))
    ranges[key] = value
    return f"range key -> {key[:40]}"


MODEL_MUTATIONS: list[tuple[Callable[[Any, random.Random], str], int]] = [
    (m_value, 4), (m_drop, 2), (m_target, 2), (m_expr, 2), (m_int, 3), (m_swap_names, 1),
    (m_range_key, 1),
]


def m_config(members: Members, rng: random.Random) -> str:
    name = _json_member(members, "_weights_config.json")
    config = json.loads(members[name])
    done = rng.choice([m_int, m_value, m_drop])(config, rng)
    if rng.random() < 0.2:
        entry = rng.choice(list(config.get("config", {}).values()) or [{}])
        if isinstance(entry, dict):
            entry["use_pickle"] = True
            done += "; use_pickle"
    members[name] = json.dumps(config).encode()
    return f"weights config: {done}"


def m_weight_bytes(members: Members, rng: random.Random) -> str:
    name = rng.choice([n for n in members if "/data/weights/weight_" in n])
    data = members[name]
    members[name] = data[: rng.randrange(len(data) + 1)] if rng.random() < 0.7 else data * 2
    return f"{name}: {len(data)} -> {len(members[name])} bytes"


def _opcodes(pkl: bytes) -> list[tuple[str, Any, int]]:
    return [(op.name, arg, pos) for op, arg, pos in pickletools.genops(pkl)]


def _pickle_text(s: str) -> bytes:
    return b"X" + len(s.encode()).to_bytes(4, "little") + s.encode()


def _injection(canary: Path, rng: random.Random) -> bytes:
    """A call that would create ``canary`` if anything ran it."""
    module, name, code = rng.choice([
        ("os", "system", f"touch {canary}"), ("posix", "system", f"touch {canary}"),
        ("builtins", "eval", f"open({str(canary)!r}, 'w')"),
        ("builtins", "exec", f"open({str(canary)!r}, 'w')")])
    return b"c" + f"{module}\n{name}\n".encode() + _pickle_text(code) + b"\x85R"


def m_pickle(pkl: bytes, rng: random.Random, canary: Path) -> tuple[bytes, str]:
    """data.pkl edited at an opcode boundary: a call injected, an opcode dropped or
    duplicated, an integer argument replaced, a byte flipped, or the stream cut."""
    ops = _opcodes(pkl)
    name, arg, pos = rng.choice(ops[1:-1])
    end = next((p for _, _, p in ops if p > pos), len(pkl))
    roll = rng.random()
    if roll < 0.25:
        return pkl[:pos] + _injection(canary, rng) + pkl[pos:], f"data.pkl: call injected at {pos}"
    if roll < 0.4:
        return pkl[:pos] + pkl[end:], f"data.pkl: {name} at {pos} dropped"
    if roll < 0.5:
        return pkl[:end] + pkl[pos:], f"data.pkl: {name} at {pos} doubled"
    if roll < 0.75 and type(arg) is int:
        new = interesting_int(rng, arg, 16) % (1 << 31)
        return (pkl[:pos] + b"J" + new.to_bytes(4, "little") + pkl[end:],
                f"data.pkl: {name} {arg} -> {new}")
    if roll < 0.9:
        i = rng.randrange(len(pkl))
        return pkl[:i] + bytes([rng.randrange(256)]) + pkl[i + 1:], f"data.pkl: byte {i}"
    cut = rng.randrange(len(pkl))
    return pkl[:cut], f"data.pkl: cut at {cut}"


def m_samples(members: Members, rng: random.Random, canary: Path) -> str:
    name = next(n for n in members if "/data/sample_inputs/" in n)
    inner = disassemble(members[name])
    pkl_name = next(n for n in inner if n.endswith("/data.pkl"))
    storages = [n for n in inner if "/data/" in n and not n.endswith(".pkl")]
    if storages and rng.random() < 0.25:
        key = rng.choice(storages)
        data = inner[key]
        inner[key] = data[: rng.randrange(len(data) + 1)] if rng.random() < 0.7 else data * 2
        done = f"{key}: {len(data)} -> {len(inner[key])} bytes"
    else:
        inner[pkl_name], done = m_pickle(inner[pkl_name], rng, canary)
    members[name] = assemble(inner)
    return f"sample inputs: {done}"


def mutate(seed: bytes, rng: random.Random, canary: Path | None = None) -> tuple[bytes, str]:
    """One mutant of the archive ``seed`` and what was done to it (``canary``: the file an
    injected call in the example inputs would create)."""
    canary = canary or Path("exportir-fuzz-canary")
    members = disassemble(seed)
    model_name = _json_member(members, "/models/model.json")
    model = json.loads(members[model_name])
    functions, weights = zip(*MODEL_MUTATIONS)
    done = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        try:
            roll = rng.random()
            if roll < 0.1:
                done.append(m_config(members, rng))
            elif roll < 0.15:
                done.append(m_weight_bytes(members, rng))
            elif roll < 0.35:
                done.append(m_samples(members, rng, canary))
            else:
                done.append(rng.choices(functions, weights)[0](model, rng))
        except (IndexError, KeyError, TypeError, ValueError, AttributeError, StopIteration) as e:
            done.append(f"(mutation skipped: {type(e).__name__})")
    members[model_name] = json.dumps(model).encode()
    return assemble(members), "; ".join(done)
