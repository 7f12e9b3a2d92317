"""exportir's fused CPU backend vs ExecuTorch 1.5.1's XNNPACK delegate, in one run.

    .venv-bench/bin/python benchmarks/program_bench.py --xnnpack [--quick] [--only NAME ...]
    .venv-bench/bin/python benchmarks/_xnnpack_rows.py [--quick] [--threads 1,2]

For each model (batch 1): ours = ``export -> to_edge_transform_and_lower(FusedCpuPartitioner())
-> to_program()``, run by ``exportir.runtime``; theirs = ``torch.export.export ->
executorch.exir.to_edge_transform_and_lower(partitioner=[XnnpackPartitioner()]) ->
to_executorch()``, run by ``executorch.runtime``; torch eager under ``no_grad`` as a third
column. Every side is checked once against eager before it is timed.

- latency: interleaved rounds, each side keeps its best loop (CPU time by default), at every
  thread count asked for (torch's intra-op threads for ours and eager, ExecuTorch's threadpool
  for XNNPACK);
- load and memory: each program file is loaded and run once in a fresh interpreter that has
  only imported its runtime (``exportir.runtime`` / ``executorch.runtime``); load = wall time
  from the bytes to the first result, memory = peak RSS growth over the import baseline. Best
  (smallest) of ``--load-runs`` processes.

transformers and timm are taken from the project venv when the benchmark venv lacks them (pure
Python packages; the benchmark venv's torch stays the one in use).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
for _path in (_ROOT / "src", _ROOT / "tests", Path(__file__).resolve().parent):
    if _path.is_dir() and str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import torch
from _timing import CLOCKS, Workload, compare, looped, select_only
from torch import nn

Case = tuple[nn.Module, tuple]


def _third_party() -> None:
    """Make transformers / timm importable (see the module docstring)."""
    try:
        import timm  # noqa: F401
        import transformers  # noqa: F401

        return
    except ImportError:
        pass
    for site in sorted(Path("/work/main/.venv/lib").glob("python3*/site-packages")):
        if str(site) not in sys.path:
            sys.path.append(str(site))
    from corpus import _torchvision_ops  # noqa: F401 - before transformers / timm


# --------------------------------------------------------------------------------------------
# Models (batch 1).


def _resnet18() -> Case:
    from program_bench import ResNet18, _randomize_norms

    return _randomize_norms(ResNet18()).eval(), (torch.randn(1, 3, 224, 224),)


class _InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()]
        layers += [
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 (width 1.0) layer for layer, without torchvision."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1))  # fmt: skip

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32),
                                   nn.ReLU6()]  # fmt: skip
        cin = 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(_InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += [nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _mobilenet_v2() -> Case:
    from program_bench import _randomize_norms

    return _randomize_norms(MobileNetV2()).eval(), (torch.randn(1, 3, 224, 224),)


def _bert() -> Case:
    _third_party()
    from transformers import BertConfig, BertModel

    cfg = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=1024, vocab_size=30522, attn_implementation="sdpa")  # fmt: skip
    model = BertModel(cfg, add_pooling_layer=False).eval()
    return _Last(model), (torch.randint(0, 30522, (1, 128)),)


def _llama() -> Case:
    _third_party()
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, intermediate_size=688, vocab_size=32000,
                      attn_implementation="sdpa", use_cache=False)  # fmt: skip
    return _Last(LlamaModel(cfg).eval()), (torch.randint(0, 32000, (1, 128)),)


class _Last(nn.Module):
    """A transformers model returning only its last hidden state (one plain tensor)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=ids).last_hidden_state


def _timm(name: str) -> Callable[[], Case]:
    def make() -> Case:
        _third_party()
        import timm
        from program_bench import _randomize_norms

        model = timm.create_model(name, pretrained=False)
        return _randomize_norms(model).eval(), (torch.randn(1, 3, 224, 224),)

    return make


def _mlp() -> Case:
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))  # fmt: skip
    return model.eval(), (torch.randn(1, 784),)


