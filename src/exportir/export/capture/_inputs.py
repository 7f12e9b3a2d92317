"""How ``forward``'s calling convention maps the example inputs to names, as torch.export does.

Three facts about the user's inputs come from ``forward``'s signature:

- :func:`bind_inputs`: ``{parameter name: value}`` for naming placeholders. Positional example
  inputs are bound to their parameters (a ``*args`` parameter binds the tuple of the rest);
  keyword example inputs keep their own key and their order (so ``**kwargs`` entries are named
  by their keys, not by the ``**kwargs`` parameter). Leaves are then named by their pytree path:
  ``x``, ``args_0``, ``d_q`` (:func:`flatten_with_names`).
- :func:`forward_arg_names`: the parameter names of ``ep.module()``'s generated ``forward``:
  positional parameters by name, a ``*args`` parameter enumerated (``args_0``, ``args_1``...),
  then the keyword inputs' keys in the order given. The first ``len(args)`` names are
  positional, the rest keyword, which is how the generated code rebuilds ``(args, kwargs)``.
- Mismatches between the inputs and the signature are reported with ``forward``'s file:line.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from exportir import pytree

__all__ = ["bind_inputs", "flatten_with_names", "forward_arg_names", "forward_of"]


class InputBindingError(TypeError):
    """The example inputs do not fit ``forward``'s signature."""


def forward_of(mod: torch.nn.Module) -> Callable[..., Any]:
    """What names the inputs: ``forward``, or the function a function-export wraps."""
    return getattr(mod, "exported_function", None) or mod.forward


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function: no Python signature
        return None


def _where(fn: Callable[..., Any]) -> str:
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is None:
        return f"{getattr(fn, '__qualname__', fn)}"
    return f'File "{code.co_filename}", line {code.co_firstlineno}, in {code.co_name}'


def _bind_error(mod: torch.nn.Module, fn: Callable[..., Any], args: tuple, kwargs: dict,
                err: TypeError) -> InputBindingError:
    sig = _signature(fn)
    return InputBindingError(
        f"the example inputs do not fit {type(mod).__name__}.forward{sig}: {err}\n"
        f"  {_where(fn)}\n"
        f"Got {len(args)} positional input(s) and keyword input(s) {list(kwargs)}. "
        f"{_keyword_only_hint(sig, kwargs)}Pass positional inputs as the `args` tuple and "
        "keyword inputs as the `kwargs` dict, exactly as you would call the model: "
        "export(model, args, kwargs) runs model(*args, **kwargs)."
    )


def _keyword_only_hint(sig: inspect.Signature | None, kwargs: dict) -> str:
    if sig is None:
        return ""
    missing = [
        name
        for name, p in sig.parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is p.empty and name not in kwargs
    ]
    if not missing:
        return ""
    example = ", ".join(f"{name!r}: ..." for name in missing)
    return f"Keyword-only parameter(s) {missing} must be given in kwargs ({{{example}}}). "


def check_binding(mod: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """Raise :class:`InputBindingError` (with ``forward``'s location) unless
    ``forward(*args, **kwargs)`` binds."""
    fn = forward_of(mod)
    sig = _signature(fn)
    if sig is None:
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as err:
        raise _bind_error(mod, fn, args, kwargs, err) from None


def bind_inputs(mod: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """``{name: value}``: positional inputs bound to their parameters, then the keyword inputs
    under their own keys in their order (torch.export's ``_bind_signature_to_inputs``)."""
    sig = _signature(forward_of(mod))
    if sig is None:
        return {**{f"args_{i}": a for i, a in enumerate(args)}, **kwargs}
    try:
        bound = sig.bind_partial(*args).arguments
    except TypeError as err:
        raise _bind_error(mod, forward_of(mod), args, kwargs, err) from None
    return {**bound, **kwargs}


def forward_arg_names(mod: torch.nn.Module, args: tuple, kwargs: dict) -> list[str]:
    """Names of ``ep.module()``'s ``forward`` parameters (torch.export's
    ``_get_forward_arg_names``): ``*args`` enumerated, keyword inputs by key, in order."""
    sig = _signature(forward_of(mod))
    if sig is None:
        return [f"args_{i}" for i in range(len(args))] + list(kwargs)
    names: list[str] = []
    for name, value in sig.bind_partial(*args).arguments.items():
        if sig.parameters[name].kind is inspect.Parameter.VAR_POSITIONAL:
            names.extend(f"{name}_{i}" for i in range(len(value)))
        else:
            names.append(name)
    return names + list(kwargs)


def flatten_with_names(bound: dict[str, Any]) -> list[tuple[str, Any]]:
    """User input leaves named like torch.export: ``x``, ``y_0``, ``d_a_b``."""
    named = []
    for path, leaf in pytree.tree_leaves_with_path(bound):
        named.append(("_".join(_key_text(k) for k in path).lower(), leaf))
    return named


def _key_text(key: Any) -> str:
    """Duck-typed: keys may come from exportir.pytree or from torch's registry."""
    if hasattr(key, "idx"):
        return str(key.idx)
    if hasattr(key, "key"):
        return "".join(c if c.isalnum() else "_" for c in str(key.key))
    if hasattr(key, "name"):
        return key.name
    return str(key)
