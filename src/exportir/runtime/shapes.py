"""Result shapes of the kernels whose output size is set by an argument, computed at load.

An operator such as ``full.out(size, fill, out)`` or ``repeat.out(self, repeats, out)``
allocates (or writes) as many elements as its arguments ask, whatever the tensors it reads hold.
When those arguments are literal in the file and the tensors they depend on static, the load-time
typing (:mod:`exportir.runtime.typecheck`) computes the shape with the rules here and requires the
planned out to have exactly it; a runtime-owned out may not exceed the load limits. A kernel then
never allocates more than the plan says, and a mismatch is a load error instead of a surprise
(or an allocation of terabytes) on the first call.

A rule takes the instruction's operands (static tensors as :class:`Sizes`, literal scalars and int
lists as Python values, anything known only at run time as :data:`UNKNOWN`) and returns the
shape, ``None`` when it cannot tell, or raises :class:`ShapeError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Sizes:
    """A static tensor operand: its sizes."""

    sizes: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)


UNKNOWN = object()
"""An operand known only at run time."""


class ShapeError(ValueError):
    """Arguments no kernel could honour (a negative size, a view of a different size)."""


Shape = tuple[int, ...] | None
Rule = Callable[[Sequence[Any]], Shape]


def _ints(x: Any, what: str) -> list[int] | None:
    if x is UNKNOWN:
        return None
    if not isinstance(x, list) or not all(type(v) is int for v in x):
        return None
    return x


def _size(x: Any) -> Shape:
    size = _ints(x, "size")
    if size is None:
        return None
    if any(s < 0 for s in size):
        raise ShapeError(f"size {size} has a negative dimension")
    return tuple(size)


def _randperm(args: Sequence[Any]) -> Shape:
    n = args[0]
    if type(n) is not int:
        return None
    if n < 0:
        raise ShapeError(f"randperm of {n} elements")
    return (n,)


def _arange(args: Sequence[Any]) -> Shape:
    start, end, step = args[:3]
    if not all(type(v) in (int, float) for v in (start, end, step)):
        return None
    if step == 0 or (end - start) / step < 0 or not math.isfinite((end - start) / step):
        raise ShapeError(f"arange({start}, {end}, {step}) has no length")
    return (math.ceil((end - start) / step),)


def _infer(size: list[int], numel: int) -> tuple[int, ...]:
    """``size`` with one ``-1`` inferred so that it holds ``numel`` elements (view rules)."""
    holes = [i for i, s in enumerate(size) if s == -1]
    if len(holes) > 1 or any(s < -1 for s in size):
        raise ShapeError(f"size {size} is not a view size")
    known = math.prod(s for s in size if s != -1)
    if holes:
        if known == 0 or numel % known:
            raise ShapeError(f"size {size} cannot hold {numel} elements")
        size = [numel // known if s == -1 else s for s in size]
    if math.prod(size) != numel:
        raise ShapeError(f"a view of {numel} elements cannot have size {size}")
    return tuple(size)


def _view(args: Sequence[Any]) -> Shape:
    source, size = args[0], _ints(args[1], "size")
    if not isinstance(source, Sizes) or size is None:
        return None
    return _infer(size, source.numel)


def _expand(args: Sequence[Any]) -> Shape:
    source, size = args[0], _ints(args[1], "size")
    if not isinstance(source, Sizes) or size is None:
        return None
    have = source.sizes
    if len(size) < len(have):
        raise ShapeError(f"cannot expand {list(have)} to fewer dimensions {size}")
    lead = len(size) - len(have)
    out = []
    for d, s in enumerate(size):
        own = have[d - lead] if d >= lead else None
        if s == -1:
            if own is None:
                raise ShapeError(f"size {size}: -1 for a new dimension")
            s = own
        if s < 0 or (own is not None and own not in (1, s)):
            raise ShapeError(f"cannot expand {list(have)} to {size}")
        out.append(s)
    return tuple(out)


def _repeat(args: Sequence[Any]) -> Shape:
    source, repeats = args[0], _ints(args[1], "repeats")
    if not isinstance(source, Sizes) or repeats is None:
        return None
    if len(repeats) < len(source.sizes) or any(r < 0 for r in repeats):
        raise ShapeError(f"repeats {repeats} for a tensor of sizes {list(source.sizes)}")
    have = (1,) * (len(repeats) - len(source.sizes)) + source.sizes
    return tuple(r * s for r, s in zip(repeats, have))


def _pad(args: Sequence[Any]) -> Shape:
    source, pad = args[0], _ints(args[1], "pad")
    if not isinstance(source, Sizes) or pad is None:
        return None
    if len(pad) % 2 or len(pad) // 2 > len(source.sizes):
        raise ShapeError(f"pad {pad} for a tensor of sizes {list(source.sizes)}")
    out = list(source.sizes)
    for k in range(len(pad) // 2):
        d = len(out) - 1 - k
        out[d] += pad[2 * k] + pad[2 * k + 1]
        if out[d] < 0:
            raise ShapeError(f"pad {pad} leaves dimension {d} negative")
    return tuple(out)


def _spatial(values: Any, n: int) -> list[int] | None:
    """An int-list convolution argument for ``n`` spatial dims (one value stands for all)."""
    got = _ints(values, "")
    if got is None or len(got) not in (1, n):
        return None
    return got * n if len(got) == 1 else got


def _convolution(args: Sequence[Any]) -> Shape:
    """``convolution.out``'s result: (N, channels, *spatial) from the input, the weight and
    stride / padding / dilation / output_padding (ATen's formula, transposed or not)."""
    source, weight = args[0], args[1]
    transposed, groups = args[6], args[8]
    if not (isinstance(source, Sizes) and isinstance(weight, Sizes)) or (
        type(transposed) is not bool or type(groups) is not int
    ):
        return None
    n = len(source.sizes) - 2
    if n < 1 or len(weight.sizes) != n + 2:
        return None
    stride, padding, dilation, extra = (_spatial(args[k], n) for k in (3, 4, 5, 7))
    if None in (stride, padding, dilation, extra) or min(stride) < 1 or min(dilation) < 1:
        return None
    kernel = weight.sizes[2:]
    if transposed:
        channels = weight.sizes[1] * groups
        spatial = [(i - 1) * s - 2 * p + d * (k - 1) + e + 1 for i, s, p, d, k, e in
                   zip(source.sizes[2:], stride, padding, dilation, kernel, extra)]
    else:
        channels = weight.sizes[0]
        spatial = [(i + 2 * p - d * (k - 1) - 1) // s + 1 for i, s, p, d, k in
                   zip(source.sizes[2:], stride, padding, dilation, kernel)]
    if min(spatial) < 0:
        raise ShapeError(f"a convolution of {list(source.sizes)} with weight "
                         f"{list(weight.sizes)} has output size {spatial}")
    return (source.sizes[0], channels, *spatial)


RULES: Mapping[str, tuple[Rule, int]] = {
    # operator -> (rule, position of the out it sizes)
    "aten::full.out": (lambda a: _size(a[0]), 2),
    "aten::empty.out": (lambda a: _size(a[0]), 2),
    "aten::rand.out": (lambda a: _size(a[0]), 1),
    "aten::randn.out": (lambda a: _size(a[0]), 1),
    "aten::empty_strided.out": (lambda a: _size(a[0]), 2),
    "aten::as_strided_copy.out": (lambda a: _size(a[1]), 4),
    "aten::randperm.out": (_randperm, 1),
    "aten::arange.start_out": (_arange, 3),
    "aten::scalar_tensor.out": (lambda a: (), 1),
    "aten::view_copy.out": (_view, 2),
    "aten::expand_copy.out": (_expand, 3),
    "aten::repeat.out": (_repeat, 2),
    "aten::constant_pad_nd.out": (_pad, 3),
    "aten::convolution.out": (_convolution, 9),
}
