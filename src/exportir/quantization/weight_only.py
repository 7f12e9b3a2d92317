"""Weight-only (and dynamic-activation) quantization of linear layers: ``quantize_(model,
config)``, as torchao's.

``quantize_`` replaces, in place, every ``nn.Linear`` of an eager model (those
``filter_fn(module, fqn)`` accepts) by a :class:`WeightOnlyLinear`: the weight is stored
quantized, the activations stay float. Its forward dequantizes the weight with a
``quantized_decomposed`` op and calls ``linear``, so a captured program shows the pattern the
backends lower to torch's CPU kernels (``aten._weight_int8pack_mm``,
``aten._weight_int4pack_mm_for_cpu``):

- :class:`Int8WeightOnlyConfig` (``int8_weight_only()``): int8, symmetric, one scale per
  output channel (``dequantize_per_channel``);
- :class:`Int4WeightOnlyConfig` (``int4_weight_only(group_size=128)``): 4-bit values
  ``[0, 15]`` (stored one per uint8) with a scale and a float zero point per group of
  ``group_size`` input channels (``dequantize_per_channel_group``), chosen for the least squared
  error;
- :class:`Int8DynamicActivationInt8WeightConfig` (``int8_dynamic_activation_int8_weight()``):
  the int8 weight above, and activations quantized to int8 at run time over each call's own
  range (``choose_qparams.tensor`` + ``quantize_per_tensor.tensor`` + ``dequantize``, the PT2E
  dynamic pattern; one scale per tensor, where torchao's config of that name takes one per
  token: the same for a decode step's single row). The fused CPU backend runs it on fbgemm's
  int8 kernels (``fused_cpu.linear_dynamic_int8``), reading a quarter of float32's weight bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from exportir.format import quantized_ops

__all__ = [
    "DynamicInt8Linear",
    "Int4WeightOnlyConfig",
    "Int8DynamicActivationInt8WeightConfig",
    "Int8WeightOnlyConfig",
    "WeightOnlyLinear",
    "int4_weight_only",
    "int8_dynamic_activation_int8_weight",
    "int8_weight_only",
    "quantize_",
]


@dataclass(frozen=True, slots=True)
class Int8WeightOnlyConfig:
    """int8 weights, symmetric per output channel."""


@dataclass(frozen=True, slots=True)
class Int4WeightOnlyConfig:
    """4-bit weights, affine per group of ``group_size`` input channels."""

    group_size: int = 128

    def __post_init__(self) -> None:
        if self.group_size not in (32, 64, 128, 256):
            raise ValueError(
                f"Int4WeightOnlyConfig: group_size must be 32, 64, 128 or 256; got "
                f"{self.group_size}"
            )


@dataclass(frozen=True, slots=True)
class Int8DynamicActivationInt8WeightConfig:
    """int8 weights, symmetric per output channel; int8 activations, affine per tensor, their
    qparams chosen at run time."""


def int8_dynamic_activation_int8_weight() -> Int8DynamicActivationInt8WeightConfig:
    return Int8DynamicActivationInt8WeightConfig()


def int8_weight_only() -> Int8WeightOnlyConfig:
    return Int8WeightOnlyConfig()


def int4_weight_only(group_size: int = 128) -> Int4WeightOnlyConfig:
    return Int4WeightOnlyConfig(group_size)


def _int8(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    w = weight.detach().float()
    scales = torch.clamp(w.abs().amax(1) / 127, min=torch.finfo(torch.float32).eps)
    q = torch.clamp(torch.round(w / scales[:, None]), -127, 127).to(torch.int8)
    return {"weight_q": q, "scales": scales, "zero_points": torch.zeros_like(scales,
                                                                             dtype=torch.int64)}


# fractions of a group's minimum and of its maximum tried for int4 (each pair; the one with the
# least squared error wins): clipping a few outliers buys resolution for every other weight
_INT4_SHRINK = (1.0, 0.95, 0.9, 0.85, 0.8)
_INT4_CHUNK = 1 << 22  # weights searched at once (bounds the search's temporaries)


def _int4_search(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scales, lows)`` of each group ``[..., group_size]``: the grid ``low + scale * [0, 15]``
    with the least squared error among the shrunk ranges ``[lo * a, hi * b]``."""
    lo0, hi0 = groups.amin(-1), groups.amax(-1)
    best = None
    for a in _INT4_SHRINK:
        for b in _INT4_SHRINK:
            lo = lo0 * a
            scales = torch.clamp((hi0 * b - lo) / 15, min=torch.finfo(torch.float32).eps)
            q = torch.clamp(torch.round((groups - lo[..., None]) / scales[..., None]), 0, 15)
            error = torch.addcmul(lo[..., None], q, scales[..., None]).sub_(groups)
            error = error.square_().sum(-1)
            if best is None:
                best = [error, scales, lo]
                continue
            better = error < best[0]
            best = [torch.where(better, new, old) for new, old in zip((error, scales, lo), best)]
    return best[1], best[2]


