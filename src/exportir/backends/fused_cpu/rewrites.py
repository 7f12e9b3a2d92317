"""Graph rewrites ``preprocess`` runs before writing a blob: fewer, cheaper kernel calls.

One driver (:func:`optimize`) applies the pattern table :data:`RULES` (keyed by the op a rule
starts from) until nothing changes, drops dead ops and folds constants, and repeats. Every rule
keeps the values the delegate computes (up to float rounding where noted):

- ``linear``: ``addmm(b, view(x), permute(W, [1, 0]))`` (and ``mm``), with the ``view`` back to
  ``x``'s leading dims, becomes ``linear(x, W, b)``: one call, no transposed weight;
- ``matmul``: the decomposition of a batched matmul, ``view(bmm(view(expand(a)),
  view(expand(b))))`` with optional ``clone`` s, becomes ``matmul(a, b)``;
- ``conv_bn``: ``_native_batch_norm_legit_no_training`` of a ``convolution`` it alone reads,
  all weights known, is folded into the convolution's weight and bias (computed in float64,
  rounded once);
- ``max_pool2d``: ``max_pool2d_with_indices`` whose indices nobody reads becomes ``max_pool2d``;
- layout no-ops: a ``view``/``expand`` to the same shape, an identity ``permute`` are dropped;
  chains of ``view``/``squeeze``/``unsqueeze`` and of ``permute`` collapse into one op;
- constant folding: an op whose inputs are all known (parameters handed to the backend, folded
  results, or none: ``full``, ``arange``) is computed now when its result is at most 64 KiB or
  no larger than its inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from exportir.backends.fused_cpu.ir import Graph, Op, Value, values_in

__all__ = ["FOLD_LIMIT", "RULES", "fold_constants", "optimize"]

FOLD_LIMIT = 64 * 1024

Rule = Callable[[Graph, Op], bool]


def static_shape(v: Any) -> tuple[int, ...] | None:
    """``v``'s shape when it is a tensor value of known, non-symbolic size."""
    if not isinstance(v, Value) or v.shape is None:
        return None
    shape = v.shape
    return shape if all(type(d) is int for d in shape) else None


def _unread(g: Graph, values: list[Value]) -> bool:
    return all(not g.readers(v) and all(o is not v for o in g.outputs) for v in values)


def _absorb_reader(g: Graph, op: Op, reader: Op) -> None:
    """``op`` now produces what ``reader`` produced; ``reader`` goes."""
    op.outs = reader.outs
    op.nodes = (*op.nodes, *reader.nodes)
    g.remove(reader)


def _alias(g: Graph, op: Op, source: Value) -> bool:
    g.replace_uses(op.out, source)
    g.remove(op)
    return True


# ------------------------------------------------------------------------------ linear, matmul


def linear(g: Graph, op: Op) -> bool:
    if op.kwargs:
        return False
    if op.name == "aten.addmm.default":
        bias, x, wt = op.args
        if static_shape(bias) is None or len(bias.shape) != 1:
            return False
    else:
        (x, wt), bias = op.args, None
    t = g.producer(wt, "aten.permute_copy.default")
    if t is None or list(t.args[1]) != [1, 0]:
        return False
    op.name, op.args, op.nodes = "aten.linear.default", [x, t.args[0], bias], (*op.nodes, *t.nodes)
    g.changed()
    flat = g.producer(x, "aten.view_copy.default")
    back = g.only_reader(op.out)
    if flat is not None and back is not None and back.name == "aten.view_copy.default":
        x0, out = flat.args[0], static_shape(back.out)
        x0_shape, x_shape = static_shape(x0), static_shape(x)
        if (
            x0_shape is not None
            and x_shape is not None
            and out is not None
            and len(x0_shape) >= 2
            and x0_shape[:-1] == out[:-1]
            and x0_shape[-1] == x_shape[-1]
        ):
            op.args[0] = x0
            _absorb_reader(g, op, back)
    return True


def _batched(g: Graph, v: Value) -> tuple[Value, tuple[int, ...]] | None:
    """``(a, batch)`` when ``v`` is ``view(clone?(expand?(a)), [B, m, k])``, ``a``'s last two
    dims ``[m, k]`` and ``B`` the product of ``batch`` (the expanded leading dims)."""
    flat = g.producer(v, "aten.view_copy.default")
    shape = static_shape(v)
    if flat is None or shape is None or len(shape) != 3:
        return None
    a = flat.args[0]
    clone = g.producer(a, "aten.clone.default")
    if clone is not None and clone.kwargs.get("memory_format") in (None, torch.contiguous_format):
        a = clone.args[0]
    expand = g.producer(a, "aten.expand_copy.default")
    if expand is not None and not expand.kwargs.get("implicit"):
        a = expand.args[0]
        batch = tuple(expand.args[1])[:-2]
    else:
        batch = static_shape(a)[:-2] if static_shape(a) is not None else None
    a_shape = static_shape(a)
    if batch is None or a_shape is None or len(a_shape) < 2 or a_shape[-2:] != shape[1:]:
        return None
    if any(type(d) is not int or d < 0 for d in batch) or math.prod(batch) != shape[0]:
        return None
    return a, batch


