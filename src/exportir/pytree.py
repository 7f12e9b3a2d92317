"""Pytrees: flatten nested containers into leaves plus a :class:`TreeSpec`, and rebuild them.

Behaviour follows ``torch.utils._pytree`` of torch 2.13 (same node types, same contexts, same
``TreeSpec`` repr, same JSON for ``treespec_dumps``, same error messages), so that code written
against torch's pytree keeps working with ``exportir``.

Contracts
- A *node* is an object whose exact type is registered (or any namedtuple instance); everything
  else, ``None`` included, is a *leaf*.
- Node types live in an explicit :class:`PytreeRegistry`; the module-level functions use
  :data:`DEFAULT_REGISTRY`, which holds only the builtin containers at import time.
- Types registered only with torch (``torch.utils._pytree.register_pytree_node``,
  ``torch.export.register_dataclass``, torch's own structseqs) are honoured: when a type is not
  in our table, torch's table is consulted. torch is never imported for that: we look only if
  ``torch.utils._pytree`` is already loaded.
- ``treespec_loads`` never imports modules: classes named in a serialized spec (defaultdict
  factories, enums) must already be importable from ``sys.modules``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import sys
import types
from collections import OrderedDict, defaultdict, deque, namedtuple
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

__all__ = [
    "DEFAULT_REGISTRY",
    "GetAttrKey",
    "KeyEntry",
    "KeyPath",
    "LeafSpec",
    "MappingKey",
    "NodeDef",
    "PytreeRegistry",
    "SequenceKey",
    "SerializeNodeDef",
    "TreeSpec",
    "TreeSpecSerializationError",
    "arg_tree_leaves",
    "from_torch_treespec",
    "is_namedtuple",
    "is_namedtuple_class",
    "is_namedtuple_instance",
    "is_registered",
    "key_get",
    "keystr",
    "map_only",
    "register_dataclass",
    "register_namedtuple",
    "register_pytree_node",
    "to_torch_treespec",
    "tree_all",
    "tree_all_only",
    "tree_any",
    "tree_any_only",
    "tree_flatten",
    "tree_flatten_spec",
    "tree_flatten_with_path",
    "tree_is_leaf",
    "tree_iter",
    "tree_leaves",
    "tree_leaves_with_path",
    "tree_map",
    "tree_map_",
    "tree_map_only",
    "tree_map_only_",
    "tree_map_with_path",
    "tree_structure",
    "tree_unflatten",
    "treespec_dict",
    "treespec_dumps",
    "treespec_leaf",
    "treespec_loads",
    "treespec_pprint",
    "treespec_tuple",
]

Context = Any
PyTree = Any
FlattenFn = Callable[[Any], "tuple[list[Any], Context]"]
UnflattenFn = Callable[[Iterable[Any], Context], Any]
FlattenWithKeysFn = Callable[[Any], "tuple[list[tuple[Any, Any]], Context]"]
IsLeafFn = Callable[[Any], bool] | None

NO_SERIALIZED_TYPE_NAME_FOUND = "NO_SERIALIZED_TYPE_NAME_FOUND"
DEFAULT_TREESPEC_SERIALIZATION_PROTOCOL = 1
_TORCH_PYTREE = "torch.utils._pytree"


# --------------------------------------------------------------------------- key entries


@dataclasses.dataclass(frozen=True, slots=True)
class SequenceKey:
    """Position ``idx`` in a sequence; prints as ``[idx]``."""

    idx: int

    def __str__(self) -> str:
        return f"[{self.idx!r}]"

    def get(self, sequence: Any) -> Any:
        return sequence[self.idx]


@dataclasses.dataclass(frozen=True, slots=True)
class MappingKey:
    """Key ``key`` of a mapping; prints as ``[repr(key)]``."""

    key: Any

    def __str__(self) -> str:
        return f"[{self.key!r}]"

    def get(self, mapping: Any) -> Any:
        return mapping[self.key]


@dataclasses.dataclass(frozen=True, slots=True)
class GetAttrKey:
    """Attribute ``name`` of an object; prints as ``.name``."""

    name: str

    def __str__(self) -> str:
        return f".{self.name}"

    def get(self, obj: Any) -> Any:
        return getattr(obj, self.name)


KeyEntry = Any  # SequenceKey | MappingKey | GetAttrKey | any object with __str__ and get()
KeyPath = tuple[Any, ...]


def keystr(kp: KeyPath) -> str:
    """Render a key path, e.g. ``[0]['a'].x``."""
    return "".join(str(k) for k in kp)


def key_get(obj: Any, kp: KeyPath) -> Any:
    """Follow key path ``kp`` from ``obj`` and return the value reached."""
    for key in kp:
        obj = key.get(obj)
    return obj


# --------------------------------------------------------------------------- namedtuples


def is_namedtuple_class(cls: Any) -> bool:
    """True for tuple subclasses shaped like ``collections.namedtuple`` / ``typing.NamedTuple``."""
    if not (isinstance(cls, type) and issubclass(cls, tuple)):
        return False
    fields = getattr(cls, "_fields", None)
    return (
        isinstance(fields, tuple)
        and all(type(f) is str for f in fields)
        and callable(getattr(cls, "_make", None))
        and callable(getattr(cls, "_asdict", None))
    )


def is_namedtuple(obj: Any) -> bool:
    """True if ``obj`` is a namedtuple class or instance."""
    return is_namedtuple_class(obj if isinstance(obj, type) else type(obj))


def is_namedtuple_instance(obj: Any) -> bool:
    """True if ``obj`` is an instance of a namedtuple class."""
    return is_namedtuple_class(type(obj))


# --------------------------------------------------------------------------- registry


@dataclasses.dataclass(frozen=True, slots=True)
class NodeDef:
    """How to take a node apart and put it back. ``type`` is what a TreeSpec records."""

    type: Any
    flatten_fn: FlattenFn
    unflatten_fn: UnflattenFn
    flatten_with_keys_fn: FlattenWithKeysFn | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class SerializeNodeDef:
    """How a node type appears in ``treespec_dumps`` JSON."""

    type: Any
    serialized_type_name: str
    to_dumpable_context: Callable[[Context], Any] | None = None
    from_dumpable_context: Callable[[Any], Context] | None = None


class PytreeRegistry:
    """Explicit table of node types, with read-through to torch's registry.

    Lookups are by exact type. Namedtuple classes always resolve to the ``namedtuple`` node
    (as in torch); registering a namedtuple class only records its serialized name.
    """

    __slots__ = ("_by_name", "_nodes", "_serialized", "_torch", "_torch_nodes")

    def __init__(self) -> None:
        self._nodes: dict[Any, NodeDef] = {}
        self._serialized: dict[Any, SerializeNodeDef] = {}
        self._by_name: dict[str, Any] = {}
        self._torch: Any = None  # torch.utils._pytree module once it is loaded
        self._torch_nodes: dict[Any, Any] | None = None  # its SUPPORTED_NODES (same object)

    # -- registration ---------------------------------------------------------------------

    def register(
        self,
        cls: Any,
        flatten_fn: FlattenFn,
        unflatten_fn: UnflattenFn,
        *,
        serialized_type_name: str | None = None,
        to_dumpable_context: Callable[[Context], Any] | None = None,
        from_dumpable_context: Callable[[Any], Context] | None = None,
        flatten_with_keys_fn: FlattenWithKeysFn | None = None,
    ) -> None:
        """Add ``cls`` as a node type. Raises ValueError if it is already ours."""
        if cls in self._nodes or cls in self._serialized:
            raise ValueError(f"{cls} is already registered as pytree node.")
        if (to_dumpable_context is None) != (from_dumpable_context is None):
            raise ValueError(
                f"Both to_dumpable_context and from_dumpable_context for {cls} must "
                "be None or registered."
            )
        if not is_namedtuple_class(cls):
            self._nodes[cls] = NodeDef(cls, flatten_fn, unflatten_fn, flatten_with_keys_fn)
        name = serialized_type_name or NO_SERIALIZED_TYPE_NAME_FOUND
        self._serialized[cls] = SerializeNodeDef(
            cls, name, to_dumpable_context, from_dumpable_context
        )
        if name != NO_SERIALIZED_TYPE_NAME_FOUND:
            self._by_name[name] = cls

    def unregister(self, cls: Any) -> None:
        """Remove ``cls`` (ours only). Raises KeyError if it is not registered here."""
        ser = self._serialized.pop(cls)
        self._nodes.pop(cls, None)
        self._by_name.pop(ser.serialized_type_name, None)

    # -- lookups --------------------------------------------------------------------------

    def _torch_table(self, attr: str) -> dict[Any, Any]:
        mod = self._torch
        if mod is None:
            mod = sys.modules.get(_TORCH_PYTREE)
            if mod is None:
                return {}
            self._torch = mod
            self._torch_nodes = mod.SUPPORTED_NODES
        return getattr(mod, attr)

    def node_for(self, cls: Any) -> Any:
        """The NodeDef used to flatten an instance of ``cls``, or None if it is a leaf type."""
        node = self._nodes.get(cls)
        if node is not None:
            return node
        if issubclass(cls, tuple) and is_namedtuple_class(cls):
            return self._nodes.get(namedtuple)
        torch_nodes = self._torch_nodes
        if torch_nodes is None:
            torch_nodes = self._torch_table("SUPPORTED_NODES")
        return torch_nodes.get(cls)

    def node_for_spec_type(self, spec_type: Any) -> Any:
        """The NodeDef recorded under ``TreeSpec.type`` (used when unflattening)."""
        node = self._nodes.get(spec_type)
        if node is None:
            node = self._torch_table("SUPPORTED_NODES").get(spec_type)
        if node is None:
            raise ValueError(f"{spec_type} is not registered as a pytree node type.")
        return node

    def is_registered(self, cls: Any) -> bool:
        """True if instances of ``cls`` are pytree nodes (ours, torch's, or namedtuples)."""
        return self._nodes.get(cls) is not None or (
            isinstance(cls, type) and self.node_for(cls) is not None
        )

    def serialization_for(self, cls: Any) -> Any:
        """SerializeNodeDef for ``cls`` (ours first, then torch's), or None."""
        ser = self._serialized.get(cls)
        if ser is None:
            ser = self._torch_table("SUPPORTED_SERIALIZED_TYPES").get(cls)
        return ser

    def type_for_name(self, name: str) -> Any:
        """Python type registered under serialized name ``name``, or None."""
        cls = self._by_name.get(name)
        if cls is None and name != NO_SERIALIZED_TYPE_NAME_FOUND:
            cls = self._torch_table("SERIALIZED_TYPE_TO_PYTHON_TYPE").get(name)
        return cls


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


# --------------------------------------------------------------------------- builtin nodes


def _seq_keys(values: Iterable[Any]) -> list[tuple[Any, Any]]:
    return [(SequenceKey(i), v) for i, v in enumerate(values)]


def _map_keys(keys: list[Any], values: list[Any]) -> list[tuple[Any, Any]]:
    return [(MappingKey(k), v) for k, v in zip(keys, values, strict=True)]


def _flatten_tuple(t: tuple) -> tuple[list[Any], None]:
    return list(t), None


def _flatten_list(lst: list) -> tuple[list[Any], None]:
    return lst, None


def _flatten_dict(d: dict) -> tuple[list[Any], list[Any]]:
    return list(d.values()), list(d)


def _flatten_namedtuple(t: tuple) -> tuple[list[Any], type]:
    return list(t), type(t)


def _flatten_defaultdict(d: defaultdict) -> tuple[list[Any], list[Any]]:
    return list(d.values()), [d.default_factory, list(d)]


def _flatten_deque(d: deque) -> tuple[list[Any], int | None]:
    return list(d), d.maxlen


def _with_seq_keys(flatten: FlattenFn) -> FlattenWithKeysFn:
    def flatten_with_keys(node: Any) -> tuple[list[tuple[Any, Any]], Context]:
        values, ctx = flatten(node)
        return _seq_keys(values), ctx

    return flatten_with_keys


def _dict_with_keys(d: dict) -> tuple[list[tuple[Any, Any]], list[Any]]:
    values, keys = _flatten_dict(d)
    return _map_keys(keys, values), keys


def _defaultdict_with_keys(d: defaultdict) -> tuple[list[tuple[Any, Any]], list[Any]]:
    values, ctx = _flatten_defaultdict(d)
    return _map_keys(ctx[1], values), ctx


def _namedtuple_with_keys(t: tuple) -> tuple[list[tuple[Any, Any]], type]:
    values, cls = _flatten_namedtuple(t)
    keys = [GetAttrKey(f) for f in cls._fields]
    return list(zip(keys, values, strict=True)), cls


def _namedtuple_to_dumpable(cls: type) -> str:
    ser = DEFAULT_REGISTRY.serialization_for(cls)
    if ser is None or ser.serialized_type_name == NO_SERIALIZED_TYPE_NAME_FOUND:
        raise TreeSpecSerializationError(
            f"Can't serialize TreeSpec of namedtuple class {cls} because we didn't register "
            "a serializated_type_name. Please register using `register_namedtuple`."
        )
    return ser.serialized_type_name


def _namedtuple_from_dumpable(name: str) -> type:
    cls = DEFAULT_REGISTRY.type_for_name(name)
    if cls is None:
        raise TreeSpecSerializationError(
            f"Can't deserialize TreeSpec of namedtuple class {name} because we couldn't "
            "find a serializated name."
        )
    return cls


def _defaultdict_to_dumpable(ctx: list[Any]) -> dict[str, Any]:
    factory, keys = ctx
    return {
        "default_factory_module": factory.__module__,
        "default_factory_name": factory.__qualname__,
        "dict_context": keys,
    }


def _defaultdict_from_dumpable(obj: Any) -> list[Any]:
    expected = {"default_factory_module", "default_factory_name", "dict_context"}
    if not isinstance(obj, dict) or set(obj) != expected:
        raise TreeSpecSerializationError(f"defaultdict context must have keys {expected}")
    factory = _resolve_loaded(obj["default_factory_module"], obj["default_factory_name"])
    return [factory, obj["dict_context"]]


def _resolve_loaded(module: Any, qualname: Any) -> Any:
    """Look ``module:qualname`` up among already-imported modules (never imports)."""
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise TreeSpecSerializationError("module and name must be strings")
    target = sys.modules.get(module)
    if target is None:
        raise TreeSpecSerializationError(
            f"module {module!r} is not imported; import it before loading this spec"
        )
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


# (type, flatten, unflatten, flatten_with_keys, serialized name, to/from dumpable)
_BUILTIN_NODES: tuple[tuple[Any, ...], ...] = (
    (tuple, _flatten_tuple, lambda v, c: tuple(v), _with_seq_keys(_flatten_tuple),
     "builtins.tuple", None, None),
    (list, _flatten_list, lambda v, c: list(v), _with_seq_keys(_flatten_list),
     "builtins.list", None, None),
    (dict, _flatten_dict, lambda v, c: dict(zip(c, v, strict=True)), _dict_with_keys,
     "builtins.dict", None, None),
    (namedtuple, _flatten_namedtuple, lambda v, c: c(*v), _namedtuple_with_keys,
     "collections.namedtuple", _namedtuple_to_dumpable, _namedtuple_from_dumpable),
    (OrderedDict, _flatten_dict, lambda v, c: OrderedDict(zip(c, v, strict=True)),
     _dict_with_keys, "collections.OrderedDict", None, None),
    (defaultdict, _flatten_defaultdict,
     lambda v, c: defaultdict(c[0], zip(c[1], v, strict=True)), _defaultdict_with_keys,
     "collections.defaultdict", _defaultdict_to_dumpable, _defaultdict_from_dumpable),
    (deque, _flatten_deque, lambda v, c: deque(v, maxlen=c), _with_seq_keys(_flatten_deque),
     "collections.deque", None, None),
)

BUILTIN_TYPES: frozenset[Any] = frozenset(row[0] for row in _BUILTIN_NODES)
STANDARD_DICT_TYPES: frozenset[Any] = frozenset({dict, OrderedDict, defaultdict})


def _registry_with_builtins() -> PytreeRegistry:
    registry = PytreeRegistry()
    for cls, flat, unflat, with_keys, name, to_d, from_d in _BUILTIN_NODES:
        registry.register(
            cls, flat, unflat, serialized_type_name=name, to_dumpable_context=to_d,
            from_dumpable_context=from_d, flatten_with_keys_fn=with_keys,
        )
    return registry


DEFAULT_REGISTRY: PytreeRegistry = _registry_with_builtins()
# Read-only view of our own node table (torch's registrations are consulted separately).
SUPPORTED_NODES: Mapping[Any, NodeDef] = MappingProxyType(DEFAULT_REGISTRY._nodes)


# --------------------------------------------------------------------------- registration API


def register_pytree_node(
    cls: type,
    flatten_fn: FlattenFn,
    unflatten_fn: UnflattenFn,
    *,
    serialized_type_name: str | None = None,
    to_dumpable_context: Callable[[Context], Any] | None = None,
    from_dumpable_context: Callable[[Any], Context] | None = None,
    flatten_with_keys_fn: FlattenWithKeysFn | None = None,
) -> None:
    """Register ``cls`` as a container node (signature of torch's ``register_pytree_node``)."""
    DEFAULT_REGISTRY.register(
        cls, flatten_fn, unflatten_fn, serialized_type_name=serialized_type_name,
        to_dumpable_context=to_dumpable_context, from_dumpable_context=from_dumpable_context,
        flatten_with_keys_fn=flatten_with_keys_fn,
    )


def register_namedtuple(cls: type, *, serialized_type_name: str) -> None:
    """Give namedtuple class ``cls`` a serialized name so specs holding it can be dumped."""
    DEFAULT_REGISTRY.register(
        cls, _flatten_namedtuple, lambda v, c: c(*v), serialized_type_name=serialized_type_name,
        to_dumpable_context=_namedtuple_to_dumpable, from_dumpable_context=_namedtuple_from_dumpable,
        flatten_with_keys_fn=_namedtuple_with_keys,
    )


def _dataclass_field_names(
    cls: type, field_names: list[str] | None, drop: list[str]
) -> list[str]:
    if not dataclasses.is_dataclass(cls):
        if field_names is None:
            raise ValueError(
                "field_names must be specified with a list of all fields used to "
                f"initialize {cls}, as it is not a dataclass."
            )
        return list(field_names)
    init_fields = [f.name for f in dataclasses.fields(cls) if f.init]
    if field_names is None:
        return init_fields
    expected = set(init_fields) - set(drop)
    missing, unexpected = expected - set(field_names), set(field_names) - expected
    if not (missing or unexpected):
        return list(field_names)
    msg = "field_names does not include all dataclass fields.\n"
    if missing:
        msg += (
            f"Missing fields in `field_names`: {missing}. If you want to include these "
            "fields in the pytree, please add them to `field_names`, otherwise please add "
            "them to `drop_field_names`.\n"
        )
    if unexpected:
        msg += (
            f"Unexpected fields in `field_names`: {unexpected}. Please remove these "
            "fields, or add them to `drop_field_names`.\n"
        )
    raise ValueError(msg)


def register_dataclass(
    cls: type,
    *,
    field_names: list[str] | None = None,
    drop_field_names: list[str] | None = None,
    serialized_type_name: str | None = None,
) -> None:
    """Register a dataclass-like type: children are the non-None fields in ``field_names``.

    The context is ``[present_field_names, none_field_names]`` (as in torch), so a field that
    is ``None`` is structure, not a leaf.
    """
    names = _dataclass_field_names(cls, field_names, drop_field_names or [])

    def flatten(obj: Any) -> tuple[list[Any], list[list[str]]]:
        values, present, absent = [], [], []
        for name in names:
            value = getattr(obj, name)
            if value is None:
                absent.append(name)
            else:
                values.append(value)
                present.append(name)
        return values, [present, absent]

    def unflatten(values: Iterable[Any], ctx: list[list[str]]) -> Any:
        present, absent = ctx
        kwargs = dict(zip(present, values, strict=True))
        kwargs.update(dict.fromkeys(absent))
        return cls(**kwargs)

    def flatten_with_keys(obj: Any) -> tuple[list[tuple[Any, Any]], list[str]]:
        values, (present, _) = flatten(obj)
        return [(GetAttrKey(n), v) for n, v in zip(present, values, strict=True)], present

    register_pytree_node(
        cls, flatten, unflatten, serialized_type_name=serialized_type_name,
        flatten_with_keys_fn=flatten_with_keys,
    )


def is_registered(cls: type) -> bool:
    """True if instances of ``cls`` are pytree nodes (ours, torch's, or a namedtuple)."""
    return DEFAULT_REGISTRY.is_registered(cls)


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


# --------------------------------------------------------------------------- FX input flattening


def _by_index(node: Any, spec: TreeSpec) -> list[Any]:
    return [node[i] for i in range(len(spec._children))]


def _by_context_keys(node: Any, spec: TreeSpec) -> list[Any]:
    return [node[k] for k in spec._context]


# Spec-driven child extraction used by FX-generated code (torch.fx._pytree equivalent).
_FLATTEN_SPEC_RULES: dict[Any, Callable[[Any, TreeSpec], list[Any]]] = {
    dict: _by_context_keys,
    list: _by_index,
    tuple: _by_index,
    namedtuple: _by_index,
}


def _is_structseq_class(cls: Any) -> bool:
    return (
        isinstance(cls, type)
        and cls.__bases__ == (tuple,)
        and isinstance(getattr(cls, "n_sequence_fields", None), int)
    )


def tree_flatten_spec(pytree: PyTree, spec: TreeSpec) -> list[Any]:
    """Leaves of ``pytree`` read in the layout of ``spec`` (for ``concrete_args`` code).

    dicts are read by the spec's keys and sequences by index, so extra entries are ignored;
    other node types must flatten to exactly ``spec`` or a RuntimeError is raised.
    """
    spec = _as_spec(spec)
    if spec.is_leaf():
        return [pytree]
    rule = _FLATTEN_SPEC_RULES.get(spec._type)
    if rule is None and _is_structseq_class(spec._type):
        rule = _by_index
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


# --------------------------------------------------------------------------- serialization


class TreeSpecSerializationError(ValueError, NotImplementedError):
    """A spec cannot be dumped or loaded (unregistered type, bad JSON, unknown protocol).

    Subclasses both ValueError and NotImplementedError (what torch raises in these cases).
    """


class _EnumEncoder(json.JSONEncoder):
    def default(self, o: Any) -> Any:
        if isinstance(o, enum.Enum):
            cls = type(o)
            return {"__enum__": True, "fqn": f"{cls.__module__}:{cls.__qualname__}",
                    "name": o.name}
        return super().default(o)


def _enum_hook(obj: dict[str, Any]) -> Any:
    if "__enum__" not in obj:
        return obj
    module, _, qualname = str(obj["fqn"]).partition(":")
    return _resolve_loaded(module, qualname)[obj["name"]]


def _spec_to_json(spec: TreeSpec, registry: PytreeRegistry) -> dict[str, Any]:
    if spec.is_leaf():
        return {"type": None, "context": None, "children_spec": []}
    ser = registry.serialization_for(spec._type)
    if ser is None:
        raise TreeSpecSerializationError(
            f"Serializing {spec._type} in pytree is not registered."
        )
    if ser.serialized_type_name == NO_SERIALIZED_TYPE_NAME_FOUND:
        raise TreeSpecSerializationError(
            f"No registered serialization name for {spec._type} found. Please update your "
            "register_pytree_node call with a `serialized_type_name` kwarg."
        )
    if ser.to_dumpable_context is not None:
        ctx = ser.to_dumpable_context(spec._context)
    else:
        try:
            ctx = json.dumps(spec._context, cls=_EnumEncoder)
        except TypeError as e:
            raise TypeError(
                "Unable to serialize context. Please make the context json dump-able, or "
                "register a custom serializer using register_pytree_node."
            ) from e
    children = [_spec_to_json(c, registry) for c in spec._children]
    return {"type": ser.serialized_type_name, "context": ctx, "children_spec": children}


def _json_to_spec(obj: Any, registry: PytreeRegistry) -> TreeSpec:
    if not isinstance(obj, dict) or set(obj) != {"type", "context", "children_spec"}:
        raise TreeSpecSerializationError(f"malformed TreeSpec JSON node: {obj!r:.200}")
    name, ctx, children = obj["type"], obj["context"], obj["children_spec"]
    if not isinstance(children, list):
        raise TreeSpecSerializationError("children_spec must be a list")
    if name is None and ctx is None and not children:
        return _LEAF
    cls = registry.type_for_name(name) if isinstance(name, str) else None
    if cls is None:
        raise TreeSpecSerializationError(f"Deserializing {name} in pytree is not registered.")
    ser = registry.serialization_for(cls)
    if ser.from_dumpable_context is not None:
        context = ser.from_dumpable_context(ctx)
    else:
        try:
            context = json.loads(ctx, object_hook=_enum_hook)
        except (TypeError, json.JSONDecodeError) as e:
            raise TreeSpecSerializationError(f"Unable to deserialize context {ctx!r}") from e
    spec_type = namedtuple if is_namedtuple_class(cls) else cls
    return TreeSpec(spec_type, context, [_json_to_spec(c, registry) for c in children])


def treespec_dumps(treespec: TreeSpec, protocol: int | None = None) -> str:
    """Serialize ``treespec`` to JSON ``[protocol, node]`` (same text as torch's)."""
    protocol = DEFAULT_TREESPEC_SERIALIZATION_PROTOCOL if protocol is None else protocol
    if protocol != 1:
        raise TreeSpecSerializationError(f"Unknown protocol {protocol}. Available protocols: [1]")
    body = _spec_to_json(_as_spec(treespec), DEFAULT_REGISTRY)
    return json.dumps([protocol, body], cls=_EnumEncoder)


def treespec_loads(serialized: str) -> TreeSpec:
    """Inverse of :func:`treespec_dumps`. Never imports modules or unpickles."""
    try:
        decoded = json.loads(serialized)
    except json.JSONDecodeError as e:
        raise TreeSpecSerializationError(f"TreeSpec is not valid JSON: {e}") from e
    if not (isinstance(decoded, list) and len(decoded) == 2):
        raise TreeSpecSerializationError("serialized TreeSpec must be [protocol, spec]")
    protocol, body = decoded
    if protocol != 1:
        raise TreeSpecSerializationError(f"Unknown protocol {protocol}. Available protocols: [1]")
    return _json_to_spec(body, DEFAULT_REGISTRY)


class _Star(str):
    __slots__ = ()

    def __repr__(self) -> str:
        return "*"


def treespec_pprint(treespec: TreeSpec) -> str:
    """The pytree rebuilt with ``*`` at every leaf, as a repr string."""
    return repr(treespec.unflatten([_Star("*")] * treespec.num_leaves))


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
