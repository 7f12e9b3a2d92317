"""Write a :class:`schema.Program` as an ExecuTorch ``.pte`` file (``program.fbs``, ``ET12``).

The program's emission and memory plan are kept: only the encoding changes (see
``docs/format/pte.md`` for the mapping). What the format cannot say is refused before anything
is written: operators ExecuTorch's portable kernels do not register
(:class:`PteKernelCoverageError`, listing every one with its nodes), delegate calls (ExecuTorch
has no exportir backend), runtime-allocated tensors and complex dtypes (:class:`PteEncodeError`).

Imports the standard library, the format and ``flatbuffers``; ``torch`` only to lay out views
of constants that are not dense (a transposed weight is written transposed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import flatbuffers

from exportir.format import _pte_fbs as fbs
from exportir.format import schema
from exportir.format.pte_kernels import PTE_KERNELS
from exportir.format.pte_select import select_kernels
from exportir.format.pte_views import view_copy

__all__ = [
    "PteEncodeError",
    "PteKernelCoverageError",
    "check_pte_coverage",
    "pte_operator_name",
    "write_pte",
]

# exportir's operator namespaces that ExecuTorch names otherwise
_NAMESPACES = {"exportir_prim": "executorch_prim"}
_AS_STRIDED = ("aten::as_strided_copy", "out")
_PERMUTE = ("aten::permute_copy", "out")
_COPY = ("aten::copy_", "")

# Outs ExecuTorch's kernel resizes to other sizes than torch's meta kernel gives them: written
# with a dynamic (upper-bound) shape so the resize succeeds. op -> argument positions.
_RESIZED_OUTS: dict[str, tuple[int, ...]] = {
    # inference batch norm leaves its saved mean / inverse std empty
    "aten::_native_batch_norm_legit_no_training.out": (8, 9),
}

# Argument values ExecuTorch's portable kernels refuse at run time: op -> (position, name,
# refused value, what to do).
_REFUSED_ARGS: dict[str, tuple[int, str, object, str]] = {
    "aten::_native_batch_norm_legit.out": (
        5, "training", True, "put the model in eval() mode before export"),
    "aten::_native_batch_norm_legit.no_stats_out": (
        3, "training", True, "put the model in eval() mode before export"),
}


class PteEncodeError(ValueError):
    """The program uses something ExecuTorch's .pte format or runtime cannot express."""


class PteKernelCoverageError(PteEncodeError):
    """Operators ExecuTorch's portable kernels do not register (or refuse an argument of);
    ``missing`` maps each (with the refused argument, if that is the reason) to the
    ``method:node (file:line)`` entries calling it."""

    def __init__(self, message: str, missing: dict[str, list[str]]) -> None:
        super().__init__(message)
        self.missing = missing


def pte_operator_name(op: schema.Operator) -> tuple[str, str]:
    """``(name, overload)`` of ``op`` in ExecuTorch's operator registry."""
    ns, sep, rest = op.name.partition("::")
    return (f"{_NAMESPACES.get(ns, ns)}{sep}{rest}", op.overload)


def _qualified(name: str, overload: str) -> str:
    return f"{name}.{overload}" if overload else name


def _refused_argument(m: schema.Method, name: str, ins: schema.KernelCall) -> str | None:
    rule = _REFUSED_ARGS.get(name)
    if rule is None or rule[0] >= len(ins.args):
        return None
    position, arg, value, fix = rule
    found = m.values[ins.args[position]]
    if getattr(found, "value", None) != value:
        return None
    return f" with {arg}={value} (the portable kernel refuses it: {fix})"


def check_pte_coverage(program: schema.Program) -> None:
    """Raise :class:`PteEncodeError` for delegates and :class:`PteKernelCoverageError` listing
    every operator ExecuTorch's portable kernels lack, with the nodes calling it."""
    if program.delegates:
        ids = sorted({d.backend_id for d in program.delegates})
        raise PteEncodeError(
            f"the program delegates to {', '.join(ids)}: ExecuTorch has no such backend, so no "
            ".pte was written; compile without to_backend (portable kernels) to write a .pte, or "
            "save the .xpt for exportir's runtime")
    missing: dict[str, list[str]] = {}
    for m in program.methods:
        for pc, ins in enumerate(m.instructions):
            if not isinstance(ins, schema.KernelCall):
                continue
            name = _qualified(*pte_operator_name(m.operators[ins.op_index]))
            refused = _refused_argument(m, name, ins)
            if name in PTE_KERNELS and refused is None:
                continue
            entry = m.debug[ins.debug] if ins.debug < len(m.debug) else None
            where = f"{m.name}:{entry.node_name if entry else f'instruction {pc}'}"
            if entry and entry.source:
                where += f" ({entry.source})"
            missing.setdefault(name + (refused or ""), []).append(where)
    if not missing:
        return
    lines = [(f"{len(missing)} operator(s) ExecuTorch's portable kernels cannot run (no kernel "
              "registered, or an argument value the kernel refuses); no .pte was written:")]
    lines += [f"  {op}: nodes {', '.join(nodes)}" for op, nodes in sorted(missing.items())]
    lines.append("Fix: decompose these ops before to_program, or save an .xpt for exportir's "
                 "runtime, which runs them.")
    raise PteKernelCoverageError("\n".join(lines), missing)


