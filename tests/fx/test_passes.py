"""Differential tests of ``passes``: ShapeProp metadata, PassBase/PassResult, PassManager.

Sanity mode: ``EXPORTIR_FX_IMPL=torch.fx`` runs this file with torch.fx on both sides.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.fx
from conftest import import_ours_fx, ours_fx_name
from corpus.fx_models import ENTRIES, build
from torch import nn
from torch.fx.passes import shape_prop as t_shape_prop
from torch.fx.passes.infra import pass_base as t_pass_base
from torch.fx.passes.infra import pass_manager as t_pass_manager

fx = import_ours_fx()
o_shape_prop = importlib.import_module(f"{ours_fx_name()}.passes.shape_prop")
o_pass_base = importlib.import_module(f"{ours_fx_name()}.passes.infra.pass_base")
o_pass_manager = importlib.import_module(f"{ours_fx_name()}.passes.infra.pass_manager")


# --------------------------------------------------------------------------------------------
# ShapeProp


def _norm_meta(value):
    """TensorMetadata of either implementation (and structures of them) as plain tuples."""
    if type(value).__name__ == "TensorMetadata":
        return ("TM", tuple(_norm_meta(v) for v in value))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__.replace("immutable_list", "list"),
                tuple(_norm_meta(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _norm_meta(v)) for k, v in value.items()))
    return value


def _meta_table(gm):
    return [
        (n.name, _norm_meta(n.meta.get("tensor_meta")), n.meta.get("type")) for n in gm.graph.nodes
    ]


def _type_name(t):
    """Types by qualified name; each implementation's immutable collections by bare name."""
    if t is None or "immutable" in t.__name__:
        return None if t is None else t.__name__
    return (t.__module__, t.__name__)


def _positional(gm, case):
    args = list(case.inputs)
    for n in [n for n in gm.graph.nodes if n.op == "placeholder"][len(args):]:
        if n.target in case.kwinputs:
            args.append(case.kwinputs[n.target])
        elif case.concrete_args and n.target in case.concrete_args:
            args.append(case.concrete_args[n.target])
    return args


def _trace(impl, case):
    if case.make_tracer is None:
        return impl.symbolic_trace(case.root, concrete_args=case.concrete_args)
    tracer = case.make_tracer()
    graph = tracer.trace(case.root, concrete_args=case.concrete_args)
    return impl.GraphModule(tracer.root, graph)


SHAPE_NAMES = [e.name for e in ENTRIES]


@pytest.mark.parametrize("name", SHAPE_NAMES)
def test_shape_prop_metadata_matches_torch(name):
    entry = next(e for e in ENTRIES if e.name == name)
    t_case, o_case = build(entry, torch.fx), build(entry, fx)
    t_gm, o_gm = _trace(torch.fx, t_case), _trace(fx, o_case)
    if any(n.op == "placeholder" and n.target.startswith("**") for n in t_gm.graph.nodes):
        # Interpreter.run is positional-only: both fail on the **kwargs lookup
        for mod, gm, case in ((t_shape_prop, t_gm, t_case), (o_shape_prop, o_gm, o_case)):
            with pytest.raises(RuntimeError, match="ShapeProp error for: node=%getitem"):
                mod.ShapeProp(gm).propagate(*_positional(gm, case))
        return
    torch.manual_seed(5)
    t_shape_prop.ShapeProp(t_gm).propagate(*_positional(t_gm, t_case))
    torch.manual_seed(5)
    o_shape_prop.ShapeProp(o_gm).propagate(*_positional(o_gm, o_case))
    theirs = [(n, m, _type_name(t)) for n, m, t in _meta_table(t_gm)]
    ours = [(n, m, _type_name(t)) for n, m, t in _meta_table(o_gm)]
    assert ours == theirs


