"""Graph -> Python source: the code a GraphModule runs.

Code generation is a pure function of a graph: :func:`graph_python_code` names every value in a
fresh namespace and asks the graph's :class:`CodeGen` to render the nodes. The text is exactly
what torch.fx 2.13 generates for the same graph (signature, operator sugar such as ``a + b`` and
``a += b``, ``;  x = None`` frees after a value's last use, verbose annotations, pytree
wrappers), so generated code can be diffed across the two implementations.

Overridable hooks (the same as torch.fx's): :meth:`CodeGen.gen_fn_def`,
:meth:`CodeGen.generate_output`, :meth:`CodeGen.process_inputs`,
:meth:`CodeGen.process_outputs`, :meth:`CodeGen.additional_globals`, and the body transformer
installed by ``Graph.on_generate_code``. One code generation run is an :class:`_Emitter`, with
one rendering method per opcode.
"""

from __future__ import annotations

import enum
import inspect
import math
import os
import pprint
import re
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch._library.opaque_object import get_opaque_obj_repr, is_opaque_value_type
from torch.types import py_sym_types
from torch.utils._dtype_abbrs import dtype_abbrs

from exportir import pytree
from exportir.fx import namespace as _namespace_mod
from exportir.fx.namespace import _Namespace
from exportir.fx.printer import _get_qualified_name, _type_repr

if TYPE_CHECKING:
    from exportir.fx.node import Argument, Node

__all__ = ["CodeGen", "PythonCode", "graph_python_code"]

# A transformer of the generated body: receives and returns the list of body line chunks.
TransformCodeFunc = Callable[[list[str]], list[str]]


# --------------------------------------------------------------------------- operator tables

# Binary operators whose reflected form (``__radd__``) also exists.
reflectable_magic_methods: dict[str, str] = {
    "add": "{} + {}",
    "sub": "{} - {}",
    "mul": "{} * {}",
    "floordiv": "{} // {}",
    "truediv": "{} / {}",
    "div": "{} / {}",
    "mod": "{} % {}",
    "pow": "{} ** {}",
    "lshift": "{} << {}",
    "rshift": "{} >> {}",
    "and_": "{} & {}",
    "or_": "{} | {}",
    "xor": "{} ^ {}",
    "getitem": "{}[{}]",
    "matmul": "{} @ {}",
}

# ``operator.<name>`` calls printed as Python operator syntax.
magic_methods: dict[str, str] = {
    "eq": "{} == {}",
    "ne": "{} != {}",
    "lt": "{} < {}",
    "gt": "{} > {}",
    "le": "{} <= {}",
    "ge": "{} >= {}",
    "pos": "+{}",
    "neg": "-{}",
    "invert": "~{}",
    **reflectable_magic_methods,
}

# ``operator.i<name>`` calls printed as augmented assignments (the node then aliases args[0]).
inplace_methods: dict[str, str] = {
    "iadd": "{} += {}",
    "iand": "{} &= {}",
    "ifloordiv": "{} //= {}",
    "ilshift": "{} <<= {}",
    "imod": "{} %= {}",
    "imul": "{} *= {}",
    "imatmul": "{} @= {}",
    "ior": "{} |= {}",
    "ipow": "{} **= {}",
    "irshift": "{} >>= {}",
    "isub": "{} -= {}",
    "itruediv": "{} /= {}",
    "ixor": "{} ^= {}",
    "setitem": "{}[{}] = {}",
}


# --------------------------------------------------------------------------- custom builtins


class _CustomBuiltin(NamedTuple):
    """A global every generated function sees, with the import statement that provides it."""

    import_str: str
    obj: object


_custom_builtins: dict[str, _CustomBuiltin] = {}


def _register_custom_builtin(name: str, import_str: str, obj: object) -> None:
    """Make ``name`` a global of all generated code; graph values may then not take that name."""
    _custom_builtins[name] = _CustomBuiltin(import_str, obj)
    _namespace_mod.reserve_name(name, obj)


_register_custom_builtin("inf", "from math import inf", math.inf)
_register_custom_builtin("nan", "from math import nan", math.nan)
_register_custom_builtin("NoneType", "NoneType = type(None)", type(None))
_register_custom_builtin("torch", "import torch", torch)
_register_custom_builtin("device", "from torch import device", torch.device)
_register_custom_builtin("fx_pytree", "import exportir.pytree as fx_pytree", pytree)
_register_custom_builtin("pytree", "import exportir.pytree as pytree", pytree)


# --------------------------------------------------------------------------- small helpers

