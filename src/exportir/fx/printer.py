"""The FX text format: how nodes, graphs and node tables print.

Every function here produces exactly the text torch.fx 2.13 produces for the same graph, so
printed graphs can be compared across the two implementations:

* :func:`_get_qualified_name` / :func:`_type_repr` / :func:`_format_arg` — the building blocks
  (also used by code generation),
* :func:`format_node` — one line of ``str(graph)`` (``Node.format_node`` delegates here),
* :func:`graph_to_str` — ``str(graph)``,
* :func:`format_tabular` / :func:`print_tabular` — the ``opcode/name/target/args/kwargs`` table,
  rendered in the layout of ``tabulate``'s default "simple" format without depending on it.

Nodes are only read (``op``, ``name``, ``target``, ``args``, ``kwargs``, ``type``, ``users``,
``meta``); nothing here mutates a graph.
"""

from __future__ import annotations

import builtins
import inspect
import math
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch.utils._dtype_abbrs import dtype_abbrs

__all__ = [
    "format_node",
    "format_tabular",
    "graph_to_str",
    "print_tabular",
]

_TABLE_HEADERS = ("opcode", "name", "target", "args", "kwargs")
# Layouts whose tensor metadata is not printed: compressed sparse tensors have no plain strides.
_UNSTRIDED_LAYOUTS = (torch.sparse_csc, torch.sparse_csr)


# --------------------------------------------------------------------------- names of callables


def _find_module_of_method(orig_method: Callable[..., Any]) -> str:
    """The module a callable lives in; falls back to searching ``torch`` and ``torch.nn.functional``.

    Raises ``RuntimeError`` when no module can be determined.
    """
    module = orig_method.__module__
    if module is not None:
        return module
    name = orig_method.__name__
    for candidate in (torch, torch.nn.functional):
        if getattr(candidate, name, None) is orig_method:
            return candidate.__name__
    raise RuntimeError(f"cannot find module for {orig_method}")


def _is_tensor_method(func: Any) -> bool:
    """True for methods of ``torch.Tensor`` (C descriptors or Python methods of ``torch._tensor``)."""
    name = func.__name__
    descriptor = isinstance(func, (types.MethodDescriptorType, types.WrapperDescriptorType))
    if descriptor and func is getattr(torch.Tensor, name, None):
        return True
    return func.__module__ == "torch._tensor" and func.__qualname__ == f"Tensor.{name}"


# (module, name) pairs whose public spelling differs from what the callable reports.
_NAME_FIXUPS: dict[tuple[str, str], str] = {
    ("torch", "segment_reduce"): "_segment_reduce",
    ("torch.nn.functional", "_ScalingType"): "ScalingType",
    ("torch.nn.functional", "_SwizzleType"): "SwizzleType",
}


def _lambda_name(func: Callable[..., Any]) -> str:
    """The variable a lambda was assigned to, read from its source (``f = lambda ...`` -> ``f``)."""
    try:
        return inspect.getsource(func).split("=")[0].strip()
    except Exception as e:
        raise RuntimeError("Unable to represent lambda") from e


def _get_qualified_name(func: Callable[..., Any]) -> str:
    """The dotted name generated code uses to refer to ``func``.

    Builtins print bare (``getattr``); Tensor methods as ``torch.Tensor.<name>``; operator
    overloads under ``torch.ops`` (their ``__module__`` says ``torch._ops``); everything else as
    ``<module>.<name>``.
    """
    name = func.__name__
    if getattr(builtins, name, None) is func:
        return name
    if _is_tensor_method(func):
        return f"torch.Tensor.{name}"
    if name == "<lambda>":
        name = _lambda_name(func)
    module = _find_module_of_method(func).replace("torch._ops", "torch.ops")
    name = _NAME_FIXUPS.get((module, name), name)
    return f"{module}.{name}"


def _type_repr(obj: object) -> str:
    """Short repr of a type annotation: ``torch.Tensor``, ``int``, ``List[int]``, ``...``.

    Classes print as ``module.qualname`` (bare for builtins), plain functions by name, anything
    else (generic aliases included) via ``repr``.
    """
    if isinstance(obj, type) and not isinstance(obj, types.GenericAlias):
        if obj.__module__ == "builtins":
            return obj.__qualname__
        return f"{obj.__module__}.{obj.__qualname__}"
    if obj is ...:
        return "..."
    if isinstance(obj, types.FunctionType):
        return obj.__name__
    return repr(obj)


def pretty_print_target(target: object) -> str:
    """How a node target appears in ``target=...``: strings verbatim, ``builtins.x``,
    ``operator.x``, otherwise the qualified name."""
    if isinstance(target, str):
        return target
    if hasattr(target, "__module__"):
        name = getattr(target, "__name__", None)
        if name is None:
            return _get_qualified_name(target)  # type: ignore[arg-type]  # mirrors torch: may raise
        prefix = _TARGET_MODULE_PREFIX.get(target.__module__)
        if prefix is not None:
            return f"{prefix}.{name}"
    return _get_qualified_name(target)  # type: ignore[arg-type]  # callables only reach here


