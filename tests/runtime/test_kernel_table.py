"""The runtime's kernel table: a program file may name only what the compiler emits (plus the
runtime's primitives and ops the user registers on purpose); anything else fails at load with
a ProgramLoadError naming the operator and the instruction.

Each refusal is checked on a hand-built file (schema dataclasses -> the codec -> bytes)."""

from __future__ import annotations

import re

import pytest
import torch
from runtime_programs import MethodBuilder, add_mul_program, program_of

from exportir.program import kernels as compiler_kernels
from exportir.program import schema, serialize
from exportir.runtime import (
    KernelRegistry,
    MissingKernelError,
    Program,
    ProgramLoadError,
    default_kernel_registry,
)
from exportir.runtime.kernel_table import KERNEL_TABLE, TORCH_VERSION

U8 = schema.ScalarType.BYTE


def _load(program: schema.Program, **kwargs) -> Program:
    return Program.load(serialize.serialize_program(program), **kwargs)


def test_the_table_is_what_the_compiler_emits():
    # scripts/gen_kernel_table.py writes exportir.runtime.kernel_table from this function
    assert dict(KERNEL_TABLE) == compiler_kernels.kernel_table(), (
        "the kernel table is out of date: run scripts/gen_kernel_table.py"
    )
    assert TORCH_VERSION == torch.__version__.split("+")[0]


# Operators that read files, print, or address memory the runtime cannot bound: never in it.
UNSAFE = (
    "aten::from_file.out", "aten::from_file.default", "aten::_print.default",
    "aten::_reshape_alias_copy.out", "aten::_nested_view_from_buffer_copy.out",
    "aten::set_.source_Storage_storage_offset", "aten::view.dtype", "aten::fill_.Scalar",
)


def test_the_table_has_no_file_io_or_unchecked_memory_operators():
    assert not set(UNSAFE) & KERNEL_TABLE.keys()
    for name, text in KERNEL_TABLE.items():
        # a str argument could only be a path or a mode; the table's are modes
        strings = re.findall(r"str\??\s+(\w+)", text)
        assert set(strings) <= {"approximate", "rounding_mode", "reduce"}, (name, strings)
        assert "Storage" not in text and "Generator" not in text, name
        # aten's out variants, and the quantize / dequantize ops of quantized programs
        assert name.startswith(("aten::", "quantized_decomposed::")) and name.rsplit(".", 1)[1].endswith(
            ("out", "_out", "out_mode", "values", "grad_input", "dim_max", "dim_min")), name


def test_every_table_entry_resolves_to_a_typed_kernel():
    registry = default_kernel_registry()
    for name in KERNEL_TABLE:
        kernel = registry.lookup(name)
        assert kernel is not None and kernel.params is not None, name
        assert len(kernel.params) == kernel.arity, name


def _from_file_program(path: str) -> schema.Program:
    """``aten::from_file.out(filename, shared, size, *, out)``: reads any file the process can."""
    b = MethodBuilder()
    name, shared, size = b.add(schema.String(path)), b.add(schema.Null()), b.add(schema.Int(64))
    out = b.planned((64,), dtype=U8)
    b.kernel("aten::from_file", "out", (name, shared, size, out), "leak", "evil.py:1")
    b.outputs.append(out)
    return program_of(b)


def test_a_file_reading_operator_is_refused_at_load(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"s3cret" * 20)
    with pytest.raises(ProgramLoadError) as info:
        _load(_from_file_program(str(secret)))
    err = info.value
    assert isinstance(err, MissingKernelError) and err.field == "methods[0].operators[0]"
    assert (err.instruction, err.op, err.node) == (0, "aten::from_file.out", "leak")
    assert "not in the runtime's kernel table" in str(err)


def test_an_unchecked_size_view_copy_is_refused_at_load():
    # _reshape_alias_copy with a size larger than its input read unrelated process memory
    b = MethodBuilder()
    x = b.input("x", (4,))
    size = b.add(schema.IntList((b.add(schema.Int(4096)),)))
    stride = b.add(schema.IntList((b.add(schema.Int(1)),)))
    out = b.planned((4096,))
    b.kernel("aten::_reshape_alias_copy", "out", (x, size, stride, out), "leak")
    b.outputs.append(out)
    with pytest.raises(MissingKernelError, match=r"aten::_reshape_alias_copy.out is not in the "
                                                 r"runtime's kernel table"):
        _load(program_of(b))


