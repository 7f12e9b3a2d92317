"""scaled_dot_product_attention on the whole road with dynamic shapes: export (against
torch.export), to_edge / to_edge_transform_and_lower, to_program, the runtime at several sizes,
compared with eager.

- Emitting a program must not specialize the symbols of the edge program (a symbolic stride
  of the decomposed attention once did: every later result was planned at the example size).
- A dynamic dimension next to a size-1 one (batch 1, dynamic sequence) stays dynamic, with
  torch's range constraints.
- A ``view`` of the attention captured at export (``linear`` of it becomes ``view`` +
  ``addmm``) still applies after decomposition: ``run_decompositions`` (``to_edge``) takes
  torch's ``(L, N, H, E)`` decomposition and re-decides the views after it in its re-trace; a
  node-level decomposition (``to_edge_transform_and_lower`` on attention no partitioner
  claimed) re-traces nothing after the node and uses the one that returns the kernel's layout
  (the query's).
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import exportir
from exportir import pytree
from exportir.dialects.backend import Partitioner, PartitionResult
from exportir.export import Dim, export
from exportir.export.capture._decompositions import KERNEL_LAYOUT
from exportir.program.manager import to_edge
from exportir.runtime import Program

SDPA = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


class KeepUnclaimed(Partitioner):
    """Keeps the attention whole through to_edge and claims nothing: it is decomposed after
    partitioning, node by node."""

    def ops_to_not_decompose(self, ep):
        return [SDPA], None

    def partition(self, exported_program):
        return PartitionResult(exported_program, {})


def _edge(ep, road: str):
    if road == "to_edge":
        return to_edge(ep)
    return exportir.to_edge_transform_and_lower(ep, partitioner=[KeepUnclaimed()])


def _runs_like_eager(manager, model, inputs) -> None:
    """The program in the runtime, and the edge program in Python, on each input tuple."""
    method = Program.load(manager.to_program().buffer).method("forward")
    graph = manager.exported_program().module()
    for args in inputs:
        expected = pytree.tree_leaves(model(*args))
        for got in (pytree.tree_leaves(method(*args)), pytree.tree_leaves(graph(*args))):
            assert len(got) == len(expected)
            for g, e in zip(got, expected):
                torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def _qkv(*shape):
    return tuple(torch.randn(*shape) for _ in range(3))


class Plain(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v) * 2 + 1


# ------------------------------------------------------------------ 1. emitting keeps symbols


def _shape(dim: int, n: int) -> tuple[int, ...]:
    shape = [3, 2, 4, 8]
    shape[dim] = n
    return tuple(shape)


@pytest.mark.parametrize("road", ["to_edge", "transform_and_lower"])
@pytest.mark.parametrize("dim", [0, 2], ids=["batch", "seq"])
def test_dynamic_dim_runs_at_every_size_and_emitting_keeps_the_symbol(dim, road):
    torch.manual_seed(0)
    model = Plain()
    spec = ({dim: Dim("d", min=2, max=64)},) * 3
    ep = export(model, _qkv(*_shape(dim, 3)), dynamic_shapes=spec)
    manager = _edge(ep, road)
    program = manager.to_program()
    edge = manager.exported_program()
    assert [str(r) for r in edge.range_constraints.values()] == ["VR[2, 64]"]
    for node in edge.graph.nodes:  # emitting asked no question that fixed the batch to 3
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dim() == 4:
            assert not all(isinstance(s, int) for s in val.shape), (node.name, val.shape)
    method = Program.load(program.buffer).method("forward")
    for n in (2, 7, 64, 3):
        args = _qkv(*_shape(dim, n))
        (got,) = pytree.tree_leaves(method(*args))
        torch.testing.assert_close(got, model(*args), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------- 2. a dynamic dim next to a 1


def test_dynamic_sequence_with_batch_one_matches_torch_export():
    torch.manual_seed(0)
    model, args = Plain(), _qkv(1, 2, 5, 8)
    ours = export(model, args, dynamic_shapes=({2: Dim("seq", min=2, max=64)},) * 3)
    theirs = torch.export.export(
        model, args, dynamic_shapes=({2: torch.export.Dim("seq", min=2, max=64)},) * 3
    )

    def placeholders(ep):
        return [
            (str(tuple(n.meta["val"].shape)), str(n.meta["val"].stride()))
            for n in ep.graph.nodes if n.op == "placeholder"
        ]  # fmt: skip

    assert placeholders(ours) == placeholders(theirs) == [("(1, 2, s0, 8)", "(16*s0, 8*s0, 8, 1)")] * 3  # fmt: skip
    assert {str(k): str(v) for k, v in ours.range_constraints.items()} == {
        str(k): str(v) for k, v in theirs.range_constraints.items()
    }
    _runs_like_eager(to_edge(ours), model, [_qkv(1, 2, n, 8) for n in (2, 5, 17, 64)])


def test_size_one_dims_keep_torchs_strides():
    """A size-1 dimension takes the dense stride when the real one equals it at the example
    sizes, else keeps the real one (as torch.export): either way no guard on the symbol."""

    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    def shown(t):  # torch numbers its symbols per process
        return re.sub(r"\bs\d+", "s", f"{tuple(t.shape)} {t.stride()}")

    seq = {2: Dim("seq", min=2, max=64)}
    odd = torch.randn(100).as_strided((1, 2, 5, 8), (7, 40, 8, 1))  # dense stride of dim 0: 80
    for x in (torch.randn(1, 2, 5, 8), torch.randn(1, 5, 2, 8).transpose(1, 2), odd):
        ours = export(Double(), (x,), dynamic_shapes=(seq,))
        theirs = torch.export.export(
            Double(), (x,), dynamic_shapes=({2: torch.export.Dim("seq", min=2, max=64)},)
        )
        (p,) = [n for n in ours.graph.nodes if n.op == "placeholder"]
        (t,) = [n for n in theirs.graph.nodes if n.op == "placeholder"]
        assert shown(p.meta["val"]) == shown(t.meta["val"])
        torch.testing.assert_close(ours.module()(x), x * 2)


# ------------------------------------------------------------ 3. the decomposition's layout


class ViewOfAttention(torch.nn.Module):
    """The attention ``view``-ed across (batch, heads, sequence) then projected."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, q, k, v):
        return self.proj(F.scaled_dot_product_attention(q, k, v).view(-1, 8))


