"""The fused CPU backend's quantized kernels (entries of :data:`.kernels.KERNELS`).

- ``quantized_decomposed.*``: quantize / dequantize / choose_qparams, the same functions the
  portable runtime's out variants run (:mod:`exportir.format.quantized_ops`, imported and its
  ops registered with torch on first use);
- ``onednn.qlinear_pointwise`` (``.default``: static qparams, ``.tensor``: qparams computed at
  run time): oneDNN's int8 linear. A constant int8 weight is packed once, at load; the kernel
  checks what it is given (oneDNN reads unchecked memory when shapes disagree) and packs a
  weight that is not packed yet;
- ``onednn.qconv_pointwise`` (static qparams): oneDNN's int8 2-D convolution, int8 in and
  out, its weight packed once at load (``onednn.qconv_prepack``), checked the same way;
- ``aten._weight_int8pack_mm`` / ``aten._weight_int4pack_mm_for_cpu``: torch's weight-only
  int8 / int4 matrix products, checked the same way. Their speed depends on the activation
  dtype and the shape: for float32 activations they are 4-30x slower than the product with the
  weight dequantized, so a constant weight is dequantized at load (:class:`DenseWeight`, kept
  in the one-row layout of :mod:`.gemv`); for other dtypes (bfloat16: often faster) the packed
  kernel is timed against it (``M`` = 1 and 32 rows, best of 3, once per shape and dtype in a
  process) and the faster one runs. Results agree to float rounding.

On a CPU without VNNI, where oneDNN's uint8 x int8 products saturate, the int8 linears and
convolutions run in float32 instead (:mod:`.int8_float`).

Imports only torch and the standard library (and the fused CPU backend's :mod:`.gemv`,
:mod:`.int8_float` and :mod:`.qlinear`).
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from exportir.runtime.backends.fused_cpu.gemv import (
    block_weight,
    blockable,
    blocked_linear,
    blocked_streams_faster,
)
from exportir.runtime.backends.fused_cpu.int8_float import (
    FloatQConv,
    FloatQLinear,
    exact_int8_products,
)
from exportir.runtime.backends.fused_cpu.qlinear import StaticQLinear

__all__ = ["QUANTIZED_KERNEL_FNS", "QUANTIZED_SPECIALIZED", "DenseWeight", "library_schema", "pack_qlinear_weight"]

_LIBRARY_MODULE = "exportir.format.quantized_ops"
NAMESPACES = frozenset({"quantized_decomposed"})


def library_schema(namespace: str, packet: str, overload: str) -> Any:
    """The schema of an op of a namespace the runtime defines itself (``None`` for other
    namespaces), parsed from the library's table: the backend runs these ops' Python functions
    and reads only their arguments, so nothing is registered with torch."""
    if namespace not in NAMESPACES:
        return None
    schema = importlib.import_module(_LIBRARY_MODULE).parsed_schema(packet, overload)
    if schema is None:
        raise KeyError(f"{namespace}.{packet}.{overload}")
    return schema


class _LibraryFn:
    """The kernel ``name`` of the quantized op library, imported on first call and kept (an
    import lookup on every call cost ~3 us of a ~10 us quantize)."""

    __slots__ = ("__name__", "_fn")

    def __init__(self, name: str) -> None:
        self.__name__ = name
        self._fn: Callable[..., Any] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = self._fn
        if fn is None:
            fn = self._fn = getattr(importlib.import_module(_LIBRARY_MODULE), self.__name__)
        return fn(*args, **kwargs)


def _library_fn(name: str) -> Callable[..., Any]:
    return _LibraryFn(name)


class QuantizedKernelError(ValueError):
    """Arguments a quantized kernel refuses (they would make oneDNN read out of bounds)."""


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise QuantizedKernelError(what)


_MKLDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops, "onednn")
_QCONV_OP = torch.ops.onednn.qconv_pointwise.default if _MKLDNN and hasattr(
    torch.ops.onednn, "qconv_pointwise") else None


def _check_plain_weight(w: Any) -> None:
    _require(isinstance(w, torch.Tensor) and w.dtype == torch.int8 and w.dim() == 2
             and w.numel() > 0 and not w.is_mkldnn,
             "qlinear_pointwise: the weight must be a non-empty 2-D int8 tensor [N, K]")


def pack_qlinear_weight(w: torch.Tensor) -> torch.Tensor:
    """oneDNN's packed form of an int8 weight ``[N, K]`` (``[K, N]``, blocked)."""
    _check_plain_weight(w)
    return torch.ops.onednn.qlinear_prepack(w.contiguous(), None)


