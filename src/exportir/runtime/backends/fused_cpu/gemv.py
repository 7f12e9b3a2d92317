"""One-row linears (an LLM's decode step) over a weight laid out once for them.

``linear(x, W)`` with one row of ``x`` is a matrix-vector product that reads all of ``W`` for
very little arithmetic: its speed is how fast the weight streams through the cache. ATen's
``linear`` (MKL's ``sgemm`` on ``W`` transposed) walks ``W [N, K]`` across rows; over a
decoder's weights (several MiB, out of L2) it ran at a fraction of the memory bandwidth on AMD
EPYC. Laid out in blocks of :data:`BLOCK` output rows, ``[N / BLOCK, K, BLOCK]`` (each block's
``BLOCK`` rows interleaved along ``K``), the same product is one ``bmm`` of ``x`` against the
blocks, which reads the weight front to back: about twice as fast there, and slower on a Xeon
(below), so the runtime times both on the machine it runs on.

- :func:`block_weight` lays a ``[N, K]`` weight out in blocks (``N`` a multiple of
  :data:`BLOCK`); :func:`blocked_linear` computes ``linear(x, W, b)`` from it, for any number
  of rows (more than one: a batched ``matmul`` and a transpose back, for prefill blocks);
- :class:`RowLinear` is the fused CPU kernel of ``aten.linear.default``: one instance per op
  of a blob (``Kernel.bind``). The weight of a method's linear is a program constant the
  delegate is handed on every call: the executor shows each op its weight when the first call
  starts (:meth:`RowLinear.prime`). When the blob's one-row weights add up to
  :data:`BLOCK_MIN_BYTES` or more, the first one-row call times one pass over all of them
  both ways, ATen's ``linear`` and the blocked layout, and the blob keeps the faster
  (:func:`fastest`; the blocked copies only when they beat ``linear`` by 5%). Which one wins
  depends on the CPU: on AMD EPYC (Zen 4) blocked weights streamed twice as fast as
  ``linear`` (29 decode-step linears of 16 MiB: 2.6 -> 1.0 ms), on a Xeon with AVX-512 and
  AMX they ran 1.5x slower (58 of 32 MiB: 1.30 vs 2.04 ms). A pass over the whole group, not
  each op alone: timed one op at a time, with its weight hot in L2, ``mm`` on a transposed
  copy of ``W`` beat ``linear`` by 1.3-1.7x on the Xeon, and lost inside the program. Smaller
  weights stay in the caches from call to call and run ATen's ``linear``. Anything else
  (several rows, a weight it has not seen or that changed, shapes or dtypes it does not
  block) runs ATen's ``linear``.

Results agree with ``linear`` to float rounding (each output is the same dot product, summed
in another order); which of the two ran can differ between machines and between processes
(it is chosen by timing). Imports only torch and the standard library.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["BLOCK", "BLOCKED", "BLOCK_MIN_BYTES", "LINEAR", "RowLinear", "block_weight",
           "blockable", "blocked_linear", "blocked_streams_faster", "fastest"]

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


# One-row weights a delegate streams per call from which the blocked layout is tried (measured
# at one thread on AMD EPYC, 1 MiB L2, 32 MiB shared L3: a 3-linear MLP of 2.6 MiB runs 62 us on
# ATen's linear vs 85 us blocked; 30 linears of 16 MiB, 1056 vs 761 us; 2 of 32 MiB, 1903 vs
# 1612 us). Below it the weights stay in the caches and ATen's linear runs, untimed.
BLOCK_MIN_BYTES = 8 << 20

# How a blob's one-row linears run (:class:`RowLinear`): ATen's linear on W, or bmm on W blocked
LINEAR, BLOCKED = "linear", "blocked"

# the blocked copies are kept only when they are this much faster than ATen's linear on W
KEEP_COPY_GAIN = 0.95
_TIMED_RUNS = 3  # per candidate, after one untimed run; the smallest time counts


def fastest(timings: dict[str, float]) -> str:
    """The layout to keep: the fastest, unless it is a copy (not :data:`LINEAR`) less than 5%
    faster than :data:`LINEAR`."""
    best = min(timings, key=timings.__getitem__)
    if best != LINEAR and timings[best] > KEEP_COPY_GAIN * timings[LINEAR]:
        return LINEAR
    return best


def _best_time(fn: Callable[[], Any]) -> float:
    fn()
    best = float("inf")
    for _ in range(_TIMED_RUNS):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


@functools.cache
def blocked_streams_faster() -> bool:
    """Whether one-row products over weights that stream from memory run faster on the blocked
    layout than on ATen's ``linear`` on this CPU: one pass over 16 MiB of synthetic ``[512,
    512]`` weights timed both ways, as :class:`RowLinear` times a blob's (:func:`fastest`),
    once per process (~10 ms). For weights laid out at load, before any call shows the blob's
    real ones (``quantized.DenseWeight``)."""
    count = 2 * BLOCK_MIN_BYTES // (512 * 512 * 4)
    row = torch.full((1, 512), 0.25)
    # one layout at a time (the values do not matter): 16 MiB held at once, not 32
    weights = [torch.full((512, 512), 0.5) for _ in range(count)]
    linear = _best_time(lambda: [_linear(row, w) for w in weights])
    weights.clear()
    blocked = [torch.full((512 // BLOCK, 512, BLOCK), 0.5) for _ in range(count)]
    timings = {LINEAR: linear,
               BLOCKED: _best_time(lambda: [blocked_linear(row, b) for b in blocked])}
    return fastest(timings) == BLOCKED


class RowLinear:
    """``aten.linear`` for one op of a blob (module docstring). The ops of one blob share a
    ``group`` (:meth:`join`) and its verdict: each records the bytes of the weight it sees; the
    first one-row call on a weight seen unchanged decides for the group (timing a pass over the
    group's weights both ways when they add up to at least ``min_bytes``,
    :data:`BLOCK_MIN_BYTES`; ``choose`` picks, :func:`fastest`). A call with the same row shape
    as the last one runs straight from the state (one ``linear`` or one ``bmm``: a decode step's
    linears are a third of its time, Python's part of each counts)."""

    __slots__ = ("_bytes", "_choose", "_group", "_min_bytes", "_state", "_verdict")

    def __init__(self, min_bytes: int = BLOCK_MIN_BYTES,
                 choose: Callable[[dict[str, float]], str] = fastest) -> None:
        self._min_bytes = min_bytes
        self._choose = choose
        self._group: list[RowLinear] = [self]
        self._verdict: list[str | None] = [None]  # the group's layout, shared by its ops
        self._bytes = 0  # the weight's size, from its first one-row call
        # (weight tensor, its version when seen, the layout (None: not decided yet), the
        # blocked copy (BLOCKED), the last one-row shape of x, the shape x is expanded to, the
        # result's shape); replaced whole, so concurrent calls read a consistent tuple
        self._state: tuple[Any, ...] = (None, -1, None, None, None, None, None)

    @property
    def mode(self) -> str | None:
        """How one-row calls run once decided (:data:`LINEAR`, :data:`BLOCKED`); ``None``
        before."""
        return self._state[2]

    def join(self, group: list[RowLinear]) -> None:
        """Share ``group`` (the blob's one-row linears) and its verdict; add this op to it."""
        group.append(self)
        self._group = group
        self._verdict = group[0]._verdict

    def prime(self, w: Any) -> None:
        """See ``w`` before the first call (the executor shows each op its weight when the
        delegate's first call starts): that call's one-row product then decides and lays out,
        as a second sight would, so the weights are laid out by the first call, not the
        second (a decode loop's first timed token paid ~13 ms for it)."""
        if isinstance(w, torch.Tensor) and self._state[0] is None:
            self._state = (w, w._version, None, None, None, None, None)
            self._bytes = w.numel() * w.element_size()

    def __call__(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None
                 ) -> torch.Tensor:
        seen, version, mode, blocked, x_shape, expanded, out_shape = self._state
        if w is seen and x.shape == x_shape and w._version == version:
            if mode is LINEAR:
                return _linear(x, w, bias)
            y = _bmm(x.expand(expanded), blocked).view(out_shape)
            return y if bias is None else y.add_(bias)
        return self._slow(x, w, bias)

    def _slow(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None
              ) -> torch.Tensor:
        seen, version, mode, blocked = self._state[:4]
        one_row = isinstance(x, torch.Tensor) and x.dim() >= 1 and x.numel() == x.shape[-1]
        if not one_row or not isinstance(w, torch.Tensor):
            return _linear(x, w, bias)
        if w is not seen or w._version != version:  # first sight (or changed): remember it
            self._state = (w, w._version, None, None, None, None, None)
            self._bytes = w.numel() * w.element_size()
            return _linear(x, w, bias)
        if x.dtype != torch.float32 or not blockable(w, x.shape[-1]) or (
                bias is not None and (bias.dtype != torch.float32 or bias.dim() != 1
                                      or bias.shape[0] != w.shape[0])):
            # ATen's linear, from the fast path in __call__ while the row shape and weight hold
            # (a classifier's 512 -> 10 took this branch on every call)
            self._state = (w, version, LINEAR, None, x.shape, None, None)
            return _linear(x, w, bias)
        if mode is None:  # second sight: the group's layout (decided by the first to ask)
            mode = self._verdict[0]
            if mode is None:
                mode = self._verdict[0] = self._decide()
                seen, version, _, blocked = self._state[:4]  # _decide may have blocked w
            if mode is BLOCKED and blocked is None:
                blocked = block_weight(w)
        if mode is LINEAR:
            self._state = (w, version, LINEAR, None, x.shape, None, None)
            return _linear(x, w, bias)
        blocks, k, width = blocked.shape
        if x.dim() <= 3:  # expand adds the leading dims: the fast path in __call__
            out_shape = (*x.shape[:-1], blocks * width)
            self._state = (w, version, BLOCKED, blocked, x.shape, (blocks, 1, k), out_shape)
        else:
            self._state = (w, version, BLOCKED, blocked, None, None, None)
        return blocked_linear(x, blocked, bias)

    def _decide(self) -> str:
        """The group's layout: :data:`LINEAR` under ``min_bytes``; else one pass over the
        group's blockable weights timed both ways, and the blocked copies handed to their ops
        when that wins."""
        if sum(r._bytes for r in self._group) < self._min_bytes:
            return LINEAR
        members = [r for r in self._group if r._state[2] is None and blockable(r._state[0])]
        weights = [r._state[0] for r in members]
        rows = [torch.ones(1, w.shape[1]) for w in weights]
        copies = [block_weight(w) for w in weights]
        timings = {
            LINEAR: _best_time(lambda: [_linear(x, w) for x, w in zip(rows, weights)]),
            BLOCKED: _best_time(lambda: [blocked_linear(x, b) for x, b in zip(rows, copies)]),
        }
        picked = self._choose(timings)
        mode = next((m for m in timings if m == picked), None)  # the constant itself: `is` tests
        if mode is None:
            raise ValueError(f"RowLinear: the chooser picked {picked!r}, not one of {sorted(timings)}")
        if mode is BLOCKED:
            for r, b in zip(members, copies):
                w, version = r._state[:2]
                r._state = (w, version, BLOCKED, b, None, None, None)
        return mode
