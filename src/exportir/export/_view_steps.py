"""Views as steps from their storage's base value, and the inverse of each step.

Functionalization (functionalize.py) describes every tensor as its storage plus the chain of
view steps that lead from the storage's base value to it (torch's ``ViewMeta`` list). A read
replays the chain on the base's current value; a write runs the inverses from the last step to
the first, scattering the new value into the base. An in-place view op (``y.unsqueeze_(0)``)
appends a step to ``y``'s own chain. The inverses are torch's (``FunctionalInverses.cpp``), so
the graphs match torch.export's.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from exportir.fx import Node

aten = torch.ops.aten


@dataclass(frozen=True, slots=True, eq=False)
class ViewStep:
    """``target(base, *args, **kwargs)``: one view op. ``args`` / ``kwargs`` are arguments of
    the captured graph (mapped to the new graph each time the step is replayed); ``base_val`` and
    ``val`` are the fake values (layouts) before and after the step. Compared by identity."""

    target: Any
    args: tuple
    kwargs: dict
    base_val: Any
    val: Any


Emit = Callable[[Any, tuple, dict], Node]
# (emit, step, new base value, new value of the view, the step's args mapped) -> new base value
Inverse = Callable[[Emit, ViewStep, Node, Node, tuple], Node]


def _select(emit: Emit, step: ViewStep, base: Node, src: Node, rest: tuple) -> Node:
    return emit(aten.select_scatter.default, (base, src, *rest[:2]), {})


def _slice(emit: Emit, step: ViewStep, base: Node, src: Node, rest: tuple) -> Node:
    return emit(aten.slice_scatter.default, (base, src, *rest), {})


def _diagonal(emit: Emit, step: ViewStep, base: Node, src: Node, rest: tuple) -> Node:
    return emit(aten.diagonal_scatter.default, (base, src, *rest), {})


def _as_strided(emit: Emit, step: ViewStep, base: Node, src: Node, rest: tuple) -> Node:
    return emit(aten.as_strided_scatter.default, (base, src, *rest), {})


def _view_back(emit: Emit, step: ViewStep, base: Node, src: Node, rest: tuple) -> Node:
    return emit(aten.view.default, (src, list(step.base_val.shape)), {})


def _squeeze_back(emit: Emit, step: ViewStep, base: Node, src: Node, rest: tuple) -> Node:
    return emit(aten.squeeze.dim, (src, rest[0]), {})


def _unsqueeze_back(emit: Emit, step: ViewStep, base: Node, src: Node, rest: tuple) -> Node:
    """Inverse of ``squeeze``: unsqueeze each squeezed dim the base had of size 1, in order."""
    shape = step.base_val.shape
    ndim = len(shape)
    if ndim == 0:
        return src
    dims = range(ndim) if not rest else _dims(rest[0], ndim)
    for d in sorted(dims):
        if shape[d] == 1:
            src = emit(aten.unsqueeze.default, (src, d), {})
    return src


def _dims(dims: Any, ndim: int) -> set[int]:
    listed = dims if isinstance(dims, (list, tuple)) else [dims]
    return {d % ndim for d in listed}


def _permute_back(emit: Emit, step: ViewStep, base: Node, src: Node, rest: tuple) -> Node:
    dims = list(rest[0])
    inverse = [0] * len(dims)
    for i, d in enumerate(dims):
        inverse[d % len(dims)] = i
    return emit(aten.permute.default, (src, inverse), {})


def _same_op(emit: Emit, step: ViewStep, base: Node, src: Node, rest: tuple) -> Node:
    return emit(step.target, (src, *rest), {})


def _identity(emit: Emit, step: ViewStep, base: Node, src: Node, rest: tuple) -> Node:
    return src


INVERSES: dict[Any, Inverse] = {
    aten.select.int: _select,
    aten.slice.Tensor: _slice,
    aten.diagonal.default: _diagonal,
    aten.as_strided.default: _as_strided,
    aten.view.default: _view_back,
    aten._unsafe_view.default: _view_back,
    aten.reshape.default: _view_back,
    aten.flatten.using_ints: _view_back,
    aten.unflatten.int: _view_back,
    aten.unsqueeze.default: _squeeze_back,
    aten.squeeze.dim: _unsqueeze_back,
    aten.squeeze.dims: _unsqueeze_back,
    aten.squeeze.default: _unsqueeze_back,
    aten.permute.default: _permute_back,
    aten.transpose.int: _same_op,
    aten.t.default: _same_op,
    aten.alias.default: _same_op,  # torch writes back through an alias with an alias
    aten.detach.default: _identity,
}


# views returning a list: (emit, step, base, new value of piece ``index``, mapped args, index)
PieceInverse = Callable[[Emit, ViewStep, Node, Node, tuple, int], Node]


def _split_back(
    emit: Emit, step: ViewStep, base: Node, src: Node, rest: tuple, index: int
) -> Node:
    size = rest[0]
    dim = (rest[1] if len(rest) > 1 else 0) % step.base_val.dim()
    start = size * index
    end = min(start + size, step.base_val.shape[dim])
    return emit(aten.slice_scatter.default, (base, src, dim, start, end), {})


def _split_sizes_back(
    emit: Emit, step: ViewStep, base: Node, src: Node, rest: tuple, index: int
) -> Node:
    sizes = rest[0]
    dim = (rest[1] if len(rest) > 1 else 0) % step.base_val.dim()
    start = sum(sizes[:index])
    return emit(aten.slice_scatter.default, (base, src, dim, start, start + sizes[index]), {})


def _unbind_back(
    emit: Emit, step: ViewStep, base: Node, src: Node, rest: tuple, index: int
) -> Node:
    dim = rest[0] if rest else 0
    return emit(aten.select_scatter.default, (base, src, dim, index), {})


PIECE_INVERSES: dict[Any, PieceInverse] = {
    aten.split.Tensor: _split_back,
    aten.split_with_sizes.default: _split_sizes_back,
    aten.unbind.int: _unbind_back,
}


def invertible(chain: tuple[ViewStep, ...]) -> bool:
    """Every step has an inverse (a piece of a list view counts with the view making it)."""
    for i, step in enumerate(chain):
        if step.target is operator.getitem:
            if i == 0 or chain[i - 1].target not in PIECE_INVERSES:
                return False
        elif step.target not in INVERSES and step.target not in PIECE_INVERSES:
            return False
    return True


def scatter_back(
    emit: Emit, chain: tuple[ViewStep, ...], bases: list[Node], src: Node,
    map_arg: Callable[[Any], Any],
) -> Node:
    """The new base value after ``src`` is written into the view ``chain`` of it; ``bases[i]``
    is the value step ``i`` applies to. ``invertible(chain)`` must hold."""
    index = None
    for step, base in zip(reversed(chain), reversed(bases)):
        if step.target is operator.getitem:
            index = step.args[0]  # the list view before it puts the piece back
            continue
        rest = map_arg(step.args)
        if index is not None:
            src = PIECE_INVERSES[step.target](emit, step, base, src, rest, index)
            index = None
        else:
            src = INVERSES[step.target](emit, step, base, src, rest)
    return src


def contiguous_strides(size: list[int]) -> list[int]:
    """Row-major strides of ``size`` (what ``resize_`` gives a tensor), as c10 computes them."""
    strides, running = [], 1
    for s in reversed(size):
        strides.append(running)
        running *= max(s, 1)
    return strides[::-1]
