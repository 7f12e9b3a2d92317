"""Matching call-site arguments to a target's signature (``Node.normalized_arguments``).

Signatures come from ``inspect`` for Python callables and from the ATen schema for torch
builtins and ``OpOverload``s (``self`` is called ``input``, as in the Python API).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from inspect import Parameter
from typing import Any, NamedTuple

import torch
from torch._ops import OpOverload, OpOverloadPacket

__all__ = ["ArgsKwargsPair", "normalize_function", "normalize_module", "get_signature_for_torch_op"]


class ArgsKwargsPair(NamedTuple):
    """Positional and keyword arguments of a call."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


_SIGNATURES: dict[tuple[str, str], inspect.Signature] = {}


def _schema_signature(schema: torch._C.FunctionSchema) -> inspect.Signature:
    key = (schema.name, schema.overload_name)
    cached = _SIGNATURES.get(key)
    if cached is not None:
        return cached
    params: list[Parameter] = []
    for arg in schema.arguments:
        kind = Parameter.KEYWORD_ONLY if arg.kwarg_only else Parameter.POSITIONAL_OR_KEYWORD
        default = arg.default_value if arg.has_default_value() else Parameter.empty
        name = "input" if arg.name == "self" else arg.name
        if name == "from":  # a Python keyword: it and everything before it is positional-only
            kind = Parameter.POSITIONAL_ONLY
            params = [p.replace(kind=Parameter.POSITIONAL_ONLY) for p in params]
        params.append(Parameter(name, kind, default=default))
    sig = inspect.Signature(params)
    _SIGNATURES[key] = sig
    return sig


def get_signature_for_torch_op(op: Callable[..., Any], return_schemas: bool = False) -> Any:
    """The signatures of every overload of a torch builtin or op (``None`` if unknown)."""
    if isinstance(op, OpOverload):
        schemas = [op._schema]
    elif isinstance(op, OpOverloadPacket):
        schemas = [getattr(op, name)._schema for name in op.overloads()]
    else:
        aten_name = torch.jit._builtins._find_builtin(op)
        if aten_name is None:
            return (None, None) if return_schemas else None
        schemas = torch._C._jit_get_schemas_for_operator(aten_name)
    signatures = [_schema_signature(s) for s in schemas]
    return (signatures, schemas) if return_schemas else signatures


def _bind(sig: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return sig.bind(*args, **kwargs)


def _to_pair(
    sig: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any], only_kwargs: bool
) -> ArgsKwargsPair | None:
    simple = {Parameter.POSITIONAL_OR_KEYWORD, Parameter.KEYWORD_ONLY}
    names = list(sig.parameters)
    if any(p.kind not in simple for p in sig.parameters.values()):
        if names != ["input", "from", "to", "generator"]:
            return None
    bound = _bind(sig, args, kwargs)
    bound.apply_defaults()
    new_args: list[Any] = []
    new_kwargs: dict[str, Any] = {}
    for i, name in enumerate(names):
        if not only_kwargs and i < len(args):
            new_args.append(bound.arguments[name])
        else:
            new_kwargs[name] = bound.arguments[name]
    return ArgsKwargsPair(tuple(new_args), new_kwargs)


def _matching(signatures: list[inspect.Signature], args: tuple, kwargs: dict) -> list[inspect.Signature]:
    found = []
    for sig in signatures:
        try:
            _bind(sig, args, kwargs)
        except TypeError:
            continue
        found.append(sig)
    return found


def _types_fit(sig: inspect.Signature, arg_types: tuple, kwarg_types: dict) -> bool:
    """Does a call with values of these types bind to ``sig`` (checked by binding only)?"""
    try:
        _bind(sig, arg_types, kwarg_types)
    except TypeError:
        return False
    return True


def normalize_function(
    target: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    arg_types: tuple[Any] | None = None,
    kwarg_types: dict[str, Any] | None = None,
    normalize_to_only_use_kwargs: bool = False,
) -> ArgsKwargsPair | None:
    """Match ``args``/``kwargs`` to ``target``'s signature and fill in defaults.

    Returns ``None`` when the signature has ``*args``/``**kwargs``/positional-only parameters
    or no overload matches. Raises ``RuntimeError`` when several overloads match and no
    ``arg_types``/``kwarg_types`` are given to choose between them.
    """
    kwargs = dict(kwargs or {})
    is_torch_op = isinstance(target, (types.BuiltinFunctionType, OpOverload, OpOverloadPacket))
    if not is_torch_op:
        sig = inspect.signature(inspect.unwrap(target))
        return _to_pair(sig, args, kwargs, normalize_to_only_use_kwargs)
    signatures = get_signature_for_torch_op(target) or []
    matched = _matching(signatures, args, kwargs)
    if len(matched) == 1:
        return _to_pair(matched[0], args, kwargs, normalize_to_only_use_kwargs)
    if not matched:
        return None
    if arg_types is None and kwarg_types is None:
        listing = "\n".join(str(s) for s in matched)
        raise RuntimeError(
            f"Tried to normalize arguments to {torch.typename(target)} but the schema match was "
            "ambiguous! Please provide argument types to the normalize_arguments() call. "
            f"Available schemas:\n{listing}"
        )
    for sig in matched:
        if _types_fit(sig, tuple(arg_types or ()), dict(kwarg_types or {})):
            return _to_pair(sig, args, kwargs, normalize_to_only_use_kwargs)
    return None


def normalize_module(
    root: torch.nn.Module,
    target: str,
    args: tuple[Any],
    kwargs: dict[str, Any] | None = None,
    normalize_to_only_use_kwargs: bool = False,
) -> ArgsKwargsPair | None:
    """Match arguments of a call to submodule ``target`` (only ``torch.nn`` built-in modules)."""
    try:
        submod = root.get_submodule(target)
    except AttributeError as e:
        raise RuntimeError(
            f"Tried to normalize node with target {target} but root did not have that target!"
        ) from e
    cls = type(submod)
    if getattr(torch.nn, cls.__name__, None) is not cls:
        return None
    sig = inspect.signature(inspect.unwrap(submod.forward))
    return _to_pair(sig, args, dict(kwargs or {}), normalize_to_only_use_kwargs)
