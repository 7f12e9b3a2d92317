"""Every code example of seeds 000 (Export IR spec), 002 (EXIR reference) and 004 (the export
programming model), one test each, run through exportir.export.

Each test follows one example and asserts what the seed shows. Where the seed shows text from an
older torch (``arg0_1`` placeholders, ``#users``, ``return [add]``, no ``Graph signature``
section), the test asserts what torch 2.13 prints for the same program and says so; torch 2.13
is run in the same test as the anchor wherever it can export the example.

Failing examples (data-dependent control flow without ``torch.cond`` / ``torch._check``)
assert the error type and message: torch's ``GuardOnDataDependentSymNode`` text, plus the
user's line and the suggested fix.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from corpus import export_harness as h
from torch import Tensor, nn


def _export(module, args, kwargs=None, **options):
    return h.quiet(h.ours().export, module, args, kwargs, **options)


def _torch(module, args, kwargs=None, **options):
    import torch._dynamo
    import torch.export as te

    # torch.cond compiles a wrapper with dynamo and caches it; an earlier (failed) cond capture
    # by exportir in this process must not decide what torch does here.
    torch._dynamo.reset()
    return h.quiet(te.export, module, args, kwargs, **options)


def _text(block: str) -> list[str]:
    return textwrap.dedent(block).strip("\n").splitlines()


def _call_nodes(ep) -> list:
    return [n for n in ep.graph.nodes if n.op == "call_function"]


# ============================================================================================
# Seed 000: torch.export IR specification.


class AddModule(nn.Module):
    def forward(self, x, y):
        return x + y


ADD_GRAPH_TORCH_2_13 = """
    graph():
        %x : [num_users=1] = placeholder[target=x]
        %y : [num_users=1] = placeholder[target=y]
        %add : [num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%x, %y), kwargs = {})
        return (add,)
