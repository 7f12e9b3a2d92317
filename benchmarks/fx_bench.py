"""exportir.fx vs torch.fx: the same workloads, the same machine, the same run.

    PYTHONPATH=src .venv/bin/python benchmarks/fx_bench.py [--quick] [--only NAME ...]

Prints, per benchmark, both sides' best time at the main size (default 10k nodes) and the
ratio ours/theirs (< 1.0: exportir is faster), checked against its target; then each side's
time at 4x the size with the ratio large/main (about 4.0 when the operation is linear).
See benchmarks/README.md for what each row measures.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import operator
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType

_SRC = Path(__file__).resolve().parent.parent / "src"
if _SRC.is_dir():
    sys.path.insert(0, str(_SRC))

import torch
import torch.fx
from _timing import CLOCKS, Measurement, Workload, WrongResult, compare, select_only
from torch import nn

OURS, THEIRS = "exportir", "torch.fx"
SCALE = 4  # the large size is SCALE x the main size


# ---------------------------------------------------------------------------------------------
# Workload inputs (framework-independent, built once and shared by both sides)


class Block(nn.Module):
    """Five graph nodes: add, relu, call_module(tanh), mul, add. No tensor attributes: torch.fx
    resolves each tensor attribute with a linear scan of ``named_buffers()``/``named_parameters()``
    (quadratic overall), which would swamp the tracing overhead this benchmark is about."""

    def __init__(self) -> None:
        super().__init__()
        self.act = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x + 1.0)
        return self.act(y) * 0.5 + x


NODES_PER_BLOCK = 5


@lru_cache(maxsize=2)
def block_model(nodes: int) -> nn.Module:
    """A Sequential of ``nodes // 5`` blocks: ~``nodes`` graph nodes when traced."""
    return nn.Sequential(*[Block() for _ in range(nodes // NODES_PER_BLOCK)]).eval()


def model_input() -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, 4)


def rewrite_pattern(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.add(x, y).relu()


def rewrite_replacement(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.sub(x, y).sigmoid()


NODES_PER_GROUP = 10  # one pattern match (add, relu) plus eight unrelated ops


def rewrite_function(groups: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A function whose trace has ``groups`` matches of ``rewrite_pattern``, 10 nodes each."""

    def chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for _ in range(groups):
            x = torch.add(x, y).relu()
            x = x * 0.5 + 1.0
            x = torch.neg(x) - y
            x = torch.sin(x) / 2.0
            x = torch.tanh(torch.cos(x))
        return x

    return chain


CHAIN_TARGETS = (operator.add, torch.relu, operator.mul)


def chain_args(target: object, prev: object) -> tuple[object, ...]:
    return (prev,) if target is torch.relu else (prev, 1.5)


# ---------------------------------------------------------------------------------------------
# Benchmarks: make(fx, nodes) prepares one side (untimed) and returns its Workload.


def _expect(what: str, got: object, want: object) -> None:
    if got != want:
        raise WrongResult(f"{what}: got {got}, want {want}")


def make_trace(fx: ModuleType, nodes: int) -> Workload:
    model = block_model(nodes)
    want = len(model) * NODES_PER_BLOCK + 2

    def check(_: object, gm: object) -> None:
        _expect("node count", len(gm.graph.nodes), want)

    return Workload(run=lambda _: fx.symbolic_trace(model), check=check)


def make_recompile(fx: ModuleType, nodes: int) -> Workload:
    """recompile() plus the first lookup of ``forward``.

    exportir generates the source in recompile() and compiles it on first use, caching compiled
    code by source text; torch.fx compiles inside recompile(). To time the same work on both
    sides, every round renames one node (untimed), so the source is new and nothing is cached,
    and the timed part ends with ``gm.forward`` so the compile is included.
    """
    gm = fx.symbolic_trace(block_model(nodes))
    victim = next(n for n in gm.graph.nodes if n.op == "call_function")
    rounds = iter(range(10**9))

    def setup() -> object:
        victim.name = f"renamed_{next(rounds)}"
        return gm

    def run(module: object) -> object:
        module.recompile()
        return module.forward

    def check(_: object, __: object) -> None:
        if "def forward" not in gm.code or victim.name not in gm.code:
            raise WrongResult("recompiled code has no forward or misses the renamed node")

    return Workload(setup=setup, run=run, check=check)


def make_interpreter(fx: ModuleType, nodes: int) -> Workload:
    model = block_model(nodes)
    gm = fx.symbolic_trace(model)
    x = model_input()

    def check(_: object, out: object) -> None:
        if not torch.allclose(out, model(x)):
            raise WrongResult("Interpreter.run result differs from eager")

    return Workload(run=lambda _: fx.Interpreter(gm).run(x), check=check)


def dead_graph(fx: ModuleType, nodes: int) -> object:
    """Groups of four: live add, dead neg -> dead mul chain, live relu. Half the nodes are dead,
    and the dead chains only die in reverse order."""
    graph = fx.Graph()
    live = graph.placeholder("x")
    for _ in range(nodes // 4):
        live = graph.call_function(operator.add, (live, 1.0))
        dead = graph.call_function(torch.neg, (live,))
        graph.call_function(operator.mul, (dead, 2.0))
        live = graph.call_function(torch.relu, (live,))
    graph.output(live)
    return graph


def make_dce(fx: ModuleType, nodes: int) -> Workload:
    want = (nodes // 4) * 2 + 2

    def check(graph: object, changed: object) -> None:
        _expect("eliminate_dead_code() return", changed, True)
        _expect("nodes left", len(graph.nodes), want)

    return Workload(
        setup=lambda: dead_graph(fx, nodes),
        run=lambda graph: graph.eliminate_dead_code(),
        check=check,
    )


def make_replace(fx: ModuleType, nodes: int) -> Workload:
    groups = nodes // NODES_PER_GROUP
    chain = rewrite_function(groups)

    def check(gm: object, matches: object) -> None:
        _expect("matches", len(matches), groups)
        subs = sum(1 for n in gm.graph.nodes if n.target is torch.sub)
        _expect("torch.sub nodes after rewrite", subs, groups)

    return Workload(
        setup=lambda: fx.symbolic_trace(chain),
        run=lambda gm: fx.replace_pattern(gm, rewrite_pattern, rewrite_replacement),
        check=check,
    )


def build_graph(fx: ModuleType, nodes: int) -> object:
    graph = fx.Graph()
    prev = graph.placeholder("x")
    for i in range(nodes - 2):
        target = CHAIN_TARGETS[i % len(CHAIN_TARGETS)]
        prev = graph.call_function(target, chain_args(target, prev))
    graph.output(prev)
    return graph


def make_build(fx: ModuleType, nodes: int) -> Workload:
    def check(_: object, graph: object) -> None:
        _expect("node count", len(graph.nodes), nodes)

    return Workload(run=lambda _: build_graph(fx, nodes), check=check)


@dataclass(frozen=True, slots=True)
class Benchmark:
    name: str
    target: float  # ours/theirs must be <= target at the main size
    what: str
    make: Callable[[ModuleType, int], Workload]


BENCHMARKS = (
    Benchmark("symbolic_trace", 0.5, "symbolic_trace(Sequential of n/5 blocks)", make_trace),
    Benchmark("recompile", 0.5, "GraphModule.recompile() of that trace", make_recompile),
    Benchmark("interpreter", 1.0, "Interpreter(gm).run(x), 4-element tensor", make_interpreter),
    Benchmark("dce", 1.0, "Graph.eliminate_dead_code(), half the nodes dead", make_dce),
    Benchmark("replace_pattern", 1.0, "replace_pattern, n/10 matches of add.relu", make_replace),
    Benchmark("graph_build", 1.0, "Graph API: placeholder, n-2 call_function, output", make_build),
)


# ---------------------------------------------------------------------------------------------
# Driver


_ours: ModuleType | Exception | None = None


def import_ours() -> ModuleType:
    """Import exportir.fx once; a failure is re-raised for every exportir measurement."""
    global _ours
    if _ours is None:
        try:
            _ours = importlib.import_module("exportir.fx")
        except Exception as exc:  # noqa: BLE001 - reported per row, other rows still run
            _ours = exc
    if isinstance(_ours, Exception):
        raise _ours
    return _ours


@dataclass(frozen=True, slots=True)
class Options:
    nodes: int
    rounds: int
    large_rounds: int
    budget: float
    timeout: float
    clock: str = "cpu"
    self_check: bool = False  # time torch.fx against itself: the noise floor


def measure(bench: Benchmark, nodes: int, rounds: int, opts: Options) -> dict[str, Measurement]:
    makers = {
        OURS: lambda: bench.make(torch.fx if opts.self_check else import_ours(), nodes),
        THEIRS: lambda: bench.make(torch.fx, nodes),
    }
    return compare(
        makers, rounds=rounds, budget=opts.budget, timeout=opts.timeout, clock=CLOCKS[opts.clock]
    )


@dataclass(frozen=True, slots=True)
class Row:
    bench: Benchmark
    main: dict[str, Measurement]
    large: dict[str, Measurement]


def ratio(a: Measurement, b: Measurement) -> float | None:
    if a.best is None or b.best is None or b.best == 0:
        return None
    return a.best / b.best


def fmt_time(m: Measurement) -> str:
    if m.best is None:
        return "ERROR" if m.error else "-"
    if m.best >= 1.0:
        return f"{m.best:.3f} s"
    return f"{m.best * 1e3:.1f} ms"


def fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}"


def status(row: Row) -> str:
    r = ratio(row.main[OURS], row.main[THEIRS])
    if r is None:
        return "ERROR"
    return "PASS" if r <= row.bench.target else "MISS"


def size_label(nodes: int) -> str:
    return f"{nodes / 1000:g}k" if nodes >= 1000 else str(nodes)


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def comparison_table(rows: list[Row], nodes: int) -> str:
    headers = ["benchmark", "size", OURS, THEIRS, "ours/theirs", "target", "status"]
    body = [
        [
            r.bench.name,
            size_label(nodes),
            fmt_time(r.main[OURS]),
            fmt_time(r.main[THEIRS]),
            fmt_ratio(ratio(r.main[OURS], r.main[THEIRS])),
            f"<={r.bench.target:.2f}",
            status(r),
        ]
        for r in rows
    ]
    return table(headers, body)


def scaling_cells(main: Measurement, large: Measurement) -> list[str]:
    growth = ratio(large, main)
    note = "" if growth is None or growth <= SCALE * 1.4 else " superlinear?"
    return [fmt_time(main), fmt_time(large), fmt_ratio(growth) + note]


def scaling_table(rows: list[Row], nodes: int) -> str:
    small, big = size_label(nodes), size_label(nodes * SCALE)
    headers = ["benchmark"]
    for side in (OURS, THEIRS):
        headers += [f"{side} {small}", f"{side} {big}", f"{big}/{small}"]
    headers.append(f"ours/theirs@{big}")
    body = []
    for r in rows:
        cells = [r.bench.name]
        for side in (OURS, THEIRS):
            cells += scaling_cells(r.main[side], r.large[side])
        cells.append(fmt_ratio(ratio(r.large[OURS], r.large[THEIRS])))
        body.append(cells)
    return table(headers, body)


def error_lines(rows: list[Row]) -> list[str]:
    lines = []
    for r in rows:
        for size, results in (("main", r.main), ("large", r.large)):
            for side, m in results.items():
                if m.error:
                    where = f"  [{m.where}]" if m.where else ""
                    lines.append(f"  {r.bench.name} ({side}, {size}): {m.error}{where}")
    return lines


def summary_line(row: Row) -> str:
    r = ratio(row.main[OURS], row.main[THEIRS])
    verdict = status(row)
    if r is None:
        failed = [f"{s}: {m.error}" for s, m in row.main.items() if m.error]
        return f"{verdict:5}  {row.bench.name}: " + "; ".join(failed or ["no measurement"])
    cmp = "<=" if r <= row.bench.target else ">"
    return f"{verdict:5}  {row.bench.name}: ours/theirs {r:.3f} {cmp} {row.bench.target:.2f}"


def header(opts: Options) -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    aa = "SELF-CHECK: the exportir column is torch.fx too\n" if opts.self_check else ""
    return aa + (
        f"exportir.fx vs torch.fx | torch {torch.__version__}, python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load {load}\n"
        f"{opts.clock} time, best of {opts.rounds} interleaved rounds at "
        f"{size_label(opts.nodes)} nodes, "
        f"{opts.large_rounds} at {size_label(opts.nodes * SCALE)}; "
        f"ratio ours/theirs < 1.0 means exportir is faster"
    )


def run(selected: list[Benchmark], opts: Options) -> list[Row]:
    # Import up front, outside any per-call timeout; import_ours() keeps a failure and
    # re-raises it in every exportir cell.
    with contextlib.suppress(Exception):
        import_ours()
    rows = []
    large_nodes = opts.nodes * SCALE
    for bench in selected:
        print(f"  running {bench.name} ...", file=sys.stderr, flush=True)
        main = measure(bench, opts.nodes, opts.rounds, opts)
        large = measure(bench, large_nodes, opts.large_rounds, opts)
        rows.append(Row(bench, main, large))
    return rows


def report(rows: list[Row], opts: Options) -> None:
    print(header(opts))
    print()
    print(comparison_table(rows, opts.nodes))
    print()
    print(f"scaling ({SCALE}x nodes; {SCALE:.1f} = linear)")
    print(scaling_table(rows, opts.nodes))
    errors = error_lines(rows)
    if errors:
        print()
        print("errors")
        print("\n".join(errors))
    print()
    for row in rows:
        print(summary_line(row))


def parse_args(argv: list[str] | None) -> tuple[list[Benchmark], Options, bool]:
    names = [b.name for b in BENCHMARKS]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 1k/4k nodes, 2 rounds")
    p.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        default=[],
        help=f"run only these (repeatable or comma-separated): {', '.join(names)}",
    )
    p.add_argument("--nodes", type=int, help="main size in nodes (default 10000; quick 1000)")
    p.add_argument("--rounds", type=int, help="rounds at the main size (default 5; quick 2)")
    p.add_argument("--large-rounds", type=int, help="rounds at 4x size (default 3; quick 1)")
    p.add_argument(
        "--budget",
        type=float,
        default=30.0,
        help="stop repeating a side after this many seconds (default 30)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="per-call timeout in seconds, reported as an error (default 300)",
    )
    p.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="cpu",
        help="cpu: process CPU time (default, robust to a busy machine); wall: perf_counter",
    )
    p.add_argument(
        "--self-check",
        action="store_true",
        help="run torch.fx in the exportir column too (A/A run; ratios show noise)",
    )
    p.add_argument("--strict", action="store_true", help="exit 1 on any MISS or ERROR")
    a = p.parse_args(argv)
    selected = select_only(p, a.only, BENCHMARKS, "benchmark")
    opts = Options(
        nodes=a.nodes or (1000 if a.quick else 10_000),
        rounds=a.rounds or (2 if a.quick else 5),
        large_rounds=a.large_rounds or (1 if a.quick else 3),
        budget=a.budget,
        timeout=a.timeout,
        clock=a.clock,
        self_check=a.self_check,
    )
    return selected, opts, a.strict


def main(argv: list[str] | None = None) -> int:
    selected, opts, strict = parse_args(argv)
    rows = run(selected, opts)
    report(rows, opts)
    failed = any(status(r) != "PASS" for r in rows)
    return 1 if strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
