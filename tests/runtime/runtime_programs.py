"""Hand-built ``schema.Program`` s for the runtime tests, made with a tiny builder that plans
memory naively (every planned tensor gets its own aligned bytes)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import torch

from exportir.format import schema
from exportir.format.schema import (
    Allocation,
    ConstantBuffer,
    ConstantData,
    DebugEntry,
    InputStorage,
    Operator,
    ScalarType,
    Tensor,
)

F32 = ScalarType.FLOAT
I64 = ScalarType.LONG
ALIGN = 16


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class MethodBuilder:
    name: str = "forward"
    values: list = field(default_factory=list)
    inputs: list = field(default_factory=list)
    input_names: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    operators: list = field(default_factory=list)
    instructions: list = field(default_factory=list)
    debug: list = field(default_factory=list)
    constants: list = field(default_factory=list)  # shared with the program builder
    arena: int = 0
    in_spec: str = ""
    out_spec: str = ""

    def add(self, value) -> int:
        self.values.append(value)
        return len(self.values) - 1

    def input(self, name, sizes, dtype=F32, dynamic=False) -> int:
        i = self.add(Tensor(dtype, tuple(sizes), tuple(range(len(sizes))), InputStorage(),
                            dynamic))
        self.inputs.append(i)
        self.input_names.append(name)
        return i

    def scalar_input(self, name, value) -> int:
        i = self.add(value)
        self.inputs.append(i)
        self.input_names.append(name)
        return i

    def planned(self, sizes, dtype=F32, dynamic=False, initial=None, dim_order=None) -> int:
        nbytes = schema.ELEMENT_SIZE[dtype]
        for s in sizes:
            nbytes *= s
        alloc = Allocation(0, self.arena, nbytes)
        self.arena = _align(self.arena + nbytes)
        order = tuple(dim_order) if dim_order is not None else tuple(range(len(sizes)))
        return self.add(Tensor(dtype, tuple(sizes), order, alloc, dynamic, initial))

    def view(self, base, sizes, strides, offset=0) -> int:
        v = self.values[base]
        order = tuple(sorted(range(len(sizes)), key=lambda d: (-strides[d], d)))
        return self.add(Tensor(v.dtype, tuple(sizes), order,
                               schema.ViewOf(base, offset, tuple(strides))))

    def constant_bytes(self, data: bytes) -> int:
        self.constants.append(ConstantBuffer(data))
        return len(self.constants) - 1

    def constant(self, tensor: torch.Tensor) -> int:
        data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        buffer = self.constant_bytes(data)
        st = {torch.float32: F32, torch.int64: I64}[tensor.dtype]
        return self.add(Tensor(st, tuple(tensor.shape), tuple(range(tensor.dim())),
                               ConstantData(buffer)))

    def op(self, name: str, overload: str) -> int:
        key = Operator(name, overload)
        if key not in self.operators:
            self.operators.append(key)
        return self.operators.index(key)

    def _debug(self, node: str, source: str) -> int:
        self.debug.append(DebugEntry(node, source))
        return len(self.debug) - 1

    def kernel(self, name, overload, args, node="node", source="") -> None:
        self.instructions.append(
            schema.KernelCall(self.op(name, overload), tuple(args), self._debug(node, source))
        )

    def instruction(self, make, node="node", source="") -> None:
        self.instructions.append(make(self._debug(node, source)))

    def build(self) -> schema.Method:
        return schema.Method(
            name=self.name,
            values=tuple(self.values),
            inputs=tuple(self.inputs),
            outputs=tuple(self.outputs),
            operators=tuple(self.operators),
            instructions=tuple(self.instructions),
            debug=tuple(self.debug),
            plan=schema.MethodPlan((_align(self.arena),) if self.arena else (), 0, ALIGN),
            input_names=tuple(self.input_names),
            in_spec=self.in_spec,
            out_spec=self.out_spec,
        )


def program_of(*builders: MethodBuilder, constants=None, delegates=()) -> schema.Program:
    return schema.Program(
        version=schema.FORMAT_VERSION,
        methods=tuple(b.build() for b in builders),
        constants=tuple(constants if constants is not None else builders[0].constants),
        delegates=tuple(delegates),
    )


def add_mul_builder() -> MethodBuilder:
    """out = (x + y) * w, w = 2 (a constant)."""
    b = MethodBuilder()
    x = b.input("x", (2, 3))
    y = b.input("y", (2, 3))
    w = b.constant(torch.full((2, 3), 2.0))
    one = b.add(schema.Int(1))
    s = b.planned((2, 3))
    out = b.planned((2, 3))
    b.kernel("aten::add", "out", (x, y, one, s), "add", "model.py:10")
    b.kernel("aten::mul", "out", (s, w, out), "mul", "model.py:11")
    b.outputs.append(out)
    return b


def add_mul_program() -> schema.Program:
    return program_of(add_mul_builder())


def f32_bytes(*xs: float) -> bytes:
    return struct.pack(f"<{len(xs)}f", *xs)


def view_program() -> schema.Program:
    """s = x.t() + w[1] as a column (w = arange(6).reshape(2, 3)); outputs s and s.t(): views
    of an input, a constant and a planned tensor."""
    b = MethodBuilder()
    x = b.input("x", (2, 3))
    w = b.constant(torch.arange(6.0).reshape(2, 3))
    xt = b.view(x, (3, 2), (1, 3))
    w1 = b.view(w, (3, 1), (1, 1), offset=3)
    one = b.add(schema.Int(1))
    s = b.planned((3, 2))
    b.kernel("aten::add", "out", (xt, w1, one, s), "add", "model.py:20")
    b.outputs += [s, b.view(s, (2, 3), (1, 2))]
    return program_of(b)
