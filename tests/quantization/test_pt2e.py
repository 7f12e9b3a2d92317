"""The PT2E flow: prepare_pt2e / convert_pt2e with XNNPACKQuantizer on exportir graphs, and
the quantized program through to_edge -> to_program -> save -> load -> run."""

from __future__ import annotations

import textwrap

import pytest
import torch
from quantization.helpers import conv_net, op_counts, quantize, run_fresh

import exportir
from exportir.quantization import (
    DerivedQuantizationSpec,
    FixedQParamsQuantizationSpec,
    MinMaxObserver,
    PerChannelMinMaxObserver,
    QuantizationAnnotation,
    QuantizationSpec,
    Quantizer,
    SharedQuantizationSpec,
    XNNPACKQuantizer,
    convert_pt2e,
    get_symmetric_quantization_config,
    prepare_pt2e,
)
from exportir.runtime import Program

QD = "quantized_decomposed"


def _inputs(n: int, seed: int = 1) -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(2, 3, 8, 8, generator=g),) for _ in range(n)]


def test_quantized_decomposed_ops_compute_what_torchs_compute():
    """Our kernels against torch's own (torch.ao's _decomposed, imported first in a fresh
    process so that its definitions are the registered ones)."""
    out = run_fresh(textwrap.dedent("""
        import torch
        import torch.ao.quantization.fx._decomposed  # noqa: F401  torch's definitions first
        from exportir.program import quantized_ops as Q
        Q.define()
        qd = torch.ops.quantized_decomposed
        g = torch.Generator().manual_seed(0)
        x = torch.randn(4, 6, generator=g) * 3
        s, z = torch.rand(4, generator=g) + 0.01, torch.randint(-3, 3, (4,), generator=g)
        q = Q.quantize_per_channel(x, s, z, 0, -128, 127, torch.int8)
        w = torch.randint(0, 15, (4, 64), dtype=torch.uint8, generator=g)
        gs, gz = torch.rand(4, 2, generator=g), torch.randint(0, 15, (4, 2), generator=g)
        checks = [
            (Q.quantize_per_tensor(x, 0.05, 3, -128, 127, torch.int8),
             qd.quantize_per_tensor(x, 0.05, 3, -128, 127, torch.int8)),
            (Q.dequantize_per_tensor(q, 0.05, 3, -128, 127, torch.int8),
             qd.dequantize_per_tensor(q, 0.05, 3, -128, 127, torch.int8)),
            (q, qd.quantize_per_channel(x, s, z, 0, -128, 127, torch.int8)),
            (Q.dequantize_per_channel(q, s, z, 0, -128, 127, torch.int8),
             qd.dequantize_per_channel(q, s, z, 0, -128, 127, torch.int8)),
            (torch.cat(Q.choose_qparams(x, -128, 127, 2**-12, torch.int8)).double(),
             torch.cat(qd.choose_qparams.tensor(x, -128, 127, 2**-12, torch.int8)).double()),
            (Q.dequantize_per_channel_group(w, gs, gz, 0, 15, torch.uint8, 32, torch.float32),
             qd.dequantize_per_channel_group(w, gs, gz, 0, 15, torch.uint8, 32, torch.float32)),
        ]
        print("SAME", [torch.equal(a, b) for a, b in checks])
    """))
    assert "SAME [True, True, True, True, True, True]" in out, out