# ------------------------------------------------------------------------------ data tables


@dataclass(slots=True)
class _Constants:
    """The constant segment: ``entries[i]`` (index ``i + 1``; 0 is reserved for non-constants)
    is ``(key, byte offset)`` where key is a program buffer index or materialized bytes."""

    buffers: Sequence[schema.ConstantBuffer]
    entries: list[tuple[Any, int]] = field(default_factory=list)
    index: dict[tuple[Any, int], int] = field(default_factory=dict)

    def ref(self, key: Any, offset: int = 0) -> int:
        found = self.index.get((key, offset))
        if found is None:
            self.entries.append((key, offset))
            found = self.index[(key, offset)] = len(self.entries)
        return found

    def layout(self, alignment: int) -> tuple[bytearray, list[int]]:
        data = bytearray()
        where: dict[Any, int] = {}
        offsets = [0]
        for key, offset in self.entries:
            if key not in where:
                data += bytes(-len(data) % alignment)
                where[key] = len(data)
                data += key if isinstance(key, bytes) else bytes(self.buffers[key].data)
            offsets.append(where[key] + offset)
        return data, offsets


def _dense(t: schema.Tensor, strides: Sequence[int]) -> bool:
    """Whether a view is a contiguous block (ExecuTorch's kernels want one dim order across
    their operands, so a transposed view is laid out anew rather than aliased)."""
    if any(s == 0 for s in t.sizes):
        return True
    want = schema.dense_strides(t.sizes, tuple(range(len(t.sizes))))
    return all(a == b for a, b, n in zip(strides, want, t.sizes) if n > 1)


def _expands(view: schema.Tensor, root: Any) -> bool:
    return isinstance(root, schema.Tensor) and view.numel > root.numel


def _contiguous_view(root: schema.Tensor, view: schema.Tensor,
                     v: schema.ViewOf) -> schema.ViewOf | None:
    """``v`` re-expressed over ``root`` laid out contiguously (ExecuTorch's kernels write every
    tensor in one dim order), or None when no strides can say it. Each view stride and the
    offset are split into whole steps of the root's dimensions (the root's memory is dense in
    its dim order, so the split is unique); the view is the same affine map over logical root
    indices when no step carries past a root dimension's size."""
    order = tuple(range(len(root.sizes)))
    if root.dim_order == order:
        return v
    if any(n == 0 for n in view.sizes):
        return schema.ViewOf(v.base, 0, schema.dense_strides(view.sizes, view.dim_order))
    old = schema.dense_strides(root.sizes, root.dim_order)
    new = schema.dense_strides(root.sizes, order)

    def split(n: int) -> list[int] | None:
        steps = [0] * len(root.sizes)
        for d in root.dim_order:
            steps[d], n = divmod(n, old[d]) if root.sizes[d] > 1 else (0, n)
        return steps if n == 0 else None

    base = split(v.offset)
    per_dim = [split(s) if n > 1 else [0] * len(root.sizes) for s, n in zip(v.strides,
                                                                           view.sizes)]
    if base is None or any(s is None for s in per_dim):
        return None
    for r, size in enumerate(root.sizes):
        reach = base[r] + sum((n - 1) * s[r] for s, n in zip(per_dim, view.sizes))
        if reach >= size:
            return None
    strides = tuple(sum(c * k for c, k in zip(s, new)) for s in per_dim)
    return schema.ViewOf(v.base, sum(c * k for c, k in zip(base, new)), strides)


def _contiguous_bytes(t: schema.Tensor, data: Any) -> Any:
    """The bytes of constant ``t`` (stored in its dim order) laid out contiguously."""
    order = tuple(range(len(t.sizes)))
    if t.dim_order == order or t.numel <= 1:
        return data
    import torch  # only the compiler writes .pte files; the runtime never imports this

    dtype = getattr(torch, schema.TORCH_DTYPE_NAME[t.dtype])
    physical = [t.sizes[d] for d in t.dim_order]
    flat = torch.frombuffer(bytearray(data), dtype=dtype).reshape(physical)
    logical = flat.permute([t.dim_order.index(d) for d in order])
    return logical.contiguous().numpy().tobytes()


