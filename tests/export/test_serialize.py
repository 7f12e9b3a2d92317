"""save / load of ExportedPrograms: round trips, the documented format, and hostile files.

Round trips compare everything a user can observe: the printed program and graph, node
metadata, the signature, state_dict / constants (values, Parameter-ness, tied weights),
module call graph, example inputs and ``module()`` outputs. Hostile files (truncated, tampered,
oversized claims, injected names, unknown ops) must fail with ``SerializationError`` naming
what is wrong; the hypothesis fuzzers check that nothing else ever escapes ``load``.

Reproduce one test with
``PYTHONPATH=src .venv/bin/python -m pytest -p no:xdist tests/export/test_serialize.py -k <name>``.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import operator
import re
import struct
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exportir import pytree
from exportir.export import (
    ExportedProgram,
    ExportGraphSignature,
    InputKind,
    InputSpec,
    ModuleCallEntry,
    ModuleCallSignature,
    OutputKind,
    OutputSpec,
    TensorArgument,
)
from exportir.export.capture.fake import fake_like
from exportir.export.serialize.save_load import SerializationError, load, save
from exportir.export.serialize.tensors import DTYPE_TO_TAG, decode_tensors, encode_tensors
from exportir.export.serialize.values import (
    Decoder,
    encode_value,
    qualified_name,
    resolve_qualified,
)
from exportir.fx.graph import Graph
from exportir.fx.graph_module import GraphModule

aten = torch.ops.aten
TRACE = 'File "model.py", line 7, in forward\n    return self.lin(x).clamp(max=0.5)'


# --------------------------------------------------------------------------- programs


def _fill_meta(g: Graph, vals: dict[str, torch.Tensor]) -> None:
    for n in g.nodes:
        if n.op == "placeholder":
            n.meta["val"] = vals[n.name]
        elif n.op == "call_function":
            args, kwargs = pytree.tree_map(
                lambda a: a.meta["val"] if hasattr(a, "meta") else a, (n.args, n.kwargs))
            n.meta["val"] = n.target(*args, **kwargs)
            n.meta["stack_trace"] = TRACE
            n.meta["nn_module_stack"] = {"lin": ("lin", "torch.nn.modules.linear.Linear")}
            n.meta["source_fn_stack"] = [("lin", torch.nn.Linear)]
        else:
            n.meta["val"] = pytree.tree_map(lambda a: a.meta["val"], n.args[0])


def make_program(*, tied: bool = False, constant: bool = True) -> ExportedProgram:
    """A hand-built ATen program: parameters, a mutated buffer, a lifted constant, a
    multi-output op with getitem, kwargs with -inf, and an (args, kwargs) input spec."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(3, 4))
    b = torch.nn.Parameter(torch.randn(3))
    count = torch.zeros(3)
    scale = torch.tensor([2.0, 3.0, 4.0])
    g = Graph()
    pw, pb, bc = g.placeholder("p_weight"), g.placeholder("p_bias"), g.placeholder("b_count")
    cs = g.placeholder("c_scale")
    x, y = g.placeholder("x"), g.placeholder("y")
    t = g.call_function(aten.t.default, (pw,))
    mm = g.call_function(aten.addmm.default, (pb, x, t))
    mx = g.call_function(aten.max.dim, (mm, 1, True))
    first = g.call_function(operator.getitem, (mx, 0))
    add = g.call_function(aten.add.Tensor, (bc, 1.0))
    scaled = g.call_function(aten.mul.Tensor, (mm, cs))
    out = g.call_function(aten.clamp.default, (scaled,), {"min": float("-inf"), "max": 0.5})
    summed = g.call_function(aten.sum.dim_IntList, (y, [0, 1]), {"keepdim": False,
                                                                 "dtype": torch.float64})
    g.output((add, out, first, summed))
    _fill_meta(g, {"p_weight": fake_like(w), "p_bias": fake_like(b), "b_count": fake_like(count),
                   "c_scale": fake_like(scale), "x": fake_like(torch.randn(2, 4)),
                   "y": fake_like(torch.randn(2, 2))})
    signature = ExportGraphSignature(
        [InputSpec(InputKind.PARAMETER, TensorArgument("p_weight"), "lin.weight"),
         InputSpec(InputKind.PARAMETER, TensorArgument("p_bias"), "lin.bias"),
         InputSpec(InputKind.BUFFER, TensorArgument("b_count"), "count", persistent=True),
         InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument("c_scale"), "scale"),
         InputSpec(InputKind.USER_INPUT, TensorArgument("x"), None),
         InputSpec(InputKind.USER_INPUT, TensorArgument("y"), None)],
        [OutputSpec(OutputKind.BUFFER_MUTATION, TensorArgument("add_tensor"), "count"),
         OutputSpec(OutputKind.USER_OUTPUT, TensorArgument("clamp_default"), None),
         OutputSpec(OutputKind.USER_OUTPUT, TensorArgument("getitem"), None),
         OutputSpec(OutputKind.USER_OUTPUT, TensorArgument("sum_dim_int_list"), None)])
    example = ((torch.randn(2, 4),), {"y": torch.randn(2, 2)})
    call_graph = [ModuleCallEntry("", ModuleCallSignature(
        [TensorArgument("x"), TensorArgument("y")],
        [TensorArgument(n) for n in ("clamp_default", "getitem", "sum_dim_int_list")],
        pytree.tree_structure(example), pytree.tree_structure({"out": 1, "rest": (2, [3])}),
        ["x", "y"]))]
    state = {"lin.weight": w, "lin.bias": b, "count": count}
    if tied:
        state["tied.weight"] = w
    gm = GraphModule({}, g)
    return ExportedProgram(gm, gm.graph, signature, state, {}, call_graph, example,
                           {"scale": scale})


