"""run_decompositions() on programs with dynamic dims: same symbols, same ranges, same numerics.

The retrace rebuilds placeholders with the program's symbolic sizes (its own ShapeEnv), so the
decomposed graph reads ``s0`` where the original did and ``range_constraints`` carry over.
Each case is compared with torch.export's ``run_decompositions()`` on the same spec.
"""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch
import torch.export as texport
from torch import nn

import exportir.export as ours
from exportir.export.dynamic.dims import Dim


class LinearGeluSlice(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 5)

    def forward(self, x, y):
        return nn.functional.gelu(self.lin(x)).reshape(-1), y[: x.shape[0] + 1].sum()


class BatchNormTrain(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x)).relu()


class EncoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)

    def forward(self, x):
        return self.layer(x)


class ReturnsSize(nn.Module):
    """A symbolic size as an output: its ``sym_size`` is re-made when the output is rebuilt."""

    def forward(self, x):
        return x.cos() * 2, x.shape[0]


def _derived(dim_cls):
    b = dim_cls("b", max=64)
    return {"x": {0: b}, "y": {0: b + 3}}


CASES = {
    "derived_dims": (
        lambda: LinearGeluSlice(),
        lambda: (torch.randn(3, 4), torch.randn(6, 2)),
        _derived,
        [(lambda n: (torch.randn(n, 4), torch.randn(n + 3, 2))) for _ in range(1)],
    ),
    "batch_norm_train_auto": (
        lambda: BatchNormTrain().train(),
        lambda: (torch.randn(3, 3, 8, 8),),
        lambda d: {"x": {0: d.AUTO}},
        [lambda n: (torch.randn(n, 3, 8, 8),)],
    ),
    "encoder_layer_batch_seq": (
        lambda: EncoderLayer().eval(),
        lambda: (torch.randn(3, 5, 8),),
        lambda d: {"x": {0: d("batch", max=32), 1: d("seq", max=64)}},
        [lambda n: (torch.randn(n, n + 2, 8),)],
    ),
    "returned_size": (
        lambda: ReturnsSize(),
        lambda: (torch.randn(3, 2),),
        lambda d: {"x": {0: d("b", max=64)}},
        [lambda n: (torch.randn(n, 2),)],
    ),
}


def _ops(ep) -> Counter:
    return Counter(
        str(n.target)
        for n in ep.graph.nodes
        if n.op == "call_function" and hasattr(n.target, "_schema")
    )


def _placeholder_sizes(ep) -> list[str]:
    return [
        str(tuple(n.meta["val"].shape))
        for n in ep.graph.nodes
        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
    ]


@pytest.mark.parametrize("name", sorted(CASES))
def test_run_decompositions_keeps_symbols(name):
    make, inputs, spec, at = CASES[name]
    torch.manual_seed(0)
    mod = make()
    args = inputs()
    ep = ours.export(mod, args, dynamic_shapes=spec(Dim))
    dec = ep.run_decompositions()
    assert dec.range_constraints == ep.range_constraints
    assert _placeholder_sizes(dec) == _placeholder_sizes(ep)
    assert any("s" in s for s in _placeholder_sizes(dec))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tdec = texport.export(mod, args, dynamic_shapes=spec(texport.Dim)).run_decompositions()
    assert _ops(dec) == _ops(tdec)
    assert [str(v) for v in dec.range_constraints.values()] == [
        str(v) for v in tdec.range_constraints.values()
    ]
    for n in (2, 7, 9):
        run_args = at[0](n)
        torch.testing.assert_close(dec.module()(*run_args), tdec.module()(*run_args))


def test_run_decompositions_then_range_check():
    ep = ours.export(
        LinearGeluSlice(), (torch.randn(3, 4), torch.randn(6, 2)), dynamic_shapes=_derived(Dim)
    )
    dec = ep.run_decompositions()
    with pytest.raises(RuntimeError, match="to be <= 64, but got 65"):
        dec.module()(torch.randn(65, 4), torch.randn(68, 2))
