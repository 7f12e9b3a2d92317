"""Spec-driven input flattening for generated code: the counterpart of ``torch.fx._pytree``.

A GraphModule whose inputs are pytrees (``concrete_args`` holding containers, or a
``_PyTreeCodeGen``) begins ``a, b, = fx_pytree.tree_flatten_spec([x], self._in_spec)``.
:func:`tree_flatten_spec` reads each node's children the way a *flatten-spec function*
registered for the spec's type says -- dicts by the spec's keys, sequences by index -- so the
same code runs on real containers and, when the GraphModule is traced again, on the Proxy that
stands for a container. A custom node type needs such a function to be traced again; register
it with :func:`register_pytree_flatten_spec` (or with torch's, which is honoured too).

``SUPPORTED_NODES`` is the table ``exportir.pytree.tree_flatten_spec`` reads (one table, so
code generated before this module existed, which imports ``exportir.pytree as fx_pytree``,
sees the same registrations). Registrations are process-wide, as in torch.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable
from typing import Any

from exportir import pytree
from exportir.pytree import PyTree, TreeSpec, tree_flatten_spec

__all__ = [
    "SUPPORTED_NODES",
    "SUPPORTED_NODES_EXACT_MATCH",
    "register_pytree_flatten_spec",
    "tree_flatten_spec",
]

FlattenFnSpec = Callable[[PyTree, TreeSpec], list[Any]]
FlattenFnExactMatchSpec = Callable[[PyTree, TreeSpec], bool]
FlattenFuncSpec = FlattenFnSpec  # torch's older names for the same types
FlattenFuncExactMatchSpec = FlattenFnExactMatchSpec

# The builtin rules, under torch.fx._pytree's names.
_dict_flatten_spec: FlattenFnSpec = pytree._by_context_keys
_list_flatten_spec: FlattenFnSpec = pytree._by_index
_tuple_flatten_spec: FlattenFnSpec = pytree._by_index
_namedtuple_flatten_spec: FlattenFnSpec = pytree._by_index

SUPPORTED_NODES: dict[type[Any], FlattenFnSpec] = pytree._FLATTEN_SPEC_RULES


def _same_length(node: Any, spec: TreeSpec) -> bool:
    """True if ``node`` has exactly the spec's number of children (no extra entries)."""
    return len(node) == spec.num_children


_dict_flatten_spec_exact_match: FlattenFnExactMatchSpec = _same_length
_list_flatten_spec_exact_match: FlattenFnExactMatchSpec = _same_length
_tuple_flatten_spec_exact_match: FlattenFnExactMatchSpec = _same_length
_namedtuple_flatten_spec_exact_match: FlattenFnExactMatchSpec = _same_length

SUPPORTED_NODES_EXACT_MATCH: dict[type[Any], FlattenFnExactMatchSpec | None] = {
    dict: _same_length,
    list: _same_length,
    tuple: _same_length,
    namedtuple: _same_length,  # type: ignore[dict-item]  # torch keys namedtuple nodes by it
}


def register_pytree_flatten_spec(
    cls: type[Any],
    flatten_fn_spec: FlattenFnSpec,
    flatten_fn_exact_match_spec: FlattenFnExactMatchSpec | None = None,
) -> None:
    """Read nodes of type ``cls`` with ``flatten_fn_spec(node, spec) -> children``.

    ``cls`` is the spec's type, as the pytree registration recorded it. The function should
    only index or read attributes of ``node``, so that it also works on a Proxy. A second
    registration for ``cls`` replaces the first.
    """
    SUPPORTED_NODES[cls] = flatten_fn_spec
    SUPPORTED_NODES_EXACT_MATCH[cls] = flatten_fn_exact_match_spec


def _deregister_pytree_flatten_spec(cls: type[Any]) -> None:
    """Undo :func:`register_pytree_flatten_spec`; KeyError if ``cls`` was not registered."""
    del SUPPORTED_NODES[cls]
    del SUPPORTED_NODES_EXACT_MATCH[cls]
