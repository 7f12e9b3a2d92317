"""ExecuTorch's memory plan in exportir's terms: the views and the state a .pte file leaves
implicit, made explicit before the program is validated like any other.

ExecuTorch says two things only through memory offsets, which exportir's format says with
values (docs/format/pte.md, "Reading ExecuTorch's files"):

1. **Views.** ExecuTorch elides a static view copy by giving the view the memory of its source
   (a ``_ViewSpec`` shares its base's ``mem_id`` / ``mem_offset`` and lifetime), and plans an
   input into the arena it copies the caller's tensor to; exportir's own .pte writer aliases a
   contiguous view at an offset into its source. So a planned tensor that no instruction
   writes reads bytes another tensor wrote. :func:`resolve` replays the writes in order and
   makes it a ``ViewOf`` the one tensor that last wrote all of its bytes before its first read
   (an output's: the end; an input, and state of rule 2, count as written before the first
   instruction: a view of a buffer reads the buffer as it is when read). The validator then
   proves the plan keeps those bytes for it: a view keeps its base live
   (``planning.lifetimes``), so a buffer placed over them while the view is read is an
   overlap, and a tensor no single write covers stays a read of memory nothing wrote.
2. **Uninitialised state.** ExecuTorch plans a mutated buffer without its initial value unless
   the buffer was tagged for initialisation: the buffer is read first and written back at the
   end of the call. A planned tensor read before any instruction writes it and written later
   becomes method state that starts as zeros (what ExecuTorch's runtime gives: it allocates
   planned memory zero-filled) and then holds what the previous call wrote back. As state it is
   live for the whole method, so the validator refuses it unless no other planned tensor shares
   its bytes: its value never depends on anything but the calls of this method.

Anything else that reads memory nothing wrote is left as it is, and refused at load as in any
file (``reads value ... before any instruction wrote it``). Standard library only.
"""

from __future__ import annotations

import bisect
import mmap
from collections.abc import Sequence
from dataclasses import dataclass, replace

from exportir.format import schema
from exportir.format.validate import ProgramLoadError

__all__ = ["Access", "resolve"]


@dataclass(frozen=True, slots=True)
class Access:
    """The tensor values one instruction reads and writes (list arguments: their items)."""

    reads: frozenset[int]
    writes: frozenset[int]


def _tensors(values: Sequence[schema.EValue], indices: Sequence[int]) -> set[int]:
    found: set[int] = set()
    n = len(values)
    for i in indices:
        v = values[i]
        if isinstance(v, (schema.TensorList, schema.OptionalTensorList)):
            # items are not validated yet: one out of range is refused by the validator
            found.update(j for j in v.items
                         if 0 <= j < n and isinstance(values[j], schema.Tensor))
        elif isinstance(v, schema.Tensor):
            found.add(i)
    return found


def access(values: Sequence[schema.EValue], mentioned: Sequence[int],
           written: Sequence[int]) -> Access:
    """An instruction mentioning ``mentioned`` and writing ``written`` (value indices)."""
    writes = _tensors(values, written)
    return Access(frozenset(_tensors(values, mentioned) - writes), frozenset(writes))


def _planned(v: schema.EValue) -> bool:
    return isinstance(v, schema.Tensor) and isinstance(v.storage, schema.Allocation) and (
        not v.dynamic and v.initial is None
    )


def _contiguous(t: schema.Tensor) -> bool:
    return t.dim_order == tuple(range(len(t.sizes)))


def _overlap(a: schema.Allocation, b: schema.Allocation) -> bool:
    return a.arena == b.arena and a.offset < b.offset + b.nbytes and (
        b.offset < a.offset + a.nbytes
    )


