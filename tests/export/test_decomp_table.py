"""``default_decompositions()`` / ``run_decompositions(table)`` as torch.export's.

A composite op the table does not name stays whole; ``del`` keeps an op, ``table[op] = fn``
decomposes it by ``fn``; custom composite ops registered after the table was made are added
when it is read. Each behaviour is compared with torch.export's, and the graphs run against
eager.
"""

from __future__ import annotations

import copy
import warnings
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import exportir
from exportir.export import default_decompositions
from exportir.export.decomp_table import CustomDecompTable

aten = torch.ops.aten


class Block(nn.Module):
    """linear, layer_norm, matmul, sdpa, conv2d, pad: composite ops torch keeps whole."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.conv = nn.Conv2d(2, 2, 3, padding=1)
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x, img):
        h = self.norm(self.fc(x))
        # heads laid out (L, N, H, E) in memory: torch's core decomposition of the attention
        # kernel lays its output out that way whatever the query's layout (test_fidelity.py's
        # SDPA_LAYOUT); with this query the kernel does too, and the graphs agree op for op
        q = h.transpose(0, 1).contiguous().view(3, 2, 2, 4).permute(1, 2, 0, 3)
        a = F.scaled_dot_product_attention(q, q, q).permute(2, 0, 1, 3).reshape(3, 2, 8)
        a = a.transpose(0, 1)
        c = self.conv(F.pad(img, (1, 1, 1, 1))).sum()
        return (a @ self.w) * c


def _inputs():
    torch.manual_seed(0)
    return (torch.randn(2, 3, 8), torch.randn(1, 2, 4, 4))


def _ops(ep) -> Counter:
    return Counter(str(n.target) for n in ep.graph.nodes if n.op == "call_function")


def _both(table_of):
    """(ours, torch's) decomposed programs of Block, each with the table ``table_of(module)``
    builds from that side's default_decompositions / export module."""
    torch.manual_seed(0)
    m = Block().eval()
    args = _inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = exportir.export(m, args).run_decompositions(table_of(exportir.export))
        theirs = torch.export.export(m, args, strict=False).run_decompositions(table_of(torch.export))
    return m, args, ours, theirs


def _same_numerics(m, args, ep) -> None:
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(*args), m(*args))


def test_default_table_has_torchs_keys() -> None:
    ours, theirs = default_decompositions(), torch.export.default_decompositions()
    assert isinstance(ours, CustomDecompTable)
    assert set(ours) == set(theirs)
    assert aten.linear.default in ours and aten.upsample_nearest2d.vec not in ours


def test_export_keeps_composite_ops_whole() -> None:
    torch.manual_seed(0)
    m, args = Block().eval(), _inputs()
    ours = exportir.export(m, args)
    theirs = torch.export.export(m, args, strict=False).run_decompositions({})
    assert _ops(ours) == _ops(theirs)
    for op in ("linear", "layer_norm", "scaled_dot_product_attention", "conv2d", "pad", "matmul"):
        assert f"aten.{op}.default" in _ops(ours), op
    _same_numerics(m, args, ours)


def test_deleting_an_op_keeps_it() -> None:
    def table(api):
        t = api.default_decompositions()
        del t[aten.linear.default]
        t.pop(aten.layer_norm.default)
        return t

    m, args, ours, theirs = _both(table)
    assert _ops(ours) == _ops(theirs)
    assert _ops(ours)["aten.linear.default"] == 1 and _ops(ours)["aten.layer_norm.default"] == 1
    assert "aten.matmul.default" not in _ops(ours)
    _same_numerics(m, args, ours)


def test_empty_table_keeps_everything_and_none_means_default() -> None:
    m, args, ours, theirs = _both(lambda api: {})
    assert _ops(ours) == _ops(theirs)
    m, args, ours, theirs = _both(lambda api: None)
    assert _ops(ours) == _ops(theirs)
    _same_numerics(m, args, ours)


def test_a_plain_dict_names_what_decomposes() -> None:
    """A dict that names only linear: linear decomposes, every other composite op stays."""

    def table(api):
        return {aten.linear.default: api.default_decompositions()[aten.linear.default]}

    m, args, ours, theirs = _both(table)
    assert _ops(ours) == _ops(theirs)
    assert "aten.linear.default" not in _ops(ours) and "aten.conv2d.default" in _ops(ours)
    _same_numerics(m, args, ours)


def test_an_entry_decomposes_by_its_callable() -> None:
    def linear_as_matmul(x, w, b=None):
        out = torch.matmul(x, w.t())
        return out if b is None else out + b

    def table(api):
        t = api.default_decompositions()
        t[aten.linear.default] = linear_as_matmul
        del t[aten.matmul.default]
        return t

    m, args, ours, theirs = _both(table)
    assert _ops(ours) == _ops(theirs)
    # linear's, the model's own and the two of the attention's math decomposition
    assert _ops(ours)["aten.matmul.default"] == 4
    _same_numerics(m, args, ours)


