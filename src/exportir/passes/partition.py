"""Partitioning: from "which nodes a backend supports" to tagged, fusable partitions, and from a
tag to the subgraph it fuses into.

- :func:`propose_partitions` groups supported ``call_function`` nodes into partitions that can
  all be fused, each into one node, without creating a cycle (greedy merging along data edges
  in topological order; a merge is refused when a path leaves the merged set and comes back,
  counting every other partition as the one node it fuses into: :func:`reentry_path`).
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from exportir.dialects.backend.specs import DELEGATION_TAG
from exportir.fx.graph import Graph
from exportir.fx.node import Node

__all__ = [
    "Grouping",
    "Partition",
    "PartitionError",
    "collect_partitions",
    "extract_subgraph",
    "propose_partitions",
    "reentry_path",
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


def reentry_path(
    members: set[Node], order: dict[Node, int], others: Mapping[Node, set[Node]] | None = None
) -> list[Node] | None:
    """A path that leaves ``members`` and comes back (as a node list), or None.

    ``others`` maps the nodes of other partitions to their partition. Each of those fuses into
    one node too, whose every output depends on every input: a path entering one continues
    from all of its nodes (two partitions that are each cycle-free can still depend on each
    other once fused)."""
    last = max(order[n] for n in members)
    spans = {
        id(g): (min(order[n] for n in g), max(order[n] for n in g))
        for g in (others or {}).values()
    }  # fmt: skip
    return _path(members, order, others or {}, _reach_limit(last, spans.values()))


def _path(
    members: set[Node], order: dict[Node, int], others: Mapping[Node, set[Node]], limit: int
) -> list[Node] | None:
    """``reentry_path`` exploring nodes up to position ``limit`` only."""
    parent: dict[Node, Node] = {}
    stack: list[Node] = []
    entered: set[int] = set()  # the other partitions reached (ids of their node sets)

    def visit(node: Node, via: Node) -> None:
        if node not in parent and node not in members and order[node] <= limit:
            parent[node] = via
            stack.append(node)

    for m in members:
        for user in m.users:
            visit(user, m)
    while stack:
        node = stack.pop()
        for user in node.users:
            if user in members:
                path = [user, node]
                while path[-1] in parent:
                    path.append(parent[path[-1]])
                return path[::-1]
            visit(user, node)
        fused = others.get(node)
        if fused is not None and id(fused) not in entered:
            entered.add(id(fused))
            for fused_with in fused:
                visit(fused_with, node)
    return None


def _reach_limit(last: int, spans: Iterable[tuple[int, int]]) -> int:
    """The last position from which a path can still come back to a node at or before
    ``last``: plain edges only go forward, but a partition (``spans``: first and last
    position of each) entered at one of its nodes is left from any of them, so partitions
    starting before the limit extend it to their last node."""
    limit = last
    for low, high in sorted(s for s in spans if s[1] > last):
        if low > limit:
            break
        limit = max(limit, high)
    return limit


class Grouping:
    """Nodes in groups that will each fuse into one node (would-be partitions).

    ``merge(x, y)`` joins the groups of two nodes unless the graph with every group fused would
    have a cycle (:func:`reentry_path` with the other groups)."""

    __slots__ = ("_of", "_order", "_span")

    def __init__(self, order: dict[Node, int]) -> None:
        self._order = order
        self._of: dict[Node, set[Node]] = {}
        self._span: dict[int, tuple[int, int]] = {}

    def __contains__(self, node: object) -> bool:
        return node in self._of

    def add(self, nodes: Iterable[Node], join: Node | None = None) -> None:
        """Put ``nodes`` in a new group, or in the group of ``join`` (no cycle check)."""
        group = self._of[join] if join is not None else set()
        group.update(nodes)
        for n in group:
            self._of[n] = group
        positions = [self._order[n] for n in group]
        self._span[id(group)] = (min(positions), max(positions))

    def merge(self, x: Node, y: Node) -> bool:
        """Join the groups of ``x`` and ``y`` unless that makes a cycle; whether they are one."""
        a, b = self._of.get(x), self._of.get(y)
        if a is None or b is None:
            return False
        if a is b:
            return True
        (la, ha), (lb, hb) = self._span[id(a)], self._span[id(b)]
        spans = (s for k, s in self._span.items() if k not in (id(a), id(b)))
        merged = a | b
        if _path(merged, self._order, self._of, _reach_limit(max(ha, hb), spans)) is not None:
            return False
        del self._span[id(a)], self._span[id(b)]
        self._span[id(merged)] = (min(la, lb), max(ha, hb))
        for n in merged:
            self._of[n] = merged
        return True

    def groups(self) -> list[list[Node]]:
        """The groups, each in graph order, ordered by their first node."""
        distinct = {id(g): g for g in self._of.values()}.values()
        ordered = (sorted(g, key=self._order.__getitem__) for g in distinct)
        return sorted(ordered, key=lambda g: self._order[g[0]])


def propose_partitions(
    graph: Graph, is_supported: Callable[[Node], bool], *, min_size: int = 1
) -> list[list[Node]]:
    """Cycle-free partitions of the supported ``call_function`` nodes, in graph order.

    Nodes join the partitions of their inputs, then partitions reading a common value merge;
    every merge is refused when it would create a cycle in the graph with every partition
    fused (:class:`Grouping`). A ``getitem`` of a supported node joins its source's partition.
    Partitions with fewer than ``min_size`` compute nodes (getitems not counted) are dropped.
    """
    grouping = Grouping(_order(graph))
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            src = node.args[0]
            if isinstance(src, Node) and src in grouping:
                grouping.add([node], join=src)
            continue
        if not is_supported(node):
            continue
        grouping.add([node])
        for inp in node.all_input_nodes:
            grouping.merge(node, inp)
    # siblings: partitions reading a common value fuse too when that makes no cycle
    for node in graph.nodes:
        users = [u for u in node.users if u in grouping]
        for a, b in itertools.pairwise(users):
            grouping.merge(a, b)
    return [
        members
        for members in grouping.groups()
        if sum(n.target is not operator.getitem for n in members) >= min_size
    ]


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
    members = {tag: _with_getitems(nodes, order) for tag, nodes in by_tag.items()}
    result = []
    for tag in wanted:
        nodes = members.get(tag, [])
        if not nodes:
            continue
        others = {n: group for t, g in members.items() if t != tag for group in [set(g)]
                  for n in g}  # fmt: skip
        result.append(_partition(tag, nodes, owned.get(tag, []), order, others))
    return result


def _with_getitems(nodes: list[Node], order: dict[Node, int]) -> list[Node]:
    members = set(nodes)
    for node in nodes:
        for user in node.users:
            if user.op == "call_function" and user.target is operator.getitem:
                members.add(user)
    return sorted(members, key=order.__getitem__)


def _partition(
    tag: str,
    nodes: list[Node],
    owned: list[Node],
    order: dict[Node, int],
    others: Mapping[Node, set[Node]],
) -> Partition:
    members = set(nodes)
    path = reentry_path(members, order, others)
    if path is not None:
        shown = " -> ".join(_on_path(n, others) for n in path)
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


def _on_path(node: Node, others: Mapping[Node, set[Node]]) -> str:
    """A node of a cycle path; one of another partition names that partition (fused, it
    passes a dependency from any of its inputs to any of its outputs)."""
    if node not in others:
        return node.name
    tag = next(t for m in others[node] if (t := m.meta.get(DELEGATION_TAG)) is not None)
    return f"{node.name} (partition {tag!r})"


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
