"""Load-time typing (exportir.runtime.typecheck): every instruction's operands, writes, moves,
jumps and reads are checked before anything runs; each problem is a ProgramLoadError naming
the field. Files are hand-built (schema dataclasses -> the codec -> bytes) unless the codec
itself would refuse them, then the JSON structure is written directly."""

from __future__ import annotations

import dataclasses
import json
import zlib

import pytest
import torch
from runtime_programs import F32, MethodBuilder, add_mul_program, program_of

from exportir.program import schema, serialize
from exportir.runtime import Program, ProgramLoadError

I32 = schema.ScalarType.INT


def _load(program: schema.Program) -> Program:
    return Program.load(serialize.serialize_program(program))


def test_an_emitted_program_passes():
    (out,) = _load(add_mul_program()).method()(torch.ones(2, 3), torch.ones(2, 3))
    assert torch.equal(out, torch.full((2, 3), 4.0))


# -- define before use -----------------------------------------------------------------------


def _read_before_write() -> MethodBuilder:
    """out = x + stale, where nothing ever writes ``stale``: its arena bytes are whatever an
    earlier call left there (before: a result that depended on earlier calls)."""
    b = MethodBuilder()
    x = b.input("x", (2,))
    stale = b.planned((2,))
    one = b.add(schema.Int(1))
    out = b.planned((2,))
    b.kernel("aten::add", "out", (x, stale, one, out), "add", "m.py:1")
    b.outputs.append(out)
    return b


def test_a_read_of_planned_memory_nothing_wrote_is_refused():
    with pytest.raises(ProgramLoadError, match=r"methods\[0\].instructions\[0\]: reads value 1 "
                                               r"before any instruction wrote it"):
        _load(program_of(_read_before_write()))


def _branches(write_in_false_branch: bool) -> MethodBuilder:
    """if flag: t = relu(x) [else: t = neg(x)]; out = t + x."""
    b = MethodBuilder()
    x = b.input("x", (2,))
    flag = b.scalar_input("flag", schema.Bool(True))
    t, out = b.planned((2,)), b.planned((2,))
    never, one = b.add(schema.Bool(False)), b.add(schema.Int(1))
    b.instruction(lambda d: schema.JumpFalseCall(flag, 3, d), "cond")
    b.kernel("aten::relu", "out", (x, t), "relu")
    b.instruction(lambda d: schema.JumpFalseCall(never, 4, d), "cond")
    if write_in_false_branch:
        b.kernel("aten::neg", "out", (x, t), "neg")
    else:
        b.kernel("aten::neg", "out", (x, out), "neg")
    b.kernel("aten::add", "out", (t, x, one, out), "add")
    b.outputs.append(out)
    return b


def test_define_before_use_follows_both_branches_of_a_jump():
    method = _load(program_of(_branches(True))).method()
    x = torch.tensor([-1.0, 2.0])
    assert method(x, True)[0].tolist() == [-1.0, 4.0]
    assert method(x, False)[0].tolist() == [0.0, 0.0]
    with pytest.raises(ProgramLoadError, match=r"instructions\[4\]: reads value 2 before any "
                                               r"instruction wrote it \(on some path"):
        _load(program_of(_branches(False)))


def _loop(free_in_body: bool) -> MethodBuilder:
    """t = neg(x); loop: acc = t + x; [free t;] t = relu(acc) written to a runtime tensor ...
    with a jump back (format 3). ``free_in_body``: the body frees ``t`` after reading it and
    never writes it again, so the second iteration reads freed memory, a path only the back
    jump reaches."""
    b = MethodBuilder()
    x = b.input("x", (2,))
    again = b.scalar_input("again", schema.Bool(False))
    t = b.add(schema.Tensor(F32, (2,), (0,), schema.DynamicStorage(), True, None))
    acc, out = b.planned((2,)), b.planned((2,))
    never, one = b.add(schema.Bool(False)), b.add(schema.Int(1))
    b.kernel("aten::neg", "out", (x, t), "neg")                         # 0
    b.kernel("aten::add", "out", (t, x, one, acc), "add")               # 1: loop start
    if free_in_body:
        b.instruction(lambda d: schema.FreeCall(t, d), "free")          # 2
    else:
        b.kernel("aten::relu", "out", (acc, t), "relu")                 # 2
    b.instruction(lambda d: schema.JumpFalseCall(again, 5, d), "cond")  # 3: leave
    b.instruction(lambda d: schema.JumpFalseCall(never, 1, d), "loop")  # 4: jump back
    b.kernel("aten::relu", "out", (acc, out), "relu")                   # 5
    b.outputs.append(out)
    return b


