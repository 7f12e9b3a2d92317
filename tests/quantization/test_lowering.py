"""Quantized programs on the fused_cpu road: q/dq patterns become the int8 / int4 kernels
torch ships for CPU, the program's results equal (or closely track) the quantized graph's."""

from __future__ import annotations

import collections

import pytest
import torch
from quantization.helpers import conv_net, quantize

import exportir
from exportir.backends.fused_cpu import FusedCpuPartitioner
from exportir.quantization import (
    int4_weight_only,
    int8_dynamic_activation_int8_weight,
    int8_weight_only,
    quantize_,
)
from exportir.runtime import Program
from exportir.runtime.backends.fused_cpu.dynamic_int8 import LINEAR_DYNAMIC_INT8, fbgemm_available
from exportir.runtime.backends.fused_cpu.format import decode_blob
from exportir.runtime.backends.fused_cpu.quantized import QuantizedKernelError

QLINEAR = "onednn.qlinear_pointwise.default"
QLINEAR_DYNAMIC = "onednn.qlinear_pointwise.tensor"
INT8_MM = "aten._weight_int8pack_mm.default"
INT4_MM = "aten._weight_int4pack_mm_for_cpu.default"


class MLP(torch.nn.Module):
    def __init__(self, k: int = 32, hidden: int = 64, n: int = 16) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(k, hidden), torch.nn.Linear(hidden, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def fused_program(model, args, tmp_path, **kwargs):
    """(loaded program, blob op counts) of ``model`` lowered to fused_cpu."""
    ep = exportir.export(model, args, kwargs or None)
    lowered = exportir.to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()])
    counts = collections.Counter()
    for _, module in lowered.exported_program().graph_module.named_children():
        if hasattr(module, "processed_bytes"):
            counts.update(row.name for row in decode_blob(module.processed_bytes).ops)
    path = tmp_path / "fused.xpt"
    lowered.to_program().save(path)
    return Program.load(path), counts


def _mlp(seed: int = 0) -> MLP:
    torch.manual_seed(seed)
    return MLP().eval()


def test_static_int8_linear_runs_onednn_qlinear_exactly(tmp_path):
    model = _mlp()
    x = torch.randn(2, 5, 32)
    converted = quantize(model, (x,), [(torch.randn(2, 5, 32),) for _ in range(4)])
    program, counts = fused_program(converted, (x,), tmp_path)
    assert counts[QLINEAR] == 2, counts  # linear+relu and linear, int8 in, int8 out
    assert counts["aten.linear.default"] == counts["aten.addmm.default"] == 0, counts
    for _ in range(3):
        x = torch.randn(2, 5, 32)
        torch.testing.assert_close(program.method("forward")(x), converted(x), rtol=0,
                                   atol=1e-6)


def test_dynamic_int8_linear_runs_fbgemm_with_runtime_qparams(tmp_path):
    """choose_qparams + quantize + dequantize + linear (+ relu) become one fbgemm kernel per
    linear that picks the qparams the same way: the program equals the quantized graph."""
    if not fbgemm_available():
        pytest.skip("this torch build has no fbgemm (not x86): the oneDNN rule runs instead")
    model = _mlp(1)
    x = torch.randn(4, 32)
    converted = quantize(model, (x,), [], dynamic=True)
    program, counts = fused_program(converted, (x,), tmp_path)
    assert counts[LINEAR_DYNAMIC_INT8] == 2 and counts[QLINEAR_DYNAMIC] == 0, counts
    assert counts["quantized_decomposed.choose_qparams.tensor"] == 0, counts
    assert counts["aten.relu.default"] == 0, counts  # fused into the first linear
    for scale in (10.0, 1e-3, 1.0):
        x = torch.randn(4, 32) * scale
        torch.testing.assert_close(program.method("forward")(x), converted(x), rtol=1e-5,
                                   atol=1e-5 * scale)
    x = torch.randn(3, 4, 32)  # leading dimensions
    converted3 = quantize(_mlp(1), (x,), [], dynamic=True)
    program3, _ = fused_program(converted3, (x,), tmp_path)
    torch.testing.assert_close(program3.method("forward")(x), converted3(x), rtol=1e-5,
                               atol=1e-5)


