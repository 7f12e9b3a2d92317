"""The Export IR verifier: one ``check(ep)`` with small hooks and allowlist semantics.

``Verifier.check`` runs when an ``ExportedProgram`` is built and from ``ep.validate()``. It
checks, in order:

1. graph structure: placeholders first, exactly one ``output`` node and it is last, plus the
   FX lint (topological order, unique names);
2. every node of the top-level graph and of every nested GraphModule (cond/map branches):
   ``call_function`` targets are allowed (``allowed_op_types`` or ``allowed_builtin_ops``, or a
   few symbolic-shape torch functions), functional in the ATen dialect, and carry the metadata
   contract of the Export IR spec; ``get_attr`` reads only submodules (or, inside nested
   graphs, tensors); there is no ``call_module`` / ``call_method``;
3. the graph signature matches the graph (one spec per placeholder and per output, same names,
   mutation outputs before user outputs and pointing at existing state) and the state_dict /
   constants hold every lifted parameter, buffer, constant and custom object;
4. module call graph entries name nodes that exist.

Anything no rule allows is rejected. Errors are ``SpecViolationError``s; the ones about a node
(``NodeSpecViolationError``) name it and print a window of the graph with the node marked.
A dialect subclasses ``Verifier``, sets ``dialect`` and overrides the hooks; it never
overrides ``check``.
"""

from __future__ import annotations

import inspect
import math
import operator
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, final

import torch
from torch._ops import HigherOrderOperator, OpOverload
from torch.utils import _pytree as torch_pytree

from exportir import pytree
from exportir.export.signature import (
    ConstantArgument,
    CustomObjArgument,
    InputKind,
    InputSpec,
    OutputKind,
    SymBoolArgument,
    SymFloatArgument,
    SymIntArgument,
    TensorArgument,
    TokenArgument,
)
from exportir.fx.graph_module import GraphModule
from exportir.fx.lint import graph_window
from exportir.fx.node import Node

if TYPE_CHECKING:
    from exportir.export.program.exported_program import ExportedProgram

__all__ = [
    "NodeSpecViolationError",
    "SpecViolationError",
    "TrainingIRVerifier",
    "Verifier",
    "load_verifier",
]


class SpecViolationError(Exception):
    """A program breaks the Export IR specification."""


class NodeSpecViolationError(SpecViolationError):
    """A ``SpecViolationError`` about one node; the message shows the graph around it."""

    def __init__(self, message: str, node: Node, graph: Any) -> None:
        super().__init__(f"{message}\n{graph_window(graph, node)}")
        self.node = node
        self.node_name = node.name


def _fail(node: Node, message: str) -> None:
    raise NodeSpecViolationError(message, node, node.graph)


# ---------------------------------------------------------------------------- value rules

_SCALAR_VALS = (
    type(None), int, bool, str, float,
    torch.memory_format, torch.dtype, torch.device, torch.layout,
    torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool,
    CustomObjArgument, torch.ScriptObject,
)  # fmt: skip


def _is_valid_val(val: Any) -> bool:
    if isinstance(val, _SCALAR_VALS):
        return True
    if isinstance(getattr(val, "script_class_name", None), str):  # a fake script object
        return True
    if isinstance(val, (list, tuple)):
        return all(_is_valid_val(v) for v in val)
    return False


def _has_no_returns(target: Any) -> bool:
    return isinstance(target, OpOverload) and len(target._schema.returns) == 0


def _check_val(node: Node) -> None:
    if "val" not in node.meta:
        if node.op == "call_function" and _has_no_returns(node.target):
            return
        _fail(
            node,
            f"Node.meta {node.name} is missing val field. Every placeholder and "
            "call_function node of an exported graph records the value it produces in "
            "meta['val'] (a fake tensor, SymInt/SymFloat/SymBool, a constant, or a "
            "list/tuple of these); set it when creating the node.",
        )
    val = node.meta["val"]
    if not _is_valid_val(val):
        _fail(
            node,
            f"Node.meta {node.name} has invalid val field {val!r} (of type "
            f"{type(val).__name__}); meta['val'] must be a fake tensor, SymInt/SymFloat/"
            "SymBool, a Python constant, or a list/tuple of these.",
        )


