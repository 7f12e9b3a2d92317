"""``fused_cpu.linear_dynamic_int8``: fbgemm's int8 linear with qparams chosen as the PT2E
dynamic pattern chooses them (runtime/backends/fused_cpu/dynamic_int8.py)."""

from __future__ import annotations

import pytest
import torch
from fused_kernel_samples import REFERENCES

from exportir.runtime.backends.fused_cpu import dynamic_int8 as D

pytestmark = pytest.mark.skipif(not D.fbgemm_available(), reason="needs fbgemm (x86 torch)")

REFERENCE = REFERENCES[D.LINEAR_DYNAMIC_INT8]
EPS = torch.finfo(torch.float32).eps


def _weights(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    return w, torch.rand(n, generator=g) * 0.02 + 1e-3, torch.randn(n, generator=g)


def test_qparams_are_choose_qparams_exactly():
    import torch.ao.quantization.fx._decomposed  # registers quantized_decomposed

    g = torch.Generator().manual_seed(1)
    for scale in (1e-6, 1e-3, 1.0, 37.5, 1e4):
        for shift in (-3.0, 0.0, 2.0):
            x = torch.randn(5, 64, generator=g) * scale + shift * scale
            want_s, want_zp = torch.ops.quantized_decomposed.choose_qparams.tensor(
                x, -128, 127, EPS, torch.int8)
            assert D.activation_qparams(x, EPS) == (want_s.item(), want_zp.item())
    zeros = torch.zeros(3, 8)
    want_s, want_zp = torch.ops.quantized_decomposed.choose_qparams.tensor(
        zeros, -128, 127, EPS, torch.int8)
    assert D.activation_qparams(zeros, EPS) == (want_s.item(), want_zp.item())


@pytest.mark.parametrize("bias_packed", [True, False])
@pytest.mark.parametrize("post_op", ["none", "relu"])
def test_packed_kernel_equals_the_pattern(bias_packed, post_op):
    """The fbgemm path (weight packed as at load, the bias packed with it or added per call)
    against torch's quantized_decomposed ops: equal to float rounding."""
    w, scales, bias = _weights(96, 80)
    packed = D.pack(w, scales, bias if bias_packed else None)
    g = torch.Generator().manual_seed(2)
    for shape, scale in (((1, 80), 1.0), ((7, 80), 30.0), ((2, 3, 80), 1e-3)):
        x = torch.randn(*shape, generator=g) * scale
        got = D.linear_dynamic_int8(x, packed, scales, bias, EPS, post_op)
        want = REFERENCE(x, w, scales, bias, EPS, post_op)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_saturating_products_stay_exact():
    """Every activation at the top of the uint8 range times weights of one sign: products
    that would saturate 16-bit pair sums (fbgemm's reduce_range exists for this) are exact."""
    k = 512
    w = torch.full((32, k), 127, dtype=torch.int8)
    w[1::2] = -127
    scales = torch.full((32,), 0.01)
    x = torch.full((2, k), 5.0)
    x[:, 0] = -1e-9  # the range starts at 0: every other value quantizes to 255
    got = D.linear_dynamic_int8(x, D.pack(w, scales, None), scales, None, EPS, "none")
    torch.testing.assert_close(got, REFERENCE(x, w, scales, None, EPS, "none"), rtol=1e-6,
                               atol=1e-3)


def test_non_finite_inputs_take_the_float_path():
    w, scales, bias = _weights(16, 32)
    packed = D.pack(w, scales, bias)
    x = torch.randn(2, 32)
    x[0, 3] = float("inf")
    got = D.linear_dynamic_int8(x, packed, scales, bias, EPS, "none")
    assert got.shape == (2, 16)  # no crash inside fbgemm; the values follow the float math


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: {**a, "x": torch.randn(2, 31)}, "input must be float32"),
        (lambda a: {**a, "x": torch.randn(2, 32).double()}, "input must be float32"),
        (lambda a: {**a, "w": a["w"].float()}, "weight must be a non-empty 2-D int8"),
        (lambda a: {**a, "w": a["w"][:, :0]}, "weight must be a non-empty 2-D int8"),
        (lambda a: {**a, "w_scales": a["w_scales"][:3]}, "w_scales must be float32 with 16"),
        (lambda a: {**a, "bias": torch.randn(15)}, "bias must be float32 with 16"),
        (lambda a: {**a, "eps": 0.0}, "eps must be a positive float"),
        (lambda a: {**a, "post_op": "gelu"}, "post_op must be one of"),
    ],
)
def test_bad_arguments_are_refused_by_name(change, message):
    w, scales, bias = _weights(16, 32)
    args = {"x": torch.randn(2, 32), "w": w, "w_scales": scales, "bias": bias, "eps": EPS,
            "post_op": "none"}
    args = change(args)
    with pytest.raises(D.DynamicInt8Error, match=message):
        D.linear_dynamic_int8(*args.values())
    if args["w"].dtype == torch.int8 and args["w"].numel():
        with pytest.raises(D.DynamicInt8Error, match=message):  # the packed path checks too
            D.linear_dynamic_int8(args["x"], D.pack(w, scales, None), *list(args.values())[2:])