def _loop_program(free_in_body: bool) -> schema.Program:
    return dataclasses.replace(program_of(_loop(free_in_body)),
                               version=schema.LOOP_FORMAT_VERSION)


def test_define_before_use_follows_a_jump_back():
    method = _load(_loop_program(False)).method()
    x = torch.tensor([-1.0, 2.0])
    assert method(x, False)[0].tolist() == [0.0, 0.0]  # one pass: relu(-x + x)
    with pytest.raises(ProgramLoadError, match=r"instructions\[1\]: reads value 2 before any "
                                               r"instruction wrote it \(on some path"):
        _load(_loop_program(True))


def test_an_output_nothing_writes_is_refused():
    b = MethodBuilder()
    x = b.input("x", (2,))
    out, spare = b.planned((2,)), b.planned((2,))
    b.kernel("aten::relu", "out", (x, out), "relu")
    b.outputs += [out, spare]
    with pytest.raises(ProgramLoadError, match=r"outputs\[1\]: output value 2 is not written"):
        _load(program_of(b))


def test_a_freed_tensor_is_undefined_again():
    b = MethodBuilder()
    x = b.input("x", (2,))
    t = b.add(schema.Tensor(F32, (2,), (0,), schema.DynamicStorage(), True))
    out = b.planned((2,))
    b.kernel("aten::relu", "out", (x, t), "relu")
    b.instruction(lambda d: schema.FreeCall(t, d), "free")
    b.kernel("aten::neg", "out", (t, out), "neg")
    b.outputs.append(out)
    with pytest.raises(ProgramLoadError, match=r"instructions\[2\]: reads value 1 before"):
        _load(program_of(b))


# -- operands, writes, moves, jumps ----------------------------------------------------------


def test_an_enum_code_outside_its_enum_is_refused():
    b = MethodBuilder()
    x = b.input("x", (2,))
    fmt = b.add(schema.Int(7))  # memory formats are 0..3
    out = b.planned((2,))
    b.kernel("aten::clone", "out", (x, fmt, out), "clone")
    b.outputs.append(out)
    with pytest.raises(ProgramLoadError, match=r"args\[1\]: argument 'memory_format' of "
                                               r"aten::clone.out: 7 is not a MemoryFormat code"):
        _load(program_of(b))


def test_an_operand_of_the_wrong_kind_is_refused():
    b = MethodBuilder()
    x = b.input("x", (2,))
    alpha = b.add(schema.String("one"))
    out = b.planned((2,))
    b.kernel("aten::add", "out", (x, x, alpha, out), "add")
    b.outputs.append(out)
    with pytest.raises(ProgramLoadError, match=r"args\[2\]: argument 'alpha' of aten::add.out "
                                               r"takes Bool/Double/Int; value 1 is String"):
        _load(program_of(b))


def test_a_move_between_different_dtypes_is_refused():
    b = MethodBuilder()
    x = b.input("x", (2,))
    out = b.planned((2,), dtype=I32)
    b.instruction(lambda d: schema.MoveCall(x, out, d), "move")
    b.outputs.append(out)
    with pytest.raises(ProgramLoadError, match=r"instructions\[0\]: a move copies value 0 "
                                               r"\(FLOAT\[2\]\) into value 1 \(INT\[2\]\)"):
        _load(program_of(b))


def test_a_move_into_a_constant_is_refused():
    b = MethodBuilder()
    x = b.input("x", (2,))
    c = b.constant(torch.zeros(2))
    b.instruction(lambda d: schema.MoveCall(x, c, d), "move")
    b.outputs.append(c)
    with pytest.raises(ProgramLoadError, match=r"instructions\[0\].dst: a move writes value 1, a "
                                               r"constant \(read-only\)"):
        _load(program_of(b))


def test_a_jump_on_a_tensor_of_several_elements_is_refused():
    b = MethodBuilder()
    x = b.input("x", (4,))
    b.instruction(lambda d: schema.JumpFalseCall(x, 1, d), "cond")
    b.outputs.append(x)
    with pytest.raises(ProgramLoadError, match=r"cond_value: a jump condition tensor must have "
                                               r"one element; value 0 has 4"):
        _load(program_of(b))


