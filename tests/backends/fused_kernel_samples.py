"""Sample arguments for every entry of the fused CPU kernel table (``SAMPLES``: op name ->
list of ``(args, kwargs)``), shared by the kernel tests and the fresh-process tests; tensors are
drawn from a fixed seed, so every import makes the same samples."""

from __future__ import annotations

import torch

from exportir.format import quantized_ops
from exportir.runtime.backends.fused_cpu.dynamic_int8 import LINEAR_DYNAMIC_INT8
from exportir.runtime.backends.fused_cpu.int8_float import exact_int8_products

quantized_ops.define()  # the quantized_decomposed references (torch.ops) the samples compare with

_GEN = torch.Generator().manual_seed(0)


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_GEN)


def _pos(*shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=_GEN) + 0.5


def _i(high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=_GEN)


def _b(*shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=_GEN) > 0.5


# op -> (args, kwargs) builders; tensors become delegate inputs
_UNARY = [
    "abs",
    "ceil",
    "cos",
    "erf",
    "exp",
    "floor",
    "neg",
    "relu",
    "sigmoid",
    "sign",
    "sin",
    "tanh",
    "gelu",
    "hardsigmoid",
    "hardswish",
    "silu",
    "elu",
    "hardtanh",
    "leaky_relu",
]
_POSITIVE = ["log", "log1p", "rsqrt", "sqrt", "reciprocal"]
_BINARY = [
    "add.Tensor",
    "sub.Tensor",
    "mul.Tensor",
    "div.Tensor",
    "maximum",
    "minimum",
    "atan2",
    "eq.Tensor",
    "ne.Tensor",
    "lt.Tensor",
    "le.Tensor",
    "gt.Tensor",
    "ge.Tensor",
    "remainder.Tensor",
]
_SCALAR = [
    "add.Scalar",
    "sub.Scalar",
    "mul.Scalar",
    "div.Scalar",
    "remainder.Scalar",
    "eq.Scalar",
    "ne.Scalar",
    "lt.Scalar",
    "le.Scalar",
    "gt.Scalar",
    "ge.Scalar",
]
_LOGICAL = ["logical_and", "logical_or", "logical_xor", "bitwise_and.Tensor", "bitwise_or.Tensor"]

SAMPLES: dict[str, list] = {}
for _op in _UNARY:
    SAMPLES[f"aten.{_op}.default"] = [((_r(3, 4),), {})]
for _op in _POSITIVE:
    SAMPLES[f"aten.{_op}.default"] = [((_pos(3, 4),), {})]
for _op in _BINARY:
    _name = f"aten.{_op}" if "." in _op else f"aten.{_op}.default"
    SAMPLES[_name] = [((_r(3, 4), _r(4)), {}), ((_r(2, 3), _pos(2, 3)), {})]
for _op in _SCALAR:
    SAMPLES[f"aten.{_op}"] = [((_r(3, 4), 0.5), {}), ((_i(9, 3, 4), 2), {})]
for _op in _LOGICAL:
    _name = f"aten.{_op}" if "." in _op else f"aten.{_op}.default"
    SAMPLES[_name] = [((_b(3, 4), _b(3, 4)), {})]