def to_bytes(ep: ExportedProgram, **kwargs: Any) -> bytes:
    buf = io.BytesIO()
    save(ep, buf, **kwargs)
    return buf.getvalue()


def from_bytes(data: bytes, **kwargs: Any) -> ExportedProgram:
    return load(io.BytesIO(data), **kwargs)


@pytest.fixture(scope="module")
def program() -> ExportedProgram:
    return make_program()


@pytest.fixture(scope="module")
def saved(program: ExportedProgram) -> bytes:
    return to_bytes(program)


# --------------------------------------------------------------------------- comparisons


def _tensor_meta(t: Any) -> Any:
    if isinstance(t, torch.Tensor):
        return (t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), t.device, t.requires_grad)
    return t


def _meta_view(meta: dict[str, Any]) -> dict[str, Any]:
    """Metadata as a round trip must keep it: tensors by their metadata, functions and classes
    in ``source_fn_stack`` by name (they are restored as objects only under torch & co)."""
    out = dict(meta)
    if "val" in out:
        out["val"] = pytree.tree_map(_tensor_meta, out["val"])
    if "source_fn_stack" in out:
        out["source_fn_stack"] = [(n, qualified_name(f)) for n, f in out["source_fn_stack"]]
    if "nn_module_stack" in out:
        out["nn_module_stack"] = {k: (p, qualified_name(c))
                                  for k, (p, c) in out["nn_module_stack"].items()}
    return out


def assert_same_program(a: ExportedProgram, b: ExportedProgram) -> None:
    assert str(b) == str(a)
    assert str(b.graph) == str(a.graph)
    assert b.graph_signature == a.graph_signature
    for na, nb in zip(a.graph.nodes, b.graph.nodes, strict=True):
        assert (nb.name, nb.op, nb.target) == (na.name, na.op, na.target)
        assert nb.format_node() == na.format_node()
        assert _meta_view(nb.meta) == _meta_view(
            {k: v for k, v in na.meta.items() if k in nb.meta}), nb.name
    assert list(b.state_dict) == list(a.state_dict)
    for key, value in a.state_dict.items():
        assert type(b.state_dict[key]) is type(value), key
        assert b.state_dict[key].requires_grad == (value.requires_grad and value.is_leaf)
        assert torch.equal(b.state_dict[key], value), key
    assert list(b.constants) == list(a.constants)
    for key, value in a.constants.items():
        assert torch.equal(b.constants[key], value), key
    assert b.range_constraints == a.range_constraints
    assert [(e.fqn, e.signature) for e in b.module_call_graph] == [
        (e.fqn, e.signature) for e in a.module_call_graph]
    assert b.dialect == a.dialect


def assert_same_outputs(a: ExportedProgram, b: ExportedProgram, args: tuple, kwargs: dict) -> None:
    out_a = a.module()(*args, **kwargs)
    out_b = b.module()(*args, **kwargs)
    flat_a, spec_a = pytree.tree_flatten(out_a)
    flat_b, spec_b = pytree.tree_flatten(out_b)
    assert spec_a == spec_b
    for x, y in zip(flat_a, flat_b, strict=True):
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y


# --------------------------------------------------------------------------- round trips


def test_round_trip_hand_built(program: ExportedProgram, saved: bytes) -> None:
    loaded = from_bytes(saved)
    assert_same_program(program, loaded)
    (args, kwargs) = loaded.example_inputs
    assert torch.equal(args[0], program.example_inputs[0][0])
    assert torch.equal(kwargs["y"], program.example_inputs[1]["y"])
    assert_same_outputs(make_program(), loaded, (torch.randn(2, 4),), {"y": torch.randn(2, 2)})


def test_loaded_meta_vals_are_fake_tensors(saved: bytes) -> None:
    from exportir.export.capture.fake import FakeTensor

    loaded = from_bytes(saved)
    for node in loaded.graph.nodes:
        for leaf in pytree.tree_leaves(node.meta["val"]):
            assert isinstance(leaf, FakeTensor), node.name
            assert leaf.device == torch.device("cpu")


def test_save_is_deterministic(program: ExportedProgram) -> None:
    assert to_bytes(program) == to_bytes(program)


def test_path_and_pathlike_and_unseekable_stream(program: ExportedProgram, tmp_path) -> None:
    path = tmp_path / "prog.pt2"
    save(program, path)
    assert_same_program(program, load(path))
    save(program, str(path))
    assert_same_program(program, load(str(path)))

    class Stream(io.RawIOBase):
        def __init__(self, data: bytes) -> None:
            self._inner = io.BytesIO(data)

        def readable(self) -> bool:
            return True

        def seekable(self) -> bool:
            return False

        def readinto(self, b: Any) -> int:
            return self._inner.readinto(b)

    assert_same_program(program, load(Stream(path.read_bytes())))


