"""``to_backend``: lower an Edge program, or the parts a partitioner claims, to backends.

Two forms, as in ExecuTorch's ``exir.backend.backend_api.to_backend``:

- ``to_backend(backend_id, edge_program, compile_specs) -> LoweredBackendModule`` lowers a whole
  program (an Edge ``ExportedProgram``, or a graph module whose nodes carry ``meta["val"]``).
- ``to_backend(edge_program, partitioner) -> ExportedProgram`` asks ``partitioner`` to tag the
  nodes its backends take, then replaces each tagged partition by one delegate call::

      %lowered_module_0 = get_attr[target=lowered_module_0]
      %executorch_call_delegate = call_function[target=executorch_call_delegate](
          args = (%lowered_module_0, %x, %p_weight))
      %getitem = call_function[target=operator.getitem](args = (%executorch_call_delegate, 0))

  The input program is left untouched. Constant placeholders the partitioner tagged move into
  the partition (and out of the parent's signature and state); the result is a Backend-dialect
  program verified by ``BackendVerifier``.

Backends are looked up by id in ``registry`` (default: every ``BackendDetails`` subclass
imported so far, see :func:`exportir.dialects.backend.default_backend_registry`).
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Sequence
from typing import Any

import torch

from exportir import pytree
from exportir.dialects.backend import (
    DELEGATION_TAG,
    BackendDetails,
    BackendRegistry,
    BackendVerifier,
    CompileSpec,
    LoweredBackendModule,
    Partitioner,
    PartitionResult,
    PreprocessResult,
    default_backend_registry,
    executorch_call_delegate,
)
from exportir.dialects.edge.config import CONFIG_META_KEY, EdgeCompileConfig
from exportir.dialects.edge.verifier import EdgeVerifier
from exportir.export.capture.fake import shape_env_of
from exportir.export.program.exported_program import (
    ExportedProgram,
    ModuleCallEntry,
    ModuleCallSignature,
    _rename_call_graph,
    _signature_after_rewrite,
)
from exportir.export.signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    SymIntArgument,
    TensorArgument,
)
from exportir.fx.graph_module import GraphModule
from exportir.fx.node import Node
from exportir.passes.partition import (
    Partition,
    PartitionError,
    collect_partitions,
    extract_subgraph,
    stable_topological_sort,
)

__all__ = ["to_backend"]

_STATE_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def to_backend(*args: Any, registry: BackendRegistry | None = None) -> Any:
    """``to_backend(backend_id, program, compile_specs)`` or ``to_backend(program, partitioner)``
    (see the module docstring)."""
    if args and isinstance(args[0], (str, type)):
        if len(args) not in (2, 3):
            raise TypeError(
                "to_backend(backend_id, edge_program, compile_specs) takes 2 or 3 "
                f"positional arguments; got {len(args)}"
            )
        backend_id, program = args[0], args[1]
        specs = args[2] if len(args) == 3 else ()
        return lower_program(backend_id, program, specs, registry=registry)
    if len(args) != 2:
        raise TypeError(
            f"to_backend(edge_program, partitioner) takes 2 positional arguments; got {len(args)}"
        )
    return lower_partitions(args[0], args[1], registry=registry)


# ------------------------------------------------------------------------------ whole program


def _backend(backend: str | type[BackendDetails], registry: BackendRegistry | None) -> Any:
    if isinstance(backend, type):
        if not issubclass(backend, BackendDetails):
            raise TypeError(f"{backend.__name__} is not a BackendDetails subclass")
        return backend
    return (registry or default_backend_registry()).get(backend)


def _guards(program: ExportedProgram) -> tuple[Any, int]:
    """The program's ShapeEnv (None when its sizes are all static) and its guard count."""
    placeholders = program.graph.find_nodes(op="placeholder")
    env = shape_env_of([n.meta.get("val") for n in placeholders])
    return env, len(env.guards) if env is not None else 0


