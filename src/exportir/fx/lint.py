"""Structural checks of a ``Graph``, with errors that show the graph around the bad node.

torch.fx's lint prints the entire graph on failure, which is unreadable for big graphs; we
print a window of a few lines around the offending node and mark it with ``-->``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from exportir.fx.node import Node

if TYPE_CHECKING:
    from exportir.fx.graph import Graph

__all__ = ["graph_window", "lint_graph"]

# The opcodes a graph may hold (a Node may also be the graph's sentinel "root").
_legal_ops = dict.fromkeys(
    ["call_function", "call_method", "get_attr", "call_module", "placeholder", "output"]
)

_WINDOW = 3


def graph_window(graph: Graph, focus: Node, radius: int = _WINDOW) -> str:
    """A few lines of ``graph`` around ``focus``, with ``focus`` marked by ``-->``."""
    nodes = list(graph.nodes)
    try:
        at = nodes.index(focus)
    except ValueError:
        return f"    (node {focus.name} is not in this graph's node list)"
    lo, hi = max(0, at - radius), min(len(nodes), at + radius + 1)
    lines = ["    ..."] if lo > 0 else []
    for i in range(lo, hi):
        text = nodes[i].format_node() or f"%{nodes[i].name}"
        marker = "--> " if i == at else "    "
        lines.append(marker + text)
    if hi < len(nodes):
        lines.append("    ...")
    return "\n".join(lines)


def _fail(graph: Graph, node: Node, message: str, error: type[Exception] = RuntimeError) -> None:
    raise error(f"{message}\n{graph_window(graph, node)}")


def _check_structure(graph: Graph) -> None:
    seen_names: set[str] = set()
    defined: set[Node] = set()
    outputs = 0
    for node in graph.nodes:
        if node.op not in _legal_ops:
            _fail(graph, node, f"Node {node} had unknown opcode {node.op}!")
        if node.graph is not graph:
            _fail(graph, node, f"Node '{node}' does not belong to this Graph!")
        if node not in graph._find_nodes_lookup_table:
            _fail(graph, node, f"Node '{node}' is not added to the side table")
        for arg in node._input_nodes:
            _check_input(graph, node, arg, defined)
        if outputs:
            _fail(graph, node, f"Node '{node}' comes after the graph's output node; the output "
                  "must be the last node (move it, or erase the extra nodes)")
        if node.op == "output":
            outputs += 1
        defined.add(node)
        if node.name in seen_names:
            _fail(graph, node, f"Node redefined name {node.name}!")
        seen_names.add(node.name)


def _check_input(graph: Graph, node: Node, arg: Node, defined: set[Node]) -> None:
    if arg.graph is not graph:
        _fail(graph, node,
              f"Argument '{arg}' of Node '{node}' does not belong to this Graph, but was used as "
              "an argument! If you are copying nodes from another graph, make sure to use "
              "``arg_transform`` on node_copy() to remap values")
    if arg._erased:
        _fail(graph, node, f"Argument '{arg}' of Node '{node}' was erased from the graph but is "
              "still used; replace its uses before erasing it")
    if arg not in defined:
        _fail(graph, node,
              f"Argument '{arg}' of Node '{node}' was used before it has been defined! Please "
              "check that Nodes in the graph are topologically ordered")


def _check_targets(graph: Graph, root: torch.nn.Module) -> None:
    for node in graph.nodes:
        if node.op == "call_function":
            if not callable(node.target):
                _fail(graph, node, f"Node {node} target {node.target} has type "
                      f"{torch.typename(node.target)} but a Callable is expected", ValueError)
            continue
        if not isinstance(node.target, str):
            _fail(graph, node, f"Node {node} target {node.target} has type "
                  f"{torch.typename(node.target)} but a str is expected", ValueError)
        if node.op in ("get_attr", "call_module"):
            _check_qualified_target(graph, node, root)


def _check_qualified_target(graph: Graph, node: Node, root: torch.nn.Module) -> None:
    atoms = node.target.split(".")  # type: ignore[union-attr]  # checked to be str above
    obj: object = root
    for i, atom in enumerate(atoms):
        nxt = getattr(obj, atom, None)
        prefix = ".".join(atoms[:i])
        if nxt is None:
            _fail(graph, node, f"Node {node} target {node.target} references nonexistent "
                  f"attribute {atom} of {prefix}")
        if node.op == "call_module" and not isinstance(nxt, torch.nn.Module):
            _fail(graph, node, f"Node {node} target {node.target} {atom} of {prefix} does not "
                  "reference an nn.Module")
        obj = nxt


def lint_graph(graph: Graph) -> None:
    """Raise if ``graph`` is malformed (see ``Graph.lint``)."""
    _check_structure(graph)
    if graph.owning_module:
        _check_targets(graph, graph.owning_module)
