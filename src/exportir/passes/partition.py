"""Partitioning: from "which nodes a backend supports" to tagged, fusable partitions, and from a
tag to the subgraph it fuses into.

- :func:`propose_partitions` groups supported ``call_function`` nodes into partitions that can
  each be fused into one node without creating a cycle (greedy merging along data edges in
  topological order; a merge is refused when a path leaves the merged set and comes back).
- :func:`tag_partitions` writes ``node.meta["delegation_tag"]``.
- :func:`collect_partitions` reads the tags back, checks each partition is fusable (the error
  names the nodes of the offending path) and describes it as a :class:`Partition`: its nodes in
  graph order, its inputs (values defined outside and used inside, in first-use order) and its
  outputs (values used outside, in graph order).
- :func:`extract_subgraph` copies a partition into a standalone graph (inputs become
  placeholders with the same names; the output is the tuple of the partition's outputs).
- :func:`stable_topological_sort` reorders a graph after a fusion, keeping the original order
  wherever the data dependencies allow.
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from exportir.dialects.backend.specs import DELEGATION_TAG
from exportir.fx.graph import Graph
from exportir.fx.node import Node

__all__ = [
    "Partition",
    "PartitionError",
    "collect_partitions",
    "extract_subgraph",
    "propose_partitions",
    "stable_topological_sort",
    "tag_partitions",
]


class PartitionError(ValueError):
    """A tagged partition that cannot be fused (a dependency cycle, a bad node)."""


@dataclass(frozen=True, slots=True)
class Partition:
    tag: str
    nodes: tuple[Node, ...]  # call_function nodes, in graph order
    owned: tuple[Node, ...]  # placeholders handed over to the backend (tagged constant state)
    inputs: tuple[Node, ...]  # values from outside, in first-use order
    outputs: tuple[Node, ...]  # values used outside, in graph order


# ------------------------------------------------------------------------------ proposing


def _order(graph: Graph) -> dict[Node, int]:
    return {n: i for i, n in enumerate(graph.nodes)}


def _reenters(members: set[Node], order: dict[Node, int]) -> list[Node] | None:
    """A path that leaves ``members`` and comes back (as a node list), or None."""
    last = max(order[n] for n in members)
    parent: dict[Node, Node] = {}
    stack = []
    for m in members:
        for user in m.users:
            if user not in members and user not in parent and order[user] < last:
                parent[user] = m
                stack.append(user)
    while stack:
        node = stack.pop()
        for user in node.users:
            if user in members:
                path = [user, node]
                while path[-1] in parent:
                    path.append(parent[path[-1]])
                return path[::-1]
            if user not in parent and order[user] < last:
                parent[user] = node
                stack.append(user)
    return None


def propose_partitions(
    graph: Graph, is_supported: Callable[[Node], bool], *, min_size: int = 1
) -> list[list[Node]]:
    """Cycle-free partitions of the supported ``call_function`` nodes, in graph order.

    Nodes join the partitions of their inputs, then partitions reading a common value merge;
    every merge is refused when it would create a cycle. A ``getitem`` of a supported node joins its source's partition. Partitions with fewer
    than ``min_size`` compute nodes (getitems not counted) are dropped.
    """
    order = _order(graph)
    group: dict[Node, set[Node]] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            src = node.args[0]
            if isinstance(src, Node) and src in group:
                group[src].add(node)
                group[node] = group[src]
            continue
        if not is_supported(node):
            continue
        group[node] = {node}
        for inp in node.all_input_nodes:
            _try_merge(group, node, inp, order)
    # siblings: partitions reading a common value fuse too when that makes no cycle
    for node in graph.nodes:
        users = [u for u in node.users if u in group]
        for a, b in itertools.pairwise(users):
            _try_merge(group, a, b, order)
    seen: list[set[Node]] = []
    for members in group.values():
        if not any(members is s for s in seen):
            seen.append(members)
    result = []
    for members in seen:
        compute = [n for n in members if n.target is not operator.getitem]
        if len(compute) >= min_size:
            result.append(sorted(members, key=order.__getitem__))
    return sorted(result, key=lambda p: order[p[0]])


def _try_merge(group: dict[Node, set[Node]], node: Node, inp: Node, order: dict[Node, int]) -> None:
    a, b = group.get(node), group.get(inp)
    if a is None or b is None or a is b:
        return
    merged = a | b
    if _reenters(merged, order) is not None:
        return
    for n in merged:
        group[n] = merged


def tag_partitions(partitions: Iterable[Sequence[Node]], prefix: str = "tag") -> list[str]:
    """Tag each partition's nodes ``<prefix><i>``; returns the tags in order."""
    tags = []
    for i, nodes in enumerate(partitions):
        tag = f"{prefix}{i}"
        for node in nodes:
            node.meta[DELEGATION_TAG] = tag
        tags.append(tag)
    return tags


