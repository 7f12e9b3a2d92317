"""Matching call-site arguments to a target's signature (``Node.normalized_arguments``).

Signatures come from ``inspect`` for Python callables and from the TorchScript schema for torch
builtins and ``OpOverload``s, annotated with the Python types torch.fx gives them (``self`` is
called ``input``, as in the Python API): ``(input: torch.Tensor, other: numbers.Number, alpha:
numbers.Number = 1) -> torch.Tensor``. Behaviour follows ``torch.fx.operator_schemas``.
"""

from __future__ import annotations

import builtins
import enum
import inspect
import numbers
import re
import types
import typing
import warnings
from collections.abc import Callable
from inspect import Parameter
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch._jit_internal import boolean_dispatched
from torch._ops import OpOverload, OpOverloadPacket

if TYPE_CHECKING:
    from exportir.fx.node import Argument

__all__ = [
    "ArgsKwargsPair",
    "check_for_mutable_operation",
    "create_type_hint",
    "get_signature_for_torch_op",
    "normalize_function",
    "normalize_module",
    "type_matches",
]


class ArgsKwargsPair(NamedTuple):
    """Positional and keyword arguments of a call."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


# --------------------------------------------------------------------------- schema types

# TorchScript type names (``Type.annotation_str``) and the Python objects they stand for.
# Other names resolve in ``typing`` (``List``, ``Optional``...), then in ``builtins``.
_TS_NAMES: dict[str, Any] = {
    "Tensor": torch.Tensor,
    "Device": torch.device,
    "Layout": torch.layout,
    "number": numbers.Number,
    "Future": torch.jit.Future,
    "AnyEnumType": enum.Enum,
    "QScheme": torch.qscheme,
    "NoneType": type(None),
    "Storage": torch.UntypedStorage,
    "t": typing.TypeVar("t"),
    "PyObject": Any,
}
_TS_CLASS_PREFIX = "__torch__."  # script classes: __torch__.torch.classes.<ns>.<Name>
_TS_TOKEN = re.compile(r"\s*(?:(\(\))|([A-Za-z_][\w.]*)|(.))")


def _ts_name(name: str) -> Any:
    """The Python object a TorchScript type name denotes; NameError (as torch.fx) if none."""
    if name in _TS_NAMES:
        return _TS_NAMES[name]
    if name.startswith(_TS_CLASS_PREFIX):
        obj: Any = torch
        for part in name[len(_TS_CLASS_PREFIX):].split(".")[1:]:
            obj = getattr(obj, part)
        return obj
    for namespace in (typing, builtins):
        if name in vars(namespace):
            return vars(namespace)[name]
    raise NameError(f"name '{name}' is not defined")


def _ts_tokens(text: str) -> list[str]:
    return [m.group(1) or m.group(2) or m.group(3) for m in _TS_TOKEN.finditer(text)
            if m.group(0).strip()]


def _ts_parse(tokens: list[str], pos: int) -> tuple[Any, int]:
    """Parse ``Name`` or ``Name[T, ...]`` starting at ``tokens[pos]``; return (type, next pos)."""
    token = tokens[pos]
    if token == "()":
        return (), pos + 1
    base = _ts_name(token)
    pos += 1
    if pos >= len(tokens) or tokens[pos] != "[":
        return base, pos
    args = []
    while tokens[pos] in ("[", ","):
        arg, pos = _ts_parse(tokens, pos + 1)
        args.append(arg)
    return base[args[0] if len(args) == 1 else tuple(args)], pos + 1  # skip "]"


def _torchscript_type_to_python_type(ts_type: torch._C.JitType) -> Any:
    """The Python type of a TorchScript type: ``List[int]`` -> ``typing.List[int]``."""
    value, _ = _ts_parse(_ts_tokens(ts_type.annotation_str), 0)
    return value


def _schema_parameter(arg: torch._C.Argument) -> Parameter:
    name = "input" if arg.name == "self" else arg.name
    if name == "from":  # a Python keyword, so it can only be passed by position
        kind = Parameter.POSITIONAL_ONLY
    else:
        kind = Parameter.KEYWORD_ONLY if arg.kwarg_only else Parameter.POSITIONAL_OR_KEYWORD
    default = arg.default_value if arg.has_default_value() else Parameter.empty
    annotation = _torchscript_type_to_python_type(arg.type)
    return Parameter(name, kind, default=default, annotation=annotation)


def _torchscript_schema_to_signature_impl(schema: torch._C.FunctionSchema) -> inspect.Signature:
    params: list[Parameter] = []
    for arg in schema.arguments:
        param = _schema_parameter(arg)
        if param.kind is Parameter.POSITIONAL_ONLY:  # so is everything before it
            params = [p.replace(kind=Parameter.POSITIONAL_ONLY) for p in params]
        params.append(param)
    returns = [_torchscript_type_to_python_type(r.type) for r in schema.returns]
    ret = None if not returns else returns[0] if len(returns) == 1 else tuple(returns)
    return inspect.Signature(params, return_annotation=ret)


_SCHEMA_TO_SIGNATURE_CACHE: dict[tuple[str, str], inspect.Signature] = {}


def _torchscript_schema_to_signature(schema: torch._C.FunctionSchema) -> inspect.Signature:
    """The Python signature of an operator schema (cached per overload)."""
    key = (schema.name, schema.overload_name)
    sig = _SCHEMA_TO_SIGNATURE_CACHE.get(key)
    if sig is None:
        sig = _SCHEMA_TO_SIGNATURE_CACHE[key] = _torchscript_schema_to_signature_impl(schema)
    return sig


# --------------------------------------------------------------------------- signatures


def _nonzero_signatures() -> list[inspect.Signature]:
    # torch.nonzero's Python binding takes ``as_tuple``, which no aten schema has.
    self_param = Parameter("self", Parameter.POSITIONAL_OR_KEYWORD, annotation=torch.Tensor)
    as_tuple = Parameter("as_tuple", Parameter.KEYWORD_ONLY, annotation=bool)
    return [
        inspect.Signature([self_param], return_annotation=None),
        inspect.Signature([self_param, as_tuple], return_annotation=None),
    ]


# Builtins whose signatures are written by hand rather than read from schemas.
_manual_overrides: dict[Callable[..., Any], list[inspect.Signature]] = {
    torch.nonzero: _nonzero_signatures(),
}


def _schemas_of(op: Callable[..., Any]) -> list[torch._C.FunctionSchema] | None:
    if isinstance(op, OpOverload):
        return [op._schema]
    if isinstance(op, OpOverloadPacket):
        return [overload._schema for overload in op.op_overloads()]
    aten_name = torch.jit._builtins._find_builtin(op)
    if aten_name is None:
        return None
    return torch._C._jit_get_schemas_for_operator(aten_name)


def get_signature_for_torch_op(op: Callable[..., Any], return_schemas: bool = False) -> Any:
    """The signatures of every overload of a torch builtin or op, or ``None`` if unknown.

    With ``return_schemas`` the result is ``(signatures, schemas)``. As in torch.fx, a builtin
    with hand-written signatures (``torch.nonzero``) reports them only with ``return_schemas``
    (and no schemas); otherwise it reports ``None``.
    """
    if not isinstance(op, (OpOverload, OpOverloadPacket)):
        override = _manual_overrides.get(op)
        if override:
            return (override, None) if return_schemas else None
    schemas = _schemas_of(op)
    if schemas is None:
        return (None, None) if return_schemas else None
    signatures = [_torchscript_schema_to_signature(s) for s in schemas]
    return (signatures, schemas) if return_schemas else signatures


def _binds(sig: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    try:
        sig.bind(*args, **kwargs)
    except TypeError:
        return False
    return True


def check_for_mutable_operation(
    target: Callable[..., Any], args: tuple[Argument, ...], kwargs: dict[str, Argument]
) -> None:
    """Raise RuntimeError if the call binds to exactly one schema of a torch operator and that
    schema mutates an operand (``out=``). Ambiguous or unknown targets pass: best effort."""
    signatures, schemas = get_signature_for_torch_op(target, return_schemas=True)
    if not signatures or not schemas:
        return
    matched = [schema for sig, schema in zip(signatures, schemas) if _binds(sig, args, kwargs)]
    if len(matched) == 1 and matched[0].is_mutable:
        raise RuntimeError(
            f"Tried to trace mutable operation {matched[0]}. FX only supports functional "
            f"code, so operations that mutate operands in-place (e.g. via `out` arguments) "
            f"are not supported"
        )


# --------------------------------------------------------------------------- type matching


def create_type_hint(x: object) -> object:
    """A type hint for a value's type: ``[int, bool]`` -> ``list[int]`` (the common base of
    the element types), ``(int,)`` -> ``tuple[int, ...]``, no common base -> ``list[Any]``;
    anything else is returned as it is."""
    if not isinstance(x, (list, tuple)):
        return x

    def hint(element: Any) -> Any:
        return list[element] if isinstance(x, list) else tuple[element, ...]

    try:
        if not x:
            return hint(Any)
        base = x[0]
        for t in x:
            if issubclass(t, base):
                continue
            if not issubclass(base, t):
                return hint(Any)
            base = t
        return hint(base)
    except Exception:  # noqa: BLE001  # x held non-types: warn and give it back, as torch.fx
        warnings.warn(f"We were not able to successfully create type hint from the type {x}",
                      stacklevel=2)
    return x


def _is_homogeneous_tuple(t: object, element: type) -> bool:
    """``tuple[T, ...]`` / ``Tuple[T1, T2]`` whose members are all subclasses of ``element``."""
    if typing.get_origin(t) is not tuple:
        return False
    members = typing.get_args(t)
    if members == ((),):  # Tuple[()]
        return True
    return all(m is Ellipsis or issubclass(m, element) for m in members)


def _list_matches(signature_type: Any, argument_type: Any) -> bool:
    element = typing.get_args(signature_type)[0]
    if argument_type is int and element is int:  # an int is promoted to list[int]
        return True
    if not inspect.isclass(element):
        warnings.warn(
            f"Does not support nested parametric types, got {signature_type}. Please file a bug.",
            stacklevel=3,
        )
        return False
    if getattr(argument_type, "__origin__", None) is list:
        return issubclass(typing.get_args(argument_type)[0], element)
    return _is_homogeneous_tuple(argument_type, element)  # Tuple[T] is accepted for List[T]


def type_matches(signature_type: Any, argument_type: Any) -> bool:
    """Whether a value of ``argument_type`` may be passed where ``signature_type`` is declared
    (Unions by any member, ``List[T]`` from lists/tuples of T or an int for ``List[int]``,
    dtypes as ints, ints/floats as numbers, classes by subclassing)."""
    if signature_type is argument_type:
        return True
    origin = getattr(signature_type, "__origin__", signature_type)
    if origin is typing.Union and signature_type != argument_type:
        return any(type_matches(c, argument_type) for c in typing.get_args(signature_type))
    if getattr(signature_type, "__origin__", None) is list:
        return _list_matches(signature_type, argument_type)
    if signature_type is int and argument_type is torch.dtype:  # dtypes are ints in schemas
        return True
    if signature_type is numbers.Number and argument_type in {int, float}:
        return True
    if inspect.isclass(argument_type) and inspect.isclass(signature_type):
        return issubclass(argument_type, signature_type)
    return False


# --------------------------------------------------------------------------- normalization


def _args_kwargs_to_normalized_args_kwargs(
    sig: inspect.Signature,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    normalize_to_only_use_kwargs: bool,
) -> ArgsKwargsPair | None:
    """Bind ``args``/``kwargs`` to ``sig`` with defaults filled in; None for signatures with
    positional-only or variadic parameters (except ``(input, from, to, generator)``)."""
    simple = {Parameter.POSITIONAL_OR_KEYWORD, Parameter.KEYWORD_ONLY}
    names = list(sig.parameters)
    unsupported = any(p.kind not in simple for p in sig.parameters.values())
    if unsupported and names != ["input", "from", "to", "generator"]:
        return None
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    new_args: list[Any] = []
    new_kwargs: dict[str, Any] = {}
    for i, name in enumerate(names):
        if not normalize_to_only_use_kwargs and i < len(args):
            new_args.append(bound.arguments[name])
        else:
            new_kwargs[name] = bound.arguments[name]
    return ArgsKwargsPair(tuple(new_args), new_kwargs)


def _python_signature(target: Callable[..., Any]) -> inspect.Signature | None:
    """The signature to normalize a Python callable against; for a ``boolean_dispatch``
    function (``F.max_pool2d``) its ``if_true`` branch, or None if the branches differ."""
    if target in boolean_dispatched:  # a WeakKeyDictionary: ``in`` accepts any object
        if_true, if_false = boolean_dispatched[target]["if_true"], boolean_dispatched[target][
            "if_false"]
        if inspect.signature(if_true).parameters != inspect.signature(if_false).parameters:
            return None
        target = if_true
    return inspect.signature(inspect.unwrap(target))


def _types_match(sig: inspect.Signature, arg_types: tuple[Any, ...],
                 kwarg_types: dict[str, Any]) -> bool:
    """Whether argument *types* bind to ``sig`` and each matches its parameter's annotation."""
    try:
        bound = sig.bind(*arg_types, **kwarg_types)
    except TypeError:
        return False
    return all(type_matches(sig.parameters[name].annotation, t)
               for name, t in bound.arguments.items())


