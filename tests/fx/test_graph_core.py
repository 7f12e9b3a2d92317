"""Node and Graph container behaviour, compared step by step with torch.fx."""

import operator
import warnings

import pytest
import torch
import torch.fx as tfx

import exportir.fx as efx
from exportir.fx.immutable_collections import immutable_dict, immutable_list
from exportir.fx.node import map_aggregate, map_arg


def _build(fx):
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.placeholder("y", default_value=3)
    a = g.call_function(operator.add, (x, y))
    b = g.call_method("relu", (a,))
    c = g.call_function(torch.add, (b, [a, {"k": x}]), {"alpha": 2})
    d = g.call_module("linear", (c,))
    e = g.get_attr("param.weight")
    f = g.call_function(torch.ops.aten.add.Tensor, (d, e))
    f2 = g.call_function(operator.add, (f, f))
    with g.inserting_before(f2):
        g.call_function(torch.neg, (f,), name="add")
    g.output((f2, a))
    return g


def _shape(g):
    rows = []
    for n in g.nodes:
        rows.append((
            n.op, n.name, n.target, repr(n.args), repr(dict(n.kwargs)),
            [u.name for u in n.users], [i.name for i in n.all_input_nodes], n._sort_key,
        ))
    return rows


def test_building_matches_torch_fx():
    assert _shape(_build(efx)) == _shape(_build(tfx))


def _edit(fx):
    g = _build(fx)
    nodes = list(g.nodes)
    x, y, add, relu = nodes[:4]
    changed = add.replace_all_uses_with(x)
    relu.args = (y,)
    g.erase_node(add)
    nodes[4].update_arg(0, y)
    nodes[4].update_kwarg("alpha", 5)
    nodes[4].insert_arg(1, x)
    nodes[6].replace_input_with(nodes[5], x)
    last = list(g.nodes)[-2]
    g.output_node().prepend(relu)  # move relu to just before the output
    return g, [n.name for n in changed], last.name


def test_editing_matches_torch_fx():
    ours, changed_ours, _ = _edit(efx)
    theirs, changed_theirs, _ = _edit(tfx)
    assert changed_ours == changed_theirs
    assert _shape(ours) == _shape(theirs)
    ours.lint()


def test_args_are_immutable_and_help_the_user():
    g = efx.Graph()
    x = g.placeholder("x")
    n = g.call_function(torch.cat, ([x, x],), {"dim": 0})
    assert type(n.args[0]) is immutable_list and type(n.kwargs) is immutable_dict
    with pytest.raises(TypeError, match="(?s)does not support mutation.*node.args = new_args"):
        n.args[0].append(x)
    with pytest.raises(TypeError, match="does not support mutation"):
        n.kwargs["dim"] = 1


def test_map_helpers_match_torch():
    g = efx.Graph()
    x = g.placeholder("x")
    nested = (x, [1, {"a": x, "b": slice(x, 2)}], 3)
    mapped = map_arg(nested, lambda n: "X")
    assert mapped == ("X", [1, {"a": "X", "b": slice("X", 2, None)}], 3)
    assert type(mapped[1]) is immutable_list and type(mapped[1][1]) is immutable_dict
    assert map_aggregate((1, [2]), lambda v: v * 10) == (10, [20])
    with pytest.raises(AssertionError, match="fn must be a callable"):
        map_arg(nested, 3)


def test_node_ordering_and_neighbours():
    g = _build(efx)
    nodes = list(g.nodes)
    assert nodes[0] < nodes[1] < nodes[-1]
    assert nodes[1].prev is nodes[0] and nodes[0].next is nodes[1]
    assert nodes[0].prev is g._root and nodes[-1].next is g._root
    assert [n.name for n in reversed(g.nodes)] == [n.name for n in nodes][::-1]
    assert len(g.nodes) == len(nodes)


def test_iteration_survives_erasing_the_current_node():
    g = efx.Graph()
    x = g.placeholder("x")
    chain = [x]
    for _ in range(5):
        chain.append(g.call_function(torch.neg, (chain[-1],)))
    g.output(x)
    seen = []
    for n in reversed(g.nodes):
        seen.append(n.name)
        if n.op == "call_function":
            g.erase_node(n)
    assert seen == ["output", "neg_4", "neg_3", "neg_2", "neg_1", "neg", "x"]
    assert [n.name for n in g.nodes] == ["x", "output"]


def test_erase_node_with_users_raises_like_torch():
    for fx in (efx, tfx):
        g = fx.Graph()
        x = g.placeholder("x")
        g.call_function(torch.relu, (x,))
        with pytest.raises(RuntimeError) as info:
            g.erase_node(x)
        assert str(info.value) == "Tried to erase Node x but it still had 1 users in the graph: {relu: None}!"


def test_erase_twice_warns():
    g = efx.Graph()
    x = g.placeholder("x")
    r = g.call_function(torch.relu, (x,))
    g.erase_node(r)
    with pytest.warns(UserWarning, match="already erased"):
        g.erase_node(r)


def test_find_nodes_tracks_target_changes():
    g = _build(efx)
    adds = g.find_nodes(op="call_function", target=operator.add)
    assert [n.name for n in adds] == ["add", "add_2"]
    adds[0].target = operator.mul
    assert [n.name for n in g.find_nodes(op="call_function", target=operator.mul)] == ["add"]
    assert [n.name for n in g.find_nodes(op="call_function", target=operator.add)] == ["add_2"]
    assert [n.name for n in g.find_nodes(op="get_attr", target="param.weight")] == ["param_weight"]
    with pytest.raises(ValueError, match="needs a target"):
        g.find_nodes(op="call_function")


