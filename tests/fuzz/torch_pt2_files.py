"""Structure-aware mutation of torch.export's .pt2 archives (``torch.export.save``).

A file is taken apart into its members; a mutation edits ``models/model.json`` (node targets,
argument kinds and values, tensor metadata, symbolic expressions, the signature, pytree specs),
a payload config (dtype, sizes, strides, ``use_pickle``) or a raw weight's bytes, and the zip is
written again. torch's archive has no checksums, so every edit reaches the loader's checks.
"""

from __future__ import annotations

import io
import json
import random
import zipfile
from collections.abc import Callable
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


MODEL_MUTATIONS: list[tuple[Callable[[Any, random.Random], str], int]] = [
    (m_value, 4), (m_drop, 2), (m_target, 2), (m_expr, 2), (m_int, 3), (m_swap_names, 1),
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


def mutate(seed: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One mutant of the archive ``seed`` and what was done to it."""
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
            else:
                done.append(rng.choices(functions, weights)[0](model, rng))
        except (IndexError, KeyError, TypeError, ValueError, AttributeError, StopIteration) as e:
            done.append(f"(mutation skipped: {type(e).__name__})")
    members[model_name] = json.dumps(model).encode()
    return assemble(members), "; ".join(done)
