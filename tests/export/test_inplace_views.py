"""In-place view ops and in-place shape changes, functionalized as torch.export does.

``y.unsqueeze_(0)`` makes ``y`` the view ``unsqueeze(y as it was)`` of the same storage: later
reads replay it, later writes through it reach the base (and the graph inputs / buffers the base
is a view of). Each case is exported by exportir and by ``torch.export.export(strict=False)`` (the
oracle): ``ep.module()`` must equal eager on the example and on fresh inputs (inputs mutated
alike), the graph must be functional and pass the verifier, and the graph signature and op
multiset must equal torch's, before and after ``run_decompositions()``, except for the
differences listed in ``KNOWN_DIFFERENCES`` (asserted exactly).
"""

from __future__ import annotations

import copy
import warnings
from collections import Counter
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from exportir import Dim
from exportir.export._export import export
from exportir.export.capture.fake import fake_like
from exportir.export.capture.functionalize import FunctionalizationError, inplace_view_target

aten = torch.ops.aten


# --- the programs ----------------------------------------------------------------------------


class Unsqueeze(nn.Module):
    def forward(self, x):
        y = x * 2
        y.unsqueeze_(0)
        return y + 1


class T(nn.Module):
    def forward(self, x):
        y = x * 2
        y.t_()
        return y + 1


class Squeeze(nn.Module):
    def forward(self, x):
        y = x * 2
        y.squeeze_()
        z = x + 1
        z.squeeze_(1)
        return y, z


class Transpose(nn.Module):
    def forward(self, x):
        y = x * 2
        y.transpose_(0, 1)
        y.add_(1)
        return y


class AsStrided(nn.Module):
    def forward(self, x):
        y = x * 2
        y.as_strided_((2, 2), (1, 3))
        return y * 3


class Swapdims(nn.Module):
    def forward(self, x):
        y = x * 2
        y.swapdims_(0, 1)
        return y.sum(0)


class Resize(nn.Module):
    def __init__(self, *size: int) -> None:
        super().__init__()
        self.size = size

    def forward(self, x):
        y = x * 2
        y.resize_(*self.size)
        return y + 1


class ResizeBiggerThenFill(nn.Module):
    def forward(self, x):
        y = x * 2
        y.resize_(4, 4)
        y.fill_(1.0)
        return y + x.sum()


class ResizeAs(nn.Module):
    def forward(self, x, t):
        y = x * 2
        y.resize_as_(t)
        return y + 1


class OutResized(nn.Module):
    def forward(self, x):
        out = torch.empty(0)
        torch.add(x, 1, out=out)
        return out * 2


class ViewOfIntermediate(nn.Module):
    def forward(self, x):
        y = x * 2
        z = y[1]
        z.unsqueeze_(0)
        z.add_(1)  # reaches y
        return y, z


class AliasSeesWrite(nn.Module):
    def forward(self, x):
        y = x * 2
        w = y.view(-1)  # taken before y changes shape: still sees y's writes
        y.t_()
        y.mul_(3)
        y[0].add_(1)
        return w + 0, y + 0


class ViewOfInput(nn.Module):
    def forward(self, x):
        z = x[0]
        z.t_()
        z.mul_(2)  # reaches the input
        return z + 1


class ViewOfBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("buf", torch.zeros(3, 4))

    def forward(self, x):
        z = self.buf[1]
        z.unsqueeze_(0)
        z.add_(x)  # reaches the buffer
        return z * 2


class DetachedInput(nn.Module):
    def forward(self, x):
        d = x.detach()
        d.unsqueeze_(0)  # d's shape changes, x's does not
        d.mul_(2)  # reaches x
        return d + 1


class Repeated(nn.Module):
    def forward(self, x):
        y = x * 2
        y.unsqueeze_(0)
        y.unsqueeze_(-1)
        y.squeeze_(0)
        y.add_(1)
        y.transpose_(0, 1)
        y[0].mul_(3)
        return y.clone(), x


class SplitPiece(nn.Module):
    def forward(self, x):
        y = x * 2
        a, b = y.split(2)
        a.unsqueeze_(0)
        a.add_(1)
        return y + 0, a * 1, b * 1


class Pieces(nn.Module):
    """Writes through pieces of unbind / split_with_sizes / chunk go back with torch's
    inverses (select_scatter, slice_scatter)."""

    def forward(self, x):
        y = x * 2
        _, b, _ = y.unbind(1)
        b.mul_(3)
        _, q = y.split([1, 3], dim=0)
        q.t_()
        q.add_(1)
        r = y.chunk(2, dim=-1)[1]
        r.sub_(2)
        return y + 0, b * 1, q * 1


class ReturnBoth(nn.Module):
    def forward(self, x):
        y = x + 1
        z = y.view(-1)
        y.t_()
        return y, z