def test_a_primitive_result_into_a_constant_is_refused():
    b = MethodBuilder()
    x = b.input("x", (2,))
    zero = b.add(schema.Int(0))
    c = b.constant(torch.zeros(()))
    b.kernel("aten::sym_size", "int", (x, zero, c), "size")
    b.outputs.append(c)
    with pytest.raises(ProgramLoadError, match=r"args\[2\]: the result of aten::sym_size.int "
                                               r"must go to a Int value; value 2 is Tensor"):
        _load(program_of(b))


# -- inputs and specs --------------------------------------------------------------------------


def test_a_view_of_an_input_that_is_not_listed_is_refused():
    # before: AttributeError ('NoneType' object has no attribute 'as_strided') when called
    b = MethodBuilder()
    x = b.input("x", (2, 3))
    hidden = b.add(schema.Tensor(F32, (2, 3), (0, 1), schema.InputStorage()))
    xt = b.view(hidden, (3, 2), (1, 3))
    one = b.add(schema.Int(1))
    out = b.planned((3, 2))
    b.kernel("aten::add", "out", (xt, xt, one, out), "add")
    b.outputs.append(out)
    del x
    with pytest.raises(ProgramLoadError, match=r"values\[1\].storage: value 1 has input storage "
                                               r"but is not one of the method's inputs \[0\]"):
        _load(program_of(b))


_LIST_KEY_SPEC = json.dumps([1, {"type": "builtins.dict", "context": json.dumps([[1, 2]]),
                                 "children_spec": [{"type": None, "context": None,
                                                    "children_spec": []}]}])


@pytest.mark.parametrize("field", ["in_spec", "out_spec"])
def test_a_treespec_dict_with_a_list_key_is_refused(field):
    # before: TypeError (unhashable type: 'list') when the method was prepared
    bad = dataclasses.replace(add_mul_program().methods[0], **{field: _LIST_KEY_SPEC})
    program = dataclasses.replace(add_mul_program(), methods=(bad,))
    with pytest.raises(ProgramLoadError, match=rf"methods\[0\].{field}: malformed pytree spec: "
                                               r"dict key \[1, 2\] is not a string"):
        _load(program)


@pytest.mark.parametrize("spec", ["[1, {", "[2, {}]", json.dumps([1, {"type": 3}]),
                                  json.dumps([1, {"type": None, "children_spec": 5}])])
def test_malformed_treespecs_are_refused(spec):
    bad = dataclasses.replace(add_mul_program().methods[0], in_spec=spec)
    with pytest.raises(ProgramLoadError, match=r"methods\[0\].in_spec: malformed pytree spec"):
        _load(dataclasses.replace(add_mul_program(), methods=(bad,)))


# -- integers and numbers the format cannot hold -----------------------------------------------


def _with_value(index: int, encoded: list) -> bytes:
    """add_mul_program's file with value ``index`` replaced by the JSON ``encoded`` (written
    directly: the codec's encoder would not write it), checksums recomputed."""
    data = serialize.serialize_program(add_mul_program())
    layout = serialize.read_layout(data)
    start = layout.structure_offset
    tree = json.loads(zlib.decompress(data[start:start + layout.structure_length]))
    tree["methods"][0]["values"][index] = encoded
    return refile(tree, data[layout.data_offset:])


def refile(tree: dict, segment: bytes) -> bytes:
    """A program file with a valid header and checksums around the structure ``tree``."""
    raw = json.dumps(tree, sort_keys=True, separators=(",", ":")).encode()
    comp = zlib.compress(raw)
    head_size, align = serialize.HEADER_SIZE, serialize.SEGMENT_ALIGNMENT
    data_offset = (head_size + len(comp) + align - 1) // align * align
    fields = [serialize.MAGIC, schema.FORMAT_VERSION, 0, 0, data_offset + len(segment),
              head_size, len(comp), len(raw), data_offset, len(segment), zlib.crc32(comp),
              zlib.crc32(segment), 0]
    fields[-1] = zlib.crc32(serialize._HEADER.pack(*fields)[:serialize._HEADER_CRC_SPAN])
    head = serialize._HEADER.pack(*fields) + bytes(head_size - serialize._HEADER.size)
    return head + comp + bytes(data_offset - head_size - len(comp)) + segment


@pytest.mark.parametrize(("encoded", "message"), [
    (["i", 10**400], "integer of 1329 bits does not fit in 64 bits"),
    (["d", 10**400], "number of 1329 bits does not fit in a double"),
    (["i", 1 << 63], "integer 9223372036854775808 does not fit in 64 bits"),
    (["il", [10**400]], "does not fit in 64 bits"),
])
def test_integers_beyond_64_bits_are_load_errors(encoded, message):
    # before: OverflowError (from float() while decoding, or from the kernel when called)
    with pytest.raises(ProgramLoadError, match=rf"methods\[0\].values\[3\].*{message}"):
        Program.load(_with_value(3, encoded))


