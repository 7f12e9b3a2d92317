"""oneDNN float32 convolutions whose constant weight the first call packs, for its input
shape (runtime/backends/fused_cpu/sized_conv.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from exportir.runtime.backends.fused_cpu.kernels import KERNELS, Ref, bind
from exportir.runtime.backends.fused_cpu.sized_conv import ConvBinary, ConvPointwise

UNARY = "mkldnn._convolution_pointwise.default"
BINARY = "mkldnn._convolution_pointwise.binary"
pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or KERNELS[UNARY].fn is not
    torch.ops.mkldnn._convolution_pointwise.default, reason="needs oneDNN's convolution")


def _constant(table):
    return lambda r: table.get(r.slot) if isinstance(r, Ref) else None


def test_unary_weight_packed_by_the_first_call_for_its_shape():
    """Packed once, by the first call; calls of the first shape and of another shape run on
    it and equal the convolution (ReLU6 post-op applied). 64 outputs from 384 channels at
    14x14 is a shape whose layout differs from the one oneDNN guesses without a shape."""
    torch.manual_seed(0)
    w, b = torch.randn(64, 384, 1, 1) * 0.05, torch.randn(64)
    args = (Ref(0), Ref(1), Ref(2), [0, 0], [1, 1], [1, 1], 1, "hardtanh", [0.0, 6.0], None)
    call = bind(UNARY, args, {}, False, _constant({1: w, 2: b}))
    assert isinstance(call.fn, ConvPointwise) and call.args[0] == Ref(0) and len(call.args) == 9
    assert call.fn.weight.packed is None
    seen = []
    for hw in (14, 14, 7):
        x = torch.randn(1, 384, hw, hw).contiguous(memory_format=torch.channels_last)
        got = call.fn(x, b, *call.args[2:])
        torch.testing.assert_close(got, F.conv2d(x, w, b).clamp(0, 6), rtol=1e-4, atol=1e-4)
        seen.append(call.fn.weight.packed)
    assert seen[0].is_mkldnn and all(p is seen[0] for p in seen)


def test_binary_weight_packed_by_the_first_call():
    torch.manual_seed(1)
    w = torch.randn(16, 16, 3, 3) * 0.1
    args = (Ref(0), Ref(3), Ref(1), None, [1, 1], [1, 1], [1, 1], 1, "add", None, "relu", [],
            None)
    call = bind(BINARY, args, {}, False, _constant({1: w}))
    assert isinstance(call.fn, ConvBinary) and len(call.args) == 12
    x = torch.randn(1, 16, 9, 9).contiguous(memory_format=torch.channels_last)
    other = torch.randn(1, 16, 9, 9).contiguous(memory_format=torch.channels_last)
    got = call.fn(x, other, *call.args[2:])
    torch.testing.assert_close(got, (F.conv2d(x, w, padding=1) + other).relu(), rtol=1e-4,
                               atol=1e-4)
    assert call.fn.weight.packed.is_mkldnn


def test_a_weight_that_is_no_constant_runs_the_plain_op():
    args = (Ref(0), Ref(1), None, [0, 0], [1, 1], [1, 1], 1, "none", [], None)
    call = bind(UNARY, args, {}, False, _constant({}))
    assert call.fn is KERNELS[UNARY].fn and call.args[1] == Ref(1)


def test_an_input_that_does_not_fit_is_reported_and_packs_nothing():
    """A first call whose input oneDNN cannot pack for (5 channels for a 4-channel weight)
    fails in the convolution, naming the problem; a later call that fits packs and runs."""
    w = torch.randn(8, 4, 3, 3)
    args = (Ref(0), Ref(1), None, [0, 0], [1, 1], [1, 1], 1, "none", [], None)
    call = bind(UNARY, args, {}, False, _constant({1: w}))
    with pytest.raises(RuntimeError):
        call.fn(torch.randn(1, 5, 6, 6), *call.args[1:])
    assert call.fn.weight.packed is None
    x = torch.randn(1, 4, 6, 6)
    torch.testing.assert_close(call.fn(x, *call.args[1:]), F.conv2d(x, w), rtol=1e-4, atol=1e-4)
    assert call.fn.weight.packed.is_mkldnn
