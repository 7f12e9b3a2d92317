"""Non-strict capture (exportir.export.capture.recorder / _export) against torch.export as the oracle.

Each small model here is exported by both; we compare placeholder names, signature
kinds/targets, the numerics of the captured graph run as an exportir.fx GraphModule with real
tensors, the op multiset after decomposition, and the node metadata. Error paths check that the
message names the user's line and the fix.

Reproduce one case: ``PYTHONPATH=src .venv/bin/python -m pytest -p no:xdist
tests/export/test_capture.py -k <name>``.
"""

from __future__ import annotations

import copy
import warnings
from collections import Counter, namedtuple

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from exportir.export._export import export
from exportir.export.capture._retrace import retrace
from exportir.export.capture.fake import DataDependentError, FakeTensor, MissingFakeImplError
from exportir.export.capture.recorder import ExportError

# ----------------------------------------------------------------------------- models


class Basic(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("buf", torch.zeros(3))
        self.register_buffer("scratch", torch.ones(3), persistent=False)
        self.const = torch.arange(3.0)

    def forward(self, x, y, *, k=2):
        z = self.lin(x) + self.const + self.scratch
        self.buf.add_(1)
        return z * k + y, torch.tensor([1.0, 2.0, 3.0]) + y


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])

    def forward(self, x):
        x = self.seq(x)
        for block in self.blocks:  # unrolled
            x = torch.tanh(block(x))
        return x.max(dim=1)


Pair = namedtuple("Pair", ["a", "b"])


class PytreeIO(nn.Module):
    def forward(self, x, rest, opts):
        left, right = rest
        out = x + left * opts["scale"] + right[0]
        return {"sum": out, "pair": Pair(out.sum(0), x)}, opts["tag"]


class StaticValues(nn.Module):
    def forward(self, x, n, flag=True, opt=None):
        y = x * (n + 7)  # n + 7 is burned in
        if flag:
            y = y - 1
        if opt is not None:
            y = y + opt
        for i in range(n):
            y = y + i
        return y


class BatchNormTrain(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class ViewMutations(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 3))

    def forward(self, x, y):
        self.cache[1:3] = x  # buffer slice assignment
        y[0].add_(1)  # user input mutation through a view
        y.view(-1).mul_(2)
        return self.cache.sum(0) + y[1]


class BufferReassign(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(2))

    def forward(self, x):
        self.count = self.count + x.sum(0)
        return x * self.count


