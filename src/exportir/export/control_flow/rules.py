"""Control flow in exportir.export: ``torch.cond``, ``map`` and ``torch.while_loop``.

Users call torch's operators (``torch.cond``, ``torch.ops.higher_order.map_impl`` through
``functorch.experimental.control_flow.map``, ``torch.while_loop``); they are
``HigherOrderOperator`` objects. :class:`ControlFlowMode`, a ``TorchFunctionMode`` entered by
capture (and by ``retrace``), catches them before autograd or torch's own tracing sees them and
hands them to a rule of this module, keyed by operator in ``RULES``. A rule traces every body
with our recorder (_cf_trace.py), checks what torch checks, and records one node in torch's
graph form::

    true_graph_0 = self.true_graph_0
    false_graph_0 = self.false_graph_0
    cond = torch.ops.higher_order.cond(gt, true_graph_0, false_graph_0, (x, mul))
    getitem = cond[0]

    map_impl = torch.ops.higher_order.map_impl(body_graph_0, [xs], [y])
    while_loop = torch.ops.higher_order.while_loop(
        while_loop_cond_graph_0, while_loop_body_graph_0, (i, x), (p_w,))

Tensors a body reaches by closure (outer intermediates, parameters, buffers) are lifted to
extra operands (cond), extra ``pos_args`` (map) or ``additional_inputs`` (while_loop).

The recorded nodes run on real tensors as they are: torch's operators accept any callable as a
body, and a GraphModule is one. ``run_decompositions`` re-runs them through ``retrace``, which
calls the operator on fakes with GraphModule bodies; the same rules re-trace those bodies node by
node, decomposing them with the same table.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Self

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _get_current_dispatch_mode

from exportir import pytree
from exportir.export.capture._node_meta import innermost_user_frame
from exportir.export.capture.extension import CaptureExtension
from exportir.export.capture.fake import FakeTensor, _no_modes, fake_from_meta, fake_like, meta_of
from exportir.export.capture.recorder import CaptureMode, Recorder
from exportir.export.control_flow._trace import (
    LIFTED_OPERANDS_ARG,
    SUBGRAPH_ARGS,
    ControlFlowError,
    Traced,
    attach_subgraphs,
    describe,
    finish,
    fresh_index,
    lifted_union,
    trace_body,
)

higher_order = torch.ops.higher_order

__all__ = [
    "CONTROL_FLOW",
    "LIFTED_OPERANDS_ARG",
    "SUBGRAPH_ARGS",
    "ControlFlowError",
    "ControlFlowMode",
    "attach_subgraphs",
]


class ControlFlowMode(TorchFunctionMode):
    """Routes control-flow operators called during capture to their rule in ``RULES``.

    Everything else passes through untouched. While a rule traces the bodies the mode is
    re-entered, so control flow nested in a body is captured the same way.

    ``torch.cond`` / ``torch.while_loop`` call ``torch.compile`` on a wrapper before reaching
    the operator. Under capture's dispatch mode dynamo would skip that frame and remember the
    skip for the wrapper's code object, breaking every later eager ``torch.cond`` and
    ``torch.export`` in the process; so while the mode is active the compiler stance is
    ``force_eager`` (public ``torch.compiler.set_stance``; restored on exit).
    """

    def __init__(self) -> None:
        super().__init__()
        self._stances: list[Any] = []

    def __enter__(self) -> Self:
        stance = torch.compiler.set_stance("force_eager")
        stance.__enter__()
        self._stances.append(stance)
        try:
            return super().__enter__()
        except BaseException:
            self._stances.pop().__exit__(None, None, None)
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._stances.pop().__exit__(*exc)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        rule = RULES.get(func)
        rec = _current_recorder() if rule is not None else None
        if rec is None:
            return func(*args, **kwargs)
        with self:
            return rule(rec, *args, **kwargs)


def _current_recorder() -> Recorder | None:
    mode = _get_current_dispatch_mode()
    return mode.recorder if isinstance(mode, CaptureMode) else None


# --- cond --------------------------------------------------------------------------------------


def capture_cond(
    rec: Recorder, pred: Any, true_fn: Callable, false_fn: Callable, operands: Any = ()
) -> Any:
    """``cond(pred, true_graph_i, false_graph_i, operands + lifted)``; returns the branch
    outputs with the true branch's structure."""
    _check_cond_inputs(pred, true_fn, false_fn, operands)
    # a Python bool reaches the operator only when it is called directly (torch.cond runs the
    # taken branch itself); torch keeps both branches then, with the literal predicate
    flat_ops, _ = pytree.tree_flatten(operands)
    inputs = [(rec.node_for(o).name, o) for o in flat_ops]
    true_body = trace_body(rec, higher_order.cond, true_fn, inputs, tuple(operands))
    false_body = trace_body(rec, higher_order.cond, false_fn, inputs, tuple(operands))
    _check_branches_match(true_body, false_body)
    lifted = lifted_union([true_body, false_body])
    i = fresh_index(rec, "true_graph", "false_graph")
    true_name, false_name = f"true_graph_{i}", f"false_graph_{i}"
    # torch.cond (traced by dynamo in torch) flattens the outputs into a tuple read with
    # getitem; the operator called directly keeps a branch's single tensor as is
    single = true_body.spec.is_leaf() and not _called_from("_cond_op_wrapper")
    rec.subgraphs[true_name] = finish(true_body, lifted, single_output=single)
    rec.subgraphs[false_name] = finish(false_body, lifted, single_output=single)
    all_ops = tuple(flat_ops) + tuple(value for _, value in lifted)
    outs = tuple(fake_like(v, requires_grad=False) for v in true_body.vals)
    args = (pred, true_name, false_name, all_ops)
    if single:
        rec.record(higher_order.cond, args, {}, outs[0])
        return outs[0]
    rec.record(higher_order.cond, args, {}, outs)
    return pytree.tree_unflatten(list(outs), true_body.spec)


