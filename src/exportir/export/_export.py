"""``exportir.export``: the user-facing entry point, glue from capture to ExportedProgram."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from exportir.export.capture._inputs import check_binding
from exportir.export.capture._module_call import ModuleCallRecorder
from exportir.export.capture.recorder import capture
from exportir.export.control_flow.rules import CONTROL_FLOW
from exportir.export.dynamic import _constraints
from exportir.export.dynamic._symbols import make_sizes
from exportir.export.dynamic.dims import plan_dims
from exportir.export.program.exported_program import ExportedProgram
from exportir.export.signature import InputKind
from exportir.symbolic import Assumption, ShapeEnv, ValueRanges

__all__ = ["DraftExportReport", "draft_export", "export"]


def export(
    mod: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    dynamic_shapes: dict[str, Any] | tuple[Any, ...] | list[Any] | None = None,
    strict: bool = False,
    preserve_module_call_signature: tuple[str, ...] = (),
    prefer_deferred_runtime_asserts_over_guards: bool = False,
) -> Any:
    """Capture ``mod(*args, **kwargs)`` into an :class:`ExportedProgram` (ATen dialect).

    Non-strict capture (seed 004): ``forward`` runs with the ordinary Python interpreter on fake
    tensors while every ATen op is recorded; Python values, branches and loops are specialized
    to the example inputs.
    """
    if strict:
        raise NotImplementedError(
            "exportir.export(strict=True) is not supported: strict mode analyses Python bytecode, "
            "which exportir does not do. Use the default non-strict mode (strict=False), the "
            "mode the torch.export documentation recommends."
        )
    if prefer_deferred_runtime_asserts_over_guards:
        raise NotImplementedError(
            "prefer_deferred_runtime_asserts_over_guards=True is not supported yet: exportir "
            "checks guards on input dims against dynamic_shapes; export without the flag."
        )
    return _export(mod, args, kwargs, dynamic_shapes, preserve_module_call_signature)[0]


def draft_export(
    mod: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    dynamic_shapes: dict[str, Any] | tuple[Any, ...] | list[Any] | None = None,
    preserve_module_call_signature: tuple[str, ...] = (),
    strict: bool = False,
) -> Any:
    """Export like :func:`export`, taking the branch the example inputs take where Python
    decides on data-dependent values (``if n > 2`` with ``n = t.item()``, ``if boxes.numel()
    == 0`` after ``boxes[mask]``), as torch.export.draft_export does.

    Where :func:`export` raises ``GuardOnDataDependentSymNode``, the condition's value on the
    (real) example inputs decides the branch, and the program checks it with an
    ``_assert_scalar`` runtime assert: an input taking the other branch fails with
    ``Runtime assertion failed for expression ...``. The returned program's ``_report``
    (:class:`DraftExportReport`) lists every such decision, where it was made, and the
    ``torch._check(...)`` that states it in the user's names; adding those checks to the code
    makes :func:`export` produce the same program.
    """
    if strict:
        raise NotImplementedError(
            "exportir.draft_export(strict=True) is not supported: exportir traces non-strict "
            "only. Call draft_export without strict."
        )
    ep, assumptions = _export(
        mod, args, kwargs, dynamic_shapes, preserve_module_call_signature, draft=True
    )
    ep._report = DraftExportReport(tuple(assumptions))
    return ep


@dataclass(frozen=True, slots=True)
class DraftExportReport:
    """The data-dependent decisions draft_export took by the example inputs (``failures``:
    each would have stopped :func:`export`)."""

    failures: tuple[Assumption, ...]

    def successful(self) -> bool:
        """True when nothing was assumed: :func:`export` gives the same program."""
        return not self.failures

    def __str__(self) -> str:
        if not self.failures:
            return "draft_export: no data-dependent decisions; export() gives the same program."
        head = (
            f"draft_export: {len(self.failures)} data-dependent decision(s) taken by the example "
            "inputs, each checked by a runtime assert. To export the same program with "
            "export(), add the torch._check shown before the line named:"
        )
        lines = [head]
        for i, a in enumerate(self.failures, 1):
            at = _indent(str(a.frame), 5) if a.frame is not None else "     <unknown location>"
            lines.append(f"{i}. {a.expr} was {a.value} on the example inputs, at\n{at}")
            if a.fix_at is None or a.fix_at == str(a.frame):
                lines.append(f"   fix: add {a.check} on the line before it")
            else:
                lines.append(f"   fix: add {a.check} before\n{_indent(a.fix_at, 5)}")
        return "\n".join(lines)


def _indent(text: str, n: int) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


def _export(
    mod: Any, args: Any, kwargs: Any, dynamic_shapes: Any, preserve: tuple[str, ...],
    *, draft: bool = False,
) -> tuple[Any, list[Assumption]]:
    mod, args, kwargs = _normalize(mod, args, kwargs)
    check_binding(mod, args, kwargs)
    # hooks on the listed submodules, removed on exit even when capture fails
    with ModuleCallRecorder(mod, tuple(preserve)) as calls:
        if dynamic_shapes is not None:
            result, ranges = _capture_dynamic(mod, args, kwargs, dynamic_shapes, draft)
        else:
            result = capture(mod, args, kwargs, draft=draft, extension=CONTROL_FLOW)
            ranges = result.range_constraints
    call_graph = calls.apply(result.graph_module, result.signature, result.module_call_graph)
    ep = _program(result, args, kwargs, ranges, call_graph)
    return ep, list(result.shape_env.assumptions)


def _capture_dynamic(
    mod: torch.nn.Module, args: tuple, kwargs: dict, dynamic_shapes: Any, draft: bool = False
) -> tuple[Any, dict[Any, Any]]:
    """Capture with backed symbols for the marked dims; check the guards against the spec
    (docs/dev/dynamic-plan.md, "export -> capture with dynamic_shapes")."""
    plan = plan_dims(mod, args, kwargs, dynamic_shapes)
    shape_env = ShapeEnv()
    sizes, table = make_sizes(plan, shape_env)
    result = capture(
        mod, args, kwargs, shape_env=shape_env, symbolic_sizes=sizes, draft=draft,
        extension=CONTROL_FLOW,
    )  # fmt: skip
    solution = _constraints.solve(table, shape_env.guards, shape_env.replacements)
    return result, _range_constraints(result, solution)


def _range_constraints(result: Any, solution: Any) -> dict[Any, Any]:
    placeholders = result.graph_module.graph.find_nodes(op="placeholder")
    sizes = [
        size
        for node, spec in zip(placeholders, result.signature.input_specs)
        if spec.kind == InputKind.USER_INPUT and isinstance(node.meta.get("val"), torch.Tensor)
        for size in node.meta["val"].shape
    ]
    ordered = _constraints.ordered_ranges(solution.ranges, sizes)
    return {
        expr: ValueRanges.of(r.lower, sympy.oo if r.upper == float("inf") else r.upper)
        for expr, r in ordered.items()
    }


def _normalize(mod: Any, args: Any, kwargs: Any) -> tuple[torch.nn.Module, tuple, dict]:
    if not isinstance(args, tuple):
        raise ValueError(  # noqa: TRY004  (torch.export raises ValueError here)
            f"Expecting `args` to be a tuple of example positional inputs, got {type(args)}"
        )
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, dict):
        raise ValueError(  # noqa: TRY004  (torch.export raises ValueError here)
            f"Expecting `kwargs` to be a dict of example inputs, got {type(kwargs)}"
        )
    if not isinstance(mod, torch.nn.Module):
        if not callable(mod):
            raise TypeError(f"Expected an nn.Module or a callable, got {type(mod)}")
        mod = _FunctionModule(mod)
    return mod, args, kwargs


class _FunctionModule(torch.nn.Module):
    """Wraps a plain function so it can be exported like a module."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.exported_function = fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.exported_function(*args, **kwargs)


def _program(
    result: Any, args: tuple, kwargs: dict, range_constraints: Any, call_graph: list[Any]
) -> Any:
    # unbacked symbols (u0 from .item(), nonzero...) keep the ranges capture found for them
    unbacked = {k: v for k, v in (result.range_constraints or {}).items() if str(k)[:1] == "u"}
    range_constraints = {**(range_constraints or {}), **unbacked}
    return ExportedProgram(
        root=result.graph_module,
        graph=result.graph_module.graph,
        graph_signature=result.signature,
        state_dict=result.state_dict,
        range_constraints=range_constraints or {},
        module_call_graph=call_graph,
        example_inputs=(args, kwargs),
        constants=result.constants,
    )
