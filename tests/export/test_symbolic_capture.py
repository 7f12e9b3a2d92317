"""Symbolic capture compared with torch.export(dynamic_shapes=...): graph text structure,
range_constraints and numerics on three input sizes."""

import re

import pytest
import torch
from torch.export import Dim
from torch.export import export as torch_export

from exportir.export import export


def _norm(text):
    """Symbol names differ (torch hashes sources: s77): rename in order of appearance."""
    names = {}
    return re.sub(r"\bs\d+\b", lambda m: names.setdefault(m.group(0), f"S{len(names)}"), text)


class ViewSlice(torch.nn.Module):
    def forward(self, x, y):
        n = x.shape[0]
        z = x.view(n * 2, -1)
        w = y[: n + 1] if x.shape[0] > 3 else y
        return z.sum() + w.sum(), n


def _both(mod, args, shapes):
    ours = export(mod, args, dynamic_shapes=shapes)
    theirs = torch_export(mod, args, dynamic_shapes=shapes)
    return ours, theirs


def test_view_slice_symbolic_output_matches_torch():
    b = Dim("b", min=4, max=64)
    ours, theirs = _both(ViewSlice(), (torch.randn(4, 6), torch.randn(5, 3)),
                         {"x": {0: b}, "y": {0: b + 1}})
    assert _norm(str(ours.range_constraints)) == _norm(str(theirs.range_constraints))
    code = ours.graph_module.code
    assert "torch.ops.aten.sym_size.int(x, 0)" in code and "* 2" in code and "+ 1" in code
    ph = [n for n in ours.graph.nodes if n.op == "placeholder"]
    assert [_norm(str(n.meta["val"].shape)) for n in ph] == [
        "torch.Size([S0, 6])", "torch.Size([S0 + 1, 3])"]
    assert str(ours.graph_signature.output_specs[1].arg.__class__.__name__) == "SymIntArgument"
    for n in (4, 9, 33):
        args = (torch.randn(n, 6), torch.randn(n + 1, 3))
        got, want = ours.module()(*args), ViewSlice()(*args)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1] == n


class Unbacked(torch.nn.Module):
    def forward(self, x):
        a = x.sum().int().item()
        torch._check(a >= 0)
        torch._check(a <= 10)
        return torch.zeros(a), x.nonzero()


def test_item_and_nonzero_runtime_asserts_match_torch():
    args = (torch.ones(4),)
    ours = export(Unbacked(), args)
    theirs = torch_export(Unbacked(), args).run_decompositions()
    assert str(ours.range_constraints) == str(theirs.range_constraints) == "{u0: VR[0, 10], u1: VR[0, 4]}"

    def asserts(ep):
        return [n.args[1].split(" on node")[0] for n in ep.graph.nodes
                if n.target is torch.ops.aten._assert_scalar.default]

    assert asserts(ours) == asserts(theirs)
    ops = [n.target for n in ours.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten._local_scalar_dense.default in ops
    for k in (0, 2, 4):
        x = torch.cat([torch.ones(k), torch.zeros(4 - k)])
        got, want = ours.module()(x), Unbacked()(x)
        assert got[0].shape == want[0].shape and torch.equal(got[1], want[1])


def test_custom_op_new_dynamic_size():
    @torch.library.custom_op("exportir_sym_test::pick", mutates_args=())
    def pick(x: torch.Tensor) -> torch.Tensor:
        return x[x > 0]

    @pick.register_fake
    def _(x):
        n = torch.library.get_ctx().new_dynamic_size()
        return x.new_empty(n)

    class M(torch.nn.Module):
        def forward(self, x):
            return pick(x) * 2

    ep = export(M(), (torch.randn(5),))
    (mul,) = [n for n in ep.graph.nodes if n.name == "mul"]
    assert str(mul.meta["val"].shape) == "torch.Size([u0])"
    x = torch.tensor([1.0, -1.0, 2.0, -3.0, 4.0])
    torch.testing.assert_close(ep.module()(x), M()(x))


class CheckedLogic(torch.nn.Module):
    """torch._check on a conjunction, a disjunction and a negation of data-dependent facts."""

    def forward(self, x):
        n = x.sum().int().item()
        torch._check((n > 0) & (n < 10))
        torch._check((n < 2) | (n > 3))
        torch._check(torch.sym_not(n == 7))
        return torch.zeros(n)


def test_checks_joined_by_and_or_not_become_runtime_asserts_as_torch():
    args = (torch.ones(9) * (torch.arange(9) < 5),)
    ours = export(CheckedLogic(), args)
    theirs = torch_export(CheckedLogic(), args)

    def checked(ep):
        return sorted(n.args[1].split("expression ")[1].split(" on node")[0] for n in ep.graph.nodes
                      if n.target is torch.ops.aten._assert_scalar.default)

    # one assert per check, a conjunction or disjunction whole, as torch.export emits them
    # (sympy orders the operands of the printed expressions differently on the two sides)
    assert len(checked(ours)) == len(checked(theirs)), (checked(ours), checked(theirs))
    assert {"Ne(u0, 7)", "u0 <= 9", "u0 >= 1"} <= set(checked(ours))
    assert sum("&" in c for c in checked(ours)) == sum("|" in c for c in checked(ours)) == 1
    assert ours.module()(torch.ones(9)).shape == theirs.module()(torch.ones(9)).shape == (9,)
    for bad in (0, 3, 7):  # each clause refuses its own counterexample at run time
        x = torch.cat([torch.ones(bad), torch.zeros(9 - bad)])
        for ep in (ours, theirs):
            with pytest.raises(RuntimeError, match="Runtime assertion failed"):
                ep.module()(x)