def _int4(weight: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """4-bit values, scales and float zero points (``dequant = (q - zero) * scale``: the grid
    need not hold 0, as in tinygemm's ``_weight_int4pack_mm`` whose zeros are float)."""
    w = weight.detach().float()
    n, k = w.shape
    groups = w.reshape(n * k // group_size, group_size)
    rows = max(1, _INT4_CHUNK // group_size)
    parts = [_int4_search(chunk) for chunk in groups.split(rows)]
    scales = torch.cat([p[0] for p in parts])
    lows = torch.cat([p[1] for p in parts])
    q = torch.clamp(torch.round((groups - lows[:, None]) / scales[:, None]), 0, 15)
    return {"weight_q": q.reshape(n, k).to(torch.uint8),
            "scales": scales.reshape(n, k // group_size),
            "zero_points": (-lows / scales).reshape(n, k // group_size)}


class WeightOnlyLinear(torch.nn.Module):
    """A linear layer whose weight is stored quantized (module docstring)."""

    def __init__(self, linear: torch.nn.Linear, config: Any) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.group_size = getattr(config, "group_size", None)
        parts = _int8(linear.weight) if self.group_size is None else _int4(
            linear.weight, self.group_size)
        for name, value in parts.items():
            self.register_buffer(name, value)
        self.bias = linear.bias
        self.out_dtype = linear.weight.dtype
        quantized_ops.define()

    def dequantized_weight(self) -> torch.Tensor:
        qd = torch.ops.quantized_decomposed
        if self.group_size is None:
            return qd.dequantize_per_channel.default(
                self.weight_q, self.scales, self.zero_points, 0, -127, 127, torch.int8,
                out_dtype=self.out_dtype)
        return qd.dequantize_per_channel_group.default(
            self.weight_q, self.scales, self.zero_points, 0, 15, torch.uint8, self.group_size,
            self.out_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.dequantized_weight(), self.bias)

    def extra_repr(self) -> str:
        kind = "int8" if self.group_size is None else f"int4, group_size={self.group_size}"
        return f"in_features={self.in_features}, out_features={self.out_features}, {kind}"


_ACT_EPS = torch.finfo(torch.float32).eps


class DynamicInt8Linear(WeightOnlyLinear):
    """A linear layer with an int8 weight whose input is quantized to int8 at run time
    (:class:`Int8DynamicActivationInt8WeightConfig`)."""

    def __init__(self, linear: torch.nn.Linear, config: Any) -> None:
        super().__init__(linear, Int8WeightOnlyConfig())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qd = torch.ops.quantized_decomposed
        scale, zero_point = qd.choose_qparams.tensor(x, -128, 127, _ACT_EPS, torch.int8)
        q = qd.quantize_per_tensor.tensor(x, scale, zero_point, -128, 127, torch.int8)
        x = qd.dequantize_per_tensor.tensor(q, scale, zero_point, -128, 127, torch.int8)
        return torch.nn.functional.linear(x, self.dequantized_weight(), self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int8 "
                "weight, int8 dynamic activation")


def _quantizable(module: torch.nn.Module, fqn: str, config: Any) -> str | None:
    """Why ``module`` cannot be quantized with ``config``, or None."""
    weight = module.weight
    if weight.device.type == "meta" or not weight.dtype.is_floating_point:
        return f"its weight is {weight.dtype} on {weight.device}"
    k = module.in_features
    if isinstance(config, Int4WeightOnlyConfig) and k % config.group_size:
        return f"in_features {k} is not a multiple of group_size {config.group_size}"
    return None


_CONFIGS = (Int8WeightOnlyConfig, Int4WeightOnlyConfig, Int8DynamicActivationInt8WeightConfig)


def quantize_(model: torch.nn.Module, config: Any,
              filter_fn: Callable[[torch.nn.Module, str], bool] | None = None) -> torch.nn.Module:
    """Replace the ``nn.Linear`` layers of ``model`` (in place; those ``filter_fn(module,
    fqn)`` accepts) by quantized ones (the module docstring's configs); returns ``model``. A layer the config cannot
    quantize (int4 needs ``in_features`` divisible by ``group_size``) raises, naming it: leave
    it out with ``filter_fn``."""
    if not isinstance(config, _CONFIGS):
        raise TypeError(
            f"quantize_: unknown config {type(config).__name__}; use int8_weight_only(), "
            "int4_weight_only(group_size) or int8_dynamic_activation_int8_weight() "
            "(Int8WeightOnlyConfig / Int4WeightOnlyConfig / Int8DynamicActivationInt8WeightConfig)"
        )
    targets = [
        (fqn, m) for fqn, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and (filter_fn is None or filter_fn(m, fqn))
    ]
    for fqn, module in targets:
        reason = _quantizable(module, fqn, config)
        if reason is not None:
            raise ValueError(
                f"quantize_: cannot quantize linear {fqn!r}: {reason}. Leave it out: "
                "quantize_(model, config, filter_fn=lambda m, fqn: fqn != ...)"
            )
    kind = (DynamicInt8Linear if isinstance(config, Int8DynamicActivationInt8WeightConfig)
            else WeightOnlyLinear)
    for fqn, module in targets:
        _set_submodule(model, fqn, kind(module, config))
    return model


def _set_submodule(model: torch.nn.Module, fqn: str, new: torch.nn.Module) -> None:
    if not fqn:
        raise ValueError("quantize_: the model itself is a Linear; wrap it in a module first")
    parent, _, name = fqn.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, new)
