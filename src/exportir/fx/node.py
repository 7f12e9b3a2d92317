"""``Node``: one operation in an FX graph, with automatic use-def bookkeeping.

A node's inputs are whatever ``Node`` objects appear (at any depth) in its ``args`` and
``kwargs``. Assigning ``args``/``kwargs`` recomputes them and keeps every input's ``users``
dict in sync, so graph edits never need manual accounting. Nodes of a graph form a circular
doubly linked list through ``_prev``/``_next`` around the graph's sentinel root node; each node
also carries a ``_sort_key`` tuple that orders nodes by position without walking the list.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional, TypeVar, Union

import torch
from torch.utils._dtype_abbrs import dtype_abbrs  # noqa: F401  # torch.fx.node exposes it

from exportir.fx.immutable_collections import immutable_dict, immutable_list

# torch.fx.node also holds the naming/printing helpers and the operator-schema entry points;
# passes import them from there (``from torch.fx.node import _get_qualified_name``).
from exportir.fx.operator_schemas import (  # noqa: F401
    ArgsKwargsPair,
    normalize_function,
    normalize_module,
)
from exportir.fx.printer import (  # noqa: F401
    _find_module_of_method,
    _format_arg,
    _get_qualified_name,
    _type_repr,
)

if TYPE_CHECKING:
    from exportir.fx.graph import Graph

__all__ = ["Node", "has_side_effect", "map_aggregate", "map_arg"]

# Runtime aliases as torch.fx defines them (``Union`` spelling: members include string
# forward references, which ``|`` cannot combine).
BaseArgumentTypes = Union[  # noqa: UP007
    str, int, float, bool, complex, torch.dtype, torch.Tensor, torch.device,
    torch.memory_format, torch.layout, torch._ops.OpOverload, torch.SymInt, torch.SymBool,
    torch.SymFloat,
]
base_types = BaseArgumentTypes.__args__  # type: ignore[attr-defined]  # a Union's members

Target = Union[Callable[..., Any], str]  # noqa: UP007
Argument = Optional[  # noqa: UP045
    Union[
        tuple["Argument", ...], Sequence["Argument"], Mapping[str, "Argument"], slice, range,
        "Node", BaseArgumentTypes,
    ]
]
ArgumentT = TypeVar("ArgumentT")

_legal_ops = dict.fromkeys(
    ["placeholder", "call_method", "call_module", "call_function", "get_attr", "output", "root"]
)

_side_effectful_need_to_be_preserved_pre_dispatch: list[Callable[..., Any]] = [
    torch._C._set_grad_enabled,
    torch.amp._enter_autocast,
    torch.amp._exit_autocast,
]


def _aten_side_effects() -> list[Any]:
    ops = torch.ops
    found = [
        ops.aten._assert_async.msg,
        ops.aten._assert_scalar.default,
        ops.aten._assert_tensor_metadata.default,
        ops.aten.sym_constrain_range.default,
        ops.aten.sym_constrain_range_for_size.default,
        ops.profiler._record_function_enter,
        ops.profiler._record_function_enter.default,
        ops.profiler._record_function_enter_new,
        ops.profiler._record_function_enter_new.default,
        ops.profiler._record_function_exit,
        ops.profiler._record_function_exit._RecordFunction,
    ]
    return found


# Functions that dead code elimination must keep even when their result is unused.
_side_effectful_functions: set[Callable[..., Any]] = {
    torch._assert,
    torch._assert_async,
    operator.setitem,
    *_aten_side_effects(),
    *_side_effectful_need_to_be_preserved_pre_dispatch,
}

# Python-level random functions: they advance the global RNG, so they are never dead code.
_RANDOM_FUNCTIONS = {
    torch.rand, torch.randn, torch.randint, torch.randperm, torch.rand_like, torch.randn_like,
    torch.randint_like, torch.normal, torch.poisson, torch.bernoulli, torch.multinomial,
}


def has_side_effect(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` so that ``Graph.eliminate_dead_code`` never removes calls to it."""
    _side_effectful_functions.add(fn)
    return fn


