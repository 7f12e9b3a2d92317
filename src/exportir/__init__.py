"""exportir: capture PyTorch programs into Export IR, lower them, and run them.

``import exportir.fx as fx`` is a drop-in for ``torch.fx``; ``exportir.export`` mirrors
``torch.export``. The names below are loaded lazily (PEP 562), so ``import exportir.runtime``
or ``import exportir.pytree`` never pulls in the capture stack.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY: dict[str, str] = {
    "export": "exportir.export",
    "draft_export": "exportir.export",
    "unflatten": "exportir.export",
    "save": "exportir.export",
    "load": "exportir.export",
    "from_torch": "exportir.export.serialize.torch_interop",
    "register_dataclass": "exportir.pytree",
    "ExportedProgram": "exportir.export",
    "ExportGraphSignature": "exportir.export",
    "ExportBackwardSignature": "exportir.export",
    "ModuleCallEntry": "exportir.export",
    "ModuleCallSignature": "exportir.export",
    "default_decompositions": "exportir.export",
    "SpecViolationError": "exportir.export",
    "Dim": "exportir.export.dynamic_shapes",
    "dims": "exportir.export.dynamic_shapes",
    "ShapesCollection": "exportir.export.dynamic_shapes",
    "to_edge": "exportir.program.manager",
    "to_edge_transform_and_lower": "exportir.program.transform_and_lower",
    "EdgeProgramManager": "exportir.program.manager",
    "ProgramManager": "exportir.program.manager",
    "EdgeCompileConfig": "exportir.dialects.edge.config",
}

__all__ = ["__version__", *_LAZY]  # noqa: PLE0604 (the keys of _LAZY are str; ruff cannot see it)


# tool subpackages reachable as attributes (``exportir.debug.compare``), imported on first use
_SUBPACKAGES = frozenset({"debug"})


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"exportir.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'exportir' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
