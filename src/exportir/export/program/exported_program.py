"""``ExportedProgram``: an exported graph plus everything needed to run and describe it.

The object holds a GraphModule in the ATen dialect (flat inputs: lifted state, then user
inputs; flat outputs: mutated state, then user outputs), its ``ExportGraphSignature``, the
values of lifted state (``state_dict`` for parameters and persistent buffers, ``constants``
for tensor constants, non-persistent buffers and custom objects), symbolic-shape
``range_constraints``, the ``module_call_graph`` (input/output pytree specs of the root and
preserved submodules) and the example inputs. Constructor, properties, printing and
``module()`` / ``run_decompositions()`` follow ``torch.export.ExportedProgram``. The verifier
runs at the end of construction.
"""

from __future__ import annotations

import copy
import dataclasses
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import torch

from exportir import pytree
from exportir.export.capture._retrace import retrace
from exportir.export.capture.decomp_table import CustomDecompTable, as_plain_table
from exportir.export.control_flow.rules import CONTROL_FLOW
from exportir.export.program import _unlift
from exportir.export.program.verifier import Verifier
from exportir.export.signature import (
    ArgumentSpec,
    ConstantArgument,
    CustomObjArgument,
    ExportGraphSignature,
    InputKind,
    InputSpec,
    ModuleCallEntry,
    ModuleCallSignature,
    OutputKind,
    OutputSpec,
)
from exportir.fx._lazy_graph_module import _LazyGraphModule
from exportir.fx.codegen import CodeGen
from exportir.fx.graph import Graph
from exportir.fx.graph_module import GraphModule
from exportir.fx.node import Node

__all__ = [
    "ExportedProgram",
    "ModuleCallEntry",
    "ModuleCallSignature",
    "default_decompositions",
]


# ---------------------------------------------------------------------------- call graph


class CallSpec(NamedTuple):
    in_spec: pytree.TreeSpec | None
    out_spec: pytree.TreeSpec | None


# ---------------------------------------------------------------------------- decompositions


def default_decompositions() -> CustomDecompTable:
    """A fresh table decomposing ops to the core ATen op set (``torch.Tag.core``).

    Holds the core ATen decompositions and, for every preservable composite-implicit op
    (custom namespaces included, added when the table is first read), its composite kernel.
    Delete an op from it (``del table[op]`` / ``table.pop(op)``) to keep that op whole.
    """
    return CustomDecompTable()


# ---------------------------------------------------------------------------- the program


def _getitem_key(node: Node, names: dict[Node, str]) -> str | None:
    if node.op == "call_function" and node.target is operator.getitem:
        source, index = node.args
        if isinstance(source, Node) and source in names:
            return f"{names[source]}.{index}"
    return None


def _dedupe_getitems(gm: GraphModule, signature: ExportGraphSignature, call_graph: list) -> None:
    """Merge repeated ``getitem(x, i)`` nodes into the first one (as torch.export does)."""
    with gm._set_replace_hook(signature.get_replace_hook()):
        for module in gm.modules():
            if not isinstance(module, GraphModule):
                continue
            names: dict[Node, str] = {}
            first: dict[str, Node] = {}
            for node in list(module.graph.nodes):
                key = _getitem_key(node, names)
                if key is None:
                    names[node] = node.name
                elif key in first:
                    node.replace_all_uses_with(first[key])
                    for entry in call_graph:
                        if entry.signature is not None:
                            entry.signature.replace_all_uses_with(node, first[key])
                    module.graph.erase_node(node)
                else:
                    first[key] = node
                    names[node] = key


def _read_only(name: str) -> property:
    def get(self: ExportedProgram) -> Any:
        return getattr(self, f"_{name}")

    def refuse(self: ExportedProgram, value: Any) -> None:
        raise RuntimeError(f"Unable to set ExportedProgram's {name} attribute.")

    return property(get, refuse)


