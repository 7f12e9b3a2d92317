"""Kernel choices for ExecuTorch's portable kernels, made when a method is written as ``.pte``.

ExecuTorch's portable elementwise kernels (``kernels/portable/cpu/util/elementwise_util.h``)
take a vectorized fast path only when every tensor operand has the computation's dtype; any
other mix loads each element through a conversion function, and a tensor operand of one element
is broadcast through index arithmetic. For the arithmetic exportir's programs do with a
zero-dim operand, two rewrites pick the cheaper kernel with the same result:

- a zero-dim **constant** operand (``x * 2`` after scalars became tensors) becomes the
  ``.Scalar_out`` overload with the value as a scalar (``x * 2`` runs as ``mul.Scalar_out``);
- a zero-dim **computed** operand of another dtype (``total / steps``, ``steps`` an int64
  buffer) is first cast to the other operand's dtype by ``_to_copy`` into memory of one more
  arena, so the operation runs on one dtype (as ExecuTorch's own compiler writes it).

Both apply only where torch's type promotion gives the tensor operand's dtype (the zero-dim
operand's kind is not above the tensor's: an int into a float tensor, never a float into an int
tensor) and the out has that dtype, so the values are those of the original call.

A third rewrite drops the copy that writes method state back (``self.total.add_(x)``: the call
computes a new value, a ``MoveCall`` at the end copies it into the buffer, one ``copy_`` in
ExecuTorch): the call writes the buffer itself, and every read of the new value reads the
buffer. Only where that is the same program: the new value has one writer, the buffer's shape
and dtype, and the buffer is not read or written between that writer and the copy (nor by the
writer, except as the operand of an elementwise kernel of the out's shape, which reads each
element before writing it). Methods with jumps are left as they are.

exportir's own ``.xpt`` is not rewritten (its runtime has other kernels). Imports the standard
library and the format.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

from exportir.format import schema
from exportir.format.pte_kernels import PTE_KERNELS

__all__ = ["select_kernels"]

S = schema.ScalarType
_INTEGRAL = {S.BYTE: "<B", S.CHAR: "<b", S.SHORT: "<h", S.INT: "<i", S.LONG: "<q"}
_FLOATING = {S.HALF: "<e", S.FLOAT: "<f", S.DOUBLE: "<d", S.BFLOAT16: None}
_RANGE = {S.BYTE: (0, 255), S.CHAR: (-128, 127), S.SHORT: (-(1 << 15), (1 << 15) - 1),
          S.INT: (-(1 << 31), (1 << 31) - 1), S.LONG: (-(1 << 63), (1 << 63) - 1)}


@dataclass(frozen=True, slots=True)
class _ScalarForm:
    """How ``op.out(a, b, ...)`` reads with a scalar: ``overload`` when the constant is ``b``;
    ``swapped`` (name, overload) when it is ``a`` (None: no such form); ``alpha``: the call has
    an alpha argument after the operands (a swap needs it to be 1)."""

    overload: str
    swapped: tuple[str, str] | None
    alpha: bool


_SCALAR_FORMS: dict[tuple[str, str], _ScalarForm] = {
    ("aten::add", "out"): _ScalarForm("Scalar_out", ("aten::add", "Scalar_out"), alpha=True),
    # (not rsub.Scalar_out for a constant first: exportir's runtime, which reads .pte files
    # too, has no such kernel)
    ("aten::sub", "out"): _ScalarForm("Scalar_out", None, alpha=True),
    ("aten::mul", "out"): _ScalarForm("Scalar_out", ("aten::mul", "Scalar_out"), alpha=False),
    ("aten::div", "out"): _ScalarForm("Scalar_out", None, alpha=False),
}
_CAST = ("aten::_to_copy", "out")

# Kernels that read each element of an operand of the out's shape before writing the same
# element of the out: the out may be that operand.
_ELEMENTWISE = frozenset({
    "aten::add.out", "aten::add.Scalar_out", "aten::sub.out", "aten::sub.Scalar_out",
    "aten::mul.out", "aten::mul.Scalar_out", "aten::div.out",
    "aten::div.Scalar_out",
})


def _kind(dtype: S) -> int:
    """0 for types no rewrite touches (bool, complex, unsigned wide), 1 integral, 2 floating."""
    return 1 if dtype in _INTEGRAL else 2 if dtype in _FLOATING else 0


def _scalar_value(t: schema.Tensor, data: bytes | memoryview) -> schema.Int | schema.Double | None:
    raw = bytes(data[:schema.ELEMENT_SIZE[t.dtype]])
    if len(raw) < schema.ELEMENT_SIZE[t.dtype]:
        return None
    if t.dtype in _INTEGRAL:
        return schema.Int(struct.unpack(_INTEGRAL[t.dtype], raw)[0])
    if t.dtype == S.BFLOAT16:
        return schema.Double(struct.unpack("<f", b"\0\0" + raw)[0])
    return schema.Double(struct.unpack(_FLOATING[t.dtype], raw)[0])


def _promotes_to(a: schema.Tensor, b: schema.Tensor) -> bool:
    """Whether ``a op b`` with zero-dim ``b`` has ``a``'s dtype by torch's rules: ``b``'s kind
    is not above ``a``'s (a zero-dim operand only decides when it is); between two zero-dim
    operands only the same dtype is taken."""
    if not (_kind(a.dtype) and _kind(b.dtype)) or b.sizes:
        return False
    if not a.sizes:
        return a.dtype == b.dtype
    return _kind(b.dtype) <= _kind(a.dtype)


class _Selector:
    def __init__(self, m: schema.Method, constants: tuple[schema.ConstantBuffer, ...]) -> None:
        self.m = m
        self.constants = constants
        self.values = list(m.values)
        self.operators = list(m.operators)
        self.arenas = list(m.plan.arenas)
        self.cast_arena: int | None = None
        self.scalars: dict[tuple, int] = {}

    def operator(self, name: str, overload: str) -> int:
        for k, op in enumerate(self.operators):
            if (op.name, op.overload) == (name, overload):
                return k
        self.operators.append(schema.Operator(name, overload))
        return len(self.operators) - 1

    def add(self, value: schema.EValue) -> int:
        self.values.append(value)
        return len(self.values) - 1

    def tensor(self, i: int) -> schema.Tensor | None:
        v = self.values[i]
        return v if isinstance(v, schema.Tensor) and not v.dynamic else None

    def constant(self, i: int, like: schema.Tensor) -> int | None:
        """A scalar value for zero-dim constant ``i`` used with tensor ``like``, or None."""
        t = self.tensor(i)
        if t is None or not isinstance(t.storage, schema.ConstantData) or not _promotes_to(
                like, t):
            return None
        if t.storage.buffer >= len(self.constants):
            return None
        value = _scalar_value(t, self.constants[t.storage.buffer].data)
        if value is None:
            return None
        if isinstance(value, schema.Int) and like.dtype in _RANGE:
            lo, hi = _RANGE[like.dtype]
            if not lo <= value.value <= hi:
                return None
        return self.shared(value)

    def shared(self, value: schema.EValue) -> int:
        """A read-only scalar this rewrite adds, one per distinct value."""
        x = getattr(value, "value", None)
        key = (type(value).__name__, x.hex() if isinstance(x, float) else x)
        found = self.scalars.get(key)
        if found is None:
            found = self.scalars[key] = self.add(value)
        return found

    def scalar_form(self, ins: schema.KernelCall, form: _ScalarForm) -> schema.KernelCall | None:
        op = self.operators[ins.op_index]
        a, b, out = ins.args[0], ins.args[1], ins.args[-1]
        ta, tb, to = self.tensor(a), self.tensor(b), self.tensor(out)
        if ta is None or tb is None or to is None:
            return None
        if to.dtype == ta.dtype and (k := self.constant(b, ta)) is not None:
            return replace(ins, op_index=self.operator(op.name, form.overload),
                           args=(a, k, *ins.args[2:]))
        if form.swapped is None or to.dtype != tb.dtype:
            return None
        alpha = self.values[ins.args[2]] if form.alpha else None
        if form.swapped[0] == op.name and alpha is not None and getattr(alpha, "value", None) != 1:
            return None  # c + alpha * x is x + c only for alpha 1
        k = self.constant(a, tb)
        if k is None:
            return None
        return replace(ins, op_index=self.operator(*form.swapped), args=(b, k, *ins.args[2:]))

    def cast_operand(self, ins: schema.KernelCall) -> list[schema.Instruction] | None:
        """``_to_copy`` of a computed zero-dim operand of another dtype, then the call on it."""
        a, b, out = ins.args[0], ins.args[1], ins.args[-1]
        ta, tb, to = self.tensor(a), self.tensor(b), self.tensor(out)
        if ta is None or tb is None or to is None or tb.dtype == ta.dtype:
            return None
        if to.dtype != ta.dtype or isinstance(tb.storage, schema.ConstantData):
            return None
        if not _promotes_to(ta, tb) or not ta.sizes:
            return None
        if self.cast_arena is None:
            self.cast_arena = len(self.arenas)
            self.arenas.append(0)
        offset = self.arenas[self.cast_arena]
        nbytes = schema.ELEMENT_SIZE[ta.dtype]
        self.arenas[self.cast_arena] = offset + nbytes + (-nbytes % 16)
        cast = self.add(schema.Tensor(ta.dtype, (), (), schema.Allocation(
            self.cast_arena, offset, nbytes)))
        no, none = self.shared(schema.Bool(False)), self.shared(schema.Null())
        return [schema.KernelCall(self.operator(*_CAST), (b, no, none, cast), ins.debug),
                replace(ins, args=(a, cast, *ins.args[2:]))]

    def rewrite(self, ins: schema.Instruction) -> list[schema.Instruction]:
        if not isinstance(ins, schema.KernelCall):
            return [ins]
        op = self.operators[ins.op_index]
        form = _SCALAR_FORMS.get((op.name, op.overload))
        if form is None:
            return [ins]
        found = self.scalar_form(ins, form)
        if found is not None:
            return [found]
        return self.cast_operand(ins) or [ins]

    def method(self) -> schema.Method:
        out: list[schema.Instruction] = []
        starts: list[int] = []
        for ins in self.m.instructions:
            starts.append(len(out))
            out += self.rewrite(ins)
        if len(out) == len(self.m.instructions) and self.values == list(self.m.values):
            return self.m
        starts.append(len(out))
        out = [replace(ins, dest=starts[ins.dest]) if isinstance(ins, schema.JumpFalseCall)
               else ins for ins in out]
        return replace(self.m, values=tuple(self.values), operators=tuple(self.operators),
                       instructions=tuple(out),
                       plan=replace(self.m.plan, arenas=tuple(self.arenas)))


def _returns(m: schema.Method, ins: schema.KernelCall) -> tuple[str, list[int]]:
    op = m.operators[ins.op_index]
    name = f"{op.name}.{op.overload}" if op.overload else op.name
    _, returns = PTE_KERNELS.get(name, (0, ()))
    return name, [ins.args[r] for r in returns if 0 <= r < len(ins.args)]


def _mentions(m: schema.Method, ins: schema.Instruction) -> set[int]:
    """The values ``ins`` reads or writes, list items included."""
    match ins:
        case schema.KernelCall(args=args) | schema.DelegateCall(args=args):
            found = set(args)
            for a in args:
                item = m.values[a]
                if isinstance(item, (schema.TensorList, schema.OptionalTensorList)):
                    found.update(item.items)
            return found
        case schema.MoveCall(src=src, dst=dst):
            return {src, dst}
        case schema.FreeCall(value=v):
            return {v}
    return set()


def _in_place(m: schema.Method, pc: int, move: schema.MoveCall) -> int | None:
    """The instruction that can write state ``move.dst`` directly instead of ``move.src``."""
    src, dst = m.values[move.src], m.values[move.dst]
    if not (isinstance(src, schema.Tensor) and isinstance(dst, schema.Tensor)):
        return None
    if not (isinstance(src.storage, schema.Allocation) and isinstance(dst.storage,
                                                                      schema.Allocation)):
        return None
    if (src.dtype, src.sizes, src.dim_order) != (dst.dtype, dst.sizes, dst.dim_order) or (
            src.dynamic or dst.dynamic or src.initial is not None or move.src in m.outputs):
        return None
    if any(isinstance(v, (schema.TensorList, schema.OptionalTensorList)) and move.src in v.items
           or isinstance(v, schema.Tensor) and isinstance(v.storage, schema.ViewOf)
           and v.storage.base == move.src for v in m.values):
        return None  # read otherwise than as an argument: not renamed
    aliases = {move.dst} | {i for i, v in enumerate(m.values) if isinstance(v, schema.Tensor)
                            and isinstance(v.storage, schema.ViewOf)
                            and v.storage.base == move.dst}
    writers = [k for k, ins in enumerate(m.instructions[:pc]) if isinstance(
        ins, schema.KernelCall) and move.src in _returns(m, ins)[1]
        or isinstance(ins, schema.MoveCall) and ins.dst == move.src]
    if len(writers) != 1 or any(move.src in _mentions(m, ins)
                                for ins in m.instructions[pc + 1:]):
        return None
    w = writers[0]
    if any(aliases & _mentions(m, ins) for ins in m.instructions[w + 1:pc]):
        return None
    ins = m.instructions[w]
    if not isinstance(ins, schema.KernelCall):
        return None
    name, outs = _returns(m, ins)
    if outs != [move.src] or ins.args.count(move.src) != 1:
        return None
    touched = aliases & _mentions(m, ins)
    if touched and (name not in _ELEMENTWISE or touched != {move.dst}):
        return None
    return w


def _write_state_in_place(m: schema.Method) -> schema.Method:
    if any(isinstance(ins, schema.JumpFalseCall) for ins in m.instructions):
        return m
    rename: dict[int, int] = {}
    dropped: set[int] = set()
    for pc, ins in enumerate(m.instructions):
        if isinstance(ins, schema.MoveCall) and _in_place(m, pc, ins) is not None:
            rename[ins.src] = ins.dst
            dropped.add(pc)
    if not rename:
        return m
    instructions = []
    for pc, ins in enumerate(m.instructions):
        if pc in dropped:
            continue
        if isinstance(ins, schema.KernelCall):
            ins = replace(ins, args=tuple(rename.get(a, a) for a in ins.args))
        elif isinstance(ins, schema.MoveCall):
            ins = replace(ins, src=rename.get(ins.src, ins.src))
        instructions.append(ins)
    return replace(m, instructions=tuple(instructions),
                   outputs=tuple(rename.get(o, o) for o in m.outputs))


def select_kernels(m: schema.Method,
                   constants: tuple[schema.ConstantBuffer, ...]) -> schema.Method:
    """``m`` with the portable kernels' cheaper forms chosen (see the module docstring); ``m``
    itself when nothing changes."""
    return _write_state_in_place(_Selector(m, constants).method())