# ---------------------------------------------------------------------------------------------
# Argument traversal. Containers are rebuilt (lists -> immutable_list, dicts -> immutable_dict,
# namedtuples keep their type); leaves are passed to ``fn``.

def map_aggregate(a: ArgumentT, fn: Callable[[Argument], Argument]) -> ArgumentT:
    """Apply ``fn`` to every leaf of ``a`` (a nest of tuples, lists, dicts and slices)."""
    cls = type(a)
    if cls is tuple:
        return tuple([map_aggregate(x, fn) for x in a])  # type: ignore[return-value]
    if cls is list or cls is immutable_list:
        return immutable_list([map_aggregate(x, fn) for x in a])  # type: ignore[return-value]
    if cls is dict or cls is immutable_dict:
        return immutable_dict(  # type: ignore[return-value]
            [(k, map_aggregate(v, fn)) for k, v in a.items()]  # type: ignore[attr-defined]
        )
    if cls is slice:
        return slice(  # type: ignore[return-value]
            map_aggregate(a.start, fn), map_aggregate(a.stop, fn), map_aggregate(a.step, fn)
        )
    if isinstance(a, tuple):
        items = [map_aggregate(x, fn) for x in a]
        # namedtuples keep their type; other tuple subclasses (torch.Size, structseqs) do not
        return cls(*items) if hasattr(a, "_fields") else tuple(items)  # type: ignore[return-value]
    if isinstance(a, list):
        return immutable_list([map_aggregate(x, fn) for x in a])  # type: ignore[return-value]
    if isinstance(a, dict):
        return immutable_dict([(k, map_aggregate(v, fn)) for k, v in a.items()])  # type: ignore[return-value]
    return fn(a)  # type: ignore[return-value]


def map_arg(a: ArgumentT, fn: Callable[[Node], Argument]) -> ArgumentT:
    """Apply ``fn`` to every ``Node`` inside ``a``; other leaves are kept as they are."""
    if not callable(fn):
        raise AssertionError("torch.fx.map_arg(a, fn): fn must be a callable")  # noqa: TRY004  # torch.fx's type
    return map_aggregate(a, lambda x: fn(x) if isinstance(x, Node) else x)


_LEAF_TYPES = frozenset({int, float, bool, str, type(None), complex, torch.dtype, torch.device})


def _freeze(a: Any, found: dict[Node, None]) -> Any:
    """Rebuild ``a`` with immutable containers, recording every ``Node`` in ``found`` in order."""
    cls = type(a)
    if cls in _LEAF_TYPES:
        return a
    if cls is Node or isinstance(a, Node):
        found[a] = None
        return a
    if cls is tuple:
        return tuple([_freeze(x, found) for x in a])
    if cls is list or cls is immutable_list:
        return immutable_list([_freeze(x, found) for x in a])
    if cls is dict or cls is immutable_dict:
        return immutable_dict([(k, _freeze(v, found)) for k, v in a.items()])
    if cls is slice:
        return slice(_freeze(a.start, found), _freeze(a.stop, found), _freeze(a.step, found))
    if isinstance(a, (tuple, list, dict)):
        return map_aggregate(a, lambda x: _freeze(x, found))
    return a


def _collect_nodes(a: Any, found: dict[Node, None]) -> None:
    map_aggregate(a, lambda x: found.setdefault(x) if isinstance(x, Node) else None)


# ---------------------------------------------------------------------------------------------