_x4 = _r(2, 3, 5, 5)
SAMPLES.update({
    "aten.add.Tensor": [((_r(3, 4), _r(4)), {}), ((_r(3, 4), _r(3, 4)), {"alpha": 2.0})],
    "aten.sub.Tensor": [((_r(3, 4), _r(4)), {}), ((_r(3, 4), _r(3, 4)), {"alpha": 0.5})],
    "aten.add.Scalar": [((_r(3, 4), 0.5), {}), ((_r(3, 4), 0.5, 2), {})],
    "aten.sub.Scalar": [((_r(3, 4), 0.5), {}), ((_r(3, 4), 0.5, 2), {})],
    "aten.div.Tensor_mode": [((_r(3, 4), _pos(3, 4)), {"rounding_mode": "floor"})],
    "aten.pow.Tensor_Tensor": [((_pos(3, 4), _r(3, 4)), {})],
    "aten.pow.Tensor_Scalar": [((_r(3, 4), 2), {}), ((_pos(3, 4), 0.5), {})],
    "aten.where.self": [((_b(3, 4), _r(3, 4), _r(4)), {})],
    "aten.logical_not.default": [((_b(3, 4),), {})],
    "aten.bitwise_not.default": [((_b(3, 4),), {}), ((_i(9, 3),), {})],
    "aten.clamp.default": [((_r(3, 4), -0.5, 0.5), {}), ((_r(3, 4), None, 0.1), {})],
    "aten.clamp.Tensor": [((_r(3, 4), _r(4), None), {})],
    "aten.gelu.default": [((_r(3, 4),), {}), ((_r(3, 4),), {"approximate": "tanh"})],
    "aten.hardtanh.default": [((_r(3, 4), -0.5, 0.25), {})],
    "aten.leaky_relu.default": [((_r(3, 4), 0.2), {})],
    "aten.elu.default": [((_r(3, 4), 0.5, 1.5, 2.0), {})],
    "aten._softmax.default": [((_r(3, 4), -1, False), {})],
    "aten._log_softmax.default": [((_r(3, 4), 0, False), {})],
    "aten.native_layer_norm.default": [((_r(2, 3, 4), [4], _r(4), _r(4), 1e-5), {})],
    "aten.layer_norm.default": [((_r(2, 3, 4), [3, 4], _r(3, 4), None, 1e-5), {})],
    "aten.native_group_norm.default": [((_x4, _r(3), _r(3), 2, 3, 25, 3, 1e-5), {})],
    "aten.group_norm.default": [((_x4, 3, _r(3), _r(3), 1e-5), {})],
    "aten._native_batch_norm_legit_no_training.default": [
        ((_x4, _r(3), _r(3), _r(3), _pos(3), 0.1, 1e-5), {})
    ],
    "aten._native_batch_norm_legit_functional.default": [
        ((_x4, _r(3), _r(3), _r(3), _pos(3), True, 0.1, 1e-5), {}),
        ((_x4, None, None, _r(3), _pos(3), False, 0.1, 1e-5), {}),
    ],
    "aten.batch_norm.default": [((_x4, _r(3), _r(3), _r(3), _pos(3), False, 0.1, 1e-5, False), {})],
    "aten.mean.dim": [((_r(3, 4), [1], True), {}), ((_r(3, 4), None), {})],
    "aten.mean.default": [((_r(3, 4),), {})],
    "aten.sum.dim_IntList": [((_r(3, 4), [0]), {}), ((_r(3, 4), [0, 1], True), {})],
    "aten.amax.default": [((_r(3, 4), [1]), {})],
    "aten.amin.default": [((_r(3, 4), [0], True), {})],
    "aten.any.dim": [((_b(3, 4), -1, True), {})],
    "aten.argmax.default": [((_r(3, 4), 1), {}), ((_r(3, 4),), {})],
    "aten.cumsum.default": [((_r(3, 4), 1), {}), ((_i(5, 3, 4), 0), {"dtype": torch.float32})],
    "aten.addmm.default": [((_r(4), _r(3, 5), _r(5, 4)), {}), ((_r(3, 4), _r(3, 5), _r(5, 4)), {"beta": 0.5, "alpha": 2.0})],
    "aten.mm.default": [((_r(3, 5), _r(5, 4)), {})],
    "aten.bmm.default": [((_r(2, 3, 5), _r(2, 5, 4)), {})],
    "aten.matmul.default": [((_r(2, 1, 3, 5), _r(4, 5, 2)), {}), ((_r(3, 5), _r(5)), {})],
    "aten.linear.default": [((_r(2, 3, 5), _r(4, 5), _r(4)), {}), ((_r(3, 5), _r(4, 5)), {})],
    "aten.convolution.default": [
        ((_x4, _r(4, 3, 3, 3), _r(4), [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {}),
        ((_x4, _r(3, 2, 3, 3), None, [2, 2], [0, 0], [1, 1], True, [1, 1], 1), {}),
        ((_r(2, 4, 9), _r(4, 1, 3), None, [1], [1], [1], False, [0], 4), {}),
    ],
    "aten.thnn_conv2d.default": [((_x4, _r(4, 3, 3, 3), [3, 3], _r(4), [1, 1], [1, 1]), {}), ((_x4, _r(4, 3, 1, 2), [1, 2]), {})],
    "aten.slow_conv_transpose2d.default": [((_x4, _r(3, 2, 3, 3), [3, 3], _r(2), [2, 2], [1, 1], [1, 1]), {})],
    "aten.unfold_copy.default": [((_r(2, 3, 9), 2, 3, 2), {})],
    "mkldnn._convolution_pointwise.default": [
        ((_x4, _r(4, 3, 3, 3), _r(4), [1, 1], [1, 1], [1, 1], 1, "none", [], None), {}),
        ((_x4, _r(6, 1, 3, 3), None, [0, 0], [2, 2], [1, 1], 3, "relu", [], None), {}),
        ((_x4, _r(4, 3, 3, 3), _r(4), [1, 1], [1, 1], [1, 1], 1, "hardtanh", [0.0, 6.0], None), {}),
        ((_x4, _r(4, 3, 3, 3), None, [1, 1], [1, 1], [1, 1], 1, "swish", [], None), {}),
        ((_x4, _r(4, 3, 3, 3), None, [1, 1], [1, 1], [1, 1], 1, "hardswish", [], None), {}),
    ],
    "mkldnn._linear_pointwise.default": [
        ((_r(40, 16), _r(8, 16), _r(8), "none", [], None), {}),
        ((_r(2, 20, 16), _r(8, 16), None, "gelu", [], "tanh"), {}),
        ((_r(40, 16), _r(8, 16), _r(8), "hardtanh", [0.0, 6.0], None), {}),
    ],
    "mkldnn._linear_pointwise.binary": [((_r(40, 16), _r(40, 8), _r(8, 16), _r(8), "add"), {})],
    "mkldnn._convolution_pointwise.binary": [
        ((_x4, _r(2, 4, 5, 5), _r(4, 3, 3, 3), _r(4), [1, 1], [1, 1], [1, 1], 1, "add", None, "relu", [], None), {}),
        ((_x4, _r(2, 4, 5, 5), _r(4, 3, 3, 3), None, [1, 1], [1, 1], [1, 1], 1, "add", None, None, [], None), {}),
    ],
    "aten.avg_pool2d.default": [((_x4, [2, 2], [2, 2]), {}), ((_x4, [3, 3], [1, 1], [1, 1], True, False), {})],
    "aten.max_pool2d_with_indices.default": [((_x4, [2, 2], [2, 2]), {})],
    "aten.max_pool2d.default": [((_x4, [3, 3], [2, 2], [1, 1]), {})],
    "aten._adaptive_avg_pool2d.default": [((_x4, [2, 3]), {})],
    "aten.adaptive_max_pool2d.default": [((_x4, [2, 2]), {})],
    "aten.upsample_nearest2d.vec": [((_x4, [10, 7], None), {}), ((_x4, None, [2.0, 2.0]), {})],
    "aten.upsample_bilinear2d.vec": [((_x4, [10, 10], False, None), {}), ((_x4, None, True, [1.5, 2.0]), {})],
    "aten.constant_pad_nd.default": [((_r(2, 3), [1, 2], 0.5), {})],
    "aten._scaled_dot_product_flash_attention_for_cpu.default": [
        ((_r(2, 2, 5, 4), _r(2, 2, 5, 4), _r(2, 2, 5, 4)), {}),
        ((_r(1, 2, 3, 4), _r(1, 2, 6, 4), _r(1, 2, 6, 4), 0.0, True), {"scale": 0.3}),
        ((_r(1, 2, 3, 4), _r(1, 2, 3, 4), _r(1, 2, 3, 4)), {"attn_mask": _r(3, 3)}),
    ],
    "aten.embedding.default": [((_r(10, 4), _i(10, 2, 3)), {}), ((_r(10, 4), _i(10, 5), 0), {})],
    "aten.index.Tensor": [((_r(4, 5), [None, _i(5, 3)]), {}), ((_r(4, 5), [_i(4, 2)]), {})],
    "aten.index_put.default": [((_r(2, 3, 4), [None, None, _i(4, 1)], _r(2, 3, 1)), {}), ((_r(4, 3), [_i(4, 2)], _r(2, 3), True), {})],
    "aten.index_select.default": [((_r(4, 5), 1, _i(5, 3)), {})],
    "aten.gather.default": [((_r(4, 5), 1, _i(5, 4, 2)), {})],
    "aten.scatter_add.default": [((_r(4, 5), 1, _i(5, 4, 2), _r(4, 2)), {})],
    "aten.slice_scatter.default": [((_r(4, 5), _r(4, 2), 1, 1, 3), {})],
    "aten.flip.default": [((_r(3, 4), [0, 1]), {})],
    "aten.roll.default": [((_r(2, 3, 8), [4], [-1]), {}), ((_r(3, 4), [1, -2], [0, 1]), {})],
    "aten.repeat.default": [((_r(2, 3), [2, 1, 2]), {})],
    "aten.full.default": [(([2, 3], 1.5), {"dtype": torch.float32, "layout": torch.strided, "device": torch.device("cpu"), "pin_memory": False})],
    "aten.full_like.default": [((_r(2, 3), 7), {"dtype": torch.int64, "memory_format": torch.preserve_format})],
    "aten.scalar_tensor.default": [((float("-inf"),), {"dtype": torch.float32})],
    "aten.arange.start_step": [((0, 7), {}), ((1, 7, 2), {"dtype": torch.float32})],
    "aten.view_copy.default": [((_r(2, 6), [3, 4]), {}), ((_r(2, 3).t(), [6]), {})],
    "aten.permute_copy.default": [((_r(2, 3, 4), [2, 0, 1]), {})],
    "aten.expand_copy.default": [((_r(3, 1), [2, 3, 4]), {})],
    "aten.unsqueeze_copy.default": [((_r(2, 3), -1), {})],
    "aten.squeeze_copy.dims": [((_r(2, 1, 3, 1), [1, -1]), {})],
    "aten.squeeze_copy.dim": [((_r(2, 1, 3), 1), {})],
    "aten.transpose_copy.int": [((_r(2, 3, 4), 0, 2), {})],
    "aten.select_copy.int": [((_r(2, 3, 4), 1, -1), {})],
    "aten.slice_copy.Tensor": [
        ((_r(4, 6), 1, 1, 5, 2), {}),
        ((_r(4, 6), -1, -3), {}),
        ((_r(4, 6), 0, 1, 9223372036854775807), {}),
        ((_r(4, 6),), {}),
    ],
    "aten.clone.default": [
        ((_r(2, 3),), {}),
        ((_r(2, 3).t(),), {"memory_format": torch.contiguous_format}),
        ((_x4,), {"memory_format": torch.channels_last}),
    ],
    "aten._to_copy.default": [
        ((_r(2, 3),), {"dtype": torch.float64}),
        ((_r(2, 3),), {"dtype": torch.float32}),
        ((_i(5, 2, 3),), {"dtype": torch.float32, "layout": torch.strided, "device": torch.device("cpu")}),
        ((_r(2, 3),), {"memory_format": torch.contiguous_format}),
    ],
    "aten.split_with_sizes_copy.default": [((_r(2, 7), [3, 4], 1), {})],
    "aten.unbind_copy.int": [((_r(3, 2, 4), 1), {})],
    "aten.cat.default": [(([_r(2, 3), _r(1, 3)],), {}), (([_r(2, 3), _r(2, 1)], 1), {})],
})  # fmt: skip


# ------------------------------------------------------------------------------ quantized kernels


def _q8(*shape: int) -> torch.Tensor:
    return torch.randint(-128, 128, shape, dtype=torch.int8, generator=_GEN)


def _int4_packed(n: int, k: int) -> torch.Tensor:
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=_GEN)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)


