"""Which kernel runs a graph node: out-variant selection and the kernel coverage check.

A functional ATen op (``aten.add.Tensor``) runs as its out variant (``aten.add.out``): the
overload of the same packet whose non-out arguments match the functional arguments (names and
types) and whose out arguments (``Tensor(a!)``, keyword-only) receive the results in return
order. Views run as their ``*_copy`` op (``aten.view.default`` -> ``aten.view_copy.out``) when
the emitter cannot make them aliases (:func:`alias_rule`). Everything here is read from the op
schemas, not from a list.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from exportir.format import quantized_ops, schema
from exportir.fx import Node

# graph-level no-ops: runtime assertions the emitter drops
SKIPPED_OPS: frozenset[str] = frozenset(
    {
        "aten::_assert_async",
        "aten::_assert_async.msg",
        "aten::sym_constrain_range",
        "aten::sym_constrain_range_for_size",
        "aten::_assert_tensor_metadata",
        "aten::_functional_assert_async.msg",
        "aten::_functional_assert_scalar",
    }
)

# Python operators on symbolic scalars -> runtime primitive (schema.PRIM_OPERATORS)
PYTHON_PRIMS: dict[Callable[..., Any], tuple[str, str]] = {
    operator.add: ("exportir_prim::add", "Scalar"),
    operator.sub: ("exportir_prim::sub", "Scalar"),
    operator.mul: ("exportir_prim::mul", "Scalar"),
    operator.floordiv: ("exportir_prim::floordiv", "Scalar"),
    operator.truediv: ("exportir_prim::truediv", "Scalar"),
    operator.mod: ("exportir_prim::mod", "Scalar"),
    operator.neg: ("exportir_prim::neg", "Scalar"),
    operator.eq: ("exportir_prim::eq", "Scalar"),
    operator.ne: ("exportir_prim::ne", "Scalar"),
    operator.lt: ("exportir_prim::lt", "Scalar"),
    operator.le: ("exportir_prim::le", "Scalar"),
    operator.gt: ("exportir_prim::gt", "Scalar"),
    operator.ge: ("exportir_prim::ge", "Scalar"),
}

# ATen ops with a runtime primitive: sizes of a tensor, ``Tensor.item()`` (a data-dependent
# scalar; ExecuTorch's prim ops have it too) and the assertions to_edge keeps on such scalars
SYM_OPS: frozenset[str] = frozenset({
    "aten::sym_size.int", "aten::sym_numel", "aten::sym_storage_offset",
    "aten::_local_scalar_dense", "aten::_assert_scalar",
})


@dataclass(frozen=True, slots=True)
class KernelChoice:
    """The out-variant overload running a functional op, and its out argument names.

    ``copied`` lists ``(argument, result index)`` pairs for an out variant that mutates some
    of its inputs (see :data:`COPY_IN_OUT_VARIANTS`): the emitter copies the input into that
    result's tensor first and passes the result in the argument's place. The other results
    go to ``out_args`` in order.
    """

    functional: torch._ops.OpOverload
    out: torch._ops.OpOverload
    out_args: tuple[str, ...]
    copied: tuple[tuple[str, int], ...] = ()

    @property
    def num_results(self) -> int:
        return len(self.out_args) + len(self.copied)

    @property
    def operator(self) -> schema.Operator:
        return operator_of(self.out)


def operator_of(op: torch._ops.OpOverload) -> schema.Operator:
    name = op._schema.name
    overload = op._schema.overload_name
    return schema.Operator(name, overload)


def qualified_name(op: torch._ops.OpOverload) -> str:
    """``aten::add.Tensor`` (the schema name and overload)."""
    s = op._schema
    return f"{s.name}.{s.overload_name}" if s.overload_name else s.name


def display_name(op: Any) -> str:
    """``aten.add.Tensor`` as graphs print it."""
    if isinstance(op, torch._ops.OpOverload):
        s = op._schema
        ns, _, name = s.name.partition("::")
        return f"{ns}.{name}.{s.overload_name or 'default'}"
    return getattr(op, "__name__", str(op))


def aten_op(target: Any) -> Any:
    """The ``OpOverload`` behind a node target (edge ops wrap it as ``aten_op``)."""
    return getattr(target, "aten_op", target)


def _packet(op: torch._ops.OpOverload, name: str | None = None) -> Any:
    ns, _, base = op._schema.name.partition("::")
    try:
        return getattr(getattr(torch.ops, ns), name or base)
    except (AttributeError, RuntimeError):
        return None


def _is_view(op: torch._ops.OpOverload) -> bool:
    s = op._schema
    if any(a.alias_info is not None and a.alias_info.is_write for a in s.arguments):
        return False
    return any(r.alias_info is not None for r in s.returns)


def is_view_copy(op: torch._ops.OpOverload) -> bool:
    """``aten.permute_copy.default`` and friends: the copying form of a view op."""
    name = op._schema.name
    if not name.endswith("_copy"):
        return False
    view = _packet(op, name.partition("::")[2][: -len("_copy")])
    overload = op._schema.overload_name or "default"
    return view is not None and overload in view.overloads() and _is_view(getattr(view, overload))


# Copies whose result may share its source's memory in a program, whose values are written only
# by the instruction producing them: op -> the view op giving the alias's layout, or None when
# the alias is the source itself (allowed only where the result has the source's dtype and
# layout: see ``MethodEmitter.alias``).
ALIASING_COPIES: dict[str, torch._ops.OpOverload | None] = {
    "aten::clone": None,
    "aten::_to_copy": None,
    "aten::_unsafe_view": torch.ops.aten.view.default,
}

NOT_ALIASING = object()

# View ops whose arguments address the source's storage, not its elements (``as_strided``'s
# storage offset): aliased only over a source that is its own root, as in eager.
STORAGE_RELATIVE_VIEWS = frozenset({"aten::as_strided"})


def alias_rule(op: torch._ops.OpOverload) -> Any:
    """How ``op``'s result may alias its first argument: the view op computing the alias's
    layout (``aten.permute.default`` for ``permute_copy`` and for ``permute`` itself), None for
    the source itself, or :data:`NOT_ALIASING`."""
    name = op._schema.name
    if name in ALIASING_COPIES:
        return ALIASING_COPIES[name]
    if _is_view(op):
        return op
    if is_view_copy(op):
        view = _packet(op, name.partition("::")[2][: -len("_copy")])
        return getattr(view, op._schema.overload_name or "default")
    return NOT_ALIASING


def _signature(args: list[Any]) -> tuple[tuple[str, str], ...]:
    return tuple((a.name, str(a.type)) for a in args)


# tensor options a factory's out variant leaves out (the out tensor carries them)
_TENSOR_OPTIONS = frozenset({"dtype", "layout", "device", "pin_memory"})


def _match_out(functional: torch._ops.OpOverload, packet: Any) -> KernelChoice | None:
    fs = functional._schema
    found: list[tuple[int, str, torch._ops.OpOverload, tuple[str, ...]]] = []
    for name in packet.overloads():
        candidate = getattr(packet, name)
        args = list(candidate._schema.arguments)
        outs = tuple(a.name for a in args if a.is_out)
        have = [a for a in args if not a.is_out]
        names = {a.name for a in have}
        want = _signature(
            [a for a in fs.arguments if a.name in names or a.name not in _TENSOR_OPTIONS]
        )
        if not outs or _signature(have) != want:
            continue
        list_return = len(fs.returns) == 1 and fs.returns[0].type.kind() == "ListType"
        if not list_return and len(outs) != len(fs.returns):
            continue
        rank = 0 if name == "out" or name == f"{fs.overload_name}_out" else 1
        found.append((rank, name, candidate, outs))
    if not found:
        return None
    _, _, best, outs = min(found, key=lambda f: (f[0], f[1]))
    return KernelChoice(functional, best, outs)


# Functional ops without an out variant of their own that run as the out variant of their
# mutating form, on copies of the inputs it mutates: functional op -> (out variant, ((mutated
# argument, functional result index receiving it), ...)). Training-mode batch norm returns the
# updated running statistics as results 3 and 4; ``_native_batch_norm_legit.out`` updates them
# in place (as ExecuTorch's portable kernel does), so it runs on copies made in those results.
COPY_IN_OUT_VARIANTS: dict[str, tuple[str, tuple[tuple[str, int], ...]]] = {
    "aten::_native_batch_norm_legit_functional": (
        "aten::_native_batch_norm_legit.out", (("running_mean", 3), ("running_var", 4)),
    ),
}


def _copy_in_variant(op: torch._ops.OpOverload) -> KernelChoice | None:
    entry = COPY_IN_OUT_VARIANTS.get(qualified_name(op))
    if entry is None:
        return None
    name, copied = entry
    base, _, overload = name.partition(".")
    ns, _, opname = base.partition("::")
    out = getattr(getattr(getattr(torch.ops, ns), opname), overload)
    outs = tuple(a.name for a in out._schema.arguments if a.is_out)
    return KernelChoice(op, out, outs, copied)


@functools.cache
def out_variant(op: torch._ops.OpOverload) -> KernelChoice | None:
    """The out variant running ``op`` (via its ``*_copy`` op for views), or None."""
    copy_in = _copy_in_variant(op)
    if copy_in is not None:
        return copy_in
    if any(a.is_out for a in op._schema.arguments):
        outs = tuple(a.name for a in op._schema.arguments if a.is_out)
        return KernelChoice(op, op, outs)  # already an out variant
    if any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
        return None  # in-place: not allowed in a functional program
    functional = op
    if _is_view(op):
        base = op._schema.name.partition("::")[2]
        copy_packet = _packet(op, base + "_copy")
        overload = op._schema.overload_name or "default"
        if copy_packet is None or overload not in copy_packet.overloads():
            return None
        functional = getattr(copy_packet, overload)
    packet = _packet(functional)
    if packet is None:
        return None
    return _match_out(functional, packet)


# Namespaces of torch's own operators: their ops run as out variants or not at all. Any other
# namespace is a custom op library (torch.library), whose ops may run as functional fallbacks.
BUILTIN_NAMESPACES = frozenset({"aten", "prims", "prim", "quantized", "_quant", "higher_order"})


def fallback_reason(op: torch._ops.OpOverload) -> str | None:
    """None when ``op`` may run as a functional fallback (a custom op returning tensors and
    mutating nothing), else why not."""
    s = op._schema
    if op.namespace in BUILTIN_NAMESPACES:
        return "no out-variant overload"
    if any(a.alias_info is not None and a.alias_info.is_write for a in s.arguments):
        return "a custom op mutating its inputs has no functional fallback"
    bad = [str(r.type) for r in s.returns if r.type.kind() != "TensorType"]
    if bad or not s.returns:
        return (f"custom op returns {', '.join(bad) or 'nothing'}; the functional fallback "
                "needs tensor results")
    return None


def fallback_operator(op: torch._ops.OpOverload) -> schema.Operator:
    """``mylib::op`` + ``default@functional``: the program's name for ``op``'s fallback."""
    overload = (op._schema.overload_name or "default") + schema.FUNCTIONAL_FALLBACK
    return schema.Operator(op._schema.name, overload)


def is_sym_op(op: Any) -> bool:
    return isinstance(op, torch._ops.OpOverload) and qualified_name(op) in SYM_OPS


def is_skipped(op: Any) -> bool:
    return isinstance(op, torch._ops.OpOverload) and qualified_name(op) in SKIPPED_OPS


class EmitError(ValueError):
    """A graph cannot be turned into a program (unsupported construct), with the node named."""


class KernelCoverageError(EmitError):
    """Some nodes have no kernel the runtime can run; lists every op, node and source line."""


class ControlFlowNotSupportedError(EmitError, NotImplementedError):
    """A control-flow construct the program format cannot run yet (names node, line, fix)."""



# control-flow operator -> (what the user wrote, the way out) for constructs not emitted
# (every construct export captures is emitted: cond as jumps, map and while_loop as loops)
UNSUPPORTED_CONTROL_FLOW: dict[Any, tuple[str, str]] = {}


def control_flow_error(node: Node, method: str) -> ControlFlowNotSupportedError:
    """The error for a control-flow ``node`` the emitter does not run."""
    construct, fix = UNSUPPORTED_CONTROL_FLOW[node.target]
    where = source_line(node)
    return ControlFlowNotSupportedError(
        f"to_program: {construct} is not supported by the program format yet "
        f"(node {node.name!r} of method {method!r}"
        + (f", from {where}" if where else "")
        + f"). Way out: {fix}; or delegate the computation to a backend (to_backend), or run "
        "the ExportedProgram itself (ep.module())."
    )


_DTYPES: dict[torch.dtype, schema.ScalarType] = {
    getattr(torch, name): st for st, name in schema.TORCH_DTYPE_NAME.items() if hasattr(torch, name)
}
LAYOUTS = {torch.strided: 0, torch.sparse_coo: 1}
MEMORY_FORMATS = {
    torch.contiguous_format: 0,
    torch.preserve_format: 1,
    torch.channels_last: 2,
    torch.channels_last_3d: 3,
}
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def source_line(node: Node) -> str:
    """The user's ``file:line`` of a node (innermost frame outside torch), or ``""``."""
    frames = _FRAME.findall(node.meta.get("stack_trace") or "")
    if not frames:
        return ""
    user = [f for f in frames if "/torch/" not in f[0]]
    file, line = (user or frames)[-1]
    return f"{file}:{line}"


