"""lint() catches malformed graphs and names the bad node, showing a window of the graph."""

import pytest
import torch

import exportir.fx as efx


def _chain(n=12):
    g = efx.Graph()
    x = g.placeholder("x")
    cur = x
    for _ in range(n):
        cur = g.call_function(torch.neg, (cur,))
    g.output(cur)
    return g


def test_clean_graph_passes():
    _chain().lint()


def test_use_before_def_names_the_node_and_marks_it():
    g = _chain()
    nodes = list(g.nodes)
    nodes[2].args = (nodes[5],)  # neg_1 now reads neg_4, defined later
    with pytest.raises(RuntimeError) as info:
        g.lint()
    text = str(info.value)
    assert "Argument 'neg_4' of Node 'neg_1' was used before it has been defined" in text
    assert "--> %neg_1" in text
    assert "%neg_10" not in text  # a window, not the whole graph


def test_foreign_node_is_reported():
    g = _chain(2)
    other = efx.Graph()
    stranger = other.placeholder("stranger")
    list(g.nodes)[1].args = (stranger,)
    with pytest.raises(RuntimeError, match="Argument 'stranger' of Node 'neg' does not belong to this Graph"):
        g.lint()


def test_two_outputs_are_reported():
    g = _chain(2)
    x = next(iter(g.nodes))
    g.output(x)
    with pytest.raises(RuntimeError, match="comes after the graph's output node") as info:
        g.lint()
    assert "--> return x" in str(info.value)


def test_missing_target_is_reported_with_owning_module():
    root = torch.nn.Module()
    root.sub = torch.nn.Module()
    g = efx.Graph()
    x = g.placeholder("x")
    g.owning_module = root
    with pytest.warns(UserWarning):
        g.call_module("sub.missing", (x,))
    g.output(x)
    with pytest.raises(RuntimeError, match="target sub.missing references nonexistent attribute missing of sub"):
        g.lint()


def test_call_module_must_be_a_module():
    root = torch.nn.Module()
    root.register_buffer("buf", torch.zeros(1))
    g = efx.Graph()
    x = g.placeholder("x")
    g.owning_module = root
    g.call_module("buf", (x,))
    g.output(x)
    with pytest.raises(RuntimeError, match="does not reference an nn.Module"):
        g.lint()


def test_wrong_target_type_is_reported():
    root = torch.nn.Module()
    g = efx.Graph()
    x = g.placeholder("x")
    n = g.call_function(torch.relu, (x,))
    g.output(n)
    g.owning_module = root
    n.target = "relu"
    with pytest.raises(ValueError, match="but a Callable is expected"):
        g.lint()


def test_duplicate_names_are_reported():
    g = _chain(2)
    nodes = list(g.nodes)
    nodes[2].name = "neg"
    with pytest.raises(RuntimeError, match="Node redefined name neg!"):
        g.lint()


def test_erased_input_is_reported():
    g = _chain(3)
    nodes = list(g.nodes)
    victim = nodes[1]
    user = nodes[2]
    victim.users.clear()  # corrupt bookkeeping so erase_node lets it go
    g.erase_node(victim)
    user._input_nodes[victim] = None
    with pytest.raises(RuntimeError, match="was erased from the graph but is still used"):
        g.lint()