class _Memory:
    """Where each planned tensor is written and first read, over the kept instructions."""

    def __init__(self, values: list[schema.EValue], accesses: Sequence[Access],
                 outputs: Sequence[int]) -> None:
        self.values = values
        self.writes: dict[int, list[int]] = {}
        self.first_read: dict[int, int] = {}
        self.last_use: dict[int, int] = {}
        self.end = len(accesses)
        for pc, a in enumerate(accesses):
            for i in a.writes:
                self.writes.setdefault(i, []).append(pc)
                self.last_use[i] = pc
            for i in a.reads:
                self.first_read.setdefault(i, pc)
                self.last_use[i] = pc
        for i in _tensors(values, [o for o in outputs if 0 <= o < len(values)]):
            self.first_read.setdefault(i, self.end)  # the caller reads outputs after the end
            self.last_use[i] = self.end


def resolve(values: list[schema.EValue], accesses: Sequence[Access],
            inputs: dict[int, schema.Allocation], outputs: Sequence[int], field: str,
            zeros: ZeroBuffers) -> None:
    """Apply both rules of the module docstring to ``values`` in place. ``accesses`` has one
    entry per instruction; ``inputs`` maps each planned input to the memory ExecuTorch planned
    for it; ``outputs`` are read after the last instruction; ``field`` names the method in
    errors."""
    mem = _Memory(values, accesses, outputs)
    state = _state(values, mem, zeros)
    _views(values, mem, inputs, state, field)


