"""Small models and helpers shared by the quantization tests."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

import torch
from quantization.ao_models import ConvNet, conv_net  # noqa: F401  (re-exported)

import exportir
from exportir.quantization import (
    XNNPACKQuantizer,
    convert_pt2e,
    get_symmetric_quantization_config,
    prepare_pt2e,
)

SRC = Path(__file__).resolve().parents[2] / "src"


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
