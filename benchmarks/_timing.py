"""Interleaved best-of-N timing for comparing implementations on a noisy, shared machine.

A *workload* is prepared once per side (untimed), then each repetition calls ``setup``
(untimed, e.g. build a fresh graph that the timed call mutates) and times ``run`` alone.
Sides are interleaved round by round, alternating which side goes first, and each side keeps
its best time. Any exception (including a per-call timeout) ends that side's measurement and is
reported as an error instead of aborting the whole benchmark run.
"""

from __future__ import annotations

import gc
import signal
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True, slots=True)
class Workload:
    """One timed operation: ``run(setup())`` is timed without ``setup``; ``check`` validates
    the first result (outside the timed region) and raises ``WrongResult`` if it is wrong."""

    run: Callable[[object], object]
    setup: Callable[[], object] = lambda: None
    check: Callable[[object, object], None] | None = None


@dataclass(frozen=True, slots=True)
class Measurement:
    """Best wall time in seconds over ``runs`` repetitions, or the error that stopped it."""

    best: float | None
    runs: int
    error: str | None = None
    where: str | None = None


class WrongResult(Exception):
    """A workload produced a result that fails its check; its time would be meaningless."""


class CallTimeout(Exception):
    """A single setup or timed call exceeded the per-call timeout."""


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise ``CallTimeout`` inside the block after ``seconds`` (SIGALRM; main thread only).
    The previous handler and timer are restored in ``finally``."""

    def _expire(signum: int, frame: object) -> None:
        raise CallTimeout(f"single call exceeded the {seconds:g}s timeout")

    previous = signal.signal(signal.SIGALRM, _expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


Clock = Callable[[], float]

CLOCKS: dict[str, Clock] = {
    # CPU time of this process: not inflated while other jobs hold the CPU, which on a shared,
    # oversubscribed machine is most of the noise. The workloads are single-threaded.
    "cpu": time.process_time,
    "wall": time.perf_counter,
}


def _time_once(workload: Workload, timeout: float, clock: Clock) -> tuple[float, object, object]:
    """Return (seconds, setup value, result). GC is disabled while timing, as in ``timeit``."""
    with _deadline(timeout):
        arg = workload.setup()
    gc.collect()
    gc.disable()
    try:
        with _deadline(timeout):
            start = clock()
            result = workload.run(arg)
            elapsed = clock() - start
    finally:
        gc.enable()
    return elapsed, arg, result


def _describe(exc: BaseException) -> tuple[str, str | None]:
    """Short one-line message plus the innermost frame outside this file (file:line)."""
    lines = str(exc).strip().splitlines()
    message = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    where = None
    if frames:
        last = frames[-1]
        where = f"{_short_path(last.filename)}:{last.lineno} in {last.name}"
    return message, where


def _short_path(filename: str) -> str:
    parts = Path(filename).parts
    for anchor in ("exportir", "torch", "benchmarks"):
        if anchor in parts:
            return str(Path(*parts[parts.index(anchor) :]))
    return filename


@dataclass(slots=True)
class _Side:
    name: str
    workload: Workload | None = None
    best: float | None = None
    runs: int = 0
    spent: float = 0.0
    error: str | None = None
    where: str | None = None

    @property
    def active(self) -> bool:
        return self.workload is not None and self.error is None

    def fail(self, exc: BaseException) -> None:
        self.error, self.where = _describe(exc)

    def result(self) -> Measurement:
        if self.error is not None:
            return Measurement(None, self.runs, self.error, self.where)
        return Measurement(self.best, self.runs)


def _prepare(name: str, make: Callable[[], Workload], timeout: float) -> _Side:
    side = _Side(name)
    try:
        with _deadline(timeout):
            side.workload = make()
    except Exception as exc:  # noqa: BLE001 - any failure is reported, never fatal
        side.fail(exc)
    return side


def _repeat_once(side: _Side, timeout: float, clock: Clock) -> None:
    started = time.perf_counter()
    try:
        elapsed, arg, result = _time_once(side.workload, timeout, clock)
        if side.runs == 0 and side.workload.check is not None:
            side.workload.check(arg, result)
    except Exception as exc:  # noqa: BLE001 - any failure is reported, never fatal
        side.fail(exc)
        return
    finally:
        side.spent += time.perf_counter() - started
    side.runs += 1
    side.best = elapsed if side.best is None else min(side.best, elapsed)


def compare(
    makers: Mapping[str, Callable[[], Workload]],
    *,
    rounds: int,
    budget: float,
    timeout: float,
    clock: Clock = time.process_time,
) -> dict[str, Measurement]:
    """Time every side ``rounds`` times, interleaved, keeping each side's best.

    A side stops early once it has run at least once and spent more than ``budget`` seconds
    (setup included, wall time), so a slow side cannot stretch the whole run; it never stops
    another side. ``clock`` measures the timed call (see ``CLOCKS``).
    """
    sides = [_prepare(name, make, timeout) for name, make in makers.items()]
    for round_index in range(rounds):
        order = sides if round_index % 2 == 0 else sides[::-1]
        for side in order:
            if side.active and not (side.runs and side.spent > budget):
                _repeat_once(side, timeout, clock)
    return {side.name: side.result() for side in sides}


def select_only(parser: Any, only: list[str], items: list[Any], kind: str) -> list[Any]:
    """The ``items`` (objects with ``.name``) chosen by repeated/comma-separated ``--only`` values.

    No ``--only`` selects everything; an unknown name is a parser error listing the valid ones.
    """
    names = [item.name for item in items]
    wanted = [n for value in only for n in value.split(",") if n]
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        parser.error(f"unknown {kind}(s) {', '.join(unknown)}; choose from {', '.join(names)}")
    return [item for item in items if not wanted or item.name in wanted]


def looped(call: Callable[[], Any], n: int) -> Callable[[object], Any]:
    """A workload's ``run``: ``call()`` ``n`` times without autograd, returning the last result
    (for timing calls too short to time one at a time)."""

    def run(_: object) -> Any:
        with torch.no_grad():
            for _ in range(n):
                out = call()
        return out

    return run
