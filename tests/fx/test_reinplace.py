"""``reinplace`` against ``torch.fx.passes.reinplace.reinplace``.

Each program is captured once with torch's ``make_fx(functionalize(f))``; the graph is copied
node by node into an ``exportir.fx.Graph`` (same names, targets and arguments), both graphs are
reinplaced with the same sample inputs, and the results must have identical generated code and
compute the same values as the original program. Sample inputs must not be mutated.

Reproduce one case: ``pytest tests/fx/test_reinplace.py -k <program name>``.
"""

from __future__ import annotations

import pytest
import torch
import torch.fx
from conftest import import_ours_fx, import_ours_pass
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.reinplace import reinplace as torch_reinplace

ours_fx = import_ours_fx()
_ours_pass = import_ours_pass("reinplace")
reinplace = _ours_pass.reinplace
_maybe_get_inplace_op = _ours_pass._maybe_get_inplace_op
aten = torch.ops.aten


def copy_to_ours(tgm: torch.fx.GraphModule):
    """The same graph as an exportir.fx GraphModule (get_attr constants carried over)."""
    graph = ours_fx.Graph()
    env: dict[torch.fx.Node, object] = {}
    for n in tgm.graph.nodes:
        env[n] = graph.create_node(
            n.op, n.target, torch.fx.map_arg(n.args, env.__getitem__),
            torch.fx.map_arg(n.kwargs, env.__getitem__), name=n.name,
        )
    root = {n.target: getattr(tgm, n.target) for n in tgm.graph.nodes if n.op == "get_attr"}
    return ours_fx.GraphModule(root, graph)


def capture(f, args):
    return make_fx(torch.func.functionalize(f, remove="mutations_and_views"))(*args)


# --------------------------------------------------------------------------------------------
# Programs (each a function of its sample inputs).


def add_then_diagonal_fill(x):
    a = torch.add(x, x)
    a.diagonal().fill_(0)
    return a


def index_put_and_column_mul(x):
    a = x.clone()
    a[0] = 1
    a[:, 1].mul_(2)
    return a + 1


def intermediate_returned(x):
    y = x + 1
    z = y * 2
    return y, z


def fresh_buffer_updates(x):
    a = torch.zeros(4, 4)
    a.add_(x)
    a.diagonal().add_(1)
    return a


def input_mutation(x):
    x.add_(1)
    return x * 2


def views_of_clone(x):
    a = x.clone()
    a.view(-1).add_(1)
    a.select(0, 1).mul_(3)
    return a


def split_view(x):
    a = x + 1
    s = a.split(2)
    s[0].add_(1)
    return a


def dtype_change(x):
    a = x.sin()
    b = a.cos()
    return (a + b).ge(0)


def constant_and_aliased_inputs(x, y):
    a = x + torch.tensor([1.0, 2.0, 3.0, 4.0])
    b = y * 2
    b.add_(a[0])
    return b


def overlapping_self(x):
    a = x.expand(4, 4) + 0
    return a.add(1), x.expand(4, 4).clone()


def broadcast_grows_self(x, y):
    return (x.sum() + y).relu()


def chain(x):
    a = x.relu()
    b = a.sigmoid()
    c = b.tanh()
    return c.exp().neg()


def reused_later(x):
    a = x * 2
    b = a + 1
    c = a - b
    return c.abs()


def self_used_twice(x):
    a = x.cos()
    b = a * a
    return b.mul(3)


def slice_scatter_loop(x):
    a = x.clone()
    for i in range(3):
        a[i:i + 1].add_(i)
    return a


def select_twice(x):
    a = x + 0
    a[1].copy_(a[2])
    a[3].zero_()
    return a


def as_strided_write(x):
    a = x.clone()
    a.as_strided((2,), (5,)).mul_(-1)
    return a


def unsqueeze_transpose(x):
    a = x.t().contiguous()
    a.unsqueeze(0).add_(1)
    a.transpose(0, 1).mul_(2)
    return a


def multi_output_unbind(x):
    a = x.clone()
    rows = a.unbind(0)
    rows[1].add_(5)
    return a, rows[0] + 1


def no_inplace_variant(x):
    a = x + 1
    b = torch.mm(a, a.t())
    return b.mean(0)


def integer_and_bool(x):
    a = (x * 10).to(torch.int64)
    b = a % 3
    c = b.eq(1)
    return c.logical_not()


def where_and_clamp(x):
    a = x.clamp(-0.5, 0.5)
    b = torch.where(a > 0, a, a * 2)
    return b.clamp_min(0.1)


def full_like_fill(x):
    a = torch.full_like(x, 2.0)
    a[1:].fill_(3.0)
    return a * x


def _x():
    return torch.randn(4, 4)


def _aliased():
    base = torch.randn(4, 4)
    return base, base[1]


PROGRAMS = {
    f.__name__: (f, make)
    for f, make in [
        (add_then_diagonal_fill, lambda: (_x(),)),
        (index_put_and_column_mul, lambda: (_x(),)),
        (intermediate_returned, lambda: (_x(),)),
        (fresh_buffer_updates, lambda: (_x(),)),
        (input_mutation, lambda: (_x(),)),
        (views_of_clone, lambda: (_x(),)),
        (split_view, lambda: (_x(),)),
        (dtype_change, lambda: (_x(),)),
        (constant_and_aliased_inputs, _aliased),
        (overlapping_self, lambda: (torch.randn(4),)),
        (broadcast_grows_self, lambda: (_x(), _x())),
        (chain, lambda: (_x(),)),
        (reused_later, lambda: (_x(),)),
        (self_used_twice, lambda: (_x(),)),
        (slice_scatter_loop, lambda: (_x(),)),
        (select_twice, lambda: (_x(),)),
        (as_strided_write, lambda: (_x(),)),
        (unsqueeze_transpose, lambda: (_x(),)),
        (multi_output_unbind, lambda: (_x(),)),
        (no_inplace_variant, lambda: (_x(),)),
        (integer_and_bool, lambda: (_x(),)),
        (where_and_clamp, lambda: (_x(),)),
        (full_like_fill, lambda: (_x(),)),
    ]
}


