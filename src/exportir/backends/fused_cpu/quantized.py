"""Rewrites of quantized patterns onto the int8 / int4 kernels torch ships for CPU.

Keyed on the ``linear`` the generic rewrites rebuild from ``addmm`` / ``mm``:

- **static int8** -- ``quantize_per_tensor(linear(dequantize_per_tensor(qx), dequantize_per_
  channel(W8), b))``, with an optional ``relu`` before the quantize, becomes
  ``onednn.qlinear_pointwise(qx, ..., W8, ...)`` writing int8 (post op ``relu``);
- **static int8 convolution** -- ``quantize_per_tensor(convolution(dequantize_per_tensor(qx),
  dequantize_per_channel(W8), b))`` (2-D, not transposed), with an optional ``relu`` before the
  quantize (or a ``hardtanh``: ``relu6``), becomes ``onednn.qconv_pointwise(qx, ..., W8, ...)``
  writing int8 (post op ``relu`` / ``hardtanh``); the weight is packed at load
  (``onednn.qconv_prepack``) and again, for its input shape, by the first call;
- **dynamic int8 on fbgemm** -- the whole dynamic chain ``linear(dequantize_per_tensor.tensor(
  quantize_per_tensor.tensor(x, *choose_qparams.tensor(x, -128, 127, eps, int8))),
  dequantize_per_channel(W8), b)`` (an optional ``relu`` after it absorbed) becomes one
  ``fused_cpu.linear_dynamic_int8(x, W8, scales, b, eps, post_op)``, which chooses the qparams
  the same way and runs fbgemm (:mod:`exportir.runtime.backends.fused_cpu.dynamic_int8`).
  Where fbgemm is missing the rule below takes the chain;
- **dynamic int8** -- ``linear(dequantize_per_tensor.tensor(qx, scale, zp), dequantize_per_
  channel(W8), b)`` becomes ``onednn.qlinear_pointwise.tensor`` writing float32;
- **weight-only int4** -- ``linear(x, dequantize_per_channel_group(W4, s, z, 0, 15, ...))``
  becomes ``aten._weight_int4pack_mm_for_cpu`` over the weight packed now with
  ``aten._convert_weight_to_int4pack_for_cpu`` (needs ``N % 16 == 0``);
- **weight-only int8** -- ``linear(x, dequantize_per_channel(W8, s))`` (any other float ``x``)
  becomes ``aten._weight_int8pack_mm``.

Weights must be constants the backend owns, quantized symmetrically (zero points 0) along the
output channel. What no rule takes runs as it is: a ``dequantize`` of a constant weight is then
folded into a float weight (constant folding), activations still go through quantize /
dequantize.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from exportir.backends.fused_cpu.ir import Graph, Op, Value, static_shape, values_in
from exportir.runtime.backends.fused_cpu import OPS
from exportir.runtime.backends.fused_cpu.dynamic_int8 import LINEAR_DYNAMIC_INT8, fbgemm_available

__all__ = ["QUANT_RULES", "uint8_activations"]

_QD = "quantized_decomposed."
_DQ_T = _QD + "dequantize_per_tensor.default"
_DQ_TT = _QD + "dequantize_per_tensor.tensor"
_DQ_C = _QD + "dequantize_per_channel.default"
_DQ_G = _QD + "dequantize_per_channel_group.default"
_Q_T = _QD + "quantize_per_tensor.default"
_Q_TT = _QD + "quantize_per_tensor.tensor"
_CHOOSE = _QD + "choose_qparams.tensor"
_RELU = "aten.relu.default"
_HARDTANH = "aten.hardtanh.default"
_QLINEAR = "onednn.qlinear_pointwise.default"
_QLINEAR_T = "onednn.qlinear_pointwise.tensor"
_QCONV = "onednn.qconv_pointwise.default"
_INT8_MM = "aten._weight_int8pack_mm.default"
_INT4_MM = "aten._weight_int4pack_mm_for_cpu.default"


def _const(t: torch.Tensor, name: str) -> Value:
    return Value(torch.empty(t.shape, dtype=t.dtype, device="meta"), t, name=name)


def _known(v: Any) -> torch.Tensor | None:
    return v.const if isinstance(v, Value) else None


def _float32(v: Any) -> bool:
    return isinstance(v, Value) and v.dtype == torch.float32


def _int8_weight(g: Graph, w: Any, dims: int = 2
                 ) -> tuple[Op, torch.Tensor, torch.Tensor] | None:
    """``(dequantize op, int8 weight [N, K] (or [N, C, kH, kW]: ``dims``), float32 scales
    [N])`` of a constant weight quantized symmetrically per output channel, else None."""
    dq = g.producer(w, _DQ_C) if isinstance(w, Value) else None
    if dq is None or dq.kwargs.get("out_dtype") not in (None, torch.float32):
        return None
    wq, scales, zps, axis, _, _, dtype = dq.args
    q, s, z = _known(wq), _known(scales), _known(zps)
    if q is None or s is None or axis != 0 or dtype != torch.int8 or q.dim() != dims:
        return None
    if zps is not None and (z is None or bool(z.any())):
        return None
    return dq, q, s.to(torch.float32).reshape(-1)


def _bias_ok(b: Any) -> bool:
    return b is None or _float32(b)


def _quantize_after(g: Graph, op: Op, clamps: bool = False
                    ) -> tuple[str, list[Op], Op, list[float]] | None:
    """``(post op, ops absorbed, the int8 quantize, post op scalars)`` reading ``op``'s
    result, else None; ``clamps``: a ``hardtanh`` (``relu6``) may come before the quantize."""
    reader = g.only_reader(op.out)
    absorbed = []
    post, scalars = "none", []
    if reader is not None and reader.name == _RELU:
        post, absorbed = "relu", [reader]
        reader = g.only_reader(reader.out)
    elif clamps and reader is not None and reader.name == _HARDTANH and not reader.kwargs:
        lo = reader.args[1] if len(reader.args) > 1 else -1.0  # hardtanh's defaults
        hi = reader.args[2] if len(reader.args) > 2 else 1.0
        if not all(isinstance(v, (int, float)) for v in (lo, hi)):
            return None
        post, absorbed, scalars = "hardtanh", [reader], [float(lo), float(hi)]
        reader = g.only_reader(reader.out)
    if reader is None or reader.name != _Q_T:
        return None
    qmin, qmax, dtype = reader.args[3:6]
    if (dtype, qmin, qmax) != (torch.int8, -128, 127):
        return None
    return post, [*absorbed, reader], reader, scalars


def _replace(g: Graph, old: Op, new: Op) -> None:
    g.ops = [new if o is old else o for o in g.ops]
    g.changed()


def qlinear_static(g: Graph, op: Op) -> bool:
    x, w, b = (*op.args, None)[:3]
    dq_x = g.producer(x, _DQ_T)
    weight = _int8_weight(g, w)
    tail = _quantize_after(g, op)
    if op.kwargs or dq_x is None or weight is None or tail is None or not _bias_ok(b):
        return False
    qx, x_scale, x_zp, _, _, x_dtype = dq_x.args
    if x_dtype != torch.int8 or dq_x.kwargs.get("out_dtype") not in (None, torch.float32):
        return False
    _, wq, ws = weight
    post, absorbed, q, _ = tail
    n = wq.shape[0]
    args = [qx, x_scale, x_zp, _const(wq, f"{op.out.name}_w8"), _const(ws, f"{op.out.name}_ws"),
            _const(torch.zeros(n, dtype=torch.int64), f"{op.out.name}_wz"), b, q.args[1],
            q.args[2], torch.int8, post, [], ""]
    nodes = (*op.nodes, *(o for a in absorbed for o in a.nodes))
    _replace(g, q, Op(_QLINEAR, args, {}, q.outs, False, nodes))
    return True


def qlinear_dynamic(g: Graph, op: Op) -> bool:
    x, w, b = (*op.args, None)[:3]
    dq_x = g.producer(x, _DQ_TT)
    weight = _int8_weight(g, w)
    if op.kwargs or dq_x is None or weight is None or not _bias_ok(b):
        return False
    qx, x_scale, x_zp, _, _, x_dtype = dq_x.args
    if x_dtype != torch.int8 or dq_x.kwargs.get("out_dtype") not in (None, torch.float32):
        return False
    _, wq, ws = weight
    n = wq.shape[0]
    args = [qx, x_scale, x_zp, _const(wq, f"{op.out.name}_w8"), _const(ws, f"{op.out.name}_ws"),
            _const(torch.zeros(n, dtype=torch.int64), f"{op.out.name}_wz"), b, 1.0, 0,
            torch.float32, "none", [], ""]
    _replace(g, op, Op(_QLINEAR_T, args, {}, op.outs, False, op.nodes))
    return True


def _dynamic_int8_input(g: Graph, v: Any) -> tuple[Any, float] | None:
    """``(x, eps)`` when ``v`` is ``dequantize(quantize(x, *choose_qparams(x, -128, 127, eps,
    int8)))`` of a float32 ``x``, every step over int8 [-128, 127] and the same qparams."""
    int8 = (-128, 127, torch.int8)
    dq = g.producer(v, _DQ_TT) if isinstance(v, Value) else None
    if dq is None or tuple(dq.args[3:6]) != int8 or dq.kwargs.get("out_dtype") not in (
            None, torch.float32):
        return None
    q = g.producer(dq.args[0], _Q_TT) if isinstance(dq.args[0], Value) else None
    if q is None or q.kwargs or tuple(q.args[3:6]) != int8:
        return None
    x, scale, zp = q.args[:3]
    choose = g.producer(scale, _CHOOSE) if isinstance(scale, Value) else None
    if (choose is None or choose.kwargs or len(choose.outs) != 2 or choose.outs[0] is not scale or choose.outs[1] is not zp
            or dq.args[1] is not scale or dq.args[2] is not zp or choose.args[0] is not x
            or tuple(choose.args[1:3]) != (-128, 127) or choose.args[4] != torch.int8
            or not isinstance(choose.args[3], float) or not choose.args[3] > 0
            or not _float32(x)):
        return None
    return x, choose.args[3]


_VIEW = "aten.view_copy.default"


def linear_dynamic_fbgemm(g: Graph, op: Op) -> bool:
    x, w, b = (*op.args, None)[:3]
    view = g.producer(x, _VIEW) if isinstance(x, Value) else None
    if view is not None and not view.kwargs and isinstance(view.args[0], Value):
        x = view.args[0]  # a flatten of the dequantized input (a linear rebuilt from mm)
    found = _dynamic_int8_input(g, x) if not op.kwargs else None
    weight = _int8_weight(g, w)
    if found is None or weight is None or not _bias_ok(b):
        return False
    x, eps = found
    if view is not None:  # the same flatten, of the float input (per-tensor qparams: the same)
        x = g.emit_before(op, _VIEW, [x, view.args[1]], view.out.meta.shape, torch.float32,
                          view.nodes)
    _, wq, ws = weight
    post = "none"
    reader = g.only_reader(op.out)
    if reader is not None and reader.name == _RELU and not reader.kwargs:
        post = "relu"
        g.absorb(op, reader)
    args = [x, _const(wq, f"{op.out.name}_w8"), _const(ws, f"{op.out.name}_ws"), b, eps, post]
    _replace(g, op, Op(LINEAR_DYNAMIC_INT8, args, {}, op.outs, False, op.nodes))
    return True


def _int8_activation(g: Graph, x: Any) -> Op | None:
    """The ``dequantize_per_tensor`` of an int8 activation computing ``x``, else None."""
    dq_x = g.producer(x, _DQ_T)
    if dq_x is None or dq_x.args[5] != torch.int8 or dq_x.kwargs.get("out_dtype") not in (
            None, torch.float32):
        return None
    return dq_x


def _conv_params(op: Op) -> tuple[list[int], list[int], list[int], int] | None:
    """``(stride, padding, dilation, groups)`` of a 2-D, not transposed convolution."""
    x, _w, _b, stride, padding, dilation, transposed, _out_pad, groups = op.args
    shape = static_shape(x)
    if shape is None or len(shape) != 4 or transposed or op.kwargs:
        return None
    stride, padding, dilation = ([*p] * 2 if len(p) == 1 else [*p]
                                 for p in (stride, padding, dilation))
    if not all(len(p) == 2 for p in (stride, padding, dilation)):
        return None
    return stride, padding, dilation, groups


def qconv_static(g: Graph, op: Op) -> bool:
    x, w, b = op.args[:3]
    params = _conv_params(op)
    dq_x = _int8_activation(g, x)
    weight = _int8_weight(g, w, dims=4)
    tail = _quantize_after(g, op, clamps=True)
    if params is None or dq_x is None or weight is None or tail is None or not _bias_ok(b):
        return False
    qx, x_scale, x_zp = dq_x.args[:3]
    _, wq, ws = weight
    post, absorbed, q, scalars = tail
    n = wq.shape[0]
    args = [qx, x_scale, x_zp, _const(wq, f"{op.out.name}_w8"), _const(ws, f"{op.out.name}_ws"),
            _const(torch.zeros(n, dtype=torch.int64), f"{op.out.name}_wz"), b, *params,
            q.args[1], q.args[2], torch.int8, post, scalars, ""]
    nodes = (*op.nodes, *(o for a in absorbed for o in a.nodes))
    _replace(g, q, Op(_QCONV, args, {}, q.outs, False, nodes))
    return True


def _matmul_2d(g: Graph, op: Op, name: str, args_after_x: list[Any], n: int) -> bool:
    """Replace ``op`` (``linear(x, W, b)``) by ``name(x2d, *args_after_x)`` [M, N] with the
    bias added and ``x``'s leading dimensions restored."""
    x, _, b = (*op.args, None)[:3]
    shape, out_shape = static_shape(x), static_shape(op.out)
    if shape is None or out_shape is None or not _float32(x) or not _bias_ok(b):
        return False
    m, k = math.prod(shape[:-1]), shape[-1]
    tag = op.nodes
    x2 = x if len(shape) == 2 else g.emit_before(
        op, "aten.view_copy.default", [x, [m, k]], [m, k], torch.float32, tag)
    y = g.emit_before(op, name, [x2, *args_after_x], [m, n], torch.float32, tag)
    if b is not None:
        y = g.emit_before(op, "aten.add.Tensor", [y, b], [m, n], torch.float32, tag)
    if len(shape) == 2:
        g.replace_uses(op.out, y)
        g.remove(op)
        return True
    op.name, op.args, op.kwargs = "aten.view_copy.default", [y, list(out_shape)], {}
    g.changed()
    return True