def test_missing_path_is_file_not_found(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "nope.pt2")


def test_extra_files(program: ExportedProgram) -> None:
    data = to_bytes(program, extra_files={"notes.txt": "héllo", "blob.bin": b"\x00\xff"})
    extra: dict[str, Any] = {"notes.txt": "", "blob.bin": b""}
    from_bytes(data, extra_files=extra)
    assert extra == {"notes.txt": "héllo", "blob.bin": b"\x00\xff"}
    with pytest.raises(SerializationError, match="extra file 'other.txt' is not in this program"):
        from_bytes(data, extra_files={"other.txt": ""})
    with pytest.raises(SerializationError, match="expected str or bytes"):
        to_bytes(program, extra_files={"x": 3})


def test_tied_weights_stay_tied() -> None:
    ep = make_program(tied=True)
    loaded = from_bytes(to_bytes(ep))
    assert loaded.state_dict["tied.weight"] is loaded.state_dict["lin.weight"]
    assert isinstance(loaded.state_dict["tied.weight"], torch.nn.Parameter)


def test_opset_versions(program: ExportedProgram) -> None:
    aten_version = torch._C._get_max_operator_version()
    data = to_bytes(program, opset_version={"mylib": 3})
    from_bytes(data, expected_opset_version={"aten": aten_version, "mylib": 3, "other": 1})
    with pytest.raises(SerializationError, match="mylib opset version 3, but version 4"):
        from_bytes(data, expected_opset_version={"mylib": 4})


def test_save_rejects_non_programs() -> None:
    with pytest.raises(TypeError, match="must be an instance of 'ExportedProgram'"):
        save(object(), io.BytesIO())  # type: ignore[arg-type]  # the point of the test


def test_pickle_protocol_is_accepted_and_ignored(program: ExportedProgram) -> None:
    buf = io.BytesIO()
    save(program, buf, pickle_protocol=4)
    assert buf.getvalue() == to_bytes(program)


def _user_program(g: Graph, gm: GraphModule, inputs: dict[str, torch.Tensor],
                  outputs: list[str]) -> ExportedProgram:
    """An ExportedProgram whose placeholders are all user inputs (in ``inputs`` order)."""
    signature = ExportGraphSignature(
        [InputSpec(InputKind.USER_INPUT, TensorArgument(n), None) for n in inputs],
        [OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(n), None) for n in outputs])
    example = (tuple(inputs.values()), {})
    call_graph = [ModuleCallEntry("", ModuleCallSignature(
        [TensorArgument(n) for n in inputs], [TensorArgument(n) for n in outputs],
        pytree.tree_structure(example), pytree.tree_structure(tuple(outputs)), list(inputs)))]
    return ExportedProgram(gm, gm.graph, signature, {}, {}, call_graph, example, {})


def _branch(op: Any) -> GraphModule:
    g = Graph()
    x = g.placeholder("x_1")
    g.output((g.call_function(op, (x,)),))
    _fill_meta(g, {"x_1": fake_like(torch.randn(3))})
    return GraphModule({}, g)


def test_round_trip_cond_with_submodules() -> None:
    g = Graph()
    pred, x = g.placeholder("pred"), g.placeholder("x")
    true_gm, false_gm = g.get_attr("true_graph_0"), g.get_attr("false_graph_0")
    cond = g.call_function(torch.ops.higher_order.cond, (pred, true_gm, false_gm, (x,)))
    first = g.call_function(operator.getitem, (cond, 0))
    g.output((first,))
    gm = GraphModule({"true_graph_0": _branch(aten.sin.default),
                      "false_graph_0": _branch(aten.cos.default)}, g)
    vals = {"pred": fake_like(torch.tensor(True)), "x": fake_like(torch.randn(3)),
            "cond": (fake_like(torch.randn(3)),), "getitem": fake_like(torch.randn(3))}
    for n in g.nodes:
        if n.op == "call_function":
            n.meta.update(val=vals[n.name], stack_trace=TRACE, nn_module_stack={},
                          source_fn_stack=[("cond", torch.cond)])
        elif n.op == "placeholder":
            n.meta["val"] = vals[n.name]
    g.output_node().meta["val"] = (vals["getitem"],)
    ep = _user_program(g, gm, {"pred": torch.tensor(True), "x": torch.randn(3)}, ["getitem"])
    loaded = from_bytes(to_bytes(ep))
    assert_same_program(ep, loaded)
    assert str(loaded.graph_module.true_graph_0.graph) == str(gm.true_graph_0.graph)
    x = torch.randn(3)
    for flag in (True, False):
        assert_same_outputs(ep, loaded, (torch.tensor(flag), x), {})


@torch.library.custom_op("exportir_serde_test::scale", mutates_args=())
def _scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


@_scale.register_fake
def _scale_fake(x: torch.Tensor, factor: float) -> torch.Tensor:
    return torch.empty_like(x)


