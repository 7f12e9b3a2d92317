"""One code generation run: the :class:`_Emitter` that renders a graph's nodes into source.

Contract: ``_Emitter(codegen, root_module, namespace, options).run(nodes)`` returns the
:class:`PythonCode` of ``nodes``, asking ``codegen`` (a :class:`CodeGen`) for the signature,
the return statement and extra globals. Each opcode has one rendering method, found through
the ``_OP_HANDLERS`` table. Node and global names are created in ``namespace`` in the order
the text is written, which is what makes the output identical to torch.fx's.

Only ``CodeGen._gen_python_code`` drives an emitter; this module builds on ``codegen``'s
vocabulary (operator tables, custom builtins, ``PythonCode``), never the other way round.
"""

from __future__ import annotations

import enum
import os
import pprint
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch._library.opaque_object import get_opaque_obj_repr, is_opaque_value_type
from torch.types import py_sym_types
from torch.utils._dtype_abbrs import dtype_abbrs

from exportir.fx.codegen import (
    _COUNTER,
    CodeGen,
    PythonCode,
    _color_fns,
    _custom_builtins,
    _format_target,
    _identity,
    _is_from_exportir_fx,
    _is_from_torch,
    _NamespaceRepr,
    _parse_stack_trace,
    inplace_methods,
    magic_methods,
)
from exportir.fx.namespace import _Namespace
from exportir.fx.printer import _get_qualified_name, _type_repr

# Pre-PEP585 generic aliases print with the ``typing`` name of their origin.
_ORIGIN_TYPE_MAP: dict[type, Any] = {
    list: typing.List,  # noqa: UP006  # torch.fx prints typing.List[...]
    dict: typing.Dict,  # noqa: UP006
    set: typing.Set,  # noqa: UP006
    frozenset: typing.FrozenSet,  # noqa: UP006
    tuple: typing.Tuple,  # noqa: UP006
}
# Values whose generated text is simply ``repr(value)``.
_PLAIN_REPR_TYPES = frozenset({int, float, bool, str, complex, type(None)})
_UNSTRIDED_LAYOUTS = (torch.sparse_csc, torch.sparse_csr)
_RECORDED_OPS = frozenset({"call_function", "call_method", "call_module"})
_MISSING = object()


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "0") == "1"


@dataclass(frozen=True, slots=True)
class _Options:
    """Rendering switches of one run (the ``FX_GRAPH_SHOW_*`` environment flags folded in)."""

    verbose: bool
    include_stride: bool
    include_device: bool
    include_meta: bool
    colored: bool
    expanded_def: bool
    record_func: bool
    additional_meta: list[str] | None

    @classmethod
    def make(cls, *, include_stride: bool, include_device: bool, **kw: Any) -> _Options:
        return cls(
            include_stride=include_stride or _env_flag("FX_GRAPH_SHOW_STRIDE"),
            include_device=include_device or _env_flag("FX_GRAPH_SHOW_DEVICE"),
            include_meta=_env_flag("FX_GRAPH_SHOW_META"),
            **kw,
        )


def _shape_str(shape: Any) -> str:
    return f"[{', '.join([str(x) for x in shape])}]"


def _class_names(obj: object) -> set[str]:
    return {c.__name__ for c in type(obj).__mro__}


def _is_tensor_type(o: object) -> bool:
    """``TensorType[...]`` annotations (gradual typing) carry their arguments in ``dims``."""
    return type(o).__name__ == "TensorType" and hasattr(o, "dims")


def _values_to_free(nodes: list[Any]) -> dict[Any, list[Any]]:
    """For each node, the values to release right after it runs: the inputs whose last use it
    is, then the node itself when nothing uses it (it runs only for its side effect)."""
    seen: set[Any] = set()
    by_user: dict[Any, list[Any]] = {}
    for node in reversed(nodes):
        for inp in node._input_nodes:
            if inp not in seen:
                seen.add(inp)
                by_user.setdefault(node, []).append(inp)
    for node in nodes:
        if not node.users and node.op not in ("placeholder", "output"):
            by_user.setdefault(node, []).append(node)
    return by_user


