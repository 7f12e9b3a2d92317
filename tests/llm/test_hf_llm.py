"""transformers decoder LLMs exported with their static KV cache into prefill/decode programs:
greedy generation token-identical to ``model.generate()`` (same static cache, do_sample=False);
the fused CPU backend; weight-only int8/int4 programs."""

from __future__ import annotations

import pytest
from hf_llm import FAMILIES, MAX_CACHE, PROMPT, causal_lm, eager_generate, static_cache_module

from exportir.program.llm import export_llm
from exportir.runtime import Program, generate

NEW = 12


def _program(family: str, **kw):
    lm = causal_lm(family, quantize=kw.pop("quantize", None))
    return lm, export_llm(static_cache_module(lm), max_seq_len=MAX_CACHE, **kw)


def test_llama_generates_like_transformers():
    lm, pm = _program("Llama")
    assert list(generate(Program.load(pm.buffer), PROMPT, NEW)) == eager_generate(lm, PROMPT, NEW)


def test_generate_command_errors(tmp_path, capsys):
    from exportir.cli import main

    assert main(["generate", str(tmp_path / "none.xpt"), "--prompt-ids", "1"]) == 1
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "x.xpt", "--prompt-ids", "1,x"])
    assert exit_.value.code == 2
    assert "comma-separated token ids" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "Llama"])
def test_family_generates_like_transformers(family):
    lm, pm = _program(family)
    assert list(generate(Program.load(pm.buffer), PROMPT, NEW)) == eager_generate(lm, PROMPT, NEW)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_fused_cpu_generates_like_transformers(family):
    """Decode steps run the fused CPU backend's one-row linears on blocked weights and
    grouped-query attention on the unrepeated cache: still token-identical."""
    from exportir.backends.fused_cpu import FusedCpuPartitioner

    lm, pm = _program(family, partitioner=[FusedCpuPartitioner()])
    assert any(d.backend_id == "FusedCpuBackend" for d in pm.program.delegates)
    assert list(generate(Program.load(pm.buffer), PROMPT, NEW)) == eager_generate(lm, PROMPT, NEW)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize("fused", [False, True], ids=["portable", "fused_cpu"])
def test_weight_only_quantized_llama_generates(scheme, fused):
    """Token-identical to the quantized model run eagerly; agreement with fp32 is printed."""
    from exportir.backends.fused_cpu import FusedCpuPartitioner
    from exportir.quantization import int4_weight_only, int8_weight_only

    config = int8_weight_only() if scheme == "int8" else int4_weight_only(group_size=32)
    lm, pm = _program("Llama", quantize=config,
                      partitioner=[FusedCpuPartitioner()] if fused else None)
    ours = list(generate(Program.load(pm.buffer), PROMPT, NEW))
    assert ours == eager_generate(lm, PROMPT, NEW)
    fp32 = eager_generate(causal_lm("Llama"), PROMPT, NEW)
    print(f"{scheme}: {sum(a == b for a, b in zip(ours, fp32))}/{NEW} tokens equal to fp32")
