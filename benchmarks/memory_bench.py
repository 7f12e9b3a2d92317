"""Load time and memory of the runtime vs ExecuTorch 1.5.1, each measured in a fresh process.

    .venv-bench/bin/python benchmarks/memory_bench.py [--programs DIR] [--runs N]
        [--only NAME ...] [--road fused|portable ...]

Two roads per model of ``_xnnpack_rows.MODELS`` (batch 1):

- ``fused``: ours = ``to_edge_transform_and_lower(FusedCpuPartitioner())``; theirs = XNNPACK
  (``to_edge_transform_and_lower(partitioner=[XnnpackPartitioner()]).to_executorch()``);
- ``portable``: ours = ``to_edge(...).to_program()``; theirs = ``exir.to_edge(...)
  .to_executorch()`` (ExecuTorch's portable kernels).

Programs are compiled once into ``DIR`` (reused when there). Every measurement is one fresh
interpreter that imports only its runtime (``exportir.runtime`` / ``executorch.runtime``),
reads the program file into ``bytes`` and the inputs, resets the kernel's peak-RSS counter
(``/proc/self/clear_refs``) and then:

- load: ``Program.load(bytes).method("forward")`` vs ``Runtime.load_program(bytes)
  .load_method("forward")``, process CPU time (one torch thread) and wall time;
- first call: the first call on the same inputs (lazy work lands here), CPU time;
- memory: peak RSS growth (``VmHWM``) over the baseline after load, after the first call, and
  the resident growth (``VmRSS``) after two calls (what stays), and the growth of private
  memory (``RssAnon``) after the first call: the rest is file-backed, mostly code pages of
  libtorch / ExecuTorch's library touched for the first time.

The sides alternate process by process; each keeps its best (smallest) value per column over
``--runs`` processes, after one unmeasured process per side (bytecode caches written, files in
the page cache). Ratios are ours / theirs: targets load <= 2, memory <= 1.2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
for _path in (_ROOT / "src", _ROOT / "tests", _HERE):
    if _path.is_dir() and str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import torch

_CHILD = r"""
import json, sys, time
def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
side, path, inputs = sys.argv[1], sys.argv[2], sys.argv[3]
import torch
torch.set_num_threads(1)
if side == "ours":
    from exportir.runtime import Program
else:
    from executorch.runtime import Runtime
    runtime = Runtime.get()
args = tuple(torch.load(inputs))
data = open(path, "rb").read()
import gc
gc.collect()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS
base, base_anon = status("VmRSS:"), status("RssAnon:")
c0, w0 = time.process_time(), time.perf_counter()
if side == "ours":
    method = Program.load(data).method("forward")
    call = lambda: method(*args)
else:
    method = runtime.load_program(data).load_method("forward")
    call = lambda: method.execute(list(args))
c1, w1 = time.process_time(), time.perf_counter()
hwm_load = status("VmHWM:")
with torch.no_grad():
    call()
    c2 = time.process_time()
    hwm_run, anon = status("VmHWM:"), status("RssAnon:") - base_anon
    call()
rss = status("VmRSS:")
print(json.dumps({"load": c1 - c0, "wall": w1 - w0, "first": c2 - c1,
                  "mem_load": hwm_load - base, "mem_run": hwm_run - base, "rss": rss - base,
                  "anon": anon}))
