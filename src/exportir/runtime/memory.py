"""Tensors over the memory a program describes: planned arenas, constants, runtime allocations.

* Arenas are allocated once per method as anonymous private memory maps (zero pages, committed
  only as the method writes them; their start aligned to 64 bytes). Each planned tensor is ``torch.frombuffer(arena, dtype, count, offset)`` shaped by
  its sizes and the strides its ``dim_order`` implies: a tensor over exactly the bytes of its
  ``Allocation``, with its own **non-resizable** storage. A kernel that tries to write more than
  the plan gave a value (a dynamic size beyond its upper bound) fails instead of spilling into
  its neighbours.
* Constants are ``torch.frombuffer`` views of the program's constant buffers; when the program
  was loaded from a file those buffers view the memory-mapped file, so weights are never copied.
  Such views are read-only memory: the runtime never lets an instruction write into them.
* Views (``ViewOf`` storage) are ``as_strided`` aliases of their base's memory, built once when
  the method is prepared (per call for views of inputs); no instruction writes them.
"""

from __future__ import annotations

import dataclasses
import mmap
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from exportir.format import schema

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


strides_for = schema.dense_strides  # dense strides of sizes in a dim order


def is_contiguous_order(dim_order: Sequence[int]) -> bool:
    return all(d == i for i, d in enumerate(dim_order))


ARENA_ALIGNMENT = 64
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform == "linux" else 0)


def reserve(nbytes: int) -> mmap.mmap | bytearray:
    """``nbytes`` of zeroed, writable memory that costs nothing until written: an anonymous
    private mapping (page-aligned; the kernel commits a page when it is first touched), or a
    ``bytearray`` where mappings are not available."""
    if nbytes == 0:
        return bytearray(ARENA_ALIGNMENT)
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    if not flags:
        return bytearray(nbytes + ARENA_ALIGNMENT)
    try:
        return mmap.mmap(-1, nbytes, flags=flags | _MAP_NORESERVE)
    except (OSError, ValueError):
        return mmap.mmap(-1, nbytes, flags=flags)


@dataclass(frozen=True, slots=True)
class Arena:
    """Planned memory: ``buffer[base:base + size]`` (``base`` aligns the start to 64 bytes)."""

    buffer: bytearray | mmap.mmap
    base: int
    size: int

    def as_tensor(self) -> torch.Tensor:
        """The arena's bytes as a uint8 tensor (a view, for inspection)."""
        if self.size == 0:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(self.buffer, dtype=torch.uint8, count=self.size, offset=self.base)


def _address(buffer: bytearray | mmap.mmap) -> int:
    return torch.frombuffer(buffer, dtype=torch.uint8, count=1).data_ptr()


def allocate_arenas(sizes: Sequence[int]) -> list[Arena]:
    """One zero-filled, 64-byte-aligned arena per planned size, committed as it is written."""
    arenas = []
    for n in sizes:
        buffer = reserve(n)
        base = -_address(buffer) % ARENA_ALIGNMENT
        arenas.append(Arena(buffer, base, n))
    return arenas


def _shape(flat: torch.Tensor, t: schema.Tensor) -> torch.Tensor:
    if is_contiguous_order(t.dim_order):
        return flat.view(t.sizes)
    return flat.as_strided(t.sizes, strides_for(t.sizes, t.dim_order))


def arena_view(arenas: Sequence[Arena], t: schema.Tensor) -> torch.Tensor:
    """The tensor ``t`` (with ``Allocation`` storage) over exactly its bytes of its arena."""
    alloc = t.storage
    if not isinstance(alloc, schema.Allocation):
        raise TypeError(f"tensor storage {alloc!r} is not planned")
    dtype = torch_dtype(t.dtype)
    count = alloc.nbytes // schema.ELEMENT_SIZE[t.dtype]
    if count == 0:
        return torch.empty(t.sizes, dtype=dtype)
    arena = arenas[alloc.arena]
    flat = torch.frombuffer(arena.buffer, dtype=dtype, count=count, offset=arena.base + alloc.offset)
    return _shape(flat, t)


