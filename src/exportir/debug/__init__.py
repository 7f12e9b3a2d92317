"""exportir.debug: find where a program's numbers drift from eager PyTorch.

::

    import exportir.debug

    report = exportir.debug.compare(ep, model, (x,), rtol=1e-4, atol=1e-5)
    print(report)              # the first node beyond tolerance, with its source line,
    report.first_drift         # then every compared node with its max abs / rel error

See ``docs/debugging.md``. Profiles of a program run are the runtime's
(``method.profile(...)``, :mod:`exportir.runtime.profile`).
"""

from exportir.debug._compare import DriftReport, NodeComparison, OutputComparison, compare

__all__ = ["DriftReport", "NodeComparison", "OutputComparison", "compare"]
