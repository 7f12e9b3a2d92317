"""Decompositions ``to_edge`` applies beyond the core ATen table.

The core ATen decomposition table (``exportir.default_decompositions()``, as
``torch.export.default_decompositions()``) leaves some non-core ops whole. ``to_edge`` decomposes
these too, so the Edge program holds core ATen ops its runtime and backends run:

- ``aten.linalg_vector_norm.default`` (``F.normalize``, ``torch.norm``, weight norm): torch's
  own decomposition, as ExecuTorch 1.5.1's ``to_edge`` adds it
  (``executorch.exir.tracer._default_decomposition_table``);
- ``aten.histc.default`` (mixture-of-experts routers count tokens per expert with it): ours,
  :func:`histc`. ExecuTorch has none and rejects the op in its Edge verifier;
- ``aten.empty_permuted.default`` (what the core table makes of ``torch.empty_like``): ours,
  :func:`empty_permuted`. ExecuTorch rejects it too (its LLM fine-tuning example rewrites it by
  hand with the Edge checks off);
- ``aten.round.decimals`` (``torch.round(x, decimals=d)``): ours, :func:`round_decimals`, equal
  bit for bit to ATen's kernel. torch's own decomposition multiplies by ``10**-d`` where the
  kernel divides by ``10**d``, which differs in the last bit; ExecuTorch rejects the op.

``compile_config.preserve_ops`` keeps any of them whole, as for the core table.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._decomp import get_decompositions

__all__ = ["edge_decompositions", "empty_permuted", "histc", "round_decimals"]

aten = torch.ops.aten


def histc(x: torch.Tensor, bins: int = 100, min: Any = 0, max: Any = 0) -> torch.Tensor:
    """``aten.histc`` in core ATen ops, computing what ATen's CPU kernel computes.

    The range is ``[min, max]``, or the data's own when ``min == max`` (widened by 1 on both
    sides when that is empty too). An element ``e`` of the range falls in bin
    ``int((e - lo) * bins / (hi - lo))`` (the last bin includes ``hi``), computed in ``x``'s
    dtype; elements outside the range and NaNs are not counted. Counts are summed with
    ``scatter_add`` into a ``bins``-element tensor of ``x``'s dtype. Where ATen raises at run
    time (the data range of an input holding NaN or infinity is not finite), the decomposition
    counts what falls in that range: nothing when it is NaN.
    """
    if not x.dtype.is_floating_point:
        raise NotImplementedError(
            f"histc of a {x.dtype} tensor: ATen's histc takes floating-point input only; "
            "cast it first (x.float())"
        )
    flat = aten.reshape.default(x, [-1])
    if isinstance(flat.shape[0], int) and flat.shape[0] == 0:
        return aten.full.default([bins], 0, dtype=x.dtype, device=x.device)
    lo, hi = _range(flat, min, max)
    scaled = aten.div.Tensor(
        aten.mul.Tensor(aten.sub.Tensor(flat, lo), bins), aten.sub.Tensor(hi, lo)
    )
    index = aten.clamp.default(aten._to_copy.default(scaled, dtype=torch.int64), 0, bins - 1)
    inside = aten.logical_and.default(aten.ge.Tensor(flat, lo), aten.le.Tensor(flat, hi))
    counts = aten._to_copy.default(inside, dtype=x.dtype)
    zeros = aten.full.default([bins], 0, dtype=x.dtype, device=x.device)
    return aten.scatter_add.default(zeros, 0, index, counts)


def _range(flat: torch.Tensor, low: Any, high: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``histc``'s outer bin edges as 0-dim tensors of ``flat``'s dtype."""
    if low != high:
        return (
            aten.scalar_tensor.default(float(low), dtype=flat.dtype, device=flat.device),
            aten.scalar_tensor.default(float(high), dtype=flat.dtype, device=flat.device),
        )
    lo, hi = aten.amin.default(flat, [0]), aten.amax.default(flat, [0])
    empty = aten.eq.Tensor(lo, hi)
    return (
        aten.where.self(empty, aten.sub.Tensor(lo, 1), lo),
        aten.where.self(empty, aten.add.Tensor(hi, 1), hi),
    )


def empty_permuted(
    size: Sequence[Any],
    physical_layout: Sequence[int],
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
) -> torch.Tensor:
    """``aten.empty_permuted`` as ``aten.empty``: the values are unspecified either way, and
    an Edge program's tensors are contiguous (how memory is ordered is the memory planner's
    choice), so only the order of the dimensions in memory is dropped."""
    return aten.empty.memory_format(
        list(size), dtype=dtype, layout=layout, device=device, pin_memory=pin_memory
    )


def round_decimals(x: torch.Tensor, *, decimals: int) -> torch.Tensor:
    """``aten.round.decimals`` in core ATen ops, as ATen's CPU kernel computes it: for
    ``decimals >= 0`` round ``x * 10**decimals`` half to even and divide by ``10**decimals``; for
    ``decimals < 0`` round ``x / 10**-decimals`` and multiply back. The power of ten is a scalar
    of ``x``'s dtype (float32 for half types, computed in float32), as in the kernel."""
    if not x.dtype.is_floating_point:
        raise NotImplementedError(
            f"round(decimals=...) of a {x.dtype} tensor: ATen rounds floating-point tensors "
            "with decimals only; cast it first (x.float())"
        )
    if x.dtype in (torch.float16, torch.bfloat16):  # the kernel computes these in float32
        wide = round_decimals(aten._to_copy.default(x, dtype=torch.float32), decimals=decimals)
        return aten._to_copy.default(wide, dtype=x.dtype)
    if decimals >= 0:
        scale = aten.scalar_tensor.default(10.0**decimals, dtype=x.dtype, device=x.device)
        return aten.div.Tensor(aten.round.default(aten.mul.Tensor(x, scale)), scale)
    scale = aten.scalar_tensor.default(10.0**-decimals, dtype=x.dtype, device=x.device)
    return aten.mul.Tensor(aten.round.default(aten.div.Tensor(x, scale)), scale)


@functools.cache
def _torch_entries() -> tuple[tuple[Any, Callable[..., Any]], ...]:
    # torch's get_decompositions walks every registered overload (~15 ms a call)
    return tuple(get_decompositions([aten.linalg_vector_norm.default]).items())


def edge_decompositions() -> dict[Any, Callable[..., Any]]:
    """A fresh table of the decompositions of the module docstring."""
    table: dict[Any, Callable[..., Any]] = dict(_torch_entries())
    table[aten.histc.default] = histc
    table[aten.empty_permuted.default] = empty_permuted
    table[aten.round.decimals] = round_decimals
    return table