class LinearOfAttention(torch.nn.Module):
    """``linear`` of the 4-d attention: captured as ``view`` + ``addmm`` + ``view``."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, q, k, v):
        return self.proj(F.scaled_dot_product_attention(q, k, v))


class HeadsMerged(torch.nn.Module):
    """The usual multi-head tail: transpose(1, 2), reshape, output projection."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, q, k, v):
        b, h, n, d = q.shape
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, n, h * d))


MODELS = {"view": ViewOfAttention, "linear": LinearOfAttention, "heads": HeadsMerged}


@pytest.mark.parametrize("road", ["to_edge", "transform_and_lower"])
@pytest.mark.parametrize("batch", ["1", "3", "dynamic"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_attention_viewed_after_decomposition_runs(name, batch, road):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    n = 1 if batch == "1" else 3
    spec = ({0: Dim("b", min=2, max=16)},) * 3 if batch == "dynamic" else None
    manager = _edge(export(model, _qkv(n, 2, 4, 8), dynamic_shapes=spec), road)
    sizes = (2, 5, 16) if batch == "dynamic" else (n,)
    _runs_like_eager(manager, model, [_qkv(b, 2, 4, 8) for b in sizes])


QUERY_LAYOUTS = {
    "contiguous": lambda: torch.randn(3, 2, 4, 8),
    "NLHE": lambda: torch.randn(3, 4, 2, 8).transpose(1, 2),
    "LNHE": lambda: torch.randn(4, 3, 2, 8).permute(1, 2, 0, 3),
    "head_dim_outer": lambda: torch.randn(3, 2, 8, 4).transpose(2, 3),
}


@pytest.mark.parametrize("layout", sorted(QUERY_LAYOUTS))
def test_decomposition_returns_the_kernels_strides(layout):
    q = QUERY_LAYOUTS[layout]()
    k, v = torch.randn(3, 2, 4, 8), torch.randn(3, 2, 4, 8)
    decompose = KERNEL_LAYOUT[SDPA]  # what a node-level decomposition (no re-trace after) uses
    out, _ = decompose(q, k, v)
    meta, _ = SDPA(q.to("meta"), k.to("meta"), v.to("meta"))  # what export captured
    assert out.stride() == meta.stride()
    if q.stride(-1) == 1:  # (the CPU kernel itself reads a head-dim-outer query wrong)
        assert out.stride() == SDPA(q, k, v)[0].stride()
    reference, _ = torch.ops.aten._scaled_dot_product_attention_math(q, k, v)
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-5)


def test_query_layouts_through_the_road():
    """A query in each layout, then the attention ``view``-ed: to_edge and the runtime."""

    class ViewAny(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v).reshape(-1, 8).sum(0)

    torch.manual_seed(0)
    for make in QUERY_LAYOUTS.values():
        args = (make(), torch.randn(3, 2, 4, 8), torch.randn(3, 2, 4, 8))
        _runs_like_eager(to_edge(export(ViewAny(), args)), ViewAny(), [args])
