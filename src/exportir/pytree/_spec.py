"""TreeSpec and flattening: take a pytree apart into leaves plus a spec, and rebuild it.

Contract: ``tree_unflatten(*tree_flatten(t)) == t`` for every pytree ``t``; ``TreeSpec`` equality,
hash, repr and pickling follow ``torch.utils._pytree``. ``flatten_up_to`` and
``tree_flatten_spec`` read a tree in the layout of a given spec; torch TreeSpecs convert both
ways.
"""

from __future__ import annotations

import sys
from collections import OrderedDict, defaultdict, deque, namedtuple
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from exportir.pytree._registry import (
    BUILTIN_TYPES,
    DEFAULT_REGISTRY,
    STANDARD_DICT_TYPES,
    Context,
    IsLeafFn,
    PyTree,
    PytreeRegistry,
    is_structseq_class,
)

# --------------------------------------------------------------------------- TreeSpec


class TreeSpec:
    """Immutable description of a pytree's structure.

    ``type`` is the node type (``None`` for a leaf, ``collections.namedtuple`` for any
    namedtuple, whose class is then the context), ``context`` what its flatten function
    returned besides the children, and the children are TreeSpecs.
    """

    __slots__ = ("_children", "_context", "_num_leaves", "_num_nodes", "_type")

    def __init__(self, type: Any, context: Context, children_specs: list[TreeSpec]) -> None:
        if type is None:
            if context is not None:
                raise ValueError("leaf node should not have a context")
            if children_specs:
                raise ValueError("leaf node should not have children")
            self._num_nodes = self._num_leaves = 1
        else:
            self._num_nodes = 1 + sum(c._num_nodes for c in children_specs)
            self._num_leaves = sum(c._num_leaves for c in children_specs)
        self._type = type
        self._context = context
        self._children = children_specs

    # -- read-only views ------------------------------------------------------------------

    type = property(lambda self: self._type, doc="Node type (None for a leaf).")
    context = property(lambda self: self._context, doc="Context returned by flatten.")
    num_nodes = property(lambda self: self._num_nodes, doc="Nodes including leaves.")
    num_leaves = property(lambda self: self._num_leaves, doc="Number of leaves.")
    num_children = property(lambda self: len(self._children), doc="Direct children.")
    children_specs = property(lambda self: self._children, doc="The child specs (shared).")

    def is_leaf(self) -> bool:
        """True if this spec describes a single leaf."""
        return self._num_nodes == 1 and self._num_leaves == 1

    def children(self) -> list[TreeSpec]:
        """A copy of the child specs."""
        return list(self._children)

    def child(self, index: int) -> TreeSpec:
        """Child spec ``index``."""
        return self._children[index]

    # -- value semantics ------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, TreeSpec):
            return NotImplemented
        return (
            str(self._type) == str(other._type)
            and self._context == other._context
            and self._children == other._children
        )

    def __hash__(self) -> int:
        return hash((self._type, _hashable_context(self), tuple(self._children)))

    def __repr__(self, indent: int = 0) -> str:
        if self._type is None:
            return "*"
        inner = indent + 2
        parts = [c.__repr__(inner) for c in self._children]
        body = (",\n" + " " * inner).join(parts)
        return f"TreeSpec({self._type.__name__}, {self._context}, [{body}])"

    def __reduce__(self) -> tuple[Any, ...]:
        if self._type is None:
            return (LeafSpec, ())
        return (TreeSpec, (self._type, self._context, self._children))

    # -- flatten / unflatten --------------------------------------------------------------

    def unflatten(self, leaves: Iterable[Any]) -> PyTree:
        """Build the pytree this spec describes from ``leaves`` (exactly ``num_leaves``)."""
        if not isinstance(leaves, (list, tuple)):
            leaves = list(leaves)
        if len(leaves) != self._num_leaves:
            raise ValueError(
                f"treespec.unflatten(leaves): `leaves` has length {len(leaves)} "
                f"but the spec refers to a pytree that holds {self._num_leaves} "
                f"items ({self})."
            )
        if self._type is None:
            return leaves[0]
        return _build(self, iter(leaves), DEFAULT_REGISTRY)

    def flatten_up_to(self, tree: PyTree) -> list[PyTree]:
        """Subtrees of ``tree`` at the positions of this spec's leaves.

        Raises ValueError when ``tree`` does not have this spec as a prefix.
        """
        out: list[PyTree] = []
        _flatten_up_to(self, tree, out, DEFAULT_REGISTRY)
        return out


