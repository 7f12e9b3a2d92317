"""``split_module`` against ``torch.fx.passes.split_module.split_module``.

Every corpus program is traced by both implementations and split with the same callback and
options; the returned modules must have identical generated code (parent and every submodule),
children, ``qualname_map`` and ``meta["partition_names"]``, and compute the same values. When
torch raises, we must raise the same exception type with the same message.

Reproduce one case: ``pytest tests/fx/test_split_module.py -k "<entry>-<callback>-<options>"``.
"""

from __future__ import annotations

import inspect
import operator

import pytest
import torch
import torch.fx
from conftest import import_ours_fx, import_ours_pass, torch_code_as_ours
from corpus.fx_models import ENTRIES, build
from torch.fx.passes.split_module import split_module as torch_split_module

ours_fx = import_ours_fx()
Partition = import_ours_pass("split_module").Partition
split_module = import_ours_pass("split_module").split_module


# --------------------------------------------------------------------------------------------
# Callbacks: pure functions of the node (or counters, called in the same order by both).


def _round_robin():
    state = [0]

    def callback(node):
        state[0] += 1
        return state[0] % 3
    return callback


def _by_position():
    seen: dict[str, int] = {}

    def callback(node):
        return seen.setdefault(node.name, len(seen)) // 2
    return callback


def _by_op():
    ops = {"call_function": 0, "call_method": 1, "call_module": 2}
    return lambda node: ops[node.op]


def _single():
    return lambda node: 0


def _reverse():
    """Partition ids decrease along the graph: a topological order still exists."""
    seen: dict[str, int] = {}
    return lambda node: 100 - seen.setdefault(node.name, len(seen))


def _by_name_hash():
    return lambda node: sum(map(ord, node.name)) % 4


CALLBACKS = {
    "round_robin": _round_robin,
    "by_position": _by_position,
    "by_op": _by_op,
    "single": _single,
    "reverse": _reverse,
    "name_hash": _by_name_hash,
}

OPTIONS = {
    "default": {},
    "keep_order": {"keep_original_order": True},
    "keep_names": {"keep_original_node_name": True},
    "arg_names": {"keep_original_input_name": False},
    "affix": {"partition_affix": "pp"},
    "tuple_return": {"tuple_return": True},
    "all": {"keep_original_order": True, "keep_original_node_name": True,
            "tuple_return": True},
}


# --------------------------------------------------------------------------------------------
# Harness.


def _trace(fx, case):
    if case.make_tracer is None:
        return fx.symbolic_trace(case.root, concrete_args=case.concrete_args)
    tracer = case.make_tracer()
    graph = tracer.trace(case.root, concrete_args=case.concrete_args)
    return fx.GraphModule(tracer.root, graph)


def _split(fx, split, entry, callback, options):
    case = build(entry, fx)
    gm = _trace(fx, case)
    qualname_map: dict[str, str] = {}
    try:
        result = split(gm, case.root, CALLBACKS[callback](), qualname_map, **options)
    except Exception as e:  # noqa: BLE001  # compared with torch's failure below
        return case, e, qualname_map
    return case, result, qualname_map


def _graph_modules(gm):
    return [(name, mod) for name, mod in gm.named_modules()
            if isinstance(mod, (torch.fx.GraphModule, ours_fx.GraphModule))]


def _run(case, gm):
    torch.manual_seed(0)
    try:
        return gm(*case.inputs, **case.kwinputs)
    except Exception as e:  # noqa: BLE001  # e.g. a split pytree-input program; compared
        return e


def _assert_same_run(t_case, theirs, o_case, ours):
    expected, actual = _run(t_case, theirs), _run(o_case, ours)
    if isinstance(expected, Exception):
        assert type(actual) is type(expected), f"torch raised {expected!r}, we gave {actual!r}"
        return
    _assert_same_values(expected, actual)


def _assert_same_values(expected, actual):
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected, equal_nan=True)
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected)
        for e, a in zip(expected, actual):
            _assert_same_values(e, a)
    elif isinstance(expected, dict):
        assert actual.keys() == expected.keys()
        for k in expected:
            _assert_same_values(expected[k], actual[k])
    else:
        assert actual == expected


def _traceable(entry) -> bool:
    try:
        _trace(torch.fx, build(entry, torch.fx))
    except Exception:  # noqa: BLE001  # programs torch cannot trace are out of scope here
        return False
    return True


TRACEABLE = [e for e in ENTRIES if _traceable(e)]