def test_prepare_inserts_observers_where_xnnpack_quantizes():
    gm = exportir.export(conv_net(), _inputs(1)[0]).module()
    config = get_symmetric_quantization_config(is_per_channel=True)
    prepared = prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
    observers = {n.target: prepared.get_submodule(n.target)
                 for n in prepared.graph.nodes if n.op == "call_module"}
    kinds = sorted(type(o).__name__ for o in set(observers.values()))
    # 4 weights per channel; activations: input, conv-relu, conv2 (read by add), add-relu
    # (shared by the max pool and the flatten after it, and fc1's input), fc1-relu, fc2 out
    assert kinds.count("PerChannelMinMaxObserver") == 4, kinds
    assert kinds.count("MinMaxObserver") == 6, kinds
    # batch norm folded into the convolution (as torchao's prepare_pt2e does)
    assert "aten._native_batch_norm_legit_no_training.default" not in op_counts(prepared)
    pool = next(n for n in prepared.graph.nodes if n.name == "max_pool2d")
    before, after = pool.args[0], next(iter(pool.users))
    assert prepared.get_submodule(before.target) is prepared.get_submodule(after.target)


def test_convert_static_folds_weights_to_int8_and_tracks_the_float_model():
    model = conv_net()
    converted = quantize(model, _inputs(1)[0], _inputs(8))
    counts = op_counts(converted)
    # one per activation observer node (the pool's and the flatten's output share their
    # input's qparams); the conv-relu output read by conv2 and the add: a dequantize each
    assert counts[f"{QD}.quantize_per_tensor.default"] == 8, counts
    assert counts[f"{QD}.dequantize_per_tensor.default"] == 9, counts
    assert counts[f"{QD}.dequantize_per_channel.default"] == 4, counts
    assert counts[f"{QD}.quantize_per_channel.default"] == 0, counts  # folded
    int8 = [n for n, b in converted.named_buffers() if b.dtype == torch.int8]
    assert len(int8) == 4, int8
    assert not [n for n, _ in converted.named_parameters() if n.endswith("weight")]
    x = _inputs(1, seed=7)[0]
    ref, got = model(*x), converted(*x)
    assert not torch.equal(ref, got)
    assert (ref - got).abs().max() < 0.05 * ref.abs().max()


def test_static_linear_matches_a_hand_written_fake_quant_reference():
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8).eval()
    calib = [(torch.randn(4, 16),) for _ in range(3)]
    converted = quantize(model, calib[0], calib)
    lo = min(float(c[0].min()) for c in calib)
    hi = max(float(c[0].max()) for c in calib)
    x_scale = max((max(hi, 0) - min(lo, 0)) / 255, 2**-12)
    x_zp = int(min(max(-128 - round(min(lo, 0) / x_scale), -128), 127))
    w = model.weight.detach()
    w_scale = w.abs().amax(1) / 127
    wq = torch.clamp(torch.round(w / w_scale[:, None]), -127, 127)
    x = calib[1][0]
    xq = torch.clamp(torch.round(x * (1 / x_scale)) + x_zp, -128, 127)
    y = torch.nn.functional.linear((xq - x_zp) * x_scale, wq * w_scale[:, None], model.bias)
    with torch.no_grad():  # the output observer's range
        outs = [model(*c) for c in calib]
    out_lo = min(float(o.min()) for o in outs)
    out_hi = max(float(o.max()) for o in outs)
    o_scale = (max(out_hi, 0) - min(out_lo, 0)) / 255
    o_zp = -128 - round(min(out_lo, 0) / o_scale)
    expected = (torch.clamp(torch.round(y * (1 / o_scale)) + o_zp, -128, 127) - o_zp) * o_scale
    assert torch.allclose(converted(x), expected, atol=1e-5, rtol=0)


