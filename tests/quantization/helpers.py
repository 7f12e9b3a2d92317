"""Small models and helpers shared by the quantization tests."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

import torch

import exportir
from exportir.quantization import (
    XNNPACKQuantizer,
    convert_pt2e,
    get_symmetric_quantization_config,
    prepare_pt2e,
)

SRC = Path(__file__).resolve().parents[2] / "src"


class ConvNet(torch.nn.Module):
    """conv-bn-relu, max pool, add, linear-relu, linear: every XNNPACK pattern we annotate."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.pool = torch.nn.MaxPool2d(2)
        self.fc1 = torch.nn.Linear(8 * 4 * 4, 32)
        self.fc2 = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.relu(self.conv2(y) + y)
        y = self.pool(y).flatten(1)
        return self.fc2(torch.relu(self.fc1(y)))


def conv_net() -> ConvNet:
    torch.manual_seed(0)
    m = ConvNet().eval()
    with torch.no_grad():  # non-trivial batch-norm statistics
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
        m.bn.weight.uniform_(0.5, 1.5)
    return m


def quantize(model: torch.nn.Module, example: tuple, calibration: list, *, dynamic: bool = False,
             per_channel: bool = True) -> torch.nn.Module:
    """The PT2E flow on ``model``: capture, prepare, calibrate, convert."""
    gm = exportir.export(model, example).module()
    config = get_symmetric_quantization_config(is_per_channel=per_channel, is_dynamic=dynamic)
    prepared = prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
    for batch in calibration:
        prepared(*batch)
    return convert_pt2e(prepared)


def op_counts(gm: torch.nn.Module) -> collections.Counter:
    """call_function targets of a graph as ``ns.op.overload`` names, counted."""
    found = collections.Counter()
    for node in gm.graph.nodes:
        if node.op == "call_function" and hasattr(node.target, "_schema"):
            found[str(getattr(node.target, "aten_op", node.target))] += 1
    return found


def run_fresh(code: str, python: str = sys.executable, timeout: int = 300) -> str:
    """Run ``code`` in a fresh interpreter with our src on the path; its stdout."""
    env = dict(os.environ, PYTHONPATH=str(SRC))
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
