"""Load-time typing of a program against the runtime's kernels: nothing runs before it passes.

``Program.load`` validates the file's structure (``exportir.format.validate``: indices, sizes,
storage, the memory plan), then :func:`check_program` types every method against the kernels
it would call:

- **operators**: each name is ``namespace::name`` with an overload, and the kernel registry has
  a kernel for it (the kernel table, a runtime primitive, or an op registered on purpose);
  otherwise :class:`MissingKernelError` naming the operator and the first instruction calling
  it;
- **operands**: each ``KernelCall`` passes one value per parameter of the kernel's schema, of
  a kind the parameter accepts (:mod:`exportir.runtime.operands`); enum codes (dtypes, memory
  formats, layouts) and device names are ones the runtime knows; a result slot has a kind the
  kernel's result fits;
- **writes**: nothing writes a constant or a view (the constants are the read-only mapped
  file): kernel outs, result slots, delegate outputs, move targets;
- **sizes set by arguments**: a kernel whose result size its arguments choose (``full``,
  ``view_copy``, ``repeat``, ... :mod:`exportir.runtime.shapes`) writes an out of exactly that
  size when the arguments are literal (a runtime-owned out: within the load limits);
- **moves and jumps**: a tensor move copies between tensors of one dtype and rank (and equal
  sizes when both are static); a tensor jump condition has one element;
- **inputs and specs**: every tensor with input storage is one of the method's inputs, and
  the input / output specs parse;
- **define before use** (:func:`defined_before_use`): along every path through the jumps (back
  jumps of loops included), no instruction reads a tensor of planned or runtime-owned memory before something wrote it,
  and every output is written by the end.

Every problem raises ``ProgramLoadError`` naming the field (``methods[0].instructions[3].args
[1]``).
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Iterable, Sequence

from exportir.format import schema
from exportir.format.validate import DEFAULT_LIMITS, LoadLimits, ProgramLoadError
from exportir.runtime import operands, shapes, treespec
from exportir.runtime.errors import FailureSite, MissingKernelError
from exportir.runtime.kernels import Kernel, KernelRegistry, canonical_op_name, missing_kernel

_IDENTIFIER = re.compile(r"(?!__)[A-Za-z_][A-Za-z0-9_]{0,255}\Z")
_OVERLOAD = re.compile(
    r"((?!__)[A-Za-z_][A-Za-z0-9_]{0,255})?(?:" + re.escape(schema.FUNCTIONAL_FALLBACK) + r")?\Z"
)
_READ_ONLY = (schema.ConstantData, schema.ViewOf)


def check_program(
    program: schema.Program, kernels: KernelRegistry, limits: LoadLimits = DEFAULT_LIMITS
) -> None:
    """Type every method of ``program`` (already structurally valid) against ``kernels``."""
    for index, method in enumerate(program.methods):
        _MethodTyping(method, index, kernels, limits).check()


class _MethodTyping:
    def __init__(
        self, method: schema.Method, index: int, kernels: KernelRegistry, limits: LoadLimits
    ) -> None:
        self.m = method
        self.f = f"methods[{index}]"
        self.registry = kernels
        self.limits = limits
        self.values = method.values
        self.rebound: set[int] = set()  # values an instruction (or the caller) binds at run time

    def check(self) -> None:
        kernels = self.operators()
        self.rebound = _scalar_targets(self.m, kernels) | set(self.m.inputs)
        self.signature()
        for pc, ins in enumerate(self.m.instructions):
            self.instruction(pc, ins, kernels)
        defined_before_use(self.m, kernels, self.f, self.rebound)

    # -- operators ------------------------------------------------------------------------------

    def operators(self) -> list[Kernel]:
        kernels = []
        for k, op in enumerate(self.m.operators):
            field = f"{self.f}.operators[{k}]"
            namespace, sep, name = op.name.partition("::")
            if not (sep and _IDENTIFIER.match(namespace) and _IDENTIFIER.match(name)
                    and _OVERLOAD.match(op.overload)):
                raise ProgramLoadError(
                    f"operator {str(op)!r:.120} is not 'namespace::name' with an overload "
                    "(identifiers, none starting with '__')", field)
            canonical = canonical_op_name(op.name, op.overload)
            kernel = self.registry.lookup(canonical)
            if kernel is None:
                raise MissingKernelError(self.site(k, canonical),
                                         *missing_kernel(canonical, self.registry), field=field)
            kernels.append(kernel)
        return kernels

    def site(self, op_index: int, name: str) -> FailureSite:
        """The first instruction calling operator ``op_index`` (or none)."""
        for pc, ins in enumerate(self.m.instructions):
            if isinstance(ins, schema.KernelCall) and ins.op_index == op_index:
                entry = self.m.debug[ins.debug] if 0 <= ins.debug < len(self.m.debug) else None
                return FailureSite(self.m.name, pc, name, entry.node_name if entry else None,
                                   entry.source if entry else None)
        return FailureSite(self.m.name, None, name)

    # -- signature ------------------------------------------------------------------------------

    def signature(self) -> None:
        listed = set(self.m.inputs)
        for i, v in enumerate(self.values):
            if isinstance(v, schema.Tensor) and isinstance(v.storage, schema.InputStorage) and (
                i not in listed
            ):
                raise ProgramLoadError(
                    f"value {i} has input storage but is not one of the method's inputs "
                    f"{list(self.m.inputs)[:16]}", f"{self.f}.values[{i}].storage")
        for field in ("in_spec", "out_spec"):
            try:
                treespec.parse(getattr(self.m, field))
            except treespec.TreeSpecError as e:
                raise ProgramLoadError(f"malformed pytree spec: {e}", f"{self.f}.{field}") from None

    # -- instructions ---------------------------------------------------------------------------

    def instruction(self, pc: int, ins: schema.Instruction, kernels: Sequence[Kernel]) -> None:
        field = f"{self.f}.instructions[{pc}]"
        match ins:
            case schema.KernelCall(op_index=op, args=args):
                self.kernel_call(kernels[op], args, field)
            case schema.DelegateCall(outputs=outputs):
                for k, out in enumerate(outputs):
                    self.writable(out, f"{field}.outputs[{k}]", "a delegate output")
            case schema.MoveCall(src=src, dst=dst):
                self.move(src, dst, field)
            case schema.JumpFalseCall(cond_value=cond):
                t = self.values[cond]
                if isinstance(t, schema.Tensor) and not t.dynamic and t.numel != 1:
                    raise ProgramLoadError(f"a jump condition tensor must have one element; "
                                           f"value {cond} has {t.numel}", f"{field}.cond_value")

    def kernel_call(self, kernel: Kernel, args: tuple[int, ...], field: str) -> None:
        if len(args) != kernel.num_value_args:
            result = " and a result slot" if kernel.result_slot else ""
            raise ProgramLoadError(
                f"{kernel.name} takes {kernel.arity} arguments{result}; the instruction passes "
                f"{len(args)} values", f"{field}.args")
        params = kernel.params
        if params is not None:
            for p, param in enumerate(params):
                self.operand(kernel, param, args[p], f"{field}.args[{p}]")
            self.sized_by_arguments(kernel, args, field)
        for p in kernel.writes:
            for i in self.items(args[p]):
                self.writable(i, f"{field}.args[{p}]", f"argument {p} of {kernel.name}")
        if kernel.result_slot:
            result = args[-1]
            kind = type(self.values[result])
            if kind not in kernel.result_kinds:
                names = "/".join(sorted(k.__name__ for k in kernel.result_kinds))
                raise ProgramLoadError(f"the result of {kernel.name} must go to a {names} "
                                       f"value; value {result} is {kind.__name__}",
                                       f"{field}.args[{len(args) - 1}]")
            if kind is schema.Tensor:
                self.writable(result, f"{field}.args[{len(args) - 1}]", "a result")

    def operand(self, kernel: Kernel, param: operands.Param, index: int, field: str) -> None:
        v = self.values[index]
        if type(v) not in param.kinds:
            raise ProgramLoadError(
                f"argument {param.name!r} of {kernel.name} takes "
                f"{'/'.join(sorted(k.__name__ for k in param.kinds))}; value {index} is "
                f"{type(v).__name__}", field)
        if param.code and isinstance(v, schema.Int) and v.value not in operands.CODES[param.code]:
            raise ProgramLoadError(f"argument {param.name!r} of {kernel.name}: {v.value} is not "
                                   f"a {param.code} code", field)
        if param.device and isinstance(v, schema.String) and v.value not in operands.DEVICES:
            raise ProgramLoadError(f"argument {param.name!r} of {kernel.name}: device "
                                   f"{v.value!r:.40} is not one of {sorted(operands.DEVICES)}",
                                   field)

    def sized_by_arguments(self, kernel: Kernel, args: tuple[int, ...], field: str) -> None:
        """The out of a kernel whose result size its arguments set (:mod:`shapes`) has that
        size, when the arguments are known at load."""
        entry = shapes.RULES.get(kernel.name)
        if entry is None:
            return
        rule, at = entry
        try:
            shape = rule([self.literal(i) for i in args[: kernel.arity]])
        except shapes.ShapeError as e:
            raise ProgramLoadError(f"{kernel.name}: {e}", f"{field}.args") from None
        if shape is not None:
            self.holds(args[at], shape, kernel.name, f"{field}.args[{at}]")

    def literal(self, index: int) -> object:
        """Value ``index`` as a shape rule sees it (:data:`shapes.UNKNOWN` if set at run time)."""
        v = self.values[index]
        match v:
            case schema.Tensor(storage=storage, dynamic=False) if not isinstance(
                storage, schema.DynamicStorage
            ):
                return shapes.Sizes(v.sizes)
            case schema.Int(value=x) | schema.Double(value=x) | schema.Bool(value=x):
                return shapes.UNKNOWN if index in self.rebound else x
            case schema.IntList(items=items):
                got = [self.literal(i) for i in items]
                return shapes.UNKNOWN if shapes.UNKNOWN in got else got
            case schema.Null():
                return None
        return shapes.UNKNOWN

    def holds(self, index: int, shape: tuple[int, ...], name: str, field: str) -> None:
        """Tensor ``index`` can take a result of ``shape``: exactly its sizes when static, within
        its upper bounds when dynamic, within the load limits when runtime-owned."""
        t = self.values[index]
        if not isinstance(t, schema.Tensor):
            return
        if isinstance(t.storage, schema.DynamicStorage):
            nbytes = math.prod(shape) * schema.ELEMENT_SIZE[t.dtype]
            if nbytes > self.limits.max_tensor_bytes:
                raise ProgramLoadError(f"{name} makes a tensor of sizes {list(shape)} ({nbytes} "
                                       f"bytes), beyond the limit of "
                                       f"{self.limits.max_tensor_bytes} bytes", field)
            return
        fits = len(shape) == len(t.sizes) and (
            all(s <= b for s, b in zip(shape, t.sizes)) if t.dynamic else shape == t.sizes
        )
        if not fits:
            bound = "upper bounds " if t.dynamic else ""
            raise ProgramLoadError(f"{name} makes a tensor of sizes {list(shape)}; value {index} "
                                   f"is planned with {bound}{list(t.sizes)}", field)

    def items(self, index: int) -> tuple[int, ...]:
        v = self.values[index]
        if isinstance(v, (schema.TensorList, schema.OptionalTensorList)):
            return tuple(i for i in v.items if isinstance(self.values[i], schema.Tensor))
        return (index,)

    def writable(self, index: int, field: str, what: str) -> None:
        t = self.values[index]
        if not isinstance(t, schema.Tensor):
            raise ProgramLoadError(f"{what} must be a Tensor; value {index} is "
                                   f"{type(t).__name__}", field)
        if isinstance(t.storage, _READ_ONLY):
            kind = "a constant" if isinstance(t.storage, schema.ConstantData) else "a view"
            raise ProgramLoadError(f"{what} writes value {index}, {kind} (read-only)", field)

    def move(self, src: int, dst: int, field: str) -> None:
        a, b = self.values[src], self.values[dst]
        if not isinstance(b, schema.Tensor):
            return
        self.writable(dst, f"{field}.dst", "a move")
        if not isinstance(a, schema.Tensor):  # validate checked the kinds are equal
            return
        same_sizes = a.dynamic or b.dynamic or a.sizes == b.sizes
        if a.dtype != b.dtype or len(a.sizes) != len(b.sizes) or not same_sizes:
            raise ProgramLoadError(
                f"a move copies value {src} ({a.dtype.name}{list(a.sizes)}) into value {dst} "
                f"({b.dtype.name}{list(b.sizes)}): dtypes, ranks and static sizes must match",
                field)


# ------------------------------------------------------------------------------ dataflow


def _initially_defined(method: schema.Method) -> set[int]:
    """Tensors holding data before the first instruction: inputs, constants, state."""
    defined = set()
    for i, v in enumerate(method.values):
        if isinstance(v, schema.Tensor) and (
            isinstance(v.storage, (schema.InputStorage, schema.ConstantData))
            or v.initial is not None
        ):
            defined.add(i)
    return defined


class _Flow:
    """Reads and writes of tensor values (views read their base; lists their items)."""

    def __init__(self, method: schema.Method) -> None:
        self.values = method.values
        # per value: the tensors a mention of it reads or writes
        self.resolved: list[tuple[int, ...]] = [self._resolve(i) for i in range(len(self.values))]
        self.positions: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def _resolve(self, i: int) -> tuple[int, ...]:
        v = self.values[i]
        if isinstance(v, schema.Tensor):
            return (v.storage.base if isinstance(v.storage, schema.ViewOf) else i,)
        if isinstance(v, (schema.TensorList, schema.OptionalTensorList)):
            return tuple(j for k in v.items if isinstance(self.values[k], schema.Tensor)
                         for j in self._resolve(k))
        return ()

    def tensors(self, indices: Iterable[int]) -> list[int]:
        resolved = self.resolved
        return [t for i in indices for t in resolved[i]]

    def _positions(self, kernel: Kernel) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(positions read, positions written) of ``kernel``'s arguments."""
        found = self.positions.get(kernel.name)
        if found is None:
            params = kernel.params
            outs = {p for p, q in enumerate(params) if q.out} if params else set(kernel.writes)
            reads = tuple(p for p in range(kernel.arity) if p not in outs)
            found = self.positions[kernel.name] = (reads, tuple(sorted(outs | set(kernel.writes))))
        return found

    def kernel(self, kernel: Kernel, args: tuple[int, ...]) -> tuple[list[int], list[int]]:
        read_at, write_at = self._positions(kernel)
        reads = self.tensors(args[p] for p in read_at)
        writes = self.tensors(args[p] for p in write_at)
        if kernel.result_slot:
            writes += self.resolved[args[-1]]
        return reads, writes


