"""``exportir.draft_export``: export that notes every problem instead of stopping at the first.

Four kinds of problem (torch.export.draft_export's ``FailureType``, plus state updates):

- a Python decision on a data-dependent value (``if n > 2`` with ``n = t.item()``): the example
  inputs decide it, a runtime assert checks it (``DATA_DEPENDENT_ERROR``);
- guards that contradict ``dynamic_shapes`` (a ``Dim`` the code specializes or bounds): the
  export is redone with those dims as ``Dim.AUTO`` and each violation is reported with the
  ``Dim`` that fits (``GUARD_ADDED``);
- an op with no fake kernel: it runs for real on the example values (``MISSING_FAKE_KERNEL``);
- forward assigning a parameter or a plain tensor attribute (``STATE_UPDATE``).

Each report names the user's line and the fix; with every fix applied, ``export`` succeeds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from exportir.export._export import _export
from exportir.export.capture._problems import FailureReport, FailureType
from exportir.export.dynamic.dims import Dim, UserError, UserErrorType
from exportir.symbolic import Assumption

__all__ = ["DraftExportReport", "FailureReport", "FailureType", "draft_export"]


def draft_export(
    mod: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
    *,
    dynamic_shapes: dict[str, Any] | tuple[Any, ...] | list[Any] | None = None,
    preserve_module_call_signature: tuple[str, ...] = (),
    strict: bool = False,
    prefer_deferred_runtime_asserts_over_guards: bool = False,
) -> Any:
    """Export like :func:`exportir.export`, but keep going past problems and report them all.

    Returns an :class:`ExportedProgram` whose ``_report`` (:class:`DraftExportReport`) lists
    each problem with the user's source line and its fix; ``ep._report.successful()`` is True
    when there was none (``export`` gives the same program). The program follows the example
    inputs where the code could not be captured soundly: data-dependent branches are checked by
    runtime asserts; ops with no fake kernel have the example's output metadata.
    """
    if strict:
        raise NotImplementedError(
            "exportir.draft_export(strict=True) is not supported: exportir traces non-strict "
            "only. Call draft_export without strict."
        )
    if prefer_deferred_runtime_asserts_over_guards:
        raise NotImplementedError(
            "prefer_deferred_runtime_asserts_over_guards=True is not supported yet; call "
            "draft_export without it."
        )
    preserve = tuple(preserve_module_call_signature)
    kwargs = dict(kwargs) if kwargs is not None else None
    violations: list[FailureReport] = []
    try:
        ep, result = _export(mod, args, kwargs, dynamic_shapes, preserve, draft=True)
    except UserError as err:
        if err.error_type is not UserErrorType.CONSTRAINT_VIOLATION or not err.violations:
            raise
        relaxed = _relaxed(dynamic_shapes)
        violations = [_guard_report(v, err.fixes, relaxed) for v in err.violations]
        ep, result = _export(mod, args, kwargs, relaxed, preserve, draft=True)
    decisions = [_decision_report(a) for a in result.shape_env.assumptions]
    ep._report = DraftExportReport((*decisions, *violations, *result.problems))
    return ep


@dataclass(frozen=True, slots=True)
class DraftExportReport:
    """The problems :func:`draft_export` found (``failures``), each with where and its fix."""

    failures: tuple[FailureReport, ...]

    def successful(self) -> bool:
        """True when nothing needed fixing: :func:`exportir.export` gives the same program."""
        return all(f.xfail for f in self.failures)

    def __str__(self) -> str:
        if self.successful():
            return (
                "draft_export: no issues found; exportir.export gives the same program "
                "(you can switch back to it)."
            )
        head = (
            f"draft_export: {len(self.failures)} issue(s) found. The program follows the "
            "example inputs where it could not be captured soundly; apply each fix below and "
            "exportir.export will capture it:"
        )
        lines = [head]
        for i, failure in enumerate(self.failures, 1):
            lines.append(f"{i}. {failure.print()}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"DraftExportReport({list(self.failures)!r})"


# ---------------------------------------------------------------------------- the reports


def _decision_report(a: Assumption) -> FailureReport:
    where = "on the line before it"
    if a.replaces_line:
        where = "in place of the line"
    elif a.fix_at is not None and a.fix_at != str(a.frame):
        where = "before " + a.fix_at.splitlines()[0]
    origins = f", where {a.origins}" if a.origins else ""
    holds = f"`{a.holds}` held on the example inputs ({a.expr} was {a.value})" if a.holds \
        else f"{a.expr} was {a.value} on the example inputs"
    return FailureReport(
        FailureType.DATA_DEPENDENT_ERROR,
        f"{holds}{origins}; the program keeps that outcome, checked by a runtime assert",
        a.frame,
        a.check,
        where,
        {"expr": a.expr, "value": a.value, "fix_at": a.fix_at},
    )


def _guard_report(violation: Any, fixes: dict[str, str], relaxed: Any) -> FailureReport:
    fix = fixes.get(violation.name)
    if fix is None:  # a derived dim's violation is fixed on its root
        fix = "\n".join(fixes.values()) or f"{violation.name} = Dim.AUTO"
    return FailureReport(
        FailureType.GUARD_ADDED,
        violation.message,
        violation.frames[0] if violation.frames else None,
        fix,
        "in the dynamic_shapes passed to export",
        {"name": violation.name, "new_dynamic_shapes": relaxed},
    )


def _relaxed(spec: Any) -> Any:
    """``spec`` with every ``Dim`` replaced by ``Dim.AUTO`` of the same bounds (as torch)."""
    if isinstance(spec, Dim):
        low = getattr(spec, "min", None)
        high = getattr(spec, "max", None)
        return Dim.AUTO(
            min=low if isinstance(low, int) else None, max=high if isinstance(high, int) else None
        )
    if isinstance(spec, dict):
        return {k: _relaxed(v) for k, v in spec.items()}
    if isinstance(spec, (list, tuple)):
        return type(spec)(_relaxed(v) for v in spec)
    return spec
