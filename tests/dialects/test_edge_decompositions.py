"""What ``to_edge`` does with the non-core ops the core ATen table leaves whole, compared with
ExecuTorch 1.5.1's ``to_edge``: ``linalg_vector_norm`` is decomposed (ExecuTorch adds torch's
decomposition to its table), ``histc`` is decomposed (ours; ExecuTorch rejects it), and
``max`` / ``min`` without a dim and antialiased bilinear upsampling stay whole with dtype
constraints (ExecuTorch's Edge verifier accepts them by default). Every program runs in the
runtime and equals eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from exportir import Dim, export
from exportir.dialects.edge.config import EdgeCompileConfig
from exportir.passes.edge_decompositions import histc, round_decimals
from exportir.program.manager import to_edge
from exportir.runtime import Program, default_kernel_registry

aten = torch.ops.aten


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _aten_ops(edge) -> set:
    ep = edge.exported_program()
    return {getattr(n.target, "aten_op", n.target) for n in ep.graph.nodes if n.op == "call_function"}


def _runs_like_eager(model, args, edge, inputs=None, preserved=()):
    """Run the program (ops kept out of the Edge op set by ``preserve_ops`` are outside the
    runtime's kernel table: registered on purpose) and compare with eager."""
    kernels = default_kernel_registry()
    kernels.register_op(*preserved)
    method = Program.load(edge.to_program().buffer, kernels=kernels).method("forward")
    for x in inputs or [args]:
        with torch.no_grad():
            expected = model(*x)
        torch.testing.assert_close(method(*x), expected, rtol=1e-5, atol=1e-5, equal_nan=True)


# ---------------------------------------------------------------------------- linalg_vector_norm

NORMS = {
    "normalize": lambda x: F.normalize(x, dim=-1),
    "norm": lambda x: x.norm(dim=0),
    "vector_norm_ord3": lambda x: torch.linalg.vector_norm(x, ord=3, dim=1, keepdim=True),
    "vector_norm_inf": lambda x: torch.linalg.vector_norm(x, ord=float("inf")),
    "matrix_norm": lambda x: torch.linalg.matrix_norm(x),
}


@pytest.mark.parametrize("name", sorted(NORMS))
def test_vector_norms_are_decomposed_like_executorch(name):
    model = Fn(NORMS[name])
    args = (torch.randn(4, 6),)
    ep = export(model, args)
    core = ep.run_decompositions().graph  # the core ATen table leaves it whole
    assert core.find_nodes(op="call_function", target=aten.linalg_vector_norm.default)
    edge = to_edge(ep)
    assert aten.linalg_vector_norm.default not in _aten_ops(edge)
    _runs_like_eager(model, args, edge)


def test_weight_norm_convolution_is_decomposed_and_runs():
    conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 6, 3, padding=1), dim=2)
    args = (torch.randn(2, 4, 9),)
    edge = to_edge(export(conv.eval(), args))
    ops = _aten_ops(edge)
    assert aten.linalg_vector_norm.default not in ops
    assert aten._weight_norm_interface.default not in ops
    _runs_like_eager(conv, args, edge)


def test_preserve_ops_keeps_vector_norm_whole():
    model = Fn(NORMS["normalize"])
    args = (torch.randn(4, 6),)
    config = EdgeCompileConfig(preserve_ops=[aten.linalg_vector_norm.default])
    edge = to_edge(export(model, args), compile_config=config)
    assert aten.linalg_vector_norm.default in _aten_ops(edge)
    _runs_like_eager(model, args, edge, preserved=[aten.linalg_vector_norm])


# ---------------------------------------------------------------------------- histc


def _histc_inputs():
    g = torch.Generator().manual_seed(0)
    yield torch.randn(40, generator=g) * 2
    yield torch.tensor([-1.0, 1.0, 0.0, 0.5, 1.0 - 1e-7, 3.0, -3.0, float("nan"), 1.0])
    yield torch.full((5,), 2.5)  # one value: the data range widens to [1.5, 3.5]
    yield torch.arange(12, dtype=torch.float64).reshape(3, 4) / 11
    yield torch.randint(0, 8, (64,), generator=g).float()  # expert ids, as MoE routers count


@pytest.mark.parametrize("bins, low, high", [(5, -1, 1), (7, 0, 0), (8, 0, 7), (3, -0.3, 2.9)])
def test_histc_decomposition_is_exact(bins, low, high):
    for x in _histc_inputs():
        if low == high and x.isnan().any():
            # ATen raises ("range of [nan, nan] is not finite"); a graph cannot: nothing counts
            assert torch.equal(histc(x, bins, low, high), torch.zeros(bins))
            continue
        assert torch.equal(histc(x, bins, low, high), torch.histc(x, bins, low, high))


