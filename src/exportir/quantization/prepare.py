"""``prepare_pt2e``: annotate a captured graph with a quantizer and insert observers.

Every annotated edge ``(producer, consumer)`` and annotated output gets an observer module
(``activation_post_process_<i>`` submodules, ``call_module`` nodes). Edges and outputs that
must share qparams share one observer: those a ``SharedQuantizationSpec`` points at, and an
edge whose spec equals the output spec of its producer (implicit sharing, unless the consumer's
annotation sets ``allow_implicit_sharing=False``). Running the prepared module calibrates the
observers; :func:`exportir.quantization.convert_pt2e` then replaces them by quantize /
dequantize ops.
"""

from __future__ import annotations

from typing import Any

import torch

from exportir.fx.graph_module import GraphModule
from exportir.fx.node import Node
from exportir.quantization._graph import fold_conv_bn, require_graph_module
from exportir.quantization.observer import ObserverBase
from exportir.quantization.quantizer import Quantizer
from exportir.quantization.spec import (
    Q_ANNOTATION_KEY,
    DerivedQuantizationSpec,
    FixedQParamsQuantizationSpec,
    QuantizationSpec,
    SharedQuantizationSpec,
)

__all__ = ["DerivedObserver", "FixedQParamsObserver", "prepare_pt2e"]

OBSERVER_PREFIX = "activation_post_process_"