def test_a_view_dtype_into_an_int_slot_then_fill_is_refused_even_when_registered():
    # view.dtype on a constant, its result kept in a slot declared Int, then fill_ on that slot:
    # it wrote into the read-only mapped constants and crashed the process (SIGSEGV)
    b = MethodBuilder()
    c = b.constant(torch.arange(4.0))
    dtype = b.add(schema.Int(int(schema.ScalarType.INT)))
    slot = b.add(schema.Int(0))
    seven = b.add(schema.Int(7))
    b.kernel("aten::view", "dtype", (c, dtype, slot), "view")
    b.kernel("aten::fill_", "Scalar", (slot, seven, slot), "fill")
    b.outputs.append(c)
    program = program_of(b)
    with pytest.raises(MissingKernelError, match="aten::view.dtype is not in the runtime's kernel"):
        _load(program)
    kernels = default_kernel_registry()  # even registered on purpose, the operands are typed
    kernels.register_op(torch.ops.aten.view.dtype, torch.ops.aten.fill_.Scalar)
    with pytest.raises(ProgramLoadError, match=r"instructions\[0\].args\[2\]: the result of "
                                               r"aten::view.dtype must go to a Tensor value"):
        _load(program, kernels=kernels)


@pytest.mark.parametrize(("name", "overload"), [
    ("__class__", "__init__"), ("aten::__class__", "default"), ("aten::add", "__init__"),
    ("aten", "add"), ("aten::add.out", ""), ("aten::a dd", "out"), ("__class__::__init__", ""),
    ("__class__::__init__", "default"),
])
def test_malformed_operator_names_are_load_errors(name, overload):
    b = MethodBuilder()
    x = b.input("x", (2,))
    b.op(name, overload)
    b.outputs.append(x)
    with pytest.raises(ProgramLoadError, match=r"operators\[0\]"):
        _load(program_of(b))


@pytest.mark.parametrize(("name", "overload"), [
    ("aten::add", "default"), ("aten::add", "Tensor"), ("aten::relu", ""),
    ("builtins::open", "default"), ("os::system", "default"),
])
def test_operators_outside_the_table_are_load_errors(name, overload):
    # before the table: AttributeError (``__class__::__init__``), RuntimeError (``.default``)
    b = MethodBuilder()
    x = b.input("x", (2,))
    out = b.planned((2,))
    b.kernel(name, overload, (x, out), "n")
    b.outputs.append(out)
    with pytest.raises(ProgramLoadError, match=r"field: methods\[0\].operators\[0\]") as info:
        _load(program_of(b))
    assert isinstance(info.value, MissingKernelError) and info.value.instruction == 0


def test_an_unused_operator_outside_the_table_is_refused_too():
    b = MethodBuilder()
    x = b.input("x", (2,))
    b.op("aten::from_file", "out")
    b.outputs.append(x)
    with pytest.raises(MissingKernelError, match="from_file") as info:
        _load(program_of(b))
    assert info.value.instruction is None


def test_a_registry_without_torch_ops_has_only_what_is_registered():
    with pytest.raises(MissingKernelError, match="no kernel is registered for aten::add.out"):
        _load(add_mul_program(), kernels=KernelRegistry(resolve_torch_ops=False))


def _custom_op_program() -> schema.Program:
    from corpus.export_models import BY_NAME, build

    from exportir.export import export
    from exportir.program.manager import to_edge

    module, args, kwargs = build(BY_NAME["custom_op"])
    return to_edge(export(module, args, kwargs)).to_program().program


def test_custom_ops_run_only_when_registered_on_purpose():
    from corpus.export_models import BY_NAME, build

    program = _custom_op_program()
    with pytest.raises(MissingKernelError, match=r"register_op\(torch.ops.exportir_test."):
        _load(program)
    kernels = default_kernel_registry()
    kernels.register_op(torch.ops.exportir_test.scaled_tanh, torch.ops.exportir_test.split_stats)
    method = _load(program, kernels=kernels).method()
    module, args, kwargs = build(BY_NAME["custom_op"])
    for got, want in zip(method(*args, **kwargs), module(*args, **kwargs)):
        torch.testing.assert_close(got, want)


def test_register_op_takes_only_torch_operators():
    with pytest.raises(TypeError, match="register_op takes torch operators"):
        default_kernel_registry().register_op("aten::from_file.out")


def test_register_op_enables_an_aten_operator_outside_the_table():
    b = MethodBuilder()
    x = b.input("x", (2, 3))
    out = b.planned((2, 3))
    b.kernel("aten::hardswish", "out", (x, out), "hardswish")  # not core ATen: no edge op
    b.outputs.append(out)
    program = program_of(b)
    with pytest.raises(MissingKernelError, match="hardswish.out is not in"):
        _load(program)
    kernels = default_kernel_registry()
    kernels.register_op(torch.ops.aten.hardswish)
    x_in = torch.randn(2, 3)
    got = _load(program, kernels=kernels).method()(x_in)[0]
    torch.testing.assert_close(got, torch.nn.functional.hardswish(x_in))


def test_prims_are_typed_too():
    b = MethodBuilder()
    x = b.input("x", (2,))
    result = b.add(schema.Int(0))
    b.kernel("exportir_prim::add", "Scalar", (x, x, result), "add")  # tensors, not scalars
    b.outputs.append(result)
    with pytest.raises(ProgramLoadError, match=r"argument 'a' of exportir_prim::add.Scalar "
                                               r"takes Bool/Double/Int; value 0 is Tensor"):
        _load(program_of(b))
