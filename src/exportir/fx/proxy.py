"""Proxies and the tracer base class they report to.

Contract: a :class:`Proxy` stands for the value of one graph :class:`Node` during symbolic
tracing. Every operation applied to a proxy -- an operator, a ``torch.*`` call, a tensor
method, an attribute read followed by a call -- appends exactly one node to the tracer's
graph and returns a new proxy for it. Operations whose result must be a concrete Python value
(``bool``, ``len``, iteration) cannot be recorded and raise the same errors ``torch.fx`` does,
unless a tracer subclass overrides :meth:`TracerBase.to_bool` / :meth:`TracerBase.iter`.
"""

from __future__ import annotations

import collections
import copy
import dis
import enum
import functools
import linecache
import logging
import operator
import os
import sys
import traceback
import types
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import fields, is_dataclass
from typing import Any

import torch

from exportir.fx.codegen import magic_methods, reflectable_magic_methods
from exportir.fx.immutable_collections import immutable_dict, immutable_list
from exportir.fx.node import Argument, Node, Target, base_types
from exportir.fx.operator_schemas import check_for_mutable_operation

__all__ = [
    "Attribute",
    "GraphAppendingTracer",
    "MetaProxy",
    "ParameterProxy",
    "Proxy",
    "Scope",
    "ScopeContextManager",
    "TraceError",
    "TracerBase",
]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Scopes: which module a node was created in
# --------------------------------------------------------------------------------------------


class Scope:
    """The module path (``"sub.lin"``) and module type a node is recorded under."""

    def __init__(self, module_path: str, module_type: Any) -> None:
        super().__init__()
        self.module_path = module_path
        self.module_type = module_type


class ScopeContextManager:
    """Sets ``scope`` to ``current_scope``'s contents for the ``with`` body, then restores it.

    The ``scope`` object itself is mutated (not replaced) so holders of it see the change.
    """

    def __init__(self, scope: Scope, current_scope: Scope) -> None:
        super().__init__()
        self._saved = (scope.module_path, scope.module_type)
        scope.module_path = current_scope.module_path
        scope.module_type = current_scope.module_type
        self._scope = scope

    def __enter__(self) -> Scope:
        return self._scope

    def __exit__(self, *args: object) -> None:
        self._scope.module_path, self._scope.module_type = self._saved


# --------------------------------------------------------------------------------------------
# Stack traces
# --------------------------------------------------------------------------------------------

# Frames from these files are tracer machinery, never user code: recorded stack traces skip
# them. (Compared by exact filename.)
_TRACER_FILES: frozenset[str] = frozenset(
    {
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "proxy.py"),
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "tracer.py"),
        os.path.abspath(torch.__file__),
    }
)

# (filename, function name) pairs always kept when only "forward" frames are recorded.
_STACK_TRACE_ANCHORS: set[tuple[str, str]] = set()


def _register_stack_trace_anchor(fn: Callable[..., Any]) -> None:
    """Keep frames of ``fn`` in ``forward``-only stack traces."""
    code = getattr(fn, "__code__", None)
    if code is not None:
        _STACK_TRACE_ANCHORS.add((code.co_filename, code.co_name))


def _current_stack_summary() -> traceback.StackSummary:
    """The Python call stack, oldest frame first, without column markers."""
    frames: list[traceback.FrameSummary] = []
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        lineno = frame.f_lineno
        line = linecache.getline(code.co_filename, lineno).strip()
        frames.append(
            traceback.FrameSummary(code.co_filename, lineno, code.co_name, line=line)
        )
        frame = frame.f_back
    frames.reverse()
    return traceback.StackSummary.from_list(frames)


# --------------------------------------------------------------------------------------------
# TracerBase
# --------------------------------------------------------------------------------------------