class SetSource(nn.Module):
    def forward(self, x):
        y = x * 2
        s = x + 1
        y.set_(s)  # y is now another tensor over s's storage
        y.mul_(3)
        return s + 0, y + 0


class SetEmpty(nn.Module):
    def forward(self, x):
        y = x * 2
        y.set_()  # y is now an empty tensor of its own
        return y.sum() + x


class InCond(nn.Module):
    def forward(self, x):
        def true_fn(x):
            y = x * 2
            y.t_()
            y.add_(1)
            return y.clone()

        def false_fn(x):
            return x.t() - 1

        return torch.cond(x.sum() > 0, true_fn, false_fn, (x,))


class Pool1dTransposed(nn.Module):
    """ATen's adaptive_avg_pool2d restrides its result with ``as_strided_`` on channels-last
    input (HF swin's pooler)."""

    def forward(self, x):
        return F.adaptive_avg_pool1d(x.transpose(1, 2), 1)


class Pool2dChannelsLast(nn.Module):
    """torchvision convnext / swin_t, timm coatnet: global pooling of a permuted input."""

    def forward(self, x):
        return F.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), 1) * 2


class Stft(nn.Module):
    """ATen's stft ends with ``transpose_`` and ``squeeze_`` on its result."""

    def forward(self, x):
        window = torch.hann_window(16)
        return torch.stft(x, 16, return_complex=True, window=window).abs()


def _r(*shape: int) -> Callable[[int], tuple]:
    def make(seed: int) -> tuple:
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(*shape, generator=g),)

    return make


def _two(a: tuple, b: tuple) -> Callable[[int], tuple]:
    return lambda seed: (_r(*a)(seed)[0], _r(*b)(seed + 100)[0])


CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[int], tuple]]] = {
    "unsqueeze_": (Unsqueeze, _r(3)),
    "t_": (T, _r(2, 3)),
    "squeeze_": (Squeeze, _r(2, 1, 3)),
    "transpose_": (Transpose, _r(2, 3)),
    "as_strided_": (AsStrided, _r(2, 3)),
    "swapdims_": (Swapdims, _r(2, 3)),
    "resize_same_numel": (lambda: Resize(6), _r(2, 3)),
    "resize_smaller": (lambda: Resize(2, 2), _r(2, 3)),
    "resize_bigger_then_fill": (ResizeBiggerThenFill, _r(2, 3)),
    "resize_as_": (ResizeAs, _two((2, 3), (3, 2))),
    "out_resized": (OutResized, _r(2, 3)),
    "view_of_intermediate": (ViewOfIntermediate, _r(2, 3)),
    "alias_sees_write": (AliasSeesWrite, _r(2, 3)),
    "view_of_input": (ViewOfInput, _r(2, 3, 4)),
    "view_of_buffer": (ViewOfBuffer, _r(4)),
    "detached_input": (DetachedInput, _r(3)),
    "repeated": (Repeated, _r(2, 3)),
    "split_piece": (SplitPiece, _r(4, 3)),
    "pieces": (Pieces, _r(4, 3)),
    "return_both": (ReturnBoth, _r(2, 3)),
    "set_": (SetSource, _r(2, 3)),
    "set_empty": (SetEmpty, _r(3)),
    "in_cond": (InCond, _r(2, 3)),
    "adaptive_avg_pool1d_transposed": (Pool1dTransposed, _r(2, 6, 4)),
    "adaptive_avg_pool2d_channels_last": (Pool2dChannelsLast, _r(2, 4, 4, 3)),
    "stft": (Stft, _r(64)),
}

# (stage, case) -> (ours-only ops, torch-only ops, reason); asserted exactly
KNOWN_DIFFERENCES: dict[tuple[str, str], tuple[dict, dict, str]] = {}


# --- helpers ---------------------------------------------------------------------------------


def _ops(ep) -> Counter:
    return Counter(str(n.target) for n in ep.graph.nodes if n.op == "call_function")


def _torch_export(mod: nn.Module, args: tuple):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.export(mod, args, strict=False)


def _leaves(x) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _assert_same(got, want) -> None:
    got, want = _leaves(got), _leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def _check_difference(stage: str, name: str, ours: Counter, theirs: Counter) -> None:
    only_ours, only_torch, _reason = KNOWN_DIFFERENCES.get((stage, name), ({}, {}, ""))
    assert (dict(ours - theirs), dict(theirs - ours)) == (only_ours, only_torch)


@pytest.fixture(scope="module")
def exported() -> dict:
    """name -> (ours, torch's) exported programs, made once per module."""
    return {}


