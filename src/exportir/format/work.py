"""How much work one call of a method does, estimated from its planned sizes (no execution).

Each instruction's cost is counted in element operations: multiply-adds for contractions
(``mm``: ``M * K * N``, batched ones times the batch, convolution: output elements times the
weight's elements per output channel, attention: ``B * H * L * S * (E + Ev)``), and for every
other kernel, move or delegate call the elements of its tensor operands and results (a view
counts its logical elements: an ``expand`` of one element to 8192 x 8192 costs 67M). Dynamic
sizes count at their upper bounds, and every instruction counts once (jumps only go forward),
so the estimate bounds a call's work from above up to the per-element constant.
:class:`~exportir.format.validate.LoadLimits` ``max_work`` compares it with a budget.
Imports only the standard library and the format.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod

from exportir.format import schema

__all__ = ["instruction_work", "method_work"]

Sizes = tuple[int, ...]


def _mm(t: Sequence[Sizes | None]) -> int | None:
    a, b = t[0], t[1]
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return None
    return a[0] * a[1] * b[1]


def _bmm(t: Sequence[Sizes | None]) -> int | None:
    a, b = t[0], t[1]
    if a is None or b is None or len(a) != 3 or len(b) != 3:
        return None
    return a[0] * a[1] * a[2] * b[2]


def _shifted(rule: Callable[[Sequence[Sizes | None]], int | None], skip: int):
    """``rule`` on the operands after the first ``skip`` (``addmm(self, mat1, mat2)``)."""
    return lambda t: rule(t[skip:])


def _convolution(t: Sequence[Sizes | None]) -> int | None:
    x, w, out = t[0], t[1], t[-1]
    if x is None or w is None or out is None or len(w) < 2:
        return None
    return max(prod(x), prod(out)) * prod(w[1:])


def _attention(t: Sequence[Sizes | None]) -> int | None:
    q, k, v = t[0], t[1], t[2]
    if q is None or k is None or v is None or min(len(q), len(k), len(v)) < 2:
        return None
    return prod(q[:-1]) * k[-2] * (q[-1] + v[-1])


_RULES: dict[str, Callable[[Sequence[Sizes | None]], int | None]] = {
    "aten::mm": _mm,
    "aten::bmm": _bmm,
    "aten::addmm": _shifted(_mm, 1),
    "aten::baddbmm": _shifted(_bmm, 1),
    "aten::convolution": _convolution,
    "aten::_scaled_dot_product_flash_attention_for_cpu": _attention,
    "aten::_scaled_dot_product_flash_attention": _attention,
    "aten::_scaled_dot_product_efficient_attention": _attention,
    "aten::scaled_dot_product_attention": _attention,
}


def _elements(values: Sequence[schema.EValue], indices: Sequence[int]) -> int:
    total = 0
    for i in indices:
        if not 0 <= i < len(values):
            continue
        v = values[i]
        if isinstance(v, schema.Tensor):
            total += prod(v.sizes)
        elif isinstance(v, (schema.TensorList, schema.OptionalTensorList)):
            total += _elements(values, v.items)
        else:
            total += 1
    return total


def _sizes(values: Sequence[schema.EValue], i: int) -> Sizes | None:
    v = values[i] if 0 <= i < len(values) else None
    return tuple(v.sizes) if isinstance(v, schema.Tensor) else None


def instruction_work(method: schema.Method, ins: schema.Instruction) -> int:
    """The estimated element operations of one instruction (see the module docstring)."""
    values = method.values
    match ins:
        case schema.KernelCall(op_index=op, args=args) if 0 <= op < len(method.operators):
            rule = _RULES.get(method.operators[op].name)
            cost = rule([_sizes(values, i) for i in args]) if rule is not None else None
            return cost if cost is not None else _elements(values, args)
        case schema.DelegateCall(args=args, outputs=outputs):
            return _elements(values, (*args, *outputs))
        case schema.MoveCall(src=src, dst=dst):
            return _elements(values, (src, dst))
    return 1


def method_work(method: schema.Method) -> list[int]:
    """The estimated work of every instruction of ``method``, in schedule order."""
    return [instruction_work(method, ins) for ins in method.instructions]