_W8 = torch.randint(-127, 128, (8, 16), dtype=torch.int8, generator=_GEN)
_QLINEAR_TAIL = (_pos(8) * 0.01, torch.zeros(8, dtype=torch.int64))

SAMPLES.update({
    "quantized_decomposed.quantize_per_tensor.default": [
        ((_r(2, 3), 0.05, 3, -128, 127, torch.int8), {}),
        ((_r(2, 3) * 100, 0.5, 0, 0, 255, torch.uint8), {}),
    ],
    "quantized_decomposed.quantize_per_tensor.tensor": [
        ((_r(2, 3), torch.tensor([0.05], dtype=torch.float64), torch.tensor([3]), -128, 127,
          torch.int8), {}),
    ],
    "quantized_decomposed.dequantize_per_tensor.default": [
        ((_q8(2, 3), 0.05, 3, -128, 127, torch.int8), {}),
        ((_q8(2, 3), 0.05, 3, -128, 127, torch.int8), {"out_dtype": torch.float32}),
    ],
    "quantized_decomposed.dequantize_per_tensor.tensor": [
        ((_q8(2, 3), torch.tensor([0.05], dtype=torch.float64), torch.tensor([-4]), -128, 127,
          torch.int8), {}),
    ],
    "quantized_decomposed.choose_qparams.tensor": [((_r(4, 5), -128, 127, 2**-12, torch.int8), {})],
    "quantized_decomposed.quantize_per_channel.default": [
        ((_r(4, 3), _pos(4), _i(3, 4), 0, -128, 127, torch.int8), {}),
    ],
    "quantized_decomposed.dequantize_per_channel.default": [
        ((_q8(4, 3), _pos(4), torch.zeros(4, dtype=torch.int64), 0, -127, 127, torch.int8), {}),
        ((_q8(4, 3), _pos(3), None, 1, -127, 127, torch.int8), {}),
    ],
    "quantized_decomposed.dequantize_per_channel_group.default": [
        ((torch.randint(0, 16, (4, 64), dtype=torch.uint8, generator=_GEN), _pos(4, 2),
          _i(16, 4, 2), 0, 15, torch.uint8, 32, torch.float32), {}),
    ],
    "aten._weight_int8pack_mm.default": [((_r(3, 16), _W8, _pos(8)), {})],
    "aten._weight_int4pack_mm_for_cpu.default": [
        ((_r(3, 64), _int4_packed(16, 64), 32, _pos(2, 16, 2)), {}),
    ],
    "onednn.qlinear_pointwise.default": [
        ((_q8(2, 16), 0.1, 0, _W8, *_QLINEAR_TAIL, _r(8), 1.0, 0, torch.float32, "none", [], ""),
         {}),
        ((_q8(2, 5, 16), 0.1, 3, _W8, *_QLINEAR_TAIL, None, 0.05, -2, torch.int8, "relu", [], ""),
         {}),
    ],
    "onednn.qlinear_pointwise.tensor": [
        ((_q8(2, 16), torch.tensor([0.1], dtype=torch.float64), torch.tensor([1]), _W8,
          *_QLINEAR_TAIL, None, 1.0, 0, torch.float32, "none", [], ""), {}),
    ],
    "onednn.qconv_pointwise.default": [
        ((_q8(1, 4, 6, 6), 0.1, 3, torch.randint(-127, 128, (8, 4, 3, 3), dtype=torch.int8,
                                                 generator=_GEN),
          *_QLINEAR_TAIL, _r(8), [1, 1], [1, 1], [1, 1], 1, 0.05, -2, torch.int8, "relu", [],
          ""), {}),
        ((_q8(2, 8, 5, 5), 0.1, 0, torch.randint(-127, 128, (8, 1, 3, 3), dtype=torch.int8,
                                                 generator=_GEN),
          *_QLINEAR_TAIL, None, [2, 2], [1, 1], [1, 1], 8, 0.2, 0, torch.int8, "none", [], ""),
         {}),
    ],
})  # fmt: skip


