"""The ``quantized_decomposed`` operators: quantize / dequantize as plain tensor ops.

Quantized graphs (``exportir.quantization.convert_pt2e``, weight-only quantization) name these
ops, with the schemas torch gives them in ``torch/ao/quantization/fx/_decomposed.py``; programs
run them through their out variants, which carry ExecuTorch's names
(``quantized_decomposed::quantize_per_tensor.out``, ``choose_qparams.Tensor_out``, ...).

torch defines the functional ops in ``torch.ao.quantization.fx._decomposed``, with a ``DEF``
library: whoever registers them second fails. transformers imports torchao whenever it is
installed, and torchao imports that module, so a process that quantized with exportir and then
builds a transformers model would crash if exportir had defined them itself. :func:`define`
therefore imports torch's definitions first (the one module of ``torch.ao`` exportir imports; it
uses no tracing) and registers only what torch lacks: the out variants, and the functional ops
should that module ever stop defining them.

This module imports only torch (and torch's op definitions, when :func:`define` runs): the runtime uses it to run programs that call these ops.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["NAMESPACE", "OUT_VARIANTS", "define", "out_variant_schemas"]

NAMESPACE = "quantized_decomposed"

# quantized dtype -> (least, greatest) value it holds
QVALUE_BOUNDS: dict[torch.dtype, tuple[int, int]] = {
    torch.uint8: (0, 255),
    torch.int8: (-128, 127),
    torch.int16: (-(2**15), 2**15 - 1),
    torch.int32: (-(2**31), 2**31 - 1),
}


# ------------------------------------------------------------------------------ the math


def _as_float(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32) if x.dtype in (torch.float16, torch.bfloat16) else x


def _check_bounds(quant_min: int, quant_max: int, dtype: torch.dtype) -> None:
    bounds = QVALUE_BOUNDS.get(dtype)
    if bounds is None:
        raise ValueError(f"{NAMESPACE}: unsupported quantized dtype {dtype}; use one of "
                         f"{sorted(map(str, QVALUE_BOUNDS))}")
    if not bounds[0] <= quant_min <= quant_max <= bounds[1]:
        raise ValueError(f"{NAMESPACE}: quant_min {quant_min} / quant_max {quant_max} outside "
                         f"{dtype}'s range {bounds}")


def quantize_per_tensor(x: Any, scale: float, zero_point: int, quant_min: int,
                        quant_max: int, dtype: torch.dtype) -> torch.Tensor:
    _check_bounds(quant_min, quant_max, dtype)
    inv_scale = 1.0 / scale
    q = torch.round(_as_float(x) * inv_scale) + zero_point
    return torch.clamp(q, quant_min, quant_max).to(dtype)


def quantize_per_tensor_tensor(x: Any, scale: torch.Tensor, zero_point: torch.Tensor,
                               quant_min: int, quant_max: int, dtype: torch.dtype) -> torch.Tensor:
    return quantize_per_tensor(x, float(scale.item()), int(zero_point.item()), quant_min,
                               quant_max, dtype)


def dequantize_per_tensor(x: torch.Tensor, scale: float, zero_point: int, quant_min: int,
                          quant_max: int, dtype: torch.dtype, *,
                          out_dtype: torch.dtype | None = None) -> torch.Tensor:
    _check_input(x, dtype)
    return (x.to(out_dtype or torch.float32) - zero_point) * scale


def dequantize_per_tensor_tensor(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                                 quant_min: int, quant_max: int, dtype: torch.dtype, *,
                                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
    return dequantize_per_tensor(x, float(scale.item()), int(zero_point.item()), quant_min,
                                 quant_max, dtype, out_dtype=out_dtype)


def _check_input(x: torch.Tensor, dtype: torch.dtype) -> None:
    if x.dtype != dtype:
        raise ValueError(f"{NAMESPACE}: expected an input of dtype {dtype}; got {x.dtype}")


def choose_qparams(x: torch.Tensor, quant_min: int, quant_max: int, eps: float,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor affine scale (float64 ``[1]``) and zero point (int64 ``[1]``) of ``x``."""
    _check_bounds(quant_min, quant_max, dtype)
    lo, hi = torch.aminmax(_as_float(x))
    lo, hi = torch.clamp(lo, max=0.0), torch.clamp(hi, min=0.0)
    scale = torch.clamp((hi - lo) / float(quant_max - quant_min), min=eps)
    zero_point = quant_min - torch.round(lo / scale).to(torch.int64)
    zero_point = torch.clamp(zero_point, quant_min, quant_max)
    return scale.reshape(1).to(torch.float64), zero_point.reshape(1).to(torch.int64)


def _channel_view(t: torch.Tensor, axis: int, ndim: int) -> torch.Tensor:
    shape = [1] * ndim
    shape[axis] = -1
    return t.reshape(shape)


