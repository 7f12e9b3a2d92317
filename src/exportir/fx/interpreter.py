"""Node-by-node execution of an FX graph (``Interpreter``) and graph-to-graph
re-tracing (``Transformer``).

Call tree of the overridable methods (identical to torch.fx)::

    run()
        +-- run_node
            +-- fetch_args_kwargs_from_env
            |   +-- map_nodes_to_values
            +-- placeholder() / get_attr() / call_function()
                call_method() / call_module() / output()

Speed: each node's arguments are classified once per interpreter (no Node,
Nodes only at the top level, nested); the common flat lists are then read
straight out of ``env`` without a recursive ``map_arg`` walk and without
allocating long-lived per-node objects (which would wake the cyclic GC on big
graphs). The shortcut is taken only while the subclass keeps the default
``fetch_args_kwargs_from_env`` / ``map_nodes_to_values``; otherwise the
documented override chain runs unchanged.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from exportir.fx.graph import Graph
from exportir.fx.graph_module import GraphModule
from exportir.fx.node import Argument, Node, Target, map_aggregate, map_arg
from exportir.fx.proxy import Proxy
from exportir.fx.tracer import Tracer

__all__ = ["Interpreter", "Transformer"]

_OPCODES = ("placeholder", "get_attr", "call_function", "call_method", "call_module", "output")

#: Node meta fields a Transformer carries from an executed node onto the nodes
#: it creates while executing it (torch.fx's ``_COPY_META_FIELDS``).
COPIED_META_FIELDS: tuple[str, ...] = (
    "nn_module_stack",
    "torch_fn",
    "source_fn_stack",
    "original_aten",
    "recompute",
    "ac_graph_id",
    "has_backward_hook",
    "quantization_tag",
    "_numeric_debug_handle",
    "custom",
    "partitioner_tag",
)

#: How many nodes either side of a failing node the error message shows.
ERROR_WINDOW = 2


# Argument classification: the fast path for flat argument lists
# --------------------------------------------------------------------------

#: Classification of a node's arguments, computed once per interpreter.
#: CONST: no Node anywhere, args/kwargs are passed through unchanged.
#: FLAT: Nodes only at the top level of ``args``; ``kwargs`` holds no Node.
#: NESTED: anything else; uses the documented ``map_nodes_to_values`` walk.
CONST, FLAT, NESTED = 0, 1, 2

_CONTAINERS = (list, tuple, dict, slice)


def _contains_node(value: Any) -> bool:
    found = False

    def mark(n: Node) -> Node:
        nonlocal found
        found = True
        return n

    map_arg(value, mark)
    return found


def _classify(node: Node) -> int:
    """CONST, FLAT or NESTED for ``node``'s args/kwargs (see above)."""
    if not node.all_input_nodes:
        return CONST
    for value in node.kwargs.values():
        if isinstance(value, Node) or (isinstance(value, _CONTAINERS) and _contains_node(value)):
            return NESTED
    for value in node.args:
        if isinstance(value, Node):
            if type(value) is not Node:
                return NESTED
        elif isinstance(value, _CONTAINERS) and _contains_node(value):
            return NESTED
    return FLAT


def _last_uses(nodes: Iterator[Node]) -> dict[Node, list[Node]]:
    """Map each node to the values whose final read it performs.

    ``nodes`` must be in reverse execution order."""
    seen: set[Node] = set()
    result: dict[Node, list[Node]] = {}
    for user in nodes:
        for used in user.all_input_nodes:
            if used not in seen:
                seen.add(used)
                result.setdefault(user, []).append(used)
    return result


def _uses_default(obj: object, name: str) -> bool:
    return getattr(type(obj), name) is getattr(Interpreter, name)


# --------------------------------------------------------------------------
# Error context
# --------------------------------------------------------------------------


def _graph_window(node: Node) -> str:
    """A few lines of the graph around ``node`` with the node marked."""
    before: list[Node] = []
    cursor = node.prev
    while len(before) < ERROR_WINDOW and cursor.op != "root":
        before.insert(0, cursor)
        cursor = cursor.prev
    after: list[Node] = []
    cursor = node.next
    while len(after) < ERROR_WINDOW and cursor.op != "root":
        after.append(cursor)
        cursor = cursor.next
    lines = [f"    {n.format_node()}" for n in before]
    lines.append(f">>> {node.format_node()}")
    lines += [f"    {n.format_node()}" for n in after]
    return "\n".join(lines)


