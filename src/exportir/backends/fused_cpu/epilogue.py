"""oneDNN linears with a packed weight, and activations / residual adds fused into oneDNN
linears and convolutions.

- ``linear(x, W, b)`` with a constant float32 ``W`` and at least :data:`PACKED_MIN_ROWS` rows
  becomes ``mkldnn._linear_pointwise`` (the executor packs ``W`` once, at load). The rule is
  measured: on the benchmark machine (1 thread) oneDNN's packed linear took 0.83-0.93x of
  torch's linear at 128-197 rows (the BERT / Llama / ViT shapes), but 1.1-5x at one row, where
  torch's GEMV wins (``benchmarks/_xnnpack_rows.py`` models; docs/fused_cpu.md).
- an activation (relu, gelu, silu, hardswish, hardsigmoid, hardtanh / ReLU6, sigmoid, tanh,
  leaky_relu) that alone reads a oneDNN linear or convolution with no post-op becomes its
  post-op (``attr``, ``scalars``, ``algorithm``);
- ``add(linear(x), other)`` of the same shape becomes ``_linear_pointwise.binary`` (a
  residual connection).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from exportir.backends.fused_cpu.ir import Graph, Op, Value, static_shape
from exportir.runtime.backends.fused_cpu import OPS

__all__ = ["EPILOGUE_FUSIONS", "LINEAR_RULES", "PACKED_MIN_ROWS", "post_op"]

PACKED_MIN_ROWS = 32
LINEAR = "mkldnn._linear_pointwise.default"
LINEAR_ADD = "mkldnn._linear_pointwise.binary"
CONV = "mkldnn._convolution_pointwise.default"

Attr = tuple[str, list, Any]  # (attr, scalars, algorithm)


def _number(x: Any) -> bool:
    return type(x) in (int, float) and math.isfinite(x)


def _gelu(op: Op) -> Attr | None:
    approximate = op.args[1] if len(op.args) > 1 else op.kwargs.get("approximate", "none")
    return ("gelu", [], approximate) if approximate in ("none", "tanh") else None


def _hardtanh(op: Op) -> Attr | None:
    low, high = (*op.args[1:], *(-1.0, 1.0)[len(op.args) - 1 :])[:2]
    low, high = op.kwargs.get("min_val", low), op.kwargs.get("max_val", high)
    if not (_number(low) and _number(high)) or low > high:
        return None
    return ("hardtanh", [float(low), float(high)], None)


def _clamp(op: Op) -> Attr | None:
    if len(op.args) != 3 or op.kwargs or not (_number(op.args[1]) and _number(op.args[2])):
        return None
    return ("hardtanh", [float(op.args[1]), float(op.args[2])], None) if op.args[1] <= op.args[2] else None


def _leaky(op: Op) -> Attr | None:
    slope = op.args[1] if len(op.args) > 1 else op.kwargs.get("negative_slope", 0.01)
    return ("leaky_relu", [float(slope)], None) if _number(slope) else None


def _plain(attr: str) -> Callable[[Op], Attr | None]:
    return lambda op: (attr, [], None) if len(op.args) == 1 and not op.kwargs else None


_UNARY: dict[str, Callable[[Op], Attr | None]] = {
    "aten.relu.default": _plain("relu"),
    "aten.sigmoid.default": _plain("sigmoid"),
    "aten.tanh.default": _plain("tanh"),
    "aten.silu.default": _plain("swish"),
    "aten.hardswish.default": _plain("hardswish"),
    "aten.hardsigmoid.default": _plain("hardsigmoid"),
    "aten.gelu.default": _gelu,
    "aten.hardtanh.default": _hardtanh,
    "aten.clamp.default": _clamp,
    "aten.leaky_relu.default": _leaky,
}


def post_op(op: Op) -> Attr | None:
    """The oneDNN post-op computing the unary ``op``, or None."""
    rule = _UNARY.get(op.name)
    return rule(op) if rule is not None else None


def _has_onednn() -> bool:
    return torch.backends.mkldnn.is_available() and LINEAR in OPS


def pack_linear(g: Graph, op: Op) -> bool:
    """``linear`` with a constant weight and enough rows runs on oneDNN (module docstring)."""
    if op.kwargs or len(op.args) != 3 or not _has_onednn():
        return False
    x, w, bias = op.args
    x_shape = static_shape(x)
    if x_shape is None or len(x_shape) < 2 or math.prod(x_shape[:-1]) < PACKED_MIN_ROWS:
        return False
    if not isinstance(w, Value) or w.const is None or w.const.dim() != 2:
        return False
    if x.dtype != torch.float32 or w.dtype != torch.float32:
        return False
    if bias is not None and (not isinstance(bias, Value) or bias.dtype != torch.float32):
        return False
    op.name, op.args = LINEAR, [x, w, bias, "none", [], None]
    g.changed()
    return True


def fuse_post_op(g: Graph, op: Op) -> bool:
    """An activation that alone reads a oneDNN linear / convolution without a post-op joins
    it (the convolution's ``attr`` is its 8th argument, the linear's its 4th)."""
    attr = post_op(op)
    if attr is None or not isinstance(op.args[0], Value):
        return False
    producer = g.producer(op.args[0])
    if producer is None or g.only_reader(op.args[0]) is not op:
        return False
    at = {LINEAR: 3, CONV: 7}.get(producer.name)
    if at is None or producer.args[at] != "none":
        return False
    op.name, op.nodes = producer.name, (*producer.nodes, *op.nodes)
    op.args, op.kwargs = [*producer.args[:at], *attr], {}
    g.remove(producer)
    return True


def linear_add(g: Graph, op: Op) -> bool:
    """``add(linear(x), other)`` (either order, same shape and dtype, no alpha) of a oneDNN
    linear it alone reads is one binary linear, run where the add was."""
    found = g.residual_add(op, LINEAR, 3)
    if found is None:
        return False
    linear, other = found
    x, w, bias = linear.args[:3]
    op.name, op.nodes = LINEAR_ADD, (*linear.nodes, *op.nodes)
    op.args = [x, other, w, bias, "add"]
    g.remove(linear)
    return True


LINEAR_RULES = {"aten.linear.default": (pack_linear,)}
EPILOGUE_FUSIONS: dict[str, tuple[Callable[[Graph, Op], bool], ...]] = {
    **{name: (fuse_post_op,) for name in _UNARY},
    "aten.add.Tensor": (linear_add,),
}