def matmul(g: Graph, op: Op) -> bool:
    if op.kwargs:
        return False
    left, right = (_batched(g, v) for v in op.args)
    back = g.only_reader(op.out)
    if left is None or right is None or back is None or back.name != "aten.view_copy.default":
        return False
    (a, batch), (b, batch_b) = left, right
    out = static_shape(back.out)
    if out is None or batch != batch_b or out[:-2] != batch:
        return False
    try:
        common = tuple(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    except RuntimeError:
        return False
    if common != batch:
        return False
    op.name, op.args = "aten.matmul.default", [a, b]
    _absorb_reader(g, op, back)
    return True


# ------------------------------------------------------------------------------ conv + batch norm


def _known(v: Any) -> torch.Tensor | None:
    return v.const if isinstance(v, Value) else None


def conv_bn(g: Graph, op: Op) -> bool:
    x, weight, bias, mean, var, _momentum, eps = op.args
    conv = g.producer(x, "aten.convolution.default")
    if conv is None or g.only_reader(x) is not op or not _unread(g, op.outs[1:]):
        return False
    cw, cb, transposed = conv.args[1], conv.args[2], conv.args[6]
    stats = [_known(v) for v in (cw, mean, var)]
    optional = [(v, _known(v)) for v in (cb, weight, bias)]
    if (
        transposed
        or any(t is None for t in stats)
        or any(v is not None and t is None for v, t in optional)
    ):
        return False
    w64, mean64, var64 = (t.double() for t in stats)
    cb64, gamma, beta = (t.double() if t is not None else None for _, t in optional)
    scale = torch.rsqrt(var64 + eps) * (gamma if gamma is not None else 1.0)
    shift = (beta if beta is not None else 0.0) - mean64 * scale
    new_w = w64 * scale.reshape(-1, *[1] * (w64.dim() - 1))
    new_b = (cb64 * scale if cb64 is not None else 0.0) + shift
    dtype = stats[0].dtype
    conv.args[1] = Value(new_w.to(dtype), new_w.to(dtype), f"{cw.name}_bn")
    conv.args[2] = Value(new_b.to(dtype), new_b.to(dtype), f"{op.out.name}_bias")
    _absorb_reader(g, conv, op)
    conv.outs = conv.outs[:1]
    conv.multi = False
    return True


def max_pool2d(g: Graph, op: Op) -> bool:
    if not _unread(g, op.outs[1:]):
        return False
    op.name, op.outs, op.multi = "aten.max_pool2d.default", op.outs[:1], False
    g.changed()
    return True


# ------------------------------------------------------------------------------ layout no-ops


_RESHAPES = ("aten.view_copy.default", "aten.unsqueeze_copy.default", "aten.squeeze_copy.dims",
             "aten.squeeze_copy.dim")  # fmt: skip


def view(g: Graph, op: Op) -> bool:
    x = op.args[0]
    if static_shape(x) is not None and static_shape(x) == static_shape(op.out):
        return _alias(g, op, x)
    inner = g.producer(x)
    if inner is None or inner.name not in _RESHAPES or static_shape(inner.args[0]) is None:
        return False
    op.args = [inner.args[0], *op.args[1:]]
    op.nodes = (*inner.nodes, *op.nodes)
    g.changed()
    return True


def permute(g: Graph, op: Op) -> bool:
    x, dims = op.args
    if list(dims) == list(range(len(dims))):
        return _alias(g, op, x)
    inner = g.producer(x, "aten.permute_copy.default")
    if inner is None:
        return False
    first = list(inner.args[1])
    op.args = [inner.args[0], [first[d] for d in dims]]
    g.changed()
    return True


def expand(g: Graph, op: Op) -> bool:
    x = op.args[0]
    if static_shape(x) is not None and static_shape(x) == static_shape(op.out):
        return _alias(g, op, x)
    return False


RULES: dict[str, tuple[Rule, ...]] = {
    "aten.addmm.default": (linear,),
    "aten.mm.default": (linear,),
    "aten.bmm.default": (matmul,),
    "aten._native_batch_norm_legit_no_training.default": (conv_bn,),
    "aten.max_pool2d_with_indices.default": (max_pool2d,),
    "aten.view_copy.default": (view,),
    "aten.permute_copy.default": (permute,),
    "aten.expand_copy.default": (expand,),
}


# ------------------------------------------------------------------------------ folding, driver


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _substitute(x: Any) -> Any:
    if isinstance(x, Value):
        return x.const
    if isinstance(x, list):
        return [_substitute(v) for v in x]
    return x


def _aten(name: str) -> Any:
    _, packet, overload = name.split(".")
    return getattr(getattr(torch.ops.aten, packet), overload)


def fold_constants(g: Graph) -> bool:
    """Compute ops whose inputs are all known (see the module docstring); True if any."""
    folded = False
    for op in list(g.ops):
        reads = list(values_in([op.args, op.kwargs]))
        if any(v.const is None for v in reads):
            continue
        with torch.no_grad():
            result = _aten(op.name)(*_substitute(op.args), **_substitute(op.kwargs))
        results = list(result) if op.multi else [result]
        size = sum(_nbytes(r) for r in results)
        if size > max(FOLD_LIMIT, sum(_nbytes(v.const) for v in reads)):
            continue
        if not all(isinstance(r, torch.Tensor) for r in results):
            continue
        for value, r in zip(op.outs, results):
            value.const = r.contiguous()
        g.remove(op)
        folded = True
    return folded


def _apply_rules(g: Graph) -> bool:
    changed = False
    progress = True
    while progress:
        progress = False
        for op in list(g.ops):
            if not any(o is op for o in g.ops):
                continue  # removed by an earlier rewrite
            for rule in RULES.get(op.name, ()):
                if rule(g, op):
                    progress = changed = True
                    break
    return changed


def optimize(g: Graph) -> Graph:
    """Rewrite ``g`` in place until no rule, dead-op removal or folding changes it."""
    while True:
        changed = _apply_rules(g)
        changed |= g.remove_dead()
        changed |= fold_constants(g)
        if not changed:
            return g