def test_round_trip_custom_op() -> None:
    g = Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.ops.exportir_serde_test.scale.default, (x, 2.5))
    g.output((y,))
    _fill_meta(g, {"x": fake_like(torch.randn(2, 3))})
    ep = _user_program(g, GraphModule({}, g), {"x": torch.randn(2, 3)}, [y.name])
    data = to_bytes(ep)
    node = next(n for n in json.loads(members(data)["program.json"])["graph_module"]["nodes"]
                if n["op"] == "call_function")
    assert node["target"] == "exportir_serde_test::scale.default"
    loaded = from_bytes(data)
    assert_same_program(ep, loaded)
    assert_same_outputs(ep, loaded, (torch.randn(2, 3),), {})


def test_range_constraints_codec() -> None:
    import sympy

    from exportir.export.serialize.program import (
        decode_range_constraints,
        encode_range_constraints,
    )
    from exportir.symbolic import ValueRanges

    ranges = {sympy.Symbol("s0", integer=True): ValueRanges(2, sympy.oo),
              sympy.Symbol("s1", integer=True): ValueRanges(-4, 16)}
    encoded = encode_range_constraints(ranges, "r")
    assert encoded == {"s0": ["2", "oo"], "s1": ["-4", "16"]}
    # format 1.0 files wrote torch's spelling of infinity
    assert decode_range_constraints({"s0": ["2", "int_oo"], "s1": ["-4", "16"]}, "r") == ranges
    assert decode_range_constraints(json.loads(json.dumps(encoded)), "r") == ranges
    with pytest.raises(SerializationError, match="r/s0: bounds"):
        decode_range_constraints({"s0": ["2", "__import__('os')"]}, "r")


# --------------------------------------------------------------------------- the format


def members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def rebuild(parts: dict[str, bytes], *, fix_manifest: bool = True) -> bytes:
    """A zip of ``parts``; with ``fix_manifest`` the manifest's sizes/digests are recomputed
    (an attacker who edits a member can always do that: checksums detect damage, not malice)."""
    parts = dict(parts)
    if fix_manifest:
        manifest = json.loads(parts["manifest.json"])
        manifest["entries"] = {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                               for n, d in parts.items() if n != "manifest.json"}
        parts["manifest.json"] = json.dumps(manifest).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in parts.items():
            zf.writestr(name, data)
    return buf.getvalue()


def edit_program(data: bytes, edit: Any) -> bytes:
    parts = members(data)
    program = json.loads(parts["program.json"])
    edit(program)
    parts["program.json"] = json.dumps(program).encode()
    return rebuild(parts)


def test_layout_of_the_archive(saved: bytes) -> None:
    parts = members(saved)
    assert list(parts) == ["manifest.json", "program.json", "weights.safetensors",
                           "constants.safetensors", "example_inputs.safetensors"]
    manifest = json.loads(parts["manifest.json"])
    assert manifest["format"] == "exportir.exported_program"
    assert manifest["version"] == [1, 1]
    assert set(manifest["producer"]) == {"exportir", "torch"}
    for name, entry in manifest["entries"].items():
        assert entry == {"size": len(parts[name]),
                         "sha256": hashlib.sha256(parts[name]).hexdigest()}
    program = json.loads(parts["program.json"])
    nodes = program["graph_module"]["nodes"]
    by_name = {n["name"]: n for n in nodes}
    assert by_name["addmm_default"]["target"] == "aten::addmm.default"
    assert by_name["getitem"]["target"] == "operator.getitem"
    assert by_name["clamp_default"]["kwargs"] == {"min": {"float": "-inf"}, "max": {"float": 0.5}}
    assert by_name["sum_dim_int_list"]["kwargs"]["dtype"] == {"dtype": "float64"}
    assert by_name["x"]["meta"]["val"] == {"fake": {
        "dtype": "float32", "shape": [2, 4], "stride": [4, 1], "storage_offset": 0,
        "device": "cpu", "requires_grad": False}}
    assert by_name["t_default"]["meta"]["source_fn_stack"] == [
        ["lin", "torch.nn.modules.linear.Linear"]]
    assert program["dialect"] == "ATEN"


def test_weights_are_safetensors(program: ExportedProgram, saved: bytes) -> None:
    safetensors = pytest.importorskip("safetensors.torch")
    weights = safetensors.load(members(saved)["weights.safetensors"])
    assert weights.keys() == program.state_dict.keys()
    for key, value in program.state_dict.items():
        assert torch.equal(weights[key], value)
    # and we read what the safetensors library writes
    ours, _ = decode_tensors(safetensors.save(dict(program.state_dict)), "w")
    assert all(torch.equal(ours[k], v) for k, v in program.state_dict.items())


@pytest.mark.parametrize("dtype", sorted(DTYPE_TO_TAG, key=str), ids=str)
def test_tensor_container_dtypes(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    base = torch.randn(3, 5) * 8
    values = {"t": base.to(dtype), "col": base.to(dtype).t(), "scalar": base[0, 0].to(dtype),
              "empty": torch.empty(0, 4, dtype=dtype)}
    out, meta = decode_tensors(encode_tensors(values, {"k": "v"}), "w")
    assert meta == {"k": "v"}
    for key, t in values.items():
        assert out[key].dtype == t.dtype and out[key].shape == t.shape
        raw = lambda v: v.contiguous().reshape(-1).view(torch.uint8)
        assert torch.equal(raw(out[key]), raw(t)), key


VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=8)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([torch.float32, torch.int8, torch.bfloat16, torch.device("cpu"),
                       torch.device("cuda", 1), torch.strided, torch.sparse_coo,
                       torch.channels_last, torch.preserve_format, Ellipsis, 1 + 2j,
                       slice(1, None, -1), aten.add.Tensor, operator.getitem]),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=4) | st.integers(), inner, max_size=3),
    max_leaves=12)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return math.copysign(1, a) == math.copysign(1, b) and a == b
    return a == b or a is b


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_value_codec_round_trips(value: Any) -> None:
    encoded = encode_value(value, "v")
    text = json.dumps(encoded, allow_nan=False)
    assert _same(Decoder({}).value(json.loads(text), "v"), value)


