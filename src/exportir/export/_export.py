"""``exportir.export``: the user-facing entry point, glue from capture to ExportedProgram."""

from __future__ import annotations

from collections.abc import Callable
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
from exportir.symbolic import ShapeEnv, ValueRanges

__all__ = ["export"]


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


def _export(
    mod: Any, args: Any, kwargs: Any, dynamic_shapes: Any, preserve: tuple[str, ...],
    *, draft: bool = False,
) -> tuple[Any, Any]:
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
    return ep, result


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