def test_load_packs_constant_weights_once(exact_cpu):
    w, scales, bias = _weights(16, 32)
    slots = {1: w, 2: scales, 3: bias}
    args = (object(), 1, 2, 3, EPS, "none")
    prepared = D.DYNAMIC_INT8_KERNELS[D.LINEAR_DYNAMIC_INT8][1](args, slots.get)
    assert isinstance(prepared[1], D.PackedDynamicLinear) and prepared[1].has_bias
    run_time_bias = D.DYNAMIC_INT8_KERNELS[D.LINEAR_DYNAMIC_INT8][1](
        (object(), 1, 2, 4, EPS, "none"), slots.get)
    assert isinstance(run_time_bias[1], D.PackedDynamicLinear) and not run_time_bias[1].has_bias


def test_saturating_cpu_dequantizes_at_load(saturating_cpu):
    """Where fbgemm's products saturate, load dequantizes the weight once and the kernel runs
    the pattern in float32: the saturating products of the test above come out right."""
    k = 512
    w = torch.full((32, k), 127, dtype=torch.int8)
    w[1::2] = -127
    scales, bias = torch.full((32,), 0.01), torch.randn(32)
    slots = {1: w, 2: scales, 3: bias}
    prepared = D.DYNAMIC_INT8_KERNELS[D.LINEAR_DYNAMIC_INT8][1](
        (object(), 1, 2, 3, EPS, "relu"), slots.get)
    assert isinstance(prepared[1], D.DenseDynamicWeight)
    assert D.DYNAMIC_INT8_SPECIALIZED[D.LINEAR_DYNAMIC_INT8](prepared, {}) is None
    x = torch.full((2, k), 5.0)
    x[:, 0] = -1e-9
    got = D.linear_dynamic_int8(x, prepared[1], scales, bias, EPS, "relu")
    torch.testing.assert_close(got, REFERENCE(x, w, scales, bias, EPS, "relu"), rtol=1e-6,
                               atol=1e-3)
    # a weight packed for fbgemm elsewhere is not run on fbgemm here either
    packed = D.linear_dynamic_int8(x, D.pack(w, scales, None), scales, bias, EPS, "relu")
    torch.testing.assert_close(packed, got, rtol=1e-6, atol=1e-3)


@pytest.mark.slow  # ~15 s: a transformers Llama quantized, lowered and run in a new process
def test_8da8w_llama_runs_on_fbgemm_in_a_fresh_process(tmp_path):
    """transformers' Llama (corpus tiny config) with 8da8w linears, on the fused road, run as
    the first thing a process does (the kernel's lazy imports and fbgemm's packing at load
    happen there, with no eager call before): every linear is the kernel, the logits match."""
    from corpus import real_models as R
    from fresh_process import Failure, Job, run_fresh

    import exportir
    from exportir.backends.fused_cpu import FusedCpuPartitioner
    from exportir.quantization import int8_dynamic_activation_int8_weight, quantize_
    from exportir.runtime.backends.fused_cpu.format import decode_blob

    case = R.build("llama")
    model = quantize_(case.model.eval(), int8_dynamic_activation_int8_weight())
    ep = exportir.export(model, (), case.kwargs)
    lowered = exportir.to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()])
    ops = [row.name for _, m in lowered.exported_program().graph_module.named_children()
           if hasattr(m, "processed_bytes") for row in decode_blob(m.processed_bytes).ops]
    # 2 layers x (q/k/v as one, o, gate/up as one, down) + lm_head
    assert ops.count(D.LINEAR_DYNAMIC_INT8) == 9, ops
    path = tmp_path / "llama_8da8w.xpt"
    lowered.to_program().save(path)
    (got,) = run_fresh([Job(path, kwargs=case.kwargs)], tmp_path)
    assert not isinstance(got, Failure), got.error
    with torch.no_grad():
        want = model(**case.kwargs).logits
    torch.testing.assert_close(got[0], want, rtol=1e-4, atol=1e-4)
