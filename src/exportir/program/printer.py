"""Human-readable dump of a :class:`schema.Program` (what ``exportir inspect`` prints).

Sections per method: signature, memory plan, operators, values, instructions (with the graph
node and the user's source line of each); then the file's size breakdown when a
:class:`serialize.FileLayout` is given. Imports only the format modules.
"""

from __future__ import annotations

from exportir.format import schema

_SHORT = {
    schema.ScalarType.BYTE: "u8", schema.ScalarType.CHAR: "i8", schema.ScalarType.SHORT: "i16",
    schema.ScalarType.INT: "i32", schema.ScalarType.LONG: "i64", schema.ScalarType.HALF: "f16",
    schema.ScalarType.FLOAT: "f32", schema.ScalarType.DOUBLE: "f64",
    schema.ScalarType.COMPLEX_HALF: "c32", schema.ScalarType.COMPLEX_FLOAT: "c64",
    schema.ScalarType.COMPLEX_DOUBLE: "c128", schema.ScalarType.BOOL: "b8",
    schema.ScalarType.BFLOAT16: "bf16", schema.ScalarType.UINT16: "u16",
    schema.ScalarType.UINT32: "u32", schema.ScalarType.UINT64: "u64",
}


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    return f"{n} B"


def _storage(t: schema.Tensor) -> str:
    match t.storage:
        case schema.ConstantData(buffer=b):
            return f"const#{b}"
        case schema.Allocation(arena=a, offset=o, nbytes=n):
            text = f"arena{a}+{o} ({n} B)"
            return text + (f" state init=const#{t.initial}" if t.initial is not None else "")
        case schema.InputStorage():
            return "input"
        case schema.DynamicStorage():
            return "dynamic"
        case schema.ViewOf(base=b, offset=o, strides=st):
            return f"view of %{b} (offset {o}, strides {st})"
    return "?"


def format_tensor_type(t: schema.Tensor) -> str:
    dims = ", ".join(str(s) for s in t.sizes)
    order = "" if t.dim_order == tuple(range(len(t.sizes))) else f" dim_order={t.dim_order}"
    bound = " (upper bound)" if t.dynamic else ""
    return f"{_SHORT.get(t.dtype, str(t.dtype))}[{dims}]{order}{bound}"


def format_value(v: schema.EValue) -> str:
    match v:
        case schema.Tensor():
            return f"{format_tensor_type(v)} {_storage(v)}"
        case schema.Int(value=x):
            return f"int {x}"
        case schema.Double(value=x):
            return f"float {x!r}"
        case schema.Bool(value=x):
            return f"bool {x}"
        case schema.String(value=x):
            return f"str {x!r}"
        case schema.Null():
            return "None"
        case schema.IntList(items=x):
            return "int[] [" + ", ".join(f"%{i}" for i in x) + "]"
        case schema.DoubleList(values=x):
            return f"float[] {list(x)}"
        case schema.BoolList(values=x):
            return f"bool[] {list(x)}"
        case schema.TensorList(items=x):
            return "Tensor[] [" + ", ".join(f"%{i}" for i in x) + "]"
        case schema.OptionalTensorList(items=x):
            return "Tensor?[] [" + ", ".join(f"%{i}" for i in x) + "]"
    return repr(v)


def _refs(ids: tuple[int, ...]) -> str:
    return ", ".join(f"%{i}" for i in ids)


def format_instruction(m: schema.Method, p: schema.Program, ins: schema.Instruction) -> str:
    match ins:
        case schema.KernelCall(op_index=op, args=args):
            o = m.operators[op] if op < len(m.operators) else f"<op {op}>"
            return f"{o}({_refs(args)})"
        case schema.DelegateCall(delegate_index=d, args=args, outputs=outs):
            backend = p.delegates[d].backend_id if d < len(p.delegates) else "?"
            return f"delegate#{d}[{backend}]({_refs(args)}) -> ({_refs(outs)})"
        case schema.MoveCall(src=s, dst=t):
            return f"move %{s} -> %{t}"
        case schema.JumpFalseCall(cond_value=c, dest=t):
            return f"jump_false %{c} -> @{t}"
        case schema.FreeCall(value=v):
            return f"free %{v}"
    return repr(ins)


def _debug(m: schema.Method, ins: schema.Instruction, modules: dict[str, str]) -> str:
    if ins.debug >= len(m.debug):
        return ""
    d = m.debug[ins.debug]
    module = modules.get(d.node_name, "")
    return (f"  # {d.node_name}" + (f"  {d.source}" if d.source else "")
            + (f"  in {module}" if module else ""))


def _signature(m: schema.Method, ids: tuple[int, ...], names: tuple[str, ...]) -> list[str]:
    lines = []
    for k, i in enumerate(ids):
        name = names[k] if k < len(names) else ""
        v = m.values[i] if i < len(m.values) else None
        lines.append(f"    %{i} {name}: {format_value(v) if v is not None else '?'}".rstrip())
    return lines


