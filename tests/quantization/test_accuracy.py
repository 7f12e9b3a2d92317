"""Accuracy of quantized corpus models against fp32 (issue 12's bounds).

Vision: a timm model from the real corpus (random weights) gets a 10-class head fitted in
closed form (ridge regression on its fp32 features) to a fixed synthetic data set (class
prototypes plus noise), so that its decisions have the margins of a trained classifier; int8
(static and dynamic, per-channel weights) must then agree with fp32's top-1 on >= 99% of a
held-out synthetic eval set. (Random 1000-class heads decide by near-ties: any perturbation, a
float reordering included, flips several percent of them; see docs/quantization.md.)

LLMs: decoder LMs of the real corpus, weight-only quantized: logits cosine >= 0.999 (int8) and
>= 0.99 (int4), and the fused_cpu program (torch's packed int8 / int4 kernels) computes what the
quantized eager model computes.
"""

from __future__ import annotations

import functools

import pytest
import torch
from corpus import real_models as R
from quantization.helpers import quantize
from quantization.test_lowering import INT4_MM, INT8_MM, fused_program

from exportir.quantization import (
    int4_weight_only,
    int8_dynamic_activation_int8_weight,
    int8_weight_only,
    quantize_,
)
from exportir.runtime.backends.fused_cpu.dynamic_int8 import LINEAR_DYNAMIC_INT8, fbgemm_available

CLASSES = 10
BATCH = 16
EVAL = 112  # one disagreement allowed


NOISE = 0.5

def _synthetic(protos: torch.Tensor, n: int, g: torch.Generator, noise: float | None = None):
    noise = NOISE if noise is None else noise
    labels = torch.arange(n) % CLASSES
    x = protos[labels] + noise * torch.randn(n, *protos.shape[1:], generator=g)
    return x, labels


def _fit_batch_norm(model: torch.nn.Module, x: torch.Tensor) -> None:
    """Batch-norm running statistics estimated on ``x``, as training leaves them: with the
    initial ones (mean 0, variance 1) a random network's activations shrink block after block
    (efficientnet_b0's features end near 1e-6, below any int8 activation scale)."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a plain average over the batches
    model.train()
    with torch.no_grad():
        for batch in x.split(BATCH * 2):
            model(batch)
    model.eval()


RESIDUAL_GAIN = 0.2


def _damp_residual_branches(model: torch.nn.Module) -> None:
    """Scale the last batch norm of every residual branch of timm's efficientnet-family blocks
    (``has_skip``) by ``RESIDUAL_GAIN``, as zero-init-last-BN schemes start them and training
    keeps them small. With unit-gain random branches, 16 blocks make the network chaotic: in
    fp32, 1 % input noise flips 8 % of efficientnet_b0's decisions, and int8 (ours or
    torchao's with ExecuTorch's XNNPACKQuantizer alike) keeps ~40 % of them."""
    with torch.no_grad():
        for block in model.modules():
            if getattr(block, "has_skip", False):
                last = block.bn3 if hasattr(block, "bn3") else block.bn2
                last.weight.mul_(RESIDUAL_GAIN)
                last.bias.mul_(RESIDUAL_GAIN)


def _published(name: str) -> torch.nn.Module:
    """The corpus model's timm architecture at its published widths and head (the corpus builds
    some narrower for speed; accuracy is measured on the nets people quantize)."""
    import timm

    torch.manual_seed(0)
    return timm.create_model(R.SPECS[name].note, pretrained=False).eval()


def _classifier(name: str, g: torch.Generator):
    """The corpus model with a 10-class head fitted to the synthetic classes, and them."""
    case = R.build(name)
    model = _published(name)
    shape = next(iter(case.kwargs.values())).shape[1:]
    protos = torch.randn(CLASSES, *shape, generator=g)
    x, y = _synthetic(protos, 120, g)
    _fit_batch_norm(model, x)
    _damp_residual_branches(model)
    model.reset_classifier(CLASSES)
    with torch.no_grad():
        f = model.forward_head(model.forward_features(x), pre_logits=True)
        f1 = torch.cat([f, torch.ones(len(f), 1)], 1)
        target = torch.nn.functional.one_hot(y, CLASSES).float()
        gram = f1.T @ f1  # ridge relative to the features' energy: a head that does not
        ridge = 1e-3 * gram.diagonal().mean()  # interpolate (and amplify) noise
        sol = torch.linalg.solve(gram + ridge * torch.eye(f1.shape[1]), f1.T @ target)
        head = model.get_classifier()
        head.weight.copy_(sol[:-1].T)
        head.bias.copy_(sol[-1])
    return model, protos


@functools.cache
def _vision_case(name: str):
    """(model, calibration batches, eval inputs, eval labels, fp32 logits), made once."""
    g = torch.Generator().manual_seed(0)
    model, protos = _classifier(name, g)
    calibration = [(_synthetic(protos, BATCH, g)[0],) for _ in range(2)]
    x_eval, y_eval = _synthetic(protos, EVAL, g)
    with torch.no_grad():
        ref = model(x_eval)
    return model, calibration, x_eval, y_eval, ref


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("name", [
    "timm_resnet18", "timm_mobilenetv3",
    pytest.param("timm_efficientnet_b0", marks=pytest.mark.slow),
])
def test_int8_vision_top1_agreement(name, dynamic):
    model, calibration, x_eval, y_eval, ref = _vision_case(name)
    converted = quantize(model, calibration[0], calibration, dynamic=dynamic)
    with torch.no_grad():
        got = torch.cat([converted(b) for b in x_eval.split(BATCH)])
    agreement = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    accuracy_loss = ((ref.argmax(-1) == y_eval).float().mean()
                     - (got.argmax(-1) == y_eval).float().mean()).item()
    assert agreement >= 0.99, agreement
    assert accuracy_loss <= 0.01, accuracy_loss
    assert not torch.equal(got, ref)  # it is quantized


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()


@pytest.mark.parametrize(("config", "kernel", "bound"), [
    (int8_weight_only(), INT8_MM, 0.999), (int4_weight_only(32), INT4_MM, 0.99),
], ids=["int8", "int4"])
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_llm_weight_only_logits(tmp_path, name, config, kernel, bound):
    case = R.build(name)
    model = case.model.eval()
    with torch.no_grad():
        ref = model(**case.kwargs).logits
        quantize_(model, config)
        got = model(**case.kwargs).logits
    assert bound <= _cosine(ref, got) < 1.0
    program, counts = fused_program(model, (), tmp_path, **case.kwargs)
    assert counts[kernel] == 15, counts  # 2 layers x 7 linears + lm_head
    torch.testing.assert_close(program.method("forward")(**case.kwargs)[0], got, rtol=1e-4,
                               atol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(not fbgemm_available(), reason="needs fbgemm (x86 torch)")
def test_llm_dynamic_int8_logits(tmp_path):
    """8da8w (int8 weights, activations quantized per call): logits close to float, every
    linear on fbgemm's kernel, the program equal to the quantized model."""
    case = R.build("llama")
    model = case.model.eval()
    with torch.no_grad():
        ref = model(**case.kwargs).logits
        quantize_(model, int8_dynamic_activation_int8_weight())
        got = model(**case.kwargs).logits
    assert 0.999 <= _cosine(ref, got) < 1.0
    program, counts = fused_program(model, (), tmp_path, **case.kwargs)
    # 2 layers x (q/k/v as one, o, gate/up as one, down) + lm_head
    assert counts[LINEAR_DYNAMIC_INT8] == 9, counts
    assert not [n for n in counts if n.startswith("quantized_decomposed")], counts
    torch.testing.assert_close(program.method("forward")(**case.kwargs)[0], got, rtol=1e-4,
                               atol=1e-4)


