"""Control flow: ``cond`` as forward jumps, ``map`` and ``torch.while_loop`` as loops (format 3:
a jump back closes a loop).

Cond, as ExecuTorch emits it::

    JumpFalseCall(pred, false_start)
    <true branch>;  MoveCall(result_i -> out_i)...
    JumpFalseCall(False, end)            # over the false branch
    false_start: <false branch>;  MoveCall(result_i -> out_i)...
    end:

Both branches write the cond's own output values, which the rest of the method reads;
branch-local values are planned like any others (jumps only go forward).

ExecuTorch emits ``map`` the same way (``exir/emit/_emitter.py``, ``_emit_map``): a counter, the
body once, a copy of each iteration's results into the outputs at the counter's row, and a
jump back. ``while_loop`` is its cond graph, a jump out when it is false, the body, moves of
the body's results into the loop-carried values, and a jump back. Loop state (the counter,
carried values, the map's outputs) is mentioned before and inside the loop, so the planner
keeps it live across the loop; values made inside the body are planned per iteration
(:func:`exportir.format.planning.lifetimes`).

Map::

    n = sym_size(xs[0], 0)                  # a literal when the leading dim is static
    i = 0 ; out_j = full([n, ...], 0)      # outputs sized
    go = lt(i, n) ; JF go -> end           # zero iterations
  loop:
    slice_k = select_copy(xs[k], 0, i)
    <body on slices and pos_args>
    row = unsqueeze_copy(r_j, 0) ; at = full([1], i) ; index_copy(out_j, 0, at, row, out=out_j)
    i = add(i, 1) ; stop = ge(i, n) ; JF stop -> loop
  end:

While loop::

    carried_j = move(init_j)
  loop:
    <cond graph> -> pred ; JF pred -> end
    <body graph> -> r_j ; carried_j = move(r_j)     (through a copy where r_j is carried)
    JF False -> loop
  end:
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from exportir.format import schema
from exportir.fx import Node
from exportir.program import kernels
from exportir.program.kernels import EmitError

if TYPE_CHECKING:
    from exportir.program._emit_method import MethodEmitter

SYM_SIZE = schema.Operator("aten::sym_size", "int")
SELECT = schema.Operator("aten::select_copy", "int_out")
UNSQUEEZE = schema.Operator("aten::unsqueeze_copy", "out")
FULL = schema.Operator("aten::full", "out")
INDEX_COPY = schema.Operator("aten::index_copy", "out")
ADD = schema.Operator("exportir_prim::add", "Scalar")
LT = schema.Operator("exportir_prim::lt", "Scalar")
GE = schema.Operator("exportir_prim::ge", "Scalar")


def _kernel(em: MethodEmitter, op: schema.Operator, args: tuple[int, ...], node: Node) -> None:
    index = em.operator_index(op)
    em.emit_instruction(lambda d: schema.KernelCall(index, args, d), node)


def _bind(em: MethodEmitter, placeholder: Node, ref: int | None, operand: Node | None) -> None:
    """Bind a body placeholder to a value (``ref``) or to what an outer node is bound to."""
    if ref is not None:
        em.node_value[placeholder] = ref
        return
    found = False
    for table in (em.node_value, em.node_items, em.constants):
        if operand in table:
            table[placeholder] = table[operand]
            found = True
    if not found:
        raise EmitError(f"method {em.name!r}: loop operand {operand!r} has no value")


def _close_back(em: MethodEmitter, cond_ref: int, start: int, node: Node) -> None:
    em.emit_instruction(lambda d: schema.JumpFalseCall(cond_ref, start, d), node)


def _new_int(em: MethodEmitter, value: int) -> int:
    """A runtime Int value (a counter, a size read at run time)."""
    return em.add(schema.Int(value))


def _rows(em: MethodEmitter, xs: list[Node], node: Node) -> int:
    """The number of iterations: ``xs[0].size(0)`` (a literal when static)."""
    val = xs[0].meta.get("val")
    size = val.shape[0] if isinstance(val, torch.Tensor) else None
    if isinstance(size, int):
        return em.literal(schema.Int(size))
    n = _new_int(em, 0)
    _kernel(em, SYM_SIZE, (em.node_ref(xs[0]), em.literal(schema.Int(0)), n), node)
    return n


def _size_list(em: MethodEmitter, n: int, val: torch.Tensor) -> int:
    """An IntList ``[n, *val.shape[1:]]`` (inner sizes: literals, or the body's own value)."""
    items = [n]
    for s in val.shape[1:]:
        if not isinstance(s, int):
            raise EmitError(f"method {em.name!r}: a map result with a symbolic inner size "
                            f"({val.shape}) is not emitted yet")
        items.append(em.literal(schema.Int(s)))
    return em.add(schema.IntList(tuple(items)))


def emit_map(em: MethodEmitter, node: Node) -> None:
    """``map_impl(body_graph, [xs...], [pos_args...])`` as a counted loop."""
    body_attr, xs, pos_args = node.args
    body = kernels.get_attr(em.gm, body_attr.target)
    val = node.meta.get("val")
    vals = list(val) if isinstance(val, (list, tuple)) else [val]
    outs = tuple(em.new_tensor(v, f"{node.name}_{k}", contiguous=True) for k, v in enumerate(vals))
    em.node_items[node] = outs
    n = _rows(em, list(xs), node)
    i = _new_int(em, 0)
    zero = em.literal(schema.Int(0))
    em.emit_instruction(lambda d: schema.MoveCall(zero, i, d), node)
    for out, v in zip(outs, vals):
        _kernel(em, FULL, (_size_list(em, n, v), zero, out), node)
    go = em.add(schema.Bool(False))
    _kernel(em, LT, (i, n, go), node)
    to_end = em.open_jump(go, node)
    start = len(em.instructions)
    placeholders = list(body.graph.find_nodes(op="placeholder"))
    for ph, x in zip(placeholders, xs):
        piece = em.new_tensor(ph.meta.get("val"), f"{node.name}_{ph.name}", contiguous=True)
        _kernel(em, SELECT, (em.node_ref(x), zero, i, piece), node)
        _bind(em, ph, piece, None)
    for ph, arg in zip(placeholders[len(xs):], pos_args):
        _bind(em, ph, None, arg)
    results = em.inline_body(body)
    one = em.literal(schema.Int(1))
    at_size = em.add(schema.IntList((one,)))
    for k, (result, out, v) in enumerate(zip(results, outs, vals)):
        src = em.output_ref(result)
        row = em.new_tensor(torch.empty((1, *v.shape[1:]), dtype=v.dtype, device="meta"),
                            f"{node.name}_row{k}", contiguous=True)
        _kernel(em, UNSQUEEZE, (src, zero, row), node)
        at = em.new_tensor(torch.empty(1, dtype=torch.int64, device="meta"), f"{node.name}_at{k}")
        _kernel(em, FULL, (at_size, i, at), node)
        _kernel(em, INDEX_COPY, (out, zero, at, row, out), node)
    _kernel(em, ADD, (i, one, i), node)
    stop = em.add(schema.Bool(False))
    _kernel(em, GE, (i, n, stop), node)
    _close_back(em, stop, start, node)
    em.close_jump(to_end)


def _carried(em: MethodEmitter, value: Any, name: str) -> int:
    """A loop-carried value: a planned tensor, or a runtime scalar."""
    if isinstance(value, torch.Tensor):
        return em.new_tensor(value, name)
    return em.scalar_value(value, name)


def emit_while(em: MethodEmitter, node: Node) -> None:
    """``while_loop(cond_graph, body_graph, carried, additional)`` as a loop."""
    cond_attr, body_attr, carried_in, additional = node.args
    cond_gm = kernels.get_attr(em.gm, cond_attr.target)
    body_gm = kernels.get_attr(em.gm, body_attr.target)
    val = node.meta.get("val")
    vals = list(val) if isinstance(val, (list, tuple)) else [val]
    slots = tuple(_carried(em, v, f"{node.name}_{k}") for k, v in enumerate(vals))
    em.node_items[node] = slots
    for init, slot in zip(carried_in, slots):
        src = em.output_ref(init)
        em.emit_instruction(lambda d, s=src, t=slot: schema.MoveCall(s, t, d), node)
    start = len(em.instructions)
    for gm in (cond_gm, body_gm):
        placeholders = list(gm.graph.find_nodes(op="placeholder"))
        for ph, slot in zip(placeholders, slots):
            _bind(em, ph, slot, None)
        for ph, arg in zip(placeholders[len(slots):], additional):
            _bind(em, ph, None, arg)
    (pred,) = em.inline_body(cond_gm)
    to_end = em.open_jump(em.output_ref(pred), node)
    results = [em.output_ref(r) for r in em.inline_body(body_gm)]
    staged = []
    for k, (src, slot) in enumerate(zip(results, slots)):
        if src in slots and src != slot:  # read by a later move: copy it out first
            temp = _carried(em, vals[k], f"{node.name}_next{k}")
            em.emit_instruction(lambda d, s=src, t=temp: schema.MoveCall(s, t, d), node)
            src = temp
        staged.append((src, slot))
    for src, slot in staged:
        if src != slot:
            em.emit_instruction(lambda d, s=src, t=slot: schema.MoveCall(s, t, d), node)
    _close_back(em, em.literal(schema.Bool(False)), start, node)
    em.close_jump(to_end)


def emit_cond(em: MethodEmitter, node: Node) -> None:
    """``cond(pred, true_graph, false_graph, operands)`` (module docstring)."""
    pred, true_attr, false_attr, operands = node.args
    outs = em.result_tensors(node, "{name}_{i}")
    if isinstance(pred, Node):
        pred_ref = em.node_ref(pred)
    else:  # a Python bool predicate (the operator called directly)
        pred_ref = em.literal(schema.Bool(bool(pred)))
    to_false = em.open_jump(pred_ref, node)
    _branch(em, kernels.get_attr(em.gm, true_attr.target), operands, outs, node)
    to_end = em.open_jump(em.literal(schema.Bool(False)), node)
    em.close_jump(to_false)
    _branch(em, kernels.get_attr(em.gm, false_attr.target), operands, outs, node)
    em.close_jump(to_end)


def _branch(em: MethodEmitter, body: Any, operands: Any, outs: tuple[int, ...],
            node: Node) -> None:
    """Emit ``body``'s nodes inline (its placeholders bound to ``operands``), then move its
    results into ``outs``."""
    placeholders = body.graph.find_nodes(op="placeholder")
    for ph, operand in zip(placeholders, operands):
        if not isinstance(operand, Node):
            raise EmitError(f"cond node {node.name!r}: operand {operand!r} is not a node")
        for table in (em.node_value, em.node_items, em.constants):
            if operand in table:
                table[ph] = table[operand]
    results = em.inline_body(body)
    output = body.graph.output_node()
    for value, out in zip(results, outs):
        src = em.output_ref(value)
        em.emit_instruction(lambda d, s=src, t=out: schema.MoveCall(s, t, d), output)


CONTROL_FLOW = {
    torch.ops.higher_order.cond: emit_cond,
    torch.ops.higher_order.map_impl: emit_map,
    torch.ops.higher_order.while_loop: emit_while,
}