def quantize_per_channel(x: Any, scales: torch.Tensor, zero_points: torch.Tensor, axis: int,
                         quant_min: int, quant_max: int, dtype: torch.dtype) -> torch.Tensor:
    _check_bounds(quant_min, quant_max, dtype)
    x = _as_float(x)
    s, z = (_channel_view(t, axis, x.dim()) for t in (scales, zero_points))
    return torch.clamp(torch.round(x * (1.0 / s)) + z, quant_min, quant_max).to(dtype)


def dequantize_per_channel(x: torch.Tensor, scales: torch.Tensor, zero_points: Any, axis: int,
                           quant_min: int, quant_max: int, dtype: torch.dtype, *,
                           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    _check_input(x, dtype)
    s = _channel_view(scales, axis, x.dim())
    res = x if zero_points is None else x - _channel_view(zero_points, axis, x.dim())
    return (res * s).to(out_dtype or torch.float32)


def dequantize_per_channel_group(x: torch.Tensor, scales: torch.Tensor, zero_points: Any,
                                 quant_min: int, quant_max: int, dtype: torch.dtype,
                                 group_size: int, output_dtype: torch.dtype) -> torch.Tensor:
    """Row-wise groups of ``group_size`` elements of a 2-D ``x``, each with its own scale and
    zero point (``scales``: ``[rows, cols // group_size]``)."""
    _check_input(x, dtype)
    if x.dim() != 2 or group_size <= 1 or x.shape[-1] % group_size:
        raise ValueError(f"{NAMESPACE}.dequantize_per_channel_group: needs a 2-D input whose "
                         f"columns ({list(x.shape)}) divide into groups of {group_size}")
    grouped = x.reshape(-1, group_size)
    zp = 0 if zero_points is None else zero_points.reshape(-1, 1)
    return grouped.sub(zp).mul(scales.reshape(-1, 1)).reshape(x.shape).to(output_dtype)


# ------------------------------------------------------------------------------ meta kernels


def _like(dtype_of: Callable[..., torch.dtype]) -> Callable[..., torch.Tensor]:
    def meta(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.empty_like(x, dtype=dtype_of(*args, **kwargs))

    return meta


def _q_dtype(*args: Any, **kwargs: Any) -> torch.dtype:
    return args[-1]


def _dq_dtype(*args: Any, out_dtype: torch.dtype | None = None) -> torch.dtype:
    return out_dtype or torch.float32


def _group_dtype(*args: Any) -> torch.dtype:
    return args[-1]


def _choose_meta(x: torch.Tensor, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty(1, dtype=torch.float64, device=x.device),
            torch.empty(1, dtype=torch.int64, device=x.device))


# ------------------------------------------------------------------------------ the table


@dataclass(frozen=True, slots=True)
class OpDef:
    """One functional overload: torch's schema, its kernel, its meta kernel, and the schema
    of its out variant (ExecuTorch's name)."""

    schema: str
    fn: Callable[..., Any]
    meta: Callable[..., Any]
    out_schema: str


_Q = "int quant_min, int quant_max, ScalarType dtype"
_OUT = "Tensor(a!) out) -> Tensor(a!)"

OPS: tuple[OpDef, ...] = (
    OpDef(f"quantize_per_tensor(Tensor input, float scale, int zero_point, {_Q}) -> Tensor",
          quantize_per_tensor, _like(_q_dtype),
          f"quantize_per_tensor.out(Tensor input, float scale, int zero_point, {_Q}, *, {_OUT}"),
    OpDef(f"quantize_per_tensor.tensor(Tensor input, Tensor scale, Tensor zero_point, {_Q}) "
          "-> Tensor",
          quantize_per_tensor_tensor, _like(_q_dtype),
          f"quantize_per_tensor.tensor_out(Tensor input, Tensor scale, Tensor zero_point, {_Q}, "
          f"*, {_OUT}"),
    OpDef(f"dequantize_per_tensor(Tensor input, float scale, int zero_point, {_Q}, *, "
          "ScalarType? out_dtype=None) -> Tensor",
          dequantize_per_tensor, _like(_dq_dtype),
          f"dequantize_per_tensor.out(Tensor input, float scale, int zero_point, {_Q}, *, "
          f"ScalarType? out_dtype=None, {_OUT}"),
    OpDef(f"dequantize_per_tensor.tensor(Tensor input, Tensor scale, Tensor zero_point, {_Q}, "
          "*, ScalarType? out_dtype=None) -> Tensor",
          dequantize_per_tensor_tensor, _like(_dq_dtype),
          f"dequantize_per_tensor.tensor_out(Tensor input, Tensor scale, Tensor zero_point, "
          f"{_Q}, *, ScalarType? out_dtype=None, {_OUT}"),
    OpDef("choose_qparams.tensor(Tensor input, int quant_min, int quant_max, float eps, "
          "ScalarType dtype) -> (Tensor, Tensor)",
          choose_qparams, _choose_meta,
          "choose_qparams.Tensor_out(Tensor input, int quant_min, int quant_max, float eps, "
          "ScalarType dtype, *, Tensor(a!) scale_out, Tensor(b!) zero_point_out) -> "
          "(Tensor(a!), Tensor(b!))"),
    OpDef(f"quantize_per_channel(Tensor input, Tensor scales, Tensor zero_points, int axis, {_Q})"
          " -> Tensor",
          quantize_per_channel, _like(_q_dtype),
          f"quantize_per_channel.out(Tensor input, Tensor scales, Tensor zero_points, int axis, "
          f"{_Q}, *, {_OUT}"),
    OpDef(f"dequantize_per_channel(Tensor input, Tensor scales, Tensor? zero_points, int axis, "
          f"{_Q}, *, ScalarType? out_dtype=None) -> Tensor",
          dequantize_per_channel, _like(_dq_dtype),
          f"dequantize_per_channel.out(Tensor input, Tensor scales, Tensor? zero_points, "
          f"int axis, {_Q}, *, ScalarType? out_dtype=None, {_OUT}"),
    OpDef(f"dequantize_per_channel_group(Tensor input, Tensor scales, Tensor? zero_points, {_Q}, "
          "int group_size, ScalarType output_dtype) -> Tensor",
          dequantize_per_channel_group, _like(_group_dtype),
          f"dequantize_per_channel_group.out(Tensor input, Tensor scales, Tensor? zero_points, "
          f"{_Q}, int group_size, ScalarType output_dtype, *, {_OUT}"),
)


def _name(schema: str) -> tuple[str, str]:
    """(packet, overload) of a schema string (``default`` when it names none)."""
    head = schema.partition("(")[0]
    packet, _, overload = head.partition(".")
    return packet, overload or "default"


def _exists(packet: str, overload: str) -> bool:
    try:
        getattr(getattr(getattr(torch.ops, NAMESPACE), packet), overload)
    except (AttributeError, RuntimeError):
        return False
    return True


def parsed_schema(packet: str, overload: str) -> torch._C.FunctionSchema | None:
    """The schema of the functional op ``packet.overload`` of this library, parsed from the
    table without registering anything with torch (:func:`define` would import torch's own
    definitions: ~15 ms and ~10 MiB, which a program that only reads the arguments of these ops,
    as the fused CPU backend does, need not pay); ``None`` when the table has no such op."""
    for op in OPS:
        if _name(op.schema) == (packet, overload):
            return torch._C.parse_schema(f"{NAMESPACE}::{op.schema}")
    return None


def _out_kernel(op: OpDef) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        outs = [kwargs.pop(k) for k in [k for k in kwargs if k.endswith("out")
                                        and isinstance(kwargs[k], torch.Tensor)]]
        results = op.fn(*args, **kwargs)
        results = results if isinstance(results, tuple) else (results,)
        for out, value in zip(outs, results):
            if out.shape != value.shape:
                out.resize_(value.shape)
            out.copy_(value)
        return outs[0] if len(outs) == 1 else tuple(outs)

    return run


def _import_torch_definitions() -> None:
    """torch's own ``quantized_decomposed`` functional ops, so that a later import of
    ``torch.ao.quantization`` (by torchao, which transformers imports) finds them defined."""
    try:
        importlib.import_module(_TORCH_DEFINITIONS)
    except ImportError:  # a torch build without torch.ao: define() registers every op itself
        pass


_TORCH_DEFINITIONS = "torch.ao.quantization.fx._decomposed"


@functools.cache
def define() -> tuple[torch.library.Library, ...]:
    """Register the ops with torch (idempotent): the functional ops that do not exist yet, and
    every out variant. Returns the libraries (kept alive by the cache)."""
    _import_torch_definitions()
    functional = torch.library.Library(NAMESPACE, "FRAGMENT")
    outs = torch.library.Library(NAMESPACE, "FRAGMENT")
    for op in OPS:
        packet, overload = _name(op.schema)
        if not _exists(packet, overload):
            functional.define(op.schema)
            qualified = packet if overload == "default" else f"{packet}.{overload}"
            functional.impl(qualified, op.fn, "CompositeExplicitAutograd")
            functional.impl(qualified, op.meta, "Meta")
        out_packet, out_overload = _name(op.out_schema)
        if not _exists(out_packet, out_overload):
            outs.define(op.out_schema)
            outs.impl(f"{out_packet}.{out_overload}", _out_kernel(op), "CompositeExplicitAutograd")
    return functional, outs


def out_variant_schemas() -> dict[str, str]:
    """``quantized_decomposed::quantize_per_tensor.out`` -> its schema, for every out variant
    (the runtime's kernel table lists them)."""
    define()
    table = {}
    for op in OPS:
        packet, overload = _name(op.out_schema)
        found = getattr(getattr(getattr(torch.ops, NAMESPACE), packet), overload)
        table[f"{NAMESPACE}::{packet}.{overload}"] = str(found._schema)
    return table


OUT_VARIANTS: tuple[str, ...] = tuple(
    f"{NAMESPACE}::{'.'.join(_name(op.out_schema))}" for op in OPS
)