def test_value_codec_rejects_unknown_objects() -> None:
    with pytest.raises(SerializationError, match="v: cannot save a value of type object"):
        encode_value(object(), "v")
    with pytest.raises(SerializationError, match="v/0: target <built-in function print> cannot"):
        encode_value([print], "v")


@pytest.mark.parametrize("obj", [torch.tanh, torch.Tensor.mul, torch.nn.Linear, torch.cond,
                                 torch.nn.functional.relu, operator.add, math.floor,
                                 aten.add.Tensor, aten.add],
                         ids=lambda o: re.sub(r" at 0x[0-9a-f]+", "", repr(o)))
def test_source_fn_names_resolve_back(obj: Any) -> None:
    assert resolve_qualified(qualified_name(obj)) is obj


@pytest.mark.parametrize("text", ["os.system", "subprocess.run", "torch._dynamo.nope",
                                  "torch.nn.nope", "builtins.nope.deeper", "mylib::nope"])
def test_unresolvable_names_stay_strings(text: str) -> None:
    import sys

    before = set(sys.modules)
    assert resolve_qualified(text) == text
    assert set(sys.modules) == before  # nothing was imported


# --------------------------------------------------------------------------- hostile files


def _set_node(program: dict, name: str, key: str, value: Any) -> None:
    for node in program["graph_module"]["nodes"]:
        if node["name"] == name:
            node[key] = value
            return
    raise KeyError(name)