def test_dynamic_int8_linear_without_fbgemm_runs_onednn_qlinear(tmp_path, monkeypatch):
    """Where the fbgemm rule is off, the chain keeps its choose_qparams / quantize and the
    linear becomes oneDNN's qlinear with run-time qparams."""
    from exportir.backends.fused_cpu import quantized, rewrites

    linear = "aten.linear.default"
    monkeypatch.setitem(rewrites.RULES, linear, tuple(
        r for r in rewrites.RULES[linear] if r is not quantized.linear_dynamic_fbgemm))
    model = _mlp(1)
    x = torch.randn(4, 32)
    converted = quantize(model, (x,), [], dynamic=True)
    program, counts = fused_program(converted, (x,), tmp_path)
    assert counts[QLINEAR_DYNAMIC] == 2, counts
    assert counts["quantized_decomposed.choose_qparams.tensor"] == 2, counts
    x = torch.randn(4, 32) * 10
    torch.testing.assert_close(program.method("forward")(x), converted(x), rtol=1e-5,
                               atol=1e-5)


QCONV = "onednn.qconv_pointwise.default"


def test_static_int8_convolutions_run_onednn_qconv(tmp_path):
    """conv-bn-relu and conv (+ residual add) become oneDNN's int8 convolution (relu fused),
    the float convolution and the weight's dequantize gone; the program computes what the
    quantized graph computes (int8 results may differ by a rounding step: oneDNN accumulates
    in int32 and requantizes once)."""
    model = conv_net()
    x = torch.randn(2, 3, 8, 8)
    converted = quantize(model, (x,), [(torch.randn(2, 3, 8, 8),) for _ in range(4)])
    program, counts = fused_program(converted, (x,), tmp_path)
    assert counts[QCONV] == 2 and counts[QLINEAR] == 2, counts
    float_convs = [n for n in counts if "convolution" in n]
    assert not float_convs, counts
    assert counts["quantized_decomposed.dequantize_per_channel.default"] == 0, counts
    for _ in range(3):
        x = torch.randn(2, 3, 8, 8)
        torch.testing.assert_close(program.method("forward")(x), converted(x), rtol=0,
                                   atol=0.05)


