"""Load-time validation of a :class:`schema.Program`: everything is checked before use.

:func:`validate_program` checks every index (values, operators, delegates, constants, debug
entries, jump targets), value kinds of instruction operands, tensor dtypes, sizes and dim orders,
storage (constant sizes, arena bounds, alignment) and the memory plan (no two simultaneously-live
planned tensors overlap). The first problem raises :class:`ProgramLoadError` naming the field.

Bounds (:class:`LoadLimits`) keep a hostile file from asking for unbounded memory; jumps go
forward, or back to close a loop (format 3) whose iterations a call bounds, so a method always
terminates. Imports only the standard library and the format.
"""

from __future__ import annotations

from dataclasses import dataclass

from exportir.format import planning, schema, work


class ProgramLoadError(ValueError):
    """A program file (or Program) is malformed. ``reason`` says what; ``field`` names the
    structure path (``methods[0].values[3].sizes``) and ``offset`` the byte offset, when known."""

    def __init__(self, reason: str, field: str | None = None, offset: int | None = None) -> None:
        self.reason = reason
        self.field = field
        self.offset = offset
        where = []
        if field:
            where.append(field)
        if offset is not None:
            where.append(f"offset {offset}")
        super().__init__(f"{', '.join(where)}: {reason}" if where else reason)


class ResourceLimitError(ProgramLoadError):
    """A program asks for more than a :class:`LoadLimits` bound allows. ``limit`` names the
    bound (``"max_arena_bytes"``); raise it with ``Program.load(..., limits=LoadLimits(...))``
    for a file you trust."""

    def __init__(self, reason: str, field: str | None, limit: str, offset: int | None = None
                 ) -> None:
        self.limit = limit
        super().__init__(f"{reason}; {_raise_hint(limit)}", field, offset)


def _raise_hint(limit: str) -> str:
    return (f"if you trust this file, load it with a larger limits=LoadLimits({limit}=...) "
            "(exportir.format.validate.LoadLimits)")


@dataclass(frozen=True, slots=True)
class LoadLimits:
    """Upper bounds a loaded program must respect, so that a small file cannot make the runtime
    allocate or compute without bound. Each is checked before the resource is used and a breach
    is a :class:`ResourceLimitError` naming the field. Defaults let any program exportir writes
    for a model that fits in memory load and run; lower them for files from untrusted sources.

    - ``max_tensor_bytes``: bytes of any one tensor's declared sizes (views included).
    - ``max_arena_bytes``: planned memory of one method (all its arenas; arenas are committed
      page by page as the method writes them).
    - ``max_rank``: dimensions of a tensor.
    - ``max_structure_bytes``: the structure section after decompression (checked while
      inflating, whatever the header claims).
    - ``max_structure_items``: JSON arrays, objects and items of the structure, counted before
      parsing (a parsed item costs ~50x its bytes).
    - ``max_dynamic_bytes``: bytes of runtime-allocated tensors (``DynamicStorage``: sizes the
      plan could not bound) live at once during one call; each such tensor's storage is capped
      before a kernel writes it, so a kernel asked for more fails before allocating.
    - ``max_work``: optional budget of one call's work, estimated at load from the planned sizes
      (dynamic sizes at their upper bounds): multiply-adds for contractions (``mm``, ``bmm``,
      convolution, attention), elements read and written otherwise. ``None``: no budget.
      A loop's instructions count once at load; each further iteration is counted while the
      call runs, and the call stops when the total passes the budget.
    - ``max_loop_iterations``: iterations of all loops (``map``, ``while_loop``; format 3)
      together in one call, so a call always terminates.
    """

    max_tensor_bytes: int = 1 << 36
    max_arena_bytes: int = 1 << 34
    max_rank: int = 64
    max_structure_bytes: int = 1 << 26
    max_structure_items: int = 1 << 22
    max_dynamic_bytes: int = 1 << 32
    max_work: int | None = None
    max_loop_iterations: int = 1 << 24


DEFAULT_LIMITS = LoadLimits()


_VIEW_BASE_STORAGE = (schema.ConstantData, schema.Allocation, schema.InputStorage)


