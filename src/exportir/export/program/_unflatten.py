"""``unflatten(ep)``: the exported program as a tree of modules mirroring the original one.

An exported program is one flat graph; each node remembers, in ``nn_module_stack``, the module
calls it ran inside (``L__self__layer1``, ``L__self__layer1.lin``; the k-th repeated call of a
module is keyed ``...@k``). ``unflatten`` walks the graph of ``ep.module()`` in order and cuts
it into nested *call scopes* by those stacks. Each scope becomes a :class:`GraphModule` at the
module's FQN with its own graph:

- its inputs are the values its nodes use that are computed outside it (placeholders named
  after them), its outputs the values it computes that are used after it (one value, or a
  tuple read back with ``getitem``);
- parameters, buffers and constants stay at their original FQNs (each module holds its own, so
  ``named_parameters()`` gives the original names); a scope reads state under its own FQN with
  ``get_attr`` and receives other state (a tied weight of a sibling) as an input;
- the parent calls it with ``call_module``; a module called twice with the same graph is one
  module called twice, with different graphs the second is ``name@1``.

A submodule listed in ``preserve_module_call_signature`` keeps its original calling convention:
its ``forward`` takes the call's original arguments (``(args, kwargs)`` flattened by the
recorded ``in_spec``) and returns the original output structure (``out_spec``), and the parent
passes and reads exactly the recorded inputs and outputs, so the submodule can be replaced by
any module with that signature (``unflat.layer1 = MyLayer()``).

Nodes without a module stack (runtime asserts, ``sym_size``) stay in the scope open where they
stand; a node of a call scope that was already closed (its nodes interleaved with the parent's)
is computed in the innermost scope still open, which is equivalent.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from exportir import pytree
from exportir.export.program._unlift import _check_inputs_pre_hook, _install_state, submodule_path
from exportir.export.signature import ConstantArgument, ModuleCallSignature
from exportir.fx.graph import Graph
from exportir.fx.graph_module import GraphModule
from exportir.fx.node import Node

if TYPE_CHECKING:
    from exportir.export.program.exported_program import ExportedProgram

__all__ = ["UnflattenedModule", "unflatten"]

_ROOT_KEY = "L__self__"
_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


class UnflattenedModule(GraphModule):
    """The root of an unflattened program: its ``forward`` has the program's calling
    convention; its submodules are :class:`GraphModule` s at the original FQNs."""

    def __init__(self, root: Any, graph: Graph, module_call_graph: list[Any]) -> None:
        super().__init__(root, graph, class_name="UnflattenedModule")
        self.module_call_graph = module_call_graph


def unflatten(module: ExportedProgram, flat_args_adapter: Any = None) -> UnflattenedModule:
    """The module hierarchy of ``module`` (an ExportedProgram), as torch.export.unflatten."""
    if flat_args_adapter is not None:
        raise NotImplementedError(
            "unflatten(flat_args_adapter=...) is not supported: exportir's unflattened module "
            "takes the program's own inputs. Call unflatten(ep)."
        )
    if not hasattr(module, "module_call_graph") or not hasattr(module, "graph_signature"):
        raise TypeError(f"unflatten expects an ExportedProgram, got {type(module).__name__}")
    flat = module.module()
    root_scope = _scopes(flat.graph)
    preserved = {
        e.fqn: e.signature for e in module.module_call_graph if e.fqn and e.signature is not None
    }
    builder = _Builder(flat, preserved)
    root = builder.build_root(root_scope, module.module_call_graph)
    _install_state(root, module)  # parameters, buffers (persistence), constants at their FQNs
    _add_empty_calls(root, [e.fqn for e in module.module_call_graph])
    _order_children(root, [e.fqn for e in module.module_call_graph if e.fqn])
    # inputs are checked as ep.module() checks them (structure, static sizes, Dim ranges)
    root.range_constraints = module.range_constraints
    root.validate_inputs = True
    root.register_forward_pre_hook(_check_inputs_pre_hook, with_kwargs=True)
    return root


def _add_empty_calls(root: torch.nn.Module, called: list[str]) -> None:
    """Modules that were called but computed nothing (an eval-mode dropout): an empty module
    at their FQN, as torch.export.unflatten has."""
    for fqn in called:
        if not fqn or "@" in fqn:
            continue
        *prefix, last = fqn.split(".")
        module = submodule_path(root, prefix)
        if not isinstance(getattr(module, last, None), torch.nn.Module):
            graph = Graph()
            graph.output(None)
            module.add_module(last, GraphModule(torch.nn.Module(), graph, class_name="InterpreterModule"))


def _order_children(module: torch.nn.Module, fqns: list[str], prefix: str = "") -> None:
    """Children in the original module's order (``fqns``: the module call graph, which lists
    the original ``named_modules()``); ``name@k`` copies follow their first."""
    first: dict[str, int] = {}
    for i, fqn in enumerate(fqns):
        parts = fqn.split(".")
        for depth in range(1, len(parts) + 1):
            first.setdefault(".".join(parts[:depth]), i)
    _reorder(module, first, prefix)


def _reorder(module: torch.nn.Module, first: dict[str, int], prefix: str) -> None:
    def rank(item: tuple[int, tuple[str, Any]]) -> tuple[float, int]:
        position, (name, _) = item
        return (first.get(prefix + name.split("@")[0], float("inf")), position)

    ordered = [child for _, child in sorted(enumerate(module._modules.items()), key=rank)]
    module._modules.clear()
    module._modules.update(ordered)
    for name, child in ordered:
        if child is not None:
            _reorder(child, first, f"{prefix}{name.split('@')[0]}.")


# ---------------------------------------------------------------------------- call scopes


@dataclasses.dataclass(slots=True)
class _Scope:
    """One module call: its key (``L__self__layer1@1``), FQN, call index, and its items in
    graph order (nodes and nested calls)."""

    key: str
    fqn: str
    call: int
    items: list[Any] = dataclasses.field(default_factory=list)

    def nodes(self) -> Iterable[Node]:
        for item in self.items:
            if isinstance(item, _Scope):
                yield from item.nodes()
            else:
                yield item


def _stack_of(node: Node) -> list[tuple[str, str]] | None:
    stack = node.meta.get("nn_module_stack")
    if stack is None:
        return None
    return [(key, entry[0]) for key, entry in stack.items() if entry[0] != ""]


def _scopes(graph: Graph) -> _Scope:
    """Cut ``graph``'s computing nodes into nested call scopes (placeholders, get_attr and the
    output stay out: they belong to the root's frame)."""
    root = _Scope(_ROOT_KEY, "", 0)
    open_scopes = [root]
    closed: set[str] = set()
    owner: dict[Node, list[_Scope]] = {}  # node -> the scopes it is inside, outer -> inner
    writes = []
    for node in graph.nodes:
        if node.op in ("placeholder", "get_attr", "output"):
            continue
        stack = _stack_of(node)
        if _is_write_back(node, stack):
            writes.append(node)
            continue
        if stack is not None:
            _enter(open_scopes, closed, stack)
        open_scopes[-1].items.append(node)
        owner[node] = list(open_scopes)
    for node in writes:
        _place_write_back(node, root, owner)
    return root


