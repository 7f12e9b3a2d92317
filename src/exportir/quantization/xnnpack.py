"""``XNNPACKQuantizer``: ExecuTorch's XNNPACK quantization recipe over exportir graphs.

``get_symmetric_quantization_config(is_per_channel=True, is_dynamic=False)`` gives its
configuration: int8 weights symmetric in ``[-127, 127]`` (per output channel, or per tensor),
int8 activations affine in ``[-128, 127]``, observed by min/max during calibration (static) or
quantized from each input's own range at run time (dynamic; only the inputs of linear and
convolution are quantized then), float biases.

What it annotates (static), in priority order so fused patterns win:

- ``linear`` / ``conv2d`` followed by ``relu`` (or ``hardtanh`` / ``relu6``): quantized inputs
  and weight, quantized output after the activation;
- ``linear`` / ``conv2d``: quantized input, weight and output;
- ``adaptive_avg_pool2d``: input quantized, output sharing its qparams;
- ``add`` / ``mul`` (followed by ``relu`` or not): both inputs and the output.

Then ops that only move or select values (``relu``, ``max_pool2d``, ``mean``, ``view``,
``permute``, ...) after an annotated output share its qparams (ExecuTorch's
``propagate_annotation``). Dynamic configurations annotate ``linear`` only, as ExecuTorch's
quantizer does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from exportir.fx.graph_module import GraphModule
from exportir.fx.node import Node
from exportir.quantization.observer import (
    MinMaxObserver,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
)
from exportir.quantization.quantizer import Quantizer
from exportir.quantization.spec import (
    Q_ANNOTATION_KEY,
    QuantizationAnnotation,
    QuantizationSpec,
    SharedQuantizationSpec,
)

__all__ = ["QuantizationConfig", "XNNPACKQuantizer", "get_symmetric_quantization_config"]

aten = torch.ops.aten


@dataclass(frozen=True, slots=True)
class QuantizationConfig:
    """Specs for an op's input activations, output activations, weight and bias."""

    input_activation: QuantizationSpec | None
    output_activation: QuantizationSpec | None
    weight: QuantizationSpec | None
    bias: QuantizationSpec | None
    is_qat: bool = False


def get_symmetric_quantization_config(
    is_per_channel: bool = False,
    is_qat: bool = False,
    is_dynamic: bool = False,
    act_qmin: int = -128,
    act_qmax: int = 127,
    weight_qmin: int = -127,
    weight_qmax: int = 127,
) -> QuantizationConfig:
    """ExecuTorch's XNNPACK configuration (module docstring)."""
    if is_qat:
        raise NotImplementedError(
            "get_symmetric_quantization_config(is_qat=True): quantization-aware training "
            "(fake-quantize modules) is not built; use post-training quantization (is_qat=False)"
        )
    act_observer = PlaceholderObserver if is_dynamic else MinMaxObserver.with_args(eps=2**-12)
    act = QuantizationSpec(
        dtype=torch.int8, quant_min=act_qmin, quant_max=act_qmax,
        qscheme=torch.per_tensor_affine, is_dynamic=is_dynamic,
        observer_or_fake_quant_ctr=act_observer,
    )
    weight = QuantizationSpec(
        dtype=torch.int8, quant_min=weight_qmin, quant_max=weight_qmax,
        qscheme=torch.per_channel_symmetric if is_per_channel else torch.per_tensor_symmetric,
        ch_axis=0, observer_or_fake_quant_ctr=(
            PerChannelMinMaxObserver if is_per_channel else MinMaxObserver
        ),
    )
    return QuantizationConfig(act, None if is_dynamic else act, weight, None)


# ------------------------------------------------------------------------------ annotators

_CONV_LINEAR = (aten.conv2d.default, aten.linear.default, aten.conv1d.default)
_ACTIVATIONS = (aten.relu.default, aten.relu_.default, aten.hardtanh.default,
                aten.hardtanh_.default, aten.relu6.default)
