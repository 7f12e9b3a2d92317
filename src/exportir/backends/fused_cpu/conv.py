"""Small convolutions on the kernels that are fast for them.

``aten.convolution`` picks oneDNN (mkldnn) on CPU, which costs some 30-40 us per call whatever
the size for 1-D convolutions and for batches above one; for small convolutions torch's plain
kernels take a few microseconds (measured on the benchmark machine; the crossover is around a
million multiply-adds). So a convolution of at most :data:`SMALL_CONV_MACS` multiply-adds
becomes (``_nn`` kernels, 1-D ones through a size-1 height):

- ``thnn_conv2d`` (im2col + GEMM) when not transposed, ``groups == 1``, no dilation;
- ``slow_conv_transpose2d`` when transposed and ``groups == 1``;
- pad + ``unfold`` + ``mul`` + ``sum`` (+ bias) for a 1-D depthwise convolution (one filter per
  channel, no dilation).

Larger 2-D convolutions with a constant weight, and grouped (depthwise) 2-D ones at every size,
become oneDNN's ``mkldnn::_convolution_pointwise`` (the executor packs the weight into oneDNN's
blocked layout once, by the first call, for its input shape, instead of on every call), and a
``relu`` after one, or an ``add`` of a tensor of the same shape (then a ``relu``: a residual
block's tail), joins it. A 1x1
convolution of a 1x1 image (a squeeze-excite block's) is a ``linear`` of the reshaped weight.

Results match ``convolution`` up to float rounding (another summation order).
"""

from __future__ import annotations

import math

import torch

from exportir.backends.fused_cpu.ir import Graph, Op, Value, static_shape
from exportir.runtime.backends.fused_cpu import OPS

__all__ = [
    "CONV_FUSIONS",
    "CONV_RULES",
    "SMALL_CONV_MACS",
    "channels_last",
    "grouped_2d",
    "pointwise_on_pixel",
]

SMALL_CONV_MACS = 1 << 20
_POINTWISE = "mkldnn._convolution_pointwise.default"
_BINARY = "mkldnn._convolution_pointwise.binary"

_UNSQUEEZE = "aten.unsqueeze_copy.default"
_VIEW = "aten.view_copy.default"


def _macs(op: Op, w_shape: tuple[int, ...]) -> int:
    out = static_shape(op.out)
    transposed = op.args[6]
    per_output = (w_shape[0] if transposed else w_shape[1]) * math.prod(w_shape[2:])
    return math.prod(out) * per_output if out is not None else SMALL_CONV_MACS + 1


def small_conv(g: Graph, op: Op) -> bool:
    x, w, _bias, *params, groups = op.args
    x_shape, w_shape = static_shape(x), static_shape(w)
    if x_shape is None or w_shape is None or len(x_shape) not in (3, 4) or op.kwargs:
        return False
    transposed = params[3]
    stride, padding, dilation, output_padding = (
        _spatial(p, len(x_shape) - 2) for p in (*params[:3], params[4])
    )
    if pointwise_on_pixel(x_shape, w_shape, padding, groups, transposed):
        return _as_linear(g, op)
    if _macs(op, w_shape) > SMALL_CONV_MACS or grouped_2d(x_shape, groups, transposed):
        return _onednn(g, op, stride, padding, dilation)
    if any(d != 1 for d in dilation):
        return False
    if groups == 1:
        return _plain(g, op, stride, padding, output_padding)
    depthwise = w_shape[0] == x_shape[1] == groups and w_shape[1] == 1
    if depthwise and not transposed and len(x_shape) == 3:
        return _depthwise_1d(g, op, stride[0], padding[0])
    return False


def grouped_2d(x_shape: tuple[int, ...], groups: int, transposed: bool) -> bool:
    """A grouped (depthwise) 2-D convolution: oneDNN with a packed weight at every size (its
    NHWC depthwise kernel took 0.8x of ``convolution``'s at 7x7-14x14, and an activation
    after it then joins it as a post-op)."""
    return groups != 1 and len(x_shape) == 4 and not transposed


def pointwise_on_pixel(x_shape: tuple[int, ...], w_shape: tuple[int, ...], padding: list,
                        groups: int, transposed: bool) -> bool:  # fmt: skip
    """A 1x1 convolution of a 1x1 image (a squeeze-excite block's): a matrix product."""
    return (len(x_shape) == 4 and x_shape[2:] == (1, 1) and w_shape[2:] == (1, 1)
            and groups == 1 and not transposed and not any(padding))  # fmt: skip


