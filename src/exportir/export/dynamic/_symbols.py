"""The backed symbols of one export call's marked dimensions (docs/dev/dynamic-plan.md).

:func:`make_sizes` turns a :class:`~exportir.export.dynamic.dims.DimPlan` into symbolic sizes
for capture and the :class:`~exportir.export.dynamic._constraints.SymbolTable` that
``_constraints.solve`` reads after tracing: one symbol per Dim name or hint dimension, linear
expressions of them for derived dims.
"""

from __future__ import annotations

from typing import Any

import sympy

from exportir.export.dynamic._constraints import SymbolInfo, SymbolTable
from exportir.export.dynamic.dims import DimPlan, DimRequest, DimSpec, UserError, UserErrorType
from exportir.symbolic import DimDynamic, ValueRanges

__all__ = ["make_sizes"]


def make_sizes(plan: DimPlan, shape_env: Any) -> tuple[dict[int, dict[int, Any]], SymbolTable]:
    """Create the backed symbols of ``plan`` in ``shape_env``.

    Returns ``({id(tensor): {dim: sympy expr}}, SymbolTable)``: the symbolic sizes of the
    marked dims (unmarked / static dims keep their example size) and the table the solver
    reads after tracing.
    """
    return _SymbolMaker(plan, shape_env).run()


def _new_symbol(shape_env: Any, hint: int, source: str, low: int, high: int | None) -> sympy.Symbol:
    """A backed symbol for one dimension, traced within the user's bounds (and >= 2, as torch:
    sizes 0 and 1 are never assumed during tracing)."""
    upper = sympy.oo if high is None else high
    lower = max(low, 2) if hint >= 2 else low
    vr = ValueRanges.of(lower, max(upper, lower))
    return shape_env.create_backed_symbol(hint, source, dynamic=DimDynamic.DYNAMIC, vr=vr)


class _SymbolMaker:
    """Creates one symbol per Dim name / hint dim, and expressions for derived dims."""

    def __init__(self, plan: DimPlan, shape_env: Any) -> None:
        self.plan = plan
        self.shape_env = shape_env
        self.sizes: dict[int, dict[int, Any]] = {}
        self.infos: list[SymbolInfo] = []
        self.by_name: dict[str, tuple[sympy.Symbol, DimRequest]] = {}
        self.derived: list[tuple[sympy.Expr, DimSpec]] = []

    def run(self) -> tuple[dict[int, dict[int, Any]], SymbolTable]:
        for r in self.plan.requests:  # roots first: derived dims may name a later root
            if r.spec.kind in ("named", "auto", "dynamic"):
                self._plain(r)
        for r in self.plan.requests:
            if r.spec.kind == "derived":
                self._derived(r)
        return self.sizes, SymbolTable(tuple(self.infos), tuple(self.derived))

    def _set(self, r: DimRequest, expr: Any) -> None:
        self.sizes.setdefault(r.tensor_id, {})[r.dim] = expr

    def _info(self, symbol: sympy.Symbol, hint: int, sources: tuple, spec: DimSpec, phantom=False):
        self.infos.append(SymbolInfo(symbol, hint, sources, spec, phantom))
        if spec.kind == "named" and spec.name:  # for errors naming the user's Dim later
            self.shape_env.var_to_name[symbol] = spec.name

    def _plain(self, r: DimRequest) -> None:
        spec = r.spec
        if spec.kind == "named" and spec.name in self.by_name:
            symbol, first = self.by_name[spec.name]
            if first.hint != r.hint:
                raise UserError(
                    UserErrorType.CONSTRAINT_VIOLATION,
                    f"{r.source} = {r.hint} is not equal to {first.source} = {first.hint}",
                )
            self._set(r, symbol)
            return
        if spec.kind != "auto" and spec.min is not None and r.hint < spec.min:
            raise UserError(
                UserErrorType.CONSTRAINT_VIOLATION,
                f"{r.hint} not in range [{spec.min}, {'int_oo' if spec.max is None else spec.max}]"
                f" for {r.source}: the example input's size is outside {spec.text}; change the "
                "example or the Dim's bounds",
            )
        if spec.max is not None and r.hint > spec.max:
            raise UserError(
                UserErrorType.CONSTRAINT_VIOLATION,
                f"{r.hint} not in range [{spec.min or 0}, {spec.max}] for {r.source}: the "
                f"example input's size is outside {spec.text}; change the example or the bounds",
            )
        symbol = _new_symbol(self.shape_env, r.hint, r.source, spec.min or 0, spec.max)
        if spec.kind == "named":
            self.by_name[spec.name] = (symbol, r)
        self._info(symbol, r.hint, (r.source,), spec)
        self._set(r, symbol)

    def _derived(self, r: DimRequest) -> None:
        spec = r.spec
        root = self.by_name.get(spec.name)
        if root is None:
            root_hint, rem = divmod(r.hint - spec.offset, spec.scale)
            if rem or root_hint < 0:
                raise UserError(
                    UserErrorType.CONSTRAINT_VIOLATION,
                    f"Expected shape[{r.dim}] = {r.hint} of input Tensor to be of the form "
                    f"{spec.text}, where {spec.name} is an integer",
                )
            root_spec = DimSpec("named", spec.name, spec.min, spec.max, text=spec.name)
            symbol = _new_symbol(self.shape_env, root_hint, spec.name, spec.min or 0, spec.max)
            self._info(symbol, root_hint, (spec.name,), root_spec, phantom=True)
            root = (symbol, DimRequest(r.tensor_id, r.dim, root_hint, spec.name, root_spec))
            self.by_name[spec.name] = root
        symbol, first = root
        expr = spec.scale * symbol + spec.offset
        if spec.scale * first.hint + spec.offset != r.hint:
            raise UserError(
                UserErrorType.CONSTRAINT_VIOLATION,
                f"Expected input at {r.source} to be equal to "
                f"{spec.scale * first.hint + spec.offset} ({spec.text} with {spec.name} = "
                f"{first.hint} from {first.source}), but got {r.hint}",
            )
        self.derived.append((expr, spec))
        self._set(r, expr)