def _enter(open_scopes: list[_Scope], closed: set[str], stack: list[tuple[str, str]]) -> None:
    """Make ``open_scopes`` follow ``stack``: close the calls it left, open the new ones."""
    depth = 1
    while depth < len(open_scopes) and depth <= len(stack) and \
            open_scopes[depth].key == stack[depth - 1][0]:
        depth += 1
    for scope in open_scopes[depth:]:
        closed.add(scope.key)
    del open_scopes[depth:]
    for key, fqn in stack[depth - 1:]:
        if key in closed:  # a call that already ended: computed where we are
            break
        call = int(key.rsplit("@", 1)[1]) if "@" in key.rsplit(".", 1)[-1] else 0
        scope = _Scope(key, fqn, call)
        open_scopes[-1].items.append(scope)
        open_scopes.append(scope)


def _is_write_back(node: Node, stack: Any) -> bool:
    """``copy_(buffer, new value)`` that ``module()`` adds for a mutated buffer."""
    return (
        stack is None
        and node.target is torch.ops.aten.copy_.default
        and isinstance(node.args[0], Node)
        and node.args[0].op == "get_attr"
    )


def _place_write_back(node: Node, root: _Scope, owner: dict[Node, list[_Scope]]) -> None:
    """A buffer's write-back goes at the end of the innermost call that computed the new value
    and owns the buffer (so a module with a preserved signature updates its own state), when
    nothing reads the old value after it; else at the end of the root."""
    buffer, value = node.args[0], node.args[1]
    scopes = owner.get(value, [root]) if isinstance(value, Node) else [root]
    target = next(s for s in reversed(scopes) if _under(buffer.target, s.fqn))
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    last_in_target = max((order[n] for n in target.nodes()), default=-1)
    if target is not root and all(
        order[u] <= last_in_target for u in buffer.users if u is not node
    ):
        target.items.append(node)
    else:
        root.items.append(node)


