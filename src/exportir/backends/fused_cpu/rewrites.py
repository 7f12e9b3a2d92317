"""Graph rewrites ``preprocess`` runs before writing a blob: fewer, cheaper kernel calls.

One driver (:func:`optimize`) applies the pattern table :data:`RULES` (keyed by the op a rule
starts from) until nothing changes, drops dead ops and folds constants, and repeats. Every rule
keeps the values the delegate computes (up to float rounding where noted):

- ``linear``: ``addmm(b, view(x), permute(W, [1, 0]))`` (and ``mm``), with the ``view`` back to
  ``x``'s leading dims, becomes ``linear(x, W, b)``: one call, no transposed weight;
- permutes keeping the last dim move across a ``linear`` to join the layout ops on the other
  side; ``view(linear(view(x, [M, K])), S + [N])`` becomes ``linear(view(x, S + [K]))``;
- ``matmul``: the decomposition of a batched matmul, ``view(bmm(view(expand(a)),
  view(expand(b))))`` with optional ``clone`` s, becomes ``matmul(a, b)``;
- ``conv_bn``: ``_native_batch_norm_legit_no_training`` of a ``convolution`` it alone reads,
  all weights known, is folded into the convolution's weight and bias (computed in float64,
  rounded once);
- ``grouped_attention``: flash attention over keys / values whose heads were repeated to the
  query's (``view(expand(unsqueeze(kv, 2)))``) reads ``kv`` itself (grouped-query attention);
- ``max_pool2d``: ``max_pool2d_with_indices`` whose indices nobody reads becomes ``max_pool2d``,
  likewise ``native_group_norm`` / ``native_layer_norm`` the ``group_norm`` / ``layer_norm``; ``mul(x, sigmoid(x))`` becomes ``silu(x)``;
- layout no-ops: a ``view``/``expand`` to the same shape, an identity ``permute`` are dropped;
  chains of ``view``/``squeeze``/``unsqueeze`` and of ``permute`` collapse into one op;
- small convolutions on the kernels fast for them (:mod:`.conv`); an LLM decode step's int8
  linears sharing an input as one, rotate-half rotary as a ``roll``, a repeated mask made once
  (:mod:`.llm`);
- constant folding: an op whose inputs are all known (parameters handed to the backend, folded
  results, or none: ``full``, ``arange``) is computed now when its result is at most 64 KiB or
  no larger than its inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from exportir.backends.fused_cpu.conv import CONV_FUSIONS, CONV_RULES, channels_last
from exportir.backends.fused_cpu.epilogue import EPILOGUE_FUSIONS, LINEAR_RULES
from exportir.backends.fused_cpu.ir import Graph, Op, Value, static_shape, values_in
from exportir.backends.fused_cpu.layout import LAYOUT_RULES
from exportir.backends.fused_cpu.llm import LLM_KERNEL_RULES
from exportir.backends.fused_cpu.quantized import QUANT_RULES, uint8_activations
from exportir.runtime.backends.fused_cpu import DTYPES

__all__ = ["FOLD_LIMIT", "KERNEL_RULES", "RULES", "fold_constants", "optimize"]

FOLD_LIMIT = 64 * 1024
_STORABLE = frozenset(DTYPES.values())

Rule = Callable[[Graph, Op], bool]


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
            g.absorb(op, back)
    return True


def _batched(g: Graph, v: Value) -> tuple[Value, tuple[int, ...]] | None:
    """``(a, batch)`` when ``v`` (shape ``[B, m, k]``) is ``view?(clone?(expand?(a)))``,
    ``a``'s last two dims ``[m, k]`` and ``B`` the product of ``batch`` (the leading dims ``a``
    is expanded to)."""
    shape = static_shape(v)
    if shape is None or len(shape) != 3:
        return None
    a = v
    flat = g.producer(a, "aten.view_copy.default")
    if flat is not None:
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
    if left is None or right is None:
        return False
    (a, batch), (b, batch_b) = left, right
    back = g.only_reader(op.out)
    if back is not None and back.name != "aten.view_copy.default":
        back = None
    out = static_shape(back.out if back is not None else op.out)
    if out is None or batch != batch_b or out[:-2] != batch:
        return False
    try:
        common = tuple(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    except RuntimeError:
        return False
    if common != batch or (a is op.args[0] and b is op.args[1]):
        return False  # not broadcast, or already plain bmm operands
    op.name, op.args = "aten.matmul.default", [a, b]
    if back is not None:
        g.absorb(op, back)
    g.changed()
    return True


def matmul_linear(g: Graph, op: Op) -> bool:
    """``matmul(x, permute(W, [1, 0]))`` is ``linear(x, W)`` (``x`` at least 2-D)."""
    x, wt = op.args
    t = g.producer(wt, "aten.permute_copy.default")
    x_shape = static_shape(x)
    if t is None or list(t.args[1]) != [1, 0] or x_shape is None or len(x_shape) < 2:
        return False
    op.name, op.args, op.nodes = "aten.linear.default", [x, t.args[0], None], (*op.nodes, *t.nodes)
    g.changed()
    return True


def linear_bias(g: Graph, op: Op) -> bool:
    """``add(linear(x, W), b)`` (either order, ``b`` of shape ``[N]``) is ``linear(x, W, b)``."""
    if op.kwargs or len(op.args) != 2:
        return False
    for lin, bias in (op.args, op.args[::-1]):
        inner = g.producer(lin, "aten.linear.default") if isinstance(lin, Value) else None
        if inner is None or inner.args[2] is not None or g.only_reader(lin) is not op:
            continue
        b_shape, out = static_shape(bias), static_shape(op.out)
        if b_shape is None or out is None or len(b_shape) != 1 or b_shape[0] != out[-1]:
            continue
        if bias.dtype != lin.dtype or out != static_shape(lin):
            continue
        inner.args = [inner.args[0], inner.args[1], bias]
        g.absorb(inner, op)
        return True
    return False


# ------------------------------------------------------------------------------ conv + batch norm


_LAYOUT_CHAIN = frozenset({"aten.permute_copy.default", "aten.view_copy.default",
                           "aten.unsqueeze_copy.default", "aten.squeeze_copy.dims",
                           "aten.squeeze_copy.dim"})  # fmt: skip


def _keeps_last(perm: Any) -> bool:
    return list(perm)[-1] == len(perm) - 1


def _is_chain_op(op: Op | None) -> bool:
    return op is not None and op.name in _LAYOUT_CHAIN


def permute_after_linear(g: Graph, op: Op) -> bool:
    """``linear(permute(x, p))`` is ``permute(linear(x), p)`` when ``p`` keeps the last dim;
    moved when layout ops read the result (the permute joins them)."""
    t = g.producer(op.args[0], "aten.permute_copy.default")
    reader = g.only_reader(op.out)
    if t is None or g.only_reader(op.args[0]) is not op or not _is_chain_op(reader):
        return False
    x, perm = t.args
    x_shape, out = static_shape(x), static_shape(op.out)
    if x_shape is None or out is None or not _keeps_last(perm):
        return False
    meta = torch.empty((*x_shape[:-1], out[-1]), dtype=op.out.dtype, device="meta")
    inner = Value(meta, name=f"{op.out.name}_unpermuted")
    g.insert_before(op, Op(op.name, [x, *op.args[1:]], dict(op.kwargs), [inner], False, op.nodes))
    g.remove(t)
    op.name, op.args, op.kwargs, op.nodes = "aten.permute_copy.default", [inner, perm], {}, t.nodes
    g.changed()
    return True


def permute_before_linear(g: Graph, op: Op) -> bool:
    """``permute(linear(y), p)`` is ``linear(permute(y, p))`` when ``p`` keeps the last dim;
    moved when ``y`` comes from layout ops (the permute joins them) and no layout op reads the
    result (else :func:`permute_after_linear` is the better move)."""
    x, perm = op.args
    lin = g.producer(x, "aten.linear.default")
    if lin is None or g.only_reader(x) is not op or not _keeps_last(perm):
        return False
    y = lin.args[0]
    if not _is_chain_op(g.producer(y)) or any(_is_chain_op(r) for r in g.readers(op.out)):
        return False
    y_shape = static_shape(y)
    if y_shape is None:
        return False
    meta = torch.empty([y_shape[d] for d in perm], dtype=y.dtype, device="meta")
    moved = Value(meta, name=f"{op.out.name}_input")
    g.insert_before(lin, Op(op.name, [y, list(perm)], {}, [moved], False, op.nodes))
    lin.args = [moved, *lin.args[1:]]
    g.absorb(lin, op)
    return True


def linear_unflatten(g: Graph, op: Op) -> bool:
    """``view(linear(view(x, [M, K])), S + [N])`` is ``linear(view(x, S + [K]))``."""
    flat = g.producer(op.args[0], "aten.view_copy.default")
    back = g.only_reader(op.out)
    if flat is None or back is None or back.name != "aten.view_copy.default":
        return False
    shape, out = static_shape(op.args[0]), static_shape(back.out)
    if shape is None or out is None or len(shape) != 2 or len(out) < 2:
        return False
    if math.prod(out[:-1]) != shape[0] or out[-1] != static_shape(op.out)[-1]:
        return False
    target = [*out[:-1], shape[1]]
    meta = torch.empty(target, dtype=op.args[0].dtype, device="meta")
    unflat = Value(meta, name=f"{op.out.name}_input")
    g.insert_before(op, Op(flat.name, [flat.args[0], target], {}, [unflat], False, flat.nodes))
    op.args = [unflat, *op.args[1:]]
    g.absorb(op, back)
    return True


def _known(v: Any) -> torch.Tensor | None:
    return v.const if isinstance(v, Value) else None


def conv_bn(g: Graph, op: Op) -> bool:
    x, weight, bias, mean, var, _momentum, eps = op.args
    conv = g.producer(x, "aten.convolution.default")
    if conv is None or g.only_reader(x) is not op or not g.unread(op.outs[1:]):
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
    g.absorb(conv, op)
    conv.outs = conv.outs[:1]
    conv.multi = False
    return True


def silu(g: Graph, op: Op) -> bool:
    """``mul(x, sigmoid(x))`` (either order) is ``silu(x)``."""
    if op.kwargs or len(op.args) != 2 or not all(isinstance(a, Value) for a in op.args):
        return False
    for x, s in (op.args, op.args[::-1]):
        sig = g.producer(s, "aten.sigmoid.default")
        if sig is not None and sig.args[0] is x and g.only_reader(s) is op:
            if static_shape(x) is None or static_shape(x) != static_shape(op.out):
                continue
            g.remove(sig)
            op.name, op.args, op.nodes = "aten.silu.default", [x], (*sig.nodes, *op.nodes)
            g.changed()
            return True
    return False


def group_norm(g: Graph, op: Op) -> bool:
    """``native_group_norm`` whose mean and rstd nobody reads is ``group_norm``."""
    if not g.unread(op.outs[1:]) or op.kwargs:
        return False
    x, weight, bias, _n, _c, _hw, groups, eps = op.args
    op.name, op.args = "aten.group_norm.default", [x, groups, weight, bias, eps]
    op.outs, op.multi = op.outs[:1], False
    g.changed()
    return True


def layer_norm(g: Graph, op: Op) -> bool:
    """``native_layer_norm`` whose mean and rstd nobody reads is ``layer_norm``."""
    if not g.unread(op.outs[1:]) or op.kwargs:
        return False
    op.name, op.outs, op.multi = "aten.layer_norm.default", op.outs[:1], False
    g.changed()
    return True


def max_pool2d(g: Graph, op: Op) -> bool:
    if not g.unread(op.outs[1:]):
        return False
    op.name, op.outs, op.multi = "aten.max_pool2d.default", op.outs[:1], False
    g.changed()
    return True


def _grouped(g: Graph, v: Any) -> tuple[Value, int] | None:
    """``(x, G)`` when ``v`` is ``x [B, H, S, D]`` with each head repeated ``G`` times:
    ``view(expand(unsqueeze(x, 2), [B, H, G, S, D]), [B, H * G, S, D])`` (``repeat_kv``,
    ``repeat_interleave`` of a KV cache)."""
    view = g.producer(v, "aten.view_copy.default") if isinstance(v, Value) else None
    expand = g.producer(view.args[0], "aten.expand_copy.default") if view else None
    unsqueeze = g.producer(expand.args[0], "aten.unsqueeze_copy.default") if expand else None
    if unsqueeze is None or unsqueeze.args[1:] not in ([2], [-3]):
        return None
    x = unsqueeze.args[0]
    xs, es, vs = static_shape(x), static_shape(expand.out), static_shape(view.out)
    if xs is None or es is None or vs is None or len(xs) != 4 or len(es) != 5:
        return None
    b, h, s, d = xs
    groups = es[2]
    if es != (b, h, groups, s, d) or vs != (b, h * groups, s, d) or groups < 1:
        return None
    return x, groups


def grouped_attention(g: Graph, op: Op) -> bool:
    """Attention over keys and values whose heads were repeated to the query's (grouped-query
    attention) reads the unrepeated ones: the CPU flash kernel pairs query head ``i`` with
    key/value head ``i // G`` itself, giving the same values without copying the cache twice."""
    if len(op.args) < 3:
        return False
    k, v = _grouped(g, op.args[1]), _grouped(g, op.args[2])
    q_shape = op.args[0].shape if isinstance(op.args[0], Value) else None
    if k is None or v is None or k[1] != v[1] or k[1] == 1 or q_shape is None:
        return False
    heads = static_shape(k[0])[1] * k[1]
    if len(q_shape) != 4 or not isinstance(q_shape[1], int) or q_shape[1] != heads:
        return False
    op.args[1], op.args[2] = k[0], v[0]
    g.changed()
    return True


