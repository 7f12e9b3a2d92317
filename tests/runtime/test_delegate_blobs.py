"""Delegate blobs are validated by their backend before any kernel or weight packing sees them;
a blob the backend refuses fails Program.load with a DelegateInitError (a ProgramLoadError).

The crash reproductions run in a child process: a regression must fail the test, not kill the
test run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from runtime_programs import MethodBuilder, program_of

from exportir.program import schema, serialize
from exportir.runtime import DelegateInitError, Program, ProgramLoadError
from exportir.runtime.backends import fused_cpu
from exportir.runtime.backends.fused_cpu import format as blob_format

SRC = Path(__file__).resolve().parents[2] / "src"
ONEDNN = "mkldnn._convolution_pointwise.default" in fused_cpu.OPS  # packs weights at load


def fused_blob(ops: list, weight: torch.Tensor) -> bytes:
    """A fused_cpu blob: slot 0 the input, slot 1 ``weight`` (a constant), slot 2 the output."""
    data = weight.contiguous().numpy().tobytes()
    header = json.dumps({
        "values": 3, "inputs": [0], "outputs": [2],
        "constants": [[1, "float32", list(weight.shape), 0, len(data)]],
        "ops": ops, "inplace": [0] * len(ops),
    }).encode()
    prelude = blob_format._PRELUDE.pack(blob_format.MAGIC, blob_format.FORMAT_VERSION, len(header))
    pad = -(len(prelude) + len(header)) % blob_format.ALIGNMENT
    return prelude + header + bytes(pad) + data


def delegated_file(blob: bytes, in_shape: tuple, out_shape: tuple) -> bytes:
    """A program file whose forward is one call of ``blob`` (backend FusedCpuBackend)."""
    b = MethodBuilder()
    x = b.input("x", in_shape)
    out = b.planned(out_shape)
    b.instruction(lambda d: schema.DelegateCall(0, (x,), (out,), d), "conv", "model.py:3")
    b.outputs.append(out)
    delegate = schema.Delegate(blob_format.BACKEND_ID, blob)
    return serialize.serialize_program(program_of(b, delegates=(delegate,)))


def _pointwise_conv(stride: list[int]) -> list:
    return ["mkldnn._convolution_pointwise.default",
            [{"v": 0}, {"v": 1}, None, [0, 0], stride, [1, 1], 1, "none", [], None], {}, 2, "conv"]


def run_child(code: str, data: bytes, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "program.xpt"
    path.write_bytes(data)
    return subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(SRC), "PATH": ""}, check=False,
    )


_LOAD = """
import sys
from exportir.runtime import Program, ProgramLoadError
try:
    Program.load(sys.argv[1])
except ProgramLoadError as e:
    print(type(e).__name__, "|", e)
"""


@pytest.mark.skipif(not ONEDNN, reason="this torch build has no oneDNN convolution: nothing "
                    "packs weights at load (the refusal itself is tested below)")
def test_a_convolution_with_stride_zero_is_refused_before_weight_packing(tmp_path):
    # before: SIGFPE inside Program.load (oneDNN's weight reorder divides by the stride)
    blob = fused_blob([_pointwise_conv([0, 0])], torch.randn(4, 3, 3, 3))
    done = run_child(_LOAD, delegated_file(blob, (1, 3, 8, 8), (1, 4, 6, 6)), tmp_path)
    assert done.returncode == 0, f"the child died ({done.returncode}): {done.stderr[-2000:]}"
    assert done.stdout.startswith("DelegateInitError |"), done.stdout
    assert "argument 'stride' has 0; it must be >= 1" in done.stdout
    assert "field: delegates[0].data" in done.stdout


@pytest.mark.parametrize(("name", "args", "message"), [
    ("aten.convolution.default",
     [{"v": 0}, {"v": 1}, None, [1, 1], [0, 0], [0, 0], False, [0, 0], 1], "'dilation' has 0"),
    ("aten.convolution.default",
     [{"v": 0}, {"v": 1}, None, [1, 1], [-2, 0], [1, 1], False, [0, 0], 1], "'padding' has -2"),
    ("aten.convolution.default",
     [{"v": 0}, {"v": 1}, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 0], "'groups' has 0"),
    ("aten.max_pool2d.default", [{"v": 0}, [2, 0], [], [0, 0], [1, 1], False],
     "'kernel_size' has 0"),
])
def test_integer_arguments_out_of_range_are_refused_at_load(name, args, message):
    blob = fused_blob([[name, args, {}, 2, "n"]], torch.randn(4, 3, 3, 3))
    with pytest.raises(DelegateInitError, match=message) as info:
        Program.load(delegated_file(blob, (1, 3, 8, 8), (1, 4, 6, 6)))
    assert isinstance(info.value, ProgramLoadError) and info.value.field == "delegates[0].data"


def test_a_valid_blob_still_runs():
    weight = torch.randn(4, 3, 3, 3)
    conv = ["aten.convolution.default",
            [{"v": 0}, {"v": 1}, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1], {}, 2, "conv"]
    blob = fused_blob([_pointwise_conv([1, 1]) if ONEDNN else conv], weight)
    x = torch.randn(1, 3, 8, 8)
    (out,) = Program.load(delegated_file(blob, (1, 3, 8, 8), (1, 4, 6, 6))).method()(x)
    torch.testing.assert_close(out, torch.nn.functional.conv2d(x, weight), atol=1e-5, rtol=1e-5)
