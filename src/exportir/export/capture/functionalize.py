"""Functionalization: a recorded graph with mutations -> the same program without them.

Input: the graph capture recorded, where in-place ops (``add_``), ``out=`` ops and ops with
mutable arguments (``_native_batch_norm_legit``) write into tensors, possibly through views
(``x[0].add_(1)``, ``x.view(-1).mul_(2)``), and in-place view ops change a tensor's layout
(``y.unsqueeze_(0)``, ``y.t_()``, ATen's own ``as_strided_``, ``resize_``, ``set_``). Output: a
new graph where

- every mutating op is replaced by its functional variant (``add_`` -> ``add``, ``add.out`` ->
  ``add.Tensor``, ``_native_batch_norm_legit`` -> ``_native_batch_norm_legit_functional``);
- every tensor is its storage plus the view steps leading to it from the storage's base value
  (torch's FunctionalTensorWrapper with its ViewMeta list, _view_steps.py). An in-place view op
  appends a step: after ``y.unsqueeze_(0)``, ``y`` is ``unsqueeze(y as it was)`` of the same
  storage, and stays one for every later read and write;
- a write through a view goes back to the storage's base through the inverse of each step
  (``select_scatter``, ``slice_scatter``, ``squeeze`` for ``unsqueeze``...; torch's inverses),
  the written view is regenerated from the new base at once, and any other alias read later
  replays its whole chain from the new base, as torch does;
- the final values of mutated buffers and user inputs are returned as extra outputs, placed
  before the user outputs in input order (BUFFER_MUTATION, USER_INPUT_MUTATION), like torch.export.

Views of unmutated tensors stay views, as the ATen dialect allows. Changing the shape of a graph
input or buffer in place is refused (torch.export cannot lower it either).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from exportir.export.capture._node_meta import node_name
from exportir.export.capture._view_steps import ViewStep, invertible, scatter_back
from exportir.export.capture.fake import FakeConverter, run_fake
from exportir.fx import Graph, Node

aten = torch.ops.aten

_META_KEYS = ("stack_trace", "nn_module_stack", "source_fn_stack")
_COMPUTE = object()  # emit(): compute the node's ``val`` on fakes
# meta key of a functional node that replaced an in-place op on a whole computed value: the op
INPLACE_OF = "inplace_of"


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
            if not _is_default(a, bound[a.name]):  # torch leaves defaults out too
                kwargs[a.name] = bound[a.name]
        else:
            args.append(bound[a.name])
    return tuple(args), kwargs


def _is_default(arg: Any, value: Any) -> bool:
    if not arg.has_default_value() or isinstance(value, Node):
        return False
    default = arg.default_value
    return type(value) is type(default) and value == default


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

def _needs_rewrite(node: Node) -> bool:
    return node.target in REWRITES or bool(_written_args(node.target))


@cache
def inplace_view_target(func: Any) -> Any:
    """The view op an in-place view op applies (``unsqueeze_`` -> ``unsqueeze``,
    ``as_strided_`` -> ``as_strided``), or None when ``func`` is not one."""
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.name.endswith("_") or _written_args(func) != (0,):
        return None
    try:
        variant = functional_variant(func)
    except FunctionalizationError:
        return None
    return variant if _is_view_op(variant) else None


def _rebuild(like: list | tuple, items: list) -> list | tuple:
    """A plain list or tuple (fx's immutable containers are not accepted by ATen ops)."""
    return items if isinstance(like, list) else tuple(items)


# --- the pass ------------------------------------------------------------------------------


class _Alias:
    """One tensor of the captured graph (torch's FunctionalTensorWrapper): the storage it lives
    in (named by the node that made the storage), the view steps from the storage's base value
    to it (an in-place view op extends them), its current layout ``val`` (a fake), and the new
    node holding its value as of storage version ``version``."""

    __slots__ = ("chain", "owner", "val", "value", "version")

    def __init__(
        self, owner: Node, chain: tuple[ViewStep, ...], val: Any, value: Node, version: int
    ) -> None:
        self.owner, self.chain, self.val = owner, chain, val
        self.value, self.version = value, version

    def like(self) -> _Alias:
        """Another tensor over the same view of the same storage (``alias``, ``detach``)."""
        return _Alias(self.owner, self.chain, self.val, self.value, self.version)


Describe = Callable[[Node], str]


def _describe_input(placeholder: Node) -> str:
    return f"graph input '{placeholder.name}'"


class Functionalizer:
    """Copies ``old`` into a new graph, replacing mutations by values (see module docstring).

    ``describe`` names a placeholder of ``old`` in error messages (``"buffer 'running_mean'"``).
    """

    def __init__(self, old: Graph, describe: Describe | None = None) -> None:
        self.old = old
        self.new = Graph()
        self.alias: dict[Node, _Alias] = {}  # old node -> its storage and view steps
        self.version: dict[Node, int] = {}  # storage (its owner node) -> number of writes so far
        self.base: dict[Node, Node] = {}  # storage (its owner node) -> new node of its value
        self.same: dict[Node, Node] = {}  # old in-place/out= result -> the argument it returns
        self.converter = FakeConverter()
        self.origin: Node | None = None
        self.placeholders: dict[Node, Node] = {}  # old placeholder -> new placeholder
        self.items: dict[Node, list[Node | None]] = {}  # old rewritten call -> its getitems
        self.describe = describe or _describe_input

    # -- reading and writing values ----------------------------------------------------------

    def resolve(self, n: Node) -> Node:
        while n in self.same:
            n = self.same[n]
        return n

    def read(self, n: Node) -> Node:
        """The new node holding ``n``'s current value; a view of a storage written since it
        was last read is regenerated from the storage's value (its whole chain, as torch)."""
        n = self.resolve(n)
        alias = self.alias[n]
        version = self.version[alias.owner]
        if alias.version != version:
            origin = self.origin
            if origin is None or origin.op == "output":  # replayed for the output: the view's
                self.origin = n  # own source line and module
            try:
                alias.value = self._replay(alias.owner, alias.chain)
            finally:
                self.origin = origin
            alias.version = version
        return alias.value

    def _replay(self, owner: Node, chain: tuple[ViewStep, ...]) -> Node:
        value = self.base[owner]
        for step in chain:
            value = self._apply(step, value)
        return value

    def _apply(self, step: ViewStep, base: Node, val: Any = _COMPUTE) -> Node:
        args = (base, *self.map_arg(step.args))
        return self.emit(step.target, args, self.map_arg_dict(step.kwargs), val)

    def map_arg(self, a: Any) -> Any:
        if isinstance(a, Node):
            return self.read(a)
        if isinstance(a, (list, tuple)):
            return _rebuild(a, [self.map_arg(x) for x in a])
        return a

    def map_arg_dict(self, kwargs: dict) -> dict:
        return {k: self.map_arg(v) for k, v in kwargs.items()}

    def write(self, target: Node, new_value: Node) -> None:
        alias = self.alias[self.resolve(target)]
        owner, chain = alias.owner, alias.chain
        new_base = self._scatter_up(owner, chain, new_value) if chain else new_value
        self.version[owner] += 1
        self.base[owner] = new_base
        if chain:  # the written view is regenerated from the new base at once, as torch does
            self.read(target)

    def _scatter_up(self, owner: Node, chain: tuple[ViewStep, ...], src: Node) -> Node:
        if not invertible(chain):
            return self._as_strided_scatter(owner, chain[-1], src)
        bases = [self.base[owner]]  # the views between are made afresh, as torch does
        for step in chain[:-1]:
            bases.append(self._apply(step, bases[-1]))
        return scatter_back(self.emit, chain, bases, src, self.map_arg)

    def _as_strided_scatter(self, owner: Node, step: ViewStep, src: Node) -> Node:
        val = step.val
        size, stride = list(val.shape), list(val.stride())
        args = (self.base[owner], src, size, stride, val.storage_offset())
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
                if not _autograd_saved_input(n):
                    self._call(n)
            else:
                raise FunctionalizationError(f"unexpected {n.op} node {n.name} in a captured graph")
        raise FunctionalizationError("captured graph has no output node")

    def _own(self, n: Node, new: Node) -> None:
        """``n`` is a fresh value in a storage of its own, held by ``new``."""
        self.alias[n] = _Alias(n, (), n.meta.get("val"), new, 0)
        self.version[n] = 0
        self.base[n] = new

    def _placeholder(self, n: Node) -> None:
        new = self.new.placeholder(n.name)
        new.meta.update(n.meta)
        self._own(n, new)
        self.placeholders[n] = new

    def _call(self, n: Node) -> None:
        layout_rule = LAYOUT_RULES.get(n.target)
        if layout_rule is not None:
            layout_rule(self, n)
            return
        view_target = None if n.target in REWRITES else inplace_view_target(n.target)
        if view_target is not None:
            self._inplace_view(n, view_target)
            return
        if _needs_rewrite(n):
            self._mutation(n)
            return
        if n.target is operator.getitem and n.args[0] in self.items:
            self._own(n, self.items[n.args[0]][n.args[1]])
            return
        if n.target in TRANSPARENT and isinstance(n.args[0], Node):
            base = self.alias[self.resolve(n.args[0])]  # same value, no node: torch drops these
            self.alias[n] = base.like()
            return
        self._copy(n)

    def _copy(self, n: Node) -> None:
        """An op without mutation; a view joins its base's storage."""
        base = view_base(n)
        val = n.meta.get("val", _COMPUTE)
        new = self.emit(n.target, self.map_arg(n.args), self.map_arg_dict(n.kwargs), val)
        if base is None:
            self._own(n, new)
            return
        of = self.alias[self.resolve(base)]
        step = ViewStep(n.target, tuple(n.args[1:]), dict(n.kwargs), of.val, n.meta.get("val"))
        chain = of.chain + (step,)
        version = self.version[of.owner]
        # torch's view of a storage written before starts out of date: its first use replays
        # the chain from the storage's value, and the view made here is left dead (the same
        # nodes, so the same name counters, as torch)
        self.alias[n] = _Alias(of.owner, chain, step.val, new, version if version == 0 else -1)

    # -- in-place changes of a tensor's layout ------------------------------------------------

    def _inplace_view(self, n: Node, target: Any) -> None:
        """``y.unsqueeze_(0)``: from now on ``y`` is ``unsqueeze(y as it was)``, a view of the
        same storage (torch's functionalization appends a ViewMeta to ``y``)."""
        self._push_step(n, target, tuple(n.args[1:]), dict(n.kwargs))

    def _push_step(self, n: Node, target: Any, args: tuple, kwargs: dict) -> None:
        """``n`` changed the layout of its first argument ``y`` in place: ``y`` is now
        ``target(y as it was, *args, **kwargs)``."""
        y = self.resolve(n.args[0])
        self._check_not_input(n, y)
        alias = self.alias[y]
        step = ViewStep(target, args, kwargs, alias.val, n.meta["val"])
        new = self._apply(step, self.read(y), step.val)
        alias.chain = alias.chain + (step,)
        alias.val = new.meta["val"]
        alias.value, alias.version = new, self.version[alias.owner]
        self.same[n] = y

    def _check_not_input(self, n: Node, y: Node) -> None:
        if y not in self.placeholders:
            return
        raise FunctionalizationError(
            f"{n.target.name()} changes the shape of {self.describe(y)} in place.\n"
            f"  {n.meta.get('stack_trace', '')}\n"
            "An exported program cannot change the shape or strides of its inputs and buffers "
            "(torch.export cannot lower this either). Use the out-of-place form and keep the "
            "result in a new variable (e.g. y = x.unsqueeze(0) instead of x.unsqueeze_(0))."
        )

    def _resize(self, n: Node) -> None:
        """``resize_``: a view (``as_strided`` with the new layout) while the storage is large
        enough, else the functional ``resize`` replaces the storage, as torch does."""
        y = self.resolve(n.args[0])
        self._check_not_input(n, y)
        val = n.meta.get("val")
        layout = (*val.shape, *val.stride(), val.storage_offset())
        if not all(isinstance(s, int) for s in layout):
            raise FunctionalizationError(
                f"resize_ to a symbolic size cannot be exported.\n  {n.meta.get('stack_trace', '')}"
                "\nUse an out-of-place op that makes the tensor you need (reshape, new_empty)."
            )
        size, stride = list(val.shape), list(val.stride())
        alias = self.alias[y]
        room = self.base[alias.owner].meta["val"].numel()
        if val.storage_offset() + val.numel() <= room:
            self._push_step(n, aten.as_strided.default, (size, stride), {})
            return
        if alias.chain:
            raise FunctionalizationError(
                f"resize_ grows a view of another tensor, which export cannot express.\n"
                f"  {n.meta.get('stack_trace', '')}\nResize a tensor of its own (y = y.clone()) or "
                "make a new one of the size you need (y.new_empty(size))."
            )
        self.write(y, self.emit(aten.resize.default, (self.read(y), size), {}))
        self.same[n] = y

    def _set_source(self, n: Node) -> None:
        """``y.set_(src)``: ``y`` becomes another tensor over ``src``'s storage and view, so
        later writes through either reach both (torch's ``set__impl``)."""
        y = self.resolve(n.args[0])
        self._check_not_input(n, y)
        self.alias[y] = self.alias[self.resolve(n.args[1])].like()
        self.same[n] = y

    def _set_empty(self, n: Node) -> None:
        """``y.set_()``: ``y`` becomes an empty tensor of its own (the functional ``set``)."""
        y = self.resolve(n.args[0])
        self._check_not_input(n, y)
        if self.alias[y].chain:
            raise FunctionalizationError(
                f"set_() empties a view of another tensor, which export cannot express.\n"
                f"  {n.meta.get('stack_trace', '')}\n"
                "Make a new empty tensor instead (y = y.new_empty(0))."
            )
        self._mutation(n)

    # -- value mutations --------------------------------------------------------------------

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
        if self._writes_a_fresh_value(n, rewrite):
            new.meta[INPLACE_OF] = n.target
        items = self._items(n, new)
        # ``rrelu_with_noise`` returns one tensor; its functional variant returns it first,
        # then the new values of the written arguments: the result is item 0
        single = items and not isinstance(n.meta.get("val"), (tuple, list))
        self._own(n, items[0] if single else new)
        for written, index in rewrite.writes:
            self.write(written, new if index is None else items[index])
        if rewrite.result_alias is not None:
            self.same[n] = rewrite.result_alias

    def _writes_a_fresh_value(self, n: Node, rewrite: Rewrite) -> bool:
        """``n`` is an in-place op (``add_``) on a whole value the graph computed (no view, no
        input): the re-trace re-runs it in place when a decomposition made that value a view
        (capture/_redecide.py)."""
        if rewrite.result_alias is None or not n.target._schema.name.endswith("_"):
            return False
        alias = self.alias.get(self.resolve(rewrite.result_alias))
        return alias is not None and not alias.chain and alias.owner.op == "call_function"

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
        if not isinstance(src, Node):
            return False
        d_alias = self.alias[self.resolve(dst)]
        if d_alias.chain:
            return False
        d, s = d_alias.val, self.alias[self.resolve(src)].val
        if not isinstance(d, torch.Tensor) or not isinstance(s, torch.Tensor):
            return False
        return d.shape == s.shape and d.dtype == s.dtype and d.device == s.device

    def output(self, values: tuple) -> Node:
        """The new graph's output node, returning ``values`` (new nodes / literals)."""
        return self.new.output(values)

    def mutated_placeholders(self) -> list[Mutation]:
        """Placeholders written to, in input order, with their final values."""
        found = []
        for old, new in self.placeholders.items():
            if self.version.get(old, 0) > 0:
                found.append(Mutation(new, self.read(old)))
        return found


# ops changing a tensor's layout in place that are not in-place view ops (keyed by op)
LAYOUT_RULES: dict[Any, Callable[[Functionalizer, Node], None]] = {
    aten.resize_.default: Functionalizer._resize,
    aten.set_.source_Tensor: Functionalizer._set_source,
    aten.set_.default: Functionalizer._set_empty,
}


def needs_functionalization(graph: Graph) -> bool:
    """Whether :func:`functionalize` would change ``graph`` beyond copying it: some node writes
    (in-place, ``out=``, mutable arguments, layout changes), is dropped (``lift_fresh``), or is
    not a call the pass copies."""
    for n in graph.nodes:
        if n.op != "call_function":
            if n.op in ("placeholder", "output"):
                continue
            return True  # (the pass reports it)
        target = n.target
        if target in REWRITES or target in TRANSPARENT or _written_args(target):
            return True
    return False


class Unchanged:
    """What a graph with nothing to functionalize becomes: itself (each node its own value).

    Has the parts of :class:`Functionalizer` the finalizers read. Stands for the copy the pass
    would make only where the copy would name every node as it is named now: the graph's
    nodes were created in graph order (appended), with the names the pass gives
    (``node_name(target)``)."""

    def __init__(self, graph: Graph) -> None:
        self.new = graph
        self.placeholders = {n: n for n in graph.find_nodes(op="placeholder")}
        self.version: dict[Node, int] = {}

    def read(self, n: Node) -> Node:
        return n

    def map_arg(self, a: Any) -> Any:
        if isinstance(a, (list, tuple)):
            return _rebuild(a, [self.map_arg(x) for x in a])
        return a

    def output(self, values: tuple) -> Node:
        out = self.new.output_node()
        out.args = (values,)
        return out


def functionalize(old: Graph, describe: Describe | None = None) -> tuple[Functionalizer, Node]:
    """Run the pass; returns it (new graph, value map, mutations) and the old output node.
    ``describe`` names placeholders in error messages."""
    pass_ = Functionalizer(old, describe)
    out = pass_.run()
    return pass_, out


def _autograd_saved_input(n: Node) -> bool:
    """``n`` is a tensor autograd makes around an in-place op on a tensor requiring grad:
    the copy of the op's input its backward needs (an unused ``clone`` of the tensor the next
    node writes: ``silu_``), the result it saves (an unused ``detach`` of the node before:
    ``relu``, ``sigmoid``), or the alias of the base it re-records history on after writing
    through a view (an unused ``alias`` of the written view's base, right after the write).
    Capture runs below autograd, so it records them; torch.export, tracing above autograd,
    never sees them. Dropping them here (they are dead code either way) keeps the name
    counters of the nodes after them equal to torch's."""
    if n.users or not n.args or not isinstance(n.args[0], Node):
        return False
    val = n.args[0].meta.get("val")
    if not (isinstance(val, torch.Tensor) and val.requires_grad):  # autograd saves nothing
        return False
    if n.target is aten.clone.default:
        return writes_in_place(n.next) and n.next.args[0] is n.args[0]
    if n.target is aten.alias.default:
        prev = n.prev
        return writes_in_place(prev) and view_base(prev.args[0]) is n.args[0]
    if n.target is aten.detach.default:  # the result saved for backward (recorder.py)
        return made_by(n.prev, n.args[0])
    return False


def made_by(n: Node, value: Node) -> bool:
    """``value`` is what node ``n`` just made: its result, or the input it wrote in place."""
    return n is value or (writes_in_place(n) and n.args[0] is value)


def writes_in_place(n: Node) -> bool:
    if n.op != "call_function" or not n.args or not isinstance(n.args[0], Node):
        return False
    schema = getattr(n.target, "_schema", None)
    return schema is not None and schema.name.endswith("_") and _written_args(n.target) == (0,)
