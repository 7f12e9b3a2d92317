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
