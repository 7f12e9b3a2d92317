"""Delegated programs on the whole road: export -> to_edge -> to_backend(FusedCpuPartitioner())
-> to_program -> bytes -> runtime Program.load -> run, compared with eager (twice, so state
kept across calls is checked too), and with the delegated graph module run in Python."""

from __future__ import annotations

import pytest
import torch
from corpus.export_models import BY_NAME, ENTRIES, build

from exportir import pytree
from exportir.backends.fused_cpu import FusedCpuPartitioner
from exportir.backends.fused_cpu.runtime import BACKEND_ID, FusedCpuRuntime
from exportir.dialects.backend import executorch_call_delegate
from exportir.export import export
from exportir.format import schema
from exportir.program.manager import to_edge
from exportir.program.transform_and_lower import to_edge_transform_and_lower
from exportir.runtime import (
    DelegateRegistry,
    MissingBackendError,
    Program,
    default_delegate_registry,
)

MODELS = [
    "mlp",
    "resnet_tiny",
    "transformer_encoder_layer",
    "softmax_log_softmax",
    "norm_zoo",
    "buffer_inplace",
    "hand_attention",
]


def _registry():
    registry = default_delegate_registry()
    if BACKEND_ID not in registry:
        registry.register(BACKEND_ID, FusedCpuRuntime())
    return registry


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _assert_same(got, expected) -> None:
    got_t, expected_t = _tensors(got), _tensors(expected)
    assert len(got_t) == len(expected_t)
    for g, e in zip(got_t, expected_t):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_delegated_corpus_model_runs_like_eager(name):
    module, args, kwargs = build(BY_NAME[name])
    delegated = to_edge(export(module, args, kwargs)).to_backend(FusedCpuPartitioner())
    ep = delegated.exported_program()
    assert any(n.target is executorch_call_delegate for n in ep.graph.nodes), name

    # in Python: the lowered modules run their blobs with the runtime's executor
    eager, args_e, kwargs_e = build(BY_NAME[name])
    _, args_py, kwargs_py = build(BY_NAME[name])
    _assert_same(ep.module()(*args_py, **kwargs_py), eager(*args_e, **kwargs_e))

    # in the runtime, from program bytes
    manager = delegated.to_program()
    assert any(
        isinstance(i, schema.DelegateCall) for m in manager.program.methods for i in m.instructions
    )
    method = Program.load(manager.buffer, delegates=_registry()).method("forward")
    eager, args_e, kwargs_e = build(BY_NAME[name])
    _, args_rt, kwargs_rt = build(BY_NAME[name])
    for _ in range(2):
        _assert_same(method(*args_rt, **kwargs_rt), eager(*args_e, **kwargs_e))


def test_owned_constants_program_is_smaller_in_the_parent_and_runs():
    module, args, kwargs = build(BY_NAME["mlp"])
    edge = to_edge(export(module, args, kwargs))
    delegated = edge.to_backend(FusedCpuPartitioner(own_constants=True))
    program = delegated.to_program().program
    assert program.constants == () or all(c.nbytes == 0 for c in program.constants)
    method = Program.load(delegated.to_program().buffer, delegates=_registry()).method("forward")
    _assert_same(method(*args, **kwargs), module(*args, **kwargs))


def test_missing_backend_at_load_names_the_way_out():
    module, args, kwargs = build(BY_NAME["mlp"])
    data = to_edge(export(module, args, kwargs)).to_backend(FusedCpuPartitioner()).to_program()
    assert BACKEND_ID in default_delegate_registry()  # shipped: loads with the defaults
    Program.load(data.buffer).method("forward")(*args, **kwargs)
    with pytest.raises(MissingBackendError, match=f"{BACKEND_ID}.*default registry"):
        Program.load(data.buffer, delegates=DelegateRegistry())  # a registry without it


LATENCY_MODELS = sorted(e.name for e in ENTRIES if {"conv", "attention"} & set(e.tags))


@pytest.mark.parametrize("name", LATENCY_MODELS)
def test_conv_and_attention_models_are_one_delegate_call(name):
    """to_edge_transform_and_lower with the fused partitioner: the whole model is one delegate
    call (only state write-backs stay in the runtime), and it runs like eager."""
    module, args, kwargs = build(BY_NAME[name])
    edge = to_edge_transform_and_lower(
        export(module, args, kwargs), partitioner=[FusedCpuPartitioner()]
    )
    manager = edge.to_program()
    (method_schema,) = manager.program.methods
    kinds = {type(i).__name__ for i in method_schema.instructions}
    delegates = [i for i in method_schema.instructions if isinstance(i, schema.DelegateCall)]
    assert len(delegates) == 1 and kinds <= {"DelegateCall", "MoveCall"}, kinds
    method = Program.load(manager.buffer).method("forward")
    eager, args_e, kwargs_e = build(BY_NAME[name])
    _, args_rt, kwargs_rt = build(BY_NAME[name])
    for _ in range(2):
        with torch.no_grad():
            expected = eager(*args_e, **kwargs_e)
        _assert_same(method(*args_rt, **kwargs_rt), expected)
