"""Read-only list and dict used for ``Node.args`` / ``Node.kwargs`` containers.

A node's arguments are shared with its users' bookkeeping, so mutating them in place would
silently desynchronize ``users``; these types refuse mutation and say how to do it instead.
"""

from __future__ import annotations

from typing import Any, NoReturn

from exportir import pytree

__all__ = ["immutable_list", "immutable_dict"]

_HOW_TO_MUTATE = (
    "If you are attempting to modify the kwargs or args of a torch.fx.Node object,\n"
    "instead create a new copy of it and assign the copy to the node:\n"
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


def _register_with_pytree() -> None:
    """Make both types pytree nodes in exportir's own registry (flattened like list/dict)."""
    pytree.register_pytree_node(
        immutable_list,
        lambda xs: (list(xs), None),
        lambda values, _ctx: immutable_list(values),
        serialized_type_name="torch.fx.immutable_collections.immutable_list",
    )
    pytree.register_pytree_node(
        immutable_dict,
        lambda d: (list(d.values()), list(d.keys())),
        lambda values, keys: immutable_dict(zip(keys, values)),
        serialized_type_name="torch.fx.immutable_collections.immutable_dict",
    )


_register_with_pytree()