def _bytes(n: int) -> str:
    """``68719476736 bytes (64.0 GiB)``: exact, and readable."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n} bytes ({n / (1 << shift):.1f} {unit})"
    return f"{n} bytes"


def _short_sizes(sizes: tuple[int, ...]) -> str:
    text = str(list(sizes))
    return text if len(text) <= 80 else text[:77] + "...]"


MAX_DEBUG_STRING = 4096
"""Longest string of a debug node (a name, an op, a ``file:line``, a module path)."""


def _fail(reason: str, field: str) -> ProgramLoadError:
    return ProgramLoadError(reason, field)


def _index(i: object, n: int, field: str, what: str) -> int:
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n:
        raise _fail(f"{what} index {i!r} out of range [0, {n})", field)
    return i


class _MethodChecker:
    def __init__(
        self, program: schema.Program, method: schema.Method, field: str, limits: LoadLimits
    ) -> None:
        self.program = program
        self.m = method
        self.f = field
        self.limits = limits
        self.n = len(method.values)

    def value(self, i: object, field: str, kinds: tuple[type, ...], what: str) -> int:
        i = _index(i, self.n, field, "value")
        if not isinstance(self.m.values[i], kinds):
            names = "/".join(k.__name__ for k in kinds)
            raise _fail(f"{what} must be {names}; value {i} is "
                        f"{type(self.m.values[i]).__name__}", field)
        return i

    # -- values ---------------------------------------------------------------------------------

    def tensor(self, t: schema.Tensor, field: str) -> None:
        if not isinstance(t.dtype, schema.ScalarType):
            raise _fail(f"unknown dtype {t.dtype!r}", f"{field}.dtype")
        if len(t.sizes) > self.limits.max_rank:
            raise _fail(f"rank {len(t.sizes)} exceeds {self.limits.max_rank}", f"{field}.sizes")
        nbytes = schema.ELEMENT_SIZE[t.dtype]
        for d, s in enumerate(t.sizes):
            if not isinstance(s, int) or isinstance(s, bool) or s < 0:
                raise _fail(f"size {s!r} is not a non-negative int", f"{field}.sizes[{d}]")
            nbytes *= s
            if nbytes > self.limits.max_tensor_bytes:
                raise ResourceLimitError(
                    f"tensor of sizes {_short_sizes(t.sizes)} exceeds "
                    f"{_bytes(self.limits.max_tensor_bytes)}", f"{field}.sizes",
                    "max_tensor_bytes")
        if sorted(t.dim_order) != list(range(len(t.sizes))):
            raise _fail(f"dim_order {t.dim_order} is not a permutation of "
                        f"0..{len(t.sizes) - 1}", f"{field}.dim_order")
        self.storage(t, nbytes, field)

    def constant_size(self, buffer: object, nbytes: int, field: str) -> None:
        b = _index(buffer, len(self.program.constants), field, "constant buffer")
        have = self.program.constants[b].nbytes
        if have != nbytes:
            raise _fail(f"constant buffer {b} holds {have} bytes; the tensor needs {nbytes}", field)

    def storage(self, t: schema.Tensor, nbytes: int, field: str) -> None:
        st = t.storage
        if t.initial is not None:
            if not isinstance(st, schema.Allocation):
                raise _fail("only planned tensors may have initial data", f"{field}.initial")
            self.constant_size(t.initial, nbytes, f"{field}.initial")
        match st:
            case schema.ConstantData(buffer=b):
                self.constant_size(b, nbytes, f"{field}.storage.buffer")
            case schema.Allocation(arena=arena, offset=offset, nbytes=size):
                arenas = self.m.plan.arenas
                _index(arena, len(arenas), f"{field}.storage.arena", "arena")
                if size != nbytes:
                    raise _fail(f"allocation of {size} bytes for a {nbytes}-byte tensor",
                                f"{field}.storage.nbytes")
                if offset < 0 or offset % self.m.plan.alignment:
                    raise _fail(f"offset {offset} is not a non-negative multiple of "
                                f"{self.m.plan.alignment}", f"{field}.storage.offset")
                if offset + size > arenas[arena]:
                    raise _fail(f"bytes [{offset}, {offset + size}) exceed arena {arena} "
                                f"({arenas[arena]} bytes)", f"{field}.storage")
            case schema.InputStorage() | schema.DynamicStorage() | schema.ViewOf():
                pass  # views are checked once every value is (their base may come later)
            case _:
                raise _fail(f"unknown storage {st!r}", f"{field}.storage")

    def values(self) -> None:
        tensor_kinds = (schema.Tensor,)
        for i, v in enumerate(self.m.values):
            field = f"{self.f}.values[{i}]"
            match v:
                case schema.Tensor():
                    self.tensor(v, field)
                case schema.IntList(items=items):
                    for k, item in enumerate(items):
                        self.value(item, f"{field}.items[{k}]", (schema.Int,), "IntList item")
                case schema.TensorList(items=items):
                    for k, item in enumerate(items):
                        self.value(item, f"{field}.items[{k}]", tensor_kinds, "TensorList item")
                case schema.OptionalTensorList(items=items):
                    for k, item in enumerate(items):
                        self.value(item, f"{field}.items[{k}]", (schema.Tensor, schema.Null),
                                   "OptionalTensorList item")
                case _ if isinstance(v, schema.EVALUE_TYPES):
                    pass
                case _:
                    raise _fail(f"unknown value kind {type(v).__name__}", field)
        for i, v in enumerate(self.m.values):
            if isinstance(v, schema.Tensor) and isinstance(v.storage, schema.ViewOf):
                self.view(v, v.storage, f"{self.f}.values[{i}]")

    def view(self, t: schema.Tensor, st: schema.ViewOf, field: str) -> None:
        """A view reads only its base's memory: the base is a static tensor that is not itself
        a view and has memory of its own (constant, planned, state, or an input when
        contiguous: no runtime-allocated storage); every element the view reaches lies inside
        the base. A view of state reads the state as it is when the view is read."""
        field = f"{field}.storage"
        b = _index(st.base, self.n, f"{field}.base", "value")
        base = self.m.values[b]
        if not isinstance(base, schema.Tensor):
            raise _fail(f"the base of a view must be a Tensor; value {b} is "
                        f"{type(base).__name__}", f"{field}.base")
        if not isinstance(base.storage, _VIEW_BASE_STORAGE):
            raise _fail(f"the base of a view must be a constant, planned or input tensor; value "
                        f"{b} has {type(base.storage).__name__} storage", f"{field}.base")
        if base.dynamic or t.dynamic:
            raise _fail(f"a view of value {b} and its base must be static", f"{field}.base")
        if isinstance(base.storage, schema.InputStorage) and base.dim_order != tuple(
            range(len(base.sizes))
        ):
            raise _fail(f"a view of input value {b} needs the input contiguous", f"{field}.base")
        if base.dtype != t.dtype:
            raise _fail(f"view dtype {t.dtype.name} differs from its base's {base.dtype.name}",
                        field)
        strides = st.strides
        if not isinstance(strides, tuple) or len(strides) != len(t.sizes):
            raise _fail(f"{len(strides)} strides for {len(t.sizes)} sizes", f"{field}.strides")
        for d, x in enumerate((st.offset, *strides)):
            if not isinstance(x, int) or isinstance(x, bool) or x < 0:
                raise _fail(f"{x!r} is not a non-negative int",
                            f"{field}.{'offset' if d == 0 else f'strides[{d - 1}]'}")
        last = st.offset + sum((s - 1) * x for s, x in zip(t.sizes, strides))
        if st.offset > base.numel or (t.numel and last >= base.numel):
            reach = f"reaches element {last}" if t.numel else f"starts at element {st.offset}"
            raise _fail(f"the view {reach} (offset {st.offset}, strides {strides}) of value "
                        f"{b}, which has {base.numel} elements", field)

    # -- signature, instructions, plan ----------------------------------------------------------

    def signature(self) -> None:
        for k, i in enumerate(self.m.inputs):
            field = f"{self.f}.inputs[{k}]"
            i = self.value(i, field, (schema.Tensor, schema.Int, schema.Double, schema.Bool,
                                      schema.String, schema.Null), "an input")
            v = self.m.values[i]
            if isinstance(v, schema.Tensor) and not isinstance(v.storage, schema.InputStorage):
                raise _fail("an input tensor must have InputStorage", field)
        for k, i in enumerate(self.m.outputs):
            _index(i, self.n, f"{self.f}.outputs[{k}]", "value")
        for k, op in enumerate(self.m.operators):
            if not op.name or "::" not in op.name:
                raise _fail(f"operator name {op.name!r} is not 'namespace::name'",
                            f"{self.f}.operators[{k}]")

    def input_sizes(self) -> None:
        """Symbolic input sizes (2.1): one entry per input, per dimension of a tensor input;
        symbols in range with ``min <= max``; a symbolic dimension only on a dynamic input,
        whose planned size holds the symbol's whole range (the plan is valid for every size
        a call may use)."""
        m, f = self.m, self.f
        if not m.symbols and not m.input_dims:
            return
        if len(m.input_dims) != len(m.inputs):
            raise _fail(f"{len(m.input_dims)} entries for {len(m.inputs)} inputs",
                        f"{f}.input_dims")
        for k, r in enumerate(m.symbols):
            if not r.name or r.min < 0 or (r.max is not None and r.max < r.min):
                raise _fail(f"symbol {r.name!r} has no name or an empty range [{r.min}, "
                            f"{r.max}]", f"{f}.symbols[{k}]")
        for k, (index, dims) in enumerate(zip(m.inputs, m.input_dims)):
            v = m.values[index]
            rank = len(v.sizes) if isinstance(v, schema.Tensor) else 0
            if len(dims) != rank:
                raise _fail(f"{len(dims)} dimensions for an input of rank {rank}",
                            f"{f}.input_dims[{k}]")
            for d, size in enumerate(dims):
                if size is not None:
                    self.input_dim(v, d, size, f"{f}.input_dims[{k}][{d}]")

    def input_dim(self, v: schema.Tensor, d: int, size: schema.DimSize, field: str) -> None:
        _index(size.symbol, len(self.m.symbols), field, "symbol")
        r = self.m.symbols[size.symbol]
        if size.coeff < 1 or size.coeff * r.min + size.offset < 0:
            raise _fail(f"size {size.coeff}*{r.name} + {size.offset} is negative or has a "
                        "coefficient below 1", field)
        if not v.dynamic:
            raise _fail("a symbolic dimension of a static input", field)
        if r.max is not None and size.coeff * r.max + size.offset > v.sizes[d]:
            raise _fail(f"{r.name} up to {r.max} makes dimension {d} "
                        f"{size.coeff * r.max + size.offset}, beyond its planned size "
                        f"{v.sizes[d]}", field)

    def instruction(self, pc: int, ins: schema.Instruction) -> None:
        field = f"{self.f}.instructions[{pc}]"
        if self.m.debug or ins.debug:
            _index(ins.debug, len(self.m.debug), f"{field}.debug", "debug entry")
        match ins:
            case schema.KernelCall(op_index=op, args=args):
                op = _index(op, len(self.m.operators), f"{field}.op_index", "operator")
                for k, a in enumerate(args):
                    _index(a, self.n, f"{field}.args[{k}]", "value")
                o = self.m.operators[op]
                arity = schema.PRIM_OPERATORS.get((o.name, o.overload))
                if arity is not None and len(args) != arity + 1:
                    raise _fail(f"{o} takes {arity} arguments and a result; got {len(args)}",
                                f"{field}.args")
            case schema.DelegateCall(delegate_index=d, args=args, outputs=outputs):
                _index(d, len(self.program.delegates), f"{field}.delegate_index", "delegate")
                for k, a in enumerate(args):
                    _index(a, self.n, f"{field}.args[{k}]", "value")
                for k, a in enumerate(outputs):
                    self.value(a, f"{field}.outputs[{k}]", (schema.Tensor,), "a delegate output")
            case schema.MoveCall(src=src, dst=dst):
                src = _index(src, self.n, f"{field}.src", "value")
                dst = _index(dst, self.n, f"{field}.dst", "value")
                if type(self.m.values[src]) is not type(self.m.values[dst]):
                    raise _fail("source and destination have different kinds", field)
            case schema.JumpFalseCall(cond_value=cond, dest=dest):
                self.value(cond, f"{field}.cond_value", (schema.Bool, schema.Tensor),
                           "a jump condition")
                self.jump(pc, dest, f"{field}.dest")
            case schema.FreeCall(value=v):
                v = self.value(v, f"{field}.value", (schema.Tensor,), "a freed value")
                if not isinstance(self.m.values[v].storage, schema.DynamicStorage):
                    raise _fail("only runtime-allocated tensors may be freed", field)
            case _:
                raise _fail(f"unknown instruction {type(ins).__name__}", field)

    def jump(self, pc: int, dest: object, field: str) -> None:
        """Jumps go forward, or (format 3) back to close a loop; a loop runs at most
        ``max_loop_iterations`` times per call, so every call terminates."""
        end = len(self.m.instructions)
        if not isinstance(dest, int) or isinstance(dest, bool):
            raise _fail(f"jump target {dest!r} is not an instruction index", field)
        if pc < dest <= end:
            return
        if self.program.version < schema.LOOP_FORMAT_VERSION:
            raise _fail(f"jump target {dest} must be forward, in ({pc}, {end}] (a jump back, a "
                        f"loop, needs format {schema.LOOP_FORMAT_VERSION})", field)
        if not 0 <= dest <= pc:
            raise _fail(f"jump target {dest} is outside [0, {end}]", field)

    def plan(self) -> None:
        p = self.m.plan
        field = f"{self.f}.plan"
        if not isinstance(p.alignment, int) or not 1 <= p.alignment <= 4096 or (
            p.alignment & (p.alignment - 1)
        ):
            raise _fail(f"alignment {p.alignment!r} is not a power of two <= 4096",
                        f"{field}.alignment")
        cap = self.limits.max_arena_bytes
        for k, size in enumerate(p.arenas):
            if not isinstance(size, int) or size < 0:
                raise _fail(f"arena size {size!r} is not a non-negative int",
                            f"{field}.arenas[{k}]")
            if size > cap:
                raise ResourceLimitError(
                    f"arena {k} of {_bytes(size)} exceeds max_arena_bytes ({_bytes(cap)})",
                    f"{field}.arenas[{k}]", "max_arena_bytes")
        total = sum(p.arenas)
        if total > cap:
            raise ResourceLimitError(
                f"the plan asks for {_bytes(total)} of arenas, more than max_arena_bytes "
                f"({_bytes(cap)})", f"{field}.arenas", "max_arena_bytes")
        if not isinstance(p.lower_bound, int) or p.lower_bound < 0:
            raise _fail(f"lower bound {p.lower_bound!r} is negative", f"{field}.lower_bound")

    def shared_state(self) -> None:
        """Shared state (2.2): each entry names a planned, static state tensor (one with
        ``initial`` data), once; names are not empty."""
        names: set[str] = set()
        taken: set[int] = set()
        for k, entry in enumerate(self.m.shared_state):
            field = f"{self.f}.shared_state[{k}]"
            if not entry.name or entry.name in names:
                raise _fail(f"shared state name {entry.name!r} is empty or repeated", field)
            i = self.value(entry.value, f"{field}.value", (schema.Tensor,), "shared state")
            v = self.m.values[i]
            if v.initial is None or v.dynamic or not isinstance(v.storage, schema.Allocation):
                raise _fail(f"value {i} is not a static planned state tensor (one with initial "
                            "data)", f"{field}.value")
            if i in taken:
                raise _fail(f"value {i} is shared under two names", f"{field}.value")
            names.add(entry.name)
            taken.add(i)

    def overlaps(self) -> None:
        """The plan is safe: no two simultaneously-live planned tensors share a byte."""
        allocations: dict[int, schema.Allocation] = {}
        state: list[int] = []
        for i, v in enumerate(self.m.values):
            if isinstance(v, schema.Tensor) and isinstance(v.storage, schema.Allocation):
                allocations[i] = v.storage
                if v.initial is not None:
                    state.append(i)
        if not allocations:
            return
        spans = planning.lifetimes(self.m.values, self.m.instructions, self.m.outputs, state)
        end = len(self.m.instructions)
        views = planning.view_bases(self.m.values)
        plan = planning.MemoryPlan(
            arenas=self.m.plan.arenas,
            allocations=allocations,
            lower_bound=self.m.plan.lower_bound,
            alignment=self.m.plan.alignment,
            lifetimes={i: spans.get(i, planning.Lifetime(end, end))
                       for i in (*allocations, *views) if i in allocations or i in spans},
            views=views,
        )
        try:
            planning.verify_plan(plan)
        except planning.PlanError as e:
            raise _fail(str(e), f"{self.f}.plan") from None

    def work(self) -> None:
        """A call's estimated work (:mod:`work`) within the optional ``max_work`` budget."""
        budget = self.limits.max_work
        if budget is None:
            return
        costs = work.method_work(self.m)
        total = sum(costs)
        if total <= budget:
            return
        pc = max(range(len(costs)), key=costs.__getitem__)
        ins = self.m.instructions[pc]
        what = (str(self.m.operators[ins.op_index]) if isinstance(ins, schema.KernelCall)
                else type(ins).__name__)
        raise ResourceLimitError(
            f"one call does about {total:.3g} element operations, more than max_work "
            f"({budget:.3g}); the costliest is instruction {pc} ({what}, {costs[pc]:.3g})",
            f"{self.f}.instructions[{pc}]", "max_work")

    def debug_nodes(self) -> None:
        """The optional debug node table (2.2): each entry's scope is the method's graph or a
        delegate of the program, names are non-empty and unique per scope, and every string is
        at most :data:`MAX_DEBUG_STRING` characters (a profile or a report prints them)."""
        seen: set[tuple[int, str]] = set()
        delegates = len(self.program.delegates)
        for i, node in enumerate(self.m.nodes):
            field = f"{self.f}.nodes[{i}]"
            if node.scope != schema.DEBUG_METHOD_SCOPE:
                _index(node.scope, delegates, f"{field}.scope", "delegate")
            if not node.name or (node.scope, node.name) in seen:
                raise _fail(f"node name {node.name!r} is empty or repeated in its scope",
                            f"{field}.name")
            seen.add((node.scope, node.name))
            for key in ("name", "target", "source", "module", "module_type"):
                if len(getattr(node, key)) > MAX_DEBUG_STRING:
                    raise _fail(f"{key} has {len(getattr(node, key))} characters, more than "
                                f"{MAX_DEBUG_STRING}", f"{field}.{key}")

    def check(self) -> None:
        self.plan()
        self.values()
        self.signature()
        self.input_sizes()
        self.debug_nodes()
        self.shared_state()
        if len(self.m.debug) > 0 or self.m.instructions:
            for pc, ins in enumerate(self.m.instructions):
                self.instruction(pc, ins)
        self.overlaps()
        self.work()


