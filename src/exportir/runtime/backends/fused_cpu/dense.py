"""oneDNN's linear with a weight packed once at load, and the post-op attributes oneDNN kernels
(linear and convolution) take.

``mkldnn._linear_pointwise.default(x, W, b, attr, scalars, algorithm)`` computes
``attr(linear(x, W, b))``; ``.binary(x, other, W, b, "add")`` computes ``linear(x, W, b) +
other``. At load a constant ``W`` is reordered into oneDNN's layout (``_reorder_linear_weight``)
so no call repacks it. oneDNN reads the attribute's scalars by position and the binary operand
by the output's size without checking either, so both are checked: the attribute, its scalars
and algorithm at load (:func:`check_attr`), the operand's shape at every call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["ATTR_SCALARS", "LINEAR_KERNELS", "AttrError", "apply_attr", "check_attr"]

# post-op attribute -> how many scalars it reads
ATTR_SCALARS: dict[str, int] = {
    "none": 0, "relu": 0, "sigmoid": 0, "tanh": 0, "hardswish": 0, "swish": 0, "gelu": 0,
    "hardsigmoid": 0, "hardtanh": 2, "leaky_relu": 1,
}  # fmt: skip
GELU_ALGORITHMS = ("none", "tanh")

_MKLDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class AttrError(ValueError):
    """A post-op attribute oneDNN would misread (the message names the argument)."""


def check_attr(attr: Any, scalars: Any, algorithm: Any) -> None:
    """Raise :class:`AttrError` unless ``attr`` is known and has its scalars and algorithm."""
    if attr not in ATTR_SCALARS:
        raise AttrError(f"argument 'attr' is {attr!r}; expected one of {sorted(ATTR_SCALARS)}")
    want = ATTR_SCALARS[attr]
    if not isinstance(scalars, list) or len(scalars) != want:
        raise AttrError(f"argument 'scalars' of attr {attr!r} must list {want} numbers; got "
                        f"{scalars!r}")  # fmt: skip
    if not all(type(s) in (int, float) for s in scalars):
        raise AttrError(f"argument 'scalars' must be numbers; got {scalars!r}")
    if attr == "hardtanh" and scalars[0] > scalars[1]:
        raise AttrError(f"argument 'scalars' of hardtanh must be [min, max]; got {scalars!r}")
    allowed = GELU_ALGORITHMS if attr == "gelu" else (None, "", "none")
    if algorithm not in allowed:
        raise AttrError(f"argument 'algorithm' of attr {attr!r} is {algorithm!r}; expected one "
                        f"of {list(allowed)}")  # fmt: skip


_F = torch.nn.functional
_ATTR_FNS: dict[str, Callable[..., Any]] = {
    "none": lambda y, s, a: y,
    "relu": lambda y, s, a: torch.relu_(y),
    "sigmoid": lambda y, s, a: torch.sigmoid_(y),
    "tanh": lambda y, s, a: torch.tanh_(y),
    "hardswish": lambda y, s, a: _F.hardswish(y, inplace=True),
    "hardsigmoid": lambda y, s, a: _F.hardsigmoid(y, inplace=True),
    "swish": lambda y, s, a: _F.silu(y, inplace=True),
    "gelu": lambda y, s, a: _F.gelu(y, approximate=a or "none"),
    "hardtanh": lambda y, s, a: y.clamp_(s[0], s[1]),
    "leaky_relu": lambda y, s, a: _F.leaky_relu(y, s[0], inplace=True),
}


def apply_attr(y: torch.Tensor, attr: str, scalars: list, algorithm: Any) -> torch.Tensor:
    """``attr`` applied to ``y`` (in place where it can), as oneDNN's post-op computes it."""
    return _ATTR_FNS[attr](y, scalars, algorithm)


def _linear_plain(x, w, b, attr, scalars, algorithm):
    """mkldnn::_linear_pointwise without oneDNN."""
    return apply_attr(torch._C._nn.linear(x, w, b), attr, scalars, algorithm)


def _linear_add_plain(x, other, w, b, attr):
    return torch._C._nn.linear(x, w, b).add_(other)


_POINTWISE = torch.ops.mkldnn._linear_pointwise if _MKLDNN else None


def _linear_add(x, other, w, b, attr):
    """``linear(x, w, b) + other``; ``other`` must have the result's shape (oneDNN reads it by
    the result's size)."""
    if tuple(other.shape) != (*x.shape[:-1], w.shape[0]) or other.dtype != x.dtype:
        raise AttrError(f"argument 'other' has shape {list(other.shape)} ({other.dtype}); the "
                        f"linear gives {[*x.shape[:-1], w.shape[0]]} ({x.dtype})")  # fmt: skip
    if _POINTWISE is None:
        return _linear_add_plain(x, other, w, b, attr)
    return _POINTWISE.binary(x, other, w, b, attr)


def _packable(w: Any) -> bool:
    return (isinstance(w, torch.Tensor) and w.dim() == 2 and w.dtype == torch.float32
            and w.numel() > 0 and not w.is_mkldnn)  # fmt: skip


def _prepare(weight_at: int, attr_at: int, binary: bool):
    def prepare(args: tuple[Any, ...], constant: Callable[[Any], Any]) -> tuple[Any, ...]:
        if binary:
            if args[attr_at] != "add":
                raise AttrError(f"argument 'attr' is {args[attr_at]!r}; expected 'add'")
        else:
            check_attr(*args[attr_at : attr_at + 3])
        weight = constant(args[weight_at])
        if not _MKLDNN or not _packable(weight):
            return args
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        except (RuntimeError, TypeError):
            return args
        return (*args[:weight_at], packed, *args[weight_at + 1 :])

    return prepare


# name -> (kernel, prepare)
LINEAR_KERNELS = {
    "mkldnn._linear_pointwise.default": (
        _POINTWISE.default if _POINTWISE is not None else _linear_plain, _prepare(1, 3, False)
    ),
    "mkldnn._linear_pointwise.binary": (_linear_add, _prepare(2, 4, True)),
}
