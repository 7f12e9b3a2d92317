"""Dynamically quantized int8 linears on fbgemm: ``fused_cpu.linear_dynamic_int8``.

The op computes, for a float32 input ``x [..., K]``, what the PT2E dynamic pattern
``linear(dequantize(quantize(x, *choose_qparams(x, -128, 127, eps, int8))), dequantize(W8), b)``
computes (followed by ``relu`` when ``post_op`` is ``"relu"``): int8 activations affine over each
call's own range, int8 weights symmetric per output channel.

The activation's scale and zero point are chosen here exactly as
``quantized_decomposed.choose_qparams.tensor`` chooses them (float32 arithmetic, ties to even),
and fbgemm's ``quantized.linear_with_input_q_dq_qweight_dq_output_fp32`` (weight packed once,
at load) quantizes with them and multiplies in int8 with int32 sums: results agree with the
pattern's to float rounding. One call costs about what torch's own ``linear_dynamic`` costs
(which chooses its qparams by another rule), 3-10x less than ``choose_qparams`` + ``quantize`` +
oneDNN's qlinear as three ops.

The compile side picks this kernel only where torch has fbgemm (x86 builds). A program holding
it still runs where fbgemm is missing (another machine, a torch without quantized tensors), or
with a weight that is no constant: the same math then runs in float32 (quantize-dequantize of
``x``, ``linear`` on the dequantized weight), equal to the pattern bit for bit. So it does on a
CPU without VNNI, where fbgemm's uint8 x int8 products saturate (:mod:`.int8_float`): there the
weight is dequantized once, at load (:class:`DenseDynamicWeight`).

Imports only torch, the standard library and :mod:`.int8_float`.
"""

from __future__ import annotations

import math
import struct
import warnings
from collections.abc import Callable
from typing import Any

import torch

from exportir.runtime.backends.fused_cpu.int8_float import exact_int8_products

__all__ = ["DYNAMIC_INT8_KERNELS", "DYNAMIC_INT8_SCHEMAS", "DYNAMIC_INT8_SPECIALIZED",
           "LINEAR_DYNAMIC_INT8", "DenseDynamicWeight", "DynamicInt8Error", "DynamicRowLinear",
           "fbgemm_available"]

LINEAR_DYNAMIC_INT8 = "fused_cpu.linear_dynamic_int8.default"
DYNAMIC_INT8_SCHEMAS = {
    LINEAR_DYNAMIC_INT8: "fused_cpu::linear_dynamic_int8(Tensor x, Tensor weight, "
    "Tensor w_scales, Tensor? bias, float eps, str post_op) -> Tensor",
}
_QMIN, _QMAX = -128, 127  # the int8 activation range the pattern quantizes to
_AMINMAX = torch.aminmax
_QUANTIZED = getattr(torch.ops, "quantized", None)
_FBGEMM = getattr(_QUANTIZED, "linear_with_input_q_dq_qweight_dq_output_fp32", None)
_FBGEMM_RELU = getattr(_QUANTIZED, "linear_with_input_q_dq_qweight_dq_relu_output_fp32", None)
_POST_OPS = ("none", "relu")


class DynamicInt8Error(ValueError):
    """Arguments ``linear_dynamic_int8`` refuses (fbgemm would read out of bounds)."""


def _fail(what: str) -> None:
    raise DynamicInt8Error(f"linear_dynamic_int8: {what}")


def fbgemm_available() -> bool:
    """Whether this torch has fbgemm's quantized linears (x86 builds)."""
    return ("fbgemm" in torch.backends.quantized.supported_engines
            and hasattr(torch.ops.quantized, "linear_with_input_q_dq_qweight_dq_output_fp32"))


def _fbgemm_engine() -> bool:
    """Whether packing now gives fbgemm's form (the engine is process state a user can set)."""
    return torch.backends.quantized.engine in ("x86", "fbgemm")


class PackedDynamicLinear:
    """An int8 weight ``[N, K]`` with its scales and bias, packed for fbgemm at load. A kernel
    argument, so a plain slotted class (not a tuple that argument walkers would descend into;
    not a dataclass: see :mod:`.kernels`)."""

    __slots__ = ("has_bias", "k", "n", "packed", "scales")

    def __init__(self, packed: Any, n: int, k: int, has_bias: bool, scales: torch.Tensor
                 ) -> None:
        self.packed = packed
        self.n, self.k = n, k
        self.has_bias = has_bias  # packed with the weight (a constant); else added per call
        self.scales = scales

    def __repr__(self) -> str:
        return f"PackedDynamicLinear(n={self.n}, k={self.k}, has_bias={self.has_bias})"


