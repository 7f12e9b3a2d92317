"""``<fx>._pytree``: flatten specs for custom types, and re-tracing structured GraphModules.

A GraphModule traced with ``concrete_args`` holding a custom pytree type starts with
``fx_pytree.tree_flatten_spec([x], self._in_spec)``. Traced again, that line runs on a Proxy;
a flatten-spec function registered for the type turns it into attribute reads. Each case is
run by torch.fx and by ours and compared: generated code, and outputs against eager.
"""

from __future__ import annotations

import dataclasses
import importlib
import pickle
import typing
from collections import namedtuple

import pytest
import torch
import torch.fx
import torch.fx._pytree as torch_fx_pytree
import torch.utils._pytree as tpt
from conftest import import_ours_fx, ours_fx_name

import exportir.pytree as ept

ours = import_ours_fx()
ours_fx_pytree = importlib.import_module(f"{ours_fx_name()}._pytree")
SANITY = ours is torch.fx


class Pair:
    """A custom container: two children read as attributes."""

    def __init__(self, a, b):
        self.a, self.b = a, b


@dataclasses.dataclass
class Box:
    """A dataclass container registered with ``register_dataclass``."""

    x: torch.Tensor
    scale: torch.Tensor


class Hidden:
    """Registered as a pytree node but given no flatten spec: cannot be traced again."""

    def __init__(self, v):
        self.v = v


Point = namedtuple("Point", ["x", "y"])


def _pair_spec(p, spec):
    return [p.a, p.b]


def _box_spec(b, spec):
    return [getattr(b, name) for name in spec.context[0]]


@pytest.fixture(scope="module", autouse=True)
def registrations():
    """Register the custom types with torch's pytree (both implementations read it) and the
    flatten specs with each implementation's ``_pytree``; undo all of it afterwards."""
    # named: torch's deregistration needs a serialized name per type
    tpt.register_pytree_node(Pair, lambda p: ([p.a, p.b], None), lambda v, c: Pair(*v),
                             serialized_type_name="test_fx_pytree.Pair")
    tpt.register_dataclass(Box, serialized_type_name="test_fx_pytree.Box")
    tpt.register_pytree_node(Hidden, lambda h: ([h.v], None), lambda v, c: Hidden(*v),
                             serialized_type_name="test_fx_pytree.Hidden")
    modules = {torch_fx_pytree, ours_fx_pytree}
    for mod in modules:
        mod.register_pytree_flatten_spec(Pair, _pair_spec)
        mod.register_pytree_flatten_spec(Box, _box_spec)
    yield
    for mod in modules:
        mod._deregister_pytree_flatten_spec(Pair)
        mod._deregister_pytree_flatten_spec(Box)
    for cls in (Pair, Box, Hidden):
        tpt._deregister_pytree_node(cls)


def f_pair(p):
    return p.a * 2 + p.b


def f_dict_of_pair(d):
    return d["pair"].a - d["pair"].b * d["k"]


def f_nested_pair(p):
    return p.a.a + p.a.b * p.b


def f_list_and_point(xs, pt):
    return xs[0].a + xs[0].b + xs[1] + pt.x * pt.y


def f_box(b):
    return b.x * b.scale


def _concrete(fx, name):
    ph = fx.PH
    table = {
        "pair": (f_pair, {"p": Pair(ph, ph)}),
        "dict_of_pair": (f_dict_of_pair, {"d": {"pair": Pair(ph, ph), "k": ph}}),
        "nested_pair": (f_nested_pair, {"p": Pair(Pair(ph, ph), ph)}),
        "list_and_point": (f_list_and_point, {"xs": [Pair(ph, ph), ph], "pt": Point(ph, ph)}),
        "box": (f_box, {"b": Box(ph, ph)}),
    }
    return table[name]


def _inputs(name):
    t = [torch.full((3,), float(v)) for v in (1.5, -2.0, 3.0, 0.5, 4.0)]
    table = {
        "pair": (Pair(t[0], t[1]),),
        "dict_of_pair": ({"pair": Pair(t[0], t[1]), "k": t[2]},),
        "nested_pair": (Pair(Pair(t[0], t[1]), t[2]),),
        "list_and_point": ([Pair(t[0], t[1]), t[2]], Point(t[3], t[4])),
        "box": (Box(t[0], t[1]),),
    }
    return table[name]


