"""exportir.export vs torch.export.export(strict=False) on the real-model corpus.

    PYTHONPATH=src .venv/bin/python benchmarks/export_bench.py [--quick] [--only NAME ...]
    PYTHONPATH=src .venv/bin/python benchmarks/export_bench.py --corpus ours   # our own models

For every model of ``tests/corpus/real_models.py`` (built by transformers, timm and
torchvision's own code; ``--corpus ours``: ``tests/corpus/export_models.py``), in one run and
interleaved round by round:

- ``export``: ``export(module, args, kwargs)`` (module and inputs built untimed);
- ``decompose``: ``ep.run_decompositions()`` on a program exported untimed;
- ``total``: ``export(...).run_decompositions()``, the path to core ATen users wait for.

Each side keeps its best time; ratios are ours/torch (< 1.0: exportir is faster). The first
result of every side is checked against eager (outputs of ``.module()``), so a wrong or no-op
implementation shows up as an ERROR, not a fast time. Then a scaling table: MLP stacks of
256/1024/4096 Linear+ReLU layers, export and decomposition time per layer for exportir (and
torch unless ``--skip-torch-scaling`` or its calls exceed ``--scaling-timeout``).

Targets (printed PASS/MISS): median export ratio <= 0.25 and no model's above 0.5 (real corpus;
our own corpus: <= 0.33 and none slower than torch); median export+decompose ratio <= 0.1 (ours:
0.2); exportir's time per layer does not grow with the stack (per-layer time at the largest size
/ at the smallest <= 1.5).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
for _path in (_ROOT / "src", _ROOT / "tests", Path(__file__).resolve().parent):
    if _path.is_dir() and str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import torch
from _timing import CLOCKS, Measurement, Workload, WrongResult, compare
from torch import nn

OURS, THEIRS = "exportir", "torch"
ROWS = ("export", "decompose", "total")
# per corpus: (median export, max export, median export+decompose)
TARGETS = {"real": (0.25, 0.5, 0.1), "ours": (0.33, 1.0, 0.2)}
TARGET_LINEARITY = 1.5


def _quiet(fn: Callable, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _exporters() -> dict[str, Callable]:
    import torch.export as te

    def theirs(module, args, kwargs):
        return te.export(module, args, kwargs, strict=False)

    def ours(module, args, kwargs):
        from corpus.export_harness import ours as impl

        return impl().export(module, args, kwargs)

    return {OURS: ours, THEIRS: theirs}


# --------------------------------------------------------------------------------------------
# Corpus rows.


def _check_program(build: Callable[[], tuple]) -> Callable[[object, object], None]:
    """A check that runs the program's ``module()`` against eager on fresh copies."""
    from corpus import export_harness as h
    from corpus import export_models as em

    def check(_setup: object, ep: object) -> None:
        module, args, kwargs = build()
        eager = copy.deepcopy(module)
        a1, k1 = em.clone_inputs(args, kwargs)
        a2, k2 = em.clone_inputs(args, kwargs)
        try:
            h.assert_same_tree(_quiet(ep.module(), *a1, **k1), _quiet(eager, *a2, **k2), "benchmark check")
        except AssertionError as exc:
            raise WrongResult(str(exc).splitlines()[0]) from exc

    return check