class ExportedProgram:
    """A program captured by ``exportir.export``: graph, signature, state and metadata.

    Call ``module()`` to get a runnable ``nn.Module`` with the original calling convention;
    ``run_decompositions()`` lowers the graph to the core ATen op set.
    """

    def __init__(
        self,
        root: torch.nn.Module | dict[str, Any],
        graph: Graph,
        graph_signature: ExportGraphSignature,
        state_dict: dict[str, torch.Tensor | torch.nn.Parameter],
        range_constraints: dict[Any, Any],
        module_call_graph: list[ModuleCallEntry],
        example_inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None,
        constants: dict[str, Any] | None = None,
        *,
        verifiers: list[type[Verifier]] | None = None,
    ) -> None:
        if module_call_graph is None:
            raise ValueError("module_call_graph must be a list of ModuleCallEntry (got None)")
        graph.set_codegen(CodeGen())  # a flat graph: no pytree codegen
        # code generated when first used (printed, run, pickled): often never
        self._graph_module = _LazyGraphModule(root, graph)
        if isinstance(root, GraphModule):
            self._graph_module.meta.update(root.meta)
        _dedupe_getitems(self._graph_module, graph_signature, module_call_graph)
        self._graph_signature = graph_signature
        self._state_dict = state_dict
        self._range_constraints = range_constraints
        self._module_call_graph = module_call_graph
        self._example_inputs = example_inputs
        self._constants = constants or {}
        verifiers = verifiers or [Verifier]
        bad = [v for v in verifiers if not (isinstance(v, type) and issubclass(v, Verifier))]
        if bad:
            raise TypeError(f"verifiers must be Verifier subclasses; got {bad}")
        self._verifiers = verifiers
        self.validate()  # always the last step of construction

    # -- read-only state ----------------------------------------------------------------------

    graph_module = _read_only("graph_module")
    graph_signature = _read_only("graph_signature")
    state_dict = _read_only("state_dict")
    range_constraints = _read_only("range_constraints")
    module_call_graph = _read_only("module_call_graph")
    constants = _read_only("constants")
    verifiers = _read_only("verifiers")

    @property
    def graph(self) -> Graph:
        return self._graph_module.graph

    @graph.setter
    def graph(self, value: Any) -> None:
        raise RuntimeError("Unable to set ExportedProgram's graph attribute.")

    @property
    def tensor_constants(self) -> dict[str, Any]:
        return self._constants

    @tensor_constants.setter
    def tensor_constants(self, value: Any) -> None:
        raise RuntimeError("Unable to set ExportedProgram's tensor_constants attribute.")

    @property
    def verifier(self) -> type[Verifier]:
        return self._verifiers[0]

    @verifier.setter
    def verifier(self, value: Any) -> None:
        raise RuntimeError("Unable to set ExportedProgram's verifier attribute.")

    @property
    def dialect(self) -> str:
        return self._verifiers[0].dialect

    @dialect.setter
    def dialect(self, value: Any) -> None:
        raise RuntimeError("Unable to set ExportedProgram's dialect attribute.")

    @property
    def call_spec(self) -> CallSpec:
        if not self._module_call_graph:
            return CallSpec(None, None)
        root = self._module_call_graph[0]
        if root.fqn != "":
            raise ValueError(
                f"module_call_graph[0] must describe the root module (fqn ''); got fqn {root.fqn!r}"
            )
        if root.signature is None:
            return CallSpec(None, None)
        return CallSpec(root.signature.in_spec, root.signature.out_spec)

    @call_spec.setter
    def call_spec(self, value: Any) -> None:
        raise RuntimeError("Unable to set ExportedProgram's call_spec attribute.")

    @property
    def example_inputs(self) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        return self._example_inputs

    @example_inputs.setter
    def example_inputs(self, value: tuple[tuple[Any, ...], dict[str, Any]] | None) -> None:
        if value is None:
            self._example_inputs = None
            return
        if not (
            isinstance(value, tuple)
            and len(value) == 2
            and isinstance(value[0], tuple)
            and isinstance(value[1], dict)
        ):
            raise ValueError(
                "Example inputs should be a tuple containing example arguments (as "
                "a tuple), and example kwargs (as a dictionary)."
            )
        if self.call_spec.in_spec is not None:
            _unlift.check_inputs_match(value[0], value[1], self.call_spec.in_spec)
        self._example_inputs = value

    # -- state iteration ----------------------------------------------------------------------

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        for _, param in self.named_parameters():
            yield param

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        for name in self._graph_signature.parameters:
            yield name, self._state_dict[name]

    def buffers(self) -> Iterator[torch.Tensor]:
        for _, buf in self.named_buffers():
            yield buf

    def named_buffers(self) -> Iterator[tuple[str, torch.Tensor]]:
        non_persistent = set(self._graph_signature.non_persistent_buffers)
        for name in self._graph_signature.buffers:
            if name in non_persistent or name not in self._state_dict:
                yield name, self._constants[name]
            else:
                yield name, self._state_dict[name]

    # -- running ------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "Unable to call ExportedProgram directly. "
            "You should use `exported_program.module()` instead."
        )

    def module(self, check_guards: bool = True) -> GraphModule:
        """A self-contained module running this program, with parameters/buffers inlined.

        It takes and returns the original (nested) structures, checks every call's inputs
        against the export-time shapes/dtypes/constants, and copies buffer (and user input)
        mutations back into its buffers (inputs) after each call.
        """
        return _unlift.unlift(self, check_guards=check_guards)

    def _user_input_placeholders(self) -> list[Node]:
        return list(_unlift._iter_user_placeholders(self))

    def _check_input_constraints(self, flat_args_with_path: list[tuple[Any, Any]]) -> None:
        _unlift.check_input_constraints(
            self._user_input_placeholders(), flat_args_with_path, self._range_constraints
        )

    def _get_flat_args_with_check(self, args: Any, kwargs: Any) -> tuple[tuple[Any, ...], Any]:
        """Flatten ``(args, kwargs)`` in the program's input order and check them."""
        in_spec = self.call_spec.in_spec
        if in_spec is not None:
            kwargs = _unlift.reorder_kwargs(kwargs, in_spec)
        flat_with_path, received = pytree.tree_flatten_with_path((args, kwargs))
        self._check_input_constraints(flat_with_path)
        return tuple(x for _, x in flat_with_path), received

    def _graph_module_flat_inputs(self, args: Any, kwargs: Any) -> tuple[Any, ...]:
        """``graph_module``'s inputs for a call ``(args, kwargs)``: lifted state + flat args."""
        in_spec = self.call_spec.in_spec
        if in_spec is not None:
            _unlift.check_inputs_match(args, kwargs, in_spec)
        flat_args, _ = self._get_flat_args_with_check(args, kwargs)
        lifted = [
            _unlift._state_value(self, spec)
            for spec in self._graph_signature.input_specs
            if spec.kind != InputKind.USER_INPUT and spec.kind != InputKind.TOKEN
        ]
        return (*lifted, *flat_args)

    def _num_lifted_params_buffers(self) -> int:
        specs = self._graph_signature.input_specs
        return next((i for i, s in enumerate(specs) if s.kind == InputKind.USER_INPUT), len(specs))

    # -- printing -----------------------------------------------------------------------------

    def __str__(self) -> str:
        graph_module = self._graph_module.print_readable(print_output=False, colored=False)
        graph_module = graph_module.replace("\n", "\n    ")
        graph_signature = str(self._graph_signature).replace("\n", "\n    ")
        return (
            "ExportedProgram:\n"
            f"    {graph_module}\n"
            f"Graph signature: {graph_signature}\n"
            f"Range constraints: {self._range_constraints}\n"
        )

    # -- transformations ----------------------------------------------------------------------

    def run_decompositions(
        self,
        decomp_table: Mapping[Any, Callable[..., Any]] | None = None,
        decompose_custom_triton_ops: bool = False,
    ) -> ExportedProgram:
        """A new program whose graph is re-traced through ``decomp_table``.

        ``None`` means ``default_decompositions()`` (the core ATen op set); ``{}`` keeps every
        op (a plain re-trace). As in torch.export, a composite-implicit op the table does not
        name stays whole, and an op the table names is decomposed by the table's entry.
        """
        table = as_plain_table(decomp_table)
        flat_fake = [n.meta["val"] for n in self.graph.find_nodes(op="placeholder")]
        mutated = frozenset(
            spec.arg.name
            for spec in self._graph_signature.output_specs
            if spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION)
        )
        # values named by preserved submodule signatures ride along as extra outputs, so the
        # re-traced graph tells which node now computes each (the output is restored after)
        extra = _call_graph_nodes(self.graph, self._module_call_graph)
        output = self.graph.output_node()
        old_args = output.args
        output.args = (tuple(old_args[0]) + tuple(extra),)
        try:
            new_gm = retrace(
                self._graph_module, flat_fake, decomposition_table=table,
                mutation_outputs=mutated, extension=CONTROL_FLOW,
            )  # fmt: skip
        finally:
            output.args = old_args
        call_renames = _drop_extra_outputs(new_gm, extra)
        signature, renames = _signature_after_rewrite(self._graph_signature, new_gm)
        remove_state_update_copies(new_gm, signature)
        call_graph = copy.deepcopy(self._module_call_graph)
        _rename_call_graph(call_graph, {**renames, **call_renames})
        return ExportedProgram(
            root=new_gm,
            graph=new_gm.graph,
            graph_signature=signature,
            state_dict=self._state_dict,
            range_constraints=self._range_constraints,
            module_call_graph=call_graph,
            example_inputs=self._example_inputs,
            constants=self._constants,
            verifiers=self._verifiers,
        )

    def _update(
        self,
        graph_module: GraphModule,
        graph_signature: ExportGraphSignature,
        *,
        state_dict: dict[str, Any] | None = None,
        constants: dict[str, Any] | None = None,
        verifiers: list[type[Verifier]] | None = None,
    ) -> ExportedProgram:
        """A copy of this program with a new graph module and signature."""
        return ExportedProgram(
            root=graph_module,
            graph=graph_module.graph,
            graph_signature=graph_signature,
            state_dict=state_dict if state_dict is not None else self._state_dict,
            range_constraints=copy.deepcopy(self._range_constraints),
            module_call_graph=copy.deepcopy(self._module_call_graph),
            example_inputs=self._example_inputs,
            constants=constants if constants is not None else self._constants,
            verifiers=verifiers if verifiers is not None else self._verifiers,
        )

    def _transform_do_not_use(self, *passes: Callable[[GraphModule], Any]) -> ExportedProgram:
        """Run FX passes over the graph module and rebuild the program around the result."""
        gm = self._graph_module
        modified = False
        for p in passes:
            result = p(gm)
            if result is not None:
                gm = result.graph_module
                modified = modified or result.modified
        if gm is self._graph_module and not modified:
            return self
        signature, renames = _signature_after_rewrite(self._graph_signature, gm)
        call_graph = copy.deepcopy(self._module_call_graph)
        _rename_call_graph(call_graph, renames)
        new = ExportedProgram(
            root=gm,
            graph=gm.graph,
            graph_signature=signature,
            state_dict=self._state_dict,
            range_constraints=self._range_constraints,
            module_call_graph=call_graph,
            example_inputs=self._example_inputs,
            constants=self._constants,
            verifiers=self._verifiers,
        )
        new.graph_module.meta.update(self._graph_module.meta)
        new.graph_module.meta.update(gm.meta)
        return new

    # -- verification -------------------------------------------------------------------------

    def validate(self) -> None:
        """Run every verifier; raises ``SpecViolationError`` on the first violation."""
        self._validate()

    def _validate(self) -> None:
        if not self._verifiers:
            raise ValueError("ExportedProgram must have at least one verifier.")
        for verifier in self._verifiers:
            verifier().check(self)


