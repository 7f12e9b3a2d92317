"""Layout rewrites: fewer view-like ops (inside the delegate they are views, so what costs is
the Python call per op, not data movement).

- a ``view`` / ``expand`` to the same shape and an identity ``permute`` are dropped;
- chains of ``view`` / ``squeeze`` / ``unsqueeze`` collapse into one ``view``, chains of
  ``permute`` into one ``permute``;
- a chain of ``permute`` s mixed with ops that only insert or remove size-1 dims (``squeeze``,
  ``unsqueeze``, such ``view`` s) becomes at most one ``permute`` and one ``view``;
- ``squeeze(slice(x, d, i, i + 1), [d])`` becomes ``select(x, d, i)``, and ``select`` s taking
  every index of one dim of ``x`` become one ``unbind(x, d)``.

All shapes involved must be static.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from exportir.backends.fused_cpu.ir import Graph, Op, Value, static_shape

__all__ = ["LAYOUT_RULES"]

_VIEW = "aten.view_copy.default"
_PERMUTE = "aten.permute_copy.default"
_UNSQUEEZE = "aten.unsqueeze_copy.default"
_SQUEEZES = ("aten.squeeze_copy.dims", "aten.squeeze_copy.dim")
_SELECT = "aten.select_copy.int"
_RESHAPES = (_VIEW, _UNSQUEEZE, *_SQUEEZES)
_CHAIN = (_PERMUTE, *_RESHAPES)
_MAX_CHAIN = 8


def view(g: Graph, op: Op) -> bool:
    x = op.args[0]
    if static_shape(x) is not None and static_shape(x) == static_shape(op.out):
        return g.alias(op, x)
    inner = g.producer(x)
    if inner is None or inner.name not in _RESHAPES or static_shape(inner.args[0]) is None:
        return False
    op.args = [inner.args[0], *op.args[1:]]
    op.nodes = (*inner.nodes, *op.nodes)
    g.changed()
    return True


def permute(g: Graph, op: Op) -> bool:
    x, dims = op.args
    if list(dims) == list(range(len(dims))):
        return g.alias(op, x)
    inner = g.producer(x, _PERMUTE)
    if inner is None:
        return False
    first = list(inner.args[1])
    op.args = [inner.args[0], [first[d] for d in dims]]
    op.nodes = (*inner.nodes, *op.nodes)
    g.changed()
    return True


def expand(g: Graph, op: Op) -> bool:
    x = op.args[0]
    if static_shape(x) is not None and static_shape(x) == static_shape(op.out):
        return g.alias(op, x)
    return False


# ------------------------------------------------------------------------------ permute chains


def _dims(op: Op, rank: int) -> list[int]:
    raw = op.args[1] if len(op.args) > 1 else 0
    dims = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    return [d + rank if d < 0 else d for d in dims]


def _track(op: Op, labels: list[Any], shape: tuple[int, ...]) -> list[Any] | None:
    """``labels`` (source dim per dim, None for a size-1 dim) after ``op``; None when ``op``
    moves data between dims (a ``view`` merging or splitting dims)."""
    out = static_shape(op.out)
    if out is None:
        return None
    if op.name == _PERMUTE:
        return [labels[d] for d in _dims(op, len(labels))]
    if op.name == _UNSQUEEZE:
        (d,) = _dims(op, len(labels) + 1)
        return [*labels[:d], None, *labels[d:]]
    if op.name in _SQUEEZES:
        gone = {d for d in _dims(op, len(labels)) if shape[d] == 1}
        return [label for i, label in enumerate(labels) if i not in gone]
    if [s for s in shape if s != 1] != [s for s in out if s != 1]:
        return None  # a view that is more than inserting / removing size-1 dims
    data = iter(label for label in labels if label is not None)
    return [next(data) if s != 1 else None for s in out]


def _replacement(x: Value, chain: list[Op]) -> tuple[list[int], tuple[int, ...]] | None:
    """``(perm, shape)``: ``chain`` applied to ``x`` is ``view(permute(x, perm), shape)``."""
    x_shape = static_shape(x)
    if x_shape is None:
        return None
    labels: list[Any] | None = [i if s != 1 else None for i, s in enumerate(x_shape)]
    shape = x_shape
    for op in chain:
        labels = _track(op, labels, shape)
        if labels is None:
            return None
        shape = static_shape(op.out)
    order = [label for label in labels if label is not None]
    perm = order + [i for i, s in enumerate(x_shape) if s == 1]
    return perm, shape


def permute_chain(g: Graph, op: Op) -> bool:
    chain = [op]
    while len(chain) < _MAX_CHAIN:
        inner = g.producer(chain[-1].args[0])
        if inner is None or inner.name not in _CHAIN:
            break
        chain.append(inner)
    chain.reverse()
    for start in range(len(chain) - 1):
        part = chain[start:]
        if not any(c.name == _PERMUTE for c in part):
            return False
        found = _replacement(part[0].args[0], part)
        if found is not None:
            return _rewrite_chain(g, op, part, *found)
    return False


def _rewrite_chain(g: Graph, op: Op, part: list[Op], perm: list[int], shape: tuple) -> bool:
    x = part[0].args[0]
    moved = list(perm) != list(range(len(perm)))
    permuted = tuple(static_shape(x)[d] for d in perm)
    reshaped = permuted != shape
    if moved + reshaped >= len(part):
        return False
    nodes = tuple(n for c in part for n in c.nodes)
    if not moved and not reshaped:
        return g.alias(op, x)
    source = x
    if moved and reshaped:
        meta = torch.empty(permuted, dtype=x.dtype, device="meta")
        source = Value(meta, name=f"{op.out.name}_permuted")
        g.insert_before(op, Op(_PERMUTE, [x, perm], {}, [source], False, nodes))
    op.kwargs, op.nodes = {}, nodes
    if reshaped:
        op.name, op.args = _VIEW, [source, list(shape)]
    else:
        op.name, op.args = _PERMUTE, [x, perm]
    g.changed()
    return True


# ------------------------------------------------------------------------------ select, unbind


def _index(size: int, start: Any, end: Any, step: Any) -> int | None:
    picked = range(*slice(start, end, step).indices(size))
    return picked[0] if len(picked) == 1 else None


def select(g: Graph, op: Op) -> bool:
    """``squeeze(slice(x, d, i, i + 1), [d])`` is ``select(x, d, i)``."""
    sliced = g.producer(op.args[0], "aten.slice_copy.Tensor")
    if sliced is None or sliced.kwargs:
        return False
    x = sliced.args[0]
    x_shape = static_shape(x)
    if x_shape is None:
        return False
    dim, start, end, step = (*sliced.args[1:], *(0, None, None, 1)[len(sliced.args) - 1 :])
    dim = dim + len(x_shape) if dim < 0 else dim
    if _dims(op, len(x_shape)) != [dim]:
        return False
    index = _index(x_shape[dim], start, end, step)
    if index is None:
        return False
    op.name, op.args, op.nodes = _SELECT, [x, dim, index], (*sliced.nodes, *op.nodes)
    g.changed()
    return True


def unbind(g: Graph, op: Op) -> bool:
    """``select(x, d, i)`` for every ``i`` of dim ``d`` is one ``unbind(x, d)``."""
    x = op.args[0]
    x_shape = static_shape(x)
    if x_shape is None:
        return False
    dim = _dims(op, len(x_shape))[0]
    picks: dict[int, Op] = {}
    for reader in g.readers(x):
        if reader.name != _SELECT or _dims(reader, len(x_shape))[0] != dim:
            continue
        index = reader.args[2] + x_shape[dim] if reader.args[2] < 0 else reader.args[2]
        picks.setdefault(index, reader)
    if x_shape[dim] < 2 or sorted(picks) != list(range(x_shape[dim])):
        return False
    selects = [picks[i] for i in range(x_shape[dim])]
    first = next(o for o in g.ops if any(o is s for s in selects))
    outs = [s.out for s in selects]
    nodes = tuple(n for s in selects for n in s.nodes)
    g.insert_before(first, Op("aten.unbind_copy.int", [x, dim], {}, outs, True, nodes))
    for s in selects:
        g.remove(s)
    return True


LAYOUT_RULES: dict[str, tuple[Callable[[Graph, Op], bool], ...]] = {
    _VIEW: (view, permute_chain),
    _PERMUTE: (permute, permute_chain),
    "aten.expand_copy.default": (expand,),
    _UNSQUEEZE: (permute_chain,),
    "aten.squeeze_copy.dims": (select, permute_chain),
    "aten.squeeze_copy.dim": (select, permute_chain),
    _SELECT: (unbind,),
}
