"""Quantized kernels the fused CPU executor makes at load for ops with constant arguments:
static int8 linears (``runtime/backends/fused_cpu/qlinear.py``), both kernels (``_int_mm`` for
few rows, oneDNN for more) against the quantized reference ``quantize(post(dequantize(qx) @
dequantize(W).T + b))`` in int8 steps; per-tensor quantize / dequantize with literal qparams,
bit for bit against the library functions; static int8 convolutions, bit for bit against the
kernel that checks and packs on every call."""

from __future__ import annotations

import pytest
import torch

from exportir.format import quantized_ops as q
from exportir.runtime.backends.fused_cpu import int8_float
from exportir.runtime.backends.fused_cpu.int8_float import FloatQConv, FloatQLinear
from exportir.runtime.backends.fused_cpu.kernels import KERNELS, Ref, bind
from exportir.runtime.backends.fused_cpu.qlinear import (
    SMALL_MACS,
    QLinearError,
    StaticQLinear,
    small_product,
)
from exportir.runtime.backends.fused_cpu.quantized import QuantizedKernelError, StaticQConv

QLINEAR = "onednn.qlinear_pointwise.default"
pytestmark = pytest.mark.skipif(QLINEAR not in KERNELS, reason="torch built without oneDNN")

X_SCALE, OUT_SCALE = 0.05, 0.2


def _reference(qx, x_zp, w, ws, b, out_zp, out_dtype, post):
    x = q.dequantize_per_tensor(qx, X_SCALE, x_zp, -128, 127, torch.int8)
    y = torch.nn.functional.linear(x, w.float() * ws[:, None], b)
    y = torch.relu(y) if post == "relu" else y
    if out_dtype == torch.float32:
        return y
    return q.quantize_per_tensor(y, OUT_SCALE, out_zp, -128, 127, torch.int8)


def _bound(w, ws, x_zp, b_slot, out_zp, out_dtype, post):
    """The call the executor binds for a blob whose weight and scales are constants."""
    n = w.shape[0]
    constants = {1: w, 2: ws, 3: torch.zeros(n, dtype=torch.int64)}
    out_scale, zp = (OUT_SCALE, out_zp) if out_dtype == torch.int8 else (1.0, 0)
    args = [Ref(0), X_SCALE, x_zp, Ref(1), Ref(2), Ref(3), b_slot, out_scale, zp, out_dtype,
            post, [], ""]
    call = bind(QLINEAR, tuple(args), {}, False,
                lambda r: constants.get(r.slot) if isinstance(r, Ref) else None)
    return call, constants  # the constants: what the executor resolves the call's Refs to


def _prepared(w, ws, x_zp, b_slot, out_zp, out_dtype, post):
    """The kernel made at load where oneDNN's int8 products are exact: a StaticQLinear."""
    kernel = _bound(w, ws, x_zp, b_slot, out_zp, out_dtype, post)[0].fn
    assert isinstance(kernel, StaticQLinear)
    return kernel


def _as_called(call, constants):
    """``(qx, bias) -> result`` for a bound call, whichever kernel load chose."""
    if isinstance(call.fn, StaticQLinear):
        return call.fn
    args = _resolved(call.args, constants)
    assert isinstance(args[3], FloatQLinear)  # saturating CPU: the weight dequantized at load
    return lambda qx, b: call.fn(qx, *args[1:6], b, *args[7:])


def _resolved(args, constants):
    return [constants.get(a.slot) if isinstance(a, Ref) else a for a in args]


