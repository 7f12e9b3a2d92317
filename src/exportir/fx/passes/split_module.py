"""``split_module``: partition a GraphModule into submodules chosen by a callback.

Each non-placeholder, non-get_attr node is assigned a partition by ``split_callback``; every
partition becomes a ``GraphModule`` child ``submod_<name>`` of the returned module, whose graph
calls the children in a topological order of their data dependencies (or in the order the
partitions first appear, with ``keep_original_order``). Values crossing a partition boundary
become placeholders of the consumer and outputs of the producer (a tuple of outputs is unpacked
with ``getitem`` nodes in the parent). Grad-mode (``torch._C._set_grad_enabled``) and autocast
(``torch.amp._enter_autocast`` / ``_exit_autocast``) regions that span partitions are re-entered
at the start of each later partition and, for autocast, exited at the end of each earlier one.

The output — node names, generated code, submodule names and call order — matches
``torch.fx.passes.split_module.split_module`` for the same graph and callback. The callback is
called the same number of times and in the same order as torch does, so stateful callbacks
partition identically.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable
from typing import Any

import torch

from exportir.fx.graph import Graph
from exportir.fx.graph_module import GraphModule
from exportir.fx.node import Node, map_arg

__all__ = ["Partition", "split_module"]

#: Calls whose global-state effect covers every node after them until they are undone.
_GLOBAL_STATE_TARGETS = (
    torch.amp._enter_autocast,
    torch.amp._exit_autocast,
    torch._C._set_grad_enabled,
)

#: The attribute naming a node's partition on the *input* graph's nodes (torch.fx sets it too).
_PARTITION_ATTR = "_fx_partition"


class Partition:
    """One partition of ``split_module``: its nodes, inputs, outputs and deps."""

    def __init__(self, name: str) -> None:
        self.name: str = name
        self.submod_name = f"submod_{name}"
        self.node_names: list[str] = []
        self.inputs: dict[str, None] = {}
        self.outputs: dict[str, None] = {}
        self.dependencies: dict[str, None] = {}
        self.dependents: dict[str, None] = {}
        self.graph: Graph = Graph()
        self.environment: dict[Node, Node] = {}
        self.targets: dict[str, Any] = {}

    def __repr__(self) -> str:
        return (
            f"name: {self.name},\n"
            f" nodes: {self.node_names},\n"
            f" inputs: {self.inputs},\n"
            f" outputs: {self.outputs},\n"
            f" partitions depended on: {self.dependencies},\n"
            f" partition dependents: {self.dependents}"
        )


def _get_attr_from_qualname(mod: torch.nn.Module, qualname: str) -> Any:
    value: Any = mod
    for atom in qualname.split("."):
        if not hasattr(value, atom):
            raise AttributeError(f"Node target {qualname} not found!")
        value = getattr(value, atom)
    return value


def _partition_of(node: Node | None) -> str | None:
    return getattr(node, _PARTITION_ATTR, None)


# --------------------------------------------------------------------------------------------
# Symbolic sizes: an input whose example value has symbolic sizes also needs those symbols.


def _sym_free_symbols(value: Any) -> set[Any]:
    node = getattr(value, "node", None)
    expr = getattr(node, "expr", None)
    return set(getattr(expr, "free_symbols", ()))


def _free_symbols(value: Any) -> set[Any]:
    """The sympy symbols in ``value``'s SymInts (a tensor's sizes, strides and offset)."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _sym_free_symbols(value)
    if isinstance(value, torch.Tensor):
        parts = [*value.size(), *value.stride(), value.storage_offset()]
        return set().union(*(_free_symbols(p) for p in parts))
    if isinstance(value, (list, tuple)):
        return set().union(set(), *(_free_symbols(v) for v in value))
    return set()


def _binding_symbol(node: Node) -> Any:
    """The plain symbol ``node``'s example value is, if it is a SymInt/SymFloat of one."""
    val = node.meta.get("example_value")
    if val is None or not isinstance(val, (torch.SymInt, torch.SymFloat)):
        return None
    expr = getattr(val.node, "expr", None)
    return expr if getattr(expr, "is_Symbol", False) else None


# --------------------------------------------------------------------------------------------
# The splitter: one object holding the state of one ``split_module`` call.


