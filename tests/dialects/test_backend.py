"""The Backend dialect: spec value types, the backend registry, the delegate-call op,
LoweredBackendModule, to_backend with a test backend, and one failing case per BackendVerifier
rule."""

from __future__ import annotations

import copy
import operator
import pickle
from typing import ClassVar

import pytest
import torch
from torch._ops import HigherOrderOperator

from exportir.dialects.backend import (
    DELEGATION_TAG,
    BackendDetails,
    BackendRegistry,
    BackendVerifier,
    CompileSpec,
    DelegationSpec,
    LoweredBackendModule,
    Partitioner,
    PartitionResult,
    PreprocessResult,
    default_backend_registry,
    executorch_call_delegate,
)
from exportir.export import export
from exportir.export.program.verifier import SpecViolationError
from exportir.passes.to_backend import to_backend
from exportir.program.manager import to_edge


class AddMul(torch.nn.Module):
    def forward(self, x, y):
        a = x + y
        b = a * y
        return torch.sin(b) + a


def _edge():
    args = (torch.randn(3, 4), torch.randn(3, 4))
    return to_edge(export(AddMul(), args)).exported_program(), args


class RecordingBackend(BackendDetails):
    """A test backend without a runtime: lowered modules run their original program."""

    seen: ClassVar[list] = []

    @classmethod
    def preprocess(cls, edge_program, compile_specs):
        ops = [n.target.__name__ for n in edge_program.graph.nodes if n.op == "call_function"]
        cls.seen.append((ops, list(compile_specs)))
        return PreprocessResult(",".join(ops).encode())


class AddMulPartitioner(Partitioner):
    """Claims ``a = x + y`` and ``b = a * y`` (or everything but sin, which has a cycle)."""

    claim = ("add", "mul")

    def partition(self, exported_program):
        for node in exported_program.graph.nodes:
            if node.op == "call_function" and node.name in self.claim:
                node.meta[DELEGATION_TAG] = "tag0"
        spec = DelegationSpec("RecordingBackend", [CompileSpec("k", b"v")])
        return PartitionResult(exported_program, {"tag0": spec})


# ------------------------------------------------------------------------------ value types


def test_specs_validate_their_fields():
    assert CompileSpec("k", bytearray(b"x")).value == b"x"
    with pytest.raises(TypeError, match="must be bytes"):
        CompileSpec("k", "text")
    with pytest.raises(TypeError, match="non-empty"):
        DelegationSpec("", [])
    spec = DelegationSpec("B", [CompileSpec("a", b"1")])
    assert spec.compile_specs == (CompileSpec("a", b"1"),)
    with pytest.raises(TypeError, match="DelegationSpec"):
        PartitionResult(None, {"tag0": "B"})
    with pytest.raises(TypeError, match="bytes"):
        PreprocessResult("blob")


def test_registry_finds_backends_by_id_and_names_the_way_out():
    assert "RecordingBackend" in default_backend_registry()
    registry = BackendRegistry([RecordingBackend])
    assert registry.get("RecordingBackend") is RecordingBackend
    with pytest.raises(KeyError, match="no backend 'Nope'.*registry=BackendRegistry"):
        registry.get("Nope")
    with pytest.raises(TypeError, match="BackendDetails subclass"):
        registry.register(object)


# ------------------------------------------------------------------------------ the op


def test_delegate_op_is_a_private_higher_order_operator():
    assert isinstance(executorch_call_delegate, HigherOrderOperator)
    assert str(executorch_call_delegate) == "executorch_call_delegate"
    # not added to torch's process-global torch.ops.higher_order table
    assert torch._ops._higher_order_ops.get("executorch_call_delegate") is not (
        executorch_call_delegate
    )
    assert copy.deepcopy(executorch_call_delegate) is executorch_call_delegate
    assert pickle.loads(pickle.dumps(executorch_call_delegate)) is executorch_call_delegate
    with pytest.raises(TypeError, match="LoweredBackendModule"):
        executorch_call_delegate(torch.nn.Identity(), torch.ones(1))


# ------------------------------------------------------------------------------ to_backend


