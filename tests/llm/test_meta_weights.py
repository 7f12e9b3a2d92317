"""Models built on the meta device: export, lower and plan without weights, then attach them from
a safetensors checkpoint (never materialising the model eagerly)."""

from __future__ import annotations

import resource
import time

import pytest
import torch
from safetensors.torch import save_file
from toy_lm import eager_greedy, toy_lm

from exportir.program.llm import export_llm
from exportir.program.weights import WeightsError, load_safetensors
from exportir.runtime import Program, generate

PROMPT = [5, 9, 33, 2, 17]


def _meta_toy() -> torch.nn.Module:
    with torch.device("meta"):
        return toy_lm()


def _toy_program():
    return export_llm(_meta_toy(), max_seq_len=24, max_prefill=8, token_arg=None,
                      position_arg=None)


def test_meta_model_runs_after_attaching_its_checkpoint(tmp_path):
    eager = toy_lm(seed=1)
    path = tmp_path / "toy.safetensors"
    # a checkpoint of the parameters only: the cache buffers start at zero
    save_file({k: v for k, v in eager.state_dict().items() if "cache" not in k}, path)
    pm = _toy_program()
    assert "model.embed.weight" in pm.deferred_weights
    assert {"model.k_cache", "model.v_cache"} <= set(pm.deferred_weights)
    with pytest.raises(ValueError, match="meta tensors at export.*attach_weights"):
        pm.buffer  # noqa: B018
    with pytest.raises(ValueError, match=r"constants\[\d+\].*attach_weights"):
        Program.from_schema(pm.program)
    pm.attach_weights(path)
    assert pm.deferred_weights == []
    got = list(generate(Program.load(pm.buffer), PROMPT, 8, stop_at_eos=False))
    assert got == eager_greedy(toy_lm(seed=1), PROMPT, 8)


def test_attach_errors_name_the_weight(tmp_path):
    eager = toy_lm()
    state = {k: v for k, v in eager.state_dict().items() if "cache" not in k}
    with pytest.raises(WeightsError, match=r"no weight 'model\.out\.bias'"):
        _toy_program().attach_weights({k: v for k, v in state.items() if k != "out.bias"})
    with pytest.raises(WeightsError, match=r"'model\.q\.weight' has shape \[3, 3\]"):
        _toy_program().attach_weights({**state, "q.weight": torch.zeros(3, 3)})
    with pytest.raises(WeightsError, match="matches several checkpoint keys"):
        _toy_program().attach_weights({**state, "weight": torch.zeros(3, 3)})
    with pytest.raises(TypeError, match="safetensors path or a mapping"):
        _toy_program().attach_weights(42)


def test_hostile_checkpoints_are_refused(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes((10**12).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match="header length"):
        load_safetensors(path)
    path.write_bytes((20).to_bytes(8, "little") + b'{"w": {"dtype": "F32"}}'.ljust(20))
    with pytest.raises(ValueError, match="bad.safetensors"):
        load_safetensors(path)
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="empty file"):
        load_safetensors(path)


@pytest.mark.slow
def test_transformers_llama_on_meta_attaches_a_real_checkpoint(tmp_path):
    from hf_llm import MAX_CACHE, causal_lm, eager_generate, static_cache_module
    from hf_llm import PROMPT as HF_PROMPT

    eager = causal_lm("Llama")
    path = tmp_path / "llama.safetensors"
    save_file(eager.state_dict(), path)
    meta = causal_lm("Llama", device="meta")
    pm = export_llm(static_cache_module(meta), max_seq_len=MAX_CACHE)
    # a buffer no checkpoint holds (rotary inv_freq) is given by name (suffix match)
    pm.attach_weights(path, {"rotary_emb.inv_freq": eager.model.rotary_emb.inv_freq})
    got = list(generate(Program.load(pm.buffer), HF_PROMPT, 10))
    assert got == eager_generate(eager, HF_PROMPT, 10)


@pytest.mark.slow
def test_llama_7b_on_meta_exports_lowers_and_plans():
    """Llama-2-7B dimensions on the meta device: export + to_edge + plan (no weights). Prints
    the time and the peak RSS; fails past 240 s (4x the 60 s target: CI machines run 2 cores shared by many jobs)."""
    from corpus import real_models as rm
    from hf_llm import static_cache_module

    tf = rm._tf()
    start = time.perf_counter()
    config = tf.LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                            num_hidden_layers=32, num_attention_heads=32,
                            num_key_value_heads=32, max_position_embeddings=4096)
    config.use_cache = True
    with torch.device("meta"):
        lm = tf.LlamaForCausalLM(config).eval()
    lm.generation_config.cache_implementation = "static"
    pm = export_llm(static_cache_module(lm), max_seq_len=32)
    elapsed = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"llama-7b meta: export+to_edge+plan {elapsed:.1f} s, peak RSS {rss:.0f} MiB")
    assert len(pm.deferred_weights) == 3 * 32 + 9 * 32 + 3 + 1  # caches, weights, inv_freq
    assert rss < 4096
    assert elapsed < 240
