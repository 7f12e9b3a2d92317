"""Hand-built programs for the format tests (every value kind and instruction kind)."""

from __future__ import annotations

import dataclasses
import struct

from exportir.format import schema
from exportir.format.schema import (
    Allocation,
    Bool,
    BoolList,
    CompileSpec,
    ConstantBuffer,
    ConstantData,
    DebugEntry,
    Delegate,
    DelegateCall,
    Double,
    DoubleList,
    DynamicStorage,
    FreeCall,
    InputStorage,
    Int,
    IntList,
    JumpFalseCall,
    KernelCall,
    Method,
    MethodPlan,
    MoveCall,
    Null,
    Operator,
    OptionalTensorList,
    Program,
    ScalarType,
    String,
    Tensor,
    TensorList,
    ViewOf,
)

F32 = ScalarType.FLOAT


def t(sizes, storage, dtype=F32, **kw) -> Tensor:
    return Tensor(dtype, tuple(sizes), tuple(range(len(sizes))), storage, **kw)


def sample_method(name: str = "forward") -> Method:
    values = (
        t((2, 3), InputStorage()),                       # 0 x
        t((2, 3), ConstantData(0)),                      # 1 weight
        Int(1),                                          # 2 alpha
        t((2, 3), Allocation(0, 0, 24)),                 # 3 add result
        t((2, 3), Allocation(0, 32, 24)),                # 4 relu result (output)
        Double(0.5),                                     # 5
        Bool(True),                                      # 6
        String("cpu"),                                   # 7
        Null(),                                          # 8
        IntList((2,)),                                   # 9
        DoubleList((1.0, 2.5)),                          # 10
        BoolList((True, False)),                         # 11
        TensorList((3, 4)),                              # 12
        OptionalTensorList((3, 8)),                      # 13
        t((3,), Allocation(0, 64, 12), initial=1),       # 14 state
        t((4,), DynamicStorage(), dynamic=True),         # 15
        t((3,), Allocation(0, 80, 12)),                  # 16
    )
    instructions = (
        KernelCall(0, (0, 1, 2, 3), 0),
        KernelCall(1, (3, 4), 1),
        JumpFalseCall(6, 4, 2),
        DelegateCall(0, (4,), (16,), 2),
        MoveCall(16, 14, 3),
        FreeCall(15, 3),
    )
    return Method(
        name=name,
        values=values,
        inputs=(0,),
        outputs=(4,),
        operators=(Operator("aten::add", "out"), Operator("aten::relu", "out")),
        instructions=instructions,
        debug=(DebugEntry("add", "model.py:3"), DebugEntry("relu", "model.py:4"),
               DebugEntry("call_delegate", ""), DebugEntry("output", "")),
        plan=MethodPlan((96,), 72, 16),
        input_names=("x",),
        output_names=("relu",),
        in_spec="",
        out_spec="",
    )


def sample_program() -> Program:
    weight = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    state = struct.pack("<3f", 0, 0, 0)
    return Program(
        version=schema.FORMAT_VERSION,
        methods=(sample_method("forward"), sample_method("other")),
        constants=(ConstantBuffer(weight), ConstantBuffer(state)),
        delegates=(Delegate("fused_cpu", b"\x01\x02blob", (CompileSpec("mode", b"\x00fast"),)),),
    )


def view_method(name: str = "forward") -> Method:
    """:func:`sample_method` plus views of an input, a constant and a planned tensor (an
    output, so its base stays live to the end)."""
    m = sample_method(name)
    views = (
        Tensor(F32, (3, 2), (1, 0), ViewOf(0, 0, (1, 3))),        # 17 x.t()
        Tensor(F32, (3,), (0,), ViewOf(1, 3, (1,))),               # 18 weight[1]
        Tensor(F32, (4, 2, 3), (1, 2, 0), ViewOf(3, 0, (0, 3, 1))),  # 19 add.expand(4, 2, 3)
    )
    instructions = m.instructions[:2] + (KernelCall(0, (18, 17, 2, 16), 1),) + m.instructions[2:]
    return dataclasses.replace(m, values=m.values + views, outputs=(4, 19),
                               instructions=instructions, output_names=("relu", "expanded"))


def view_program() -> Program:
    p = sample_program()
    return dataclasses.replace(p, methods=(view_method("forward"), view_method("other")))