def _wide_llama():
    """A wider Llama (hidden 128, one layer) and its input: groups of 128 are whole rows."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64,
                                      use_cache=False)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(1))
    return model, ids


def _not_lm_head(module: torch.nn.Module, fqn: str) -> bool:
    return fqn != "lm_head"


@pytest.mark.parametrize(("group_size", "bound"), [(64, 0.99), (128, 0.99)])
def test_llm_int4_group_sizes(tmp_path, group_size, bound):
    """int4 decoder linears with the output projection (lm_head) in int8, as llama.cpp's Q4 and
    similar recipes keep it: issue 12's 0.99 for groups of 64 and 128. (Quantizing lm_head to
    int4 too costs 0.005 on its own: 0.989-0.990 with groups of 128, at what any 16-level grid
    per 128 Gaussian weights reaches; docs/quantization.md.)"""
    model, ids = _wide_llama()
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        quantize_(model, int4_weight_only(group_size), filter_fn=_not_lm_head)
        quantize_(model, int8_weight_only())
        got = model(input_ids=ids).logits
    assert bound <= _cosine(ref, got) < 1.0
    program, counts = fused_program(model, (), tmp_path, input_ids=ids)
    assert counts[INT4_MM] == 7 and counts[INT8_MM] == 1, counts  # 7 linears + lm_head
    torch.testing.assert_close(program.method("forward")(input_ids=ids)[0], got, rtol=1e-4,
                               atol=1e-5)


def test_int4_weight_error_not_above_torchaos_tinygemm():
    """Our int4 grid (float zero points, range searched for the least squared error) against
    torchao's tinygemm choice (min / max range, float zero point) on the same weights: ours
    reconstructs every linear of the wide Llama with less squared error."""
    qp = pytest.importorskip("torchao.quantization.quant_primitives")
    model, _ = _wide_llama()
    linears = {f: m.weight.detach().clone() for f, m in model.named_modules()
               if isinstance(m, torch.nn.Linear)}
    quantize_(model, int4_weight_only(128))
    for fqn, w in linears.items():
        ours = model.get_submodule(fqn).dequantized_weight()
        args = (w, (1, 128))
        s, z = qp._choose_qparams_affine_tinygemm(*args[:1], qp.MappingType.ASYMMETRIC, args[1],
                                                  torch.int32, 0, 15, 1e-6, torch.float32,
                                                  torch.float32)
        q = qp._quantize_affine_tinygemm(w, (1, 128), s, z, torch.int32, 0, 15)
        theirs = qp._dequantize_affine_tinygemm(q, (1, 128), s, z, torch.int32, 0, 15,
                                                output_dtype=torch.float32)
        assert (ours - w).square().sum() < 0.97 * (theirs - w).square().sum(), fqn
