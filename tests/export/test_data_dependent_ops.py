"""Data-dependent core ops export with unbacked sizes, as torch's fake tensors do.

torch.export(strict=False) is the oracle: each program computes what eager computes (on the
example inputs and on other data of the same shapes), and every unbacked symbol's range is at
least as tight as torch's (a mask's count lies in [0, numel]).
"""

from __future__ import annotations

import pytest
import sympy
import torch

from exportir.export import Dim, export


def _t(*shape):
    return torch.randn(*shape)


def _ints(*values):
    return torch.tensor(values)


def _index_items(self, x, i, j):
    """x[...] with SymInt indices: torch.export runs them as select / slice / unsqueeze."""
    a, b = i.item(), j.item()
    torch._check(b >= 0)
    return x[a], x[:, b], x[..., a:b], x[None, b, 1:]


# name -> (forward, example inputs, other inputs of the same shapes)
CASES = {
    "bool_mask": (lambda self, x: x[x > 0] * 2, (_t(6),), (_t(6),)),
    "bool_mask_rows": (lambda self, x: x[x[:, 0] > 0], (_t(5, 3),), (_t(5, 3),)),
    "bool_mask_2d": (lambda self, x: x[x > 0].sum(), (_t(4, 3),), (_t(4, 3),)),
    "mask_then_view": (lambda self, x: x[x > 0].view(-1, 1), (_t(6),), (_t(6),)),
    "mask_and_index": (lambda self, x, i: x[x[:, 0] > 0, i], (_t(5, 3), _ints(1)), (_t(5, 3), _ints(2))),
    "nonzero": (lambda self, x: torch.nonzero(x > 0), (_t(6),), (_t(6),)),
    "nonzero_tuple": (lambda self, x: torch.nonzero(x > 0, as_tuple=True)[0] + 1, (_t(6),), (_t(6),)),
    "where_one_arg": (lambda self, x: torch.where(x > 0)[0], (_t(2, 3),), (_t(2, 3),)),
    "argwhere": (lambda self, x: torch.argwhere(x > 0), (_t(6),), (_t(6),)),
    "masked_select": (lambda self, x: torch.masked_select(x, x > 0), (_t(6),), (_t(6),)),
    "unique": (lambda self, x: torch.unique(x), (_ints(1, 2, 2, 3),), (_ints(5, 5, 5, 5),)),
    "unique_inverse_counts": (
        lambda self, x: torch.unique(x, return_inverse=True, return_counts=True),
        (_ints(1, 2, 2, 3),), (_ints(4, 1, 4, 0),)),
    "unique_consecutive": (lambda self, x: torch.unique_consecutive(x), (_ints(1, 2, 2, 3),),
                           (_ints(1, 1, 2, 1),)),
    "repeat_interleave": (lambda self, x, r: torch.repeat_interleave(x, r, dim=0),
                          (_t(3, 2), _ints(1, 2, 3)), (_t(3, 2), _ints(0, 4, 1))),
    "repeat_interleave_counts": (lambda self, r: torch.repeat_interleave(r), (_ints(1, 2, 3),),
                                 (_ints(3, 0, 1),)),
    "bincount": (lambda self, x: torch.bincount(x), (_ints(1, 2, 2, 3),), (_ints(0, 5, 5, 1),)),
    "item_as_size": (lambda self, x, n: x.new_zeros(n.item()), (_t(2), _ints(4)), (_t(2), _ints(7))),
    "item_as_slice_end": (lambda self, x, n: x[: n.item()], (_t(6), _ints(4)), (_t(6), _ints(2))),
    "tolist_as_sizes": (lambda self, x, n: torch.zeros(n.tolist()), (_t(2), _ints(2, 3)),
                        (_t(2), _ints(4, 1))),
    "mask_slice_head": (lambda self, x: x[x > 0][:3], (_t(8),), (_t(8),)),
    "select_item": (lambda self, x, i: x[i.item()], (_t(5, 3), _ints(2)), (_t(5, 3), _ints(-1))),
    "index_items": (_index_items, (_t(5, 6), _ints(-2), _ints(3)), (_t(5, 6), _ints(1), _ints(4))),
    "mask_fill": (lambda self, x: x.masked_fill(x > 0, 0), (_t(6),), (_t(6),)),
    "mask_put": (lambda self, x: x.index_put((x > 0,), torch.tensor(0.0)), (_t(6),), (_t(6),)),
}