@pytest.mark.parametrize("cpu", ["this_cpu", "saturating_cpu"])
@pytest.mark.parametrize("rows", [(1,), (3,), (2, 5), (64,), (4, 50)], ids=str)
@pytest.mark.parametrize(("post", "out_zp"), [("relu", -128), ("relu", 7), ("none", 3)])
@pytest.mark.parametrize("out_dtype", [torch.int8, torch.float32], ids=["int8", "float32"])
def test_static_qlinear_matches_the_quantized_reference(rows, post, out_zp, out_dtype, cpu,
                                                         request):
    """Whichever kernel load binds (StaticQLinear where oneDNN's int8 products are exact, the
    float32 form where they saturate: forced by ``saturating_cpu``), against the reference."""
    if cpu == "saturating_cpu":
        request.getfixturevalue("saturating_cpu")
    torch.manual_seed(len(rows) * 31 + rows[0] + out_zp)
    k, n = 96, 40
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    ws = torch.rand(n) * 0.01 + 1e-3
    b, x_zp = torch.randn(n), -9
    call, constants = _bound(w, ws, x_zp, None, out_zp, out_dtype, post)
    assert isinstance(call.fn, StaticQLinear) == int8_float.exact_int8_products()
    kernel = _as_called(call, constants)
    for _ in range(2):
        qx = torch.randint(-128, 128, (*rows, k), dtype=torch.int8)
        got = kernel(qx, b)
        want = _reference(qx, x_zp, w, ws, b, out_zp, out_dtype, post)
        assert got.shape == want.shape and got.dtype == want.dtype
        if out_dtype == torch.float32:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
            continue
        steps = (got.int() - want.int()).abs()
        assert steps.max() <= 1 and (steps > 0).float().mean() < 0.01, steps.max()
        if post == "relu":
            assert got.min() >= max(out_zp, -128)


def test_both_kernels_agree_and_the_rule_picks_by_size(exact_cpu):
    torch.manual_seed(1)
    k, n = 256, 64
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    ws = torch.rand(n) * 0.01 + 1e-3
    b = torch.randn(n)
    kernel = _prepared(w, ws, 4, None, -128, torch.int8, "relu")
    qx = torch.randint(-128, 128, (5, k), dtype=torch.int8)
    small, dnn = kernel(qx, b), kernel.onednn(qx, b)
    assert (small.int() - dnn.int()).abs().max() <= 1
    assert small_product(1, 4096, 4096) and small_product(8, n, k)
    assert not small_product(2, 1024, SMALL_MACS // 1024)  # two rows of that: 2x the budget


def test_a_changed_bias_is_folded_again(exact_cpu):
    """The bias is a delegate input: the folded shift follows a new tensor or one written in
    place, and a bias of the wrong shape is refused by name."""
    torch.manual_seed(2)
    k, n = 32, 16
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    ws = torch.rand(n) * 0.01 + 1e-3
    kernel = _prepared(w, ws, 0, None, 0, torch.float32, "none")
    qx = torch.randint(-128, 128, (1, k), dtype=torch.int8)
    b = torch.randn(n)
    first = kernel(qx, b)
    b.add_(1.0)
    torch.testing.assert_close(kernel(qx, b), first + 1.0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kernel(qx, None), first - b + 1.0, rtol=1e-5, atol=1e-4)
    with pytest.raises(QLinearError, match=r"bias must be float32 \[16\]"):
        kernel(qx, torch.randn(15))
    with pytest.raises(QLinearError, match=r"int8 / uint8 \[\.\.\., 32\]"):
        kernel(torch.zeros(1, 31, dtype=torch.int8), b)


def test_a_repeated_call_skips_only_checks_its_first_call_made(exact_cpu):
    """The second call with the same int8 shape and bias runs straight to _int_mm; any other
    input (another dtype or shape, not a tensor) is checked again."""
    torch.manual_seed(5)
    k, n = 32, 16
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    kernel = _prepared(w, torch.rand(n) * 0.01 + 1e-3, 2, None, 1, torch.int8, "relu")
    qx, b = torch.randint(-128, 128, (1, k), dtype=torch.int8), torch.randn(n)
    first = kernel(qx, b)
    assert kernel._fast[0] == qx.shape and torch.equal(kernel(qx, b), first)
    assert torch.equal(kernel(qx.to(torch.uint8), b), kernel.onednn(qx.to(torch.uint8), b))
    with pytest.raises(QLinearError, match=r"int8 / uint8 \[\.\.\., 32\]"):
        kernel(qx.tolist(), b)
    assert kernel(qx.expand(3, k), b).shape == (3, n)


def test_a_uint8_input_runs_onednn(exact_cpu):
    torch.manual_seed(3)
    k, n = 32, 16
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    ws = torch.rand(n) * 0.01 + 1e-3
    kernel = _prepared(w, ws, 5, None, 0, torch.int8, "none")
    qx = torch.randint(-128, 128, (1, k), dtype=torch.int8)
    b = torch.randn(n)
    as_uint8 = (qx.view(torch.uint8) ^ 128)  # the same values, zero point + 128
    got = KERNELS[QLINEAR].fn(as_uint8, X_SCALE, 5 + 128, w, ws,
                              torch.zeros(n, dtype=torch.int64), b, OUT_SCALE, 0, torch.int8,
                              "none", [], "")
    assert (got.int() - kernel(qx, b).int()).abs().max() <= 1


@pytest.mark.parametrize("zp", [0, -7])
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8], ids=["int8", "uint8"])
def test_per_tensor_quantize_made_at_load_equals_the_library(zp, dtype):
    """Literal qparams: the kernel made at load gives the library's results bit for bit, on
    values at half steps (ties) and out of range too; other input dtypes run the library."""
    scale = 0.0286  # not a float32 number: the kernel's constants must round as torch does
    lo, hi = (-128, 127) if dtype == torch.int8 else (0, 255)
    zp = zp if dtype == torch.int8 else 128 + zp
    names = [f"quantized_decomposed.{op}_per_tensor.default" for op in ("quantize", "dequantize")]
    quantize, dequantize = (bind(n, (Ref(0), scale, zp, lo, hi, dtype), {}).fn for n in names)
    assert quantize is not KERNELS[names[0]].fn and dequantize is not KERNELS[names[1]].fn
    x = torch.cat([(torch.arange(-80, 80) + 0.5) * scale, torch.randn(300) * 3]).reshape(2, -1)
    got = quantize(x)
    assert torch.equal(got, q.quantize_per_tensor(x, scale, zp, lo, hi, dtype))
    assert torch.equal(dequantize(got), q.dequantize_per_tensor(got, scale, zp, lo, hi, dtype))
    half = x.to(torch.bfloat16)
    assert torch.equal(quantize(half), q.quantize_per_tensor(half, scale, zp, lo, hi, dtype))


