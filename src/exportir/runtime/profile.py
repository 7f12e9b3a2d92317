"""Per-instruction and per-delegate-op profiles of a method: ``method.profile(*inputs)``.

A profile runs the method on an instrumented execution state of its own
(:mod:`exportir.runtime.instrument`): each instruction's compiled step or bare call is timed,
and inside a delegate whose backend can be instrumented (the fused CPU backend) each of the
backend's own ops. The normal run loop is not touched, so an unprofiled method pays nothing.
The first ``warmup`` runs (the first one is the checked run that verifies the plan) are not
counted; the ``repeat`` runs after them are the trusted runs ``method(...)`` makes.

:class:`Profile` holds the measurements; it prints as a table (grouped by instruction, op or
``nn.Module``; rich on a terminal, plain text otherwise) and writes Chrome trace JSON
(``chrome://tracing``, https://ui.perfetto.dev).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from exportir.format import schema
from exportir.runtime.instrument import (
    NodeInfo,
    Session,
    delegate_ops,
    instruction_label,
    instruction_node,
    instrumented_state,
    node_table,
)

__all__ = ["GROUPINGS", "Profile", "ProfileRow", "profile_method"]

GROUPINGS = ("instruction", "op", "module", "module_tree")
"""How :meth:`Profile.rows` groups measurements."""

_clock = time.perf_counter_ns


class _ProfileSession(Session):
    """Records ``(pc, start, end)`` per instruction call and ``(pc, delegate, op, start, end)``
    per op inside an instrumented delegate (nanoseconds, ``perf_counter_ns``)."""

    def __init__(self) -> None:
        self.events: list[tuple[int, int, int]] = []
        self.op_events: list[tuple[int, int, int, int, int]] = []

    def wrap_call(self, pc: int, call: Callable[[], object]) -> Callable[[], object]:
        events, session = self.events, self

        def timed() -> None:
            session.pc = pc
            start = _clock()
            call()
            events.append((pc, start, _clock()))

        return timed

    def wrap_step(self, pc: int, step: Callable[[list[Any]], int]) -> Callable[[list[Any]], int]:
        events, session = self.events, self

        def timed(values: list[Any]) -> int:
            session.pc = pc
            start = _clock()
            nxt = step(values)
            events.append((pc, start, _clock()))
            return nxt

        return timed

    def delegate_hook(self, delegate: int) -> Callable[[int, tuple[Any, ...]], None]:
        op_events, session = self.op_events, self
        last = [0]

        def hook(i: int, outs: tuple[Any, ...]) -> None:
            now = _clock()
            if i >= 0:
                op_events.append((session.pc, delegate, i, last[0], now))
            last[0] = _clock()  # the hook's own bookkeeping is nobody's op time

        return hook

    def clear(self) -> None:
        self.events.clear()
        self.op_events.clear()


@dataclass(frozen=True, slots=True)
class ProfileRow:
    """One line of a profile: what ran (an instruction, an op inside a delegate, or a group of
    them), how often and for how long (nanoseconds over all counted runs)."""

    key: str
    op: str
    calls: int
    total_ns: int
    node: str = ""
    source: str = ""
    module: str = ""
    module_type: str = ""
    pc: int | None = None
    delegate_op: int | None = None
    min_ns: int | None = None  # the shortest call (instruction and delegate op rows)

    @property
    def mean_ns(self) -> float:
        return self.total_ns / self.calls if self.calls else 0.0


@dataclass(frozen=True, slots=True)
class _Span:
    """A timed interval of the trace: an instruction call or an op inside a delegate."""

    name: str
    category: str
    start: int
    end: int
    args: dict[str, Any]


@dataclass(slots=True)
class Profile:
    """The measurements of :func:`profile_method`: ``rows()`` (grouped and sorted),
    ``table()`` / ``print()`` and ``chrome_trace()`` / ``save_chrome_trace(path)``."""

    method: str
    repeat: int
    runs: list[tuple[int, int]]
    leaves: list[ProfileRow]
    spans: list[_Span] = field(default_factory=list)

    @property
    def total_ns(self) -> int:
        """Time of the counted runs, end to end (input binding and output copies included)."""
        return sum(end - start for start, end in self.runs)

    @property
    def mean_run_ns(self) -> float:
        return self.total_ns / len(self.runs) if self.runs else 0.0

    def percent(self, row: ProfileRow) -> float:
        total = self.total_ns
        return 100.0 * row.total_ns / total if total else 0.0

    def rows(self, by: str = "instruction", top: int | None = None) -> list[ProfileRow]:
        """Rows sorted by total time, the costliest first: one per instruction or delegate op
        (``by="instruction"``), per op name (``"op"``) or per innermost ``nn.Module`` path
        (``"module"``), or per module with everything its submodules ran
        (``"module_tree"``: ``block`` holds ``block.lin``; in tree order, indented, ``top``
        keeping the costliest modules); the runtime's own time (binding inputs, copying
        outputs) is a row too. ``top`` keeps the first ``top`` rows."""
        if by not in GROUPINGS:
            raise ValueError(f"profile rows are grouped by one of {GROUPINGS}; got {by!r}")
        if top is not None and (not isinstance(top, int) or top < 1):
            raise ValueError(f"top must be a positive integer; got {top!r}")
        if by == "module_tree":
            return _module_tree(self.leaves, top)
        rows = self.leaves if by == "instruction" else _grouped(self.leaves, by)
        rows = sorted(rows, key=lambda r: (-r.total_ns, r.key))
        return rows[:top] if top is not None else rows

    # -- text ------------------------------------------------------------------------------------

    def _header(self) -> str:
        return (f"profile of method {self.method!r}: {len(self.runs)} runs, "
                f"{self.mean_run_ns / 1000:.1f} us per run")

    def table(self, by: str = "instruction", top: int | None = 20) -> str:
        """The profile as plain text (see :meth:`rows`)."""
        rows = self.rows(by, top)
        columns = _columns(by)
        cells = [[title for title, _ in columns]]
        cells += [[fmt(self, row) for _, fmt in columns] for row in rows]
        widths = [max(len(r[k]) for r in cells) for k in range(len(columns))]
        lines = [self._header()]
        numeric = [title in _NUMERIC for title, _ in columns]
        for r in cells:
            lines.append("  ".join(
                c.rjust(w) if numeric[k] else c.ljust(w)
                for k, (c, w) in enumerate(zip(r, widths))
            ).rstrip())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def print(self, by: str = "instruction", top: int | None = 20, file: Any = None) -> None:
        """Print the table: with rich on a terminal, as :meth:`table` text otherwise."""
        out = sys.stdout if file is None else file
        if not (hasattr(out, "isatty") and out.isatty()):
            print(self.table(by, top), file=out)
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=self._header(), title_justify="left")
        columns = _columns(by)
        for title, _ in columns:
            table.add_column(title, justify="right" if title in _NUMERIC else "left")
        for row in self.rows(by, top):
            table.add_row(*(fmt(self, row) for _, fmt in columns))
        Console(file=out).print(table)

    # -- Chrome trace ----------------------------------------------------------------------------

    def chrome_trace(self) -> dict[str, Any]:
        """The counted runs as Chrome trace events (``X`` complete events in microseconds,
        nested on one thread: run > instruction > delegate op)."""
        origin = self.runs[0][0] if self.runs else 0

        def us(t: int) -> float:
            return (t - origin) / 1000.0

        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": 1, "tid": 1,
             "args": {"name": f"exportir method {self.method}"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "run"}},
        ]
        for k, (start, end) in enumerate(self.runs):
            events.append({"name": f"run {k}", "cat": "run", "ph": "X", "pid": 1, "tid": 1,
                           "ts": us(start), "dur": (end - start) / 1000.0, "args": {}})
        for s in self.spans:
            events.append({"name": s.name, "cat": s.category, "ph": "X", "pid": 1, "tid": 1,
                           "ts": us(s.start), "dur": (s.end - s.start) / 1000.0, "args": s.args})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def save_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.chrome_trace(), f)


_NUMERIC = frozenset({"calls", "total ms", "mean us", "min us", "%"})  # right-aligned


def _short_source(row: ProfileRow) -> str:
    """``file:line`` with the file's last two path components (rows keep the whole path)."""
    parts = row.source.replace("\\", "/").split("/")
    return "/".join(parts[-2:]) if len(parts) > 2 else row.source


