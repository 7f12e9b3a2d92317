"""Functionalization: in-place, out= and view mutations become functional ops plus mutation
outputs; checked against eager semantics and torch.export's decomposed form."""

from __future__ import annotations

import copy
import warnings
from collections import Counter

import pytest
import torch
from torch import nn

from exportir.export._export import export
from exportir.export.capture.functionalize import FunctionalizationError, functional_variant

aten = torch.ops.aten


@pytest.mark.parametrize(
    "op, expected",
    [
        (aten.add_.Tensor, aten.add.Tensor),
        (aten.mul_.Scalar, aten.mul.Scalar),
        (aten.add.out, aten.add.Tensor),
        (aten.bernoulli_.float, aten.bernoulli.p),
        (aten.copy_.default, aten.copy.default),
        (aten._native_batch_norm_legit.default, aten._native_batch_norm_legit_functional.default),
    ],
)
def test_functional_variant(op, expected):
    assert functional_variant(op) is expected


def _targets(ep):
    return Counter(n.target for n in ep.graph.nodes if n.op == "call_function")


def _run_graph(ep, mod, args):
    """Run the exported graph with real tensors; returns (mutation values, user outputs)."""
    state = {**dict(mod.named_parameters()), **dict(mod.named_buffers()), **ep.constants}
    user = iter(torch.utils._pytree.tree_leaves(args))
    flat = [
        next(user) if s.kind.name == "USER_INPUT" else state[s.target]
        for s in ep.graph_signature.input_specs
    ]
    out = ep.graph_module(*flat)
    specs = ep.graph_signature.output_specs
    mutations = {s.target: v for s, v in zip(specs, out) if s.kind.name != "USER_OUTPUT"}
    users = [v for s, v in zip(specs, out) if s.kind.name == "USER_OUTPUT"]
    return mutations, users


class InplaceAndOut(nn.Module):
    def forward(self, x):
        y = x * 1
        y.add_(2).mul_(3)
        out = torch.empty(3)
        torch.add(y, 1, out=out)
        return out


class ViewWrites(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.zeros(4, 4))

    def forward(self, x):
        self.buf[0].add_(x)
        self.buf[:, 1:3].mul_(2)
        self.buf.diagonal().fill_(5.0)
        flat = self.buf.view(-1)
        flat[3:5] = 7.0
        t = self.buf.t()
        t[0].sub_(1)
        return self.buf + 0


class InputWrites(nn.Module):
    def forward(self, a, b):
        a.add_(1)
        b[1].mul_(2)
        return a + b


def test_inplace_and_out_become_functional():
    ep = export(InplaceAndOut(), (torch.randn(3),))
    targets = _targets(ep)
    assert aten.add_.Tensor not in targets and aten.mul_.Tensor not in targets
    assert aten.add.out not in targets
    x = torch.randn(3)
    _, (out,) = _run_graph(ep, InplaceAndOut(), (x,))
    torch.testing.assert_close(out, (x + 2) * 3 + 1)