# Every callback with default options, and every option with the round-robin callback.
COMBOS = [(c, "default") for c in CALLBACKS] + [("round_robin", o) for o in OPTIONS if o != "default"]


def _cases() -> list:
    """Every entry with every combination; the options other than the default run on every
    fourth entry in `make test` and on all of them in `make test-slow` (CI runs both)."""
    return [pytest.param(entry, callback, options, id=f"{entry.name}-{callback}-{options}",
                         marks=pytest.mark.slow if options != "default" and i % 4 else ())
            for i, entry in enumerate(TRACEABLE) for callback, options in COMBOS]


@pytest.mark.parametrize(("entry", "callback", "options"), _cases())
def test_split_matches_torch(entry, callback, options):
    kw = OPTIONS[options]
    t_case, theirs, t_map = _split(torch.fx, torch_split_module, entry, callback, kw)
    o_case, ours, o_map = _split(ours_fx, split_module, entry, callback, kw)
    if isinstance(theirs, Exception):
        assert type(ours) is type(theirs), f"torch raised {theirs!r}, we gave {ours!r}"
        assert str(ours) == str(theirs)
        return
    assert not isinstance(ours, Exception), f"we raised {ours!r}; torch did not"
    t_mods, o_mods = _graph_modules(theirs), _graph_modules(ours)
    assert [n for n, _ in o_mods] == [n for n, _ in t_mods]
    for (name, t_mod), (_, o_mod) in zip(t_mods, o_mods):
        assert o_mod.code == torch_code_as_ours(t_mod.code), f"code of {name or 'parent'}"
    assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]
    assert o_map == t_map
    assert ours.meta["partition_names"] == theirs.meta["partition_names"]
    _assert_same_run(t_case, theirs, o_case, ours)


# --------------------------------------------------------------------------------------------
# Hand-built graphs: get_attr handling, defaults, grad-mode and autocast regions.


