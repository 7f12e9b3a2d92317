"""``to_edge`` and ``EdgeProgramManager``: the seed 001 example, numerics over corpus models,
multiple methods, constant methods, preserve_ops / exception lists, and the conversions
(views -> view_copy, scalars -> lifted tensors, ATen -> edge ops)."""

from __future__ import annotations

import pytest
import torch
from corpus.export_models import BY_NAME, build
from torch import nn

from exportir import pytree
from exportir.dialects.edge.ops import EdgeOpOverload, ops
from exportir.export.program.verifier import SpecViolationError

# A dozen small corpus models across families (conv, norm, attention, rnn, pytree, mutation).
NUMERIC_MODELS = [
    "mlp", "mlp_layernorm_dropout_eval", "tied_weights", "cnn_bn_eval", "resnet_tiny",
    "conv_transpose", "upsample", "depthwise_conv1d_groupnorm", "lstm", "embedding_mha",
    "sdpa_attention", "gpt_kv_cache", "dict_io", "buffer_inplace", "indexing_ops",
    "int_and_bool_ops", "elementwise_zoo", "view_ops",
]  # fmt: skip


def _export(model, args, kwargs=None):
    from exportir.export import export

    return export(model, args, kwargs or {})


def _to_edge(*a, **kw):
    from exportir.program.manager import to_edge

    return to_edge(*a, **kw)


def _run(ep, args, kwargs=None):
    """Run the edge program's graph module on real inputs; user outputs only."""
    flat = ep._graph_module_flat_inputs(args, kwargs or {})
    out = ep.graph_module(*flat)
    n_mut = sum(1 for s in ep.graph_signature.output_specs if s.kind.name != "USER_OUTPUT")
    return list(out[n_mut:])


def _call_targets(ep):
    return [n.target for n in ep.graph.nodes if n.op == "call_function"]


# ---------------------------------------------------------------------------- the seed example


def test_seed_001_edge_example_runs(capsys):
    class MyModule(nn.Module):
        def forward(self, x):
            return torch.sigmoid(x @ x) + 1

    a = MyModule()
    tracing_inputs = (torch.rand(2, 2),)
    aten_dialect_program = _export(a, tracing_inputs)
    edge_dialect_program = _to_edge(aten_dialect_program)
    print(edge_dialect_program.exported_program())
    printed = capsys.readouterr().out
    assert printed.startswith("ExportedProgram:")
    assert "exportir_dialects_edge_ops_aten_sigmoid_default" in printed
    x = torch.rand(2, 2)
    (got,) = _run(edge_dialect_program.exported_program(), (x,))
    torch.testing.assert_close(got, a(x))


# ---------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("name", NUMERIC_MODELS)
def test_to_edge_keeps_numerics(name):
    module, args, kwargs = build(BY_NAME[name])
    edge = _to_edge(_export(module, args, kwargs)).exported_program()
    assert edge.dialect == "EDGE"
    assert all(
        isinstance(t, EdgeOpOverload)
        or not isinstance(t, torch._ops.OpOverload)
        or "sym_" in str(t)
        for t in _call_targets(edge)
    )
    fresh, args2, kwargs2 = build(BY_NAME[name])
    expected = [
        t for t in pytree.tree_leaves(fresh(*args2, **kwargs2)) if isinstance(t, torch.Tensor)
    ]
    _, args3, kwargs3 = build(BY_NAME[name])
    got = [t for t in _run(edge, args3, kwargs3) if isinstance(t, torch.Tensor)]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------- conversions


class ScaleView(nn.Module):
    def forward(self, x):
        y = x.view(-1) * 2 + 1.5
        return y.unsqueeze(0).permute(1, 0), torch.where(x > 0, x, 0.0)


def test_conversions_views_scalars_edge_ops():
    edge = _to_edge(_export(ScaleView(), (torch.randn(2, 3),))).exported_program()
    names = {str(t.__name__) for t in _call_targets(edge) if isinstance(t, EdgeOpOverload)}
    assert {
        "aten.view_copy.default",
        "aten.unsqueeze_copy.default",
        "aten.permute_copy.default",
    } <= names
    assert not any(n.split(".")[1] in ("view", "unsqueeze", "permute") for n in names)
    consts = edge.graph_signature.lifted_tensor_constants
    assert len(consts) == 2  # 2 -> int64, 1.5 -> float32 (gt.Scalar keeps its Scalar 0)
    values = sorted((str(edge.constants[c].dtype), edge.constants[c].item()) for c in consts)
    assert ("torch.int64", 2) in values and ("torch.float32", 1.5) in values
    specs = [s.kind.name for s in edge.graph_signature.input_specs]
    assert specs == ["CONSTANT_TENSOR"] * 2 + ["USER_INPUT"]
    x = torch.randn(2, 3)
    for g, e in zip(_run(edge, (x,)), ScaleView()(x)):
        torch.testing.assert_close(g, e)


