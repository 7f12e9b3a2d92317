"""exportir's program road vs ExecuTorch 1.5.1 on the export corpus, in one process.

    .venv-bench/bin/python benchmarks/program_bench.py [--quick] [--only NAME ...]
    .venv-bench/bin/python benchmarks/program_bench.py --xnnpack [--quick]   (_xnnpack_rows.py)

Needs the benchmark venv (ExecuTorch is never installed in the project's .venv); see
benchmarks/README.md for how to create it. Without ExecuTorch every ExecuTorch cell is an ERROR
and the exportir-only columns are still measured.

For every model of ``tests/corpus/export_models.py`` plus a ResNet-18-shaped net at 224x224 and
a tiny GPT-2-shaped decoder (both defined here):

- compile: ``export -> to_edge -> to_program().buffer`` vs ExecuTorch's
  ``torch.export.export -> exir.to_edge -> to_executorch().buffer`` (target <= 0.2x, median);
- memory: our planned arena vs ExecuTorch's (sum of ``non_const_buffer_sizes``, default config,
  which also plans the graph inputs; and with ``alloc_graph_input=False``, which is what we do);
  our arena / lower bound (target <= 1.05 on every model) and / sum of all planned activations;
- size: program file / weight bytes (target <= 1.002 on models with >= 1 MiB of weights), and
  the .pte's;
- load: ``Program.load(bytes).method("forward")`` vs ``Runtime.load_program(bytes)
  .load_method("forward")``;
- latency (batch as the corpus builds it; 1 for ResNet-18 and GPT-2): our runtime, portable and
  with the fused CPU delegate (compiled with ``to_edge_transform_and_lower``, so the ops the
  partitioner asks to keep whole, attention, are not decomposed), and ExecuTorch's portable
  runtime, vs torch eager (target <= 1.0 on the conv and attention models).

Every compiled program is run once against eager (untimed) before it is timed, so a wrong result
shows up as an ERROR, never as a fast time. A failure on one side is reported with its exception;
the other side and the other models go on.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import statistics
import sys
import time
import traceback
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
import torch.nn.functional as F
import torch.utils._pytree as torch_pytree
from _timing import CLOCKS, Measurement, Workload, WrongResult, compare, looped, select_only
from corpus import export_models as em
from torch import nn

OURS, ET, EAGER, FUSED = "exportir", "executorch", "eager", "exportir+fused"

TARGET_COMPILE = 0.2  # median ours/ExecuTorch compile time
TARGET_ARENA_BOUND = 1.05  # every model: arena / lower bound
TARGET_LATENCY = 1.0  # conv and attention models: runtime / eager
TARGET_FILE = 1.002  # models with >= BIG_WEIGHTS of weights: file / weight bytes
BIG_WEIGHTS = 1 << 20
LATENCY_TAGS = frozenset({"conv", "attention"})


# --------------------------------------------------------------------------------------------
# Extra models: a ResNet-18-shaped net and a tiny GPT-2-shaped decoder (no torchvision, no hub).


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """torchvision's resnet18 layout: 7x7 stem, max pool, [2, 2, 2, 2] basic blocks, fc."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.pool = nn.MaxPool2d(3, 2, 1)
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.layers(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class GPT2Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(dim)
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.mlp_proj = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class TinyGPT2(nn.Module):
    """GPT-2 layout (learned positions, pre-LN blocks, tied LM head), tiny sizes."""

    def __init__(
        self, vocab: int = 2048, ctx: int = 64, dim: int = 128, layers: int = 4, heads: int = 4
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(ctx, dim)
        self.h = nn.ModuleList(GPT2Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def _randomize_norms(model: nn.Module) -> nn.Module:
    """Trained-looking norm layers: fresh ones have identical all-ones weights and all-zeros
    biases, which a program file may store once and so look smaller than the weights."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model


def _resnet18() -> em.Case:
    return _randomize_norms(ResNet18()).eval(), (torch.randn(1, 3, 224, 224),), {}


def _gpt2() -> em.Case:
    return _randomize_norms(TinyGPT2()).eval(), (torch.randint(0, 2048, (1, 32)),), {}


EXTRA = [
    em.Entry("resnet18_224", _resnet18, frozenset({"conv", "norm"})),
    em.Entry("gpt2_tiny", _gpt2, frozenset({"attention", "norm"})),
]
ENTRIES = [*em.ENTRIES, *EXTRA]


# --------------------------------------------------------------------------------------------
# The two roads (each returns bytes plus what the report needs).


@contextlib.contextmanager
def _quiet():
    """Silence warnings and ExecuTorch's Python-level chatter while compiling."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        with contextlib.redirect_stdout(io.StringIO()):
            yield


def ours_compile(case: em.Case, partitioner: Any = None) -> Any:
    from exportir.export import export
    from exportir.program.manager import to_edge
    from exportir.program.transform_and_lower import to_edge_transform_and_lower

    module, args, kwargs = case
    with _quiet():
        ep = export(module, args, kwargs)
        if partitioner is None:
            edge = to_edge(ep)
        else:  # the partitioner's ops_to_not_decompose are kept whole for its backend
            edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
        manager = edge.to_program()
        manager.buffer  # noqa: B018 - serialization is part of the road
    return manager


def et_compile(case: em.Case, config: Any = None) -> Any:
    from executorch.exir import to_edge

    module, args, kwargs = case
    with _quiet():
        ep = torch.export.export(module, args, kwargs, strict=False)
        manager = to_edge(ep).to_executorch(config) if config else to_edge(ep).to_executorch()
        manager.buffer  # noqa: B018
    return manager


def et_no_input_config() -> Any:
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass

    return ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False))


def fused_registry() -> Any:
    from exportir.backends.fused_cpu.runtime import BACKEND_ID, backend_runtime
    from exportir.runtime import default_delegate_registry

    registry = default_delegate_registry()
    registry.register(BACKEND_ID, backend_runtime())
    return registry


def ours_load(data: bytes, delegates: Any = None) -> Any:
    from exportir.runtime import Program

    return Program.load(data, delegates=delegates).method("forward")


def et_load(data: bytes) -> Any:
    from executorch.runtime import Runtime

    return Runtime.get().load_program(data).load_method("forward")


def et_inputs(args: tuple, kwargs: dict) -> list[Any]:
    """ExecuTorch's flat input list: pytree leaves; strings are burned in (Null inputs)."""
    return [None if isinstance(x, str) else x for x in torch_pytree.tree_leaves((args, kwargs))]


def weight_bytes(module: nn.Module, args: tuple, kwargs: dict) -> int:
    """Bytes of the distinct tensors in the exported program's state_dict and constants."""
    with _quiet():
        ep = torch.export.export(module, args, kwargs, strict=False)
    seen, total = set(), 0
    for t in [*ep.state_dict.values(), *ep.constants.values()]:
        if isinstance(t, torch.Tensor):
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.nbytes)
            if key not in seen:
                seen.add(key)
                total += t.nbytes
    return total