def scalar_type(dtype: torch.dtype) -> schema.ScalarType:
    found = _DTYPES.get(dtype)
    if found is None:
        raise EmitError(f"dtype {dtype} has no program-file scalar type")
    return found


# ------------------------------------------------------------------------------ node classes


def get_attr(gm: Any, target: str) -> Any:
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def is_lowered_module(obj: Any) -> bool:
    return hasattr(obj, "backend_id") and hasattr(obj, "processed_bytes")


def delegate_module(node: Node, gm: Any) -> Any:
    """The LoweredBackendModule a delegate-call node calls, or None for other nodes."""
    if node.op != "call_function" or not node.args:
        return None
    first = node.args[0]
    if not isinstance(first, Node) or first.op != "get_attr":
        return None
    obj = get_attr(gm, first.target)
    return obj if is_lowered_module(obj) else None


def classify(node: Node, gm: Any) -> str:
    """One of getitem, skip, sym, prim, delegate, kernel, fallback (a custom op without an out
    variant: see :data:`schema.FUNCTIONAL_FALLBACK`), or ``!reason`` (cannot run)."""
    target = node.target
    if target is operator.getitem:
        return "getitem"
    if delegate_module(node, gm) is not None:
        return "delegate"
    if target in PYTHON_PRIMS:
        return "prim"
    op = aten_op(target)
    if not isinstance(op, torch._ops.OpOverload):
        return f"!{display_name(target)} is not an ATen operator (no kernel)"
    if is_skipped(op):
        return "skip"
    if is_sym_op(op):
        return "sym"
    if out_variant(op) is not None:
        return "kernel"
    reason = fallback_reason(op)
    return "fallback" if reason is None else f"!{reason}"