def _prepare_qlinear(args: tuple[Any, ...], constant: Callable[[Any], Any]) -> tuple[Any, ...]:
    weight = constant(args[3])
    if weight is None or not _MKLDNN:
        return args
    try:
        _check_plain_weight(weight)
    except QuantizedKernelError:
        return args  # the kernel refuses it when it runs
    if not exact_int8_products():  # oneDNN's products saturate here: float32 (.int8_float)
        scales, zps = constant(args[4]), constant(args[5])
        if scales is None or zps is None:
            return args
        return (*args[:3], FloatQLinear(weight, scales, zps), *args[4:])
    static = _static_qlinear(args, weight, constant)
    if static is not None:  # packs for oneDNN only if a call needs it
        return (*args[:3], static, *args[4:])
    try:
        packed = pack_qlinear_weight(weight)
    except (QuantizedKernelError, RuntimeError):
        return args  # the kernel refuses it when it runs
    return (*args[:3], packed, *args[4:])


def _static_qlinear(args: tuple[Any, ...], weight: torch.Tensor,
                    constant: Callable[[Any], Any]) -> StaticQLinear | None:
    """A :class:`.qlinear.StaticQLinear` for ``.default`` arguments whose weight scales and
    zero points are constants and whose qparams are literals, else None."""
    _, x_scale, x_zp, _, w_scales, w_zps, bias, out_scale, out_zp, out_dtype, post_op, \
        post_args, algorithm = args
    scales, zps = constant(w_scales), constant(w_zps)
    n = weight.shape[0]
    if scales is None or zps is None or not (type(x_scale) is float and type(x_zp) is int
                                              and type(out_scale) is float
                                              and type(out_zp) is int):
        return None
    if out_dtype == torch.int8 and not 0 < out_scale < math.inf:
        return None
    bias_value = constant(bias) if bias is not None else None
    try:
        _check_qlinear(torch.empty(1, weight.shape[1], dtype=torch.int8), weight, scales, zps,
                       bias_value, out_dtype, post_op, post_args)
    except QuantizedKernelError:
        return None  # the kernel refuses it when it runs
    if out_dtype not in (torch.int8, torch.float32) or bool(zps.any()) or (
            out_dtype == torch.float32 and (out_scale, out_zp) != (1.0, 0)):
        return None
    onednn = _qlinear(torch.ops.onednn.qlinear_pointwise.default)
    rest = (out_scale, out_zp, out_dtype, post_op, post_args, algorithm)
    return StaticQLinear(weight, scales.reshape(n), x_scale, x_zp, out_scale, out_zp,
                         out_dtype, post_op, onednn, (x_scale, x_zp, weight, scales, zps, *rest),
                         pack_qlinear_weight)


_POST_OPS = frozenset({"none", "relu"})
_OUT_DTYPES = (None, torch.float32, torch.bfloat16, torch.int8, torch.uint8)


def _check_channel_params(kernel: str, n: int, w_scales: Any, w_zps: Any, bias: Any) -> None:
    """The per-output-channel arguments of an int8 linear / convolution with ``n`` outputs."""
    for name, t in (("w_scale", w_scales), ("w_zero_point", w_zps)):
        _require(isinstance(t, torch.Tensor) and t.dim() == 1 and t.numel() == n,
                 f"{kernel}: {name} must have {n} elements")
    _require(bias is None or (isinstance(bias, torch.Tensor) and bias.numel() == n
                              and bias.dtype == torch.float32),
             f"{kernel}: the bias must be float32 with {n} elements")


def _check_qlinear(qx: Any, w: torch.Tensor, w_scales: Any, w_zps: Any, bias: Any,
                   out_dtype: Any, post_op: Any, post_args: Any) -> None:
    k, n = (w.shape[0], w.shape[1]) if w.is_mkldnn else (w.shape[1], w.shape[0])
    _require(isinstance(qx, torch.Tensor) and qx.dtype in (torch.int8, torch.uint8)
             and qx.dim() >= 2 and qx.shape[-1] == k,
             f"qlinear_pointwise: the input must be int8 / uint8 [..., {k}]")
    _check_channel_params("qlinear_pointwise", n, w_scales, w_zps, bias)
    _require(out_dtype in _OUT_DTYPES and post_op in _POST_OPS and not post_args,
             f"qlinear_pointwise: output dtype {out_dtype} / post op {post_op!r} not supported")


def _qlinear(op: Any) -> Callable[..., Any]:
    def run(qx: Any, x_scale: Any, x_zp: Any, w: Any, w_scales: Any, w_zps: Any, bias: Any,
            out_scale: float, out_zp: int, out_dtype: Any, post_op: str, post_args: Any,
            algorithm: str) -> torch.Tensor:
        if isinstance(w, FloatQLinear) or not exact_int8_products():
            return _float_qlinear(qx, x_scale, x_zp, w, w_scales, w_zps, bias, out_scale,
                                  out_zp, out_dtype, post_op, post_args)
        if not (isinstance(w, torch.Tensor) and w.is_mkldnn):
            w = pack_qlinear_weight(w)
        _check_qlinear(qx, w, w_scales, w_zps, bias, out_dtype, post_op, post_args)
        if qx.dtype == torch.int8:
            # oneDNN's int8 x int8 product is a slow reference path (~1000x slower than
            # uint8 x int8 here): shift the input and its zero point by 128, same values
            qx, x_zp = torch.bitwise_xor(qx.contiguous().view(torch.uint8), 128), x_zp + 128
        return op(qx.contiguous(), x_scale, x_zp, w, w_scales, w_zps, bias, out_scale, out_zp,
                  out_dtype, post_op, post_args, algorithm)

    return run


