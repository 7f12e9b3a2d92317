"""``reinplace``: turn a functional ATen graph's out-of-place ops back into in-place ones.

Behaviour follows ``torch.fx.passes.reinplace.reinplace``. For ``b = foo(a, ...)`` the pass
rewrites the node to ``foo_(a, ...)`` (and later uses of ``b`` to ``a``) when:

1. ``a`` can hold the result (same numel and dtype, no internal memory overlap), does not alias
   a graph input, and is not passed to ``foo`` twice;
2. neither ``a`` nor any alias of it is used by a later node, except by a view op on an alias,
   or by a ``{view}_scatter(base, alias, args...)`` that writes that alias back into the base
   it was viewed from with the same view arguments (such scatters become dead and are erased);
3. ``foo`` has an in-place variant whose schema matches (``add.Tensor`` -> ``add_.Tensor``).

A ``{view}_scatter(a, src, args...)`` itself that passes the checks is replaced by
``view(a, args...).copy_(src)``.

Aliasing comes from running the graph on meta tensors built from ``sample_args``: a meta tensor
has a storage, and views share it, so storage identity tells which nodes alias (torch uses its
FakeTensor for this; exportir.fx may not depend on it). Inputs that alias each other in
``sample_args`` get meta tensors sharing one storage. Each node keeps ``meta["fake_result"]``
(its meta value), ``meta["node_idx"]`` and, for views, ``meta["view_of"]``, as in torch.
Graphs whose ops have no meta kernel or produce data-dependent shapes cannot be analysed; the
error of the failing op is raised.
"""

from __future__ import annotations

import itertools
import operator
from collections import defaultdict
from enum import Enum
from typing import Any

import torch
import torch._ops
from torch.multiprocessing.reductions import StorageWeakRef

from exportir import pytree
from exportir.fx.graph_module import GraphModule
from exportir.fx.interpreter import Interpreter
from exportir.fx.node import Node, map_aggregate

__all__ = ["reinplace"]

_META = torch.device("meta")

#: ``{view}_scatter`` op -> the view op whose effect it undoes.
_VIEW_INVERSE_MAP: dict[torch._ops.OpOverload, torch._ops.OpOverload] = {
    torch.ops.aten.diagonal_scatter.default: torch.ops.aten.diagonal.default,
    torch.ops.aten.select_scatter.default: torch.ops.aten.select.int,
    torch.ops.aten.slice_scatter.default: torch.ops.aten.slice.Tensor,
    torch.ops.aten.as_strided_scatter.default: torch.ops.aten.as_strided.default,
}


class _ViewType(Enum):
    NonView = 0
    SingleOutputView = 1
    MultiOutputView = 2


def _view_type(target: object) -> _ViewType:
    """Whether ``target``'s first argument is aliased (not written) by its output(s)."""
    if not isinstance(target, torch._ops.OpOverload):
        return _ViewType.NonView
    arguments = target._schema.arguments
    alias = arguments[0].alias_info if arguments else None
    if alias is None or alias.is_write:
        return _ViewType.NonView
    return _ViewType.MultiOutputView if "*" in alias.after_set else _ViewType.SingleOutputView


def _storage(t: torch.Tensor) -> StorageWeakRef:
    return StorageWeakRef(t._typed_storage())


def _tensor_storages(value: Any) -> set[StorageWeakRef]:
    return {_storage(x) for x in pytree.tree_leaves(value) if isinstance(x, torch.Tensor)}


# --------------------------------------------------------------------------------------------
# Metadata propagation on meta tensors.