def _strided_bytes(root: schema.Tensor, data: Any, view: schema.Tensor,
                   v: schema.ViewOf) -> bytes:
    import torch  # only the compiler writes .pte files; the runtime never imports this

    dtype = getattr(torch, schema.TORCH_DTYPE_NAME[root.dtype])
    flat = torch.frombuffer(bytearray(data), dtype=dtype) if len(data) else torch.empty(
        0, dtype=dtype)
    return flat.as_strided(view.sizes, v.strides, v.offset).contiguous().numpy().tobytes()


# ------------------------------------------------------------------------------ one method


@dataclass(slots=True)
class _Method:
    name: str
    values: list[tuple]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    operators: list[tuple[str, str]]
    instructions: list[tuple]
    buffer_sizes: list[int]
    in_spec: str
    out_spec: str


class _MethodEncoder:
    """Maps one method's values and instructions onto ExecuTorch's (see docs/format/pte.md)."""

    def __init__(self, m: schema.Method, constants: _Constants, mutable: list[Any]) -> None:
        self.m = m
        self.constants = constants
        self.mutable = mutable
        self.values: list[tuple] = []
        self.operators: dict[tuple[str, str], int] = {}
        self.arenas = list(m.plan.arenas)
        self.view_arena: int | None = None
        self.runtime_views: dict[int, tuple[schema.ViewOf, bool]] = {}
        self.physical: dict[int, int] = {}
        self.read_only: dict[tuple, int] = {}
        self.scratch_sizes: dict[Any, int] = {}
        self.block_keys: list[set[Any]] = []
        self.resized = self.resized_outs()
        self.planned_inputs = self.plan_inputs()
        self.outputs = list(m.outputs)
        self.mentioned = {i for ins in m.instructions for i in self.reads(ins)}
        self.mentioned.update(m.outputs)
        self.mentioned.update(i for ins in m.instructions if isinstance(ins, schema.MoveCall)
                              for i in (ins.dst,))
        # a broadcast of a constant (an expand: more elements than its base) is copied at run
        # time from the stored base rather than stored expanded
        self.mentioned.update(
            v.storage.base for v in m.values
            if isinstance(v, schema.Tensor) and isinstance(v.storage, schema.ViewOf)
            and isinstance(m.values[v.storage.base], schema.Tensor)
            and _expands(v, m.values[v.storage.base])
        )

    def written(self) -> set[int]:
        """Values some instruction writes (out arguments, in-place targets, move targets)."""
        found: set[int] = set()
        for ins in self.m.instructions:
            if isinstance(ins, schema.KernelCall):
                name = _qualified(*pte_operator_name(self.m.operators[ins.op_index]))
                n_args, returns = PTE_KERNELS.get(name, (len(ins.args), ()))
                found.update(ins.args[r] for r in returns if 0 <= r < len(ins.args))
                found.update(ins.args[n_args:])  # results the call appends
            elif isinstance(ins, schema.MoveCall):
                found.add(ins.dst)
        return found

    def plan_inputs(self) -> dict[int, tuple[int, int]]:
        """Planned memory for the inputs that views read, as ExecuTorch plans every input: the
        runtime copies the caller's tensor in once per call, and each view of it is an alias
        rather than an ``as_strided_copy`` before every instruction reading it. Inputs the
        method writes stay bound to the caller's tensor (the caller sees the write)."""
        viewed = {v.storage.base for v in self.m.values if isinstance(v, schema.Tensor)
                  and isinstance(v.storage, schema.ViewOf)}
        written = self.written()
        found = {}
        for i in self.m.inputs:
            t = self.m.values[i]
            if ((i in viewed or i in self.m.outputs) and i not in written and isinstance(t, schema.Tensor)
                    and isinstance(t.storage, schema.InputStorage) and not t.dynamic):
                found[i] = self.reserve(t.nbytes)
        return found

    def resized_outs(self) -> set[int]:
        found = set()
        for ins in self.m.instructions:
            if isinstance(ins, schema.KernelCall):
                name = _qualified(*pte_operator_name(self.m.operators[ins.op_index]))
                found.update(ins.args[k] for k in _RESIZED_OUTS.get(name, ())
                             if k < len(ins.args))
        return found

    def fail(self, where: str, what: str) -> PteEncodeError:
        return PteEncodeError(f"method {self.m.name!r}, {where}: {what}; no .pte was written")

    # -- values --------------------------------------------------------------------------------

    def tensor(self, i: int, t: schema.Tensor) -> tuple:
        if int(t.dtype) not in fbs.SCALAR_TYPES:
            raise self.fail(f"value {i}", f"dtype {t.dtype.name} has no ExecuTorch ScalarType")
        dynamism = fbs.DYNAMIC_BOUND if t.dynamic or i in self.resized else fbs.STATIC
        data, alloc = 0, None
        match t.storage:
            case schema.ConstantData() if i not in self.mentioned:
                pass  # only views of it are read (aliased or laid out on their own): no data
            case schema.ConstantData(buffer=b):
                stored = self.constants.buffers[b].data
                relaid = _contiguous_bytes(t, stored)
                data = self.constants.ref(b if relaid is stored else bytes(relaid))
            case schema.Allocation(arena=a, offset=off):
                alloc = (a + 1, off)
                if t.initial is not None:
                    self.mutable.append(t.initial)
                    data = len(self.mutable)
            case schema.InputStorage():
                alloc = self.planned_inputs.get(i)
            case schema.DynamicStorage():
                raise self.fail(f"value {i}", "a tensor without an upper bound on its size "
                                "(runtime-allocated): ExecuTorch's planned memory cannot hold it")
            case schema.ViewOf() as v:
                data, alloc = self.view(i, t, v)
        return ("Tensor", int(t.dtype), t.sizes, tuple(range(len(t.sizes))), data, alloc,
                dynamism)

    def view(self, i: int, t: schema.Tensor, v: schema.ViewOf) -> tuple[int, Any]:
        """A view has no instruction in exportir's format. Contiguous views of planned or
        constant memory alias it (an offset into the arena or the constant segment); other
        views of constants are laid out at write time; the rest are copied by
        ``as_strided_copy`` before each instruction reading them."""
        root = self.m.values[v.base]
        esize = schema.ELEMENT_SIZE[t.dtype]
        if t.dynamic or not isinstance(root, schema.Tensor):
            raise self.fail(f"value {i}", "a view of a dynamic tensor")
        if isinstance(root.storage, schema.ConstantData) and not _expands(t, root):
            stored = self.constants.buffers[root.storage.buffer].data
            if _dense(t, v.strides) and root.dim_order == tuple(range(len(root.sizes))):
                return self.constants.ref(root.storage.buffer, v.offset * esize), None
            return self.constants.ref(_strided_bytes(root, stored, t, v)), None
        relaid = _contiguous_view(root, t, v)
        if isinstance(root.storage, schema.Allocation):
            where: tuple[int, int] | None = (root.storage.arena + 1, root.storage.offset)
        else:
            where = self.planned_inputs.get(v.base)
        if relaid is not None and where is not None and _dense(t, relaid.strides):
            return 0, (where[0], where[1] + relaid.offset * esize)
        # copied at run time: from the base (contiguous in ExecuTorch), or when the view only
        # exists over the base's own dim order, from a copy of the base in that order
        self.runtime_views[i] = (relaid or v, relaid is None)
        return 0, self.scratch(i, t.nbytes)

    def scratch(self, key: Any, nbytes: int) -> tuple[str, Any]:
        """A placeholder allocation for a copy made just before the instruction reading it:
        copies never read by one instruction share memory (:meth:`place_scratch`)."""
        self.scratch_sizes[key] = nbytes
        return ("scratch", key)

    def place_scratch(self) -> None:
        """Lays the run-time copies out in one more arena: first fit, each apart from the copies
        made for the same instruction (the only ones alive with it), then points their values
        at the places found."""
        if not self.scratch_sizes:
            return
        together: dict[Any, set[Any]] = {k: set() for k in self.scratch_sizes}
        for keys in self.block_keys:
            for k in keys:
                together[k] |= keys
        for k in [k for k, others in together.items() if not others]:
            together[k] = set(self.scratch_sizes)  # never copied: apart from every copy
            for others in together.values():
                others.add(k)
        placed: dict[Any, int] = {}
        end = 0
        for key, nbytes in self.scratch_sizes.items():
            busy = sorted((placed[o], placed[o] + self.scratch_sizes[o]) for o in together[key]
                          if o in placed)
            offset = 0
            for lo, hi in busy:
                if offset + nbytes <= lo:
                    break
                offset = max(offset, _align(hi, 16))
            placed[key] = offset
            end = max(end, _align(offset + nbytes, 16))
        arena = len(self.arenas)
        self.arenas.append(end)
        for k, v in enumerate(self.values):
            if v[0] == "Tensor" and isinstance(v[5], tuple) and v[5][0] == "scratch":
                self.values[k] = (*v[:5], (arena + 1, placed[v[5][1]]), v[6])

    def reserve(self, nbytes: int) -> tuple[int, int]:
        """Planned memory for a copy this encoding adds, in an arena of its own."""
        if self.view_arena is None:
            self.view_arena = len(self.arenas)
            self.arenas.append(0)
        offset = self.arenas[self.view_arena]
        self.arenas[self.view_arena] = offset + nbytes + (-nbytes % 16)
        return (self.view_arena + 1, offset)

    def value(self, i: int, v: schema.EValue) -> tuple:
        match v:
            case schema.Tensor():
                return self.tensor(i, v)
            case schema.Int(value=x):
                return ("Int", x)
            case schema.Double(value=x):
                return ("Double", x)
            case schema.Bool(value=x):
                return ("Bool", x)
            case schema.String(value=x):
                return ("String", x)
            case schema.Null():
                return ("Null",)
            case schema.IntList(items=x):
                return ("IntList", x)
            case schema.DoubleList(values=x):
                return ("DoubleList", x)
            case schema.BoolList(values=x):
                return ("BoolList", x)
            case schema.TensorList(items=x):
                return ("TensorList", x)
            case schema.OptionalTensorList(items=x):
                return ("OptionalTensorList", x)
        raise self.fail(f"value {i}", f"{type(v).__name__} has no ExecuTorch value kind")

    def add(self, value: tuple) -> int:
        self.values.append(value)
        return len(self.values) - 1

    # -- instructions --------------------------------------------------------------------------

    def operator(self, name: str, overload: str) -> int:
        return self.operators.setdefault((name, overload), len(self.operators))

    def kernel(self, pc: int, ins: schema.KernelCall) -> tuple:
        name, overload = pte_operator_name(self.m.operators[ins.op_index])
        n_args, returns = PTE_KERNELS[_qualified(name, overload)]
        args = list(ins.args)
        fresh = sum(1 for r in returns if r < 0)
        if len(args) != n_args + fresh:
            raise self.fail(f"instruction {pc}", f"{name}.{overload} takes {n_args} argument(s) "
                            f"in ExecuTorch, the program passes {len(args) - fresh}")
        aliased = [args[r] for r in returns if r >= 0]
        if not returns and name.startswith("aten::"):
            # an out-list variant (split_copy, unbind_copy: ``Tensor(a!)[] out -> ()``): ExecuTorch
            # passes the list once more, as its emitter does
            args.append(args[-1])
        elif len(aliased) == 1:
            args.append(aliased[0])
        elif aliased:
            args.append(self.add(("TensorList", tuple(aliased))))
        return ("KernelCall", self.operator(name, overload), tuple(args))

    def move(self, ins: schema.MoveCall) -> tuple:
        if not isinstance(self.m.values[ins.src], schema.Tensor):
            return ("MoveCall", ins.src, ins.dst)
        # ExecuTorch's MoveCall rebinds the value; exportir's copies the tensor's contents
        op = self.operator(*_COPY)
        return ("KernelCall", op, (ins.dst, ins.src, self.constant(("Bool", False)), ins.dst))

    def constant(self, value: tuple) -> int:
        """A read-only scalar or list the encoding adds, shared with every equal one (a value
        no instruction writes and the caller does not pass)."""
        found = self.read_only.get(value)
        if found is None:
            found = self.read_only[value] = self.add(value)
        return found

    def int_list(self, items: Sequence[int]) -> int:
        return self.constant(("IntList", tuple(self.constant(("Int", x)) for x in items)))

    def materialize(self, i: int) -> list[tuple]:
        """A copy of view ``i`` from its base: ``slice_copy`` / ``select_copy`` when it is one
        (``pte_views``), else ``as_strided_copy`` (first a ``permute_copy`` of the base into
        its own dim order, when the view only exists over that order)."""
        v, physical = self.runtime_views[i]
        t = self.m.values[i]
        self.block_keys[-1].add(i)
        found: list[tuple] = []
        source = v.base
        if physical:
            root = self.m.values[v.base]
            source = self.physical.get(v.base, -1)
            if source < 0:
                sizes = tuple(root.sizes[d] for d in root.dim_order)
                source = self.physical[v.base] = self.add((
                    "Tensor", int(root.dtype), sizes, tuple(range(len(sizes))), 0,
                    self.scratch(("physical", v.base), root.nbytes), fbs.STATIC))
            self.block_keys[-1].add(("physical", v.base))
            dims = self.int_list(root.dim_order)
            op = self.operator(*_PERMUTE)
            found.append(("KernelCall", op, (v.base, dims, source, source)))
        form = None if physical else view_copy(self.m.values[v.base], t, v)
        if form is not None:  # a slice or a selection: a cheaper kernel (pte_views)
            ints = tuple(self.constant(("Int", x)) for x in form.ints)
            found.append(("KernelCall", self.operator(form.op, form.overload),
                          (source, *ints, i, i)))
            return found
        sizes, strides = self.int_list(t.sizes), self.int_list(v.strides)
        offset = self.constant(("Int", v.offset))
        op = self.operator(*_AS_STRIDED)
        found.append(("KernelCall", op, (source, sizes, strides, offset, i, i)))
        return found

    def copy_input_outputs(self) -> list[tuple]:
        """An output that is an input is returned as a planned copy: ExecuTorch's runtime
        points outputs it does not plan at fresh memory, which would replace the input."""
        found = []
        for k, i in enumerate(self.outputs):
            t = self.m.values[i]
            if not (isinstance(t, schema.Tensor) and isinstance(t.storage, schema.InputStorage)
                    and i not in self.planned_inputs):  # a planned input is the runtime's copy
                continue
            copy = self.add(("Tensor", int(t.dtype), t.sizes, tuple(range(len(t.sizes))), 0,
                             self.reserve(t.nbytes),
                             fbs.DYNAMIC_BOUND if t.dynamic else fbs.STATIC))
            found.append(self.move(schema.MoveCall(i, copy)))
            self.outputs[k] = copy
        return found

    def reads(self, ins: schema.Instruction) -> list[int]:
        match ins:
            case schema.KernelCall(args=args):
                found = []
                for a in args:
                    item = self.m.values[a]
                    if isinstance(item, (schema.TensorList, schema.OptionalTensorList)):
                        found += item.items
                    found.append(a)
                return found
            case schema.MoveCall(src=src):
                return [src]
            case schema.JumpFalseCall(cond_value=c):
                return [c]
        return []

    def instructions(self) -> list[tuple]:
        blocks: list[list[tuple]] = []
        for pc, ins in enumerate(self.m.instructions):
            self.block_keys.append(set())
            block = [c for i in dict.fromkeys(self.reads(ins)) if i in self.runtime_views
                     for c in self.materialize(i)]
            match ins:
                case schema.KernelCall():
                    block.append(self.kernel(pc, ins))
                case schema.MoveCall():
                    block.append(self.move(ins))
                case schema.JumpFalseCall(cond_value=c, dest=d):
                    block.append(("JumpFalseCall", c, d))
                case schema.FreeCall(value=v):
                    block.append(("FreeCall", v))
                case schema.DelegateCall():
                    raise self.fail(f"instruction {pc}", "a delegate call")
            blocks.append(block)
        self.block_keys.append(set())  # the outputs: copied last, alive together
        tail = [c for i in dict.fromkeys(self.m.outputs) if i in self.runtime_views
                for c in self.materialize(i)]
        tail += self.copy_input_outputs()
        starts, n = [], 0
        for block in blocks:
            starts.append(n)
            n += len(block)
        starts.append(n)  # a jump to the end lands on the output copies
        flat = []
        for block in blocks:
            for ins in block:
                if ins[0] == "JumpFalseCall":
                    ins = ("JumpFalseCall", ins[1], starts[ins[2]])
                flat.append(ins)
        return flat + tail

    def encode(self) -> _Method:
        fixed = self.written() | set(self.m.inputs)
        for i, v in enumerate(self.m.values):  # in order: value i of the method is value i
            self.values.append(self.value(i, v))
            if isinstance(v, (schema.Int, schema.Bool)) and i not in fixed:
                self.read_only.setdefault(self.values[-1], i)
        instructions = self.instructions()
        self.place_scratch()
        return _Method(
            # a str input is fixed at export (the method runs with that value only) and
            # ExecuTorch's runtime takes no str input: the .pte keeps it as a value, not an input
            name=self.m.name, values=self.values,
            inputs=tuple(i for i in self.m.inputs if not isinstance(self.m.values[i],
                                                                     schema.String)),
            outputs=tuple(self.outputs), operators=list(self.operators),
            instructions=instructions, buffer_sizes=[0, *self.arenas],
            in_spec=self.m.in_spec, out_spec=self.m.out_spec,
        )