# -- sizes set by arguments ----------------------------------------------------------------------


def _ints(b: MethodBuilder, *xs: int) -> int:
    return b.add(schema.IntList(tuple(b.add(schema.Int(x)) for x in xs)))


def test_a_factory_size_that_differs_from_its_planned_out_is_refused():
    b = MethodBuilder()
    size, fill = _ints(b, 1 << 33), b.add(schema.Double(1.0))
    out = b.planned((4,))
    b.kernel("aten::full", "out", (size, fill, out), "full")
    b.outputs.append(out)
    with pytest.raises(ProgramLoadError, match=r"instructions\[0\].args\[2\]: aten::full.out makes "
                                               r"a tensor of sizes \[8589934592\]; value 3 is "
                                               r"planned with \[4\]"):
        _load(program_of(b))


def test_a_factory_size_beyond_the_limits_into_runtime_memory_is_refused():
    # full.out([2**33]) into a runtime-owned tensor: 32 GiB asked for by a few bytes of file
    b = MethodBuilder()
    size, fill = _ints(b, 1 << 40), b.add(schema.Double(1.0))
    out = b.add(schema.Tensor(F32, (0,), (0,), schema.DynamicStorage(), True))
    b.kernel("aten::full", "out", (size, fill, out), "full")
    b.outputs.append(out)
    with pytest.raises(ProgramLoadError, match=r"makes a tensor of sizes \[1099511627776\] "
                                               r"\(4398046511104 bytes\), beyond the limit"):
        _load(program_of(b))


@pytest.mark.parametrize(("op", "extra", "message"), [
    ("view_copy", (6, 2), r"a view of 6 elements cannot have size \[6, 2\]"),
    ("expand_copy", (4, 3), r"cannot expand \[2, 3\] to \[4, 3\]"),
    ("repeat", (1 << 20, 1), r"makes a tensor of sizes \[2097152, 3\]; value \d+ is planned"),
])
def test_views_and_repeats_must_match_their_planned_out(op, extra, message):
    b = MethodBuilder()
    x = b.input("x", (2, 3))
    size = _ints(b, *extra)
    out = b.planned((2, 3))
    args = (x, size, b.add(schema.Bool(False)), out) if op == "expand_copy" else (x, size, out)
    b.kernel(f"aten::{op}", "out", args, op)
    b.outputs.append(out)
    with pytest.raises(ProgramLoadError, match=message):
        _load(program_of(b))


def test_sizes_known_only_at_run_time_are_left_to_the_plan():
    # view_copy to [n, 3] with n = x.size(0): the out is dynamic, bounded by its plan
    b = MethodBuilder()
    x = b.input("x", (4, 3), dynamic=True)
    zero, n = b.add(schema.Int(0)), b.add(schema.Int(0))
    b.kernel("aten::sym_size", "int", (x, zero, n), "size")
    size = b.add(schema.IntList((n, b.add(schema.Int(3)))))
    out = b.planned((4, 3), dynamic=True)
    b.kernel("aten::view_copy", "out", (x, size, out), "view")
    b.outputs.append(out)
    method = _load(program_of(b)).method()
    x_in = torch.randn(3, 3)
    assert torch.equal(method(x_in)[0], x_in)


def test_a_convolution_whose_padding_does_not_match_its_planned_out_is_refused():
    # padding 2**32 would make ATen's convolution allocate terabytes before copying to the out
    b = MethodBuilder()
    x = b.input("x", (1, 3, 8, 8))
    w = b.constant(torch.randn(4, 3, 3, 3))
    stride, padding, dilation = _ints(b, 1, 1), _ints(b, 0, 1 << 32), _ints(b, 1, 1)
    out = b.planned((1, 4, 6, 6))
    b.kernel("aten::convolution", "out", (x, w, b.add(schema.Null()), stride, padding, dilation,
                                          b.add(schema.Bool(False)), _ints(b, 0, 0),
                                          b.add(schema.Int(1)), out), "conv")
    b.outputs.append(out)
    with pytest.raises(ProgramLoadError, match=r"aten::convolution.out makes a tensor of sizes "
                                               r"\[1, 4, 6, 8589934598\]; value \d+ is planned "
                                               r"with \[1, 4, 6, 6\]"):
        _load(program_of(b))
