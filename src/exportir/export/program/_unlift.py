"""``ExportedProgram.module()``: turn the lifted, flat program back into a stateful module.

The exported graph takes parameters, buffers and constants as placeholders and returns
mutated state as extra outputs. ``unlift`` undoes that on a copy of the graph: lifted
placeholders become ``get_attr`` reads of attributes registered on the module (parameters as
parameters, buffers with their persistence, constants as plain attributes, sharing storage with
the program's state_dict/constants like torch does), mutation outputs become
``aten.copy_`` writes into the buffer / user input before returning, and the pytree codegen
restores the original calling convention (``forward(self, x, y)`` taking the original nested
structure and returning the original output structure).

The input checks (``check_inputs_match``, ``check_input_constraints``) run as a forward
pre-hook and raise torch.export's messages, e.g.
``Expected input at *args[0].shape[0] to be equal to 4, but got 5``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import sympy
import torch

from exportir import pytree
from exportir.export.signature import InputKind, OutputKind
from exportir.fx.codegen import _PyTreeCodeGen, _PyTreeInfo
from exportir.fx.graph import Graph
from exportir.fx.graph_module import GraphModule
from exportir.fx.node import Node

if TYPE_CHECKING:
    from exportir.export.program.exported_program import ExportedProgram

__all__ = ["check_input_constraints", "check_inputs_match", "reorder_kwargs", "unlift"]


# ---------------------------------------------------------------------------- input structure


def reorder_kwargs(user_kwargs: dict[str, Any], spec: pytree.TreeSpec) -> dict[str, Any]:
    """``user_kwargs`` in the key order of the kwargs half of an ``(args, kwargs)`` spec."""
    if spec.type is not tuple or spec.num_children != 2 or spec.child(1).type is not dict:
        raise ValueError(f"expected an (args, kwargs) input spec, got {spec}")
    expected = spec.child(1).context
    if set(user_kwargs) != set(expected):
        raise ValueError(
            f"Ran into a kwarg keyword mismatch: Got the following keywords "
            f"{list(user_kwargs)} but expected {expected}"
        )
    return {kw: user_kwargs[kw] for kw in expected}


# torch.Size flattens like a tuple; treat the two as the same container type.
_SAME_TYPES: dict[Any, Any] = {torch.Size: tuple}


def _same_structure(a: pytree.TreeSpec, b: pytree.TreeSpec) -> bool:
    if a is b:
        return True
    if _SAME_TYPES.get(a.type, a.type) is not _SAME_TYPES.get(b.type, b.type):
        return False
    if a.type is dict and b.type is dict:
        if set(a.context) != set(b.context):
            return False
    elif a.context != b.context:
        return False
    if a.num_children != b.num_children:
        return False
    return all(_same_structure(x, y) for x, y in zip(a.children(), b.children()))


def _as_our_spec(spec: Any) -> pytree.TreeSpec:
    return spec if isinstance(spec, pytree.TreeSpec) else pytree.from_torch_treespec(spec)


def check_inputs_match(
    args: Sequence[Any], kwargs: dict[str, Any], in_spec: pytree.TreeSpec
) -> list[tuple[pytree.KeyPath, Any]]:
    """Flatten ``(args, kwargs)`` with paths; raise if the structure differs from ``in_spec``."""
    in_spec = _as_our_spec(in_spec)
    kwargs = reorder_kwargs(kwargs, in_spec)
    flat_with_path, received = pytree.tree_flatten_with_path((tuple(args), kwargs))
    if not _same_structure(received, in_spec):
        raise ValueError(
            "Trying to flatten user inputs with exported input tree spec: \n"
            f"{in_spec}\n"
            "but actually got inputs with tree spec of: \n"
            f"{received}.\n"
            "Please check that the inputs have the same number and type of args and kwargs "
            "as the ones you used when tracing."
        )
    return flat_with_path


# ---------------------------------------------------------------------------- input values


def input_path(key_path: pytree.KeyPath) -> str:
    """``*args[0]['a']`` for a positional input, ``'k'[1]`` for keyword ``k`` (torch's text)."""
    first = key_path[0]
    if getattr(first, "idx", None) == 0:
        return f"*args{pytree.keystr(key_path[1:])}"
    name = str(key_path[1])[1:-1]  # drop the enclosing [ ]
    return f"{name}{pytree.keystr(key_path[2:])}"


def _where(key_path: pytree.KeyPath, dim: int | None) -> str:
    path = input_path(key_path)
    return path if dim is None else f"{path}.shape[{dim}]"


def _range_bounds(value_range: Any) -> tuple[int | float, int | float]:
    """Integer (lower, upper) of a value range; an unbounded side is -inf / inf."""
    lower, upper = value_range.lower, value_range.upper
    low = -math.inf if lower in (-sympy.oo, -math.inf) else math.ceil(lower)
    high = math.inf if upper in (sympy.oo, math.inf) else math.floor(upper)
    return low, high


def _is_symbolic(x: Any) -> bool:
    return isinstance(x, torch.SymInt) and not x.node.expr.is_number


class _DimChecker:
    """Checks one run's input sizes against the export-time (possibly symbolic) sizes.

    A symbol seen for the first time is bound to the size it meets (``unification``); later
    occurrences must agree. Bound symbols are checked against ``range_constraints``.
    """

    __slots__ = ("range_constraints", "unification")

    def __init__(self, range_constraints: dict[Any, Any]) -> None:
        self.range_constraints = range_constraints
        self.unification: dict[Any, int] = {}

    def check(self, expected: Any, actual: Any, key_path: pytree.KeyPath, dim: int | None) -> None:
        if _is_symbolic(actual):
            return  # symbolic (fake) inputs are not checked, as in torch
        if not _is_symbolic(expected):  # static, or a symbol the program specialized
            if actual != int(expected):
                raise RuntimeError(
                    f"Expected input at {_where(key_path, dim)} to be equal to {expected}, but "
                    f"got {actual}. If you meant for this dimension to be dynamic, please "
                    "re-export and specify dynamic_shapes (e.g. with Dim.DYNAMIC)"
                )
            return
        expr = expected.node.expr
        if len(expr.free_symbols) != 1:
            return  # a deferred runtime assertion checks these
        self._unify(expr, actual, key_path, dim)
        self._check_range(expr, actual, key_path, dim)

    def _unify(self, expr: Any, actual: Any, key_path: pytree.KeyPath, dim: int | None) -> None:
        (symbol,) = expr.free_symbols
        if symbol in self.unification:
            existing = expr.subs(self.unification)
            if actual != existing:
                raise RuntimeError(
                    f"Expected input at {_where(key_path, dim)} to be equal to {existing}, but "
                    f"got {actual}"
                )
            return
        if isinstance(expr, sympy.Symbol):
            self.unification[symbol] = int(actual)
            return
        solutions = [s for s in sympy.solve(sympy.Eq(expr, actual), symbol) if s.is_integer]
        if not solutions:
            raise RuntimeError(
                f"Expected input {_where(key_path, dim)} = {actual} to be of the form {expr}, "
                f"where {symbol} is an integer"
            )
        self.unification[symbol] = int(solutions[0])

    def _check_range(self, expr: Any, actual: Any, key_path: pytree.KeyPath, dim: int | None):
        if expr not in self.range_constraints:
            return
        low, high = _range_bounds(self.range_constraints[expr])
        # Sizes 0 and 1 are accepted at runtime even when export assumed >= 2.
        if low > 2 and actual < low:
            raise RuntimeError(
                f"Expected input at {_where(key_path, dim)} to be >= {low}, but got {actual}"
            )
        if high < math.inf and actual > high:
            raise RuntimeError(
                f"Expected input at {_where(key_path, dim)} to be <= {high}, but got {actual}"
            )


def _check_tensor(val: torch.Tensor, arg: Any, path: pytree.KeyPath, dims: _DimChecker) -> None:
    if not isinstance(arg, torch.Tensor):
        raise RuntimeError(  # noqa: TRY004  # torch.export raises RuntimeError here
            f"Expected input at {input_path(path)} to be a tensor, but got {type(arg)}"
        )
    if len(val.shape) != len(arg.shape):
        raise RuntimeError(
            f"Unexpected number of dimensions in input at {input_path(path)}.shape "
            f"(expected {val.shape}, got {arg.shape})"
        )
    for i, (actual, expected) in enumerate(zip(arg.shape, val.shape)):
        dims.check(expected, actual, path, i)
    if arg.dtype != val.dtype:
        # torch.export does not check dtypes; the Export IR fixes them at export time.
        raise RuntimeError(
            f"Expected input at {input_path(path)}.dtype to be equal to {val.dtype}, but got "
            f"{arg.dtype}. Tensor dtypes are fixed at export time; convert the input "
            f"(x.to({val.dtype})) or re-export with an input of the new dtype"
        )


def _check_constant(val: Any, arg: Any, path: pytree.KeyPath) -> None:
    where = input_path(path)
    if type(arg) is not type(val):
        raise RuntimeError(f"Expected input at {where} to be equal to {val}, but got {arg}")
    if isinstance(val, float) and math.isnan(val):
        if not math.isnan(arg):
            raise RuntimeError(f"Expected input at {where} to be nan, but got {arg}")
    elif arg != val:
        raise RuntimeError(f"Expected input at {where} to be equal to {val}, but got {arg}")


def check_input_constraints(
    placeholders: Sequence[Node],
    flat_args_with_path: Sequence[tuple[pytree.KeyPath, Any]],
    range_constraints: dict[Any, Any],
) -> None:
    """Check each flat user input against its placeholder's export-time ``meta['val']``."""
    if len(flat_args_with_path) != len(placeholders):
        raise RuntimeError(
            "Unexpected number of inputs "
            f"(expected {len(placeholders)}, got {len(flat_args_with_path)})"
        )
    dims = _DimChecker(range_constraints)
    for (path, arg), node in zip(flat_args_with_path, placeholders):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            _check_tensor(val, arg, path, dims)
        elif isinstance(val, (int, float, str)):
            _check_constant(val, arg, path)
        elif isinstance(val, torch.SymInt):
            dims.check(val, arg, path, None)


# ---------------------------------------------------------------------------- the module


_LIFTED_KINDS = (
    InputKind.PARAMETER,
    InputKind.BUFFER,
    InputKind.CONSTANT_TENSOR,
    InputKind.CUSTOM_OBJ,
)
_MUTATION_KINDS = (
    OutputKind.BUFFER_MUTATION,
    OutputKind.USER_INPUT_MUTATION,
    OutputKind.PARAMETER_MUTATION,
)


class _StatefulGraphModule(GraphModule):
    """The module ``ExportedProgram.module()`` returns; checks its inputs before each call."""

    def __init__(self, root: torch.nn.Module, graph: Any, range_constraints: Any = None):
        super().__init__(root, graph)
        self.range_constraints = range_constraints or {}
        self.validate_inputs = True


def _check_inputs_pre_hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if not module.validate_inputs:
        return
    flat = check_inputs_match(args, kwargs, module._in_spec)
    placeholders = module.graph.find_nodes(op="placeholder")
    check_input_constraints(placeholders, flat, module.range_constraints)


def submodule_path(root: torch.nn.Module, atoms: Iterable[str]) -> torch.nn.Module:
    """The module at ``root.<atoms...>``, adding an empty ``nn.Module`` for each missing step."""
    module = root
    for atom in atoms:
        child = getattr(module, atom, None)
        if not isinstance(child, torch.nn.Module):
            child = torch.nn.Module()
            module.add_module(atom, child)
        module = child
    return module


def _set_attr(root: torch.nn.Module, fqn: str, value: Any, kind: InputKind, persistent: bool):
    """Register ``value`` at ``fqn`` as a parameter, buffer or plain constant attribute."""
    *prefix, field = fqn.split(".")
    module = submodule_path(root, prefix)
    if hasattr(module, field):
        delattr(module, field)
    if kind == InputKind.PARAMETER:
        param = value if isinstance(value, torch.nn.Parameter) else torch.nn.Parameter(value)
        module.register_parameter(field, param)
    elif kind == InputKind.BUFFER:
        module.register_buffer(field, value, persistent=persistent)
    else:
        if isinstance(value, torch.Tensor) and value.requires_grad:
            value = value.detach()  # constants never take part in autograd
        object.__setattr__(module, field, value)


def _state_value(ep: ExportedProgram, spec: Any) -> Any:
    saved = spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent)
    if saved and spec.target in ep.state_dict:
        return ep.state_dict[spec.target]
    return ep.constants[spec.target]