def planned_activation_bytes(method: Any) -> int:
    from exportir.format import schema

    return sum(
        v.nbytes
        for v in method.values
        if isinstance(v, schema.Tensor) and isinstance(v.storage, schema.Allocation)
    )


# --------------------------------------------------------------------------------------------
# Result records.


@dataclass
class Cell:
    """One measured number (or the error that prevented it)."""

    value: float | None = None
    error: str | None = None

    @classmethod
    def of(cls, m: Measurement, scale: float = 1.0) -> Cell:
        return (
            cls(None, m.error + (f" [{m.where}]" if m.where else ""))
            if m.error
            else cls(None if m.best is None else m.best / scale)
        )


@dataclass
class Row:
    name: str
    tags: frozenset[str]
    cells: dict[str, Cell] = field(default_factory=dict)

    def get(self, key: str) -> float | None:
        c = self.cells.get(key)
        return None if c is None else c.value

    def put(self, key: str, value: float | None = None, error: str | None = None) -> None:
        self.cells[key] = Cell(value, error)

    def fail(self, key: str, exc: BaseException) -> None:
        self.cells[key] = Cell(None, _describe(exc))

    def ratio(self, a: str, b: str) -> float | None:
        x, y = self.get(a), self.get(b)
        return None if x is None or not y else x / y