def _reference_qconv(qx, x_scale, x_zp, w, w_scales, w_zps, bias, stride, padding, dilation,
                     groups, out_scale, out_zp, out_dtype, post_op, post_args, algorithm):
    """oneDNN's qconv reads its weight packed and an uint8 input; the reference packs it and
    shifts the int8 input by 128 (the fused kernel does both itself)."""
    qu = torch.bitwise_xor(qx.contiguous(memory_format=torch.channels_last).view(torch.uint8),
                           128)
    packed = torch.ops.onednn.qconv_prepack(w, w_scales, x_scale, x_zp + 128, stride, padding,
                                            dilation, groups, None)
    return torch.ops.onednn.qconv_pointwise.default(
        qu, x_scale, x_zp + 128, packed, w_scales, w_zps, bias, stride, padding, dilation,
        groups, out_scale, out_zp, out_dtype, post_op, post_args, algorithm)


def _packed_qlinear(op):
    """oneDNN's qlinear reads its weight packed (an int8 [N, K] weight would be misread);
    the fused kernel packs it itself."""

    def run(qx, x_scale, x_zp, w, *rest):
        return op(qx, x_scale, x_zp, torch.ops.onednn.qlinear_prepack(w, None), *rest)

    return run


def _rnn_params(gates: int, features: int, hidden: int, layers: int, dirs: int) -> list:
    out = []
    for layer in range(layers):
        width = features if layer == 0 else dirs * hidden
        for _ in range(dirs):
            out += [_r(gates * hidden, width), _r(gates * hidden, hidden), _r(gates * hidden),
                    _r(gates * hidden)]
    return out