class _Recurrent(nn.Module):
    def __init__(self, cell: type[nn.Module]) -> None:
        super().__init__()
        self.rnn = cell(64, 128, num_layers=2, batch_first=True)
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


def _lstm() -> Case:
    return _Recurrent(nn.LSTM).eval(), (torch.randn(1, 32, 64),)


def _gru() -> Case:
    return _Recurrent(nn.GRU).eval(), (torch.randn(1, 32, 64),)


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    build: Callable[[], Case]
    int8: bool = False  # static int8 (PT2E, XNNPACK's symmetric per-channel recipe) both sides


MODELS = [
    Model("resnet18", _resnet18),
    Model("mobilenet_v2", _mobilenet_v2),
    Model("bert_4x256", _bert),
    Model("llama_2x256_s128", _llama),
    Model("vit_small", _timm("vit_small_patch16_224")),
    Model("efficientnet_b0", _timm("efficientnet_b0")),
    Model("mlp", _mlp),
    Model("lstm", _lstm),
    Model("gru", _gru),
    # static int8: ours = exportir.quantization's prepare_pt2e / convert_pt2e with its
    # XNNPACKQuantizer; theirs = torchao's with ExecuTorch's XNNPACKQuantizer; same calibration
    Model("resnet18_int8", _resnet18, int8=True),
    Model("mobilenet_v2_int8", _mobilenet_v2, int8=True),
    Model("efficientnet_b0_int8", _timm("efficientnet_b0"), int8=True),
    Model("mlp_int8", _mlp, int8=True),
]


def _calibration(args: tuple) -> list[tuple]:
    g = torch.Generator().manual_seed(1)
    return [args, *((torch.randn(a.shape, generator=g),) for a in args for _ in range(2))]


def ours_quantize(case: Case) -> Case:
    import exportir
    from exportir.quantization import (
        XNNPACKQuantizer,
        convert_pt2e,
        get_symmetric_quantization_config,
        prepare_pt2e,
    )

    module, args = case
    with _quiet():
        gm = exportir.export(module, args).module()
        prepared = prepare_pt2e(gm, XNNPACKQuantizer().set_global(
            get_symmetric_quantization_config(is_per_channel=True)))
        for batch in _calibration(args):
            prepared(*batch)
        return convert_pt2e(prepared), args


def et_quantize(case: Case) -> Case:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    module, args = case
    with _quiet():
        gm = torch.export.export(module, args, strict=False).module()
        prepared = prepare_pt2e(gm, XNNPACKQuantizer().set_global(
            get_symmetric_quantization_config(is_per_channel=True)))
        for batch in _calibration(args):
            prepared(*batch)
        return convert_pt2e(prepared), args


def _seeded(model: Model) -> Case:
    torch.manual_seed(0)
    return model.build()


# --------------------------------------------------------------------------------------------
# The two roads.


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        with contextlib.redirect_stdout(io.StringIO()):
            yield


def ours_compile(case: Case) -> bytes:
    from exportir.backends.fused_cpu import FusedCpuPartitioner
    from exportir.export import export
    from exportir.program.transform_and_lower import to_edge_transform_and_lower

    module, args = case
    with _quiet():
        edge = to_edge_transform_and_lower(export(module, args), partitioner=[FusedCpuPartitioner()])
        return bytes(edge.to_program().buffer)


def et_compile(case: Case) -> bytes:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    module, args = case
    with _quiet():
        ep = torch.export.export(module, args, strict=False)
        edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
        return bytes(edge.to_executorch().buffer)


def et_set_threads(n: int) -> None:
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

    _unsafe_reset_threadpool(n)


# --------------------------------------------------------------------------------------------
# Load and memory, in fresh interpreters.

_CHILD = r"""
import json, resource, sys, time
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
side, path, inputs = sys.argv[1], sys.argv[2], sys.argv[3]
import torch
torch.set_num_threads(1)
if side == "ours":
    from exportir.runtime import Program
else:
    from executorch.runtime import Runtime
args = torch.load(inputs)
data = open(path, "rb").read()
base = hwm()
t0 = time.perf_counter()
if side == "ours":
    out = Program.load(data).method("forward")(*args)
else:
    out = Runtime.get().load_program(data).load_method("forward").execute(list(args))
elapsed = time.perf_counter() - t0
mods = sorted(m for m in sys.modules if m.split(".")[0] in ("sympy", "mpmath")
              or m.startswith("torch._dynamo"))
print(json.dumps({"load": elapsed, "mem": hwm() - base, "heavy": len(mods)}))
"""