def weight_only_int8(g: Graph, op: Op) -> bool:
    weight = _int8_weight(g, op.args[1])
    if op.kwargs or weight is None:
        return False
    _, wq, ws = weight
    args = [_const(wq, f"{op.out.name}_w8"), _const(ws, f"{op.out.name}_ws")]
    return _matmul_2d(g, op, _INT8_MM, args, wq.shape[0])


def _int4_weight(g: Graph, w: Any) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """``(packed weight, scales_and_zeros, group size)`` of a constant int4 weight."""
    dq = g.producer(w, _DQ_G) if isinstance(w, Value) else None
    if dq is None:
        return None
    wq, scales, zps, qmin, qmax, _, group, out_dtype = dq.args
    q, s, z = _known(wq), _known(scales), _known(zps)
    if q is None or s is None or z is None or (qmin, qmax) != (0, 15) or q.dim() != 2:
        return None
    n, k = q.shape
    if out_dtype != torch.float32 or n % 16 or k % group or k % 2 or s.numel() != n * k // group:
        return None
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    s = s.reshape(n, k // group).float()
    zeros = (8 - z.reshape(n, k // group).float()) * s  # (q - z) s = (q - 8) s + (8 - z) s
    scales_zeros = torch.stack([s, zeros], -1).transpose(0, 1).contiguous()
    return packed, scales_zeros, group


def weight_only_int4(g: Graph, op: Op) -> bool:
    found = _int4_weight(g, op.args[1]) if not op.kwargs else None
    if found is None:
        return False
    packed, scales_zeros, group = found
    args = [_const(packed, f"{op.out.name}_w4"), group,
            _const(scales_zeros, f"{op.out.name}_sz")]
    return _matmul_2d(g, op, _INT4_MM, args, packed.shape[0])


_LINEAR_RULES = tuple(
    rule
    for rule, kernel in (
        (qlinear_static, _QLINEAR),
        (linear_dynamic_fbgemm, LINEAR_DYNAMIC_INT8),
        (qlinear_dynamic, _QLINEAR_T),
        (weight_only_int4, _INT4_MM),
        (weight_only_int8, _INT8_MM),
    )
    if kernel in OPS and (kernel != LINEAR_DYNAMIC_INT8 or fbgemm_available())
)

QUANT_RULES: dict[str, tuple[Any, ...]] = {
    "aten.linear.default": _LINEAR_RULES,
    "aten.convolution.default": (qconv_static,) if _QCONV in OPS else (),
}


# ------------------------------------------------------------------------------ uint8 activations

# op -> (index of its zero point, of its dtype) for ops writing an int8 activation that may
# write it as uint8 instead (zero point + 128); quantize's bounds follow its dtype
_WRITERS: dict[str, tuple[int, int]] = {_QCONV: (12, 13), _Q_T: (2, 5)}
# op -> index of its input's zero point, for ops reading an int8 activation (argument 0) that
# read a uint8 one as well (zero point + 128): oneDNN's convolution (which runs on uint8 and
# otherwise shifts every int8 input by 128 per call), dequantize
_READERS: dict[str, int] = {_QCONV: 2, _DQ_T: 2}
_SHIFT = 128


def _writes_int8(op: Op) -> bool:
    at = _WRITERS.get(op.name)
    if at is None or op.args[at[1]] is not torch.int8:
        return False
    return op.name != _Q_T or tuple(op.args[3:5]) == (-128, 127)


def _reads_as_input(op: Op, v: Value) -> bool:
    at = _READERS.get(op.name)
    if at is None or op.args[0] is not v or any(
            x is v for x in values_in([op.args[1:], op.kwargs])):
        return False
    return op.name != _DQ_T or (op.args[5] is torch.int8 and tuple(op.args[3:5]) == (-128, 127))


def uint8_activations(g: Graph) -> bool:
    """Write as uint8 (zero point + 128, the same real values) every int8 activation that only
    oneDNN convolutions and dequantizes read: oneDNN's int8 convolution takes uint8 inputs, so
    each int8 one cost a shift by 128 (a pass over the tensor) per convolution at run time
    (MobileNetV2: ~25% of a forward). Results are unchanged: ``q + 128`` with zero point
    ``z + 128`` dequantizes to what ``q`` with ``z`` does, and quantizing into [0, 255] with
    ``z + 128`` gives ``q + 128`` exactly. True when something changed."""
    outputs = set(g.outputs)
    changed = False
    for op in g.ops:
        v = op.out if len(op.outs) == 1 else None
        if v is None or v in outputs or not _writes_int8(op):
            continue
        readers = g.readers(v)
        if not readers or not all(_reads_as_input(r, v) for r in readers):
            continue
        zp_at, dtype_at = _WRITERS[op.name]
        op.args[zp_at] += _SHIFT
        op.args[dtype_at] = torch.uint8
        if op.name == _Q_T:
            op.args[3:5] = [0, 255]
        v.meta = torch.empty(v.meta.shape, dtype=torch.uint8, device="meta").as_strided(
            v.meta.shape, v.meta.stride())
        for r in readers:
            r.args[_READERS[r.name]] += _SHIFT
            if r.name == _DQ_T:
                r.args[3:6] = [0, 255, torch.uint8]
        changed = True
    return changed