def _check_arguments(node: Node, op: OpOverload) -> None:
    """An operator's argument is one value: a node producing several (a tuple-returning op
    such as ``rrelu_with_noise_functional`` or ``split``) may only feed ``operator.getitem``."""
    schema = op._schema.arguments
    named = [(schema[i].name if i < len(schema) else f"#{i}", a) for i, a in enumerate(node.args)]
    for name, value in named + list(node.kwargs.items()):
        items = value if isinstance(value, (list, tuple)) else (value,)
        for item in items:
            val = item.meta.get("val") if isinstance(item, Node) else None
            if isinstance(val, (list, tuple)):
                _fail(
                    node,
                    f"operator '{op}' (node {node.name}) takes argument '{name}' from node "
                    f"{item.name}, which produces {len(val)} values (a multi-output "
                    f"operator), not one. Read the value it needs with operator.getitem "
                    f"(e.g. {item.name}[0]) and pass that node instead.",
                )


def _check_required_meta(node: Node, keys: Iterable[str]) -> None:
    missing = [k for k in keys if k not in node.meta]
    if missing:
        _fail(
            node,
            f"call_function node {node.name} ({_op_name(node.target)}) is missing "
            f"metadata {missing}; the Export IR metadata contract requires 'val', "
            "'stack_trace' and 'nn_module_stack' on every call_function node. Copy them "
            "from the node it replaces (node.meta.update(old.meta)) when rewriting a graph.",
        )


_MODULE_ALIASES = {"_operator": "operator", "builtins": ""}


def _op_name(target: Any) -> str:
    """``aten.add.Tensor``, ``torch.add``, ``operator.getitem``, ``round``."""
    if isinstance(target, (OpOverload, HigherOrderOperator)):
        return str(target)
    # Builtins' __qualname__ names their defining class (torch._VariableFunctionsClass.add).
    attrs = ("__name__", "__qualname__") if inspect.isbuiltin(target) else ("__qualname__",)
    name = next((getattr(target, a) for a in attrs if getattr(target, a, None)), None)
    if name is None:
        return repr(target)
    module = getattr(target, "__module__", None) or ""
    module = _MODULE_ALIASES.get(module, module)
    return f"{module}.{name}" if module else name


# ---------------------------------------------------------------------------- allow lists

_BUILTIN_OPS: tuple[Callable[..., Any], ...] = (
    operator.getitem, operator.add, operator.mul, operator.sub, operator.truediv,
    operator.ge, operator.le, operator.gt, operator.lt, operator.eq, operator.ne,
    operator.floordiv, operator.mod, operator.and_, operator.or_, operator.not_,
    operator.pow, operator.neg, operator.abs, operator.lshift, operator.rshift,
    math.ceil, math.floor, math.trunc, round,
)  # fmt: skip

# Symbolic-shape helpers and grad-mode switches that export graphs may call directly.
_TORCH_FUNCTIONS: tuple[Callable[..., Any], ...] = (
    torch.sym_int, torch.sym_float, torch.sym_ite, torch.sym_max, torch.sym_min,
    torch.sym_not, torch.sym_sqrt, torch.sym_sum,
    torch._C._set_grad_enabled, torch.autograd.grad_mode.set_grad_enabled,
    torch.amp.autocast_mode._enter_autocast, torch.amp.autocast_mode._exit_autocast,
)  # fmt: skip

_TREE_SPECS = (pytree.TreeSpec, torch_pytree.TreeSpec)


def _resolve_attr(gm: torch.nn.Module, node: Node) -> Any:
    target = node.target
    if not isinstance(target, str):
        _fail(
            node,
            f"get_attr node {node.name} has target {target!r} of type "
            f"{type(target).__name__}; get_attr targets are qualified attribute names (str).",
        )
    obj: Any = gm
    atoms = target.split(".")  # type: ignore[union-attr]  # checked to be str above
    for i, atom in enumerate(atoms):
        if not hasattr(obj, atom):
            _fail(
                node,
                f"get_attr node {node.name} references nonexistent attribute "
                f"{'.'.join(atoms[: i + 1])!r} of the graph module; register the submodule "
                "(gm.add_submodule) before referencing it.",
            )
        obj = getattr(obj, atom)
    return obj


