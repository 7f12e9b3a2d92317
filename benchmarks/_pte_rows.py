"""ExecuTorch .pte rows: exportir writing ExecuTorch's format vs ExecuTorch's own compiler.

    .venv-bench/bin/python benchmarks/_pte_rows.py [--quick] [--only NAME ...] [--self-check]

(also printed at the end of ``benchmarks/program_bench.py``). Per model:

- compile to .pte: ``export -> to_edge -> to_program().pte_buffer()`` vs ExecuTorch's
  ``torch.export.export -> exir.to_edge -> to_executorch().buffer`` (target <= 0.1x, median;
  CPU time, interleaved rounds, best of each side);
- size: .pte bytes / weight bytes, ours vs ExecuTorch's file (target: ours <= theirs);
- latency in ExecuTorch's runtime (portable kernels, 1 thread): our .pte vs ExecuTorch's .pte of
  the same model (target <= 1.0 per model), both checked against eager first. Both files run in
  this one process, each loaded twice; the four methods take turns in blocks of ~0.2 ms of calls
  (see :func:`latency`). The two loads of one file differ only by where the runtime put them and
  by noise: their ratio (``A/A``) is printed per model, and the largest in the run is the floor
  a ratio must pass to count as slower. ``--self-check`` puts ExecuTorch's file on both sides.

Ratios < 1.0 mean exportir's side is faster or smaller. A model exportir refuses to write as
.pte (kernels ExecuTorch lacks) shows the refusal.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
for _path in (_ROOT / "src", _ROOT / "tests", Path(__file__).resolve().parent):
    if _path.is_dir() and str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import torch
import torch.utils._pytree as torch_pytree
from _timing import CLOCKS, Workload, WrongResult, compare

OURS, ET = "exportir", "executorch"


def ours_pte(case: Any) -> bytes:
    from exportir.export import export
    from exportir.program.manager import to_edge

    module, args, kwargs = case
    return to_edge(export(module, args, kwargs)).to_program().pte_buffer()


def et_pte(case: Any) -> bytes:
    import warnings

    from executorch.exir import to_edge

    module, args, kwargs = case
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        return to_edge(torch.export.export(module, args, kwargs, strict=False)).to_executorch(
        ).buffer


def _et_program(data: bytes) -> Any:
    from executorch.runtime import Runtime

    return Runtime.get().load_program(data)


def _flat(args: tuple, kwargs: dict, keep_str: bool) -> list[Any]:
    leaves = torch_pytree.tree_leaves((args, kwargs))
    if keep_str:  # ExecuTorch's own file keeps a str input as a None input
        return [None if isinstance(x, str) else x for x in leaves]
    return [x for x in leaves if not isinstance(x, str)]


def _check(got: Any, want: Any, what: str) -> None:
    got_t = [t for t in got if isinstance(t, torch.Tensor)]
    want_t = [t for t in torch_pytree.tree_leaves(want) if isinstance(t, torch.Tensor)]
    if len(got_t) < len(want_t):
        raise WrongResult(f"{what}: {len(got_t)} outputs, eager has {len(want_t)}")
    for g, w in zip(got_t[-len(want_t):], want_t):  # mutated inputs come first in ET's outputs
        if not torch.allclose(g, w, atol=1e-4, rtol=1e-4):
            raise WrongResult(f"{what} differs from eager")


def _weights(case: Any) -> int:
    module = case[0]
    seen, total = set(), 0
    for t in [*module.state_dict(keep_vars=False).values()]:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.nbytes)
        if key not in seen:
            seen.add(key)
            total += t.nbytes
    return total


def measure(build: Any, opts: Any) -> dict[str, Any]:
    """One model's numbers: compile seconds, file bytes, latency in ExecuTorch's runtime."""
    row: dict[str, Any] = {"weights": _weights(build())}
    files: dict[str, bytes] = {}

    def keep(side: str) -> Any:
        def check(_: object, data: object) -> None:
            files[side] = data

        return check

    clock = CLOCKS[opts.clock]
    compiled = compare({
        OURS: lambda: Workload(run=ours_pte, setup=build, check=keep(OURS)),
        ET: lambda: Workload(run=et_pte, setup=build, check=keep(ET)),
    }, rounds=opts.rounds, budget=opts.budget, timeout=opts.timeout, clock=clock)
    for side, m in compiled.items():
        row[f"compile_{side}"] = m.best if m.error is None else m.error
        if side in files:
            row[f"size_{side}"] = len(files[side])
    if len(files) < 2:
        return row

    with torch.no_grad():
        fresh, fresh_args, fresh_kwargs = build()  # one call, as each load's first call
        want = fresh(*fresh_args, **fresh_kwargs)
    if not stateless(build):
        row["note"] = "stateful"  # each call sees other state, the same on both sides
    aa = getattr(opts, "self_check", False)  # A/A: ExecuTorch's file on both sides
    try:
        row.update(latency(files[ET] if aa else files[OURS], files[ET], build, want, opts,
                           ours_is_et=aa))
    except Exception as exc:  # noqa: BLE001 - reported in the row, the compile numbers stay
        row["lat_error"] = f"{type(exc).__name__}: {exc}"
    return row


def stateless(build: Any) -> bool:
    return not any(t in build.tags for t in ("mutation", "input_mutation"))


def _block_times(methods: list[Any], n: int, blocks: int) -> list[list[float]]:
    """Per-call CPU seconds of ``blocks`` blocks of ``n`` calls for each method, the methods
    taking turns block by block, GC off. Turn ``t`` starts at method ``t mod k`` of ``k`` and
    every other cycle of ``k`` turns runs backwards, so each method is in each place of a turn
    (first, after a given other method, ...) equally often."""
    clock = time.process_time
    times: list[list[float]] = [[] for _ in methods]
    k = len(methods)
    forward = list(enumerate(methods))
    gc.collect()
    gc.disable()
    try:
        for turn in range(blocks):
            order = forward[turn % k:] + forward[:turn % k]
            for i, (call, flat) in order if turn // k % 2 == 0 else order[::-1]:
                start = clock()
                for _ in range(n):
                    call(flat)
                times[i].append((clock() - start) / n)
    finally:
        gc.enable()
    return times


def _low(values: list[float]) -> float:
    """The block time at the ``LOW_QUANTILE``: blocks slowed by other jobs (cache, frequency,
    preemption inside a block) are above it, on both sides alike."""
    ordered = sorted(values)
    return ordered[int(LOW_QUANTILE * (len(ordered) - 1))]


def _gm(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


LOW_QUANTILE = 0.1
# Load order (ABBA BAAB): each side's loads sit as early and as late as the other's on average.
# A/A halves: the two loads of a side at the ends of its run of loads against the two between.
LOADS = ("ours", "et", "et", "ours", "et", "ours", "ours", "et")
_HALVES = ((0, 3), (1, 2))


def latency(ours: bytes, et: bytes, build: Any, want: Any, opts: Any,
            ours_is_et: bool = False) -> dict[str, Any]:
    """Per-call CPU time of each file in ExecuTorch's runtime, in this one process.

    Each file is loaded four times (its own program, arenas and input tensors each time, in the
    order ``LOADS``): where the runtime puts a load changes its time by up to a few percent on
    some models, and that counts on both sides alike. After a warm-up, the eight methods take
    turns in blocks of about ``BLOCK_SECONDS`` of calls; a load's time is the low decile of its
    blocks, a side's the geometric mean of its four loads. ``aa_et`` / ``aa_ours``: the same
    comparison within one file, two of its loads against the other two (the A/A ratios).
    """
    methods = []
    keep = []  # each method's program and bytes stay alive while it runs
    for k, side in enumerate(LOADS):
        data = bytes(ours if side == "ours" else et)
        program = _et_program(data)
        method = program.load_method("forward")
        _, a, kw = build()
        flat = _flat(a, kw, keep_str=side == "et" or ours_is_et)
        _check(method.execute(flat), want, f"{side}'s .pte (load {k}) in ExecuTorch")
        keep.append((data, program))
        methods.append((method._method, flat))  # the binding's call: no Python wrapper frame
    call, flat = methods[1]
    start = time.process_time()
    calls = 0
    while time.process_time() - start < 0.02:  # warm-up, and the length of one call
        call(flat)
        calls += 1
    one = (time.process_time() - start) / calls
    n = max(1, round(BLOCK_SECONDS / one))
    seconds = getattr(opts, "latency_seconds", None) or 24 * opts.call_seconds
    blocks = max(20, int(seconds / (len(methods) * n * one)))
    _block_times(methods, n, len(methods))  # warm-up of every method, untimed
    lows = list(map(_low, _block_times(methods, n, blocks)))
    del keep
    row: dict[str, Any] = {"blocks": f"{blocks}x{n}"}
    for side in ("ours", "et"):
        mine = [t for s, t in zip(LOADS, lows) if s == side]
        name = OURS if side == "ours" else ET
        row[f"lat_{name}"] = _gm(mine)
        outer, inner = ([mine[i] for i in half] for half in _HALVES)
        row[f"aa_{side}"] = _gm(outer) / _gm(inner)
    return row


BLOCK_SECONDS = 0.0002


class _Builder:
    def __init__(self, entry: Any, em: Any) -> None:
        self.entry, self.em, self.tags = entry, em, entry.tags

    def __call__(self) -> Any:
        return self.em.build(self.entry)


def _num(x: Any) -> float | None:
    return x if isinstance(x, (int, float)) else None


def _ratio(a: Any, b: Any) -> float | None:
    a, b = _num(a), _num(b)
    return None if a is None or not b else a / b


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _floor(rows: dict[str, dict[str, Any]]) -> float | None:
    """The run's A/A noise floor: the largest ratio of one file's loads, two against two."""
    aa = [abs(v - 1.0) for r in rows.values() for k in ("aa_et", "aa_ours")
          if (v := _num(r.get(k))) is not None]
    return max(aa) if aa else None


def report(rows: dict[str, dict[str, Any]], self_check: bool = False) -> str:
    lat_head = "lat ET/ET (A/A)" if self_check else "ET-runtime lat ours/ET"
    lines = [(f"{'model':<28} {'compile ours/ET':>15} {'pte/weights ours':>16} "
              f"{'pte/weights ET':>14} {'size ours/ET':>12} {lat_head:>22} {'A/A ET':>7} "
              f"{'A/A ours':>8} {'us/call':>7}")]
    for name, r in rows.items():
        w = r.get("weights") or None
        err = next((v for k, v in r.items() if isinstance(v, str) and k not in _TEXT), "")
        et_us = _num(r.get(f"lat_{ET}"))
        lines.append(
            f"{name:<28} {_fmt(_ratio(r.get('compile_exportir'), r.get('compile_executorch')), 3):>15}"
            f" {_fmt(_ratio(r.get('size_exportir'), w), 3):>16}"
            f" {_fmt(_ratio(r.get('size_executorch'), w), 3):>14}"
            f" {_fmt(_ratio(r.get('size_exportir'), r.get('size_executorch')), 3):>12}"
            f" {_fmt(_ratio(r.get('lat_exportir'), r.get('lat_executorch')), 3):>22}"
            f" {_fmt(_num(r.get('aa_et')), 3):>7} {_fmt(_num(r.get('aa_ours')), 3):>8}"
            f" {_fmt(et_us * 1e6 if et_us else None, 1):>7}"
            + (f"  {err.splitlines()[0][:90]}" if err else ""))

    def med(a: str, b: str) -> float | None:
        vals = [v for r in rows.values() if (v := _ratio(r.get(a), r.get(b))) is not None]
        return statistics.median(vals) if vals else None

    compile_med = med("compile_exportir", "compile_executorch")
    size_med = med("size_exportir", "size_executorch")
    lat = {n: v for n, r in rows.items()
           if (v := _ratio(r.get("lat_exportir"), r.get("lat_executorch"))) is not None}
    lines.append("")
    lines.append(f"compile to .pte, median ours/ET: {_fmt(compile_med, 3)} (target <= 0.1): "
                 f"{'OK' if compile_med is not None and compile_med <= 0.1 else 'MISS'}")
    bigger = [n for n, r in rows.items()
              if (v := _ratio(r.get("size_exportir"), r.get("size_executorch"))) and v > 1.0]
    lines.append(f".pte size ours/ET, median {_fmt(size_med, 3)}; larger than ExecuTorch's on "
                 f"{len(bigger)} model(s){': ' + ', '.join(bigger) if bigger else ''}")
    floor = _floor(rows)
    vals = list(lat.values())
    lines.append(f"ExecuTorch runtime latency {'ET/ET' if self_check else 'ours/ET'}: median "
                 f"{_fmt(statistics.median(vals) if vals else None, 3)}, min "
                 f"{_fmt(min(vals) if vals else None, 3)}, max "
                 f"{_fmt(max(vals) if vals else None, 3)} ({len(vals)} models)")
    if floor is None:
        return "\n".join(lines)
    slow = [f"{n} {v:.3f}" for n, v in lat.items() if v > 1.0 + floor]
    near = [f"{n} {v:.3f}" for n, v in lat.items() if 1.0 < v <= 1.0 + floor]
    lines.append(f"A/A floor (two loads of one file against its other two, this run): "
                 f"+-{floor:.3f}; above 1.0 by more than the floor on {len(slow)}"
                 f"{': ' + ', '.join(slow) if slow else ''}; above 1.0 within it on "
                 f"{len(near)}{': ' + ', '.join(near) if near else ''}")
    return "\n".join(lines)


_TEXT = ("note", "blocks")  # string fields of a row that are not errors


def pte_report(entries: list[Any], em: Any, opts: Any) -> None:
    """Measure ``entries`` and print the .pte section (the hook program_bench.py calls)."""
    warm = _Builder(em.BY_NAME["mlp"], em)  # imports and first-call caches, untimed
    for step in (lambda: _et_program(ours_pte(warm())).load_method("forward"),
                 lambda: _et_program(et_pte(warm())).load_method("forward")):
        with contextlib.suppress(Exception):  # the measured run reports any error
            step()
    rows = {}
    for entry in entries:
        print(f"  .pte {entry.name} ...", file=sys.stderr, flush=True)
        try:
            rows[entry.name] = measure(_Builder(entry, em), opts)
        except Exception as exc:  # noqa: BLE001 - one model never stops the others
            rows[entry.name] = {"error": f"{type(exc).__name__}: {exc}"}
    print("\nExecuTorch .pte: exportir's writer vs ExecuTorch's compiler, both run by "
          "ExecuTorch's runtime")
    print(report(rows, getattr(opts, "self_check", False)))


def main(argv: list[str] | None = None) -> int:
    from corpus import export_models as em

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", action="append", default=[])
    p.add_argument("--self-check", action="store_true",
                   help="A/A: time ExecuTorch's file on both sides (the harness's noise floor)")
    p.add_argument("--latency-seconds", type=float,
                   help="CPU seconds of timed calls per model (default 1.2; quick 0.3)")
    a = p.parse_args(argv)
    names = {n for item in a.only for n in item.split(",")}
    entries = [e for e in em.ENTRIES if not names or e.name in names]
    opts = argparse.Namespace(rounds=1 if a.quick or a.self_check else 3,
                              latency_rounds=2 if a.quick else 5,
                              budget=30.0, timeout=600.0, clock="cpu",
                              call_seconds=0.005 if a.quick else 0.05,
                              latency_seconds=a.latency_seconds or (0.3 if a.quick else 1.2),
                              self_check=a.self_check)
    torch.set_num_threads(1)
    em.register_dataclasses()
    pte_report(entries, em, opts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