QCONV = "onednn.qconv_pointwise.default"


@pytest.mark.skipif(QCONV not in KERNELS, reason="torch built without oneDNN's qconv")
def test_qconv_weight_packed_at_load_serves_int8_and_uint8_inputs(exact_cpu):
    """oneDNN packs a convolution weight for the input zero point it sees (an int8 input's +
    128); load guesses the input's dtype from the zero point (the key the first call packs
    for) and a call with the other packs once more: both give what the weight packed at the
    call gives."""
    torch.manual_seed(5)
    w = torch.randint(-127, 128, (8, 4, 3, 3), dtype=torch.int8)
    ws = torch.rand(8) * 0.01 + 1e-3
    constants = {1: w, 2: ws, 3: torch.zeros(8, dtype=torch.int64)}
    geometry = [[1, 1], [1, 1], [1, 1], 1]
    tail = [0.1, 3, torch.int8, "relu", [], ""]
    call = bind(QCONV, (Ref(0), X_SCALE, 5, Ref(1), Ref(2), Ref(3), None, *geometry, *tail), {},
                False, lambda r: constants.get(r.slot) if isinstance(r, Ref) else None)
    assert isinstance(call.fn, StaticQConv) and len(call.args) == 2  # (qx, bias)
    packed = call.fn.weight
    assert packed.key[1] == 5  # zero point >= 0: packed for a uint8 input
    qx = torch.randint(-128, 128, (1, 4, 6, 6), dtype=torch.int8)
    as_uint8 = qx.view(torch.uint8) ^ 128
    plain, b = KERNELS[QCONV].fn, torch.randn(8)
    for x in (as_uint8, qx, qx):
        want = plain(x, X_SCALE, 5, w, ws, constants[3], b, *geometry, *tail)
        assert torch.equal(call.fn(x, b), want)
        assert torch.equal(plain(x, X_SCALE, 5, packed, ws, constants[3], b, *geometry, *tail),
                           want)
    assert list(packed.others) == [(X_SCALE, 5 + 128, (1, 1), (1, 1), (1, 1), 1)]
    with pytest.raises(QuantizedKernelError, match="packed for other input qparams or geometry"):
        plain(qx, X_SCALE, 5, packed, ws, constants[3], None, [2, 2], *geometry[1:], *tail)
    with pytest.raises(QuantizedKernelError, match=r"int8 / uint8 \[N, 4, H, W\] at least as"):
        call.fn(torch.zeros(1, 4, 0, 6, dtype=torch.int8), None)  # 0 rows + padding < 3
    with pytest.raises(QuantizedKernelError, match=r"\[N, 4, H, W\]"):
        call.fn(torch.zeros(1, 3, 6, 6, dtype=torch.uint8), None)
    with pytest.raises(QuantizedKernelError, match="bias must be float32 with 8 elements"):
        call.fn(qx, torch.randn(7))
    b.resize_(7)  # the same tensor, changed: checked again
    with pytest.raises(QuantizedKernelError, match="bias must be float32 with 8 elements"):
        call.fn(qx, b)