# ---------------------------------------------------------------------------- building


def _under(target: str, prefix: str) -> bool:
    return not prefix or target.startswith(prefix + ".")


def _relative(target: str, prefix: str) -> str:
    return target[len(prefix) + 1:] if prefix else target


def _fetch(module: torch.nn.Module, fqn: str) -> Any:
    for atom in fqn.split("."):
        module = getattr(module, atom)
    return module


class _Builder:
    """Builds the GraphModule of each scope, innermost first."""

    def __init__(self, flat: GraphModule, preserved: dict[str, ModuleCallSignature]) -> None:
        self._flat = flat
        self._preserved = preserved
        self._by_name = {n.name: n for n in flat.graph.nodes}
        self._built: dict[str, list[tuple[GraphModule, tuple]]] = {}  # fqn -> (module, graph)

    # -- the root ---------------------------------------------------------------------------

    def build_root(self, scope: _Scope, module_call_graph: list[Any]) -> UnflattenedModule:
        graph = Graph()
        graph.set_codegen(self._flat.graph._codegen)
        attrs: dict[str, Any] = {"_in_spec": self._flat._in_spec, "_out_spec": self._flat._out_spec}
        env: dict[Node, Any] = {}
        for node in self._flat.graph.find_nodes(op="placeholder"):
            env[node] = graph.node_copy(node)
        self._fill(graph, scope, env, attrs)
        output = self._flat.graph.output_node()
        graph.output(_map(output.args[0], self._reader(graph, "", env, attrs)))
        root = UnflattenedModule(attrs, graph, module_call_graph)
        root._in_spec, root._out_spec = self._flat._in_spec, self._flat._out_spec
        return root

    # -- one scope's body -------------------------------------------------------------------

    def _fill(self, graph: Graph, scope: _Scope, env: dict[Node, Any], attrs: dict[str, Any]) -> None:
        read = self._reader(graph, scope.fqn, env, attrs)
        for item in scope.items:
            if isinstance(item, _Scope):
                self._call(graph, scope, item, env, attrs)
            else:
                env[item] = graph.node_copy(item, read)

    def _reader(self, graph: Graph, prefix: str, env: dict[Node, Any], attrs: dict[str, Any]) -> Any:
        """Maps a node of the flat graph to its value in this scope's graph; state under the
        scope's FQN is read with a get_attr the first time."""

        def read(node: Node) -> Any:
            if node in env:
                return env[node]
            if node.op == "get_attr" and _under(node.target, prefix):
                target = _relative(node.target, prefix)
                attrs[target] = _fetch(self._flat, node.target)
                env[node] = graph.get_attr(target)
                env[node].meta.update(node.meta)
                return env[node]
            # a module with a preserved signature gets only its call's inputs: it computes
            # sizes again from them and holds the program's subgraphs (cond branches) itself
            if node.op == "get_attr" and "." not in node.target:
                value = _fetch(self._flat, node.target)
                if isinstance(value, torch.nn.Module):
                    attrs[node.target] = value
                    env[node] = graph.get_attr(node.target)
                    return env[node]
            if node.op == "call_function" and isinstance(node.meta.get("val"), _SYMBOLIC):
                env[node] = graph.node_copy(node, read)
                return env[node]
            raise NotImplementedError(
                f"unflatten: module {prefix!r} uses {node.name}, which is computed outside it "
                "and is not an input of its preserved call signature; pass that value to the "
                "module as an argument, or do not preserve its signature"
            )

        return read

    # -- a nested call ----------------------------------------------------------------------

    def _call(
        self, graph: Graph, parent: _Scope, scope: _Scope, env: dict[Node, Any], attrs: dict[str, Any]
    ) -> None:
        signature = self._preserved.get(_call_name(scope))
        inside = set(scope.nodes())
        if signature is not None:
            inputs, outputs = self._signature_values(signature)
        else:
            inputs, outputs = _boundary(inside, scope.fqn)
        module = self._module(scope, inputs, outputs, signature)
        name = self._attach(parent, scope, module, attrs)
        read = self._reader(graph, parent.fqn, env, attrs)
        if signature is not None:
            self._call_preserved(graph, name, signature, inputs, outputs, read, env, attrs)
            return
        result = _call_module(graph, name, tuple(read(n) for n in inputs), {})
        if len(outputs) == 1:
            env[outputs[0]] = result
            return
        for i, out in enumerate(outputs):
            env[out] = graph.call_function(operator.getitem, (result, i))
            env[out].meta.update(out.meta)

    def _module(
        self, scope: _Scope, inputs: list[Any], outputs: list[Node],
        signature: ModuleCallSignature | None,
    ) -> GraphModule:
        graph = Graph()
        attrs: dict[str, Any] = {}
        env: dict[Node, Any] = {}
        if signature is not None:
            self._preserved_inputs(graph, signature, inputs, env, attrs)
        else:
            for node in inputs:
                env[node] = graph.placeholder(node.name)
                env[node].meta.update(node.meta)
        self._fill(graph, scope, env, attrs)
        read = self._reader(graph, scope.fqn, env, attrs)
        if signature is not None:
            leaves = [read(n) if isinstance(n, Node) else n for n in outputs]
            attrs["_out_spec"] = signature.out_spec
            spec = graph.get_attr("_out_spec")
            graph.output(graph.call_function(pytree.tree_unflatten, (leaves, spec)))
        elif len(outputs) == 1:
            graph.output(read(outputs[0]))
        else:
            graph.output(tuple(read(n) for n in outputs))
        return GraphModule(attrs, graph, class_name="InterpreterModule")

    def _attach(self, parent: _Scope, scope: _Scope, module: GraphModule, attrs: dict) -> str:
        """The name the parent calls ``module`` by: the module's FQN relative to the parent
        (the first call's module again when a repeated call computes the same)."""
        name = _relative(scope.fqn, parent.fqn) if _under(scope.fqn, parent.fqn) else scope.fqn
        code = _structure(module)
        built = self._built.setdefault(scope.fqn, [])
        for k, (other, other_code) in enumerate(built):
            if other_code == code:
                attrs[_suffixed(name, k)] = other
                return _suffixed(name, k)
        built.append((module, code))
        name = _suffixed(name, len(built) - 1)
        attrs[name] = module
        return name

    # -- preserved call signatures ----------------------------------------------------------

    def _signature_values(self, signature: ModuleCallSignature) -> tuple[list[Any], list[Any]]:
        def value(arg: Any) -> Any:
            if isinstance(arg, ConstantArgument):
                return arg.value
            node = self._by_name.get(arg.name)
            if node is None:
                raise NotImplementedError(
                    f"unflatten: the preserved signature names {arg.name!r}, which the program's "
                    "graph does not compute"
                )
            return node

        return [value(a) for a in signature.inputs], [value(a) for a in signature.outputs]

    def _preserved_inputs(
        self, graph: Graph, signature: ModuleCallSignature, inputs: list[Any],
        env: dict[Node, Any], attrs: dict[str, Any],
    ) -> None:
        """Placeholders for the original call's arguments, flattened by the in_spec."""
        spec = signature.in_spec
        args_spec, kwargs_spec = spec.child(0), spec.child(1)
        positional = [graph.placeholder(f"_positional_arg_{i}") for i in range(args_spec.num_children)]
        keywords = {k: graph.placeholder(k) for k in kwargs_spec.context}
        attrs["_in_spec"] = spec
        spec_node = graph.get_attr("_in_spec")
        flat = graph.call_function(_flatten_as, ((tuple(positional), keywords), spec_node))
        for i, node in enumerate(inputs):
            if isinstance(node, Node):
                env[node] = graph.call_function(operator.getitem, (flat, i))
                env[node].meta.update(node.meta)

    def _call_preserved(
        self, graph: Graph, name: str, signature: ModuleCallSignature, inputs: list[Any],
        outputs: list[Any], read: Any, env: dict[Node, Any], attrs: dict[str, Any],
    ) -> None:
        leaves = [read(n) if isinstance(n, Node) else n for n in inputs]
        args, kwargs = pytree.tree_unflatten(leaves, signature.in_spec)
        result = _call_module(graph, name, tuple(args), dict(kwargs))
        spec_name = f"_out_spec_{name.replace('.', '_').replace('@', '_')}"
        attrs[spec_name] = signature.out_spec
        flat = graph.call_function(_flatten_as, (result, graph.get_attr(spec_name)))
        for i, node in enumerate(outputs):
            if isinstance(node, Node):
                env[node] = graph.call_function(operator.getitem, (flat, i))
                env[node].meta.update(node.meta)