def _f32(v: float) -> float:
    """``v`` rounded to float32, as a tensor op on float32 values rounds its result."""
    return struct.unpack("f", struct.pack("f", v))[0]


def activation_qparams(x: torch.Tensor, eps: float) -> tuple[float, int]:
    """``(scale, zero point)`` of ``x`` as ``choose_qparams.tensor(x, -128, 127, eps, int8)``
    gives them."""
    lo_t, hi_t = torch.aminmax(x)
    return _qparams(lo_t.item(), hi_t.item(), eps)


def _qparams(lo: float, hi: float, eps: float) -> tuple[float, int]:
    """:func:`activation_qparams` from the range. float32 operations on float32 values are
    computed in float64 and rounded once, which gives the float32 result exactly."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = max(_f32(_f32(hi - lo) / float(_QMAX - _QMIN)), _f32(eps))
    if not math.isfinite(scale) or not math.isfinite(lo):
        return scale, _QMIN
    zero_point = _QMIN - round(_f32(lo / scale))
    return scale, min(max(zero_point, _QMIN), _QMAX)


def _check(x: Any, n: int, k: int, w_scales: Any, bias: Any, eps: Any, post_op: Any) -> None:
    # every call runs these: messages are formatted only on failure
    if not (isinstance(x, torch.Tensor) and x.dtype == torch.float32 and x.dim() >= 1
            and x.shape[-1] == k):
        _fail(f"the input must be float32 [..., {k}]")
    if not (isinstance(w_scales, torch.Tensor) and w_scales.dtype == torch.float32
            and w_scales.dim() == 1 and w_scales.numel() == n):
        _fail(f"w_scales must be float32 with {n} elements")
    if not (bias is None or (isinstance(bias, torch.Tensor) and bias.dtype == torch.float32
                             and bias.dim() == 1 and bias.numel() == n)):
        _fail(f"the bias must be float32 with {n} elements")
    if not (isinstance(eps, float) and eps > 0):
        _fail("eps must be a positive float")
    if post_op not in _POST_OPS:
        _fail(f"post_op must be one of {list(_POST_OPS)}; got {post_op!r}")


def _check_weight(w: Any) -> None:
    if not (isinstance(w, torch.Tensor) and w.dtype == torch.int8 and w.dim() == 2
            and w.numel() > 0):
        _fail("the weight must be a non-empty 2-D int8 tensor [N, K]")


def pack(w: torch.Tensor, w_scales: torch.Tensor, bias: torch.Tensor | None
         ) -> PackedDynamicLinear:
    _check_weight(w)
    n, k = w.shape
    _check(torch.empty(1, k), n, k, w_scales, bias, 1.0, "none")
    with warnings.catch_warnings():  # torch 2.13 calls quantized tensors deprecated
        warnings.simplefilter("ignore", UserWarning)
        q = torch._make_per_channel_quantized_tensor(
            w.contiguous(), w_scales.double(), torch.zeros(n, dtype=torch.int64), 0)
    return PackedDynamicLinear(torch.ops.quantized.linear_prepack(q, bias), n, k,
                               bias is not None, w_scales)


def _reference(x: torch.Tensor, dense: torch.Tensor, bias: Any, scale: float,
               zero_point: int) -> torch.Tensor:
    """The pattern in float32: ``x`` quantized and dequantized, times the dequantized weight."""
    q = torch.clamp(torch.round(x * _f32(1.0 / scale)) + zero_point, _QMIN, _QMAX)
    return torch.nn.functional.linear((q - zero_point) * scale, dense, bias)


class DenseDynamicWeight:
    """An int8 weight ``[N, K]`` dequantized at load, for CPUs where fbgemm's int8 products
    saturate (:mod:`.int8_float`): the kernel runs the pattern in float32. A kernel argument,
    so a plain slotted class."""

    __slots__ = ("dense", "k", "n")

    def __init__(self, w: torch.Tensor, w_scales: torch.Tensor) -> None:
        self.n, self.k = w.shape
        self.dense = w.float() * w_scales.float().reshape(-1, 1)

    def __repr__(self) -> str:
        return f"DenseDynamicWeight(n={self.n}, k={self.k})"


def linear_dynamic_int8(x: Any, w: Any, w_scales: Any, bias: Any, eps: Any,
                        post_op: Any) -> torch.Tensor:
    if isinstance(w, (PackedDynamicLinear, DenseDynamicWeight)):
        n, k = w.n, w.k
    else:
        _check_weight(w)
        n, k = w.shape
    _check(x, n, k, w_scales, bias, eps, post_op)
    if x.numel() == 0:
        return x.new_zeros((*x.shape[:-1], n))
    scale, zero_point = activation_qparams(x, eps)
    if isinstance(w, PackedDynamicLinear) and math.isfinite(scale) and exact_int8_products():
        x2 = x.reshape(-1, k).contiguous()
        late_bias = bias is not None and not w.has_bias
        op = _FBGEMM_RELU if post_op == "relu" and not late_bias else _FBGEMM
        # fbgemm's activations are uint8: the same values, zero point moved by 128
        out = op(x2, scale, zero_point - _QMIN, w.packed)
        if late_bias:
            out += bias
            if post_op == "relu":
                out.relu_()
        return out.reshape(*x.shape[:-1], n)
    if isinstance(w, DenseDynamicWeight):
        dense = w.dense
    else:
        if isinstance(w, PackedDynamicLinear):
            w = torch.ops.quantized.linear_unpack(w.packed)[0].int_repr()
        dense = w.float() * w_scales.reshape(-1, 1)
    out = _reference(x, dense, bias, scale, zero_point)
    return torch.relu(out) if post_op == "relu" else out


class DynamicRowLinear:
    """``linear_dynamic_int8`` for one op of a blob whose weight was packed at load, its
    ``eps`` and ``post_op`` checked once: called as ``(x, bias)``. A contiguous float32 input
    with the weight's bias (or none) goes straight to fbgemm (an LLM decode step makes ~30 such
    calls: the general kernel's argument checks and op lookups were a fifth of each); anything
    else runs the general kernel."""

    __slots__ = ("eps", "op", "post_op", "w")

    def __init__(self, w: PackedDynamicLinear, eps: float, post_op: str) -> None:
        self.w, self.eps, self.post_op = w, eps, post_op
        # None where fbgemm's products saturate (:mod:`.int8_float`): every call runs the
        # general kernel, which computes in float32 there
        self.op = (_FBGEMM_RELU if post_op == "relu" else _FBGEMM) if exact_int8_products() \
            else None

    def __call__(self, x: Any, bias: Any) -> torch.Tensor:
        w = self.w
        if (self.op is not None and type(x) is torch.Tensor and x.dtype == torch.float32
                and x.dim() >= 2
                and x.shape[-1] == w.k and x.numel() > 0 and x.is_contiguous()
                and (bias is None or w.has_bias)):
            lo_t, hi_t = _AMINMAX(x)
            scale, zero_point = _qparams(lo_t.item(), hi_t.item(), self.eps)
            if math.isfinite(scale):
                y = self.op(x.view(-1, w.k), scale, zero_point - _QMIN, w.packed)
                return y.view(*x.shape[:-1], w.n)
        return linear_dynamic_int8(x, w, w.scales, bias, self.eps, self.post_op)


def _specialize(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``(DynamicRowLinear, (x, bias))`` for an op whose weight was packed at load and whose
    ``eps`` / ``post_op`` are valid, else None (the general kernel runs, and names what is
    wrong)."""
    if kwargs or len(args) != 6 or not isinstance(args[1], PackedDynamicLinear):
        return None
    x, w, _scales, bias, eps, post_op = args
    if not (isinstance(eps, float) and eps > 0 and post_op in _POST_OPS):
        return None
    return DynamicRowLinear(w, eps, post_op), (x, bias)