def _float_qlinear(qx: Any, x_scale: Any, x_zp: Any, w: Any, w_scales: Any, w_zps: Any,
                   bias: Any, out_scale: float, out_zp: int, out_dtype: Any, post_op: str,
                   post_args: Any) -> torch.Tensor:
    """``qlinear_pointwise`` where oneDNN's int8 products saturate (:mod:`.int8_float`)."""
    if not isinstance(w, FloatQLinear):
        _check_plain_weight(w)
        w = FloatQLinear(w, w_scales, w_zps)
    _check_qlinear(qx, w.weight, w_scales, w_zps, bias, out_dtype, post_op, post_args)
    return w(qx, x_scale, x_zp, bias, out_scale, out_zp, out_dtype, post_op, post_args)


class PackedConvWeight:
    """An int8 convolution weight ``[O, C / groups, kH, kW]`` in oneDNN's packed form, for the
    program's stride / padding / dilation / groups and input qparams (made at load, or None
    until a :class:`StaticQConv`'s first call packs it for its input shape). oneDNN
    runs on uint8 inputs, and the packing depends on the input's zero point as oneDNN sees it
    (an int8 input's + 128); the blob does not say whether an input is int8 or uint8, so load
    guesses from the zero point (negative: int8) and a call meeting the other packs once more
    for its own (``others``, by key; ``plain`` and ``scales`` are kept for that). A kernel
    argument, so a plain slotted class (not a tuple that argument walkers would descend into;
    not a dataclass, see :mod:`.kernels`)."""

    __slots__ = ("key", "others", "packed", "plain", "scales", "shape")

    def __init__(self, packed: torch.Tensor | None, shape: tuple[int, ...], key: tuple[Any, ...],
                 plain: torch.Tensor | None = None, scales: torch.Tensor | None = None) -> None:
        self.packed = packed
        self.shape = shape
        self.key = key
        self.plain = plain
        self.scales = scales
        self.others: dict[tuple[Any, ...], torch.Tensor] = {}

    def __repr__(self) -> str:
        return f"PackedConvWeight(shape={self.shape!r}, key={self.key!r})"

    def for_key(self, key: tuple[Any, ...]) -> torch.Tensor | None:
        """The packed weight for the call's ``key`` (packed now when first met), or None."""
        if key == self.key:
            if self.packed is None and self.plain is not None:  # not packed at load
                self.packed = _pack_qconv(self.plain, self.scales, *key).packed
            return self.packed
        packed = self.others.get(key)
        if packed is None and self.plain is not None:
            packed = _pack_qconv(self.plain, self.scales, *key[:2], *key[2:]).packed
            self.others[key] = packed
        return packed


def _check_qconv(qx: Any, w: Any, w_scales: Any, w_zps: Any, bias: Any, stride: Any,
                 padding: Any, dilation: Any, groups: Any, out_dtype: Any, post_op: Any,
                 post_args: Any) -> None:
    shape = w.shape if isinstance(w, PackedConvWeight) else getattr(w, "shape", ())
    _require(isinstance(w, PackedConvWeight) or (
        isinstance(w, torch.Tensor) and w.dtype == torch.int8 and not w.is_mkldnn),
        "qconv_pointwise: the weight must be an int8 tensor [O, C / groups, kH, kW]")
    _require(len(shape) == 4 and all(d > 0 for d in shape) and isinstance(groups, int)
             and groups > 0 and shape[0] % groups == 0,
             f"qconv_pointwise: weight shape {list(shape)} / groups {groups} do not fit")
    o, c = shape[0], shape[1] * groups
    _require(isinstance(qx, torch.Tensor) and qx.dtype in (torch.int8, torch.uint8)
             and qx.dim() == 4 and qx.shape[1] == c and qx.numel() > 0,
             f"qconv_pointwise: the input must be int8 / uint8 [N, {c}, H, W]")
    for name, p, least in (("stride", stride, 1), ("padding", padding, 0),
                           ("dilation", dilation, 1)):
        _require(isinstance(p, (list, tuple)) and len(p) == 2
                 and all(isinstance(v, int) and v >= least for v in p),
                 f"qconv_pointwise: {name} must be two ints >= {least}")
    for k in range(2):
        span = dilation[k] * (shape[2 + k] - 1) + 1
        _require(qx.shape[2 + k] + 2 * padding[k] >= span,
                 f"qconv_pointwise: the input {list(qx.shape)} is smaller than the kernel")
    _check_channel_params("qconv_pointwise", o, w_scales, w_zps, bias)
    clamp = post_op == "hardtanh" and isinstance(post_args, (list, tuple)) and len(
        post_args) == 2 and all(isinstance(v, (int, float)) for v in post_args)
    _require(out_dtype in _OUT_DTYPES and (clamp or (post_op in _POST_OPS and not post_args)),
             f"qconv_pointwise: output dtype {out_dtype} / post op {post_op!r} "
             f"{list(post_args or [])} not supported (none, relu, hardtanh [min, max])")