def _short_module(row: ProfileRow) -> str:
    if not row.module and not row.module_type:
        return ""
    kind = row.module_type.rsplit(".", 1)[-1]
    return f"{row.module or '<root>'} ({kind})" if kind else row.module


def _columns(by: str) -> list[tuple[str, Callable[[Profile, ProfileRow], str]]]:
    first = {"instruction": "instruction", "op": "op", "module": "module",
             "module_tree": "module"}[by]
    columns: list[tuple[str, Callable[[Profile, ProfileRow], str]]] = [
        (first, lambda p, r: r.key),
        ("calls", lambda p, r: str(r.calls)),
        ("total ms", lambda p, r: f"{r.total_ns / 1e6:.3f}"),
        ("mean us", lambda p, r: f"{r.mean_ns / 1000:.2f}"),
        ("%", lambda p, r: f"{p.percent(r):.1f}"),
    ]
    if by == "instruction":
        columns.insert(4, ("min us", lambda p, r: "" if r.min_ns is None
                           else f"{r.min_ns / 1000:.2f}"))
        columns += [("node", lambda p, r: r.node), ("source", lambda p, r: _short_source(r)),
                    ("module", lambda p, r: _short_module(r))]
    elif by in ("module", "module_tree"):
        columns += [("type", lambda p, r: r.module_type.rsplit(".", 1)[-1])]
    return columns