SAMPLES.update({
    # (input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    "aten.lstm.input": [
        ((_r(2, 5, 3), [_r(2, 2, 4), _r(2, 2, 4)], _rnn_params(4, 3, 4, 2, 1), True, 2, 0.0,
          False, False, True), {}),
        ((_r(5, 1, 3), [_r(2, 1, 4), _r(2, 1, 4)], _rnn_params(4, 3, 4, 1, 2), True, 1, 0.0,
          False, True, False), {}),
    ],
    "aten.gru.input": [
        ((_r(2, 5, 3), _r(2, 2, 4), _rnn_params(3, 3, 4, 2, 1), True, 2, 0.0, False, False,
          True), {}),
        ((_r(5, 1, 3), _r(2, 1, 4), _rnn_params(3, 3, 4, 1, 2)[:2] + _rnn_params(3, 3, 4, 1, 2)[4:6],
          False, 1, 0.0, False, True, False), {}),
        # time-major, a batch of 3, no biases: the fused step loop (GruKernel)
        ((_r(5, 3, 3), _r(1, 3, 4), _rnn_params(3, 3, 4, 1, 1)[:2], False, 1, 0.0, False, False,
          False), {}),
    ],
})  # fmt: skip


def _no_grad(op):
    """torch's RNN ops take oneDNN's sequence kernel only without autograd, as delegates run."""

    def run(*args, **kwargs):
        with torch.no_grad():
            return op(*args, **kwargs)

    return run


