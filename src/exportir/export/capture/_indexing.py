"""``x[i]`` with a symbolic integer index, as torch.export's non-strict mode rewrites it.

Tensor indexing is C++ (``Tensor.__getitem__``): it turns an integer index into ``select`` by
calling ``int(i)``, which on a data-dependent ``i = t.item()`` cannot be decided (the C++ code
then reports "only integers, slices ... are valid indices (got SymInt)"). As torch does, when an
index holds a SymInt, ``x[a, b:c, None]`` is run as the sequence ``select`` / ``slice`` /
``unsqueeze`` it means, on the symbolic values. Any other index (tensors, booleans, lists...)
goes to ``__getitem__`` unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten
Step = tuple[Callable[..., torch.Tensor], tuple[Any, ...]]


def _has_symint(items: list[Any]) -> bool:
    for item in items:
        if isinstance(item, torch.SymInt):
            return True
        if isinstance(item, slice) and any(
            isinstance(s, torch.SymInt) for s in (item.start, item.stop, item.step)
        ):
            return True
    return False


def _step(dim: int, item: Any) -> tuple[int, Step | None] | None:
    """(next dim, the call for ``item`` at ``dim``), or None when ``item`` is not rewritable."""
    if item is None:
        return dim + 1, (torch.unsqueeze, (dim,))
    if isinstance(item, (int, torch.SymInt)) and not isinstance(item, bool):
        return dim, (torch.select, (dim, item))
    if isinstance(item, slice):
        step = 1 if item.step is None else item.step
        if item.start is None and item.stop is None and step == 1:
            return dim + 1, None  # ``:`` keeps the dim
        return dim + 1, (aten.slice, (dim, item.start, item.stop, step))
    return None


def _plan(t: torch.Tensor, index: Any) -> list[Step] | None:
    items = list(index) if isinstance(index, tuple) else [index]
    if not _has_symint(items):
        return None
    if any(item is Ellipsis for item in items):
        at = items.index(Ellipsis)
        indexed = sum(1 for i in items if i is not None and i is not Ellipsis)
        items[at : at + 1] = [slice(None)] * (t.dim() - indexed)
    steps, dim = [], 0
    for item in items:
        found = _step(dim, item)
        if found is None:
            return None
        dim, step = found
        if step is not None:
            steps.append(step)
    return steps


class SymIndexing(TorchFunctionMode):
    """Runs ``x[...]`` with SymInt indices as select / slice / unsqueeze (torch.export's
    rewrite); entered by capture for the duration of ``forward``."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) == "__getitem__" and isinstance(args[0], torch.Tensor):
            steps = _plan(args[0], args[1])
            if steps is not None:
                out = args[0]
                for call, extra in steps:
                    out = call(out, *extra)
                return out
        return func(*args, **kwargs)