# ------------------------------------------------------------------------------ collecting


def _describe(node: Node) -> str:
    trace = node.meta.get("stack_trace") or ""
    line = trace.strip().splitlines()[-2].strip() if trace.strip().count("\n") >= 1 else ""
    return f"{node.name} ({node.format_node()})" + (f" from {line}" if line else "")


def collect_partitions(graph: Graph, tags: Iterable[str] | None = None) -> list[Partition]:
    """The tagged partitions of ``graph`` (only ``tags`` when given), checked fusable."""
    order = _order(graph)
    by_tag: dict[str, list[Node]] = {}
    owned: dict[str, list[Node]] = {}
    for node in graph.nodes:
        tag = node.meta.get(DELEGATION_TAG)
        if tag is None:
            continue
        if node.op == "call_function":
            by_tag.setdefault(tag, []).append(node)
        elif node.op == "placeholder":
            owned.setdefault(tag, []).append(node)
        else:
            raise PartitionError(
                f"node {_describe(node)} is a {node.op} node tagged {tag!r}; only call_function "
                "nodes (and constant placeholders, to hand them to the backend) can be tagged"
            )
    wanted = list(by_tag) if tags is None else list(tags)
    result = []
    for tag in wanted:
        nodes = _with_getitems(by_tag.get(tag, []), order)
        if not nodes:
            continue
        result.append(_partition(tag, nodes, owned.get(tag, []), order))
    return result


def _with_getitems(nodes: list[Node], order: dict[Node, int]) -> list[Node]:
    members = set(nodes)
    for node in nodes:
        for user in node.users:
            if user.op == "call_function" and user.target is operator.getitem:
                members.add(user)
    return sorted(members, key=order.__getitem__)


def _partition(tag: str, nodes: list[Node], owned: list[Node], order: dict[Node, int]) -> Partition:
    members = set(nodes)
    path = _reenters(members, order)
    if path is not None:
        shown = " -> ".join(n.name for n in path)
        raise PartitionError(
            f"partition {tag!r} cannot be fused: the path {shown} leaves the partition and "
            "comes back, so one fused node would depend on itself. Tag the nodes on that path "
            "too, or split the partition there (propose_partitions builds cycle-free "
            "partitions)."
        )
    owned_set = {p for p in owned if all(u in members for u in p.users)}
    inputs: list[Node] = []
    for node in nodes:
        for inp in node.all_input_nodes:
            if inp not in members and inp not in owned_set and inp not in inputs:
                inputs.append(inp)
    outputs = [n for n in nodes if any(u not in members for u in n.users)]
    owned_sorted = sorted(owned_set, key=order.__getitem__)
    return Partition(tag, tuple(nodes), tuple(owned_sorted), tuple(inputs), tuple(outputs))


# ------------------------------------------------------------------------------ extracting


def extract_subgraph(partition: Partition) -> Graph:
    """A standalone graph computing ``partition``: placeholders for its owned state, then its
    inputs (same names, same meta), its nodes, and ``output((out0, out1, ...))``."""
    graph = Graph()
    env: dict[Node, Node] = {}
    for node in (*partition.owned, *partition.inputs):
        new = graph.placeholder(node.name)
        new.meta = dict(node.meta)
        new.meta.pop(DELEGATION_TAG, None)
        env[node] = new
    for node in partition.nodes:
        env[node] = graph.node_copy(node, env.__getitem__)
        env[node].meta.pop(DELEGATION_TAG, None)
    graph.output(tuple(env[n] for n in partition.outputs))
    return graph


# ------------------------------------------------------------------------------ ordering


def stable_topological_sort(graph: Graph) -> None:
    """Reorder ``graph`` so every node comes after its inputs, otherwise keeping its order."""
    nodes = list(graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    waiting = {n: len(set(n.all_input_nodes)) for n in nodes}
    ready = [index[n] for n in nodes if waiting[n] == 0]
    heapq.heapify(ready)
    result: list[Node] = []
    while ready:
        node = nodes[heapq.heappop(ready)]
        result.append(node)
        for user in node.users:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, index[user])
    if len(result) != len(nodes):
        stuck = [n.name for n in nodes if waiting[n] > 0][:8]
        raise PartitionError(f"the graph has a dependency cycle through {stuck}")
    if result == nodes:
        return
    cursor = result[0]
    for node in result[1:]:
        cursor.append(node)
        cursor = node
