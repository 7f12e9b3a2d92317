"""Partitioning on plain FX graphs: claimed nodes are grouped, unclaimed ones left out, and no
proposed partition can create a cycle when fused."""

from __future__ import annotations

import operator

import pytest
import torch

from exportir.dialects.backend import DELEGATION_TAG
from exportir.fx import symbolic_trace
from exportir.passes.partition import (
    PartitionError,
    collect_partitions,
    extract_subgraph,
    propose_partitions,
    stable_topological_sort,
    tag_partitions,
)


def _names(parts):
    return [[n.name for n in p] for p in parts]


def _supported_unless(*names):
    return lambda node: node.name not in names


def test_chain_becomes_one_partition():
    def f(x):
        return torch.relu(torch.sin(x) + 1) * 2

    gm = symbolic_trace(f)
    parts = propose_partitions(gm.graph, lambda n: True)
    assert _names(parts) == [["sin", "add", "relu", "mul"]]


def test_unsupported_node_in_a_diamond_splits_the_partition():
    # a -> b (unsupported) -> c, and a -> c: fusing a with c would make the fused node feed b
    # and depend on it.
    def f(x):
        a = torch.sin(x)
        b = torch.cos(a)
        return a + b

    gm = symbolic_trace(f)
    parts = propose_partitions(gm.graph, _supported_unless("cos"))
    assert _names(parts) == [["sin"], ["add"]]
    tag_partitions(parts)
    collected = collect_partitions(gm.graph)
    assert [p.tag for p in collected] == ["tag0", "tag1"]


def test_independent_branches_joined_by_a_supported_node_fuse():
    def f(x, y):
        return torch.sin(x) + torch.cos(y)

    gm = symbolic_trace(f)
    assert _names(propose_partitions(gm.graph, lambda n: True)) == [["sin", "cos", "add"]]


def test_min_size_drops_small_partitions():
    def f(x):
        return torch.cos(torch.sin(x)).neg()

    gm = symbolic_trace(f)
    assert propose_partitions(gm.graph, _supported_unless("cos"), min_size=2) == []


def test_getitem_joins_its_source():
    def f(x):
        parts = torch.split(x, 2)
        return parts[0] + parts[1]

    gm = symbolic_trace(f)
    parts = propose_partitions(gm.graph, lambda n: True)
    assert len(parts) == 1
    assert {n.target for n in parts[0]} >= {operator.getitem}


def test_collect_describes_inputs_and_outputs():
    def f(x, y):
        a = torch.sin(x)
        b = a * y
        c = torch.cos(b)
        return c, a

    gm = symbolic_trace(f)
    for n in gm.graph.nodes:
        if n.name in ("a", "sin", "mul"):
            n.meta[DELEGATION_TAG] = "t"
    (p,) = collect_partitions(gm.graph)
    assert [n.name for n in p.nodes] == ["sin", "mul"]
    assert [n.name for n in p.inputs] == ["x", "y"]
    assert [n.name for n in p.outputs] == ["sin", "mul"]
    sub = extract_subgraph(p)
    assert [n.op for n in sub.nodes] == [
        "placeholder",
        "placeholder",
        "call_function",
        "call_function",
        "output",
    ]
    assert not any(DELEGATION_TAG in n.meta for n in sub.nodes)


def test_hand_tagged_cycle_is_refused_with_the_path():
    def f(x):
        a = torch.sin(x)
        b = torch.cos(a)
        return a + b

    gm = symbolic_trace(f)
    for n in gm.graph.nodes:
        if n.name in ("sin", "add"):
            n.meta[DELEGATION_TAG] = "t"
    with pytest.raises(PartitionError, match="sin -> cos -> add leaves the partition"):
        collect_partitions(gm.graph)


def test_tagging_an_output_node_is_refused():
    gm = symbolic_trace(lambda x: x + 1)
    gm.graph.output_node().meta[DELEGATION_TAG] = "t"
    with pytest.raises(PartitionError, match="only call_function nodes"):
        collect_partitions(gm.graph)


def test_stable_topological_sort_moves_only_what_it_must():
    def f(x):
        a = torch.sin(x)
        b = torch.cos(x)
        return a + b

    gm = symbolic_trace(f)
    graph = gm.graph
    nodes = {n.name: n for n in graph.nodes}
    nodes["x"].append(nodes["add"])  # add now comes before its inputs
    stable_topological_sort(graph)
    assert [n.name for n in graph.nodes] == ["x", "sin", "cos", "add", "output"]
    graph.lint()
    stable_topological_sort(graph)  # already sorted: unchanged
    assert [n.name for n in graph.nodes] == ["x", "sin", "cos", "add", "output"]


@pytest.mark.parametrize("unsupported", [(), ("cos",), ("neg",), ("cos", "tanh"), ("sin", "add")])
def test_proposed_partitions_never_form_cycles(unsupported):
    def f(x, y):
        a = torch.sin(x)
        b = torch.cos(a)
        c = torch.neg(y) + a
        d = torch.tanh(b) * c
        return d + a, b

    gm = symbolic_trace(f)
    parts = propose_partitions(gm.graph, _supported_unless(*unsupported))
    claimed = {n.name for p in parts for n in p}
    assert claimed.isdisjoint(unsupported)
    tag_partitions(parts)
    collect_partitions(gm.graph)  # raises on a cycle