def test_buffer_writes_through_views_match_eager():
    mod = ViewWrites()
    x = torch.randn(4)
    ep = export(copy.deepcopy(mod), (x,))
    mutations, (out,) = _run_graph(ep, copy.deepcopy(mod), (x,))
    eager = copy.deepcopy(mod)
    expected = eager(x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(mutations["buf"], eager.buf)
    assert [s.kind.name for s in ep.graph_signature.output_specs] == [
        "BUFFER_MUTATION",
        "USER_OUTPUT",
    ]
    for node in ep.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        assert schema is None or not schema.is_mutable, node.format_node()


def test_user_input_mutations_are_outputs_in_input_order():
    a, b = torch.randn(3), torch.randn(2, 3)
    ep = export(InputWrites(), (a.clone(), b.clone()))
    specs = ep.graph_signature.output_specs
    assert [(s.kind.name, s.target) for s in specs] == [
        ("USER_INPUT_MUTATION", "a"),
        ("USER_INPUT_MUTATION", "b"),
        ("USER_OUTPUT", None),
    ]
    mutations, (out,) = _run_graph(ep, InputWrites(), (a.clone(), b.clone()))
    ea, eb = a.clone(), b.clone()
    expected = InputWrites()(ea, eb)
    torch.testing.assert_close(mutations["a"], ea)
    torch.testing.assert_close(mutations["b"], eb)
    torch.testing.assert_close(out, expected)


def test_view_write_decomposes_like_torch():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torch.export.export(
            InputWrites(), (torch.randn(3), torch.randn(2, 3)), strict=False
        )
        theirs = theirs.run_decompositions()
    ours = export(InputWrites(), (torch.randn(3), torch.randn(2, 3))).run_decompositions()
    assert _targets(ours) == _targets(theirs)


@pytest.mark.parametrize("training", [True, False])
def test_batchnorm_functional_form(training):
    bn = nn.BatchNorm1d(3).train(training)
    ep = export(copy.deepcopy(bn), (torch.randn(4, 3),)).run_decompositions()
    targets = _targets(ep)
    if training:
        assert targets[aten._native_batch_norm_legit_functional.default] == 1
        mutated = [
            s.target for s in ep.graph_signature.output_specs if s.kind.name == "BUFFER_MUTATION"
        ]
        assert mutated == ["running_mean", "running_var", "num_batches_tracked"]
    else:
        assert targets[aten._native_batch_norm_legit_no_training.default] == 1
        assert all(s.kind.name == "USER_OUTPUT" for s in ep.graph_signature.output_specs)


def test_whole_buffer_copy_is_the_source_value():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("buf", torch.zeros(3))

        def forward(self, x):
            self.buf.copy_(x * 2)
            return x + 1

    ep = export(M(), (torch.randn(3),))
    assert aten.copy.default not in _targets(ep)
    mutation = ep.graph_signature.output_specs[0]
    assert mutation.kind.name == "BUFFER_MUTATION" and mutation.arg.name == "mul"


def test_shape_change_of_an_input_is_an_error():
    class M(nn.Module):
        def forward(self, x):
            x.unsqueeze_(0)
            return x

    with pytest.raises(FunctionalizationError, match=r"(?s)input 'x' in place.*test_functionalize"):
        export(M(), (torch.randn(3),))


class GradInplaceActivations(nn.Module):
    """In-place activations on tensors that require grad (computed from parameters): autograd
    saves each input with a clone below the dispatcher, which capture sees and torch.export
    does not."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        h = nn.functional.silu(self.a(x), inplace=True)
        kept = h.clone()  # a clone the user asked for: named as torch names it
        h = torch.sigmoid_(self.b(h))
        return h + kept.clone()


def test_autograd_saved_clones_take_no_names():
    mod, args = GradInplaceActivations(), (torch.randn(2, 4),)
    ours = [n.name for n in export(copy.deepcopy(mod), args).graph.nodes]
    theirs_ep = torch.export.export(mod, args, strict=False).run_decompositions({})
    theirs = [n.name for n in theirs_ep.graph.nodes]
    assert ours == theirs
    assert "clone" in ours and "clone_1" in ours


def _mutated_then_viewed(x):
    y = x * 2
    y.relu_()
    v = y.view(16)
    return v.view(2, 8), (y + 1).view(16)


def _view_written_then_viewed(x):
    y = torch.cat([x * 2, x * 3], 1)[:, :8]  # a full slice: an alias of the cat
    y += torch.cat([x, x], 1)
    z = y.unsqueeze(0)
    z.relu_()
    return z.squeeze(0) * 5


class _AutogradArtifacts(nn.Module):
    """Ops whose backward saves their result (relu, sigmoid) and an in-place write through a
    view of a tensor requiring grad: autograd's detach / alias records, beside the user's."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)

    def forward(self, x):
        h = torch.relu(self.a(x))
        g = torch.sigmoid(h).detach()
        w = torch.cat([h, h], 1)[:, :16]
        w += 1
        return w.detach() + g.sum()


class _UsersDetach(nn.Module):
    """The user's detach right after an op whose result autograd does not save (gelu): kept,
    with a detach's name, in a graph with nothing to functionalize."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        return nn.functional.gelu(self.a(x)).detach() * 2


class _Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize(
    "make, shape",
    [
        (lambda: _Fn(_mutated_then_viewed), (4, 4)),
        (lambda: _Fn(_view_written_then_viewed), (1, 4, 3, 3)),
        (_AutogradArtifacts, (2, 4)),
        (_UsersDetach, (2, 4)),
    ],
    ids=[
        "views_of_a_written_storage",
        "view_written_in_place",
        "autograd_artifacts",
        "users_detach",
    ],
)
def test_node_names_follow_torch_functionalization(make, shape):
    """A view of a storage written before is made stale and replayed from the storage at its
    first use (the view made first is dead but named, as torch's); nodes autograd makes below
    the dispatcher take no names."""
    args = (torch.randn(shape),)
    ours = [n.name for n in export(make(), args).graph.nodes]
    theirs_ep = torch.export.export(make(), args, strict=False).run_decompositions({})
    assert ours == [n.name for n in theirs_ep.graph.nodes]