def _describe(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    msg = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    if frames:
        last = frames[-1]
        parts = Path(last.filename).parts
        for anchor in ("exportir", "executorch", "torch"):
            if anchor in parts:
                msg += f" [{Path(*parts[parts.index(anchor) :])}:{last.lineno}]"
                break
    return msg[:300]


# --------------------------------------------------------------------------------------------
# Measurements of one model.


@dataclass(frozen=True)
class Options:
    rounds: int
    latency_rounds: int
    budget: float
    timeout: float
    call_seconds: float  # each latency repetition loops calls for about this long
    clock: str
    threads: int
    et_memory_variant: bool


def _builder(entry: em.Entry) -> Callable[[], em.Case]:
    return lambda: em.build(entry)


def measure_compile(entry: em.Entry, row: Row, opts: Options) -> dict[str, Any]:
    """Interleaved compile timing; returns the first manager of each side."""
    first: dict[str, Any] = {}

    def keep(side: str) -> Callable[[object, object], None]:
        def check(_: object, manager: object) -> None:
            first[side] = manager

        return check

    makers = {
        OURS: lambda: Workload(run=ours_compile, setup=_builder(entry), check=keep(OURS)),
        ET: lambda: Workload(run=et_compile, setup=_builder(entry), check=keep(ET)),
    }
    result = compare(
        makers,
        rounds=opts.rounds,
        budget=opts.budget,
        timeout=opts.timeout,
        clock=CLOCKS[opts.clock],
    )
    for side in (OURS, ET):
        row.cells[f"compile_{side}"] = Cell.of(result[side])
    return first


def _assert_same(got: Any, want: Any, what: str) -> None:
    got_t = [t for t in torch_pytree.tree_leaves(got) if isinstance(t, torch.Tensor)]
    want_t = [t for t in torch_pytree.tree_leaves(want) if isinstance(t, torch.Tensor)]
    if len(got_t) != len(want_t):
        raise WrongResult(f"{what}: {len(got_t)} output tensors, eager has {len(want_t)}")
    for g, w in zip(got_t, want_t):
        try:
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4, check_dtype=False)
        except AssertionError as exc:
            raise WrongResult(f"{what} differs from eager: {str(exc).splitlines()[1:3]}") from None


def measure_static(entry: em.Entry, row: Row, ours: Any, theirs: Any, opts: Options) -> None:
    module, args, kwargs = em.build(entry)
    try:
        row.put("weights", weight_bytes(module, args, kwargs))
    except Exception as exc:  # noqa: BLE001
        row.fail("weights", exc)
    if ours is not None:
        method = ours.program.method("forward")
        row.put("arena_ours", sum(method.plan.arenas))
        row.put("bound_ours", method.plan.lower_bound)
        row.put("acts_ours", planned_activation_bytes(method))
        row.put("file_ours", len(ours.buffer))
    if theirs is not None:
        plan = theirs.executorch_program.execution_plan[0]
        row.put("arena_et", sum(plan.non_const_buffer_sizes))
        row.put("file_et", len(theirs.buffer))
        if opts.et_memory_variant:
            try:
                variant = et_compile(em.build(entry), et_no_input_config())
                plan = variant.executorch_program.execution_plan[0]
                row.put("arena_et_noin", sum(plan.non_const_buffer_sizes))
            except Exception as exc:  # noqa: BLE001
                row.fail("arena_et_noin", exc)


def measure_load(row: Row, ours: Any, theirs: Any, opts: Options) -> None:
    makers = {}
    if ours is not None:
        data = ours.buffer
        makers[OURS] = lambda: Workload(run=lambda _: ours_load(data))
    if theirs is not None:
        pte = theirs.buffer
        makers[ET] = lambda: Workload(run=lambda _: et_load(pte))
    result = compare(
        makers,
        rounds=opts.rounds + 2,
        budget=opts.budget,
        timeout=opts.timeout,
        clock=CLOCKS[opts.clock],
    )
    for side, m in result.items():
        row.cells[f"load_{side}"] = Cell.of(m)