_TARGET_MODULE_PREFIX = {"builtins": "builtins", "_operator": "operator"}


# --------------------------------------------------------------------------- arguments


def _node_class() -> type:
    """The Node class, imported lazily: node.py imports this module."""
    from exportir.fx.node import Node

    return Node


def _format_sequence(items: Sequence[object], max_list_len: float) -> tuple[str, str]:
    """Comma-joined items (at most ``max_list_len``) and the ``...[total_len=N]`` trailer."""
    shown = ", ".join(_format_arg(a) for idx, a in enumerate(items) if idx < max_list_len)
    trailer = "" if len(items) < max_list_len + 1 else f", ...[total_len={len(items)}]"
    return shown, trailer


def _format_arg(arg: object, max_list_len: float = math.inf) -> str:
    """An argument as printed in ``str(graph)``: nodes as ``%name``, containers recursively,
    dict keys unquoted, everything else via ``str``."""
    custom = getattr(arg, "_custom_fx_repr_fn", None)
    if custom is not None:
        return custom()
    if isinstance(arg, list):
        shown, trailer = _format_sequence(arg, max_list_len)
        return f"[{shown}{trailer}]"
    if isinstance(arg, tuple):
        shown, trailer = _format_sequence(arg, max_list_len)
        comma = "," if len(arg) == 1 else ""
        return f"({shown}{comma}{trailer})"
    if isinstance(arg, dict):
        items = ", ".join(f"{k}: {_format_arg(v)}" for k, v in arg.items())
        return f"{{{items}}}"
    if isinstance(arg, _node_class()):
        return f"%{arg}"
    return str(arg)


# --------------------------------------------------------------------------- nodes and graphs


def _shape_str(shape: Iterable[object]) -> str:
    return f"[{', '.join(str(x) for x in shape)}]"


def _meta_value(node: Any) -> object:
    """The value a node's metadata describes: ``val``, else ``tensor_meta``, else ``example_value``."""
    meta = node.meta
    return meta.get("val", meta.get("tensor_meta", meta.get("example_value", None)))


def _typename_prefix(node: Any) -> str:
    """``"<type> "`` for a node with a type annotation, else ``""``."""
    return f"{_type_repr(node.type)} " if node.type is not None else ""


def _tensor_metadata_annotation(node: Any) -> str | None:
    """``Tensor "f32[2, 3][3, 1]cpu"`` for a node whose metadata holds a strided tensor."""
    val = _meta_value(node)
    if not isinstance(val, torch.Tensor) or val.layout in _UNSTRIDED_LAYOUTS:
        return None
    return (
        f'Tensor "{dtype_abbrs[val.dtype]}{_shape_str(val.shape)}'
        f'{_shape_str(val.stride())}{val.device}"'
    )


def _format_placeholder(node: Any, placeholder_names: list[str] | None) -> str | None:
    target = node.target
    if not isinstance(target, str):
        raise AssertionError(f"Expected target to be str for placeholder, got {type(target)}")  # noqa: TRY004  # torch.fx's exception type
    # torch.fx 2.13 repeats the name when the placeholder is typed ("xx: int"); kept verbatim.
    signature_entry = target + (target + f": {_type_repr(node.type)}" if node.type else "")
    if placeholder_names:
        placeholder_names.append(signature_entry)
        return None
    typename = f"{_type_repr(node.type)} " if node.type else ""
    default = f"(default={node.args[0]})" if node.args else ""
    return (
        f"%{node.name} : {typename}[num_users={len(node.users)}] = "
        f"placeholder[target={target}]{default}"
    )


def _format_get_attr(node: Any) -> str:
    return (
        f"%{node.name} : {_typename_prefix(node)}[num_users={len(node.users)}] = "
        f"{node.op}[target={pretty_print_target(node.target)}]"
    )


def _format_output(node: Any, maybe_return_typename: list[str] | None) -> str:
    if node.type and maybe_return_typename:
        maybe_return_typename[0] = f" -> {_type_repr(node.type)}"
    return f"return {node.args[0]}"


def _format_call(node: Any, include_tensor_metadata: bool) -> str:
    annotation = _tensor_metadata_annotation(node) if include_tensor_metadata else None
    if annotation is None:
        annotation = _typename_prefix(node)
    return (
        f"%{node.name} : {annotation}[num_users={len(node.users)}] = "
        f"{node.op}[target={pretty_print_target(node.target)}]("
        f"args = {_format_arg(node.args)}, kwargs = {_format_arg(node.kwargs)})"
    )


