"""exportir.export: capture a PyTorch program into Export IR (the ATen dialect).

Mirrors ``torch.export``: ``ExportedProgram``, ``ExportGraphSignature`` and its spec classes,
``ModuleCallEntry`` / ``ModuleCallSignature``, ``default_decompositions`` and the Export IR
verifier.
"""

from exportir.export.exported_program import (
    ExportedProgram,
    ModuleCallEntry,
    ModuleCallSignature,
    default_decompositions,
)
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
from exportir.export.verifier import SpecViolationError, Verifier

__all__ = [
    "ConstantArgument",
    "CustomObjArgument",
    "ExportBackwardSignature",
    "ExportGraphSignature",
    "ExportedProgram",
    "InputKind",
    "InputSpec",
    "ModuleCallEntry",
    "ModuleCallSignature",
    "OutputKind",
    "OutputSpec",
    "SpecViolationError",
    "SymBoolArgument",
    "SymFloatArgument",
    "SymIntArgument",
    "TensorArgument",
    "TokenArgument",
    "Verifier",
    "default_decompositions",
]