def _as_linear(g: Graph, op: Op) -> bool:
    """``conv(x, w, b)`` of a ``[N, C, 1, 1]`` input and 1x1 kernel is ``linear(x.view(N, C),
    w.view(O, C), b).view(N, O, 1, 1)``: one GEMV (some 3 us) instead of ``thnn_conv2d``'s
    im2col path (8-20 us) for a squeeze-excite block's two convolutions."""
    x, w, bias = op.args[:3]
    n, c = static_shape(x)[:2]
    o = static_shape(w)[0]
    nodes = op.nodes
    flat = g.emit_before(op, _VIEW, [x, [n, c]], (n, c), x.dtype, nodes)
    w2 = g.emit_before(op, _VIEW, [w, [o, c]], (o, c), w.dtype, nodes)
    out = g.emit_before(op, "aten.linear.default", [flat, w2, bias], (n, o), op.out.dtype, nodes)
    op.name, op.args, op.kwargs = _VIEW, [out, [n, o, 1, 1]], {}
    g.changed()
    return True


def _spatial(param: list[int], n: int) -> list[int]:
    """``param`` (stride, padding...) for each of ``n`` spatial dims: ``aten.convolution``
    repeats a one-element list (``Conv2d(padding="valid")`` exports ``padding=[0]``)."""
    items = list(param)
    return items * n if len(items) == 1 else items


def _plain(g: Graph, op: Op, stride: list, padding: list, output_padding: list) -> bool:
    x, w, bias = op.args[:3]
    transposed = op.args[6]
    one_d = len(static_shape(x)) == 3
    nodes = op.nodes
    if one_d:  # through a size-1 height
        x = g.emit_before(op, _UNSQUEEZE, [x, 2], _with_height(x), x.dtype, nodes)
        w = g.emit_before(op, _UNSQUEEZE, [w, 2], _with_height(w), w.dtype, nodes)
        stride, padding, output_padding = [1, *stride], [0, *padding], [0, *output_padding]
    kernel = list(static_shape(w)[2:])
    if transposed:
        name = "aten.slow_conv_transpose2d.default"
        args = [x, w, kernel, bias, stride, padding, output_padding, [1, 1]]
    else:
        name, args = "aten.thnn_conv2d.default", [x, w, kernel, bias, stride, padding]
    if not one_d:
        op.name, op.args = name, args
        g.changed()
        return True
    out = g.emit_before(op, name, args, _with_height(op.out), op.out.dtype, nodes)
    op.name, op.args = "aten.squeeze_copy.dims", [out, [2]]
    g.changed()
    return True


def _depthwise_1d(g: Graph, op: Op, stride: int, padding: int) -> bool:
    x, w, bias = op.args[:3]
    n, c, length = static_shape(x)
    k = static_shape(w)[2]
    nodes, dtype = op.nodes, op.out.dtype
    if padding:
        length += 2 * padding
        x = g.emit_before(op, "aten.constant_pad_nd.default", [x, [padding, padding], 0.0],
                          (n, c, length), dtype, nodes)  # fmt: skip
    out_len = static_shape(op.out)[2]
    windows = g.emit_before(op, "aten.unfold_copy.default", [x, 2, k, stride],
                            (n, c, out_len, k), dtype, nodes)  # fmt: skip
    products = g.emit_before(op, "aten.mul.Tensor", [windows, w], (n, c, out_len, k), dtype, nodes)
    if bias is None:
        op.name, op.args = "aten.sum.dim_IntList", [products, [-1]]
        g.changed()
        return True
    sums = g.emit_before(
        op, "aten.sum.dim_IntList", [products, [-1]], (n, c, out_len), dtype, nodes
    )
    column = g.emit_before(op, _UNSQUEEZE, [bias, 1], (c, 1), bias.dtype, nodes)
    op.name, op.args = "aten.add.Tensor", [sums, column]
    g.changed()
    return True


def _onednn(g: Graph, op: Op, stride: list, padding: list, dilation: list) -> bool:
    x, w, bias = op.args[:3]
    transposed, groups = op.args[6], op.args[8]
    if transposed or len(static_shape(x)) != 4 or w.const is None or not _has_onednn():
        return False
    if x.dtype != torch.float32 or w.dtype != torch.float32:
        return False
    op.name = _POINTWISE
    op.args = [x, w, bias, padding, stride, dilation, groups, "none", [], None]
    g.changed()
    return True


def _has_onednn() -> bool:
    return torch.backends.mkldnn.is_available() and _POINTWISE in OPS