CASES = ["pair", "dict_of_pair", "nested_pair", "list_and_point", "box"]


def _three_traces(fx, name):
    """First trace with PH-filled concrete_args, a plain re-trace, a re-trace with them again."""
    fn, concrete = _concrete(fx, name)
    first = fx.symbolic_trace(fn, concrete_args=concrete)
    again = fx.symbolic_trace(first)
    again_concrete = fx.symbolic_trace(first, concrete_args=_concrete(fx, name)[1])
    return fn, (first, again, again_concrete)


@pytest.mark.parametrize("name", CASES)
def test_retrace_code_matches_torch_fx(name):
    _, theirs = _three_traces(torch.fx, name)
    _, mine = _three_traces(ours, name)
    for t, m in zip(theirs, mine):
        assert m.code == t.code


@pytest.mark.parametrize("name", CASES)
def test_retraced_modules_compute_like_eager(name):
    fn, traced = _three_traces(ours, name)
    expected = fn(*_inputs(name))
    for gm in traced:
        torch.testing.assert_close(gm(*_inputs(name)), expected)


def test_retrace_reads_the_container_through_the_flatten_spec():
    _, (_, again, _) = _three_traces(ours, "pair")
    reads = [(n.op, n.target, n.args[1]) for n in again.graph.nodes if n.op == "call_function"
             and n.args and isinstance(n.args[-1], str)]
    assert reads == [("call_function", getattr, "a"), ("call_function", getattr, "b")]
    assert [n.op for n in again.graph.nodes].count("placeholder") == 1


def test_without_a_flatten_spec_retrace_fails_like_torch_fx():
    def f(h):
        return h.v + 1

    errors = []
    for fx in (torch.fx, ours):
        gm = fx.symbolic_trace(f, concrete_args={"h": Hidden(fx.PH)})
        torch.testing.assert_close(gm(Hidden(torch.ones(2))), torch.full((2,), 2.0))
        with pytest.raises(RuntimeError, match="Real spec .* is different from expected spec"):
            fx.symbolic_trace(gm)
        errors.append(gm.code)
    assert errors[0] == errors[1]


@pytest.mark.skipif(SANITY, reason="read-through from ours to torch's table")
def test_flatten_spec_registered_only_with_torch_is_honoured():
    """A spec function registered with torch.fx._pytree (not ours) makes ours re-trace too."""
    class Only:
        def __init__(self, a):
            self.a = a

    tpt.register_pytree_node(Only, lambda o: ([o.a], None), lambda v, c: Only(*v),
                             serialized_type_name="test_fx_pytree.Only")
    torch_fx_pytree.register_pytree_flatten_spec(Only, lambda o, spec: [o.a])
    try:
        assert Only not in ours_fx_pytree.SUPPORTED_NODES
        gm = ours.symbolic_trace(lambda o: o.a.relu(), concrete_args={"o": Only(ours.PH)})
        again = ours.symbolic_trace(gm)
        x = torch.tensor([-1.0, 2.0])
        torch.testing.assert_close(again(Only(x)), x.relu())
    finally:
        torch_fx_pytree._deregister_pytree_flatten_spec(Only)
        tpt._deregister_pytree_node(Only)


@pytest.mark.skipif(SANITY, reason="our pytree registry")
def test_type_registered_with_our_pytree_retraces():
    """Registered with exportir.pytree only (torch's pytree does not know it)."""
    class Ours:
        def __init__(self, a, b):
            self.a, self.b = a, b

    ept.register_pytree_node(Ours, lambda o: ([o.a, o.b], None), lambda v, c: Ours(*v))
    ours_fx_pytree.register_pytree_flatten_spec(Ours, lambda o, spec: [o.a, o.b])
    try:
        gm = ours.symbolic_trace(lambda o: o.a - o.b, concrete_args={"o": Ours(ours.PH, ours.PH)})
        again = ours.symbolic_trace(gm)
        a, b = torch.ones(2), torch.full((2,), 4.0)
        torch.testing.assert_close(gm(Ours(a, b)), a - b)
        torch.testing.assert_close(again(Ours(a, b)), a - b)
    finally:
        ours_fx_pytree._deregister_pytree_flatten_spec(Ours)
        ept.DEFAULT_REGISTRY.unregister(Ours)