RULES: dict[str, tuple[Rule, ...]] = {
    "aten.addmm.default": (linear,),
    "aten.mm.default": (linear,),
    "aten.bmm.default": (matmul,),
    "aten.matmul.default": (matmul_linear,),
    # activations and residual adds join the oneDNN linear / convolution before them
    **EPILOGUE_FUSIONS,
    "aten.add.Tensor": (linear_bias, *CONV_FUSIONS["aten.add.Tensor"], *EPILOGUE_FUSIONS["aten.add.Tensor"]),
    "aten.relu.default": (*CONV_FUSIONS["aten.relu.default"], *EPILOGUE_FUSIONS["aten.relu.default"]),
    # int8 / int4 kernels first: they read the weight's dequantize before it is folded
    "aten.linear.default": (
        *QUANT_RULES["aten.linear.default"], permute_after_linear, linear_unflatten,
    ),
    "aten.convolution.default": QUANT_RULES["aten.convolution.default"],  # before folding
    "aten._native_batch_norm_legit_no_training.default": (conv_bn,),
    "aten.max_pool2d_with_indices.default": (max_pool2d,),
    "aten.mul.Tensor": (silu,),
    "aten.native_group_norm.default": (group_norm,),
    "aten.native_layer_norm.default": (layer_norm,),
    "aten._scaled_dot_product_flash_attention_for_cpu.default": (grouped_attention,),
    **LAYOUT_RULES,
    # before the permute joins the layout ops before it, see whether it can cross a linear
    "aten.permute_copy.default": (
        permute_before_linear,
        *LAYOUT_RULES["aten.permute_copy.default"],
    ),
}