# ------------------------------------------------------------------------------ the kernel table

# Out variants the emitter names although no edge op runs as them: op -> why.
EMITTER_OUT_VARIANTS: dict[str, str] = {
    "aten::scalar_tensor.out": "a run-time scalar used as a Tensor operand (scalar_as_tensor)",
    "aten::index_copy.out": "a map loop writes iteration i's result into row i of the stacked "
                            "output (program._emit_control_flow)",
}

# Out variants of edge ops that program files may not name: op -> why. The runtime's kernel
# table leaves them out, so a file naming one fails to load.
_NESTED = (
    "makes a nested tensor over offsets and sizes read from tensors, which the runtime cannot "
    "check at load (the program format has strided tensors only)"
)
_SPARSE = "reads a sparse tensor's parts; the program format has strided tensors only"
NOT_IN_KERNEL_TABLE: dict[str, str] = {
    "aten::_reshape_alias_copy.out": (
        "views its input with any sizes and strides without checking they stay inside it "
        "(export writes view / view_copy instead)"
    ),
    "aten::_nested_view_from_buffer_copy.out": _NESTED,
    "aten::_nested_view_from_jagged_copy.out": _NESTED,
    "aten::_nested_get_values_copy.out": _NESTED,
    **{f"aten::{name}.out": _SPARSE for name in (
        "_indices_copy", "_values_copy", "indices_copy", "values_copy", "crow_indices_copy",
        "col_indices_copy", "ccol_indices_copy", "row_indices_copy", "_sparse_broadcast_to_copy",
    )},
    "aten::_test_autograd_multiple_dispatch_view_copy.out": "a test operator of torch's",
}