def _tensor_blob(header: dict, data: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + data


EDITS: dict[str, tuple[Any, str]] = {
    "unknown_aten_op": (lambda p: _set_node(p, "t_default", "target", "aten::nope.default"),
                        "unknown operator 'aten::nope.default'"),
    "unregistered_custom_op": (lambda p: _set_node(p, "t_default", "target", "mylib::foo.default"),
                               "import the module that registers it"),
    "python_callable_target": (lambda p: _set_node(p, "t_default", "target", "os.system"),
                               "unknown call target 'os.system'"),
    "dunder_target": (lambda p: _set_node(p, "t_default", "target", "aten::t.__class__"),
                      "unknown operator"),
    "code_in_node_name": (lambda p: _set_node(p, "t_default", "name", "x; import os"),
                          "is not a valid identifier"),
    "code_in_placeholder": (lambda p: _set_node(p, "x", "target", "x=__import__('os')"),
                            "is not a valid identifier"),
    "keyword_name": (lambda p: _set_node(p, "t_default", "name", "lambda"),
                     "is not a valid identifier"),
    "code_in_kwarg_name": (lambda p: _set_node(p, "clamp_default", "kwargs",
                                               {"min=1)#": {"int": 1}}),
                           "is not a valid identifier"),
    "unknown_op_kind": (lambda p: _set_node(p, "t_default", "op", "call_module"),
                        "unknown op 'call_module'"),
    "forward_reference": (lambda p: _set_node(p, "t_default", "args", [{"node": "getitem"}]),
                          "not defined before this node"),
    "unknown_value_tag": (lambda p: _set_node(p, "t_default", "args", [{"pickle": "x"}]),
                          "unknown value tag 'pickle'"),
    "two_tags": (lambda p: _set_node(p, "t_default", "args", [{"int": 1, "str": "a"}]),
                 "one-key object"),
    "bad_float": (lambda p: _set_node(p, "t_default", "args", [{"float": "1e400x"}]),
                  "expected a number"),
    "unknown_dtype": (lambda p: _set_node(p, "sum_dim_int_list", "kwargs",
                                          {"dtype": {"dtype": "float128"}}), "unknown dtype"),
    "unknown_meta": (lambda p: _set_node(p, "t_default", "meta", {"evil": 1}),
                     "unknown metadata key"),
    "fake_with_huge_rank": (lambda p: _set_node(p, "x", "meta", {"val": {"fake": {
        "dtype": "float32", "shape": [1] * 100, "stride": [1] * 100, "storage_offset": 0,
        "device": "cpu", "requires_grad": False}}}), "rank 100 exceeds 64"),
    "fake_negative_dim": (lambda p: _set_node(p, "x", "meta", {"val": {"fake": {
        "dtype": "float32", "shape": [-2, 4], "stride": [4, 1], "storage_offset": 0,
        "device": "cpu", "requires_grad": False}}}), "do not describe a tensor"),
    "fake_bad_device": (lambda p: _set_node(p, "x", "meta", {"val": {"fake": {
        "dtype": "float32", "shape": [2, 4], "stride": [4, 1], "storage_offset": 0,
        "device": "warp_drive", "requires_grad": False}}}), "bad device"),
    "meta_shape_differs_from_weight": (lambda p: _set_node(p, "p_weight", "meta", {"val": {
        "fake": {"dtype": "float32", "shape": [4, 3], "stride": [3, 1], "storage_offset": 0,
                 "device": "cpu", "requires_grad": True}}}),
        "tensor is \\[3, 4\\] torch.float32 on cpu, but placeholder 'p_weight' declares \\[4, 3\\]"),
    "two_outputs": (lambda p: p["graph_module"]["nodes"].insert(0, {
        "name": "output0", "op": "output", "target": "output", "args": [{"none": None}],
        "kwargs": {}}), "exactly one output node"),
    "duplicate_name": (lambda p: _set_node(p, "t_default", "name", "x"), "duplicate node name"),
    "missing_field": (lambda p: p.pop("signature"), "missing field\\(s\\) \\['signature'\\]"),
    "unknown_field": (lambda p: p.update(surprise=1), "unknown field\\(s\\) \\['surprise'\\]"),
    "bad_kind": (lambda p: p["signature"]["input_specs"][0].update(kind="WEIGHT"),
                 "unknown InputKind 'WEIGHT'"),
    "signature_mismatch": (lambda p: p["signature"]["input_specs"][0]["arg"].update(
        tensor="nobody"), "not valid Export IR"),
    "missing_weight_info": (lambda p: p["state_dict"].pop("count"),
                            "missing \\[\\], unexpected \\['count'\\]"),
    "bad_alias": (lambda p: p["state_dict"]["count"].update(alias_of="ghost"),
                  "'ghost' is not an earlier stored tensor"),
    "evil_defaultdict_factory": (lambda p: p["module_call_graph"][0]["signature"].update(
        out_spec=json.dumps([1, {"type": "collections.defaultdict", "context": {
            "default_factory_module": "os", "default_factory_name": "system",
            "dict_context": []}, "children_spec": []}])),
        "defaultdict factory .* is not allowed"),
    "lazy_import_defaultdict_factory": (lambda p: p["module_call_graph"][0]["signature"].update(
        out_spec=json.dumps([1, {"type": "collections.defaultdict", "context": {
            "default_factory_module": "torch", "default_factory_name": "_dynamo",
            "dict_context": []}, "children_spec": []}])),
        "defaultdict factory .* is not allowed"),
    "lazy_import_enum": (lambda p: p["module_call_graph"][0]["signature"].update(
        out_spec=json.dumps([1, {"type": "builtins.dict", "context": json.dumps(
            [{"__enum__": True, "fqn": "torch:onnx", "name": "X"}]),
            "children_spec": [{"type": None, "context": None, "children_spec": []}]}])),
        # (if torch.onnx happens to be imported already, the name lookup fails later)
        "enum torch:onnx is not an already-imported class|Unable to deserialize context"),
    "bad_treespec": (lambda p: p["module_call_graph"][0]["signature"].update(in_spec="[9, {}]"),
                     "bad TreeSpec"),
    "unknown_dialect": (lambda p: p.update(dialect="MARTIAN"), "no verifier is registered"),
    "get_attr_unknown_submodule": (lambda p: _set_node(p, "t_default", "op", "get_attr"),
                                   "get_attr|not a valid identifier"),
    "deep_nesting": (lambda p: _set_node(p, "t_default", "args", [
        json.loads('{"list":[' * 300 + "]}" * 300)]), "nested deeper than 256"),
}


@pytest.mark.parametrize("case", sorted(EDITS))
def test_tampered_program_json(saved: bytes, case: str) -> None:
    import sys

    edit, message = EDITS[case]
    before = set(sys.modules)
    with pytest.raises(SerializationError, match=message):
        from_bytes(edit_program(saved, edit))
    imported = {m for m in set(sys.modules) - before if not m.startswith("encodings.")}
    assert not imported, "loading a file must not import anything (zip name codecs aside)"


def test_flipped_byte_fails_checksum(saved: bytes) -> None:
    data = bytearray(saved)
    start = data.index(b'"graph_module"')
    data[start + 40] ^= 0x01
    with pytest.raises(SerializationError, match="program.json"):
        from_bytes(bytes(data))


def test_checksum_mismatch_is_reported(saved: bytes) -> None:
    parts = members(saved)
    parts["program.json"] = parts["program.json"].replace(b"aten::t.default", b"aten::t.defaulT")
    with pytest.raises(SerializationError, match="program.json: SHA-256 does not match"):
        from_bytes(rebuild(parts, fix_manifest=False))


@pytest.mark.parametrize("cut", [0, 1, 4, 22, 100, 1000, -1000, -100, -22, -1])
def test_truncated_file(saved: bytes, cut: int) -> None:
    with pytest.raises(SerializationError):
        from_bytes(saved[:cut])


def test_not_a_zip() -> None:
    with pytest.raises(SerializationError, match="not a readable zip file"):
        from_bytes(b"\x80\x02}q\x00." * 10)  # a pickle is not a program


MANIFEST_EDITS: dict[str, tuple[Any, str]] = {
    "major_version": (lambda m: m.update(version=[2, 0]), "format version 2.0 is not supported"),
    "newer_minor": (lambda m: m.update(version=[1, 99]), "format version 1.99 is not supported"),
    "other_format": (lambda m: m.update(format="pt2"), "'pt2' is not an exportir program"),
    "missing_entry": (lambda m: m["entries"].pop("weights.safetensors"),
                      "weights.safetensors: missing from the manifest"),
    "oversize_claim": (lambda m: m["entries"]["program.json"].update(size=2**39),
                       "the manifest says 549755813888"),
    "bad_digest": (lambda m: m["entries"]["program.json"].update(sha256="00"),
                   "expected 64 hex digits"),
}


@pytest.mark.parametrize("case", sorted(MANIFEST_EDITS))
def test_tampered_manifest(saved: bytes, case: str) -> None:
    edit, message = MANIFEST_EDITS[case]
    parts = members(saved)
    manifest = json.loads(parts["manifest.json"])
    edit(manifest)
    parts["manifest.json"] = json.dumps(manifest).encode()
    with pytest.raises(SerializationError, match=message):
        from_bytes(rebuild(parts, fix_manifest=False))


WEIGHT_EDITS: dict[str, tuple[bytes, str]] = {
    "empty": (b"", "truncated"),
    "header_too_long": (struct.pack("<Q", 2**62), "exceeds 104857600"),
    "header_past_end": (struct.pack("<Q", 1000) + b"{}", "runs past the end"),
    "huge_shape_claim": (_tensor_blob({
        "lin.weight": {"dtype": "F32", "shape": [2**40, 2**20], "data_offsets": [0, 48]},
        "lin.bias": {"dtype": "F32", "shape": [3], "data_offsets": [48, 60]},
        "count": {"dtype": "F32", "shape": [3], "data_offsets": [60, 72]}}, bytes(72)),
        "needs 4611686018427387904"),
    "overlap": (_tensor_blob({
        "lin.weight": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]},
        "lin.bias": {"dtype": "F32", "shape": [3], "data_offsets": [40, 52]},
        "count": {"dtype": "F32", "shape": [3], "data_offsets": [52, 64]}}, bytes(64)),
        "overlaps the previous tensor"),
    "hole": (_tensor_blob({
        "lin.weight": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]},
        "lin.bias": {"dtype": "F32", "shape": [3], "data_offsets": [52, 64]},
        "count": {"dtype": "F32", "shape": [3], "data_offsets": [64, 76]}}, bytes(76)),
        "leaves a hole"),
    "missing_tensor": (_tensor_blob({
        "lin.weight": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]},
        "lin.bias": {"dtype": "F32", "shape": [3], "data_offsets": [48, 60]}}, bytes(60)),
        "missing \\['count'\\]"),
    "shape_mismatch": (_tensor_blob({
        "lin.weight": {"dtype": "F32", "shape": [4, 3], "data_offsets": [0, 48]},
        "lin.bias": {"dtype": "F32", "shape": [3], "data_offsets": [48, 60]},
        "count": {"dtype": "F32", "shape": [3], "data_offsets": [60, 72]}}, bytes(72)),
        "placeholder 'p_weight' declares \\[3, 4\\]"),
    "unknown_dtype": (_tensor_blob({
        "lin.weight": {"dtype": "F128", "shape": [3, 4], "data_offsets": [0, 48]}}, bytes(48)),
        "unknown dtype 'F128'"),
    "trailing_bytes": (_tensor_blob({
        "lin.weight": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]},
        "lin.bias": {"dtype": "F32", "shape": [3], "data_offsets": [48, 60]},
        "count": {"dtype": "F32", "shape": [3], "data_offsets": [60, 72]}}, bytes(80)),
        "data buffer is 80 bytes but tensors cover 72"),
}