def _reference_linear_dynamic_int8(x, w, w_scales, bias, eps, post_op):
    """The PT2E dynamic pattern the kernel computes, in torch's own quantized_decomposed ops."""
    import torch.ao.quantization.fx._decomposed  # registers quantized_decomposed

    qd = torch.ops.quantized_decomposed
    scale, zp = qd.choose_qparams.tensor(x, -128, 127, eps, torch.int8)
    q = qd.quantize_per_tensor.tensor(x, scale, zp, -128, 127, torch.int8)
    dq = qd.dequantize_per_tensor.tensor(q, scale, zp, -128, 127, torch.int8)
    dw = qd.dequantize_per_channel(w, w_scales, torch.zeros_like(w_scales, dtype=torch.int64),
                                   0, -127, 127, torch.int8)
    out = torch.nn.functional.linear(dq, dw, bias)
    return torch.relu(out) if post_op == "relu" else out


SAMPLES[LINEAR_DYNAMIC_INT8] = [
    ((_r(2, 16), _W8, _QLINEAR_TAIL[0], _r(8), 1.1920928955078125e-07, "none"), {}),
    ((_r(3, 2, 16) * 7, _W8, _QLINEAR_TAIL[0], None, 1e-5, "relu"), {}),
    ((_pos(1, 16), _W8, _QLINEAR_TAIL[0], _r(8), 1.1920928955078125e-07, "relu"), {}),
]