def _unlift_placeholders(graph: Graph, specs: Sequence[Any]) -> dict[str, Node]:
    """Replace lifted placeholders by get_attr nodes; returns {target or input name: node}."""
    by_name: dict[str, Node] = {}
    for node, spec in zip(list(graph.find_nodes(op="placeholder")), specs):
        if spec.kind not in _LIFTED_KINDS:
            by_name[node.name] = node
            continue
        with graph.inserting_after(node):
            getattr_node = graph.get_attr(spec.target)
        node.replace_all_uses_with(getattr_node)
        getattr_node.meta = node.meta
        graph.erase_node(node)
        by_name[spec.target] = getattr_node
    return by_name


def _write_back_mutations(graph: Graph, specs: Sequence[Any], by_name: dict[str, Node]):
    """Copy mutated values into their buffer / input, and return only the user outputs."""
    output = graph.output_node()
    user_outputs = []
    with graph.inserting_before(output):
        for value, spec in zip(output.args[0], specs):
            if spec.kind not in _MUTATION_KINDS:
                user_outputs.append(value)
                continue
            if spec.target not in by_name:
                raise RuntimeError(
                    f"Could not find {spec.target} in either buffer or input nodes; the "
                    f"{spec.kind.name} output {spec.arg.name} names no lifted state or input"
                )
            graph.call_function(torch.ops.aten.copy_.default, (by_name[spec.target], value))
        new_output = graph.output(tuple(user_outputs))
    new_output.meta.update(output.meta)
    graph.erase_node(output)
    new_output.name = "output"


