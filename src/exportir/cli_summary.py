"""``exportir inspect --summary``: a program file on one screen.

Per method: inputs and outputs (with the dynamic sizes they accept), instruction counts, the
operator histogram (top ``N``), the memory plan; per delegate: its backend, blob size and what
the blob holds (for the fused CPU backend: the number of fused ops, their kinds, the constants
it carries); then the file's size breakdown. Reads only the program format and the runtime's
blob decoders (no compiler).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from exportir.format import schema
from exportir.program.printer import format_sizes, format_tensor_type, human_bytes

__all__ = ["format_delegates", "format_summary"]


def _value_type(v: schema.EValue | None) -> str:
    match v:
        case schema.Tensor():
            return format_tensor_type(v)
        case schema.Int(value=x) | schema.Double(value=x) | schema.Bool(value=x):
            return f"{type(v).__name__.lower()} {x!r}"
        case schema.Null():
            return "None"
        case None:
            return "?"
    return type(v).__name__


def _dim_text(m: schema.Method, d: schema.DimSize | None, static: int) -> str:
    if d is None:
        return str(static)
    name = m.symbols[d.symbol].name if 0 <= d.symbol < len(m.symbols) else f"?{d.symbol}"
    text = name if d.coeff == 1 else f"{d.coeff}*{name}"
    return text + (f"{d.offset:+d}" if d.offset else "")


def _io_lines(m: schema.Method, label: str, ids: tuple[int, ...],
              names: tuple[str, ...]) -> list[str]:
    lines = []
    for k, i in enumerate(ids):
        name = names[k] if k < len(names) and names[k] else f"{label[:-1]} {k}"
        v = m.values[i] if i < len(m.values) else None
        text = _value_type(v)
        dims = m.input_dims[k] if label == "inputs" and k < len(m.input_dims) else ()
        if isinstance(v, schema.Tensor) and any(d is not None for d in dims):
            sizes = ", ".join(_dim_text(m, d, s) for d, s in zip(dims, v.sizes))
            text = f"{text.split('[')[0]}[{sizes}]"
        lines.append(f"    {name}: {text}")
    return [f"  {label} ({len(ids)}):"] + (lines or ["    (none)"])


# Instruction kinds (the closed set of the format), in the order the summary counts them.
_INSTRUCTION_WORDS = {
    schema.KernelCall.__name__: "kernel calls", schema.DelegateCall.__name__: "delegate calls",
    schema.MoveCall.__name__: "moves", schema.JumpFalseCall.__name__: "jumps",
    schema.FreeCall.__name__: "frees",
}


def _histogram(m: schema.Method, top: int) -> list[str]:
    calls: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    for ins in m.instructions:
        kinds[type(ins).__name__] += 1
        if isinstance(ins, schema.KernelCall) and ins.op_index < len(m.operators):
            calls[str(m.operators[ins.op_index])] += 1
    parts = ", ".join(f"{kinds[k]} {word}" for k, word in _INSTRUCTION_WORDS.items() if kinds[k])
    lines = [f"  instructions: {len(m.instructions)} ({parts or 'none'})"]
    if calls:
        lines.append(f"  operators (top {min(top, len(calls))} of {len(calls)} kinds):")
        width = max(len(name) for name, _ in calls.most_common(top))
        lines += [f"    {name:<{width}}  x{n}" for name, n in calls.most_common(top)]
        rest = sum(calls.values()) - sum(n for _, n in calls.most_common(top))
        if rest:
            lines.append(f"    ... {rest} more call(s) of {len(calls) - top} other kind(s)")
    return lines


def _memory(m: schema.Method) -> str:
    total = sum(m.plan.arenas)
    ratio = f", {total / m.plan.lower_bound:.2f}x the lower bound" if m.plan.lower_bound else ""
    return (f"  memory: {human_bytes(total)} in {len(m.plan.arenas)} arena(s) "
            f"(peak live {human_bytes(m.plan.lower_bound)}{ratio})")


def _symbols(m: schema.Method) -> list[str]:
    if not m.symbols:
        return []
    ranges = ", ".join(f"{r.name} in [{r.min}, {'inf' if r.max is None else r.max}]"
                       for r in m.symbols)
    return [f"  dynamic sizes: {ranges}"]


@dataclass(frozen=True, slots=True)
class _BlobContents:
    """What a delegate blob holds, as far as its backend's decoder tells."""

    ops: Counter[str]
    constants: int = 0
    constant_bytes: int = 0
    problem: str = ""


