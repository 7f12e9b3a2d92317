"""Executing hand-built programs: kernels into planned memory, multi-output ops, control flow,
state, dynamic shapes, outputs that survive later calls."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from runtime_programs import (
    F32,
    I64,
    MethodBuilder,
    add_mul_builder,
    add_mul_program,
    program_of,
)

from exportir.program import schema, serialize
from exportir.runtime import Program, UnknownMethodError


def run(program: schema.Program, *inputs, method="forward"):
    return Program.from_schema(program).method(method).execute(inputs)


def test_elementwise_matches_eager():
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    (out,) = run(add_mul_program(), x, y)
    torch.testing.assert_close(out, (x + y) * 2)


def test_results_land_in_the_planned_arena():
    method = Program.from_schema(add_mul_program()).method()
    arena = method._state._arenas[0].as_tensor()
    x, y = torch.ones(2, 3), torch.ones(2, 3)
    method(x, y)
    # value 5 is x + y, planned at offset 0
    assert torch.equal(arena[:24].view(torch.float32), torch.full((6,), 2.0))


def test_outputs_are_copies_that_survive_later_calls():
    method = Program.from_schema(add_mul_program()).method()
    (first,) = method(torch.ones(2, 3), torch.ones(2, 3))
    (second,) = method(torch.zeros(2, 3), torch.zeros(2, 3))
    assert torch.equal(first, torch.full((2, 3), 4.0))
    assert torch.equal(second, torch.zeros(2, 3))
    arena = method._state._arenas[0].as_tensor()
    base, end = arena.data_ptr(), arena.data_ptr() + arena.numel()
    assert not base <= first.data_ptr() < end


def test_matmul_and_addmm_with_constant_weights():
    w = torch.randn(4, 5)
    bias = torch.randn(5)
    b = MethodBuilder()
    x = b.input("x", (3, 4))
    wv, bv = b.constant(w), b.constant(bias)
    one = b.add(schema.Int(1))
    mm, out = b.planned((3, 5)), b.planned((3, 5))
    b.kernel("aten::mm", "out", (x, wv, mm), "mm")
    b.kernel("aten::addmm", "out", (bv, x, wv, one, one, out), "addmm")
    b.outputs += [mm, out]
    xin = torch.randn(3, 4)
    got_mm, got_addmm = run(program_of(b), xin)
    torch.testing.assert_close(got_mm, xin @ w)
    torch.testing.assert_close(got_addmm, torch.addmm(bias, xin, w))


def test_multi_output_op_max_dim():
    b = MethodBuilder()
    x = b.input("x", (3, 4))
    dim, keep = b.add(schema.Int(1)), b.add(schema.Bool(False))
    values, indices = b.planned((3,)), b.planned((3,), I64)
    b.kernel("aten::max", "dim_max", (x, dim, keep, values, indices), "max")
    b.outputs += [values, indices]
    xin = torch.randn(3, 4)
    got_v, got_i = run(program_of(b), xin)
    want = torch.max(xin, dim=1)
    assert torch.equal(got_v, want.values) and torch.equal(got_i, want.indices)


def test_tensor_list_out_split_copy():
    b = MethodBuilder()
    x = b.input("x", (4, 3))
    two, zero = b.add(schema.Int(2)), b.add(schema.Int(0))
    p0, p1 = b.planned((2, 3)), b.planned((2, 3))
    parts = b.add(schema.TensorList((p0, p1)))
    b.kernel("aten::split_copy", "Tensor_out", (x, two, zero, parts), "split")
    cat = b.planned((2, 6))
    dim1 = b.add(schema.Int(1))
    b.kernel("aten::cat", "out", (parts, dim1, cat), "cat")
    b.outputs += [p1, cat]
    xin = torch.randn(4, 3)
    got_p1, got_cat = run(program_of(b), xin)
    assert torch.equal(got_p1, xin[2:])
    assert torch.equal(got_cat, torch.cat(torch.split(xin, 2), dim=1))


def test_tensor_list_of_inputs_is_rebuilt_every_call():
    b = MethodBuilder()
    x, y = b.input("x", (2,)), b.input("y", (2,))
    items = b.add(schema.TensorList((x, y)))
    zero = b.add(schema.Int(0))
    out = b.planned((4,))
    b.kernel("aten::cat", "out", (items, zero, out), "cat")
    b.outputs.append(out)
    method = Program.from_schema(program_of(b)).method()
    assert method(torch.ones(2), torch.zeros(2))[0].tolist() == [1, 1, 0, 0]
    assert method(torch.zeros(2), torch.ones(2))[0].tolist() == [0, 0, 1, 1]


def test_dtype_argument_codes_become_torch_dtypes():
    b = MethodBuilder()
    x = b.input("x", (3,))
    false, null = b.add(schema.Bool(False)), b.add(schema.Null())
    out = b.planned((3,), I64)
    # _to_copy.out(Tensor self, *, bool non_blocking=False, MemoryFormat? memory_format, out)
    b.kernel("aten::_to_copy", "out", (x, false, null, out), "to")
    size = b.add(schema.IntList((b.add(schema.Int(2)),)))
    fill = b.add(schema.Double(1.5))
    full = b.planned((2,))
    b.kernel("aten::full", "out", (size, fill, full), "full")
    b.outputs += [out, full]
    got, got_full = run(program_of(b), torch.tensor([1.7, -2.2, 3.0]))
    assert got.dtype == torch.int64 and got.tolist() == [1, -2, 3]
    assert got_full.tolist() == [1.5, 1.5]


def test_sum_with_dtype_code():
    b = MethodBuilder()
    x = b.input("x", (2, 3))
    dims = b.add(schema.IntList((b.add(schema.Int(1)),)))
    keep = b.add(schema.Bool(False))
    dtype = b.add(schema.Int(int(schema.ScalarType.DOUBLE)))
    out = b.planned((2,), schema.ScalarType.DOUBLE)
    b.kernel("aten::sum", "IntList_out", (x, dims, keep, dtype, out), "sum")
    b.outputs.append(out)
    xin = torch.randn(2, 3)
    (got,) = run(program_of(b), xin)
    torch.testing.assert_close(got, xin.sum(1, dtype=torch.float64))


def _branching_builder() -> MethodBuilder:
    """out = x + 1 if flag else x - 1 (both branches write the same planned output)."""
    b = MethodBuilder()
    x = b.input("x", (2,))
    flag = b.scalar_input("flag", schema.Bool(True))
    one = b.constant(torch.ones(2))
    alpha = b.add(schema.Int(1))
    out = b.planned((2,))
    never = b.add(schema.Bool(False))
    b.instruction(lambda d: schema.JumpFalseCall(flag, 3, d), "cond")  # 0
    b.kernel("aten::add", "out", (x, one, alpha, out), "true_branch")  # 1
    b.instruction(lambda d: schema.JumpFalseCall(never, 4, d), "goto_end")  # 2
    b.kernel("aten::sub", "out", (x, one, alpha, out), "false_branch")  # 3
    b.outputs.append(out)
    return b


def test_jump_false_selects_a_branch():
    b = _branching_builder()
    method = Program.from_schema(program_of(b)).method()
    assert method(torch.zeros(2), True)[0].tolist() == [1, 1]
    assert method(torch.zeros(2), False)[0].tolist() == [-1, -1]


def test_mutable_state_persists_across_calls_and_starts_from_its_initial_value():
    b = MethodBuilder()
    x = b.input("x", (2,))
    init = b.constant_bytes(torch.tensor([10.0, 20.0]).numpy().tobytes())
    state = b.planned((2,), initial=init)
    alpha = b.add(schema.Int(1))
    new = b.planned((2,))
    b.kernel("aten::add", "out", (state, x, alpha, new), "add")
    b.instruction(lambda d: schema.MoveCall(new, state, d), "output")
    b.outputs.append(new)
    method = Program.from_schema(program_of(b)).method()
    assert method(torch.ones(2))[0].tolist() == [11, 21]
    assert method(torch.ones(2))[0].tolist() == [12, 22]


def test_input_mutation_writes_the_callers_tensor():
    b = MethodBuilder()
    x = b.input("x", (2,))
    two = b.constant(torch.full((2,), 2.0))
    out = b.planned((2,))
    b.kernel("aten::mul", "out", (x, two, out), "mul")
    b.instruction(lambda d: schema.MoveCall(out, x, d), "output")
    b.outputs.append(out)
    xin = torch.tensor([1.0, 3.0])
    run(program_of(b), xin)
    assert xin.tolist() == [2, 6]


def _dynamic_builder() -> MethodBuilder:
    """Input x: float32[<=8, 3]; out = relu(x).view(-1) via sym_size * 3."""
    b = MethodBuilder()
    x = b.input("x", (8, 3), dynamic=True)
    zero, three = b.add(schema.Int(0)), b.add(schema.Int(3))
    n = b.add(schema.Int(8))
    numel = b.add(schema.Int(24))
    relu = b.planned((8, 3), dynamic=True)
    flat = b.planned((24,), dynamic=True)
    shape = b.add(schema.IntList((numel,)))
    b.kernel("aten::relu", "out", (x, relu), "relu")
    b.kernel("aten::sym_size", "int", (x, zero, n), "sym_size")
    b.kernel("exportir_prim::mul", "Scalar", (n, three, numel), "mul")
    b.kernel("aten::view_copy", "out", (relu, shape, flat), "view")
    b.outputs += [flat, n]
    return b


def test_dynamic_shapes_within_the_upper_bound():
    method = Program.from_schema(program_of(_dynamic_builder())).method()
    for rows in (8, 2, 5):
        xin = torch.randn(rows, 3)
        flat, n = method(xin)
        assert n == rows
        assert torch.equal(flat, xin.relu().reshape(-1))


def test_int_list_from_computed_sizes_is_resolved_every_call():
    method = Program.from_schema(program_of(_dynamic_builder())).method()
    assert method(torch.ones(1, 3))[0].shape == (3,)
    assert method(torch.ones(4, 3))[0].shape == (12,)


def test_runtime_owned_dynamic_storage_and_free():
    b = MethodBuilder()
    x = b.input("x", (3,))
    tmp = b.add(schema.Tensor(F32, (3,), (0,), schema.DynamicStorage(), True))
    out = b.planned((3,))
    b.kernel("aten::exp", "out", (x, tmp), "exp")
    b.kernel("aten::neg", "out", (tmp, out), "neg")
    b.instruction(lambda d: schema.FreeCall(tmp, d), "free")
    b.outputs.append(out)
    method = Program.from_schema(program_of(b)).method()
    xin = torch.randn(3)
    torch.testing.assert_close(method(xin)[0], -xin.exp())
    torch.testing.assert_close(method(xin)[0], -xin.exp())


def test_scalar_output_and_constant_output():
    b = MethodBuilder()
    x = b.input("x", (2, 5))
    one = b.add(schema.Int(1))
    size = b.add(schema.Int(0))
    c = b.constant(torch.arange(3.0))
    b.kernel("aten::sym_size", "int", (x, one, size), "sym_size")
    b.outputs += [size, c]
    size_out, const_out = run(program_of(b), torch.zeros(2, 5))
    assert size_out == 5
    const_out.add_(1)  # a copy: writable even though the constant view is read-only
    assert const_out.tolist() == [1, 2, 3]


def test_non_contiguous_dim_order_output():
    b = MethodBuilder()
    x = b.input("x", (1, 2, 2, 3))
    out = b.planned((1, 2, 2, 3), dim_order=(0, 2, 3, 1))  # channels-last
    b.kernel("aten::clone", "out", (x, b.add(schema.Int(2)), out), "clone")
    b.outputs.append(out)
    xin = torch.randn(1, 2, 2, 3)
    (got,) = run(program_of(b), xin)
    assert torch.equal(got, xin)


def test_multiple_methods_have_separate_arenas():
    forward = add_mul_builder()
    other = MethodBuilder(name="double", constants=forward.constants)
    x = other.input("x", (2,))
    two = other.constant(torch.full((2,), 2.0))
    out = other.planned((2,))
    other.kernel("aten::mul", "out", (x, two, out), "mul")
    other.outputs.append(out)
    program = Program.from_schema(program_of(forward, other))
    assert program.method_names == ("forward", "double")
    assert program.method("double")(torch.ones(2))[0].tolist() == [2, 2]
    assert program.method("forward")(torch.ones(2, 3), torch.ones(2, 3))[0].sum() == 24
    assert program.method("forward") is program.method("forward")
    with pytest.raises(UnknownMethodError, match="no method 'nope'.*'forward', 'double'"):
        program.method("nope")


def test_output_structure_from_out_spec_and_kwargs_from_in_spec():
    b = add_mul_builder()
    leaf = {"type": None, "context": None, "children_spec": []}
    b.out_spec = json.dumps(
        [1, {"type": "builtins.dict", "context": '["sum"]', "children_spec": [leaf]}]
    )
    args = {"type": "builtins.tuple", "context": "null", "children_spec": [leaf, leaf]}
    kwargs = {"type": "builtins.dict", "context": "[]", "children_spec": []}
    b.in_spec = json.dumps(
        [1, {"type": "builtins.tuple", "context": "null", "children_spec": [args, kwargs]}]
    )
    method = Program.from_schema(program_of(b)).method()
    got = method(torch.ones(2, 3), torch.ones(2, 3))
    assert set(got) == {"sum"} and got["sum"].sum() == 24
    assert isinstance(method.execute([torch.ones(2, 3), torch.ones(2, 3)]), tuple)


def test_file_round_trip_mmaps_constants_zero_copy(tmp_path):
    path = tmp_path / "m.xpt"
    serialize.save(add_mul_program(), path)
    program = Program.load(path)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    torch.testing.assert_close(program.method()(x, y)[0], (x + y) * 2)
    mapping = program._mapping
    base = np.frombuffer(mapping, dtype=np.uint8).ctypes.data
    (constant,) = program._constants.values()
    assert base <= constant.data_ptr() < base + len(mapping)


def test_load_from_bytes_and_program_call_shorthand():
    program = Program.load(serialize.serialize_program(add_mul_program()))
    (out,) = program(torch.ones(2, 3), torch.ones(2, 3))
    assert out.sum() == 24
    assert "forward" in repr(program)