class _Splitter:
    def __init__(
        self,
        m: GraphModule,
        split_callback: Callable[[Node], int],
        partition_affix: str | None,
    ) -> None:
        self.m = m
        self.callback = split_callback
        self.affix = partition_affix
        self.partitions: dict[str, Partition] = {}
        self.orig_nodes: dict[str, Node] = {}
        self.symbol_to_node: dict[Any, Node] = {}
        self.grad_regions: dict[Node, Any] = {}
        self.autocast_regions: dict[Node, Any] = {}
        self.autocast_exits: dict[Node, Node | None] = {}

    # -- step 1: assign partitions and find global-state regions --------------------------

    def assign(self, node: Node) -> None:
        name = str(self.callback(node))
        if self.affix is not None:
            name = f"{self.affix}_{name}"
        partition = self.partitions.get(name)
        if partition is None:
            partition = self.partitions[name] = Partition(name)
        partition.node_names.append(node.name)
        setattr(node, _PARTITION_ATTR, name)

    def assign_all(self) -> None:
        active_grad: Node | None = None
        active_autocasts: dict[Node, None] = {}
        for node in self.m.graph.nodes:
            symbol = _binding_symbol(node)
            if symbol is not None and symbol not in self.symbol_to_node:
                self.symbol_to_node[symbol] = node
            if node.op in ("placeholder", "get_attr", "output"):
                continue
            self.assign(node)
            if node.op == "call_function" and node.target in _GLOBAL_STATE_TARGETS:
                active_grad = self._enter_region(node, active_grad, active_autocasts)
            if active_grad is not None:
                self.grad_regions[active_grad].add(self.callback(node))
            for enter in active_autocasts:
                self.autocast_regions[enter].add(self.callback(node))
        if any(v is None for v in self.autocast_exits.values()):
            raise AssertionError("autocast must exit")
        self.autocast_regions = {k: sorted(v) for k, v in self.autocast_regions.items()}
        self.grad_regions = {k: sorted(v) for k, v in self.grad_regions.items()}

    def _enter_region(
        self, node: Node, active_grad: Node | None, active_autocasts: dict[Node, None]
    ) -> Node | None:
        """Record a global-state node; returns the grad-mode node now in effect."""
        if node.target is torch._C._set_grad_enabled:
            if len(node.args) != 1:
                raise AssertionError(f"Expected 1 arg for _set_grad_enabled, got {len(node.args)}")
            if not isinstance(node.args[0], bool):
                raise AssertionError(f"Expected bool arg, got {type(node.args[0])}")
            self.grad_regions[node] = {self.callback(node)}
            return node
        if node.target is torch.amp._enter_autocast:
            if any(isinstance(a, Node) for a in node.args):
                raise AssertionError("Expected all args to be python constants, not Nodes")
            active_autocasts[node] = None
            self.autocast_regions[node] = {self.callback(node)}
            self.autocast_exits[node] = None
            return active_grad
        if len(node.args) != 1:
            raise AssertionError(f"Expected 1 arg for _exit_autocast, got {len(node.args)}")
        enter = node.args[0]
        self.autocast_regions[enter].add(self.callback(node))
        del active_autocasts[enter]
        self.autocast_exits[enter] = node
        return active_grad

    # -- step 2: dependencies between partitions ------------------------------------------

    def record_use(self, def_node: Node, use_node: Node | None) -> None:
        defined, used = _partition_of(def_node), _partition_of(use_node)
        if defined == used:
            return
        if defined is not None:
            producer = self.partitions[defined]
            producer.outputs.setdefault(def_node.name)
            if used is not None:
                producer.dependents.setdefault(used)
        if used is None:
            return
        consumer = self.partitions[used]
        consumer.inputs.setdefault(def_node.name)
        val = def_node.meta.get("example_value")
        if val is not None:
            for symbol in sorted(_free_symbols(val), key=str):
                self._use_symbol(symbol, consumer, used)
        if defined is not None:
            consumer.dependencies.setdefault(defined)

    def _use_symbol(self, symbol: Any, consumer: Partition, used: str) -> None:
        s_node = self.symbol_to_node[symbol]
        consumer.inputs.setdefault(s_node.name)
        if s_node.op == "placeholder":
            return
        s_defined = _partition_of(s_node)
        if s_defined is not None:
            producer = self.partitions[s_defined]
            producer.outputs.setdefault(s_node.name)
            producer.dependents.setdefault(used)
            consumer.dependencies.setdefault(s_defined)

    def record_all_uses(self) -> None:
        monotonic = bool(self.autocast_regions) or bool(self.grad_regions)
        highest = -1
        for node in self.m.graph.nodes:
            self.orig_nodes[node.name] = node
            if node.op in ("placeholder", "get_attr"):
                continue
            if node.op == "output":
                map_arg(node.args[0], lambda n: self.record_use(n, None))
                continue
            if monotonic:
                pid = self.callback(node)
                if highest > pid:
                    raise AssertionError(
                        "autocast or set_grad_enabled require monotonically increasing "
                        f"partitions: highest: {highest}, this node's: {pid}"
                    )
                highest = pid
            if node.target not in _GLOBAL_STATE_TARGETS:
                map_arg(node.args, lambda d, node=node: self.record_use(d, node))
                map_arg(node.kwargs, lambda d, node=node: self.record_use(d, node))

    def topological_order(self) -> list[str]:
        """Partitions in dependency order (a stack of ready partitions, as torch.fx does)."""
        ready = [name for name, p in self.partitions.items() if not p.dependencies]
        order: list[str] = []
        while ready:
            name = ready.pop()
            order.append(name)
            for dependent in self.partitions[name].dependents:
                waiting = self.partitions[dependent].dependencies
                waiting.pop(name)
                if not waiting:
                    ready.append(dependent)
        if len(order) != len(self.partitions):
            raise RuntimeError("cycle exists between partitions!")
        return order

    # -- step 3: build the partition graphs -----------------------------------------------

    def enter_prelude(self) -> None:
        """Re-enter grad/autocast regions at the start of every later partition they span."""
        for regions_mapping in (self.autocast_regions, self.grad_regions):
            for node, regions in regions_mapping.items():
                if not regions:
                    raise AssertionError("Expected at least one region for node")
                self.partitions[str(regions[0])].environment[node] = node
                for region in regions[1:]:
                    partition = self.partitions[str(region)]
                    copy = partition.graph.create_node(
                        op=node.op, target=node.target, args=tuple(node.args), kwargs={},
                        type_expr=node.type,
                    )
                    copy.meta = node.meta.copy()
                    partition.environment[node] = copy

    def add_inputs(self, partition: Partition, keep_original_input_name: bool) -> None:
        """Placeholders for ``partition``'s inputs (module-valued get_attrs become get_attrs)."""
        module_attrs = [i for i in partition.inputs if self._is_module_attr(self.orig_nodes[i])]
        values = [i for i in partition.inputs if i not in module_attrs]
        new_inputs: dict[str, None] = {}
        for inp in values + module_attrs:
            orig = self.orig_nodes[inp]
            if inp in module_attrs:
                new = partition.graph.get_attr(orig.target)
                partition.targets[orig.target] = _get_attr_from_qualname(self.m, orig.target)
            else:
                name = inp if keep_original_input_name else f"arg_{len(new_inputs)}"
                new = partition.graph.placeholder(name, type_expr=orig.type)
                new_inputs[inp] = None
            new.meta = orig.meta.copy()
            partition.environment[orig] = new
        partition.inputs = new_inputs

    def _is_module_attr(self, node: Node) -> bool:
        if node.op != "get_attr":
            return False
        if not isinstance(node.target, str):
            raise AssertionError(f"Expected str target, got {type(node.target)}")  # noqa: TRY004  # torch.fx raises this type
        return isinstance(_get_attr_from_qualname(self.m, node.target), torch.nn.Module)

    def copy_nodes(self, qualname_map: dict[str, str] | None, keep_name: bool) -> None:
        """Copy every partitioned node into its partition's graph, in the original order."""
        for node in self.m.graph.nodes:
            name = _partition_of(node)
            if name is None:
                continue
            partition = self.partitions[name]
            env = partition.environment
            target = node.target
            if node.op in ("call_module", "get_attr"):
                target = node.target.replace(".", "_")
                partition.targets[target] = _get_attr_from_qualname(self.m, node.target)
                if qualname_map is not None:
                    qualname_map[f"{partition.submod_name}.{target}"] = node.target
            new = partition.graph.create_node(
                op=node.op, target=target,
                args=map_arg(node.args, env.__getitem__),
                kwargs=map_arg(node.kwargs, env.__getitem__),
                type_expr=node.type, name=node.name if keep_name else None,
            )
            new.meta = node.meta.copy()
            env[node] = new

    def exit_epilogue(self) -> None:
        """Exit autocast regions at the end of every partition but the last they span."""
        for enter in reversed(self.autocast_regions):
            regions = self.autocast_regions[enter]
            if not regions:
                raise AssertionError("Expected at least one region")
            exit_node = self.autocast_exits[enter]
            for region in regions[:-1]:
                partition = self.partitions[str(region)]
                if exit_node is None:
                    raise AssertionError("Missing exit node")
                new = partition.graph.create_node(
                    op=exit_node.op, target=exit_node.target,
                    args=(partition.environment[enter],), kwargs={}, type_expr=exit_node.type,
                )
                new.meta = exit_node.meta.copy()


