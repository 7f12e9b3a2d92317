"""Reshapes re-decided against the layouts of a re-trace.

Capture records what ``reshape`` did on the layouts it saw: a ``view`` when the input's strides
allow one, else ``clone`` + ``_unsafe_view``. torch.export's training IR keeps ``reshape``
whole, so its ``run_decompositions()`` decides again on the re-trace's layouts, which a
decomposition can change (torch's ``_scaled_dot_product_flash_attention_for_cpu`` lays its
output out as ``(L, N, H, E)``, the kernel like the query). The re-trace does the same:

- ``_unsafe_view(clone(x), shape)`` with the clone used only there is ``reshape(x, shape)``,
  re-run as such (a ``view`` when ``x`` now allows one);
- a ``view`` that the input's new strides no longer allow is re-run as ``reshape`` (a copy).
  Where it was the user's own ``.view`` torch's re-trace fails ("Cannot view a tensor", gpt2);
  the values are the same either way, as the graph is functional.

torch's training IR also keeps in-place ops, which its re-trace functionalizes: an ``add_`` on
a value a decomposition made a view (falcon's ``mlp_output += attention_output``, where the
``matmul`` before it becomes ``view(mm)``) writes back to the view's base and regenerates the
view. A functional node that replaced such an in-place op (``functionalize.INPLACE_OF``) is
re-run in place when its target is now a view, and the re-trace's functionalization does the
same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from exportir.export.capture.fake import _no_modes, meta_of, shape_env_of
from exportir.export.capture.functionalize import INPLACE_OF, is_view_op
from exportir.fx import GraphModule, Node

aten = torch.ops.aten


class Reshapes:
    """The reshapes of one graph being re-traced (see module docstring)."""

    __slots__ = ("_clones", "_sources")

    def __init__(self, gm: GraphModule) -> None:
        self._sources: dict[Node, Node] = {}  # _unsafe_view node -> reshape input node
        for node in gm.graph.find_nodes(op="call_function", target=aten._unsafe_view.default):
            clone = node.args[0]
            if _is_reshape_clone(clone):
                self._sources[node] = clone.args[0]
        self._clones = frozenset(view.args[0] for view in self._sources)

    def skips(self, node: Node) -> bool:
        """``node`` is a reshape's clone: its reshape re-runs in its place."""
        return node in self._clones

    def rerun(self, node: Node, lookup: Callable[[Any], Any]) -> Any | None:
        """The re-decided result of ``node`` (``lookup`` maps its arguments to their new
        values), or None when ``node`` is not a reshape to re-decide."""
        source = self._sources.get(node)
        if source is not None:
            return aten.reshape.default(lookup(source), lookup(node.args[1]))
        if node.target is not aten.view.default:
            return None
        x, shape = lookup(node.args[0]), lookup(node.args[1])
        return None if _view_fits(x, shape) else aten.reshape.default(x, shape)


def in_place_variant(
    node: Node, made_by: Node | None, is_graph_value: Callable[[Any], bool]
) -> Any | None:
    """The in-place op to re-run ``node`` as, or None: re-run it as it is. ``made_by`` made
    the new value ``node`` writes; ``is_graph_value(v)``: ``v`` is the new value of a node of
    the graph being re-traced.

    Only where the write goes to storage nothing else reads: every base up the view chain is
    a decomposition's own intermediate (``mm`` under ``view(mm)``), never a value of the graph
    (a ``reshape`` re-decided into a view of its input, which later nodes still read). torch's
    re-trace writes into such an input too, and then computes wrong values."""
    op = node.meta.get(INPLACE_OF)
    if op is None or made_by is None or not _is_view_node(made_by):
        return None
    step = made_by
    while _is_view_node(step):
        base = step.args[0]
        if not isinstance(base, Node) or is_graph_value(base.meta.get("val")):
            return None
        step = base
    return op


def _is_view_node(node: Any) -> bool:
    return (
        isinstance(node, Node)
        and node.op == "call_function"
        and (is_view_op(node.target) or node.target is aten._unsafe_view.default)
    )


def _is_reshape_clone(node: Any) -> bool:
    """``clone(x)`` to a contiguous layout, used by one node (as ``reshape`` makes it)."""
    return (
        isinstance(node, Node)
        and node.target is aten.clone.default
        and len(node.users) == 1
        and isinstance(node.args[0], Node)
        and node.kwargs.get("memory_format", torch.contiguous_format) == torch.contiguous_format
    )


def _view_fits(x: Any, shape: Any) -> bool:
    """``x.view(shape)`` is possible on ``x``'s strides (decided on its meta twin, recording
    nothing; a symbolic check's guards go to the program's ShapeEnv as the view's would)."""
    if not isinstance(x, torch.Tensor):
        return True
    env = shape_env_of(x)
    if env is not None:
        env.listener_paused += 1
    try:
        with _no_modes():
            meta_of(x).view(shape)
        return True
    except (RuntimeError, ValueError):
        return False
    finally:
        if env is not None:
            env.listener_paused -= 1
