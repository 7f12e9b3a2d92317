"""The debug node table of format 2.2 (``schema.DebugNode``): written, read back, committed as a
compatibility file, and validated like every other field of a file from elsewhere."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from program_samples import sample_program

from exportir.format.validate import MAX_DEBUG_STRING, ProgramLoadError, validate_program
from exportir.program import _codec, schema, serialize

DATA = Path(__file__).resolve().parent / "data"


def debug_program() -> schema.Program:
    """The sample program with a debug node per debug entry and one in delegate 0's scope."""
    program = sample_program()
    methods = []
    for m in program.methods:
        names = dict.fromkeys(d.node_name for d in m.debug if d.node_name)
        nodes = [schema.DebugNode(-1, n, f"aten.{n}.default", "model.py:3", "encoder.0",
                                  "torch.nn.modules.linear.Linear") for n in names]
        nodes.append(schema.DebugNode(0, "addmm", "aten.addmm.default", "model.py:4", "head",
                                      "torch.nn.modules.linear.Linear"))
        methods.append(dataclasses.replace(m, nodes=tuple(nodes)))
    return dataclasses.replace(program, methods=tuple(methods))


def test_debug_nodes_round_trip_and_the_file_is_2_2():
    program = debug_program()
    data = serialize.serialize_program(program)
    assert (serialize.read_layout(data).major, serialize.read_layout(data).minor) == (2, 2)
    assert serialize.deserialize_program(data) == program
    bare = serialize.serialize_program(sample_program())  # no table: no key written
    assert serialize.deserialize_program(bare).methods[0].nodes == ()


def test_format_2_2_file_with_debug_nodes_still_loads():
    """A committed file written by format 2.2 (debug nodes)."""
    assert serialize.load(DATA / "program_v2_2.xpt") == debug_program()


def _with_nodes(*nodes: schema.DebugNode) -> schema.Program:
    program = sample_program()
    first = dataclasses.replace(program.methods[0], nodes=nodes)
    return dataclasses.replace(program, methods=(first, *program.methods[1:]))


@pytest.mark.parametrize(("nodes", "field", "message"), [
    ((schema.DebugNode(3, "add"),), "methods[0].nodes[0].scope", "delegate index 3 out of range"),
    ((schema.DebugNode(-2, "add"),), "methods[0].nodes[0].scope", "delegate index -2"),
    ((schema.DebugNode(-1, ""),), "methods[0].nodes[0].name", "empty or repeated"),
    ((schema.DebugNode(-1, "add"), schema.DebugNode(-1, "add")), "methods[0].nodes[1].name",
     "empty or repeated"),
    ((schema.DebugNode(-1, "add", source="x" * (MAX_DEBUG_STRING + 1)),),
     "methods[0].nodes[0].source", "4097 characters"),
])
def test_bad_debug_nodes_are_refused_naming_the_field(nodes, field, message):
    with pytest.raises(ProgramLoadError) as info:
        validate_program(_with_nodes(*nodes))
    assert info.value.field == field and message in str(info.value)


def test_the_same_name_in_two_scopes_is_fine():
    validate_program(_with_nodes(schema.DebugNode(-1, "add"), schema.DebugNode(0, "add")))


@pytest.mark.parametrize(("raw", "field"), [
    ("not a list", "m.nodes"),
    ([[-1, "add", "", ""]], "m.nodes[0]"),
    ([["-1", "add", "", "", "", ""]], "m.nodes[0].scope"),
    ([[-1, 7, "", "", "", ""]], "m.nodes[0][1]"),
])
def test_malformed_debug_nodes_are_refused_when_decoding(raw, field):
    method = _codec.encode_method(sample_program().methods[0]) | {"nodes": raw}
    with pytest.raises(ProgramLoadError) as info:
        _codec.decode_method(method, "m")
    assert info.value.field == field


if __name__ == "__main__":
    # Writes the 2.2 compatibility file (only when releasing the version: never regenerated).
    serialize.save(debug_program(), DATA / "program_v2_2.xpt")