@pytest.mark.parametrize("case", sorted(WEIGHT_EDITS))
def test_tampered_weights(saved: bytes, case: str) -> None:
    blob, message = WEIGHT_EDITS[case]
    parts = members(saved)
    parts["weights.safetensors"] = blob
    with pytest.raises(SerializationError, match=message):
        from_bytes(rebuild(parts))


def test_deflate_bomb_claim_is_rejected(saved: bytes) -> None:
    parts = members(saved)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in parts.items():
            zf.writestr(name, data)
    data = bytearray(buf.getvalue())
    # Patch the central directory's uncompressed size of program.json to 3 GiB.
    cd = data.index(b"PK\x01\x02")
    while True:
        name_len = struct.unpack_from("<H", data, cd + 28)[0]
        name = bytes(data[cd + 46:cd + 46 + name_len])
        if name == b"program.json":
            struct.pack_into("<I", data, cd + 24, 3 << 30)
            break
        extra_len, comment_len = struct.unpack_from("<HH", data, cd + 30)
        cd += 46 + name_len + extra_len + comment_len
    with pytest.raises(SerializationError, match="program.json"):
        from_bytes(bytes(data))


def test_save_errors_name_the_node() -> None:
    ep = make_program()
    node = next(n for n in ep.graph.nodes if n.name == "t_default")
    node.target = lambda x: x  # not an operator
    with pytest.raises(SerializationError, match="nodes/6/target: target <function"):
        to_bytes(ep)