# --------------------------------------------------------------------------------------------
# The parent graph.


class _Parent:
    """The graph of the returned module: inputs, submodule calls, output."""

    def __init__(self, m: GraphModule, keep_original_node_name: bool) -> None:
        self.m = m
        self.keep_name = keep_original_node_name
        self.graph = Graph()
        self.env: dict[str, Node] = {}
        self.attrs: dict[str, Any] = {}
        self.constructed: set[Node] = set()

    def copy_input(self, node: Node) -> None:
        """Copy a placeholder or get_attr of the original graph (other nodes are ignored)."""
        if node.op == "placeholder":
            default = node.args[0] if node.args else inspect.Signature.empty
            if self.keep_name:
                args = () if default is inspect.Signature.empty else (default,)
                new = self.graph.create_node("placeholder", node.name, args=args,
                                             type_expr=node.type)
            else:
                new = self.graph.placeholder(node.target, type_expr=node.type,
                                             default_value=default)
        elif node.op == "get_attr":
            if not isinstance(node.target, str):
                raise AssertionError(f"Expected str target, got {type(node.target)}")
            new = self.graph.get_attr(node.target)
            self.attrs[node.target] = _get_attr_from_qualname(self.m, node.target)
        else:
            return
        new.meta = node.meta.copy()
        self.env[node.name] = new

    def copy_once(self, node: Node) -> None:
        if node not in self.constructed:
            self.copy_input(node)
            self.constructed.add(node)

    def call(self, partition: Partition, tuple_return: bool) -> None:
        """Emit the call of ``partition``'s submodule and bind its outputs by name."""
        self.attrs[partition.submod_name] = GraphModule(partition.targets, partition.graph)
        result = self.graph.call_module(
            partition.submod_name, tuple(self.env[name] for name in partition.inputs)
        )
        outputs = list(partition.outputs)
        if len(outputs) > 1 or (outputs and tuple_return):
            for i, name in enumerate(outputs):
                self.env[name] = self.graph.call_function(operator.getitem, (result, i))
        elif outputs:
            self.env[outputs[0]] = result