def test_histc_decomposition_refuses_integer_input():
    with pytest.raises(NotImplementedError, match=r"floating-point input only; cast it first"):
        histc(torch.arange(4), 3, 0, 3)


@pytest.mark.parametrize("low, high", [(0, 8), (0, 0)])
def test_histc_is_decomposed_and_runs(low, high):
    model = Fn(lambda x: torch.histc(x.float(), bins=8, min=low, max=high))
    args = (torch.randint(0, 8, (6, 2)),)
    edge = to_edge(export(model, args))
    assert aten.histc.default not in _aten_ops(edge)
    assert aten.scatter_add.default in _aten_ops(edge)
    _runs_like_eager(model, args, edge)


def test_histc_with_a_dynamic_size_runs_at_other_sizes():
    model = Fn(lambda x: torch.histc(x, bins=5, min=-2, max=2))
    args = (torch.randn(6, 3),)
    ep = export(model, args, dynamic_shapes={"x": {0: Dim("tokens", min=2, max=64)}})
    edge = to_edge(ep)
    sizes = [2, 5, 17, 64]
    _runs_like_eager(model, args, edge, [(torch.randn(n, 3),) for n in sizes])


def test_preserve_ops_keeps_histc_whole_and_the_runtime_runs_it():
    model = Fn(lambda x: torch.histc(x, bins=4, min=-1, max=1))
    args = (torch.randn(10),)
    config = EdgeCompileConfig(preserve_ops=[aten.histc.default])
    edge = to_edge(export(model, args), compile_config=config)
    assert aten.histc.default in _aten_ops(edge)
    _runs_like_eager(model, args, edge, preserved=[aten.histc])


# ---------------------------------------------------------------------------- kept whole

KEPT = {
    aten.max.default: lambda x: torch.max(x) + x,
    aten.min.default: lambda x: torch.min(x) * x,
    aten._upsample_bilinear2d_aa.default: lambda x: F.interpolate(
        x.reshape(1, 1, 4, 6), size=(2, 3), mode="bilinear", antialias=True
    ),
}


@pytest.mark.parametrize("op", list(KEPT), ids=str)
def test_ops_executorch_keeps_stay_whole_and_run(op):
    model = Fn(KEPT[op])
    args = (torch.randn(4, 6),)
    edge = to_edge(export(model, args))
    assert op in _aten_ops(edge)
    _runs_like_eager(model, args, edge)


def test_kept_ops_have_generated_dtype_constraints():
    from exportir.dialects.edge.ops import to_edge_op

    for op in KEPT:
        described = to_edge_op(op).dtype_constraint.describe()
        assert "Float" in described and "Half" not in described, (op, described)
    # antialiased upsampling has no integer kernel but uint8 (images)
    described = to_edge_op(aten._upsample_bilinear2d_aa.default).dtype_constraint.describe()
    assert "Long" not in described and "Byte" in described



# ---------------------------------------------------------------------------- empty_permuted


class InversePermutation(nn.Module):
    """MoE experts code inverts a permutation this way (``torch.empty_like`` then an indexed
    write); the core table turns ``empty_like`` into ``aten.empty_permuted``."""

    def forward(self, perm, x):
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel())
        t = torch.empty_like(x.t())  # a transposed layout: physical_layout [1, 0]
        t.copy_(x.t() * 2)
        return inv, t


def test_empty_permuted_becomes_empty_and_runs():
    model = InversePermutation()
    args = (torch.randperm(7), torch.randn(3, 5))
    ep = export(model, args)
    core = ep.run_decompositions().graph  # as torch.export's: empty_permuted, not core ATen
    assert core.find_nodes(op="call_function", target=aten.empty_permuted.default)
    edge = to_edge(ep)
    ops = _aten_ops(edge)
    assert aten.empty_permuted.default not in ops and aten.empty.memory_format in ops
    _runs_like_eager(model, args, edge)


# ---------------------------------------------------------------------------- round(decimals=)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("decimals", [0, 1, 3, -2])
def test_round_decimals_decomposition_is_bit_exact(dtype, decimals):
    x = (torch.randn(20000, generator=torch.Generator().manual_seed(0)) * 1000).to(dtype)
    assert torch.equal(round_decimals(x, decimals=decimals), torch.round(x, decimals=decimals))


def test_round_decimals_refuses_integer_input():
    with pytest.raises(NotImplementedError, match=r"x\.float\(\)"):
        round_decimals(torch.arange(4), decimals=1)


def test_round_decimals_is_decomposed_and_runs():
    model = Fn(lambda x: torch.round(x, decimals=2) + torch.round(x * 3))
    args = (torch.randn(3, 5) * 10,)
    edge = to_edge(export(model, args))
    assert aten.round.decimals not in _aten_ops(edge)
    method = Program.load(edge.to_program().buffer).method("forward")
    assert torch.equal(method(*args), model(*args))
