"""Quantization: torchao's PT2E flow (``prepare_pt2e`` / ``convert_pt2e`` with a
``Quantizer``) and weight-only and dynamic-activation quantization of linear layers (``quantize_``).

See docs/quantization.md. Nothing here imports torch.ao or torchao.
"""

from exportir.quantization.convert import convert_pt2e
from exportir.quantization.observer import (
    MinMaxObserver,
    ObserverBase,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
)
from exportir.quantization.prepare import prepare_pt2e
from exportir.quantization.quantizer import Quantizer
from exportir.quantization.spec import (
    DerivedQuantizationSpec,
    EdgeOrNode,
    FixedQParamsQuantizationSpec,
    QuantizationAnnotation,
    QuantizationSpec,
    QuantizationSpecBase,
    SharedQuantizationSpec,
)
from exportir.quantization.weight_only import (
    DynamicInt8Linear,
    Int4WeightOnlyConfig,
    Int8DynamicActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    WeightOnlyLinear,
    int4_weight_only,
    int8_dynamic_activation_int8_weight,
    int8_weight_only,
    quantize_,
)
from exportir.quantization.xnnpack import (
    QuantizationConfig,
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)

__all__ = [
    "DerivedQuantizationSpec",
    "DynamicInt8Linear",
    "EdgeOrNode",
    "FixedQParamsQuantizationSpec",
    "Int4WeightOnlyConfig",
    "Int8DynamicActivationInt8WeightConfig",
    "Int8WeightOnlyConfig",
    "MinMaxObserver",
    "ObserverBase",
    "PerChannelMinMaxObserver",
    "PlaceholderObserver",
    "QuantizationAnnotation",
    "QuantizationConfig",
    "QuantizationSpec",
    "QuantizationSpecBase",
    "Quantizer",
    "SharedQuantizationSpec",
    "WeightOnlyLinear",
    "XNNPACKQuantizer",
    "convert_pt2e",
    "get_symmetric_quantization_config",
    "int4_weight_only",
    "int8_dynamic_activation_int8_weight",
    "int8_weight_only",
    "prepare_pt2e",
    "quantize_",
]
