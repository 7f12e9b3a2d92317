"""Load time and one-call latency of the runtime on the export corpus programs.

    PYTHONPATH=src .venv/bin/python benchmarks/load_bench.py [--programs DIR] [--save FILE]
        [--compare FILE] [--only NAME ...] [--rounds N]

Every model of ``tests/corpus/export_models.py`` is compiled on both roads (portable:
``to_edge``; fused: the fused CPU delegate) into ``DIR`` (reused when the files are there, so
two versions of the runtime can be timed on the same files). For each program:

- load: ``Program.load(bytes).method("forward")`` -- reading, validation, load-time typing,
  kernel binding, arenas (best of ``--rounds``);
- call: one trusted call (after two warm-up calls) of the method on the corpus inputs (best of
  ``5 * --rounds``).

``--save`` writes the numbers as JSON; ``--compare`` prints them next to a saved run with the
ratio (now / then) per program and the geometric mean per column. The load-time checks of the
runtime must not make either column slower by more than 10%.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
for _path in (_ROOT / "tests",):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import torch
from corpus import export_models as em

ROADS = ("portable", "fused")


def _compile(name: str, road: str) -> bytes:
    from exportir.export import export
    from exportir.program.manager import to_edge

    module, args, kwargs = em.build(em.BY_NAME[name])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        edge = to_edge(export(module, args, kwargs))
        if road == "fused":
            from exportir.backends.fused_cpu import FusedCpuPartitioner

            edge = edge.to_backend(FusedCpuPartitioner())
        return edge.to_program().buffer


def _program(directory: Path, name: str, road: str) -> bytes | None:
    path = directory / f"{name}.{road}.xpt"
    if not path.exists():
        try:
            path.write_bytes(_compile(name, road))
        except Exception as e:  # noqa: BLE001 - a model that does not compile is reported
            print(f"  {name} ({road}): does not compile: {type(e).__name__}: {e}"[:200])
            return None
    return path.read_bytes()


def _kernels(name: str) -> Any:
    """The kernel registry for ``name``: custom-op models register their ops on purpose."""
    from exportir.runtime import default_kernel_registry

    registry = default_kernel_registry()
    entry = em.BY_NAME[name]
    if "custom_op" in entry.tags and hasattr(registry, "register_op"):
        namespace = getattr(torch.ops, em.CUSTOM_NS)
        for op in ("scaled_tanh", "split_stats"):
            registry.register_op(getattr(namespace, op))
    return registry


def _best(fn: Any, rounds: int) -> float:
    best = math.inf
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(data: bytes, name: str, rounds: int) -> tuple[float, float]:
    """(load seconds, call seconds) of one program."""
    from exportir.runtime import Program

    kernels = _kernels(name)

    def load() -> Any:
        return Program.load(data, kernels=kernels).method("forward")

    method = load()
    _, args, kwargs = em.build(em.BY_NAME[name])
    for _ in range(2):
        method(*args, **kwargs)
    load_time = _best(load, rounds)
    call_time = _best(lambda: method(*args, **kwargs), 5 * rounds)
    return load_time, call_time


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=Path, default=None)
    parser.add_argument("--save", type=Path, default=None)
    parser.add_argument("--compare", type=Path, default=None)
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--rounds", type=int, default=7)
    ns = parser.parse_args()
    torch.set_num_threads(1)  # the machine is shared: intra-op threads only add noise
    directory = ns.programs or Path(tempfile.mkdtemp(prefix="exportir-load-bench-"))
    directory.mkdir(parents=True, exist_ok=True)
    names = ns.only or [e.name for e in em.ENTRIES]
    then = json.loads(ns.compare.read_text()) if ns.compare else {}
    results: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {"load": [], "call": []}
    print(f"{'program':44} {'load ms':>9} {'call us':>9}" + ("  load x   call x" if then else ""))
    for name in names:
        for road in ROADS:
            data = _program(directory, name, road)
            if data is None:
                continue
            key = f"{name}.{road}"
            try:
                load_time, call_time = measure(data, name, ns.rounds)
            except Exception as e:  # noqa: BLE001
                print(f"{key:44} ERROR {type(e).__name__}: {e}"[:160])
                continue
            results[key] = [load_time, call_time]
            line = f"{key:44} {load_time * 1e3:9.2f} {call_time * 1e6:9.1f}"
            if key in then:
                r_load, r_call = load_time / then[key][0], call_time / then[key][1]
                ratios["load"].append(r_load)
                ratios["call"].append(r_call)
                line += f"  {r_load:6.3f}  {r_call:6.3f}"
            print(line, flush=True)
    total_load = sum(v[0] for v in results.values())
    total_call = sum(v[1] for v in results.values())
    print(f"{'total':44} {total_load * 1e3:9.2f} {total_call * 1e6:9.1f}")
    if ratios["load"]:
        print(f"geometric mean now/then: load {_geomean(ratios['load']):.3f}, "
              f"call {_geomean(ratios['call']):.3f} over {len(ratios['load'])} programs")
    if ns.save:
        ns.save.write_text(json.dumps(results, indent=1))
    print(f"programs in {directory}")


if __name__ == "__main__":
    main()
