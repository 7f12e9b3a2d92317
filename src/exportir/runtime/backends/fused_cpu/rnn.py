"""Whole-sequence recurrent kernels: ``aten.lstm.input`` and ``aten.gru.input``.

A delegate runs an LSTM or GRU as one call to torch's sequence kernel (oneDNN's RNN layer on
CPU, as eager does), never as per-timestep ops. torch's kernel trusts the shapes of the weights
it is handed, so every argument is checked first: the literal flags and layer count at load
(with the weights too, when the blob owns them), and the tensors' shapes at every call (a few
integer comparisons). A mismatch is a :class:`~.kernels.SchemaMismatch` naming the argument
(``params[5] (layer 1 weight_hh) has shape [48, 12]; expected [48, 16]``), which loading turns
into a ``FusedCpuBlobError`` for ``ops[i]``.

Weights per layer and direction, in torch's order: ``weight_ih [G*H, in]``, ``weight_hh
[G*H, R]``, then with biases ``bias_ih [G*H]``, ``bias_hh [G*H]``, then for a projected LSTM
``weight_hr [P, H]``; G is 4 (LSTM) or 3 (GRU), R is P for a projected LSTM, else H. Layer 0
reads ``in`` features, later layers ``D * R`` (D = 2 when bidirectional).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from exportir.runtime.backends.fused_cpu.records import record

__all__ = [
    "RNN_KERNELS",
    "RNN_PER_OP",
    "GruKernel",
    "RnnShape",
    "RnnShapeError",
    "check_rnn_flags",
    "rnn_shape",
]

MAX_LAYERS = 1024


class RnnShapeError(ValueError):
    """Recurrent-op arguments that do not fit together (the message names the argument); at
    load the kernel table re-raises it as its ``SchemaMismatch``."""


class RnnShape(record("RnnShape", "hidden proj features directions layers group")):
    """The sizes the weights fix: hidden ``hidden``, projection ``proj`` (0: none), input
    features ``features``, directions, layers, weights per layer and direction."""

    __slots__ = ()
    hidden: int
    proj: int
    features: int
    directions: int
    layers: int
    group: int


def check_rnn_flags(args: Sequence[Any]) -> None:
    """The literal arguments (``has_biases`` ... ``batch_first``) of a decoded lstm/gru op."""
    has_biases, num_layers, dropout, train, bidirectional, batch_first = args[3:9]
    for name, value in (("has_biases", has_biases), ("train", train),
                        ("bidirectional", bidirectional), ("batch_first", batch_first)):  # fmt: skip
        if type(value) is not bool:
            raise RnnShapeError(f"argument {name!r} must be a bool; got {value!r}")
    if type(num_layers) is not int or not 1 <= num_layers <= MAX_LAYERS:
        raise RnnShapeError(f"argument 'num_layers' must be an int in [1, {MAX_LAYERS}]; got {num_layers!r}")
    if type(dropout) not in (int, float) or not 0.0 <= dropout <= 1.0:
        raise RnnShapeError(f"argument 'dropout' must be a number in [0, 1]; got {dropout!r}")


def _shape(t: Any) -> list[int]:
    return list(t.shape)


def rnn_shape(gates: int, params: Sequence[Any], has_biases: bool, layers: int,
              bidirectional: bool) -> RnnShape:  # fmt: skip
    """Check the weights ``params`` (tensors) against each other; return the sizes they fix."""
    directions = 2 if bidirectional else 1
    count = len(params)
    base = 4 if has_biases else 2
    if count == layers * directions * base:
        group = base
    elif gates == 4 and count == layers * directions * (base + 1):
        group = base + 1  # projected LSTM: weight_hr last
    else:
        raise RnnShapeError(
            f"argument 'params' has {count} tensors; {layers} layer(s) x {directions} "
            f"direction(s) x {base} weights need {layers * directions * base}"
        )
    if any(not isinstance(p, torch.Tensor) or p.dtype != params[0].dtype for p in params):
        raise RnnShapeError("argument 'params' must be tensors of one dtype")
    w_ih = params[0]
    if w_ih.dim() != 2 or w_ih.shape[0] % gates or w_ih.shape[0] == 0:
        raise RnnShapeError(f"params[0] (layer 0 weight_ih) has shape {_shape(w_ih)}; expected "
                        f"[{gates} * hidden, input features]")  # fmt: skip
    hidden = w_ih.shape[0] // gates
    proj = params[group - 1].shape[0] if group == base + 1 else 0
    recurrent = proj or hidden
    names = ["weight_ih", "weight_hh", "bias_ih", "bias_hh"][:base] + (["weight_hr"] if proj else [])
    for layer in range(layers):
        features = w_ih.shape[1] if layer == 0 else directions * recurrent
        expected = [[gates * hidden, features], [gates * hidden, recurrent],
                    [gates * hidden], [gates * hidden]][:base] + ([[proj, hidden]] if proj else [])  # fmt: skip
        for d in range(directions):
            at = (layer * directions + d) * group
            for k, want in enumerate(expected):
                got = _shape(params[at + k])
                if got != want:
                    raise RnnShapeError(f"params[{at + k}] (layer {layer} {names[k]}) has shape "
                                    f"{got}; expected {want}")  # fmt: skip
    return RnnShape(hidden, proj, w_ih.shape[1], directions, layers, group)


def _check_call(gates: int, x: Any, hx: Sequence[Any], args: Sequence[Any]) -> None:
    params, has_biases, layers, _, _, bidirectional, batch_first = args
    s = rnn_shape(gates, params, has_biases, layers, bidirectional)
    if x.dtype != params[0].dtype:
        raise RnnShapeError(f"argument 'input' is {x.dtype}; the weights are {params[0].dtype}")
    if x.dim() != 3 or x.shape[-1] != s.features:
        raise RnnShapeError(f"argument 'input' has shape {_shape(x)}; expected 3 dims, the last "
                            f"{s.features}")  # fmt: skip
    batch = x.shape[0 if batch_first else 1]
    want = [[s.layers * s.directions, batch, s.proj or s.hidden]]
    if gates == 4:
        want.append([s.layers * s.directions, batch, s.hidden])
    if len(hx) != len(want):
        raise RnnShapeError(f"argument 'hx' has {len(hx)} tensors; expected {len(want)}")
    for k, (h, w) in enumerate(zip(hx, want)):
        if _shape(h) != w or h.dtype != x.dtype:
            raise RnnShapeError(f"hx[{k}] has shape {_shape(h)} ({h.dtype}); expected {w} ({x.dtype})")


def _lstm(x: Any, hx: list, params: list, *flags: Any) -> tuple[Any, Any, Any]:
    _check_call(4, x, hx, (params, *flags))
    return torch.lstm(x, hx, params, *flags)


def _gru(x: Any, hx: Any, params: list, *flags: Any) -> tuple[Any, Any]:
    """``aten.gru.input``, checked; see :class:`GruKernel` (which a blob's op runs)."""
    return GruKernel()(x, hx, params, *flags)


_addmm, _mm, _addcmul, _lerp = torch.addmm, torch.mm, torch.addcmul, torch.lerp


class GruKernel:
    """``aten.gru.input`` for one op of a blob. Float32, one direction, inference: each
    layer's input projection for the whole sequence in one product, then five ATen calls a step
    into buffers made once per call (:func:`_gru_layer`), on ``weight_hh`` transposed (the product's fast layout: 7
    -> 5 us a step), made the first time a weight is seen and kept while the same tensor comes
    back unchanged (its version counter). torch's own loop runs ~12 ops a step on new tensors:
    a 2-layer, 128-hidden GRU over 32 steps takes 1.12 ms there, ~0.85 ms here (one thread).
    Anything else runs ``torch.gru``. Equal to it up to float rounding."""

    __slots__ = ("_hh",)

    def __init__(self) -> None:
        self._hh: dict[int, tuple[Any, int, Any]] = {}  # layer -> (weight_hh, version, .T)

    def __call__(self, x: Any, hx: Any, params: list, *flags: Any) -> tuple[Any, Any]:
        _check_call(3, x, [hx], (params, *flags))
        has_biases, layers, _, train, bidirectional, batch_first = flags
        if train or bidirectional or x.dtype != torch.float32 or x.numel() == 0:
            return torch.gru(x, hx, params, *flags)
        group = 4 if has_biases else 2
        seq = x.transpose(0, 1) if batch_first else x  # time-major, as torch's kernel runs
        finals = []
        for layer in range(layers):
            w_ih, w_hh, *biases = params[layer * group:(layer + 1) * group]
            b_ih, b_hh = biases if biases else (None, None)
            seq = _gru_layer(seq, hx[layer], w_ih, self._transposed(layer, w_hh), b_ih, b_hh)
            finals.append(seq[-1])
        # batch first: the time-major result transposed (torch's strides too)
        return seq.transpose(0, 1) if batch_first else seq, torch.stack(finals)

    def _transposed(self, layer: int, w_hh: Any) -> Any:
        seen, version, w_t = self._hh.get(layer, (None, -1, None))
        if seen is w_hh and w_hh._version == version:
            return w_t
        w_t = w_hh.t().contiguous()
        self._hh = {**self._hh, layer: (w_hh, w_hh._version, w_t)}  # replaced whole
        return w_t


def _gru_layer(seq: Any, h: Any, w_ih: Any, w_hh_t: Any, b_ih: Any, b_hh: Any) -> Any:
    """One GRU layer over ``seq [T, B, F]`` from ``h [B, H]`` with ``w_hh_t = weight_hh.T``
    (contiguous); returns its outputs ``[T, B, H]``. Gates as torch's:
    r, z = sigmoid(gi + gh), n = tanh(gi_n + r * gh_n), h' = n + z * (h - n) (a ``lerp``).

    A step is five calls: the recurrent product adds its own per-step bias ``c`` (the input
    projection of the r and z gates plus ``bias_hh``; for the n gate ``bias_hh`` alone), so
    ``sigmoid`` runs in place on its r, z columns; then ``addcmul``, ``tanh``, ``lerp``."""
    hidden = w_hh_t.shape[0]
    steps, batch = seq.shape[0], seq.shape[1]
    flat = seq.reshape(-1, seq.shape[2])
    c = _mm(flat, w_ih.t()) if b_ih is None else _addmm(b_ih, flat, w_ih.t())  # [B*T, 3H]
    gi_n = c[:, 2 * hidden:].clone()
    if b_hh is None:
        c[:, 2 * hidden:].zero_()
    else:
        c[:, : 2 * hidden].add_(b_hh[: 2 * hidden])
        c[:, 2 * hidden:].copy_(b_hh[2 * hidden:])
    c_steps = c.view(steps, batch, 3 * hidden).unbind(0)
    n_steps = gi_n.view(steps, batch, hidden).unbind(0)
    gh = torch.empty(batch, 3 * hidden)
    rz, r, z, gh_n = gh[:, : 2 * hidden], gh[:, :hidden], gh[:, hidden : 2 * hidden], gh[:, 2 * hidden:]
    n = torch.empty(r.shape)
    out = torch.empty(steps, batch, hidden)
    for c_t, gi_n_t, h_next in zip(c_steps, n_steps, out.unbind(0)):
        _addmm(c_t, h, w_hh_t, out=gh)
        rz.sigmoid_()
        _addcmul(gi_n_t, r, gh_n, out=n).tanh_()
        h = _lerp(n, h, z, out=h_next)
    return out


def _prepare(gates: int) -> Callable[[tuple[Any, ...], Callable[[Any], Any]], tuple[Any, ...]]:
    """At load: the flags, and the weights when the blob owns all of them."""

    def prepare(args: tuple[Any, ...], constant: Callable[[Any], Any]) -> tuple[Any, ...]:
        check_rnn_flags(args)
        params = [constant(p) for p in args[2]]
        if params and all(p is not None for p in params):
            rnn_shape(gates, params, args[3], args[4], args[7])
        return args

    return prepare


# name -> the class of the callable each op of a blob gets (state kept per op)
RNN_PER_OP = {"aten.gru.input": GruKernel}

# name -> (kernel, prepare)
RNN_KERNELS = {
    "aten.lstm.input": (_lstm, _prepare(4)),
    "aten.gru.input": (_gru, _prepare(3)),
}