class _MetaConverter:
    """Real tensors -> meta tensors; tensors sharing a storage get metas sharing one too."""

    def __init__(self) -> None:
        self.storages: dict[StorageWeakRef, Any] = {}
        self.keep_alive: list[torch.Tensor] = []

    def __call__(self, value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value.device == _META:
            return value
        if value.is_sparse or value.is_quantized or value.is_nested:
            return value.to(_META)
        self.keep_alive.append(value)  # StorageWeakRef keys must not be recycled
        key = _storage(value)
        storage = self.storages.get(key)
        if storage is None:
            nbytes = value.untyped_storage().nbytes()
            storage = torch.empty(nbytes, dtype=torch.uint8, device=_META).untyped_storage()
            self.storages[key] = storage
        meta = torch.empty(0, dtype=value.dtype, device=_META)
        meta.set_(storage, value.storage_offset(), value.size(), value.stride())
        return meta


class _MetaProp(Interpreter):
    """Runs the graph on meta tensors, recording ``fake_result``/``node_idx``/``view_of``."""

    def __init__(self, module: GraphModule) -> None:
        super().__init__(module)
        self.to_meta = _MetaConverter()
        self.multi_output_views: dict[Node, Any] = {}
        self.node_counter = -1

    def run_node(self, n: Node) -> Any:
        self.node_counter += 1
        result = super().run_node(n)
        n.meta["fake_result"] = result
        n.meta["node_idx"] = self.node_counter
        if n.op == "call_function":
            self._record_view(n)
        if "view_of" in n.meta:
            self._check_view(n)
        return result

    def _record_view(self, n: Node) -> None:
        kind = _view_type(n.target)
        if kind is _ViewType.SingleOutputView:
            if not isinstance(n.args[0], Node):
                raise AssertionError(f"Expected Node, got {type(n.args[0])}")
            n.meta["view_of"] = n.args[0]
        elif kind is _ViewType.MultiOutputView:
            self.multi_output_views[n] = n.args[0]
        elif n.target is operator.getitem:
            base = self.multi_output_views.get(n.args[0])
            if base is not None:
                if not isinstance(base, Node):
                    raise AssertionError(f"Expected Node, got {type(base)}")
                n.meta["view_of"] = base

    @staticmethod
    def _check_view(n: Node) -> None:
        view, base = n.meta["fake_result"], n.meta["view_of"].meta["fake_result"]
        if not isinstance(view, torch.Tensor) or not isinstance(base, torch.Tensor):
            raise AssertionError("Expected tensors in fake_result of a view and its base")  # noqa: TRY004  # torch.fx raises this type
        if _storage(view) != _storage(base):
            raise AssertionError("view_storage != base_storage")

    def get_attr(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.to_meta(super().get_attr(target, args, kwargs))

    def call_function(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        args = map_aggregate(args, self.to_meta)
        kwargs = {k: _META if k == "device" and v is not None else self.to_meta(v)
                  for k, v in kwargs.items()}
        return super().call_function(target, args, kwargs)

    def propagate(self, *args: Any) -> Any:
        self.multi_output_views = {}
        self.node_counter = -1
        return self.run(*[self.to_meta(a) for a in args])


# --------------------------------------------------------------------------------------------
# In-place variants.


def _schemas_match(functional: torch._C.FunctionSchema, inplace: torch._C.FunctionSchema) -> bool:
    first = inplace.arguments[0].alias_info
    if first is None or not first.is_write:
        raise AssertionError("First argument of inplace op must be mutable")
    if any(a.alias_info is not None for a in inplace.arguments[1:]):
        raise AssertionError("Remaining arguments of inplace op must not be mutable")
    return (
        inplace.name.endswith("_")
        and inplace.name[:-1] == functional.name
        and len(functional.arguments) == len(inplace.arguments)
        and all(a.type == b.type for a, b in zip(functional.arguments, inplace.arguments))
    )


def _maybe_get_inplace_op(op: object) -> torch._ops.OpOverload | None:
    """The in-place overload of ``op`` with a matching schema, if there is one."""
    if not isinstance(op, torch._ops.OpOverload) or _view_type(op) is not _ViewType.NonView:
        return None
    namespace = getattr(torch.ops, op.__module__.split(".")[-1], None)
    packet = getattr(namespace, f"{op.overloadpacket.__name__}_", None)
    if packet is None:
        return None
    matching = [f for f in packet.op_overloads() if _schemas_match(op._schema, f._schema)]
    if not matching:
        return None
    if len(matching) != 1:
        raise AssertionError(
            f"Expected exactly 1 matching inplace overload, got {len(matching)}"
        )
    return matching[0]


# --------------------------------------------------------------------------------------------
# Later uses of a tensor's aliases.


def _later_usages(aliases: set[Node], op_index: int) -> set[Node]:
    """Nodes after ``op_index`` using any alias, ignoring an alias's own view/getitem of one."""
    later: set[Node] = set()
    for alias in aliases:
        for user in alias.users:
            if "node_idx" not in user.meta or user.meta["node_idx"] <= op_index:
                continue
            if user in aliases and (
                isinstance(user.target, torch._ops.OpOverload) or user.target is operator.getitem
            ):
                continue
            later.add(user)
    return later


def _same_view_metadata(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.size() == b.size() and a.stride() == b.stride()
            and a.storage_offset() == b.storage_offset())


def _is_view_inverse_of(scatter: Node, alias: Node) -> bool:
    """Does ``scatter`` write ``alias`` back with the same view op and arguments?"""
    base_of_alias = alias.meta["view_of"]
    base = scatter.args[0]
    view_op = _VIEW_INVERSE_MAP[scatter.target]
    try:
        replay = view_op(base_of_alias.meta["fake_result"], *scatter.args[2:], **scatter.kwargs)
        return _same_view_metadata(
            base_of_alias.meta["fake_result"], base.meta["fake_result"]
        ) and _same_view_metadata(replay, alias.meta["fake_result"])
    except Exception:  # noqa: BLE001  # a replay that fails means "not the inverse"
        return False


def _check_scatter_args(scatter: Node) -> None:
    for what, arg in (("base", scatter.args[0]), ("mutated_view", scatter.args[1])):
        if not isinstance(arg, Node):
            raise AssertionError(f"Expected Node for {what}, got {type(arg)}")  # noqa: TRY004  # torch.fx raises this type
        if not isinstance(arg.meta["fake_result"], torch.Tensor):
            raise AssertionError(f"Expected a tensor in {what}.meta['fake_result']")  # noqa: TRY004  # torch.fx raises this type


def _view_inverse_usages(later: set[Node], aliases: set[Node]) -> set[Node]:
    """The later ``{view}_scatter`` uses that only write an alias back where it came from."""
    found: set[Node] = set()
    for n in sorted(later, key=lambda x: x.meta["node_idx"]):
        if n.target not in _VIEW_INVERSE_MAP:
            continue
        _check_scatter_args(n)
        if any("view_of" in a.meta and _is_view_inverse_of(n, a) for a in aliases):
            found.add(n)
    return found


# --------------------------------------------------------------------------------------------
# The pass.


def _self_has_wrong_metadata(self_value: Any, node_value: Any) -> bool:
    """Step 1a: ``self`` cannot hold the result (numel/dtype differ, or it overlaps itself)."""
    selfs, results = pytree.tree_leaves(self_value), pytree.tree_leaves(node_value)
    if len(selfs) != len(results):
        return False
    return any(
        s.numel() != r.numel() or s.dtype != r.dtype or torch._debug_has_internal_overlap(s) == 1
        for s, r in zip(selfs, results)
    )


def _is_candidate(node: Node) -> bool:
    """An OpOverload call whose first argument is a Tensor."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    arguments = node.target._schema.arguments
    return bool(arguments) and type(arguments[0].type) is torch.TensorType


class _Reinplacer:
    def __init__(self, gm: GraphModule) -> None:
        self.gm = gm
        self.input_storages = {
            _storage(n.meta["fake_result"]) for n in gm.graph.nodes
            if n.op == "placeholder" and isinstance(n.meta["fake_result"], torch.Tensor)
        }
        self.storage_to_nodes: dict[StorageWeakRef, set[Node]] = defaultdict(set)
        for n in gm.graph.nodes:
            if "fake_result" in n.meta:
                for storage in _tensor_storages(n.meta["fake_result"]):
                    self.storage_to_nodes[storage].add(n)
        self.to_delete: set[Node] = set()

    def _blocked(self, node: Node, self_arg: Node) -> bool:
        """Steps 1a-1c."""
        wrong = _self_has_wrong_metadata(self_arg.meta["fake_result"], node.meta["fake_result"])
        if wrong and node.target != torch.ops.aten.resize.default:
            return True
        if _storage(self_arg.meta["fake_result"]) in self.input_storages:
            return True
        return sum(1 for a in node.args if a is self_arg) > 1

    def visit(self, node: Node) -> None:
        if not _is_candidate(node):
            return
        self_arg = node.args[0]
        if self._blocked(node, self_arg):
            return
        self_storage = _storage(self_arg.meta["fake_result"])
        aliases = self.storage_to_nodes[self_storage]
        later = _later_usages(aliases, node.meta["node_idx"])
        inverses = _view_inverse_usages(later, aliases)
        if later - inverses:
            return
        if node.target in _VIEW_INVERSE_MAP and node not in self.to_delete:
            self._scatter_to_copy(node, self_arg)
        else:
            inplace = _maybe_get_inplace_op(node.target)
            if inplace is None:
                return
            node.target = inplace
        node_storage = _storage(node.meta["fake_result"])
        self._union(self_storage, node_storage)
        self.to_delete.update(inverses)
        for old in itertools.chain([node], inverses):
            self._redirect_later_uses(old, node.meta["node_idx"])

    def _scatter_to_copy(self, node: Node, self_arg: Node) -> None:
        """Step 3a: ``base_updated = v_scatter(base, src, args)`` -> ``v(base, args).copy_(src)``."""
        view_op = _VIEW_INVERSE_MAP[node.target]
        with self.gm.graph.inserting_before(node):
            view = self.gm.graph.create_node(
                "call_function", view_op, (self_arg, *node.args[2:]), node.kwargs
            )
            self.gm.graph.create_node(
                "call_function", torch.ops.aten.copy_.default, (view, node.args[1]), {}
            )
        self.to_delete.add(node)

    def _union(self, a: StorageWeakRef, b: StorageWeakRef) -> None:
        self.storage_to_nodes[a].update(self.storage_to_nodes[b])
        self.storage_to_nodes[b].update(self.storage_to_nodes[a])

    def _redirect_later_uses(self, old: Node, op_index: int) -> None:
        """Step 4: later users of ``old``'s result read its (now mutated) first argument."""
        new = old.args[0]
        if not isinstance(new, Node):
            raise AssertionError(f"Expected Node, got {type(new)}")  # noqa: TRY004  # torch.fx raises this type
        for user in [u for u in old.users if u.meta["node_idx"] > op_index]:
            user.args = map_aggregate(user.args, lambda a: new if a is old else a)
            user.kwargs = map_aggregate(user.kwargs, lambda a: new if a is old else a)
            self._track_rebased_view(old, new, user)

    def _track_rebased_view(self, old: Node, new: Node, user: Node) -> None:
        """A view of ``old`` is now a view of ``new``: merge their alias sets."""
        old_storages = _tensor_storages(old.meta["fake_result"])
        user_storages = _tensor_storages(user.meta["fake_result"])
        if len(old_storages) != 1 or old_storages != user_storages:
            return
        new_storages = _tensor_storages(new.meta["fake_result"])
        if len(new_storages) != 1:
            raise AssertionError(f"Expected 1 storage, got {len(new_storages)}")
        self._union(next(iter(user_storages)), next(iter(new_storages)))


def reinplace(gm: GraphModule, *sample_args: Any) -> GraphModule:
    """Rewrite ``gm`` (a functional ATen graph) in place to use in-place ops where safe.

    ``sample_args`` are example inputs (only their metadata and aliasing are used). Returns
    ``gm``, recompiled. See the module docstring for the rules.
    """
    _MetaProp(gm).propagate(*sample_args)
    reinplacer = _Reinplacer(gm)
    for node in gm.graph.nodes:
        reinplacer.visit(node)
    for dead in reinplacer.to_delete:
        gm.graph.erase_node(dead)
    gm.recompile()
    return gm
