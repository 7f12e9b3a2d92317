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
from torch._prims_common import (
    compute_elementwise_output_logical_to_physical_perm,
    suggest_memory_format,
)

aten = torch.ops.aten


def sdpa_flash_attention_for_cpu(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten._scaled_dot_product_flash_attention_for_cpu`` through the math attention, its
    output laid out as the kernel lays it out (``empty_like(query)``: like the query), for
    :data:`KERNEL_LAYOUT`.

    Only a decomposition spliced into a graph without re-tracing what comes after
    (``exportir.passes.decompose_nodes``, which ``to_edge_transform_and_lower`` runs on the
    attention no partitioner claimed) needs this: a ``view`` after the attention was recorded
    against the kernel's layout, and torch's ``(L, N, H, E)`` result would not fit it. Like
    torch's, the second result is the attention weights, not the kernel's log-sum-exp (nothing
    in a captured ``scaled_dot_product_attention`` reads it).
    """
    torch._check(
        torch.is_floating_point(query),
        lambda: f"query must be FP32, FP64, BF16, FP16 but got {query.dtype}",
    )
    torch._check(
        query.dim() == 4 and key.dim() == 4 and value.dim() == 4,
        lambda: "q, k, v must be a 4 dimensional tensor, got "
        f"{query.dim()}, {key.dim()}, {value.dim()}",
    )
    torch._check(dropout_p == 0.0, lambda: f"dropout probability must be zero, got {dropout_p}")
    torch._check(
        query.shape[3] == value.shape[3] and key.shape[3] == value.shape[3],
        lambda: "q, k, v should have the same head size",
    )
    output, attn = aten._scaled_dot_product_attention_math.default(
        query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
        dropout_mask=None, scale=scale, enable_gqa=query.size(1) != key.size(1),
    )  # fmt: skip
    # outermost dimension first, as empty_like(query) orders them (no guard on an ambiguity)
    order, _ = compute_elementwise_output_logical_to_physical_perm(query)
    inverse = [order.index(d) for d in range(len(order))]
    output = aten.permute.default(output, order)
    output = aten.clone.default(output, memory_format=torch.contiguous_format)
    return aten.permute.default(output, inverse), attn


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

# Decompositions that keep the kernel's result layout, for decompositions spliced in without a
# re-trace of the graph after them (exportir.passes.decompose_nodes): they replace the table's
# entry for the same op there.
KERNEL_LAYOUT: dict[Any, Callable[..., Any]] = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: sdpa_flash_attention_for_cpu,
}
