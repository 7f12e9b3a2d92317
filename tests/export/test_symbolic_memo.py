"""Meta results are memoized (export/capture/_meta_memo.py; per ShapeEnv on symbolic sizes, process-wide on concrete ones): repeated
layers replay the first layer's output metadata. The program must not change: same graph as
with the memo off, same numerics as eager at several sizes."""

from __future__ import annotations

import torch
from torch import nn

import exportir.export as ours
from exportir.export.capture import _meta_memo, fake
from exportir.export.dynamic.dims import Dim


def _encoder(layers: int = 3) -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()


def _export(mod):
    spec = ({0: Dim("batch", max=32), 1: Dim("seq", max=64)},)
    return ours.export(mod, (torch.randn(3, 5, 8),), dynamic_shapes=spec)


def test_memo_does_not_change_the_program(monkeypatch):
    mod = _encoder()
    with_memo = _export(mod)
    monkeypatch.setattr(fake, "memoizable", lambda func: False)
    without = _export(mod)
    assert with_memo.graph_module.code == without.graph_module.code
    vals = lambda ep: [str(n.meta.get("val")) for n in ep.graph.nodes]
    assert vals(with_memo) == vals(without)
    assert str(with_memo.range_constraints) == str(without.range_constraints)


def test_memoized_export_runs_at_other_sizes():
    mod = _encoder()
    ep = _export(mod)
    for b, s in ((1, 2), (4, 9), (7, 33)):
        x = torch.randn(b, s, 8)
        torch.testing.assert_close(ep.module()(x), mod(x), rtol=1e-4, atol=1e-5)


def test_ops_that_write_or_create_unbacked_symbols_are_not_memoized():
    aten = torch.ops.aten
    assert _meta_memo.memoizable(aten.addmm.default)
    assert _meta_memo.memoizable(aten.view.default)
    assert not _meta_memo.memoizable(aten.add_.Tensor)
    assert not _meta_memo.memoizable(aten.copy_.default)
    assert not _meta_memo.memoizable(aten._local_scalar_dense.default)  # returns a Scalar
    assert not _meta_memo.memoizable(aten.sym_size.int)


def test_concrete_sizes_share_one_memo_across_exports_without_changing_the_program(monkeypatch):
    mod = _encoder()
    x = (torch.randn(3, 5, 8),)
    _meta_memo.STATIC_MEMO.entries.clear()
    first = ours.export(mod, x)
    filled = len(_meta_memo.STATIC_MEMO.entries)
    assert filled > 0  # static shapes: the memo is the process-wide one
    again = ours.export(mod, x)
    assert len(_meta_memo.STATIC_MEMO.entries) == filled  # every op found its entry
    monkeypatch.setattr(fake, "memoizable", lambda func: False)
    without = ours.export(mod, x)
    vals = lambda ep: [str(n.meta.get("val")) for n in ep.graph.nodes]
    assert first.graph_module.code == again.graph_module.code == without.graph_module.code
    assert vals(first) == vals(again) == vals(without)


class _Ramp(nn.Module):
    def forward(self, x):
        return x, torch.arange(0.0, 4.0)  # a float range: torch's default dtype


def test_concrete_memo_follows_the_default_dtype():
    x = torch.ones(4, dtype=torch.float64)
    ep32 = ours.export(_Ramp(), (x,))
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        ep64 = ours.export(_Ramp(), (x,))  # the same op on the same sizes, another result
    finally:
        torch.set_default_dtype(old)

    def ramp_dtype(ep):
        (out,) = ep.graph.find_nodes(op="output")
        return out.args[0][1].meta["val"].dtype

    assert (ramp_dtype(ep32), ramp_dtype(ep64)) == (torch.float32, torch.float64)
