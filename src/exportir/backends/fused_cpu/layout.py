"""Layout rewrites: fewer view-like ops (inside the delegate they are views, so what costs is
the Python call per op, not data movement).

- a ``view`` / ``expand`` to the same shape and an identity ``permute`` are dropped;
- chains of ``view`` / ``squeeze`` / ``unsqueeze`` collapse into one ``view``, chains of
  ``permute`` into one ``permute``;
- a chain of ``permute`` s and reshapes (``view``, ``squeeze``, ``unsqueeze``) becomes at most
  ``view``, ``permute``, ``view`` when that is fewer ops: the chain is followed on the finest
  pieces of the source's dims it moves whole (a reshape to ``[L, N * H, d]`` and a transpose
  become one reshape to ``[L, N, H, d]`` and one permute);
- a ``clone`` only view-like ops read is dropped;
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


_VIEW_READERS = frozenset({*_CHAIN, _SELECT, "aten.unbind_copy.int", "aten.slice_copy.Tensor",
                           "aten.split_with_sizes_copy.default", "aten.expand_copy.default"})  # fmt: skip


def clone(g: Graph, op: Op) -> bool:
    """A ``clone`` keeping the layout is dropped (values never change in place here, outputs
    sharing an input's memory are cloned by the executor); a contiguous ``clone`` read only by
    view-like ops too: they take any strides (a ``view`` that cannot view copies)."""
    fmt = op.kwargs.get("memory_format")
    if any(o is op.out for o in g.outputs):
        return False  # an output of its own, distinct from the value it copies
    if fmt is None or fmt is torch.preserve_format:
        return g.alias(op, op.args[0])
    if fmt is not torch.contiguous_format:
        return False
    readers = g.readers(op.out)
    if not readers or any(r.name not in _VIEW_READERS for r in readers):
        return False
    return g.alias(op, op.args[0])


def expand(g: Graph, op: Op) -> bool:
    x = op.args[0]
    if static_shape(x) is not None and static_shape(x) == static_shape(op.out):
        return g.alias(op, x)
    return False


# ------------------------------------------------------------------------------ view chains


class _Atoms:
    """A chain of reshapes and permutes followed on *atoms*: the finest pieces of the source's
    dims the chain moves as a whole. Every value of the chain is a list of dims, each a list of
    atoms in row-major order; a reshape that cuts an atom splits it everywhere."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.size: list[int] = []
        self.source = [[self._new(s)] if s != 1 else [] for s in shape]

    def _new(self, size: int) -> int:
        self.size.append(size)
        return len(self.size) - 1

    def _split(self, atom: int, outer: int, lists: list[list[int]]) -> None:
        inner = self._new(self.size[atom] // outer)
        self.size[atom] = outer
        for seq in lists:
            for i in range(len(seq) - 1, -1, -1):
                if seq[i] == atom:
                    seq.insert(i + 1, inner)

    def reshape(self, dims: list[list[int]], target: tuple[int, ...]) -> list[list[int]] | None:
        seq = [a for d in dims for a in d]
        out: list[list[int]] = []
        i = 0
        for t in target:
            group: list[int] = []
            have = 1
            while have < t:
                if i >= len(seq):
                    return None
                size = self.size[seq[i]]
                if t % (have * size) == 0:
                    group.append(seq[i])
                    have *= size
                    i += 1
                    continue
                need = t // have
                if t % have or size % need:
                    return None
                self._split(seq[i], need, [seq, *self.source, *dims, *out, group])
                group.append(seq[i])
                have *= need
                i += 1
            out.append(group)
        return out if i == len(seq) else None


def _dims(op: Op, rank: int) -> list[int]:
    raw = op.args[1] if len(op.args) > 1 else 0
    dims = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    return [d + rank if d < 0 else d for d in dims]


def _replacement(x: Value, chain: list[Op]) -> tuple[tuple, list[int], tuple] | None:
    """``(shape1, perm, shape2)``: ``chain`` applied to ``x`` is
    ``view(permute(view(x, shape1), perm), shape2)``."""
    x_shape = static_shape(x)
    if x_shape is None or 0 in x_shape:
        return None
    atoms = _Atoms(x_shape)
    dims: list[list[int]] | None = [list(d) for d in atoms.source]
    for op in chain:
        out = static_shape(op.out)
        if out is None or dims is None:
            return None
        if op.name == _PERMUTE:
            if len(dims) != len(out):
                return None
            dims = [dims[d] for d in _dims(op, len(dims))]
        else:
            dims = atoms.reshape(dims, out)
    if dims is None:
        return None
    out_shape = static_shape(chain[-1].out)
    if all(len(d) <= 1 for d in atoms.source):  # x's own dims are the atoms: permute x itself
        return x_shape, _dims_perm(atoms.source, dims), out_shape
    order = [a for d in atoms.source for a in d]
    perm = [order.index(a) for d in dims for a in d]
    return tuple(atoms.size[a] for a in order), perm, out_shape


def _dims_perm(source: list[list[int]], dims: list[list[int]]) -> list[int]:
    """A permutation of the source dims (each one atom or size 1) putting the atoms in the
    order of ``dims``; size-1 source dims go where ``dims`` has size-1 dims, else at the end."""
    where = {d[0]: i for i, d in enumerate(source) if d}
    ones = [i for i, d in enumerate(source) if not d]
    perm: list[int] = []
    if all(len(d) <= 1 for d in dims) and sum(not d for d in dims) == len(ones):
        spare = iter(ones)
        return [where[d[0]] if d else next(spare) for d in dims]
    perm = [where[a] for d in dims for a in d]
    return perm + ones


def view_chain(g: Graph, op: Op) -> bool:
    """A chain of ``permute`` / ``view`` / ``squeeze`` / ``unsqueeze`` becomes at most a
    ``view``, a ``permute`` and a ``view`` when that is fewer ops."""
    chain = [op]
    while len(chain) < _MAX_CHAIN:
        inner = g.producer(chain[-1].args[0])
        if inner is None or inner.name not in _CHAIN:
            break
        chain.append(inner)
    chain.reverse()
    for start in range(len(chain) - 1):
        part = chain[start:]
        found = _replacement(part[0].args[0], part)
        if found is not None:
            return _rewrite_chain(g, op, part, *found)
    return False


def _rewrite_chain(g: Graph, op: Op, part: list[Op], shape1: tuple, perm: list[int],
                   shape2: tuple) -> bool:  # fmt: skip
    x = part[0].args[0]
    permuted = tuple(shape1[d] for d in perm)
    steps: list[tuple[str, list, tuple]] = []
    if shape1 != static_shape(x):
        steps.append((_VIEW, list(shape1), shape1))
    if perm != list(range(len(perm))):
        steps.append((_PERMUTE, perm, permuted))
    if permuted != shape2:
        steps.append((_VIEW, list(shape2), shape2))
    if len(steps) >= len(part):
        return False
    if not steps:
        return g.alias(op, x)
    nodes = tuple(n for c in part for n in c.nodes)
    source = x
    for name, arg, shape in steps[:-1]:
        meta = torch.empty(shape, dtype=x.dtype, device="meta")
        value = Value(meta, name=f"{op.out.name}_{len(nodes)}")
        g.insert_before(op, Op(name, [source, arg], {}, [value], False, nodes))
        source = value
    name, arg, _ = steps[-1]
    op.name, op.args, op.kwargs, op.nodes = name, [source, arg], {}, nodes
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
    _VIEW: (view, view_chain),
    _PERMUTE: (permute, view_chain),
    "aten.expand_copy.default": (expand,),
    _UNSQUEEZE: (view_chain,),
    "aten.squeeze_copy.dims": (select, view_chain),
    "aten.squeeze_copy.dim": (select, view_chain),
    _SELECT: (unbind,),
    "aten.clone.default": (clone,),
}