def format_node(
    node: Any,
    placeholder_names: list[str] | None = None,
    maybe_return_typename: list[str] | None = None,
    *,
    include_tensor_metadata: bool = False,
) -> str | None:
    """One node as printed in ``str(graph)``; the body of ``Node.format_node``.

    A placeholder appends its signature entry to a *non-empty* ``placeholder_names`` and returns
    ``None`` (torch.fx tests the list's truthiness, so an empty list collects nothing). An output
    node records ``" -> <type>"`` in ``maybe_return_typename[0]`` when both are given.
    """
    op = node.op
    if op == "placeholder":
        return _format_placeholder(node, placeholder_names)
    if op == "get_attr":
        return _format_get_attr(node)
    if op == "output":
        return _format_output(node, maybe_return_typename)
    return _format_call(node, include_tensor_metadata)


def graph_to_str(graph: Any) -> str:
    """``str(graph)``: a ``graph(...):`` header and one indented line per node."""
    placeholder_names: list[str] = []
    return_typename = [""]
    lines = [format_node(node, placeholder_names) for node in graph.nodes]
    header = f"graph({', '.join(placeholder_names)}){return_typename[0]}:"
    return header + "".join(f"\n    {line}" for line in lines if line)


# --------------------------------------------------------------------------- tabular view


def _numeric_kind(cells: list[list[str]]) -> str | None:
    """``"int"``/``"float"`` when every line of a column parses as that number, else ``None``."""
    lines = [line for cell in cells for line in cell if line]
    if not lines:
        return None
    for kind, parse in (("int", int), ("float", float)):
        try:
            for line in lines:
                parse(line)
        except ValueError:
            continue
        return kind
    return None


# tabulate re-formats numeric cells: ints canonically, floats with the "g" format.
_NUMBER_FORMAT: dict[str, Callable[[str], str]] = {
    "int": lambda s: str(int(s)),
    "float": lambda s: format(float(s), "g"),
}


def _decimal_pad(lines: list[str]) -> list[str]:
    """Pad numbers on the right so their decimal points line up once right-aligned.

    As tabulate counts it, a number without a point is measured from its exponent's ``e``
    (``5e+06`` has 3 characters "after the point"), and an integer from its end.
    """

    def after_point(s: str) -> int:
        pos = s.rfind(".")
        if pos < 0:
            pos = s.lower().rfind("e")
        return len(s) - pos - 1 if pos >= 0 else -1

    most = max(after_point(s) for s in lines if s)
    return [s + " " * (most - after_point(s)) if s else s for s in lines]


def _column_lines(cells: list[list[str]], header: str) -> tuple[list[list[str]], str, int, bool]:
    """Normalize one column: returns its cells (as lines), header, width and right-alignment."""
    kind = _numeric_kind(cells)
    if kind is not None:
        fmt = _NUMBER_FORMAT[kind]
        cells = [[fmt(line) if line else line for line in cell] for cell in cells]
    if kind == "float":
        flat = _decimal_pad([line for cell in cells for line in cell])
        it = iter(flat)
        cells = [[next(it) for _ in cell] for cell in cells]
    width = max([len(header) + 2] + [len(line) for cell in cells for line in cell])
    return cells, header, width, kind is not None


def format_tabular(rows: Sequence[Sequence[object]], headers: Sequence[str]) -> str:
    """Render ``rows`` like ``tabulate(rows, headers=headers)`` (the default "simple" format).

    Columns are separated by two spaces and underlined with dashes; each column is at least two
    wider than its header; text is left-aligned and numeric columns right-aligned; cells are
    ``str()``-ed and stripped (the cell, not each of its lines), multi-line cells span several
    lines; trailing spaces of each output line are dropped.
    """
    columns = []
    for idx, header in enumerate(headers):
        cells = [str(row[idx]).strip().split("\n") for row in rows]
        columns.append(_column_lines(cells, header))

    def render(parts: Sequence[str]) -> str:
        fitted = [
            part.rjust(width) if right else part.ljust(width)
            for part, (_, _, width, right) in zip(parts, columns)
        ]
        return "  ".join(fitted).rstrip()

    out = [render(headers), render(["-" * width for _, _, width, _ in columns])]
    for r in range(len(rows)):
        height = max(len(col[0][r]) for col in columns)
        for i in range(height):
            out.append(render([col[0][r][i] if i < len(col[0][r]) else "" for col in columns]))
    return "\n".join(out)


def tabular_rows(graph: Any) -> list[list[object]]:
    """The rows ``print_tabular`` shows: ``[op, name, target, args, kwargs]`` per node."""
    return [[n.op, n.name, n.target, n.args, n.kwargs] for n in graph.nodes]


def print_tabular(graph: Any) -> None:
    """Print the graph's nodes as a table, as ``torch.fx.Graph.print_tabular`` does."""
    print(format_tabular(tabular_rows(graph), _TABLE_HEADERS))


_pretty_print_target = pretty_print_target  # the spelling torch.fx.Node uses
