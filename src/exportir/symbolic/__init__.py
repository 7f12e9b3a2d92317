"""Symbolic shapes: SymNode (behind ``torch.SymInt``), ShapeEnv, value ranges, guards.

A leaf package: it imports torch and sympy, nothing of exportir.
"""

from exportir.symbolic.functions import FloorDiv, IntTrueDiv, PyMod, RoundToInt, ToFloat, TruncToInt
from exportir.symbolic.printing import python_source
from exportir.symbolic.shape_env import (
    Assumption,
    DimDynamic,
    Guard,
    GuardOnDataDependentSymNode,
    RuntimeAssert,
    ShapeEnv,
    SymbolOrigin,
    UserFrame,
    user_frame,
)
from exportir.symbolic.sym_node import SymNode
from exportir.symbolic.value_ranges import ValueRanges, bound

__all__ = [
    "Assumption",
    "DimDynamic",
    "FloorDiv",
    "Guard",
    "GuardOnDataDependentSymNode",
    "IntTrueDiv",
    "PyMod",
    "RoundToInt",
    "RuntimeAssert",
    "ShapeEnv",
    "SymNode",
    "SymbolOrigin",
    "ToFloat",
    "TruncToInt",
    "UserFrame",
    "ValueRanges",
    "bound",
    "python_source",
    "user_frame",
]
