"""The values a method emitter creates before memory planning: tensors whose storage is
decided at the end (:class:`_PendingTensor`), their dim orders and size bounds, and how they
become :class:`schema.Tensor` values once the plan is made."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from exportir.format import planning, schema


@dataclass(slots=True)
class _PendingTensor:
    """A tensor whose storage is decided at the end (planned or runtime-allocated)."""

    dtype: schema.ScalarType
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    dynamic: bool
    bounded: bool
    name: str
    initial: int | None = None


_TENSORS = (schema.Tensor, _PendingTensor)


def _stride_hint(stride: Any) -> int | None:
    """A stride's static value, or a symbolic stride's value at the example inputs. Never
    ``int(stride)``: that guards, and the guard would specialize the exported program's shape
    symbols to their example values (every later dynamic size would be planned static)."""
    if isinstance(stride, int):
        return stride
    hint = getattr(getattr(stride, "node", None), "hint", None)
    return hint if isinstance(hint, int) else None


def _dim_order(val: Any) -> tuple[int, ...]:
    strides = [_stride_hint(s) for s in val.stride()]
    if any(s is None for s in strides):
        return tuple(range(val.dim()))
    return _order_of(strides)


def _order_of(strides: Sequence[int]) -> tuple[int, ...]:
    return tuple(sorted(range(len(strides)), key=lambda d: (-strides[d], d)))


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same sizes and the same strides wherever a stride matters (dimensions of size > 1)."""
    return a.shape == b.shape and all(
        n <= 1 or x == y for n, x, y in zip(a.shape, a.stride(), b.stride())
    )


def _size_bound(size: Any) -> tuple[int, bool]:
    """(static size or upper bound, bounded?) of one dimension."""
    if isinstance(size, int):
        return size, True
    node = getattr(size, "node", None)
    env, expr = getattr(node, "shape_env", None), getattr(node, "expr", None)
    if env is not None and expr is not None and hasattr(env, "bound"):
        try:
            upper = env.bound(expr).upper
        except (TypeError, ValueError, AttributeError):
            upper = None
        if getattr(upper, "is_Integer", False) or isinstance(upper, int):
            return max(int(upper), 0), True
    hint = getattr(node, "hint", None)
    hint = hint() if callable(hint) else hint
    return (hint if isinstance(hint, int) and hint >= 0 else 0), False


def _numel(sizes: Sequence[int]) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


def _nbytes(v: _PendingTensor) -> int:
    return schema.ELEMENT_SIZE[v.dtype] * _numel(v.sizes)


def _finalize(v: Any, plan: planning.MemoryPlan, index: int) -> schema.EValue:
    if not isinstance(v, _PendingTensor):
        return v
    alloc = plan.allocations.get(index)
    storage: schema.Storage = alloc if alloc is not None else schema.DynamicStorage()
    return schema.Tensor(v.dtype, v.sizes, v.dim_order, storage, v.dynamic, v.initial)
