"""The execution model: the first run of a method checks every kernel's outputs against the plan,
later runs call the kernels bare (verify once, then trust) wherever shapes cannot vary; a failure
still names the instruction and sends the next run back through the checks; the method's value
frame keeps nothing of a call once it returns."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from runtime_programs import MethodBuilder, add_mul_builder, program_of

from exportir.format import schema
from exportir.runtime import MethodInputError, Program, RuntimeFailure, default_kernel_registry


def _relu_method(kernels=None, sizes=(2, 3)):
    b = MethodBuilder()
    x = b.input("x", sizes)
    out = b.planned(sizes)
    b.kernel("aten::relu", "out", (x, out), "relu", "m.py:5")
    b.outputs.append(out)
    return Program.from_schema(program_of(b), kernels=kernels).method()


def _flaky_relu(fail_on: set[int], resize_first: bool = False):
    """A relu.out kernel that raises on the given call numbers (1-based)."""
    calls = []
    kernels = default_kernel_registry()

    def relu(x, out):
        calls.append(1)
        if len(calls) in fail_on:
            if resize_first:
                out.resize_(1)
            raise ValueError(f"flaky on call {len(calls)}")
        torch.clamp_min(x, 0, out=out)

    kernels.register_function("aten::relu.out", relu, arity=2, writes=(1,))
    return kernels


def test_first_run_is_checked_later_runs_are_trusted():
    method = Program.from_schema(program_of(add_mul_builder())).method()
    assert not method._state._verified
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    (first,) = method(x, y)
    assert method._state._verified
    for _ in range(3):
        x, y = torch.randn(2, 3), torch.randn(2, 3)
        (got,) = method(x, y)
        assert torch.equal(got, (x + y) * 2)
    assert torch.equal(first, first.clone())  # earlier results are untouched copies


def test_a_failure_on_a_trusted_run_names_the_instruction_and_rechecks():
    method = _relu_method(_flaky_relu({3}))
    x = torch.tensor([[-1.0, 2.0, 3.0], [4.0, -5.0, 6.0]])
    method(x)
    method(x)
    assert method._state._verified
    with pytest.raises(RuntimeFailure) as info:
        method(x)
    err = info.value
    assert (err.instruction, err.op, err.node, err.source) == (0, "aten::relu.out", "relu",
                                                              "m.py:5")
    assert "ValueError: flaky on call 3" in str(err)
    assert isinstance(err.__cause__, ValueError)
    assert not method._state._verified  # the next run is checked again
    assert torch.equal(method(x)[0], x.clamp_min(0))
    assert method._state._verified


def test_a_trusted_failure_restores_planned_layouts():
    method = _relu_method(_flaky_relu({2}, resize_first=True))
    x = torch.randn(2, 3)
    method(x)
    with pytest.raises(RuntimeFailure, match="flaky on call 2"):
        method(x)
    assert method(x)[0].shape == (2, 3)


def test_a_kernel_resizing_its_out_on_the_first_run_is_caught_and_never_trusted():
    kernels = default_kernel_registry()
    kernels.register_function(
        "aten::relu.out", lambda x, out: torch.clamp_min(x.t(), 0, out=out.resize_(0)), arity=2,
        writes=(1,),
    )
    method = _relu_method(kernels)
    for _ in range(2):
        with pytest.raises(RuntimeFailure, match=r"resized value 1 to \(3, 2\)"):
            method(torch.randn(2, 3))
        assert not method._state._verified


def test_instructions_on_dynamic_shapes_stay_checked_after_verification():
    b = MethodBuilder()
    x = b.input("x", (4,), dynamic=True)
    out = b.planned((4,), dynamic=True)
    b.kernel("aten::relu", "out", (x, out), "relu", "m.py:9")
    b.outputs.append(out)
    method = Program.from_schema(program_of(b)).method()
    assert 0 not in method._state._trusted
    method(torch.ones(2))
    assert method._state._verified
    with pytest.raises(RuntimeFailure, match="needs more memory than the plan gives it"):
        method(torch.ones(6))
    assert method(torch.ones(3))[0].shape == (3,)


def test_the_frame_keeps_no_input_after_a_call():
    method = Program.from_schema(program_of(add_mul_builder())).method()
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    method(x, y)
    method(x, y)  # trusted
    ref = weakref.ref(x)
    del x
    gc.collect()
    assert ref() is None
    assert all(v is None for v in (method._state._frame[i] for i in method.meta.inputs))


def test_an_input_error_leaves_the_frame_clean():
    method = Program.from_schema(program_of(add_mul_builder())).method()
    with pytest.raises(MethodInputError):
        method(torch.randn(2, 3), "not a tensor")
    assert method._state._frame[method.meta.inputs[0]] is None
    assert torch.equal(method(torch.ones(2, 3), torch.ones(2, 3))[0], torch.full((2, 3), 4.0))


def _layer_norm_method(read_mean: bool):
    b = MethodBuilder()
    x = b.input("x", (2, 3, 8))
    w, bias = b.constant(torch.randn(8)), b.constant(torch.randn(8))
    shape, eps = b.add(schema.IntList((b.add(schema.Int(8)),))), b.add(schema.Double(1e-5))
    out0, out1, out2 = b.planned((2, 3, 8)), b.planned((2, 3, 1)), b.planned((2, 3, 1))
    b.kernel("aten::native_layer_norm", "out", (x, shape, w, bias, eps, out0, out1, out2),
             "layer_norm", "m.py:3")
    b.outputs += [out0, out1] if read_mean else [out0]
    return b, (w, bias, out0, out1, out2)


@pytest.mark.parametrize("read_mean", [False, True])
def test_outs_nobody_reads_may_stay_unwritten(read_mean):
    b, (w, bias, out0, out1, out2) = _layer_norm_method(read_mean)
    method = Program.from_schema(program_of(b)).method()
    assert not method._state._unread(out0) and method._state._unread(out2)
    assert method._state._unread(out1) is not read_mean
    x = torch.randn(2, 3, 8)
    for _ in range(2):  # checked, then trusted
        got = method(x)
        want = torch.native_layer_norm(x, [8], method._state._template[w], method._state._template[bias], 1e-5)
        assert torch.equal(got[0], want[0])
        if read_mean:
            assert torch.equal(got[1], want[1])


def test_changing_arguments_of_every_position_are_read_per_call():
    b = MethodBuilder()
    x = b.input("x", (3,))
    y = b.input("y", (2, 3))
    one = b.add(schema.Int(1))
    out = b.planned((2, 3))
    b.kernel("aten::sub", "out", (y, x, one, out), "sub", "m.py:1")  # changing at (0, 1)
    b.outputs.append(out)
    method = Program.from_schema(program_of(b)).method()
    for _ in range(3):
        x, y = torch.randn(3), torch.randn(2, 3)
        assert torch.equal(method(x, y)[0], y - x)


def test_outputs_only_returned_are_computed_fresh_after_verification():
    b = add_mul_builder()  # s = x + y (read by mul), out = s * w (returned only)
    method = Program.from_schema(program_of(b)).method()
    out = method.meta.outputs[0]
    assert set(method._state._fresh_slots) == {out}
    arena_out = method._state._template[out]
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    first = method(x, y)[0]  # checked: written to the arena, cloned
    results = [method(x, y)[0] for _ in range(2)]  # trusted: new tensors, no clone
    for got in (first, *results):
        assert torch.equal(got, (x + y) * 2)
        assert got.is_contiguous() and got.untyped_storage().data_ptr() != (
            arena_out.untyped_storage().data_ptr()
        )
    assert results[0].data_ptr() != results[1].data_ptr()
    assert method._state._fresh_box == [None]  # handed out, not kept


def test_an_output_also_read_inside_the_method_is_cloned():
    b = add_mul_builder()
    b.outputs.insert(0, 4)  # s, read by mul, returned as well
    method = Program.from_schema(program_of(b)).method()
    assert 4 not in method._state._fresh_slots
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    for _ in range(2):
        s, out = method(x, y)
        assert torch.equal(s, x + y) and torch.equal(out, (x + y) * 2)


def test_no_fresh_output_from_inputs_of_free_layout():
    b = MethodBuilder()
    x = b.add(schema.Tensor(schema.ScalarType.FLOAT, (2, 3), (1, 0), schema.InputStorage()))
    b.inputs.append(x)
    b.input_names.append("x")
    out = b.planned((2, 3), dim_order=(1, 0))
    b.kernel("aten::relu", "out", (x, out), "relu", "m.py:5")
    b.outputs.append(out)
    method = Program.from_schema(program_of(b)).method()
    assert not method._state._fresh_slots
    x = torch.randn(3, 2).t()
    for _ in range(2):
        assert torch.equal(method(x)[0], x.relu())


def test_moves_into_inputs_and_state_are_bare_copies_once_verified():
    b = MethodBuilder()
    x = b.input("x", (2,))
    state = b.planned((2,), initial=b.constant_bytes(torch.tensor([10.0, 20.0]).numpy()
                                                     .tobytes()))
    alpha = b.add(schema.Int(1))
    new, doubled = b.planned((2,)), b.planned((2,))
    b.kernel("aten::add", "out", (state, x, alpha, new), "add")
    b.kernel("aten::add", "out", (x, x, alpha, doubled), "double")
    b.instruction(lambda d: schema.MoveCall(new, state, d), "state")
    b.instruction(lambda d: schema.MoveCall(doubled, x, d), "input")
    b.outputs.append(new)
    method = Program.from_schema(program_of(b)).method()
    assert {2, 3} <= set(method._state._trusted)
    assert not method._state._unread(state) and not method._state._unread(x)  # read by later calls, caller
    for step in range(1, 4):
        given = torch.tensor([1.0, 2.0])
        (got,) = method(given)
        assert got.tolist() == [10 + step, 20 + 2 * step]
        assert given.tolist() == [2.0, 4.0]  # the caller's tensor, written every call