"""


def test_000_graph_text_of_add_module() -> None:
    # The seed calls ``torch.export.export(MyModule())`` without inputs and shows no output;
    # export needs example inputs, and this is what torch 2.13 prints for them.
    args = (torch.randn(2, 3), torch.randn(2, 3))
    ep = _export(AddModule(), args)
    assert str(ep.graph).splitlines() == _text(ADD_GRAPH_TORCH_2_13)
    assert str(ep.graph).splitlines() == str(_torch(AddModule(), args).graph).splitlines()
    torch.testing.assert_close(ep.module()(*args), args[0] + args[1])


def test_000_node_schema_and_text_format() -> None:
    """Node fields: name, op, target (the OpOverload object, not its name), args as Node
    references, kwargs, meta; ``%name`` marks node arguments in the text format."""
    ep = _export(AddModule(), (torch.randn(2), torch.randn(2)))
    x, y, add, out = list(ep.graph.nodes)
    assert (add.name, add.op) == ("add", "call_function")
    assert add.target is torch.ops.aten.add.Tensor
    assert add.args == (x, y) and add.kwargs == {}
    assert isinstance(add.meta, dict)
    assert add.format_node() == (
        "%add : [num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%x, %y), kwargs = {})"
    )
    assert out.op == "output" and out.args == ((add,),)


def dummy_helper(y):
    return y + 1


class SequentialLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.sequential = nn.Sequential(nn.Linear(3, 3))

    def forward(self, x, y):
        return self.sequential(x) + dummy_helper(y), F.linear(x, self.sequential[0].weight)


def test_000_call_function_metadata() -> None:
    """stack_trace, val, nn_module_stack and source_fn_stack on every call_function node:
    ops from ``nn.Linear`` inside ``nn.Sequential`` carry both modules and ``nn.Linear``;
    ops from a ``F.linear`` call carry ``F.linear``."""
    module = SequentialLinear()
    args = (torch.randn(2, 3), torch.randn(2, 3))
    ep = _export(module, args)
    nodes = _call_nodes(ep)
    assert nodes
    for node in nodes:
        assert {"stack_trace", "val", "nn_module_stack", "source_fn_stack"} <= set(node.meta), node.name
        assert isinstance(node.meta["val"], torch.Tensor)
    from_module = [n for n in nodes if n.meta["source_fn_stack"][-1][1] is nn.Linear]
    from_functional = [n for n in nodes if n.meta["source_fn_stack"][-1][1] is F.linear]
    assert from_module and from_functional
    own = f"{__name__}.SequentialLinear"
    for node in from_module:
        assert list(node.meta["nn_module_stack"].values()) == [
            ("", own),
            ("sequential", "torch.nn.modules.container.Sequential"),
            ("sequential.0", "torch.nn.modules.linear.Linear"),
        ]
    for node in from_functional:
        assert list(node.meta["nn_module_stack"].values()) == [("", own)]
    # Stack traces: the seed's example shows a frame per user function (forward, then
    # dummy_helper). torch 2.13 records only ``forward`` frames (the user's and nn modules');
    # exportir matches torch 2.13, so compare node for node with it.
    theirs = _torch(SequentialLinear(), args)
    ours_traces = {n.meta["stack_trace"] for n in nodes}
    torch_traces = {n.meta["stack_trace"] for n in _call_nodes(theirs)}
    assert ours_traces == torch_traces
    helper_add = [n for n in nodes if n.target is torch.ops.aten.add.Tensor and n.args[1] == 1]
    assert len(helper_add) == 1
    trace = helper_add[0].meta["stack_trace"]
    this_file = re.escape(Path(__file__).name)
    assert re.match(
        rf'File ".*{this_file}", line \d+, in forward\n    return self\.sequential\(x\) \+ dummy_helper\(y\)', trace
    ), trace


def test_000_placeholder_and_output_nodes() -> None:
    """Placeholders are the first N nodes with empty args and a ``val`` of the input's shape and
    dtype; exactly one output node, last, with ``val`` too."""
    module = SequentialLinear()
    ep = _export(module, (torch.randn(2, 3), torch.randn(2, 3, dtype=torch.float32)))
    nodes = list(ep.graph.nodes)
    ops = [n.op for n in nodes]
    n_ph = ops.count("placeholder")
    assert ops[:n_ph] == ["placeholder"] * n_ph and "placeholder" not in ops[n_ph:]
    assert ops.count("output") == 1 and ops[-1] == "output"
    assert [n.target for n in nodes[:n_ph]] == ["p_sequential_0_weight", "p_sequential_0_bias", "x", "y"]
    for node in nodes[:n_ph]:
        assert node.args == ()
        assert tuple(node.meta["val"].shape) in {(3, 3), (3,), (2, 3)}
        assert node.meta["val"].dtype == torch.float32
    assert "val" in nodes[-1].meta


def true_fn(x):
    return x.sin()


def false_fn(x):
    return x.cos()


class CondOnInput(nn.Module):
    def forward(self, x, y):
        from functorch.experimental.control_flow import cond

        return cond(y, true_fn, false_fn, [x])


COND_GRAPH_TORCH_2_13 = """
    graph():
        %x : [num_users=1] = placeholder[target=x]
        %y : [num_users=1] = placeholder[target=y]
        %true_graph_0 : [num_users=1] = get_attr[target=true_graph_0]
        %false_graph_0 : [num_users=1] = get_attr[target=false_graph_0]
        %cond : [num_users=1] = call_function[target=torch.ops.higher_order.cond](args = (%y, %true_graph_0, %false_graph_0, (%x,)), kwargs = {})
        %getitem : [num_users=1] = call_function[target=operator.getitem](args = (%cond, 0), kwargs = {})
        return (getitem,)
