"""Static int8 linears (``onednn.qlinear_pointwise.default``) with every qparam known at load.

When the weight, its scales and zero points, and the input / output qparams of a static int8
linear are constants of the blob, :class:`StaticQLinear` is made for that op at load and called
as ``(qx, bias) -> result``; it computes what the quantized reference computes,
``quantize(post(dequantize(qx) @ dequantize(W).T + bias))``, on one of two kernels:

- **few rows** (:func:`small_product`: one row, or at most :data:`SMALL_MACS` multiply-adds):
  ``torch._int_mm(qx, W.T)`` (exact int32 sums) then one ``addcmul`` applying the per-channel
  scale, the input zero point's share and the bias, already divided by the output scale, then
  ``round``, ``clamp`` (``relu`` folded into the lower bound: ``quantize(relu(y))`` is
  ``max(quantize(y), zero_point)``) and the cast to int8. Five calls, ~10-15 us on the MLP's
  shapes, where oneDNN's ``qlinear_pointwise`` spends ~25 us per call before any arithmetic;
- **more rows**: oneDNN's ``qlinear_pointwise`` on the weight packed by the first such call
  (a one-row program never packs it: packing costs ~3 MiB of RSS once); an int8 input is fed
  as uint8, its zero point shifted by 128 (oneDNN's int8 x int8 product is a slow reference
  path).

The rule comes from timing both at one thread on AVX-512 (AMD EPYC, ``benchmarks/README.md``,
``program_bench.py --xnnpack``): at one row ``_int_mm`` wins on every shape measured (784x512:
22 vs 35 us, 1280x1000: 40 vs 58 us); at 4 rows and more it wins only while the product is
small (256x256 at 4 rows, 512x10 up to 64 rows) and loses by 10-70% on larger ones.

Results equal the reference up to float rounding (the int32 sum is exact; the scale, bias and
output scale are applied in one float32 multiply-add instead of three): an element may land one
int8 step off where the reference's value sits within float rounding of a half step.

Imports only torch and the standard library.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["SMALL_MACS", "QLinearError", "StaticQLinear", "small_product"]

SMALL_MACS = 1 << 19  # multiply-adds up to which _int_mm beats oneDNN at more than one row

_INT_MM = torch._int_mm
_ADDCMUL = torch.addcmul
_I8 = torch.int8
_TENSOR = torch.Tensor


class QLinearError(ValueError):
    """Arguments a static int8 linear refuses (the message names the argument)."""


def small_product(rows: int, n: int, k: int) -> bool:
    """Whether ``rows`` x ``k`` by ``k`` x ``n`` runs on ``_int_mm`` (module docstring)."""
    return rows == 1 or rows * n * k <= SMALL_MACS


class StaticQLinear:
    """One static int8 linear of a blob (module docstring), made at load from the op's
    arguments (:func:`.quantized._static_qlinear`, after their checks); :meth:`onednn` runs
    oneDNN's kernel on the packed weight (more rows, or an input that is not int8).

    The bias may be a delegate input (the method's constant, handed over on every call): the
    float32 shift folding it in is made the first time a bias tensor is seen and kept while the
    same tensor comes back unchanged (its version counter)."""

    __slots__ = ("_args", "_fast", "_onednn", "_out", "_pack", "_relu", "_scale", "_shift",
                 "_zp_sums", "bounds", "int8_out", "k", "n", "weight_t")

    def __init__(self, weight: torch.Tensor, w_scales: torch.Tensor, x_scale: float,
                 x_zp: int, out_scale: float, out_zp: int, out_dtype: Any, post_op: str,
                 onednn: Any, onednn_args: tuple[Any, ...], pack: Any) -> None:
        self.n, self.k = weight.shape
        self.weight_t = weight.contiguous().t()  # [K, N] view: _int_mm's fast layout
        self.int8_out = out_dtype == torch.int8
        self._relu = post_op == "relu"
        inv_out = 1.0 / out_scale if self.int8_out else 1.0
        scale = x_scale * w_scales.double() * inv_out
        self._scale = scale.float()
        # the input zero point's share of each output: x_zp * sum_k W[n, k] * scale[n]
        self._zp_sums = x_zp * weight.sum(1, dtype=torch.float64) * scale  # no float64 copy
        self._shift: tuple[Any, ...] = (None, -1, None)  # (bias seen, its version, shift)
        # the last 2-D int8 input shape that ran on _int_mm, with the _shift entry then: a call
        # with the same shape and bias skips the checks that call made (:meth:`__call__`)
        self._fast: tuple[Any, ...] = (None, None, -1, None)
        lo = max(-128, out_zp) if self._relu else -128
        self.bounds = (float(lo), 127.0)
        self._onednn = onednn
        # (x_scale, x_zp, weight, w_scales, w_zps, out_scale, ...): the weight packed for
        # oneDNN (``pack``) by the first call that runs it, replaced whole
        self._args = onednn_args
        self._pack = pack
        self._out = (inv_out, out_zp)

    def _shift_for(self, bias: Any) -> torch.Tensor:
        seen, version, shift = self._shift
        if bias is seen and (bias is None or bias._version == version):
            return shift
        if bias is not None and not (isinstance(bias, torch.Tensor) and bias.dtype ==
                                     torch.float32 and tuple(bias.shape) == (self.n,)):
            raise QLinearError(f"qlinear_pointwise: the bias must be float32 [{self.n}]")
        inv_out, out_zp = self._out
        b = torch.zeros(self.n, dtype=torch.float64) if bias is None else bias.double()
        shift = (b * inv_out - self._zp_sums + (out_zp if self.int8_out else 0)).float()
        self._shift = (bias, -1 if bias is None else bias._version, shift)
        return shift

    def __call__(self, qx: Any, bias: Any) -> torch.Tensor:
        shape, seen, version, shift = self._fast
        if (qx.__class__ is _TENSOR and qx.shape == shape and qx.dtype is _I8 and bias is seen
                and (bias is None or bias._version == version)):
            y = _ADDCMUL(shift, _INT_MM(qx, self.weight_t), self._scale)
            if self.int8_out:
                return y.round_().clamp_(*self.bounds).char()
            return y.relu_() if self._relu else y
        return self._checked(qx, bias)

    def _checked(self, qx: Any, bias: Any) -> torch.Tensor:
        if not isinstance(qx, torch.Tensor) or qx.dim() < 2 or qx.shape[-1] != self.k:
            raise QLinearError(f"qlinear_pointwise: the input must be int8 / uint8 "
                               f"[..., {self.k}]")
        rows = qx.numel() // self.k
        if qx.dtype != _I8 or not small_product(rows, self.n, self.k):
            return self.onednn(qx, bias)
        acc = _INT_MM(qx if qx.dim() == 2 else qx.reshape(rows, self.k), self.weight_t)
        shift = self._shift_for(bias)
        if qx.dim() == 2 and type(qx) is _TENSOR:
            self._fast = (qx.shape, bias, -1 if bias is None else bias._version, shift)
        y = _ADDCMUL(shift, acc, self._scale)
        if self.int8_out:
            y = y.round_().clamp_(*self.bounds).char()  # .to(int8) parses overloads: ~1 us
        elif self._relu:
            y = y.relu_()
        return y if qx.dim() == 2 else y.view(*qx.shape[:-1], self.n)

    def onednn(self, qx: Any, bias: Any) -> torch.Tensor:
        args = self._args
        if not args[2].is_mkldnn:  # packed on first use (M = 1 programs never need it)
            args = self._args = (*args[:2], self._pack(args[2]), *args[3:])
        x_scale, x_zp, packed, w_scales, w_zps, *rest = args
        return self._onednn(qx, x_scale, x_zp, packed, w_scales, w_zps, bias, *rest)
