"""Read an ExecuTorch ``.pte`` file (``program.fbs``, ``ET12``) into a :class:`schema.Program`.

For files ExecuTorch's ``to_executorch()`` writes for programs of portable kernels. The file is
hostile until proven otherwise: every offset, length and index is checked against the bytes
before it is followed (flatbuffers' own accessors check nothing), and every refusal is a
:class:`~exportir.format.validate.ProgramLoadError` naming the field
(``execution_plan[0].values[3].val.sizes``). Operator names only select entries of
:data:`~exportir.format.pte_kernels.PTE_KERNELS` (and then the runtime's kernel table, which
types every call at load). The views and the mutated-buffer state ExecuTorch leaves to memory
offsets become ``ViewOf`` values and zero-initialised state (:mod:`pte_memory`); the result then
goes through :func:`validate.validate_program` like any exportir file. Standard library only.
"""

from __future__ import annotations

import struct
from typing import Any

from exportir.format import _pte_fbs as fbs
from exportir.format import pte_memory, schema
from exportir.format.pte_kernels import PTE_KERNELS
from exportir.format.validate import DEFAULT_LIMITS, LoadLimits, ProgramLoadError

__all__ = ["is_pte", "read_pte"]

_NAMESPACES = {"executorch_prim": "exportir_prim"}

# ExecuTorch operators that exportir's kernel table names otherwise: ET name -> (exportir
# operator, position of the ``int[]? dim_order`` argument that must be None or contiguous and
# becomes ``memory_format=None``, argument positions exportir's schema lacks)
_RENAMED: dict[str, tuple[schema.Operator, int, tuple[int, ...]]] = {
    "dim_order_ops::_to_dim_order_copy.out": (schema.Operator("aten::_to_copy", "out"), 2, ()),
    "dim_order_ops::_clone_dim_order.out": (schema.Operator("aten::clone", "out"), 2, (1,)),
    "dim_order_ops::_empty_dim_order.out": (schema.Operator("aten::empty", "out"), 1, ()),
}
_COPY = "aten::copy_"
_VIEW = "executorch_prim::et_view.default"

# Operators ExecuTorch's compiler writes that its portable runtime does not register, and that
# exportir's runtime runs (its kernel table types every call at load): the layout of
# PTE_KERNELS, written from the operator's schema
_MORE_KERNELS: dict[str, tuple[int, tuple[int, ...]]] = {
    # sort.values(self, dim, descending, *, values, indices) -> (values, indices)
    "aten::sort.values": (5, (3, 4)),
}
_KERNELS = {**PTE_KERNELS, **_MORE_KERNELS}

# Operators that return nothing and write an argument (its position): the out list of the
# split / unbind copies, the destination of et_copy_index
_WRITES_WITHOUT_RETURN = {
    "aten::split_copy.Tensor_out": 3,
    "aten::split_with_sizes_copy.out": 3,
    "aten::unbind_copy.int_out": 2,
    "executorch_prim::et_copy_index.tensor": 0,
}


def is_pte(data: Any) -> bool:
    """Whether ``data`` starts like a .pte file (flatbuffer with identifier ``ET12``)."""
    return len(data) >= 8 and bytes(data[4:8]) == fbs.FILE_IDENTIFIER


class _Buf:
    """Bounds-checked little-endian reads of the file's bytes."""

    __slots__ = ("data", "n")

    def __init__(self, data: Any) -> None:
        self.data = data
        self.n = len(data)

    def check(self, pos: int, size: int, field: str) -> None:
        if pos < 0 or size < 0 or pos + size > self.n:
            raise ProgramLoadError(f"points outside the file ({pos}+{size} > {self.n} bytes)",
                                   field, offset=pos)

    def read(self, fmt: str, pos: int, field: str) -> Any:
        size = struct.calcsize(fmt)
        self.check(pos, size, field)
        return struct.unpack_from(fmt, self.data, pos)[0]