def _dim_text(m: schema.Method, d: schema.DimSize | None, static: int) -> str:
    if d is None:
        return str(static)
    name = m.symbols[d.symbol].name if 0 <= d.symbol < len(m.symbols) else f"?{d.symbol}"
    text = name if d.coeff == 1 else f"{d.coeff}*{name}"
    return text + (f"{d.offset:+d}" if d.offset else "")


def _input_sizes(m: schema.Method) -> list[str]:
    """``symbols: T in [2, 128], B in [1, 16]`` and each dynamic input's sizes in them."""
    if not m.symbols:
        return []
    ranges = ", ".join(f"{r.name} in [{r.min}, {'inf' if r.max is None else r.max}]"
                       for r in m.symbols)
    lines = [f"  symbols: {ranges}"]
    for k, (i, dims) in enumerate(zip(m.inputs, m.input_dims)):
        v = m.values[i] if i < len(m.values) else None
        if isinstance(v, schema.Tensor) and any(d is not None for d in dims):
            name = m.input_names[k] if k < len(m.input_names) else f"input {k}"
            sizes = ", ".join(_dim_text(m, d, s) for d, s in zip(dims, v.sizes))
            lines.append(f"    {name}: [{sizes}]")
    return lines


def format_method(m: schema.Method, p: schema.Program) -> list[str]:
    lines = [f"Method {m.name!r}", "  inputs:"]
    lines += _signature(m, m.inputs, m.input_names) or ["    (none)"]
    lines += _input_sizes(m)
    lines.append("  outputs:")
    lines += _signature(m, m.outputs, m.output_names) or ["    (none)"]
    total = sum(m.plan.arenas)
    ratio = f", {total / m.plan.lower_bound:.3f}x" if m.plan.lower_bound else ""
    lines.append(f"  memory plan: {len(m.plan.arenas)} arena(s), {human_bytes(total)} "
                 f"(lower bound {human_bytes(m.plan.lower_bound)}{ratio}), "
                 f"alignment {m.plan.alignment}")
    for a, size in enumerate(m.plan.arenas):
        lines.append(f"    arena {a}: {size} bytes")
    lines.append(f"  operators ({len(m.operators)}):")
    lines += [f"    {k}: {o}" for k, o in enumerate(m.operators)]
    lines.append(f"  values ({len(m.values)}):")
    lines += [f"    %{i}: {format_value(v)}" for i, v in enumerate(m.values)]
    lines.append(f"  instructions ({len(m.instructions)}):")
    width = len(str(max(len(m.instructions) - 1, 0)))
    modules = {n.name: n.module for n in m.nodes if n.scope == schema.DEBUG_METHOD_SCOPE}
    for pc, ins in enumerate(m.instructions):
        lines.append(f"    {pc:>{width}}  {format_instruction(m, p, ins)}{_debug(m, ins, modules)}")
    return lines


def format_sizes(p: schema.Program, layout: object) -> list[str]:
    constants = sum(c.nbytes for c in p.constants)
    delegates = sum(d.nbytes for d in p.delegates)
    data = getattr(layout, "data_length", 0)
    size = getattr(layout, "file_size", 0)
    lines = [
        "Size breakdown:",
        f"  header       {getattr(layout, 'header_size', 0):>12} B",
        (
            f"  structure    {getattr(layout, 'structure_length', 0):>12} B "
            f"({getattr(layout, 'structure_raw_length', 0)} B uncompressed)"
        ),
        f"  constants    {constants:>12} B in {len(p.constants)} buffer(s)",
        f"  delegates    {delegates:>12} B in {len(p.delegates)} blob(s)",
        f"  padding      {data - constants - delegates:>12} B",
        f"  total        {size:>12} B ({human_bytes(size)})",
    ]
    if constants:
        lines.append(f"  file / constant bytes: {size / constants:.4f}")
    return lines


def format_program(p: schema.Program, layout: object | None = None) -> str:
    """The dump; ``layout`` (a ``serialize.FileLayout``) adds the size breakdown."""
    head = (f"Program (format {p.version}): {len(p.methods)} method(s) "
            f"[{', '.join(repr(m.name) for m in p.methods)}], {len(p.constants)} constant "
            f"buffer(s) ({human_bytes(sum(c.nbytes for c in p.constants))}), "
            f"{len(p.delegates)} delegate(s)")
    lines = [head]
    for d, g in enumerate(p.delegates):
        specs = ", ".join(s.key for s in g.compile_specs)
        lines.append(f"  delegate#{d}: backend {g.backend_id!r}, {g.nbytes} B"
                     + (f", compile specs: {specs}" if specs else ""))
    for m in p.methods:
        lines.append("")
        lines += format_method(m, p)
    if layout is not None:
        lines.append("")
        lines += format_sizes(p, layout)
    return "\n".join(lines) + "\n"