def _pair(exported: dict, name: str):
    if name not in exported:
        make, inputs = CASES[name]
        ours = export(make(), inputs(0))
        theirs = _torch_export(make(), inputs(0))
        exported[name] = (ours, theirs)
    return exported[name]


# --- the cases against eager and torch.export ------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_module_matches_eager(exported, name):
    make, inputs = CASES[name]
    ours, _ = _pair(exported, name)
    eager, module = make(), ours.module()  # buffers carry over from call to call in both
    for seed in (0, 1):
        eager_in, our_in = inputs(seed), inputs(seed)
        _assert_same(module(*our_in), eager(*eager_in))
        _assert_same(our_in, eager_in)  # input mutations applied alike
        _assert_same(list(module.buffers()), list(eager.buffers()))


@pytest.mark.parametrize("name", list(CASES))
def test_graph_is_functional(exported, name):
    ours, _ = _pair(exported, name)
    ours.validate()
    graphs = [m.graph for m in ours.graph_module.modules() if hasattr(m, "graph")]
    assert len(graphs) == (3 if name == "in_cond" else 1)  # cond's branches are checked too
    for node in (n for g in graphs for n in g.nodes):
        schema = getattr(node.target, "_schema", None)
        assert schema is None or not schema.is_mutable, node.format_node()


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch(exported, name):
    ours, theirs = _pair(exported, name)
    decomposed = theirs.run_decompositions({})
    _check_difference("aten", name, _ops(ours), _ops(decomposed))
    if ("aten", name) not in KNOWN_DIFFERENCES:  # output names follow the ops
        assert str(ours.graph_signature) == str(decomposed.graph_signature)


@pytest.mark.slow  # torch's run_decompositions() of every case, live (~15 s)
@pytest.mark.parametrize("name", list(CASES))
def test_core_decomposition_matches_torch(exported, name):
    make, inputs = CASES[name]
    _, theirs = _pair(exported, name)
    ours_core = export(make(), inputs(0)).run_decompositions()  # buffers as in a fresh module
    _check_difference("core", name, _ops(ours_core), _ops(theirs.run_decompositions()))
    _assert_same(ours_core.module()(*inputs(1)), make()(*inputs(1)))


def test_known_differences_name_cases():
    assert {name for _, name in KNOWN_DIFFERENCES} <= set(CASES)


# --- what the graph says -----------------------------------------------------------------------


def test_inplace_view_becomes_the_view_op():
    ep = export(Unsqueeze(), (torch.randn(3),))
    mul, unsqueeze, add = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert (mul.target, unsqueeze.target, add.target) == (
        aten.mul.Tensor,
        aten.unsqueeze.default,
        aten.add.Tensor,
    )
    assert unsqueeze.args == (mul, 0) and add.args[0] is unsqueeze
    # the value recorded before the in-place change keeps the layout it had
    assert tuple(mul.meta["val"].shape) == (3,)
    assert tuple(unsqueeze.meta["val"].shape) == (1, 3)


def test_write_through_changed_view_scatters_with_torch_inverses():
    ep = export(ViewOfIntermediate(), (torch.randn(2, 3),))
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert targets[:5] == [
        aten.mul.Tensor,
        aten.select.int,
        aten.unsqueeze.default,
        aten.add.Tensor,
        aten.squeeze.dim,  # unsqueeze's inverse
    ]
    assert aten.select_scatter.default in targets


def test_buffer_mutation_through_changed_view():
    mod = ViewOfBuffer()
    x = torch.randn(4)
    ep = export(copy.deepcopy(mod), (x,))
    specs = [(s.kind.name, s.target) for s in ep.graph_signature.output_specs]
    assert specs == [("BUFFER_MUTATION", "buf"), ("USER_OUTPUT", None)]
    module = ep.module()
    module(x)
    eager = copy.deepcopy(mod)
    eager(x)
    torch.testing.assert_close(module.buf, eager.buf)


@pytest.mark.parametrize(
    "op, view",
    [
        (aten.unsqueeze_.default, aten.unsqueeze.default),
        (aten.squeeze_.dim, aten.squeeze.dim),
        (aten.squeeze_.dims, aten.squeeze.dims),
        (aten.t_.default, aten.t.default),
        (aten.transpose_.default, aten.transpose.int),
        (aten.as_strided_.default, aten.as_strided.default),
        (aten.add_.Tensor, None),
        (aten.resize_.default, None),
        (aten.detach_.default, aten.detach.default),
    ],
)
def test_inplace_view_target(op, view):
    assert inplace_view_target(op) is view