"""

COLUMNS = ("load", "wall", "first", "mem_load", "mem_run", "rss", "anon")


def _quiet():
    from _xnnpack_rows import _quiet as quiet

    return quiet()


def compile_side(road: str, side: str, case: tuple) -> bytes:
    from _xnnpack_rows import et_compile, ours_compile

    if road == "fused":
        return ours_compile(case) if side == "ours" else et_compile(case)
    module, args = case
    with _quiet():
        if side == "ours":
            from exportir.export import export
            from exportir.program.manager import to_edge

            return bytes(to_edge(export(module, args)).to_program().buffer)
        from executorch.exir import to_edge as et_to_edge

        return bytes(et_to_edge(torch.export.export(module, args, strict=False))
                     .to_executorch().buffer)  # fmt: skip


def programs(directory: Path, model, road: str) -> tuple[Path, Path, Path]:
    """(ours, theirs, inputs) files of ``model`` on ``road``, compiled when missing."""
    from _xnnpack_rows import _seeded

    paths = tuple(directory / f"{model.name}.{road}.{s}" for s in ("ours.xpt", "et.pte"))
    inputs = directory / f"{model.name}.inputs.pt"
    if not inputs.exists():
        torch.save(_seeded(model)[1], inputs)
    for path, side in zip(paths, ("ours", "et")):
        if not path.exists():
            path.write_bytes(compile_side(road, side, _seeded(model)))
    return paths[0], paths[1], inputs


def child(side: str, path: Path, inputs: Path) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(_ROOT / "src"),
                                                      os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    # Bytecode caches on both sides: ExecuTorch's Python modules are installed with theirs; ours
    # are compiled once into the program directory instead of in every measured process.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(path.parent / "pycache")
    proc = subprocess.run([sys.executable, "-c", _CHILD, side, str(path), str(inputs)],
                          capture_output=True, text=True, env=env, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{side}: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(ours: Path, theirs: Path, inputs: Path, runs: int) -> dict[str, dict[str, float]]:
    best: dict[str, dict[str, float]] = {"ours": {}, "et": {}}
    for side, path in (("ours", ours), ("et", theirs)):  # warm: bytecode and page caches
        child(side, path, inputs)
    for i in range(runs):
        order = (("ours", ours), ("et", theirs)) if i % 2 == 0 else (("et", theirs), ("ours", ours))
        for side, path in order:
            got = child(side, path, inputs)
            for k in COLUMNS:
                best[side][k] = min(best[side].get(k, float("inf")), got[k])
    return best


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f}"


def _mib(b: float) -> str:
    return f"{b / 2**20:.1f}"


def main(argv: list[str] | None = None) -> int:
    from _xnnpack_rows import MODELS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--programs", type=Path, default=None, help="program cache directory")
    p.add_argument("--runs", type=int, default=3, help="fresh processes per side (best of)")
    p.add_argument("--only", action="append", default=[], metavar="NAME")
    p.add_argument("--road", action="append", choices=("fused", "portable"), default=[])
    a = p.parse_args(argv)
    roads = a.road or ["fused", "portable"]
    models = [m for m in MODELS if not a.only or m.name in a.only]
    cleanup = None
    if a.programs is None:
        cleanup = tempfile.TemporaryDirectory(prefix="exportir-memory-bench-")
        a.programs = Path(cleanup.name)
    a.programs.mkdir(parents=True, exist_ok=True)
    heads = ["model", "road", "load ours ms", "load ET ms", "ratio<=2", "1st call ours ms",
             "1st call ET ms", "peak MiB ours", "peak MiB ET", "ratio<=1.2", "load peak ratio",
             "resident ratio", "anon MiB ours", "anon MiB ET"]  # fmt: skip
    print(f"fresh process per measurement, best of {a.runs}, CPU time, torch {torch.__version__}")
    print("| " + " | ".join(heads) + " |")
    print("|" + "---|" * len(heads))
    for model in models:
        for road in roads:
            try:
                ours, theirs, inputs = programs(a.programs, model, road)
                r = measure(ours, theirs, inputs, a.runs)
            except Exception as exc:  # noqa: BLE001 - one model never stops the others
                print(f"| {model.name} | {road} | ERROR {type(exc).__name__}: {exc} |"[:300])
                continue
            o, e = r["ours"], r["et"]

            def ratio(k: str, o=o, e=e) -> str:
                return f"{o[k] / max(e[k], 1e-9 if k in ('load', 'first') else 1 << 16):.2f}"

            cells = [model.name, road, _ms(o["load"]), _ms(e["load"]), ratio("load"),
                     _ms(o["first"]), _ms(e["first"]), _mib(o["mem_run"]), _mib(e["mem_run"]),
                     ratio("mem_run"), ratio("mem_load"), ratio("rss"), _mib(o["anon"]), _mib(e["anon"])]  # fmt: skip
            print("| " + " | ".join(cells) + " |", flush=True)
            print(json.dumps({"model": model.name, "road": road, **r}), file=sys.stderr)
    if cleanup is not None:
        cleanup.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