class NoGradAutocast(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            y = self.lin(x)
        torch._check(x.shape[0] == 2)
        torch._assert(x.dim() == 2, "rank")
        with torch.autocast("cpu", enabled=False):
            y = y * 2
        return y, x


def _basic():
    return Basic(), (torch.randn(2, 4), torch.randn(2, 3)), {"k": 3}


CASES = {
    "basic": _basic,
    "nested": lambda: (Nested(), (torch.randn(2, 4),), {}),
    "pytree_io": lambda: (
        PytreeIO(),
        (torch.randn(2, 3), (torch.randn(2, 3), [torch.randn(3)]), {"scale": 2.0, "tag": "t"}),
        {},
    ),
    "static_values": lambda: (StaticValues(), (torch.randn(3), 3), {"flag": False}),
    "batchnorm_train": lambda: (BatchNormTrain().train(), (torch.randn(2, 3, 6, 6),), {}),
    "batchnorm_eval": lambda: (BatchNormTrain().eval(), (torch.randn(2, 3, 6, 6),), {}),
    "view_mutations": lambda: (ViewMutations(), (torch.randn(2, 3), torch.randn(2, 3)), {}),
    "buffer_reassign": lambda: (BufferReassign(), (torch.randn(3, 2),), {}),
    "no_grad_autocast": lambda: (NoGradAutocast(), (torch.randn(2, 4),), {}),
}


def _both(name):
    torch.manual_seed(0)
    mod, args, kwargs = CASES[name]()
    ours = export(copy.deepcopy(mod), copy.deepcopy(args), copy.deepcopy(kwargs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torch.export.export(
            copy.deepcopy(mod), copy.deepcopy(args), copy.deepcopy(kwargs), strict=False
        )
    return mod, args, kwargs, ours, theirs


def _input_specs(ep):
    return [
        (s.kind.name, s.arg.name, s.target, getattr(s, "persistent", None))
        for s in ep.graph_signature.input_specs
    ]


def _ops(ep):
    return Counter(str(n.target) for n in ep.graph.nodes if n.op == "call_function")


# ----------------------------------------------------------------------------- oracle tests


@pytest.mark.parametrize("name", list(CASES))
def test_placeholders_and_input_specs_match_torch(name):
    _, _, _, ours, theirs = _both(name)
    assert _input_specs(ours) == _input_specs(theirs)
    names = [n.name for n in ours.graph.nodes if n.op == "placeholder"]
    assert names == [n.name for n in theirs.graph.nodes if n.op == "placeholder"]


@pytest.mark.parametrize("name", list(CASES))
def test_output_kinds_and_targets_match_torch_after_decomposition(name):
    _, _, _, ours, theirs = _both(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = theirs.run_decompositions()
    kinds = [(s.kind.name, s.target) for s in ours.graph_signature.output_specs]
    assert kinds == [(s.kind.name, s.target) for s in theirs.graph_signature.output_specs]


@pytest.mark.parametrize("name", list(CASES))
def test_op_multiset_after_decomposition_matches_torch(name):
    _, _, _, ours, theirs = _both(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = _ops(theirs.run_decompositions())
    assert _ops(ours.run_decompositions()) == expected


@pytest.mark.parametrize("name", list(CASES))
def test_captured_graph_runs_like_eager(name):
    mod, args, kwargs, ours, _ = _both(name)
    eager_mod, eager_args = copy.deepcopy(mod), copy.deepcopy(args)
    expected = eager_mod(*eager_args, **kwargs)
    flat_inputs = _flat_graph_inputs(ours, mod, copy.deepcopy(args), kwargs)
    got = ours.graph_module(*flat_inputs)
    user_outputs = [
        v
        for v, s in zip(got, ours.graph_signature.output_specs)
        if s.kind.name == "USER_OUTPUT" and isinstance(v, torch.Tensor)
    ]
    want = [t for t in torch.utils._pytree.tree_leaves(expected) if isinstance(t, torch.Tensor)]
    assert len(user_outputs) == len(want)
    for a, b in zip(user_outputs, want):
        torch.testing.assert_close(a, b)


def _flat_graph_inputs(ep, mod, args, kwargs):
    state = {**dict(mod.named_parameters()), **dict(mod.named_buffers()), **ep.constants}
    values = []
    user = iter(torch.utils._pytree.tree_leaves((args, kwargs)))
    for spec in ep.graph_signature.input_specs:
        values.append(next(user) if spec.kind.name == "USER_INPUT" else state[spec.target])
    return values


@pytest.mark.parametrize("name", list(CASES))
def test_metadata_contract(name):
    _, _, _, ours, theirs = _both(name)
    traces = {n.meta.get("stack_trace") for n in theirs.graph.nodes if n.op == "call_function"}
    for node in ours.graph.nodes:
        assert "val" in node.meta, node
        if node.op != "call_function":
            continue
        assert {"stack_trace", "nn_module_stack", "source_fn_stack"} <= set(node.meta)
        assert isinstance(node.meta["val"], (FakeTensor, tuple, list))
        # every stack trace we record is one torch records for the same program
        assert node.meta["stack_trace"] in traces, (node, node.meta["stack_trace"])


def test_nn_module_stack_matches_torch_for_nested_modules():
    _, _, _, ours, theirs = _both("nested")
    stacks_ours = {
        tuple(n.meta["nn_module_stack"].items())
        for n in ours.graph.nodes
        if n.op == "call_function"
    }
    stacks_torch = {
        tuple(n.meta["nn_module_stack"].items())
        for n in theirs.graph.nodes
        if n.op == "call_function"
    }
    assert stacks_ours == stacks_torch


def test_static_values_are_burned_in():
    _, _, _, ours, _ = _both("static_values")
    muls = [n for n in ours.graph.nodes if n.target is torch.ops.aten.mul.Tensor]
    assert muls[0].args[1] == 10  # x * (n + 7) with n = 3
    assert not any(n.target is torch.ops.aten.sub.Tensor for n in ours.graph.nodes)  # flag=False
    adds = [n for n in ours.graph.nodes if n.target is torch.ops.aten.add.Tensor]
    assert [a.args[1] for a in adds] == [0, 1, 2]  # the loop unrolled


def test_graph_has_no_mutating_ops():
    for name in CASES:
        _, _, _, ours, _ = _both(name)
        for node in ours.graph.nodes:
            schema = getattr(node.target, "_schema", None)
            if schema is not None:
                assert not schema.is_mutable, (name, node.format_node())


def test_export_leaves_module_and_inputs_untouched():
    mod, args, kwargs = CASES["view_mutations"]()
    before_state = {k: v.clone() for k, v in mod.state_dict().items()}
    before_args = [a.clone() for a in args]
    export(mod, args, kwargs)
    for k, v in mod.state_dict().items():
        torch.testing.assert_close(v, before_state[k])
    for a, b in zip(args, before_args):
        torch.testing.assert_close(a, b)


def test_retrace_with_empty_table_keeps_the_graph():
    _, _, _, ours, _ = _both("basic")
    fakes = [n.meta["val"] for n in ours.graph.nodes if n.op == "placeholder"]
    gm = retrace(ours.graph_module, fakes, decomposition_table={})
    assert _ops(ours) == Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    assert [n.name for n in gm.graph.nodes if n.op == "placeholder"] == [
        n.name for n in ours.graph.nodes if n.op == "placeholder"
    ]


# ----------------------------------------------------------------------------- custom ops


@torch.library.custom_op("exportir_capture_test::scale", mutates_args=())
def _scale(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s


@_scale.register_fake
def _(x, s):
    return torch.empty_like(x)


@torch.library.custom_op("exportir_capture_test::no_fake", mutates_args=())
def _no_fake(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def test_custom_op_is_kept_as_one_node():
    class M(nn.Module):
        def forward(self, x):
            return torch.ops.exportir_capture_test.scale(x, 2.0).relu()

    ep = export(M(), (torch.randn(3),))
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert torch.ops.exportir_capture_test.scale.default in targets
    x = torch.randn(3)
    torch.testing.assert_close(ep.module()(x), (x * 2).relu())


def test_custom_op_without_fake_names_the_fix():
    class M(nn.Module):
        def forward(self, x):
            return torch.ops.exportir_capture_test.no_fake(x)

    with pytest.raises(MissingFakeImplError) as info:
        export(M(), (torch.randn(3),))
    assert "exportir_capture_test::no_fake" in str(info.value)
    assert "register_fake" in str(info.value)


# ----------------------------------------------------------------------------- errors


def test_parameter_update_is_an_error_with_the_user_line():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            with torch.no_grad():
                self.w.add_(1)  # forbidden
            return x * self.w

    with pytest.raises(ExportError) as info:
        export(M(), (torch.randn(3),))
    message = str(info.value)
    assert "parameter 'w'" in message and "test_capture.py" in message
    assert "self.w.add_(1)" in message and "register_buffer" in message


def test_tensor_attribute_assignment_is_an_error():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.state = torch.zeros(3)

        def forward(self, x):
            self.state = x * 2
            return x

    with pytest.raises(RuntimeError, match="(?s)plain attribute 'state'.*register_buffer"):
        export(M(), (torch.randn(3),))


def test_tensor_attribute_inplace_update_is_an_error():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.state = torch.zeros(3)

        def forward(self, x):
            self.state.add_(x)
            return x

    with pytest.raises(ExportError, match="plain tensor attribute 'state'"):
        export(M(), (torch.randn(3),))


def test_uninitialized_state_is_an_error():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lazy = nn.LazyLinear(3)
    with pytest.raises(ExportError, match="(?s)not initialized.*run the module once"):
        export(lazy, (torch.randn(2, 4),))


def test_data_dependent_branch_points_at_the_user_line():
    class M(nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent
                return x + 1
            return x - 1

    with pytest.raises(DataDependentError) as info:
        export(M(), (torch.randn(3),))
    assert "if x.sum() > 0" in str(info.value)
    assert "torch.cond" in str(info.value)


def test_strict_mode_is_not_implemented():
    mod, args, kwargs = _basic()
    with pytest.raises(NotImplementedError, match="non-strict"):
        export(mod, args, kwargs, strict=True)


# ----------------------------------------------------------------------------- what code sees


class _SeesFlags(nn.Module):
    """Records what torch.compiler says while forward runs (libraries branch on it)."""

    seen: tuple = ()

    def forward(self, x):
        type(self).seen = (torch.compiler.is_compiling(), torch.compiler.is_exporting())
        return x + 1


def test_forward_sees_is_compiling_and_is_exporting_like_torch_export():
    m = _SeesFlags()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.export.export(m, (torch.ones(2),), strict=False)
    torch_seen = _SeesFlags.seen
    export(m, (torch.ones(2),))
    assert _SeesFlags.seen == torch_seen == (True, True)
    # and both are restored afterwards
    assert not torch.compiler.is_compiling() and not torch.compiler.is_exporting()


def test_flags_restored_when_forward_raises():
    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        export(Boom(), (torch.ones(2),))
    assert not torch.compiler.is_compiling() and not torch.compiler.is_exporting()


class _CachesInADict(nn.Module):
    """Fills a cache held in a plain dict attribute during forward (as timm's LeViT does)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))
        self.cache: dict = {}
        self.history: list = []

    def forward(self, x):
        if "w2" not in self.cache:
            self.cache["w2"] = self.w * 2
        self.history.append(1)
        return x * self.cache["w2"]


def test_containers_in_plain_attributes_are_restored_after_export():
    m = _CachesInADict()
    export(m, (torch.ones(3),))
    assert m.cache == {} and m.history == []
    out = m(torch.ones(3))  # eager after export: a real tensor, not one left by capture
    assert type(out) is torch.Tensor and torch.equal(out, torch.full((3,), 2.0))


class _HooksOnce(nn.Module):
    """Registers a forward hook on first call and marks it with an attribute (transformers'
    output capturing does this); a second registration would double what the hook collects."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(3, 3)
        self.seen: list = []

    def forward(self, x):
        if not getattr(self, "_hooks_installed", False):
            self.inner.register_forward_hook(lambda mod, args, out: self.seen.append(out))
            self._hooks_installed = True
        self.seen.clear()
        y = self.inner(x)
        return y + len(self.seen)


def test_attributes_added_by_forward_stay_like_torch_export():
    m = _HooksOnce()
    x = torch.ones(1, 3)
    ep = export(m, (x,))
    assert m._hooks_installed is True  # torch.export keeps it too: the hook stays registered
    assert torch.allclose(m(x), m.inner(x) + 1)  # one hook, not two
    assert torch.allclose(ep.module()(x), m.inner(x) + 1)


def test_export_leaves_the_autograd_state_of_module_tensors_as_it_was():
    """Capture runs forward on the real tensors below autograd: writing a value that requires
    grad into a buffer in place gave the real buffer a grad_fn and requires_grad=True (eager
    would too; torch.export does not). Export puts them back."""

    class Cache(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cache", torch.zeros(1, 6, 4))
            self.proj = nn.Linear(4, 4)

        def forward(self, x):
            self.cache[:, 1:3] = self.proj(x)
            return self.cache.sum(dim=1)

    m = Cache().eval()
    ep = export(m, (torch.randn(1, 2, 4),))
    assert m.cache.grad_fn is None and not m.cache.requires_grad and m.cache.is_leaf
    assert torch.equal(m.cache, torch.zeros(1, 6, 4))
    assert m.proj.weight.requires_grad and m.proj.weight.is_leaf
    assert not ep.state_dict["cache"].requires_grad
    x = torch.randn(1, 2, 4)
    reference = copy.deepcopy(m)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), reference(x))