# ------------------------------------------------------------------------------ flatbuffer

_WIDTH = {"Int64": 8, "Uint64": 8, "Float64": 8, "off": 4, "Int32": 4, "Uint32": 4,
          "Int8": 1, "Uint8": 1, "Bool": 1}


def _exact(x: Any) -> Any:
    """A key telling apart values that compare equal but encode differently (0.0 and -0.0)."""
    return ("f", x.hex()) if isinstance(x, float) else x



class _Writer:
    """Builds the flatbuffer bottom-up with ``flatbuffers.Builder`` (children before
    parents, vectors back to front). Equal strings, vectors and tables are written once and
    shared by every reference (a flatbuffer is a DAG of offsets), and a table's fields are laid
    out widest first, so no padding falls between them."""

    def __init__(self) -> None:
        self.b = flatbuffers.Builder(1 << 16)
        self.shared: dict[tuple, int] = {}

    def table(self, num: int, fields: Sequence[tuple[str, int, Any]]) -> int:
        """``fields``: (kind, slot, value) with kind one of the Prepend*Slot suffixes or
        ``"off"`` for an offset; ``None`` values are left out (the schema default)."""
        present = sorted(((k, s, v) for k, s, v in fields if v is not None),
                         key=lambda f: -_WIDTH[f[0]])
        key = ("table", num, *((k, s, _exact(v)) for k, s, v in present))
        found = self.shared.get(key)
        if found is not None:
            return found
        b = self.b
        b.StartObject(num)
        for kind, slot, value in present:
            if kind == "off":
                b.PrependUOffsetTRelativeSlot(slot, value, 0)
            else:
                getattr(b, f"Prepend{kind}Slot")(slot, value, 0 if kind != "Bool" else False)
        found = self.shared[key] = b.EndObject()
        return found

    def offsets(self, items: Sequence[int]) -> int:
        key = ("offsets", *items)
        found = self.shared.get(key)
        if found is None:
            b = self.b
            b.StartVector(4, len(items), 4)
            for off in reversed(items):
                b.PrependUOffsetTRelative(off)
            found = self.shared[key] = b.EndVector()
        return found

    def scalars(self, kind: str, size: int, items: Sequence[Any]) -> int:
        key = (kind, *(_exact(x) for x in items))
        found = self.shared.get(key)
        if found is None:
            b = self.b
            b.StartVector(size, len(items), size)
            prepend = getattr(b, f"Prepend{kind}")
            for x in reversed(items):
                prepend(x)
            found = self.shared[key] = b.EndVector()
        return found

    def string(self, s: str) -> int:
        key = ("string", s)
        found = self.shared.get(key)
        if found is None:
            found = self.shared[key] = self.b.CreateString(s)
        return found

    # -- values --------------------------------------------------------------------------------

    def evalue(self, v: tuple) -> int:
        kind = v[0]
        match v:
            case ("Tensor", dtype, sizes, dim_order, data, alloc, dynamism):
                sizes_off = self.scalars("Int32", 4, sizes)
                order_off = self.scalars("Uint8", 1, dim_order)
                alloc_off = None
                if alloc is not None:
                    arena, offset = alloc
                    alloc_off = self.table(fbs.AllocationDetails.NUM, [
                        ("Uint32", fbs.AllocationDetails.memory_id, arena),
                        ("Uint32", fbs.AllocationDetails.memory_offset_low, offset & 0xFFFFFFFF),
                        ("Uint32", fbs.AllocationDetails.memory_offset_high, offset >> 32),
                    ])
                T = fbs.Tensor
                inner = self.table(T.NUM, [
                    ("Int8", T.scalar_type, dtype), ("off", T.sizes, sizes_off),
                    ("off", T.dim_order, order_off), ("Uint32", T.data_buffer_idx, data),
                    ("off", T.allocation_info, alloc_off), ("Int8", T.shape_dynamism, dynamism),
                ])
            case ("Int", x):
                inner = self.table(1, [("Int64", 0, x)])
            case ("Bool", x):
                inner = self.table(1, [("Bool", 0, bool(x))])
            case ("Double", x):
                inner = self.table(1, [("Float64", 0, float(x))])
            case ("String", x):
                inner = self.table(1, [("off", 0, self.string(x))])
            case ("Null",):
                inner = self.table(0, [])
            case ("IntList", items):
                inner = self.table(1, [("off", 0, self.scalars("Int64", 8, items))])
            case ("DoubleList", items):
                inner = self.table(1, [("off", 0, self.scalars("Float64", 8, items))])
            case ("BoolList", items):
                inner = self.table(1, [("off", 0, self.scalars("Bool", 1, items))])
            case ("TensorList", items) | ("OptionalTensorList", items):
                inner = self.table(1, [("off", 0, self.scalars("Int32", 4, items))])
        return self.table(fbs.EValue.NUM, [
            ("Uint8", fbs.EValue.val_type, fbs.KERNEL_TYPE_TAG[kind]),
            ("off", fbs.EValue.val, inner),
        ])

    def instruction(self, ins: tuple) -> int:
        match ins:
            case ("KernelCall", op, args):
                inner = self.table(2, [("Int32", 0, op), ("off", 1, self.scalars("Int32", 4, args))])
            case ("MoveCall", src, dst):
                inner = self.table(2, [("Int32", 0, src), ("Int32", 1, dst)])
            case ("JumpFalseCall", cond, dest):
                inner = self.table(2, [("Int32", 0, cond), ("Int32", 1, dest)])
            case ("FreeCall", value):
                inner = self.table(1, [("Int32", 0, value)])
        return self.table(fbs.Instruction.NUM, [
            ("Uint8", fbs.Instruction.instr_args_type, fbs.INSTRUCTION_TAG[ins[0]]),
            ("off", fbs.Instruction.instr_args, inner),
        ])

    def plan(self, m: _Method) -> int:
        name = self.string(m.name)
        meta = self.table(fbs.ContainerMetadata.NUM, [
            ("off", 0, self.string(m.in_spec)), ("off", 1, self.string(m.out_spec))])
        values = self.offsets([self.evalue(v) for v in m.values])
        inputs = self.scalars("Int32", 4, m.inputs)
        outputs = self.scalars("Int32", 4, m.outputs)
        instructions = self.offsets([self.instruction(i) for i in m.instructions])
        chain = self.table(fbs.Chain.NUM, [
            ("off", fbs.Chain.inputs, inputs), ("off", fbs.Chain.outputs, outputs),
            ("off", fbs.Chain.instructions, instructions),
        ])
        chains = self.offsets([chain])
        operators = self.offsets([
            self.table(fbs.Operator.NUM, [("off", 0, self.string(n)), ("off", 1, self.string(o))])
            for n, o in m.operators
        ])
        sizes = self.scalars("Int64", 8, m.buffer_sizes)
        E = fbs.ExecutionPlan
        return self.table(E.NUM, [
            ("off", E.name, name), ("off", E.container_meta_type, meta), ("off", E.values, values),
            ("off", E.inputs, inputs), ("off", E.outputs, outputs), ("off", E.chains, chains),
            ("off", E.operators, operators), ("off", E.delegates, self.offsets([])),
            ("off", E.non_const_buffer_sizes, sizes),
        ])

    def subsegment(self, index: int, offsets: Sequence[int]) -> int:
        return self.table(fbs.SubsegmentOffsets.NUM, [
            ("Uint32", 0, index), ("off", 1, self.scalars("Uint64", 8, offsets))])

    def program(self, methods: Sequence[_Method], segments: Sequence[tuple[int, int]],
                constant: tuple[int, list[int]], mutable: tuple[int, list[int]] | None) -> bytes:
        plans = self.offsets([self.plan(m) for m in methods])
        segs = self.offsets([
            self.table(fbs.DataSegment.NUM, [("Uint64", 0, off), ("Uint64", 1, size)])
            for off, size in segments
        ])
        const = self.subsegment(*constant)
        mut = self.offsets([self.subsegment(*mutable)]) if mutable else None
        P = fbs.Program
        root = self.table(P.NUM, [
            ("Uint32", P.version, fbs.PROGRAM_VERSION), ("off", P.execution_plan, plans),
            ("off", P.constant_buffer, self.offsets([])),
            ("off", P.backend_delegate_data, self.offsets([])), ("off", P.segments, segs),
            ("off", P.constant_segment, const), ("off", P.mutable_data_segments, mut),
        ])
        self.b.Finish(root, file_identifier=fbs.FILE_IDENTIFIER)
        return bytes(self.b.Output())