_COLOR_CODES: dict[str, str] = {
    "yellow": "\033[33m",
    "cyan": "\033[36m",
    "green": "\033[32m",
    "blue": "\033[34m",
    "red": "\033[31m",
    "dim": "\033[2m",
    "dim_blue": "\033[2m\033[34m",
    "dim_green": "\033[2m\033[32m",
}
_COUNTER = re.compile(r"# COUNTER: (\d+)")
# A module path under torch, except the dynamo and inductor compilers.
_TORCH_MODULE = re.compile(r"^torch(?:\.(?!_dynamo\.|_inductor\.)[^.]+)*$").fullmatch


def _identity(s: str) -> str:
    return s


def _make_color_fn(code: str) -> Callable[[str], str]:
    def paint(s: str) -> str:
        return f"{code}{s}\033[0m"

    return paint


_color_fns: dict[str, Callable[[str], str]] = {k: _make_color_fn(v) for k, v in _COLOR_CODES.items()}


def _is_magic(x: str) -> bool:
    return x.startswith("__") and x.endswith("__")


def _snake_case(s: str) -> str:
    """``mod.pascalCase`` -> ``mod.pascal_case``; ``ALL_CAPS`` -> ``all_caps``."""
    return _namespace_mod.snake_case(s)


def _is_from_torch(obj: object) -> bool:
    """Whether generated code can spell ``obj`` by its qualified torch name instead of a global."""
    module_name = getattr(obj, "__module__", None)
    if module_name is not None:
        return _TORCH_MODULE(module_name) is not None
    name = getattr(obj, "__name__", None)
    if name is None or name == "torch":
        return False
    return any(getattr(home, name, None) is obj for home in (torch, torch.nn.functional))


def _format_target(base: str, target: str) -> str:
    """``base.a.b`` for a dotted attribute path, using ``getattr(...)`` for non-identifiers."""
    r = base
    for elem in target.split("."):
        r = f"{r}.{elem}" if elem.isidentifier() else f'getattr({r}, "{elem}")'
    return r


@dataclass
class PythonCode:
    """Everything needed to exec or save a graph as Python code.

    ``src`` defines the function; ``globals`` are the names it refers to; ``_lineno_map`` maps a
    line of ``src`` (counted from the ``def`` line) to the index of the node that produced it;
    ``_prologue_start`` is the line of ``src`` where the ``def`` starts.
    """

    src: str
    globals: dict[str, Any]
    _lineno_map: dict[int, int | None] | None
    _prologue_start: int = 0


class _PyTreeInfo(NamedTuple):
    """Pytree layout of a traced function: its argument names and input/output specs."""

    orig_args: list[str]
    in_spec: Any
    out_spec: Any | None


@dataclass(frozen=True)
class _ParsedStackTrace:
    """The innermost user frame of a stack trace."""

    file: str
    lineno: str
    name: str
    code: str

    def get_summary_str(self) -> str:
        return f"File: {self.file}:{self.lineno} in {self.name}, code: {self.code}"


_FRAME_LINE = re.compile(r"^File \"(.+)\", line (\d+), in (.+)$")


def _parse_stack_trace(
    stack_trace: str | None, filter_fn: Callable[[str, str, str], bool] | None = None
) -> _ParsedStackTrace | None:
    """The innermost ``File "...", line N, in f`` frame (and its code line) accepted by ``filter_fn``."""
    if stack_trace is None:
        return None
    lines = stack_trace.strip().split("\n")
    for idx in range(len(lines) - 2, -1, -1):
        match = _FRAME_LINE.match(lines[idx].strip())
        if not match:
            continue
        file, lineno, name = match.group(1, 2, 3)
        code = lines[idx + 1].strip()
        if filter_fn and not filter_fn(file, name, code):
            continue
        return _ParsedStackTrace(file, lineno, name, code)
    return None


# --------------------------------------------------------------------------- CodeGen


