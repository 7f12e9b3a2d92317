"""Tiny transformers decoder LLMs with a static cache, as the corpus builds them, and their
eager greedy generation (the oracle)."""

from __future__ import annotations

from typing import Any

import torch
from corpus import real_models as rm

MAX_CACHE = 32
PROMPT = [3, 17, 42, 9, 100]
FAMILIES: dict[str, dict[str, Any]] = {
    "Llama": {},
    "Qwen2": {},
    "Gemma": {"head_dim": 8},
    "Phi3": {"pad_token_id": 0},
    "Mistral": {"sliding_window": 4},
}


def config(family: str, **overrides: Any) -> Any:
    c = getattr(rm._tf(), family + "Config")(**{**rm.TINY_TEXT, **rm.LLM, **FAMILIES[family],
                                                **overrides})
    c.use_cache = True
    return c


def causal_lm(family: str, *, device: str = "cpu", seed: int = 0, quantize: Any = None) -> Any:
    """The model (eval, static-cache generation config), built on ``device``."""
    torch.manual_seed(seed)
    with torch.device(device):
        lm = getattr(rm._tf(), family + "ForCausalLM")(config(family)).eval()
    lm.generation_config.cache_implementation = "static"
    lm.generation_config.cache_config = {"batch_size": 1, "max_cache_len": MAX_CACHE}
    lm.generation_config.eos_token_id = None  # random weights: never stop early
    if quantize is not None:
        from exportir.quantization import quantize_

        quantize_(lm, quantize)
    return lm


def static_cache_module(lm: Any) -> torch.nn.Module:
    """transformers' own export wrapper: ``forward(input_ids=, cache_position=)``."""
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    return TorchExportableModuleWithStaticCache(lm, batch_size=1, max_cache_len=MAX_CACHE)


def eager_generate(lm: Any, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = lm.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()