def _is_args_kwargs(spec: pytree.TreeSpec) -> bool:
    return (
        spec.type is tuple
        and spec.num_children == 2
        and spec.child(0).type is tuple
        and spec.child(1).type is dict
    )


def _forward_arg_names(in_spec: pytree.TreeSpec, names: list[str] | None) -> list[str]:
    """Parameter names of the generated ``forward``: the recorded ones, else ``arg_i`` plus
    the keyword names; keyword inputs missing from the recorded names are appended."""
    if not _is_args_kwargs(in_spec):
        return list(names) if names else [f"arg_{i}" for i in range(in_spec.num_children)]
    kwarg_names = list(in_spec.child(1).context)
    if not names:
        return [f"arg_{i}" for i in range(in_spec.child(0).num_children)] + kwarg_names
    return list(names) + [k for k in kwarg_names if k not in names]


def _install_state(gm: torch.nn.Module, ep: ExportedProgram) -> None:
    for spec in ep.graph_signature.input_specs:
        if spec.kind in _LIFTED_KINDS:
            _set_attr(gm, spec.target, _state_value(ep, spec), spec.kind, spec.persistent)
    for name, value in ep.constants.items():  # constants used only inside nested graphs
        if not _has_attr(gm, name):
            _set_attr(gm, name, value, InputKind.CONSTANT_TENSOR, False)


