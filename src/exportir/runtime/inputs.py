"""Checking the caller's inputs against a method's signature."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from exportir.format import schema
from exportir.runtime import memory
from exportir.runtime.errors import MethodInputError


@dataclass(frozen=True, slots=True)
class _TensorInput:
    """What a tensor input must be to be used as given (no conversion, no error)."""

    dtype: torch.dtype
    sizes: tuple[int, ...]
    dynamic: bool
    contiguous: bool

    def accepts(self, given: Any) -> bool:
        return (
            isinstance(given, torch.Tensor)
            and given.dtype == self.dtype
            and not self.dynamic
            and given.shape == self.sizes
            and given.is_cpu
            and not given.requires_grad
            and (not self.contiguous or given.is_contiguous())
        )



def _check_tensor_input(label: str, v: schema.Tensor, given: Any) -> torch.Tensor:
    want = memory.describe(v.dtype, v.sizes)
    if not isinstance(given, torch.Tensor):
        raise MethodInputError(f"{label} must be a tensor {want}; got {type(given).__name__}")
    dtype = memory.torch_dtype(v.dtype)
    shape = tuple(given.shape)
    got = memory.describe(given.dtype, shape)
    bound = " (upper bounds)" if v.dynamic else ""
    if given.dtype != dtype:
        raise MethodInputError(
            f"{label} must have dtype {str(dtype).removeprefix('torch.')}; got {got} "
            f"(expected {want}{bound}); convert it with .to({dtype})"
        )
    if len(shape) != len(v.sizes):
        raise MethodInputError(f"{label} must have rank {len(v.sizes)}: expected {want}{bound}, "
                               f"got {got}")
    if not v.dynamic and shape != tuple(v.sizes):
        raise MethodInputError(
            f"{label} has shape {got}; the method was exported for {want} (static shape); "
            "export with dynamic_shapes to accept other sizes"
        )
    if given.device.type != "cpu":
        raise MethodInputError(f"{label} is on {given.device}; the runtime runs on cpu")
    if given.requires_grad:
        given = given.detach()
    if memory.is_contiguous_order(v.dim_order) and not given.is_contiguous():
        given = given.contiguous()
    return given



@dataclass(frozen=True, slots=True)
class _DimCheck:
    """What one dimension of an input must be: ``static`` exactly, or ``coeff * symbol +
    offset`` with the symbol in its range."""

    dim: int
    static: int
    size: schema.DimSize | None


def _form(size: schema.DimSize, name: str) -> str:
    text = name if size.coeff == 1 else f"{size.coeff}*{name}"
    if size.offset:
        text += f" {'+' if size.offset > 0 else '-'} {abs(size.offset)}"
    return text


def _range(r: schema.SymbolRange) -> str:
    return f"[{r.min}, {'inf' if r.max is None else r.max}]"


class InputSizes:
    """Checks a call's tensor input sizes against the method's symbolic sizes (format 2.1)
    before anything runs: every symbolic dimension within its symbol's range and of its form
    (``2*dx``), dimensions sharing a symbol equal, static dimensions of dynamic inputs exact.
    Errors name the input, the dimension, the symbol (the user's ``Dim`` name) and its range."""

    __slots__ = ("_checks", "_labels", "_method", "_symbols")

    def __init__(self, meta: schema.Method, labels: tuple[str, ...]) -> None:
        self._method = meta.name
        self._symbols = meta.symbols
        self._labels = labels
        checks = []
        for k, (index, dims) in enumerate(zip(meta.inputs, meta.input_dims)):
            v = meta.values[index]
            if not isinstance(v, schema.Tensor) or not v.dynamic or len(dims) != len(v.sizes):
                continue  # static tensors are checked whole; others carry no sizes
            checks.append((k, tuple(_DimCheck(d, v.sizes[d], s) for d, s in enumerate(dims))))
        self._checks = tuple(checks)

    @classmethod
    def of(cls, meta: schema.Method, labels: tuple[str, ...]) -> InputSizes | None:
        """The check for ``meta``, or None when it has no symbolic input sizes."""
        if not meta.symbols or len(meta.input_dims) != len(meta.inputs):
            return None
        return cls(meta, labels)

    def check(self, values: list[Any], inputs: tuple[int, ...]) -> None:
        bound: dict[int, tuple[int, int, int]] = {}  # symbol -> (value, input, dim)
        for k, dims in self._checks:
            shape = values[inputs[k]].shape
            for c in dims:
                given = shape[c.dim]
                if c.size is None:
                    if given != c.static:
                        raise self._error(k, c.dim, given, f"the method was exported with it "
                                          f"static = {c.static}")
                    continue
                value = self._value(k, c, given)
                first = bound.setdefault(c.size.symbol, (value, k, c.dim))
                if first[0] != value:
                    raise self._mismatch(k, c, given, value, first)

    def _value(self, k: int, c: _DimCheck, given: int) -> int:
        size = c.size
        r = self._symbols[size.symbol]
        value, rest = divmod(given - size.offset, size.coeff)
        if rest:
            raise self._error(k, c.dim, given, f"it is {_form(size, r.name)} ({r.name} in "
                              f"{_range(r)}), and {given} is not of that form")
        if value < r.min or (r.max is not None and value > r.max):
            what = (r.name if size.coeff == 1 and not size.offset
                    else f"{_form(size, r.name)}, so {r.name} = {value}")
            raise self._error(
                k, c.dim, given,
                f"it is {what}, which the method accepts in {_range(r)}; call with sizes in "
                "that range, or export with a wider range for it in dynamic_shapes")
        return value

    def _mismatch(
        self, k: int, c: _DimCheck, given: int, value: int, first: tuple[int, int, int]
    ) -> MethodInputError:
        r = self._symbols[c.size.symbol]
        earlier, k0, d0 = first
        return MethodInputError(
            f"method {self._method!r}: input {k} ({self._labels[k]}) has size {given} at dim "
            f"{c.dim}, which makes {r.name} = {value}; input {k0} ({self._labels[k0]}) makes it "
            f"{earlier} at dim {d0}: the method was exported with these sizes tied (the same "
            "Dim); call with consistent sizes")

    def _error(self, k: int, dim: int, given: int, why: str) -> MethodInputError:
        return MethodInputError(
            f"method {self._method!r}: input {k} ({self._labels[k]}) has size {given} at dim "
            f"{dim}; {why}")