@pytest.mark.skipif(QCONV not in KERNELS, reason="torch built without oneDNN's qconv")
def test_qconv_weight_packed_again_for_each_input_shape(exact_cpu):
    """The weight is not packed at load (without an input shape oneDNN guesses one, and a
    call of another shape reorders the weight every time) but by the first call, for its
    shape; later calls reuse it, of other shapes too (no repacking when shapes alternate).
    Results equal the unpacked weight's at every shape (96 -> 576 at 14x14 is a shape whose
    layout differs from the guess's on AVX-512)."""
    torch.manual_seed(6)
    w = torch.randint(-127, 128, (576, 96, 1, 1), dtype=torch.int8)
    ws = torch.rand(576) * 0.01 + 1e-3
    constants = {1: w, 2: ws, 3: torch.zeros(576, dtype=torch.int64)}
    geometry = [[1, 1], [0, 0], [1, 1], 1]
    tail = [0.1, 3, torch.uint8, "relu", [], ""]
    call = bind(QCONV, (Ref(0), X_SCALE, 5, Ref(1), Ref(2), Ref(3), None, *geometry, *tail), {},
                False, lambda r: constants.get(r.slot) if isinstance(r, Ref) else None)
    assert call.fn.weight.packed is None
    plain, b = KERNELS[QCONV].fn, torch.randn(576)
    seen = []
    for hw in (14, 14, 7, 14):
        x = torch.randint(0, 256, (1, 96, hw, hw), dtype=torch.uint8)
        want = plain(x, X_SCALE, 5, w, ws, constants[3], b, *geometry, *tail)
        assert torch.equal(call.fn(x, b), want)
        seen.append(call.fn.weight.packed)
    assert seen[0].is_mkldnn and all(p is seen[0] for p in seen)


def _reference_qconv(qx, x_zp, w, ws, b, geometry, out_zp, out_dtype, post, post_args):
    """``quantize(post(conv2d(dequantize(qx), dequantize(W)) + b))`` in float64."""
    stride, padding, dilation, groups = geometry
    x = (qx.double() - x_zp) * X_SCALE
    y = torch.nn.functional.conv2d(x, w.double() * ws.double()[:, None, None, None], b.double(),
                                   stride, padding, dilation, groups)
    if post == "relu":
        y = y.relu()
    elif post == "hardtanh":
        y = y.clamp(*post_args)
    if out_dtype == torch.float32:
        return y.float()
    lo, hi = (-128, 127) if out_dtype == torch.int8 else (0, 255)
    return (torch.round(y / 0.1) + out_zp).clamp(lo, hi).to(out_dtype)


@pytest.mark.skipif(QCONV not in KERNELS, reason="torch built without oneDNN's qconv")
@pytest.mark.parametrize("cpu", ["this_cpu", "saturating_cpu"])
@pytest.mark.parametrize(("in_dtype", "x_zp"), [(torch.uint8, 131), (torch.int8, -5)],
                         ids=["uint8", "int8"])
