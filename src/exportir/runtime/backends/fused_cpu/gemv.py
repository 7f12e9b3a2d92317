"""One-row linears (an LLM's decode step) over a weight laid out once for them.

``linear(x, W)`` with one row of ``x`` is a matrix-vector product that reads all of ``W`` for
very little arithmetic: its speed is how fast the weight streams through the cache. ATen's
``linear`` (MKL's ``sgemm`` on ``W`` transposed) walks ``W [N, K]`` across rows; over a
decoder's weights (several MiB, out of L2) it runs at a fraction of the memory bandwidth.
Laid out in blocks of :data:`BLOCK` output rows, ``[N / BLOCK, K, BLOCK]`` (each block's
``BLOCK`` rows interleaved along ``K``), the same product is one ``bmm`` of ``x`` against the
blocks, which reads the weight front to back: about twice as fast on such weights (measured
on AVX-512: 29 decode-step linears, 16 MiB, 2.6 ms -> 1.0 ms).

- :func:`block_weight` lays a ``[N, K]`` weight out in blocks (``N`` a multiple of
  :data:`BLOCK`); :func:`blocked_linear` computes ``linear(x, W, b)`` from it, for any number
  of rows (more than one: a batched ``matmul`` and a transpose back, for prefill blocks);
- :class:`RowLinear` is the fused CPU kernel of ``aten.linear.default``: one instance per op
  of a blob (``Kernel.bind``). The weight of a method's linear is a program constant the
  delegate is handed on every call: the executor shows each op its weight when the first call
  starts (:meth:`RowLinear.prime`); when one op then sees the same weight tensor, unchanged
  (its version counter), with one row of ``x``, it blocks it and keeps the copy;
  later one-row calls use it. It blocks only when the blob's one-row weights add up to
  :data:`BLOCK_MIN_BYTES` or more: smaller ones stay in the caches from call to call, where
  ATen's ``linear`` is faster (a 3-linear MLP of 2.6 MiB: 62 vs 85 us). Anything else (several
  rows, a weight it has not seen twice or that changed, shapes or dtypes it does not block)
  runs ATen's ``linear``.

Results agree with ``linear`` to float rounding (each output is the same dot product, summed
in another order). Imports only torch.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["BLOCK", "BLOCK_MIN_BYTES", "RowLinear", "block_weight", "blockable", "blocked_linear"]

BLOCK = 16
_linear = torch._C._nn.linear
_bmm = torch.bmm


def blockable(w: Any, k: int | None = None) -> bool:
    """Whether ``w`` is a float32 ``[N, K]`` weight :func:`block_weight` lays out (``N`` a
    multiple of :data:`BLOCK`; ``K`` equal to ``k`` when given)."""
    return (
        isinstance(w, torch.Tensor)
        and w.dim() == 2
        and w.dtype == torch.float32
        and w.shape[0] % BLOCK == 0
        and w.shape[0] > 0
        and w.shape[1] > 0
        and (k is None or w.shape[1] == k)
        and not w.requires_grad
    )


def block_weight(w: torch.Tensor) -> torch.Tensor:
    """``w [N, K]`` as ``[N / BLOCK, K, BLOCK]`` (contiguous): block ``j`` holds rows
    ``j * BLOCK ... (j + 1) * BLOCK - 1`` of ``w``, transposed."""
    n, k = w.shape
    return w.reshape(n // BLOCK, BLOCK, k).transpose(1, 2).contiguous()


def blocked_linear(x: torch.Tensor, blocked: torch.Tensor, bias: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """``linear(x, W, bias)`` from ``blocked = block_weight(W)``; ``x [..., K]``."""
    blocks, k, width = blocked.shape
    lead = x.shape[:-1]
    if x.numel() == k:  # one row: a batch of [1, K] x [K, BLOCK] products, in output order
        y = _bmm(x.reshape(1, 1, k).expand(blocks, 1, k), blocked).view(*lead, blocks * width)
    else:
        y = torch.matmul(x.reshape(1, -1, k), blocked)  # [N / BLOCK, M, BLOCK]
        y = y.transpose(0, 1).reshape(*lead, blocks * width)
    return y if bias is None else y.add_(bias)


# One-row weights a delegate streams per call from which the blocked layout pays (measured at
# one thread on AMD EPYC, 1 MiB L2, 32 MiB shared L3: a 3-linear MLP of 2.6 MiB runs 62 us on
# ATen's linear vs 85 us blocked; 30 linears of 16 MiB, 1056 vs 761 us; 2 of 32 MiB, 1903 vs
# 1612 us). Below it the weights stay in the caches between calls, where MKL's product is faster.
BLOCK_MIN_BYTES = 8 << 20


class RowLinear:
    """``aten.linear`` for one op of a blob (module docstring). The ops of one blob share a
    ``group`` (:meth:`join`): each records the bytes of the weight it sees; the second one-row
    call on a weight seen unchanged blocks it when the group's weights add up to at least
    ``min_bytes`` (:data:`BLOCK_MIN_BYTES`), else keeps ATen's ``linear``. A call with the same
    row shape as the last one runs straight from the state (one ``bmm`` or one ``linear``: a
    decode step's linears are a third of its time, Python's part of each counts)."""

    __slots__ = ("_bytes", "_group", "_min_bytes", "_state")

    def __init__(self, min_bytes: int = BLOCK_MIN_BYTES) -> None:
        self._min_bytes = min_bytes
        self._group: list[RowLinear] = [self]
        self._bytes = 0  # the weight's size, from its first one-row call
        # (weight tensor, its version when seen, its blocked copy or None, the last one-row
        # shape of x, x expanded to the blocks (None: ATen's linear runs), the result's shape);
        # replaced whole, so concurrent calls read a consistent tuple
        self._state: tuple[Any, ...] = (None, -1, None, None, None, None)

    def join(self, group: list[RowLinear]) -> None:
        """Share ``group`` (the blob's one-row linears) and add this op to it."""
        group.append(self)
        self._group = group

    def prime(self, w: Any) -> None:
        """See ``w`` before the first call (the executor shows each op its weight when the
        delegate's first call starts): that call's one-row product then decides and blocks,
        as a second sight would, so the weights are laid out by the first call, not the
        second (a decode loop's first timed token paid ~13 ms for it)."""
        if isinstance(w, torch.Tensor) and self._state[0] is None:
            self._state = (w, w._version, None, None, None, None)
            self._bytes = w.numel() * w.element_size()

    def __call__(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None
                 ) -> torch.Tensor:
        seen, version, blocked, x_shape, expanded, out_shape = self._state
        if w is seen and x.shape == x_shape and w._version == version:
            if expanded is None:
                return _linear(x, w, bias)
            y = _bmm(x.expand(expanded), blocked).view(out_shape)
            return y if bias is None else y.add_(bias)
        return self._slow(x, w, bias)

    def _slow(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None
              ) -> torch.Tensor:
        seen, version, blocked, x_shape = self._state[:4]
        one_row = isinstance(x, torch.Tensor) and x.dim() >= 1 and x.numel() == x.shape[-1]
        if not one_row or not isinstance(w, torch.Tensor):
            return _linear(x, w, bias)
        if w is not seen or w._version != version:  # first sight (or changed): remember it
            self._state = (w, w._version, None, None, None, None)
            self._bytes = w.numel() * w.element_size()
            return _linear(x, w, bias)
        if x.dtype != torch.float32 or not blockable(w, x.shape[-1]) or (
                bias is not None and (bias.dtype != torch.float32 or bias.dim() != 1
                                      or bias.shape[0] != w.shape[0])):
            return _linear(x, w, bias)
        if blocked is None and x_shape is None:  # second sight: decide once
            if sum(r._bytes for r in self._group) < self._min_bytes:
                self._state = (w, version, None, x.shape, None, None)
                return _linear(x, w, bias)
            blocked = block_weight(w)
        elif blocked is None:  # decided for ATen's linear; another row shape
            self._state = (w, version, None, x.shape, None, None)
            return _linear(x, w, bias)
        blocks, k, width = blocked.shape
        if x.dim() <= 3:  # expand adds the leading dims: the fast path in __call__
            out_shape = (*x.shape[:-1], blocks * width)
            self._state = (w, version, blocked, x.shape, (blocks, 1, k), out_shape)
        else:
            self._state = (w, version, blocked, None, None, None)
        return blocked_linear(x, blocked, bias)