"""


def test_000_get_attr_reads_cond_branches() -> None:
    # The seed's graph has ``x_1``/``y_1`` placeholders, ``[x_1]`` operands and returns the cond
    # directly; torch 2.13 names placeholders ``x``/``y``, passes a tuple and adds a getitem.
    args = (torch.randn(3), torch.tensor(True))
    ep = _export(CondOnInput(), args)
    assert str(ep.graph).splitlines() == _text(COND_GRAPH_TORCH_2_13)
    assert str(ep.graph).splitlines() == str(_torch(CondOnInput(), args).graph).splitlines()
    module = ep.module()
    x = args[0]
    torch.testing.assert_close(module(x, torch.tensor(True)), x.sin())
    torch.testing.assert_close(module(x, torch.tensor(False)), x.cos())


def add_one(x):
    # The seed writes ``torch.ops.aten(x, 1)``; the op it shows is aten.add.Tensor.
    return torch.ops.aten.add.Tensor(x, 1)


class AddOne(nn.Module):
    def forward(self, x):
        return add_one(x)


def test_000_fake_tensor_val_of_add_one() -> None:
    """``FakeTensor(dtype=torch.int, size=[2,], device=CPU)``: the node's val has the output's
    dtype, size and device and no data."""
    x = torch.tensor([1, 2], dtype=torch.int)
    ep = _export(AddOne(), (x,))
    (node,) = _call_nodes(ep)
    assert node.target is torch.ops.aten.add.Tensor and node.args[1] == 1
    val = node.meta["val"]
    assert isinstance(val, torch.Tensor) and type(val) is not torch.Tensor
    assert (val.dtype, list(val.shape), val.device) == (torch.int, [2], torch.device("cpu"))
    assert torch.equal(ep.module()(x), torch.tensor([2, 3], dtype=torch.int))


class MaxPoolWithIndices(nn.Module):
    def forward(self, x):
        values, indices = F.max_pool2d(x, 2, return_indices=True)
        return values, indices


def test_000_val_of_multi_output_op_is_a_tuple() -> None:
    """``max_pool2d_with_indices`` returns (Tensor, Tensor): its val is a 2-tuple of fakes."""
    x = torch.randn(1, 2, 4, 4)
    ep = _export(MaxPoolWithIndices(), (x,))
    (pool,) = [n for n in _call_nodes(ep) if n.target is torch.ops.aten.max_pool2d_with_indices.default]
    val = pool.meta["val"]
    assert isinstance(val, tuple) and len(val) == 2
    assert [(v.dtype, tuple(v.shape)) for v in val] == [(torch.float32, (1, 2, 2, 2)), (torch.int64, (1, 2, 2, 2))]
    h.assert_same_tree(ep.module()(x), F.max_pool2d(x, 2, return_indices=True), "max_pool2d_with_indices")


class SizeUser(nn.Module):
    def forward(self, x):
        return x.new_zeros(x.shape[0])


def test_000_sym_size_val_is_a_symint() -> None:
    """``aten::sym_size`` returns an integer known only at run time: its val is a SymInt."""
    from torch.export import Dim

    spec = {"x": {0: Dim("batch")}}
    ep = _export(SizeUser(), (torch.randn(4, 2),), dynamic_shapes=spec)
    theirs = _torch(SizeUser(), (torch.randn(4, 2),), dynamic_shapes=spec)
    assert h.op_multiset(ep) == h.op_multiset(theirs)
    sizes = [n for n in _call_nodes(ep) if n.target is torch.ops.aten.sym_size.int]
    assert len(sizes) == 1 and isinstance(sizes[0].meta["val"], torch.SymInt)
    for batch in (1, 7):
        torch.testing.assert_close(ep.module()(torch.randn(batch, 2)), torch.zeros(batch))


Pair = __import__("collections").namedtuple("Pair", ["a", "b"])


class LeafAndContainerTypes(nn.Module):
    def forward(self, t, i, f, b, s, nested):
        out = t * i + f
        if b and s == "go":
            out = out.to(torch.float64)
        return out, nested[0][1] + nested[1]["k"], Pair(nested[2].a * 2, nested[2].b)


def test_000_pytree_leaf_and_container_types() -> None:
    """Tensor/int/float/bool/str leaves and tuple/list/dict/namedtuple containers are
    accepted; primitives are burned in; ``ep.module()`` returns the original structure."""
    args = (torch.randn(2), 3, 0.5, True, "go", ([torch.ones(2), torch.zeros(2)], {"k": torch.ones(2)}, Pair(torch.ones(1), torch.zeros(1))))
    ep = _export(LeafAndContainerTypes(), args)
    theirs = _torch(LeafAndContainerTypes(), args)
    assert h.signature_rows(ep)[0] == h.signature_rows(theirs)[0]
    h.assert_same_tree(ep.module()(*args), LeafAndContainerTypes()(*args), "pytree leaves")


class DtypeInput(nn.Module):
    def forward(self, x, dtype):
        return x.to(dtype)


def test_000_dtype_leaf_is_not_an_export_input() -> None:
    # Seed 000 lists ScalarType/Layout/MemoryFormat/Device among IR leaf types (as op
    # arguments); as *inputs* of export torch 2.13 rejects them, and so does exportir.
    with pytest.raises(ValueError, match="Unsupported input type <class 'torch.dtype'>"):
        _torch(DtypeInput(), (torch.randn(2), torch.float64))
    with pytest.raises(Exception, match="dtype"):
        _export(DtypeInput(), (torch.randn(2), torch.float64))


@dataclasses.dataclass
class SeedDataclass:
    x: torch.Tensor
    y: torch.Tensor


class UsesDataclass(nn.Module):
    def forward(self, inp: SeedDataclass):
        return inp.x * inp.y


def test_000_dataclass_container_registered() -> None:
    import torch.export as te

    register = h.ours().register_dataclass
    assert register is not None, "exportir has no register_dataclass"
    register(SeedDataclass)
    te.register_dataclass(SeedDataclass)
    arg = SeedDataclass(torch.randn(2), torch.randn(2))
    ep = _export(UsesDataclass(), (arg,))
    assert h.signature_rows(ep)[0] == h.signature_rows(_torch(UsesDataclass(), (arg,)))[0]
    torch.testing.assert_close(ep.module()(arg), arg.x * arg.y)


# ============================================================================================
# Seed 002: EXIR reference (older edition of 000).


def test_002_graph_text_of_add_module() -> None:
    # The seed (torch._export of July 2023) prints ``%arg0_1 : [#users=1]`` placeholders and
    # ``return [add]``; torch 2.13 names placeholders after the forward's parameters, writes
    # ``num_users`` and returns a tuple. exportir prints what torch 2.13 prints.
    args = (torch.randn(3), torch.randn(3))
    ep = _export(AddModule(), args)
    assert str(ep.graph).splitlines() == _text(ADD_GRAPH_TORCH_2_13)


class ListOfLists(nn.Module):
    def forward(self, xs):
        return [[xs[0][0] + xs[1][0]], (xs[0][1] * 2,)]


def test_002_call_spec_flattens_and_unflattens() -> None:
    """The graph takes and returns flat lists; ``call_spec.in_spec`` flattens the user's
    inputs and ``call_spec.out_spec`` rebuilds the outputs."""
    import torch.utils._pytree as pytree

    xs = [[torch.randn(2), torch.randn(2)], [torch.randn(2)]]
    ep = _export(ListOfLists(), (xs,))
    spec = ep.call_spec
    flat_in = [n for n in ep.graph.nodes if n.op == "placeholder"]
    assert len(flat_in) == 3 and spec.in_spec.num_leaves == 3
    (out_node,) = [n for n in ep.graph.nodes if n.op == "output"]
    assert len(out_node.args[0]) == 2 and spec.out_spec.num_leaves == 2
    # The specs are the user's structure: same as torch's pytree of (args, kwargs) / outputs.
    assert str(spec.in_spec) == str(pytree.tree_flatten(((xs,), {}))[1])
    expected = ListOfLists()(xs)
    assert str(spec.out_spec) == str(pytree.tree_flatten(expected)[1])
    h.assert_same_tree(ep.module()(xs), expected, "list of lists")


def test_002_equality_constraints() -> None:
    """Two inputs sharing a dimension (the seed's ``equality_constraints``; torch 2.13 expresses
    it as one symbol in both placeholders' vals and one range constraint)."""
    from torch.export import Dim

    batch = Dim("batch")
    spec = {"x": {0: batch}, "y": {0: batch}}
    args = (torch.randn(4, 2), torch.randn(4, 2))
    ep = _export(AddModule(), args, dynamic_shapes=spec)
    theirs = _torch(AddModule(), args, dynamic_shapes=spec)
    x, y = [n.meta["val"] for n in ep.graph.nodes if n.op == "placeholder"]
    assert isinstance(x.shape[0], torch.SymInt) and str(x.shape[0]) == str(y.shape[0])
    assert [str(v) for v in ep.range_constraints.values()] == [str(v) for v in theirs.range_constraints.values()]
    a, b = torch.randn(6, 2), torch.randn(6, 2)
    torch.testing.assert_close(ep.module()(a, b), a + b)
    with pytest.raises(Exception):  # noqa: B017 - any input-check error; texts: test_dynamic_*
        ep.module()(torch.randn(6, 2), torch.randn(5, 2))


class LinearInCond(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: self.linear(x), lambda x: x.cos(), (x,))


def test_002_source_fn_stack_inside_cond() -> None:
    """A Linear called in cond's true branch: its nodes' source_fn_stack is the cond, then
    ``torch.nn.Linear`` (the seed's ``['cond', 'torch.nn.Linear']``). torch 2.13's non-strict
    export records no source_fn_stack at all, so the seed is the reference here."""
    x = torch.randn(2, 3)
    module = LinearInCond()
    ep = _export(module, (x,))
    branch = ep.graph_module.get_submodule("true_graph_0")
    nodes = [n for n in branch.graph.nodes if n.op == "call_function"]
    assert nodes
    for node in nodes:
        stack = node.meta["source_fn_stack"]
        assert len(stack) == 2, stack
        assert stack[0][0] == "cond" and stack[-1][1] is nn.Linear, stack
    for probe in (x.abs(), -x.abs()):
        torch.testing.assert_close(ep.module()(probe), module(probe))


class TrueModule(nn.Module):
    def forward(self, x):
        return x.sin()


class FalseModule(nn.Module):
    def forward(self, x):
        return x.cos()


class CondOnShape(nn.Module):
    def __init__(self):
        super().__init__()  # the seed forgets this call; nn.Module needs it
        self.true_module = TrueModule()
        self.false_module = FalseModule()

    def forward(self, x):
        return torch.ops.higher_order.cond(x.shape[0] == 1, self.true_module, self.false_module, (x,))


def test_002_get_attr_reads_submodules() -> None:
    # The seed reads ``true_module``; torch 2.13 keeps the cond (predicate burned to True) and
    # reads the branches as ``true_graph_0``/``false_graph_0`` submodules through get_attr.
    x = torch.randn(1, 3)
    theirs = _torch(CondOnShape(), (x,))
    assert [n.target for n in theirs.graph.nodes if n.op == "get_attr"] == ["true_graph_0", "false_graph_0"]
    ep = _export(CondOnShape(), (x,))
    assert str(ep.graph).splitlines() == str(theirs.graph).splitlines()
    torch.testing.assert_close(ep.module()(x), x.sin())


def test_002_fake_tensor_of_add_one() -> None:
    """The 002 edition of the FakeTensor example: ``add_tensor`` on ``ph_0`` (torch 2.13 names
    them ``add`` and ``x``); its val describes the int tensor of size [2]."""
    x = torch.tensor([5, 6], dtype=torch.int)
    ep = _export(AddOne(), (x,))
    assert str(ep.graph).splitlines() == _text("""
        graph():
            %x : [num_users=1] = placeholder[target=x]
            %add : [num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%x, 1), kwargs = {})
            return (add,)
    """)
    (node,) = _call_nodes(ep)
    assert (node.meta["val"].dtype, tuple(node.meta["val"].shape)) == (torch.int, (2,))


# ============================================================================================
# Seed 004: the torch.export programming model.


class MyMod(nn.Module):
    def forward(self, x, y):
        z = y + 7
        return x + z


def test_004_static_values_are_burned_in() -> None:
    # The seed shows ``forward(self, arg0_1, arg1_1)`` and one space before ``;``: torch 2.13
    # keeps the parameter names and writes two spaces.
    ep = _export(MyMod(), (torch.randn(1), 3))
    expected = "\n\n\ndef forward(self, x, y):\n    add = torch.ops.aten.add.Tensor(x, 10);  x = None\n    return (add,)\n    "
    assert ep.graph_module.code == expected
    assert _torch(MyMod(), (torch.randn(1), 3)).graph_module.code == expected
    x = torch.randn(1)
    torch.testing.assert_close(ep.module()(x, 3), x + 10)


@dataclasses.dataclass
class Input:
    f: torch.Tensor
    p: torch.Tensor


class UsesInput(nn.Module):
    def forward(self, x: Input):
        return x.f + 1


def test_004_custom_input_type_dataclass() -> None:
    import torch.export as te

    te.register_dataclass(Input)  # as in the seed: exportir honours torch's registration
    arg = Input(f=torch.ones(10, 4), p=torch.zeros(10, 4))
    ep = _export(UsesInput(), (arg,))
    rows = h.signature_rows(ep)[0]
    assert rows == h.signature_rows(_torch(UsesInput(), (arg,)))[0]
    assert [r[2] for r in rows] == ["x_f", "x_p"]
    torch.testing.assert_close(ep.module()(arg), torch.full((10, 4), 2.0))


class OptionalY(nn.Module):
    def forward(self, x, y=None):
        if y is not None:
            return y * x
        return x + x


def test_004_optional_input_passed_and_not_passed() -> None:
    # The seed's printout is the ExportedProgram section only, from another file path; torch
    # 2.13 adds the Graph signature and Range constraints sections. Compare with torch 2.13.
    for args in ((torch.randn(3, 3), torch.randn(3, 3)), (torch.randn(3, 3),)):
        ours = str(_export(OptionalY(), args)).splitlines()
        assert ours == str(_torch(OptionalY(), args)).splitlines()
    passed = str(_export(OptionalY(), (torch.randn(3, 3), torch.randn(3, 3))))
    assert 'def forward(self, x: "f32[3, 3]", y: "f32[3, 3]"):' in passed
    assert 'mul: "f32[3, 3]" = torch.ops.aten.mul.Tensor(y, x);  y = x = None' in passed
    not_passed = str(_export(OptionalY(), (torch.randn(3, 3),)))
    assert 'def forward(self, x: "f32[3, 3]"):' in not_passed
    assert 'add: "f32[3, 3]" = torch.ops.aten.add.Tensor(x, x);  x = None' in not_passed
    assert "# File: " in not_passed and "in forward, code: return x + x" in not_passed


class DataDependentIf(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x.sin()
        else:
            return x.cos()


def test_004_data_dependent_control_flow_is_an_export_error() -> None:
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    with pytest.raises(GuardOnDataDependentSymNode, match="Could not guard on data-dependent expression"):
        _torch(DataDependentIf(), (torch.randn(3),))
    with pytest.raises(RuntimeError) as info:
        _export(DataDependentIf(), (torch.randn(3),))
    message = str(info.value)
    assert type(info.value).__name__ == "GuardOnDataDependentSymNode"
    assert message.startswith("Could not guard on data-dependent expression")
    assert Path(__file__).name in message and "if x.sum() > 0:" in message  # the user's line
    assert "torch.cond" in message and "torch._check" in message  # the fixes


class CondRewrite(nn.Module):
    def forward(self, x):
        return torch.cond(
            pred=x.sum() > 0,
            true_fn=lambda x: x.sin(),
            false_fn=lambda x: x.cos(),
            operands=(x,),
        )


def test_004_cond_rewrite_traces_both_branches() -> None:
    x = torch.randn(3)
    ep = _export(CondRewrite(), (x,))
    theirs = _torch(CondRewrite(), (x,))
    assert str(ep.graph).splitlines() == str(theirs.graph).splitlines()
    for branch, op in (("true_graph_0", "aten.sin.default"), ("false_graph_0", "aten.cos.default")):
        sub = ep.graph_module.get_submodule(branch)
        assert [h.op_name(n.target) for n in sub.graph.nodes if n.op == "call_function"] == [op]
    for probe in (x.abs() + 0.1, -x.abs() - 0.1):
        torch.testing.assert_close(ep.module()(probe), probe.sin() if probe.sum() > 0 else probe.cos())


class NonzeroIf(nn.Module):
    def forward(self, x):
        nz = x.nonzero()
        if nz.shape[0] > 0:
            return x.sin()
        else:
            return x.cos()


class NonzeroChecked(nn.Module):
    def forward(self, x):
        nz = x.nonzero()
        torch._check(nz.shape[0] > 0)
        if nz.shape[0] > 0:
            return x.sin()
        else:
            return x.cos()


def test_004_data_dependent_shape_without_check_is_an_error() -> None:
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    with pytest.raises(GuardOnDataDependentSymNode):
        _torch(NonzeroIf(), (torch.randn(3),))
    with pytest.raises(RuntimeError) as info:
        _export(NonzeroIf(), (torch.randn(3),))
    message = str(info.value)
    assert type(info.value).__name__ == "GuardOnDataDependentSymNode"
    assert message.startswith("Could not guard on data-dependent expression u0 > 0")
    assert "if nz.shape[0] > 0:" in message and "torch._check(nz.shape[0] > 0)" in message


def test_004_torch_check_decides_data_dependent_shape() -> None:
    x = torch.tensor([1.0, 0.0, 2.0])
    ep = _export(NonzeroChecked(), (x,))
    theirs = _torch(NonzeroChecked(), (x,))
    assert h.op_multiset(ep) == h.op_multiset(theirs)
    torch.testing.assert_close(ep.module()(x), x.sin())
    # The check is a runtime assertion: an input with no non-zero element fails it.
    with pytest.raises(RuntimeError):
        ep.module()(torch.zeros(3))


class IndexSelect(nn.Module):
    def forward(self, x, index):
        return torch.index_select(x, 0, index)


def test_004_fake_impl_computes_output_shape() -> None:
    """The meta_index_select example: the output size comes from the input's size with
    ``dim`` replaced by ``index.numel()``, without data."""
    x, index = torch.randn(5, 3), torch.tensor([4, 0])
    ep = _export(IndexSelect(), (x, index))
    (node,) = [n for n in _call_nodes(ep) if n.target is torch.ops.aten.index_select.default]
    assert tuple(node.meta["val"].shape) == (2, 3)
    torch.testing.assert_close(ep.module()(x, index), x[[4, 0]])


@torch.library.custom_op("exportir_seed004::sin", mutates_args=())
def numpy_sin(x: Tensor) -> Tensor:
    x_np = x.numpy()
    y_np = np.sin(x_np)
    return torch.from_numpy(y_np)


@torch.library.register_fake("exportir_seed004::sin")
def _(x: Tensor) -> Tensor:
    return torch.empty_like(x)


class UsesCustomSin(nn.Module):
    def forward(self, x):
        return torch.ops.exportir_seed004.sin(x) + 1


def test_004_custom_op_with_fake_impl() -> None:
    x = torch.randn(4)
    ep = _export(UsesCustomSin(), (x,))
    assert [h.op_name(n.target) for n in _call_nodes(ep)] == ["exportir_seed004.sin.default", "aten.add.Tensor"]
    torch.testing.assert_close(ep.module()(x), torch.sin(x) + 1)
    decomposed = h.quiet(ep.run_decompositions)
    assert h.op_multiset(decomposed) == h.op_multiset(h.quiet(_torch(UsesCustomSin(), (x,)).run_decompositions))


@torch.library.custom_op("exportir_seed004::custom_nonzero", mutates_args=())
def custom_nonzero(x: Tensor) -> Tensor:
    return torch.from_numpy(np.stack(np.nonzero(x.numpy()), axis=1).astype(np.int64))


@torch.library.register_fake("exportir_seed004::custom_nonzero")
def _(x):
    nnz = torch.library.get_ctx().new_dynamic_size()
    shape = [nnz, x.dim()]
    return x.new_empty(shape, dtype=torch.int64)


class UsesCustomNonzero(nn.Module):
    def forward(self, x):
        return torch.ops.exportir_seed004.custom_nonzero(x)


def test_004_custom_op_with_data_dependent_size() -> None:
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    theirs = _torch(UsesCustomNonzero(), (x,))
    torch.testing.assert_close(theirs.module()(x), torch.nonzero(x))
    ep = _export(UsesCustomNonzero(), (x,))
    (node,) = [n for n in _call_nodes(ep) if h.op_name(n.target) == "exportir_seed004.custom_nonzero.default"]
    rows, cols = node.meta["val"].shape
    assert isinstance(rows, torch.SymInt) and cols == 2  # new_dynamic_size(): an unbacked size
    for probe in (x, torch.tensor([[0.0, 0.0], [3.0, 4.0]]), torch.ones(2, 2)):
        torch.testing.assert_close(ep.module()(probe), torch.nonzero(probe))


# Module state: the access rules of seed 004 (reads allowed; static attributes may be updated
# and are burned in; buffers may be updated in place or reassigned; tensor plain attributes and
# parameters may not be updated; all state must be initialized).


class StaticCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.count = 0

    def forward(self, x):
        self.count += 1
        return x * self.count


def test_004_static_attribute_update_is_burned_in() -> None:
    ep = _export(StaticCounter(), (torch.randn(2),))
    assert [n.format_node() for n in _call_nodes(ep)] == [
        "%mul : [num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%x, 1), kwargs = {})"
    ]
    # torch 2.13 restores the module's plain attributes after a non-strict export.
    module = StaticCounter()
    _torch(module, (torch.randn(2),))
    assert module.count == 0
    module = StaticCounter()
    _export(module, (torch.randn(2),))
    assert module.count == 0, "export left the module's plain attribute changed"


class BufferUpdates(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buffer", torch.zeros(3))
        self.register_buffer("other", torch.ones(3))

    def forward(self, x):
        self.buffer[:] = x * 2
        self.other = self.other + x
        return self.buffer + self.other


def test_004_buffers_updated_in_place_and_reassigned() -> None:
    x = torch.randn(3)
    ep = _export(BufferUpdates(), (x,))
    outputs = [(s.kind.name, s.target) for s in ep.graph_signature.output_specs]
    assert outputs == [("BUFFER_MUTATION", "buffer"), ("BUFFER_MUTATION", "other"), ("USER_OUTPUT", None)]
    # The program stores the initial values (ep.module() then shares them, as in torch).
    torch.testing.assert_close(ep.state_dict["buffer"], torch.zeros(3))
    torch.testing.assert_close(ep.state_dict["other"], torch.ones(3))
    module = ep.module()
    torch.testing.assert_close(module(x), x * 2 + 1 + x)
    torch.testing.assert_close(module.buffer, x * 2)
    torch.testing.assert_close(module.other, 1 + x)


class TensorAttributeUpdate(nn.Module):
    def __init__(self):
        super().__init__()
        self.t = torch.ones(2)

    def forward(self, x):
        self.t = self.t + 1
        return x + self.t


class TensorAttributeInplace(nn.Module):
    def __init__(self):
        super().__init__()
        self.t = torch.ones(2)

    def forward(self, x):
        self.t.add_(1)
        return x + self.t


class ParameterInplace(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))

    def forward(self, x):
        self.w.add_(1)
        return x + self.w


class ParameterReassign(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))

    def forward(self, x):
        self.w = nn.Parameter(self.w + 1)
        return x + self.w


@pytest.mark.parametrize(
    ("make", "pattern"),
    [
        (TensorAttributeUpdate, r"(?s)plain attribute 't'.*register_buffer"),
        (TensorAttributeInplace, r"(?s)plain tensor attribute 't'.*register_buffer"),
        (ParameterInplace, r"(?s)parameter 'w'.*Parameters may not be updated"),
        (ParameterReassign, r"(?s)parameter 'w'.*Parameters may not be updated"),
        (lambda: nn.LazyLinear(3), r"(?s)not initialized.*initialized before export"),
    ],
    ids=["tensor_attr_assign", "tensor_attr_inplace", "param_inplace", "param_reassign", "uninitialized"],
)
def test_004_forbidden_state_updates(make, pattern) -> None:
    """Each forbidden access is an export error stating seed 004's rule and the fix (torch
    2.13 silently allows several of them; exportir follows the seed)."""
    with torch.no_grad(), pytest.raises(RuntimeError, match=pattern):
        _export(make(), (torch.randn(2),))