class TracerBase:
    """Records nodes into ``self.graph``; subclasses decide how values become arguments."""

    graph: Any
    record_stack_traces: bool = False
    # With record_stack_traces: keep only frames named "forward" (plus registered anchors).
    _record_forward_stack_traces_only: bool = False
    check_mutable_operations: bool = False
    trace_asserts: bool = False
    proxy_buffer_attributes: bool = False
    traced_func_name: str = "forward"
    scope: Scope
    module_stack: OrderedDict[str, tuple[str, Any]]
    node_name_to_scope: dict[str, tuple[str, type]]

    def create_node(
        self,
        kind: str,
        target: Target,
        args: tuple[Argument, ...],
        kwargs: dict[str, Argument],
        name: str | None = None,
        type_expr: Any | None = None,
    ) -> Node:
        """Append a node to ``self.graph``, recording its scope, module stack and stack trace.

        Override to validate or rewrite nodes as they are created.
        """
        if kind == "call_function" and self.check_mutable_operations:
            check_for_mutable_operation(target, args, kwargs)
        node = self.graph.create_node(kind, target, args, kwargs, name, type_expr)
        scope = self.scope
        self.node_name_to_scope[node.name] = (scope.module_path, scope.module_type)
        if self.module_stack:
            node.meta["nn_module_stack"] = self.module_stack.copy()
        if self.record_stack_traces and not node.stack_trace:
            self._record_stack_trace(node)
        return node

    def _record_stack_trace(self, node: Node) -> None:
        summary = self._filter_traceback_frames(_current_stack_summary())
        if summary:
            node.stack_trace = "".join(summary.format()).strip()

    def _filter_traceback_frames(
        self, user_stack_summary: traceback.StackSummary
    ) -> traceback.StackSummary:
        """Keep the user's frames: from the first ``forward`` on, minus tracer machinery."""
        frames = list(user_stack_summary)
        if self._record_forward_stack_traces_only:
            kept = [f for f in frames if _is_forward_or_anchor(f)]
        else:
            first = next((i for i, f in enumerate(frames) if f.name == "forward"), None)
            kept = [] if first is None else frames[first:]
        kept = [f for f in kept if f.filename not in _TRACER_FILES]
        return traceback.StackSummary.from_list(kept)

    def proxy(self, node: Node) -> Proxy:
        """Wrap ``node`` in the proxy type this tracer hands out."""
        return Proxy(node, self)

    def create_proxy(
        self,
        kind: str,
        target: Target,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str | None = None,
        type_expr: Any | None = None,
        proxy_factory_fn: Callable[[Node], Proxy] | None = None,
    ) -> Proxy:
        """Lower ``args``/``kwargs`` with :meth:`create_arg`, create the node, wrap it.

        For ``placeholder`` nodes, ``args`` holds the parameter's default value, if any.
        """
        args_ = self.create_arg(args)
        kwargs_ = self.create_arg(kwargs)
        if not isinstance(args_, tuple):
            raise AssertionError(f"Expected args_ to be tuple, got {type(args_)}")  # noqa: TRY004  # torch.fx raises AssertionError
        if not isinstance(kwargs_, dict):
            raise AssertionError(f"Expected kwargs_ to be dict, got {type(kwargs_)}")  # noqa: TRY004  # as torch.fx
        node = self.create_node(kind, target, args_, kwargs_, name, type_expr)
        if proxy_factory_fn is None:
            return self.proxy(node)
        return proxy_factory_fn(node)

    def _find_user_frame(self) -> types.FrameType | None:
        """The innermost frame that is not tracer machinery (the user code being traced)."""
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename in _TRACER_FILES:
            frame = frame.f_back
        return frame

    def create_arg(self, a: Any) -> Argument:
        """Lower a traced value into something a node can hold as an argument.

        Proxies become their nodes; containers are lowered element-wise; plain constants pass
        through. Unsupported types raise ``NotImplementedError("argument of type: ...")``.
        Override to support more types.
        """
        lower = _ARG_LOWERING.get(type(a))
        if lower is not None:
            return lower(self, a)
        return _create_arg_slow(self, a)

    def to_bool(self, obj: Proxy) -> bool:
        """Called for ``bool(proxy)`` (control flow). Raises :class:`TraceError` by default."""
        raise TraceError("symbolically traced variables cannot be used as inputs to control flow")

    def iter(self, obj: Proxy) -> Iterator[Any]:
        """Called when a proxy is iterated. Raises :class:`TraceError` by default."""
        raise TraceError(
            "Proxy object cannot be iterated. This can be "
            "attempted when the Proxy is used in a loop or"
            " as a *args or **kwargs function argument. "
            "See the torch.fx docs on pytorch.org for a "
            "more detailed explanation of what types of "
            "control flow can be traced, and check out the"
            " Proxy docstring for help troubleshooting "
            "Proxy iteration errors"
        )

    def keys(self, obj: Proxy) -> Proxy:
        """Called for ``proxy.keys()`` (e.g. ``**proxy``); records a ``keys`` method call."""
        return Attribute(obj, "keys")()