def state_tensor(t: schema.Tensor) -> torch.Tensor:
    """A tensor of ``t``'s sizes and layout in memory of its own (a program's shared state)."""
    own = dataclasses.replace(t, storage=schema.Allocation(0, 0, t.nbytes))
    return arena_view(allocate_arenas((t.nbytes,)), own)


def layout_of(t: schema.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The (sizes, strides) a planned tensor has when the method is prepared."""
    return tuple(t.sizes), strides_for(t.sizes, t.dim_order)


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


def view_tensor(base: torch.Tensor, t: schema.Tensor) -> torch.Tensor:
    """The tensor ``t`` (with ``ViewOf`` storage) over the memory of ``base``: its storage
    offset and strides count elements of the base's memory (validated to stay inside it)."""
    view = t.storage
    if not isinstance(view, schema.ViewOf):
        raise TypeError(f"tensor storage {view!r} is not a view")
    return base.as_strided(t.sizes, view.strides, base.storage_offset() + view.offset)


def runtime_tensor(t: schema.Tensor) -> torch.Tensor:
    """An empty tensor the runtime owns (``DynamicStorage``); kernels resize it as they write."""
    return torch.empty(0, dtype=torch_dtype(t.dtype))


MIN_REGION_BYTES = 1 << 20


def _reserve_at_most(nbytes: int) -> tuple[mmap.mmap | bytearray, int]:
    """A reservation of ``nbytes``, or of the largest half, quarter, ... of it (at least
    :data:`MIN_REGION_BYTES`) the process may map (an address-space limit, ``ulimit -v``);
    raises ``MemoryError`` below that."""
    size = nbytes
    while True:
        try:
            return reserve(size), size
        except (OSError, MemoryError, OverflowError) as e:
            if size <= MIN_REGION_BYTES:
                raise MemoryError(f"cannot reserve {size} bytes of address space: {e}") from e
            size = max(size // 2, MIN_REGION_BYTES)


class Region:
    """The memory of one runtime-allocated tensor (``DynamicStorage``): ``capacity`` bytes
    reserved once (less when the process may not map that much: ``capacity`` is what it got)
    and committed as they are written, behind a storage that cannot grow. A
    kernel asked to make the tensor larger fails ("not resizable") before allocating anything,
    so no call can allocate more than the cap for it, whatever sizes the file asks for."""

    __slots__ = ("_buffer", "_storage", "capacity", "tensor")

    def __init__(self, t: schema.Tensor, capacity: int) -> None:
        self._buffer, self.capacity = _reserve_at_most(capacity)
        flat = torch.frombuffer(self._buffer, dtype=torch.uint8, count=max(self.capacity, 1))
        self._storage = flat.untyped_storage()
        self.tensor = torch.empty(0, dtype=torch_dtype(t.dtype))
        self.attach()

    def attach(self) -> None:
        """The tensor back on the region, empty (after a free, a failure, or a kernel that
        swapped the tensor's storage)."""
        self.tensor.set_(self._storage, 0, (0,), (1,))

    def release(self) -> None:
        """``FreeCall``: the tensor emptied and the pages it used given back to the system."""
        self.attach()
        if isinstance(self._buffer, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
            self._buffer.madvise(mmap.MADV_DONTNEED)

    def attached(self) -> bool:
        return self.tensor.untyped_storage().data_ptr() == self._storage.data_ptr()


def describe(dtype: torch.dtype | schema.ScalarType, sizes: Sequence[int]) -> str:
    """``float32[2, 3]``, the way errors print tensors."""
    if isinstance(dtype, schema.ScalarType):
        name = schema.TORCH_DTYPE_NAME.get(dtype, dtype.name.lower())
    else:
        name = str(dtype).removeprefix("torch.")
    return f"{name}[{', '.join(str(s) for s in sizes)}]"
