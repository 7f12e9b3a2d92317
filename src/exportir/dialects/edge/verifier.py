"""The Edge dialect verifier: Export IR checks plus the Edge rules of seed 001.

``EdgeVerifier`` extends the Export IR verifier through its hooks (allowlist semantics: what
no rule allows is rejected). Beyond the base checks (graph structure, signature, state, and
the metadata contract -- ``val``, ``stack_trace``, ``nn_module_stack`` on every call_function
node), every graph, nested ones included, must satisfy, in this order per node:

1. **op set** -- ``call_function`` targets are edge operators (``ops.edge.aten.*``) whose ATen
   op is core ATen or a ``*_copy`` view op; custom-namespace edge ops; higher-order operators;
   the symbolic-size ATen ops; the builtins of Export IR. Non-core ops named in
   ``EdgeCompileConfig._core_aten_ops_exception_list`` / ``preserve_ops`` are accepted. No op
   may return a view (the Edge dialect has copy semantics).
2. **no scalar operands** -- no Python number where the op's schema expects a ``Tensor``.
3. **dtype constraints** -- the dtypes of an edge op's tensor arguments and results are a
   combination ``edge.yaml`` allows, or (Half / BFloat16) ``edge_reduced_float.yaml`` allows.
4. **no scalar inputs/outputs** -- graph inputs the graph uses, and graph outputs computed by
   nodes, are tensors (literal constants burned in at export may be returned).

The config travels in ``graph_module.meta["edge_compile_config"]``; with
``_check_ir_validity=False`` only the Export IR checks run. Every error names the node, the
op, the offending dtype or value, the user's source line, the way out, and shows the graph
around the node.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch._ops import HigherOrderOperator, OpOverload

from exportir.dialects.edge.config import CONFIG_META_KEY, EdgeCompileConfig
from exportir.dialects.edge.constraints import (
    ALL_DTYPE_NAMES,
    ALL_EDGE_DTYPES,
    is_tensor_like,
    reduced_float_constraint_for,
    tensor_variable_names,
)
from exportir.dialects.edge.ops import EdgeOpOverload
from exportir.export.program.verifier import NodeSpecViolationError, Verifier
from exportir.fx.graph_module import GraphModule
from exportir.fx.node import Node

__all__ = ["EdgeVerifier", "node_dtypes", "user_source_line"]


def _calls(graph: Any) -> list[Any]:
    """The graph's call_function nodes, in order."""
    return [n for n in graph.nodes if n.op == "call_function"]


aten = torch.ops.aten

# ATen ops on symbolic sizes, and assertions on data-dependent scalars: allowed as plain ATen
# ops (they compute and check shapes and scalars, not tensors).
_SYMBOLIC_OPS = frozenset({
    aten.sym_size.int, aten.sym_numel.default, aten.sym_stride.int,
    aten.sym_storage_offset.default, aten._assert_scalar.default,
})  # fmt: skip

_DISABLE_HINT = "or skip the Edge checks: to_edge(..., compile_config=EdgeCompileConfig(_check_ir_validity=False))"


# ---------------------------------------------------------------------------- error helpers


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in [^\n]*(?:\n[ \t]+([^\n]*))?')


def user_source_line(node: Node) -> str:
    """``file.py:12 `code``` from the innermost frame of ``node.meta["stack_trace"]``."""
    trace = node.meta.get("stack_trace") or ""
    frames = _FRAME.findall(trace)
    if not frames:
        return "(no source line recorded)"
    filename, line, code = frames[-1]
    return f"{filename}:{line}" + (f" `{code.strip()}`" if code else "")


def _fail(node: Node, what: str, way_out: str, source: Node | None = None) -> None:
    target = node.target
    op = target.__name__ if isinstance(target, EdgeOpOverload) else str(target)
    where = user_source_line(source or node)
    message = (
        f"Edge dialect violation at node {node.name} (op {op}), from {where}:\n"
        f"  {what}\n  Way out: {way_out}"
    )
    raise NodeSpecViolationError(message, node, node.graph)