def _is_forward_or_anchor(frame: traceback.FrameSummary) -> bool:
    return (
        frame.name == "forward"
        or frame.filename.endswith("torch/__init__.py")
        or (frame.filename, frame.name) in _STACK_TRACE_ANCHORS
    )


# --------------------------------------------------------------------------------------------
# Argument lowering table (create_arg)
# --------------------------------------------------------------------------------------------


def _refuse_node_key(arg: Any) -> Any:
    raise RuntimeError(
        f"Keys for dictionaries used as an argument cannot contain a Node. Got key: {arg}"
    )


def _lower_dict(tracer: TracerBase, a: dict[Any, Any]) -> dict[Any, Argument]:
    out: dict[Any, Argument] = {}
    for k, v in a.items():
        if not isinstance(k, str):
            k = tracer.create_arg(k)
            _walk_nodes(k, _refuse_node_key)
        out[k] = tracer.create_arg(v)
    return out


def _walk_nodes(a: Any, fn: Callable[[Node], Any]) -> None:
    """Call ``fn`` on every Node inside the (nested) argument ``a``."""
    if isinstance(a, Node):
        fn(a)
    elif isinstance(a, (tuple, list)):
        for x in a:
            _walk_nodes(x, fn)
    elif isinstance(a, dict):
        for x in a.values():
            _walk_nodes(x, fn)
    elif isinstance(a, slice):
        for x in (a.start, a.stop, a.step):
            _walk_nodes(x, fn)


def _lower_tuple(tracer: TracerBase, a: tuple[Any, ...]) -> tuple[Argument, ...]:
    return tuple([tracer.create_arg(x) for x in a])


def _lower_list(tracer: TracerBase, a: list[Any]) -> list[Argument]:
    return [tracer.create_arg(x) for x in a]


def _lower_slice(tracer: TracerBase, a: slice) -> slice:
    return slice(tracer.create_arg(a.start), tracer.create_arg(a.stop), tracer.create_arg(a.step))


def _lower_range(tracer: TracerBase, a: range) -> range:
    return range(tracer.create_arg(a.start), tracer.create_arg(a.stop), tracer.create_arg(a.step))


def _identity(tracer: TracerBase, a: Any) -> Any:
    return a


def _lower_proxy(tracer: TracerBase, a: Proxy) -> Node:
    return a.node


# Exact-type fast path; subclasses go through _create_arg_slow.
_ARG_LOWERING: dict[type, Callable[[TracerBase, Any], Argument]] = {
    **{t: _identity for t in (*base_types, type(None), type(...))},
    torch._ops.OpOverload: _identity,
    torch._ops.HigherOrderOperator: _identity,
    tuple: _lower_tuple,
    list: _lower_list,
    dict: _lower_dict,
    immutable_list: _lower_list,
    immutable_dict: _lower_dict,
}


def _is_opaque_value(a: Any) -> bool:
    try:
        from torch._library.opaque_object import is_opaque_value_type
    except ImportError:  # older torch: no opaque objects
        return False
    return is_opaque_value_type(type(a))


