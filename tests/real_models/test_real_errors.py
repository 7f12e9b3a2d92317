"""Errors real models hit: what they say, where they point, and that the fix they give works.

Each failure class is reproduced on a model built by a library (not on a toy), the message is
checked for the location and the fix, and the fix is applied to show it works. Fixes that
change process-wide registries run in a subprocess so they cannot leak into other tests.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from corpus import real_models as R

import exportir
from exportir.export.capture.recorder import ExportError
from exportir.export.dynamic.dims import UserError

_TESTS = Path(__file__).resolve().parent.parent
_SRC = _TESTS.parent / "src"


def _llama_with_cache() -> tuple[torch.nn.Module, torch.Tensor]:
    import transformers

    cfg = transformers.LlamaConfig(**{**R.TINY_TEXT, **R.LLM})
    cfg.use_cache = True
    return transformers.LlamaForCausalLM(cfg).eval(), torch.randint(1, R.VOCAB, (1, 6))


def test_unregistered_output_class_names_the_output_and_the_fixes() -> None:
    model, ids = _llama_with_cache()
    with pytest.raises(ExportError) as info:
        exportir.export(model, (ids,))
    text = str(info.value)
    assert "LlamaForCausalLM.forward returns a DynamicCache" in text
    assert "output['past_key_values']" in text
    assert "register_dynamic_cache_export_support()" in text
    assert "use_cache=False" in text


def test_leaving_the_cache_out_as_the_error_says_exports() -> None:
    model, ids = _llama_with_cache()
    ep = exportir.export(model, (ids,), {"use_cache": False})
    with torch.no_grad():
        expected = model(ids, use_cache=False).logits
    torch.testing.assert_close(ep.module()(ids, use_cache=False).logits, expected)


def test_registering_the_cache_as_the_error_says_exports() -> None:
    code = f"""
    import sys
    sys.path[:0] = [{str(_TESTS)!r}, {str(_SRC)!r}]
    import torch, transformers
    import exportir
    from corpus import real_models as R
    from transformers.integrations.executorch import register_dynamic_cache_export_support
    cfg = transformers.LlamaConfig(**{{**R.TINY_TEXT, **R.LLM}})
    cfg.use_cache = True
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(1, R.VOCAB, (1, 6))
    register_dynamic_cache_export_support()
    out = exportir.export(model, (ids,)).module()(ids)
    with torch.no_grad():
        ref = model(ids)
    torch.testing.assert_close(out.logits, ref.logits)
    keys = [layer.keys for layer in out.past_key_values.layers]
    torch.testing.assert_close(keys, [layer.keys for layer in ref.past_key_values.layers])
    print("OK")
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          check=False, text=True, timeout=600)
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]


def test_dim_range_beyond_what_the_model_allows_names_the_library_line_and_the_fix_exports() -> None:
    case = R.build("bert")
    seq = exportir.Dim("seq", min=2, max=4096)
    with pytest.raises(UserError) as info:
        exportir.export(case.model, (), case.kwargs,
                        dynamic_shapes={k: {1: seq} for k in case.kwargs})
    text = str(info.value)
    assert "Constraints violated (seq)!" in text
    assert "transformers/models/bert/modeling_bert.py:" in text and "position_ids" in text
    fix = next(line.strip() for line in text.splitlines() if line.strip().startswith("seq = Dim("))
    assert fix == "seq = Dim('seq', max=64)"
    seq = exportir.Dim("seq", max=64)  # the suggested fix, applied
    ep = exportir.export(case.model, (), case.kwargs,
                         dynamic_shapes={k: {1: seq} for k in case.kwargs})
    long = {k: torch.cat([v] * 8, dim=1) for k, v in case.kwargs.items()}  # 64 tokens
    with torch.no_grad():
        expected = case.model(**long).last_hidden_state
    torch.testing.assert_close(ep.module()(**long).last_hidden_state, expected)


def test_dynamic_batch_on_a_batch_one_example_says_to_give_two_and_that_works() -> None:
    case = R.build("vit")
    one = {k: v[:1] for k, v in case.kwargs.items()}
    batch = exportir.Dim("batch")
    with pytest.raises(UserError, match="specialized it to be a constant") as info:
        exportir.export(case.model, (), one, dynamic_shapes={k: {0: batch} for k in one})
    assert "The example input has size 1 at L['pixel_values'].size()[0]" in str(info.value)
    assert "pass an example of size 2 or more there" in str(info.value)
    two = {k: v[:1].repeat(2, 1, 1, 1) for k, v in case.kwargs.items()}  # the fix, applied
    ep = exportir.export(case.model, (), two, dynamic_shapes={k: {0: batch} for k in two})
    for n in (1, 3):
        x = {k: torch.randn(n, *v.shape[1:]) for k, v in one.items()}
        with torch.no_grad():
            expected = case.model(**x).last_hidden_state
        torch.testing.assert_close(ep.module()(**x).last_hidden_state, expected)


def _bart_classifier() -> tuple[torch.nn.Module, torch.Tensor]:
    import transformers

    cfg = transformers.BartConfig(
        vocab_size=R.VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64,
    )
    ids = torch.randint(3, R.VOCAB, (2, 8))
    ids[:, -1] = cfg.eos_token_id
    return transformers.BartForSequenceClassification(cfg).eval(), ids


def test_encoder_decoder_cache_output_says_leave_it_out_and_that_works() -> None:
    """BART's classifier returns an EncoderDecoderCache, for which transformers registers no
    pytree node: the error offers only what works. With it left out, the classification head's
    select from a masked tensor (`hidden[eos_mask].view(b, -1, d)[:, -1]`, a data-dependent
    size) exports as torch.export exports it."""
    model, ids = _bart_classifier()
    with pytest.raises(ExportError) as info:
        exportir.export(model, (ids,))
    text = str(info.value)
    assert "returns a EncoderDecoderCache" in text and "output['past_key_values']" in text
    assert "use_cache=False" in text and "register_dynamic_cache_export_support" not in text
    ep = exportir.export(model, (ids,), {"use_cache": False})
    fresh = torch.randint(3, R.VOCAB, (2, 8))
    fresh[:, -1] = model.config.eos_token_id
    with torch.no_grad():
        expected = model(fresh, use_cache=False).logits
    torch.testing.assert_close(ep.module()(fresh, use_cache=False).logits, expected)
