"""``Graph``: the container of an FX program and its mutation API.

This module only holds nodes and edits them. Printing lives in ``printer``, code generation in
``codegen``, structural checks in ``lint``; the methods here that expose them delegate.

Every edit is O(1): nodes sit in a circular doubly linked list around a sentinel root, names
come from a hash-based namespace, and a side table indexes nodes by ``(op, target)`` so
``find_nodes`` never scans the graph.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

# torch.fx.graph exposes its codegen helpers; code written against it imports them from here.
from torch.utils._dtype_abbrs import dtype_abbrs  # noqa: F401  # torch.fx.graph exposes it

from exportir.fx import namespace as _namespace

# torch.fx.graph exposes its codegen helpers; code written against it imports them from here.
from exportir.fx._emit import _ORIGIN_TYPE_MAP as _origin_type_map  # noqa: F401
from exportir.fx.codegen import (  # noqa: F401
    _COLOR_CODES,
    _COUNTER,
    CodeGen,
    PythonCode,
    _BoxedCodeGen,
    _color_fns,
    _custom_builtins,
    _CustomBuiltin,
    _ExportCodeGen,
    _format_target,
    _identity,
    _is_from_torch,
    _is_magic,
    _make_color_fn,
    _override_sym_repr,
    _parse_stack_trace,
    _ParsedStackTrace,
    _PyTreeCodeGen,
    _PyTreeInfo,
    _register_custom_builtin,
    _snake_case,
    inplace_methods,
    magic_methods,
    reflectable_magic_methods,
)
from exportir.fx.immutable_collections import immutable_dict
from exportir.fx.lint import _legal_ops  # noqa: F401
from exportir.fx.namespace import _Namespace, is_magic, snake_case
from exportir.fx.node import Argument, Node, Target, map_arg
from exportir.fx.printer import _get_qualified_name, _type_repr  # noqa: F401

if TYPE_CHECKING:
    from exportir.fx.graph_module import GraphModule
    from exportir.fx.tracer import Tracer

__all__ = ["CodeGen", "Graph", "PythonCode"]

TransformCodeFunc = Callable[[list[str]], list[str]]

# The naming tables behind ``_Namespace`` and ``_snake_case`` and the codegen's colours and
# line markers, under torch.fx.graph's names.
_color_codes = _COLOR_CODES
_counter_regexp = _COUNTER
_illegal_names = _namespace._RESERVED
_illegal_char_regex = _namespace._ILLEGAL_CHARS
_name_regex = _namespace._BASE_AND_SUFFIX
_snake_case_sub = functools.partial(_namespace._CAMEL_HUMP.sub, r"_\1")


class _InsertPoint:
    """Sets a graph's insertion function; restores the previous one when used as a context."""

    __slots__ = ("graph", "orig_insert")

    def __init__(self, graph: Graph, new_insert: Callable[[Node], None]) -> None:
        self.graph = graph
        self.orig_insert = graph._insert
        graph._insert = new_insert

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self.graph._insert = self.orig_insert


class _NodeIter:
    """Walks the linked list, skipping nodes erased while the walk was in progress."""

    __slots__ = ("_cur", "_forward", "_root")

    def __init__(self, root: Node, reverse: bool) -> None:
        self._root = root
        self._cur = root
        self._forward = not reverse

    def __iter__(self) -> _NodeIter:
        return self

    def __next__(self) -> Node:
        root = self._root
        cur = self._cur
        while True:
            cur = cur._next if self._forward else cur._prev
            if cur is root:
                self._cur = cur
                raise StopIteration
            if not cur._erased:
                self._cur = cur
                return cur


class _node_list:
    """A live view of a graph's nodes; safe to mutate the graph while iterating."""

    __slots__ = ("direction", "graph")

    def __init__(self, graph: Graph, direction: str = "_next") -> None:
        if direction not in ("_next", "_prev"):
            raise ValueError(f"direction must be '_next' or '_prev', got {direction!r}")
        self.graph = graph
        self.direction = direction

    def __len__(self) -> int:
        return self.graph._len

    def __iter__(self) -> Iterator[Node]:
        return _NodeIter(self.graph._root, self.direction == "_prev")

    def __reversed__(self) -> Iterator[Node]:
        return _NodeIter(self.graph._root, self.direction == "_next")