# ---------------------------------------------------------------------------- rewrites


def remove_state_update_copies(gm: GraphModule, signature: ExportGraphSignature) -> None:
    """Return ``new`` instead of ``aten.copy(old, new)`` for mutated buffers / parameters.

    Re-capturing a module that writes its buffers with ``copy_`` (as ``ExportedProgram.module()``
    does) records a functional ``copy`` whose result is the buffer's new value; the copy is
    redundant, the copied value is the update. The signature follows the renamed outputs.
    """
    mutated = {**signature.buffers_to_mutate, **signature.parameters_to_mutate}
    output = gm.graph.output_node()
    with gm._set_replace_hook(signature.get_replace_hook()):
        for value in list(output.args[0]):
            is_copy = isinstance(value, Node) and value.target is torch.ops.aten.copy.default
            if is_copy and value.name in mutated:
                value.replace_all_uses_with(value.args[1])
                gm.graph.erase_node(value)
    # (no recompile: the caller builds the new program's GraphModule from this graph)


def _renamed(arg: ArgumentSpec, node: Any) -> ArgumentSpec:
    if isinstance(arg, (ConstantArgument, CustomObjArgument)) or not isinstance(node, Node):
        return arg
    return dataclasses.replace(arg, name=node.name)


def _signature_after_rewrite(
    old: ExportGraphSignature, gm: GraphModule
) -> tuple[ExportGraphSignature, dict[str, str]]:
    """The signature of a rewritten graph whose inputs/outputs kept their positions."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    outputs = gm.graph.output_node().args[0]
    if len(placeholders) != len(old.input_specs) or len(outputs) != len(old.output_specs):
        raise RuntimeError(
            f"a rewrite changed the number of graph inputs/outputs ({len(old.input_specs)} -> "
            f"{len(placeholders)} inputs, {len(old.output_specs)} -> {len(outputs)} outputs); "
            "passes over an ExportedProgram must keep its inputs and outputs"
        )
    renames: dict[str, str] = {}
    inputs, outs = [], []
    for spec, node in zip(old.input_specs, placeholders):
        arg = _renamed(spec.arg, node)
        renames[getattr(spec.arg, "name", "")] = getattr(arg, "name", "")
        inputs.append(InputSpec(spec.kind, arg, spec.target, spec.persistent))
    for spec, node in zip(old.output_specs, outputs):
        arg = _renamed(spec.arg, node)
        renames[getattr(spec.arg, "name", "")] = getattr(arg, "name", "")
        outs.append(OutputSpec(spec.kind, arg, spec.target))
    return ExportGraphSignature(inputs, outs), renames


def _call_graph_nodes(graph: Graph, call_graph: list[ModuleCallEntry]) -> list[Node]:
    """Non-placeholder nodes named by the inputs/outputs of submodule call signatures."""
    names = {
        getattr(arg, "name", "")
        for entry in call_graph
        if entry.fqn and entry.signature is not None
        for arg in (*entry.signature.inputs, *entry.signature.outputs)
    }
    return [n for n in graph.nodes if n.name in names and n.op not in ("placeholder", "output")]


def _drop_extra_outputs(gm: GraphModule, extra: list[Node]) -> dict[str, str]:
    """Remove the trailing ``extra`` outputs from ``gm``; old name -> name of the new node."""
    if not extra:
        return {}
    output = gm.graph.output_node()
    flat = tuple(output.args[0])
    keep = len(flat) - len(extra)
    renames = {
        old.name: new.name for old, new in zip(extra, flat[keep:]) if isinstance(new, Node)
    }
    output.args = (flat[:keep],)
    if isinstance(output.meta.get("val"), tuple):
        output.meta["val"] = output.meta["val"][:keep]
    gm.graph.eliminate_dead_code()  # (the new program's GraphModule generates the code)
    return renames


def _rename_call_graph(call_graph: list[ModuleCallEntry], renames: dict[str, str]) -> None:
    for entry in call_graph:
        if entry.signature is None:
            continue
        for args in (entry.signature.inputs, entry.signature.outputs):
            for i, arg in enumerate(args):
                name = getattr(arg, "name", "")
                if name in renames and renames[name] != name:
                    args[i] = dataclasses.replace(arg, name=renames[name])
