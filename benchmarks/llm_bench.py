"""LLM benchmark: prefill and decode of a small Llama (transformers, static KV cache), exportir
vs ExecuTorch 1.5.1 with XNNPACK, fp32 and weight-only int8 / int4; and the Llama-2-7B meta
export (export + to_edge + plan, no weights).

Each side is compiled in this process and written to a file; each program then runs in a fresh
child process (so its peak RSS is the runtime's own: load, prefill, decode) which reports
prefill time, decode tokens/s and peak RSS. Ratios are measured in the same run.

    PYTHONPATH=src:tests /work/main/.venv-bench/bin/python benchmarks/llm_bench.py
    ... --quick            (a smaller model, fewer tokens)
    ... --skip-7b          (no 7B meta export row)

ExecuTorch rows: ``torch.export`` of the same wrapped model, ``to_edge_transform_and_lower`` with
``XnnpackPartitioner``; a ``decode`` and a ``prefill`` program (ExecuTorch 1.5.1 has no
config to share a mutable buffer between methods, so each is its own program: the decode rate
does not depend on it). Quantized ExecuTorch rows use torchao's XNNPACK recipe
(``Int8DynamicActivationIntxWeightConfig``: int8 dynamic activations, int8 / int4 weights), the
closest XNNPACK has to weight-only; a row that fails to export says so.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

PROMPT_LEN = 64


def llama_config(quick: bool) -> Any:
    from corpus import real_models as rm

    tf = rm._tf()
    dims = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                num_attention_heads=8, num_key_value_heads=4, vocab_size=4096) if quick else dict(
        hidden_size=512, intermediate_size=1376, num_hidden_layers=8, num_attention_heads=8,
        num_key_value_heads=4, vocab_size=8192)
    c = tf.LlamaConfig(**dims, max_position_embeddings=1024, tie_word_embeddings=False)
    c.use_cache = True
    return c


def build(config: Any, max_cache: int, scheme: str, side: str) -> torch.nn.Module:
    """The static-cache module of a fixed-seed Llama, quantized for ``side``."""
    from corpus import real_models as rm
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    torch.manual_seed(0)
    lm = rm._tf().LlamaForCausalLM(config).eval()
    lm.generation_config.cache_implementation = "static"
    if scheme != "fp32" and side == "exportir":
        from exportir.quantization import int4_weight_only, int8_weight_only, quantize_

        quantize_(lm, int8_weight_only() if scheme == "int8" else int4_weight_only(group_size=32))
    elif scheme != "fp32":
        from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
        from torchao.quantization.granularity import PerAxis, PerGroup

        weight = torch.int8 if scheme == "int8" else torch.int4
        granularity = PerAxis(0) if scheme == "int8" else PerGroup(32)
        quantize_(lm, Int8DynamicActivationIntxWeightConfig(weight_dtype=weight,
                                                            weight_granularity=granularity))
    return TorchExportableModuleWithStaticCache(lm, batch_size=1, max_cache_len=max_cache)


def compile_ours(module: torch.nn.Module, max_cache: int, path: Path) -> float:
    from exportir.backends.fused_cpu import FusedCpuPartitioner
    from exportir.program.llm import export_llm

    start = time.perf_counter()
    export_llm(module, max_seq_len=max_cache, max_prefill=PROMPT_LEN,
               partitioner=[FusedCpuPartitioner()]).save(path)
    return time.perf_counter() - start


def compile_et(module: torch.nn.Module, prefix: Path) -> float:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from exportir.program.llm import LLMStep

    step = LLMStep(module).eval()
    start = time.perf_counter()
    with torch.no_grad():
        decode = torch.export.export(step, (torch.zeros(1, 1, dtype=torch.long),
                                            torch.tensor([0])), strict=False)
        prefill = torch.export.export(step, (torch.zeros(1, PROMPT_LEN, dtype=torch.long),
                                             torch.arange(PROMPT_LEN)), strict=False)
    for name, ep in (("decode", decode), ("prefill", prefill)):
        et = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
        Path(f"{prefix}.{name}.pte").write_bytes(et.buffer)
    return time.perf_counter() - start


# ------------------------------------------------------------------------------ child: run


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_ours(path: str, tokens: int) -> dict[str, float]:
    from exportir.runtime import Program

    program = Program.load(path)
    prefill, decode = program.method("prefill"), program.method("decode")
    prompt = torch.randint(0, 100, (1, PROMPT_LEN))
    prefill.execute([prompt, torch.arange(PROMPT_LEN)])  # warm
    start = time.perf_counter()
    (logits,) = prefill.execute([prompt, torch.arange(PROMPT_LEN)])
    prefill_s = time.perf_counter() - start
    return _decode_loop(lambda t, p: decode.execute([t, p])[0], logits, tokens, prefill_s)


def run_et(prefix: str, tokens: int) -> dict[str, float]:
    from executorch.runtime import Runtime

    runtime = Runtime.get()
    prefill = runtime.load_program(Path(f"{prefix}.prefill.pte").read_bytes()).load_method("forward")
    decode = runtime.load_program(Path(f"{prefix}.decode.pte").read_bytes()).load_method("forward")
    prompt = torch.randint(0, 100, (1, PROMPT_LEN))
    prefill.execute([prompt, torch.arange(PROMPT_LEN)])
    start = time.perf_counter()
    (logits,) = prefill.execute([prompt, torch.arange(PROMPT_LEN)])
    prefill_s = time.perf_counter() - start
    return _decode_loop(lambda t, p: decode.execute([t, p])[0], logits, tokens, prefill_s)


def _decode_loop(step: Any, logits: torch.Tensor, tokens: int, prefill_s: float) -> dict[str, float]:
    token = int(logits.argmax())
    step(torch.tensor([[token]]), torch.tensor([PROMPT_LEN]))  # warm
    start = time.perf_counter()
    for k in range(tokens):
        logits = step(torch.tensor([[token]]), torch.tensor([PROMPT_LEN + 1 + k]))
        token = int(logits.argmax())
    elapsed = time.perf_counter() - start
    return {"prefill_ms": 1000 * prefill_s, "decode_tps": tokens / elapsed, "rss_mib": _rss_mib()}


def child(kind: str, path: str, tokens: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT / 'tests'}"}
    cmd = [sys.executable, __file__, "--child", kind, path, "--tokens", str(tokens)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr else "failed")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------ 7B meta export


def seven_b() -> dict[str, float]:
    code = (
        "import time, resource, torch, sys\n"
        f"sys.path[:0] = [{str(ROOT / 'src')!r}, {str(ROOT / 'tests')!r}]\n"
        "from corpus import real_models as rm\n"
        "from transformers.integrations.executorch import TorchExportableModuleWithStaticCache\n"
        "from exportir.program.llm import export_llm\n"
        "tf = rm._tf()\n"
        "c = tf.LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008,\n"
        "    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32)\n"
        "c.use_cache = True\n"
        "start = time.perf_counter()\n"
        "with torch.device('meta'):\n"
        "    lm = tf.LlamaForCausalLM(c).eval()\n"
        "lm.generation_config.cache_implementation = 'static'\n"
        "pm = export_llm(TorchExportableModuleWithStaticCache(lm, batch_size=1, max_cache_len=128),\n"
        "    max_seq_len=128)\n"
        "print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1])
    seconds, rss = map(float, done.stdout.split()[-2:])
    return {"seconds": seconds, "rss_mib": rss}


# ------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-7b", action="store_true")
    parser.add_argument("--schemes", default="fp32,int8,int4")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--child", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    ns = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if ns.child:
        kind, path = ns.child
        print(json.dumps((run_ours if kind == "exportir" else run_et)(path, ns.tokens)))
        return
    tokens = 16 if ns.quick else ns.tokens
    config = llama_config(ns.quick)
    max_cache = PROMPT_LEN + tokens + 8
    print(f"Llama hidden={config.hidden_size} layers={config.num_hidden_layers} "
          f"vocab={config.vocab_size}; prompt {PROMPT_LEN} tokens, {tokens} decoded; "
          f"torch threads {torch.get_num_threads()}")
    print(f"{'scheme':8} {'side':10} {'compile s':>9} {'prefill ms':>10} {'decode tok/s':>12} "
          f"{'peak RSS MiB':>12}  ratio ours/ET (decode tok/s)")
    with tempfile.TemporaryDirectory() as tmp:
        for scheme in ns.schemes.split(","):
            results: dict[str, dict[str, float]] = {}
            for side in ("exportir", "executorch"):
                try:
                    module = build(config, max_cache, scheme, side)
                    path = Path(tmp) / f"{scheme}-{side}"
                    if side == "exportir":
                        path = path.with_suffix(".xpt")
                        seconds = compile_ours(module, max_cache, path)
                    else:
                        seconds = compile_et(module, path)
                    r = results[side] = {**child(side, str(path), tokens), "compile_s": seconds}
                    print(f"{scheme:8} {side:10} {r['compile_s']:9.1f} {r['prefill_ms']:10.2f} "
                          f"{r['decode_tps']:12.1f} {r['rss_mib']:12.0f}", flush=True)
                except Exception as e:  # noqa: BLE001 - reported as the row's result
                    print(f"{scheme:8} {side:10} FAILED: {type(e).__name__}: {str(e)[:200]}",
                          flush=True)
            if len(results) == 2:
                ratio = results["exportir"]["decode_tps"] / results["executorch"]["decode_tps"]
                pre = results["executorch"]["prefill_ms"] / results["exportir"]["prefill_ms"]
                print(f"{scheme:8} ratio: decode tok/s ours/ET {ratio:.2f}x (target >= 1.0), "
                      f"prefill speed ours/ET {pre:.2f}x", flush=True)
    if not ns.skip_7b:
        try:
            r = seven_b()
            print(f"llama-2-7b on meta: export + to_edge + plan {r['seconds']:.1f} s (target < 60), "
                  f"peak RSS {r['rss_mib']:.0f} MiB (target < 4096)")
        except Exception as e:  # noqa: BLE001
            print(f"llama-2-7b on meta: FAILED {e}")


if __name__ == "__main__":
    main()