class LeafSpec(TreeSpec):
    """The spec of a single leaf; prints as ``*``."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(None, None, [])


_LEAF = LeafSpec()


def _hashable_context(spec: TreeSpec) -> Any:
    kind, ctx = spec._type, spec._context
    if kind is defaultdict:
        return (ctx[0], tuple(ctx[1]))
    if kind in (dict, OrderedDict):
        return tuple(ctx)
    if kind is None or kind in BUILTIN_TYPES:
        return ctx
    return None  # user contexts may be unhashable; equal specs still hash equal


def _build(spec: TreeSpec, leaves: Iterator[Any], registry: PytreeRegistry) -> PyTree:
    node = registry._nodes.get(spec._type) or registry.node_for_spec_type(spec._type)
    kids = [
        next(leaves) if c._type is None else _build(c, leaves, registry) for c in spec._children
    ]
    return node.unflatten_fn(kids, spec._context)


def treespec_leaf() -> LeafSpec:
    """The shared leaf spec."""
    return _LEAF


def treespec_tuple(iterable: Iterable[TreeSpec] = (), /) -> TreeSpec:
    """A tuple spec with the given children."""
    children = list(iterable)
    if not all(isinstance(c, TreeSpec) for c in children):
        raise ValueError(f"Expected a tuple of TreeSpec values, got: {children!r}.")
    return TreeSpec(tuple, None, children)


def treespec_dict(mapping: Any = (), /, **kwargs: TreeSpec) -> TreeSpec:
    """A dict spec with the given keys and child specs."""
    items = dict(mapping, **kwargs)
    if not all(isinstance(c, TreeSpec) for c in items.values()):
        raise ValueError(f"Expected a dictionary of TreeSpec values, got: {items!r}.")
    return TreeSpec(dict, list(items), list(items.values()))


# --------------------------------------------------------------------------- flattening


def tree_is_leaf(tree: PyTree, is_leaf: IsLeafFn = None) -> bool:
    """True if ``tree`` is a leaf (unregistered type, or ``is_leaf`` says so)."""
    if is_leaf is not None and is_leaf(tree):
        return True
    return DEFAULT_REGISTRY.node_for(type(tree)) is None


def _flatten_into(
    tree: PyTree, leaves: list[Any], is_leaf: IsLeafFn, registry: PytreeRegistry
) -> TreeSpec:
    if is_leaf is not None and is_leaf(tree):
        leaves.append(tree)
        return _LEAF
    node = registry.node_for(type(tree))
    if node is None:
        leaves.append(tree)
        return _LEAF
    children, ctx = node.flatten_fn(tree)
    return TreeSpec(node.type, ctx, [_flatten_into(c, leaves, is_leaf, registry) for c in children])


def tree_flatten(tree: PyTree, is_leaf: IsLeafFn = None) -> tuple[list[Any], TreeSpec]:
    """Leaves of ``tree`` in order, and the TreeSpec to rebuild it."""
    leaves: list[Any] = []
    spec = _flatten_into(tree, leaves, is_leaf, DEFAULT_REGISTRY)
    return leaves, spec


def _as_spec(spec: Any) -> TreeSpec:
    if isinstance(spec, TreeSpec):
        return spec
    if callable(getattr(spec, "is_leaf", None)) and hasattr(spec, "num_leaves"):
        return from_torch_treespec(spec)
    raise TypeError(
        f"Expected `treespec` to be an instance of PyTreeSpec but got item of type {type(spec)}."
    )


def tree_unflatten(leaves: Iterable[Any], treespec: TreeSpec) -> PyTree:
    """Inverse of :func:`tree_flatten`. Accepts torch TreeSpecs too."""
    if not isinstance(treespec, TreeSpec) and isinstance(leaves, TreeSpec):
        leaves, treespec = treespec, leaves
    return _as_spec(treespec).unflatten(leaves)


def tree_iter(tree: PyTree, is_leaf: IsLeafFn = None) -> Iterator[Any]:
    """Iterate over the leaves of ``tree`` lazily."""
    if is_leaf is not None and is_leaf(tree):
        yield tree
        return
    node = DEFAULT_REGISTRY.node_for(type(tree))
    if node is None:
        yield tree
        return
    for child in node.flatten_fn(tree)[0]:
        yield from tree_iter(child, is_leaf)


def _collect_leaves(
    tree: PyTree, leaves: list[Any], is_leaf: IsLeafFn, registry: PytreeRegistry
) -> None:
    if is_leaf is not None and is_leaf(tree):
        leaves.append(tree)
        return
    node = registry.node_for(type(tree))
    if node is None:
        leaves.append(tree)
        return
    for child in node.flatten_fn(tree)[0]:
        _collect_leaves(child, leaves, is_leaf, registry)


def tree_leaves(tree: PyTree, is_leaf: IsLeafFn = None) -> list[Any]:
    """List of the leaves of ``tree`` (no TreeSpec is built)."""
    leaves: list[Any] = []
    _collect_leaves(tree, leaves, is_leaf, DEFAULT_REGISTRY)
    return leaves


def tree_structure(tree: PyTree, is_leaf: IsLeafFn = None) -> TreeSpec:
    """TreeSpec of ``tree``."""
    return tree_flatten(tree, is_leaf)[1]


def arg_tree_leaves(*args: PyTree, **kwargs: PyTree) -> list[Any]:
    """Leaves of ``(args, kwargs)`` without building a spec."""
    leaves: list[Any] = []
    for value in (*args, *kwargs.values()):
        _collect_leaves(value, leaves, None, DEFAULT_REGISTRY)
    return leaves


# --------------------------------------------------------------------------- flatten_up_to


def _check_dict_keys(expected: list[Any], node: Any) -> None:
    got, want = set(node), set(expected)
    if got == want:
        return
    message = ""
    if want - got:
        message += f"; missing key(s): {want - got}"
    if got - want:
        message += f"; extra key(s): {got - want}"
    raise ValueError(f"Node keys mismatch{message}.")


def _children_up_to(spec: TreeSpec, node: Any, registry: PytreeRegistry) -> list[Any]:
    node_def = registry.node_for(type(node))
    node_type = node_def.type if node_def is not None else type(node)
    kind = spec._type
    if kind not in BUILTIN_TYPES:
        if node_type != kind:
            raise ValueError(f"Type mismatch; expected {kind!r}, but got {node_type!r}.")
        children, ctx = node_def.flatten_fn(node)
        if len(children) != len(spec._children):
            raise ValueError(
                f"Node arity mismatch; expected {len(spec._children)}, but got {len(children)}."
            )
        if ctx != spec._context:
            raise ValueError(f"Node context mismatch for custom node type {kind!r}.")
        return children
    both_dicts = kind in STANDARD_DICT_TYPES and node_type in STANDARD_DICT_TYPES
    if not both_dicts and node_type != kind:
        raise ValueError(f"Node type mismatch; expected {kind!r}, but got {node_type!r}.")
    if len(node) != len(spec._children):
        raise ValueError(
            f"Node arity mismatch; expected {len(spec._children)}, but got {len(node)}."
        )
    if both_dicts:
        keys = spec._context[1] if kind is defaultdict else spec._context
        _check_dict_keys(keys, node)
        return [node[k] for k in keys]
    children, ctx = node_def.flatten_fn(node)
    if node_type is not deque and ctx != spec._context:
        raise ValueError(
            f"Node context mismatch for node type {kind!r}; "
            f"expected {spec._context!r}, but got {ctx!r}."
        )
    return children


def _flatten_up_to(spec: TreeSpec, tree: Any, out: list[Any], registry: PytreeRegistry) -> None:
    if spec.is_leaf():
        out.append(tree)
        return
    children = _children_up_to(spec, tree, registry)
    for child, child_spec in zip(children, spec._children, strict=True):
        _flatten_up_to(child_spec, child, out, registry)


# --------------------------------------------------------------------------- FX input flattening


def _by_index(node: Any, spec: TreeSpec) -> list[Any]:
    return [node[i] for i in range(len(spec._children))]


def _by_context_keys(node: Any, spec: TreeSpec) -> list[Any]:
    return [node[k] for k in spec._context]


# Spec-driven child extraction used by FX-generated code, keyed by ``TreeSpec.type``.
# ``exportir.fx._pytree`` publishes this very dict as its ``SUPPORTED_NODES`` and adds to it
# with ``register_pytree_flatten_spec``; the builtin rows are these four.
_FLATTEN_SPEC_RULES: dict[Any, Callable[[Any, TreeSpec], list[Any]]] = {
    dict: _by_context_keys,
    list: _by_index,
    tuple: _by_index,
    namedtuple: _by_index,
}

# torch's table of the same rules; functions users registered there are honoured, read only
# when torch has loaded that module (it always does on ``import torch``; never imported here).
_TORCH_FX_PYTREE = "torch.fx._pytree"


_is_structseq_class = is_structseq_class  # the name this module used before


def _flatten_spec_rule(spec_type: Any) -> Callable[[Any, TreeSpec], list[Any]] | None:
    """The rule reading the children of a node of ``spec_type``: ours, then torch's, else None."""
    rule = _FLATTEN_SPEC_RULES.get(spec_type)
    if rule is not None:
        return rule
    if _is_structseq_class(spec_type):
        return _by_index
    torch_fx_pytree = sys.modules.get(_TORCH_FX_PYTREE)
    if torch_fx_pytree is None:
        return None
    return torch_fx_pytree.SUPPORTED_NODES.get(spec_type)


