"""Load-time validation: every kind of corruption gives ProgramLoadError naming the field."""

from __future__ import annotations

import dataclasses
import json
import struct
import zlib

import pytest
from program_samples import sample_program

from exportir.format.schema import (
    Allocation,
    ConstantData,
    DebugEntry,
    FreeCall,
    Int,
    IntList,
    JumpFalseCall,
    KernelCall,
    MethodPlan,
    MoveCall,
    Null,
    Operator,
    OptionalTensorList,
    ScalarType,
    Tensor,
    TensorList,
    ViewOf,
)
from exportir.format.validate import LoadLimits, ProgramLoadError
from exportir.program import schema, serialize, validate

F32 = ScalarType.FLOAT


def _with(method_changes: dict, program_changes: dict | None = None) -> schema.Program:
    p = sample_program()
    m = dataclasses.replace(p.methods[0], **method_changes)
    return dataclasses.replace(p, methods=(m,) + p.methods[1:], **(program_changes or {}))


def _value(i: int, v: schema.EValue) -> dict:
    values = list(sample_program().methods[0].values)
    values[i] = v
    return {"values": tuple(values)}


def _values(changes: dict[int, schema.EValue]) -> dict:
    values = list(sample_program().methods[0].values)
    for i, v in changes.items():
        values[i] = v
    return {"values": tuple(values)}


def _view(base: int, offset: int, strides: tuple, sizes=(3,), dtype=F32) -> Tensor:
    return Tensor(dtype, sizes, tuple(range(len(sizes))), ViewOf(base, offset, strides))


V = "methods[0].values[15].storage"


def _instruction(i: int, ins: schema.Instruction) -> dict:
    instructions = list(sample_program().methods[0].instructions)
    instructions[i] = ins
    return {"instructions": tuple(instructions)}