def _check_no_new_guards(env: Any, before: int, who: str) -> None:
    """A backend deciding a symbolic size (``s0 == 16``) records a guard in the program's
    ShapeEnv and silently narrows the sizes the program accepts (memory planning would then
    bound ``s0`` by 15): refuse it."""
    if env is None or len(env.guards) == before:
        return
    decided = ", ".join(str(g.expr) for g in env.guards[before:])
    raise PartitionError(
        f"{who} decided symbolic sizes of a dynamic program ({decided}); that would narrow "
        "the sizes the program accepts. A backend must not branch on symbolic sizes: compare "
        "them by expression (a.node.expr == b.node.expr) or treat them as unknown. To lower "
        "anyway, export without dynamic_shapes."
    )


def _preprocess(details: Any, program: ExportedProgram, specs: Sequence[CompileSpec]) -> bytes:
    env, before = _guards(program)
    result = details.preprocess(program, list(specs))
    _check_no_new_guards(env, before, f"{details.__name__}.preprocess")
    if not isinstance(result, PreprocessResult):
        raise TypeError(
            f"{details.__name__}.preprocess returned {type(result).__name__}; it must return "
            "PreprocessResult(processed_bytes=...)"
        )
    return result.processed_bytes


def lower_program(
    backend: str | type[BackendDetails],
    program: ExportedProgram | GraphModule,
    compile_specs: Sequence[CompileSpec] = (),
    *,
    registry: BackendRegistry | None = None,
) -> LoweredBackendModule:
    """Lower a whole program to ``backend`` (an id or a ``BackendDetails`` subclass)."""
    details = _backend(backend, registry)
    specs = tuple(compile_specs or ())
    if isinstance(program, GraphModule):
        program = program_from_graph_module(program)
    if not isinstance(program, ExportedProgram):
        raise TypeError(
            f"to_backend lowers an ExportedProgram or a GraphModule; got {type(program).__name__}"
        )
    data = _preprocess(details, program, specs)
    return LoweredBackendModule(program, details.backend_id, data, specs, runtime=details.runtime())


def _arg_for(node: Node) -> Any:
    val = node.meta.get("val")
    if isinstance(val, torch.SymInt):
        return SymIntArgument(node.name)
    if isinstance(val, torch.Tensor):
        return TensorArgument(node.name)
    raise PartitionError(
        f"value {node.name} ({type(val).__name__}) crosses a delegate boundary; delegates "
        "take and return tensors (and symbolic sizes). Leave its producer out of the partition."
    )


def _root_call_graph(inputs: list[Any], outputs: list[Any]) -> list[ModuleCallEntry]:
    in_spec = pytree.tree_flatten((tuple(range(len(inputs))), {}))[1]
    out_spec = pytree.tree_flatten(tuple(range(len(outputs))))[1]
    signature = ModuleCallSignature(inputs, outputs, in_spec, out_spec)
    return [ModuleCallEntry("", signature)]


def program_from_graph_module(gm: GraphModule) -> ExportedProgram:
    """An Edge program whose inputs are ``gm``'s placeholders and outputs its output tuple."""
    gm = copy.deepcopy(gm)
    gm.meta.setdefault(CONFIG_META_KEY, EdgeCompileConfig(_check_ir_validity=False))
    for node in gm.graph.nodes:
        if node.op == "call_function":
            node.meta.setdefault("stack_trace", "")
            node.meta.setdefault("nn_module_stack", {})
    output = gm.graph.output_node()
    outs = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    inputs = [_arg_for(n) for n in gm.graph.find_nodes(op="placeholder")]
    outputs = [_arg_for(n) for n in outs]
    signature = ExportGraphSignature(
        [InputSpec(InputKind.USER_INPUT, a, None) for a in inputs],
        [OutputSpec(OutputKind.USER_OUTPUT, a, None) for a in outputs],
    )
    return ExportedProgram(
        gm, gm.graph, signature, {}, {}, _root_call_graph(inputs, outputs), verifiers=[EdgeVerifier]
    )