def _op_label(op: Any) -> str:
    if isinstance(op, EdgeOpOverload):
        return f"edge op {op.__name__}"
    return str(op)


# ---------------------------------------------------------------------------- dtypes of a node


def _bind(schema: torch._C.FunctionSchema, node: Node) -> dict[str, Any]:
    bound = {a.name: v for a, v in zip(schema.arguments, node.args)}
    bound.update(node.kwargs)
    return bound


def _dtype_of(value: Any) -> torch.dtype | None:
    if isinstance(value, Node):
        value = value.meta.get("val")
    if isinstance(value, torch.Tensor):
        return value.dtype
    if isinstance(value, (list, tuple)):
        dtypes = [d for d in (_dtype_of(v) for v in value) if d is not None]
        if not dtypes:
            return None
        result = dtypes[0]
        for d in dtypes[1:]:
            result = torch.promote_types(result, d)
        return result
    return None


def node_dtypes(node: Node, op: OpOverload) -> dict[str, torch.dtype | None]:
    """Tensor variable name -> dtype for a call of ``op`` (None: absent or unknown)."""
    schema = op._schema
    arg_vars, ret_vars = tensor_variable_names(schema)
    bound = _bind(schema, node)
    dtypes: dict[str, torch.dtype | None] = {name: _dtype_of(bound.get(name)) for name in arg_vars}
    val = node.meta.get("val")
    rets = (val,) if len(schema.returns) == 1 else tuple(val or ())
    tensor_returns = [i for i, r in enumerate(schema.returns) if is_tensor_like(r.type)]
    for name, index in zip(ret_vars, tensor_returns):
        if index < len(rets):
            dtypes[name] = _dtype_of(rets[index])
    return dtypes


def _describe_dtypes(dtypes: Mapping[str, torch.dtype | None]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in dtypes.items() if v is not None)


# ---------------------------------------------------------------------------- rules


def _is_aliasing(op: OpOverload) -> bool:
    returns = op._schema.returns
    return (
        bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write
    )


def _check_op_set(node: Node, accepted: frozenset[Any]) -> None:
    target = node.target
    if isinstance(target, EdgeOpOverload):
        op = target.aten_op
        if op in accepted or op.namespace != "aten":
            return
        if _is_aliasing(op):
            _fail(
                node,
                f"{_op_label(target)} returns a view of its input; the Edge dialect has copy "
                "semantics.",
                f"use its copy form (e.g. ops.edge.aten.{op._schema.name[6:]}_copy."
                f"{op._overloadname}); to_edge converts views this way.",
            )
        tags = op.tags
        if torch.Tag.core not in tags and torch.Tag.view_copy not in tags:
            _fail(
                node,
                f"{_op_label(target)} is not in the core ATen op set the Edge dialect allows.",
                "decompose it before to_edge, or accept it with to_edge(..., compile_config="
                f"EdgeCompileConfig(_core_aten_ops_exception_list=[torch.ops.{op}])) if your "
                "runtime has a kernel for it. Training-only ops disappear with model.eval() "
                "and torch.no_grad().",
            )
        return
    if isinstance(target, OpOverload):
        if target in _SYMBOLIC_OPS or target in accepted:
            return
        _fail(
            node,
            f"operator {target} is an ATen op, not an edge op.",
            f"call ops.edge.{target} (exportir.dialects.edge.ops) instead; to_edge converts "
            "every ATen op, so a pass run after it inserted this one.",
        )


def _check_scalar_operands(node: Node) -> None:
    target = node.target
    op = target.aten_op if isinstance(target, EdgeOpOverload) else target
    if not isinstance(op, OpOverload):
        return
    bound = _bind(op._schema, node)
    for arg in op._schema.arguments:
        value = bound.get(arg.name)
        if isinstance(arg.type, torch.TensorType) and isinstance(value, (bool, int, float)):
            _fail(
                node,
                f"argument {arg.name!r} of {_op_label(target)} is the Python scalar {value!r}; "
                "Edge operators take tensors where their schema says Tensor.",
                f"pass torch.tensor({value!r}) (a lifted constant) instead; to_edge's "
                "ScalarToTensor pass does this.",
            )