def test_node_constructor_validates_target():
    g = efx.Graph()
    with pytest.raises(ValueError, match="but a Callable is expected"):
        efx.Node(g, "n", "call_function", "relu", (), {})
    with pytest.raises(ValueError, match="but a str is expected"):
        efx.Node(g, "n", "call_method", torch.relu, (), {})
    with pytest.raises(AssertionError, match="op 'bogus' is not in _legal_ops"):
        efx.Node(g, "n", "bogus", "relu", (), {})


def test_create_node_rejects_non_tuple_args():
    g = efx.Graph()
    with pytest.raises(TypeError, match="args must be a tuple"):
        g.create_node("call_function", torch.relu, [1])


def test_graph_copy_and_deepcopy():
    import copy

    g = _build(efx)
    assert _shape(copy.deepcopy(g)) == _shape(copy.deepcopy(_build(tfx)))
    new = efx.Graph()
    val_map = {}
    out = new.graph_copy(g, val_map)
    assert [n.name for n in out] == ["add_2", "add"]
    assert all(k.graph is g and v.graph is new for k, v in val_map.items())


def test_replace_all_uses_with_callback_and_meta():
    g = efx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.neg, (x,))
    b = g.call_function(torch.relu, (x,))
    c = g.call_function(torch.sin, (x,))
    x.meta["val"] = 1
    y = g.placeholder("y")
    changed = x.replace_all_uses_with(y, lambda user: user is not b, propagate_meta=True)
    assert changed == [a, c]
    assert b.args == (x,) and a.args == (y,)
    assert y.meta == {"val": 1}
    with pytest.raises(AssertionError, match="already has .meta keys"):
        x.replace_all_uses_with(y, propagate_meta=True)


def test_dce_keeps_impure_nodes():
    g = efx.Graph()
    x = g.placeholder("x")
    g.call_function(torch.neg, (x,))
    g.call_function(torch._assert, (x, "msg"))
    g.call_function(torch.ops.aten.add_.Tensor, (x, x))
    g.call_function(torch.rand, (3,))
    g.call_function(operator.setitem, (x, 0, 1))
    g.output(x)
    assert g.eliminate_dead_code()
    kept = [n.target for n in g.nodes if n.op == "call_function"]
    assert kept == [torch._assert, torch.ops.aten.add_.Tensor, torch.rand, operator.setitem]
    assert not g.eliminate_dead_code()


def test_dce_custom_predicate_and_chains():
    g = efx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.neg, (x,))
    b = g.call_function(torch.neg, (a,))
    g.call_function(torch.neg, (b,))
    g.output(x)
    assert g.eliminate_dead_code(is_impure_node=lambda n: n.op == "placeholder")
    assert [n.op for n in g.nodes] == ["placeholder"]


def test_has_side_effect_registration():
    def my_effect(x):
        return x

    efx.has_side_effect(my_effect)
    g = efx.Graph()
    x = g.placeholder("x")
    g.call_function(my_effect, (x,))
    g.output(x)
    assert not g.eliminate_dead_code()


def test_inserting_points_restore():
    g = efx.Graph()
    x = g.placeholder("x")
    out = g.output(x)
    with g.inserting_before(out):
        a = g.call_function(torch.neg, (x,))
    with g.inserting_after(x):
        b = g.call_function(torch.relu, (x,))
    with g.inserting_before(None):
        c = g.placeholder("first")
    d = g.call_function(torch.sin, (x,))  # default: append at end
    assert [n.name for n in g.nodes] == ["first", "x", "relu", "neg", "output", "sin"]
    assert a.prev is b and c.next is x and d.prev is out
    with pytest.raises(ValueError, match="not in this graph"):
        g.inserting_before(efx.Graph().placeholder("z"))


def test_stack_trace_property():
    g = efx.Graph()
    x = g.placeholder("x")
    assert x.stack_trace is None
    x.stack_trace = "File a.py, line 1"
    assert x.meta["stack_trace"] == "File a.py, line 1"


def test_normalized_arguments():
    g = efx.Graph()
    x = g.placeholder("x")
    n = g.call_function(torch.ops.aten.add.Tensor, (x, x))
    pair = n.normalized_arguments(torch.nn.Module(), normalize_to_only_use_kwargs=True)
    assert pair.args == () and pair.kwargs == {"input": x, "other": x, "alpha": 1}

    def f(a, b=2, *, c=3):
        return a

    m = g.call_function(f, (x,))
    assert m.normalized_arguments(torch.nn.Module()).kwargs == {"b": 2, "c": 3}
    root = torch.nn.Module()
    root.lin = torch.nn.Linear(2, 2)
    k = g.call_module("lin", (x,))
    assert k.normalized_arguments(root, normalize_to_only_use_kwargs=True).kwargs == {"input": x}
    s = g.call_function(torch.sum, (x,))
    with pytest.raises(RuntimeError, match="ambiguous"):
        s.normalized_arguments(root)


def test_is_impure_call_module_reads_flag():
    gm_root = torch.nn.Module()
    gm_root.m = torch.nn.ReLU()
    g = efx.Graph()
    x = g.placeholder("x")
    n = g.call_module("m", (x,))
    with pytest.raises(AssertionError, match="owning_module not set"):
        n.is_impure()
    g.owning_module = gm_root
    assert not n.is_impure()
    gm_root.m._is_impure = True
    assert n.is_impure()


def test_prepend_self_is_a_silent_no_op():
    g = efx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.relu, (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y.prepend(y)
        y.append(y)
    assert [n.name for n in g.nodes] == ["x", "relu"]