# ---------------------------------------------------------------------------- the verifier

_REGISTRY: dict[str, type[Verifier]] = {}


class Verifier:
    """Checks that an ExportedProgram is valid Export IR in the dialect named ``dialect``.

    Hooks for dialects: ``allowed_builtin_ops``, ``allowed_op_types``,
    ``allowed_getattr_types`` (top level), ``allowed_getattr_types_for_subgm``,
    ``required_call_function_meta``, ``check_valid_op`` and ``check_additional``.
    """

    dialect: ClassVar[str] = "ATEN"
    # Whether ops with a mutable schema (in-place / out=) are rejected.
    functional: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in ("check", "_check_graph_module"):
            if name in cls.__dict__:
                raise TypeError(
                    f"{cls.__name__} overrides Verifier.{name}; dialects customise "
                    "the verifier through its hooks, never by replacing check()"
                )
        if cls.__dict__.get("dialect", "ATEN") == "ATEN":
            raise TypeError(f"{cls.__name__} must set a dialect name other than 'ATEN'")
        _REGISTRY[cls.dialect] = cls

    # -- hooks --------------------------------------------------------------------------------

    def allowed_builtin_ops(self) -> list[Callable[..., Any]]:
        return list(_BUILTIN_OPS)

    def allowed_op_types(self) -> tuple[type[Any], ...]:
        return (OpOverload, HigherOrderOperator)

    def allowed_getattr_types(self) -> tuple[type[Any], ...]:
        return (GraphModule, *_TREE_SPECS)

    def allowed_getattr_types_for_subgm(self) -> tuple[type[Any], ...]:
        # Branch graphs of higher-order ops may read weights directly.
        return (GraphModule, torch.nn.Parameter, torch.Tensor, *_TREE_SPECS)

    def required_call_function_meta(self) -> tuple[str, ...]:
        """Metadata keys every top-level call_function node must carry (besides ``val``)."""
        return ("stack_trace", "nn_module_stack")

    def check_valid_op(self, op: Any) -> None:
        """Dialect-specific check of one call_function target (raise SpecViolationError)."""

    def check_additional(self, gm: GraphModule) -> None:
        """Dialect-specific checks of the whole graph module."""

    # -- the check ----------------------------------------------------------------------------

    @final
    def check(self, ep: ExportedProgram) -> None:
        """Raise ``SpecViolationError`` if ``ep`` is not valid in this dialect."""
        self._check_graph_module(ep.graph_module)
        _check_signature(ep)
        _check_state(ep)
        _check_module_call_graph(ep)

    @final
    def _check_graph_module(self, gm: torch.nn.Module) -> None:
        if not isinstance(gm, GraphModule):
            raise SpecViolationError(
                f"an exported program's graph_module must be an exportir.fx "
                f"GraphModule; got {type(gm).__name__}"
            )
        _check_structure(gm.graph)
        for mod in gm.modules():
            if isinstance(mod, GraphModule):
                self._check_nodes(mod, top_level=mod is gm)
        self.check_additional(gm)

    def _check_nodes(self, mod: GraphModule, *, top_level: bool) -> None:
        try:
            mod.graph.lint()
        except (RuntimeError, ValueError) as e:
            raise SpecViolationError(f"the graph is malformed: {e}") from e
        getattr_types = (
            self.allowed_getattr_types() if top_level else self.allowed_getattr_types_for_subgm()
        )
        meta_keys = self.required_call_function_meta() if top_level else ()
        for node in mod.graph.nodes:
            if node.op == "call_function":
                _check_val(node)
                _check_required_meta(node, meta_keys)
                self._check_op(node)
            elif node.op == "placeholder":
                _check_val(node)
            elif node.op == "get_attr":
                _check_getattr(mod, node, getattr_types)
            elif node.op in ("call_module", "call_method"):
                _fail(
                    node,
                    f"{node.op} is not valid in an exported graph: got node {node.name} "
                    f"with target {node.target!r}. Export IR only calls functions (ATen "
                    "operators, higher-order operators, operator.getitem); inline the "
                    "submodule or method call.",
                )

    def _check_op(self, node: Node) -> None:
        op = node.target
        if not isinstance(op, self.allowed_op_types()):
            builtins = self.allowed_builtin_ops()
            if op not in builtins and op not in _TORCH_FUNCTIONS:
                _fail(
                    node,
                    f"Operator '{_op_name(op)}' (node {node.name}) is not an allowed "
                    f"operator type: {self.allowed_op_types()}. Valid builtin ops: "
                    f"{[_op_name(b) for b in builtins]}. Export graphs call ATen/custom "
                    "OpOverloads (torch.ops.aten.add.Tensor, not torch.add) or "
                    "higher-order operators.",
                )
        if isinstance(op, OpOverload) and self.functional and op._schema.is_mutable:
            _fail(
                node,
                f"operator '{op}' (node {node.name}) is not functional: its schema "
                f"mutates an input ({op._schema}). The {self.dialect} dialect is functional; "
                "use the out-of-place variant and return the new value as a mutation "
                "output.",
            )
        if isinstance(op, OpOverload):
            _check_arguments(node, op)
        try:
            self.check_valid_op(op)
        except SpecViolationError as e:
            if isinstance(e, NodeSpecViolationError):
                raise
            _fail(node, str(e))