def measure_latency(
    entry: em.Entry, row: Row, ours: Any, fused: bytes | None, theirs: Any, opts: Options
) -> None:
    """Each side gets its own module/inputs, is checked once against a fresh eager call, then
    timed in loops of ``n`` calls (``n`` from one eager call, so a repetition lasts about
    ``opts.call_seconds``)."""
    eager_module, eager_args, eager_kwargs = em.build(entry)
    with torch.no_grad():
        eager_module(*eager_args, **eager_kwargs)  # warm-up
        start = time.process_time()
        eager_module(*eager_args, **eager_kwargs)
        one = max(time.process_time() - start, 1e-6)
    n = max(1, min(2000, int(opts.call_seconds / one)))

    def reference() -> Any:
        module, args, kwargs = em.build(entry)
        with torch.no_grad():
            return module(*args, **kwargs)

    def make_eager() -> Workload:
        module, args, kwargs = em.build(entry)
        return Workload(run=looped(lambda: module(*args, **kwargs), n))

    def make_ours(data: bytes, delegates: Any, what: str) -> Callable[[], Workload]:
        def make() -> Workload:
            method = ours_load(data, delegates)
            _, args, kwargs = em.build(entry)
            with torch.no_grad():
                _assert_same(method(*args, **kwargs), reference(), what)
            return Workload(run=looped(lambda: method(*args, **kwargs), n))

        return make

    def make_et() -> Workload:
        method = et_load(theirs.buffer)
        _, args, kwargs = em.build(entry)
        flat = et_inputs(args, kwargs)
        _assert_same(method.execute(flat), reference(), "ExecuTorch runtime")
        return Workload(run=looped(lambda: method.execute(flat), n))

    makers: dict[str, Callable[[], Workload]] = {EAGER: make_eager}
    if ours is not None:
        makers[OURS] = make_ours(ours.buffer, None, "exportir runtime")
    if fused is not None:
        makers[FUSED] = make_ours(fused, fused_registry(), "exportir runtime (fused_cpu)")
    if theirs is not None:
        makers[ET] = make_et
    result = compare(
        makers,
        rounds=opts.latency_rounds,
        budget=opts.budget,
        timeout=opts.timeout,
        clock=CLOCKS[opts.clock],
    )
    for side, m in result.items():
        row.cells[f"lat_{side}"] = Cell.of(m, scale=n)


def measure_model(entry: em.Entry, opts: Options) -> Row:
    row = Row(entry.name, entry.tags)
    first = measure_compile(entry, row, opts)
    ours, theirs = first.get(OURS), first.get(ET)
    fused = None
    if ours is not None:
        try:
            from exportir.backends.fused_cpu import FusedCpuPartitioner

            fused = ours_compile(em.build(entry), FusedCpuPartitioner()).buffer
        except Exception as exc:  # noqa: BLE001
            row.fail(f"lat_{FUSED}", exc)
    measure_static(entry, row, ours, theirs, opts)
    measure_load(row, ours, theirs, opts)
    measure_latency(entry, row, ours, fused, theirs, opts)
    return row


# --------------------------------------------------------------------------------------------
# Report.


def fmt_time(x: float | None) -> str:
    if x is None:
        return "ERR"
    if x >= 1.0:
        return f"{x:.2f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.1f} ms"
    return f"{x * 1e6:.0f} us"


def fmt_bytes(x: float | None) -> str:
    if x is None:
        return "ERR"
    if x >= 1 << 20:
        return f"{x / (1 << 20):.2f} MiB"
    if x >= 1 << 10:
        return f"{x / (1 << 10):.1f} KiB"
    return f"{int(x)} B"


