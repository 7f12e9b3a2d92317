"""Runtime errors name the instruction, the op, the graph node and the user's source line; input
errors say what was expected; malformed files never run."""

from __future__ import annotations

import pytest
import torch
from runtime_programs import MethodBuilder, add_mul_program, program_of

from exportir.program import schema, serialize
from exportir.runtime import (
    KernelRegistry,
    MethodInputError,
    MissingKernelError,
    Program,
    ProgramLoadError,
    RuntimeFailure,
    default_kernel_registry,
)


def test_missing_kernel_fails_at_load():
    with pytest.raises(MissingKernelError) as info:
        Program.from_schema(add_mul_program(), kernels=KernelRegistry(resolve_torch_ops=False))
    err = info.value
    assert isinstance(err, ProgramLoadError) and err.field == "methods[0].operators[0]"
    assert (err.instruction, err.op, err.node, err.source) == (0, "aten::add.out", "add",
                                                              "model.py:10")
    text = str(err)
    assert "method 'forward', instruction 0, op aten::add.out, node 'add'" in text
    assert "from user code: model.py:10" in text
    assert "no kernel is registered for aten::add.out" in text
    assert "hint: register one" in text


def test_a_registered_kernel_replaces_the_default():
    calls = []
    kernels = default_kernel_registry()

    def my_mul(a, b, out):
        calls.append("mul")
        torch.mul(a, b, out=out)

    kernels.register_function("aten::mul.out", my_mul, arity=3, writes=(2,))
    program = Program.from_schema(add_mul_program(), kernels=kernels)
    assert program(torch.ones(2, 3), torch.ones(2, 3))[0].sum() == 24
    assert calls == ["mul"]


def _div_by_input_builder() -> MethodBuilder:
    b = MethodBuilder()
    n = b.scalar_input("n", schema.Int(1))
    ten, q = b.add(schema.Int(10)), b.add(schema.Int(0))
    b.kernel("exportir_prim::floordiv", "Scalar", (ten, n, q), "floordiv_1", "model.py:7")
    b.outputs.append(q)
    return b


def test_kernel_exception_becomes_a_runtime_failure_with_the_site():
    method = Program.from_schema(program_of(_div_by_input_builder())).method()
    assert method(3) == (3,)
    with pytest.raises(RuntimeFailure) as info:
        method(0)
    err = info.value
    assert (err.instruction, err.op, err.node, err.source) == (
        0, "exportir_prim::floordiv.Scalar", "floordiv_1", "model.py:7")
    assert "ZeroDivisionError" in str(err)
    assert isinstance(err.__cause__, ZeroDivisionError)


def test_wrong_argument_count_fails_at_load():
    b = MethodBuilder()
    x = b.input("x", (2,))
    out = b.planned((2,))
    b.kernel("aten::relu", "out", (x, x, out), "relu", "m.py:1")
    b.outputs.append(out)
    with pytest.raises(ProgramLoadError, match=r"instructions\[0\].args: aten::relu.out takes 2 "
                                               r"arguments; the instruction passes 3 values"):
        Program.from_schema(program_of(b))


def test_writing_a_constant_is_rejected_at_load():
    b = MethodBuilder()
    x = b.input("x", (2,))
    c = b.constant(torch.zeros(2))
    b.kernel("aten::relu", "out", (x, c), "relu", "m.py:3")
    b.outputs.append(c)
    with pytest.raises(ProgramLoadError, match=r"instructions\[0\].args\[1\]: argument 1 of "
                                               r"aten::relu.out writes value 1, a constant"):
        Program.from_schema(program_of(b))


def test_kernel_that_resizes_a_planned_output_is_caught():
    b = MethodBuilder()
    x = b.input("x", (2, 3))
    out = b.planned((3, 2))  # wrong planned shape (same bytes)
    b.kernel("aten::relu", "out", (x, out), "relu", "m.py:5")
    b.outputs.append(out)
    method = Program.from_schema(program_of(b)).method()
    with pytest.raises(
        RuntimeFailure, match=r"resized value 1 to \(2, 3\); the plan gives it \(3, 2\)"
    ):
        method(torch.ones(2, 3))


def test_dynamic_result_beyond_its_upper_bound_is_caught():
    b = MethodBuilder()
    x = b.input("x", (4,), dynamic=True)
    out = b.planned((4,), dynamic=True)
    b.kernel("aten::relu", "out", (x, out), "relu", "m.py:9")
    b.outputs.append(out)
    method = Program.from_schema(program_of(b)).method()
    assert method(torch.ones(3))[0].shape == (3,)
    with pytest.raises(RuntimeFailure, match=r"needs more memory than the plan gives it "
                       r"\(planned: value 1 \(4,\)\); call with inputs within") as info:
        method(torch.ones(6))
    assert info.value.instruction == 0 and info.value.source == "m.py:9"
    assert method(torch.full((4,), -1.0))[0].tolist() == [0, 0, 0, 0]  # still usable


