"""Memo of meta-kernel results on symbolic sizes (the analogue of torch's fake dispatch cache).

A model repeats the same op on the same symbolic shapes many times (48 identical transformer
layers run the same ``addmm`` / ``view`` / ``_softmax`` on ``[s0, s1, 16]`` tensors). The meta
kernels' Python code then redoes the same symbolic arithmetic and guards each time. An op's
output metadata is a function of its inputs' metadata (sizes, strides, offset, dtype...) and
its non-tensor arguments, so the first result is kept and later calls rebuild fresh meta
tensors with the same sizes and strides. Guards the first call recorded stay in the ShapeEnv;
a replay would only re-decide them the same way.

Only ATen/prims ops that write nothing and return tensors are memoized; ops that create
unbacked symbols (``nonzero``, ``item``), custom ops and in-place/out= ops always run.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

from exportir.symbolic.data_dependent import SYM_TYPES as _SYM_TYPES

_META = torch.device("meta")


class _Uncacheable(Exception):
    pass


@cache
def memoizable(func: Any) -> bool:
    """An ATen / prims op without mutated arguments whose outputs are all tensors."""
    schema = getattr(func, "_schema", None)
    if schema is None or getattr(func, "namespace", None) not in ("aten", "prims"):
        return False
    if schema.is_mutable or not schema.returns:
        return False
    for a in schema.arguments:
        if a.alias_info is not None and a.alias_info.is_write:
            return False
    return all(isinstance(r.type, torch.TensorType) for r in schema.returns)


class _KeyBuilder:
    """Builds a memo key; notes whether any size or scalar in it is symbolic."""

    __slots__ = ("symbolic",)

    def __init__(self) -> None:
        self.symbolic = False

    def expr(self, x: Any) -> Any:
        if isinstance(x, _SYM_TYPES):
            e = x.node.expr
            if e.is_Integer:
                return int(e)
            self.symbolic = True
            return e
        return x

    def key(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if not x._has_symbolic_sizes_strides:  # (equal to the tuples below, and as fast)
                return ("T", x.shape, x.stride(), x.storage_offset(), x.dtype, x.layout)
            expr = self.expr
            return (
                "T",
                tuple(expr(s) for s in x.shape),
                tuple(expr(s) for s in x.stride()),
                expr(x.storage_offset()),
                x.dtype,
                x.layout,
            )
        if isinstance(x, _SYM_TYPES):
            self.symbolic = True
            return ("S", x.node.pytype, x.node.expr)
        if isinstance(x, (list, tuple)):
            return (type(x).__name__, tuple(self.key(a) for a in x))
        if isinstance(x, dict):
            return ("D", tuple((k, self.key(v)) for k, v in x.items()))
        try:
            hash(x)
        except TypeError:
            raise _Uncacheable from None
        return (type(x), x)  # 1, 1.0 and True hash alike: the type tells them apart


def memo_key(func: Any, args: Any, kwargs: Any) -> tuple[tuple | None, bool]:
    """The memo key of ``func(*args, **kwargs)`` on meta tensors (None when not cacheable),
    and whether it holds only concrete sizes (then it means the same in every ShapeEnv)."""
    builder = _KeyBuilder()
    try:
        key = (func, builder.key(args), builder.key(kwargs), torch.get_default_dtype())
    except _Uncacheable:
        return None, False
    return key, not builder.symbolic


class StaticMemo:
    """The memo of ops on concrete sizes, shared by every capture in the process (as torch's
    fake-tensor dispatch cache is): a result on concrete sizes does not depend on a ShapeEnv.
    Bounded: when full it starts over."""

    def __init__(self, capacity: int = 16384) -> None:
        self.capacity = capacity
        self.entries: dict[tuple, Any] = {}

    def get(self, key: tuple) -> Any:
        return self.entries.get(key)

    def __setitem__(self, key: tuple, template: Any) -> None:  # (as the per-ShapeEnv dict)
        if len(self.entries) >= self.capacity:
            self.entries.clear()
        self.entries[key] = template


STATIC_MEMO = StaticMemo()


def template_of(out: Any, env: Any) -> Any:
    """What to keep of a meta result to rebuild it, or None (not tensors / new unbacked symbols;
    ``env`` None: any symbolic size)."""
    if isinstance(out, torch.Tensor):
        offset = out.storage_offset()
        if out.layout != torch.strided or not (isinstance(offset, int) and offset == 0):
            return None  # (views at an offset: rebuilt storage would be too small)
        if any(_has_unbacked(s, env) for s in (*out.shape, *out.stride())):
            return None
        return ("T", tuple(out.shape), tuple(out.stride()), out.dtype)
    if isinstance(out, (tuple, list)):
        parts = [template_of(o, env) for o in out]
        if any(p is None for p in parts):
            return None
        return ("L", type(out), parts)
    return None


def _has_unbacked(s: Any, env: Any) -> bool:
    if not isinstance(s, torch.SymInt):
        return False
    return env is None or bool(env.unbacked_symbols(s.node.expr))


def rebuild(template: Any) -> Any:
    """Fresh meta tensors with a template's sizes and strides (call with no modes)."""
    if template[0] == "L":
        return template[1](rebuild(t) for t in template[2])
    _, size, stride, dtype = template
    return torch.empty_strided(size, stride, dtype=dtype, device=_META)
