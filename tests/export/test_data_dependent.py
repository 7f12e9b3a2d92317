"""Data-dependent values: the error on a Python branch over an unbacked value names the user's
line and suggests torch._check; applying the fix makes export succeed."""

import pytest
import torch

from exportir.export import export
from exportir.symbolic import GuardOnDataDependentSymNode


class Branch(torch.nn.Module):
    def forward(self, x):
        n = x.sum().int().item()
        if n > 2:  # data-dependent branch
            return x * 2
        return x


class BranchChecked(torch.nn.Module):
    def forward(self, x):
        n = x.sum().int().item()
        torch._check(n > 2)
        if n > 2:
            return x * 2
        return x


def test_branch_on_item_raises_with_line_and_fix():
    with pytest.raises(GuardOnDataDependentSymNode) as info:
        export(Branch(), (torch.ones(4),))
    text = str(info.value)
    assert "Could not guard on data-dependent expression u0 > 2" in text
    assert __file__ in text and "if n > 2:  # data-dependent branch" in text
    assert "torch._check(n > 2)" in text and "torch._check(n <= 2)" in text


def test_applying_the_fix_exports_with_a_runtime_assert():
    ep = export(BranchChecked(), (torch.ones(4),))
    msgs = [n.args[1] for n in ep.graph.nodes if n.target is torch.ops.aten._assert_scalar.default]
    assert any("u0 >= 3" in m or "u0 > 2" in m for m in msgs)
    torch.testing.assert_close(ep.module()(torch.ones(4)), torch.ones(4) * 2)


def test_tolist_gives_unbacked_values():
    class M(torch.nn.Module):
        def forward(self, x, t):
            a, b = t.tolist()
            torch._check(a >= 0)
            torch._check(b >= 0)
            return x.new_zeros(a + b)

    ep = export(M(), (torch.ones(2), torch.tensor([1, 2])))
    assert str(ep.range_constraints) == "{u0: VR[0, int_oo], u1: VR[0, int_oo]}"
    assert ep.module()(torch.ones(2), torch.tensor([3, 4])).shape == (7,)
