"""Partitioning on plain FX graphs: claimed nodes are grouped, unclaimed ones left out, and no
proposed partition can create a cycle when fused."""

from __future__ import annotations

import operator
import random

import pytest
import torch

from exportir.dialects.backend import DELEGATION_TAG
from exportir.fx import Graph, symbolic_trace
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


def test_partitions_depending_on_each_other_once_fused_are_refused_with_the_path():
    # each partition alone is cycle-free, but fused, A feeds B (sin -> cos) and B feeds A
    # (exp -> neg -> add): the fused B passes sin's value on to exp's output
    def f(x, y):
        a1 = torch.sin(x)
        b1 = torch.cos(a1)
        b2 = torch.exp(y)
        a2 = a1 + torch.neg(b2)
        return a2, b1

    gm = symbolic_trace(f)
    tags = {"sin": "A", "add": "A", "cos": "B", "exp": "B"}
    for n in gm.graph.nodes:
        if n.name in tags:
            n.meta[DELEGATION_TAG] = tags[n.name]
    with pytest.raises(PartitionError, match=r"partition 'A' cannot be fused: the path sin -> "
                       r"cos \(partition 'B'\) -> exp \(partition 'B'\) -> neg -> add"):
        collect_partitions(gm.graph)


def _random_graph(rng: random.Random, size: int) -> Graph:
    graph = Graph()
    values = [graph.placeholder(f"x{i}") for i in range(3)]
    for _ in range(size):
        if rng.random() < 0.3:
            values.append(graph.call_function(torch.neg, (rng.choice(values),)))
        else:
            values.append(graph.call_function(torch.add, tuple(rng.sample(values, 2))))
    graph.output(tuple(v for v in values[3:] if not v.users))
    return graph


def _fused_graph_is_acyclic(graph: Graph, parts: list[list]) -> bool:
    """Contract every partition into one node; whether the result has no cycle (Kahn)."""
    rep = {n: ("part", i) for i, p in enumerate(parts) for n in p}
    key = lambda n: rep.get(n, n)
    edges = {(key(n), key(u)) for n in graph.nodes for u in n.users if key(n) != key(u)}
    nodes = {key(n) for n in graph.nodes}
    indegree = {k: 0 for k in nodes}
    for _, b in edges:
        indegree[b] += 1
    ready = [k for k, d in indegree.items() if d == 0]
    seen = 0
    while ready:
        k = ready.pop()
        seen += 1
        for a, b in edges:
            if a == k:
                indegree[b] -= 1
                if indegree[b] == 0:
                    ready.append(b)
    return seen == len(nodes)


@pytest.mark.parametrize("seed", range(60))
def test_proposed_partitions_fuse_without_cycles_on_random_graphs(seed):
    from exportir.backends.fused_cpu.partitioner import _merge_independent

    rng = random.Random(seed)
    graph = _random_graph(rng, rng.randint(8, 40))
    unsupported = {n for n in graph.nodes if rng.random() < 0.3}
    parts = propose_partitions(graph, lambda n: n not in unsupported)
    assert _fused_graph_is_acyclic(graph, parts)
    merged = _merge_independent(graph, parts)
    assert _fused_graph_is_acyclic(graph, merged)
    tag_partitions(merged)
    collect_partitions(graph)  # raises on a cycle