def _qconv_key(x_scale: float, x_zp: int, stride: Any, padding: Any, dilation: Any,
               groups: int) -> tuple[Any, ...]:
    return (float(x_scale), int(x_zp), tuple(stride), tuple(padding), tuple(dilation), groups)


def _pack_qconv(w: torch.Tensor, w_scales: torch.Tensor, x_scale: float, x_zp: int,
                stride: Any, padding: Any, dilation: Any, groups: int,
                x_shape: Sequence[int] | None = None) -> PackedConvWeight:
    """oneDNN's packed form of ``w``; with the input's ``x_shape`` it is the layout the
    convolution of that shape reads as it is (packed without it, oneDNN picks a layout for a
    guessed shape and reorders the weight on every call whose shape wants another one: up to
    2x a convolution's time, 96 -> 576 channels at 14x14 196 vs 94 us)."""
    key = _qconv_key(x_scale, x_zp, stride, padding, dilation, groups)
    packed = torch.ops.onednn.qconv_prepack(w.contiguous(), w_scales.float(), key[0], key[1],
                                            list(stride), list(padding), list(dilation), groups,
                                            None if x_shape is None else list(x_shape))
    return PackedConvWeight(packed, tuple(w.shape), key)


def _qconv(qx: Any, x_scale: Any, x_zp: Any, w: Any, w_scales: Any, w_zps: Any, bias: Any,
           stride: Any, padding: Any, dilation: Any, groups: Any, out_scale: float, out_zp: int,
           out_dtype: Any, post_op: str, post_args: Any, algorithm: str) -> torch.Tensor:
    if isinstance(w, FloatQConv) or not exact_int8_products():
        # oneDNN's int8 products saturate here: float32 (.int8_float)
        plain = w.weight if isinstance(w, FloatQConv) else getattr(w, "plain", w)
        _check_qconv(qx, plain, w_scales, w_zps, bias, stride, padding, dilation, groups,
                     out_dtype, post_op, post_args)
        if not isinstance(w, FloatQConv):
            w = FloatQConv(plain, w_scales, w_zps, groups)
        return w(qx, x_scale, x_zp, bias, stride, padding, dilation, out_scale, out_zp,
                 out_dtype, post_op, post_args)
    _check_qconv(qx, w, w_scales, w_zps, bias, stride, padding, dilation, groups, out_dtype,
                 post_op, post_args)
    # oneDNN computes in NHWC: results stay channels_last (the next int8 convolution reads them
    # as they are), inputs are made so; an int8 input is fed as uint8 (_qlinear)
    qx = qx.contiguous(memory_format=torch.channels_last)
    if qx.dtype == torch.int8:
        qx, x_zp = torch.bitwise_xor(qx.view(torch.uint8), 128), x_zp + 128
    key = (float(x_scale), int(x_zp), tuple(stride), tuple(padding), tuple(dilation), groups)
    if not isinstance(w, PackedConvWeight):
        w = _pack_qconv(w, w_scales, x_scale, x_zp, stride, padding, dilation, groups)
    packed = w.for_key(key) if w.key[2:] == key[2:] else None
    _require(packed is not None, "qconv_pointwise: the weight was packed for other input "
             "qparams or geometry than the call's")
    return torch.ops.onednn.qconv_pointwise.default(
        qx, x_scale, x_zp, packed, w_scales, w_zps, bias, list(stride), list(padding),
        list(dilation), groups, out_scale, out_zp, out_dtype, post_op, post_args, algorithm or "")


