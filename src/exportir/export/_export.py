"""``exportir.export``: the user-facing entry point, glue from capture to ExportedProgram."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from exportir.export.capture import capture

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
    if dynamic_shapes is not None:
        raise NotImplementedError(
            "dynamic shapes are not built yet: export with static shapes (dynamic_shapes=None) "
            "for now; Dim / dynamic_shapes support comes in the next release."
        )
    if prefer_deferred_runtime_asserts_over_guards:
        raise NotImplementedError(
            "prefer_deferred_runtime_asserts_over_guards=True is not supported yet: exportir "
            "checks guards on input dims against dynamic_shapes; export without the flag."
        )
    if preserve_module_call_signature:
        raise NotImplementedError(
            "preserve_module_call_signature is not supported yet; export without it."
        )
    mod, args, kwargs = _normalize(mod, args, kwargs)
    result = capture(mod, args, kwargs)
    return _program(result, args, kwargs)


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


def _program(result: Any, args: tuple, kwargs: dict) -> Any:
    from exportir.export.exported_program import ExportedProgram

    return ExportedProgram(
        root=result.graph_module,
        graph=result.graph_module.graph,
        graph_signature=result.signature,
        state_dict=result.state_dict,
        range_constraints={},
        module_call_graph=result.module_call_graph,
        example_inputs=(args, kwargs),
        constants=result.constants,
    )
