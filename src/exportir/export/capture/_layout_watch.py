"""Recorded metadata survives in-place layout changes during capture.

A node's ``meta["val"]`` is the fake tensor its op produced: the very object the user's code
holds. When a later op changes that tensor's layout in place (``y.unsqueeze_(0)``, ATen's own
``as_strided_`` inside ``adaptive_avg_pool2d`` on a channels-last input, an ``out=`` tensor
resized by its op), the nodes recorded before keep the layout they saw: their ``val`` becomes a
snapshot of the old layout, like the per-node snapshot torch's tracer keeps.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

from exportir.export.capture.fake import FakeTensor, _no_modes, layout_of
from exportir.fx import Graph


@cache
def _written(func: Any) -> tuple[tuple[int, str, bool], ...]:
    """(position, name, keyword-only) of each argument ``func`` writes to."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return ()
    return tuple(
        (i, a.name, a.kwarg_only)
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )


def _written_tensors(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    found = []
    for i, name, kwarg_only in _written(func):
        value = kwargs.get(name) if kwarg_only or i >= len(args) else args[i]
        if isinstance(value, FakeTensor):
            found.append(value)
    return found


class LayoutWatch:
    """Layouts of the tensors one op writes, taken before it runs (see module docstring)."""

    __slots__ = ("_before",)

    def __init__(self, func: Any, args: tuple, kwargs: dict) -> None:
        self._before = [
            (t, layout_of(t), t.size(), t.stride(), t.storage_offset())
            for t in _written_tensors(func, args, kwargs)
        ]

    def settle(self, graph: Graph) -> None:
        """After the op: nodes whose ``val`` is a tensor whose layout changed get a snapshot."""
        for t, key, size, stride, offset in self._before:
            if layout_of(t) != key:
                _replace_val(graph, t, _snapshot(t, size, stride, offset))


def _snapshot(t: FakeTensor, size: Any, stride: Any, offset: Any) -> FakeTensor:
    with _no_modes():
        meta = t._meta.as_strided(size, stride, offset)
    return FakeTensor(meta, t.fake_device, requires_grad=t.requires_grad)


def _replace_val(graph: Graph, t: torch.Tensor, snapshot: FakeTensor) -> None:
    for node in graph.nodes:
        val = node.meta.get("val")
        if val is t:
            node.meta["val"] = snapshot
        elif isinstance(val, (tuple, list)) and any(v is t for v in val):
            node.meta["val"] = type(val)(snapshot if v is t else v for v in val)