def _prepare_qconv(args: tuple[Any, ...], constant: Callable[[Any], Any]) -> tuple[Any, ...]:
    weight, scales = constant(args[3]), constant(args[4])
    if weight is None or scales is None or not _MKLDNN or not isinstance(args[1], float):
        return args
    # the kernel feeds an int8 input as uint8, zero point + 128 (_qconv): a negative zero
    # point is an int8 input's (PackedConvWeight)
    x_zp = args[2] + 128 if type(args[2]) is int and args[2] < 0 else args[2]
    static = type(args[2]) is int and isinstance(args[11], float) and type(args[12]) is int
    try:
        _check_qconv(torch.empty(1, weight.shape[1] * args[10], *[
            d * (k - 1) + 1 for d, k in zip(args[9], weight.shape[2:])], dtype=torch.int8),
            weight, scales, constant(args[5]), None, *args[7:11], *args[13:16])
        if not exact_int8_products():  # oneDNN's products saturate here: float32 (.int8_float)
            zps = constant(args[5])
            if zps is None:
                return args
            return (*args[:3], FloatQConv(weight.contiguous(), scales, zps, args[10]), *args[4:])
        # a StaticQConv packs by its first call, for the input's shape: not here too
        packed = None if static else _pack_qconv(weight, scales, args[1], x_zp,
                                                 *args[7:11]).packed
    except (QuantizedKernelError, RuntimeError, TypeError, IndexError):
        return args  # the kernel refuses it when it runs
    packed = PackedConvWeight(packed, tuple(weight.shape), _qconv_key(args[1], x_zp, *args[7:11]),
                              weight.contiguous(), scales.float())
    args = (*args[:3], packed, *args[4:])
    if not static:
        return args
    return (*args[:3], StaticQConv(args, scales, constant(args[5])), *args[4:])


class StaticQConv:
    """``onednn.qconv_pointwise.default`` for one op whose weight, qparams and geometry are
    constants, checked once at load (:func:`_prepare_qconv`): called as ``(qx, bias)``, it
    checks only what changes between calls (the input's dtype and size, a bias handed in) and
    calls oneDNN with arguments built at load; ``_qconv`` spent ~18 us per call re-checking
    and rebuilding them (a MobileNetV2 runs 52). The weight is packed by the first call, for
    its input shape (:func:`_pack_qconv`; the blob does not hold value shapes, so load cannot);
    calls of other shapes (a dynamic-shape program) use that one too (oneDNN reorders it when
    it must; packing per shape would repack on every call of alternating shapes)."""

    __slots__ = ("_args", "_bias", "_c", "_least", "_n", "_sized", "_x_zp", "weight")

    def __init__(self, args: tuple[Any, ...], scales: torch.Tensor, zps: torch.Tensor) -> None:
        (_, x_scale, x_zp, weight, _, _, _, stride, padding, dilation, groups, out_scale, out_zp,
         out_dtype, post_op, post_args, algorithm) = args
        self.weight: PackedConvWeight = weight
        self._x_zp = x_zp
        self._n, self._c = weight.shape[0], weight.shape[1] * groups
        self._least = tuple(d * (k - 1) + 1 - 2 * p
                            for d, k, p in zip(dilation, weight.shape[2:], padding))
        self._args = (x_scale, scales, zps, list(stride), list(padding), list(dilation), groups,
                      out_scale, out_zp, out_dtype, post_op, post_args, algorithm or "")
        self._bias: tuple[Any, Any] = (None, None)  # the last bias checked, its version
        # (input zero point as fed, input shape, the weight packed for them); replaced whole,
        # so concurrent calls read a consistent tuple
        self._sized: tuple[Any, Any, Any] = (None, None, None)

    def __call__(self, qx: Any, bias: Any) -> torch.Tensor:
        if not (isinstance(qx, torch.Tensor) and qx.dim() == 4 and qx.shape[1] == self._c
                and qx.shape[0] > 0 and qx.shape[2] >= self._least[0]
                and qx.shape[3] >= self._least[1] and qx.dtype in (torch.uint8, torch.int8)):
            raise QuantizedKernelError(
                f"qconv_pointwise: the input must be int8 / uint8 [N, {self._c}, H, W] at least "
                f"as large as the kernel; got {getattr(qx, 'dtype', None)} "
                f"{list(getattr(qx, 'shape', []))}")
        seen = self._bias
        if bias is not seen[0] or (bias is not None and bias._version != seen[1]):
            _require(bias is None or (isinstance(bias, torch.Tensor) and bias.numel() == self._n
                                      and bias.dtype == torch.float32),
                     f"qconv_pointwise: the bias must be float32 with {self._n} elements")
            self._bias = (bias, None if bias is None else bias._version)
        x_scale, scales, zps, stride, padding, dilation, groups, *rest = self._args
        qx = qx.contiguous(memory_format=torch.channels_last)
        x_zp = self._x_zp
        if qx.dtype == torch.int8:  # fed as uint8 (_qconv)
            qx, x_zp = torch.bitwise_xor(qx.view(torch.uint8), 128), x_zp + 128
        sized_zp, sized_shape, packed = self._sized
        if x_zp != sized_zp or qx.shape != sized_shape:
            packed = self._pack_for(x_zp, qx.shape)
        return _QCONV_OP(qx, x_scale, x_zp, packed, scales, zps, bias, stride, padding,
                         dilation, groups, *rest)


    def _pack_for(self, x_zp: int, shape: torch.Size) -> torch.Tensor:
        w = self.weight
        if self._sized[0] is not None or w.plain is None:  # packed for a shape already
            return w.packed if x_zp == w.key[1] else w.for_key((w.key[0], x_zp, *w.key[2:]))
        try:
            packed = _pack_qconv(w.plain, w.scales, w.key[0], x_zp, *w.key[2:],
                                 x_shape=shape).packed
        except RuntimeError:  # oneDNN refuses the shape: the convolution reports it
            return w.packed if x_zp == w.key[1] else w.for_key((w.key[0], x_zp, *w.key[2:]))
        if x_zp == w.key[1]:  # the weight's packing for its own key from now on
            w.packed = packed
        self._sized = (x_zp, shape, packed)
        return packed


