"""Rewrites for the decode step of a transformer (few rows, many small kernel calls).

A decode step's time at small model sizes is mostly fixed costs per kernel call, not
arithmetic; these rules make fewer calls for the same values:

- ``shared_input_int8``: the dynamically quantized int8 linears (``linear_dynamic_int8``) reading
  the same input with the same ``eps`` and post-op (an attention's q / k / v projections, a
  SwiGLU's gate and up projections), weights and scales constants of the blob, become one such
  linear over the weights concatenated along the output channels, then one
  ``split_with_sizes`` giving each projection its part. The activation's qparams depend only on
  the input, the int8 sums are exact and each output channel is scaled on its own, so every
  value is bit for bit what the separate linears compute; fbgemm's fixed cost per call (~15 us
  at one row) is paid once instead of three times;
- ``rotary``: ``cat([-x2, x1]) * sin`` with ``x1, x2`` the halves of ``x`` (the rotate-half of
  rotary embeddings: split or two slices, neg, cat, mul) is ``roll(x, D / 2) * (sin * [-1, .., 1, ..])``: two
  calls, the signed ``sin`` made once per ``sin`` and shared by every layer. Negation is exact,
  so the values are bit for bit the same;
- ``same_mask``: a ``where`` computing what an earlier one computes (the attention mask each
  layer makes from the same positions and equal constants) is dropped for the earlier one.

Measured and left out: RMSNorm's six calls as one ``torch.rms_norm`` (bit for bit the same
values) cost more at one row (18.6 vs 16.7 us a norm in the decode step: its CPU kernel runs
the same six operations inside, each through the dispatcher).
"""

from __future__ import annotations

from typing import Any

import torch

from exportir.backends.fused_cpu.ir import Graph, Op, Value, static_shape
from exportir.runtime.backends.fused_cpu.dynamic_int8 import LINEAR_DYNAMIC_INT8

__all__ = ["LLM_KERNEL_RULES", "rotary", "same_mask", "shared_input_int8"]

_SPLIT = "aten.split_with_sizes_copy.default"
_VIEW = "aten.view_copy.default"
_SLICE = "aten.slice_copy.Tensor"


def _int8_parts(op: Op) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """``(weight, scales, bias)`` of a ``linear_dynamic_int8`` whose weight, scales and bias
    (if any) are blob constants and whose result has a static shape, else None."""
    if op.name != LINEAR_DYNAMIC_INT8 or op.kwargs or len(op.args) != 6 or op.multi:
        return None
    _x, w, scales, bias = op.args[:4]
    if not (isinstance(w, Value) and w.const is not None and w.const.dim() == 2):
        return None
    if not (isinstance(scales, Value) and scales.const is not None):
        return None
    if bias is not None and not (isinstance(bias, Value) and bias.const is not None):
        return None
    if static_shape(op.out) is None:
        return None
    return w.const, scales.const, None if bias is None else bias.const


def _input(g: Graph, v: Any) -> tuple[Any, ...]:
    """What a linear reads, up to a flatten: ``(x,)`` or ``(x, shape)`` for ``view(x, shape)``
    (a linear rebuilt from ``mm`` reads its own flatten of the shared input)."""
    view = g.producer(v, _VIEW) if isinstance(v, Value) else None
    if view is not None and not view.kwargs and isinstance(view.args[0], Value):
        return (view.args[0], tuple(view.args[1]))
    return (v,)


def _merges_with(g: Graph, op: Op, other: Op) -> bool:
    if other is op or _int8_parts(other) is None:
        return False
    a, b = _input(g, op.args[0]), _input(g, other.args[0])
    if a[0] is not b[0] or a[1:] != b[1:]:
        return False
    same_tail = other.args[4:] == op.args[4:]  # eps, post_op
    same_k = other.args[1].const.shape[1] == op.args[1].const.shape[1]
    same_lead = static_shape(other.out)[:-1] == static_shape(op.out)[:-1]
    same_bias = (other.args[3] is None) == (op.args[3] is None)
    return same_tail and same_k and same_lead and same_bias


def shared_input_int8(g: Graph, op: Op) -> bool:
    """The module docstring's ``shared_input_int8``, for the group ``op`` is the first of."""
    if _int8_parts(op) is None or not isinstance(op.args[0], Value):
        return False
    source = _input(g, op.args[0])[0]
    readers = [*g.readers(source), *(r for v in g.readers(source) if v.name == _VIEW
                                     for r in g.readers(v.out))]
    group = [op, *dict.fromkeys(o for o in readers if _merges_with(g, op, o))]
    if len(group) < 2:
        return False
    parts = [_int8_parts(o) for o in group]
    sizes = [int(w.shape[0]) for w, _, _ in parts]
    name = group[0].out.name
    weight = torch.cat([w for w, _, _ in parts]).contiguous()
    scales = torch.cat([s for _, s, _ in parts]).contiguous()
    consts: list[Any] = [_const(weight, f"{name}_w8_cat"), _const(scales, f"{name}_ws_cat")]
    if parts[0][2] is None:
        consts.append(None)
    else:
        consts.append(_const(torch.cat([b for _, _, b in parts]).contiguous(), f"{name}_b_cat"))
    lead = static_shape(op.out)[:-1]
    nodes = tuple(n for o in group for n in o.nodes)
    merged = Value(torch.empty((*lead, sum(sizes)), dtype=torch.float32, device="meta"),
                   name=f"{name}_cat")
    first = next(o for o in g.ops if any(o is m for m in group))  # its input is defined first
    g.insert_before(first, Op(LINEAR_DYNAMIC_INT8, [first.args[0], *consts, *op.args[4:]], {},
                              [merged], False, nodes))
    g.insert_before(first, Op(_SPLIT, [merged, sizes, -1], {}, [o.out for o in group], True,
                              nodes))
    for o in group:
        g.remove(o)
    return True


