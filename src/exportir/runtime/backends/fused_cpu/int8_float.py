"""int8 linears and convolutions in float32, for CPUs whose int8 products saturate.

oneDNN's ``qlinear_pointwise`` / ``qconv_pointwise`` and fbgemm's dynamic linear multiply
uint8 activations by int8 weights. Without VNNI (AVX2, AVX-512 without VNNI) both do it with
``vpmaddubsw``, which adds each pair of products into a 16-bit integer *with saturation*: a pair
above 32767 (``255 * 127 * 2`` is 64770) is clipped, and results are silently wrong by up to
tens of int8 steps (measured on an AVX2 AMD EPYC: 84-103 steps on random weights). torch's
``_int_mm`` is exact there but runs a scalar reference loop (~35x a float32 product of the same
shape). :func:`exact_int8_products` tells which case this CPU is; where products saturate, the
fused CPU backend computes these ops with the functions here instead: the weight dequantized
once at load, the activation dequantized per call (``(q - zero_point) * scale``, the reference's
own formula), a float32 ``linear`` / ``conv2d``, then the post op and, for an int8 result,
``quantize`` as the reference does (``round(y * (1 / scale)) + zero_point``, clamped). Results
equal the quantized reference up to float rounding (an element may land one int8 step off where
the reference's value sits within rounding of a half step).

Imports only torch and the standard library.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["FloatQConv", "FloatQLinear", "dequantized_weight", "exact_int8_products",
           "quantize_result"]

_QRANGE = {torch.int8: (-128, 127), torch.uint8: (0, 255)}


@functools.cache
def exact_int8_products() -> bool:
    """Whether oneDNN's and fbgemm's uint8 x int8 kernels sum their products exactly on this
    CPU: with AVX-512 VNNI (``vpdpbusd`` adds in 32 bits) or AMX. Decided once per process;
    a program compiled on one machine decides again where it is loaded."""
    caps = torch.backends.cpu.get_cpu_capability()
    if caps not in ("AVX512", "AVX2"):  # not x86: oneDNN / fbgemm int8 kernels are not ours
        return False
    return bool(torch.cpu._is_vnni_supported() or torch.cpu._is_amx_tile_supported())


def dequantized_weight(w: torch.Tensor, w_scales: torch.Tensor, w_zps: Any) -> torch.Tensor:
    """``(w - zero_point) * scale`` per output channel (dim 0), float32, as the reference's
    ``dequantize_per_channel`` computes it."""
    view = (-1,) + (1,) * (w.dim() - 1)
    wf = w.float()
    if w_zps is not None and bool(torch.as_tensor(w_zps).any()):
        wf = wf - torch.as_tensor(w_zps).reshape(view).float()
    return wf * w_scales.float().reshape(view)


def quantize_result(y: torch.Tensor, out_scale: float, out_zp: int,
                    dtype: torch.dtype) -> torch.Tensor:
    """``y`` quantized as ``quantized_decomposed.quantize_per_tensor`` quantizes it."""
    lo, hi = _QRANGE[dtype]
    return (torch.round(y * (1.0 / out_scale)) + out_zp).clamp_(lo, hi).to(dtype)


def _dequantize_input(qx: torch.Tensor, x_scale: Any, x_zp: Any) -> torch.Tensor:
    scale = float(x_scale) if not isinstance(x_scale, torch.Tensor) else float(x_scale.item())
    zp = int(x_zp) if not isinstance(x_zp, torch.Tensor) else int(x_zp.item())
    return (qx.float() - zp) * scale


def _finish(y: torch.Tensor, qx_dtype: torch.dtype, out_scale: float, out_zp: int,
            out_dtype: Any, post_op: str, post_args: Any) -> torch.Tensor:
    if post_op == "relu":
        y = y.relu_()
    elif post_op == "hardtanh":
        y = y.clamp_(float(post_args[0]), float(post_args[1]))
    dtype = qx_dtype if out_dtype is None else out_dtype
    if dtype in _QRANGE:
        return quantize_result(y, out_scale, out_zp, dtype)
    return y if dtype == torch.float32 else y.to(dtype)


class FloatQLinear:
    """``onednn.qlinear_pointwise`` (either overload) in float32 (module docstring), its weight
    dequantized at the first call and kept. A kernel argument, so a plain slotted class."""

    __slots__ = ("_dense", "n", "w_scales", "w_zps", "weight")

    def __init__(self, weight: torch.Tensor, w_scales: torch.Tensor, w_zps: Any) -> None:
        self.weight, self.w_scales, self.w_zps = weight, w_scales, w_zps
        self.n = weight.shape[0]
        self._dense: torch.Tensor | None = None

    def __repr__(self) -> str:
        return f"FloatQLinear(n={self.n}, k={self.weight.shape[1]})"

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    def dense(self) -> torch.Tensor:
        dense = self._dense
        if dense is None:
            dense = self._dense = dequantized_weight(self.weight, self.w_scales, self.w_zps)
        return dense

    def __call__(self, qx: torch.Tensor, x_scale: Any, x_zp: Any, bias: Any, out_scale: float,
                 out_zp: int, out_dtype: Any, post_op: str, post_args: Any) -> torch.Tensor:
        y = torch.nn.functional.linear(_dequantize_input(qx, x_scale, x_zp), self.dense(), bias)
        return _finish(y, qx.dtype, out_scale, out_zp, out_dtype, post_op, post_args)


class FloatQConv:
    """``onednn.qconv_pointwise.default`` in float32 (module docstring): the dequantized
    weight made at the first call and kept; results channels-last, as oneDNN's are."""

    __slots__ = ("_dense", "groups", "w_scales", "w_zps", "weight")

    def __init__(self, weight: torch.Tensor, w_scales: torch.Tensor, w_zps: Any,
                 groups: int) -> None:
        self.weight, self.w_scales, self.w_zps, self.groups = weight, w_scales, w_zps, groups
        self._dense: torch.Tensor | None = None

    def __call__(self, qx: torch.Tensor, x_scale: Any, x_zp: Any, bias: Any, stride: Any,
                 padding: Any, dilation: Any, out_scale: float, out_zp: int, out_dtype: Any,
                 post_op: str, post_args: Any) -> torch.Tensor:
        dense = self._dense
        if dense is None:
            dense = dequantized_weight(self.weight, self.w_scales, self.w_zps)
            dense = self._dense = dense.contiguous(memory_format=torch.channels_last)
        x = _dequantize_input(qx.contiguous(memory_format=torch.channels_last), x_scale, x_zp)
        y = torch.nn.functional.conv2d(x, dense, bias, list(stride), list(padding),
                                       list(dilation), self.groups)
        y = _finish(y, qx.dtype, out_scale, out_zp, out_dtype, post_op, post_args)
        return y.contiguous(memory_format=torch.channels_last)

