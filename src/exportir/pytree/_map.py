"""Leafwise operations: the ``tree_map`` family, ``tree_all``/``tree_any``, and key paths.

Contract: ``tree_map(f, t, *rests)`` applies ``f`` to the leaves of ``t`` (and the matching
subtrees of ``rests``, which must have ``t``'s structure as a prefix) and rebuilds ``t``'s
structure; the ``*_with_path`` variants pair each leaf with its key path.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

from exportir.pytree._keys import KeyPath
from exportir.pytree._registry import DEFAULT_REGISTRY, IsLeafFn, PyTree
from exportir.pytree._spec import TreeSpec, tree_flatten, tree_iter, tree_structure

# --------------------------------------------------------------------------- mapping


def tree_map(
    func: Callable[..., Any], tree: PyTree, *rests: PyTree, is_leaf: IsLeafFn = None
) -> PyTree:
    """Apply ``func`` leafwise; ``rests`` must have ``tree``'s structure as a prefix."""
    leaves, spec = tree_flatten(tree, is_leaf)
    columns = [leaves] + [spec.flatten_up_to(r) for r in rests]
    return spec.unflatten(list(map(func, *columns)))


def tree_map_(
    func: Callable[..., Any], tree: PyTree, *rests: PyTree, is_leaf: IsLeafFn = None
) -> PyTree:
    """Call ``func`` leafwise for its side effects; return ``tree`` itself."""
    leaves, spec = tree_flatten(tree, is_leaf)
    columns = [leaves] + [spec.flatten_up_to(r) for r in rests]
    for _ in map(func, *columns):
        pass
    return tree


def _predicate(type_or_pred: Any) -> Callable[[Any], bool]:
    if isinstance(type_or_pred, (type, tuple, types.UnionType)):
        return lambda x: isinstance(x, type_or_pred)
    if callable(type_or_pred):
        return type_or_pred
    raise TypeError("Argument must be a type, a tuple of types, or a callable.")


def map_only(type_or_pred: Any, /) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
    """Decorator: apply the function only where the type/predicate matches, else identity."""
    pred = _predicate(type_or_pred)

    def wrapper(func: Callable[[Any], Any]) -> Callable[[Any], Any]:
        @functools.wraps(func)
        def wrapped(x: Any) -> Any:
            return func(x) if pred(x) else x

        return wrapped

    return wrapper


def tree_map_only(
    type_or_pred: Any, /, func: Callable[[Any], Any], tree: PyTree, is_leaf: IsLeafFn = None
) -> PyTree:
    """:func:`tree_map` restricted to leaves matching a type, tuple of types or predicate."""
    return tree_map(map_only(type_or_pred)(func), tree, is_leaf=is_leaf)


def tree_map_only_(
    type_or_pred: Any, /, func: Callable[[Any], Any], tree: PyTree, is_leaf: IsLeafFn = None
) -> PyTree:
    """:func:`tree_map_` restricted to matching leaves."""
    return tree_map_(map_only(type_or_pred)(func), tree, is_leaf=is_leaf)


def tree_all(pred: Callable[[Any], bool], tree: PyTree, is_leaf: IsLeafFn = None) -> bool:
    """True if ``pred`` holds for every leaf."""
    return all(map(pred, tree_iter(tree, is_leaf)))


def tree_any(pred: Callable[[Any], bool], tree: PyTree, is_leaf: IsLeafFn = None) -> bool:
    """True if ``pred`` holds for some leaf."""
    return any(map(pred, tree_iter(tree, is_leaf)))


def tree_all_only(
    types: Any, /, pred: Callable[[Any], bool], tree: PyTree, is_leaf: IsLeafFn = None
) -> bool:
    """True if ``pred`` holds for every leaf that is an instance of ``types``."""
    return all(pred(x) for x in tree_iter(tree, is_leaf) if isinstance(x, types))


def tree_any_only(
    types: Any, /, pred: Callable[[Any], bool], tree: PyTree, is_leaf: IsLeafFn = None
) -> bool:
    """True if ``pred`` holds for some leaf that is an instance of ``types``."""
    return any(pred(x) for x in tree_iter(tree, is_leaf) if isinstance(x, types))


# --------------------------------------------------------------------------- key paths


def _key_paths(
    path: KeyPath, tree: PyTree, is_leaf: IsLeafFn, out: list[tuple[KeyPath, Any]]
) -> None:
    if is_leaf is not None and is_leaf(tree):
        out.append((path, tree))
        return
    node = DEFAULT_REGISTRY.node_for(type(tree))
    if node is None:
        out.append((path, tree))
        return
    if node.flatten_with_keys_fn is None:
        raise ValueError(
            f"Did not find a flatten_with_keys_fn for type: {node.type}. "
            "Please pass a flatten_with_keys_fn argument to register_pytree_node."
        )
    for key, child in node.flatten_with_keys_fn(tree)[0]:
        _key_paths((*path, key), child, is_leaf, out)


def tree_leaves_with_path(tree: PyTree, is_leaf: IsLeafFn = None) -> list[tuple[KeyPath, Any]]:
    """``(key_path, leaf)`` pairs in flatten order."""
    out: list[tuple[KeyPath, Any]] = []
    _key_paths((), tree, is_leaf, out)
    return out


def tree_flatten_with_path(
    tree: PyTree, is_leaf: IsLeafFn = None
) -> tuple[list[tuple[KeyPath, Any]], TreeSpec]:
    """Like :func:`tree_flatten`, with each leaf paired with its key path."""
    return tree_leaves_with_path(tree, is_leaf), tree_structure(tree, is_leaf)


def tree_map_with_path(
    func: Callable[..., Any], tree: PyTree, *rests: PyTree, is_leaf: IsLeafFn = None
) -> PyTree:
    """Like :func:`tree_map`; ``func`` receives the key path first."""
    pairs, spec = tree_flatten_with_path(tree, is_leaf)
    paths = [p for p, _ in pairs]
    columns = [[v for _, v in pairs]] + [spec.flatten_up_to(r) for r in rests]
    return spec.unflatten([func(p, *xs) for p, *xs in zip(paths, *columns, strict=True)])
