"""Node types: the :class:`PytreeRegistry`, the builtin containers and the registration API.

Contract: a *node* is an object whose exact type is registered (or any namedtuple instance);
everything else is a leaf. :data:`DEFAULT_REGISTRY` holds only the builtin containers at import
time; ``register_pytree_node`` / ``register_namedtuple`` / ``register_dataclass`` add to it.
Types registered only with torch are found by read-through to torch's table, and only if
``torch.utils._pytree`` is already loaded.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import OrderedDict, defaultdict, deque, namedtuple
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from exportir.pytree._keys import GetAttrKey, MappingKey, SequenceKey

Context = Any
PyTree = Any
FlattenFn = Callable[[Any], "tuple[list[Any], Context]"]
UnflattenFn = Callable[[Iterable[Any], Context], Any]
FlattenWithKeysFn = Callable[[Any], "tuple[list[tuple[Any, Any]], Context]"]
IsLeafFn = Callable[[Any], bool] | None
DumpableContext = Any  # what a context becomes for JSON: any json-dumpable value
ToDumpableContextFn = Callable[[Context], DumpableContext]
FromDumpableContextFn = Callable[[DumpableContext], Context]

NO_SERIALIZED_TYPE_NAME_FOUND = "NO_SERIALIZED_TYPE_NAME_FOUND"
DEFAULT_TREESPEC_SERIALIZATION_PROTOCOL = 1
_TORCH_PYTREE = "torch.utils._pytree"


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


# --------------------------------------------------------------------------- structseqs

# Set on types that may be subclassed (CPython's Py_TPFLAGS_BASETYPE); structseqs may not.
_Py_TPFLAGS_BASETYPE = 1 << 10


def is_structseq_class(cls: Any) -> bool:
    """True for CPython struct sequences (``torch.return_types.max``, ``os.stat_result``):
    direct tuple subclasses with the ``n_*fields`` counts that cannot be subclassed."""
    return (
        isinstance(cls, type)
        and cls.__bases__ == (tuple,)
        and all(isinstance(getattr(cls, f, None), int)
                for f in ("n_fields", "n_sequence_fields", "n_unnamed_fields"))
        and not cls.__flags__ & _Py_TPFLAGS_BASETYPE
    )


def is_structseq(obj: Any) -> bool:
    """True if ``obj`` is a struct sequence class or instance."""
    return is_structseq_class(obj if isinstance(obj, type) else type(obj))


def is_structseq_instance(obj: Any) -> bool:
    """True if ``obj`` is an instance of a struct sequence class."""
    return is_structseq_class(type(obj))


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


# --------------------------------------------------------------------------- serialization errors
# Defined here rather than in _serialize: the builtin nodes' dumpable-context hooks raise it.


class TreeSpecSerializationError(ValueError, NotImplementedError):
    """A spec cannot be dumped or loaded (unregistered type, bad JSON, unknown protocol).

    Subclasses both ValueError and NotImplementedError (what torch raises in these cases).
    """


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


def _namedtuple_from_dumpable(name: Any) -> type:
    cls = DEFAULT_REGISTRY.type_for_name(name) if isinstance(name, str) else None
    if cls is None:
        raise TreeSpecSerializationError(
            f"Can't deserialize TreeSpec of namedtuple class {name} because we couldn't "
            "find a serializated name."
        )
    if not is_namedtuple_class(cls):
        raise TreeSpecSerializationError(
            f"namedtuple context {name!r} names {cls!r}, which is not a namedtuple class"
        )
    return cls


# What a loaded spec may name as a defaultdict ``default_factory``, keyed by the
# (default_factory_module, default_factory_name) pair ``treespec_dumps`` writes. Anything else
# could be arbitrary code (``os.system``) run on the first missing key, so loading refuses it.
# ``None`` has no ``__qualname__``; it is written as ``builtins.None`` (torch cannot dump it).
SAFE_DEFAULTDICT_FACTORIES: Mapping[tuple[str, str], Any] = MappingProxyType({
    **{("builtins", t.__qualname__): t for t in (list, dict, set, int, float, str, tuple)},
    ("builtins", "None"): None,
})


def _defaultdict_to_dumpable(ctx: list[Any]) -> dict[str, Any]:
    factory, keys = ctx
    module, name = ("builtins", "None") if factory is None else (
        factory.__module__, factory.__qualname__)
    return {"default_factory_module": module, "default_factory_name": name, "dict_context": keys}


def _defaultdict_from_dumpable(obj: Any) -> list[Any]:
    expected = {"default_factory_module", "default_factory_name", "dict_context"}
    if not isinstance(obj, dict) or set(obj) != expected:
        raise TreeSpecSerializationError(f"defaultdict context must have keys {expected}")
    ref = (obj["default_factory_module"], obj["default_factory_name"])
    named = all(isinstance(part, str) for part in ref)
    if not named or ref not in SAFE_DEFAULTDICT_FACTORIES:
        allowed = ", ".join(f"{m}.{n}" for m, n in SAFE_DEFAULTDICT_FACTORIES)
        shown = ".".join(ref) if named else repr(ref)
        raise TreeSpecSerializationError(
            f"defaultdict default_factory {shown:.120} is not allowed: loading a spec never "
            f"binds arbitrary callables; allowed factories: {allowed}"
        )
    if not isinstance(obj["dict_context"], list):
        raise TreeSpecSerializationError("defaultdict dict_context must be a list of keys")
    return [SAFE_DEFAULTDICT_FACTORIES[ref], obj["dict_context"]]


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


def _deregister_pytree_node(cls: type) -> None:
    """Undo a registration with ours (KeyError if ``cls`` is not registered with ours)."""
    DEFAULT_REGISTRY.unregister(cls)


def is_registered(cls: type) -> bool:
    """True if instances of ``cls`` are pytree nodes (ours, torch's, or a namedtuple)."""
    return DEFAULT_REGISTRY.is_registered(cls)