def _unconditional(method: schema.Method, cond: int, written: set[int]) -> bool:
    """Whether a jump on ``cond`` always jumps: a literal ``Bool(False)`` nothing writes."""
    v = method.values[cond]
    return isinstance(v, schema.Bool) and not v.value and cond not in written and (
        cond not in method.inputs
    )


def _scalar_targets(method: schema.Method, kernels: Sequence[Kernel]) -> set[int]:
    """Values instructions (re)bind at run time: result slots and move targets."""
    out = set()
    for ins in method.instructions:
        if isinstance(ins, schema.KernelCall) and kernels[ins.op_index].result_slot:
            out.add(ins.args[-1])
        elif isinstance(ins, schema.MoveCall):
            out.add(ins.dst)
    return out


def _effects(
    flow: _Flow, ins: schema.Instruction, kernels: Sequence[Kernel]
) -> tuple[list[int], list[int], list[int]]:
    """(reads, writes, frees) of tensor values by one instruction."""
    match ins:
        case schema.KernelCall(op_index=op, args=args):
            reads, writes = flow.kernel(kernels[op], args)
            return reads, writes, []
        case schema.DelegateCall(args=args, outputs=outputs):
            return flow.tensors(args), flow.tensors(outputs), []
        case schema.MoveCall(src=src, dst=dst):
            return flow.tensors((src,)), flow.tensors((dst,)), []
        case schema.JumpFalseCall(cond_value=cond):
            return flow.tensors((cond,)), [], []
        case schema.FreeCall(value=v):
            return [], [], [v]
    return [], [], []