class TrainingIRVerifier(Verifier):
    """The training IR: ATen ops, not necessarily functional (in-place ops allowed)."""

    dialect = "TRAINING"
    functional = False


def load_verifier(dialect: str) -> type[Verifier]:
    """The verifier class of ``dialect`` ("" and "ATEN" mean the base ``Verifier``)."""
    if dialect in ("", "ATEN"):
        return Verifier
    if dialect not in _REGISTRY:
        raise SpecViolationError(
            f"no verifier is registered for dialect {dialect!r}; known "
            f"dialects: {['ATEN', *_REGISTRY]}"
        )
    return _REGISTRY[dialect]


# ---------------------------------------------------------------------------- structure


def _check_structure(graph: Any) -> None:
    nodes = list(graph.nodes)
    if not nodes or nodes[-1].op != "output":
        last = nodes[-1] if nodes else None
        if last is None:
            raise SpecViolationError("the exported graph is empty; it needs an output node")
        _fail(
            last,
            f"the last node of an exported graph must be the output node; got "
            f"{last.op} node {last.name}. End the graph with graph.output((...)).",
        )
    seen_other = None
    for node in nodes:
        if node.op == "placeholder" and seen_other is not None:
            _fail(
                node,
                f"placeholder {node.name} comes after {seen_other.op} node "
                f"{seen_other.name}; all placeholders must come first, in signature order.",
            )
        if node.op == "output" and node is not nodes[-1]:
            _fail(
                node,
                f"the graph has more than one output node ({node.name} is not last); "
                "an exported graph has exactly one output node, at the end.",
            )
        if node.op != "placeholder":
            seen_other = seen_other or node


def _check_getattr(mod: GraphModule, node: Node, allowed: tuple[type[Any], ...]) -> None:
    attr = _resolve_attr(mod, node)
    if isinstance(attr, torch.nn.Module) and type(attr).__name__ == "LoweredBackendModule":
        return  # the backend dialect verifies its delegates
    if not isinstance(attr, allowed):
        _fail(
            node,
            f"Invalid get_attr type {type(attr).__name__} on target {node.target}. "
            f"Valid get_attr types: {tuple(t.__name__ for t in allowed)}. Parameters, "
            "buffers and constants of an exported program are lifted to placeholders "
            "described by the graph signature, not read with get_attr.",
        )


# ---------------------------------------------------------------------------- signature

_NODE_ARGS = (TensorArgument, SymIntArgument, SymFloatArgument, SymBoolArgument)
_MUTATION_KINDS = (
    OutputKind.BUFFER_MUTATION,
    OutputKind.PARAMETER_MUTATION,
    OutputKind.USER_INPUT_MUTATION,
)