class _Emitter:
    """State of one code generation run: globals, free variables and the body being written.

    Node names and global names share ``namespace`` and are created in the order the text is
    written, which is what makes the output identical to torch.fx's.
    """

    def __init__(
        self, codegen: CodeGen, root_module: str, namespace: _Namespace, options: _Options
    ) -> None:
        from exportir.fx.node import Node

        self.codegen = codegen
        self.root_module = root_module
        self.namespace = namespace
        self.opts = options
        self.decorated = options.verbose or options.expanded_def or options.include_meta
        self.node_cls = Node
        self.free_vars: list[str] = []
        self.body: list[str] = []
        self.globals: dict[str, Any] = {}
        self.wrapped_fns: dict[str, None] = {}
        self.return_annotation = ""
        self.prev_summary: str | None = None
        self.function_plans: dict[Any, tuple[str, str]] = {}
        # repr(node) memoized: the namespace returns the same name on every call anyway
        self.names: dict[Any, str] = {}
        self.node_starts: list[int] = []  # body index where each node's text begins
        paint = _color_fns.get if options.colored else (lambda _name: _identity)
        self.red, self.blue, self.dim = paint("red"), paint("blue"), paint("dim")
        self.dim_blue, self.dim_green = paint("dim_blue"), paint("dim_green")
        for name, builtin in _custom_builtins.items():
            if self.add_global(name, builtin.obj) != name:
                # one object registered under two builtin names; the reserved-name table
                # keeps graph values off the alias
                self.globals[name] = builtin.obj

    # -- globals and values

    def add_global(self, name_hint: str, obj: Any) -> str:
        """The name generated code uses for ``obj``; torch objects keep their qualified name,
        and so do exportir.fx's own (through the ``exportir`` package global)."""
        if _is_from_torch(obj) and obj != torch.device:
            return _get_qualified_name(obj)
        if _is_from_exportir_fx(obj):
            return self._exportir_global() + _get_qualified_name(obj)[len("exportir"):]
        name = self.namespace.create_name(name_hint, obj)
        known = self.globals.get(name, _MISSING)
        if known is _MISSING:
            self.globals[name] = obj
        elif known != obj:
            raise AssertionError(f"Global name {name} already assigned to different object")
        return name

    def type_repr(self, o: Any) -> str:
        """A type annotation as source text, registering the globals it refers to."""
        if o == ():
            return "()"  # the empty tuple of Tuple[()]
        typename = _type_repr(o)
        if isinstance(o, types.UnionType) and "|" in typename:
            return "|".join(self.type_repr(a) for a in typing.get_args(o))
        origin = getattr(o, "__origin__", None)
        if not origin:
            return self.add_global(typename, o)
        if isinstance(o, typing._GenericAlias):  # type: ignore[attr-defined]  # pre-PEP585 alias
            origin = _ORIGIN_TYPE_MAP.get(origin, origin)
        origin_name = self.add_global(_type_repr(origin), origin)
        type_args = o.dims if _is_tensor_type(o) else typing.get_args(o)
        if not type_args:
            return origin_name
        return f"{origin_name}[{','.join(self.type_repr(a) for a in type_args)}]"

    def repr_arg(self, arg: Any) -> str:
        """An argument as a Python expression (nodes by name, containers recursively)."""
        cls = type(arg)
        if cls is self.node_cls:
            return self.names.get(arg) or self.name_of(arg)
        if cls in _PLAIN_REPR_TYPES:
            return self.blue(repr(arg))
        if isinstance(arg, self.node_cls):
            return self.name_of(arg)
        if isinstance(arg, tuple) and hasattr(arg, "_fields"):
            cls_name = self.add_global(_get_qualified_name(type(arg)), type(arg))
            return f"{cls_name}{tuple(arg)!r}"
        if isinstance(arg, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
            return self.add_global(_get_qualified_name(arg), arg)
        if isinstance(arg, enum.Enum):
            return f"{self.add_global(arg.__class__.__name__, arg.__class__)}.{arg.name}"
        if isinstance(arg, torch.Tensor):
            dtype = str(arg.dtype).split(".")[-1]
            return f"torch.Tensor(size={list(arg.size())}, dtype={dtype})"
        if isinstance(arg, tuple):
            if len(arg) == 1:
                return f"({self.repr_arg(arg[0])},)"
            return "(" + ", ".join([self.repr_arg(a) for a in arg]) + ")"
        if isinstance(arg, list):
            return "[" + ", ".join([self.repr_arg(a) for a in arg]) + "]"
        if isinstance(arg, slice):
            parts = (self.repr_arg(arg.start), self.repr_arg(arg.stop), self.repr_arg(arg.step))
            return f"slice({parts[0]}, {parts[1]}, {parts[2]})"
        if is_opaque_value_type(type(arg)):
            text, needed_types = get_opaque_obj_repr(arg)
            for name, typ in needed_types.items():
                self.add_global(name, typ)
            return text
        return self.blue(repr(arg))

    def name_of(self, node: Any) -> str:
        """``repr(node)`` (its name in this run's namespace once codegen overrides node reprs)."""
        name = self.names.get(node)
        if name is None:
            namer = node._repr_fn
            if type(namer) is _NamespaceRepr and namer.namespace is self.namespace:
                name = self.namespace.create_name(node.name, node)  # repr(node), minus two calls
            else:
                name = repr(node)
            self.names[node] = name
        return name

    def format_args(self, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
        show = self.repr_arg
        parts = [show(a) for a in args]
        if kwargs:
            parts.extend([f"{k} = {show(v)}" for k, v in kwargs.items()])
        return ", ".join(parts)

    # -- annotations and comments

    def _tensor_annotation(self, t: torch.Tensor) -> str:
        stride = _shape_str(t.stride()) if self.opts.include_stride else ""
        device = f"{t.device}" if self.opts.include_device else ""
        return (
            f"{self.red(dtype_abbrs[t.dtype])}{self.blue(_shape_str(t.shape))}"
            f"{self.dim_blue(stride)}{self.dim_green(device)}"
        )

    def _dtensor_annotation(self, val: Any, core: str) -> str:
        from torch.distributed.tensor._api import DTensorSpec

        spec = val._spec
        placements = DTensorSpec.format_shard_order_str(spec.placements, spec.shard_order)
        return f': "{type(val).__name__}({core}, {self.dim_green(placements)})"'

    def verbose_annotation(self, node: Any, default: str) -> str:
        """The quoted ``: "f32[2, 3]"`` annotation verbose mode derives from ``node.meta``."""
        meta = node.meta
        val = meta.get("val", meta.get("tensor_meta", meta.get("example_value", None)))
        if isinstance(val, torch.Tensor) and val.layout not in _UNSTRIDED_LAYOUTS:
            core = self._tensor_annotation(val)
            names = _class_names(val)
            if type(val) is torch.Tensor or "FakeTensor" in names:
                return f': "{core}"'
            if type(val).__name__ == "DTensor":
                return self._dtensor_annotation(val, core)
            return f': "{type(val).__name__}({core})"'
        if isinstance(val, py_sym_types):
            return f': "Sym({CodeGen._sym_repr(val)})"'
        if type(val).__name__ == "TensorMetadata":
            return f': "{dtype_abbrs[val.dtype]}{_shape_str(val.shape)}"'
        return default

    def append_stacktrace_summary(self, node: Any) -> None:
        """Verbose mode: a ``# File: ...`` comment before a node whose origin differs."""
        if node.op in ("placeholder", "output"):
            return
        meta = node.meta
        extra = ""
        if self.opts.additional_meta:
            parts = [f"{k}: {meta[k]}" for k in self.opts.additional_meta if k in meta]
            extra = f"# {', '.join(parts)} " if parts else ""
        custom = meta.get("custom", {})
        annotation = ""
        if custom:
            trimmed = {k: (str(v)[:40] + "..." if len(str(v)) > 40 else v) for k, v in custom.items()}
            annotation = f" Annotation: {trimmed}"
        where = "No stacktrace found for following nodes"
        parsed = _parse_stack_trace(meta.get("stack_trace")) if meta.get("stack_trace") else None
        if parsed:
            where = parsed.get_summary_str()
        summary = f"\n{self.dim(f'{extra}#{annotation}{_recompute_info(meta)} {where}')}\n"
        if summary != self.prev_summary:
            self.prev_summary = summary
            self.body.append(summary)

    def _append_meta_docstring(self, node: Any) -> None:
        self.body.append('"""\n')
        for k, v in node.meta.items():
            self.body.append(f"{k}: {pprint.pformat(str(v), width=80, compact=True)}\n")
        self.body.append('"""\n')

    # -- nodes

    def emit(self, node: Any) -> None:
        """Append ``node``'s statement (without its trailing newline, except placeholders)."""
        typ = node.type
        ann = "" if typ is None else f" : {self.type_repr(typ)}"
        desc = None
        if self.decorated:
            ann, desc = self._decorate(node, ann)
        handler = _OP_HANDLERS.get(node.op)
        if handler is None:
            raise NotImplementedError(f"node: {node.op} {node.target}")
        handler(self, node, ann, desc)

    def _decorate(self, node: Any, ann: str) -> tuple[str, Any]:
        """Verbose annotation, expanded-def description, and the FX_GRAPH_SHOW_META docstring."""
        opts = self.opts
        if opts.verbose:
            ann = self.verbose_annotation(node, ann)
        desc = node.meta.get("desc", None) if opts.expanded_def else None
        if opts.include_meta and node.meta:
            self._append_meta_docstring(node)
        return ann, desc

    def _emit_placeholder(self, node: Any, ann: str, desc: Any) -> None:
        target = node.target
        if not isinstance(target, str):
            raise AssertionError(f"Expected node.target to be str, got {type(target)}")  # noqa: TRY004  # torch.fx's exception type
        default = f" = {self.repr_arg(node.args[0])}" if node.args else ""
        comment = f"  # {desc}" if desc is not None else ""
        self.free_vars.append(f"{target}{ann}{default}{comment}")
        raw_name = target.replace("*", "")
        name = self.name_of(node)
        if raw_name != name:
            self.body.append(f"{name} = {raw_name}\n")

    def _emit_call_method(self, node: Any, ann: str, desc: Any) -> None:
        if not isinstance(node.target, str):
            raise AssertionError(  # noqa: TRY004  # torch.fx's exception type
                f"Expected node.target to be str for call_method, got {type(node.target)}"
            )
        name = self.name_of(node)
        args = node.args
        receiver = _format_target(self.repr_arg(args[0]), node.target)
        self.body.append(f"{name}{ann} = {receiver}({self.format_args(args[1:], node.kwargs)})")

    def _function_plan(self, target: Any) -> tuple[str, str]:
        """How calls of ``target`` print: ``("magic"|"inplace", template)`` or ``("call", name)``."""
        if getattr(target, "__module__", "") == "_operator":
            name = target.__name__
            if name in magic_methods:
                return "magic", magic_methods[name]
            if name in inplace_methods:
                return "inplace", inplace_methods[name]
        return "call", self.add_global(_get_qualified_name(target), target)

    def _plan_for(self, target: Any) -> tuple[str, str]:
        plan = self.function_plans[target] = self._function_plan(target)
        return plan

    def _emit_call_function(self, node: Any, ann: str, desc: Any) -> None:
        target = node.target
        if not callable(target):
            raise AssertionError(f"Expected node.target to be callable, got {type(target)}")  # noqa: TRY004  # torch.fx's exception type
        try:
            plan = self.function_plans.get(target) or self._plan_for(target)
        except TypeError:  # unhashable callable: no caching
            plan = self._function_plan(target)
        kind, text = plan
        args = node.args
        show = self.repr_arg
        if kind == "magic":
            name = self.name_of(node)
            self.body.append(f"{name}{ann} = {text.format(*[show(a) for a in args])}")
            return
        if kind == "inplace":
            statement = text.format(*[self.repr_arg(a) for a in args])
            self.body.append(f"{statement};  {self.name_of(node)}{ann} = {self.repr_arg(args[0])}")
            return
        if text == "getattr" and isinstance(args, tuple) and _is_attr_access(args):
            attr = _format_target(self.repr_arg(args[0]), args[1])
            self.body.append(f"{self.name_of(node)}{ann} = {attr}")
            return
        name = self.name_of(node)
        self.body.append(f"{name}{ann} = {text}({self.format_args(args, node.kwargs)})")
        if node.meta.get("is_wrapped", False):
            self.wrapped_fns.setdefault(text)

    def _emit_call_module(self, node: Any, ann: str, desc: Any) -> None:
        if not isinstance(node.target, str):
            raise AssertionError(  # noqa: TRY004  # torch.fx's exception type
                f"Expected node.target to be str for call_module, got {type(node.target)}"
            )
        name = self.name_of(node)
        callee = _format_target(self.root_module, node.target)
        self.body.append(f"{name}{ann} = {callee}({self.format_args(node.args, node.kwargs)})")

    def _emit_get_attr(self, node: Any, ann: str, desc: Any) -> None:
        if not isinstance(node.target, str):
            raise AssertionError(  # noqa: TRY004  # torch.fx's exception type
                f"Expected node.target to be str for get_attr, got {type(node.target)}"
            )
        name = self.name_of(node)
        self.body.append(f"{name}{ann} = {_format_target(self.root_module, node.target)}")

    def _emit_output(self, node: Any, ann: str, desc: Any) -> None:
        if node.type is not None:
            self.return_annotation = f" -> {self.type_repr(node.type)}"
        codegen = self.codegen
        self.body.append(
            codegen._call_method_with_signature_check(
                codegen.generate_output, node.args[0], descs=desc, repr_fn=self.repr_arg
            )
        )

    def free_after(self, user: Any, dead: list[Any] | None) -> None:
        """End ``user``'s line, assigning ``None`` to the values in ``dead``."""
        op = user.op
        if op == "placeholder":
            return
        if op == "output" or not dead:
            self.body.append("\n")
            return
        known = self.names
        names = [known.get(n) or self.name_of(n) for n in dead]
        names.append("None")
        self.body.append(f";  {self.dim(' = '.join(names))}\n")

    # -- the whole function

    def run(self, nodes: Any) -> PythonCode:
        """Render all nodes and assemble the function source."""
        nodes = list(nodes)
        opts, body = self.opts, self.body
        to_free = _values_to_free(nodes)
        emit, free_after, starts = self.emit, self.free_after, self.node_starts
        if opts.record_func:
            body.append(
                "_rf = torch._C._profiler._RecordFunctionFast('## ENTER_GRAPH_PLACEHOLDER_KEY ##');"
                " _rf.__enter__()\n"
            )
        verbose, record_func = opts.verbose, opts.record_func
        for i, node in enumerate(nodes):
            if verbose:
                self.append_stacktrace_summary(node)
            starts.append(len(body))  # node i's text starts here (torch marks it "# COUNTER: i")
            record = record_func and node.op in _RECORDED_OPS
            if record:
                body.append(
                    f"_rf_{node.name} = torch._C._profiler._RecordFunctionFast('## {i} ##');"
                    f" _rf_{node.name}.__enter__()\n"
                )
            emit(node)
            free_after(node, to_free.get(node))
            if record:
                body.append(f"_rf_{node.name}.__exit__(None, None, None)\n")
        if opts.record_func:
            body.append("_rf.__exit__(None, None, None)\n")
        return self._finish()

    def _wrap_statements(self) -> str:
        """Re-registration lines for wrapped functions, so retracing keeps them as leaves.

        torch.fx writes ``torch.fx._symbolic_trace.wrap("f")``; running that would register
        ``f`` with torch.fx's tracer, not ours, so we write ``exportir.fx.wrap("f")`` instead.
        This is the one intended difference between our generated code and torch's.
        """
        # A dotted name (``exportir.fx.tracer._assert_is_none``) is looked up on its module,
        # whose own wrap() registration applies; registering the dotted text would make every
        # later trace fail (torch.fx writes it, and then raises KeyError on each trace).
        names = [name for name in self.wrapped_fns if name.isidentifier()]
        if not names:
            return ""
        package = self._exportir_global()
        return "\n".join(f'{package}.fx.wrap("{name}")' for name in names)

    def _exportir_global(self) -> str:
        """The global through which generated code reaches the ``exportir`` package."""
        import exportir

        return self.add_global("exportir", exportir)

    def _finish(self) -> PythonCode:
        codegen = self.codegen
        body, starts = self.body, self.node_starts
        if not body and not starts:  # no nodes at all (torch's markers count as body text)
            body.append("pass\n")
        wrap_stmts = self._wrap_statements()
        transformer = codegen._body_transformer
        if transformer:
            # the transformer sees torch.fx's per-node "# COUNTER: i" marker lines
            body, starts = transformer(_with_counters(body, starts)), None
        for name, value in codegen.additional_globals():
            self.add_global(name, value)
        prologue = codegen._call_method_with_signature_check(
            codegen.gen_fn_def,
            self.free_vars,
            self.return_annotation,
            expanded_def=self.opts.expanded_def,
        )
        first_line = prologue.count("\n") + 1
        lineno_map = _line_map(body, starts, first_line) if starts is not None else None
        if lineno_map is None:
            text, lineno_map = _strip_counters(body, first_line)
        else:
            text = "".join(body)
        code = "    " + text.lstrip("\n").replace("\n", "\n    ")
        return PythonCode(
            f"\n{wrap_stmts}\n\n{prologue}\n{code}",
            self.globals,
            _lineno_map=lineno_map,
            _prologue_start=wrap_stmts.count("\n") + 4,  # the blank lines before the def
        )


def _is_attr_access(args: tuple) -> bool:
    """``getattr(x, "name")`` with an identifier name prints as ``x.name``."""
    return isinstance(args[1], str) and args[1].isidentifier() and len(args) == 2


def _recompute_info(meta: dict[str, Any]) -> str:
    """Activation-checkpointing tags shown in verbose comments."""
    recompute = meta.get("recompute", None)
    graph_id = meta.get("ac_graph_id", None)
    if recompute is not None and graph_id is not None:
        return f" ac_graph_id: {graph_id!s} - {recompute.name!s}"
    if recompute is not None:
        return f" recompute: {recompute.name!s}"
    if graph_id is not None:
        return f" ac_graph_id: {graph_id!s}"
    return ""


def _with_counters(body: list[str], starts: list[int]) -> list[str]:
    """``body`` with a ``# COUNTER: i`` chunk where node ``i``'s text starts."""
    marked: list[str] = []
    prev = 0
    for i, start in enumerate(starts):
        marked.extend(body[prev:start])
        marked.append(f"# COUNTER: {i}\n")
        prev = start
    marked.extend(body[prev:])
    return marked


def _line_map(body: list[str], starts: list[int], first_line: int) -> dict[int, int | None] | None:
    """Map each line of ``"".join(body)`` (numbered from ``first_line``) to the index of the node
    whose text it belongs to (``None`` before the first node).

    Returns ``None`` when some node's text does not start on a fresh line, i.e. when the result
    could differ from scanning marker lines; the caller then takes the marker route.
    """
    if any(s and not body[s - 1].endswith("\n") for s in starts):
        return None
    bounds = [*starts, len(body)]
    owners: list[int | None] = [None] * "".join(body[: bounds[0]]).count("\n")
    for i in range(len(starts)):
        lo, hi = bounds[i], bounds[i + 1]
        if hi - lo == 1:
            owners += [i] * body[lo].count("\n")
        elif hi > lo:
            owners += [i] * "".join(body[lo:hi]).count("\n")
    owners.append(len(starts) - 1 if starts else None)  # the final (partial or empty) line
    return dict(zip(range(first_line, first_line + len(owners)), owners))


def _strip_counters(body: list[str], first_line: int) -> tuple[str, dict[int, int | None]]:
    """Drop ``# COUNTER: i`` marker lines from the joined body and map each remaining line
    (numbered from ``first_line``) to the index of the marker before it."""
    lineno_map: dict[int, int | None] = {}
    kept: list[str] = []
    current: int | None = None
    for line in "".join(body).split("\n"):
        marker = _COUNTER.search(line) if "# COUNTER: " in line else None
        if marker is not None:
            current = int(marker.group(1))
            continue
        lineno_map[len(kept) + first_line] = current
        kept.append(line)
    return "\n".join(kept), lineno_map


_OP_HANDLERS: dict[str, Callable[[_Emitter, Any, str, Any], None]] = {
    "placeholder": _Emitter._emit_placeholder,
    "call_method": _Emitter._emit_call_method,
    "call_function": _Emitter._emit_call_function,
    "call_module": _Emitter._emit_call_module,
    "get_attr": _Emitter._emit_get_attr,
    "output": _Emitter._emit_output,
}