def _called_from(wrapper: str) -> bool:
    """Whether torch's user-facing wrapper (``torch.cond``'s ``_cond_op_wrapper``) called the
    operator, a few frames up (through ``__call__`` and the torch-function dispatch)."""
    frame = sys._getframe(1)
    for _ in range(12):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name == wrapper and "/torch/" in code.co_filename.replace("\\", "/"):
            return True
        frame = frame.f_back
    return False


def _check_cond_inputs(pred: Any, true_fn: Any, false_fn: Any, operands: Any) -> None:
    if not isinstance(pred, (bool, int, float, torch.Tensor, torch.SymBool)):
        raise _usage(
            f"Expected pred to be bool or tensor, but got {pred}.",
            "Pass a boolean scalar tensor (e.g. x.sum() > 0) or a Python bool.",
        )
    if isinstance(pred, torch.Tensor) and pred.numel() != 1:
        raise _usage(
            f"Expected pred to be bool or single-element tensor, but got {pred}.",
            "Reduce the predicate to one element, e.g. (x > 0).all() or x.sum() > 0.",
        )
    if not callable(true_fn) or not callable(false_fn):
        raise _usage(
            "Expect both branches to be callable.",
            "Pass functions (or modules) as true_fn and false_fn.",
        )
    if not isinstance(operands, (tuple, list)) or not all(
        isinstance(t, torch.Tensor) for t in pytree.tree_leaves(operands)
    ):
        raise _usage(
            "Expect operands to be a tuple of possibly nested dict/list/tuple that only "
            f"consists of tensor leaves, but got {operands}.",
            "Pass tensors as operands; Python values can be read by the branches directly "
            "(they are constants of the graph).",
        )


def _check_branches_match(t: Traced, f: Traced) -> None:
    if t.spec != f.spec:
        raise ControlFlowError(
            "Unmatched output spec from torch.cond branches: true branch tree_spec "
            f"{t.spec} vs false branch tree_spec {f.spec}.\n  {innermost_user_frame()}\n"
            f"Make {describe(t.fn)} and {describe(f.fn)} return the same structure "
            "(same containers, same number of tensors)."
        )
    for i, (a, b) in enumerate(zip(t.vals, f.vals)):
        for attr, get in _MERGE_CHECKS:
            left, right = get(a), get(b)
            if left != right:
                raise ControlFlowError(
                    "When merging two branches' output in torch.cond, expected same "
                    f"{attr} but got {left} and {right} (output {i}).\n"
                    f"  {innermost_user_frame()}\n"
                    f"Make {describe(t.fn)} and {describe(f.fn)} return tensors of the same "
                    f"{attr} (e.g. with .to(dtype), .reshape(...) or .expand(...))."
                )


_MERGE_CHECKS: tuple[tuple[str, Callable[[torch.Tensor], Any]], ...] = (
    ("dtype", lambda t: t.dtype),
    ("device", lambda t: t.device),
    ("layout", lambda t: t.layout),
    ("dim", lambda t: t.dim()),
    # torch would merge differing sizes into an unbacked symbol; without it they must agree
    ("shape", lambda t: tuple(t.shape)),
)


