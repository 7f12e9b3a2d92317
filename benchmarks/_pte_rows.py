"""ExecuTorch .pte rows: exportir writing ExecuTorch's format vs ExecuTorch's own compiler.

    .venv-bench/bin/python benchmarks/_pte_rows.py [--quick] [--only NAME ...]

(also printed at the end of ``benchmarks/program_bench.py``). Per model:

- compile to .pte: ``export -> to_edge -> to_program().pte_buffer()`` vs ExecuTorch's
  ``torch.export.export -> exir.to_edge -> to_executorch().buffer`` (target <= 0.1x, median);
- size: .pte bytes / weight bytes, ours vs ExecuTorch's file (target: ours <= theirs);
- latency in ExecuTorch's runtime (portable kernels, 1 thread): our .pte vs ExecuTorch's .pte of
  the same model (target <= 1.0 per model), both checked against eager first.

CPU time, interleaved rounds, best of each side; ratios < 1.0 mean exportir's side is faster or
smaller. A model exportir refuses to write as .pte (kernels ExecuTorch lacks) shows the refusal.
"""

from __future__ import annotations

import argparse
import contextlib
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


def _et_method(data: bytes) -> Any:
    from executorch.runtime import Runtime

    return Runtime.get().load_program(data).load_method("forward")


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

    eager, args, kwargs = build()
    with torch.no_grad():
        eager(*args, **kwargs)
        start = time.process_time()
        eager(*args, **kwargs)
        one = max(time.process_time() - start, 1e-6)
        fresh, fresh_args, fresh_kwargs = build()  # one call, as each side's first call
        want = fresh(*fresh_args, **fresh_kwargs)
    n = max(1, min(2000, int(opts.call_seconds / one)))

    def make(side: str) -> Any:
        def workload() -> Workload:
            method = _et_method(files[side])
            _, a, k = build()
            flat = _flat(a, k, keep_str=side == ET)
            _check(method.execute(flat), want, f"{side}'s .pte in ExecuTorch")

            def run(_: object) -> Any:
                for _ in range(n):
                    out = method.execute(flat)
                return out

            return Workload(run=run)

        return workload

    stateless = not any(t in build.tags for t in ("mutation", "input_mutation"))
    if not stateless:  # a second call sees other state: checked once above is enough
        row["note"] = "stateful"
    timed = compare({OURS: make(OURS), ET: make(ET)}, rounds=opts.latency_rounds,
                    budget=opts.budget, timeout=opts.timeout, clock=clock)
    for side, m in timed.items():
        row[f"lat_{side}"] = m.best / n if m.error is None and m.best else m.error
    return row


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


def report(rows: dict[str, dict[str, Any]]) -> str:
    lines = [(f"{'model':<28} {'compile ours/ET':>15} {'pte/weights ours':>16} "
             f"{'pte/weights ET':>14} {'size ours/ET':>12} {'ET-runtime lat ours/ET':>22}")]
    for name, r in rows.items():
        w = r.get("weights") or None
        err = next((v for k, v in r.items() if isinstance(v, str) and k != "note"), "")
        lines.append(
            f"{name:<28} {_fmt(_ratio(r.get('compile_exportir'), r.get('compile_executorch')), 3):>15}"
            f" {_fmt(_ratio(r.get('size_exportir'), w), 3):>16}"
            f" {_fmt(_ratio(r.get('size_executorch'), w), 3):>14}"
            f" {_fmt(_ratio(r.get('size_exportir'), r.get('size_executorch')), 3):>12}"
            f" {_fmt(_ratio(r.get('lat_exportir'), r.get('lat_executorch'))):>22}"
            + (f"  {err.splitlines()[0][:90]}" if err else ""))

    def med(a: str, b: str) -> float | None:
        vals = [v for r in rows.values() if (v := _ratio(r.get(a), r.get(b))) is not None]
        return statistics.median(vals) if vals else None

    compile_med = med("compile_exportir", "compile_executorch")
    size_med = med("size_exportir", "size_executorch")
    lat = [v for r in rows.values()
           if (v := _ratio(r.get("lat_exportir"), r.get("lat_executorch"))) is not None]
    lines.append("")
    lines.append(f"compile to .pte, median ours/ET: {_fmt(compile_med, 3)} (target <= 0.1): "
                 f"{'OK' if compile_med is not None and compile_med <= 0.1 else 'MISS'}")
    bigger = [n for n, r in rows.items()
              if (v := _ratio(r.get("size_exportir"), r.get("size_executorch"))) and v > 1.0]
    lines.append(f".pte size ours/ET, median {_fmt(size_med, 3)}; larger than ExecuTorch's on "
                 f"{len(bigger)} model(s){': ' + ', '.join(bigger) if bigger else ''}")
    slow = [n for n, r in rows.items()
            if (v := _ratio(r.get("lat_exportir"), r.get("lat_executorch"))) and v > 1.0]
    lines.append(f"ExecuTorch runtime latency ours/ET: median {_fmt(statistics.median(lat) if lat else None)}, "
                 f"max {_fmt(max(lat) if lat else None)}; > 1.0 on {len(slow)} of {len(lat)}"
                 f"{': ' + ', '.join(slow) if slow else ''}")
    return "\n".join(lines)


def pte_report(entries: list[Any], em: Any, opts: Any) -> None:
    """Measure ``entries`` and print the .pte section (the hook program_bench.py calls)."""
    warm = _Builder(em.BY_NAME["mlp"], em)  # imports and first-call caches, untimed
    for step in (lambda: _et_method(ours_pte(warm())), lambda: _et_method(et_pte(warm()))):
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
    print(report(rows))


def main(argv: list[str] | None = None) -> int:
    from corpus import export_models as em

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", action="append", default=[])
    a = p.parse_args(argv)
    names = {n for item in a.only for n in item.split(",")}
    entries = [e for e in em.ENTRIES if not names or e.name in names]
    opts = argparse.Namespace(rounds=1 if a.quick else 3, latency_rounds=2 if a.quick else 5,
                              budget=30.0, timeout=600.0, clock="cpu",
                              call_seconds=0.005 if a.quick else 0.05)
    torch.set_num_threads(1)
    em.register_dataclasses()
    pte_report(entries, em, opts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
