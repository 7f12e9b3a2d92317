"""exportir.program: from Edge/Backend programs to program files.

``manager`` holds ``to_edge`` and ``EdgeProgramManager`` (the Edge dialect stage); ``emit``
plans and emits methods and ``printer`` prints them. The format they write (``schema``,
``serialize``, ``validate``, ``planning``) lives in :mod:`exportir.format` (see
docs/dev/program-plan.md).

The format modules were once submodules of this package; the old names
(``exportir.program.schema`` and its siblings) stay importable as aliases of the
``exportir.format`` modules (the same module objects) for code written against them.
"""

import importlib
import sys

# Compatibility aliases: ``exportir.program.<name>`` is the ``exportir.format.<name>`` module
# object itself, so isinstance checks and exceptions agree whichever name code imports. The
# stdlib-only format modules are aliased now; ``quantized_ops`` (it imports torch) on first
# attribute access (``from exportir.program import quantized_ops``).
for _name in ("schema", "_codec", "serialize", "validate", "work", "planning"):
    _module = importlib.import_module(f"exportir.format.{_name}")
    sys.modules.setdefault(f"{__name__}.{_name}", _module)
    globals()[_name] = _module
del _name, _module


def __getattr__(name: str):
    if name != "quantized_ops":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module("exportir.format.quantized_ops")
    sys.modules.setdefault(f"{__name__}.quantized_ops", module)
    return module