# --- map ---------------------------------------------------------------------------------------


def capture_map(rec: Recorder, f: Callable, xs: Any, pos_args: Any = ()) -> Any:
    """``map_impl(body_graph_i, [xs...], [pos_args... + lifted])``: ``f`` runs on one slice of
    the leading dimension; every output is stacked along a new leading dimension."""
    xs, pos_args = list(xs), list(pos_args)
    _check_map_inputs(xs, pos_args)
    n = xs[0].shape[0]
    slices = [_first_slice(x) for x in xs]
    inputs = [(rec.node_for(x).name, s) for x, s in zip(xs, slices)]
    inputs += [(rec.node_for(a).name, a) for a in pos_args]
    body = trace_body(rec, higher_order.map_impl, f, inputs, (*slices, *pos_args))
    lifted = lifted_union([body])
    name = f"body_graph_{fresh_index(rec, 'body_graph')}"
    rec.subgraphs[name] = finish(body, lifted)
    outs = tuple(_stacked(v, n) for v in body.vals)
    all_pos = pos_args + [value for _, value in lifted]
    rec.record(higher_order.map_impl, (name, xs, all_pos), {}, outs)
    return pytree.tree_unflatten(list(outs), body.spec)


def _check_map_inputs(xs: list, pos_args: list) -> None:
    if not xs or not all(isinstance(x, torch.Tensor) for x in xs):
        raise _usage(
            f"Mapped xs can only consist of tensors. Got xs {xs}.",
            "Map over tensors (or a pytree of tensors) with a leading dimension.",
        )
    if not all(isinstance(a, torch.Tensor) for a in pos_args):
        raise _usage(
            f"map's extra arguments must be tensors, got {pos_args}.",
            "Read Python values from the body's closure instead of passing them.",
        )
    shapes = [x.shape for x in xs]
    if any(len(s) == 0 for s in shapes):
        raise _usage(
            f"Mapped xs must have a leading dimension. Got shapes {shapes}.",
            "Map over tensors of at least one dimension.",
        )
    if shapes[0][0] == 0:
        raise _usage(
            "Leading dimensions of mapped xs cannot be 0.",
            "Map over a non-empty leading dimension.",
        )
    if any(s[0] != shapes[0][0] for s in shapes):
        raise _usage(
            f"Leading dimensions of mapped xs must be consistent. Got shapes {shapes}.",
            "Give every mapped tensor the same leading dimension.",
        )


def _first_slice(x: torch.Tensor) -> FakeTensor:
    """A fresh contiguous fake shaped like ``x[0]`` (what one step of map sees)."""
    with _no_modes():  # meta tensors built here are not ops of the program
        meta = torch.empty(meta_of(_as_fake(x)).shape[1:], dtype=x.dtype, device="meta")
    return fake_from_meta(meta, x.device)


def _stacked(v: torch.Tensor, n: int) -> FakeTensor:
    with _no_modes():  # meta tensors built here are not ops of the program
        meta = torch.empty((n, *meta_of(_as_fake(v)).shape), dtype=v.dtype, device="meta")
    return fake_from_meta(meta, v.device)


def _as_fake(t: torch.Tensor) -> FakeTensor:
    return t if isinstance(t, FakeTensor) else fake_like(t)




# --- while_loop --------------------------------------------------------------------------------


def capture_while_loop(
    rec: Recorder,
    cond_fn: Callable,
    body_fn: Callable,
    carried_inputs: Any,
    additional_inputs: Any = (),
    **kwargs: Any,
) -> Any:
    """``while_loop(while_loop_cond_graph_i, while_loop_body_graph_i, carried, additional +
    lifted)``; returns the final carried values."""
    carried, additional = list(carried_inputs), list(additional_inputs)
    _check_while_inputs(cond_fn, body_fn, carried, additional, kwargs)
    fresh = [fake_like(c, requires_grad=False) for c in carried]  # values change per iteration
    inputs = [("carried", c) for c in fresh] + [("additional", a) for a in additional]
    args = (*fresh, *additional)
    cond_body = trace_body(rec, higher_order.while_loop, cond_fn, inputs, args)
    loop_body = trace_body(rec, higher_order.while_loop, body_fn, inputs, args)
    _check_cond_fn_output(cond_body)
    _check_body_fn_output(loop_body, carried)
    lifted = lifted_union([cond_body, loop_body])
    names = [f"arg{i}_1" for i in range(len(inputs) + len(lifted))]
    i = fresh_index(rec, "while_loop_cond_graph", "while_loop_body_graph")
    cond_name, body_name = f"while_loop_cond_graph_{i}", f"while_loop_body_graph_{i}"
    rec.subgraphs[cond_name] = finish(cond_body, lifted, names=names, single_output=True)
    rec.subgraphs[body_name] = finish(loop_body, lifted, names=names)
    all_additional = tuple(additional) + tuple(value for _, value in lifted)
    outs = tuple(fake_like(c, requires_grad=False) for c in carried)
    rec.record(
        higher_order.while_loop, (cond_name, body_name, tuple(carried), all_additional), {}, outs
    )
    return outs


