"""Hand-built hostile .pt2 files (a saved program's members edited, the manifest's sizes and
SHA-256 recomputed): each reproduction of a problem once found now fails ``exportir.load``
with a SerializationError naming the field, before ``ep.module()`` can run anything."""

from __future__ import annotations

import copy
import io
import json

import pytest
import torch
from pt2_files import assemble, disassemble

import exportir
from exportir.export.serialize_common import SerializationError


class _Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + 1


@pytest.fixture(scope="module")
def saved() -> tuple[dict, dict, dict]:
    buffer = io.BytesIO()
    exportir.save(exportir.export(_Model(), (torch.randn(2, 3),)), buffer)
    members, producer = disassemble(buffer.getvalue())
    return members, producer, json.loads(members["program.json"])


def _load(saved, edit) -> exportir.ExportedProgram:
    members, producer, program = saved
    program = copy.deepcopy(program)
    edit(program)
    return exportir.load(io.BytesIO(assemble({**members, "program.json":
                                              json.dumps(program).encode()}, producer)))


def _node(program: dict, name: str) -> dict:
    return next(n for n in program["graph_module"]["nodes"] if n["name"] == name)


def test_the_unedited_file_loads_and_runs(saved):
    ep = _load(saved, lambda p: None)
    x = torch.randn(2, 3)
    torch.testing.assert_close(ep.module()(x), torch.relu(x) + 1)


def _read_a_file(program: dict) -> None:
    relu = _node(program, "relu")
    relu["target"] = "aten::from_file.default"
    relu["args"] = [{"str": "/etc/hostname"}]
    relu["kwargs"] = {"size": {"int": 64}}


@pytest.mark.parametrize(("target", "message"), [
    ("aten::from_file.default", "is not one an exported program may call"),
    ("aten::_print.default", "is not one an exported program may call"),
    ("aten::_reshape_alias.default", "is not one an exported program may call"),
    ("profiler::_record_function_enter.default", "is not one an exported program may call"),
    ("_c10d_functional::all_reduce.default", "is not one an exported program may call"),
    ("higher_order::invoke_subgraph", "is not one export emits"),
    ("__class__::__init__", "unknown operator namespace"),
])
def test_operators_an_exported_program_never_calls_are_refused(saved, target, message):
    # before: aten::from_file loaded, and ep.module() read the file when called
    def edit(program: dict) -> None:
        _node(program, "relu")["target"] = target

    with pytest.raises(SerializationError, match=rf"nodes/1/target \(node relu\): .*{message}"):
        _load(saved, edit)


def test_a_file_reading_graph_is_refused_before_module_runs(saved):
    with pytest.raises(SerializationError, match="aten::from_file.default"):
        _load(saved, _read_a_file)


@pytest.mark.parametrize(("value", "message"), [
    ({"int": 10**400}, r"args/1: an integer of 1329 bits does not fit in the 64 bits"),
    ({"float": 10**400}, r"args/1/float: number of 1329 bits does not fit in a double"),
    ({"list": [{"int": -(2**70)}]}, r"args/1/0: an integer of 71 bits"),
])
def test_numbers_an_operator_cannot_take_are_refused(saved, value, message):
    # before: OverflowError when ep.module() ran (or while loading, for the float)
    def edit(program: dict) -> None:
        _node(program, "add")["args"][1] = value

    with pytest.raises(SerializationError, match=rf"nodes/2/{message}"):
        _load(saved, edit)


_LEAF = {"type": None, "context": None, "children_spec": []}


def _dict_spec(*keys) -> str:
    return json.dumps([1, {"type": "builtins.dict", "context": json.dumps(list(keys)),
                           "children_spec": [_LEAF] * len(keys)}])


@pytest.mark.parametrize(("field", "spec", "message"), [
    ("out_spec", _dict_spec([1, 2]), r"dict key \[1, 2\] is not a string"),
    ("out_spec", _dict_spec({"a": 1}), r"dict key \{'a': 1\} is not a string"),
    ("in_spec", json.dumps([1, {"type": "builtins.tuple", "context": "null", "children_spec": [
        {"type": "builtins.tuple", "context": "null", "children_spec": [_LEAF]},
        json.loads(_dict_spec([1]))[1]]}]), r"dict key \[1\] is not a string"),
    ("in_spec", json.dumps([1, {"type": "builtins.tuple", "context": "null", "children_spec": [
        {"type": "builtins.tuple", "context": "null", "children_spec": [_LEAF]},
        json.loads(_dict_spec("not a name"))[1]]}]), r"'not a name' is not a valid identifier"),
])
def test_treespecs_with_keys_a_program_cannot_use_are_refused(saved, field, spec, message):
    # before: TypeError (unhashable type: 'list', or a str join) when ep.module() was built
    def edit(program: dict) -> None:
        program["module_call_graph"][0]["signature"][field] = spec

    with pytest.raises(SerializationError, match=rf"module_call_graph/0/signature/{field}.*"
                                                 rf"{message}"):
        _load(saved, edit)


def test_example_inputs_that_are_not_args_and_kwargs_are_refused(saved):
    # before: loaded, then ``args, kwargs = ep.example_inputs`` failed (ValueError)
    def edit(program: dict) -> None:
        program["example_inputs"]["spec"] = json.dumps(
            [1, {"type": "builtins.list", "context": "null", "children_spec": [_LEAF]}])

    with pytest.raises(SerializationError, match=r"example_inputs/spec: example inputs must be "
                                                 r"\(args tuple, kwargs dict\); the spec gives "
                                                 r"a list"):
        _load(saved, edit)