def fmt_ratio(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def _lat_target(row: Row) -> bool:
    return bool(row.tags & LATENCY_TAGS)


def compile_table(rows: list[Row]) -> str:
    body = [
        [
            r.name,
            fmt_time(r.get(f"compile_{OURS}")),
            fmt_time(r.get(f"compile_{ET}")),
            fmt_ratio(r.ratio(f"compile_{OURS}", f"compile_{ET}"), 3),
            fmt_time(r.get(f"load_{OURS}")),
            fmt_time(r.get(f"load_{ET}")),
            fmt_ratio(r.ratio(f"load_{OURS}", f"load_{ET}")),
        ]
        for r in rows
    ]
    return table(
        ["model", "compile ours", "compile ET", "ours/ET", "load ours", "load ET", "ours/ET"], body
    )


def memory_table(rows: list[Row]) -> str:
    body = []
    for r in rows:
        body.append(
            [
                r.name,
                fmt_bytes(r.get("arena_ours")),
                fmt_bytes(r.get("bound_ours")),
                fmt_ratio(r.ratio("arena_ours", "bound_ours"), 3),
                fmt_ratio(r.ratio("arena_ours", "acts_ours")),
                fmt_bytes(r.get("arena_et")),
                fmt_ratio(r.ratio("arena_ours", "arena_et")),
                fmt_bytes(r.get("arena_et_noin")),
                fmt_ratio(r.ratio("arena_ours", "arena_et_noin")),
                fmt_bytes(r.get("weights")),
                fmt_ratio(r.ratio("file_ours", "weights"), 4),
                fmt_ratio(r.ratio("file_et", "weights"), 4),
            ]
        )
    return table(
        [
            "model",
            "arena ours",
            "lower bnd",
            "arena/bnd",
            "arena/acts",
            "arena ET",
            "ours/ET",
            "ET no-input",
            "ours/ET-ni",
            "weights",
            "file/w ours",
            "pte/w ET",
        ],
        body,
    )


def latency_table(rows: list[Row]) -> str:
    body = [
        [
            r.name + (" *" if _lat_target(r) else ""),
            fmt_time(r.get(f"lat_{EAGER}")),
            fmt_time(r.get(f"lat_{OURS}")),
            fmt_time(r.get(f"lat_{FUSED}")),
            fmt_time(r.get(f"lat_{ET}")),
            fmt_ratio(r.ratio(f"lat_{OURS}", f"lat_{EAGER}")),
            fmt_ratio(r.ratio(f"lat_{FUSED}", f"lat_{EAGER}")),
            fmt_ratio(r.ratio(f"lat_{ET}", f"lat_{EAGER}")),
            fmt_ratio(r.ratio(f"lat_{OURS}", f"lat_{ET}")),
        ]
        for r in rows
    ]
    return table(
        [
            "model (* = latency target)",
            "eager",
            "ours",
            "ours+fused",
            "ET",
            "ours/eager",
            "fused/eager",
            "ET/eager",
            "ours/ET",
        ],
        body,
    )


def error_lines(rows: list[Row]) -> list[str]:
    out = []
    for r in rows:
        seen = set()
        for key, cell in r.cells.items():
            if cell.error and (key, cell.error) not in seen:
                seen.add((key, cell.error))
                out.append(f"  {r.name} [{key}]: {cell.error}")
    return out


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def medians(rows: list[Row]) -> str:
    cols = [
        ("compile ours/ET", lambda r: r.ratio(f"compile_{OURS}", f"compile_{ET}")),
        ("load ours/ET", lambda r: r.ratio(f"load_{OURS}", f"load_{ET}")),
        ("arena/lower bound", lambda r: r.ratio("arena_ours", "bound_ours")),
        ("arena/activations", lambda r: r.ratio("arena_ours", "acts_ours")),
        ("arena ours/ET", lambda r: r.ratio("arena_ours", "arena_et")),
        ("arena ours/ET no-input", lambda r: r.ratio("arena_ours", "arena_et_noin")),
        ("file/weights ours", lambda r: r.ratio("file_ours", "weights")),
        ("pte/weights ET", lambda r: r.ratio("file_et", "weights")),
        ("latency ours/eager", lambda r: r.ratio(f"lat_{OURS}", f"lat_{EAGER}")),
        ("latency fused/eager", lambda r: r.ratio(f"lat_{FUSED}", f"lat_{EAGER}")),
        ("latency ET/eager", lambda r: r.ratio(f"lat_{ET}", f"lat_{EAGER}")),
        ("latency ours/ET", lambda r: r.ratio(f"lat_{OURS}", f"lat_{ET}")),
    ]
    body = []
    for label, fn in cols:
        vals = [fn(r) for r in rows]
        n = sum(v is not None for v in vals)
        body.append([label, fmt_ratio(_median(vals), 3), str(n)])
    return table(["ratio", "median", "models"], body)


def _verdict(ok: bool | None) -> str:
    return "ERROR" if ok is None else ("PASS" if ok else "MISS")


def _verdict_all(selected: int, slow: list[str], missing: list[str]) -> str:
    """Every selected model must be measured and within target; none selected: n/a."""
    if not selected:
        return "n/a"
    return "MISS" if slow else ("ERROR" if missing else "PASS")


def summary(rows: list[Row]) -> list[str]:
    lines = []
    compile_r = [r.ratio(f"compile_{OURS}", f"compile_{ET}") for r in rows]
    med = _median(compile_r)
    within = sum(1 for v in compile_r if v is not None and v <= TARGET_COMPILE)
    n = sum(v is not None for v in compile_r)
    lines.append(
        f"{_verdict(None if med is None else med <= TARGET_COMPILE):5}  compile "
        f"ours/ExecuTorch: median {fmt_ratio(med, 3)} (target <= {TARGET_COMPILE}); "
        f"{within}/{n} models within"
    )

    bound = [(r.name, r.ratio("arena_ours", "bound_ours")) for r in rows]
    vals = [v for _, v in bound if v is not None]
    over = [f"{name} {v:.3f}" for name, v in bound if v is not None and v > TARGET_ARENA_BOUND]
    lines.append(
        f"{_verdict(None if not vals else not over):5}  arena/lower bound: max "
        f"{fmt_ratio(max(vals) if vals else None, 3)}, median {fmt_ratio(_median(vals), 3)}"
        f" (target <= {TARGET_ARENA_BOUND} on every model)"
        + (f"; over: {', '.join(over)}" if over else "")
    )

    for side, label in ((OURS, "portable"), (FUSED, "fused_cpu")):
        pairs = [(r.name, r.ratio(f"lat_{side}", f"lat_{EAGER}")) for r in rows if _lat_target(r)]
        vals = [v for _, v in pairs if v is not None]
        slow = [f"{name} {v:.2f}" for name, v in pairs if v is not None and v > TARGET_LATENCY]
        missing = [name for name, v in pairs if v is None]
        lines.append(
            f"{_verdict_all(len(pairs), slow, missing):5}  latency {label}/eager on conv+attention"
            f" models: {len(vals) - len(slow)}/{len(vals)} within {TARGET_LATENCY}, median "
            f"{fmt_ratio(_median(vals))}"
            + (f"; slower: {', '.join(slow)}" if slow else "")
            + (f"; no measurement: {', '.join(missing)}" if missing else "")
        )

    big = [
        (r.name, r.ratio("file_ours", "weights"), r.ratio("file_et", "weights"))
        for r in rows
        if (r.get("weights") or 0) >= BIG_WEIGHTS
    ]
    over = [name for name, v, _ in big if v is not None and v > TARGET_FILE]
    missing = [name for name, v, _ in big if v is None]
    detail = ", ".join(f"{name} {fmt_ratio(v, 4)} (ET {fmt_ratio(e, 4)})" for name, v, e in big)
    lines.append(
        f"{_verdict_all(len(big), over, missing):5}  "
        f"file/weights on models with >= 1 MiB of weights (target <= {TARGET_FILE}): "
        f"{detail or 'none measured'}"
    )
    return lines


def header(opts: Options) -> str:
    try:
        import importlib.metadata as md

        et_version = md.version("executorch")
    except Exception:  # noqa: BLE001
        et_version = "not installed"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"exportir program road vs ExecuTorch {et_version} | torch {torch.__version__}, python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs, load {load}, torch threads "
        f"{torch.get_num_threads()}\n{opts.clock} time, best of {opts.rounds} interleaved rounds "
        f"(compile, load +2) / {opts.latency_rounds} (latency, loops of ~{opts.call_seconds:g} s);"
        f" ratios < 1.0 mean exportir is faster / smaller"
    )