def _prepare(args: tuple[Any, ...], constant: Callable[[Any], Any]) -> tuple[Any, ...]:
    w, scales = constant(args[1]), constant(args[2])
    bias = constant(args[3]) if args[3] is not None else None  # None: a run-time value
    if w is None or scales is None:
        return args
    if not exact_int8_products():  # fbgemm's products saturate here: float32 (.int8_float)
        try:
            _check_weight(w)
            _check(torch.empty(1, w.shape[1]), w.shape[0], w.shape[1], scales, bias, 1.0, "none")
        except DynamicInt8Error:
            return args  # the kernel refuses it when it runs
        return (args[0], DenseDynamicWeight(w, scales), *args[2:])
    if not (fbgemm_available() and _fbgemm_engine()):
        return args
    try:
        packed = pack(w, scales, bias)
    except (DynamicInt8Error, RuntimeError):
        return args  # the kernel refuses them when it runs
    return (args[0], packed, *args[2:])


# name -> specialize(args, kwargs): ``(callable, its arguments)`` (see .kernels._specialized)
DYNAMIC_INT8_SPECIALIZED: dict[str, Callable[..., Any]] = {LINEAR_DYNAMIC_INT8: _specialize}

# name -> (kernel, prepare)
DYNAMIC_INT8_KERNELS: dict[str, tuple[Callable[..., Any], Any]] = {
    LINEAR_DYNAMIC_INT8: (linear_dynamic_int8, _prepare),
}