def test_scalar_constants_are_shared_and_the_aten_program_is_untouched():
    class Twice(nn.Module):
        def forward(self, x, y):
            return x * 2, y * 2

    ep = _export(Twice(), (torch.randn(2), torch.randn(2)))
    before = str(ep)
    edge = _to_edge(ep).exported_program()
    assert len(edge.graph_signature.lifted_tensor_constants) == 1
    assert str(ep) == before


# ---------------------------------------------------------------------------- manager API


def test_multiple_methods_and_constant_methods():
    class A(nn.Module):
        def forward(self, x):
            return x.sin()

    class B(nn.Module):
        def forward(self, x):
            return x.relu() * 3

    x = torch.randn(4)
    manager = _to_edge(
        {"forward": _export(A(), (x,)), "other": _export(B(), (x,))},
        constant_methods={"get_version": 3},
    )
    assert manager.methods == {"forward", "other"}
    assert manager.config_methods == {"get_version"}
    (got,) = _run(manager.exported_program("other"), (x,))
    torch.testing.assert_close(got, B()(x))
    (got,) = _run(manager.exported_program(), (x,))
    torch.testing.assert_close(got, A()(x))
    with pytest.raises(KeyError, match="no method 'missing'.*forward.*other"):
        manager.exported_program("missing")


def test_to_edge_rejects_non_programs():
    with pytest.raises(TypeError, match="ExportedProgram"):
        _to_edge(nn.Linear(2, 2))


def test_transform_runs_graph_passes_and_keeps_the_original():
    from exportir.fx.passes.infra.pass_base import PassResult

    manager = _to_edge(_export(ScaleView(), (torch.randn(2, 3),)))

    def sin_to_cos(gm):
        for node in gm.graph.nodes:
            if node.target is ops.edge.aten.add.Tensor:
                node.target = ops.edge.aten.sub.Tensor
        gm.recompile()
        return PassResult(gm, True)

    changed = manager.transform([sin_to_cos])
    x = torch.randn(2, 3)
    (a, _), (b, _) = _run(manager.exported_program(), (x,)), _run(changed.exported_program(), (x,))
    torch.testing.assert_close(a - b, torch.full_like(a, 3.0))


def test_preserve_ops_keeps_an_op_whole_and_verifies():
    from exportir.dialects.edge.config import EdgeCompileConfig

    ep = _export(nn.SiLU(), (torch.randn(4, 3),))
    plain = _to_edge(ep).exported_program()
    assert "aten.silu.default" not in [t.__name__ for t in _call_targets(plain)]
    silu = torch.ops.aten.silu.default
    edge = _to_edge(ep, compile_config=EdgeCompileConfig(preserve_ops=[silu]))
    targets = [t.__name__ for t in _call_targets(edge.exported_program())]
    assert targets == ["aten.silu.default"]


class AdaptiveMax3d(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = torch.nn.AdaptiveMaxPool3d((1, 2, 1))

    def forward(self, x):
        return self.pool(x) * 2


def test_non_core_op_error_and_exception_list():
    from exportir.dialects.edge.config import EdgeCompileConfig

    module, args = AdaptiveMax3d(), (torch.randn(1, 2, 3, 4, 5),)
    ep = _export(module, args, {})
    with pytest.raises(SpecViolationError) as info:
        _to_edge(ep)
    message = str(info.value)
    assert "node adaptive_max_pool3d" in message and "not in the core ATen op set" in message
    assert "pooling.py" in message and "_core_aten_ops_exception_list" in message
    config = EdgeCompileConfig(
        _core_aten_ops_exception_list=[torch.ops.aten.adaptive_max_pool3d.default]
    )
    edge = _to_edge(ep, compile_config=config).exported_program()
    (got,) = _run(edge, args, {})
    torch.testing.assert_close(got, module(*args))


def test_default_exception_list_takes_the_corpus_pooling_model():
    module, args, kwargs = build(BY_NAME["pooling"])
    edge = _to_edge(_export(module, args, kwargs)).exported_program()
    _, args2, kwargs2 = build(BY_NAME["pooling"])
    (got,) = _run(edge, args2, kwargs2)
    torch.testing.assert_close(got, module(*args2, **kwargs2))


def test_to_backend_and_to_program_delegate_to_their_stages():
    manager = _to_edge(_export(ScaleView(), (torch.randn(2, 3),)))
    try:
        import exportir.passes.to_backend  # noqa: F401
    except ImportError:
        with pytest.raises(NotImplementedError, match="exportir.passes.to_backend"):
            manager.to_backend(object())
    program = manager.to_program()
    assert program.methods == {"forward"}
    assert isinstance(program.buffer, bytes) and len(program.buffer) > 0
