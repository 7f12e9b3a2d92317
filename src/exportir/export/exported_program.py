"""Public module path of ``torch.export.exported_program``: the ExportedProgram object.

The code lives in the program room (``exportir/export/program/``); this module only names its
public classes where torch users look for them.
"""

from exportir.export.program.exported_program import (
    ExportedProgram,
    ModuleCallEntry,
    ModuleCallSignature,
    default_decompositions,
)

__all__ = [
    "ExportedProgram",
    "ModuleCallEntry",
    "ModuleCallSignature",
    "default_decompositions",
]
