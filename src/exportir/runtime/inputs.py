"""Checking the caller's inputs against a method's signature."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from exportir.program import schema
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