def report(rows: list[Row], opts: Options) -> None:
    print(header(opts))
    for title, fn in (
        ("compile and load", compile_table),
        ("memory and size", memory_table),
        ("latency per call", latency_table),
    ):
        print(f"\n{title}")
        print(fn(rows))
    print("\nmedians over the models measured on both sides of each ratio")
    print(medians(rows))
    errors = error_lines(rows)
    if errors:
        print("\nerrors")
        print("\n".join(errors))
    print()
    print("\n".join(summary(rows)))


# --------------------------------------------------------------------------------------------
# Driver.


def parse_args(argv: list[str] | None) -> tuple[list[em.Entry], Options, bool]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 1 compile round, 2 latency rounds of ~5 ms loops",
    )
    p.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        default=[],
        help="repeatable or comma-separated model names (corpus, resnet18_224, gpt2_tiny)",
    )
    p.add_argument("--rounds", type=int, help="compile rounds (default 3; quick 1)")
    p.add_argument("--latency-rounds", type=int, help="latency rounds (default 5; quick 2)")
    p.add_argument(
        "--budget",
        type=float,
        default=30.0,
        help="stop repeating a side after this many seconds (default 30)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="per-call timeout in seconds, reported as an error (default 600)",
    )
    p.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: ExecuTorch's portable kernels are "
        "single-threaded, and CPU time counts every thread)",
    )
    p.add_argument(
        "--skip-et-variant",
        action="store_true",
        help="do not compile ExecuTorch a second time with alloc_graph_input=False",
    )
    p.add_argument("--strict", action="store_true", help="exit 1 on any MISS or ERROR summary")
    a = p.parse_args(argv)
    selected = select_only(p, a.only, ENTRIES, "model")
    opts = Options(
        rounds=a.rounds or (1 if a.quick else 3),
        latency_rounds=a.latency_rounds or (2 if a.quick else 5),
        budget=a.budget,
        timeout=a.timeout,
        call_seconds=0.005 if a.quick else 0.05,
        clock=a.clock,
        threads=a.threads,
        et_memory_variant=not a.skip_et_variant,
    )
    return selected, opts, a.strict