def _check_dtypes(node: Node) -> None:
    target = node.target
    if not isinstance(target, EdgeOpOverload):
        return
    constraint = target.dtype_constraint
    dtypes = node_dtypes(node, target.aten_op)
    if constraint.validate(dtypes):
        return
    reduced = reduced_float_constraint_for(target.aten_op)
    if reduced is not None and reduced.validate(dtypes):
        return  # a Half / BFloat16 combination the kernels run (edge_reduced_float.yaml)
    outside = sorted(
        {str(d) for d in dtypes.values() if d is not None and d not in ALL_EDGE_DTYPES}
    )
    if outside:
        what = (
            f"{_op_label(target)} got dtypes ({_describe_dtypes(dtypes)}); {', '.join(outside)} "
            f"is not an edge dtype (edge dtypes: {', '.join(ALL_DTYPE_NAMES.values())})."
        )
    else:
        what = (
            f"{_op_label(target)} does not support the dtype combination "
            f"({_describe_dtypes(dtypes)}). Allowed (edge.yaml): {constraint.describe()}"
            + (f"; with Half/BFloat16: {reduced.describe()}." if reduced is not None else ".")
        )
    _fail(
        node,
        what,
        "cast the inputs to an allowed dtype in the model (e.g. x.to(torch.float32)), "
        f"{_DISABLE_HINT}.",
    )


def _check_graph_inputs(gm: GraphModule) -> None:
    for node in gm.graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        if node.users and not isinstance(val, torch.Tensor) and val is not None:
            _fail(
                node,
                f"graph input {node.name} is the scalar {val!r} ({type(val).__name__}); Edge "
                "graph inputs are tensors.",
                "pass it to the model as a tensor (torch.tensor(value)), or let export burn it "
                "in as a constant.",
            )


def _check_graph_outputs(gm: GraphModule) -> None:
    # Literal constants returned by the program (burned in at export) are values, not
    # computed scalars; a node producing a non-tensor value may not be an output.
    output = gm.graph.output_node()
    values = output.args[0] if output.args else ()
    for value in values if isinstance(values, (list, tuple)) else (values,):
        if not isinstance(value, Node):
            continue
        val = value.meta.get("val")
        if isinstance(val, torch.Tensor):
            continue
        _fail(
            output,
            f"graph output {value.name} is the scalar {val!r} ({type(val).__name__}); Edge "
            "graph outputs are tensors.",
            "return a tensor from the model (keep the value a 0-dim tensor instead of "
            "calling .item() or returning a size).",
            source=value,
        )


# The node rules, in the order they run (see the module docstring).
_NODE_RULES: tuple[Callable[[Node, frozenset[Any]], None], ...] = (
    _check_op_set,
    lambda node, _: _check_scalar_operands(node),
    lambda node, _: _check_dtypes(node),
)


def _graph_modules(gm: GraphModule) -> Iterator[GraphModule]:
    for module in gm.modules():
        if isinstance(module, GraphModule):
            yield module


class EdgeVerifier(Verifier):
    """Verifier of the Edge dialect (see the module docstring for the rules)."""

    dialect = "EDGE"

    def allowed_op_types(self) -> tuple[type[Any], ...]:
        return (OpOverload, HigherOrderOperator, EdgeOpOverload)

    def check_additional(self, gm: GraphModule) -> None:
        config = gm.meta.get(CONFIG_META_KEY) or EdgeCompileConfig()
        if not config._check_ir_validity:
            return
        accepted = config.accepted_noncore_ops()
        for module in _graph_modules(gm):
            for node in _calls(module.graph):
                for rule in _NODE_RULES:
                    rule(node, accepted)
        _check_graph_inputs(gm)
        _check_graph_outputs(gm)
