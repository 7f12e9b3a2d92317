"""The debug node table of an emitted method (format 2.2 / 3.1, ``schema.DebugNode``).

For every graph node an instruction comes from, and every call node of a delegated subgraph,
the table keeps what a profile or a numerical comparison prints next to a measurement: the op,
the user's ``file:line``, and the innermost ``nn.Module`` path and class the node ran in
(``nn_module_stack``). Decomposed and edge nodes carry their source node's stack, so the table
maps an instruction back to the module call it implements.
"""

from __future__ import annotations

from typing import Any

from exportir.format import schema
from exportir.format.validate import MAX_DEBUG_STRING
from exportir.fx import Node
from exportir.program.kernels import source_line


def target_name(target: Any) -> str:
    """A node target as a short op name: ``aten.addmm.default``, ``getitem``."""
    op = getattr(target, "_op", target)  # EdgeOpOverload wraps the ATen op
    if hasattr(op, "_schema") and hasattr(op, "_overloadname"):
        return f"{op.namespace}.{op._schema.name.split('::', 1)[-1]}.{op._overloadname}"
    name = getattr(target, "__name__", None)
    return name if isinstance(name, str) else str(target)


def _module_of(node: Node) -> tuple[str, str]:
    stack = node.meta.get("nn_module_stack") or {}
    if not isinstance(stack, dict) or not stack:
        return "", ""
    entry = list(stack.values())[-1]
    if not isinstance(entry, (tuple, list)) or len(entry) != 2:
        return "", ""
    path, kind = entry
    if isinstance(kind, type):
        kind = f"{kind.__module__}.{kind.__qualname__}"
    return str(path), str(kind)


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_DEBUG_STRING else text[: MAX_DEBUG_STRING - 3] + "..."


def debug_node(node: Node, scope: int) -> schema.DebugNode:
    # a delegate call runs what many modules' nodes became: it belongs to none of them
    delegate = target_name(node.target) == "executorch_call_delegate"
    module, module_type = ("", "") if delegate else _module_of(node)
    return schema.DebugNode(
        scope, _bounded(node.name), _bounded(target_name(node.target)),
        _bounded(source_line(node)), _bounded(module), _bounded(module_type),
    )


class DebugNodes:
    """The table being built: the first node of each (scope, name) is kept."""

    __slots__ = ("_entries", "_seen")

    def __init__(self) -> None:
        self._entries: list[schema.DebugNode] = []
        self._seen: set[tuple[int, str]] = set()

    def add(self, node: Node, scope: int = schema.DEBUG_METHOD_SCOPE) -> None:
        key = (scope, node.name)
        if key not in self._seen and node.op == "call_function":
            self._seen.add(key)
            self._entries.append(debug_node(node, scope))

    def add_delegate(self, lowered: Any, index: int) -> None:
        """Every call node of a delegated subgraph (``lowered.original_module``), once."""
        if any(scope == index for scope, _ in self._seen):
            return
        program = getattr(lowered, "original_module", None)
        graph = getattr(program, "graph", None)
        for node in getattr(graph, "nodes", ()):
            self.add(node, index)

    def table(self) -> tuple[schema.DebugNode, ...]:
        return tuple(self._entries)
