"""Observers: modules ``prepare_pt2e`` inserts into a graph to record the range of a tensor
during calibration, and turn it into quantization parameters at ``convert_pt2e``.

Each observer passes its input through unchanged. ``calculate_qparams()`` returns
``(scale, zero_point)`` tensors as torch's observers compute them (``determine_qparams`` in
``torch.ao.quantization.utils``): affine schemes spread ``[min(lo, 0), max(hi, 0)]`` over
``[quant_min, quant_max]``; symmetric schemes centre on zero (zero point 0 for signed dtypes).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from exportir.format.quantized_ops import QVALUE_BOUNDS

__all__ = [
    "MinMaxObserver",
    "ObserverBase",
    "PerChannelMinMaxObserver",
    "PlaceholderObserver",
    "determine_qparams",
]

_SYMMETRIC = (torch.per_tensor_symmetric, torch.per_channel_symmetric)
_PER_CHANNEL = (torch.per_channel_symmetric, torch.per_channel_affine)


def determine_qparams(lo: torch.Tensor, hi: torch.Tensor, quant_min: int, quant_max: int,
                      dtype: torch.dtype, eps: float, qscheme: Any) -> tuple[torch.Tensor, ...]:
    """``(scale float32, zero_point int64)`` covering ``[lo, hi]`` (elementwise)."""
    lo = torch.clamp(lo.float(), max=0.0)
    hi = torch.clamp(hi.float(), min=0.0)
    if qscheme in _SYMMETRIC:
        bound = torch.maximum(-lo, hi)
        scale = torch.clamp(bound / ((quant_max - quant_min) / 2), min=eps)
        zero = (quant_min + quant_max + 1) // 2 if dtype == torch.uint8 else 0
        zero_point = torch.full_like(scale, zero, dtype=torch.int64)
    else:
        scale = torch.clamp((hi - lo) / float(quant_max - quant_min), min=eps)
        zero_point = quant_min - torch.round(lo / scale).to(torch.int64)
        zero_point = torch.clamp(zero_point, quant_min, quant_max)
    return scale.reshape(-1), zero_point.reshape(-1)


class ObserverBase(torch.nn.Module):
    """Common settings: the quantized ``dtype``, its range, the scheme and the least scale."""

    def __init__(self, dtype: torch.dtype = torch.int8, qscheme: Any = torch.per_tensor_affine,
                 quant_min: int | None = None, quant_max: int | None = None,
                 eps: float = torch.finfo(torch.float32).eps, is_dynamic: bool = False,
                 ch_axis: int = 0) -> None:
        super().__init__()
        bounds = QVALUE_BOUNDS.get(dtype)
        if bounds is None:
            raise ValueError(
                f"{type(self).__name__}: dtype {dtype} is not a quantized dtype; use one of "
                f"{sorted(map(str, QVALUE_BOUNDS))}"
            )
        self.dtype = dtype
        self.qscheme = qscheme
        self.quant_min = bounds[0] if quant_min is None else quant_min
        self.quant_max = bounds[1] if quant_max is None else quant_max
        self.eps = eps
        self.is_dynamic = is_dynamic
        self.ch_axis = ch_axis

    @classmethod
    def with_args(cls, **kwargs: Any) -> Any:
        """A constructor with some arguments bound (torch's ``Observer.with_args``)."""
        return functools.partial(cls, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError(
            f"{type(self).__name__} computes no qparams: it marks a tensor quantized at run "
            "time (dynamic quantization)"
        )


class PlaceholderObserver(ObserverBase):
    """Records nothing: marks a tensor quantized dynamically (qparams chosen at run time)."""


class MinMaxObserver(ObserverBase):
    """The running min and max of everything it saw (per tensor)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.register_buffer("min_val", torch.tensor(float("inf")))
        self.register_buffer("max_val", torch.tensor(float("-inf")))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel():
            lo, hi = torch.aminmax(x.detach().float())
            self.min_val = torch.minimum(self.min_val, lo)
            self.max_val = torch.maximum(self.max_val, hi)
        return x

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not bool(self.min_val <= self.max_val):
            raise RuntimeError(
                f"{type(self).__name__} observed nothing: run the prepared model on "
                "calibration inputs before convert_pt2e"
            )
        return determine_qparams(self.min_val, self.max_val, self.quant_min, self.quant_max,
                                 self.dtype, self.eps, self.qscheme)


class PerChannelMinMaxObserver(ObserverBase):
    """The running min and max of every slice along ``ch_axis``."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("qscheme", torch.per_channel_symmetric)
        super().__init__(**kwargs)
        self.register_buffer("min_val", torch.empty(0))
        self.register_buffer("max_val", torch.empty(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.numel():
            return x
        flat = x.detach().float().transpose(0, self.ch_axis).reshape(x.shape[self.ch_axis], -1)
        lo, hi = flat.amin(1), flat.amax(1)
        if self.min_val.numel():
            lo, hi = torch.minimum(self.min_val, lo), torch.maximum(self.max_val, hi)
        self.min_val, self.max_val = lo, hi
        return x

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.min_val.numel():
            raise RuntimeError(
                f"{type(self).__name__} observed nothing: run the prepared model on "
                "calibration inputs before convert_pt2e"
            )
        return determine_qparams(self.min_val, self.max_val, self.quant_min, self.quant_max,
                                 self.dtype, self.eps, self.qscheme)

    @property
    def per_channel(self) -> bool:
        return self.qscheme in _PER_CHANNEL