def validate_method(
    program: schema.Program, index: int, limits: LoadLimits = DEFAULT_LIMITS
) -> None:
    method = program.methods[index]
    _MethodChecker(program, method, f"methods[{index}]", limits).check()


def validate_program(program: schema.Program, limits: LoadLimits = DEFAULT_LIMITS) -> None:
    """Raise :class:`ProgramLoadError` at the first inconsistency of ``program``."""
    if program.version not in schema.READABLE_VERSIONS:
        raise _fail(f"format version {program.version!r} is not one of "
                    f"{schema.READABLE_VERSIONS} (this reader's versions)", "version")
    names: set[str] = set()
    for i, m in enumerate(program.methods):
        if not m.name or m.name in names:
            raise _fail(f"method name {m.name!r} is empty or repeated", f"methods[{i}].name")
        names.add(m.name)
    for i, d in enumerate(program.delegates):
        if not d.backend_id:
            raise _fail("empty backend id", f"delegates[{i}].backend_id")
    for i in range(len(program.methods)):
        validate_method(program, i, limits)
    _check_shared_state(program)


def _check_shared_state(program: schema.Program) -> None:
    """Every method naming a shared state tensor declares it with one dtype, sizes and layout."""
    first: dict[str, tuple[int, schema.Tensor]] = {}
    for i, m in enumerate(program.methods):
        for k, entry in enumerate(m.shared_state):
            t = m.values[entry.value]
            if not isinstance(t, schema.Tensor):  # validate_method refused it already
                continue
            seen = first.setdefault(entry.name, (i, t))
            other = seen[1]
            if (other.dtype, other.sizes, other.dim_order) != (t.dtype, t.sizes, t.dim_order):
                raise _fail(
                    f"shared state {entry.name!r} is {schema.TORCH_DTYPE_NAME[t.dtype]}"
                    f"{list(t.sizes)} here and {schema.TORCH_DTYPE_NAME[other.dtype]}"
                    f"{list(other.sizes)} in methods[{seen[0]}]: one shared tensor needs one "
                    "dtype, shape and layout",
                    f"methods[{i}].shared_state[{k}]")
