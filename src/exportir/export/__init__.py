"""exportir.export: capture a PyTorch program into Export IR (the ATen dialect).

Mirrors ``torch.export``: ``export``, ``save`` / ``load``, ``register_dataclass``,
``draft_export``, ``unflatten``, ``ExportedProgram``, ``ExportGraphSignature`` and its spec classes, ``ModuleCallEntry`` /
``ModuleCallSignature``, ``default_decompositions`` and the Export IR verifier.
"""

import inspect
import sys
import types
from typing import Any

from exportir.export._draft import DraftExportReport, draft_export
from exportir.export._export import export
from exportir.export.dynamic.dims import Dim, ShapesCollection, dims
from exportir.export.program._unflatten import UnflattenedModule, unflatten
from exportir.export.program.exported_program import (
    ExportedProgram,
    ModuleCallEntry,
    ModuleCallSignature,
    default_decompositions,
)
from exportir.export.program.verifier import SpecViolationError, Verifier
from exportir.export.serialize.save_load import load, save
from exportir.export.signature import (
    ConstantArgument,
    CustomObjArgument,
    ExportBackwardSignature,
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    SymBoolArgument,
    SymFloatArgument,
    SymIntArgument,
    TensorArgument,
    TokenArgument,
)
from exportir.pytree import register_dataclass

__all__ = [
    "ConstantArgument",
    "CustomObjArgument",
    "Dim",
    "DraftExportReport",
    "ExportBackwardSignature",
    "ExportGraphSignature",
    "ExportedProgram",
    "InputKind",
    "InputSpec",
    "ModuleCallEntry",
    "ModuleCallSignature",
    "OutputKind",
    "OutputSpec",
    "ShapesCollection",
    "SpecViolationError",
    "SymBoolArgument",
    "SymFloatArgument",
    "SymIntArgument",
    "TensorArgument",
    "TokenArgument",
    "UnflattenedModule",
    "Verifier",
    "default_decompositions",
    "dims",
    "draft_export",
    "export",
    "load",
    "register_dataclass",
    "save",
    "unflatten",
]


class _CallablePackage(types.ModuleType):
    """``exportir.export`` is both this package and the ``export`` function.

    ``import exportir.export`` binds the package as the ``export`` attribute of ``exportir``
    (Python does that for every submodule), which would shadow the function that
    ``exportir.export(model, args)`` means to call. Calling the package calls the function, so
    both spellings work: ``exportir.export(m, args)`` and ``exportir.export.export(m, args)``.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> ExportedProgram:
        return export(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
__signature__ = inspect.signature(export)
