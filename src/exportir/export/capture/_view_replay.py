"""Re-tracing views of a mutated input the way torch's functionalization does.

torch.export's ``run_decompositions()`` re-traces the (non-functional) training IR under
functionalization. A view taken of a graph input after the input was mutated is out of date
each time it is read: every op consuming it first regenerates its whole view chain from the
input's new value, and consumes the regenerated view. The earlier copies become dead and are
removed, but they used up node names (``permute_4`` .. ``permute_6`` die, ``permute_7`` feeds
``bmm``), so torch's surviving nodes are numbered past them.

exportir's captured graph is already functional; the new values of mutated inputs are the
graph's mutation outputs. :class:`ViewReplay` re-runs the view chains rooted at those values
before each consumer, so the re-traced graph numbers its nodes as torch does (dead copies are
removed with the rest of the dead code).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from exportir.export.capture.functionalize import is_view_op
from exportir.fx import Node

# views by schema, plus ``_unsafe_view``, which functionalization treats as a view
_EXTRA_VIEWS = frozenset({torch.ops.aten._unsafe_view.default})


class ViewReplay:
    """Tracks view chains rooted at mutation outputs of the graph being re-traced."""

    __slots__ = ("_chains", "_roots")

    def __init__(self, roots: set[Node]) -> None:
        self._roots = roots
        self._chains: dict[Node, tuple[Node, ...]] = {}

    def before(self, node: Node, rerun: Callable[[Node], Any]) -> None:
        """Regenerate the chains of the views ``node`` reads (``rerun`` records each view)."""
        if not self._chains:
            return
        seen: set[Node] = set()
        for arg in node.all_input_nodes:
            chain = self._chains.get(arg)
            if chain is None or arg in seen:
                continue
            seen.add(arg)
            for view in chain:
                rerun(view)

    def after(self, node: Node) -> None:
        """Start or extend a chain when ``node`` is a view of a root or of a chained view."""
        if not self._roots or not (is_view_op(node.target) or node.target in _EXTRA_VIEWS):
            return
        base = node.args[0] if node.args else None
        if not isinstance(base, Node):
            return
        if base in self._chains:
            self._chains[node] = (*self._chains[base], node)
        elif base in self._roots:
            self._chains[node] = (node,)


def mutation_roots(gm: Any, names: frozenset[str]) -> set[Node]:
    """The nodes of ``gm`` named in ``names`` (the mutation outputs' argument names)."""
    if not names:
        return set()
    return {n for n in gm.graph.nodes if n.name in names}