def _check_signature(ep: ExportedProgram) -> None:
    graph = ep.graph_module.graph
    placeholders = graph.find_nodes(op="placeholder")
    _check_input_specs(ep, placeholders)
    _check_output_specs(ep, graph.output_node())


def _check_input_specs(ep: ExportedProgram, placeholders: list[Node]) -> None:
    specs = ep.graph_signature.input_specs
    if len(placeholders) != len(specs):
        spec_names = [getattr(s.arg, "name", None) for s in specs]
        node_names = [p.name for p in placeholders]
        raise SpecViolationError(
            f"Number of graph inputs ({len(placeholders)}) does not match number of inputs in "
            f"the graph signature ({len(specs)})\n"
            f"Placeholders missing input_specs: {[n for n in node_names if n not in spec_names]}\n"
            f"Input_specs missing placeholders: {[n for n in spec_names if n not in node_names]}"
        )
    for spec, node in zip(specs, placeholders):
        named = isinstance(spec.arg, (*_NODE_ARGS, CustomObjArgument, TokenArgument))
        if named and spec.arg.name != node.name:
            _fail(
                node,
                f"Input spec name {spec.arg.name} does not match node name "
                f"{node.name}; input_specs list one spec per placeholder, in graph order.",
            )
        _check_input_kind(spec, node)


# kind -> (required argument type, what the argument is called in messages)
_INPUT_ARGUMENT_RULES: dict[InputKind, tuple[tuple[type, ...], str]] = {
    InputKind.PARAMETER: ((TensorArgument,), "tensor argument"),
    InputKind.BUFFER: ((TensorArgument,), "tensor argument"),
    InputKind.CONSTANT_TENSOR: ((TensorArgument,), "tensor argument"),
    InputKind.CUSTOM_OBJ: ((CustomObjArgument,), "custom object argument"),
    InputKind.TOKEN: ((TokenArgument,), "token argument"),
    InputKind.USER_INPUT: ((*_NODE_ARGS, ConstantArgument, CustomObjArgument), "user input"),
}


def _check_input_kind(spec: InputSpec, node: Node) -> None:
    arg_types, what = _INPUT_ARGUMENT_RULES[spec.kind]
    if not isinstance(spec.arg, arg_types):
        _fail(
            node, f"{spec.kind.name} input {node.name} is not a {what}. Found {spec.arg} instead."
        )
    if spec.kind in (InputKind.USER_INPUT, InputKind.TOKEN):
        return
    if spec.target is None:
        _fail(
            node,
            f"InputSpec for {node.name} ({spec.kind.name}) has no target; lifted "
            "state names the attribute it comes from (e.g. target='linear.weight').",
        )


def _output_names(output: Node) -> list[Any]:
    args = output.args[0] if output.args else ()
    if not isinstance(args, (list, tuple)):
        _fail(
            output,
            "the output node of an exported graph returns a flat tuple/list of "
            f"values; got {type(args).__name__}. Return (value,) for a single output.",
        )
    return [a.name if isinstance(a, Node) else a for a in args]


def _check_output_specs(ep: ExportedProgram, output: Node) -> None:
    gs = ep.graph_signature
    names = _output_names(output)
    specs = gs.output_specs
    if len(names) != len(specs):
        spec_names = [getattr(s.arg, "name", str(s.arg)) for s in specs]
        _fail(
            output,
            f"Number of output nodes {len(names)} is different than the number of "
            f"outputs specified by the graph signature: {len(specs)}\n"
            f"Nodes missing output_specs: {[n for n in names if n not in spec_names]}\n"
            f"Output_specs missing nodes: {[n for n in spec_names if n not in names]}",
        )
    seen_user_output = None
    for spec, name in zip(specs, names):
        if not isinstance(spec.arg, ConstantArgument) and spec.arg.name != name:
            _fail(
                output,
                f"Output spec {spec} names {spec.arg.name!r} but the graph returns "
                f"{name!r} at that position; output_specs list one spec per returned value, "
                "in order.",
            )
        if spec.kind in _MUTATION_KINDS:
            if seen_user_output is not None:
                _fail(
                    output,
                    f"mutation output {name} ({spec.kind.name}) comes after user "
                    f"output {seen_user_output}; mutated state is returned before user "
                    "outputs.",
                )
            _check_mutation_target(gs, spec, output)
        elif spec.kind == OutputKind.USER_OUTPUT:
            seen_user_output = name