def test_torchs_table_object_is_accepted() -> None:
    torch.manual_seed(0)
    m, args = Block().eval(), _inputs()
    table = torch.export.default_decompositions()
    del table[aten.conv2d.default]
    ours = exportir.export(m, args).run_decompositions(table)
    assert _ops(ours)["aten.conv2d.default"] == 1 and "aten.linear.default" not in _ops(ours)


def test_pop_copy_and_errors() -> None:
    t = default_decompositions()
    assert t.pop(aten.linear.default) is not None
    assert t.pop(aten.linear.default, "gone") == "gone"
    with pytest.raises(KeyError):
        t.pop(aten.linear.default)
    with pytest.raises(KeyError):
        del t[aten.linear.default]
    c = t.copy()
    c[aten.linear.default] = lambda *a: None
    assert aten.linear.default in c and aten.linear.default not in t
    d = copy.deepcopy(t)
    assert set(d) == set(t)
    assert len(t) == len(default_decompositions()) - 1


NS = "exportir_decomp_table_test"
_lib = torch.library.Library(NS, "FRAGMENT")  # kept alive for the session


def _define_composite(name: str) -> object:
    """A custom op with a CompositeImplicitAutograd kernel (x * 2 + 1), defined on demand."""
    _lib.define(f"{name}(Tensor x) -> Tensor")
    _lib.impl(name, lambda x: x * 2 + 1, "CompositeImplicitAutograd")
    return getattr(getattr(torch.ops, NS), name).default


class UsesCustom(nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x):
        return self.op(x).sin()


def test_custom_composite_op_registered_after_the_table() -> None:
    """torch keeps a composite custom op whole in export and decomposes it by default; a table
    made before the op existed still decomposes it (it is added when the table is read), and
    deleting it ahead of time keeps it."""
    early, early_deleted = default_decompositions(), default_decompositions()
    t_early, t_early_deleted = torch.export.default_decompositions(), torch.export.default_decompositions()
    op = _define_composite("twice_plus_one")
    del early_deleted[op]
    del t_early_deleted[op]
    x = torch.randn(4)
    ep = exportir.export(UsesCustom(op), (x,))
    tep = torch.export.export(UsesCustom(op), (x,), strict=False)
    assert _ops(ep) == _ops(tep.run_decompositions({}))
    assert _ops(ep)[str(op)] == 1
    for ours_table, torch_table, kept in ((early, t_early, 0), (early_deleted, t_early_deleted, 1)):
        ours = ep.run_decompositions(ours_table)
        assert _ops(ours) == _ops(tep.run_decompositions(torch_table))
        assert _ops(ours)[str(op)] == kept
        torch.testing.assert_close(ours.module()(x), (x * 2 + 1).sin())


def test_deleting_an_unknown_custom_op_twice_is_a_key_error() -> None:
    t = default_decompositions()
    op = _define_composite("plus_one_later")
    del t[op]
    with pytest.raises(KeyError):
        del t[op]


class MatmulOfParameter(nn.Module):
    """matmul's composite kernel folds a 3-D @ 2-D product into mm when the 2-D side requires
    grad: in torch's re-trace only parameters do (what they compute does not)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 5))
        self.register_buffer("b", torch.randn(4, 5))

    def forward(self, x):
        x = x.transpose(0, 1)
        return x @ self.w, x @ self.b, x @ (self.w * 2)


def test_matmul_decomposes_as_in_torchs_retrace() -> None:
    m, x = MatmulOfParameter(), torch.randn(3, 2, 4)
    ours = exportir.export(m, (x,)).run_decompositions()
    theirs = torch.export.export(m, (x,), strict=False).run_decompositions()
    assert _ops(ours) == _ops(theirs)
    assert _ops(ours)["aten.mm.default"] == 1 and _ops(ours)["aten.bmm.default"] == 2
    with torch.no_grad():
        torch.testing.assert_close(ours.module()(x), m(x))


def test_kept_op_results_require_grad_while_capturing() -> None:
    """Under torch.export, forward sees a linear's output require grad (it traces above
    autograd); so it does here, and the graph holds no trace of it."""
    seen = []

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            y = self.fc(x)
            seen.append(y.requires_grad)
            y.add_(1)  # in place on a kept op's result (not a leaf)
            return y

    x = torch.randn(2, 3)
    ep = exportir.export(Probe(), (x,))
    torch.export.export(Probe(), (x,), strict=False)
    assert seen == [True, True]
    assert [str(n.target) for n in ep.graph.nodes if n.op == "call_function"] == [
        "aten.linear.default", "aten.add.Tensor",
    ]  # fmt: skip
