"""The symbolic sizes of a method's inputs, as the program file records them (format 2.1).

For every tensor input, each dimension is static (``None``) or ``coeff * symbol + offset`` of a
symbol the method declares with its name (the user's ``Dim`` name) and the range a call may
use: the exported program's ``range_constraints`` (what the user declared, as torch.export
reports it) within the bounds the memory plan was made for. A ``Dim.AUTO`` / ``Dim.DYNAMIC``
size whose range starts at 2 (export's assumption while tracing, not the user's) accepts 0 and
1, as ``ep.module()`` does; a named ``Dim``'s ``min`` is enforced as declared. The runtime checks a call's inputs
against them before running anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy

from exportir.format import schema


def _int_or_none(x: Any) -> int | None:
    if isinstance(x, int):
        return x
    if getattr(x, "is_Integer", False):
        return int(x)
    return None


def _linear(expr: sympy.Expr) -> tuple[sympy.Symbol, int, int] | None:
    """``expr`` as ``coeff * symbol + offset`` with integers, ``coeff >= 1``, else None."""
    free = expr.free_symbols
    if len(free) != 1:
        return None
    (symbol,) = free
    poly = sympy.Poly(expr, symbol) if expr.is_polynomial(symbol) else None
    if poly is None or poly.degree() != 1:
        return None
    coeff, offset = poly.all_coeffs()
    if not (coeff.is_Integer and offset.is_Integer) or coeff < 1:
        return None
    return symbol, int(coeff), int(offset)


class InputSizes:
    """Collects the symbols of the inputs in order of first appearance."""

    def __init__(self, ep: Any) -> None:
        self.ep = ep
        self.symbols: list[schema.SymbolRange] = []
        self.index: dict[Any, int] = {}

    def _symbol(self, symbol: Any, env: Any, where: str) -> int:
        found = self.index.get(symbol)
        if found is not None:
            return found
        declared = self.ep.range_constraints.get(symbol)
        low = _int_or_none(getattr(declared, "lower", None))
        high = _int_or_none(getattr(declared, "upper", None))
        planned = _int_or_none(env.bound(symbol).upper) if env is not None else None
        if planned is not None:
            high = planned if high is None else min(high, planned)
        named = getattr(env, "var_to_name", {}).get(symbol)
        if not named and low is not None and low <= 2:
            low = 0  # a hint's 2 is export's assumption, not the user's: 0 and 1 run (as torch)
        found = self.index[symbol] = len(self.symbols)
        self.symbols.append(schema.SymbolRange(named or where, max(low or 0, 0), high))
        return found

    def dim(self, size: Any, where: str) -> schema.DimSize | None:
        if isinstance(size, int):
            return None
        node = getattr(size, "node", None)
        env, expr = getattr(node, "shape_env", None), getattr(node, "expr", None)
        if expr is None:
            return None
        if env is not None:
            expr = env.replace(expr)
        if expr.is_number:
            return None
        linear = _linear(expr)
        if linear is None:  # not an affine size of one symbol: a symbol of its own
            return schema.DimSize(self._symbol(expr, env, where))
        symbol, coeff, offset = linear
        return schema.DimSize(self._symbol(symbol, env, where), coeff, offset)

    def input(self, name: str, val: Any) -> tuple[schema.DimSize | None, ...]:
        if not hasattr(val, "shape"):
            return ()
        return tuple(self.dim(s, f"{name}.size({d})") for d, s in enumerate(val.shape))


def input_sizes(
    ep: Any, names: Sequence[str], vals: Sequence[Any]
) -> tuple[tuple[schema.SymbolRange, ...], tuple[tuple[schema.DimSize | None, ...], ...]]:
    """(symbols, input_dims) of a method whose inputs are ``vals`` (their ``meta["val"]``);
    both empty when every input size is static."""
    sizes = InputSizes(ep)
    dims = tuple(sizes.input(n, v) for n, v in zip(names, vals))
    if not sizes.symbols:
        return (), ()
    return tuple(sizes.symbols), dims