class _Painted:
    """Which value last wrote each byte of one arena: breakpoints ``starts`` (sorted) and the
    writer of ``[starts[i], starts[i + 1])`` (None: nothing yet)."""

    __slots__ = ("owner", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = [0]
        self.owner: list[int | None] = [None]

    def _split(self, at: int) -> None:
        i = bisect.bisect_right(self.starts, at) - 1
        if self.starts[i] != at:
            self.starts.insert(i + 1, at)
            self.owner.insert(i + 1, self.owner[i])

    def paint(self, lo: int, hi: int, value: int) -> None:
        if lo >= hi:
            return
        self._split(hi)
        self._split(lo)
        i, j = bisect.bisect_left(self.starts, lo), bisect.bisect_left(self.starts, hi)
        self.starts[i:j] = [lo]
        self.owner[i:j] = [value]

    def writer(self, lo: int, hi: int) -> int | None:
        """The one value that last wrote all of ``[lo, hi)`` (None: nothing, or several)."""
        i = bisect.bisect_right(self.starts, lo) - 1
        if hi <= lo or (i + 1 < len(self.starts) and self.starts[i + 1] < hi):
            return None
        return self.owner[i]


def _views(values: list[schema.EValue], mem: _Memory, inputs: dict[int, schema.Allocation],
           state: set[int], field: str) -> None:
    """Rule 1, replaying the writes in order: a view first read at ``pc`` (an output: at the
    end) takes the value that last wrote all its bytes before ``pc``."""
    memory = {k: a for k, a in inputs.items()}
    events: list[tuple[int, int, int]] = []  # (pc, 0: a query / 1: a write, value)
    for k, v in enumerate(values):
        if not (isinstance(v, schema.Tensor) and isinstance(v.storage, schema.Allocation)):
            continue
        if k in state or (_planned(v) and k in mem.writes):
            memory[k] = v.storage
            events += [(pc, 1, k) for pc in mem.writes[k]]
        elif _planned(v):  # read (by an instruction, or as an output), or never
            events.append((mem.first_read.get(k, mem.end), 0, k))
    # inputs and state hold their value before the first instruction
    events += [(-1, 1, k) for k in sorted({*inputs, *state})]
    arenas: dict[int, _Painted] = {}
    overwritten: dict[int, tuple[int, int] | None] = {}  # input -> its first overwrite
    for _, kind, k in sorted(events):
        if kind:
            a = memory[k]
            arenas.setdefault(a.arena, _Painted()).paint(a.offset, a.offset + a.nbytes, k)
            continue
        v = values[k]
        painted = arenas.get(v.storage.arena)
        base = painted.writer(v.storage.offset, v.storage.offset + v.nbytes) if painted else None
        if base is None or not _can_view(values[base], memory[base], v):
            continue  # read before anything wrote it: refused when the method is typed
        if base in inputs:
            if base not in overwritten:
                overwritten[base] = _first_write_over(values, mem, inputs[base])
            _check_input_view(mem, k, overwritten[base], field)
        order = tuple(range(len(v.sizes)))
        offset = (v.storage.offset - memory[base].offset) // schema.ELEMENT_SIZE[v.dtype]
        values[k] = schema.Tensor(v.dtype, v.sizes, order, schema.ViewOf(
            base, offset, schema.dense_strides(v.sizes, order)))


def _can_view(base: schema.Tensor, memory: schema.Allocation, view: schema.Tensor) -> bool:
    """Whether ``view`` can read ``base``'s elements: one dtype, a contiguous base, whole
    elements in."""
    return base.dtype == view.dtype and _contiguous(base) and (
        view.storage.offset - memory.offset) % schema.ELEMENT_SIZE[view.dtype] == 0


def _first_write_over(values: list[schema.EValue], mem: _Memory, alloc: schema.Allocation
                      ) -> tuple[int, int] | None:
    """(instruction, value): the first write of a planned tensor sharing a byte with
    ``alloc``."""
    return min(((min(mem.writes[k]), k) for k, v in enumerate(values) if k in mem.writes
                and isinstance(v, schema.Tensor) and isinstance(v.storage, schema.Allocation)
                and _overlap(v.storage, alloc)), default=None)


def _check_input_view(mem: _Memory, view: int, overwritten: tuple[int, int] | None,
                      field: str) -> None:
    """A view of an input reads the caller's tensor, while ExecuTorch reads the arena the input
    was copied to: the two agree only while no instruction writes those bytes."""
    last = mem.last_use.get(view, mem.end)
    if overwritten is not None and overwritten[0] <= last:
        raise ProgramLoadError(
            f"value {view} reads the memory planned for an input, which value {overwritten[1]} "
            f"overwrites at instruction {overwritten[0]} before value {view}'s last use "
            f"(instruction {last}): the plan gives the view no stable bytes",
            f"{field}.values[{view}].val.allocation_info")


def _state(values: list[schema.EValue], mem: _Memory, zeros: ZeroBuffers) -> set[int]:
    """The tensors made state (rule 2)."""
    state = set()
    for k, v in enumerate(values):
        if not _planned(v) or k not in mem.writes or k not in mem.first_read:
            continue
        if mem.first_read[k] < min(mem.writes[k]):
            values[k] = replace(v, initial=zeros.buffer(v.nbytes))
            state.add(k)
    return state


class ZeroBuffers:
    """Constant buffers of zeros, one per size, over one read-only anonymous mapping (zero
    pages: reading them commits no memory) as large as the largest."""

    def __init__(self, constants: list[schema.ConstantBuffer]) -> None:
        self.constants = constants
        self.sizes: dict[int, int] = {}

    def buffer(self, nbytes: int) -> int:
        """The index (into ``constants``) of a buffer of ``nbytes`` zeros; the bytes are made by
        :meth:`finish`."""
        if nbytes not in self.sizes:
            self.constants.append(schema.ConstantBuffer(b""))
            self.sizes[nbytes] = len(self.constants) - 1
        return self.sizes[nbytes]

    def finish(self) -> None:
        if not self.sizes:
            return
        largest = max(self.sizes)
        data = memoryview(_zeros(largest))
        for nbytes, index in self.sizes.items():
            self.constants[index] = schema.ConstantBuffer(data[:nbytes])


def _zeros(nbytes: int) -> mmap.mmap | bytes:
    prot = getattr(mmap, "PROT_READ", None)
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    if nbytes == 0 or prot is None or not flags:
        return bytes(nbytes)
    try:
        return mmap.mmap(-1, nbytes, flags=flags, prot=prot)
    except (OSError, ValueError):
        return bytes(nbytes)
