"""``Quantizer``: the interface a backend implements to say what it wants quantized.

As torchao's: ``transform_for_annotation`` (optional), ``annotate`` (writes
:class:`~exportir.quantization.spec.QuantizationAnnotation` s on nodes), ``validate`` (refuses
annotations the backend cannot run), ``prepare_obs_or_fq_callback`` (optional).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from exportir.fx.graph_module import GraphModule

__all__ = ["Quantizer"]


class Quantizer(ABC):
    """Annotates a graph captured by ``exportir.export(...).module()``."""

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        """Rewrite the graph before annotation (optional; returns it unchanged)."""
        return model

    @abstractmethod
    def annotate(self, model: GraphModule) -> GraphModule:
        """Put ``QuantizationAnnotation`` s on ``node.meta["quantization_annotation"]``."""

    @abstractmethod
    def validate(self, model: GraphModule) -> None:
        """Raise if the annotations ask for something the backend cannot run."""

    def prepare_obs_or_fq_callback(self, model: GraphModule, edge_or_node_to_obs: dict[Any, Any]
                                   ) -> None:
        """Adjust the observers (shared by edges of one sharing group) before insertion."""
