"""Timed steps for the ``exportir`` command: one plain line per step (``name  123.4 ms``), and on
a terminal a transient rich progress bar for a step still running after a second.

When stdout is not a terminal (a pipe, a file, CI logs) nothing but the plain lines is written:
no escape codes, no carriage returns.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

if TYPE_CHECKING:
    from typing import Self  # Python 3.11; annotations only

__all__ = ["ImportClock", "Stages", "format_seconds"]

T = TypeVar("T")

# A step shows a progress bar once it has run this long (seconds).
SHOW_AFTER = 1.0


def format_seconds(seconds: float) -> str:
    """``12.3 ms`` under a second, ``1.42 s`` above."""
    return f"{1000 * seconds:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


class _DelayedBar:
    """A transient rich progress bar for one step, started by a timer after ``SHOW_AFTER``."""

    def __init__(self, out: TextIO, label: str) -> None:
        self._out = out
        self._label = label
        self._lock = threading.Lock()
        self._progress: Any = None
        self._done = False
        self._start = 0.0
        self._timer = threading.Timer(SHOW_AFTER, self._show)
        self._timer.daemon = True

    def __enter__(self) -> Self:
        self._start = time.perf_counter()
        self._timer.start()
        return self

    def _show(self) -> None:
        try:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn
            from rich.text import Text
        except ImportError:  # plain lines only
            return
        started = self._start

        class StepElapsed(ProgressColumn):
            """The step's time so far (the bar itself starts a second late)."""

            def render(self, task: Any) -> Text:
                return Text(format_seconds(time.perf_counter() - started))

        with self._lock:
            if self._done:
                return
            self._progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), StepElapsed(),
                console=Console(file=self._out), transient=True,
            )
            self._progress.add_task(self._label, total=None)
            self._progress.start()

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        with self._lock:
            self._done = True
            if self._progress is not None:
                self._progress.stop()


class Stages:
    """Run steps one after another, each printed with its time when it ends.

    ``live`` (default: whether ``out`` is a terminal) turns the progress bars on.
    """

    def __init__(self, out: TextIO | None = None, live: bool | None = None, width: int = 12):
        self.out = out if out is not None else sys.stdout
        self.live = _isatty(self.out) if live is None else live
        self.width = width
        self.times: dict[str, float] = {}

    def run(self, name: str, fn: Callable[[], T], note: str | Callable[[T], str] = "") -> T:
        """``fn()``, printed as ``name  time  note`` (``note`` may be computed from the result)."""
        start = time.perf_counter()
        if self.live:
            with _DelayedBar(self.out, f"{name}..."):
                result = fn()
        else:
            result = fn()
        seconds = time.perf_counter() - start
        self.times[name] = seconds
        text = note(result) if callable(note) else note
        self.line(name, format_seconds(seconds), text)
        return result

    def line(self, name: str, value: str, note: str = "") -> None:
        tail = f"  {note}" if note else ""
        print(f"{name:<{self.width}} {value:>10}{tail}", file=self.out, flush=True)


def _isatty(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


class ImportClock(importlib.abc.MetaPathFinder):
    """While installed (``with ImportClock("pkg.mod") as clock``), times the import of one module,
    nested imports included, if it happens: ``clock.seconds`` (0.0 when it did not).

    A finder at the front of ``sys.meta_path`` (the import system's own hook) that lets the other
    finders find the module and times its loader; it is removed on exit and the module keeps its
    own loader.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.seconds = 0.0

    def __enter__(self) -> Self:
        sys.meta_path.insert(0, self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _TimedLoader(spec.loader, self)
                return spec
        return None


class _TimedLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, clock: ImportClock) -> None:
        self.loader = loader
        self.clock = clock

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        start = time.perf_counter()
        try:
            self.loader.exec_module(module)
        finally:
            self.clock.seconds += time.perf_counter() - start
