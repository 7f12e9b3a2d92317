"""``split_module``: partition a GraphModule into submodules by a callback.

Not built yet: calling ``split_module`` raises NotImplementedError."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from exportir.fx.graph_module import GraphModule
from exportir.fx.node import Node

__all__ = ["Partition", "split_module"]


class Partition:
    """One partition of ``split_module``: its nodes, inputs, outputs and deps."""

    def __init__(self, name: str) -> None:
        self.name: str = name
        self.submod_name = f"submod_{name}"
        self.node_names: list[str] = []
        self.inputs: dict[str, None] = {}
        self.outputs: dict[str, None] = {}
        self.dependencies: dict[str, None] = {}
        self.dependents: dict[str, None] = {}
        self.graph: Any = None
        self.environment: dict[Node, Node] = {}
        self.targets: dict[str, Any] = {}

    def __repr__(self) -> str:
        return (
            f"name: {self.name},\n"
            f" nodes: {self.node_names},\n"
            f" inputs: {self.inputs},\n"
            f" outputs: {self.outputs},\n"
            f" partitions depended on: {self.dependencies},\n"
            f" partition dependents: {self.dependents}"
        )


def split_module(
    m: GraphModule,
    root_m: torch.nn.Module,
    split_callback: Callable[[Node], int],
    qualname_map: dict[str, str] | None = None,
    keep_original_order: bool | None = False,
    keep_original_node_name: bool | None = False,
    partition_affix: str | None = None,
) -> GraphModule:
    """Split ``m`` into one submodule per ``split_callback`` value (not built yet)."""
    raise NotImplementedError(
        "exportir.fx.passes.split_module.split_module is not implemented yet"
    )