_BINARY = (aten.add.Tensor, aten.add_.Tensor, aten.mul.Tensor, aten.mul_.Tensor)
_POOLS = (aten.adaptive_avg_pool2d.default,)
_LINEAR = (aten.linear.default,)

Annotator = Callable[[Node, QuantizationConfig], bool]


def _annotated(node: Node) -> bool:
    ann = node.meta.get(Q_ANNOTATION_KEY)
    return ann is not None and ann._annotated


def _mark(node: Node, inputs: dict[Node, Any], output: Any = None) -> None:
    node.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(inputs, output, _annotated=True)


def _is_float_tensor(node: Any) -> bool:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return isinstance(val, torch.Tensor) and val.dtype.is_floating_point


def _only_user(node: Node) -> Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _weight_inputs(node: Node, config: QuantizationConfig) -> dict[Node, Any] | None:
    x, w = node.args[0], node.args[1]
    if not (_is_float_tensor(x) and _is_float_tensor(w)):
        return None
    inputs: dict[Node, Any] = {x: config.input_activation, w: config.weight}
    bias = node.args[2] if len(node.args) > 2 else None
    if isinstance(bias, Node) and config.bias is not None:
        inputs[bias] = config.bias
    return inputs


def _conv_linear_act(node: Node, config: QuantizationConfig) -> bool:
    if node.target not in _CONV_LINEAR or config.output_activation is None:
        return False
    act = _only_user(node)
    if act is None or act.target not in _ACTIVATIONS or _annotated(act):
        return False
    inputs = _weight_inputs(node, config)
    if inputs is None:
        return False
    _mark(node, inputs)
    _mark(act, {}, config.output_activation)
    return True


def _conv_linear(node: Node, config: QuantizationConfig) -> bool:
    if node.target not in _CONV_LINEAR:
        return False
    inputs = _weight_inputs(node, config)
    if inputs is None:
        return False
    _mark(node, inputs, config.output_activation)
    return True


def _binary(node: Node, config: QuantizationConfig) -> bool:
    if node.target not in _BINARY or config.output_activation is None:
        return False
    a, b = node.args[:2]
    if not (_is_float_tensor(a) and _is_float_tensor(b)):
        return False
    act = _only_user(node)
    fused = act is not None and act.target in _ACTIVATIONS and not _annotated(act)
    _mark(node, {a: config.input_activation, b: config.input_activation},
          None if fused else config.output_activation)
    if fused:
        _mark(act, {}, config.output_activation)
    return True


def _pool(node: Node, config: QuantizationConfig) -> bool:
    if node.target not in _POOLS or config.output_activation is None:
        return False
    x = node.args[0]
    if not _is_float_tensor(x):
        return False
    ann = x.meta.get(Q_ANNOTATION_KEY)
    observed = ann is not None and ann._annotated and ann.output_qspec is not None
    spec = SharedQuantizationSpec(x) if observed else config.input_activation
    _mark(node, {x: spec}, SharedQuantizationSpec((x, node)))
    return True


def _dynamic_linear(node: Node, config: QuantizationConfig) -> bool:
    if node.target not in _LINEAR:
        return False
    inputs = _weight_inputs(node, config)
    if inputs is None:
        return False
    _mark(node, inputs)
    return True


# ops whose output keeps its input's qparams (ExecuTorch's _is_share_obs_or_fq_op)
SHARING_OPS = frozenset({
    aten.relu.default, aten.hardtanh.default, aten.hardtanh_.default, aten.max_pool2d.default,
    aten.mean.default, aten.mean.dim, aten.permute.default, aten.permute_copy.default,
    aten.squeeze.dim, aten.squeeze_copy.dim, aten.adaptive_avg_pool2d.default,
    aten.view_copy.default, aten.view.default, aten.slice_copy.Tensor, aten.flatten.using_ints,
})  # fmt: skip