def _clone_args(args):
    """Clones keeping aliasing between the inputs (a view of another input stays a view)."""
    bases: dict[int, torch.Tensor] = {}
    out = []
    for a in args:
        key = a.untyped_storage().data_ptr()
        if key not in bases:
            bases[key] = torch.empty(0).set_(a.untyped_storage()).clone()
        base = bases[key]
        out.append(base.as_strided(a.size(), a.stride(), a.storage_offset()))
    return tuple(out)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_reinplace_matches_torch(name):
    f, make = PROGRAMS[name]
    torch.manual_seed(0)
    args = make()
    theirs = capture(f, _clone_args(args))
    ours = copy_to_ours(theirs)
    assert ours.code == theirs.code  # the copy is faithful before the pass
    before = [a.clone() for a in args]
    torch_reinplace(theirs, *_clone_args(args))
    result = reinplace(ours, *args)
    assert result is ours
    for a, b in zip(args, before):
        assert torch.equal(a, b), "reinplace must not mutate its sample inputs"
    assert ours.code == theirs.code
    for n_ours, n_theirs in zip(ours.graph.nodes, theirs.graph.nodes):
        assert n_ours.meta.get("node_idx") == n_theirs.meta.get("node_idx"), n_ours.name
        view_of = n_ours.meta.get("view_of")
        t_view_of = n_theirs.meta.get("view_of")
        assert getattr(view_of, "name", None) == getattr(t_view_of, "name", None), n_ours.name
    expected = f(*_clone_args(args))
    torch.testing.assert_close(ours(*_clone_args(args)), expected)


def test_some_programs_are_actually_reinplaced():
    f, make = PROGRAMS["chain"]
    args = make()
    gm = reinplace(copy_to_ours(capture(f, args)), *args)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets == [aten.relu.default, aten.sigmoid_.default, aten.tanh_.default,
                       aten.exp_.default, aten.neg_.default]


def test_diagonal_scatter_is_removed():
    f, make = PROGRAMS["add_then_diagonal_fill"]
    args = make()
    gm = reinplace(copy_to_ours(capture(f, args)), *args)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert aten.diagonal_scatter.default not in targets
    assert aten.fill_.Scalar in targets


def test_inplace_variant_lookup():
    assert _maybe_get_inplace_op(aten.add.Tensor) is aten.add_.Tensor
    assert _maybe_get_inplace_op(aten.mm.default) is None
    assert _maybe_get_inplace_op(aten.view.default) is None
    assert _maybe_get_inplace_op("add") is None


def test_meta_without_kernel_raises_the_op_error():
    def f(x):
        return x.nonzero() + 1
    args = (torch.tensor([0.0, 1.0, 2.0]),)
    gm = copy_to_ours(capture(f, args))
    with pytest.raises(Exception):  # noqa: B017  # nonzero has no data-free shape
        reinplace(gm, *args)


# --------------------------------------------------------------------------------------------
# Random programs: chains of functional ops and view mutations with arbitrary reuse.

_UNARY = [torch.sin, torch.relu, torch.neg, torch.clone, lambda t: t * 2]
_BINARY = [torch.add, torch.mul, torch.sub, torch.maximum]
_VIEW_WRITES = [
    lambda t, k: t[k % 4].add_(1),
    lambda t, k: t.diagonal().mul_(2),
    lambda t, k: t[:, k % 3:k % 3 + 2].fill_(float(k)),
    lambda t, k: t.select(1, k % 4).copy_(t[0]),
    lambda t, k: t.view(-1)[k:k + 3].neg_(),
    lambda t, k: t.add_(k),
]


def random_program(seed: int):
    import random
    rng = random.Random(seed)
    steps = []
    for _ in range(rng.randint(3, 10)):
        kind = rng.choice(["unary", "binary", "write", "write"])
        steps.append((kind, rng.random(), rng.random(), rng.randrange(6), rng.randrange(8)))
    n_out = rng.randint(1, 3)

    def program(x, y):
        values = [x, y]
        fresh: list[torch.Tensor] = []
        for kind, r1, r2, choice, k in steps:
            a = values[int(r1 * len(values))]
            if kind == "unary":
                values.append(_UNARY[choice % len(_UNARY)](a))
                fresh.append(values[-1])
            elif kind == "binary":
                values.append(_BINARY[choice % len(_BINARY)](a, values[int(r2 * len(values))]))
                fresh.append(values[-1])
            elif fresh:
                _VIEW_WRITES[choice](fresh[int(r2 * len(fresh))], k)
        return tuple(values[-n_out:])
    return program


@pytest.mark.parametrize("seed", range(60))
def test_random_programs_match_torch(seed):
    f = random_program(seed)
    torch.manual_seed(seed)
    args = (torch.randn(4, 4), torch.randn(4, 4))
    theirs = capture(f, _clone_args(args))
    ours = copy_to_ours(theirs)
    # The functional graph is the reference: eager ``f`` may copy between overlapping views.
    expected = theirs(*_clone_args(args))
    torch_reinplace(theirs, *_clone_args(args))
    reinplace(ours, *args)
    assert ours.code == theirs.code
    torch.testing.assert_close(ours(*_clone_args(args)), expected)
