"""Loading and running a program imports only what running needs: in a fresh process that
loads and runs a portable and a fused program, neither ``torch._dynamo`` nor ``sympy`` (nor
``mpmath``) is imported (they once came in through a dispatch mode's dynamo-disabling wrapper
and through torch's Python meta kernels: ~800 modules, ~0.7 s and ~80 MiB per process), and the
fused backend's executor only once a program delegates to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

from exportir.backends.fused_cpu import FusedCpuPartitioner
from exportir.export import export
from exportir.program.manager import to_edge
from exportir.program.transform_and_lower import to_edge_transform_and_lower

_SRC = str(Path(__file__).resolve().parents[2] / "src")

_CHILD = r"""
import json, sys
import torch
from exportir.runtime import Program
x = torch.zeros(1, 3, 12, 12)
seq = torch.zeros(1, 5, 12)
backend = []  # whether the fused backend was imported after each program
for path, args in ((sys.argv[1], (x,)), (sys.argv[2], (x,)), (sys.argv[3], (seq,))):
    with open(path, "rb") as f:
        Program.load(f.read()).method("forward")(*args)
    backend.append("exportir.runtime.backends.fused_cpu" in sys.modules)
heavy = sorted(m for m in sys.modules
               if m.split(".")[0] in ("sympy", "mpmath") or m.startswith("torch._dynamo"))
print(json.dumps([heavy, backend]))
"""


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)
        self.head = nn.Linear(8 * 10 * 10, 4)

    def forward(self, x):
        y = nn.functional.relu6(self.bn(self.conv(x)))
        return torch.softmax(self.head(y.flatten(1)) * 0.5 + 1.0, -1)


class _Lstm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(12, 8, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0]


def test_a_fresh_process_running_programs_imports_no_dynamo_and_no_sympy(tmp_path):
    torch.manual_seed(0)
    net, x = _Net().eval(), torch.randn(1, 3, 12, 12)
    lstm, seq = _Lstm().eval(), torch.randn(1, 5, 12)
    fused = [FusedCpuPartitioner()]
    files = {
        "portable.xpt": to_edge(export(net, (x,))).to_program().buffer,
        "fused.xpt": to_edge_transform_and_lower(export(net, (x,)), partitioner=fused)
        .to_program()
        .buffer,
        "lstm.xpt": to_edge_transform_and_lower(export(lstm, (seq,)), partitioner=fused)
        .to_program()
        .buffer,
    }
    paths = []
    for name, data in files.items():
        (tmp_path / name).write_bytes(bytes(data))
        paths.append(str(tmp_path / name))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_SRC, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, *paths], capture_output=True, text=True, env=env,
        timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    heavy, backend = json.loads(proc.stdout.strip().splitlines()[-1])
    assert heavy == []
    # the fused backend's executor is imported by the first program delegating to it
    assert backend == [False, True, True]
