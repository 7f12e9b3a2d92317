"""The structure section's JSON tree <-> :class:`schema.Program` (used by :mod:`serialize`).

Values and instructions are tagged arrays (``["T", dtype, sizes, ...]``, ``["K", op, args,
debug]``); the tags are listed in ``docs/format/program-file.md``. The decoder checks the type of
every field as it goes and raises :class:`ProgramLoadError` with the field's path; semantic
checks (indices, sizes, the plan) are :mod:`validate`'s.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from exportir.format import schema
from exportir.format.validate import ProgramLoadError

# ------------------------------------------------------------------------------ encoding


def _storage(s: schema.Storage) -> list[Any]:
    match s:
        case schema.ConstantData(buffer=b):
            return ["C", b]
        case schema.Allocation(arena=a, offset=o, nbytes=n):
            return ["A", a, o, n]
        case schema.InputStorage():
            return ["I"]
        case schema.DynamicStorage():
            return ["D"]
        case schema.ViewOf(base=b, offset=o, strides=st):
            return ["V", b, o, list(st)]
    raise TypeError(f"not a storage: {s!r}")


def encode_value(v: schema.EValue) -> list[Any]:
    match v:
        case schema.Tensor():
            return ["T", int(v.dtype), list(v.sizes), list(v.dim_order), _storage(v.storage),
                    v.dynamic, v.initial]
        case schema.Int(value=x):
            return ["i", x]
        case schema.Double(value=x):
            return ["d", x]
        case schema.Bool(value=x):
            return ["b", x]
        case schema.String(value=x):
            return ["s", x]
        case schema.Null():
            return ["n"]
        case schema.IntList(items=x):
            return ["il", list(x)]
        case schema.DoubleList(values=x):
            return ["dl", list(x)]
        case schema.BoolList(values=x):
            return ["bl", list(x)]
        case schema.TensorList(items=x):
            return ["tl", list(x)]
        case schema.OptionalTensorList(items=x):
            return ["ol", list(x)]
    raise TypeError(f"not a value: {v!r}")


def encode_instruction(ins: schema.Instruction) -> list[Any]:
    match ins:
        case schema.KernelCall(op_index=op, args=args, debug=d):
            return ["K", op, list(args), d]
        case schema.DelegateCall(delegate_index=i, args=args, outputs=outs, debug=d):
            return ["G", i, list(args), list(outs), d]
        case schema.MoveCall(src=s, dst=t, debug=d):
            return ["M", s, t, d]
        case schema.JumpFalseCall(cond_value=c, dest=t, debug=d):
            return ["J", c, t, d]
        case schema.FreeCall(value=v, debug=d):
            return ["F", v, d]
    raise TypeError(f"not an instruction: {ins!r}")


def _encode_dim(d: schema.DimSize | None) -> list[int] | None:
    return None if d is None else [d.symbol, d.coeff, d.offset]


def _encode_input_sizes(m: schema.Method) -> dict[str, Any]:
    """The 2.1 keys, written only when the method has symbolic input sizes (a static method's
    structure is the 2.0 one)."""
    if not m.symbols and not any(m.input_dims):
        return {}
    return {
        "symbols": [[r.name, r.min, r.max] for r in m.symbols],
        "input_dims": [[_encode_dim(d) for d in dims] for dims in m.input_dims],
    }


def _encode_shared_state(m: schema.Method) -> dict[str, Any]:
    """The 2.2 key, written only when the method shares state."""
    if not m.shared_state:
        return {}
    return {"shared_state": [[s.name, s.value] for s in m.shared_state]}


def _encode_nodes(m: schema.Method) -> dict[str, Any]:
    """The 2.2 debug node table, written only when the method has one."""
    if not m.nodes:
        return {}
    return {"nodes": [[n.scope, n.name, n.target, n.source, n.module, n.module_type]
                      for n in m.nodes]}


def encode_method(m: schema.Method) -> dict[str, Any]:
    return _encode_input_sizes(m) | _encode_nodes(m) | _encode_shared_state(m) | {
        "name": m.name,
        "values": [encode_value(v) for v in m.values],
        "inputs": list(m.inputs),
        "outputs": list(m.outputs),
        "operators": [[op.name, op.overload] for op in m.operators],
        "instructions": [encode_instruction(i) for i in m.instructions],
        "debug": [[d.node_name, d.source] for d in m.debug],
        "plan": [list(m.plan.arenas), m.plan.lower_bound, m.plan.alignment],
        "input_names": list(m.input_names),
        "output_names": list(m.output_names),
        "in_spec": m.in_spec,
        "out_spec": m.out_spec,
    }


def encode_program(
    program: schema.Program,
    constants: list[tuple[int, int]],
    delegates: list[tuple[int, int]],
) -> dict[str, Any]:
    return {
        "version": program.version,
        "methods": [encode_method(m) for m in program.methods],
        "constants": [list(r) for r in constants],
        "delegates": [
            [d.backend_id, list(r), [[s.key, base64.b64encode(s.value).decode()]
                                     for s in d.compile_specs]]
            for d, r in zip(program.delegates, delegates)
        ],
    }


# ------------------------------------------------------------------------------ decoding


def _bad(path: str, why: str) -> ProgramLoadError:
    return ProgramLoadError(why, path)


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
"""Every integer of the format is a signed 64-bit integer (what a kernel or a size can take)."""


def _int(x: Any, path: str) -> int:
    if type(x) is not int:
        raise _bad(path, f"expected an integer, got {type(x).__name__}")
    if not INT64_MIN <= x <= INT64_MAX:
        raise _bad(path, f"integer {_short(x)} does not fit in 64 bits")
    return x


def _nat(x: Any, path: str) -> int:
    if type(x) is not int or x < 0:
        raise _bad(path, f"expected a non-negative integer, got {_short(x)}")
    if x > INT64_MAX:
        raise _bad(path, f"integer {_short(x)} does not fit in 64 bits")
    return x


def _short(x: Any) -> str:
    """``x`` for a message: huge integers by their size, never their 400 digits."""
    if type(x) is int and x.bit_length() > 64:
        return f"of {x.bit_length()} bits"
    return f"{x!r:.40}"


def _str(x: Any, path: str) -> str:
    if type(x) is not str:
        raise _bad(path, f"expected a string, got {type(x).__name__}")
    return x


def _bool(x: Any, path: str) -> bool:
    if type(x) is not bool:
        raise _bad(path, f"expected a boolean, got {type(x).__name__}")
    return x


def _float(x: Any, path: str) -> float:
    if type(x) not in (int, float):
        raise _bad(path, f"expected a number, got {type(x).__name__}")
    try:
        return float(x)
    except OverflowError:
        raise _bad(path, f"number {_short(x)} does not fit in a double") from None


def _list(x: Any, path: str, n: int | None = None) -> list[Any]:
    if type(x) is not list:
        raise _bad(path, f"expected an array, got {type(x).__name__}")
    if n is not None and len(x) != n:
        raise _bad(path, f"expected {n} entries, got {len(x)}")
    return x


def _all_ints(x: Any, low: int) -> bool:
    """Whether ``x`` is a list of integers in ``[low, INT64_MAX]`` (the common case, checked
    without making a path string per item)."""
    return type(x) is list and all(type(v) is int and low <= v <= INT64_MAX for v in x)


def _ints(x: Any, path: str) -> tuple[int, ...]:
    if _all_ints(x, INT64_MIN):
        return tuple(x)
    return tuple(_int(v, f"{path}[{i}]") for i, v in enumerate(_list(x, path)))


def _nats(x: Any, path: str) -> tuple[int, ...]:
    if _all_ints(x, 0):
        return tuple(x)
    return tuple(_nat(v, f"{path}[{i}]") for i, v in enumerate(_list(x, path)))


def _dict(x: Any, path: str, keys: tuple[str, ...]) -> dict[str, Any]:
    if type(x) is not dict:
        raise _bad(path, f"expected an object, got {type(x).__name__}")
    missing = [k for k in keys if k not in x]
    if missing:
        raise _bad(path, f"missing field(s) {', '.join(missing)}")
    return x


def _tagged(x: Any, path: str) -> tuple[str, list[Any]]:
    items = _list(x, path)
    if not items or type(items[0]) is not str:
        raise _bad(path, "expected a tagged array [tag, ...]")
    return items[0], items


_INPUT, _DYNAMIC = schema.InputStorage(), schema.DynamicStorage()


def _decode_storage(x: Any, path: str) -> schema.Storage:
    if type(x) is list and len(x) == 4 and x[0] == "A" and _all_ints(x[1:], 0):
        return schema.Allocation(x[1], x[2], x[3])  # the common case, checked at once
    tag, a = _tagged(x, path)
    if tag == "C" and len(a) == 2:
        return schema.ConstantData(_nat(a[1], f"{path}[1]"))
    if tag == "A" and len(a) == 4:
        return schema.Allocation(*(_nat(a[i], f"{path}[{i}]") for i in (1, 2, 3)))
    if tag == "I" and len(a) == 1:
        return _INPUT
    if tag == "D" and len(a) == 1:
        return _DYNAMIC
    if tag == "V" and len(a) == 4:
        return schema.ViewOf(_nat(a[1], f"{path}.base"), _nat(a[2], f"{path}.offset"),
                             _nats(a[3], f"{path}.strides"))
    raise _bad(path, f"unknown storage {tag!r} with {len(a)} entries")


_DTYPES: dict[int, schema.ScalarType] = {int(t): t for t in schema.ScalarType}


def _decode_tensor(a: list[Any], path: str) -> schema.Tensor:
    _list(a, path, 7)
    code = a[1]
    dtype = _DTYPES.get(code) if type(code) is int else None
    if dtype is None:
        _int(code, f"{path}.dtype")
        raise _bad(f"{path}.dtype", f"unknown dtype code {code}")
    initial = None if a[6] is None else _nat(a[6], f"{path}.initial")
    return schema.Tensor(
        dtype, _ints(a[2], f"{path}.sizes"), _ints(a[3], f"{path}.dim_order"),
        _decode_storage(a[4], f"{path}.storage"), _bool(a[5], f"{path}.dynamic"), initial,
    )


_SCALARS = {
    "i": (schema.Int, _int),
    "d": (schema.Double, _float),
    "b": (schema.Bool, _bool),
    "s": (schema.String, _str),
}
_LISTS = {
    "il": (schema.IntList, _nat),
    "tl": (schema.TensorList, _nat),
    "ol": (schema.OptionalTensorList, _nat),
    "dl": (schema.DoubleList, _float),
    "bl": (schema.BoolList, _bool),
}


def _fast_tensor(x: Any) -> schema.Tensor | None:
    """A well-formed ``["T", ...]`` with planned, input, runtime or constant storage decoded
    without making a path string per field; ``None`` for anything else (then
    :func:`decode_value` decodes it field by field and names what is wrong)."""
    if type(x) is not list or len(x) != 7 or x[0] != "T":
        return None
    _, code, sizes, order, storage, dynamic, initial = x
    dtype = _DTYPES.get(code) if type(code) is int else None
    if dtype is None or type(dynamic) is not bool or not (
        _all_ints(sizes, INT64_MIN) and _all_ints(order, INT64_MIN)
    ):
        return None
    if initial is not None and not (type(initial) is int and 0 <= initial <= INT64_MAX):
        return None
    if type(storage) is not list or not storage or storage[0] == "V":
        return None
    try:
        decoded = _decode_storage(storage, "")
    except ProgramLoadError:
        return None
    return schema.Tensor(dtype, tuple(sizes), tuple(order), decoded, dynamic, initial)


def decode_value(x: Any, path: str) -> schema.EValue:
    tag, a = _tagged(x, path)
    if tag == "T":
        return _decode_tensor(a, path)
    if tag in _SCALARS and len(a) == 2:
        cls, check = _SCALARS[tag]
        return cls(check(a[1], f"{path}.value"))
    if tag == "n" and len(a) == 1:
        return schema.Null()
    if tag in _LISTS and len(a) == 2:
        cls, check = _LISTS[tag]
        return cls(tuple(check(v, f"{path}.items[{i}]")
                         for i, v in enumerate(_list(a[1], f"{path}.items"))))
    raise _bad(path, f"unknown value {tag!r} with {len(a)} entries")


def decode_instruction(x: Any, path: str) -> schema.Instruction:
    tag, a = _tagged(x, path)
    if tag == "K" and len(a) == 4:
        return schema.KernelCall(_nat(a[1], f"{path}.op_index"), _nats(a[2], f"{path}.args"),
                                 _nat(a[3], f"{path}.debug"))
    if tag == "G" and len(a) == 5:
        return schema.DelegateCall(_nat(a[1], f"{path}.delegate_index"),
                                   _nats(a[2], f"{path}.args"), _nats(a[3], f"{path}.outputs"),
                                   _nat(a[4], f"{path}.debug"))
    if tag == "M" and len(a) == 4:
        return schema.MoveCall(_nat(a[1], f"{path}.src"), _nat(a[2], f"{path}.dst"),
                               _nat(a[3], f"{path}.debug"))
    if tag == "J" and len(a) == 4:
        return schema.JumpFalseCall(_nat(a[1], f"{path}.cond_value"), _nat(a[2], f"{path}.dest"),
                                    _nat(a[3], f"{path}.debug"))
    if tag == "F" and len(a) == 3:
        return schema.FreeCall(_nat(a[1], f"{path}.value"), _nat(a[2], f"{path}.debug"))
    raise _bad(path, f"unknown instruction {tag!r} with {len(a)} entries")


_METHOD_KEYS = ("name", "values", "inputs", "outputs", "operators", "instructions", "debug",
                "plan", "input_names", "output_names", "in_spec", "out_spec")


def _pair_of_str(x: Any, path: str) -> tuple[str, str]:
    a = _list(x, path, 2)
    return _str(a[0], f"{path}[0]"), _str(a[1], f"{path}[1]")


def _decode_symbol(x: Any, path: str) -> schema.SymbolRange:
    a = _list(x, path, 3)
    upper = None if a[2] is None else _int(a[2], f"{path}.max")
    return schema.SymbolRange(_str(a[0], f"{path}.name"), _int(a[1], f"{path}.min"), upper)


def _decode_dim(x: Any, path: str) -> schema.DimSize | None:
    if x is None:
        return None
    a = _list(x, path, 3)
    return schema.DimSize(_nat(a[0], f"{path}.symbol"), _int(a[1], f"{path}.coeff"),
                          _int(a[2], f"{path}.offset"))


def _decode_input_sizes(d: dict[str, Any], path: str) -> dict[str, Any]:
    """The 2.1 keys (absent in 2.0 files: no symbolic input sizes known)."""
    symbols = d.get("symbols", [])
    dims = d.get("input_dims", [])
    return {
        "symbols": tuple(_decode_symbol(v, f"{path}.symbols[{i}]")
                         for i, v in enumerate(_list(symbols, f"{path}.symbols"))),
        "input_dims": tuple(
            tuple(_decode_dim(e, f"{path}.input_dims[{i}][{k}]")
                  for k, e in enumerate(_list(v, f"{path}.input_dims[{i}]")))
            for i, v in enumerate(_list(dims, f"{path}.input_dims"))
        ),
    }


def _decode_node(x: Any, path: str) -> schema.DebugNode:
    a = _list(x, path, 6)
    return schema.DebugNode(_int(a[0], f"{path}.scope"),
                            *(_str(a[k], f"{path}[{k}]") for k in range(1, 6)))


def _decode_nodes(d: dict[str, Any], path: str) -> tuple[schema.DebugNode, ...]:
    """The 2.2 debug node table (absent in older files and in files written without it)."""
    field = f"{path}.nodes"
    return tuple(_decode_node(v, f"{field}[{i}]")
                 for i, v in enumerate(_list(d.get("nodes", []), field)))


def _decode_shared_state(x: Any, path: str) -> tuple[schema.SharedState, ...]:
    entries = []
    for i, e in enumerate(_list(x, path)):
        a = _list(e, f"{path}[{i}]", 2)
        entries.append(schema.SharedState(_str(a[0], f"{path}[{i}].name"),
                                          _nat(a[1], f"{path}[{i}].value")))
    return tuple(entries)


def decode_method(x: Any, path: str) -> schema.Method:
    d = _dict(x, path, _METHOD_KEYS)
    plan = _list(d["plan"], f"{path}.plan", 3)
    return schema.Method(
        **_decode_input_sizes(d, path),
        nodes=_decode_nodes(d, path),
        shared_state=_decode_shared_state(d.get("shared_state", []), f"{path}.shared_state"),
        name=_str(d["name"], f"{path}.name"),
        values=tuple(_fast_tensor(v) or decode_value(v, f"{path}.values[{i}]")
                     for i, v in enumerate(_list(d["values"], f"{path}.values"))),
        inputs=_nats(d["inputs"], f"{path}.inputs"),
        outputs=_nats(d["outputs"], f"{path}.outputs"),
        operators=tuple(schema.Operator(*_pair_of_str(o, f"{path}.operators[{i}]"))
                        for i, o in enumerate(_list(d["operators"], f"{path}.operators"))),
        instructions=tuple(decode_instruction(v, f"{path}.instructions[{i}]")
                           for i, v in enumerate(_list(d["instructions"], f"{path}.instructions"))),
        debug=tuple(schema.DebugEntry(*_pair_of_str(e, f"{path}.debug[{i}]"))
                    for i, e in enumerate(_list(d["debug"], f"{path}.debug"))),
        plan=schema.MethodPlan(_nats(plan[0], f"{path}.plan.arenas"),
                               _nat(plan[1], f"{path}.plan.lower_bound"),
                               _nat(plan[2], f"{path}.plan.alignment")),
        input_names=tuple(_str(n, f"{path}.input_names[{i}]")
                          for i, n in enumerate(_list(d["input_names"], f"{path}.input_names"))),
        output_names=tuple(_str(n, f"{path}.output_names[{i}]")
                           for i, n in enumerate(_list(d["output_names"],
                                                       f"{path}.output_names"))),
        in_spec=_str(d["in_spec"], f"{path}.in_spec"),
        out_spec=_str(d["out_spec"], f"{path}.out_spec"),
    )


def _slice(segment: memoryview, x: Any, path: str) -> memoryview:
    a = _list(x, path, 2)
    offset, nbytes = _nat(a[0], f"{path}[0]"), _nat(a[1], f"{path}[1]")
    if offset > segment.nbytes or nbytes > segment.nbytes - offset:
        raise _bad(path, f"bytes [{offset}, {offset + nbytes}) lie outside the "
                         f"{segment.nbytes}-byte data segment")
    return segment[offset:offset + nbytes]


def _compile_spec(x: Any, path: str) -> schema.CompileSpec:
    key, value = _pair_of_str(x, path)
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(f"{path}[1]", "compile spec value is not base64") from None
    return schema.CompileSpec(key, raw)


def decode_program(x: Any, segment: memoryview) -> schema.Program:
    d = _dict(x, "structure", ("version", "methods", "constants", "delegates"))
    constants = tuple(
        schema.ConstantBuffer(_slice(segment, c, f"constants[{i}]"))
        for i, c in enumerate(_list(d["constants"], "constants"))
    )
    delegates = []
    for i, g in enumerate(_list(d["delegates"], "delegates")):
        a = _list(g, f"delegates[{i}]", 3)
        specs = tuple(_compile_spec(s, f"delegates[{i}].compile_specs[{k}]")
                      for k, s in enumerate(_list(a[2], f"delegates[{i}].compile_specs")))
        delegates.append(schema.Delegate(_str(a[0], f"delegates[{i}].backend_id"),
                                         _slice(segment, a[1], f"delegates[{i}].data"), specs))
    return schema.Program(
        version=_int(d["version"], "version"),
        methods=tuple(decode_method(m, f"methods[{i}]")
                      for i, m in enumerate(_list(d["methods"], "methods"))),
        constants=constants,
        delegates=tuple(delegates),
    )