def _float64_qlinear(qx, x_scale, x_zp, w, w_scales, w_zps, bias, out_scale, out_zp, out_dtype,
                     post_op, post_args, algorithm):
    """``quantize(post(dequantize(qx) @ dequantize(W).T + b))`` in float64."""
    x = (qx.double() - _number(x_zp)) * _number(x_scale)
    y = torch.nn.functional.linear(x, _dequantized(w, w_scales, w_zps),
                                   None if bias is None else bias.double())
    return _quantized(y, qx.dtype, out_scale, out_zp, out_dtype, post_op, post_args)


def _float64_qconv(qx, x_scale, x_zp, w, w_scales, w_zps, bias, stride, padding, dilation,
                   groups, out_scale, out_zp, out_dtype, post_op, post_args, algorithm):
    """The convolution's quantized reference in float64; channels-last as oneDNN's result."""
    x = (qx.double() - x_zp) * x_scale
    y = torch.nn.functional.conv2d(x, _dequantized(w, w_scales, w_zps),
                                   None if bias is None else bias.double(), stride, padding,
                                   dilation, groups)
    y = _quantized(y, qx.dtype, out_scale, out_zp, out_dtype, post_op, post_args)
    return y.contiguous(memory_format=torch.channels_last)


def _number(v):
    return v.item() if isinstance(v, torch.Tensor) else v


def _dequantized(w, w_scales, w_zps):
    view = (-1,) + (1,) * (w.dim() - 1)
    return (w.double() - w_zps.double().reshape(view)) * w_scales.double().reshape(view)


def _quantized(y, in_dtype, out_scale, out_zp, out_dtype, post_op, post_args):
    if post_op == "relu":
        y = y.relu()
    elif post_op == "hardtanh":
        y = y.clamp(*post_args)
    dtype = in_dtype if out_dtype is None else out_dtype
    if dtype not in (torch.int8, torch.uint8):
        return y.to(dtype)
    lo, hi = (-128, 127) if dtype == torch.int8 else (0, 255)
    return (torch.round(y / out_scale) + out_zp).clamp(lo, hi).to(dtype)


# kernels that compute the op's arithmetic in another order than ATen's: equal to the reference
# up to float32 rounding (torch's default tolerances; one step for integer results), not bit
# for bit
ROUNDING = frozenset({"aten.gru.input"})

# ops whose torch reference takes its arguments differently from the fused kernel
REFERENCES = {
    LINEAR_DYNAMIC_INT8: _reference_linear_dynamic_int8,
    "aten.lstm.input": _no_grad(torch.ops.aten.lstm.input),
    "aten.gru.input": _no_grad(torch.ops.aten.gru.input),
    "onednn.qlinear_pointwise.default": _packed_qlinear(torch.ops.onednn.qlinear_pointwise.default),
    "onednn.qlinear_pointwise.tensor": _packed_qlinear(torch.ops.onednn.qlinear_pointwise.tensor),
    "onednn.qconv_pointwise.default": _reference_qconv,
}

# Without VNNI oneDNN's uint8 x int8 products saturate (fused_cpu/int8_float.py): the ATen ops
# are no oracle there, the float64 quantized references are, and the kernels (float32 there)
# match them up to rounding
if not exact_int8_products():
    REFERENCES.update({
        "onednn.qlinear_pointwise.default": _float64_qlinear,
        "onednn.qlinear_pointwise.tensor": _float64_qlinear,
        "onednn.qconv_pointwise.default": _float64_qconv,
    })
    ROUNDING = ROUNDING | {"onednn.qlinear_pointwise.default", "onednn.qlinear_pointwise.tensor",
                           "onednn.qconv_pointwise.default"}


def assert_same(got: torch.Tensor, expected: torch.Tensor, exact: bool) -> None:
    """``got`` equals ``expected`` bit for bit, or (``exact`` false) up to float32 rounding:
    torch's default tolerances for floats, one step for integers."""
    if exact:
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    elif expected.is_floating_point():
        torch.testing.assert_close(got, expected, equal_nan=True)
    else:
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got.int(), expected.int(), rtol=0, atol=1)