def _module_tree(leaves: Sequence[ProfileRow], top: int | None) -> list[ProfileRow]:
    """Per module path, the time of its own ops and of its submodules' (``<root>``: every op
    a module ran), in depth-first order; rows outside any module (the runtime's time, a
    delegate's own) after them."""
    totals: dict[tuple[str, ...], list[int]] = defaultdict(lambda: [0, 0])
    types: dict[tuple[str, ...], str] = {}
    others = []
    for row in leaves:
        if not row.module and not row.module_type:
            others.append(row)
            continue
        path = tuple(row.module.split(".")) if row.module else ()
        types.setdefault(path, row.module_type)
        for depth in range(len(path) + 1):
            totals[path[:depth]][0] += row.calls
            totals[path[:depth]][1] += row.total_ns
    keep = sorted(totals, key=lambda p: -totals[p][1])[:top] if top is not None else totals
    rows = []
    for path in sorted(keep):
        label = "  " * len(path) + (path[-1] if path else "<root>")
        calls, total = totals[path]
        rows.append(ProfileRow(label, "", calls, total, module=".".join(path),
                               module_type=types.get(path, "")))
    return rows + sorted(others, key=lambda r: -r.total_ns)


def _grouped(leaves: Sequence[ProfileRow], by: str) -> list[ProfileRow]:
    groups: dict[str, list[ProfileRow]] = defaultdict(list)
    for row in leaves:
        key = row.op if by == "op" else (row.module or ("<root>" if row.module_type else ""))
        groups[key or row.op].append(row)
    out = []
    for key, rows in groups.items():
        first = rows[0]
        calls = sum(r.calls for r in rows)
        out.append(ProfileRow(
            key, first.op if by == "op" else "", calls, sum(r.total_ns for r in rows),
            module=first.module if by == "module" else "",
            module_type=first.module_type if by == "module" else "",
        ))
    return out


# ------------------------------------------------------------------------------ measuring


