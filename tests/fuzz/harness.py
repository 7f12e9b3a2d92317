"""Run fuzz cases in child processes with resource limits, and report what they found.

:func:`run_cases` starts ``child.py`` under an address-space and CPU-time limit and reads one
outcome per case. A child that dies mid-case (a crash: a signal, an abort) or makes no progress
for too long (a hang) is charged to the case it was running, and a new child goes on with the
next one. :func:`findings` keeps the outcomes that are not fine and copies their files where a
developer can rerun them (the message prints the command).
"""

from __future__ import annotations

import collections
import json
import os
import random
import resource
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CHILD = Path(__file__).resolve().with_name("child.py")
SRC = Path(__file__).resolve().parents[2] / "src"
FINE = frozenset({"refused", "run-error", "ran", "ran-unchecked"})

ADDRESS_SPACE = 4 << 30  # bytes of virtual memory a child may map (torch itself needs ~1 GiB)
CPU_SECONDS = 900  # per child process
STALL_SECONDS = 60  # without a new line from the child: a hang


@dataclass(frozen=True)
class Result:
    case: int
    outcome: str
    detail: str = ""


def _limit() -> None:  # runs in the child before exec
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _start(kind: str, manifest: Path, start: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, str(CHILD), kind, str(manifest), str(start)],
            stdout=subprocess.PIPE, stderr=err, env=env, preexec_fn=_limit,  # noqa: PLW1509
        )


def _read(proc: subprocess.Popen, results: dict[int, Result]) -> tuple[int | None, bool]:
    """Read the child's lines into ``results``; returns (case it was running when it stopped,
    whether it stalled)."""
    current = None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    buffered = b""
    deadline = time.monotonic() + STALL_SECONDS
    while True:
        if not selector.select(timeout=max(deadline - time.monotonic(), 0)):
            return current, True
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            return current, False
        deadline = time.monotonic() + STALL_SECONDS
        buffered += chunk
        *lines, buffered = buffered.split(b"\n")
        for line in lines:
            message = json.loads(line)
            if "start" in message:
                current = message["start"]
            else:
                results[message["case"]] = Result(message["case"], message["outcome"],
                                                  message.get("detail", ""))
                current = None


def run_cases(kind: str, files: list[Path], workdir: Path) -> list[Result]:
    """One :class:`Result` per case file, in order."""
    manifest = workdir / f"{kind}-cases.json"
    manifest.write_text(json.dumps([str(f) for f in files]))
    log = workdir / f"{kind}-child.log"
    results: dict[int, Result] = {}
    start = 0
    while start < len(files):
        proc = _start(kind, manifest, start, log)
        current, stalled = _read(proc, results)
        if stalled:
            proc.kill()
        code = proc.wait()
        proc.stdout.close()
        if current is None:
            if len(results) < len(files) and not stalled:
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the fuzz child exited ({code}) between cases:\n{tail}")
            break
        what = "hang" if stalled else "crash"
        results[current] = Result(current, what, f"child exit status {code}; its stderr ends "
                                                 f"with:\n{log.read_text(errors='replace')[-1500:]}")
        start = current + 1
    return [results[i] for i in sorted(results)]


def summary(results: list[Result]) -> str:
    counts = collections.Counter(r.outcome for r in results)
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))


def findings(kind: str, results: list[Result], files: list[Path], notes: list[str]) -> list[str]:
    """A message per outcome that is not fine; each case file is kept in a directory that
    outlives the test, with the command that reruns it."""
    bad = [r for r in results if r.outcome not in FINE]
    if not bad:
        return []
    keep = Path(tempfile.mkdtemp(prefix=f"exportir-fuzz-{kind}-"))
    messages = []
    for r in bad:
        kept = keep / files[r.case].name
        shutil.copy(files[r.case], kept)
        messages.append(
            f"case {r.case} ({notes[r.case]}): {r.outcome}\n{r.detail}\n"
            f"  rerun: PYTHONPATH={SRC} {sys.executable} {CHILD} {kind} {kept}"
        )
    return messages


def write_cases(
    workdir: Path,
    seeds: dict[str, bytes],
    mutate: Callable[[bytes, random.Random], tuple[bytes, str]],
    cases: int,
    rng: random.Random,
    suffix: str,
) -> tuple[list[Path], list[str]]:
    """The files of one fuzz run and a note for each: every seed unmutated first (sorted by
    name: the oracle must accept them), then ``cases`` mutants of the seeds in turn."""
    names = sorted(seeds)
    files, notes = [], []
    for name in names:
        path = workdir / f"seed-{name}{suffix}"
        path.write_bytes(seeds[name])
        files.append(path)
        notes.append(f"{name}: unmutated")
    for i in range(cases):
        name = names[i % len(names)]
        data, note = mutate(seeds[name], rng)
        path = workdir / f"case{i:05d}-{name}{suffix}"
        path.write_bytes(data)
        files.append(path)
        notes.append(f"{name}: {note}")
    return files, notes