def _leaders(method: schema.Method) -> list[int]:
    """First instructions of the basic blocks: 0, every jump target, every instruction after a
    jump (and the end, ``len(instructions)``)."""
    n = len(method.instructions)
    leaders = {0, n}
    for pc, ins in enumerate(method.instructions):
        if isinstance(ins, schema.JumpFalseCall):
            leaders.update((ins.dest, pc + 1))
    return sorted(x for x in leaders if 0 <= x <= n)


def defined_before_use(
    method: schema.Method, kernels: Sequence[Kernel], f: str, written: set[int] | None = None
) -> None:
    """Raise ``ProgramLoadError`` if some path through the method reads a tensor of planned or
    runtime-owned memory before an instruction wrote it, or ends without writing an output.

    A must-be-defined dataflow over basic blocks: the tensors defined on entry to a block are
    those defined on every path reaching it (the fall-through and each jump to it, forward or
    back). Blocks are revisited, lowest first, until the entry sets stop shrinking; without a
    jump back that is one pass."""
    flow = _Flow(method)
    if written is None:
        written = _scalar_targets(method, kernels)
    n = len(method.instructions)
    leaders = _leaders(method)
    block_end = dict(zip(leaders, [*leaders[1:], n]))
    entry: dict[int, set[int]] = {0: _initially_defined(method)}
    work = [0]
    while work:
        start = heapq.heappop(work)
        if start == n:
            continue
        defined = set(entry[start])
        for target, out in _run_block(method, flow, kernels, start, block_end[start], defined,
                                      written, f):
            joined = out if target not in entry else entry[target] & out
            if target not in entry or joined != entry[target]:
                entry[target] = joined if target in entry else set(out)
                if target not in work:
                    heapq.heappush(work, target)
    end = entry.get(n)
    if end is None:
        return
    for k, output in enumerate(method.outputs):
        for i in flow.tensors((output,)):
            if i not in end:
                raise ProgramLoadError(f"output value {output} is not written on every path "
                                       "through the method", f"{f}.outputs[{k}]")


def _run_block(method: schema.Method, flow: _Flow, kernels: Sequence[Kernel], start: int,
               stop: int, defined: set[int], written: set[int], f: str
               ) -> list[tuple[int, set[int]]]:
    """Check the reads of instructions ``start..stop-1`` (``defined``: on entry, updated in
    place); the successors with what is defined on the way to each."""
    for pc in range(start, stop):
        ins = method.instructions[pc]
        reads, writes, frees = _effects(flow, ins, kernels)
        for i in reads:
            if i not in defined:
                raise ProgramLoadError(
                    f"reads value {i} before any instruction wrote it (on some path through "
                    "the method): its memory holds whatever an earlier call left there",
                    f"{f}.instructions[{pc}]")
        defined.update(writes)
        defined.difference_update(frees)
        if isinstance(ins, schema.JumpFalseCall):
            if _unconditional(method, ins.cond_value, written):
                return [(ins.dest, defined)]
            return [(ins.dest, set(defined)), (pc + 1, defined)]
    return [(stop, defined)]