def _module(forward):
    return type("M", (torch.nn.Module,), {"forward": forward})()


_INFINITE = {"oo": float("inf"), "int_oo": float("inf"), "-oo": float("-inf"),
             "-int_oo": float("-inf")}


def _num(bound) -> float:
    return _INFINITE.get(str(bound)) or float(int(bound))


def _ranges(ep) -> dict[str, tuple]:
    return {str(k): (_num(v.lower), _num(v.upper)) for k, v in ep.range_constraints.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_module_matches_eager(name):
    forward, example, other = CASES[name]
    m = _module(forward)
    module = export(m, example).module()
    for inputs in (example, other):
        torch.testing.assert_close(module(*inputs), m(*inputs))


@pytest.mark.parametrize("name", list(CASES))
def test_ranges_at_least_as_tight_as_torch(name):
    forward, example, _ = CASES[name]
    m = _module(forward)
    ours = _ranges(export(m, example))
    theirs = _ranges(torch.export.export(m, example, strict=False))
    # (torch also lists the storage offsets of views at data-dependent places; we do not)
    assert set(ours) <= set(theirs) and bool(ours) == bool(theirs)
    for sym, (lo, hi) in ours.items():
        tlo, thi = theirs[sym]
        assert lo >= tlo and hi <= thi, (ours, theirs)


def test_mask_count_is_bounded_by_numel():
    ep = export(_module(CASES["bool_mask"][0]), (_t(6),))
    (count,) = [v for k, v in ep.range_constraints.items() if str(k).startswith("u")]
    assert str(count) == "VR[0, 6]"


def test_nonzero_count_is_bounded_by_a_dynamic_numel_upper_bound():
    n = Dim("n", max=10)
    ep = export(_module(lambda self, x: torch.nonzero(x)), (_t(6),), dynamic_shapes={"x": {0: n}})
    counts = [v for k, v in ep.range_constraints.items() if str(k).startswith("u")]
    assert [str(c) for c in counts] == ["VR[0, 10]"]
    x = torch.tensor([0.0, 1.0, 0.0, 2.0, 3.0, 0.0, 0.0, 4.0])
    torch.testing.assert_close(ep.module()(x), torch.nonzero(x))


def test_one_mask_gives_one_count_to_every_tensor_it_selects_from():
    def forward(self, x, y):
        m = x > 0
        return torch.stack([x[m], y[m]])  # equal sizes: the same symbol

    ep = export(_module(forward), (_t(6), _t(6)))
    unbacked = [k for k in ep.range_constraints if str(k).startswith("u")]
    assert unbacked == [sympy.Symbol("u0", integer=True)]
    x, y = _t(6), _t(6)
    torch.testing.assert_close(ep.module()(x, y), forward(None, x, y))


def test_byte_mask_exports_where_torch_fails():
    def forward(self, x):
        return x[(x > 0).to(torch.uint8)]

    x = _t(6)
    with pytest.raises(RuntimeError, match="tensors used as indices must be long, int, byte"):
        torch.export.export(_module(forward), (x,), strict=False)
    ep = export(_module(forward), (x,))
    torch.testing.assert_close(ep.module()(x), x[x > 0])


def test_slice_bound_from_item_is_checked_at_run_time():
    def forward(self, x, n):
        k = n.item()
        torch._check(k >= 2)
        return x[:k]

    module = export(_module(forward), (_t(6), _ints(4))).module()
    assert module(_t(6), _ints(3)).shape == (3,)
    with pytest.raises(RuntimeError, match="Runtime assertion failed for expression u0 >= 2"):
        module(_t(6), _ints(1))


def test_item_twice_is_one_symbol():
    def forward(self, x, n):
        return x.new_zeros(n.item()) + x.new_ones(n.item())

    ep = export(_module(forward), (_t(2), _ints(3)))
    assert [str(k) for k in ep.range_constraints] == ["u0"]
    torch.testing.assert_close(ep.module()(_t(2), _ints(5)), torch.ones(5))