def _fused_cpu(blob: bytes | memoryview) -> _BlobContents:
    from exportir.runtime.backends.fused_cpu.format import FusedCpuBlobError, decode_blob

    try:
        decoded = decode_blob(blob)
    except FusedCpuBlobError as exc:
        return _BlobContents(Counter(), problem=f"unreadable blob: {exc}")
    kinds = Counter(op.name.removeprefix("aten.").removesuffix(".default") for op in decoded.ops)
    weights = sum(t.nbytes for _, t in decoded.constants)
    return _BlobContents(kinds, len(decoded.constants), weights)


# Backend id -> reader of what its blob holds (the backends exportir ships).
_DESCRIBE = {"FusedCpuBackend": _fused_cpu}

# More delegates than this: the largest ones are listed, with totals for all.
_MAX_DELEGATE_LINES = 8


def _kinds_text(ops: Counter[str], top: int) -> str:
    shown = ", ".join(f"{name} x{n}" for name, n in ops.most_common(top))
    return shown + (f", ... ({len(ops) - top} more kinds)" if len(ops) > top else "")


def _delegate_line(d: int, g: schema.Delegate, c: _BlobContents | None) -> str:
    head = f"  #{d} {g.backend_id}, blob {human_bytes(g.nbytes)}"
    if c is None:
        return head + " (a backend exportir does not ship: contents not shown)"
    if c.problem:
        return f"{head}: {c.problem}"
    return (f"{head}: {sum(c.ops.values())} fused op(s) ({_kinds_text(c.ops, 3)}), "
            f"{c.constants} constant(s) ({human_bytes(c.constant_bytes)})")


def format_delegates(p: schema.Program, top: int = 10,
                     limit: int | None = _MAX_DELEGATE_LINES) -> list[str]:
    """What the delegates hold: totals, then one line per delegate (the ``limit`` largest)."""
    if not p.delegates:
        return ["Delegates: none"]
    contents = []
    for g in p.delegates:
        describe = _DESCRIBE.get(g.backend_id)
        contents.append(describe(g.data) if describe else None)
    backends = Counter(g.backend_id for g in p.delegates)
    total_ops: Counter[str] = Counter()
    for c in contents:
        total_ops.update(c.ops if c is not None else {})
    lines = [f"Delegates ({len(p.delegates)}): "
             + ", ".join(f"{b} x{n}" for b, n in backends.items())
             + f", blobs {human_bytes(sum(g.nbytes for g in p.delegates))}"]
    if total_ops:
        lines.append(f"  {sum(total_ops.values())} fused op(s) in all: "
                     f"{_kinds_text(total_ops, top)}")
    order = sorted(range(len(p.delegates)), key=lambda d: -p.delegates[d].nbytes)
    shown = sorted(order if limit is None else order[:limit])
    lines += [_delegate_line(d, p.delegates[d], contents[d]) for d in shown]
    if len(order) > len(shown):
        lines.append(f"  ... {len(order) - len(shown)} smaller delegate(s) (all of them: "
                     "exportir inspect without --summary)")
    return lines


def format_summary(path: str, p: schema.Program, layout: Any, top: int = 10,
                   method: str | None = None) -> str:
    """The one-screen summary of program ``p`` read from ``path`` (of one ``method`` if given)."""
    constants = sum(c.nbytes for c in p.constants)
    head = (f"{path}: exportir program, format {layout.major}.{layout.minor}, "
            f"{human_bytes(layout.file_size)}; {len(p.methods)} method(s), "
            f"{len(p.constants)} constant buffer(s) ({human_bytes(constants)}), "
            f"{len(p.delegates)} delegate(s)")
    lines = [head]
    for m in p.methods:
        if method is not None and m.name != method:
            continue
        lines.append("")
        lines.append(f"Method {m.name!r}")
        lines += _io_lines(m, "inputs", m.inputs, m.input_names)
        lines += _symbols(m)
        lines += _io_lines(m, "outputs", m.outputs, m.output_names)
        lines += _histogram(m, top)
        lines.append(_memory(m))
    lines.append("")
    lines += format_delegates(p, top)
    lines.append("")
    lines += format_sizes(p, layout)
    lines.append("")
    lines.append(f"(full dump: exportir inspect {path})")
    return "\n".join(lines) + "\n"
