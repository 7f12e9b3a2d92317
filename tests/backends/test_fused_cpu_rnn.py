"""LSTM and GRU reach the fused CPU backend whole (``aten.lstm.input`` / ``aten.gru.input``,
kept by ``ops_to_not_decompose``) and run as one sequence kernel; their weights and states are
checked before torch's kernel sees them."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from exportir.backends.fused_cpu import FusedCpuPartitioner
from exportir.export import export
from exportir.program.transform_and_lower import to_edge_transform_and_lower
from exportir.runtime import Program
from exportir.runtime.backends.fused_cpu import FusedCpuBlobError
from exportir.runtime.backends.fused_cpu.executor import FusedCpuExecutionError, build, run
from exportir.runtime.backends.fused_cpu.format import Blob, OpRow
from exportir.runtime.backends.fused_cpu.kernels import Ref
from exportir.runtime.backends.fused_cpu.rnn import GruKernel


class _Rnn(nn.Module):
    def __init__(self, cell: type[nn.Module], with_state: bool, **kw) -> None:
        super().__init__()
        self.rnn = cell(6, 8, **kw)
        self.with_state = with_state

    def forward(self, x, *state):
        out, last = self.rnn(x, *state)
        last = last if isinstance(last, tuple) else (last,)
        return (out, *last)


_CASES = [
    (nn.LSTM, {"num_layers": 2, "batch_first": True}),
    (nn.LSTM, {"bidirectional": True, "bias": False}),
    (nn.LSTM, {"proj_size": 5, "num_layers": 2}),
    (nn.GRU, {"num_layers": 2, "bidirectional": True, "batch_first": True}),
    (nn.GRU, {}),
]


def _lower(module, args):
    edge = to_edge_transform_and_lower(export(module, args), partitioner=[FusedCpuPartitioner()])
    return bytes(edge.to_program().buffer)


@pytest.mark.parametrize(("cell", "kw"), _CASES, ids=lambda c: getattr(c, "__name__", str(c)))
def test_recurrent_models_run_whole_and_match_eager(cell, kw):
    torch.manual_seed(0)
    model = _Rnn(cell, False, **kw).eval()
    x = torch.randn(2, 7, 6) if kw.get("batch_first") else torch.randn(7, 2, 6)
    data = _lower(model, (x,))
    assert (b"aten.lstm.input" if cell is nn.LSTM else b"aten.gru.input") in data
    assert b"aten.sigmoid" not in data  # no per-timestep ops
    method = Program.load(data).method("forward")
    with torch.no_grad():
        want = model(x)
    for got, expected in zip(method(x), want, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_an_lstm_with_an_initial_state_matches_eager():
    torch.manual_seed(0)
    model = _Rnn(nn.LSTM, True, num_layers=2).eval()
    x, h, c = torch.randn(5, 1, 6), torch.randn(2, 1, 8), torch.randn(2, 1, 8)
    data = _lower(model, (x, (h, c)))
    method = Program.load(data).method("forward")
    with torch.no_grad():
        want = model(x, (h, c))
    for got, expected in zip(method(x, (h, c)), want, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_gru_program_runs_its_step_loop_on_weights_it_transposed_once():
    torch.manual_seed(0)
    model = _Rnn(nn.GRU, True, num_layers=2, batch_first=True).eval()
    x, h = torch.randn(3, 9, 6), torch.randn(2, 3, 8)
    method = Program.load(_lower(model, (x, h))).method("forward")
    with torch.no_grad():
        want = model(x, h)
    for _ in range(3):  # checked, then trusted (the transposed weights kept)
        got = method(x, h)
        for g, e in zip(got, want, strict=True):
            assert g.stride() == e.stride()  # torch's layout (batch first: time-major)
            torch.testing.assert_close(g, e)


def test_the_gru_kernel_follows_a_changed_weight_and_leaves_other_dtypes_to_torch():
    torch.manual_seed(0)
    gru = GruKernel()
    params = [torch.randn(12, 3), torch.randn(12, 4), torch.randn(12), torch.randn(12)]
    x, h = torch.randn(6, 2, 3), torch.randn(1, 2, 4)
    flags = (True, 1, 0.0, False, False, False)
    for _ in range(2):
        for g, e in zip(gru(x, h, params, *flags), torch.gru(x, h, params, *flags), strict=True):
            torch.testing.assert_close(g, e)
        params[1].mul_(0.5)  # in place: the kept transpose must not be used again
    params64 = [p.double() for p in params]
    got = gru(x.double(), h.double(), params64, *flags)
    want = torch.gru(x.double(), h.double(), params64, *flags)
    for g, e in zip(got, want, strict=True):
        assert torch.equal(g, e)


# ------------------------------------------------------------------------------ hostile blobs


def _lstm_params(hidden=8, features=6, bad_hh_hidden=None):
    g = 4 * hidden
    hh = bad_hh_hidden or hidden
    return [torch.randn(g, features), torch.randn(g, hh), torch.randn(g), torch.randn(g)]


def _lstm_blob(params, *, constants: bool, num_layers=1, flags=(True, 0.0, False, False, False)):
    """slot 0: input, 1-2: h0/c0, then the weights (constants or inputs), then 3 outputs."""
    n = len(params)
    w = list(range(3, 3 + n))
    has_biases, dropout, train, bidirectional, batch_first = flags
    args = (Ref(0), [Ref(1), Ref(2)], [Ref(s) for s in w], has_biases, num_layers, dropout, train,
            bidirectional, batch_first)  # fmt: skip
    outs = (3 + n, 4 + n, 5 + n)
    row = OpRow("aten.lstm.input", "lstm", args, {}, outs, True, False)
    inputs = (0, 1, 2) if constants else (0, 1, 2, *w)
    consts = tuple(zip(w, params)) if constants else ()
    return Blob(6 + n, inputs, outs, consts, (row,))


def test_owned_weights_of_the_wrong_hidden_size_are_refused_at_load():
    blob = _lstm_blob(_lstm_params(bad_hh_hidden=5), constants=True)
    with pytest.raises(FusedCpuBlobError, match=r"ops\[0\].*params\[1\] \(layer 0 weight_hh\)"):
        build(blob)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"num_layers": 0}, "num_layers"),
        ({"num_layers": 1 << 40}, "num_layers"),
        ({"num_layers": 2}, "params' has 4 tensors"),
        ({"flags": (1, 0.0, False, False, False)}, "has_biases"),
        ({"flags": (True, 7.0, False, False, False)}, "dropout"),
    ],
)
def test_bad_literal_arguments_are_refused_at_load(kw, match):
    with pytest.raises(FusedCpuBlobError, match=match):
        build(_lstm_blob(_lstm_params(), constants=True, **kw))


def test_weights_and_states_passed_in_are_checked_before_the_kernel_runs():
    program = build(_lstm_blob(_lstm_params(bad_hh_hidden=5), constants=False))
    x, h = torch.randn(3, 1, 6), torch.randn(1, 1, 8)
    with pytest.raises(FusedCpuExecutionError, match=r"params\[1\]"):
        run(program, [x, h, h, *_lstm_params(bad_hh_hidden=5)])
    program = build(_lstm_blob(_lstm_params(), constants=False))
    with pytest.raises(FusedCpuExecutionError, match=r"hx\[1\]"):
        run(program, [x, h, torch.randn(1, 1, 7), *_lstm_params()])
    with pytest.raises(FusedCpuExecutionError, match="input"):
        run(program, [torch.randn(3, 1, 4), h, h, *_lstm_params()])
    out = run(program, [x, h, h, *_lstm_params()])
    assert out[0].shape == (3, 1, 8)


def test_the_blob_header_names_the_sequence_op():
    torch.manual_seed(0)
    data = _lower(_Rnn(nn.GRU, False).eval(), (torch.randn(4, 1, 6),))
    start = data.find(b"XFC1")
    assert start >= 0
    length = int.from_bytes(data[start + 8 : start + 12], "little")
    header = json.loads(data[start + 12 : start + 12 + length])
    assert [op[0] for op in header["ops"]] == ["aten.gru.input"]
