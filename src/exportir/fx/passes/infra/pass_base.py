"""The pass interface: a callable taking a GraphModule and returning a ``PassResult``."""

from __future__ import annotations

import abc
from collections import namedtuple

from torch import nn

from exportir.fx.graph_module import GraphModule

__all__ = ["PassBase", "PassResult"]


class PassResult(namedtuple("PassResult", ["graph_module", "modified"])):
    """Result of a pass: the (possibly new) module and whether it changed."""

    __slots__ = ()

    def __new__(cls, graph_module: nn.Module, modified: bool) -> PassResult:  # noqa: PYI034
        return super().__new__(cls, graph_module, modified)


class PassBase(abc.ABC):
    """Base class for passes: implement ``call``; optionally ``requires`` (checked
    before) and ``ensures`` (checked after). Instances are passes themselves."""

    def __call__(self, graph_module: GraphModule) -> PassResult | None:
        """``requires``, then ``call``, then ``ensures``; returns ``call``'s result."""
        self.requires(graph_module)
        result = self.call(graph_module)
        self.ensures(graph_module)
        return result

    @abc.abstractmethod
    def call(self, graph_module: GraphModule) -> PassResult | None:
        """Run the pass on ``graph_module``."""

    def requires(self, graph_module: GraphModule) -> None:
        """Precondition check; raise to reject ``graph_module``."""

    def ensures(self, graph_module: GraphModule) -> None:
        """Postcondition check; raise if the pass left ``graph_module`` invalid."""