def fresh_load(side: str, data: bytes, args: tuple, runs: int) -> dict[str, float]:
    """Best load time and smallest peak-RSS growth of ``runs`` fresh interpreters."""
    with tempfile.TemporaryDirectory() as tmp:
        path, inputs = Path(tmp, "program"), Path(tmp, "inputs.pt")
        path.write_bytes(data)
        torch.save(args, inputs)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(_ROOT / "src"),
                                                          os.environ.get("PYTHONPATH", "")]))  # fmt: skip
        # bytecode caches for our modules too (ExecuTorch's are installed with theirs), written
        # by one unmeasured process (see benchmarks/memory_bench.py)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp, "pycache"))
        results = []
        for i in range(runs + 1):
            proc = subprocess.run(
                [sys.executable, "-c", _CHILD, side, str(path), str(inputs)],
                capture_output=True, text=True, env=env, check=False,
            )  # fmt: skip
            if proc.returncode != 0:
                raise RuntimeError(f"{side} load failed: {proc.stderr.strip().splitlines()[-1:]}")
            if i:
                results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {
        "load": min(r["load"] for r in results),
        "mem": min(r["mem"] for r in results),
        "heavy": max(r["heavy"] for r in results),
    }


# --------------------------------------------------------------------------------------------
# Measuring one model.


@dataclass(slots=True)
class Row:
    name: str
    latency: dict[tuple[str, int], float] = field(default_factory=dict)  # (side, threads) -> s
    load: dict[str, dict[str, float]] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Options:
    rounds: int
    call_seconds: float
    threads: tuple[int, ...]
    load_runs: int
    budget: float
    clock: str


def _close(got: Any, want: torch.Tensor, what: str, int8: bool = False) -> None:
    got = got[0] if isinstance(got, (list, tuple)) else got
    if int8:  # quantized: close to float in direction, not elementwise
        cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
        if cos < 0.9:
            raise RuntimeError(f"{what}: cosine with float {cos.item():.3f}")
        return
    if not torch.allclose(got, want, rtol=1e-3, atol=1e-3):
        raise RuntimeError(f"{what}: max abs error {(got - want).abs().max().item():.3g}")


def measure(model: Model, opts: Options) -> Row:
    from executorch.runtime import Runtime

    from exportir.runtime import Program

    row = Row(model.name)
    module, args = _seeded(model)
    with torch.no_grad():
        want = module(*args)
    if model.int8:
        ours, theirs = (ours_compile(ours_quantize(_seeded(model))),
                        et_compile(et_quantize(_seeded(model))))
    else:
        ours, theirs = ours_compile(_seeded(model)), et_compile(_seeded(model))
    ours_method = Program.load(ours).method("forward")
    et_method = Runtime.get().load_program(theirs).load_method("forward")
    with torch.no_grad():
        _close(ours_method(*args), want, "exportir fused", model.int8)
        _close(et_method.execute(list(args)), want, "ExecuTorch XNNPACK", model.int8)
        module(*args)
        start = time.process_time()
        module(*args)
        one = max(time.process_time() - start, 1e-6)
    n = max(1, min(1000, int(opts.call_seconds / one)))
    makers = {
        "eager": lambda: Workload(run=looped(lambda: module(*args), n)),
        "fused": lambda: Workload(run=looped(lambda: ours_method(*args), n)),
        "xnnpack": lambda: Workload(run=looped(lambda: et_method.execute(list(args)), n)),
    }
    for threads in opts.threads:
        torch.set_num_threads(threads)
        et_set_threads(threads)
        result = compare(makers, rounds=opts.rounds, budget=opts.budget, timeout=600.0,
                         clock=CLOCKS[opts.clock])  # fmt: skip
        for side, m in result.items():
            if m.best is None:
                raise RuntimeError(f"{side}: {m.error} at {m.where}")
            row.latency[side, threads] = m.best / n
    torch.set_num_threads(opts.threads[0])
    if opts.load_runs:
        row.load["fused"] = fresh_load("ours", ours, args, opts.load_runs)
        row.load["xnnpack"] = fresh_load("et", theirs, args, opts.load_runs)
    return row