def tree_flatten_spec(pytree: PyTree, spec: TreeSpec) -> list[Any]:
    """Leaves of ``pytree`` read in the layout of ``spec`` (for ``concrete_args`` code).

    Node types with a flatten-spec rule are read by the rule -- dicts by the spec's keys and
    sequences by index, so extra entries are ignored and a Proxy standing for the container
    is indexed, which is what lets a GraphModule with structured inputs be traced again.
    Other node types must flatten to exactly ``spec`` or a RuntimeError is raised.
    """
    spec = _as_spec(spec)
    if spec.is_leaf():
        return [pytree]
    rule = _flatten_spec_rule(spec._type)
    if rule is not None:
        out: list[Any] = []
        for child, child_spec in zip(rule(pytree, spec), spec._children):
            out += tree_flatten_spec(child, child_spec)
        return out
    leaves, real_spec = tree_flatten(pytree)
    if real_spec != spec:
        raise RuntimeError(
            f"Real spec {real_spec} of object {pytree} is different from expected spec {spec}."
        )
    return leaves


# --------------------------------------------------------------------------- torch interop


def from_torch_treespec(spec: Any) -> TreeSpec:
    """Convert a ``torch.utils._pytree.TreeSpec`` to ours (same type, context, children)."""
    if spec.is_leaf():
        return _LEAF
    return TreeSpec(spec.type, spec.context, [from_torch_treespec(c) for c in spec.children()])


def to_torch_treespec(spec: TreeSpec) -> Any:
    """Convert our TreeSpec to a ``torch.utils._pytree.TreeSpec``."""
    import torch.utils._pytree as torch_pytree

    if spec.is_leaf():
        return torch_pytree.treespec_leaf()
    kids = [to_torch_treespec(c) for c in spec._children]
    return torch_pytree.TreeSpec(spec._type, spec._context, kids)