# ------------------------------------------------------------------------------ partitions


def lower_partitions(
    program: ExportedProgram, partitioner: Partitioner, *, registry: BackendRegistry | None = None
) -> ExportedProgram:
    """Replace every partition ``partitioner`` tags by a delegate call (module docstring)."""
    if not isinstance(program, ExportedProgram):
        raise TypeError(
            f"to_backend(program, partitioner) needs an ExportedProgram; got "
            f"{type(program).__name__}"
        )
    gm = copy.deepcopy(program.graph_module)
    for node in gm.graph.nodes:
        node.meta.pop(DELEGATION_TAG, None)
    work = program._update(gm, copy.deepcopy(program.graph_signature))
    env, before = _guards(work)
    result = partitioner.partition(work)
    _check_no_new_guards(env, before, f"{type(partitioner).__name__}.partition")
    if not isinstance(result, PartitionResult):
        raise TypeError(
            f"{type(partitioner).__name__}.partition returned "
            f"{type(result).__name__}; it must return a PartitionResult"
        )
    tagged = result.tagged_exported_program
    partitions = collect_partitions(tagged.graph)
    unknown = sorted({p.tag for p in partitions} - set(result.partition_tags))
    if unknown:
        raise PartitionError(
            f"{type(partitioner).__name__} tagged nodes with {unknown}, which "
            "its PartitionResult.partition_tags does not map to a "
            "DelegationSpec; add them, or remove the tags"
        )
    if not partitions:
        return program
    lowering = _Lowering(tagged, registry)
    for tag in [p.tag for p in partitions]:
        # described again after each fusion: earlier fusions rewire this partition's inputs
        (partition,) = collect_partitions(tagged.graph, [tag])
        lowering.fuse(partition, result.partition_tags[tag])
    return lowering.finish()


