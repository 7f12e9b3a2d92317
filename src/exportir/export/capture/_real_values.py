"""The values a capture's graph takes on the real example inputs, computed only when asked.

Capture runs the user's code on fake tensors, so a data-dependent value (``u0`` of
``n = t.item()``, the row count of ``x[mask]``) has no value while tracing. But the example
inputs are real tensors: re-running the recorded graph on them (copies of the inputs and of the
module state, so nothing of the user's changes) gives every intermediate value. Two features
read them:

- ``torch.compiler.assume_constant_result``: the decorated function's result is a constant of
  the program, its value on the example inputs (constant_result.py);
- ``draft_export``: a Python branch on a data-dependent value follows the example inputs and is
  checked at run time by an ``_assert_scalar`` (the ShapeEnv asks :meth:`symbol_value`).

The graph is run incrementally (nodes already run keep their values), and not at all in an
export that never asks. A node that cannot run on real tensors (an op with only a fake kernel)
stops the replay there: later values are unknown and the caller falls back to its error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sympy
import torch

from exportir.fx import Node
from exportir.fx.node import map_aggregate
from exportir.symbolic.data_dependent import SYM_TYPES as _SYM_TYPES

if TYPE_CHECKING:
    from exportir.export.capture.recorder import Recorder



class RealValues:
    """Runs a :class:`Recorder`'s graph on the real example inputs, up to where it is asked."""

    __slots__ = ("_broken", "_rec", "_symbols", "_values")

    def __init__(self, rec: Recorder) -> None:
        self._rec = rec
        self._values: dict[Node, Any] = {}
        self._symbols: dict[sympy.Symbol, Any] = {}
        self._broken: Node | None = None  # the first node that could not run

    # -- queries ---------------------------------------------------------------------------

    def symbol_value(self, sym: sympy.Symbol) -> Any:
        """The value of unbacked symbol ``sym`` on the example inputs, or None if unknown."""
        if sym not in self._symbols:
            self._run(until=lambda: sym in self._symbols)
        return self._symbols.get(sym)

    def tensor_value(self, fake: torch.Tensor) -> torch.Tensor | None:
        """The real value of a traced (fake) tensor, or None if unknown."""
        hit = self._rec.nodes.get(id(fake))
        if hit is None or hit[0] is not fake:
            return None
        node = hit[1]
        if node not in self._values:
            self._run(until=lambda: node in self._values)
        value = self._values.get(node)
        return value if isinstance(value, torch.Tensor) else None

    def value_of(self, expr: sympy.Basic) -> Any:
        """``expr`` (over backed and unbacked symbols) on the example inputs, or None."""
        env = self._rec.shape_env
        values: dict[sympy.Symbol, Any] = {}
        for sym in expr.free_symbols:
            value = env.var_to_hint.get(sym)
            if value is None:
                value = self.symbol_value(sym)
            if value is None:
                return None
            values[sym] = value
        from exportir.symbolic.functions import evaluate

        out = evaluate(expr, values)
        return None if isinstance(out, sympy.Basic) else out

    # -- running the graph -----------------------------------------------------------------

    def _run(self, until: Any) -> None:
        if self._broken is not None:
            return
        with RealMode():
            for node in self._rec.graph.nodes:
                if node in self._values:
                    continue
                try:
                    self._values[node] = self._run_node(node)
                except Exception:  # noqa: BLE001  (any failure: the value is just unknown)
                    self._broken = node
                    return
                self._bind_symbols(node)
                if until():
                    return

    def _run_node(self, node: Node) -> Any:
        if node.op == "placeholder":
            return _fresh(self._rec.inputs[node].value)
        if node.op == "call_function":
            args = map_aggregate(node.args, self._arg)
            kwargs = map_aggregate(dict(node.kwargs), self._arg)
            return node.target(*args, **kwargs)
        if node.op == "get_attr":
            return self._rec.subgraphs[node.target]
        return None  # output

    def _arg(self, a: Any) -> Any:
        if isinstance(a, Node):
            return self._values[a]
        if isinstance(a, str) and a in self._rec.subgraphs:  # a cond/map body, named
            return self._rec.subgraphs[a]
        return a

    def _bind_symbols(self, node: Node) -> None:
        """Symbols the node's fake value introduces, read off its real value."""
        val, real = node.meta.get("val"), self._values[node]
        if isinstance(val, _SYM_TYPES):
            self._bind(val.node.expr, real)
        elif isinstance(val, torch.Tensor) and isinstance(real, torch.Tensor):
            for size, n in zip(val.shape, real.shape):
                if isinstance(size, torch.SymInt):
                    self._bind(size.node.expr, n)
        elif isinstance(val, (tuple, list)) and isinstance(real, (tuple, list)):
            for v, r in zip(val, real):
                if isinstance(v, torch.Tensor) and isinstance(r, torch.Tensor):
                    for size, n in zip(v.shape, r.shape):
                        if isinstance(size, torch.SymInt):
                            self._bind(size.node.expr, n)

    def _bind(self, expr: sympy.Basic, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            value = value.item()
        if isinstance(expr, sympy.Symbol):
            self._symbols.setdefault(expr, value)
        elif isinstance(expr, sympy.Eq) and isinstance(expr.lhs, sympy.Symbol) and expr.rhs == 1:
            self._symbols.setdefault(expr.lhs, int(bool(value)))  # an unbacked bool: Eq(u, 1)


def _fresh(value: Any) -> Any:
    """A copy the replay may write to (in-place ops of the graph run on it)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return value


class RealMode:
    """Runs real kernels from inside the capture: no dispatch or function modes (the capture's
    own modes are below on the stack), restored on exit."""

    __slots__ = ("_dispatch", "_function")

    def __enter__(self) -> None:
        self._dispatch = torch._C._DisableTorchDispatch()
        self._function = torch._C.DisableTorchFunction()
        self._dispatch.__enter__()
        self._function.__enter__()

    def __exit__(self, *exc: object) -> None:
        try:
            self._function.__exit__(*exc)
        finally:
            self._dispatch.__exit__(*exc)