class _Params(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.sub = torch.nn.Linear(4, 4)
        self.register_buffer("buf", torch.ones(4))


def _build(fx, make):
    root = _Params()
    torch.manual_seed(0)
    root.sub.reset_parameters()
    graph = fx.Graph()
    make(graph)
    return root, fx.GraphModule(root, graph)


def _attrs_graph(g):
    x = g.placeholder("x")
    y = g.placeholder("y", default_value=2.0)
    w = g.get_attr("sub.weight")
    sub = g.get_attr("sub")
    b = g.get_attr("buf")
    a = g.call_function(torch.matmul, (x, w))
    c = g.call_function(operator.add, (a, b))
    d = g.call_method("mul", (c, y))
    e = g.call_function(torch.relu, (d,))
    bias = g.call_function(getattr, (sub, "bias"))  # a module-valued get_attr crossing over
    f = g.call_function(torch.add, (e, bias))
    g.output((f, c))


def _grad_graph(g):
    x = g.placeholder("x")
    a = g.call_function(torch.sin, (x,))
    g.call_function(torch._C._set_grad_enabled, (False,))
    b = g.call_function(torch.cos, (a,))
    c = g.call_function(torch.exp, (b,))
    g.call_function(torch._C._set_grad_enabled, (True,))
    d = g.call_function(torch.neg, (c,))
    g.output(d)


def _autocast_graph(g):
    x = g.placeholder("x")
    a = g.call_function(torch.sin, (x,))
    enter = g.call_function(torch.amp._enter_autocast, ("cpu", torch.bfloat16, True, None))
    b = g.call_function(torch.mm, (a, a))
    c = g.call_function(torch.mm, (b, a))
    g.call_function(torch.amp._exit_autocast, (enter,))
    d = g.call_function(torch.add, (c, 1))
    g.output(d)


GRAPHS = {"attrs": _attrs_graph, "grad": _grad_graph, "autocast": _autocast_graph}

GRAPH_CALLBACKS = {
    "round_robin": _round_robin,
    "increasing": _by_position,
    "single": _single,
    "decreasing": _reverse,
}


@pytest.mark.parametrize("options", list(OPTIONS))
@pytest.mark.parametrize("callback", list(GRAPH_CALLBACKS))
@pytest.mark.parametrize("graph", list(GRAPHS))
def test_hand_built_graphs(graph, callback, options):
    kw = OPTIONS[options]
    results = []
    for fx, split in ((torch.fx, torch_split_module), (ours_fx, split_module)):
        root, gm = _build(fx, GRAPHS[graph])
        qmap: dict[str, str] = {}
        try:
            results.append((split(gm, root, GRAPH_CALLBACKS[callback](), qmap, **kw), qmap))
        except Exception as e:  # noqa: BLE001  # compared below
            results.append((e, qmap))
    (theirs, t_map), (ours, o_map) = results
    if isinstance(theirs, Exception):
        assert type(ours) is type(theirs) and str(ours) == str(theirs)
        return
    assert not isinstance(ours, Exception), f"we raised {ours!r}"
    t_mods, o_mods = _graph_modules(theirs), _graph_modules(ours)
    assert [n for n, _ in o_mods] == [n for n, _ in t_mods]
    for (name, t_mod), (_, o_mod) in zip(t_mods, o_mods):
        assert o_mod.code == t_mod.code, f"code of {name or 'parent'}"
    assert o_map == t_map
    x = torch.randn(4, 4)
    _assert_same_values(theirs(x), ours(x))


def test_cycle_between_partitions_raises():
    def make(g):
        x = g.placeholder("x")
        a = g.call_function(torch.sin, (x,))
        b = g.call_function(torch.cos, (a,))
        c = g.call_function(torch.exp, (b,))
        g.output(c)
    ids = {"sin": 0, "cos": 1, "exp": 0}
    root, gm = _build(ours_fx, make)
    with pytest.raises(RuntimeError, match="cycle exists between partitions!"):
        split_module(gm, root, lambda n: ids[n.name])


def test_signature_matches_torch():
    assert inspect.signature(split_module).parameters.keys() == \
        inspect.signature(torch_split_module).parameters.keys()


def test_partition_repr():
    p = Partition("3")
    assert p.submod_name == "submod_3"
    assert repr(p) == repr(torch.fx.passes.split_module.Partition("3"))


def test_node_partition_attribute_and_qualname_map():
    def make(g):
        x = g.placeholder("x")
        a = g.call_module("sub", (x,))
        g.output(a)
    root, gm = _build(ours_fx, make)
    qmap: dict[str, str] = {}
    out = split_module(gm, root, lambda n: 7, qmap)
    assert qmap == {"submod_7.sub": "sub"}
    assert next(n for n in gm.graph.nodes if n.op == "call_module")._fx_partition == "7"
    assert out.meta["partition_names"] == {"submod_7"}


# --------------------------------------------------------------------------------------------
# Symbolic sizes in ``meta["example_value"]``: a partition reading a tensor of size s0 also
# receives the node binding s0.


def _symbolic_graph(fx, bind_placeholder: bool):
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    s0 = env.create_symintnode(env.create_symbol(3, ConstantSource("s0")), hint=3)
    s1 = env.create_symintnode(env.create_symbol(5, ConstantSource("s1")), hint=5)
    xv = torch.empty(s0, 4, device="meta")
    g = fx.Graph()

    def node(n, value):
        n.meta["example_value"] = value
        return n
    if bind_placeholder:
        node(g.placeholder("s"), s0)
    x = node(g.placeholder("x"), xv)
    n = node(g.placeholder("n"), s1)
    a = node(g.call_function(torch.sin, (x,)), xv)
    size = node(g.call_method("size", (a, 0)), s0)
    b = node(g.call_function(torch.cos, (a,)), xv)
    c = node(g.call_function(torch.ones, (size, n)), torch.empty(s0, s1, device="meta"))
    d = node(g.call_function(operator.add, (b, 1)), xv)
    g.output((c, d))
    return fx.GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize("bind_placeholder", [True, False])
@pytest.mark.parametrize("size_partition", [0, 1])
def test_symbolic_example_values(bind_placeholder, size_partition):
    ids = {"sin": 0, "size": size_partition, "cos": 2, "ones": 3, "add": 4}
    results = []
    for fx, split in ((torch.fx, torch_split_module), (ours_fx, split_module)):
        try:
            results.append(split(_symbolic_graph(fx, bind_placeholder), None,
                                 lambda n: ids[n.name]))
        except Exception as e:  # noqa: BLE001  # compared below
            results.append(e)
    theirs, ours = results
    if isinstance(theirs, Exception):
        assert type(ours) is type(theirs) and str(ours) == str(theirs)
        return
    for (name, t_mod), (_, o_mod) in zip(_graph_modules(theirs), _graph_modules(ours)):
        assert o_mod.code == t_mod.code, f"code of {name or 'parent'}"
