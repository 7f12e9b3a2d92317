"""Find-and-replace on FX graphs: ``replace_pattern`` and friends.

Every non-overlapping occurrence of ``pattern`` (matched by use-def structure,
not by names; placeholders match any value) is replaced by a copy of
``replacement`` wired to the same inputs. Matches are handled in topological
order of their first anchor, exactly as torch.fx does, and the returned
``Match`` list has the same content.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from exportir.fx.graph import Graph
from exportir.fx.graph_module import GraphModule
from exportir.fx.node import Node
from exportir.fx.passes.utils.matcher_utils import InternalMatch, SubgraphMatcher
from exportir.fx.tracer import symbolic_trace

__all__ = ["Match", "ReplacedPatterns", "replace_pattern", "replace_pattern_with_filters"]

MatchFilter = Callable[[InternalMatch, Graph, Graph], bool]
ReplacementCallback = Callable[[InternalMatch, Graph, Graph], Graph]


class Match(NamedTuple):
    """Where a pattern matched."""

    #: the pattern node the match was found from
    anchor: Node
    #: pattern node -> node of the larger graph
    nodes_map: dict[Node, Node]


@dataclass
class ReplacedPatterns:
    """A match together with the nodes that replaced it."""

    anchor: Node
    nodes_map: dict[Node, Node]
    #: nodes added to the graph for this match
    replacements: list[Node]


def replace_pattern(
    gm: GraphModule,
    pattern: Callable[..., Any] | GraphModule,
    replacement: Callable[..., Any] | GraphModule,
) -> list[Match]:
    """Replace every non-overlapping occurrence of ``pattern`` in ``gm`` by
    ``replacement`` (callables are symbolically traced) and recompile ``gm``.

    ``pattern``'s parameters must all be used; ``replacement`` takes the same
    parameters. Returns one ``Match`` per replaced occurrence."""
    replaced = _replace_pattern(gm, pattern, replacement)
    return [Match(anchor=r.anchor, nodes_map=r.nodes_map) for r in replaced]


def replace_pattern_with_filters(
    gm: GraphModule,
    pattern: Callable[..., Any] | Graph | GraphModule,
    replacement: Callable[..., Any] | Graph | GraphModule | None = None,
    match_filters: list[MatchFilter] | None = None,
    ignore_literals: bool = False,
    replacement_callback: ReplacementCallback | None = None,
    node_name_match: str = "",
) -> list[ReplacedPatterns]:
    """``replace_pattern`` with extras: ``match_filters`` each get
    ``(match, original_graph, pattern_graph)`` and must all accept a match;
    ``ignore_literals`` makes literal arguments wildcards;
    ``replacement_callback`` builds the replacement graph per match;
    ``node_name_match`` also lets nodes whose name contains it match."""
    return _replace_pattern(
        gm, pattern, replacement, match_filters, ignore_literals,
        replacement_callback, node_name_match,
    )


# ------------------------------------------------------------------------------------------


def _as_graph(obj: Callable[..., Any] | Graph | GraphModule) -> Graph:
    if isinstance(obj, GraphModule):
        return obj.graph
    if isinstance(obj, Graph):
        return obj
    return symbolic_trace(obj).graph


def _placeholders(graph: Graph) -> list[Node]:
    return [n for n in graph.nodes if n.op == "placeholder"]


def _insert_point(graph: Graph, returning: list[Node]) -> Node:
    """Where a replacement goes: before the first user of the matched outputs,
    or, when they are unused, right after the last of them."""
    users = {user for node in returning for user in node.users}
    if users:
        return min(users, key=_sort_key)
    last = max(returning, key=_sort_key, default=None)
    if last is None or last.next.op == "root":
        raise AssertionError("The insert point can't be None")
    return last.next


def _sort_key(node: Node) -> Any:
    return node._sort_key


class _Rewriter:
    """Applies matches one after another, tracking nodes that earlier
    replacements substituted (a later match may consume them)."""

    def __init__(self, gm: GraphModule, pattern_graph: Graph) -> None:
        self.gm = gm
        self.graph = gm.graph
        self.pattern_graph = pattern_graph
        self.erase_order = [
            n for n in reversed(pattern_graph.nodes) if n.op not in ("placeholder", "output")
        ]
        self.substituted: dict[Node, Node] = {}

    def _rebind_inputs(self, match: InternalMatch, holes: list[Node]) -> dict[Node, Any]:
        """Replacement placeholder -> current graph value, updating ``match`` where an
        earlier replacement substituted the bound node."""
        if len(match.placeholder_nodes) != len(holes):
            raise AssertionError(
                f"Placeholder count mismatch: {len(match.placeholder_nodes)} vs {len(holes)}"
            )
        val_map: dict[Node, Any] = {}
        for hole, bound in zip(holes, list(match.placeholder_nodes)):
            if not isinstance(bound, Node):
                val_map[hole] = bound
                continue
            current = self.substituted.get(bound, bound)
            val_map[hole] = current
            if current is not bound:
                _swap_binding(match, bound, current)
        return val_map

    def apply(self, match: InternalMatch, replacement_graph: Graph) -> ReplacedPatterns:
        holes = _placeholders(replacement_graph)
        val_map = self._rebind_inputs(match, holes)
        bound_inputs = list(match.placeholder_nodes)
        with self.graph.inserting_before(_insert_point(self.graph, match.returning_nodes)):
            copied = self.graph.graph_copy(replacement_graph, val_map)
        if isinstance(copied, Node):
            copied = (copied,)
        added = [v for v in val_map.values() if not _among(v, bound_inputs)]
        if len(match.returning_nodes) != len(copied):
            raise AssertionError(
                f"Returning nodes count mismatch: {len(match.returning_nodes)} vs {len(copied)}"
            )
        for old, new in zip(match.returning_nodes, copied):
            old.replace_all_uses_with(new)
            self.substituted[old] = new
        for pn in self.erase_order:
            self.graph.erase_node(match.nodes_map[pn])
        return ReplacedPatterns(
            anchor=match.anchors[0], nodes_map=match.nodes_map, replacements=added
        )


def _among(value: Any, items: list[Any]) -> bool:
    """``value in items`` with identity for Nodes (no tensor ``==``)."""
    if isinstance(value, Node):
        return any(value is item for item in items)
    return any(not isinstance(item, Node) and _same_literal(value, item) for item in items)


def _same_literal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except (RuntimeError, TypeError, ValueError):  # e.g. multi-element tensors
        return a is b


def _swap_binding(match: InternalMatch, old: Node, new: Node) -> None:
    """Point ``match``'s first placeholder binding of ``old`` at ``new``."""
    position = next(i for i, v in enumerate(match.placeholder_nodes) if v is old)
    match.placeholder_nodes[position] = new
    key = next(pn for pn, gn in match.nodes_map.items() if gn is old)
    match.nodes_map[key] = new