def test_static_output_never_spills_into_its_neighbours():
    b = MethodBuilder()
    x = b.input("x", (2, 3))
    small = b.planned((2,))  # wrong plan: too small for relu(x)
    guard = b.planned((4,))  # nothing writes or reads it: its bytes must stay zero
    b.kernel("aten::relu", "out", (x, small), "relu", "m.py:5")
    b.outputs += [small]
    method = Program.from_schema(program_of(b)).method()
    with pytest.raises(RuntimeFailure, match="needs more memory than the plan gives it"):
        method(torch.ones(2, 3))
    assert method._state._template[guard].tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ((torch.ones(2, 3),), r"takes 2 input\(s\) \(x, y\); got 1"),
        ((torch.ones(2, 3), torch.ones(2, 3, dtype=torch.float64)),
         r"input 1 \(y\) must have dtype float32; got float64\[2, 3\] \(expected float32\[2, 3\]\)"),
        ((torch.ones(2, 4), torch.ones(2, 3)),
         r"input 0 \(x\) has shape float32\[2, 4\]; the method was exported for float32\[2, 3\]"),
        ((torch.ones(6), torch.ones(2, 3)), r"input 0 \(x\) must have rank 2"),
        ((1.0, torch.ones(2, 3)), r"input 0 \(x\) must be a tensor float32\[2, 3\]; got float"),
    ],
)
def test_bad_inputs_are_reported_clearly(inputs, message):
    method = Program.from_schema(add_mul_program()).method()
    with pytest.raises(MethodInputError, match=message):
        method(*inputs)


def test_scalar_input_type_is_checked():
    method = Program.from_schema(program_of(_div_by_input_builder())).method()
    with pytest.raises(MethodInputError, match=r"input 0 \(n\) must be a int; got 'x'"):
        method("x")
    with pytest.raises(MethodInputError, match="must be a int; got True"):
        method(True)
    assert method(torch.tensor(5)) == (2,)


def test_inputs_requiring_grad_and_non_contiguous_inputs_are_accepted():
    method = Program.from_schema(add_mul_program()).method()
    x = torch.ones(3, 2, requires_grad=True).t()
    (out,) = method(x, torch.ones(2, 3))
    assert out.sum() == 24 and not out.requires_grad


@pytest.mark.parametrize(
    "data", [b"", b"garbage" * 20, serialize.serialize_program(add_mul_program())[:-3]]
)
def test_malformed_files_raise_program_load_error(data, tmp_path):
    with pytest.raises(ProgramLoadError):
        Program.load(data)
    path = tmp_path / "bad.xpt"
    path.write_bytes(data)
    with pytest.raises(ProgramLoadError):
        Program.load(path)


def test_invalid_schema_program_is_rejected_before_running():
    b = MethodBuilder()
    x = b.input("x", (2,))
    b.kernel("aten::relu", "out", (x, 99), "relu")
    with pytest.raises(ProgramLoadError, match=r"args\[1\].*out of range"):
        Program.from_schema(program_of(b))


def test_constant_tensors_are_never_written_through_the_file_mapping(tmp_path):
    # the constant segment is mapped read-only: the runtime must hand out copies as outputs
    b = MethodBuilder()
    c = b.constant(torch.arange(4.0))
    b.outputs.append(c)
    path = tmp_path / "c.xpt"
    serialize.save(program_of(b), path)
    (out,) = Program.load(path).method()()
    out.mul_(2)
    assert Program.load(path).method()()[0].tolist() == [0, 1, 2, 3]


def test_runtime_failure_without_debug_entry_still_names_instruction():
    b = MethodBuilder()
    x = b.input("x", (2,))
    out = b.planned((2,))
    b.instructions.append(schema.KernelCall(b.op("exportir_test::nothing", "out"), (x, out)))
    b.outputs.append(out)
    method_meta = b.build()
    method_meta = schema.Method(**{f: getattr(method_meta, f) for f in method_meta.__slots__
                                   if f != "debug"}, debug=())
    program = schema.Program(schema.FORMAT_VERSION, (method_meta,))
    with pytest.raises(RuntimeFailure) as info:
        Program.from_schema(program).method()
    assert info.value.instruction == 0 and info.value.node is None