def _align(n: int, alignment: int) -> int:
    return n + (-n % alignment)


def write_pte(program: schema.Program) -> bytes:
    """The ``.pte`` bytes of ``program``: flatbuffer with the extended header inserted after
    its identifier, then one 128-byte aligned segment: the constant tensors, then (when methods
    keep state) the initial values of the mutable ones, each 16-byte aligned."""
    check_pte_coverage(program)
    constants = _Constants(program.constants)
    mutable: list[int] = []
    methods = [_MethodEncoder(select_kernels(m, program.constants), constants, mutable).encode()
               for m in program.methods]
    data, const_offsets = constants.layout(fbs.TENSOR_ALIGNMENT)
    mutable_ref = None
    if mutable:  # a subsegment of the same segment: no second segment alignment to pad to
        offsets = [0]
        for b in mutable:
            data += bytes(-len(data) % fbs.TENSOR_ALIGNMENT)
            offsets.append(len(data))
            data += bytes(program.constants[b].data)
        mutable_ref = (0, offsets)
    blobs = [bytes(data)]
    segments, pos = [], 0
    for blob in blobs:
        pos = _align(pos, fbs.SEGMENT_ALIGNMENT)
        segments.append((pos, len(blob)))
        pos += len(blob)
    flat = _Writer().program(methods, segments, (0, const_offsets), mutable_ref)
    program_size = len(flat) + fbs.HEADER_LENGTH
    base = _align(program_size, fbs.SEGMENT_ALIGNMENT)
    header = (fbs.HEADER_MAGIC + fbs.HEADER_LENGTH.to_bytes(4, "little")
              + program_size.to_bytes(8, "little") + base.to_bytes(8, "little")
              + pos.to_bytes(8, "little"))
    root = int.from_bytes(flat[:4], "little") + fbs.HEADER_LENGTH
    out = bytearray(root.to_bytes(4, "little") + flat[4:8] + header + flat[8:])
    for (offset, _), blob in zip(segments, blobs):
        out += bytes(base + offset - len(out))
        out += blob
    return bytes(out)