class _Table:
    """A flatbuffer table at ``pos``; ``path`` names it in errors."""

    __slots__ = ("buf", "path", "pos", "vlen", "vtable")

    def __init__(self, buf: _Buf, pos: int, path: str) -> None:
        self.buf, self.pos, self.path = buf, pos, path
        self.vtable = pos - buf.read("<i", pos, path)
        self.vlen = buf.read("<H", self.vtable, f"{path} (vtable)")
        if self.vlen < 4 or self.vlen % 2:
            raise ProgramLoadError(f"vtable length {self.vlen} is malformed", path,
                                   offset=self.vtable)
        buf.check(self.vtable, self.vlen, f"{path} (vtable)")

    def _field(self, slot: int) -> int | None:
        entry = 4 + 2 * slot
        if entry >= self.vlen:
            return None
        off = self.buf.read("<H", self.vtable + entry, self.path)
        return self.pos + off if off else None

    def scalar(self, slot: int, fmt: str, name: str, default: Any = 0) -> Any:
        pos = self._field(slot)
        return default if pos is None else self.buf.read(fmt, pos, f"{self.path}.{name}")

    def _target(self, slot: int, name: str) -> int | None:
        pos = self._field(slot)
        if pos is None:
            return None
        return pos + self.buf.read("<I", pos, f"{self.path}.{name}")

    def table(self, slot: int, name: str, required: bool = False) -> _Table | None:
        pos = self._target(slot, name)
        if pos is None:
            if required:
                raise ProgramLoadError("is missing", f"{self.path}.{name}")
            return None
        return _Table(self.buf, pos, f"{self.path}.{name}")

    def _vector(self, slot: int, name: str, size: int) -> tuple[int, int]:
        pos = self._target(slot, name)
        if pos is None:
            return 0, 0
        n = self.buf.read("<I", pos, f"{self.path}.{name}")
        self.buf.check(pos + 4, n * size, f"{self.path}.{name}")
        return pos + 4, n

    def scalars(self, slot: int, name: str, fmt: str) -> tuple[Any, ...]:
        size = struct.calcsize(fmt)
        start, n = self._vector(slot, name, size)
        if not n:
            return ()
        return struct.unpack_from(f"<{n}{fmt}", self.buf.data, start)

    def tables(self, slot: int, name: str) -> list[_Table]:
        start, n = self._vector(slot, name, 4)
        found = []
        for k in range(n):
            pos = start + 4 * k
            found.append(_Table(self.buf, pos + self.buf.read("<I", pos, self.path),
                                f"{self.path}.{name}[{k}]"))
        return found

    def string(self, slot: int, name: str) -> str:
        start, n = self._vector(slot, name, 1)
        try:
            return bytes(self.buf.data[start:start + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise ProgramLoadError("is not UTF-8", f"{self.path}.{name}", offset=start) from None


def _fail(reason: str, field: str) -> ProgramLoadError:
    return ProgramLoadError(reason, field)


def _index(i: int, n: int, field: str, what: str) -> int:
    if not 0 <= i < n:
        raise _fail(f"{what} index {i} is out of range (0..{n - 1})", field)
    return i


class _Segments:
    """The data segments after the flatbuffer (extended header: their base offset)."""

    def __init__(self, buf: _Buf, root: _Table) -> None:
        self.buf = buf
        self.base = 0
        if buf.n >= 8 + fbs.HEADER_MIN_LENGTH and bytes(buf.data[8:12]) == fbs.HEADER_MAGIC:
            self.base = buf.read("<Q", 24, "header.segment_base_offset")
        self.spans = []
        for k, seg in enumerate(root.tables(fbs.Program.segments, "segments")):
            off = seg.scalar(fbs.DataSegment.offset, "<Q", "offset")
            size = seg.scalar(fbs.DataSegment.size, "<Q", "size")
            buf.check(self.base + off, size, f"segments[{k}]")
            self.spans.append((self.base + off, size))

    def slice(self, segment: int, offset: int, nbytes: int, field: str) -> memoryview:
        start, size = self.spans[_index(segment, len(self.spans), field, "segment")]
        if offset < 0 or offset + nbytes > size:
            raise _fail(f"{nbytes} bytes at offset {offset} overrun segment {segment} "
                        f"({size} bytes)", field)
        return memoryview(self.buf.data)[start + offset:start + offset + nbytes]


class _Reader:
    def __init__(self, data: Any, limits: LoadLimits) -> None:
        self.buf = _Buf(data)
        self.limits = limits
        root_pos = self.buf.read("<I", 0, "root offset")
        self.root = _Table(self.buf, root_pos, "program")
        self.segments = _Segments(self.buf, self.root)
        self.constants: list[schema.ConstantBuffer] = []
        self.constant_index: dict[tuple[str, int, int], int] = {}
        if self.root.tables(fbs.Program.constant_buffer, "constant_buffer")[1:]:
            raise _fail("inline constants (deprecated since 2024) are not read; re-export "
                        "with a current ExecuTorch", "program.constant_buffer")
        seg = self.root.table(fbs.Program.constant_segment, "constant_segment")
        self.constant_segment = self._subsegment(seg) if seg else (0, ())
        self.mutable = [self._subsegment(t) for t in self.root.tables(
            fbs.Program.mutable_data_segments, "mutable_data_segments")]
        self.zeros = pte_memory.ZeroBuffers(self.constants)

    @staticmethod
    def _subsegment(t: _Table) -> tuple[int, tuple[int, ...]]:
        return (t.scalar(fbs.SubsegmentOffsets.segment_index, "<I", "segment_index"),
                t.scalars(fbs.SubsegmentOffsets.offsets, "offsets", "Q"))

    def constant(self, kind: str, segment: tuple[int, tuple[int, ...]], idx: int, nbytes: int,
                 field: str) -> int:
        key = (kind, idx, nbytes)
        if key in self.constant_index:
            return self.constant_index[key]
        seg, offsets = segment
        off = offsets[_index(idx, len(offsets), field, f"{kind} buffer")]
        data = self.segments.slice(seg, off, nbytes, field)
        self.constants.append(schema.ConstantBuffer(data))
        self.constant_index[key] = len(self.constants) - 1
        return self.constant_index[key]

    def program(self) -> schema.Program:
        plans = self.root.tables(fbs.Program.execution_plan, "execution_plan")
        if not plans:
            raise _fail("has no method", "program.execution_plan")
        methods = tuple(_PlanReader(self, p).method() for p in plans)
        self.zeros.finish()
        looping = any(isinstance(ins, schema.JumpFalseCall) and ins.dest <= pc
                      for m in methods for pc, ins in enumerate(m.instructions))
        return schema.Program(
            version=schema.LOOP_FORMAT_VERSION if looping else schema.FORMAT_VERSION,
            methods=methods, constants=tuple(self.constants))


class _PlanReader:
    """One ExecutionPlan -> one schema.Method."""

    def __init__(self, reader: _Reader, plan: _Table) -> None:
        self.r = reader
        self.t = plan
        self.path = plan.path
        self.inputs = plan.scalars(fbs.ExecutionPlan.inputs, "inputs", "i")
        self.input_set = set(self.inputs)
        self.outputs = plan.scalars(fbs.ExecutionPlan.outputs, "outputs", "i")
        sizes = plan.scalars(fbs.ExecutionPlan.non_const_buffer_sizes, "non_const_buffer_sizes",
                             "q")
        self.arenas = tuple(sizes[1:])
        if any(s < 0 for s in self.arenas):
            raise _fail("an arena size is negative", f"{self.path}.non_const_buffer_sizes")
        self.values: list[schema.EValue] = []
        self.input_memory: dict[int, schema.Allocation] = {}  # planned input -> its arena bytes

    # -- values ------------------------------------------------------------------------------

    def tensor(self, t: _Table, k: int) -> schema.Tensor:
        T = fbs.Tensor
        field = t.path
        dtype = t.scalar(T.scalar_type, "<b", "scalar_type")
        try:
            scalar_type = schema.ScalarType(dtype)
        except ValueError:
            raise _fail(f"scalar type {dtype} is not one exportir runs", f"{field}.scalar_type")\
                from None
        sizes = t.scalars(T.sizes, "sizes", "i")
        if len(sizes) > self.r.limits.max_rank:
            raise _fail(f"rank {len(sizes)} exceeds max_rank", f"{field}.sizes")
        dim_order = t.scalars(T.dim_order, "dim_order", "B")
        if sorted(dim_order) != list(range(len(sizes))):
            raise _fail(f"dim order {dim_order} is not a permutation of the {len(sizes)} "
                        "dimensions", f"{field}.dim_order")
        if any(s < 0 for s in sizes):
            raise _fail(f"sizes {sizes} are negative", f"{field}.sizes")
        if t.scalar(T.storage_offset, "<i", "storage_offset"):
            raise _fail("a storage offset other than 0", f"{field}.storage_offset")
        dynamism = t.scalar(T.shape_dynamism, "<b", "shape_dynamism")
        if dynamism not in (fbs.STATIC, fbs.DYNAMIC_BOUND, fbs.DYNAMIC_UNBOUND):
            raise _fail(f"shape dynamism {dynamism} is unknown", f"{field}.shape_dynamism")
        probe = schema.Tensor(scalar_type, tuple(sizes), tuple(dim_order), schema.InputStorage())
        if probe.nbytes > self.r.limits.max_tensor_bytes:
            raise _fail(f"{probe.nbytes} bytes exceed max_tensor_bytes", f"{field}.sizes")
        extra = t.table(T.extra_tensor_info, "extra_tensor_info")
        if extra is not None and extra.scalar(fbs.ExtraTensorInfo.location, "<b", "location"):
            raise _fail("tensor data stored outside the file (.ptd) is not read",
                        f"{field}.extra_tensor_info.location")
        data = t.scalar(T.data_buffer_idx, "<I", "data_buffer_idx")
        alloc = t.table(T.allocation_info, "allocation_info")
        initial = None
        if k in self.input_set:
            storage: schema.Storage = schema.InputStorage()
            if alloc is not None and not dynamism:
                self.input_memory[k] = self.allocation(alloc, probe.nbytes)
        elif alloc is not None:
            storage = self.allocation(alloc, probe.nbytes)
            if data:
                which = 0 if extra is None else extra.scalar(
                    fbs.ExtraTensorInfo.mutable_data_segments_idx, "<Q", "mutable_data_segments_idx")
                segment = self.r.mutable[_index(which, len(self.r.mutable), field,
                                                "mutable data segment")]
                initial = self.r.constant(f"mutable{which}", segment, data, probe.nbytes,
                                          f"{field}.data_buffer_idx")
        elif data:
            storage = schema.ConstantData(self.r.constant(
                "constant", self.r.constant_segment, data, probe.nbytes, f"{field}.data_buffer_idx"))
        else:
            storage = schema.DynamicStorage()
        return schema.Tensor(scalar_type, tuple(sizes), tuple(dim_order), storage,
                             dynamic=dynamism != fbs.STATIC, initial=initial)

    def allocation(self, a: _Table, nbytes: int) -> schema.Allocation:
        A = fbs.AllocationDetails
        memory = a.scalar(A.memory_id, "<I", "memory_id")
        low = a.scalar(A.memory_offset_low, "<I", "memory_offset_low")
        high = a.scalar(A.memory_offset_high, "<I", "memory_offset_high")
        if not 1 <= memory <= len(self.arenas):
            raise _fail(f"memory id {memory} names no planned buffer (1..{len(self.arenas)})",
                        f"{a.path}.memory_id")
        return schema.Allocation(memory - 1, (high << 32) | low, nbytes)

    def value(self, k: int, v: _Table) -> schema.EValue:
        tag = v.scalar(fbs.EValue.val_type, "<B", "val_type")
        kind = fbs.KERNEL_TYPES.get(tag)
        if kind is None:
            raise _fail(f"value kind {tag} is unknown", f"{v.path}.val_type")
        inner = v.table(fbs.EValue.val, "val", required=kind != "Null")
        match kind:
            case "Null":
                return schema.Null()
            case "Int":
                return schema.Int(inner.scalar(0, "<q", "int_val"))
            case "Bool":
                return schema.Bool(bool(inner.scalar(0, "<B", "bool_val")))
            case "Double":
                return schema.Double(inner.scalar(0, "<d", "double_val", 0.0))
            case "String":
                return schema.String(inner.string(0, "string_val"))
            case "IntList":
                return schema.IntList(tuple(inner.scalars(0, "items", "q")))
            case "DoubleList":
                return schema.DoubleList(tuple(inner.scalars(0, "items", "d")))
            case "BoolList":
                return schema.BoolList(tuple(bool(b) for b in inner.scalars(0, "items", "B")))
            case "TensorList":
                return schema.TensorList(tuple(inner.scalars(0, "items", "i")))
            case "OptionalTensorList":
                return schema.OptionalTensorList(tuple(inner.scalars(0, "items", "i")))
        return self.tensor(inner, k)

    # -- instructions ------------------------------------------------------------------------

    def operators(self) -> list[str]:
        names = []
        for op in self.t.tables(fbs.ExecutionPlan.operators, "operators"):
            name, overload = op.string(0, "name"), op.string(1, "overload")
            qualified = f"{name}.{overload}" if overload else name
            if qualified not in _KERNELS:
                raise _fail(f"operator {qualified!r} is not one of ExecuTorch's portable "
                            "kernels", f"{op.path}.name")
            names.append(qualified)
        return names

    def kernel(self, pc: int, call: _Table, names: list[str], ops: dict[schema.Operator, int]
               ) -> tuple[schema.Instruction, tuple[int, ...]] | None:
        """The call as an exportir instruction, and the values it writes (None: an et_view)."""
        field = call.path
        name = names[_index(call.scalar(0, "<i", "op_index"), len(names), f"{field}.op_index",
                            "operator")]
        args = list(call.scalars(1, "args", "i"))
        n_args, returns = _KERNELS[name]
        fresh = sum(1 for r in returns if r < 0)
        aliased = len(returns) - fresh
        want = n_args + fresh + (1 if aliased else 0)
        if len(args) == want + 1 and not returns:
            args.pop()  # ExecuTorch passes the out list of an op returning nothing once more
        if len(args) != want:
            raise _fail(f"{name} takes {want} value(s) (arguments and returns), the call passes "
                        f"{len(args)}", f"{field}.args")
        for a in args:
            _index(a, len(self.values), f"{field}.args", "value")
        if aliased:
            args.pop()  # the return slot: the out argument(s) again
        writes = tuple(args[p] for p in (*(r for r in returns if r >= 0),
                                          *range(n_args, len(args))))
        if name in _WRITES_WITHOUT_RETURN:
            writes = (args[_WRITES_WITHOUT_RETURN[name]],)
        if name == _COPY:
            return schema.MoveCall(args[1], args[0], pc), (args[0],)
        if name == _VIEW:
            self.view(args, field)
            return None
        renamed = _RENAMED.get(name)
        if renamed is not None:
            op, position, dropped = renamed
            if not self.default_dim_order(args[position], args[-1]):
                raise _fail(f"{name} with a dim order other than the contiguous one is not "
                            "read", f"{field}.args[{position}]")
            args[position] = self.null()
            args = [a for i, a in enumerate(args) if i not in dropped]
        else:
            ns, _, rest = name.partition("::")
            base, _, overload = rest.partition(".")
            op = schema.Operator(f"{_NAMESPACES.get(ns, ns)}::{base}", overload)
        index = ops.setdefault(op, len(ops))
        return schema.KernelCall(index, tuple(args), pc), writes

    def access(self, ins: schema.Instruction, writes: tuple[int, ...]) -> pte_memory.Access:
        for i in writes:
            _index(i, len(self.values), f"{self.path}.chains[0].instructions[{ins.debug}]",
                   "value")
        return pte_memory.access(self.values, [
            i for i in _mentions(ins) if 0 <= i < len(self.values)], writes)

    def drop_unused(self, kept: list[schema.Instruction]) -> None:
        """A tensor that nothing reads or writes (a constant whose views were laid out on their
        own, a planned view source no instruction names) is no value to run: it becomes a Null
        rather than memory the runtime would reserve (and the plan would check)."""
        used = set(self.inputs) | set(self.outputs)
        for ins in kept:
            used.update(_mentions(ins))
        for v in self.values:
            if isinstance(v, (schema.TensorList, schema.OptionalTensorList)):
                used.update(v.items)
            elif isinstance(v, schema.Tensor) and isinstance(v.storage, schema.ViewOf):
                used.add(v.storage.base)
        for k, v in enumerate(self.values):
            if k not in used and isinstance(v, schema.Tensor) and isinstance(
                v.storage, (schema.DynamicStorage, schema.Allocation)
            ):
                self.values[k] = schema.Null()

    def default_dim_order(self, arg: int, out: int) -> bool:
        order, t = self.values[arg], self.values[out]
        if isinstance(order, schema.Null):
            return True
        if not isinstance(order, schema.IntList) or not isinstance(t, schema.Tensor):
            return False
        items = [self.values[_index(i, len(self.values), "dim_order", "value")]
                 for i in order.items]
        return [getattr(v, "value", None) for v in items] == list(range(len(t.sizes)))

    def null(self) -> int:
        self.values.append(schema.Null())
        return len(self.values) - 1

    def view(self, args: list[int], field: str) -> None:
        """``et_view(self, sizes) -> out``: ``out`` aliases ``self`` (a ViewOf its root)."""
        src, out = args[0], args[2]
        s, o = self.values[src], self.values[out]
        if not (isinstance(s, schema.Tensor) and isinstance(o, schema.Tensor)) or o.dynamic or (
            s.dynamic
        ) or s.numel != o.numel or not isinstance(o.storage, schema.DynamicStorage):
            raise _fail("et_view must alias a static tensor with an unplanned one of as many "
                        "elements", f"{field}.args")
        base, offset = src, 0
        if isinstance(s.storage, schema.ViewOf):
            base, offset = s.storage.base, s.storage.offset
        strides = schema.dense_strides(o.sizes, tuple(range(len(o.sizes))))
        self.values[out] = schema.Tensor(o.dtype, o.sizes, tuple(range(len(o.sizes))),
                                         schema.ViewOf(base, offset, strides))

    def instruction(self, pc: int, ins: _Table, names: list[str], ops: dict[schema.Operator, int]
                    ) -> tuple[schema.Instruction, tuple[int, ...]] | None:
        """The instruction and the values it writes (None: nothing to run)."""
        tag = ins.scalar(fbs.Instruction.instr_args_type, "<B", "instr_args_type")
        kind = fbs.INSTRUCTION_TYPES.get(tag)
        if kind is None:
            raise _fail(f"instruction kind {tag} is unknown", f"{ins.path}.instr_args_type")
        call = ins.table(fbs.Instruction.instr_args, "instr_args", required=True)
        match kind:
            case "KernelCall":
                return self.kernel(pc, call, names, ops)
            case "MoveCall":
                dst = call.scalar(1, "<i", "move_to")
                return schema.MoveCall(call.scalar(0, "<i", "move_from"), dst, pc), (dst,)
            case "JumpFalseCall":
                return schema.JumpFalseCall(call.scalar(0, "<i", "cond_value_index"),
                                            call.scalar(1, "<i", "destination_instruction"),
                                            pc), ()
            case "FreeCall":
                return schema.FreeCall(call.scalar(0, "<i", "value_index"), pc), ()
        delegates = self.t.tables(fbs.ExecutionPlan.delegates, "delegates")
        index = call.scalar(0, "<i", "delegate_index")
        backend = (delegates[index].string(fbs.BackendDelegate.id, "id")
                   if 0 <= index < len(delegates) else "?")
        raise _fail(f"a call of the {backend!r} delegate: exportir reads portable-only .pte "
                    "files", f"{call.path}")

    def method(self) -> schema.Method:
        name = self.t.string(fbs.ExecutionPlan.name, "name")
        for k, v in enumerate(self.t.tables(fbs.ExecutionPlan.values, "values")):
            self.values.append(self.value(k, v))
        chains = self.t.tables(fbs.ExecutionPlan.chains, "chains")
        if len(chains) != 1:
            raise _fail(f"{len(chains)} chains; exportir reads methods of one chain",
                        f"{self.path}.chains")
        names = self.operators()
        ops: dict[schema.Operator, int] = {}
        kept: list[schema.Instruction] = []
        accesses: list[pte_memory.Access] = []
        starts = []
        raw = chains[0].tables(fbs.Chain.instructions, "instructions")
        for pc, ins in enumerate(raw):
            starts.append(len(kept))
            found = self.instruction(pc, ins, names, ops)
            if found is not None:
                kept.append(found[0])
                accesses.append(self.access(found[0], found[1]))
        starts.append(len(kept))
        pte_memory.resolve(self.values, accesses, self.input_memory, self.outputs, self.path,
                           self.r.zeros)
        self.drop_unused(kept)
        instructions, debug = [], []
        for ins in kept:
            if isinstance(ins, schema.JumpFalseCall):
                dest = _index(ins.dest, len(starts), f"{self.path}.chains[0].instructions"
                              f"[{ins.debug}].destination_instruction", "instruction")
                ins = schema.JumpFalseCall(ins.cond_value, starts[dest], ins.debug)
            debug.append(schema.DebugEntry(f"instruction {ins.debug}"))
            instructions.append(_with_debug(ins, len(debug) - 1))
        meta = self.t.table(fbs.ExecutionPlan.container_meta_type, "container_meta_type")
        offsets = [v.storage.offset for v in self.values if isinstance(v, schema.Tensor)
                   and isinstance(v.storage, schema.Allocation)]
        alignment = 16
        while alignment > 1 and any(o % alignment for o in offsets):
            alignment //= 2
        return schema.Method(
            name=name, values=tuple(self.values), inputs=tuple(self.inputs),
            outputs=tuple(self.outputs), operators=tuple(sorted(ops, key=ops.__getitem__)),
            instructions=tuple(instructions), debug=tuple(debug),
            plan=schema.MethodPlan(self.arenas, 0, alignment),
            in_spec=meta.string(0, "encoded_inp_str") if meta else "",
            out_spec=meta.string(1, "encoded_out_str") if meta else "",
        )


def _mentions(ins: schema.Instruction) -> tuple[int, ...]:
    match ins:
        case schema.KernelCall(args=a):
            return a
        case schema.MoveCall(src=s, dst=d):
            return (s, d)
        case schema.JumpFalseCall(cond_value=c):
            return (c,)
    return ()


def _with_debug(ins: schema.Instruction, debug: int) -> schema.Instruction:
    match ins:
        case schema.KernelCall(op_index=o, args=a):
            return schema.KernelCall(o, a, debug)
        case schema.MoveCall(src=s, dst=d):
            return schema.MoveCall(s, d, debug)
        case schema.JumpFalseCall(cond_value=c, dest=d):
            return schema.JumpFalseCall(c, d, debug)
        case schema.FreeCall(value=v):
            return schema.FreeCall(v, debug)
    return ins


def read_pte(data: Any, limits: LoadLimits = DEFAULT_LIMITS) -> schema.Program:
    """Decode and check a .pte file; the caller validates the result like any program
    (``validate.validate_program``: indices, sizes, the memory plan)."""
    if not is_pte(data):
        raise ProgramLoadError("is not a .pte file (no ET12 identifier at byte 4)",
                               "file identifier", offset=4)
    try:
        return _Reader(data, limits).program()
    except RecursionError:  # pragma: no cover - the schema has no recursion; belt and braces
        raise ProgramLoadError("nests too deeply", "program") from None