class _FindNodesLookupTable:
    """Index of a graph's nodes by ``(op, target)``; ``target`` only for ``call_function``."""

    __slots__ = ("table",)

    def __init__(self) -> None:
        self.table: defaultdict[tuple[str, Any], dict[Node, None]] = defaultdict(dict)

    @staticmethod
    def _key(node: Node) -> tuple[str, Any]:
        op = node.op
        return (op, node.target if op == "call_function" else None)

    def __contains__(self, node: Node) -> bool:
        return node in self.table[self._key(node)]

    def insert(self, node: Node) -> None:
        self.table[self._key(node)][node] = None

    def remove(self, node: Node) -> None:
        self.table[self._key(node)].pop(node)

    def find_nodes(self, *, op: str, target: Target | None = None) -> list[Node]:
        if op == "call_function":
            if target is None:
                raise ValueError("find_nodes(op='call_function') needs a target")
            return list(self.table[(op, target)])
        bucket = self.table[(op, None)]
        if target is None:
            return list(bucket)
        return [n for n in bucket if n.target == target]


class Graph:
    """The FX intermediate representation: a list of ``Node``s forming a Python function.

    Placeholders are the function's parameters, ``output`` is its return statement, and every
    other node calls a function, method or module, or fetches an attribute.
    """

    def __init__(
        self,
        owning_module: GraphModule | None = None,
        tracer_cls: type[Tracer] | None = None,
        tracer_extras: dict[str, Any] | None = None,
    ) -> None:
        self._root: Node = Node(self, "", "root", "", (), {})
        self._used_names: dict[str, int] = {}
        self._insert: Callable[[Node], None] = self._root.prepend
        self._len = 0
        self._graph_namespace = _Namespace()
        self._owning_module = owning_module
        self._tracer_cls = tracer_cls
        self._tracer_extras = tracer_extras
        self._codegen: CodeGen = CodeGen()
        self._co_fields: dict[str, Any] = {}
        self._find_nodes_lookup_table = _FindNodesLookupTable()

    @property
    def owning_module(self) -> GraphModule | None:
        return self._owning_module

    @owning_module.setter
    def owning_module(self, mod: GraphModule | None) -> None:
        self._owning_module = mod

    @property
    def nodes(self) -> _node_list:
        """The nodes in program order; ``reversed(graph.nodes)`` walks backwards."""
        return _node_list(self)

    def output_node(self) -> Node:
        """The graph's ``output`` node, which must be the last node."""
        last = self._root._prev
        if last.op != "output":
            raise ValueError(f"the last node of the graph is {last.op} {last.name!r}, not output")
        return last

    def find_nodes(self, *, op: str, target: Target | None = None, sort: bool = True) -> list[Any]:
        """Nodes with ``op`` (and ``target``, required for ``call_function``), without a scan."""
        found = self._find_nodes_lookup_table.find_nodes(op=op, target=target)
        if sort:
            found.sort(key=_sort_key_of)
        return found

    # -- building ------------------------------------------------------------------------------

    def create_node(
        self,
        op: str,
        target: Target,
        args: tuple[Argument, ...] | None = None,
        kwargs: dict[str, Argument] | None = None,
        name: str | None = None,
        type_expr: Any | None = None,
    ) -> Node:
        """Create a node at the current insertion point (see ``inserting_before/after``)."""
        if not args:
            args = ()
        elif not isinstance(args, tuple):
            raise TypeError(f"args must be a tuple, got {type(args).__name__}")
        if not kwargs:
            kwargs = immutable_dict()
        elif not isinstance(kwargs, dict):
            raise TypeError(f"kwargs must be a dict, got {type(kwargs).__name__}")
        candidate = name if name is not None else self._target_to_str(target)
        name = self._graph_namespace.create_name(candidate, None)
        node = Node(self, name, op, target, args, kwargs, type_expr)
        hooks = getattr(self._owning_module, "_create_node_hooks", None)
        if hooks is not None:
            for hook in hooks:
                hook(node)
        self._graph_namespace.associate_name_with_obj(name, node)
        self._insert(node)
        self._find_nodes_lookup_table.insert(node)
        self._len += 1
        return node

    def placeholder(
        self, name: str, type_expr: Any | None = None, default_value: Any = inspect.Signature.empty
    ) -> Node:
        """A function input named ``name``; pass ``default_value`` to make it optional."""
        args = () if default_value is inspect.Signature.empty else (default_value,)
        return self.create_node("placeholder", name, args=args, type_expr=type_expr)

    def get_attr(self, qualified_name: str, type_expr: Any | None = None) -> Node:
        """Fetch ``qualified_name`` (e.g. ``"sub.weight"``) from the owning module hierarchy."""
        root = self._owning_module
        if root is not None and not _attr_reference_exists(root, qualified_name):
            warnings.warn(
                "Attempted to insert a get_attr Node with no underlying reference in the owning "
                "GraphModule! Call GraphModule.add_submodule to add the necessary submodule, "
                "GraphModule.add_parameter to add the necessary Parameter, or "
                "nn.Module.register_buffer to add the necessary buffer",
                stacklevel=2,
            )
        return self.create_node("get_attr", qualified_name, type_expr=type_expr)

    def call_module(
        self,
        module_name: str,
        args: tuple[Argument, ...] | None = None,
        kwargs: dict[str, Argument] | None = None,
        type_expr: Any | None = None,
    ) -> Node:
        """Call the ``forward`` of submodule ``module_name`` (args exclude ``self``)."""
        root = self._owning_module
        if root is not None and _lookup_qualified(root, module_name) is None:
            warnings.warn(
                "Attempted to insert a call_module Node with no underlying reference in the "
                "owning GraphModule! Call GraphModule.add_submodule to add the necessary submodule"
            )
        return self.create_node("call_module", module_name, args, kwargs, type_expr=type_expr)

    def call_method(
        self,
        method_name: str,
        args: tuple[Argument, ...] | None = None,
        kwargs: dict[str, Argument] | None = None,
        type_expr: Any | None = None,
    ) -> Node:
        """Call method ``method_name`` on ``args[0]``."""
        return self.create_node("call_method", method_name, args, kwargs, type_expr=type_expr)

    def call_function(
        self,
        the_function: Callable[..., Any],
        args: tuple[Argument, ...] | None = None,
        kwargs: dict[str, Argument] | None = None,
        type_expr: Any | None = None,
        name: str | None = None,
    ) -> Node:
        """Call a free function (an operator, a torch function, an ``OpOverload``...)."""
        return self.create_node(
            "call_function", the_function, args, kwargs, name=name, type_expr=type_expr
        )

    def output(self, result: Argument, type_expr: Any | None = None) -> Node:
        """The ``return result`` of the function."""
        return self.create_node(op="output", target="output", args=(result,), type_expr=type_expr)

    def _target_to_str(self, target: Target | None) -> str:
        if callable(target):
            text = target.__name__
        elif isinstance(target, str):
            text = target[2:-2] if is_magic(target) else target
        else:
            raise TypeError(f"node target must be a callable or a str, got {type(target).__name__}")
        return snake_case(text)

    # -- symbolic-shape helpers ----------------------------------------------------------------

    def create_size_node(self, tensor_node: Node, dim: int) -> Node:
        """A ``sym_size.int`` node reading dimension ``dim`` of ``tensor_node``."""
        return self._tensor_query(torch.ops.aten.sym_size.int, tensor_node, dim, "size")

    def create_stride_node(self, tensor_node: Node, dim: int) -> Node:
        """A ``sym_stride.int`` node reading stride ``dim`` of ``tensor_node``."""
        return self._tensor_query(torch.ops.aten.sym_stride.int, tensor_node, dim, "stride")

    def create_storage_offset_node(self, tensor_node: Node) -> Node:
        """A ``sym_storage_offset`` node reading ``tensor_node``'s storage offset."""
        return self._tensor_query(
            torch.ops.aten.sym_storage_offset.default, tensor_node, None, "storage_offset"
        )

    def _tensor_query(self, op: Any, tensor_node: Node, dim: int | None, what: str) -> Node:
        args = (tensor_node,) if dim is None else (tensor_node, dim)
        node = self.call_function(op, args)
        val = tensor_node.meta.get("val")
        if isinstance(val, torch.Tensor):
            query = getattr(val, what)
            node.meta["val"] = query() if dim is None else query(dim)
        return node

    def materialize_symint(self, value: torch.SymInt | int) -> Node | int:
        """Plain ints pass through; symbolic ints need the symbolic-shape layer (not built yet)."""
        if isinstance(value, int):
            return value
        raise NotImplementedError(
            "Graph.materialize_symint of a torch.SymInt needs exportir's symbolic shapes, "
            "which are not built yet"
        )

    def materialize_symints(self, values: Any) -> list[Node | int]:
        """``materialize_symint`` over a sequence."""
        return [self.materialize_symint(v) for v in values]

    # -- editing -------------------------------------------------------------------------------

    def erase_node(self, to_erase: Node) -> None:
        """Remove a node that has no users left."""
        if to_erase.users:
            raise RuntimeError(
                f"Tried to erase Node {to_erase} but it still had {len(to_erase.users)} "
                f"users in the graph: {to_erase.users}!"
            )
        if to_erase.graph is not self:
            raise RuntimeError(f"Attempting to remove {to_erase} from wrong graph!")
        if to_erase._erased:
            warnings.warn(f"erase_node({to_erase}) on an already erased node")
            return
        hooks = getattr(self._owning_module, "_erase_node_hooks", None)
        if hooks is not None:
            for hook in hooks:
                hook(to_erase)
        self._find_nodes_lookup_table.remove(to_erase)
        to_erase._remove_from_list()
        to_erase._erased = True
        self._len -= 1
        # drop the uses this node held on its inputs
        to_erase._update_args_kwargs(
            map_arg(to_erase._args, _to_none), map_arg(to_erase._kwargs, _to_none)
        )

    def inserting_before(self, n: Node | None = None) -> _InsertPoint:
        """Insert new nodes before ``n`` (at the very start when ``None``); a context manager."""
        if n is None:
            return self.inserting_after(self._root)
        if n.graph is not self:
            raise ValueError(f"Node {n} to insert before is not in this graph")
        return _InsertPoint(self, n.prepend)

    def inserting_after(self, n: Node | None = None) -> _InsertPoint:
        """Insert new nodes after ``n`` (at the very end when ``None``); a context manager."""
        if n is None:
            return self.inserting_before(self._root)
        if n.graph is not self:
            raise ValueError(f"Node {n} to insert after is not in this graph")
        return _InsertPoint(self, n.append)

    def node_copy(self, node: Node, arg_transform: Callable[[Node], Argument] = lambda x: x) -> Node:
        """Copy ``node`` (possibly from another graph) here, mapping its inputs through
        ``arg_transform``; meta is shallow-copied."""
        args = map_arg(node.args, arg_transform)
        kwargs = map_arg(node.kwargs, arg_transform)
        copied = self.create_node(node.op, node.target, args, kwargs, node.name, node.type)
        copied.meta = copy.copy(node.meta)
        return copied

    def graph_copy(
        self, g: Graph, val_map: dict[Node, Node], return_output_node: bool = False
    ) -> Argument | None:
        """Copy every node of ``g`` except its output into this graph.

        ``val_map`` is filled with old -> new nodes (pre-filled entries are not copied). Returns
        ``g``'s output value mapped into this graph (with the old output node if asked), or
        ``None`` when ``g`` has no output.
        """
        lookup = val_map.__getitem__
        for node in g.nodes:
            if node in val_map:
                continue
            if node.op == "output":
                result = map_arg(node.args[0], lookup)
                return (result, node) if return_output_node else result
            val_map[node] = self.node_copy(node, lookup)
        return None

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Graph:
        memo = memo if memo else {}
        g = Graph(tracer_cls=self._tracer_cls)
        copied = g.graph_copy(self, val_map=memo, return_output_node=True)  # type: ignore[arg-type]  # memo doubles as node map, as in torch
        g._codegen = copy.deepcopy(self._codegen)
        if copied is not None:
            value, old_output = copied  # type: ignore[misc]  # (value, node) when asked
            new_output = g.output(value, type_expr=getattr(old_output, "type", None))
            new_output.meta = copy.copy(old_output.meta)
        return g

    def eliminate_dead_code(self, is_impure_node: Callable[[Node], bool] | None = None) -> bool:
        """Erase nodes whose results are unused and that have no side effects.

        Walks backwards once, so chains of dead nodes disappear in one call. Returns whether
        anything was removed. Subgraph modules read by ``get_attr`` are cleaned too.
        """
        self.lint()
        impure = is_impure_node if is_impure_node is not None else Node.is_impure
        changed = False
        for node in reversed(self.nodes):
            if not node.users and not impure(node):
                self.erase_node(node)
                changed = True
        return self._eliminate_in_subgraphs() or changed

    def _eliminate_in_subgraphs(self) -> bool:
        root = self._owning_module
        if root is None:
            return False
        from exportir.fx.graph_module import GraphModule

        read = {n.target for n in self.find_nodes(op="get_attr")}
        changed = False
        for name, child in root.named_children():
            if name in read and isinstance(child, GraphModule):
                changed |= child.graph.eliminate_dead_code()
                child.recompile()
        return changed

    def lint(self) -> None:
        """Check ownership, topological order, unique names, op kinds and (with an owning
        module) that targets exist. Raises with a window of the graph around the bad node."""
        from exportir.fx.lint import lint_graph

        lint_graph(self)

    # -- code generation and printing ------------------------------------------------------------

    def python_code(
        self,
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
        """The Python source of this graph as a function ``forward(self, ...)``."""
        from exportir.fx.codegen import graph_python_code

        return graph_python_code(
            self, root_module, verbose=verbose, include_stride=include_stride,
            include_device=include_device, colored=colored, expanded_def=expanded_def,
            record_func=record_func, additional_meta=additional_meta,
        )

    def __str__(self) -> str:
        from exportir.fx.printer import graph_to_str

        return graph_to_str(self)

    def print_tabular(self) -> None:
        """Print the nodes as a table of opcode, name, target, args and kwargs."""
        from exportir.fx.printer import print_tabular

        print_tabular(self)

    def set_codegen(self, codegen: CodeGen) -> None:
        self._codegen = codegen

    def process_inputs(self, *args: Any) -> Any:
        """Turn user inputs into the flat positional inputs the graph takes."""
        return self._codegen.process_inputs(*args)

    def process_outputs(self, out: Any) -> Any:
        """Turn the graph's flat outputs into what the user expects back."""
        return self._codegen.process_outputs(out)

    def on_generate_code(
        self, make_transformer: Callable[[TransformCodeFunc | None], TransformCodeFunc]
    ) -> contextlib.AbstractContextManager[None]:
        """Install a transformer of the generated body lines.

        ``make_transformer`` receives the current transformer (or ``None``) and returns the new
        one. Takes effect immediately; used as a context manager it restores the previous one.
        """
        previous = self._codegen._body_transformer
        self._codegen._body_transformer = make_transformer(previous)
        codegen = self._codegen

        @contextlib.contextmanager
        def restore() -> Iterator[None]:
            try:
                yield
            finally:
                codegen._body_transformer = previous

        return restore()

    def _clear_nodes(self) -> None:
        for node in reversed(self.nodes):
            node.users.clear()
            self.erase_node(node)


def _to_none(_: Node) -> None:
    return None


def _sort_key_of(node: Node) -> tuple[int, ...]:
    return node._sort_key


def _lookup_qualified(root: torch.nn.Module, qualified_name: str) -> Any:
    obj: Any = root
    for atom in qualified_name.split("."):
        obj = getattr(obj, atom, None)
        if obj is None:
            return None
    return obj


def _attr_reference_exists(root: torch.nn.Module, qualified_name: str) -> bool:
    module_path, _, name = qualified_name.rpartition(".")
    try:
        owner = root.get_submodule(module_path)
    except AttributeError:
        warnings.warn(f"Failed to fetch module {module_path}!")
        return False
    if not hasattr(owner, name):
        return False
    value = getattr(owner, name)
    return isinstance(value, (torch.nn.Module, torch.nn.Parameter)) or name in owner._buffers