@pytest.mark.parametrize(("post", "post_args", "out_dtype"),
                         [("relu", [], torch.uint8), ("hardtanh", [0.0, 6.0], torch.int8),
                          ("none", [], torch.float32)], ids=["relu", "relu6", "float"])
def test_qconv_matches_the_quantized_reference(cpu, in_dtype, x_zp, post, post_args, out_dtype,
                                               request):
    """Saturation-prone operands (weights of one sign near 127, inputs near the top of the
    uint8 range, 3x3 over 64 channels: pair sums far above 32767) through whichever kernel
    load binds (oneDNN where its products are exact, float32 where they saturate): within one
    int8 step of the reference, in at most 1% of the elements."""
    if cpu == "saturating_cpu":
        request.getfixturevalue("saturating_cpu")
    torch.manual_seed(9)
    w = torch.randint(100, 128, (16, 32, 3, 3), dtype=torch.int8)
    w[1::2] *= -1
    ws = torch.rand(16) * 1e-4 + 1e-5
    geometry = ([1, 1], [1, 1], [1, 1], 2)
    constants = {1: w, 2: ws, 3: torch.zeros(16, dtype=torch.int64)}
    out_scale, out_zp = (0.1, 3) if out_dtype != torch.float32 else (1.0, 0)
    call = bind(QCONV, (Ref(0), X_SCALE, x_zp, Ref(1), Ref(2), Ref(3), None, *geometry,
                        out_scale, out_zp, out_dtype, post, post_args, ""), {}, False,
                lambda r: constants.get(r.slot) if isinstance(r, Ref) else None)
    exact = int8_float.exact_int8_products()
    assert isinstance(call.fn, StaticQConv) == exact
    assert exact or isinstance(call.args[3], FloatQConv)
    lo, hi = (200, 256) if in_dtype == torch.uint8 else (72, 128)
    qx = torch.randint(lo, hi, (1, 64, 9, 9), dtype=torch.int16).to(in_dtype)
    b = torch.randn(16)
    if isinstance(call.fn, StaticQConv):
        got = call.fn(qx, b)
    else:
        args = _resolved(call.args, constants)
        got = call.fn(qx, *args[1:6], b, *args[7:])
    want = _reference_qconv(qx, x_zp, w, ws, b, geometry, out_zp, out_dtype, post, post_args)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.is_contiguous(memory_format=torch.channels_last)
    if out_dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    else:
        steps = (got.int() - want.int()).abs()
        assert steps.max() <= 1 and (steps > 0).float().mean() < 0.01, steps.max()


def test_saturating_cpu_qlinear_takes_uint8_and_run_time_qparams(saturating_cpu):
    """The float32 form serves both overloads: a uint8 input, and qparams given as tensors
    (``.tensor``) with the weight packed at no point; it equals the reference."""
    torch.manual_seed(4)
    k, n = 512, 24
    w = torch.full((n, k), 127, dtype=torch.int8)
    w[1::2] = -127
    ws = torch.full((n,), 1e-3)
    qx = torch.randint(250, 256, (3, k), dtype=torch.int16).to(torch.uint8)
    zps, b = torch.zeros(n, dtype=torch.int64), torch.randn(n)
    want = torch.nn.functional.linear((qx.double() - 128) * X_SCALE,
                                      w.double() * ws.double()[:, None], b.double()).float()
    plain = KERNELS[QLINEAR].fn(qx, X_SCALE, 128, w, ws, zps, b, 1.0, 0, torch.float32, "none",
                                [], "")
    torch.testing.assert_close(plain, want, rtol=1e-5, atol=1e-3)
    tensor_form = KERNELS["onednn.qlinear_pointwise.tensor"].fn(
        qx, torch.tensor(X_SCALE), torch.tensor(128), w, ws, zps, b, 1.0, 0, torch.float32,
        "none", [], "")
    torch.testing.assert_close(tensor_form, want, rtol=1e-5, atol=1e-3)
