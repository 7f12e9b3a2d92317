"""What profiling costs: a plain ``method(...)`` call vs the same call on an instrumented
execution state with profiling off, and with profiling on.

    PYTHONPATH=src .venv/bin/python benchmarks/profile_bench.py [--rounds 7] [--calls 200]

Three sides per model, one thread, interleaved round by round (the order rotating), each
timing ``--calls`` back-to-back calls in process CPU time and keeping its best round:

- ``plain``: ``method.execute(inputs)``, the runtime's normal run loop (what every user calls);
- ``off``: the same call on an instrumented state whose session observes nothing
  (``exportir.runtime.instrument``): the code path ``method.profile`` runs on, profiling off;
- ``on``: a profiling state (every instruction timed, every op inside fused_cpu delegates
  timed through the instrumented delegate function), as ``method.profile`` runs.

Printed: microseconds per call and the ratios off/plain and on/plain. ``off/plain`` is the
noise floor (the normal loop is not changed by profiling: there is no flag to test).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import exportir
from exportir.backends.fused_cpu import FusedCpuPartitioner
from exportir.runtime import Program
from exportir.runtime.instrument import Session, instrumented_state
from exportir.runtime.profile import _ProfileSession


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128),
            torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x).softmax(-1)


def _models() -> list[tuple[str, torch.nn.Module, tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    encoder = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).eval()
    conv = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10),
    ).eval()
    return [
        ("mlp", Mlp().eval(), (torch.randn(4, 64),)),
        ("encoder_layer", encoder, (torch.randn(1, 16, 64),)),
        ("conv_bn", conv, (torch.randn(1, 3, 32, 32),)),
    ]


def _programs(model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> dict[str, bytes]:
    ep = exportir.export(model, args)
    return {
        "portable": exportir.to_edge(ep).to_program().buffer,
        "fused_cpu": exportir.to_edge_transform_and_lower(
            ep, partitioner=[FusedCpuPartitioner()]).to_program().buffer,
    }


def _round(call, inputs, calls: int) -> float:
    start = time.process_time_ns()
    for _ in range(calls):
        call(inputs)
    return (time.process_time_ns() - start) / calls / 1000.0


def bench(data: bytes, inputs: tuple[torch.Tensor, ...], rounds: int, calls: int
          ) -> dict[str, float]:
    method = Program.load(data).method()
    off = instrumented_state(method, Session())
    session = _ProfileSession()
    on = instrumented_state(method, session)

    def profiled(x):
        on.execute(x)
        session.clear()  # what a profile keeps per call, dropped so memory stays flat

    sides = {"plain": method.execute, "off": off.execute, "on": profiled}
    expected = method.execute(inputs)
    for name, call in sides.items():  # warm up (checked run) and check the results
        call(inputs)
        got = off.execute(inputs) if name == "on" else call(inputs)
        torch.testing.assert_close(got, expected)
    best = dict.fromkeys(sides, float("inf"))
    order = list(sides)
    for r in range(rounds):
        for name in order[r % 3:] + order[:r % 3]:
            best[name] = min(best[name], _round(sides[name], inputs, calls))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    ns = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'model':<16} {'program':<10} {'plain us':>9} {'off us':>9} {'on us':>9} "
          f"{'off/plain':>9} {'on/plain':>9}")
    for name, model, args in _models():
        for kind, data in _programs(model, args).items():
            best = bench(data, args, ns.rounds, ns.calls)
            print(f"{name:<16} {kind:<10} {best['plain']:9.1f} {best['off']:9.1f} "
                  f"{best['on']:9.1f} {best['off'] / best['plain']:9.2f} "
                  f"{best['on'] / best['plain']:9.2f}", flush=True)


if __name__ == "__main__":
    main()
