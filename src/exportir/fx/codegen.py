"""Graph -> Python source: the code a GraphModule runs.

Code generation is a pure function of a graph: :func:`graph_python_code` names every value in a
fresh namespace and asks the graph's :class:`CodeGen` to render the nodes. The text is exactly
what torch.fx 2.13 generates for the same graph (signature, operator sugar such as ``a + b`` and
``a += b``, ``;  x = None`` frees after a value's last use, verbose annotations, pytree
wrappers), so generated code can be diffed across the two implementations.

Overridable hooks (the same as torch.fx's): :meth:`CodeGen.gen_fn_def`,
:meth:`CodeGen.generate_output`, :meth:`CodeGen.process_inputs`,
:meth:`CodeGen.process_outputs`, :meth:`CodeGen.additional_globals`, and the body transformer
installed by ``Graph.on_generate_code``. One code generation run is an :class:`_Emitter` (in
``_emit``), with one rendering method per opcode.
"""

from __future__ import annotations

import inspect
import math
import re
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from exportir import pytree
from exportir.fx import _pytree as fx_pytree
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
_register_custom_builtin("fx_pytree", "import exportir.fx._pytree as fx_pytree", fx_pytree)
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


def _is_from_exportir_fx(obj: object) -> bool:
    """Whether ``obj`` belongs to exportir.fx itself (``exportir.fx.tracer._assert_is_none``).

    Generated code spells these by qualified name, as torch.fx spells its own objects, so a
    re-trace looks them up on their module and finds them as that module's trace-time
    wrappers (``wrap()``-registered functions stay leaves).
    """
    if not isinstance(obj, (types.FunctionType, type)):  # instances report their class's module
        return False
    return obj.__module__.startswith("exportir.fx.")


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
        # Lazy: _emit builds on this module (CodeGen's hooks, the operator tables, PythonCode),
        # so importing it at the top would be an import cycle.
        from exportir.fx._emit import _Emitter, _Options

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


def _bare_name(free_var: str) -> str:
    """The variable of a placeholder's parameter text: ``x: T = 3  # c`` -> ``x``.

    torch.fx keeps the default (``y_1 = None``) and so writes ``a, y_1 = None, = ...``, a
    syntax error; dropping it makes a structured input specialized to a default work.
    """
    name = free_var.split(":")[0].split("#")[0]  # spacing kept as torch.fx keeps it
    return name.split("=")[0].rstrip() if "=" in name else name


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
        bare = [_bare_name(x) for x in free_vars]
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
        bare = [_bare_name(x) for x in free_vars]
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

# The emitter and its private helpers moved to ``_emit``; still importable from here. Resolved
# on first access because ``_emit`` imports this module (see ``CodeGen._gen_python_code``).
_EMIT_NAMES = frozenset({
    "_MISSING",
    "_OP_HANDLERS",
    "_ORIGIN_TYPE_MAP",
    "_PLAIN_REPR_TYPES",
    "_RECORDED_OPS",
    "_UNSTRIDED_LAYOUTS",
    "_Emitter",
    "_Options",
    "_class_names",
    "_env_flag",
    "_is_attr_access",
    "_is_tensor_type",
    "_line_map",
    "_recompute_info",
    "_shape_str",
    "_strip_counters",
    "_values_to_free",
    "_with_counters",
})


def __getattr__(name: str) -> Any:
    if name in _EMIT_NAMES:
        from exportir.fx import _emit

        return getattr(_emit, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