def _check_count(name: str, value: Any, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")
    return value


def profile_method(
    method: Any,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    repeat: int = 10,
    warmup: int = 1,
) -> Profile:
    """Run ``method`` ``warmup + repeat`` times on its own instrumented execution state and
    return the :class:`Profile` of the last ``repeat`` runs. A method with state (mutable
    buffers) is profiled on a state of its own, starting from the initial buffers."""
    repeat = _check_count("repeat", repeat, 1)
    warmup = _check_count("warmup", warmup, 0)
    session = _ProfileSession()
    state = instrumented_state(method, session)
    flat = state._flatten_inputs(tuple(args), dict(kwargs or {}))
    for _ in range(warmup):
        state.execute(flat)
    session.clear()
    runs = []
    for _ in range(repeat):
        start = _clock()
        state.execute(flat)
        runs.append((start, _clock()))
    return _build(method, session, runs, repeat)


def _counter() -> list[int]:
    return [0, 0, 1 << 62]  # calls, total, shortest call


def _count(counter: list[int], duration: int) -> None:
    counter[0] += 1
    counter[1] += duration
    counter[2] = min(counter[2], duration)


class _Names:
    """What the debug tables say about each instruction and each op inside a delegate."""

    def __init__(self, method: Any) -> None:
        meta: schema.Method = method.meta
        self.method = method
        self.nodes = node_table(meta)
        self.labels = [instruction_label(method._program, meta, ins) for ins in meta.instructions]
        self.infos = [instruction_node(meta, ins, self.nodes) for ins in meta.instructions]
        self._ops: dict[int, Any] = {}

    def op(self, delegate: int, i: int) -> tuple[str, tuple[str, ...], NodeInfo]:
        """Op ``i`` of delegate ``delegate``: its name, its nodes, its first known node."""
        if delegate not in self._ops:
            self._ops[delegate] = delegate_ops(self.method, delegate) or ()
        table = self._ops[delegate]
        name, names = table[i] if i < len(table) else (f"op {i}", ())
        info = next((self.nodes[(delegate, n)] for n in names if (delegate, n) in self.nodes),
                    None)
        return name, names, info or NodeInfo(names[0] if names else "")


def _spans(session: _ProfileSession, names: _Names) -> list[_Span]:
    """Every timed call as a trace span, in time order (an enclosing span first)."""
    spans = []
    for pc, start, end in session.events:
        info = names.infos[pc]
        spans.append(_Span(names.labels[pc], "instruction", start, end,
                           {"pc": pc, "node": info.name, "source": info.source,
                            "module": info.module}))
    for pc, delegate, i, start, end in session.op_events:
        name, nodes, info = names.op(delegate, i)
        spans.append(_Span(name, "delegate_op", start, end,
                           {"pc": pc, "delegate": delegate, "op_index": i,
                            "nodes": ",".join(nodes), "source": info.source,
                            "module": info.module}))
    spans.sort(key=lambda s: (s.start, -s.end))
    return spans


def _leaves(session: _ProfileSession, names: _Names, runs: list[tuple[int, int]]
            ) -> list[ProfileRow]:
    """One row per instruction and per delegate op (a delegate's row: its time outside its
    ops), and the runtime's own time: together, the whole of the counted runs."""
    totals: dict[int, list[int]] = defaultdict(_counter)
    for pc, start, end in session.events:
        _count(totals[pc], end - start)
    op_totals: dict[tuple[int, int, int], list[int]] = defaultdict(_counter)
    for pc, delegate, i, start, end in session.op_events:
        _count(op_totals[(pc, delegate, i)], end - start)
    leaves: list[ProfileRow] = []
    inside: dict[int, int] = defaultdict(int)
    for (pc, delegate, i), (calls, total, least) in sorted(op_totals.items()):
        name, nodes, info = names.op(delegate, i)
        inside[pc] += total
        leaves.append(ProfileRow(
            f"{pc}.{i} {name}", name, calls, total, ",".join(nodes), info.source, info.module,
            info.module_type, pc, i, least,
        ))
    for pc, (calls, total, least) in sorted(totals.items()):
        info, op, delegated = names.infos[pc], names.labels[pc], pc in inside
        if delegated:  # the delegate's own work around its ops: no module's
            op = f"{op} (outside its ops)"
            info = NodeInfo(info.name, info.target, info.source)
        leaves.append(ProfileRow(
            f"{pc} {op}", op, calls, max(total - inside.get(pc, 0), 0), info.name, info.source,
            info.module, info.module_type, pc, None, None if delegated else least,
        ))
    measured = sum(end - start for _, start, end in session.events)
    overall = sum(end - start for start, end in runs)
    leaves.append(ProfileRow("(runtime: inputs, outputs)", "(runtime)", len(runs),
                             max(overall - measured, 0)))
    return leaves


def _build(
    method: Any, session: _ProfileSession, runs: list[tuple[int, int]], repeat: int
) -> Profile:
    names = _Names(method)
    return Profile(method.meta.name, repeat, runs, _leaves(session, names, runs),
                   _spans(session, names))
