"""Functionalization: a recorded graph with mutations -> the same program without them.

Input: the graph capture recorded, where in-place ops (``add_``), ``out=`` ops and ops with
mutable arguments (``_native_batch_norm_legit``) write into tensors, possibly through views
(``x[0].add_(1)``, ``x.view(-1).mul_(2)``). Output: a new graph where

- every mutating op is replaced by its functional variant (``add_`` -> ``add``, ``add.out`` ->
  ``add.Tensor``, ``_native_batch_norm_legit`` -> ``_native_batch_norm_legit_functional``);
- a write through a view is propagated to the view's base with the inverse ``*_scatter`` op
  (``select_scatter``, ``slice_scatter``...) or inverse view, and later reads of any alias of that
  base regenerate the view from the new base;
- the final values of mutated buffers and user inputs are returned as extra outputs, placed
  before the user outputs in input order (BUFFER_MUTATION, USER_INPUT_MUTATION), like torch.export.

Views of unmutated tensors stay views, as the ATen dialect allows.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from exportir.export._node_meta import node_name
from exportir.export.fake import FakeConverter, run_fake
from exportir.fx import Graph, Node

aten = torch.ops.aten

_META_KEYS = ("stack_trace", "nn_module_stack", "source_fn_stack")
_COMPUTE = object()  # emit(): compute the node's ``val`` on fakes


class FunctionalizationError(RuntimeError):
    """A mutation that cannot be expressed functionally (or is forbidden by the export rules)."""


@dataclass(frozen=True, slots=True)
class Mutation:
    """A mutated input: its placeholder (in the new graph) and the node holding its final value."""

    placeholder: Node
    value: Node


@dataclass(frozen=True, slots=True)
class Rewrite:
    """How to replace one mutating call: ``target(*args, **kwargs)`` and where each written
    argument's new value comes from (``None``: the call's result, ``i``: its ``i``-th output)."""

    target: Any
    args: tuple
    kwargs: dict
    writes: tuple[tuple[Any, int | None], ...]  # (old node written, output index)
    result_alias: Any = None  # old node the call's own result aliases (in-place / out=)


# --- what aliases what ---------------------------------------------------------------------


@cache
def _is_view_op(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.arguments or not schema.returns:
        return False
    first = schema.arguments[0].alias_info
    ret = schema.returns[0].alias_info
    return (
        first is not None
        and not first.is_write
        and ret is not None
        and not ret.is_write
        and len(schema.returns) == 1
    )


is_view_op = _is_view_op  # for export/_view_replay.py


def view_base(node: Node) -> Node | None:
    """The node a view (or an in-place op's result, or a getitem of a view list) aliases."""
    if node.op != "call_function":
        return None
    target = node.target
    if target is operator.getitem:
        parent = node.args[0]
        if isinstance(parent, Node) and parent.op == "call_function" and _is_view_op(parent.target):
            return parent
        return None
    if _is_view_op(target):
        return node.args[0] if isinstance(node.args[0], Node) else None
    written = _written_args(target)
    if written and written[0] == 0 and isinstance(node.args[0], Node):
        return node.args[0]  # add_(x, 1) returns x
    return None


@cache
def _written_args(func: Any) -> tuple[int, ...]:
    schema = getattr(func, "_schema", None)
    if schema is None:
        return ()
    return tuple(
        i
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )


# --- functional variants -----------------------------------------------------------------


def _arg_key(func: Any, *, drop_out: bool) -> tuple:
    return tuple(
        (a.name, str(a.type))
        for a in func._schema.arguments
        if not (drop_out and a.alias_info is not None and a.alias_info.is_write)
    )


@cache
def functional_variant(func: Any) -> Any:
    """The functional overload with the same arguments (``add_.Tensor`` -> ``add.Tensor``,
    ``add.out`` -> ``add.Tensor``, ``_native_batch_norm_legit`` -> ``..._functional``)."""
    name = func._schema.name.split("::")[-1]
    written = [func._schema.arguments[i] for i in _written_args(func)]
    is_out = bool(written) and all(a.kwarg_only for a in written)
    if name.endswith("_"):
        packet_names = [name[:-1]]
    elif is_out:
        packet_names = [name]
    else:  # mutable arguments: the functional op returns their new values too
        packet_names = [name + "_functional"]
    want = _arg_key(func, drop_out=is_out)
    for packet_name in packet_names:
        packet = getattr(aten, packet_name, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            candidate = getattr(packet, overload)
            if _written_args(candidate):
                continue
            if _arg_key(candidate, drop_out=False) == want:
                return candidate
    raise FunctionalizationError(
        f"{func.name()} mutates its input and has no functional variant to replace it"
    )


def default_rewrite(node: Node) -> Rewrite:
    """In-place, ``out=`` and mutable-argument ops, read from their schema."""
    func = node.target
    schema = func._schema
    bound = _bind(node)
    written = [
        a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write
    ]
    target = functional_variant(func)
    if schema.name.endswith("_"):  # in-place: self is written with the result
        self_arg = bound["self"]
        return Rewrite(target, node.args, dict(node.kwargs), ((self_arg, None),), self_arg)
    if all(a.kwarg_only for a in schema.arguments if a.name in written):  # out= overload
        outs = [bound[name] for name in written]
        args, kwargs = _call_for(target, {k: v for k, v in bound.items() if k not in written})
        if len(outs) == 1:
            return Rewrite(target, args, kwargs, ((outs[0], None),), outs[0])
        return Rewrite(target, args, kwargs, tuple((o, i) for i, o in enumerate(outs)))
    first = len(schema.returns)  # mutable args come back after the op's own returns
    writes = tuple((bound[n], first + i) for i, n in enumerate(written) if bound[n] is not None)
    return Rewrite(target, node.args, dict(node.kwargs), writes)


def _call_for(target: Any, bound: dict) -> tuple[tuple, dict]:
    args, kwargs = [], {}
    for a in target._schema.arguments:
        if a.name not in bound:
            continue
        if a.kwarg_only:
            kwargs[a.name] = bound[a.name]
        else:
            args.append(bound[a.name])
    return tuple(args), kwargs


def _bind(node: Node) -> dict:
    bound = {}
    for i, a in enumerate(node.target._schema.arguments):
        if i < len(node.args) and not a.kwarg_only:
            bound[a.name] = node.args[i]
        elif a.name in node.kwargs:
            bound[a.name] = node.kwargs[a.name]
        elif a.has_default_value():
            bound[a.name] = a.default_value
    return bound


def _native_batch_norm(node: Node) -> Rewrite | None:
    """``native_batch_norm`` updates the running stats in training mode without saying so."""
    x, w, b, mean, var, training, momentum, eps = node.args[:8]
    if not training:
        return Rewrite(
            aten._native_batch_norm_legit_no_training.default,
            (x, w, b, mean, var, momentum, eps),
            {},
            (),
        )
    if mean is None or var is None:
        return Rewrite(
            aten._native_batch_norm_legit.no_stats, (x, w, b, True, momentum, eps), {}, ()
        )
    return Rewrite(
        aten._native_batch_norm_legit_functional.default,
        (x, w, b, mean, var, True, momentum, eps),
        {},
        ((mean, 3), (var, 4)),
    )


def _no_data_change(node: Node) -> Rewrite | None:
    """``detach_`` & co. change autograd metadata only: the value is the argument itself."""
    return None


REWRITES: dict[Any, Callable[[Node], Rewrite | None]] = {
    aten.native_batch_norm.default: _native_batch_norm,
    aten.detach_.default: _no_data_change,
    aten.requires_grad_.default: _no_data_change,
}

# aliases that change nothing a graph can observe and that torch.export drops (``alias`` and
# ``detach`` stay: torch's functional graphs keep them as view nodes)
TRANSPARENT = {aten.lift_fresh.default}

# ops changing a tensor's shape/strides in place: not expressible by value rewriting
METADATA_MUTATIONS = {
    aten.resize_.default,
    aten.set_.source_Tensor,
    aten.transpose_.default,
    aten.t_.default,
    aten.unsqueeze_.default,
    aten.squeeze_.default,
    aten.squeeze_.dim,
    aten.as_strided_.default,
}


def _needs_rewrite(node: Node) -> bool:
    return node.target in REWRITES or bool(_written_args(node.target))


# --- inverse views -------------------------------------------------------------------------

# (old view node, new base, new src, the view's other args mapped to the new graph) -> call
Scatter = Callable[[Node, Node, Node, tuple], tuple[Any, tuple, dict]]


def _select(v: Node, base: Node, src: Node, rest: tuple) -> tuple:
    return aten.select_scatter.default, (base, src, *rest[:2]), {}


def _slice(v: Node, base: Node, src: Node, rest: tuple) -> tuple:
    return aten.slice_scatter.default, (base, src, *rest), {}


def _diagonal(v: Node, base: Node, src: Node, rest: tuple) -> tuple:
    return aten.diagonal_scatter.default, (base, src, *rest), {}


def _as_strided(v: Node, base: Node, src: Node, rest: tuple) -> tuple:
    return aten.as_strided_scatter.default, (base, src, *rest), {}


def _view_back(v: Node, base: Node, src: Node, rest: tuple) -> tuple:
    return aten.view.default, (src, list(v.args[0].meta["val"].shape)), {}


def _permute_back(v: Node, base: Node, src: Node, rest: tuple) -> tuple:
    dims = list(v.args[1])
    inverse = [0] * len(dims)
    for i, d in enumerate(dims):
        inverse[d % len(dims)] = i
    return aten.permute.default, (src, inverse), {}


def _same_op(v: Node, base: Node, src: Node, rest: tuple) -> tuple:
    return v.target, (src, *rest), {}


def _identity(v: Node, base: Node, src: Node, rest: tuple) -> tuple:
    return None, (src,), {}


SCATTERS: dict[Any, Scatter] = {
    aten.select.int: _select,
    aten.slice.Tensor: _slice,
    aten.diagonal.default: _diagonal,
    aten.as_strided.default: _as_strided,
    aten.view.default: _view_back,
    aten._unsafe_view.default: _view_back,
    aten.reshape.default: _view_back,
    aten.unsqueeze.default: _view_back,
    aten.squeeze.dim: _view_back,
    aten.squeeze.dims: _view_back,
    aten.squeeze.default: _view_back,
    aten.flatten.using_ints: _view_back,
    aten.unflatten.int: _view_back,
    aten.permute.default: _permute_back,
    aten.transpose.int: _same_op,
    aten.t.default: _same_op,
    aten.alias.default: _same_op,  # torch writes back through an alias with an alias
    aten.detach.default: _identity,
}


def _rebuild(like: list | tuple, items: list) -> list | tuple:
    """A plain list or tuple (fx's immutable containers are not accepted by ATen ops)."""
    return items if isinstance(like, list) else tuple(items)


# --- the pass ------------------------------------------------------------------------------


class Functionalizer:
    """Copies ``old`` into a new graph, replacing mutations by values (see module docstring)."""

    def __init__(self, old: Graph) -> None:
        self.old = old
        self.new = Graph()
        self.value: dict[Node, Node] = {}  # old node -> new node with its current value
        self.root: dict[Node, Node] = {}  # old node -> old node owning its storage
        self.chain: dict[Node, tuple[Node, ...]] = {}  # old view -> views from root to it
        self.version: dict[Node, int] = {}  # old root -> number of writes so far
        self.stamp: dict[Node, int] = {}  # old view -> root version its value was made at
        self.same: dict[Node, Node] = {}  # old in-place/out= result -> the argument it returns
        self.converter = FakeConverter()
        self.origin: Node | None = None
        self.placeholders: dict[Node, Node] = {}  # old placeholder -> new placeholder
        self.items: dict[Node, list[Node | None]] = {}  # old rewritten call -> its getitems

    # -- reading and writing values ----------------------------------------------------------

    def resolve(self, n: Node) -> Node:
        while n in self.same:
            n = self.same[n]
        return n

    def read(self, n: Node) -> Node:
        n = self.resolve(n)
        root = self.root.get(n, n)
        if n is root or self.stamp.get(n) == self.version[root]:
            return self.value[n]
        chain = self.chain[n]
        parent = chain[-2] if len(chain) > 1 else root
        base = self.read(parent)
        fresh = self.emit(n.target, (base, *map(self.map_arg, n.args[1:])), self._map_kwargs(n))
        for key in _META_KEYS:  # regenerated for the output node, which has no source
            if key not in fresh.meta and key in n.meta:
                fresh.meta[key] = n.meta[key]
        self.value[n] = fresh
        self.stamp[n] = self.version[root]
        return fresh

    def map_arg(self, a: Any) -> Any:
        if isinstance(a, Node):
            return self.read(a)
        if isinstance(a, (list, tuple)):
            return _rebuild(a, [self.map_arg(x) for x in a])
        return a

    def _map_kwargs(self, n: Node) -> dict:
        return {k: self.map_arg(v) for k, v in n.kwargs.items()}

    def write(self, target: Node, new_value: Node) -> None:
        target = self.resolve(target)
        root = self.root.get(target, target)
        chain = self.chain.get(target, ())
        if chain:
            new_root = self._scatter_up(root, chain, new_value)
        else:
            new_root = new_value
        self.version[root] = self.version.get(root, 0) + 1
        self.value[root] = new_root
        if target is not root:
            self.value[target] = new_value
            self.stamp[target] = self.version[root]

    def _scatter_up(self, root: Node, chain: tuple[Node, ...], src: Node) -> Node:
        if not all(v.target in SCATTERS for v in chain):
            return self._as_strided_scatter(root, chain[-1], src)
        bases = [self.read(root)] + [self.read(v) for v in chain[:-1]]
        for view, base in zip(reversed(chain), reversed(bases)):
            rest = self.map_arg(tuple(view.args[1:]))
            target, args, kwargs = SCATTERS[view.target](view, base, src, rest)
            src = args[0] if target is None else self.emit(target, args, kwargs)
        return src

    def _as_strided_scatter(self, root: Node, view: Node, src: Node) -> Node:
        val = view.meta["val"]
        args = (self.read(root), src, list(val.shape), list(val.stride()), val.storage_offset())
        return self.emit(aten.as_strided_scatter.default, args, {})

    # -- emitting nodes ----------------------------------------------------------------------

    def emit(self, target: Any, args: tuple, kwargs: dict, val: Any = _COMPUTE) -> Node:
        node = self.new.create_node("call_function", target, args, kwargs, name=node_name(target))
        if self.origin is not None:
            for key in _META_KEYS:
                if key in self.origin.meta:
                    node.meta[key] = self.origin.meta[key]
        node.meta["val"] = self._compute_val(target, args, kwargs) if val is _COMPUTE else val
        return node

    def _compute_val(self, target: Any, args: tuple, kwargs: dict) -> Any:
        def val_of(a: Any) -> Any:
            if isinstance(a, Node):
                return a.meta["val"]
            if isinstance(a, (list, tuple)):
                return _rebuild(a, [val_of(x) for x in a])
            if isinstance(a, dict):
                return {k: val_of(v) for k, v in a.items()}
            return a

        if target is operator.getitem:
            return val_of(args[0])[args[1]]
        return run_fake(target, val_of(args), val_of(kwargs), self.converter)

    # -- the walk ---------------------------------------------------------------------------

    def run(self) -> Node:
        """Copy every node; returns the old output node (its args are mapped by the caller)."""
        for n in self.old.nodes:
            self.origin = n
            if n.op == "placeholder":
                self._placeholder(n)
            elif n.op == "output":
                return n
            elif n.op == "call_function":
                self._call(n)
            else:
                raise FunctionalizationError(f"unexpected {n.op} node {n.name} in a captured graph")
        raise FunctionalizationError("captured graph has no output node")

    def _placeholder(self, n: Node) -> None:
        new = self.new.placeholder(n.name)
        new.meta.update(n.meta)
        self.value[n] = new
        self.version[n] = 0
        self.placeholders[n] = new

    def _call(self, n: Node) -> None:
        if n.target in METADATA_MUTATIONS:
            raise FunctionalizationError(
                f"{n.target.name()} changes a tensor's shape in place, which export cannot "
                f"express functionally.\n  {n.meta.get('stack_trace', '')}\n"
                "Use the out-of-place form (e.g. x = x.unsqueeze(0)) instead."
            )
        if _needs_rewrite(n):
            self._mutation(n)
            return
        if n.target is operator.getitem and n.args[0] in self.items:
            self.value[n] = self.items[n.args[0]][n.args[1]]
            self.version[n] = 0
            return
        if n.target in TRANSPARENT and isinstance(n.args[0], Node):
            self.same[n] = n.args[0]  # same value, no node: torch drops these too
            return
        base = view_base(n)
        new = self.emit(
            n.target, self.map_arg(n.args), self._map_kwargs(n), n.meta.get("val", _COMPUTE)
        )
        self.value[n] = new
        if base is not None:
            base = self.resolve(base)
            root = self.root.get(base, base)
            self.root[n] = root
            self.chain[n] = self.chain.get(base, ()) + (n,)
            self.stamp[n] = self.version.setdefault(root, 0)
        else:
            self.version[n] = 0

    def _mutation(self, n: Node) -> None:
        if n.target is aten.copy_.default and self._whole_copy(n):
            # dst.copy_(src) over a whole tensor of the same metadata: dst's new value is src
            self.write(n.args[0], self.read(n.args[1]))
            self.same[n] = n.args[0]
            return
        rule = REWRITES.get(n.target, default_rewrite)
        rewrite = rule(n)
        if rewrite is None:  # value unchanged: the result is the argument
            self.same[n] = n.args[0]
            return
        new = self.emit(
            rewrite.target, self.map_arg(rewrite.args), self.map_arg_dict(rewrite.kwargs)
        )
        self.version[n] = 0
        items = self._items(n, new)
        # ``rrelu_with_noise`` returns one tensor; its functional variant returns it first,
        # then the new values of the written arguments: the result is item 0
        single = items and not isinstance(n.meta.get("val"), (tuple, list))
        self.value[n] = items[0] if single else new
        for written, index in rewrite.writes:
            self.write(written, new if index is None else items[index])
        if rewrite.result_alias is not None:
            self.same[n] = rewrite.result_alias

    def _items(self, n: Node, new: Node) -> list[Node | None]:
        """getitem nodes for every tensor output of a multi-output call, in index order (as
        torch names them); the old graph's getitems of ``n`` reuse them."""
        val = new.meta.get("val")
        if not isinstance(val, (tuple, list)):
            return []
        items = [
            self.emit(operator.getitem, (new, i), {}, v) if isinstance(v, torch.Tensor) else None
            for i, v in enumerate(val)
        ]
        self.items[n] = items
        return items

    def _whole_copy(self, n: Node) -> bool:
        dst, src = n.args[0], n.args[1]
        if not isinstance(src, Node) or self.chain.get(self.resolve(dst)):
            return False
        d, s = dst.meta.get("val"), src.meta.get("val")
        if not isinstance(d, torch.Tensor) or not isinstance(s, torch.Tensor):
            return False
        return d.shape == s.shape and d.dtype == s.dtype and d.device == s.device

    def map_arg_dict(self, kwargs: dict) -> dict:
        return {k: self.map_arg(v) for k, v in kwargs.items()}

    def mutated_placeholders(self) -> list[Mutation]:
        """Placeholders written to, in input order, with their final values."""
        found = []
        for old, new in self.placeholders.items():
            if self.version.get(old, 0) > 0:
                found.append(Mutation(new, self.read(old)))
        return found


def functionalize(old: Graph) -> tuple[Functionalizer, Node]:
    """Run the pass; returns it (new graph, value map, mutations) and the old output node."""
    pass_ = Functionalizer(old)
    out = pass_.run()
    return pass_, out