def _replace_pattern(
    gm: GraphModule,
    pattern: Callable[..., Any] | Graph | GraphModule,
    replacement: Callable[..., Any] | Graph | GraphModule | None = None,
    match_filters: list[MatchFilter] | None = None,
    ignore_literals: bool = False,
    replacement_callback: ReplacementCallback | None = None,
    node_name_match: str = "",
) -> list[ReplacedPatterns]:
    original_graph = gm.graph
    pattern_graph = _as_graph(pattern)
    matcher = SubgraphMatcher(
        pattern_graph,
        match_output=False,
        match_placeholder=False,
        remove_overlapping_matches=True,
        ignore_literals=ignore_literals,
    )
    matches = matcher.match(original_graph, node_name_match=node_name_match)
    filters = match_filters or []
    matches = [m for m in matches if all(f(m, original_graph, pattern_graph) for f in filters)]

    if isinstance(replacement, (GraphModule, Graph)) or callable(replacement):
        common = _as_graph(replacement)  # type: ignore[arg-type]
    elif replacement_callback is None:
        raise AssertionError(
            "Must provide either a replacement GraphModule or a replacement callback"
        )
    else:
        common = None

    rewriter = _Rewriter(gm, pattern_graph)
    results = []
    for match in matches:
        if replacement_callback is not None:
            graph = replacement_callback(match, original_graph, pattern_graph)
        elif common is None:
            raise AssertionError(
                "Must provide either a replacement GraphModule or a replacement callback"
            )
        else:
            graph = common
        results.append(rewriter.apply(match, graph))

    gm.recompile()
    if isinstance(replacement, torch.nn.Module):
        _replace_attributes(gm, replacement)
    return results


def _try_get_attr(module: torch.nn.Module, target: str) -> Any | None:
    owner_path, _, name = target.rpartition(".")
    try:
        owner = module.get_submodule(owner_path)
    except AttributeError:
        return None
    return getattr(owner, name, None)


def _replace_attributes(gm: GraphModule, replacement: torch.nn.Module) -> None:
    """Copy into ``gm`` the submodules/attributes that replacement nodes reference
    and ``gm`` lacks (``gm``'s own attributes win)."""
    gm.delete_all_unused_submodules()
    if isinstance(replacement, GraphModule):
        replacement.graph.lint()
    for node in gm.graph.nodes:
        if node.op not in ("call_module", "get_attr"):
            continue
        if _try_get_attr(gm, node.target) is not None:
            continue
        source = _try_get_attr(replacement, node.target)
        if source is None:
            raise RuntimeError(
                f'Attempted to create a "{node.op}" node during subgraph rewriting with '
                f"target {node.target}, but the referenced attribute does not exist in the "
                "replacement GraphModule"
            )
        copied = copy.deepcopy(source)
        if isinstance(source, torch.nn.Module):
            gm.add_submodule(node.target, copied)
        else:
            setattr(gm, node.target, copied)
    gm.graph.lint()
