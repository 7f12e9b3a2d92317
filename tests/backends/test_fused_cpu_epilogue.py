"""oneDNN linears with a weight packed at load, and activations / residual adds fused into
oneDNN linears and convolutions (``backends/fused_cpu/epilogue.py``, runtime ``dense.py``)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from exportir.backends.fused_cpu import FusedCpuPartitioner
from exportir.backends.fused_cpu.epilogue import PACKED_MIN_ROWS
from exportir.export import export
from exportir.program.transform_and_lower import to_edge_transform_and_lower
from exportir.runtime import Program
from exportir.runtime.backends.fused_cpu import FusedCpuBlobError, dense
from exportir.runtime.backends.fused_cpu.executor import FusedCpuExecutionError, build, run
from exportir.runtime.backends.fused_cpu.format import Blob, OpRow
from exportir.runtime.backends.fused_cpu.kernels import Ref

_ACTS = [nn.ReLU(), nn.GELU(), nn.GELU(approximate="tanh"), nn.SiLU(), nn.Hardswish(),
         nn.ReLU6(), nn.Sigmoid(), nn.Tanh(), nn.LeakyReLU(0.2), nn.Hardsigmoid()]  # fmt: skip
_ATTRS = ["relu", "gelu", "gelu", "swish", "hardswish", "hardtanh", "sigmoid", "tanh",
          "leaky_relu", "hardsigmoid"]  # fmt: skip


class _Mlp(nn.Module):
    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.up, self.down, self.act = nn.Linear(16, 24), nn.Linear(24, 16), act

    def forward(self, x):
        return self.down(self.act(self.up(x))) + x  # the residual joins the second linear


class _Conv(nn.Module):
    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.conv, self.bn, self.act = nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), act

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


def _ops(data: bytes) -> list[list]:
    start = data.find(b"XFC1")
    length = int.from_bytes(data[start + 8 : start + 12], "little")
    return json.loads(data[start + 12 : start + 12 + length])["ops"]


def _check(model: nn.Module, x: torch.Tensor) -> list[list]:
    model = model.eval()
    ep = export(model, (x,))
    data = bytes(to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()]).to_program().buffer)
    got = Program.load(data).method("forward")(x)
    with torch.no_grad():
        torch.testing.assert_close(got, model(x), atol=1e-5, rtol=1e-5)
    return _ops(data)


@pytest.mark.parametrize(("act", "attr"), list(zip(_ACTS, _ATTRS)), ids=_ATTRS)
def test_linear_with_each_epilogue_matches_eager(act, attr):
    torch.manual_seed(0)
    ops = _check(_Mlp(act), torch.randn(2, PACKED_MIN_ROWS, 16))
    assert [op[0] for op in ops] == [
        "mkldnn._linear_pointwise.default", "mkldnn._linear_pointwise.binary",
    ]
    assert ops[0][1][3] == attr and ops[1][1][4] == "add"


@pytest.mark.parametrize(("act", "attr"), list(zip(_ACTS, _ATTRS)), ids=_ATTRS)
def test_convolution_with_each_activation_matches_eager(act, attr):
    torch.manual_seed(0)
    ops = _check(_Conv(act), torch.randn(1, 8, 40, 40))
    assert [op[0] for op in ops] == ["aten.clone.default", "mkldnn._convolution_pointwise.default"]
    assert ops[0][2] == {"memory_format": {"memory_format": "channels_last"}}  # NHWC for oneDNN
    assert ops[1][1][7] == attr


def test_a_single_row_linear_keeps_torchs_kernel():
    torch.manual_seed(0)
    ops = _check(_Mlp(nn.ReLU()), torch.randn(1, 16))
    assert "mkldnn._linear_pointwise.default" not in [op[0] for op in ops]


def test_the_linear_fallbacks_compute_the_same():
    torch.manual_seed(0)
    x, w, b, other = torch.randn(40, 16), torch.randn(8, 16), torch.randn(8), torch.randn(40, 8)
    for attr, scalars, alg in [("gelu", [], "tanh"), ("hardtanh", [0.0, 6.0], None),
                               ("leaky_relu", [0.1], None), ("swish", [], None)]:  # fmt: skip
        want = torch.ops.mkldnn._linear_pointwise(x, w, b, attr, scalars, alg)
        torch.testing.assert_close(dense._linear_plain(x, w, b, attr, scalars, alg), want)
    torch.testing.assert_close(dense._linear_add_plain(x, other, w, b, "add"),
                               torch.ops.mkldnn._linear_pointwise.binary(x, other, w, b, "add"))  # fmt: skip


# ------------------------------------------------------------------------------ hostile blobs


def _linear_blob(args: tuple, name="mkldnn._linear_pointwise.default", inputs=(0,)) -> Blob:
    """slot 0 (and 1): inputs, 2: the weight (a constant), 3: the output."""
    row = OpRow(name, "linear", args, {}, (3,), False, False)
    return Blob(4, inputs, (3,), ((2, torch.randn(8, 16)),), (row,))


@pytest.mark.parametrize(
    ("attr", "scalars", "algorithm", "match"),
    [
        ("hardtanh", [], None, "scalars"),  # oneDNN would read two scalars that are not there
        ("leaky_relu", [0.1, 0.2], None, "scalars"),
        ("bogus", [], None, "attr"),
        ("gelu", [], "erf", "algorithm"),
        ("relu", [], "tanh", "algorithm"),
        ("hardtanh", [6.0, 0.0], None, "min, max"),
    ],
)
def test_bad_post_ops_are_refused_at_load(attr, scalars, algorithm, match):
    with pytest.raises(FusedCpuBlobError, match=rf"ops\[0\].*{match}"):
        build(_linear_blob((Ref(0), Ref(2), None, attr, scalars, algorithm)))


def test_bad_convolution_post_ops_are_refused_at_load():
    row = OpRow("mkldnn._convolution_pointwise.default", "conv",
                (Ref(0), Ref(2), None, [1, 1], [1, 1], [1, 1], 1, "hardtanh", [1.0], None), {},
                (3,), False, False)  # fmt: skip
    with pytest.raises(FusedCpuBlobError, match=r"ops\[0\].*scalars"):
        build(Blob(4, (0,), (3,), ((2, torch.randn(4, 3, 3, 3)),), (row,)))


def test_a_residual_of_the_wrong_shape_is_refused_before_onednn_reads_it():
    blob = _linear_blob((Ref(0), Ref(1), Ref(2), None, "add"),
                        name="mkldnn._linear_pointwise.binary", inputs=(0, 1))  # fmt: skip
    with pytest.raises(FusedCpuBlobError, match="attr"):
        build(_linear_blob((Ref(0), Ref(1), Ref(2), None, "mul"),
                           name="mkldnn._linear_pointwise.binary", inputs=(0, 1)))  # fmt: skip
    program = build(blob)
    with pytest.raises(FusedCpuExecutionError, match="other"):
        run(program, [torch.randn(4, 16), torch.randn(3, 8)])  # 24 elements where 32 are read
    assert run(program, [torch.randn(4, 16), torch.randn(4, 8)])[0].shape == (4, 8)
