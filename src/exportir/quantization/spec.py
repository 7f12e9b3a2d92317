"""What a quantizer says about a graph: specs on edges and values, annotations on nodes.

The names and fields are torchao's (``torchao.quantization.pt2e.quantizer``): a quantizer
written against that API reads the same here. An *edge* is ``(producer, consumer)``: the
tensor ``producer`` computes, as ``consumer`` reads it; a *node* stands for its output.
``QuantizationAnnotation`` goes on ``node.meta["quantization_annotation"]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from exportir.fx.node import Node

__all__ = [
    "Q_ANNOTATION_KEY",
    "DerivedQuantizationSpec",
    "EdgeOrNode",
    "FixedQParamsQuantizationSpec",
    "QuantizationAnnotation",
    "QuantizationSpec",
    "QuantizationSpecBase",
    "SharedQuantizationSpec",
]

Q_ANNOTATION_KEY = "quantization_annotation"

EdgeOrNode = tuple[Node, Node] | Node


class QuantizationSpecBase:
    """How one tensor (an edge or a node's output) is quantized."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class QuantizationSpec(QuantizationSpecBase):
    """Quantize with qparams an observer made by ``observer_or_fake_quant_ctr()`` computes
    (calibration), or, with ``is_dynamic``, with qparams computed from each input at run time.
    ``qscheme``: ``torch.per_tensor_affine`` / ``per_tensor_symmetric`` /
    ``per_channel_symmetric`` / ``per_channel_affine``; ``ch_axis`` for the per-channel ones."""

    dtype: torch.dtype
    observer_or_fake_quant_ctr: Callable[..., Any]
    quant_min: int | None = None
    quant_max: int | None = None
    qscheme: Any = None
    ch_axis: int | None = None
    is_dynamic: bool = False

    def __post_init__(self) -> None:
        bounds = (self.quant_min, self.quant_max)
        if None not in bounds and self.quant_min > self.quant_max:
            raise ValueError(
                f"QuantizationSpec: quant_min {self.quant_min} must be <= quant_max "
                f"{self.quant_max}"
            )
        if self.ch_axis is not None and self.ch_axis < 0:
            raise ValueError(f"QuantizationSpec: ch_axis must be >= 0; got {self.ch_axis}")


@dataclass(frozen=True, slots=True)
class FixedQParamsQuantizationSpec(QuantizationSpecBase):
    """Quantize with the given ``scale`` / ``zero_point`` (sigmoid's output, ...)."""

    dtype: torch.dtype
    scale: float
    zero_point: int
    quant_min: int | None = None
    quant_max: int | None = None
    qscheme: Any = None
    is_dynamic: bool = False


@dataclass(frozen=True, slots=True)
class SharedQuantizationSpec(QuantizationSpecBase):
    """Use the qparams of another edge or node (max_pool's output shares its input's)."""

    edge_or_node: Any


@dataclass(frozen=True, slots=True)
class DerivedQuantizationSpec(QuantizationSpecBase):
    """qparams computed by ``derive_qparams_fn(observers)`` from the observers of
    ``derived_from`` (a bias's scale = input scale * weight scale)."""

    derived_from: tuple[Any, ...]
    derive_qparams_fn: Callable[[list[Any]], tuple[torch.Tensor, torch.Tensor]]
    dtype: torch.dtype
    quant_min: int | None = None
    quant_max: int | None = None
    qscheme: Any = None
    ch_axis: int | None = None
    is_dynamic: bool = False


@dataclass(slots=True)
class QuantizationAnnotation:
    """How a node's inputs (``input_qspec_map``: input node -> spec) and output are quantized.
    Mutable, as torchao's: quantizers fill it in while annotating."""

    input_qspec_map: dict[Node, QuantizationSpecBase | None] = field(default_factory=dict)
    output_qspec: QuantizationSpecBase | None = None
    allow_implicit_sharing: bool = True
    _annotated: bool = False