def test_dynamic_quantizes_inputs_with_their_own_range():
    model = conv_net()
    converted = quantize(model, _inputs(1)[0], [], dynamic=True)  # weights need no calibration
    counts = op_counts(converted)
    # ExecuTorch's XNNPACK quantizer quantizes only linear layers dynamically
    assert counts[f"{QD}.choose_qparams.tensor"] == 2, counts
    assert counts[f"{QD}.quantize_per_tensor.tensor"] == 2, counts
    assert counts[f"{QD}.dequantize_per_channel.default"] == 2, counts
    assert counts[f"{QD}.quantize_per_tensor.default"] == 0, counts
    x = _inputs(1, seed=3)[0]
    ref = model(*x)
    assert (ref - converted(*x)).abs().max() < 0.05 * ref.abs().max()
    big = (x[0] * 100,)  # a range calibration never saw: dynamic qparams follow it
    assert (model(*big) - converted(*big)).abs().max() < 0.05 * model(*big).abs().max()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_portable_program_runs_the_quantized_graph(tmp_path, dynamic):
    model = conv_net()
    example = _inputs(1)[0]
    converted = quantize(model, example, _inputs(4), dynamic=dynamic)
    program = exportir.to_edge(exportir.export(converted, example)).to_program()
    path = tmp_path / "q.xpt"
    program.save(path)
    loaded = Program.load(path)
    names = {f"{op.name}.{op.overload}" for op in loaded.schema.methods[0].operators}
    expected = {f"{QD}::quantize_per_tensor.{'tensor_out' if dynamic else 'out'}"}
    assert expected <= names, names
    for x in _inputs(3, seed=11):
        torch.testing.assert_close(loaded.method("forward")(*x), converted(*x), rtol=0,
                                   atol=1e-6)


# ------------------------------------------------------------------------------ errors


def test_prepare_refuses_an_uncaptured_module():
    with pytest.raises(TypeError, match=r"exportir.export\(model, example_args\).module\(\)"):
        prepare_pt2e(torch.nn.Linear(2, 2), XNNPACKQuantizer())


def test_convert_without_calibration_says_to_calibrate():
    gm = exportir.export(torch.nn.Linear(4, 4), (torch.randn(1, 4),)).module()
    config = get_symmetric_quantization_config(is_per_channel=True)
    prepared = prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
    with pytest.raises(RuntimeError, match="run the prepared model on calibration inputs"):
        convert_pt2e(prepared)


def test_unbuilt_options_raise_not_implemented():
    with pytest.raises(NotImplementedError, match="quantization-aware training"):
        get_symmetric_quantization_config(is_qat=True)
    gm = exportir.export(torch.nn.Linear(4, 4), (torch.randn(1, 4),)).module()
    with pytest.raises(NotImplementedError, match="use_reference_representation=False"):
        convert_pt2e(gm, use_reference_representation=True)


def test_spec_and_observer_arguments_are_checked():
    with pytest.raises(ValueError, match="quant_min 5 must be <= quant_max 1"):
        QuantizationSpec(torch.int8, MinMaxObserver, quant_min=5, quant_max=1)
    with pytest.raises(ValueError, match="ch_axis must be >= 0"):
        QuantizationSpec(torch.int8, PerChannelMinMaxObserver, ch_axis=-1)
    with pytest.raises(ValueError, match="is not a quantized dtype"):
        MinMaxObserver(dtype=torch.float32)


class _SharesWithNothing(Quantizer):
    def annotate(self, model):
        for node in model.graph.nodes:
            if node.op == "call_function":
                x = node.args[0]
                node.meta["quantization_annotation"] = QuantizationAnnotation(
                    {x: SharedQuantizationSpec(x)})
        return model

    def validate(self, model):
        return None


def test_shared_spec_pointing_at_nothing_is_refused():
    gm = exportir.export(torch.nn.ReLU(), (torch.randn(2),)).module()
    with pytest.raises(ValueError, match="shares qparams .* with nothing"):
        prepare_pt2e(gm, _SharesWithNothing())


def test_xnnpack_validate_refuses_other_dtypes():
    gm = exportir.export(torch.nn.Linear(4, 4), (torch.randn(1, 4),)).module()
    spec = QuantizationSpec(torch.int16, MinMaxObserver)
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    node.meta["quantization_annotation"] = QuantizationAnnotation({}, spec)
    with pytest.raises(ValueError, match="XNNPACK runs int8 / uint8"):
        XNNPACKQuantizer().validate(gm)