def _check_while_inputs(
    cond_fn: Any, body_fn: Any, carried: list, additional: list, kwargs: dict
) -> None:
    if not callable(cond_fn) or not callable(body_fn):
        raise _usage(
            "Expect cond_fn and body_fn to be callable.",
            "Pass functions (or modules) as cond_fn and body_fn.",
        )
    if kwargs.get("mutated_arg_indices"):
        raise _usage(
            "while_loop with mutated_arg_indices cannot be exported.",
            "Return new values from body_fn instead of mutating carried inputs.",
        )
    leaves = carried + additional
    if not all(isinstance(t, torch.Tensor) for t in leaves):
        raise _usage(
            "Expect carried_inputs to be a tuple of possibly nested dict/list/tuple that only "
            f"consists of tensor leaves, but got {tuple(carried)}.",
            "Carry tensors (e.g. torch.tensor(0) for a counter); Python ints need symbolic shapes.",
        )


def _check_cond_fn_output(body: Traced) -> None:
    v = body.vals[0] if len(body.vals) == 1 and body.spec.is_leaf() else None
    if v is None or v.dtype != torch.bool or v.dim() != 0:
        shown = v if v is not None else pytree.tree_unflatten(body.vals, body.spec)
        raise ControlFlowError(
            f"cond_fn must return a boolean scalar tensor or a boolean but got {shown}.\n"
            f"  {innermost_user_frame()}\n"
            f"Make {describe(body.fn)} return one bool tensor with no dimensions, e.g. "
            "(i < n) on a 0-d tensor or (x.sum() > 0)."
        )


def _check_body_fn_output(body: Traced, carried: list) -> None:
    outs = body.vals
    if len(outs) != len(carried):
        raise ControlFlowError(
            "Expected body_fn_output and carried_inputs to have same number of outputs but got "
            f"lhs:{outs} and rhs:{carried}.\n  {innermost_user_frame()}\n"
            f"Make {describe(body.fn)} return one new value per carried input, in order."
        )
    for i, (lhs, rhs) in enumerate(zip(outs, carried)):
        diffs = [
            f"{attr}: {get(lhs)} vs {get(rhs)}"
            for attr, get in _WHILE_CHECKS
            if get(lhs) != get(rhs)
        ]
        if diffs:
            raise ControlFlowError(
                "Expected body_fn_output and carried_inputs to have same metadata but found:\n"
                f"pair[{i}] differ in {', '.join(repr(d) for d in diffs)}, where lhs is {lhs} "
                f"and rhs is {rhs}\n  {innermost_user_frame()}\n"
                f"Make {describe(body.fn)} return values shaped like the carried inputs "
                "(same shape, dtype and strides; .contiguous() or .clone() fixes strides)."
            )


_WHILE_CHECKS: tuple[tuple[str, Callable[[torch.Tensor], Any]], ...] = (
    ("shape", lambda t: t.shape),
    ("dtype", lambda t: t.dtype),
    ("device", lambda t: t.device),
    ("stride", lambda t: t.stride()),
)


# --- table and errors ----------------------------------------------------------------------------


def _usage(what: str, fix: str) -> ControlFlowError:
    return ControlFlowError(f"{what}\n  {innermost_user_frame()}\n{fix}")


RULES: dict[Any, Callable[..., Any]] = {
    higher_order.cond: capture_cond,
    higher_order.map_impl: capture_map,
    higher_order.while_loop: capture_while_loop,
}


# what capture and retrace take to record control flow (the control-flow room builds on capture,
# so capture cannot import it: export and run_decompositions pass this in)
CONTROL_FLOW = CaptureExtension(ControlFlowMode, attach_subgraphs)
