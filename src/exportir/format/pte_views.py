"""Which portable kernel copies a view that ExecuTorch cannot alias, when a method is written as
``.pte`` (see ``docs/format/pte.md``, "Kernel choices").

A view of planned memory that is not one contiguous block is copied just before each
instruction that reads it. ``as_strided_copy`` can copy any view, but ExecuTorch's portable
kernel walks it one element at a time; ``slice_copy`` copies each run of contiguous elements
with one ``memcpy``, and ``select_copy`` likewise. So a view that is a slice of one dimension
(``x[..., 1:]``, ``x[:, ::2]``) or the selection of one index of one dimension (``x[:, 0]``) of
a contiguous base is copied by that kernel, with the same result; any other view keeps
``as_strided_copy``.

Imports the standard library and the format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from exportir.format import schema

__all__ = ["ViewCopy", "view_copy"]


@dataclass(frozen=True, slots=True)
class ViewCopy:
    """``op.overload(base, *ints, out)`` copies the view (each int written as an ``Int``)."""

    op: str
    overload: str
    ints: tuple[int, ...]


def _same(sizes: Sequence[int], strides: Sequence[int], want_sizes: Sequence[int],
          want_strides: Sequence[int]) -> bool:
    """Equal sizes, and equal strides wherever the size is above one (a stride of a size-one
    dimension is never used)."""
    return tuple(sizes) == tuple(want_sizes) and all(
        s == w for s, w, n in zip(strides, want_strides, sizes) if n > 1)


def _slice(base: Sequence[int], dense: Sequence[int], sizes: Sequence[int],
           strides: Sequence[int], offset: int) -> ViewCopy | None:
    for d, (n, stride) in enumerate(zip(sizes, strides)):
        rest = [i for i in range(len(base)) if i != d]
        if not _same([sizes[i] for i in rest], [strides[i] for i in rest],
                     [base[i] for i in rest], [dense[i] for i in rest]):
            continue
        step = 1 if n == 1 else stride // dense[d] if stride % dense[d] == 0 else 0
        start, rem = divmod(offset, dense[d])
        if step < 1 or rem or start + (n - 1) * step >= base[d]:
            continue
        return ViewCopy("aten::slice_copy", "Tensor_out", (d, start, start + (n - 1) * step + 1,
                                                          step))
    return None


def _select(base: Sequence[int], dense: Sequence[int], sizes: Sequence[int],
            strides: Sequence[int], offset: int) -> ViewCopy | None:
    for d in range(len(base)):
        rest = [i for i in range(len(base)) if i != d]
        index, rem = divmod(offset, dense[d])
        if rem or index >= base[d] or not _same(
                sizes, strides, [base[i] for i in rest], [dense[i] for i in rest]):
            continue
        return ViewCopy("aten::select_copy", "int_out", (d, index))
    return None


def view_copy(base: schema.Tensor, view: schema.Tensor, v: schema.ViewOf) -> ViewCopy | None:
    """The kernel copying view ``view`` (``v``: its strides and offset over ``base`` laid out
    contiguously) when it is a slice or a selection of one dimension of ``base``; None leaves it
    to ``as_strided_copy``."""
    if (view.dtype != base.dtype or view.dynamic or base.dynamic or v.offset < 0
            or any(n == 0 for n in (*base.sizes, *view.sizes))):
        return None
    dense = schema.dense_strides(base.sizes, tuple(range(len(base.sizes))))
    args = (base.sizes, dense, view.sizes, v.strides, v.offset)
    if len(view.sizes) == len(base.sizes):
        return _slice(*args)
    if len(view.sizes) + 1 == len(base.sizes):
        return _select(*args)
    return None