def _call_module(graph: Graph, target: str, args: tuple, kwargs: dict) -> Node:
    """``call_module`` node whose name never shadows ``self`` (BERT has a submodule "self")."""
    name = target.replace(".", "_").replace("@", "_")
    if name == "self":
        name = "self_module"
    return graph.create_node("call_module", target, args, kwargs, name=name)


def _flatten_as(value: Any, spec: pytree.TreeSpec) -> list[Any]:
    """The leaves of ``value``, which must have the structure ``spec`` (a swapped-in module
    returning something else fails here, naming both)."""
    leaves, got = pytree.tree_flatten(value)
    if got != spec:
        raise ValueError(
            f"unflatten: a module with a preserved call signature got or returned {got}, "
            f"expected {spec}"
        )
    return leaves


def _boundary(inside: set[Node], prefix: str) -> tuple[list[Node], list[Node]]:
    """Values a scope takes from outside (in first-use order; state under its FQN excluded)
    and values it computes that are used outside (in graph order)."""
    inputs: dict[Node, None] = {}
    outputs: list[Node] = []
    for node in _ordered(inside):
        for a in node.all_input_nodes:
            if a in inside or (a.op == "get_attr" and _under(a.target, prefix)):
                continue
            inputs.setdefault(a)
        if any(user not in inside for user in node.users):
            outputs.append(node)
    return list(inputs), outputs


