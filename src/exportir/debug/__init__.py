"""exportir.debug: find where a program's numbers drift from eager PyTorch.

::

    import exportir.debug

    report = exportir.debug.compare(ep, model, (x,), rtol=1e-4, atol=1e-5)
    print(report)              # the first node beyond tolerance, with its source line,
    report.first_drift         # then every compared node with its max abs / rel error

A program file and its ETRecord (``program_manager.get_etrecord().save(path)``) compare the
same way: ``compare("model.xpt", model, (x,), etrecord="model.etrecord")``. See
``docs/debugging.md``. Profiles of a program run are the runtime's
(``method.profile(...)``, :mod:`exportir.runtime.profile`).
"""

from exportir.debug._compare import DriftReport, NodeComparison, OutputComparison, compare
from exportir.program.etrecord import ETRecord, ETRecordError, load_etrecord

__all__ = [
    "DriftReport",
    "ETRecord",
    "ETRecordError",
    "NodeComparison",
    "OutputComparison",
    "compare",
    "load_etrecord",
]