def edge_operators() -> list[torch._ops.OpOverload]:
    """Every ATen overload an Edge program may call under the default config: core ATen, the
    ``*_copy`` view ops and :data:`DEFAULT_CORE_ATEN_OPS_EXCEPTIONS` (sorted by name)."""
    from exportir.dialects.edge.config import DEFAULT_CORE_ATEN_OPS_EXCEPTIONS

    found = set(DEFAULT_CORE_ATEN_OPS_EXCEPTIONS)
    # every registered name (dir(torch.ops.aten) lists only the packets used so far)
    names = {n.partition(".")[0] for n in torch._C._dispatch_get_all_op_names()}
    for name in sorted(n.removeprefix("aten::") for n in names if n.startswith("aten::")):
        try:
            packet = getattr(torch.ops.aten, name)
        except (AttributeError, RuntimeError):
            continue
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if torch.Tag.core in op.tags or torch.Tag.view_copy in op.tags:
                found.add(op)
    return sorted(found, key=qualified_name)


def kernel_table() -> dict[str, str]:
    """The operators a program file may name and their schemas (``aten::add.out`` ->
    ``str(schema)``): the out variants the emitter runs edge ops as, plus
    :data:`EMITTER_OUT_VARIANTS` and the quantize / dequantize out variants
    (:data:`exportir.format.quantized_ops.OUT_VARIANTS`), minus :data:`NOT_IN_KERNEL_TABLE`. The runtime's committed
    copy (``exportir.runtime.kernel_table``) is generated from this by
    ``scripts/gen_kernel_table.py``; a test keeps the two equal."""
    outs = {qualified_name(c.out): c.out for c in map(out_variant, edge_operators()) if c}
    for name in (*EMITTER_OUT_VARIANTS, *quantized_ops.OUT_VARIANTS):
        quantized_ops.define()  # the quantize / dequantize ops quantized programs call
        base, _, overload = name.partition(".")
        ns, _, op = base.partition("::")
        outs[name] = getattr(getattr(getattr(torch.ops, ns), op), overload)
    return {
        name: str(op._schema)
        for name, op in sorted(outs.items())
        if name not in NOT_IN_KERNEL_TABLE
    }