class _Lowering:
    """Fuses partitions of one (copied, tagged) program in place, then rebuilds the program."""

    __slots__ = ("count", "gm", "input_kinds", "owned", "program", "registry")

    def __init__(self, program: ExportedProgram, registry: BackendRegistry | None) -> None:
        self.program = program
        self.gm = program.graph_module
        self.registry = registry
        self.owned: list[Node] = []
        self.count = sum(
            1
            for n in self.gm.graph.nodes
            if n.op == "get_attr" and str(n.target).startswith("lowered_module_")
        )
        self.input_kinds = {
            s.arg.name: s for s in program.graph_signature.input_specs if hasattr(s.arg, "name")
        }

    def fuse(self, partition: Partition, spec: Any) -> None:
        details = _backend(spec.backend_id, self.registry)
        sub = self.subprogram(partition)
        data = _preprocess(details, sub, spec.compile_specs)
        lowered = LoweredBackendModule(
            sub, details.backend_id, data, spec.compile_specs, runtime=details.runtime()
        )
        name = self._attr_name()
        self.gm.add_submodule(name, lowered)
        self._replace(partition, name)
        self.owned.extend(partition.owned)

    def _attr_name(self) -> str:
        while hasattr(self.gm, f"lowered_module_{self.count}"):
            self.count += 1
        name = f"lowered_module_{self.count}"
        self.count += 1
        return name

    def subprogram(self, partition: Partition) -> ExportedProgram:
        graph = extract_subgraph(partition)
        parent = self.program
        state: dict[str, Any] = {}
        constants: dict[str, Any] = {}
        input_specs = []
        for node in partition.owned:
            spec = self.input_kinds.get(node.name)
            if spec is None or spec.kind not in _STATE_KINDS:
                raise PartitionError(
                    f"placeholder {node.name} is tagged {partition.tag!r} but is not a "
                    "parameter, buffer or constant; only constant state can be handed to a "
                    "backend. Remove its tag."
                )
            if spec.kind == InputKind.BUFFER and _is_mutated(parent, spec.target):
                raise PartitionError(
                    f"buffer {spec.target} ({node.name}) is mutated by the program; it cannot "
                    "be handed to a backend. Remove the tag from its placeholder."
                )
            input_specs.append(
                InputSpec(spec.kind, TensorArgument(node.name), spec.target, spec.persistent)
            )
            if spec.target in parent.state_dict:
                state[spec.target] = parent.state_dict[spec.target]
            else:
                constants[spec.target] = parent.constants[spec.target]
        user_inputs = [_arg_for(n) for n in partition.inputs]
        input_specs += [InputSpec(InputKind.USER_INPUT, a, None) for a in user_inputs]
        outputs = [_arg_for(n) for n in partition.outputs]
        signature = ExportGraphSignature(
            input_specs, [OutputSpec(OutputKind.USER_OUTPUT, a, None) for a in outputs]
        )
        root = GraphModule({}, graph)
        config = self.gm.meta.get(CONFIG_META_KEY)
        if config is not None:
            root.meta[CONFIG_META_KEY] = config
        return ExportedProgram(
            root,
            graph,
            signature,
            state,
            copy.deepcopy(parent.range_constraints),
            _root_call_graph(user_inputs, outputs),
            constants=constants,
            verifiers=[EdgeVerifier],
        )

    def _replace(self, partition: Partition, name: str) -> None:
        graph = self.gm.graph
        last = partition.nodes[-1]
        first = partition.nodes[0]
        with graph.inserting_after(last):
            attr = graph.get_attr(name)
        with graph.inserting_after(attr):
            call = graph.call_function(executorch_call_delegate, (attr, *partition.inputs))
        call.meta.update(_call_meta(first))
        call.meta["val"] = tuple(n.meta.get("val") for n in partition.outputs)
        cursor = call
        for i, out in enumerate(partition.outputs):
            with graph.inserting_after(cursor):
                item = graph.call_function(operator.getitem, (call, i))
            item.meta.update(_call_meta(out))
            item.meta["val"] = out.meta.get("val")
            out.replace_all_uses_with(item)
            cursor = item
        for node in reversed(partition.nodes):
            graph.erase_node(node)
        stable_topological_sort(graph)

    def finish(self) -> ExportedProgram:
        gm, old = self.gm, self.program
        gm.recompile()
        signature, renames = _signature_after_rewrite(old.graph_signature, gm)
        call_graph = copy.deepcopy(old.module_call_graph)
        _rename_call_graph(call_graph, renames)
        owned = {n.name for n in self.owned}
        for node in self.owned:
            gm.graph.erase_node(node)
        gm.recompile()
        kept = [s for s in signature.input_specs if getattr(s.arg, "name", None) not in owned]
        # state handed over to a backend leaves the parent unless another input still reads it
        gone = {s.target for s in signature.input_specs if getattr(s.arg, "name", None) in owned}
        gone -= {s.target for s in kept}
        signature = ExportGraphSignature(kept, list(signature.output_specs))
        state = {k: v for k, v in old.state_dict.items() if k not in gone}
        constants = {k: v for k, v in old.constants.items() if k not in gone}
        return ExportedProgram(
            gm,
            gm.graph,
            signature,
            state,
            copy.deepcopy(old.range_constraints),
            call_graph,
            example_inputs=old.example_inputs,
            constants=constants,
            verifiers=[BackendVerifier],
        )


def _call_meta(node: Node) -> dict[str, Any]:
    return {
        "stack_trace": node.meta.get("stack_trace", ""),
        "nn_module_stack": node.meta.get("nn_module_stack", {}),
    }


def _is_mutated(program: ExportedProgram, target: str | None) -> bool:
    return any(
        s.kind == OutputKind.BUFFER_MUTATION and s.target == target
        for s in program.graph_signature.output_specs
    )