# Kernel choices, applied once the fusions settled.
KERNEL_RULES: dict[str, tuple[Rule, ...]] = {**CONV_RULES, **LINEAR_RULES, **LLM_KERNEL_RULES}


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
    namespace, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


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
        if not all(isinstance(r, torch.Tensor) and r.dtype in _STORABLE for r in results):
            continue
        for value, r in zip(op.outs, results):
            value.const = r.contiguous()
        g.remove(op)
        folded = True
    return folded


def _apply_rules(g: Graph, rules: dict[str, tuple[Rule, ...]]) -> bool:
    changed = False
    progress = True
    while progress:
        progress = False
        for op in list(g.ops):
            if not any(o is op for o in g.ops):
                continue  # removed by an earlier rewrite
            for rule in rules.get(op.name, ()):
                if rule(g, op):
                    # rules also rewrite ops' arguments in place, which the graph's reader
                    # index does not see: it is rebuilt before the next rule reads it
                    g.changed()
                    progress = changed = True
                    break
    return changed


def _settle(g: Graph) -> None:
    while True:
        changed = _apply_rules(g, RULES)
        changed |= g.remove_dead()
        changed |= fold_constants(g)
        if not changed:
            return


def optimize(g: Graph) -> Graph:
    """Rewrite ``g`` in place until no rule, dead-op removal or folding changes it; then pick
    kernels for what is left (:data:`KERNEL_RULES`, after the fusions that need the ATen ops:
    a batch norm folds into a ``convolution``) and settle again."""
    _settle(g)
    if _apply_rules(g, KERNEL_RULES):
        _settle(g)
    uint8_activations(g)  # after the int8 kernels are chosen: it reads what they are
    channels_last(g)  # last: the layout rules would see the conversions as copies to drop
    return g