# ------------------------------------------------------------------------------ quantizer API


def test_module_type_and_name_configs_override_the_global_one():
    gm = exportir.export(conv_net(), _inputs(1)[0]).module()
    quantizer = (XNNPACKQuantizer()
                 .set_global(get_symmetric_quantization_config(is_per_channel=True))
                 .set_module_type(torch.nn.Conv2d, None)
                 .set_module_name("fc2", None))
    prepared = prepare_pt2e(gm, quantizer)
    annotated = {n.name for n in prepared.graph.nodes
                 if n.meta.get("quantization_annotation") is not None}
    assert "linear" in annotated
    assert not {"conv2d", "conv2d_1", "linear_1"} & annotated, annotated


class _CustomSpecs(Quantizer):
    """linear: input and weight per-tensor, bias int32 derived from them; sigmoid: fixed."""

    def annotate(self, model):
        act = QuantizationSpec(torch.int8, MinMaxObserver, -128, 127, torch.per_tensor_affine)
        weight = QuantizationSpec(torch.int8, MinMaxObserver, -127, 127,
                                  torch.per_tensor_symmetric)
        for node in model.graph.nodes:
            if node.target == torch.ops.aten.linear.default:
                x, w, b = node.args
                bias = DerivedQuantizationSpec(
                    derived_from=((x, node), (w, node)),
                    derive_qparams_fn=lambda obs: (
                        obs[0].calculate_qparams()[0] * obs[1].calculate_qparams()[0],
                        torch.zeros(1, dtype=torch.int64)),
                    dtype=torch.int32, quant_min=-(2**31), quant_max=2**31 - 1,
                    qscheme=torch.per_tensor_symmetric)
                node.meta["quantization_annotation"] = QuantizationAnnotation(
                    {x: act, w: weight, b: bias})
            elif node.target == torch.ops.aten.sigmoid.default:
                node.meta["quantization_annotation"] = QuantizationAnnotation(
                    {}, FixedQParamsQuantizationSpec(torch.uint8, 1 / 256, 0, 0, 255))
        return model

    def validate(self, model):
        return None


def test_derived_and_fixed_qparams_specs():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Sigmoid()).eval()
    x = torch.randn(3, 8)
    prepared = prepare_pt2e(exportir.export(model, (x,)).module(), _CustomSpecs())
    prepared(x)
    converted = convert_pt2e(prepared)
    dq = [n for n in converted.graph.nodes
          if n.target == torch.ops.quantized_decomposed.dequantize_per_tensor.default]
    by_dtype = {n.args[-1]: n for n in dq}
    x_scale = next(n.args[1] for n in dq if n.args[-1] == torch.int8 and n.args[3] == -128)
    w_scale = next(n.args[1] for n in dq if n.args[-1] == torch.int8 and n.args[3] == -127)
    assert by_dtype[torch.int32].args[1] == pytest.approx(x_scale * w_scale)
    assert by_dtype[torch.uint8].args[1:3] == (1 / 256, 0)
    assert (converted(x) - model(x)).abs().max() < 1 / 256


def test_quantized_program_with_a_dynamic_batch(tmp_path):
    batch = exportir.Dim("batch", min=1, max=16)
    shapes = {"x": {0: batch}}
    gm = exportir.export(conv_net(), _inputs(1)[0], dynamic_shapes=shapes).module()
    config = get_symmetric_quantization_config(is_per_channel=True)
    prepared = prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
    prepared(torch.randn(4, 3, 8, 8))
    converted = convert_pt2e(prepared)
    path = tmp_path / "dyn.xpt"
    ep = exportir.export(converted, _inputs(1)[0], dynamic_shapes=shapes)
    exportir.to_edge(ep).to_program().save(path)
    x = torch.randn(5, 3, 8, 8)
    torch.testing.assert_close(Program.load(path).method("forward")(x), converted(x), rtol=0,
                               atol=1e-6)