def _normalize_torch_op(
    target: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    arg_types: tuple[Any, ...] | None,
    kwarg_types: dict[str, Any] | None,
    only_kwargs: bool,
) -> ArgsKwargsPair | None:
    signatures = get_signature_for_torch_op(target) or []
    matched = [sig for sig in signatures if _binds(sig, args, kwargs)]
    if len(matched) == 1:
        return _args_kwargs_to_normalized_args_kwargs(matched[0], args, kwargs, only_kwargs)
    if not matched:
        return None
    if arg_types is None and kwarg_types is None:
        listing = "\n".join(str(s) for s in matched)
        raise RuntimeError(
            f"Tried to normalize arguments to {torch.typename(target)} but the schema match was "
            "ambiguous! Please provide argument types to the normalize_arguments() call. "
            f"Available schemas:\n{listing}"
        )
    for sig in signatures:
        if _types_match(sig, tuple(arg_types or ()), dict(kwarg_types or {})):
            return _args_kwargs_to_normalized_args_kwargs(sig, args, kwargs, only_kwargs)
    return None


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
    or no overload matches. When several overloads of a torch op match, ``arg_types`` /
    ``kwarg_types`` choose the one whose annotations they match (:func:`type_matches`);
    without them a ``RuntimeError`` lists the candidates. A wrapper exposing the real op as
    ``_op`` (ExecuTorch's edge ops) is normalized as that op.
    """
    kwargs = dict(kwargs or {})
    is_torch_op = isinstance(target, (types.BuiltinFunctionType, OpOverload, OpOverloadPacket))
    if not is_torch_op and hasattr(target, "_op"):
        target = target._op
        is_torch_op = isinstance(
            target, (types.BuiltinFunctionType, OpOverload, OpOverloadPacket))
    if is_torch_op:
        return _normalize_torch_op(
            target, args, kwargs, arg_types, kwarg_types, normalize_to_only_use_kwargs)
    sig = _python_signature(target)
    if sig is None:
        return None
    return _args_kwargs_to_normalized_args_kwargs(sig, args, kwargs, normalize_to_only_use_kwargs)


def _normalize_function_or_error(
    target: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    arg_types: tuple[Any] | None = None,
    kwarg_types: dict[str, Any] | None = None,
    normalize_to_only_use_kwargs: bool = False,
) -> ArgsKwargsPair:
    """:func:`normalize_function`, raising RuntimeError instead of returning None."""
    res = normalize_function(
        target, args, kwargs, arg_types, kwarg_types, normalize_to_only_use_kwargs)
    if res is None:
        raise RuntimeError(
            f"Failed to normalize function {target} with args {args} and kwargs {kwargs}")
    return res


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
    if getattr(torch.nn, cls.__name__, None) != cls:
        return None
    sig = inspect.signature(inspect.unwrap(submod.forward))
    return _args_kwargs_to_normalized_args_kwargs(
        sig, args, dict(kwargs or {}), normalize_to_only_use_kwargs)