def _annotate_error(error: Exception, node: Node) -> None:
    """Append the failing node, its original stack trace and a window of the
    graph around it to ``error``'s message (in place)."""
    context = f"While executing {node.format_node()}"
    message = f"{error.args[0]}\n\n{context}" if error.args else context
    message += f"\nOriginal traceback:\n{node.stack_trace}"
    with contextlib.suppress(Exception):
        message += f"\nGraph around the failing node:\n{_graph_window(node)}"
    error.args = (message,) + error.args[1:]


# --------------------------------------------------------------------------
# Interpreter
# --------------------------------------------------------------------------


class Interpreter:
    """Executes an FX graph node by node; override the per-opcode methods to
    customise execution.

    Args:
        module: the module whose state (``get_attr`` / ``call_module``
            targets) the graph reads.
        garbage_collect_values: drop each value from ``env`` right after its
            last use. Disable to inspect every intermediate in ``env``.
        graph: execute this graph instead of ``module.graph``.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        garbage_collect_values: bool = True,
        graph: Graph | None = None,
    ) -> None:
        self.module = module
        self.submodules = dict(self.module.named_modules())
        self.graph = graph if graph is not None else self.module.graph
        self.env: dict[Node, Any] = {}
        self.name = "Interpreter"
        self.garbage_collect_values = garbage_collect_values
        self.extra_traceback = True
        self._arg_kinds: dict[Node, int] = {}
        self._default_fetch = _uses_default(self, "fetch_args_kwargs_from_env") and _uses_default(
            self, "map_nodes_to_values"
        )
        if self.garbage_collect_values:
            self.user_to_last_uses = _last_uses(reversed(self.graph.nodes))

    # -- driving -----------------------------------------------------------

    def run(
        self,
        *args: Any,
        initial_env: dict[Node, Any] | None = None,
        enable_io_processing: bool = True,
    ) -> Any:
        """Run the graph on ``args`` and return its output value.

        ``initial_env`` pre-populates values for some nodes (those nodes are not
        executed). With ``enable_io_processing`` the graph's codegen
        ``process_inputs`` / ``process_outputs`` hooks are applied."""
        self.env = initial_env if initial_env is not None else {}
        if enable_io_processing:
            args = self.graph.process_inputs(*args)
        self.args_iter: Iterator[Any] = iter(args)
        step = self._fast_step() if _uses_default(self, "run_node") else self.run_node
        last_uses = self.user_to_last_uses if self.garbage_collect_values else {}
        env = self.env
        for node in self.graph.nodes:
            if node in env:
                continue
            try:
                env[node] = step(node)
            except Exception as error:
                if not self.extra_traceback:
                    raise
                _annotate_error(error, node)
                if isinstance(error, KeyError):  # KeyError's str() would quote the message
                    raise RuntimeError(*error.args) from error  # noqa: TRY004 (torch.fx parity)
                raise
            for dead in last_uses.get(node, ()):
                del env[dead]
            if node.op == "output":
                result = env[node]
                return self.graph.process_outputs(result) if enable_io_processing else result
        return None

    def _fast_step(self) -> Callable[[Node], Any]:
        """``run_node`` without the method indirection (default ``run_node`` only)."""
        handlers = {op: getattr(self, op) for op in _OPCODES}
        fetch = self._fetch

        def step(node: Node) -> Any:
            args, kwargs = fetch(node)
            return handlers[node.op](node.target, args, kwargs)

        return step

    def _fetch(self, node: Node) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``fetch_args_kwargs_from_env``, reading flat argument lists straight from
        ``env`` when the subclass keeps the default fetch chain."""
        if not self._default_fetch:
            args, kwargs = self.fetch_args_kwargs_from_env(node)
            if not isinstance(args, tuple):
                raise AssertionError(f"Expected args to be tuple, got {type(args)}")
            if not isinstance(kwargs, dict):
                raise AssertionError(f"Expected kwargs to be dict, got {type(kwargs)}")
            return args, kwargs
        kind = self._arg_kinds.get(node)
        if kind is None:
            kind = self._arg_kinds[node] = _classify(node)
        if kind == FLAT:
            env = self.env
            try:
                return tuple([env[a] if a.__class__ is Node else a for a in node.args]), node.kwargs
            except KeyError:
                pass  # the generic walk below raises the descriptive error
        elif kind == CONST:
            return node.args, node.kwargs
        else:
            lookup = self.env.__getitem__
            try:
                return map_arg(node.args, lookup), map_arg(node.kwargs, lookup)
            except KeyError:
                pass
        return self.fetch_args_kwargs_from_env(node)

    def boxed_run(self, args_list: list[Any]) -> Any:
        """Run with the boxed calling convention: ``args_list`` is cleared so the
        interpreter holds the only references to the inputs."""
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        if len(args_list) != len(placeholders):
            detail = (
                "extra arguments" if len(args_list) > len(placeholders) else "missing arguments"
            )
            raise RuntimeError(
                f"Interpreter.boxed_run expected {len(placeholders)} arguments for "
                f"placeholders but received {len(args_list)} ({detail})"
            )
        env = dict(zip(placeholders, args_list))
        args_list.clear()
        return self.run(initial_env=env)

    @contextlib.contextmanager
    def _set_current_node(self, node: Node) -> Iterator[None]:
        """Kept for API parity; node-meta propagation lives in ``Transformer``."""
        yield

    def run_node(self, n: Node) -> Any:
        """Execute node ``n`` by dispatching to the method named by ``n.op``."""
        args, kwargs = self._fetch(n)
        return getattr(self, n.op)(n.target, args, kwargs)

    # -- per-opcode semantics ----------------------------------------------

    def placeholder(self, target: Target, args: tuple[Argument, ...], kwargs: dict[str, Any]) -> Any:
        """Next positional input (all remaining ones for ``*args``); falls back to
        the placeholder's default value in ``args``."""
        _expect_str(target)
        if target.startswith("*"):
            return list(self.args_iter)
        try:
            return next(self.args_iter)
        except StopIteration as stop:
            if args:
                return args[0]
            raise RuntimeError(
                f"Expected positional argument for parameter {target}, but one was not passed in!"
            ) from stop

    def get_attr(self, target: Target, args: tuple[Argument, ...], kwargs: dict[str, Any]) -> Any:
        """The attribute at dotted path ``target`` of ``self.module``."""
        _expect_str(target)
        return self.fetch_attr(target)

    def call_function(
        self, target: Target, args: tuple[Argument, ...], kwargs: dict[str, Any]
    ) -> Any:
        """``target(*args, **kwargs)``."""
        if isinstance(target, str):
            raise AssertionError("target should not be a string for call_function")  # noqa: TRY004 (torch.fx parity)
        return target(*args, **kwargs)

    def call_method(self, target: Target, args: tuple[Argument, ...], kwargs: dict[str, Any]) -> Any:
        """``args[0].<target>(*args[1:], **kwargs)``."""
        self_obj, *rest = args
        _expect_str(target)
        return getattr(self_obj, target)(*rest, **kwargs)

    def call_module(self, target: Target, args: tuple[Argument, ...], kwargs: dict[str, Any]) -> Any:
        """Call the submodule at dotted path ``target``."""
        _expect_str(target)
        return self.fetch_attr(target)(*args, **kwargs)

    def output(self, target: Target, args: tuple[Argument, ...], kwargs: dict[str, Any]) -> Any:
        """The value the graph returns."""
        return args[0]

    # -- helpers -------------------------------------------------------------

    def fetch_attr(self, target: str) -> Any:
        """Resolve dotted ``target`` on ``self.module``; RuntimeError names the
        first missing prefix."""
        value: Any = self.module
        atoms = target.split(".")
        for depth, atom in enumerate(atoms):
            if not hasattr(value, atom):
                missing = ".".join(atoms[: depth + 1])
                raise RuntimeError(f"Node referenced nonexistent target {missing}")
            value = getattr(value, atom)
        return value

    def fetch_args_kwargs_from_env(self, n: Node) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Concrete ``args`` and ``kwargs`` of ``n`` from the current ``env``."""
        args = self.map_nodes_to_values(n.args, n)
        if not isinstance(args, tuple):
            raise AssertionError(f"Expected args to be tuple, got {type(args)}")  # noqa: TRY004 (torch.fx parity)
        kwargs = self.map_nodes_to_values(n.kwargs, n)
        if not isinstance(kwargs, dict):
            raise AssertionError(f"Expected kwargs to be dict, got {type(kwargs)}")  # noqa: TRY004 (torch.fx parity)
        return args, kwargs

    def map_nodes_to_values(self, args: Argument, n: Node) -> Argument:
        """Replace every Node inside ``args`` by its value in ``env``; ``n`` (the
        node owning ``args``) only appears in the error message."""
        env = self.env

        def load(used: Node) -> Any:
            if used not in env:
                raise RuntimeError(
                    f"Node {n} referenced nonexistent value {used}! Run Graph.lint() "
                    f"to diagnose such issues"
                )
            return env[used]

        return map_arg(args, load)


def _expect_str(target: Target) -> None:
    if not isinstance(target, str):
        raise AssertionError(f"Expected target to be str, got {type(target)}")  # noqa: TRY004 (torch.fx parity)


# --------------------------------------------------------------------------
# Transformer
# --------------------------------------------------------------------------


class _TransformerTracer(Tracer):
    """Appends to a given graph and treats every submodule as a leaf."""

    def __init__(self, graph: Graph) -> None:
        super().__init__()
        self.graph = graph
        self.tensor_attrs: dict[torch.Tensor, str] = {}

    def is_leaf_module(self, _: torch.nn.Module, __: str) -> bool:
        return True


def _carry_meta(source: Node, created: list[Node]) -> None:
    """Copy provenance meta of an executed node onto the nodes made for it."""
    if not source.meta:
        return
    stack_trace = source.meta.get("stack_trace")
    for node in created:
        if node.op == "placeholder":
            continue
        if stack_trace:
            node.meta["stack_trace"] = stack_trace
        for field in COPIED_META_FIELDS:
            if field in source.meta:
                node.meta[field] = _shallow_copy(source.meta[field])


def _shallow_copy(value: Any) -> Any:
    copier = getattr(value, "copy", None)
    return copier() if callable(copier) and not isinstance(value, torch.Tensor) else value


class Transformer(Interpreter):
    """An Interpreter that runs on Proxies and records a new graph.

    ``transform()`` returns a new ``GraphModule`` holding the recorded graph;
    override the opcode methods to rewrite what gets recorded."""

    def __init__(self, module: GraphModule) -> None:
        super().__init__(module)
        self.new_graph = Graph()
        self.new_graph.set_codegen(module.graph._codegen)
        self.tracer = _TransformerTracer(self.new_graph)
        self.tracer.root = module

    def run_node(self, n: Node) -> Any:
        """Run ``n``; nodes it records inherit its provenance meta."""
        before = len(self.new_graph.nodes)
        result = super().run_node(n)
        added = len(self.new_graph.nodes) - before
        if added > 0:
            _carry_meta(n, list(itertools.islice(reversed(self.new_graph.nodes), added)))
        return result

    def placeholder(
        self, target: Target, args: tuple[Argument, ...], kwargs: dict[str, Any]
    ) -> Proxy:
        """Insert a placeholder (keeping its default value) into the new graph."""
        _expect_str(target)
        default = next(iter(args)) if args else inspect.Signature.empty
        return Proxy(self.new_graph.placeholder(target, default_value=default), self.tracer)

    def get_attr(self, target: Target, args: tuple[Argument, ...], kwargs: dict[str, Any]) -> Proxy:
        """Insert a get_attr node into the new graph."""
        _expect_str(target)
        return self.tracer.create_proxy("get_attr", target, args, kwargs)

    def call_module(self, target: Target, args: tuple[Argument, ...], kwargs: dict[str, Any]) -> Any:
        """Record a module call, honouring the tracer's leaf-module policy."""
        _expect_str(target)
        submodule = self.fetch_attr(target)
        return self.tracer.call_module(submodule, submodule.forward, args, kwargs)

    def call_function(
        self, target: Target, args: tuple[Argument, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Record a function call (wrapped functions stay wrapped)."""
        return self.tracer.create_proxy("call_function", target, args, kwargs)

    def transform(self) -> GraphModule:
        """Re-trace ``self.module`` through the overrides; return the new module."""
        result = super().run(enable_io_processing=False)
        if result is not None:
            returned = map_aggregate(result, lambda a: a.node if isinstance(a, Proxy) else a)
            new_output = self.new_graph.output(returned)
            old_output = next(iter(reversed(self.graph.nodes)))
            if old_output.op != "output":
                raise AssertionError(f"Expected output node, got op={old_output.op}")
            new_output.meta.update(old_output.meta)
        return GraphModule(self.module, self.new_graph)
