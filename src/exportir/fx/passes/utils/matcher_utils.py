"""Subgraph pattern matching by use-def structure (torch.fx ``SubgraphMatcher``).

A pattern graph is matched backwards from its *anchors* (the nodes whose only
user is the pattern's output) towards its placeholders, which act as wildcards.
Matches are reported in the order torch.fx reports them: candidates of the
first anchor in graph order, then (for multi-output patterns) every consistent
combination of the remaining anchors' candidates.

Compared with a naive implementation the driver
  * finds anchor candidates through the graph's ``(op, target)`` index,
  * keeps a reverse set of matched graph nodes (no ``in dict.values()`` scans),
  * bounds the fused-cycle check to the nodes that lie before the match's end.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from exportir.fx.graph import Graph
from exportir.fx.node import Node

__all__ = ["InternalMatch", "SubgraphMatcher"]

#: ``PYTORCH_MATCHER_LOGLEVEL=INFO`` shows every matching step.
logger = logging.getLogger(__name__)
logger.setLevel(os.environ.get("PYTORCH_MATCHER_LOGLEVEL", "WARNING").upper())

_WILDCARD_OPS = frozenset({"placeholder", "output"})


@dataclass
class InternalMatch:
    """One match of a pattern inside a larger graph."""

    #: pattern nodes the match started from
    anchors: list[Node]
    #: pattern node -> graph node (or literal, for a placeholder matched to a literal)
    nodes_map: dict[Node, Node] = field(default_factory=dict)
    #: graph values bound to the pattern's placeholders, in placeholder order
    placeholder_nodes: list[Node] = field(default_factory=list)
    #: graph nodes bound to the values the pattern returns
    returning_nodes: list[Node] = field(default_factory=list)
    #: name -> graph node (filled only by name-aware matchers)
    name_node_map: dict[str, Node] = field(default_factory=dict)

    def __copy__(self) -> InternalMatch:
        return InternalMatch(
            anchors=self.anchors,
            nodes_map=self.nodes_map.copy(),
            placeholder_nodes=self.placeholder_nodes.copy(),
            returning_nodes=self.returning_nodes.copy(),
        )


def _lookup_attr(module: torch.nn.Module, dotted: str) -> Any:
    value: Any = module
    for atom in dotted.split("."):
        value = getattr(value, atom)
    return value


def _all_arguments(node: Node) -> list[Any]:
    """Positional view of an OpOverload call with defaults filled from its schema."""
    args, kwargs = node.args, node.kwargs
    result = []
    for index, argument in enumerate(node.target._schema.arguments):
        if argument.name in kwargs:
            result.append(kwargs[argument.name])
        elif not argument.kwarg_only and index < len(args):
            result.append(args[index])
        else:
            result.append(argument.default_value)
    return result


def _comparable_arguments(pn: Node, gn: Node) -> tuple[list[Any], list[Any]] | None:
    """The argument lists to compare pairwise, or None when the shapes differ."""
    same_shape = len(pn.args) == len(gn.args) and list(pn.kwargs) == list(gn.kwargs)
    if not same_shape and pn.op == "call_function" and isinstance(
        pn.target, torch._ops.OpOverload
    ):
        return _all_arguments(pn), _all_arguments(gn)
    if same_shape:
        return [*pn.args, *pn.kwargs.values()], [*gn.args, *gn.kwargs.values()]
    return None


class _State:
    """Mutable matching state: the pattern->graph map and its matched graph nodes."""

    __slots__ = ("nodes_map", "taken")

    def __init__(self, nodes_map: dict[Node, Any], taken: set[Node]) -> None:
        self.nodes_map = nodes_map
        self.taken = taken

    def copy(self) -> _State:
        return _State(self.nodes_map.copy(), self.taken.copy())

    def bind(self, pn: Node, value: Any) -> None:
        self.nodes_map[pn] = value
        if isinstance(value, Node):
            self.taken.add(value)


class SubgraphMatcher:
    """Finds the places where ``pattern`` occurs in a graph.

    Args:
        pattern: the pattern graph (must be free of dead code).
        match_output: treat the pattern's output node as part of the pattern.
        match_placeholder: require placeholders to match placeholders instead of
            acting as wildcards.
        remove_overlapping_matches: keep only the first of overlapping matches.
        ignore_literals: treat literal arguments as wildcards.
    """

    def __init__(
        self,
        pattern: Graph,
        match_output: bool = False,
        match_placeholder: bool = False,
        remove_overlapping_matches: bool = True,
        ignore_literals: bool = False,
    ) -> None:
        self.pattern = pattern
        self.match_output = match_output
        self.match_placeholder = match_placeholder
        self.remove_overlapping_matches = remove_overlapping_matches
        self.ignore_literals = ignore_literals

        if len(pattern.nodes) == 0:
            raise ValueError("SubgraphMatcher cannot be initialized with an empty pattern")
        for node in pattern.nodes:
            if node.op != "output" and not node.is_impure() and not node.users:
                raise AssertionError(
                    "SubgraphMatcher cannot be initialized with an pattern with dead code"
                )

        self.pattern_placeholder_nodes = [n for n in pattern.nodes if n.op == "placeholder"]
        output_node = next(iter(reversed(pattern.nodes)))
        self.pattern_returning_nodes: list[Node] = output_node.all_input_nodes
        self._returning = set(self.pattern_returning_nodes)
        if match_output:
            self.pattern_anchors: list[Node] = [output_node]
        else:
            self.pattern_anchors = [n for n in self.pattern_returning_nodes if len(n.users) == 1]

    # -- node comparison ---------------------------------------------------------------

    def _match_attributes(self, pn: Node, gn: Node) -> bool:
        """get_attr nodes match when both fetch tensors (values are not compared)."""
        for node in (pn, gn):
            if not isinstance(node.target, str):
                raise AssertionError(f"{'pn' if node is pn else 'gn'}.target {node.target} "  # noqa: TRY004 (torch.fx parity)
                                     "must be a string.")
        for node in (pn, gn):
            if node.graph.owning_module is None:
                raise AssertionError(
                    f"{'pn' if node is pn else 'gn'}.graph.owning_module must not be None"
                )
        pn_value = _lookup_attr(pn.graph.owning_module, pn.target)
        gn_value = _lookup_attr(gn.graph.owning_module, gn.target)
        if type(pn_value) is not type(gn_value):
            return False
        if isinstance(pn_value, torch.Tensor):
            return isinstance(gn_value, torch.Tensor)
        raise RuntimeError(f"Unsupported type {pn_value} when matching attributes")

    def _nodes_are_equal(self, pn: Node, gn: Node, node_name_match: str = "") -> bool:
        if not self.match_placeholder and pn.op == "placeholder":
            return True
        if node_name_match and node_name_match in gn.name:
            return True
        if pn.op != gn.op:
            return False
        if pn.op in _WILDCARD_OPS:
            return True
        if pn.op == "get_attr":
            return self._match_attributes(pn, gn)
        return pn.target == gn.target

    def _match_literals(self, pn: Any, gn: Any, state: _State) -> bool:
        """A non-Node argument position: literals must be equal (same type); a
        pattern placeholder binds to the literal."""
        pn_is_node, gn_is_node = isinstance(pn, Node), isinstance(gn, Node)
        if pn_is_node and gn_is_node:
            raise AssertionError("pn and gn cannot both be Node")
        if pn_is_node:
            if pn.op != "placeholder":
                return False
            if pn in state.nodes_map:
                return state.nodes_map[pn] == gn
            state.nodes_map[pn] = gn
            return True
        if gn_is_node:
            return False
        return type(gn) is type(pn) and gn == pn

    def _match_args(self, p_args: Any, g_args: Any, state: _State) -> bool:
        if len(p_args) != len(g_args):
            return False
        for pa, ga in zip(p_args, g_args):
            if isinstance(pa, Node) and isinstance(ga, Node):
                matched = self._match_nodes(pa, ga, state)
            elif isinstance(pa, (list, tuple)) and isinstance(ga, (list, tuple)):
                matched = self._match_args(pa, ga, state)
            else:
                matched = self._match_literals(pa, ga, state) or self.ignore_literals
            if not matched:
                return False
        return True

    def _match_nodes(self, pn: Node, gn: Node, state: _State, node_name_match: str = "") -> bool:
        """Match ``pn`` to ``gn`` and, recursively, their inputs. On failure
        ``state`` may hold partial bindings; callers restore a saved copy."""
        logger.info("  matching %s to %s", pn, gn)
        if not (isinstance(pn, Node) and isinstance(gn, Node)):
            raise AssertionError(f"pn and gn must be Node, pn: {pn}, gn: {gn}")  # noqa: TRY004 (torch.fx parity)
        bound = state.nodes_map.get(pn, state)
        if bound is not state:
            return bound == gn
        if gn in state.taken or not self._nodes_are_equal(pn, gn, node_name_match):
            return False
        state.bind(pn, gn)
        if pn.op == "placeholder":
            return True
        pairs = _comparable_arguments(pn, gn)
        return pairs is not None and self._match_args(pairs[0], pairs[1], state)

    # -- driver --------------------------------------------------------------------------

    def _candidates(self, anchor: Node, graph: Graph, node_name_match: str) -> list[Node]:
        """Graph nodes that could match ``anchor``, in graph order."""
        indexed = not node_name_match and (self.match_placeholder or anchor.op != "placeholder")
        if indexed and anchor.op in ("call_function", "call_method", "call_module"):
            try:
                pool = graph.find_nodes(op=anchor.op, target=anchor.target)
            except TypeError:  # unhashable target: fall back to a scan
                pool = list(graph.nodes)
        elif indexed and anchor.op in ("get_attr", "output", "placeholder"):
            pool = graph.find_nodes(op=anchor.op)
        else:
            pool = list(graph.nodes)
        return [n for n in pool if self._nodes_are_equal(anchor, n, node_name_match)]

    def _enumerate(self, graph: Graph, node_name_match: str) -> list[InternalMatch]:
        """Every consistent binding of all anchors (before any filtering)."""
        candidates = []
        for anchor in self.pattern_anchors:
            found = self._candidates(anchor, graph, node_name_match)
            if found:
                candidates.append((anchor, found))
        logger.info("Initial match_candidates_list: %s\n", candidates)
        matches: list[InternalMatch] = []
        if candidates:
            self._backtrack(candidates, 0, _State({}, set()), matches, node_name_match)
        return matches

    def _backtrack(
        self,
        candidates: list[tuple[Node, list[Node]]],
        index: int,
        state: _State,
        out: list[InternalMatch],
        node_name_match: str,
    ) -> None:
        if index == len(candidates):
            out.append(self._finish(state))
            return
        anchor, nodes = candidates[index]
        for node in nodes:
            trial = state.copy()
            logger.info("Trying to match anchor %s to %s", anchor, node)
            if self._match_nodes(anchor, node, trial, node_name_match):
                self._backtrack(candidates, index + 1, trial, out, node_name_match)
            else:
                logger.info("Failed to match anchor %s to %s\n", anchor, node)

    def _finish(self, state: _State) -> InternalMatch:
        nodes_map = state.nodes_map
        match = InternalMatch(
            anchors=self.pattern_anchors,
            nodes_map=nodes_map,
            placeholder_nodes=[nodes_map[pn] for pn in self.pattern_placeholder_nodes],
            returning_nodes=[nodes_map[pn] for pn in self.pattern_returning_nodes],
        )
        logger.info("Found a match: %s\n", match)
        return match

    def _is_contained(self, nodes_map: dict[Node, Node]) -> bool:
        """No matched node except the returned ones has a user outside the match."""
        inside = {gn: pn for pn, gn in nodes_map.items() if pn.op != "placeholder"}
        for gn, pn in inside.items():
            if pn in self._returning:
                continue
            if any(user not in inside for user in gn.users):
                return False
        return True

    def _remove_overlapping_matches(self, matches: list[InternalMatch]) -> list[InternalMatch]:
        kept: list[InternalMatch] = []
        claimed: set[Node] = set()
        for match in matches:
            compute = [gn for pn, gn in match.nodes_map.items() if pn.op not in _WILDCARD_OPS]
            if any(gn in claimed for gn in compute):
                continue
            kept.append(match)
            claimed.update(compute)
        return kept

    def match(self, graph: Graph, node_name_match: str = "") -> list[InternalMatch]:
        """All matches of the pattern in ``graph``.

        A returned match is self-contained (only placeholders and returned nodes
        are used outside it), would not create a cycle if fused, and, with
        ``remove_overlapping_matches``, shares no compute node with an earlier
        match."""
        matches = self._enumerate(graph, node_name_match)
        matches = [m for m in matches if self._is_contained(m.nodes_map)]
        matches = [m for m in matches if _fusable(m)]
        if self.remove_overlapping_matches:
            matches = self._remove_overlapping_matches(matches)
        logger.info("Matches returned: %s", matches)
        return matches


def _fusable(match: InternalMatch) -> bool:
    """True unless fusing the match's compute nodes would create a cycle, i.e.
    a path leaves the match and re-enters it.

    Users always follow their inputs, so the search never needs to visit a node
    placed after the match's last node."""
    partition = {gn for pn, gn in match.nodes_map.items() if pn.op not in _WILDCARD_OPS}
    if not partition:
        return True
    last = max(partition, key=_order)
    last_key = _order(last)
    frontier = [u for n in partition for u in n.users if u not in partition]
    seen: set[Node] = set()
    while frontier:
        node = frontier.pop()
        if node in seen or _order(node) > last_key:
            continue
        seen.add(node)
        for user in node.users:
            if user in partition:
                return False
            frontier.append(user)
    return True


def _order(node: Node) -> Any:
    return node._sort_key

