"""The view model: what a page shows, as plain JSON-able data.

A page holds a list of graphs (``GraphView.to_json()``). Each node carries an id, a label, the
ids of the nodes it reads, its module path (from ``nn_module_stack``), an ordered list of
details shown on click, and optionally the id of another graph it opens (a delegate's
subgraph, a control-flow branch). Program graphs may carry a memory plan: buffers with their
arena, offset, size and the instruction range they are live in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Buffer", "GraphView", "MemoryView", "NodeView", "PageModel"]


@dataclass(slots=True)
class NodeView:
    """One box of the picture. ``kind`` picks its colour: input, param, op, delegate, output."""

    id: int
    name: str
    label: str
    kind: str
    inputs: list[int] = field(default_factory=list)
    module: list[tuple[str, str]] = field(default_factory=list)  # (path, type), outermost first
    details: list[tuple[str, str]] = field(default_factory=list)
    opens: list[tuple[str, str]] = field(default_factory=list)  # (caption, graph id)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name, "label": self.label, "kind": self.kind,
            "inputs": self.inputs, "module": [list(m) for m in self.module],
            "details": [list(d) for d in self.details], "opens": [list(o) for o in self.opens],
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Buffer:
    """A planned tensor: where it lives and the instructions it is live across (inclusive)."""

    name: str
    arena: int
    offset: int
    nbytes: int
    first: int
    last: int
    type: str


@dataclass(slots=True)
class MemoryView:
    """Arena sizes, one label per instruction, the planned buffers, and for each instruction the
    id of its node in the graph (so the page can go from a buffer to the code using it)."""

    arenas: list[int]
    instructions: list[str]
    buffers: list[Buffer]
    nodes: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "arenas": self.arenas, "instructions": self.instructions, "nodes": self.nodes,
            "buffers": [[b.name, b.arena, b.offset, b.nbytes, b.first, b.last, b.type]
                        for b in self.buffers],
        }  # fmt: skip


@dataclass(slots=True)
class GraphView:
    id: str
    title: str
    nodes: list[NodeView] = field(default_factory=list)
    parent: str | None = None
    notes: list[tuple[str, str]] = field(default_factory=list)
    memory: MemoryView | None = None

    def add(self, name: str, label: str, kind: str, **rest: Any) -> NodeView:
        node = NodeView(len(self.nodes), name, label, kind, **rest)
        self.nodes.append(node)
        return node

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "title": self.title, "parent": self.parent,
            "notes": [list(n) for n in self.notes],
            "nodes": [n.to_json() for n in self.nodes],
            "memory": self.memory.to_json() if self.memory is not None else None,
        }  # fmt: skip


@dataclass(slots=True)
class PageModel:
    """Every graph of one page; the first ones without a parent are its tabs."""

    title: str
    graphs: list[GraphView] = field(default_factory=list)

    def new_graph(self, title: str, parent: str | None = None) -> GraphView:
        graph = GraphView(f"g{len(self.graphs)}", title, parent=parent)
        self.graphs.append(graph)
        return graph

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "graphs": [g.to_json() for g in self.graphs]}