CASES = {
    "version": (_with({}, {"version": 99}), "version", "format version 99"),
    "duplicate method": (
        dataclasses.replace(sample_program(), methods=(sample_program().methods[0],) * 2),
        "methods[1].name", "repeated"),
    "input index": (_with({"inputs": (99,)}), "methods[0].inputs[0]", "out of range"),
    "output index": (_with({"outputs": (17,)}), "methods[0].outputs[0]", "out of range"),
    "input kind": (_with({"inputs": (1,)}), "methods[0].inputs[0]", "InputStorage"),
    "operator name": (_with({"operators": (Operator("add", "out"), Operator("aten::relu", "out"))}),
                      "methods[0].operators[0]", "namespace::name"),
    "op index": (_with(_instruction(0, KernelCall(7, (0,), 0))),
                 "methods[0].instructions[0].op_index", "operator index 7"),
    "arg index": (_with(_instruction(0, KernelCall(0, (0, 1, 2, 300), 0))),
                  "methods[0].instructions[0].args[3]", "value index 300"),
    "debug index": (_with(_instruction(0, KernelCall(0, (0,), 9))),
                    "methods[0].instructions[0].debug", "debug entry"),
    "delegate index": (_with(_instruction(3, schema.DelegateCall(5, (4,), (16,), 2))),
                       "methods[0].instructions[3].delegate_index", "delegate index 5"),
    "delegate output kind": (_with(_instruction(3, schema.DelegateCall(0, (4,), (2,), 2))),
                             "methods[0].instructions[3].outputs[0]", "must be Tensor"),
    "move kinds": (_with(_instruction(4, MoveCall(2, 14, 3))), "methods[0].instructions[4]",
                   "different kinds"),
    "backward jump": (_with(_instruction(2, JumpFalseCall(6, 1, 2))),
                      "methods[0].instructions[2].dest", "must be forward"),
    "jump past end": (_with(_instruction(2, JumpFalseCall(6, 7, 2))),
                      "methods[0].instructions[2].dest", "must be forward"),
    "jump cond kind": (_with(_instruction(2, JumpFalseCall(7, 4, 2))),
                       "methods[0].instructions[2].cond_value", "jump condition"),
    "free planned": (_with(_instruction(5, FreeCall(3, 3))), "methods[0].instructions[5]",
                     "runtime-allocated"),
    "prim arity": (_with({"operators": (Operator("aten::sym_size", "int"),
                                        Operator("aten::relu", "out"))}),
                   "methods[0].instructions[0].args", "takes 2 arguments"),
    "negative size": (_with(_value(3, Tensor(F32, (2, -3), (0, 1), Allocation(0, 0, 24)))),
                      "methods[0].values[3].sizes[1]", "non-negative"),
    "huge tensor": (_with(_value(15, Tensor(F32, (1 << 30, 1 << 30), (0, 1),
                                            schema.DynamicStorage()))),
                    "methods[0].values[15].sizes", "exceeds"),
    "dim order": (_with(_value(3, Tensor(F32, (2, 3), (0, 0), Allocation(0, 0, 24)))),
                  "methods[0].values[3].dim_order", "permutation"),
    "constant index": (_with(_value(1, Tensor(F32, (2, 3), (0, 1), ConstantData(9)))),
                       "methods[0].values[1].storage.buffer", "constant buffer index 9"),
    "constant size": (_with(_value(1, Tensor(F32, (3, 3), (0, 1), ConstantData(0)))),
                      "methods[0].values[1].storage.buffer", "holds 24 bytes"),
    "alloc size": (_with(_value(3, Tensor(F32, (2, 3), (0, 1), Allocation(0, 0, 20)))),
                   "methods[0].values[3].storage.nbytes", "allocation of 20 bytes"),
    "alloc arena": (_with(_value(3, Tensor(F32, (2, 3), (0, 1), Allocation(3, 0, 24)))),
                    "methods[0].values[3].storage.arena", "arena index 3"),
    "alloc bounds": (_with(_value(3, Tensor(F32, (2, 3), (0, 1), Allocation(0, 80, 24)))),
                     "methods[0].values[3].storage", "exceed arena"),
    "alloc align": (_with(_value(3, Tensor(F32, (2, 3), (0, 1), Allocation(0, 8, 24)))),
                    "methods[0].values[3].storage.offset", "multiple of 16"),
    "plan overlap": (_with(_value(3, Tensor(F32, (2, 3), (0, 1), Allocation(0, 32, 24)))),
                     "methods[0].plan", "value 3 and value 4 overlap"),
    "initial on input": (_with(_value(0, Tensor(F32, (2, 3), (0, 1), schema.InputStorage(),
                                                initial=0))),
                         "methods[0].values[0].initial", "only planned"),
    "int list item": (_with(_value(9, IntList((5,)))), "methods[0].values[9].items[0]",
                      "must be Int"),
    "tensor list item": (_with(_value(12, TensorList((2,)))), "methods[0].values[12].items[0]",
                         "must be Tensor"),
    "optional list item": (_with(_value(13, OptionalTensorList((2,)))),
                           "methods[0].values[13].items[0]", "Tensor/Null"),
    "alignment": (_with({"plan": MethodPlan((96,), 72, 12)}), "methods[0].plan.alignment",
                  "power of two"),
    "arena limit": (_with({"plan": MethodPlan((1 << 40,), 72, 16)}),
                    "methods[0].plan.arenas[0]", "max_arena_bytes"),
    "empty backend": (_with({}, {"delegates": (schema.Delegate("", b""),)}),
                      "delegates[0].backend_id", "empty backend"),
    "view base index": (_with(_value(15, _view(99, 0, (1,)))), f"{V}.base",
                        "value index 99 out of range"),
    "view base kind": (_with(_value(15, _view(2, 0, (1,)))), f"{V}.base",
                       "must be a Tensor; value 2 is Int"),
    "view of a view": (_with(_values({15: _view(16, 0, (1,)), 16: _view(1, 0, (1,))})),
                       f"{V}.base", "value 16 has ViewOf storage"),
    "view of runtime storage": (_with(_value(16, _view(15, 0, (1,)))),
                                "methods[0].values[16].storage.base",
                                "value 15 has DynamicStorage storage"),
    "dynamic view": (_with(_value(15, Tensor(F32, (3,), (0,), ViewOf(1, 0, (1,)), dynamic=True))),
                     f"{V}.base", "must be static"),
    "view dtype": (_with(_value(15, _view(1, 0, (1,), dtype=ScalarType.LONG))), V,
                   "view dtype LONG differs from its base's FLOAT"),
    "view reach": (_with(_value(15, _view(1, 4, (1,)))), V,
                   "reaches element 6 (offset 4, strides (1,)) of value 1, which has 6"),
    "view reach by stride": (_with(_value(15, _view(3, 0, (3,)))), V, "reaches element 6"),
    "view offset past base": (_with(_value(15, _view(1, 7, (1,), sizes=(0,)))), V,
                              "starts at element 7"),
    "view strides": (_with(_value(15, _view(1, 0, (1, 1)))), f"{V}.strides",
                     "2 strides for 1 sizes"),
    "view negative stride": (_with(_value(15, _view(1, 0, (-1,)))), f"{V}.strides[0]",
                             "-1 is not a non-negative int"),
    "view of non-contiguous input": (
        _with(_values({0: Tensor(F32, (2, 3), (1, 0), schema.InputStorage()),
                       15: _view(0, 0, (1,))})), f"{V}.base", "needs the input contiguous"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_validation_errors_name_the_field(name):
    program, field, message = CASES[name]
    with pytest.raises(ProgramLoadError) as info:
        validate.validate_program(program)
    assert info.value.field == field, str(info.value)
    assert message in info.value.reason, str(info.value)
    assert str(info.value).startswith(field)


@pytest.mark.parametrize("name", sorted(CASES))
def test_corrupt_structures_fail_when_loaded_from_bytes(name):
    program = CASES[name][0]
    data = _rewrite(serialize.serialize_program(sample_program()),
                    lambda tree: _codec_tree(program))
    with pytest.raises(ProgramLoadError):
        serialize.deserialize_program(data)


def test_sample_is_valid():
    validate.validate_program(sample_program())


def test_a_view_of_state_is_valid():
    """A view of a state tensor reads the state as it is when read (ExecuTorch plans views of
    mutated buffers on the buffer's bytes: docs/format/pte.md)."""
    assert sample_program().methods[0].values[14].initial is not None
    values = sample_program().methods[0].values
    validate.validate_program(_with({"values": (*values, _view(14, 0, (1,)))}))


def test_unused_null_and_int_values_are_fine():
    validate.validate_program(_with(_value(8, Null())))
    validate.validate_program(_with(_value(2, Int(-5))))


def test_limits_are_configurable():
    with pytest.raises(ProgramLoadError, match="rank"):
        validate.validate_program(sample_program(), LoadLimits(max_rank=1))
    p = _with({"debug": (DebugEntry("a"),) * 4})
    validate.validate_program(p)


# ------------------------------------------------------------------------------ byte-level


def _codec_tree(program: schema.Program) -> dict:
    from exportir.format import _codec

    constants, delegates, _ = serialize._data_layout(program, 16)
    return _codec.encode_program(program, constants, delegates)


def _rewrite(data: bytes, edit, raw_length: int | None = None) -> bytes:
    """Replace the structure of a file (fixing all checksums), to test the decoder."""
    layout = serialize.read_layout(data)
    tree = json.loads(zlib.decompress(data[layout.structure_offset:layout.structure_offset
                                           + layout.structure_length]))
    tree = edit(tree)
    raw = tree if isinstance(tree, bytes) else json.dumps(tree).encode()
    comp = zlib.compress(raw)
    segment = data[layout.data_offset:]
    data_offset = (80 + len(comp) + 63) // 64 * 64
    head = struct.pack("<8sHHIQQQQQQII", serialize.MAGIC, 1, 0, 0, data_offset + len(segment),
                       80, len(comp), raw_length if raw_length is not None else len(raw),
                       data_offset, len(segment), zlib.crc32(comp), zlib.crc32(segment))
    head += struct.pack("<I", zlib.crc32(head)) + bytes(4)
    return head + comp + bytes(data_offset - 80 - len(comp)) + segment


def _set(path, value):
    def edit(tree):
        node = tree
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return tree
    return edit


DECODE_CASES = {
    "not json": (lambda t: b"{not json", "structure", "not valid JSON"),
    "deep nesting": (lambda t: b"[" * 100000 + b"]" * 100000, "structure", "JSON"),
    "top level": (lambda t: [1, 2], "structure", "expected an object"),
    "missing field": (lambda t: {"version": 1}, "structure", "missing field"),
    "bad value tag": (_set(["methods", 0, "values", 2], ["Q", 1]), "methods[0].values[2]",
                      "unknown value"),
    "dtype code": (_set(["methods", 0, "values", 0, 1], 99), "methods[0].values[0].dtype",
                   "unknown dtype code 99"),
    "bool as int": (_set(["methods", 0, "inputs", 0], True), "methods[0].inputs[0]",
                    "non-negative integer"),
    "string size": (_set(["methods", 0, "values", 0, 2], ["2", 3]),
                    "methods[0].values[0].sizes[0]", "expected an integer"),
    "bad storage": (_set(["methods", 0, "values", 0, 4], ["Z"]),
                    "methods[0].values[0].storage", "unknown storage"),
    "bad instruction": (_set(["methods", 0, "instructions", 0], ["K", 0]),
                        "methods[0].instructions[0]", "unknown instruction"),
    "constant range": (_set(["constants", 0], [0, 1 << 40]), "constants[0]", "outside"),
    "delegate range": (_set(["delegates", 0, 1], [1 << 20, 4]), "delegates[0].data", "outside"),
    "compile spec": (_set(["delegates", 0, 2, 0, 1], "@@@"), "delegates[0].compile_specs[0][1]",
                     "base64"),
    "plan shape": (_set(["methods", 0, "plan"], [[96], 72]), "methods[0].plan",
                   "expected 3 entries"),
    "name type": (_set(["methods", 0, "name"], 7), "methods[0].name", "expected a string"),
}


@pytest.mark.parametrize("name", sorted(DECODE_CASES))
def test_decoder_errors_name_the_field(name):
    edit, field, message = DECODE_CASES[name]
    data = _rewrite(serialize.serialize_program(sample_program()), edit)
    with pytest.raises(ProgramLoadError) as info:
        serialize.deserialize_program(data)
    assert info.value.field == field, str(info.value)
    assert message in info.value.reason, str(info.value)


def test_rewrite_helper_round_trips():
    data = serialize.serialize_program(sample_program())
    assert serialize.deserialize_program(_rewrite(data, lambda t: t)) == sample_program()


HEADER_CASES = {
    "short": (lambda d: d[:40], "header", "header needs 80"),
    "magic": (lambda d: b"NOTAPROG" + d[8:], "header.magic", "bad magic"),
    "header crc": (lambda d: d[:20] + bytes([d[20] ^ 1]) + d[21:], "header.crc", "checksum"),
    "truncated": (lambda d: d[:-1], "header.file_size", "truncated"),
    "extended": (lambda d: d + b"\0", "header.file_size", "truncated or extended"),
    "structure crc": (lambda d: d[:100] + bytes([d[100] ^ 4]) + d[101:], "structure", "checksum"),
    "data crc": (lambda d: d[:-3] + bytes([d[-3] ^ 1]) + d[-2:], "data", "checksum"),
}


@pytest.mark.parametrize("name", sorted(HEADER_CASES))
def test_header_and_checksum_errors(name):
    corrupt, field, message = HEADER_CASES[name]
    with pytest.raises(ProgramLoadError) as info:
        serialize.deserialize_program(corrupt(serialize.serialize_program(sample_program())))
    assert info.value.field == field, str(info.value)
    assert message in info.value.reason, str(info.value)
    assert info.value.offset is not None


def test_data_checksum_can_be_skipped():
    data = serialize.serialize_program(sample_program())
    flipped = data[:-3] + bytes([data[-3] ^ 1]) + data[-2:]
    serialize.deserialize_program(flipped, verify_data=False)


def test_version_and_lengths_in_header():
    data = serialize.serialize_program(sample_program())
    bumped = _reheader(data, major=4)
    with pytest.raises(ProgramLoadError, match=r"format version 4\.\d is not supported"):
        serialize.deserialize_program(bumped)
    with pytest.raises(ProgramLoadError, match="exceeds the limit"):
        serialize.deserialize_program(_rewrite(data, lambda t: t, raw_length=1 << 40))
    with pytest.raises(ProgramLoadError, match="different length"):
        serialize.deserialize_program(_rewrite(data, lambda t: t, raw_length=10))
    with pytest.raises(ProgramLoadError, match="outside"):
        serialize.deserialize_program(_reheader(data, structure_length=1 << 50))


def _reheader(data: bytes, **changes) -> bytes:
    layout = serialize.read_layout(data)
    fields = dataclasses.replace(layout, **changes)
    values = [serialize.MAGIC] + [getattr(fields, f.name) for f in dataclasses.fields(fields)]
    head = struct.pack("<8sHHIQQQQQQII", *values[:-1])
    head += struct.pack("<I", zlib.crc32(head)) + bytes(4)
    return head + data[80:]
