"""Divisibility guards: ``Eq(Mod(s0, 2), 0)`` from a meta kernel (``reshape(-1, 2)``).

A named Dim cannot promise the congruence: the solver reports it as torch does ("Not all values
of dx ... satisfy the generated guard (L['x'].size()[0] % 2) == 0") and suggests a derived dim
(``_dx = Dim('_dx', ...)`` / ``dx = 2*_dx``); the test applies the fix. ``Dim.AUTO`` keeps the
symbol (``s0``, like torch) with the guard.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.export as texport

import exportir.export as ours
from exportir.export.dynamic.dims import Dim, UserError


class Pairs(torch.nn.Module):
    def forward(self, x):
        return x.reshape(-1, 2) * 2


class PairsAfterFirst(torch.nn.Module):
    def forward(self, x):
        return x[1:].reshape(-1, 2) * 2


def _fix_lines(message: str) -> list[str]:
    return message.split("Suggested fixes:\n", 1)[1].strip().splitlines()


def _apply(lines: list[str]) -> dict:
    scope: dict = {"Dim": Dim}
    for line in lines:
        exec(line.strip(), scope)  # noqa: S102  # the fixes are Python: run them
    return scope


def _torch_message(mod, x, **dim_kwargs) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception) as info:
            texport.export(mod, (x,), dynamic_shapes={"x": {0: texport.Dim("dx", **dim_kwargs)}})
    return str(info.value)


@pytest.mark.parametrize("dim_kwargs", [{}, {"max": 64}, {"min": 4, "max": 64}], ids=str)
def test_named_dim_must_be_even(dim_kwargs):
    x = torch.randn(6)
    with pytest.raises(UserError) as info:
        ours.export(Pairs(), (x,), dynamic_shapes={"x": {0: Dim("dx", **dim_kwargs)}})
    message = str(info.value)
    theirs = _torch_message(Pairs(), x, **dim_kwargs)
    guard = "satisfy the generated guard (L['x'].size()[0] % 2) == 0."
    assert guard in message and guard in theirs
    ours_line = next(line for line in message.splitlines() if guard in line)
    assert ours_line in theirs  # same text, incl. "in the specified range dx <= 64"
    assert re.search(r"guard added at .*test_divisibility.py:\d+ in forward", message)
    fixes = _fix_lines(message)
    assert fixes[1].strip() == "dx = 2*_dx"
    # torch prints max=oo for an unbounded root; ours stays valid Python
    assert fixes[0].strip() == _fix_lines(theirs)[0].strip().replace(", max=oo", "")
    scope = _apply(fixes)
    ep = ours.export(Pairs(), (x,), dynamic_shapes={"x": {0: scope["dx"]}})
    assert [str(n.meta["val"].shape) for n in ep.graph.nodes if n.op == "placeholder"] == [
        "torch.Size([2*s0])"
    ]
    for n in (4, 10, 32):
        y = torch.randn(n)
        torch.testing.assert_close(ep.module()(y), Pairs()(y))


def test_offset_congruence_fix_applies():
    x = torch.randn(7)
    with pytest.raises(UserError) as info:
        ours.export(PairsAfterFirst(), (x,), dynamic_shapes={"x": {0: Dim("dx")}})
    message = str(info.value)
    guard = "satisfy the generated guard (((-1) + L['x'].size()[0]) % 2) == 0."
    assert guard in message and guard in _torch_message(PairsAfterFirst(), x)
    fixes = _fix_lines(message)
    assert fixes[1].strip() == "dx = 2*_dx + 1"
    ep = ours.export(PairsAfterFirst(), (x,), dynamic_shapes={"x": {0: _apply(fixes)["dx"]}})
    for n in (5, 9, 21):
        y = torch.randn(n)
        torch.testing.assert_close(ep.module()(y), PairsAfterFirst()(y))


def test_auto_keeps_the_symbol_like_torch():
    x = torch.randn(6)
    ep = ours.export(Pairs(), (x,), dynamic_shapes={"x": {0: Dim.AUTO}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tep = texport.export(Pairs(), (x,), dynamic_shapes={"x": {0: texport.Dim.AUTO}})
    shape = lambda e: [
        re.sub(r"s\d+", "S", str(n.meta["val"].shape))
        for n in e.graph.nodes
        if n.op == "placeholder"
    ]
    assert shape(ep) == shape(tep) == ["torch.Size([S])"]
    assert [str(v) for v in ep.range_constraints.values()] == [
        str(v) for v in tep.range_constraints.values()
    ]
    y = torch.randn(10)
    torch.testing.assert_close(ep.module()(y), Pairs()(y))