class FixedQParamsObserver(ObserverBase):
    """qparams given up front (:class:`FixedQParamsQuantizationSpec`)."""

    def __init__(self, scale: float, zero_point: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scale, self.zero_point = scale, zero_point

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor([self.scale]), torch.tensor([self.zero_point])


class DerivedObserver(ObserverBase):
    """qparams computed from other observers (:class:`DerivedQuantizationSpec`)."""

    def __init__(self, spec: DerivedQuantizationSpec, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._derive = spec.derive_qparams_fn
        self._sources: list[ObserverBase] = []

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._derive(list(self._sources))


class _Groups:
    """Union-find over edges ``(producer, consumer)`` and nodes."""

    def __init__(self) -> None:
        self.parent: dict[Any, Any] = {}

    def find(self, key: Any) -> Any:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def union(self, a: Any, b: Any) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


def _collect(model: GraphModule) -> tuple[dict[Any, Any], dict[Any, bool]]:
    """Annotated keys -> spec, and per edge whether implicit sharing is allowed."""
    specs: dict[Any, Any] = {}
    implicit: dict[Any, bool] = {}
    for node in model.graph.nodes:
        ann = node.meta.get(Q_ANNOTATION_KEY)
        if ann is None:
            continue
        for arg, spec in ann.input_qspec_map.items():
            if spec is not None:
                specs[(arg, node)] = spec
                implicit[(arg, node)] = ann.allow_implicit_sharing
        if ann.output_qspec is not None:
            specs[node] = ann.output_qspec
    return specs, implicit


def _unwrap(specs: dict[Any, Any], spec: Any) -> Any:
    """The spec a chain of ``SharedQuantizationSpec`` s ends at (None if it ends nowhere)."""
    seen = set()
    while isinstance(spec, SharedQuantizationSpec) and id(spec) not in seen:
        seen.add(id(spec))
        spec = specs.get(spec.edge_or_node)
    return None if isinstance(spec, SharedQuantizationSpec) else spec


def _group(specs: dict[Any, Any], implicit: dict[Any, bool]) -> _Groups:
    groups = _Groups()
    for key, spec in specs.items():
        groups.find(key)
        if isinstance(spec, SharedQuantizationSpec):
            groups.union(key, spec.edge_or_node)
        elif isinstance(key, tuple) and implicit.get(key, True):
            producer_spec = _unwrap(specs, specs.get(key[0]))
            if producer_spec is not None and producer_spec == spec:
                groups.union(key, key[0])
    return groups


def _make_observer(spec: Any) -> ObserverBase:
    """The observer a (non-shared) spec asks for."""
    common = {"dtype": spec.dtype, "quant_min": spec.quant_min, "quant_max": spec.quant_max,
              "is_dynamic": spec.is_dynamic}
    if spec.qscheme is not None:
        common["qscheme"] = spec.qscheme
    if isinstance(spec, FixedQParamsQuantizationSpec):
        return FixedQParamsObserver(spec.scale, spec.zero_point, **common)
    if getattr(spec, "ch_axis", None) is not None:
        common["ch_axis"] = spec.ch_axis
    if isinstance(spec, DerivedQuantizationSpec):
        return DerivedObserver(spec, **common)
    if isinstance(spec, QuantizationSpec):
        return spec.observer_or_fake_quant_ctr(**common)
    raise TypeError(
        f"prepare_pt2e: unknown quantization spec {type(spec).__name__}; use QuantizationSpec, "
        "SharedQuantizationSpec, DerivedQuantizationSpec or FixedQParamsQuantizationSpec"
    )


def _observers(specs: dict[Any, Any], groups: _Groups) -> dict[Any, ObserverBase]:
    """One observer per sharing group, for every key."""
    concrete: dict[Any, Any] = {}
    for key, spec in specs.items():
        if not isinstance(spec, SharedQuantizationSpec):
            concrete.setdefault(groups.find(key), spec)
    made: dict[Any, ObserverBase] = {}
    mapping: dict[Any, ObserverBase] = {}
    for key in specs:
        root = groups.find(key)
        if root not in concrete:
            raise ValueError(
                f"prepare_pt2e: {_describe(key)} shares qparams (SharedQuantizationSpec) with "
                "nothing that has its own QuantizationSpec; annotate the edge or node it "
                "points at"
            )
        if root not in made:
            made[root] = _make_observer(concrete[root])
        mapping[key] = made[root]
    for key, spec in specs.items():
        if isinstance(spec, DerivedQuantizationSpec):
            missing = [k for k in spec.derived_from if k not in mapping]
            if missing:
                raise ValueError(
                    f"prepare_pt2e: {_describe(key)} derives its qparams from "
                    f"{', '.join(map(_describe, missing))}, which no annotation quantizes"
                )
            mapping[key]._sources = [mapping[k] for k in spec.derived_from]
    return mapping


def _describe(key: Any) -> str:
    if isinstance(key, tuple):
        return f"the edge {key[0].name} -> {key[1].name}"
    return f"the output of {key.name}"


class _Inserter:
    """Adds observer modules and the nodes calling them."""

    def __init__(self, model: GraphModule) -> None:
        self.model = model
        self.count = 0
        self.node_of: dict[tuple[Node, int], Node] = {}  # (input, observer id) -> its node

    def observe(self, value: Node, observer: ObserverBase, after: Node) -> Node:
        found = self.node_of.get((value, id(observer)))
        if found is not None:
            return found
        while hasattr(self.model, f"{OBSERVER_PREFIX}{self.count}"):
            self.count += 1
        name = f"{OBSERVER_PREFIX}{self.count}"
        self.model.add_submodule(name, observer)
        if after.op == "placeholder":  # observers follow every placeholder
            after = _last_placeholder(self.model)
        with self.model.graph.inserting_after(after):
            node = self.model.graph.call_module(name, (value,))
        if "val" in value.meta:
            node.meta["val"] = value.meta["val"]
        self.node_of[(value, id(observer))] = node
        return node


def _insert(model: GraphModule, specs: dict[Any, Any], mapping: dict[Any, ObserverBase]) -> None:
    inserter = _Inserter(model)
    observed: dict[Node, Node] = {}
    for node in list(model.graph.nodes):
        if node in specs and node.op != "output":
            obs = inserter.observe(node, mapping[node], node)
            node.replace_all_uses_with(obs, delete_user_cb=lambda u, obs=obs: u is not obs)
            observed[node] = obs
    for key in specs:
        if not isinstance(key, tuple):
            continue
        producer, consumer = key
        current = observed.get(producer, producer)
        if producer in observed and mapping[producer] is mapping[key]:
            continue  # the consumer reads the shared output observer already
        obs = inserter.observe(current, mapping[key], current)
        consumer.replace_input_with(current, obs)


def _last_placeholder(model: GraphModule) -> Node:
    return list(model.graph.find_nodes(op="placeholder"))[-1]


def prepare_pt2e(model: GraphModule, quantizer: Quantizer) -> GraphModule:
    """Annotate ``model`` (``exportir.export(m, args).module()``) with ``quantizer`` and insert
    observers; run the result on calibration data, then :func:`convert_pt2e` it. Batch norms
    after convolutions are folded into them first (as torchao's ``prepare_pt2e`` does)."""
    model = require_graph_module(model, "prepare_pt2e")
    fold_conv_bn(model)
    model = quantizer.transform_for_annotation(model)
    quantizer.annotate(model)
    quantizer.validate(model)
    specs, implicit = _collect(model)
    mapping = _observers(specs, _group(specs, implicit))
    quantizer.prepare_obs_or_fq_callback(model, mapping)
    _insert(model, specs, mapping)
    model.graph.lint()
    model.recompile()
    return model