def test_partitioned_program_has_the_delegate_graph_form_and_runs():
    ep, args = _edge()
    RecordingBackend.seen.clear()
    lowered = to_backend(ep, AddMulPartitioner())
    text = str(lowered.graph)
    assert "get_attr[target=lowered_module_0]" in text
    assert "executorch_call_delegate](args = (%lowered_module_0, %x, %y)" in text
    calls = [n for n in lowered.graph.nodes if n.op == "call_function"]
    names = [getattr(n.target, "__name__", "") for n in calls]
    assert names == [
        "executorch_call_delegate",
        "getitem",
        "getitem",
        "aten.sin.default",
        "aten.add.Tensor",
    ]
    ((ops, specs),) = RecordingBackend.seen
    assert ops == ["aten.add.Tensor", "aten.mul.Tensor"]
    assert specs == [CompileSpec("k", b"v")]
    assert lowered.verifiers == [BackendVerifier]
    module = lowered.graph_module.lowered_module_0
    assert module.backend_id == "RecordingBackend"
    assert module.processed_bytes == b"aten.add.Tensor,aten.mul.Tensor"
    torch.testing.assert_close(lowered.module()(*args), AddMul()(*args))
    # the input program is untouched
    assert not any(n.meta.get(DELEGATION_TAG) for n in ep.graph.nodes)
    assert "executorch_call_delegate" not in str(ep.graph)


def test_whole_program_lowering_returns_a_callable_lowered_module():
    ep, args = _edge()
    lowered = to_backend("RecordingBackend", ep, [])
    assert isinstance(lowered, LoweredBackendModule)
    assert lowered.original_module is ep
    (out,) = lowered(*args)
    torch.testing.assert_close(out, AddMul()(*args))
    # deep copies keep the blob and drop the runtime handle
    clone = copy.deepcopy(lowered)
    assert clone.processed_bytes == lowered.processed_bytes
    (again,) = clone(*args)
    torch.testing.assert_close(again, out)


def test_a_partition_with_a_cycle_is_refused_with_the_path():
    class Greedy(AddMulPartitioner):
        claim = ("add", "mul", "add_1")

    ep, _ = _edge()
    with pytest.raises(ValueError, match="the path mul -> sin -> add_1 leaves the partition"):
        to_backend(ep, Greedy())


def test_partitioner_must_map_every_tag():
    class Forgetful(AddMulPartitioner):
        def partition(self, exported_program):
            result = super().partition(exported_program)
            return PartitionResult(result.tagged_exported_program, {})

    ep, _ = _edge()
    with pytest.raises(ValueError, match=r"tagged nodes with \['tag0'\]"):
        to_backend(ep, Forgetful())


def test_unknown_backend_id_is_reported():
    ep, _ = _edge()
    with pytest.raises(KeyError, match="no backend 'Missing'"):
        to_backend("Missing", ep, [])


def test_empty_partition_leaves_the_program_alone():
    class Nothing(Partitioner):
        def partition(self, exported_program):
            return PartitionResult(exported_program, {})

    ep, _ = _edge()
    assert to_backend(ep, Nothing()) is ep


# ------------------------------------------------------------------------------ verifier


def _delegated():
    ep, _ = _edge()
    return to_backend(ep, AddMulPartitioner())


def _reverify(ep):
    BackendVerifier().check(ep)


def test_verifier_accepts_to_backend_output():
    _reverify(_delegated())


def test_verifier_rejects_a_delegate_result_used_without_getitem():
    ep = _delegated()
    graph = ep.graph
    call = next(n for n in graph.nodes if n.target is executorch_call_delegate)
    with graph.inserting_after(call):
        bad = graph.call_function(operator.add, (call, call))
    bad.meta.update(call.meta)
    with pytest.raises(SpecViolationError, match="may only be indexed with operator.getitem"):
        _reverify(ep)


def test_verifier_rejects_a_wrong_argument_count():
    ep = _delegated()
    call = next(n for n in ep.graph.nodes if n.target is executorch_call_delegate)
    call.args = call.args[:-1]
    with pytest.raises(SpecViolationError, match="passes 1 values; the lowered RecordingBackend"):
        _reverify(ep)


def test_verifier_rejects_a_lowered_module_read_by_another_node():
    ep = _delegated()
    graph = ep.graph
    attr = next(n for n in graph.nodes if n.op == "get_attr")
    with graph.inserting_after(attr):
        bad = graph.call_function(operator.getitem, (attr, 0))
    bad.meta.update({"val": None, "stack_trace": "", "nn_module_stack": {}})
    with pytest.raises(SpecViolationError, match="only executorch_call_delegate may take"):
        _reverify(ep)


def test_verifier_rejects_a_delegate_call_without_a_lowered_module():
    ep = _delegated()
    call = next(n for n in ep.graph.nodes if n.target is executorch_call_delegate)
    x = next(n for n in ep.graph.nodes if n.op == "placeholder")
    call.args = (x, *call.args[1:])
    with pytest.raises(SpecViolationError, match="get_attr of a LoweredBackendModule"):
        _reverify(ep)


def test_verifier_rejects_a_delegate_val_that_is_not_a_tuple():
    ep = _delegated()
    call = next(n for n in ep.graph.nodes if n.target is executorch_call_delegate)
    call.meta["val"] = call.meta["val"][0]
    with pytest.raises(SpecViolationError, match="tuple of its outputs"):
        _reverify(ep)
