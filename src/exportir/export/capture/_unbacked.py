"""Fake rules for ops whose output depends on tensor data: they create unbacked symbols.

Each rule runs on meta tensors with the export's ShapeEnv and returns meta outputs (or a
``torch.SymInt``) whose data-dependent sizes / values are fresh ``u`` symbols, with the ranges
torch gives them (a ``nonzero`` count lies in ``[0, numel]``). Custom ops registered with
``torch.library.register_fake`` get a context whose ``new_dynamic_size()`` does the same.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from exportir.symbolic import ShapeEnv

aten = torch.ops.aten
_META = torch.device("meta")


def _size_like(env: ShapeEnv, upper: Any) -> torch.SymInt:
    u = env.create_unbacked_symint()
    env.constrain_size_like(u.node.expr, upper if isinstance(upper, int) else torch.inf)
    return u


def _upper(env: ShapeEnv, n: Any) -> int | None:
    """The largest value ``n`` (an int or a SymInt) can take, None when unbounded."""
    if not isinstance(n, torch.SymInt):
        return int(n)
    upper = env.bound(n.node.expr).upper
    return int(upper) if upper.is_finite else None


def _count(env: ShapeEnv, numel: Any) -> Any:
    """How many elements a data-dependent selection out of ``numel`` keeps: 0 when there are
    none (as torch: no symbol for an empty input), else a size-like ``u`` in ``[0, numel]``."""
    if not isinstance(numel, torch.SymInt) and numel == 0:
        return 0
    return _size_like(env, _upper(env, numel))


def _memo(t: torch.Tensor, key: str, make: Callable[[], Any]) -> Any:
    """A data-dependent result of ``t`` made once per version of ``t`` (``x[m]`` and ``y[m]``
    share one size, as torch's ``nonzero_memo``); kept on the meta twin, so it lives as long
    as the tensor and an in-place write (a new version) makes a new one."""
    memo = t.__dict__.setdefault("_exportir_memo", {})
    hit = memo.get(key)
    if hit is not None and hit[0] == t._version:
        return hit[1]
    value = make()
    memo[key] = (t._version, value)
    return value


def _local_scalar_dense(env: ShapeEnv, t: torch.Tensor) -> Any:
    return _memo(t, "item", lambda: _new_scalar(env, t.dtype))


def _new_scalar(env: ShapeEnv, dtype: torch.dtype) -> Any:
    if dtype.is_floating_point or dtype.is_complex:
        return env.create_unbacked_symfloat()
    if dtype is torch.bool:
        return env.create_unbacked_symbool()
    return env.create_unbacked_symint()


def _nonzero(env: ShapeEnv, t: torch.Tensor) -> torch.Tensor:
    n = _memo(t, "nonzero", lambda: _count(env, t.numel()))
    return torch.empty_strided((n, t.dim()), (1, n), dtype=torch.long, device=_META)


def _masked_select(env: ShapeEnv, t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    numel = torch.broadcast_shapes(t.shape, mask.shape).numel()
    return torch.empty((_count(env, numel),), dtype=t.dtype, device=_META)


def _unique_outputs(
    env: ShapeEnv, t: torch.Tensor, return_inverse: bool, return_counts: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = _memo(t, "unique", lambda: _count(env, t.numel()))
    values = torch.empty((n,), dtype=t.dtype, device=_META)
    inverse = torch.empty(t.shape if return_inverse else (0,), dtype=torch.long, device=_META)
    counts = torch.empty((n,) if return_counts else (0,), dtype=torch.long, device=_META)
    return values, inverse, counts


def _unique2(env: ShapeEnv, t: torch.Tensor, sorted: bool = True, return_inverse: bool = False,
             return_counts: bool = False) -> tuple:
    return _unique_outputs(env, t, return_inverse, return_counts)


def _unique_consecutive(env: ShapeEnv, t: torch.Tensor, return_inverse: bool = False,
                        return_counts: bool = False, dim: int | None = None) -> tuple:
    if dim is not None:
        return _unique_dim(env, t, dim, True, return_inverse, return_counts)
    n = _memo(t, "unique_consecutive", lambda: _count(env, t.numel()))
    values = torch.empty((n,), dtype=t.dtype, device=_META)
    inverse = torch.empty(t.shape if return_inverse else (0,), dtype=torch.long, device=_META)
    counts = torch.empty((n,) if return_counts else (0,), dtype=torch.long, device=_META)
    return values, inverse, counts


def _unique_dim(env: ShapeEnv, t: torch.Tensor, dim: int, sorted: bool = True,
                return_inverse: bool = False, return_counts: bool = False) -> tuple:
    dim = dim % max(t.dim(), 1)
    n = _count(env, t.shape[dim])
    shape = list(t.shape)
    shape[dim] = n
    values = torch.empty(shape, dtype=t.dtype, device=_META)
    # as torch's CPU kernel: unique over a dim always returns inverse and counts
    inverse = torch.empty((t.shape[dim],), dtype=torch.long, device=_META)
    counts = torch.empty((n,), dtype=torch.long, device=_META)
    return values, inverse, counts


def _repeat_interleave(env: ShapeEnv, repeats: torch.Tensor, output_size: Any = None) -> torch.Tensor:
    n = output_size if output_size is not None else _size_like(env, None)
    return torch.empty((n,), dtype=repeats.dtype, device=_META)


def _bincount(env: ShapeEnv, t: torch.Tensor, weights: torch.Tensor | None = None,
              minlength: Any = 0) -> torch.Tensor:
    n = _size_like(env, None)
    if not isinstance(minlength, torch.SymInt) and minlength > 0:
        env.constrain_range(n.node.expr, minlength)
    dtype = torch.long if weights is None else (
        torch.float32 if weights.dtype == torch.float32 else torch.float64)
    return torch.empty((n,), dtype=dtype, device=_META)


_MASK_DTYPES = (torch.bool, torch.uint8, torch.int8)


def _index(env: ShapeEnv, t: torch.Tensor, indices: list[torch.Tensor | None]) -> Any:
    """``x[mask]``: every boolean (or byte) mask becomes the columns of its ``nonzero()``
    (one long index per mask dimension, sharing the mask's count symbol), then the meta
    kernel indexes with long tensors. (torch's meta kernel also takes int8 masks and rejects
    uint8 ones; eager takes uint8 masks, and so do we.)"""
    if not any(i is not None and i.dtype in _MASK_DTYPES for i in indices):
        return NotImplemented
    expanded: list[torch.Tensor | None] = []
    for i, index in enumerate(indices):
        if index is None or index.dtype not in _MASK_DTYPES:
            expanded.append(index)
            continue
        _check_mask(t, index, i, len(expanded))
        columns = _nonzero(env, index)
        expanded.extend(columns.select(1, j) for j in range(index.dim()))
    return torch.ops.aten.index.Tensor(t, expanded)


def _check_mask(t: torch.Tensor, mask: torch.Tensor, i: int, k: int) -> None:
    if k + mask.dim() > t.dim():
        raise IndexError(f"too many indices for tensor of dimension {t.dim()}")
    for j in range(mask.dim()):
        if mask.shape[j] != t.shape[k + j]:
            raise IndexError(
                f"The shape of the mask {list(mask.shape)} at index {i} does not match the shape "
                f"of the indexed tensor {list(t.shape)} at index {k + j}"
            )


def _has_unbacked(env: ShapeEnv, x: Any) -> bool:
    return isinstance(x, torch.SymInt) and bool(env.unbacked_symbols(x.node.expr))


def _known(env: ShapeEnv, cond: Any) -> bool:
    """``cond`` holds for certain (ranges and facts say so); never records a guard."""
    if isinstance(cond, bool):
        return cond
    return env.evaluate_static(cond.node.expr) is True


def _slice_index(env: ShapeEnv, size: Any, i: Any) -> Any:
    """Where index ``i`` of a slice lands in ``[0, size]``, or None when it depends on data."""
    rules = (
        (lambda: (i >= 0) & (i <= size), lambda: i),
        (lambda: (i < 0) & (i >= -size), lambda: i + size),
        (lambda: i < -size, lambda: 0),
        (lambda: i > size, lambda: size),
        (lambda: i >= 0, lambda: torch.sym_min(i, size)),
        (lambda: i < 0, lambda: torch.sym_max(i + size, 0)),
    )
    for cond, value in rules:
        if _known(env, cond()):
            return value()
    return None


def _slice(env: ShapeEnv, t: torch.Tensor, dim: int = 0, start: Any = None, end: Any = None,
           step: int = 1) -> Any:
    """``x[a:b]`` with a data-dependent bound (``b = n.item()``) or size (``x[mask][:5]``): the
    bounds are placed in ``[0, size]`` when ranges allow (``x[mask][:5]`` has ``min(5, u0)``
    rows), else the length is a new ``u`` in ``[0, size]`` (asserted at run time), as torch's
    fake slice."""
    if t.dim() == 0:
        return NotImplemented  # (the kernel's own error)
    dim = dim % t.dim()
    if not any(_has_unbacked(env, v) for v in (start, end, t.shape[dim])):
        return NotImplemented
    if step <= 0:
        raise ValueError("slice step must be positive")
    sizes, strides = list(t.shape), list(t.stride())
    size = sizes[dim]
    lo = 0 if start is None else _slice_index(env, size, start)
    hi = size if end is None or (isinstance(end, int) and end >= sys.maxsize) else (
        _slice_index(env, size, end))
    sizes[dim] = _slice_length(env, size, lo, hi, step)
    strides[dim] = strides[dim] * step
    if lo is None:
        offset = env.create_unbacked_symint()
        torch._check(offset >= 0)
    else:
        offset = t.storage_offset() + lo * t.stride(dim)
    return t.as_strided(sizes, strides, offset)


def _slice_length(env: ShapeEnv, size: Any, lo: Any, hi: Any, step: int) -> Any:
    if lo is not None and hi is not None:
        if _known(env, hi >= lo):
            return (hi - lo + step - 1) // step
        if _known(env, lo >= hi):
            return 0
        return (torch.sym_max(hi - lo, 0) + step - 1) // step
    n = env.create_unbacked_symint()
    torch._check(n >= 0)
    torch._check(n <= size)
    return n


def _select(env: ShapeEnv, t: torch.Tensor, dim: int, index: Any) -> Any:
    """``x.select(dim, i)`` with a data-dependent ``i`` or size (``x[mask].view(b, -1, d)[:, -1]``):
    out-of-range indices are errors when ranges prove them; the view's offset is ``i`` (or
    ``i + size``) times the stride when the sign of ``i`` is known, else a new unbacked offset
    (as torch's fake select). Never a guard on data."""
    if t.dim() == 0:
        return NotImplemented
    dim = dim % t.dim()
    size, stride = t.shape[dim], t.stride(dim)
    if not (_has_unbacked(env, index) or _has_unbacked(env, size)):
        return NotImplemented
    if _known(env, index >= size) or _known(env, index < -size):
        raise IndexError(
            f"select(): index {index} out of range for tensor of size {list(t.shape)} at "
            f"dimension {dim}"
        )
    if _known(env, index >= 0):
        offset = t.storage_offset() + index * stride
    elif _known(env, index < 0):
        offset = t.storage_offset() + (index + size) * stride
    else:
        offset = env.create_unbacked_symint()
    sizes = [s for d, s in enumerate(t.shape) if d != dim]
    strides = [s for d, s in enumerate(t.stride()) if d != dim]
    return t.as_strided(sizes, strides, offset)


def _symbolic(x: Any) -> bool:
    return isinstance(x, torch.SymInt)


UNBACKED_RULES: dict[Any, Callable[..., Any]] = {
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.nonzero.default: _nonzero,
    aten.masked_select.default: _masked_select,
    aten._unique2.default: _unique2,
    aten.unique_dim.default: _unique_dim,
    aten.unique_consecutive.default: _unique_consecutive,
    aten.repeat_interleave.Tensor: _repeat_interleave,
    aten.bincount.default: _bincount,
    aten.index.Tensor: _index,
    aten.slice.Tensor: _slice,
    aten.select.int: _select,
}


# --- custom ops ------------------------------------------------------------------------------


def custom_fake_impl(func: Any) -> Callable[..., Any] | None:
    """The ``register_fake`` kernel of a custom op, if it has one (None for ATen ops)."""
    schema = getattr(func, "_schema", None)
    if schema is None or getattr(func, "namespace", "aten") in ("aten", "prim", "prims"):
        return None
    from torch._library.simple_registry import singleton

    kernel = singleton.find(schema.name).fake_impl.kernel
    return kernel if kernel is not None else None


class FakeImplContext:
    """What ``torch.library.get_ctx()`` returns inside a custom op's fake impl during export."""

    __slots__ = ("_env", "_op")

    def __init__(self, env: ShapeEnv, op: Any) -> None:
        self._env = env
        self._op = op

    def new_dynamic_size(self, *, min: int = 0, max: int | None = None) -> torch.SymInt:
        """A fresh data-dependent size (unbacked symbol) in ``[min, max]``."""
        if min < 0:
            raise ValueError(
                f"new_dynamic_size(min={min}): a size cannot be negative; use min >= 0 "
                f"(in the fake impl of {self._op})"
            )
        u = self._env.create_unbacked_symint()
        self._env.constrain_size_like(u.node.expr, torch.inf if max is None else max)
        if min > 0:
            self._env.constrain_range(u.node.expr, min)
        return u

    create_unbacked_symint = new_dynamic_size


@contextlib.contextmanager
def fake_impl_context(env: ShapeEnv, op: Any) -> Iterator[None]:
    """Make ``torch.library.get_ctx()`` return our context while ``op``'s fake impl runs."""
    from torch._library.fake_impl import set_ctx_getter

    ctx = FakeImplContext(env, op)
    with set_ctx_getter(lambda: ctx):
        yield