class DenseWeight:
    """A weight-only kernel's weight, dequantized at load because ``linear`` on it was
    measured faster than the packed kernel (module docstring): ``weight`` is ``[N, K]``, or
    None when only its blocked layout is kept (``blocked``, :func:`.gemv.block_weight`), which
    :meth:`of` does where one-row products (a decode step's) stream blocked weights faster than
    ATen's ``linear`` on this CPU (:func:`.gemv.blocked_streams_faster`: twice as fast on AMD
    EPYC, 8% slower on a Xeon with AVX-512 in the mini Llama's int8 decode). A kernel argument,
    so a plain slotted class (as :class:`PackedConvWeight`)."""

    __slots__ = ("blocked", "weight")

    def __init__(self, weight: torch.Tensor | None, blocked: torch.Tensor | None = None) -> None:
        self.weight = weight
        self.blocked = blocked

    def __repr__(self) -> str:
        held = self.weight if self.weight is not None else self.blocked
        return f"DenseWeight({'blocked ' if self.weight is None else ''}{list(held.shape)})"

    @classmethod
    def of(cls, dense: torch.Tensor) -> DenseWeight:
        if blockable(dense) and blocked_streams_faster():
            return cls(None, block_weight(dense))
        return cls(dense)

    @property
    def in_features(self) -> int:
        return self.weight.shape[1] if self.weight is not None else self.blocked.shape[1]

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        if self.blocked is not None:
            return blocked_linear(x, self.blocked.to(x.dtype))
        return torch.nn.functional.linear(x, self.weight.to(x.dtype))


# (kernel, activation dtype, N, K) -> whether linear on the dequantized weight is faster
_DENSE_FASTER: dict[tuple[str, torch.dtype, int, int], bool] = {}
_TIMED_ROWS = (1, 32)


_TIMED_RUNS = 3  # the best of: one run is at the mercy of the scheduler on a busy machine


def _seconds(fn: Callable[[torch.Tensor], Any], x: torch.Tensor) -> float:
    fn(x)  # warm-up: first calls allocate and pick kernels
    best = float("inf")
    for _ in range(_TIMED_RUNS):
        start = time.perf_counter()
        fn(x)
        best = min(best, time.perf_counter() - start)
    return best


def _dense_is_faster(key: tuple[str, torch.dtype, int, int], packed: Callable[..., Any],
                     dense: torch.Tensor) -> bool:
    """Whether the dequantized weight, as :meth:`DenseWeight.of` keeps it, multiplies faster
    than the packed kernel: always for float32 activations (torch's kernels have no fast path
    for them: 4-30x slower than the dense product on one row or 32, measured on AVX-512, and a
    load-time timing on a busy machine is noise), else timed once per key in a process."""
    if key[1] == torch.float32:
        return True
    if key not in _DENSE_FASTER:
        _, dtype, _, k = key
        xs = [torch.randn(m, k).to(dtype) for m in _TIMED_ROWS]
        held = DenseWeight.of(dense)
        with torch.no_grad():
            t_packed = sum(_seconds(packed, x) for x in xs)
            t_dense = sum(_seconds(held.linear, x) for x in xs)
        _DENSE_FASTER[key] = t_dense < t_packed
    return _DENSE_FASTER[key]


def _int8pack_mm(x: Any, w: Any, scales: Any) -> torch.Tensor:
    if isinstance(w, DenseWeight):
        _require(isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[1] == w.in_features,
                 "_weight_int8pack_mm: needs x [M, K] for an int8 weight [N, K]")
        return w.linear(x)
    _require(isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.dim() == 2
             and w.dim() == 2 and w.dtype == torch.int8 and x.shape[1] == w.shape[1]
             and isinstance(scales, torch.Tensor) and scales.numel() == w.shape[0],
             "_weight_int8pack_mm: needs x [M, K], an int8 weight [N, K] and N scales")
    return torch.ops.aten._weight_int8pack_mm.default(x.contiguous(), w, scales)