def _finish_partition(partition: Partition, splitter: _Splitter, tuple_return: bool) -> None:
    values = tuple(partition.environment[splitter.orig_nodes[n]] for n in partition.outputs)
    partition.graph.output(values[0] if len(values) == 1 and not tuple_return else values)


def split_module(
    m: GraphModule,
    root_m: torch.nn.Module,
    split_callback: Callable[[Node], int],
    qualname_map: dict[str, str] | None = None,
    keep_original_order: bool | None = False,
    keep_original_node_name: bool | None = False,
    keep_original_input_name: bool = True,
    *,
    partition_affix: str | None = None,
    tuple_return: bool = False,
) -> GraphModule:
    """Split ``m`` into one ``submod_<id>`` child per value ``split_callback`` returns.

    ``root_m`` is unused (kept for torch.fx compatibility). ``qualname_map``, if given, is
    filled with ``{"submod_<id>.<new target>": "<original target>"}`` for every call_module.
    ``keep_original_order`` emits the submodule calls in the order partitions first appear
    instead of a topological order; ``keep_original_node_name`` keeps node names inside the
    partitions; ``keep_original_input_name=False`` names partition inputs ``arg_<i>``;
    ``partition_affix`` names submodules ``submod_<affix>_<id>``; ``tuple_return`` makes every
    submodule return a tuple. The returned module's ``meta["partition_names"]`` is the set of
    submodule names created. Raises RuntimeError if the partitions depend on each other
    cyclically.
    """
    splitter = _Splitter(m, split_callback, partition_affix)
    splitter.assign_all()
    splitter.record_all_uses()
    first_seen = list(splitter.partitions)
    ordered = splitter.topological_order()
    splitter.enter_prelude()
    for name in ordered:
        splitter.add_inputs(splitter.partitions[name], keep_original_input_name)
    splitter.copy_nodes(qualname_map, bool(keep_original_node_name))
    splitter.exit_epilogue()

    parent = _Parent(m, bool(keep_original_node_name))
    if not keep_original_order:
        for node in m.graph.nodes:
            parent.copy_input(node)
    placeholders = [n for n in m.graph.nodes if n.op == "placeholder"]
    for name in first_seen if keep_original_order else ordered:
        partition = splitter.partitions[name]
        _finish_partition(partition, splitter, tuple_return)
        if keep_original_order:
            # Placeholders first, in their original order (the signature depends on it), then
            # whatever else this partition reads (get_attrs).
            for node in placeholders:
                parent.copy_once(node)
            for inp in partition.inputs:
                parent.copy_once(splitter.orig_nodes[inp])
        parent.call(partition, tuple_return)
    if keep_original_order and not parent.env:
        for node in m.graph.nodes:
            parent.copy_input(node)
    output = m.graph.output_node()
    parent.graph.output(map_arg(output.args[0], lambda n: parent.env[n.name]))

    result = GraphModule(parent.attrs, parent.graph)
    result.meta["partition_names"] = {p.submod_name for p in splitter.partitions.values()}
    return result
