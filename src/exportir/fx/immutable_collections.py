"""Read-only list and dict used for ``Node.args`` / ``Node.kwargs`` containers.

A node's arguments are shared with its users' bookkeeping, so mutating them in place would
silently desynchronize ``users``; these types refuse mutation and say how to do it instead.

Both types are pytree nodes, flattened like ``list`` / ``dict``, in exportir's registry and in
torch's (``torch.utils._pytree``), exactly as ``torch.fx.immutable_collections`` registers its
own: see :func:`_register_with_pytrees`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, NoReturn

import torch.utils._pytree as torch_pytree

from exportir import pytree

__all__ = ["immutable_dict", "immutable_list"]

_HOW_TO_MUTATE = (
    "If you are attempting to modify the kwargs or args of a torch.fx.Node object,\n"
    "instead create a new copy of it and assign the copy to the node:\n\n"
    "    new_args = ...  # copy and mutate args\n"
    "    node.args = new_args"
)


def _refuse(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError(f"{type(self).__name__!r} object does not support mutation. {_HOW_TO_MUTATE}")


class immutable_list(list):
    """A ``list`` whose mutating methods raise ``TypeError``; hashable by value."""

    __delitem__ = __iadd__ = __imul__ = __setitem__ = _refuse
    append = clear = extend = insert = pop = remove = reverse = sort = _refuse

    def __hash__(self) -> int:  # type: ignore[override]  # hashable by contents, like a tuple
        return hash(tuple(self))

    def __reduce__(self) -> tuple[type, tuple[tuple[Any, ...]]]:
        return (type(self), (tuple(self),))


class immutable_dict(dict):
    """A ``dict`` whose mutating methods raise ``TypeError``; hashable by value."""

    __delitem__ = __ior__ = __setitem__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]  # refuse all

    def __hash__(self) -> int:  # type: ignore[override]  # hashable by contents
        return hash(frozenset(self.items()))

    def __reduce__(self) -> tuple[type, tuple[tuple[tuple[Any, Any], ...]]]:
        return (type(self), (tuple(self.items()),))


# --------------------------------------------------------------------------- pytree nodes
# Same flatten contract as torch's list/dict nodes: children in order, context None for the
# list and the key list for the dict; keyed flattening yields each pytree's own
# SequenceKey / MappingKey (``keys`` is the pytree module whose key classes to use).


def _flatten_list(xs: immutable_list) -> tuple[list[Any], None]:
    return list(xs), None


def _unflatten_list(values: Iterable[Any], _context: None) -> immutable_list:
    return immutable_list(values)


def _list_with_keys(xs: immutable_list, keys: Any) -> tuple[list[tuple[Any, Any]], None]:
    return [(keys.SequenceKey(i), v) for i, v in enumerate(xs)], None


def _flatten_dict(d: immutable_dict) -> tuple[list[Any], list[Any]]:
    return list(d.values()), list(d.keys())


def _unflatten_dict(values: Iterable[Any], keys: list[Any]) -> immutable_dict:
    return immutable_dict(zip(keys, values, strict=True))


def _dict_with_keys(d: immutable_dict, keys: Any) -> tuple[list[tuple[Any, Any]], list[Any]]:
    return [(keys.MappingKey(k), v) for k, v in d.items()], list(d.keys())


# (class, flatten, unflatten, keyed flatten, serialized name in ours, in torch's). Ours reuse
# torch.fx's names so dumped specs read as torch's do; in torch's registry those names belong
# to torch.fx's own classes, which must keep loading as themselves, so ours get their own.
_NODES: tuple[tuple[Any, ...], ...] = (
    (immutable_list, _flatten_list, _unflatten_list, _list_with_keys,
     "torch.fx.immutable_collections.immutable_list",
     "exportir.fx.immutable_collections.immutable_list"),
    (immutable_dict, _flatten_dict, _unflatten_dict, _dict_with_keys,
     "torch.fx.immutable_collections.immutable_dict",
     "exportir.fx.immutable_collections.immutable_dict"),
)


def _register_with_pytrees() -> None:
    """Make both types pytree nodes in exportir's registry and in torch's.

    Done once, when this module is first imported (``exportir.fx`` imports it) -- the moment
    ``torch.fx.immutable_collections`` registers torch's own pair. Code that walks
    ``node.args`` with either pytree (``torch.utils._pytree.tree_map`` in a third-party pass,
    ``exportir.pytree`` in ours) must see the elements as leaves, not the container as one
    leaf. torch's registry is process-wide and has no scoped registration, so this one is
    permanent; a type a registry already holds (module reloaded) is left as it is.
    """
    for cls, flatten, unflatten, with_keys, our_name, torch_name in _NODES:
        if cls not in pytree.SUPPORTED_NODES:
            pytree.register_pytree_node(
                cls, flatten, unflatten, serialized_type_name=our_name,
                flatten_with_keys_fn=functools.partial(with_keys, keys=pytree),
            )
        if cls not in torch_pytree.SUPPORTED_NODES:
            torch_pytree.register_pytree_node(
                cls, flatten, unflatten, serialized_type_name=torch_name,
                flatten_with_keys_fn=functools.partial(with_keys, keys=torch_pytree),
            )


_register_with_pytrees()
