"""Tensors over the memory a program describes: planned arenas, constants, runtime allocations.

* Arenas are allocated once per method as byte tensors (``torch.empty(n, dtype=uint8)``: a plain
  byte buffer, 64-byte aligned by torch's CPU allocator); each planned tensor is a view of its
  ``Allocation`` (``arena[offset:offset + nbytes]`` reinterpreted with the tensor's dtype, sizes
  and the strides its ``dim_order`` implies).
* Constants are ``torch.frombuffer`` views of the program's constant buffers; when the program
  was loaded from a file those buffers view the memory-mapped file, so weights are never copied.
  Such views are read-only memory: the runtime never lets an instruction write into them.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

from exportir.program import schema

TORCH_DTYPES: dict[schema.ScalarType, torch.dtype] = {
    st: getattr(torch, name)
    for st, name in schema.TORCH_DTYPE_NAME.items()
    if isinstance(getattr(torch, name, None), torch.dtype)
}


def torch_dtype(scalar_type: schema.ScalarType) -> torch.dtype:
    found = TORCH_DTYPES.get(scalar_type)
    if found is None:
        raise TypeError(f"scalar type {scalar_type!r} has no torch dtype in this build")
    return found


def strides_for(sizes: Sequence[int], dim_order: Sequence[int]) -> tuple[int, ...]:
    """Dense strides of ``sizes`` laid out in ``dim_order`` (outermost dimension first)."""
    strides = [0] * len(sizes)
    step = 1
    for d in reversed(dim_order):
        strides[d] = step
        step *= max(sizes[d], 1)
    return tuple(strides)


def is_contiguous_order(dim_order: Sequence[int]) -> bool:
    return all(d == i for i, d in enumerate(dim_order))


def allocate_arenas(sizes: Sequence[int]) -> list[torch.Tensor]:
    """One zero-filled byte tensor per planned arena."""
    return [torch.zeros(n, dtype=torch.uint8) for n in sizes]


def _shape(flat: torch.Tensor, t: schema.Tensor) -> torch.Tensor:
    if is_contiguous_order(t.dim_order):
        return flat.view(t.sizes)
    return flat.as_strided(t.sizes, strides_for(t.sizes, t.dim_order))


def arena_view(arenas: Sequence[torch.Tensor], t: schema.Tensor) -> torch.Tensor:
    """The tensor ``t`` (with ``Allocation`` storage) as a view of its arena bytes."""
    alloc = t.storage
    if not isinstance(alloc, schema.Allocation):
        raise TypeError(f"tensor storage {alloc!r} is not planned")
    dtype = torch_dtype(t.dtype)
    window = arenas[alloc.arena][alloc.offset : alloc.offset + alloc.nbytes]
    return _shape(window.view(dtype), t)


def buffer_tensor(data: bytes | memoryview, t: schema.Tensor) -> torch.Tensor:
    """The tensor ``t`` viewing ``data`` without copying (read-only when ``data`` is)."""
    dtype = torch_dtype(t.dtype)
    if t.numel == 0:
        return torch.empty(t.sizes, dtype=dtype)
    with warnings.catch_warnings():
        # frombuffer warns that a read-only buffer yields a tensor torch thinks is writable;
        # the runtime never writes constants (checked when a method is prepared).
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        flat = torch.frombuffer(data, dtype=dtype, count=t.numel)
    return _shape(flat, t)


def runtime_tensor(t: schema.Tensor) -> torch.Tensor:
    """An empty tensor the runtime owns (``DynamicStorage``); kernels resize it as they write."""
    return torch.empty(0, dtype=torch_dtype(t.dtype))


def describe(dtype: torch.dtype | schema.ScalarType, sizes: Sequence[int]) -> str:
    """``float32[2, 3]``, the way errors print tensors."""
    if isinstance(dtype, schema.ScalarType):
        name = schema.TORCH_DTYPE_NAME.get(dtype, dtype.name.lower())
    else:
        name = str(dtype).removeprefix("torch.")
    return f"{name}[{', '.join(str(s) for s in sizes)}]"