def test_shape_prop_seed_two_layer_net():
    class TwoLayerNet(nn.Module):
        def __init__(self, d_in, h, d_out):
            super().__init__()
            self.linear1 = nn.Linear(d_in, h)
            self.linear2 = nn.Linear(h, d_out)

        def forward(self, x):
            return self.linear2(self.linear1(x).clamp(min=0))

    gm = fx.symbolic_trace(TwoLayerNet(1000, 100, 10))
    o_shape_prop.ShapeProp(gm).propagate(torch.randn(50, 1000))
    table = [(n.name, n.meta["tensor_meta"].dtype, n.meta["tensor_meta"].shape)
             for n in gm.graph.nodes]
    assert table == [
        ("x", torch.float32, torch.Size([50, 1000])),
        ("linear1", torch.float32, torch.Size([50, 100])),
        ("clamp", torch.float32, torch.Size([50, 100])),
        ("linear2", torch.float32, torch.Size([50, 10])),
        ("output", torch.float32, torch.Size([50, 10])),
    ]


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        lambda: torch.randn(2, 3, 4, 5, 6).to(memory_format=torch.channels_last_3d),
        lambda: torch.randn(4, 6)[:, ::2],
        lambda: torch.randn(3, 3, requires_grad=True),
        lambda: torch.arange(6).reshape(2, 3).t(),
        lambda: torch.randn(3, 4).to_sparse(),
        lambda: torch.quantize_per_tensor(torch.randn(4), 0.1, 3, torch.quint8),
        lambda: torch.quantize_per_channel(
            torch.randn(2, 3), torch.tensor([0.1, 0.2]), torch.tensor([1, 2]), 0, torch.qint8
        ),
        lambda: torch.empty(0, 3),
        lambda: torch.tensor(1.5, dtype=torch.float64),
    ],
)
def test_extract_tensor_metadata_matches_torch(make):
    t = make()
    for contiguity in (True, False):
        theirs = t_shape_prop._extract_tensor_metadata(t, include_contiguity=contiguity)
        ours = o_shape_prop._extract_tensor_metadata(t, include_contiguity=contiguity)
        assert tuple(ours) == tuple(theirs)
        assert ours._fields == theirs._fields


def test_shape_prop_error_wraps_node():
    gm = fx.symbolic_trace(lambda x: x @ x)
    with pytest.raises(RuntimeError) as info:
        o_shape_prop.ShapeProp(gm).propagate(torch.randn(2, 3))
    assert "ShapeProp error for: node=%matmul" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_shape_prop_with_fake_mode_writes_real_nodes():
    from torch._subclasses.fake_tensor import FakeTensorMode  # oracle-side fake mode

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 2)

        def forward(self, x):
            return self.lin(x).relu()

    gm = fx.symbolic_trace(M())
    mode = FakeTensorMode()
    prop = o_shape_prop.ShapeProp(gm, fake_mode=mode)
    out = prop.propagate(torch.randn(8, 4))
    assert out.shape == (8, 2)
    assert [n.meta["tensor_meta"].shape for n in gm.graph.nodes] == [
        torch.Size([8, 4]), torch.Size([8, 2]), torch.Size([8, 2]), torch.Size([8, 2])
    ]
    assert isinstance(gm.lin.weight, nn.Parameter) and gm.lin.weight.device.type == "cpu"
    assert type(gm.lin.weight) is nn.Parameter  # the real module is untouched


# --------------------------------------------------------------------------------------------
# PassBase / PassResult / PassManager


def test_pass_result_is_a_namedtuple_like_torch():
    r = o_pass_base.PassResult(nn.Module(), True)
    assert r._fields == t_pass_base.PassResult._fields == ("graph_module", "modified")
    assert r.modified is True and r[1] is True


def _relu_to_sigmoid(impl):
    def relu_to_sigmoid(gm):
        changed = False
        for n in gm.graph.nodes:
            if n.op == "call_function" and n.target is torch.relu:
                n.target = torch.sigmoid
                changed = True
        return impl.PassResult(gm, changed)

    return relu_to_sigmoid