def conv_relu(g: Graph, op: Op) -> bool:
    """``relu`` of a oneDNN convolution it alone reads runs inside it."""
    conv = g.producer(op.args[0])
    if conv is None or g.only_reader(op.args[0]) is not op:
        return False
    if conv.name == _POINTWISE and conv.args[7] == "none":
        op.args = [*conv.args[:7], "relu", *conv.args[8:]]
    elif conv.name == _BINARY and conv.args[10] is None:
        op.args = [*conv.args[:10], "relu", *conv.args[11:]]
    else:
        return False
    op.name, op.nodes = conv.name, (*conv.nodes, *op.nodes)
    g.remove(conv)
    return True


def conv_add(g: Graph, op: Op) -> bool:
    """``add(conv(x), other)`` (either order, same shapes, no alpha) of a oneDNN convolution
    it alone reads is one binary convolution; it runs where the add did (``other`` may come
    later than the convolution)."""
    found = g.residual_add(op, _POINTWISE, 7)
    if found is None:
        return False
    conv, other = found
    x, w, bias, padding, stride, dilation, groups = conv.args[:7]
    op.name, op.nodes = _BINARY, (*conv.nodes, *op.nodes)
    op.args = [
        x,
        other,
        w,
        bias,
        padding,
        stride,
        dilation,
        groups,
        "add",
        None,
        None,
        [],
        None,
    ]
    g.remove(conv)
    return True


def _with_height(v: Value) -> tuple[int, ...]:
    shape = static_shape(v)
    return (*shape[:2], 1, *shape[2:])


# Ops whose result has its first argument's shape and memory order when that argument is
# channels-last (TensorIterator keeps the first operand's order; a [N, C, 1, 1] second operand
# broadcasts over it).
_KEEPS_ORDER = frozenset({
    "aten.relu.default", "aten.sigmoid.default", "aten.tanh.default", "aten.silu.default",
    "aten.hardswish.default", "aten.hardsigmoid.default", "aten.hardtanh.default",
    "aten.clamp.default", "aten.gelu.default", "aten.leaky_relu.default", "aten.elu.default",
    "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor",
})  # fmt: skip


def _channels_last_values(g: Graph) -> set[int]:
    """Ids of the values known to be channels-last when the delegate runs: the outputs of the
    oneDNN convolutions (NHWC in, NHWC out), of channels-last ``clone`` s, and of
    order-keeping ops (:data:`_KEEPS_ORDER`) of one of them, same shape."""
    known: set[int] = set()
    for op in g.ops:
        if len(op.outs) == 1 and _makes_channels_last(op, known):
            known.add(id(op.out))
    return known


def _makes_channels_last(op: Op, known: set[int]) -> bool:
    if op.name in (_POINTWISE, _BINARY):
        return True
    if op.name == "aten.clone.default":
        return op.kwargs.get("memory_format") is torch.channels_last
    first = op.args[0] if op.args else None
    return (op.name in _KEEPS_ORDER and isinstance(first, Value) and id(first) in known
            and static_shape(first) == static_shape(op.out))  # fmt: skip


def channels_last(g: Graph) -> bool:
    """Every oneDNN convolution reads its input in channels-last order (NHWC): its output is
    then channels-last too, elementwise ops keep that order, so a conv net converts once, at
    its first convolution; a conversion is inserted only where the input is not known to be
    channels-last already (:func:`_channels_last_values`; a conversion of a channels-last
    tensor would return it unchanged, but still cost a call). oneDNN runs NHWC convolutions
    1.1-5x faster than NCHW ones on the benchmark machine (depthwise 3x3 most). Results match
    up to float rounding."""
    changed = False
    known = _channels_last_values(g)
    for op in list(g.ops):
        if op.name not in (_POINTWISE, _BINARY) or not isinstance(op.args[0], Value):
            continue
        x = op.args[0]
        if id(x) in known:
            continue
        nodes = (*op.nodes[:1], f"{op.nodes[0]}_channels_last")
        value = Value(torch.empty(static_shape(x), dtype=x.dtype, device="meta"), name=nodes[-1])
        g.insert_before(op, Op("aten.clone.default", [x], {"memory_format": torch.channels_last},
                               [value], False, nodes))  # fmt: skip
        op.args[0] = value
        known.add(id(value))
        changed = True
    if changed:
        g.changed()  # ops now read the conversions: the reader index learns it
    return changed


CONV_RULES = {"aten.convolution.default": (small_conv,)}
CONV_FUSIONS = {"aten.relu.default": (conv_relu,), "aten.add.Tensor": (conv_add,)}