def _ordered(nodes: set[Node]) -> list[Node]:
    if not nodes:
        return []
    graph = next(iter(nodes)).graph
    return [n for n in graph.nodes if n in nodes]


def _structure(module: GraphModule) -> tuple:
    """``module``'s graph up to node names, and its submodules' (two calls computing the same
    share one module)."""
    index = {n: i for i, n in enumerate(module.graph.nodes)}

    def arg(a: Any) -> Any:
        if isinstance(a, Node):
            return ("%", index[a])
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, *map(arg, a))
        if isinstance(a, dict):
            return ("dict", *((k, arg(v)) for k, v in a.items()))
        return repr(a)

    nodes = tuple(
        (n.op, "" if n.op == "placeholder" else str(n.target), arg(n.args), arg(n.kwargs))
        for n in module.graph.nodes
    )
    children = tuple((name, _structure(c)) for name, c in module.named_children()
                     if isinstance(c, GraphModule))
    return nodes, children


def _call_name(scope: _Scope) -> str:
    return scope.fqn if scope.call == 0 else f"{scope.fqn}@{scope.call}"


def _suffixed(name: str, k: int) -> str:
    return name if k == 0 else f"{name}@{k}"


def _map(value: Any, fn: Any) -> Any:
    if isinstance(value, Node):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return value
