"""Decompositions that replace torch's entry for the same op in the core ATen table.

Each entry here fixes one where torch 2.13's cannot be recorded in a functional graph, and
says how; the result is the ops torch.export's core graph has.

A decomposition whose result is laid out unlike the kernel's (torch's
``_scaled_dot_product_flash_attention_for_cpu``: ``(L, N, H, E)`` whatever the query's
layout) is kept as torch's: the re-trace re-decides the reshapes after it against the new
layout, as torch's does, and turns a ``view`` that no longer fits into a copy
(capture/_redecide.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._prims_common import suggest_memory_format

aten = torch.ops.aten


def adaptive_avg_pool2d(x: torch.Tensor, output_size: list[int]) -> torch.Tensor:
    """``aten.adaptive_avg_pool2d`` as its C++ composite kernel, with a functional restride.

    For a 1x1 output the kernel takes the mean over the last two dimensions and, for a
    channels-last input, restrides it with the in-place ``as_strided_``: a metadata mutation
    a functional graph cannot hold. The same restride through ``as_strided`` gives the ops
    torch.export's core graph has (``mean.dim`` + ``as_strided``).
    """
    if output_size[0] != 1 or output_size[1] != 1 or x.is_quantized:
        return aten._adaptive_avg_pool2d.default(x, output_size)
    out = aten.mean.dim(x, [-1, -2], True)
    if suggest_memory_format(x) != torch.channels_last:
        return out
    n, c = x.shape[0], x.shape[1]
    return aten.as_strided.default(out, [n, c, 1, 1], [c, 1, c, c])


OVERRIDES: dict[Any, Callable[..., Any]] = {
    aten.adaptive_avg_pool2d.default: adaptive_avg_pool2d,
}