# --- dynamic shapes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, shape, fresh",
    [
        (Pool2dChannelsLast, (2, 4, 4, 3), (5, 4, 4, 3)),
        (Unsqueeze, (3,), (7,)),
        (Pool1dTransposed, (2, 6, 4), (3, 6, 4)),
        (OutResized, (2, 3), (5, 3)),  # the out= tensor grows to a symbolic size
    ],
)
def test_dynamic_batch(make, shape, fresh):
    batch = Dim("batch", min=2, max=64)
    ep = export(make(), (torch.randn(*shape),), dynamic_shapes=({0: batch},))
    x = torch.randn(*fresh)
    torch.testing.assert_close(ep.module()(x), make()(x))


# --- what torch refuses, refused with advice ---------------------------------------------------


class InputUnsqueeze(nn.Module):
    def forward(self, x):
        x.unsqueeze_(0)
        return x + 1


class InputT(nn.Module):
    def forward(self, x):
        x.t_()
        return x + 1


class BufferT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("buf", torch.zeros(3, 4))

    def forward(self, x):
        self.buf.t_()
        return self.buf + x


@pytest.mark.parametrize(
    "make, x, what, line",
    [
        (InputUnsqueeze, torch.randn(3), "aten::unsqueeze_ changes the shape of input 'x'",
         "x.unsqueeze_(0)"),
        (InputT, torch.randn(2, 3), "aten::t_ changes the shape of input 'x'", "x.t_()"),
        (BufferT, torch.randn(4, 3), "aten::t_ changes the shape of buffer 'buf'",
         "self.buf.t_()"),
    ],
)
def test_shape_change_of_input_or_buffer_is_refused(make, x, what, line):
    with pytest.raises(Exception):  # noqa: B017  (torch fails with internal errors here)
        _torch_export(make(), (x.clone(),)).run_decompositions({})
    with pytest.raises(FunctionalizationError) as info:
        export(make(), (x.clone(),))
    text = str(info.value)
    assert what in text
    assert "test_inplace_views.py" in text and line in text  # the user's line
    assert "out-of-place" in text  # what to do


class ResizeGrowsView(nn.Module):
    def forward(self, x):
        y = x * 2
        v = y[0]
        v.resize_(10)
        return y + 1


class ResizeSymbolic(nn.Module):
    def forward(self, x):
        y = x * 2
        y.resize_(x.shape[0] * 3 - 1)
        return y + 1


class SetEmptyView(nn.Module):
    def forward(self, x):
        y = x * 2
        v = y[0]
        v.set_()
        return y + 1


def test_resize_growing_a_view_is_refused():
    with pytest.raises(FunctionalizationError, match=r"(?s)grows a view.*v\.resize_\(10\).*clone"):
        export(ResizeGrowsView(), (torch.randn(2, 3),))


def test_resize_to_symbolic_size_is_refused():
    batch = Dim("batch", min=2, max=64)
    with pytest.raises(FunctionalizationError, match=r"(?s)symbolic size.*resize_\(.*reshape"):
        export(ResizeSymbolic(), (torch.randn(4, 3),), dynamic_shapes=({0: batch},))


def test_emptying_a_view_is_refused():
    with pytest.raises(FunctionalizationError, match=r"(?s)empties a view.*v\.set_\(\).*new_empty"):
        export(SetEmptyView(), (torch.randn(2, 3),))


# --- fakes follow in-place layout changes --------------------------------------------------------


def test_fake_reports_layout_after_inplace_changes():
    x = fake_like(torch.randn(2, 3))
    y = x * 2
    y.unsqueeze_(0)
    assert (tuple(y.shape), y.stride()) == ((1, 2, 3), (6, 3, 1))
    y.resize_(4, 4)  # larger than the storage
    assert (tuple(y.shape), y.stride()) == ((4, 4), (4, 1))
    y.t_()
    assert y.stride() == (1, 4)
    y.as_strided_((2, 2), (1, 3), 1)
    assert (tuple(y.shape), y.stride(), y.storage_offset()) == ((2, 2), (1, 3), 1)
    out = fake_like(torch.empty(0))
    torch.add(x, 1, out=out)  # resized by the op
    assert tuple(out.shape) == (2, 3)


# --- real models -------------------------------------------------------------------------------

REAL_MODELS = ["swin", "timm_coat", "tv_convnext_tiny", "tv_swin_t"]


@pytest.mark.parametrize("name", REAL_MODELS)
def test_real_model_with_channels_last_pooling(name):
    from corpus import real_models as R

    case = R.build(name)
    with torch.no_grad():
        want = case.model(**case.kwargs)
    ep = export(case.model, (), case.kwargs)
    _assert_same(ep.module()(**case.kwargs), want)
    dynamic = export(case.model, (), case.kwargs, dynamic_shapes=case.dynamic_shapes())
    fresh = case.fresh_inputs()
    with torch.no_grad():
        want = case.model(**fresh)
    _assert_same(dynamic.module()(**fresh), want)