class Node:
    """One operation of a :class:`Graph`.

    ``op`` is one of ``placeholder``, ``get_attr``, ``call_function``, ``call_method``,
    ``call_module`` or ``output``; ``target`` is what is called (a callable for
    ``call_function``, a string otherwise); ``args``/``kwargs`` follow Python's calling
    convention and may reference other nodes. Create nodes through the ``Graph`` API.
    """

    __slots__ = (
        "__dict__",
        "__weakref__",
        "_args",
        "_erased",
        "_input_nodes",
        "_kwargs",
        "_name",
        "_next",
        "_op",
        "_prev",
        "_repr_fn",
        "_sort_key",
        "_target",
        "graph",
        "meta",
        "type",
        "users",
    )

    def __init__(
        self,
        graph: Graph,
        name: str,
        op: str,
        target: Target,
        args: tuple[Argument, ...],
        kwargs: dict[str, Argument],
        return_type: Any | None = None,
    ) -> None:
        if op == "call_function":
            if not callable(target):
                raise ValueError(
                    f"Node [graph = {graph}, name = '{name}'] target {target} has type "
                    f"{torch.typename(target)} but a Callable is expected"
                )
        else:
            if op not in _legal_ops:
                raise AssertionError(f"op '{op}' is not in _legal_ops")
            if not isinstance(target, str):
                raise ValueError(
                    f"Node [graph = {graph}, name = '{name}'] target {target} has type "
                    f"{torch.typename(target)} but a str is expected"
                )
        self.graph = graph
        self._name = name
        self._op = op
        self._target = target
        self.type = return_type
        self._input_nodes: dict[Node, None] = {}
        self.users: dict[Node, None] = {}
        self._sort_key: tuple[int, ...] = ()
        self._prev = self
        self._next = self
        self._erased = False
        self._repr_fn: Callable[[Node], str] | None = None
        self.meta: dict[str, Any] = {}
        self._args: tuple[Argument, ...] = ()
        self._kwargs: dict[str, Argument] = immutable_dict()
        self._update_args_kwargs(args, kwargs)

    # -- identity fields that the graph's find_nodes index depends on --------------------------

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        hooks = getattr(self.graph.owning_module, "_replace_hooks", None)
        if hooks:
            if not isinstance(value, str):
                raise TypeError(f"Node name must be a str, got {type(value).__name__}")
            for user in self.users:
                for hook in hooks:
                    hook(old=self, new=value, user=user)
        self._name = value

    @property
    def op(self) -> str:
        return self._op

    @op.setter
    def op(self, value: str) -> None:
        self._reindexed("_op", value)

    @property
    def target(self) -> Target:
        return self._target

    @target.setter
    def target(self, value: Target) -> None:
        self._reindexed("_target", value)

    def _reindexed(self, slot: str, value: Any) -> None:
        table = getattr(self.graph, "_find_nodes_lookup_table", None)
        indexed = table is not None and not self._erased and self in table
        if indexed:
            table.remove(self)
        object.__setattr__(self, slot, value)
        if indexed:
            table.insert(self)

    # -- pickling: Node has slots plus a __dict__ ----------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for slot in Node.__slots__:
            if slot not in ("__dict__", "__weakref__"):
                state[slot] = getattr(self, slot)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)

    # -- ordering ------------------------------------------------------------------------------

    def __lt__(self, other: Node) -> bool:
        return self._sort_key < other._sort_key

    def __gt__(self, other: Node) -> bool:
        return self._sort_key > other._sort_key

    def __le__(self, other: Node) -> bool:
        return self._sort_key <= other._sort_key

    def __ge__(self, other: Node) -> bool:
        return self._sort_key >= other._sort_key

    __hash__ = object.__hash__
    __eq__ = object.__eq__

    # -- the linked list -----------------------------------------------------------------------

    @property
    def next(self) -> Node:
        """The node after this one (the graph's root sentinel after the last node)."""
        return self._next

    @property
    def prev(self) -> Node:
        """The node before this one (the graph's root sentinel before the first node)."""
        return self._prev

    def prepend(self, x: Node) -> None:
        """Move ``x`` (a node of the same graph) to just before this node."""
        self._prepend(x)

    def append(self, x: Node) -> None:
        """Move ``x`` (a node of the same graph) to just after this node."""
        self._next._prepend(x)

    def _prepend(self, x: Node) -> None:
        if x is self:  # a no-op, silently, as in torch.fx
            return
        x._remove_from_list()
        before = self._prev
        before._next = x
        x._prev = before
        x._next = self
        self._prev = x
        x._sort_key = _key_between(before._sort_key, self._sort_key)

    def _remove_from_list(self) -> None:
        before, after = self._prev, self._next
        before._next = after
        after._prev = before

    # -- arguments and use-def bookkeeping ------------------------------------------------------

    @property
    def args(self) -> tuple[Argument, ...]:
        """Positional arguments. Assigning updates ``users`` of old and new inputs."""
        return self._args

    @args.setter
    def args(self, a: tuple[Argument, ...]) -> None:
        self._update_args_kwargs(a, self._kwargs)

    @property
    def kwargs(self) -> dict[str, Argument]:
        """Keyword arguments. Assigning updates ``users`` of old and new inputs."""
        return self._kwargs

    @kwargs.setter
    def kwargs(self, k: dict[str, Argument]) -> None:
        self._update_args_kwargs(self._args, k)

    @property
    def all_input_nodes(self) -> list[Node]:
        """Every distinct ``Node`` used by ``args`` then ``kwargs``, in order of appearance."""
        return list(self._input_nodes)

    def _update_args_kwargs(self, new_args: Any, new_kwargs: Any) -> None:
        found: dict[Node, None] = {}
        self._args = _freeze(new_args, found)
        self._kwargs = _freeze(new_kwargs, found)
        for old in self._input_nodes:
            old.users.pop(self)
        self._input_nodes = found
        for new in found:
            new.users[self] = None

    def update_arg(self, idx: int, arg: Argument) -> None:
        """Set ``self.args[idx] = arg``."""
        args = list(self._args)
        args[idx] = arg
        self.args = tuple(args)

    def insert_arg(self, idx: int, arg: Argument) -> None:
        """Insert ``arg`` into ``args`` before position ``idx`` (0 <= idx <= len(args))."""
        if not 0 <= idx <= len(self._args):
            raise AssertionError(
                f"insert_args index must be between 0 and len(self.args), got {idx}"
            )
        found: dict[Node, None] = {}
        frozen = _freeze(arg, found)
        self._args = self._args[:idx] + (frozen,) + self._args[idx:]
        for node in found:
            if node not in self._input_nodes:
                self._input_nodes[node] = None
                node.users[self] = None

    def update_kwarg(self, key: str, arg: Argument) -> None:
        """Set ``self.kwargs[key] = arg``."""
        self.kwargs = {**self._kwargs, key: arg}

    def replace_all_uses_with(
        self,
        replace_with: Node,
        delete_user_cb: Callable[[Node], bool] | None = None,
        *,
        propagate_meta: bool = False,
    ) -> list[Node]:
        """Make every user of this node (that ``delete_user_cb`` accepts) use ``replace_with``.

        Returns the users that were changed. With ``propagate_meta``, this node's ``meta`` is
        copied onto ``replace_with``, which must not have any meta of its own.
        """
        if propagate_meta:
            if replace_with.meta:
                raise AssertionError(
                    "Called node.replace_all_uses_with(replace_with, propagate_meta=True), "
                    "but replace_with already has .meta keys"
                )
            replace_with.meta.update(self.meta)
        hooks = getattr(self.graph.owning_module, "_replace_hooks", None)
        changed = []
        for user in list(self.users):
            if delete_user_cb is not None and not delete_user_cb(user):
                continue
            changed.append(user)
            for hook in hooks or ():
                hook(old=self, new=replace_with.name, user=user)
            user._replace_input_with(self, replace_with)
        return changed

    def replace_input_with(self, old_input: Node, new_input: Node) -> None:
        """Replace every occurrence of ``old_input`` in this node's arguments by ``new_input``."""
        for hook in getattr(self.graph.owning_module, "_replace_hooks", None) or ():
            hook(old=old_input, new=new_input.name, user=self)
        self._replace_input_with(old_input, new_input)

    def _replace_input_with(self, old_input: Node, new_input: Node) -> None:
        swap = lambda n: new_input if n is old_input else n
        self._update_args_kwargs(map_arg(self._args, swap), map_arg(self._kwargs, swap))

    def _rename(self, candidate: str) -> None:
        if candidate == self._name:
            return
        name = self.graph._graph_namespace.create_name(candidate, None)
        self.name = name
        self.graph._graph_namespace._rename_object(self, name)

    # -- metadata ------------------------------------------------------------------------------

    @property
    def stack_trace(self) -> str | None:
        """The user's Python stack recorded while tracing (innermost frame last), if any."""
        return self.meta.get("stack_trace", None)

    @stack_trace.setter
    def stack_trace(self, trace: str | None) -> None:
        self.meta["stack_trace"] = trace

    def __repr__(self) -> str:
        if self._repr_fn is not None:
            return self._repr_fn(self)
        return self._name

    @staticmethod
    def _pretty_print_target(target: object) -> str:
        from exportir.fx.printer import pretty_print_target

        return pretty_print_target(target)

    def format_node(
        self,
        placeholder_names: list[str] | None = None,
        maybe_return_typename: list[str] | None = None,
        *,
        include_tensor_metadata: bool = False,
    ) -> str | None:
        """This node in the FX text format, e.g. ``%add : [num_users=1] = call_function[...]``.

        ``placeholder_names`` collects placeholder names (the graph signature) instead of
        returning a line for them; ``maybe_return_typename`` receives the output's type text.
        """
        from exportir.fx.printer import format_node

        return format_node(
            self, placeholder_names, maybe_return_typename,
            include_tensor_metadata=include_tensor_metadata,
        )

    def is_impure(self, impure_random: bool = True) -> bool:
        """Whether removing this node could change the program's behaviour."""
        if self._op in ("placeholder", "output"):
            return True
        if self._op == "call_module":
            root = self.graph.owning_module
            if root is None:
                raise AssertionError("self.graph.owning_module not set for purity check")
            return getattr(root.get_submodule(self._target), "_is_impure", False)
        if self._op == "call_function":
            return _target_is_impure(self._target, impure_random)
        return False

    def normalized_arguments(
        self,
        root: torch.nn.Module,
        arg_types: tuple[Any] | None = None,
        kwarg_types: dict[str, Any] | None = None,
        normalize_to_only_use_kwargs: bool = False,
    ) -> ArgsKwargsPair | None:
        """Match ``args``/``kwargs`` to the target's signature, filling in defaults.

        Works for Python callables, ``OpOverload``s and modules (``call_module``); returns
        ``None`` when the signature cannot be matched unambiguously.
        """
        from exportir.fx import operator_schemas

        if self._op == "call_function":
            return operator_schemas.normalize_function(
                self._target, self._args, self._kwargs, arg_types, kwarg_types,
                normalize_to_only_use_kwargs=normalize_to_only_use_kwargs,
            )
        if self._op == "call_module":
            return operator_schemas.normalize_module(
                root, self._target, self._args, self._kwargs,
                normalize_to_only_use_kwargs=normalize_to_only_use_kwargs,
            )
        return None


def _key_between(before: tuple[int, ...], after: tuple[int, ...]) -> tuple[int, ...]:
    """A sort key strictly between two neighbours' keys (``()`` is the root sentinel)."""
    if len(before) > len(after):
        head = before[: len(after) + 1]
        return head[:-1] + (head[-1] + 1,)
    if len(before) < len(after):
        head = after[: len(before) + 1]
        return head[:-1] + (head[-1] - 1,)
    return before + (0,)


def _target_is_impure(target: Any, impure_random: bool) -> bool:
    if target in _side_effectful_functions:
        return True
    if isinstance(target, torch._ops.OpOverloadPacket):
        default = getattr(target, "default", None)
        return default is not None and _target_is_impure(default, impure_random)
    if target in _RANDOM_FUNCTIONS:
        return True
    if impure_random and getattr(target, "_nondeterministic_seeded", False):
        return True
    schema = getattr(target, "_schema", None)
    return schema is not None and schema.is_mutable
