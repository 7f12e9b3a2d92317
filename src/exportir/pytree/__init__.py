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
  ``torch.utils._pytree`` is already loaded. Likewise ``tree_flatten_spec`` reads flatten-spec
  functions registered with ``torch.fx._pytree`` when that module is loaded.
- ``treespec_loads`` never imports modules and never binds arbitrary callables: enum classes
  named in a serialized spec are read out of the namespaces of modules already in
  ``sys.modules`` (no ``getattr``, so no lazy imports), namedtuple classes must be registered,
  and defaultdict factories are limited to :data:`SAFE_DEFAULTDICT_FACTORIES`.

Layout: ``_keys`` (key entries), ``_registry`` (node types and registration), ``_spec``
(TreeSpec, flatten/unflatten), ``_map`` (tree_map family, key paths), ``_serialize``
(treespec_dumps/loads). This package re-exports all of it; import from ``exportir.pytree``.
"""

from __future__ import annotations

# The public dataclasses report this package as their module (see _adopt_public_names), so the
# names their string annotations use must resolve here too.
from collections.abc import Callable  # noqa: F401
from typing import Any  # noqa: F401

# Everything below, private helpers included, stays importable as exportir.pytree.<name>.
from exportir.pytree._keys import (
    GetAttrKey,
    KeyEntry,
    KeyPath,
    MappingKey,
    SequenceKey,
    key_get,
    keystr,
)
from exportir.pytree._map import (  # noqa: F401
    _key_paths,
    _predicate,
    map_only,
    tree_all,
    tree_all_only,
    tree_any,
    tree_any_only,
    tree_flatten_with_path,
    tree_leaves_with_path,
    tree_map,
    tree_map_,
    tree_map_only,
    tree_map_only_,
    tree_map_with_path,
)
from exportir.pytree._registry import (  # noqa: F401
    _BUILTIN_NODES,
    _TORCH_PYTREE,
    BUILTIN_TYPES,
    DEFAULT_REGISTRY,
    DEFAULT_TREESPEC_SERIALIZATION_PROTOCOL,
    NO_SERIALIZED_TYPE_NAME_FOUND,
    SAFE_DEFAULTDICT_FACTORIES,
    STANDARD_DICT_TYPES,
    SUPPORTED_NODES,
    Context,
    DumpableContext,
    FlattenFn,
    FlattenWithKeysFn,
    FromDumpableContextFn,
    IsLeafFn,
    NodeDef,
    PyTree,
    PytreeRegistry,
    SerializeNodeDef,
    ToDumpableContextFn,
    TreeSpecSerializationError,
    UnflattenFn,
    _dataclass_field_names,
    _defaultdict_from_dumpable,
    _defaultdict_to_dumpable,
    _defaultdict_with_keys,
    _deregister_pytree_node,
    _dict_with_keys,
    _flatten_defaultdict,
    _flatten_deque,
    _flatten_dict,
    _flatten_list,
    _flatten_namedtuple,
    _flatten_tuple,
    _map_keys,
    _namedtuple_from_dumpable,
    _namedtuple_to_dumpable,
    _namedtuple_with_keys,
    _registry_with_builtins,
    _seq_keys,
    _with_seq_keys,
    is_namedtuple,
    is_namedtuple_class,
    is_namedtuple_instance,
    is_registered,
    is_structseq,
    is_structseq_class,
    is_structseq_instance,
    register_dataclass,
    register_namedtuple,
    register_pytree_node,
)
from exportir.pytree._serialize import (  # noqa: F401
    _enum_hook,
    _EnumEncoder,
    _json_to_spec,
    _resolve_loaded,
    _resolve_loaded_class,
    _spec_to_json,
    _Star,
    treespec_dumps,
    treespec_loads,
    treespec_pprint,
)
from exportir.pytree._spec import (  # noqa: F401
    _FLATTEN_SPEC_RULES,
    _LEAF,
    LeafSpec,
    TreeSpec,
    _as_spec,
    _build,
    _by_context_keys,
    _by_index,
    _check_dict_keys,
    _children_up_to,
    _collect_leaves,
    _flatten_into,
    _flatten_up_to,
    _hashable_context,
    _is_structseq_class,
    arg_tree_leaves,
    from_torch_treespec,
    to_torch_treespec,
    tree_flatten,
    tree_flatten_spec,
    tree_is_leaf,
    tree_iter,
    tree_leaves,
    tree_structure,
    tree_unflatten,
    treespec_dict,
    treespec_leaf,
    treespec_tuple,
)

PyTreeSpec = TreeSpec  # torch.utils._pytree's alias

__all__ = [
    "DEFAULT_REGISTRY",
    "DumpableContext",
    "FromDumpableContextFn",
    "GetAttrKey",
    "KeyEntry",
    "KeyPath",
    "LeafSpec",
    "MappingKey",
    "NodeDef",
    "PyTreeSpec",
    "PytreeRegistry",
    "SequenceKey",
    "SerializeNodeDef",
    "ToDumpableContextFn",
    "TreeSpec",
    "TreeSpecSerializationError",
    "arg_tree_leaves",
    "from_torch_treespec",
    "is_namedtuple",
    "is_namedtuple_class",
    "is_namedtuple_instance",
    "is_registered",
    "is_structseq",
    "is_structseq_class",
    "is_structseq_instance",
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


def _adopt_public_names() -> None:
    """Report ``exportir.pytree`` as the ``__module__`` of the public classes and functions.

    That is their documented home and what pickles, qualified names in generated code and
    serialized programs recorded before this module became a package; private helpers keep
    their submodule.
    """
    namespace = globals()
    for name in __all__:
        value = namespace[name]
        defined_here = getattr(value, "__module__", "").startswith(__name__ + ".")
        if defined_here and (isinstance(value, type) or callable(value)):
            value.__module__ = __name__


_adopt_public_names()