class CodeGen:
    """Renders a graph's nodes as the source of ``def forward(self, ...)``.

    Subclasses customize the signature (:meth:`gen_fn_def`), the return statement
    (:meth:`generate_output`), extra globals, and how runtime inputs/outputs are adapted.
    """

    # Printer of symbolic values in verbose annotations (swapped by ``_override_sym_repr``).
    _sym_repr: Callable[[Any], str] = lambda x: repr(x)

    def __init__(self) -> None:
        self._body_transformer: TransformCodeFunc | None = None
        self._func_name: str = "forward"

    # -- formatting helpers shared by subclasses

    def _format_multiline_args(self, args: list[str]) -> str:
        return "".join(self._format_single_arg(arg) for arg in args)

    def _format_single_arg(self, arg: str) -> str:
        if "#" not in arg:
            return f"    {arg},\n"
        arg_part, comment_part = arg.split("#", 1)
        return f"    {arg_part.rstrip()},  # {comment_part.lstrip()}\n"

    def _get_delimiters(self, container: Sequence[object]) -> tuple[str, str]:
        return ("(", ")") if isinstance(container, tuple) else ("[", "]")

    def _format_multiline_container(
        self,
        items: Sequence[object],
        descs: Sequence[str] | None = None,
        prefix: str = "",
        repr_fn: Callable[[object], str] | None = None,
    ) -> str:
        """``prefix(`` + one ``item,  # desc`` line per item + ``)`` (brackets for lists)."""
        ldelim, rdelim = self._get_delimiters(items)
        trailers = self._get_desc_trailers(items, descs)
        show = repr if repr_fn is None else repr_fn
        lines = "".join(f"    {show(item)},{t}\n" for item, t in zip(items, trailers))
        return f"{prefix}{ldelim}\n{lines}{rdelim}"

    def _get_desc_trailers(
        self, items: Sequence[object], descs: Sequence[str] | None
    ) -> list[str]:
        if descs is None:
            return [""] * len(items)
        return [f"  # {desc}" for desc in descs]

    def _call_method_with_signature_check(
        self, method: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Call ``method``, dropping keyword arguments its signature does not accept."""
        params = inspect.signature(method).parameters
        return method(*args, **{k: v for k, v in kwargs.items() if k in params})

    # -- overridable hooks

    def gen_fn_def(
        self,
        free_vars: list[str],
        maybe_return_annotation: str,
        *,
        expanded_def: bool = False,
    ) -> str:
        """The ``def`` line; ``self`` is prepended to ``free_vars`` (in place) when missing.

        ``gen_fn_def(['a', 'b'], '') == 'def forward(self, a, b):'``.
        """
        if not free_vars or free_vars[0] != "self":
            free_vars.insert(0, "self")
        if expanded_def:
            args = self._format_multiline_args(free_vars)
            return f"def {self._func_name}(\n{args}){maybe_return_annotation}:"
        return f"def {self._func_name}({', '.join(free_vars)}){maybe_return_annotation}:"

    def generate_output(
        self,
        output_args: Argument,
        *,
        descs: Sequence[str] | None = None,
        repr_fn: Callable[[object], str] | None = None,
    ) -> str:
        """The (unindented) return statement for the output node's argument."""
        show = repr if repr_fn is None else repr_fn
        if descs is not None and isinstance(output_args, (list, tuple)):
            return self._format_multiline_container(output_args, descs, "return ", repr_fn=show)
        return f"return {show(output_args)}"

    def process_inputs(self, *args: Any) -> Any:
        """Adapt user inputs to the graph's placeholders (identity here)."""
        return args

    def process_outputs(self, outputs: Any) -> Any:
        """Adapt graph outputs to what the user expects (identity here)."""
        return outputs

    def additional_globals(self) -> list[tuple[str, Any]]:
        """Extra ``(name, object)`` globals the generated code needs."""
        return []

    def _gen_python_code(
        self,
        nodes: Any,
        root_module: str,
        namespace: _Namespace,
        *,
        verbose: bool = False,
        include_stride: bool = False,
        include_device: bool = False,
        colored: bool = False,
        expanded_def: bool = False,
        record_func: bool = False,
        additional_meta: list[str] | None = None,
    ) -> PythonCode:
        """Render ``nodes`` (in order) into a :class:`PythonCode`; names come from ``namespace``."""
        options = _Options.make(
            verbose=verbose,
            include_stride=include_stride,
            include_device=include_device,
            colored=colored,
            expanded_def=expanded_def,
            record_func=record_func,
            additional_meta=additional_meta,
        )
        emitter = _Emitter(self, root_module, namespace, options)
        return emitter.run(nodes)


class _BoxedCodeGen(CodeGen):
    """Boxed calling convention: ``forward(self, args_list)`` unpacks and clears the list."""

    def gen_fn_def(
        self,
        free_vars: list[str],
        maybe_return_annotation: str,
        *,
        expanded_def: bool = False,
    ) -> str:
        fn_def = f"def {self._func_name}(self, args_list){maybe_return_annotation}:"
        names = [v.split(":")[0].split("=")[0].strip() for v in free_vars if v != "self"]
        if not names:
            return fn_def
        unpack = "".join(f"\n    {name} = next(args_iter)" for name in names)
        return f"{fn_def}\n    args_iter = iter(args_list){unpack}\n    args_list.clear()"


class _PyTreeCodeGen(CodeGen):
    """Signature of the original (nested) function; flattens inputs and rebuilds outputs.

    The generated code calls ``fx_pytree.tree_flatten_spec(..., self._in_spec)`` and
    ``pytree.tree_unflatten(..., self._out_spec)``.
    """

    def __init__(self, pytree_info: _PyTreeInfo) -> None:
        super().__init__()
        self.pytree_info: _PyTreeInfo = pytree_info

    def process_inputs(self, *inputs: Any) -> Any:
        return pytree.arg_tree_leaves(*inputs)

    def process_outputs(self, out: Any) -> Any:
        if self.pytree_info is None or self.pytree_info.out_spec is None:
            return out
        if not isinstance(out, (list, tuple)):
            out = [out]
        return pytree.tree_unflatten(out, self.pytree_info.out_spec)

    def _format_annotations(self, free_vars: list[str], expanded_def: bool) -> str:
        """Annotated free variables as bare annotation statements (``x: int; ``)."""
        annotated = [x for x in free_vars if ":" in x]
        if not annotated:
            return ""
        if expanded_def:
            return "\n    " + "\n    ".join(annotated)
        return "\n    " + "".join(x + "; " for x in annotated) + "\n"

    def _flatten_call_args(self, fn_args: list[str]) -> str:
        """The first argument text of ``tree_flatten_spec``: ``[a, b], self._in_spec`` or, when
        the spec is ``(args, kwargs)``, ``([a], {'k':k}), self._in_spec``."""
        spec = self.pytree_info.in_spec
        has_kwargs = (
            spec.type is tuple
            and spec.num_children == 2
            and spec.child(0).type is tuple
            and spec.child(1).type is dict
        )
        if not has_kwargs:
            return f"[{', '.join(fn_args)}], self._in_spec"
        orig = self.pytree_info.orig_args
        count = spec.child(0).num_children
        kwargs = ", ".join(f"'{k}':{v}" for k, v in zip(spec.child(1).context, orig[count:]))
        return f"([{', '.join(orig[:count])}], {{{kwargs}}}), self._in_spec"

    def gen_var_bindings(self, fn_args: list[str], free_vars: list[str], expanded_def: bool) -> str:
        """Lines binding the flat placeholders from the structured arguments."""
        # ``a: T, b: U = f()`` is not Python, so annotations go on their own line first.
        bare = [x.split(":")[0].split("#")[0] for x in free_vars]
        bindings = self._format_annotations(free_vars, expanded_def)
        call = self._flatten_call_args(fn_args)
        return f"{bindings}\n    {', '.join(bare)}, = fx_pytree.tree_flatten_spec({call})"

    def gen_fn_def(
        self,
        free_vars: list[str],
        maybe_return_annotation: str,
        *,
        expanded_def: bool = False,
    ) -> str:
        if self.pytree_info is None:
            return super().gen_fn_def(free_vars, maybe_return_annotation, expanded_def=expanded_def)
        fn_args = self.pytree_info.orig_args
        if fn_args and fn_args[0] == "self":
            free_vars.insert(0, "self")
        fn_def = super().gen_fn_def(fn_args[:], maybe_return_annotation, expanded_def=expanded_def)
        if free_vars:
            fn_def += self.gen_var_bindings(fn_args, free_vars, expanded_def)
        return fn_def

    def generate_output(
        self,
        output_args: Argument,
        *,
        descs: Sequence[str] | None = None,
        repr_fn: Callable[[object], str] | None = None,
    ) -> str:
        show = repr if repr_fn is None else repr_fn
        if not (self.pytree_info and self.pytree_info.out_spec):
            return super().generate_output(output_args, descs=descs, repr_fn=show)
        if descs is not None and isinstance(output_args, (list, tuple)):
            body = self._format_multiline_container(
                output_args, descs, "return pytree.tree_unflatten(", repr_fn=show
            )
            return body + ", self._out_spec)"
        return f"return pytree.tree_unflatten({show(output_args)}, self._out_spec)"


class _ExportCodeGen(_PyTreeCodeGen):
    """Pytree codegen whose inputs/outputs pass through shuffle graphs (used by unflattening)."""

    def __init__(
        self,
        pytree_info: _PyTreeInfo,
        in_shuffle_graph: Any,
        out_shuffle_graph: Any,
        tree_leaf_names: list[str],
        root: torch.nn.Module | None,
    ) -> None:
        super().__init__(pytree_info)
        self.in_shuffle_graph = in_shuffle_graph
        self.out_shuffle_graph = out_shuffle_graph
        self.tree_leaf_names = tree_leaf_names
        self.root = root

    def process_inputs(self, *inputs: Any) -> Any:
        flat_args = super().process_inputs(*inputs)
        if self.root is not None:
            flat_args = (self.root, *flat_args)
        self.flat_args = flat_args
        return self.in_shuffle_graph(*flat_args)

    def process_outputs(self, out: Any) -> Any:
        flat_outs = self.out_shuffle_graph(*self.flat_args, *out)
        del self.flat_args
        return super().process_outputs(flat_outs)

    def gen_var_bindings(self, fn_args: list[str], free_vars: list[str], expanded_def: bool) -> str:
        bare = [x.split(":")[0].split("#")[0] for x in free_vars]
        signature = ", ".join(fn_args)
        if self.root is not None:
            signature = f"self, {signature}"
        leaves = ", ".join(self.tree_leaf_names)
        return (
            f"\n    {leaves}, = pytree.tree_leaves(({signature},))"
            f"\n    {', '.join(bare)}, = self._in_shuffle_graph({leaves})"
        )

    def generate_output(self, output_args: Argument, *args: Any, **kwargs: Any) -> str:
        if not isinstance(output_args, (list, tuple)):
            raise TypeError(f"Expected list or tuple for output_args, got {type(output_args)}")
        leaves = ", ".join(self.tree_leaf_names)
        outs = ", ".join(str(a) for a in output_args)
        return f"return pytree.tree_unflatten(self._out_shuffle_graph({leaves}, {outs}), self._out_spec)"


# --------------------------------------------------------------------------- one codegen run

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
                # one object registered under two builtin names (pytree/fx_pytree); the
                # reserved-name table keeps graph values off the alias
                self.globals[name] = builtin.obj

    # -- globals and values

    def add_global(self, name_hint: str, obj: Any) -> str:
        """The name generated code uses for ``obj``; torch objects keep their qualified name."""
        if _is_from_torch(obj) and obj != torch.device:
            return _get_qualified_name(obj)
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
        if not self.wrapped_fns:
            return ""
        import exportir

        package = self.add_global("exportir", exportir)
        return "\n".join(f'{package}.fx.wrap("{name}")' for name in self.wrapped_fns)

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


# --------------------------------------------------------------------------- entry points


class _NamespaceRepr:
    """A node repr function: the node's name in ``namespace`` (created on first use)."""

    __slots__ = ("namespace",)

    def __init__(self, namespace: _Namespace) -> None:
        self.namespace = namespace

    def __call__(self, n: Node) -> str:
        return self.namespace.create_name(n.name, n)


@contextmanager
def _override_node_repr(graph: Any, namespace: _Namespace) -> Iterator[None]:
    """While active, ``repr(node)`` of every node of ``graph`` is its name in ``namespace``.

    Generated code is written with ``repr``, so nested containers of nodes print as valid
    expressions; the previous repr functions are restored on exit.
    """
    node_repr = _NamespaceRepr(namespace)
    nodes = list(graph.nodes)
    saved = [n._repr_fn for n in nodes]
    for n in nodes:
        n._repr_fn = node_repr
    try:
        yield
    finally:
        for n, fn in zip(nodes, saved):
            n._repr_fn = fn


def graph_python_code(
    graph: Any,
    root_module: str,
    *,
    verbose: bool = False,
    include_stride: bool = False,
    include_device: bool = False,
    colored: bool = False,
    expanded_def: bool = False,
    record_func: bool = False,
    additional_meta: list[str] | None = None,
) -> PythonCode:
    """``Graph.python_code``: the source of ``graph`` with attribute targets looked up on
    ``root_module`` (usually ``"self"``); all names come from a fresh namespace."""
    namespace = _Namespace()
    with _override_node_repr(graph, namespace):
        return graph._codegen._gen_python_code(
            graph.nodes,
            root_module,
            namespace,
            verbose=verbose,
            include_stride=include_stride,
            include_device=include_device,
            colored=colored,
            expanded_def=expanded_def,
            record_func=record_func,
            additional_meta=additional_meta,
        )


@contextmanager
def _override_sym_repr(override: Callable[[Any], str]) -> Iterator[None]:
    """Temporarily print symbolic values in verbose annotations with ``override``."""
    saved = CodeGen._sym_repr
    try:
        CodeGen._sym_repr = override  # type: ignore[method-assign]  # class-level hook by design
        yield
    finally:
        CodeGen._sym_repr = saved  # type: ignore[method-assign]  # restore the hook


# Re-exported for callers that spell it as in torch.fx.graph.
__all__ += ["_get_qualified_name", "_type_repr"]
