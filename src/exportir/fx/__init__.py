"""exportir.fx: a from-scratch, source-compatible implementation of ``torch.fx``.

Switch with one line: ``import exportir.fx as fx``.
"""

# Beyond ``__all__`` (torch.fx's list, in torch.fx's order), torch.fx also exposes the other
# names imported here at top level (``fx.PH``, ``fx.CodeGen``...); so do we.
from exportir.fx.graph import CodeGen, Graph, PythonCode  # noqa: F401
from exportir.fx.graph_module import GraphModule
from exportir.fx.interpreter import Interpreter, Transformer
from exportir.fx.node import Node, has_side_effect, map_aggregate, map_arg  # noqa: F401
from exportir.fx.proxy import (  # noqa: F401
    Attribute,
    GraphAppendingTracer,
    Proxy,
    TraceError,
    TracerBase,
)
from exportir.fx.subgraph_rewriter import replace_pattern
from exportir.fx.tracer import PH, ProxyableClassMeta, Tracer, symbolic_trace, wrap  # noqa: F401

__all__ = [  # noqa: RUF022  # torch.fx.__all__, same order
    "symbolic_trace",
    "Tracer",
    "wrap",
    "Graph",
    "GraphModule",
    "Interpreter",
    "Transformer",
    "Node",
    "Proxy",
    "replace_pattern",
    "has_side_effect",
    "map_arg",
]