def _only(g: Graph, v: Any, name: str) -> Op | None:
    """The op ``name`` that alone reads ``v``, else None."""
    reader = g.only_reader(v) if isinstance(v, Value) else None
    return reader if reader is not None and reader.name == name and not reader.kwargs else None


def _other(op: Op, v: Any) -> Any:
    """The other argument of a binary ``op`` one of whose two arguments is ``v``."""
    a, b = op.args[:2]
    return b if a is v else a if b is v else None


def _halves(g: Graph, a: Any, b: Any) -> Value | None:
    """``x`` when ``a, b`` are the first and second halves of ``x``'s last dim: the two results
    of one split (``chunk``) or two slices (``x[..., :h]``, ``x[..., h:]``)."""
    split = g.producer(a, _SPLIT)
    if split is not None and not split.kwargs and len(split.outs) == 2 and split.outs[1] is b:
        x, sizes, dim = (*split.args, 0)[:3]
        shape = static_shape(x)
        if shape is None or dim not in (-1, len(shape) - 1) or list(sizes) != [shape[-1] // 2] * 2:
            return None
        return x if 2 * sizes[0] == shape[-1] else None
    first, second = g.producer(a, _SLICE), g.producer(b, _SLICE)
    if first is None or second is None or first.kwargs or second.kwargs:
        return None
    x = first.args[0]
    shape = static_shape(x)
    if shape is None or second.args[0] is not x or shape[-1] % 2:
        return None
    half, last = shape[-1] // 2, len(shape) - 1
    lo, hi = (_slice_args(op) for op in (first, second))
    if lo[0] not in (-1, last) or hi[0] not in (-1, last) or lo[3] != 1 or hi[3] != 1:
        return None
    if lo[1] not in (0, None) or lo[2] != half or hi[1] != half:
        return None
    return x if hi[2] is None or (type(hi[2]) is int and hi[2] >= shape[-1]) else None


def _slice_args(op: Op) -> tuple[Any, ...]:
    """``(dim, start, end, step)`` of a ``slice_copy``, defaults filled in."""
    given = tuple(op.args[1:5])
    return (*given, *(0, None, None, 1)[len(given):])


def _signed(g: Graph, sin: Value, half: int, before: Op) -> Value:
    """``sin * [-1] * half + [1] * half``: the one already made for ``sin``, else a new one
    placed before the first op reading ``sin``."""
    signs = torch.cat([-torch.ones(half), torch.ones(half)])
    for r in g.readers(sin):
        c = r.args[1] if r.name == "aten.mul.Tensor" and len(r.args) == 2 else None
        if r.args[0] is sin and isinstance(c, Value) and c.name.endswith("_rotary_signs") and (
                torch.equal(c.const, signs)):
            return r.out
    first = next(o for o in g.ops if any(v is sin for v in _reads(o)) or o is before)
    return g.emit_before(first, "aten.mul.Tensor", [sin, _const(signs, f"{sin.name}_rotary_signs")],
                         sin.shape, torch.float32, (f"{sin.name}_signed",))


def _reads(op: Op) -> list[Any]:
    return [v for a in op.args for v in (a if isinstance(a, list) else [a])]


def rotary(g: Graph, op: Op) -> bool:
    """The module docstring's ``rotary``, matched from its ``cat``."""
    parts, dim = (*op.args, 0)[:2]
    if op.kwargs or not isinstance(parts, list) or len(parts) != 2:
        return False
    neg = g.producer(parts[0], "aten.neg.default")
    if neg is None or g.only_reader(neg.out) is not op:
        return False
    x = _halves(g, parts[1], neg.args[0])
    shape = static_shape(x)
    if x is None or x.dtype != torch.float32 or dim not in (-1, len(shape) - 1):
        return False
    mul = _only(g, op.out, "aten.mul.Tensor")
    sin = _other(mul, op.out) if mul is not None else None
    sin_shape = static_shape(sin)
    if not sin_shape or sin.dtype != torch.float32 or sin_shape[-1] != shape[-1]:
        return False
    if static_shape(mul.out) != shape:
        return False
    signed = _signed(g, sin, shape[-1] // 2, mul)
    rolled = g.emit_before(mul, "aten.roll.default", [x, [shape[-1] // 2], [-1]], shape,
                           torch.float32, op.nodes)
    mul.args = [rolled, signed]
    g.remove(op)
    g.remove(neg)
    return True


def _same_arg(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, Value) and isinstance(b, Value):
        x, y = a.const, b.const
        return (x is not None and y is not None and x.dtype == y.dtype and x.shape == y.shape
                and x.numel() <= 64 and torch.equal(x, y))
    return not isinstance(a, (Value, list)) and type(a) is type(b) and a == b


def same_mask(g: Graph, op: Op) -> bool:
    """The module docstring's ``same_mask``."""
    if op.kwargs or op.multi:
        return False
    for other in g.ops:
        if other is op:
            return False
        if (other.name == op.name and not other.kwargs and not other.multi
                and len(other.args) == len(op.args)
                and all(_same_arg(a, b) for a, b in zip(other.args, op.args))):
            other.nodes = (*other.nodes, *op.nodes)
            g.replace_uses(op.out, other.out)
            g.remove(op)
            return True
    return False


def _const(t: torch.Tensor, name: str) -> Value:
    return Value(torch.empty(t.shape, dtype=t.dtype, device="meta"), t, name=name)


# Kernel choices (applied once the fusions settled: every int8 linear of a group is chosen)
LLM_KERNEL_RULES = {
    LINEAR_DYNAMIC_INT8: (shared_input_int8,),
    "aten.cat.default": (rotary,),
    "aten.where.self": (same_mask,),
}