def _create_arg_slow(tracer: TracerBase, a: Any) -> Argument:
    """Lowering for types without an exact-type entry (subclasses, dataclasses, ...)."""
    if isinstance(a, Proxy):
        return a.node
    if hasattr(a, "__fx_create_arg__"):
        return a.__fx_create_arg__(tracer)
    if isinstance(a, tuple):
        elems = [tracer.create_arg(x) for x in a]
        return type(a)(*elems) if hasattr(a, "_fields") else type(a)(elems)
    if isinstance(a, list):
        return [tracer.create_arg(x) for x in a]
    if isinstance(a, dict):
        return _lower_dict(tracer, a)
    if isinstance(a, slice):
        return _lower_slice(tracer, a)
    if isinstance(a, range):
        return _lower_range(tracer, a)
    if isinstance(a, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
        return a
    if _is_opaque_value(a):
        return a
    if is_dataclass(a) and not isinstance(a, type):
        kwargs = {f.name: tracer.create_arg(getattr(a, f.name)) for f in fields(a)}
        return tracer.create_node("call_function", a.__class__, (), kwargs)
    if isinstance(a, (*base_types, enum.Enum)) or a is None or a is ...:
        return a
    raise NotImplementedError(f"argument of type: {type(a)}")


# --------------------------------------------------------------------------------------------
# Concrete tracers and errors
# --------------------------------------------------------------------------------------------


class GraphAppendingTracer(TracerBase):
    """A tracer that only appends to an existing graph (for proxies built outside tracing)."""

    def __init__(self, graph: Any) -> None:
        super().__init__()
        self.graph = graph
        self.scope = Scope("", None)
        self.module_stack = collections.OrderedDict()
        self.node_name_to_scope = {}


def assert_fn(x: object) -> None:
    """Target recorded for a traced ``assert`` (``TracerBase.trace_asserts``)."""
    if not x:
        raise AssertionError("Assertion failed")


class TraceError(ValueError):
    """A traced value was used where a concrete Python value is required."""


# --------------------------------------------------------------------------------------------
# Bytecode inspection of the caller (``__iter__`` unpacking, traced asserts)
# --------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=256)
def _instructions(code: types.CodeType) -> tuple[list[dis.Instruction], dict[int, int]]:
    """The code's instructions and an offset -> index map (bounded cache per code object)."""
    insts = list(dis.get_instructions(code))
    return insts, {inst.offset: i for i, inst in enumerate(insts)}


def _current_instruction(frame: types.FrameType) -> tuple[list[dis.Instruction], int]:
    """The instructions of ``frame``'s code and the index of the one executing now."""
    insts, index = _instructions(frame.f_code)
    idx = index.get(frame.f_lasti)
    if idx is None:  # f_lasti inside a multi-word instruction: take the next boundary
        idx = next(i for i, inst in enumerate(insts) if inst.offset >= frame.f_lasti)
    return insts, idx


def _is_traced_assert(frame: types.FrameType) -> bool:
    """Whether ``frame`` is evaluating the condition of an ``assert`` statement.

    Recognizes the ``POP_JUMP_IF_TRUE`` / ``AssertionError`` / ``RAISE_VARARGS`` shape only,
    exactly as torch.fx does (so on Python 3.11, whose jump opcodes are named differently,
    asserts are not traced and ``to_bool`` decides).
    """
    insts, cur = _current_instruction(frame)
    inst = insts[cur]
    if inst.opname != "POP_JUMP_IF_TRUE" or inst.arg is None:
        return False
    first = insts[cur + 1]
    last = insts[inst.arg // 2 - 1]
    starts_with_assert = (
        first.opname == "LOAD_GLOBAL" and first.argval == "AssertionError"
    ) or first.opname == "LOAD_ASSERTION_ERROR"
    return starts_with_assert and last.opname == "RAISE_VARARGS"


# --------------------------------------------------------------------------------------------
# Proxy
# --------------------------------------------------------------------------------------------


def _collect_tracers(a: Any, found: dict[Any, None], proxy_type: type) -> None:
    """Add the tracer of every ``proxy_type`` instance inside the nested value ``a``."""
    if isinstance(a, proxy_type):
        found[a.tracer] = None
    elif isinstance(a, (tuple, list)):
        for x in a:
            _collect_tracers(x, found, proxy_type)
    elif isinstance(a, dict):
        for x in a.values():
            _collect_tracers(x, found, proxy_type)


def _is_arbitrary_callable(obj: object) -> bool:
    kinds = (
        types.FunctionType,
        types.MethodType,
        types.BuiltinFunctionType,
        types.BuiltinMethodType,
        functools.partial,
    )
    return isinstance(obj, kinds)


def _find_arbitrary_callable(args: Any, kwargs: Any) -> Any:
    """The first plain Python callable nested in args/kwargs, or None."""
    stack: list[Any] = [args, kwargs]
    while stack:
        a = stack.pop(0)
        if _is_arbitrary_callable(a):
            return a
        if isinstance(a, (tuple, list)):
            stack[:0] = list(a)
        elif isinstance(a, dict):
            stack[:0] = list(a.values())
    return None


class Proxy:
    """A traced value: wraps a :class:`Node` and records every operation applied to it.

    Proxies cannot be iterated, converted to ``bool`` or measured with ``len`` during
    tracing (the value is unknown). Factor such logic into an ``fx.wrap``-ed function, or
    rewrite static loops as ``for i in range(n): proxied_value[i]``.

    ``Proxy(node)`` without a tracer appends to ``node.graph`` (graph-building outside tracing).
    """

    def __init__(self, node: Node, tracer: TracerBase | None = None) -> None:
        if tracer is None:
            tracer = GraphAppendingTracer(node.graph)
        self.tracer = tracer
        self.node = node

    def __repr__(self) -> str:
        return f"Proxy({self.node.name})"

    def __getattr__(self, k: str) -> Attribute:
        # Not recorded yet: a method call on the attribute becomes one call_method node.
        return Attribute(self, k)

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__ = d

    def __deepcopy__(self, memo: dict[int, Any]) -> Proxy:
        # Defined explicitly: otherwise lookup would reach __getattr__ and yield an Attribute.
        new_dict: dict[str, Any] = {}
        for k, v in self.__dict__.items():
            try:
                new_dict[k] = copy.deepcopy(v, memo)
            except Exception:  # noqa: BLE001  # any deepcopy failure falls back to a shallow copy
                log.warning(
                    "Shallow copy %s of Proxy because it cannot be deepcopied. "
                    "Proxy is created for node %s",
                    k,
                    self.node.name,
                )
                new_dict[k] = copy.copy(v)
        for required in ("node", "tracer"):
            if required not in new_dict:
                raise AssertionError(f"'{required}' not in new_dict during proxy unpickling")
        new_proxy = Proxy(new_dict["node"], new_dict["tracer"])
        new_proxy.__dict__.update(new_dict)
        return new_proxy

    def __call__(self, *args: Any, **kwargs: Any) -> Proxy:
        return self.tracer.create_proxy("call_method", "__call__", (self,) + args, kwargs)

    def __iter__(self) -> Iterator[Proxy]:
        caller = sys._getframe(1)
        insts, idx = _current_instruction(caller)
        inst = insts[idx]
        if inst.opname == "UNPACK_SEQUENCE":
            return (self[i] for i in range(inst.argval))
        return self.tracer.iter(self)

    def __abs__(self) -> Proxy:
        return self.tracer.create_proxy("call_function", operator.abs, (self,), {})

    def __bool__(self) -> bool:
        if self.tracer.trace_asserts and _is_traced_assert(sys._getframe(1)):
            self.tracer.create_proxy("call_function", assert_fn, (self,), {})
            return True
        return self.tracer.to_bool(self)

    def keys(self) -> Proxy:
        return self.tracer.keys(self)

    def __len__(self) -> int:
        raise RuntimeError(
            "'len' is not supported in symbolic tracing by default. If you want "
            "this call to be recorded, please call torch.fx.wrap('len') at "
            "module scope"
        )

    @classmethod
    def __torch_function__(
        cls,
        orig_method: Callable[..., Any],
        types: tuple[type, ...],
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> Proxy:
        """Record a ``torch.*`` call as call_function, a Tensor method as call_method."""
        args = args if args else ()
        kwargs = kwargs if kwargs else {}
        found: dict[Any, None] = {}
        _collect_tracers(args, found, cls)
        _collect_tracers(kwargs, found, cls)
        if len(found) > 1:
            raise RuntimeError(
                f"Found multiple different tracers {list(found.keys())} while "
                f"trying to trace operations {orig_method}"
            )
        tracer = next(iter(found))
        if isinstance(orig_method, torch._C.ScriptMethod):
            args = (orig_method.owner,) + args
            return tracer.create_proxy("call_method", orig_method.name, args, kwargs)
        if torch.overrides.is_tensor_method_or_property(orig_method):
            return tracer.create_proxy("call_method", orig_method.__name__, args, kwargs)
        if isinstance(orig_method, torch._ops.HigherOrderOperator):
            _refuse_callable_operand(orig_method, args, kwargs)
        name = tracer.graph._target_to_str(orig_method.__name__)
        return tracer.create_proxy("call_function", orig_method, args, kwargs, name=name)


def _refuse_callable_operand(op: Any, args: Any, kwargs: Any) -> None:
    bad = _find_arbitrary_callable(args, kwargs)
    if bad is not None:
        raise RuntimeError(
            f"Unable to symbolically trace the HigherOrderOperator "
            f"{op._name} because it received an arbitrary "
            f"callable argument {bad}. Use make_fx or dynamo "
            f"tracing instead."
        )


class MetaProxy(Proxy):
    """A proxy that also computes ``node.meta['val']`` by running the op under ``fake_mode``."""

    def __init__(self, node: Node, tracer: TracerBase | None = None, fake_mode: Any = None):
        super().__init__(node, tracer)
        self.fake_mode = fake_mode

    def __repr__(self) -> str:
        return f"MetaProxy({self.node.name})"

    @classmethod
    def __torch_function__(
        cls,
        orig_method: Callable[..., Any],
        types: tuple[type, ...],
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> MetaProxy:
        args = args if args else ()
        kwargs = kwargs if kwargs else {}
        meta_proxy = next((a for a in args if isinstance(a, MetaProxy)), None)
        if meta_proxy is None:
            raise AssertionError("No MetaProxy found in arguments, but one is expected.")
        proxy = super().__torch_function__(orig_method, types, args, kwargs)
        values = [a.node.meta["val"] if isinstance(a, Proxy) else a for a in args]
        with meta_proxy.fake_mode:
            proxy.node.meta["val"] = orig_method(*values, **kwargs)
        return MetaProxy(proxy.node, proxy.tracer, meta_proxy.fake_mode)


class Attribute(Proxy):
    """``root.attr`` during tracing: a getattr node created only if the value itself is used.

    Calling it records a single ``call_method`` node instead (the common ``x.relu()`` case).
    """

    def __init__(self, root: Proxy, attr: str) -> None:
        self.root = root
        self.attr = attr
        self.tracer = root.tracer
        self._node: Node | None = None

    @property
    def node(self) -> Node:  # type: ignore[override]  # lazily created, read-only
        if self._node is None:
            self._node = self.tracer.create_proxy(
                "call_function", getattr, (self.root, self.attr), {}
            ).node
        return self._node

    def __call__(self, *args: Any, **kwargs: Any) -> Proxy:
        return self.tracer.create_proxy("call_method", self.attr, (self.root,) + args, kwargs)


class ParameterProxy(Proxy):
    """A parameter's proxy whose shape queries (``shape``, ``size()``, ``dim()``, ``ndim``,
    ``numel()``, ``nelement()``) return the real values, so shape checks can branch."""

    def __init__(self, tracer: TracerBase, node: Node, name: str, param: torch.nn.Parameter):
        super().__init__(node, tracer)
        if not isinstance(param, torch.nn.Parameter):
            raise AssertionError(f"Expected Parameter, got {type(param)}")  # noqa: TRY004  # as torch.fx
        self.param = param
        self.name = name

    def __repr__(self) -> str:
        return f"ParameterProxy({self.name})"

    @property
    def shape(self) -> torch.Size:
        return self.param.shape

    def size(self) -> torch.Size:
        return self.param.size()

    def dim(self) -> int:
        return self.param.dim()

    @property
    def ndim(self) -> int:
        return self.param.ndim

    def numel(self) -> int:
        return self.param.numel()

    def nelement(self) -> int:
        return self.param.nelement()


# --------------------------------------------------------------------------------------------
# Operator overloads on Proxy, generated from one table
# --------------------------------------------------------------------------------------------

# ``operator`` function names recorded by Proxy's dunder methods: the codegen's tables (one
# source for what Proxy records and how the code prints it). The reflectable ones also get
# ``__r<name>__`` (arguments swapped). "div" has no ``operator`` function on Python 3; the
# dunders exist for parity and fail with AttributeError if ever called.
_REFLECTABLE_OPS: tuple[str, ...] = tuple(reflectable_magic_methods)
_MAGIC_OPS: tuple[str, ...] = tuple(m for m in magic_methods if m not in reflectable_magic_methods)


def _dunder(op_name: str, reflected: bool = False) -> str:
    core = op_name.strip("_")
    return f"__r{core}__" if reflected else f"__{core}__"


def _make_forward_op(op_name: str) -> Callable[..., Proxy]:
    def impl(*args: Any, **kwargs: Any) -> Proxy:
        target = getattr(operator, op_name)
        return args[0].tracer.create_proxy("call_function", target, args, kwargs)

    impl.__name__ = op_name
    return impl


def _make_reflected_op(op_name: str) -> Callable[[Proxy, Any], Proxy]:
    def impl(self: Proxy, rhs: Any) -> Proxy:
        target = getattr(operator, op_name)
        return self.tracer.create_proxy("call_function", target, (rhs, self), {})

    impl.__name__ = impl.__qualname__ = _dunder(op_name, reflected=True)
    return impl


def _install_operator_overloads(cls: type) -> None:
    for op_name in _MAGIC_OPS + _REFLECTABLE_OPS:
        setattr(cls, _dunder(op_name), _make_forward_op(op_name))
    for op_name in _REFLECTABLE_OPS:
        setattr(cls, _dunder(op_name, reflected=True), _make_reflected_op(op_name))


_install_operator_overloads(Proxy)

# Exact ``Proxy`` instances take the table's fast path too (subclasses use the slow path).
_ARG_LOWERING[Proxy] = _lower_proxy
