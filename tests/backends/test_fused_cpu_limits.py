"""Allocation caps inside a fused_cpu blob (the issue's "``arange`` inside a fused blob"): an op
whose result size an argument decides is refused beyond ``LoadLimits.max_dynamic_bytes``, at
load when the argument is a literal, before allocating when it is read at run time."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from runtime.runtime_programs import F32, MethodBuilder, program_of

from exportir.format import schema
from exportir.format.validate import LoadLimits
from exportir.runtime import Program, RuntimeFailure
from exportir.runtime.backends.fused_cpu import (
    BACKEND_ID,
    FusedAllocationError,
    FusedCpuBlobError,
    backend_runtime,
)
from exportir.runtime.errors import ResourceLimitExceeded


def _blob(ops: list, values: int, inputs: list[int], outputs: list[int]) -> bytes:
    header = {"values": values, "inputs": inputs, "outputs": outputs, "constants": [],
              "ops": ops, "inplace": [0] * len(ops)}
    text = json.dumps(header).encode()
    head = struct.pack("<4sII", b"XFC1", 2, len(text)) + text
    return head + b"\0" * (-len(head) % 16)


def _arange(end: object) -> bytes:
    return _blob([["aten.arange.start_step", [0, end, 1], {}, 1, "arange"]], 2, [0], [1])


def _program(blob: bytes) -> schema.Program:
    """out = delegate(x) into a runtime-allocated tensor; x of any size up to [64, 64]."""
    b = MethodBuilder()
    x = b.input("x", (64, 64), dynamic=True)
    out = b.add(schema.Tensor(F32, (0, 0), (0, 1), schema.DynamicStorage(), True))
    b.instruction(lambda d: schema.DelegateCall(0, (x,), (out,), d), "delegate", "model.py:7")
    b.outputs.append(out)
    return program_of(b, delegates=[schema.Delegate(BACKEND_ID, blob, ())])


def test_a_literal_arange_beyond_the_cap_is_refused_at_load():
    with pytest.raises(FusedCpuBlobError, match=r"ops\[0\].*max_dynamic_bytes"):
        backend_runtime().init(_arange(1 << 40), ())
    with pytest.raises(FusedCpuBlobError, match="Ref"):  # sizes are literals in a blob
        backend_runtime().init(_arange({"v": 0}), ())
    with pytest.raises(RuntimeFailure, match="max_dynamic_bytes"):
        Program.from_schema(_program(_arange(1 << 40)))
    backend_runtime().init(_arange(1 << 10), ())  # within the cap


def test_a_literal_full_beyond_a_lower_cap_is_refused_at_load():
    blob = _blob([["aten.full.default", [[1 << 20], 1.0], {}, 1, "full"]], 2, [0], [1])
    Program.from_schema(_program(blob))
    with pytest.raises(RuntimeFailure, match="max_dynamic_bytes"):
        Program.from_schema(_program(blob), limits=LoadLimits(max_dynamic_bytes=1 << 20))


def test_a_repeat_sized_by_its_input_at_run_time_is_refused_before_allocating():
    blob = _blob([["aten.repeat.default", [{"v": 0}, [1 << 12, 1 << 12]], {}, 1, "repeat"]],
                 2, [0], [1])
    method = Program.from_schema(_program(blob)).method()
    x = torch.ones(1, 1)
    assert method.execute([x])[0].shape == (1 << 12, 1 << 12)  # 64 MiB: within the cap
    with pytest.raises(ResourceLimitExceeded) as info:
        method.execute([torch.ones(64, 64)])  # 256 GiB
    assert info.value.limit == "max_dynamic_bytes" and info.value.instruction == 0
    assert "repeat" in str(info.value)
    assert method.execute([torch.ones(1, 2)])[0].shape == (1 << 12, 1 << 13)


def test_views_and_repeats_sized_by_arguments_are_capped():
    runtime = backend_runtime()
    repeat = _blob([["aten.repeat.default", [{"v": 0}, [1 << 16, 1 << 16]], {}, 1, "rep"]],
                   2, [0], [1])
    handle = runtime.init(repeat, ())
    with pytest.raises(FusedAllocationError, match="rep"):
        runtime.execute(handle, [torch.zeros(4, 4)])
    expand = _blob([["aten.expand_copy.default", [{"v": 0}, [1 << 20, 1 << 20]], {}, 1, "ex"]],
                   2, [0], [1])
    with pytest.raises(FusedCpuBlobError, match="max_dynamic_bytes"):
        runtime.init(expand, ())
    small = _blob([["aten.repeat.default", [{"v": 0}, [2, 3]], {}, 1, "rep"]], 2, [0], [1])
    x = torch.randn(2, 2, dtype=torch.float32)
    torch.testing.assert_close(runtime.execute(runtime.init(small, ()), [x])[0], x.repeat(2, 3))
    assert F32 is schema.ScalarType.FLOAT