def warm_up() -> None:
    """Compile and run a small model once on each side (untimed): imports, op registries and
    first-call caches would otherwise land on whichever model is measured first."""
    entry = em.BY_NAME["mlp"]
    for step in (
        lambda: ours_load(ours_compile(em.build(entry)).buffer),
        lambda: et_load(et_compile(em.build(entry)).buffer),
    ):
        with contextlib.suppress(Exception):
            step()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--xnnpack" in argv:  # the fused CPU backend vs ExecuTorch's XNNPACK: _xnnpack_rows.py
        import _xnnpack_rows

        return _xnnpack_rows.main([a for a in argv if a != "--xnnpack"])
    selected, opts, strict = parse_args(argv)
    torch.set_num_threads(opts.threads)
    em.register_dataclasses()
    warm_up()
    rows = []
    for entry in selected:
        print(f"  {entry.name} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            rows.append(measure_model(entry, opts))
        except Exception as exc:  # noqa: BLE001 - one model never stops the others
            row = Row(entry.name, entry.tags)
            row.fail("model", exc)
            rows.append(row)
        print(f"    {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    report(rows, opts)
    from _pte_rows import pte_report  # ExecuTorch .pte rows: benchmarks/_pte_rows.py

    pte_report(selected, em, opts)
    failed = any(line.split()[0] in ("MISS", "ERROR") for line in summary(rows))
    return 1 if strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