def test_save_rejects_symbolic_and_tensor_args() -> None:
    ep = make_program()
    node = next(n for n in ep.graph.nodes if n.name == "add_tensor")
    node.args = (node.args[0], torch.ones(1))
    with pytest.raises(SerializationError, match="tensor constant inside node arguments"):
        to_bytes(ep)


# --------------------------------------------------------------------------- fuzzing


def _load_or_serialization_error(data: bytes) -> None:
    start = time.perf_counter()
    try:
        from_bytes(data)
    except SerializationError:
        pass
    assert time.perf_counter() - start < 5.0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_mutated_bytes(saved: bytes, data: st.DataObject) -> None:
    blob = bytearray(saved)
    for _ in range(data.draw(st.integers(1, 8))):
        action = data.draw(st.sampled_from(["flip", "set", "cut", "insert", "delete"]))
        pos = data.draw(st.integers(0, max(len(blob) - 1, 0)))
        if action == "flip" and blob:
            blob[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "set" and blob:
            blob[pos] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del blob[pos:]
        elif action == "insert":
            blob[pos:pos] = data.draw(st.binary(min_size=1, max_size=16))
        elif blob:
            del blob[pos:pos + data.draw(st.integers(1, 64))]
    _load_or_serialization_error(bytes(blob))


JSON_LEAVES = (st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.floats(
    allow_nan=False) | st.text(max_size=12) | st.sampled_from(
    ["aten::add.Tensor", "operator.getitem", "x", "output", "float32", "cpu", "USER_INPUT",
     "-inf", "tensor", "node", "fake", "[1, {}]"]))
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                           max_leaves=8)


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_structured_program_json(saved: bytes, data: st.DataObject) -> None:
    parts = members(saved)
    program = json.loads(parts["program.json"])
    paths = _paths(program)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        if not path:
            continue
        holder = program
        try:
            for key in path[:-1]:
                holder = holder[key]
            if data.draw(st.booleans()) and isinstance(holder, (dict, list)):
                del holder[path[-1]]
            else:
                holder[path[-1]] = data.draw(JSON_VALUES)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed this path
    parts["program.json"] = json.dumps(program).encode()
    _load_or_serialization_error(rebuild(parts))


COMPAT_DIR = Path(__file__).resolve().parents[1] / "compat"
COMPAT_FILES = {"1.0": COMPAT_DIR / "exported_program_1_0.pt2"}


def write_compat_file(path: Path) -> None:
    """The hand-built program plus, as extra files, what loading it must give: the printed
    signature and the outputs of ``module()`` on the stored example inputs."""
    ep = make_program()
    args, kwargs = ep.example_inputs
    outputs = pytree.tree_leaves(make_program().module()(*args, **kwargs))
    expected = encode_tensors({str(i): t.detach() for i, t in enumerate(outputs)})
    save(ep, path, extra_files={"expected_signature.txt": str(ep.graph_signature),
                                "expected_outputs.safetensors": expected})


@pytest.mark.parametrize("version", sorted(COMPAT_FILES))
def test_released_format_versions_still_load(version: str) -> None:
    extra: dict[str, Any] = {"expected_signature.txt": "", "expected_outputs.safetensors": b""}
    ep = load(COMPAT_FILES[version], extra_files=extra)
    assert str(ep.graph_signature) == extra["expected_signature.txt"]
    expected, _ = decode_tensors(extra["expected_outputs.safetensors"], "expected")
    args, kwargs = ep.example_inputs
    got = pytree.tree_leaves(ep.module()(*args, **kwargs))
    assert len(got) == len(expected)
    for i, t in enumerate(got):
        # recorded on another CPU: float kernels round differently across instruction sets
        torch.testing.assert_close(t, expected[str(i)], rtol=1e-5, atol=1e-6, msg=str(i))


# --------------------------------------------------------------------------- exported models


def _corpus() -> list[Any]:
    try:
        from corpus import export_models as em
    except ImportError:
        return []
    return em.ENTRIES


@pytest.mark.parametrize("entry", _corpus(), ids=lambda e: e.name)
def test_round_trip_exported_corpus(entry: Any) -> None:
    from corpus import export_harness as h
    from corpus import export_models as em

    module, args, kwargs = em.build(entry)
    ep = h.ours().export(module, args, kwargs)
    loaded = from_bytes(to_bytes(ep))
    assert_same_program(ep, loaded)
    fresh_args, fresh_kwargs = em.fresh_inputs(args, kwargs, seed=1)
    expected = ep.module()(*em.clone_inputs(fresh_args, fresh_kwargs)[0],
                           **em.clone_inputs(fresh_args, fresh_kwargs)[1])
    got = loaded.module()(*em.clone_inputs(fresh_args, fresh_kwargs)[0],
                          **em.clone_inputs(fresh_args, fresh_kwargs)[1])
    flat_e, flat_g = pytree.tree_leaves(expected), pytree.tree_leaves(got)
    assert len(flat_e) == len(flat_g)
    for a, b in zip(flat_e, flat_g, strict=True):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


if __name__ == "__main__":
    # Write the compatibility file of the current format version (only when releasing one:
    # files of released versions are never regenerated).
    import sys

    write_compat_file(Path(sys.argv[1]))
