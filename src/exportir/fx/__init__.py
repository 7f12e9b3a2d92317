"""exportir.fx: a from-scratch, source-compatible implementation of ``torch.fx``.

Switch with one line: ``import exportir.fx as fx``.
"""

from exportir.fx.node import Node, has_side_effect, map_arg, map_aggregate
from exportir.fx.graph import CodeGen, Graph, PythonCode
from exportir.fx.graph_module import GraphModule
from exportir.fx.proxy import Attribute, GraphAppendingTracer, Proxy, TraceError, TracerBase
from exportir.fx.tracer import PH, ProxyableClassMeta, Tracer, symbolic_trace, wrap
from exportir.fx.interpreter import Interpreter, Transformer
from exportir.fx.subgraph_rewriter import replace_pattern

__all__ = [
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
