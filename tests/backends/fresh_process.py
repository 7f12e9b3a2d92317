"""Run program files in fresh processes: processes that have done nothing but import
``exportir.runtime``, load one program file and run it.

torch sets up parts of its Python bindings lazily, on the first call that needs them, and a
test process has run eager torch long before; only a fresh process shows what a deployed
program meets. :func:`run_fresh` starts one helper process that imports ``exportir.runtime``
and forks one child per job: the child loads the job's file, rebuilds its inputs from raw bytes
(``torch.frombuffer``), runs the method and writes its outputs' bytes back, so every program is
the first thing its process runs (after importing the libraries of any custom ops it calls). Outputs come back as tensors (or ``Failure`` with the error).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

_SRC = str(Path(__file__).resolve().parents[2] / "src")

_CHILD = r"""
import json, os, sys
import torch
from exportir.runtime import Program, default_kernel_registry

def tensor(spec):
    dtype, shape = getattr(torch, spec["dtype"]), spec["shape"]
    with open(spec["file"], "rb") as f:
        data = bytearray(f.read())
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(data, dtype=dtype).reshape(shape)

def leaves(x):
    if isinstance(x, (list, tuple)):
        return [leaf for v in x for leaf in leaves(v)]
    if isinstance(x, dict):
        return [leaf for v in x.values() for leaf in leaves(v)]
    return [x]

def run(job):
    for module in job["preload"]:  # libraries defining custom ops the program calls
        __import__(module)
    kernels = default_kernel_registry()
    for name in job["custom_ops"]:  # the custom ops registered on purpose
        namespace, op = name.split("::")
        kernels.register_op(getattr(getattr(torch.ops, namespace), op))
    method = Program.load(job["program"], kernels=kernels).method(job.get("method", "forward"))
    args = [tensor(s) for s in job["args"]]
    kwargs = {k: tensor(s) for k, s in job["kwargs"].items()}
    outs, offset = [], 0
    with open(job["out"], "wb") as f:
        for value in leaves(method(*args, **kwargs)):
            if not isinstance(value, torch.Tensor):
                outs.append({"value": value})
                continue
            raw = value.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            f.write(raw)
            outs.append({"dtype": str(value.dtype).removeprefix("torch."),
                         "shape": list(value.shape), "offset": offset, "nbytes": len(raw)})
            offset += len(raw)
    return outs

def child(job):
    try:
        return run(job)
    except Exception as e:
        return f"{type(e).__name__}: {e}"

results = []
for job in json.load(open(sys.argv[1])):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        with os.fdopen(write, "w") as f:
            f.write(json.dumps(child(job)))
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        text = f.read()
    os.waitpid(pid, 0)
    results.append(json.loads(text) if text else "the child process died")
print(json.dumps(results))
"""


@dataclass(frozen=True)
class Job:
    """Run ``method`` of the program file ``program`` on ``args`` / ``kwargs`` (tensors),
    after importing the modules in ``preload`` (libraries defining custom ops the program
    calls: the runtime runs those through their ``torch.library`` registration) and
    registering the ops ``custom_ops`` names (``ns::op``) with the runtime, on purpose."""

    program: Path
    args: tuple[torch.Tensor, ...] = ()
    kwargs: dict[str, torch.Tensor] = field(default_factory=dict)
    method: str = "forward"
    preload: tuple[str, ...] = ()
    custom_ops: tuple[str, ...] = ()


@dataclass(frozen=True)
class Failure:
    """What a fresh process raised."""

    error: str


def _write_tensor(t: torch.Tensor, path: Path) -> dict[str, Any]:
    flat = t.detach().contiguous().reshape(-1)
    path.write_bytes(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "file": str(path)}


def _read_outputs(manifest: list[dict[str, Any]], path: Path) -> list[Any]:
    data = path.read_bytes()
    outs: list[Any] = []
    for entry in manifest:
        if "value" in entry:
            outs.append(entry["value"])
            continue
        dtype = getattr(torch, entry["dtype"])
        raw = bytearray(data[entry["offset"] : entry["offset"] + entry["nbytes"]])
        t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        outs.append(t.reshape(entry["shape"]))
    return outs


def run_fresh(jobs: list[Job], workdir: Path, timeout: float = 900) -> list[list[Any] | Failure]:
    """Run every job in its own fresh process (module docstring); results in job order."""
    specs = []
    for i, job in enumerate(jobs):
        specs.append({
            "program": str(job.program),
            "method": job.method,
            "preload": list(job.preload),
            "custom_ops": list(job.custom_ops),
            "args": [_write_tensor(t, workdir / f"in{i}_{k}.bin") for k, t in enumerate(job.args)],
            "kwargs": {
                name: _write_tensor(t, workdir / f"in{i}_{name}.bin")
                for name, t in job.kwargs.items()
            },
            "out": str(workdir / f"out{i}.bin"),
        })  # fmt: skip
    manifest = workdir / "jobs.json"
    manifest.write_text(json.dumps(specs))
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(manifest)],
        capture_output=True, text=True, timeout=timeout, check=False,
        env={**os.environ, "PYTHONPATH": _SRC},
    )  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"the fresh-process helper failed:\n{done.stderr[-3000:]}")
    results = json.loads(done.stdout.strip().splitlines()[-1])
    return [
        Failure(r) if isinstance(r, str) else _read_outputs(r, Path(spec["out"]))
        for r, spec in zip(results, specs)
    ]
