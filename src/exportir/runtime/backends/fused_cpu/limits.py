"""Allocation caps of the fused CPU executor: ops whose result size comes from an argument.

Most ops of a blob make results no larger than their inputs. The ops below make results whose
size an argument decides (``full([2**33])``, ``arange(0, 2**40)``, ``repeat``, padding,
upsampling, and the views ``expand`` / ``unfold``, whose logical size the next op
materialises): each is called through a guard that computes the result's bytes from its
arguments and refuses more than the cap (the program's ``LoadLimits.max_dynamic_bytes``)
before torch allocates anything. Arguments known when the blob is loaded are checked then, once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from exportir.runtime.backends.fused_cpu.kernels import Call, Ref

__all__ = ["DEFAULT_MAX_BYTES", "FusedAllocationError", "guard"]

DEFAULT_MAX_BYTES = 1 << 32
"""The cap when the runtime gives none (``LoadLimits().max_dynamic_bytes``)."""


class FusedAllocationError(ValueError):
    """An op of a fused blob would allocate more than the cap; ``limit`` is the LoadLimits
    field that sets it."""

    limit = "max_dynamic_bytes"


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(x.shape) if isinstance(x, torch.Tensor) else ()


def _itemsize(x: Any, default: int = 8) -> int:
    if isinstance(x, torch.Tensor):
        return x.element_size()
    if isinstance(x, torch.dtype):
        return torch.empty((), dtype=x).element_size()
    return default


def _ints(x: Any) -> list[int]:
    return [int(v) for v in x] if isinstance(x, (list, tuple)) else [int(x)]


def _full(args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    return math.prod(_ints(args[0])) * _itemsize(kwargs.get("dtype"))


def _arange(args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    start, end = args[0], args[1]
    step = args[2] if len(args) > 2 else 1
    if step == 0:
        return 0  # torch refuses it
    return max(0, math.ceil((end - start) / step)) * _itemsize(kwargs.get("dtype"))


def _repeat(args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    x, repeats = args[0], _ints(args[1])
    shape = [1] * (len(repeats) - len(_shape(x))) + list(_shape(x))
    return math.prod(s * r for s, r in zip(shape, repeats)) * _itemsize(x)


def _pad(args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    x, pad = args[0], _ints(args[1])
    shape = list(_shape(x))
    for k in range(len(pad) // 2):
        d = len(shape) - 1 - k
        if d >= 0:
            shape[d] += pad[2 * k] + pad[2 * k + 1]
    return math.prod(max(s, 0) for s in shape) * _itemsize(x)


def _expand(args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    x, sizes = args[0], _ints(args[1])
    shape = _shape(x)
    lead = len(sizes) - len(shape)
    dims = [s if s != -1 else shape[i - lead] for i, s in enumerate(sizes)]
    return math.prod(dims) * _itemsize(x)


def _unfold(args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    x, dim, size, step = args[0], int(args[1]), int(args[2]), int(args[3])
    shape = list(_shape(x)) or [1]
    windows = (shape[dim] - size) // step + 1 if step > 0 else 0
    shape[dim] = max(windows, 0)
    return math.prod(shape) * size * _itemsize(x)


def _upsample(args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    x, output_size = args[0], args[1]
    shape = list(_shape(x))
    if output_size is not None:
        spatial = _ints(output_size)
    else:
        scales = args[-1] if len(args) > 2 else None
        spatial = [math.floor(s * f) for s, f in zip(shape[2:], scales or ())]
    return math.prod(shape[:2]) * math.prod(spatial) * _itemsize(x)


_RULES: dict[str, Callable[[Sequence[Any], dict[str, Any]], int]] = {
    "aten.full.default": _full,
    "aten.arange.start_step": _arange,
    "aten.repeat.default": _repeat,
    "aten.constant_pad_nd.default": _pad,
    "aten.expand_copy.default": _expand,
    "aten.unfold_copy.default": _unfold,
    "aten.upsample_nearest2d.vec": _upsample,
    "aten.upsample_bilinear2d.vec": _upsample,
}


def _has_ref(x: Any) -> bool:
    if isinstance(x, (list, tuple)):
        return any(_has_ref(v) for v in x)
    if isinstance(x, dict):
        return any(_has_ref(v) for v in x.values())
    return isinstance(x, Ref)


def _check(name: str, node: str, nbytes: int, cap: int) -> None:
    if nbytes > cap:
        raise FusedAllocationError(
            f"fused_cpu op {name} (graph node {node}) would allocate {nbytes} bytes, more than "
            f"max_dynamic_bytes ({cap}); if you trust this program, load it with "
            "Program.load(..., limits=LoadLimits(max_dynamic_bytes=...))")


def guard(name: str, node: str, call: Call, cap: int) -> Call:
    """``call``, checked: an op whose result size an argument decides refuses more than
    ``cap`` bytes. Literal arguments are checked now (raising :class:`FusedAllocationError`);
    arguments read at run time make the call a guarded one."""
    rule = _RULES.get(name)
    if rule is None or call.form != "call":
        return call
    if not _has_ref(call.args) and not _has_ref(call.kwargs):
        _check(name, node, rule(call.args, call.kwargs), cap)
        return call
    if name == "aten.expand_copy.default" and not _has_ref(call.args[1:]):
        sizes = _ints(call.args[1])
        if -1 not in sizes:  # the view's size is all literal: checked once, called bare
            _check(name, node, math.prod(sizes) * 8, cap)
            return call
    fn = call.fn

    def guarded(*args: Any, **kwargs: Any) -> Any:
        _check(name, node, rule(args, kwargs), cap)
        return fn(*args, **kwargs)

    return call._replace(fn=guarded, splat=False)
