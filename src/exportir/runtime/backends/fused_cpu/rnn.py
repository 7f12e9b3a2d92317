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

__all__ = ["RNN_KERNELS", "RnnShape", "RnnShapeError", "check_rnn_flags", "rnn_shape"]

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
    _check_call(3, x, [hx], (params, *flags))
    return torch.gru(x, hx, params, *flags)


def _prepare(gates: int) -> Callable[[tuple[Any, ...], Callable[[Any], Any]], tuple[Any, ...]]:
    """At load: the flags, and the weights when the blob owns all of them."""

    def prepare(args: tuple[Any, ...], constant: Callable[[Any], Any]) -> tuple[Any, ...]:
        check_rnn_flags(args)
        params = [constant(p) for p in args[2]]
        if params and all(p is not None for p in params):
            rnn_shape(gates, params, args[3], args[4], args[7])
        return args

    return prepare


# name -> (kernel, prepare)
RNN_KERNELS = {
    "aten.lstm.input": (_lstm, _prepare(4)),
    "aten.gru.input": (_gru, _prepare(3)),
}