def propagate_annotation(nodes: Iterable[Node]) -> None:
    """Annotate :data:`SHARING_OPS` reading an annotated output to share its qparams."""
    for node in nodes:
        if node.target not in SHARING_OPS or _annotated(node) or not node.args:
            continue
        prev = node.args[0]
        ann = prev.meta.get(Q_ANNOTATION_KEY) if isinstance(prev, Node) else None
        if ann is None or ann.output_qspec is None:
            continue
        shared = SharedQuantizationSpec(prev)
        _mark(node, {prev: shared}, shared)


STATIC_ANNOTATORS: tuple[Annotator, ...] = (_conv_linear_act, _conv_linear, _pool, _binary)
DYNAMIC_ANNOTATORS: tuple[Annotator, ...] = (_dynamic_linear,)


class XNNPACKQuantizer(Quantizer):
    """ExecuTorch's XNNPACK quantizer (module docstring). ``set_global(config)`` sets the
    configuration for the whole graph; ``set_module_type(nn.Linear, config)`` /
    ``set_module_name("layer1", config)`` override it (``None``: leave unquantized) for
    nodes captured from such modules."""

    def __init__(self) -> None:
        super().__init__()
        self.global_config: QuantizationConfig | None = None
        self.module_type_config: dict[type, QuantizationConfig | None] = {}
        self.module_name_config: dict[str, QuantizationConfig | None] = {}

    def set_global(self, config: QuantizationConfig | None) -> XNNPACKQuantizer:
        self.global_config = config
        return self

    def set_module_type(self, module_type: type, config: QuantizationConfig | None
                        ) -> XNNPACKQuantizer:
        self.module_type_config[module_type] = config
        return self

    def set_module_name(self, name: str, config: QuantizationConfig | None) -> XNNPACKQuantizer:
        self.module_name_config[name] = config
        return self

    def _config_for(self, node: Node) -> QuantizationConfig | None:
        stack = list((node.meta.get("nn_module_stack") or {}).values())
        for path, module_type in reversed(stack):
            name = _module_name(path)
            if name in self.module_name_config:
                return self.module_name_config[name]
        for path, module_type in reversed(stack):
            for cls, config in self.module_type_config.items():
                if _type_matches(module_type, cls):
                    return config
        return self.global_config

    def annotate(self, model: GraphModule) -> GraphModule:
        nodes = _calls(model.graph.nodes)
        for dynamic, annotators in ((False, STATIC_ANNOTATORS), (True, DYNAMIC_ANNOTATORS)):
            for annotator in annotators:
                for node in nodes:
                    config = self._config_for(node)
                    if config is None or _annotated(node) or _is_dynamic(config) != dynamic:
                        continue
                    annotator(node, config)
        propagate_annotation(n for n in nodes if not _is_dynamic_or_none(self._config_for(n)))
        return model

    def validate(self, model: GraphModule) -> None:
        for node in model.graph.nodes:
            ann = node.meta.get(Q_ANNOTATION_KEY)
            if ann is None:
                continue
            for spec in [*ann.input_qspec_map.values(), ann.output_qspec]:
                dtype = getattr(spec, "dtype", torch.int8)
                if dtype not in (torch.int8, torch.uint8):
                    raise ValueError(
                        f"XNNPACKQuantizer: node {node.name} is annotated with dtype {dtype}; "
                        "XNNPACK runs int8 / uint8 quantized tensors only"
                    )


def _is_dynamic(config: QuantizationConfig) -> bool:
    return config.input_activation is not None and config.input_activation.is_dynamic


def _is_dynamic_or_none(config: QuantizationConfig | None) -> bool:
    return config is None or _is_dynamic(config)


def _calls(nodes: Iterable[Node]) -> list[Node]:
    return [n for n in nodes if n.op == "call_function"]


def _module_name(path: str) -> str:
    """``L['self'].layer1`` / ``layer1`` -> ``layer1``."""
    return path.removeprefix("L['self']").lstrip(".")


def _type_matches(recorded: Any, cls: type) -> bool:
    """Whether ``nn_module_stack``'s recorded type (a class or its qualified name) is ``cls``."""
    if isinstance(recorded, type):
        return recorded is cls
    return str(recorded) == f"{cls.__module__}.{cls.__qualname__}"