def _has_attr(module: Any, fqn: str) -> bool:
    for atom in fqn.split("."):
        if not hasattr(module, atom):
            return False
        module = getattr(module, atom)
    return True


def _not_supported(what: str) -> Any:
    def method(self: Any, mode: bool = True) -> Any:
        raise NotImplementedError(f"Calling {what}() is not supported yet.")

    return method


def unlift(ep: ExportedProgram, check_guards: bool = True) -> GraphModule:
    """A runnable module equivalent to ``ep`` with the original calling convention."""
    in_spec, out_spec = ep.call_spec
    if in_spec is None:
        raise RuntimeError("module() needs the program's input spec (module_call_graph[0])")
    in_spec = _as_our_spec(in_spec)
    holder = torch.nn.Module()
    _install_state(holder, ep)
    for name, child in ep.graph_module.named_children():
        holder.add_module(name, child)
    graph = copy.deepcopy(ep.graph_module.graph)  # a free-standing copy to edit
    by_name = _unlift_placeholders(graph, ep.graph_signature.input_specs)
    _write_back_mutations(graph, ep.graph_signature.output_specs, by_name)
    signature = ep.module_call_graph[0].signature
    names = _forward_arg_names(in_spec, signature.forward_arg_names if signature else None)
    out = _as_our_spec(out_spec) if out_spec is not None else None
    graph.set_codegen(_PyTreeCodeGen(_PyTreeInfo(names, in_spec, out)))
    module = _StatefulGraphModule(holder, graph, ep.range_constraints)
    module.graph.lint()
    _install_state(module, ep)  # GraphModule() copies attributes without their kinds
    module.meta.update(ep.graph_module.meta)
    module.register_forward_pre_hook(_check_inputs_pre_hook, with_kwargs=True)
    module.train = _not_supported("train").__get__(module)
    module.eval = _not_supported("eval").__get__(module)
    return module


def _iter_user_placeholders(ep: ExportedProgram) -> Iterable[Node]:
    placeholders = ep.graph_module.graph.find_nodes(op="placeholder")
    for node, spec in zip(placeholders, ep.graph_signature.input_specs):
        if spec.kind == InputKind.USER_INPUT:
            yield node