class Corpus:
    """The models one run measures: ``names`` and ``build(name) -> (module, args, kwargs)``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        if kind == "real":
            from corpus import real_models as rm

            self.names = list(rm.NAMES)
            self._build = self._build_real
        else:
            from corpus import export_models as em

            self.names = [e.name for e in em.ENTRIES]
            self._build = lambda name: em.build(em.BY_NAME[name])

    @staticmethod
    def _build_real(name: str) -> tuple:
        from corpus import real_models as rm

        case = rm.build(name)
        return case.model, (), case.kwargs

    def build(self, name: str) -> tuple:
        return self._build(name)

    @property
    def warm_up(self) -> str:
        return "bert" if self.kind == "real" else "mlp"


def _corpus_makers(corpus: Corpus, name: str, row: str, export: Callable) -> Callable[[], Workload]:
    def build():
        return corpus.build(name)

    check = _check_program(build)

    def make() -> Workload:
        if row == "export":
            return Workload(run=lambda case: _quiet(export, *case), setup=build, check=check)
        if row == "decompose":
            return Workload(
                run=lambda ep: _quiet(ep.run_decompositions),
                setup=lambda: _quiet(export, *build()),
                check=check,
            )
        return Workload(run=lambda case: _quiet(_quiet(export, *case).run_decompositions), setup=build, check=check)

    return make


def run_corpus(args, corpus: Corpus) -> dict[str, dict[str, dict[str, Measurement]]]:
    exporters = _exporters()
    names = [n for n in corpus.names if not args.only or n in args.only]
    results: dict[str, dict[str, dict[str, Measurement]]] = {}
    clock = CLOCKS[args.clock]
    for name in names:
        results[name] = {}
        for row in ROWS:
            makers = {side: _corpus_makers(corpus, name, row, fn) for side, fn in exporters.items()}
            results[name][row] = compare(
                makers, rounds=args.rounds, budget=args.budget, timeout=args.timeout, clock=clock
            )
        _print_model_line(name, results[name])
    return results


# --------------------------------------------------------------------------------------------
# Scaling.


class MLPStack(nn.Module):
    def __init__(self, layers: int, width: int = 8):
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())])

    def forward(self, x):
        return self.layers(x)


def _scaling_maker(row: str, export: Callable, module: nn.Module, x: torch.Tensor, check) -> Callable[[], Workload]:
    def make() -> Workload:
        if row == "export":
            return Workload(run=lambda _: _quiet(export, module, (x,), {}), check=check)
        return Workload(
            run=lambda ep: _quiet(ep.run_decompositions),
            setup=lambda: _quiet(export, module, (x,), {}),
            check=check,
        )

    return make


def run_scaling(args) -> dict[int, dict[str, dict[str, Measurement]]]:
    exporters = _exporters()
    if args.skip_torch_scaling:
        exporters.pop(THEIRS)
    clock = CLOCKS[args.clock]
    results: dict[int, dict[str, dict[str, Measurement]]] = {}
    torch_gave_up = False
    for layers in args.scaling_sizes:
        torch.manual_seed(0)
        module = MLPStack(layers).eval()
        x = torch.randn(2, 8)
        expected = module(x)

        def check(_setup: object, ep: object, expected=expected, x=x) -> None:
            if not torch.allclose(ep.module()(x), expected, rtol=1e-4, atol=1e-5):
                raise WrongResult("MLP stack output differs from eager")

        results[layers] = {}
        for row in ("export", "decompose"):
            makers = {}
            for side, export in exporters.items():
                if side == THEIRS and torch_gave_up:
                    continue
                makers[side] = _scaling_maker(row, export, module, x, check)
            results[layers][row] = compare(
                makers, rounds=args.scaling_rounds, budget=args.budget, timeout=args.scaling_timeout, clock=clock
            )
            theirs = results[layers][row].get(THEIRS)
            if theirs is not None and theirs.error is not None and "timeout" in theirs.error:
                torch_gave_up = True  # larger sizes would only take longer
        _print_scaling_line(layers, results[layers])
    return results


# --------------------------------------------------------------------------------------------
# Reporting.


def _fmt(m: Measurement | None) -> str:
    if m is None:
        return "-"
    if m.error is not None:
        return "ERROR"
    return f"{m.best * 1e3:8.1f}ms"


def _ratio(row: dict[str, Measurement]) -> float | None:
    ours, theirs = row.get(OURS), row.get(THEIRS)
    if ours is None or theirs is None or ours.best is None or theirs.best is None or theirs.best == 0:
        return None
    return ours.best / theirs.best


def _fmt_ratio(r: float | None) -> str:
    return "   -" if r is None else f"{r:5.2f}"


_HEADER = f"{'model':30s} " + " ".join(f"{row + ' ours':>11s} {'torch':>10s} {'ratio':>5s}" for row in ROWS)


def _print_model_line(name: str, rows: dict[str, dict[str, Measurement]]) -> None:
    cells = [f"{_fmt(rows[r].get(OURS)):>11s} {_fmt(rows[r].get(THEIRS)):>10s} {_fmt_ratio(_ratio(rows[r]))}" for r in ROWS]
    print(f"{name:30s} " + " ".join(cells), flush=True)


def _per_layer(m: Measurement | None, layers: int) -> str:
    if m is None:
        return "-"
    if m.error is not None:
        return "ERROR"
    return f"{m.best * 1e6 / layers:7.1f}us"


def _print_scaling_line(layers: int, rows: dict[str, dict[str, Measurement]]) -> None:
    cells = []
    for row in ("export", "decompose"):
        for side in (OURS, THEIRS):
            m = rows[row].get(side)
            cells.append(f"{_fmt(m):>11s} {_per_layer(m, layers):>10s}")
    print(f"{layers:>7d} " + " ".join(cells), flush=True)


def _errors(corpus, scaling) -> list[str]:
    lines = []
    for name, rows in corpus.items():
        for row, sides in rows.items():
            for side, m in sides.items():
                if m.error is not None:
                    lines.append(f"  {name}/{row}/{side}: {m.error}" + (f"  [{m.where}]" if m.where else ""))
    for layers, rows in scaling.items():
        for row, sides in rows.items():
            for side, m in sides.items():
                if m.error is not None:
                    lines.append(f"  mlp_stack_{layers}/{row}/{side}: {m.error}" + (f"  [{m.where}]" if m.where else ""))
    return lines


def _only_torch_failed(sides) -> bool:
    """exportir's side ran and torch's raised."""
    ours, theirs = sides.get(OURS), sides.get(THEIRS)
    return (ours is not None and ours.error is None and theirs is not None
            and theirs.error is not None)


def summarize(corpus, scaling, kind: str) -> list[tuple[str, str]]:
    target_median, target_max, target_total = TARGETS[kind]
    verdicts: list[tuple[str, str]] = []
    ratios = {row: {n: _ratio(rows[row]) for n, rows in corpus.items()} for row in ROWS}
    print()
    for row in ROWS:
        values = [r for r in ratios[row].values() if r is not None]
        missing = len(ratios[row]) - len(values)
        median = statistics.median(values) if values else None
        extra = f" ({missing} models without a ratio)" if missing else ""
        print(f"median {row:9s} ratio: {_fmt_ratio(median)}  over {len(values)} models{extra}")
    export_values = [r for r in ratios["export"].values() if r is not None]
    total_values = [r for r in ratios["total"].values() if r is not None]
    complete = all(r is not None for r in ratios["export"].values()) and bool(export_values)

    def verdict(ok: bool | None) -> str:
        return "ERROR" if ok is None else ("PASS" if ok else "MISS")

    median_export = statistics.median(export_values) if export_values else None
    verdicts.append((
        f"median export ratio {_fmt_ratio(median_export).strip()} <= {target_median}",
        verdict(None if not complete else median_export <= target_median),
    ))
    slower = sorted((n for n, r in ratios["export"].items() if r is not None and r > target_max))
    worst = max(export_values, default=None)
    verdicts.append((
        (f"no model's export ratio above {target_max} (max {_fmt_ratio(worst).strip()}; "
        f"above: {', '.join(slower) or 'none'})"),
        verdict(None if not complete else not slower),
    ))
    median_total = statistics.median(total_values) if total_values else None
    # a model torch.export cannot decompose (its own error, listed above) has no ratio and does
    # not stop the verdict; a model exportir fails on does
    torch_only = sorted(n for n, rows in corpus.items()
                        if _ratio(rows["total"]) is None and _only_torch_failed(rows["total"]))
    total_complete = bool(total_values) and all(
        r is not None or n in torch_only for n, r in ratios["total"].items())
    note = f"; torch.export fails on {', '.join(torch_only)}" if torch_only else ""
    verdicts.append((
        f"median export+decompose ratio {_fmt_ratio(median_total).strip()} <= {target_total}{note}",
        verdict(None if not total_complete else median_total <= target_total),
    ))
    for row in ("export", "decompose"):
        per_layer = [
            (layers, rows[row][OURS].best / layers)
            for layers, rows in sorted(scaling.items())
            if OURS in rows[row] and rows[row][OURS].best is not None
        ]
        if len(per_layer) < 2 or len(per_layer) != len(scaling):
            verdicts.append((f"exportir {row} scales linearly", verdict(None if scaling else True)))
            continue
        # Fixed costs make small stacks dearer per layer; only growth per layer is superlinear.
        growth = per_layer[-1][1] / per_layer[0][1]
        verdicts.append((
            (f"exportir {row} per-layer time largest/smallest {growth:.2f} <= {TARGET_LINEARITY} "
            f"({per_layer[0][0]}..{per_layer[-1][0]} layers)"),
            verdict(growth <= TARGET_LINEARITY),
        ))
    return verdicts


# --------------------------------------------------------------------------------------------
# Dynamic shapes (rows and report in _dynamic_rows.py).

TARGET_MEDIAN_DYNAMIC = 0.33


def run_dynamic_section(args) -> list[tuple[str, str]]:
    """Dynamic-batch export rows (median target) and the 48-layer transformer report."""
    from _dynamic_rows import run_dynamic, transformer_report

    print(f"\n{'model (dynamic batch)':30s} {'export ours':>11s} {'torch':>10s} {'ratio':>5s}")

    def line(name: str, rows: dict) -> None:
        row = rows["dynamic export"]
        print(f"{name:30s} {_fmt(row.get(OURS)):>11s} {_fmt(row.get(THEIRS)):>10s} {_fmt_ratio(_ratio(row))}", flush=True)

    results = run_dynamic(args, compare, CLOCKS[args.clock], line)
    ratios = [r for r in (_ratio(rows["dynamic export"]) for rows in results.values()) if r is not None]
    missing = len(results) - len(ratios)
    median = statistics.median(ratios) if ratios else None
    print(f"median dynamic export ratio: {_fmt_ratio(median)} over {len(ratios)} models"
          + (f" ({missing} without a ratio: errors above)" if missing else ""))
    print()
    try:
        print("\n".join(transformer_report(48)))
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        print(f"48-layer transformer report failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    ok = median is not None and median <= TARGET_MEDIAN_DYNAMIC
    return [(f"median dynamic-batch export ratio {_fmt_ratio(median)} <= {TARGET_MEDIAN_DYNAMIC}",
             "PASS" if ok else "MISS")]


def parse_args(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 rounds; scaling at 256/1024 layers, 1 round")
    parser.add_argument("--corpus", choices=sorted(TARGETS), default="real",
                        help="real: transformers/timm/torchvision models (default); ours: our own corpus")
    parser.add_argument("--only", action="append", default=[], help="corpus model name (repeatable, or comma-separated)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds per row (default 5, quick 2)")
    parser.add_argument("--budget", type=float, default=20.0, help="a side stops repeating after S seconds (after >= 1 run)")
    parser.add_argument("--timeout", type=float, default=120.0, help="a single corpus call taking longer is an ERROR")
    parser.add_argument("--scaling-sizes", type=lambda s: [int(v) for v in s.split(",")], default=None,
                        help="comma-separated layer counts (default 256,1024,4096; quick 256,1024)")
    parser.add_argument("--scaling-rounds", type=int, default=None, help="rounds per scaling cell (default 2, quick 1)")
    parser.add_argument("--scaling-timeout", type=float, default=300.0,
                        help="a scaling call taking longer is an ERROR; torch then skips larger sizes")
    parser.add_argument("--skip-torch-scaling", action="store_true", help="time only exportir in the scaling table")
    parser.add_argument("--no-scaling", action="store_true", help="skip the scaling table")
    parser.add_argument("--no-dynamic", action="store_true", help="skip the dynamic-batch rows and the 48-layer report")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="timer for the timed call")
    parser.add_argument("--strict", action="store_true", help="exit status 1 on any MISS or ERROR")
    args = parser.parse_args(argv)
    args.only = [n for item in args.only for n in item.split(",") if n]
    if args.rounds is None:
        args.rounds = 2 if args.quick else 5
    if args.scaling_sizes is None:
        args.scaling_sizes = [256, 1024] if args.quick else [256, 1024, 4096]
    if args.scaling_rounds is None:
        args.scaling_rounds = 1 if args.quick else 2
    if args.no_scaling:
        args.scaling_sizes = []
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    source = Corpus(args.corpus)
    unknown = [n for n in args.only if n not in source.names]
    if unknown:
        print(f"unknown corpus models: {', '.join(unknown)}", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, corpus={args.corpus}, clock={args.clock}, rounds={args.rounds}; "
          "times are best-of, ratio = exportir/torch")
    started = time.perf_counter()
    # Warm both sides up (imports, first-call caches) outside any measurement.
    for export in _exporters().values():
        try:
            _quiet(_quiet(export, *source.build(source.warm_up)).run_decompositions)
        except Exception as exc:  # noqa: BLE001 - reported per row below
            print(f"warm-up failed: {type(exc).__name__}: {exc}".splitlines()[0])
    print()
    print(_HEADER)
    corpus = run_corpus(args, source)
    scaling = {}
    if args.scaling_sizes:
        print()
        print(f"{'layers':>7s} " + " ".join(f"{label:>11s} {'per layer':>10s}" for label in (
            "export ours", "torch", "decomp ours", "torch")))
        scaling = run_scaling(args)
    dynamic_verdicts = [] if args.no_dynamic else run_dynamic_section(args)
    errors = _errors(corpus, scaling)
    if errors:
        print("\nerrors:")
        print("\n".join(errors))
    verdicts = summarize(corpus, scaling, args.corpus) + dynamic_verdicts
    print("\nSummary:")
    for text, status in verdicts:
        print(f"  {status:5s} {text}")
    print(f"\n(total {time.perf_counter() - started:.0f}s)")
    bad = any(status != "PASS" for _, status in verdicts)
    return 1 if args.strict and bad else 0


if __name__ == "__main__":
    sys.exit(main())
