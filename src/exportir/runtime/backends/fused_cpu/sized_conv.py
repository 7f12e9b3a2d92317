"""oneDNN float32 convolutions whose constant weight is packed by the first call, for that
call's input shape.

oneDNN's blocked weight layout depends on the input shape. Packed without one (as load would
have to: the blob does not hold value shapes), oneDNN picks the layout for a guessed shape, and
a convolution of a shape that wants another layout reorders the weight on every call, or runs
a slower kernel on it: packing each of MobileNetV2's convolution weights for its real input
took their summed time (each timed alone) from 8.07 to 7.92 ms (1 thread, AVX-512; 1x1
convolutions with 64 outputs gain ~10%). So the weight is packed once, at the first call, for that call's
input; calls of other shapes (a dynamic-shape program) run on the same packed weight, which
oneDNN reorders when it must (results are the same).

:class:`ConvPointwise` runs ``mkldnn::_convolution_pointwise`` and :class:`ConvBinary` its
``.binary`` form (a residual add); both are called without the weight. Imports only torch.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ConvBinary", "ConvPointwise", "SizedConvWeight"]


class SizedConvWeight:
    """A float32 convolution weight ``[O, C / groups, kH, kW]`` and its oneDNN packing, made
    by the first :meth:`packed_for` (a plain slotted class: argument walkers must not descend
    into it)."""

    __slots__ = ("_geometry", "_packed", "plain")

    def __init__(self, plain: torch.Tensor, padding: list[int], stride: list[int],
                 dilation: list[int], groups: int) -> None:
        self.plain = plain
        self._geometry = (list(padding), list(stride), list(dilation), groups)
        self._packed: torch.Tensor | None = None

    def __repr__(self) -> str:
        state = "packed" if self._packed is not None else "not packed yet"
        return f"SizedConvWeight({list(self.plain.shape)}, {state})"

    @property
    def packed(self) -> torch.Tensor | None:
        return self._packed

    def packed_for(self, x: Any) -> torch.Tensor:
        """The packed weight (packed now, for ``x``'s shape, when first asked)."""
        packed = self._packed
        if packed is not None:
            return packed
        size = list(x.shape) if isinstance(x, torch.Tensor) and x.dim() == 4 else None
        try:
            packed = torch.ops.mkldnn._reorder_convolution_weight(self.plain, *self._geometry,
                                                                  size)
        except RuntimeError:  # an input that does not fit: the convolution reports it
            return self.plain
        self._packed = packed
        return packed


class ConvPointwise:
    """``mkldnn::_convolution_pointwise(x, W, bias, padding, stride, dilation, groups, attr,
    scalars, algorithm)`` on a :class:`SizedConvWeight`, called without ``W``."""

    __slots__ = ("_op", "weight")

    def __init__(self, op: Any, weight: SizedConvWeight) -> None:
        self._op = op
        self.weight = weight

    def __call__(self, x: Any, *rest: Any) -> torch.Tensor:
        packed = self.weight._packed
        if packed is None:
            packed = self.weight.packed_for(x)
        return self._op(x, packed, *rest)


class ConvBinary(ConvPointwise):
    """``mkldnn::_convolution_pointwise.binary(x, other, W, ...)`` on a
    :class:`SizedConvWeight`, called without ``W``."""

    __slots__ = ()

    def __call__(self, x: Any, other: Any, *rest: Any) -> torch.Tensor:
        packed = self.weight._packed
        if packed is None:
            packed = self.weight.packed_for(x)
        return self._op(x, other, packed, *rest)