class _Convs(torch.nn.Module):
    """Strided, dilated, grouped and depthwise 2-D convolutions, with relu, relu6 or none."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(4, 8, 3, stride=2, padding=1)
        self.b = torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=2)
        self.c = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.nn.functional.relu6(self.b(torch.relu(self.a(x)))))


def test_qconv_matches_the_eager_quantized_reference(tmp_path):
    """Each int8 convolution against torch's eager quantized reference: the reference's
    ``quantize(conv(dequantize(qx), dequantize(W8)))`` on the same int8 input, compared in
    int8 steps (at most one step off, on few elements). The activations between them, read
    only by convolutions and dequantizes, are written as uint8 (zero point + 128: oneDNN's
    int8 convolution runs on uint8, no shift per call)."""
    torch.manual_seed(6)
    model = _Convs().eval()
    x = torch.randn(2, 4, 12, 12)
    converted = quantize(model, (x,), [(torch.randn(2, 4, 12, 12),) for _ in range(4)])
    ep = exportir.export(converted, (x,))
    lowered = exportir.to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()])
    rows = [row for _, m in lowered.exported_program().graph_module.named_children()
            if hasattr(m, "processed_bytes") for row in decode_blob(m.processed_bytes).ops]
    counts = collections.Counter(r.name for r in rows)
    assert counts[QCONV] == 3 and counts["aten.hardtanh.default"] == 0, counts  # relu6 fused
    quantizes = [r for r in rows if r.name == "quantized_decomposed.quantize_per_tensor.default"]
    convs = [r for r in rows if r.name == QCONV]
    assert [r.args[5] for r in quantizes] == [torch.uint8]
    assert tuple(quantizes[0].args[3:5]) == (0, 255)
    assert [r.args[13] for r in convs] == [torch.uint8] * 3, [r.args[13] for r in convs]
    assert all(0 <= r.args[2] <= 255 and 0 <= r.args[12] <= 255 for r in convs)
    path = tmp_path / "p.xpt"
    lowered.to_program().save(path)
    program = Program.load(path)
    for _ in range(2):
        x = torch.randn(2, 4, 12, 12)
        got, ref = program.method("forward")(x), converted(x)
        scale = (ref.max() - ref.min()) / 255
        steps = ((got - ref).abs() / scale).round()
        assert steps.max() <= 1 and (steps > 0).float().mean() < 0.05, steps.max()


@pytest.mark.parametrize(("config", "kernel"), [(int8_weight_only(), INT8_MM),
                                                (int4_weight_only(32), INT4_MM)],
                         ids=["int8", "int4"])
def test_weight_only_linears_run_torchs_packed_kernels(tmp_path, config, kernel):
    model = quantize_(_mlp(2), config)
    x = torch.randn(3, 7, 32)
    program, counts = fused_program(model, (x,), tmp_path)
    assert counts[kernel] == 2, counts
    assert not [n for n in counts if n.startswith("quantized_decomposed")], counts
    torch.testing.assert_close(program.method("forward")(x), model(x), rtol=1e-4, atol=1e-5)


def test_dynamic_int8_config_runs_fbgemm(tmp_path):
    """quantize_ with int8_dynamic_activation_int8_weight(): the module computes the PT2E
    dynamic pattern; its program runs each linear as one fbgemm kernel, equal to the module."""
    if not fbgemm_available():
        pytest.skip("this torch build has no fbgemm (not x86)")
    model = quantize_(_mlp(2), int8_dynamic_activation_int8_weight())
    assert "int8 dynamic activation" in repr(model)
    x = torch.randn(3, 7, 32)
    program, counts = fused_program(model, (x,), tmp_path)
    assert counts[LINEAR_DYNAMIC_INT8] == 2, counts
    assert not [n for n in counts if n.startswith("quantized_decomposed")], counts
    for x in (torch.randn(3, 7, 32), torch.randn(3, 7, 32) * 100):
        torch.testing.assert_close(program.method("forward")(x), model(x), rtol=1e-4,
                                   atol=1e-4 * model(x).abs().max().item())
    with torch.no_grad():
        float_model = _mlp(2)
        cos = torch.nn.functional.cosine_similarity(model(x).flatten(),
                                                    float_model(x).flatten(), dim=0)
    assert 0.999 < cos < 1.0


def test_quantize_refuses_unknown_configs():
    with pytest.raises(TypeError, match="int8_dynamic_activation_int8_weight"):
        quantize_(_mlp(), object())


def test_int4_weight_with_too_few_output_channels_stays_dequantized(tmp_path):
    """_weight_int4pack_mm_for_cpu packs 16 output channels at a time: N = 8 is left to the
    generic kernels (the dequantized weight folded to float)."""
    torch.manual_seed(3)
    model = quantize_(torch.nn.Sequential(torch.nn.Linear(32, 8)).eval(), int4_weight_only(32))
    x = torch.randn(2, 32)
    program, counts = fused_program(model, (x,), tmp_path)
    assert counts[INT4_MM] == 0, counts
    torch.testing.assert_close(program.method("forward")(x), model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config", [int8_weight_only(), int4_weight_only(64)],
                         ids=["int8", "int4"])
def test_weight_only_portable_program_keeps_int8_weights(tmp_path, config):
    torch.manual_seed(4)
    model = quantize_(torch.nn.Sequential(torch.nn.Linear(128, 256)).eval(), config)
    x = torch.randn(2, 128)
    path = tmp_path / "w.xpt"
    exportir.to_edge(exportir.export(model, (x,))).to_program().save(path)
    loaded = Program.load(path)
    ops = {f"{op.name}.{op.overload}" for op in loaded.schema.methods[0].operators}
    assert any(o.startswith("quantized_decomposed::dequantize_per_channel") for o in ops), ops
    assert path.stat().st_size < 128 * 256 * 2, "the float weight would take 128 KiB"
    torch.testing.assert_close(loaded.method("forward")(x), model(x), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ kernel checks


def test_quantized_kernels_refuse_arguments_onednn_would_misread():
    from exportir.runtime.backends.fused_cpu.kernels import KERNELS

    qlinear = KERNELS[QLINEAR].fn
    w = torch.randint(-127, 127, (8, 16), dtype=torch.int8)
    good = (torch.zeros(2, 16, dtype=torch.int8), 0.1, 0, w, torch.ones(8),
            torch.zeros(8, dtype=torch.int64), None, 1.0, 0, torch.float32, "none", [], "")
    assert qlinear(*good).shape == (2, 8)
    bad_k = (torch.zeros(2, 15, dtype=torch.int8), *good[1:])
    with pytest.raises(QuantizedKernelError, match=r"int8 / uint8 \[\.\.\., 16\]"):
        qlinear(*bad_k)
    bad_scales = (*good[:4], torch.ones(7), *good[5:])
    with pytest.raises(QuantizedKernelError, match="w_scale must have 8 elements"):
        qlinear(*bad_scales)
    with pytest.raises(QuantizedKernelError, match="2-D int8 tensor"):
        qlinear(*good[:3], w.float(), *good[4:])
    with pytest.raises(QuantizedKernelError, match="int8 weight"):
        KERNELS[INT8_MM].fn(torch.randn(2, 16), w, torch.ones(7))
    qconv = KERNELS[QCONV].fn
    w4 = torch.randint(-127, 127, (8, 4, 3, 3), dtype=torch.int8)
    conv = (torch.zeros(1, 4, 6, 6, dtype=torch.int8), 0.1, 0, w4, torch.ones(8),
            torch.zeros(8, dtype=torch.int64), None, [1, 1], [1, 1], [1, 1], 1, 1.0, 0,
            torch.int8, "relu", [], "")
    assert qconv(*conv).shape == (1, 8, 6, 6)
    with pytest.raises(QuantizedKernelError, match=r"int8 / uint8 \[N, 4, H, W\]"):
        qconv(torch.zeros(1, 3, 6, 6, dtype=torch.int8), *conv[1:])
    with pytest.raises(QuantizedKernelError, match="smaller than the kernel"):
        qconv(torch.zeros(1, 4, 1, 1, dtype=torch.int8), *conv[1:7], [1, 1], [0, 0],
              *conv[9:])
    with pytest.raises(QuantizedKernelError, match="w_scale must have 8 elements"):
        qconv(*conv[:4], torch.ones(7), *conv[5:])
    with pytest.raises(QuantizedKernelError, match="groups 3 do not fit"):
        qconv(*conv[:10], 3, *conv[11:])
    with pytest.raises(QuantizedKernelError, match="padding must be two ints"):
        qconv(*conv[:8], [-1, 0], *conv[9:])
    with pytest.raises(QuantizedKernelError, match=r"post op 'hardtanh' \[0\.0\] not"):
        qconv(*conv[:14], "hardtanh", [0.0], "")
    with pytest.raises(QuantizedKernelError, match="packed weight"):
        KERNELS[INT4_MM].fn(torch.randn(2, 32), torch.zeros(16, 8, dtype=torch.uint8), 32,
                            torch.zeros(1, 16, 2))


def test_weight_only_kernels_on_a_dequantized_weight_compute_the_same():
    """At load a weight-only kernel may run as linear on its weight dequantized (when measured
    faster): the int4 weight is read back from torch's packed layout exactly."""
    from exportir.runtime.backends.fused_cpu.kernels import KERNELS
    from exportir.runtime.backends.fused_cpu.quantized import DenseWeight, _unpack_int4

    g = torch.Generator().manual_seed(0)
    for n, k in ((16, 64), (48, 256), (64, 128)):
        q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=g)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        assert torch.equal(_unpack_int4(packed, n, k), q.long())
    n, k, group = 32, 128, 64
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=g)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    sz = torch.rand(k // group, n, 2, generator=g)
    dense = (q - 8) * sz[..., 0].t().repeat_interleave(group, 1) + sz[..., 1].t().repeat_interleave(
        group, 1)
    x = torch.randn(3, k, generator=g)
    torch.testing.assert_close(KERNELS[INT4_MM].fn(x, DenseWeight(dense), group, sz),
                               KERNELS[INT4_MM].fn(x, packed, group, sz), rtol=1e-4, atol=1e-4)
    w8 = torch.randint(-127, 128, (8, 16), dtype=torch.int8, generator=g)
    s8 = torch.rand(8, generator=g)
    x8 = torch.randn(2, 16, generator=g)
    torch.testing.assert_close(KERNELS[INT8_MM].fn(x8, DenseWeight(w8.float() * s8[:, None]), s8),
                               KERNELS[INT8_MM].fn(x8, w8, s8), rtol=1e-5, atol=1e-5)
    with pytest.raises(QuantizedKernelError, match="needs x"):
        KERNELS[INT8_MM].fn(torch.randn(2, 15), DenseWeight(w8.float()), s8)