def _prepare_int8pack(args: tuple[Any, ...], constant: Callable[[Any], Any]) -> tuple[Any, ...]:
    w, scales = constant(args[1]), constant(args[2])
    if w is None or scales is None or w.dim() != 2 or scales.numel() != w.shape[0]:
        return args
    dense = (w.float() * scales.float().reshape(-1, 1)).to(scales.dtype)
    key = ("int8", scales.dtype, w.shape[0], w.shape[1])
    try:
        faster = _dense_is_faster(key, lambda x: _int8pack_mm(x, w, scales), dense)
    except (QuantizedKernelError, RuntimeError):
        return args  # the kernel refuses these arguments when it runs
    return (args[0], DenseWeight.of(dense), *args[2:]) if faster else args


def _int4pack_mm(x: Any, w: Any, group_size: int, scales_zeros: Any) -> torch.Tensor:
    if isinstance(w, DenseWeight):
        _require(isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[1] == w.in_features,
                 "_weight_int4pack_mm_for_cpu: needs x [M, K] for a weight [N, K]")
        return w.linear(x)
    ok = (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.dim() == 2
          and w.dim() == 2 and w.dtype == torch.uint8 and isinstance(scales_zeros, torch.Tensor)
          and type(group_size) is int and group_size > 0 and x.shape[1] == w.shape[1] * 2
          and x.shape[1] % group_size == 0 and scales_zeros.dim() == 3
          and tuple(scales_zeros.shape) == (x.shape[1] // group_size, w.shape[0], 2))
    _require(ok, "_weight_int4pack_mm_for_cpu: needs x [M, K], a packed weight [N, K / 2] and "
                 "scales_and_zeros [K / group_size, N, 2]")
    return torch.ops.aten._weight_int4pack_mm_for_cpu.default(x.contiguous(), w, group_size,
                                                               scales_zeros)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([packed & 15, packed >> 4], -1).reshape(-1).to(torch.int64)


def _unpack_int4(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The int4 values ``[N, K]`` of a weight ``_convert_weight_to_int4pack_for_cpu`` packed.
    The packed layout is the kernel's own (blocked per CPU); it is read back by packing probes
    whose values spell each element's row and column in base 16."""
    rows = torch.arange(n, dtype=torch.int32)[:, None].expand(n, k)
    cols = torch.arange(k, dtype=torch.int32)[None, :].expand(n, k)
    row_of = torch.zeros(n * k, dtype=torch.int64)
    col_of = torch.zeros(n * k, dtype=torch.int64)
    for digit in range(max(n, k).bit_length() // 4 + 1):
        for index, source in ((row_of, rows), (col_of, cols)):
            probe = ((source >> (4 * digit)) & 15).contiguous()
            index += _nibbles(torch.ops.aten._convert_weight_to_int4pack_for_cpu(probe, 1)) << (
                4 * digit)
    values = torch.zeros(n, k, dtype=torch.int64)
    values[row_of, col_of] = _nibbles(packed)
    return values


def _prepare_int4pack(args: tuple[Any, ...], constant: Callable[[Any], Any]) -> tuple[Any, ...]:
    w, group, scales_zeros = constant(args[1]), args[2], constant(args[3])
    if w is None or scales_zeros is None or w.dim() != 2 or type(group) is not int or group < 1:
        return args
    n, k = w.shape[0], w.shape[1] * 2
    dtype = scales_zeros.dtype
    try:
        stand_in = torch.randn(n, k).to(dtype)  # only the timing: any values will do
        if not _dense_is_faster(("int4", dtype, n, k),
                                lambda x: _int4pack_mm(x, w, group, scales_zeros), stand_in):
            return args
        q = _unpack_int4(w, n, k).float()
        sz = scales_zeros.float().repeat_interleave(group, 0)  # [K, N, 2]
        dense = ((q - 8) * sz[..., 0].t() + sz[..., 1].t()).to(dtype)
    except (QuantizedKernelError, RuntimeError, IndexError):
        return args  # the kernel refuses these arguments when it runs
    return (args[0], DenseWeight.of(dense), *args[2:])


class _PerTensor:
    """``quantize_per_tensor`` / ``dequantize_per_tensor`` of one op with literal qparams,
    called with the tensor alone: the library function's arithmetic, in place on the one new
    tensor it makes (float32 in, or int8 / uint8 out to float32; anything else runs the library
    function). Results are identical to it: the scale and zero point are float32 0-dim tensors
    made at load (a Python number is wrapped into a tensor on every call, ~1.5 us, and float32
    arithmetic rounds it to float32 anyway); the casts are ``Tensor.char`` / ``byte`` /
    ``float`` (``Tensor.to`` parses its overloads: ~1 us more)."""

    __slots__ = ("_args", "_cast", "_dequantize", "_dtype", "_library", "_lo_hi", "_scale",
                 "_zp")

    def __init__(self, dequantize: bool, args: tuple[Any, ...]) -> None:
        _, scale, zp, qmin, qmax, dtype = args
        self._dequantize = dequantize
        self._args = args[1:]
        self._library = _LibraryFn("dequantize_per_tensor" if dequantize else
                                   "quantize_per_tensor")
        factor = scale if dequantize else 1.0 / scale  # as the library computes it
        self._scale = torch.tensor(factor, dtype=torch.float32)
        self._zp = torch.tensor(float(zp)) if zp else None
        self._lo_hi = (qmin, qmax)
        self._dtype = dtype
        self._cast = torch.Tensor.char if dtype == torch.int8 else torch.Tensor.byte

    def __call__(self, x: Any) -> torch.Tensor:
        if self._dequantize:
            if not isinstance(x, torch.Tensor) or x.dtype != self._dtype:
                return self._library(x, *self._args)
            y = x.float()
            return (y if self._zp is None else y.sub_(self._zp)).mul_(self._scale)
        if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
            return self._library(x, *self._args)
        y = x.mul(self._scale).round_()
        return self._cast((y if self._zp is None else y.add_(self._zp)).clamp_(*self._lo_hi))


def _per_tensor(dequantize: bool) -> Callable[..., Any]:
    def specialize(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        scale, zp, qmin, qmax, dtype = args[1:6]
        out = kwargs.get("out_dtype")
        if (kwargs and (not dequantize or out not in (None, torch.float32) or len(kwargs) > 1)
                or type(scale) is not float or not 0 < scale < math.inf
                or type(zp) is not int or dtype not in (torch.int8, torch.uint8)
                or type(qmin) is not int or type(qmax) is not int):
            return None
        try:
            importlib.import_module(_LIBRARY_MODULE)._check_bounds(qmin, qmax, dtype)
        except ValueError:
            return None  # the library refuses it when it runs
        return _PerTensor(dequantize, args), (args[0],)

    return specialize


def _static_qconv_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if isinstance(args[3], StaticQConv):
        return args[3], (args[0], args[6])
    return None


def _static_qlinear_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if isinstance(args[3], StaticQLinear):
        return args[3], (args[0], args[6])
    return None


# name -> specialize(args, kwargs): ``(callable, its arguments)`` for an op whose constant
# arguments let it run on a kernel made for it at load, else None (the table's kernel runs)
QUANTIZED_SPECIALIZED: dict[str, Callable[..., Any]] = {
    "quantized_decomposed.quantize_per_tensor.default": _per_tensor(False),
    "quantized_decomposed.dequantize_per_tensor.default": _per_tensor(True),
    "onednn.qlinear_pointwise.default": _static_qlinear_call,
    "onednn.qconv_pointwise.default": _static_qconv_call,
}

# name -> (kernel, prepare)
QUANTIZED_KERNEL_FNS: dict[str, tuple[Callable[..., Any], Any]] = {
    "quantized_decomposed.quantize_per_tensor.default": (_library_fn("quantize_per_tensor"), None),
    "quantized_decomposed.quantize_per_tensor.tensor": (
        _library_fn("quantize_per_tensor_tensor"), None),
    "quantized_decomposed.dequantize_per_tensor.default": (
        _library_fn("dequantize_per_tensor"), None),
    "quantized_decomposed.dequantize_per_tensor.tensor": (
        _library_fn("dequantize_per_tensor_tensor"), None),
    "quantized_decomposed.choose_qparams.tensor": (_library_fn("choose_qparams"), None),
    "quantized_decomposed.quantize_per_channel.default": (
        _library_fn("quantize_per_channel"), None),
    "quantized_decomposed.dequantize_per_channel.default": (
        _library_fn("dequantize_per_channel"), None),
    "quantized_decomposed.dequantize_per_channel_group.default": (
        _library_fn("dequantize_per_channel_group"), None),
    "aten._weight_int8pack_mm.default": (_int8pack_mm, _prepare_int8pack),
    "aten._weight_int4pack_mm_for_cpu.default": (_int4pack_mm, _prepare_int4pack),
}
if _MKLDNN and hasattr(torch.ops.onednn, "qlinear_pointwise"):
    QUANTIZED_KERNEL_FNS["onednn.qlinear_pointwise.default"] = (
        _qlinear(torch.ops.onednn.qlinear_pointwise.default), _prepare_qlinear)
    QUANTIZED_KERNEL_FNS["onednn.qlinear_pointwise.tensor"] = (
        _qlinear(torch.ops.onednn.qlinear_pointwise.tensor), _prepare_qlinear)
if _MKLDNN and hasattr(torch.ops.onednn, "qconv_pointwise"):
    QUANTIZED_KERNEL_FNS["onednn.qconv_pointwise.default"] = (_qconv, _prepare_qconv)