def _check_mutation_target(gs: Any, spec: Any, output: Node) -> None:
    available = {
        OutputKind.BUFFER_MUTATION: ("buffer", gs.buffers),
        OutputKind.PARAMETER_MUTATION: ("parameter", gs.parameters),
        OutputKind.USER_INPUT_MUTATION: ("user input", gs.user_inputs),
    }
    what, existing = available[spec.kind]
    if not isinstance(spec.arg, TensorArgument):
        _fail(output, f"{spec.kind.name} output {spec} must be a tensor argument")
    if spec.target not in existing:
        _fail(
            output,
            f"{what.capitalize()} output {spec.arg.name} does not point to a {what} "
            f"that exists: target {spec.target!r}. {what.capitalize()}s available: "
            f"{list(existing)}",
        )


# ---------------------------------------------------------------------------- state


def _check_state(ep: ExportedProgram) -> None:
    placeholders = {n.name: n for n in ep.graph_module.graph.find_nodes(op="placeholder")}
    for spec in ep.graph_signature.input_specs:
        rule = _STATE_RULES.get(spec.kind)
        if rule is None:
            continue
        problem = rule(ep, spec)
        if problem:
            node = placeholders.get(getattr(spec.arg, "name", ""))
            if node is None:
                raise SpecViolationError(problem)
            _fail(node, problem)


def _parameter_problem(ep: ExportedProgram, spec: InputSpec) -> str | None:
    if spec.target not in ep.state_dict:
        return (
            f"Parameter {spec.target} is not in the state dict; add the parameter's value "
            "to state_dict under its fully qualified name."
        )
    if not isinstance(ep.state_dict[spec.target], torch.nn.Parameter):
        return (
            f"State dict entry for parameter {spec.target} is not an instance of "
            "torch.nn.Parameter; wrap it (torch.nn.Parameter(t, requires_grad=...))."
        )
    return None


def _buffer_problem(ep: ExportedProgram, spec: InputSpec) -> str | None:
    name = spec.target
    if spec.persistent and name not in ep.state_dict and name not in ep.constants:
        return (
            f"Buffer {name} is not in the state dict; persistent buffers are saved in "
            "state_dict under their fully qualified name."
        )
    if spec.persistent is False:
        if name in ep.state_dict:
            return (
                f"Non-persistent buffer {name} is in the state dict, it should not be; "
                "keep non-persistent buffers in constants."
            )
        if name not in ep.constants:
            return (
                f"Non-persistent buffer {name} is not in the constants dictionary; "
                "non-persistent buffers are kept in constants."
            )
    return None


def _constant_problem(ep: ExportedProgram, spec: InputSpec) -> str | None:
    if spec.target not in ep.constants:
        what = "Constant tensor" if spec.kind == InputKind.CONSTANT_TENSOR else "Custom object"
        return f"{what} {spec.target} is not in the constants dictionary."
    return None


_STATE_RULES: dict[InputKind, Callable[[Any, InputSpec], str | None]] = {
    InputKind.PARAMETER: _parameter_problem,
    InputKind.BUFFER: _buffer_problem,
    InputKind.CONSTANT_TENSOR: _constant_problem,
    InputKind.CUSTOM_OBJ: _constant_problem,
}


def _check_module_call_graph(ep: ExportedProgram) -> None:
    nodes = {node.name for node in ep.graph_module.graph.nodes}
    for entry in ep.module_call_graph:
        if entry.signature is None:
            continue
        for where, args in (("Input", entry.signature.inputs), ("Output", entry.signature.outputs)):
            for arg in args:
                name = getattr(arg, "name", "")
                if name and name not in nodes:
                    raise SpecViolationError(
                        f"{where} {name} of module call entry {entry.fqn!r} does not exist in "
                        "the graph; update module_call_graph when renaming or removing nodes."
                    )