# --------------------------------------------------------------------------------------------
# Report.


def _t(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} us"


def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]  # fmt: skip
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |",
             "| " + " | ".join("-" * w for w in widths) + " |"]  # fmt: skip
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(lines)


def report(rows: list[Row], opts: Options) -> None:
    ok = [r for r in rows if r.error is None]
    for threads in opts.threads:
        body, ratios = [], []
        for r in ok:
            f, x, e = (r.latency[s, threads] for s in ("fused", "xnnpack", "eager"))
            ratios.append(f / x)
            body.append([r.name, _t(e), _t(x), _t(f), _r(f / x), _r(f / e),
                         "ok" if f / x <= 1.0 else "MISS"])  # fmt: skip
        print(f"\nlatency, batch 1, {threads} thread(s), best of {opts.rounds} interleaved "
              f"rounds ({opts.clock} time)")  # fmt: skip
        print(_table(["model", "eager", "xnnpack", "fused", "fused/xnnpack", "fused/eager",
                      "<= 1.0"], body))  # fmt: skip
        if ratios:
            print(f"median fused/xnnpack: {statistics.median(ratios):.2f}")
    loaded = [r for r in ok if r.load]
    if loaded:
        body = []
        for r in loaded:
            f, x = r.load["fused"], r.load["xnnpack"]
            body.append([r.name, _t(x["load"]), _t(f["load"]), _r(f["load"] / x["load"]),
                         f"{x['mem'] / 2**20:.1f}", f"{f['mem'] / 2**20:.1f}",
                         _r(f["mem"] / max(x["mem"], 1)), str(int(f["heavy"]))])  # fmt: skip
        print(f"\nload (fresh process, bytes -> first result, wall) and peak RSS growth over the "
              f"runtime's import, best of {opts.load_runs}")  # fmt: skip
        print(_table(["model", "xnnpack load", "fused load", "ratio (<= 2)", "xnnpack MiB",
                      "fused MiB", "ratio (<= 1.2)", "dynamo/sympy modules"], body))  # fmt: skip
    for r in rows:
        if r.error is not None:
            print(f"ERROR {r.name}: {r.error}")


def parse_args(argv: list[str] | None) -> tuple[list[Model], Options]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 rounds of ~5 ms loops, 1 load run")
    p.add_argument("--only", action="append", default=[], metavar="NAME")
    p.add_argument("--rounds", type=int, help="latency rounds (default 7; quick 2)")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    p.add_argument("--load-runs", type=int, help="fresh processes per load (default 3; quick 1)")
    p.add_argument("--budget", type=float, default=30.0, help="seconds per side before it stops")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    a = p.parse_args(argv)
    models = select_only(p, a.only, MODELS, "model")
    opts = Options(
        rounds=a.rounds or (2 if a.quick else 7),
        call_seconds=0.005 if a.quick else 0.05,
        threads=tuple(int(t) for t in a.threads.split(",") if t),
        load_runs=a.load_runs if a.load_runs is not None else (1 if a.quick else 3),
        budget=a.budget,
        clock=a.clock,
    )
    return models, opts


def main(argv: list[str] | None = None) -> int:
    models, opts = parse_args(argv)
    torch.set_num_threads(opts.threads[0])
    rows = []
    for model in models:
        print(f"  {model.name} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            rows.append(measure(model, opts))
        except Exception as exc:  # noqa: BLE001 - one model never stops the others
            rows.append(Row(model.name, error=f"{type(exc).__name__}: {exc}"[:300]))
        print(f"    {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    print(f"exportir fused_cpu vs ExecuTorch XNNPACK; torch {torch.__version__}")
    report(rows, opts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