def test_pass_base_runs_requires_call_ensures():
    order = []

    class Tracking(o_pass_base.PassBase):
        def requires(self, gm):
            order.append("requires")

        def call(self, gm):
            order.append("call")
            return o_pass_base.PassResult(gm, False)

        def ensures(self, gm):
            order.append("ensures")

    gm = fx.symbolic_trace(lambda x: x + 1)
    assert Tracking()(gm).graph_module is gm
    assert order == ["requires", "call", "ensures"]
    with pytest.raises(TypeError):
        o_pass_base.PassBase()  # abstract


def test_pass_manager_runs_to_fixed_point_and_recompiles():
    gm = fx.symbolic_trace(lambda x: torch.relu(torch.relu(x)))
    manager = o_pass_manager.PassManager([_relu_to_sigmoid(o_pass_base)], steps=5)
    result = manager(gm)
    assert result.modified is True
    assert "torch.sigmoid" in result.graph_module.code
    assert "torch.relu(" not in result.graph_module.code
    assert result.graph_module.code.count("torch.sigmoid(") == 2
    assert manager(result.graph_module).modified is False


def test_pass_result_wrapper_and_error_message_match_torch():
    def noop(gm):
        return None

    def returns_module(gm):
        return gm

    def broken(gm):
        raise ValueError("bad")

    messages = []
    for mgr_mod in (t_pass_manager, o_pass_manager):
        gm = torch.fx.symbolic_trace(lambda x: x + 1) if mgr_mod is t_pass_manager else \
            fx.symbolic_trace(lambda x: x + 1)
        wrapped = [mgr_mod.pass_result_wrapper(p) for p in (noop, returns_module)]
        assert [w.__name__ for w in wrapped] == ["noop", "returns_module"]
        assert all(w(gm).modified for w in wrapped)
        manager = mgr_mod.PassManager(wrapped + [broken])
        with pytest.raises(Exception) as info:
            manager(gm)
        assert isinstance(info.value.__cause__, ValueError)
        messages.append(str(info.value))
        manager = mgr_mod.PassManager([lambda gm: 3])
        with pytest.raises(Exception) as info:
            manager(gm)
        messages.append(str(info.value) + str(info.value.__cause__))
    assert messages[:2] == messages[2:]


def _p1(gm):
    return None


def _p2(gm):
    return None


def _p3(gm):
    return None


def test_constraints_solve_validate_and_cycles_match_torch():
    outcomes = []
    for mod in (t_pass_manager, o_pass_manager):
        c12 = mod.this_before_that_pass_constraint(_p1, _p2)
        c23 = mod.this_before_that_pass_constraint(_p2, _p3)
        manager = mod.PassManager([_p3, _p2, _p1], [c12, c23])
        with pytest.raises(RuntimeError) as info:
            manager.validate_constraints()
        manager.solve_constraints()
        solved = [p.__name__ for p in manager.passes]
        c31 = mod.this_before_that_pass_constraint(_p3, _p1)
        manager = mod.PassManager([_p1, _p2, _p3], [c12, c23, c31])
        with pytest.raises(RuntimeError) as cycle:
            manager.solve_constraints()
        outcomes.append((str(info.value).replace(mod.__name__, ""), solved,
                         str(cycle.value).split(":")[0]))
    assert outcomes[0] == outcomes[1]
    assert outcomes[1][1] == ["_p1", "_p2", "_p3"]


def test_add_checks_requires_one_parameter():
    manager = o_pass_manager.PassManager()
    with pytest.raises(TypeError, match="only take in one variable"):
        manager.add_checks(lambda a, b: None)
    seen = []
    manager.add_checks(lambda m: seen.append(m))
    manager.run_checks_after_each_pass = True
    manager.add_pass(o_pass_manager.pass_result_wrapper(_p1))
    gm = fx.symbolic_trace(lambda x: x)
    manager(gm)
    assert seen == [gm, gm]


# --------------------------------------------------------------------------------------------
# split_module is not built yet: it must say so.