# --------------------------------------------------------------------------------------------
# The module's own API, against torch.fx._pytree.


def _spec(tree):
    return ept.tree_structure(tree) if not SANITY else tpt.tree_structure(tree)


@pytest.mark.parametrize("tree", [
    [1, {"a": 2, "b": (3, 4)}],
    Point(1, [2, 3]),
    Pair(1, Pair(2, 3)),
    {"box": Box(torch.ones(1), torch.zeros(1)), "k": 5},
    torch.return_types.max((torch.ones(1), torch.zeros(1))),
], ids=["builtins", "namedtuple", "pair", "box", "structseq"])
def test_tree_flatten_spec_matches_torch(tree):
    ours_leaves = ours_fx_pytree.tree_flatten_spec(tree, _spec(tree))
    theirs_leaves = torch_fx_pytree.tree_flatten_spec(tree, tpt.tree_structure(tree))
    assert len(ours_leaves) == len(theirs_leaves)
    assert all(a is b for a, b in zip(ours_leaves, theirs_leaves))


def test_tree_flatten_spec_reads_only_what_the_spec_names():
    spec = _spec(({"a": 0, "b": 0}, [0, 0]))
    tree = ({"b": 20, "a": 10, "extra": 99}, [30, 40, 50])
    assert ours_fx_pytree.tree_flatten_spec(tree, spec) == [10, 20, 30, 40]
    assert torch_fx_pytree.tree_flatten_spec(tree, tpt.tree_structure(
        ({"a": 0, "b": 0}, [0, 0]))) == [10, 20, 30, 40]


@pytest.mark.parametrize("node, count, expected", [
    ({"a": 1}, 1, True), ({"a": 1, "b": 2}, 1, False), ([1, 2], 2, True), ((1,), 2, False),
])
def test_exact_match_functions_match_torch(node, count, expected):
    spec = _spec(type(node)(range(count)) if not isinstance(node, dict)
                 else dict.fromkeys(list(node)[:count]))
    theirs_spec = tpt.tree_structure(type(node)(range(count)) if not isinstance(node, dict)
                                     else dict.fromkeys(list(node)[:count]))
    cls = dict if isinstance(node, dict) else type(node)
    assert ours_fx_pytree.SUPPORTED_NODES_EXACT_MATCH[cls](node, spec) is expected
    assert torch_fx_pytree.SUPPORTED_NODES_EXACT_MATCH[cls](node, theirs_spec) is expected


def test_register_and_deregister_like_torch():
    class Tmp:
        pass

    def read(t, spec):
        return []

    for mod in (ours_fx_pytree, torch_fx_pytree):
        mod.register_pytree_flatten_spec(Tmp, read)
        assert mod.SUPPORTED_NODES[Tmp] is read and mod.SUPPORTED_NODES_EXACT_MATCH[Tmp] is None
        mod._deregister_pytree_flatten_spec(Tmp)
        assert Tmp not in mod.SUPPORTED_NODES
        with pytest.raises(KeyError):
            mod._deregister_pytree_flatten_spec(Tmp)


def test_module_names_match_torch():
    """Every function, table and type alias of torch.fx._pytree (its own, not its imports)."""
    def own_names(mod):
        return {n for n, v in vars(mod).items() if not n.startswith("__")
                and not isinstance(v, (type(torch), typing.TypeVar))}

    imported = {"Any", "Callable", "NamedTuple", "PyTree", "TreeSpec", "TypeVar", "namedtuple",
                "tree_flatten", "return_type"}
    assert own_names(torch_fx_pytree) - imported <= own_names(ours_fx_pytree)


def test_generated_code_imports_our_fx_pytree_and_pickles():
    def f(d):
        return d["a"] + d["b"]

    gm = ours.symbolic_trace(f, concrete_args={"d": {"a": ours.PH, "b": ours.PH}})
    assert gm.forward.__globals__["fx_pytree"] is ours_fx_pytree
    loaded = pickle.loads(pickle.dumps(gm))
    assert loaded.forward.__globals__["fx_pytree"] is ours_fx_pytree
    a = torch.ones(2)
    torch.testing.assert_close(loaded({"a": a, "b": a}), a * 2)
