"""A method's execution state: its arenas, value frame and compiled steps (see
:mod:`exportir.runtime.method`, whose :class:`~exportir.runtime.method.Method` keeps a pool of
them, one per concurrent call).

A :class:`MethodState` is made once per concurrent call: it builds the value table (planned
tensors view the arenas it allocates, constants view the program's constant segment, views alias
their base), compiles every instruction into a checked step and, for kernels, a bare call, binds
and checks inputs, runs, and copies the outputs out.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from exportir.format import schema, work
from exportir.format.validate import ResourceLimitError
from exportir.runtime import memory, treespec
from exportir.runtime._steps import (
    _copy_call,
    _delegate_call,
    _delegate_results,
    _direct_call,
    _Fresh,
    _kernel_error,
    _kernel_step,
    _locked,
    _mentions,
    _Out,
    _store,
    _truth,
)
from exportir.runtime.errors import (
    FailureSite,
    LimitBreach,
    MethodInputError,
    MissingKernelError,
    ResourceLimitExceeded,
    RuntimeFailure,
    limit_hint,
)
from exportir.runtime.inputs import InputSizes, _check_tensor_input, _TensorInput
from exportir.runtime.kernels import Kernel, canonical_op_name, missing_kernel

if TYPE_CHECKING:
    from exportir.runtime.program import Program

Step = Callable[[list[Any]], int]

_LIST_KINDS = (schema.IntList, schema.TensorList, schema.OptionalTensorList)
_SCALAR_TYPES: dict[type, tuple[type, ...]] = {
    schema.Int: (int,),
    schema.Double: (float, int),
    schema.Bool: (bool,),
    schema.String: (str,),
}


class _MethodInfo:
    """What a method's file entry (``self.meta``) says, shared by :class:`Method` and its
    execution states."""

    __slots__ = ()
    meta: schema.Method

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.meta.input_names

    @property
    def num_instructions(self) -> int:
        return len(self.meta.instructions)

    @property
    def arena_bytes(self) -> tuple[int, ...]:
        return tuple(self.meta.plan.arenas)


class MethodState(_MethodInfo):
    """One execution state of a method: its planned arenas, value frame and compiled steps.

    Runs one call at a time; :class:`Method` keeps a pool of them so that threads calling one
    method never share a state.
    """

    __slots__ = (
        "_arenas",
        "_calls",
        "_direct",
        "_dynamic",
        "_dynamic_cap",
        "_flatten",
        "_frame",
        "_fresh_box",
        "_fresh_slots",
        "_in_spec",
        "_input_checks",
        "_input_sizes",
        "_input_views",
        "_lists",
        "_loop",
        "_mutated",
        "_out_spec",
        "_planned",
        "_program",
        "_readers",
        "_rebuild",
        "_regions",
        "_resets",
        "_shared_names",
        "_steps",
        "_straight",
        "_template",
        "_trusted",
        "_verified",
        "_write_back",
        "meta",
        "name",
    )

    def __init__(self, program: Program, meta: schema.Method) -> None:
        self.name = meta.name
        self.meta = meta
        self._program = program
        self._arenas = memory.allocate_arenas(meta.plan.arenas)
        self._planned: list[tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]] = []
        self._lists: dict[int, tuple[int, ...]] = {}
        self._input_views: list[tuple[int, int, schema.Tensor]] = []  # (view, input, meta)
        self._dynamic_cap = program.limits.max_dynamic_bytes
        self._mutated: set[int] = set()  # inputs the method writes (found while compiling)
        self._loop = [0, 0]  # this call's loop iterations and their work (format 3 loops)
        # (input value, the caller's tensor) to copy a mutation back into after this call
        self._write_back: list[tuple[int, torch.Tensor]] = []
        self._regions: dict[int, memory.Region] = {}  # DynamicStorage value -> its memory
        self._shared_names = {e.value: e.name for e in meta.shared_state}  # program-wide state
        self._template = self._build_values()
        # Values whose Python object changes from call to call: the inputs and their views,
        # and (added while compiling, in schedule order) scalar kernel results and scalar move
        # targets. Tensors are written in place and keep their object.
        self._dynamic: set[int] = set(meta.inputs) | {v for v, _, _ in self._input_views}
        # The values every call runs on (the template's objects; per-call slots reset after
        # each call). Trusted calls bind to it (see _run).
        self._frame = self._template.copy()
        self._trusted: dict[int, tuple[Callable[[], object], tuple[_Out, ...]]] = {}
        self._readers: collections.Counter[int] | None = None  # see _unread
        self._fresh_box: list[torch.Tensor | None] = []  # see _Fresh
        self._fresh_slots: dict[int, int] = {}  # output value -> its slot in _fresh_box
        self._direct = None  # see _direct_call: set while compiling a lone delegate call
        self._steps: list[Step] = [
            self._compile(pc, ins) for pc, ins in enumerate(meta.instructions)
        ]
        self._resets = tuple((i, self._template[i]) for i in sorted(self._dynamic))
        # No jumps: every step returns the next index, so the steps run as a plain loop.
        self._straight = not any(
            isinstance(ins, schema.JumpFalseCall) for ins in meta.instructions
        )
        self._calls = self._trusted_calls() if self._straight else None
        self._verified = False
        self._input_checks = tuple(
            _TensorInput(memory.torch_dtype(v.dtype), tuple(v.sizes), v.dynamic,
                         memory.is_contiguous_order(v.dim_order))
            if isinstance(v, schema.Tensor) else None
            for v in (meta.values[i] for i in meta.inputs)
        )
        self._input_sizes = InputSizes.of(
            meta, tuple(self._input_label(k) for k in range(len(meta.inputs)))
        )
        if self._direct is not None:  # (backend, handle, args, outs) of the lone delegate
            self._direct = _direct_call(self, *self._direct)
        self._in_spec = treespec.parse(meta.in_spec)
        self._out_spec = treespec.parse(meta.out_spec)
        self._flatten = treespec.flattener(self._in_spec) if self._in_spec is not None else None
        spec = self._out_spec
        rebuildable = spec is not None and spec.rebuildable
        self._rebuild = (
            treespec.rebuilder(spec)
            if rebuildable and spec.num_leaves == len(meta.outputs)
            else None
        )

    # -- public API ------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run with the model's own calling convention; returns outputs structured as the
        model returned them (a flat tuple when the program has no output spec)."""
        outputs = self.execute(self._flatten_inputs(args, kwargs))
        if self._rebuild is not None:
            return self._rebuild(outputs)
        return outputs

    def execute(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        """Run with the flat inputs (one per ``meta.inputs``); returns the flat outputs.

        Raises :class:`MethodInputError` for inputs that do not match the method and
        :class:`RuntimeFailure` when an instruction fails. Output tensors are copies.
        """
        if self._direct is not None and self._verified:  # a lone delegate (_direct_call)
            outputs = self._direct(inputs)
            if outputs is not None:
                return outputs
        values = self._frame
        for region in self._regions.values():  # runtime-allocated tensors start each call empty
            region.tensor.resize_(0)
        self._loop[0] = self._loop[1] = 0  # loop iterations and their work in this call
        try:
            self._bind_inputs(values, inputs)
            grad = torch.is_grad_enabled()
            _set_grad_enabled(False)  # no autograd: out= kernels refuse it, and it costs time
            try:
                trusted = self._verified
                self._run(values)
                for index, original in self._write_back:  # mutations of copied inputs
                    original.copy_(values[index])
                return self._outputs(values, trusted)
            finally:
                _set_grad_enabled(grad)
        finally:  # the frame keeps no input, view of one or scalar result past the call
            self._write_back.clear()
            for index, value in self._resets:
                values[index] = value

    def __repr__(self) -> str:
        return (
            f"MethodState({self.name!r}, inputs={len(self.meta.inputs)}, "
            f"outputs={len(self.meta.outputs)}, instructions={self.num_instructions}, "
            f"arenas={list(self.meta.plan.arenas)})"
        )

    # -- values ----------------------------------------------------------------------------------

    def _build_values(self) -> list[Any]:
        values: list[Any] = []
        for index, v in enumerate(self.meta.values):
            match v:
                case schema.Tensor():
                    values.append(self._tensor(index, v))
                case schema.Int(value=x) | schema.Double(value=x) | schema.Bool(value=x):
                    values.append(x)
                case schema.String(value=x):
                    values.append(x)
                case schema.Null():
                    values.append(None)
                case schema.DoubleList(values=xs) | schema.BoolList(values=xs):
                    values.append(list(xs))
                case schema.IntList(items=items) | schema.TensorList(items=items):
                    self._lists[index] = items
                    values.append(None)
                case schema.OptionalTensorList(items=items):
                    self._lists[index] = items
                    values.append(None)
                case _:
                    raise self._failure(None, f"value {index} has unknown kind {v!r}")
        for index, v in enumerate(self.meta.values):  # views, once every base exists
            if isinstance(v, schema.Tensor) and isinstance(v.storage, schema.ViewOf):
                base = v.storage.base
                if isinstance(self.meta.values[base].storage, schema.InputStorage):  # per call
                    self._input_views.append((index, base, v))
                else:
                    values[index] = memory.view_tensor(values[base], v)
        return values

    def _changing(self, index: int) -> bool:
        """Whether value ``index`` (or an item of the list it is) is rebound while running."""
        items = self._lists.get(index)
        if items is None:
            return index in self._dynamic
        return any(i in self._dynamic for i in items)

    def _fixed(self, index: int) -> Any:
        """The value ``index`` as it is on every call (lists built from their items)."""
        items = self._lists.get(index)
        if items is None:
            return self._template[index]
        return [self._template[i] for i in items]

    def _tensor(self, index: int, t: schema.Tensor) -> torch.Tensor | None:
        match t.storage:
            case schema.ConstantData(buffer=b):
                return self._program._constant(b, t)
            case schema.Allocation() if index in self._shared_names:
                view = self._program._shared_state(self._shared_names[index], t)
                self._planned.append((view, *memory.layout_of(t)))
                return view
            case schema.Allocation():
                view = memory.arena_view(self._arenas, t)
                self._planned.append((view, *memory.layout_of(t)))
                if t.initial is not None:  # mutable state starts from its constant
                    view.copy_(self._program._constant(t.initial, t))
                return view
            case schema.InputStorage() | schema.ViewOf():
                return None  # bound per call; views: built once their base is
            case schema.DynamicStorage():  # capped: see memory.Region
                try:
                    region = self._regions[index] = memory.Region(t, self._dynamic_cap)
                except MemoryError as e:
                    raise ResourceLimitError(
                        f"no memory for runtime-allocated value {index}: {e}",
                        f"methods[{self.meta.name!r}].values[{index}]", "max_dynamic_bytes",
                    ) from None
                return region.tensor
        raise self._failure(None, f"value {index} has unknown storage {t.storage!r}")

    def _resolve(self, values: list[Any], index: int) -> Any:
        items = self._lists.get(index)
        if items is None:
            return values[index]
        return [values[i] for i in items]

    def _tensor_meta(self, index: int) -> schema.Tensor | None:
        v = self.meta.values[index]
        return v if isinstance(v, schema.Tensor) else None

    # -- compilation: the one match over the instruction union ------------------------------------

    def _compile(self, pc: int, ins: schema.Instruction) -> Step:
        nxt = pc + 1
        match ins:
            case schema.KernelCall(op_index=op_index, args=args):
                return self._compile_kernel(pc, self.meta.operators[op_index], args)
            case schema.DelegateCall(delegate_index=d, args=args, outputs=outputs):
                return self._compile_delegate(pc, d, args, outputs)
            case schema.MoveCall(src=src, dst=dst):
                return self._compile_move(pc, src, dst)
            case schema.JumpFalseCall(cond_value=cond, dest=dest):
                if dest <= pc:
                    return self._compile_loop_jump(pc, cond, dest)
                return lambda values: nxt if _truth(values[cond]) else dest
            case schema.FreeCall(value=v):

                region = self._regions[v]

                def free(values: list[Any]) -> int:
                    region.release()  # empty, its pages given back; the tensor object stays
                    return nxt

                return free
        raise self._failure(pc, f"unknown instruction {type(ins).__name__}")

    def _compile_loop_jump(self, pc: int, cond: int, dest: int) -> Step:
        """The jump back closing a loop (format 3): counts the call's iterations against
        ``max_loop_iterations`` and, with a ``max_work`` budget, the work of each further
        iteration of the loop's body against it (its first counted at load)."""
        nxt = pc + 1
        limits = self._program.limits
        cap, budget = limits.max_loop_iterations, limits.max_work
        body = sum(work.method_work(self.meta)[dest:pc + 1]) if budget is not None else 0
        base = sum(work.method_work(self.meta)) if budget is not None else 0
        loop = self._loop

        def back(values: list[Any]) -> int:
            if _truth(values[cond]):
                return nxt
            loop[0] += 1
            if loop[0] > cap:
                raise LimitBreach(f"the call's loops ran more than max_loop_iterations ({cap}) "
                                  "iterations", "max_loop_iterations")
            if budget is not None:
                loop[1] += body
                if base + loop[1] > budget:
                    raise LimitBreach(f"the call's work passed max_work ({budget:.3g}) after "
                                      f"{loop[0]} loop iterations", "max_work")
            return dest

        return back

    def _compile_kernel(self, pc: int, op: schema.Operator, args: tuple[int, ...]) -> Step:
        name = canonical_op_name(op.name, op.overload)
        kernel = self._program.kernels.lookup(name)
        if kernel is None:  # Program.load checked every operator; kept for direct callers
            registry = self._program.kernels
            raise MissingKernelError(self._site(pc), *missing_kernel(name, registry))
        if len(args) != kernel.num_value_args:
            result = " and a result slot" if kernel.result_slot else ""
            raise self._failure(
                pc,
                f"{name} takes {kernel.arity} arguments{result}; the instruction passes "
                f"{len(args)} values",
            )
        operands = args[: kernel.arity]
        written = tuple(
            i for pos in kernel.writes for i in self._list_items_or_self(operands[pos])
        )
        emptied = {operands[pos] for pos in kernel.empties}
        planned = self._writes(pc, written)
        outs = tuple(replace(o, dynamic=True) if o.value in emptied else o for o in planned)
        result = args[-1] if kernel.result_slot else None
        result_out = self._writes(pc, (result,)) if result is not None else ()
        trusted = (
            result is None
            and not any(o.dynamic for o in planned)  # emptied outs stay empty once verified
            and all(self._static_shape(i) for i in operands)
        )
        fresh = self._fresh_output(kernel, operands) if trusted else None
        step, call, fresh_used = _kernel_step(
            self, pc, kernel, operands, outs, result, result_out, fresh
        )
        if trusted:
            self._trusted[pc] = (call, outs)
        if fresh is not None and fresh_used:
            self._fresh_slots[operands[kernel.writes[0]]] = fresh.slot
            self._fresh_box.append(None)
        if result is not None and not result_out:
            self._dynamic.add(result)  # after binding the step: it reads its own args first
        return step

    def _fresh_output(self, kernel: Kernel, operands: tuple[int, ...]) -> _Fresh | None:
        """Whether a trusted kernel may compute its one out as a new tensor each call, handed
        out as the method's output without a clone: the out is a planned, static tensor that
        nothing but the method's outputs reads, once."""
        if len(kernel.writes) != 1 or kernel.empties:
            return None
        index = operands[kernel.writes[0]]
        if not self._output_only(index) or not all(
            # the result's strides are the same on every call
            self._fixed_layout(j) for i in operands for j in self._lists.get(i, (i,))
        ):
            return None
        return _Fresh(self._fresh_box, len(self._fresh_box))

    def _output_only(self, index: int) -> bool:
        """Whether ``index`` is a planned, static tensor that only its writer and one method
        output name: a result that may be handed out directly instead of stored and cloned."""
        t = self._tensor_meta(index)
        return (
            t is not None
            and isinstance(t.storage, schema.Allocation)
            and not t.dynamic
            and t.initial is None
            and self.meta.outputs.count(index) == 1
            and self._unread(index, allowed=3)  # its writer, and one output (counted 2)
        )

    def _static_shape(self, index: int) -> bool:
        """Whether value ``index`` has the same shape (tensors) or value (anything else) on
        every call; for lists, every item."""
        for i in self._lists.get(index, (index,)):
            t = self._tensor_meta(i)
            if t is None:
                if i in self._dynamic:
                    return False
            elif t.dynamic or isinstance(t.storage, schema.DynamicStorage):
                return False
        return True

    def _unread(self, index: int, allowed: int = 1) -> bool:
        """Whether nothing reads value ``index`` (or the items of the list it is): it is no
        output, no view's base, and no instruction but its writer names it. (With ``allowed``
        3: or only as one output.)"""
        if self._readers is None:
            self._readers = _mentions(self.meta, self._lists)
        items = self._lists.get(index, (index,))
        return all(self._readers[i] <= allowed for i in items)

    def _sample(self, index: int) -> Any:
        """A stand-in for value ``index``, which changes between calls: of its kind (a meta
        tensor of its dtype and planned sizes and strides, a scalar of its type), never
        computed on."""
        items = self._lists.get(index)
        if items is not None:
            return [self._sample(i) if i in self._dynamic else self._template[i] for i in items]
        v = self.meta.values[index]
        if isinstance(v, schema.Tensor):
            sizes, strides = memory.layout_of(v)
            if isinstance(v.storage, schema.ViewOf):
                strides = v.storage.strides
            dtype = memory.torch_dtype(v.dtype)
            return torch.empty_strided(sizes, strides, dtype=dtype, device="meta")
        return _SCALAR_SAMPLES.get(type(v))

    def _fixed_layout(self, index: int) -> bool:
        """Whether tensor value ``index`` has the same strides on every call: not an input
        whose dim order lets the caller pass any strides (see _TensorInput)."""
        t = self._tensor_meta(index)
        if t is None or not isinstance(t.storage, schema.InputStorage):
            return True
        return memory.is_contiguous_order(t.dim_order)

    def _trusted_calls(self) -> list[Callable[[], object]]:
        """One no-argument call per instruction for the trusted loop: the bare kernel call
        where :meth:`_compile_kernel` found one, else the checked step on the frame."""
        return [
            self._trusted[pc][0] if pc in self._trusted else functools.partial(step, self._frame)
            for pc, step in enumerate(self._steps)
        ]

    def _compile_move(self, pc: int, src: int, dst: int) -> Step:
        nxt = pc + 1
        outs = self._writes(pc, (dst,))
        if outs:  # tensors: copy the contents (dst keeps its own memory)
            target = outs[0]

            def move_tensor(values: list[Any]) -> int:
                _store(target, values[src], values)
                return nxt

            tensor = self._tensor_meta(src) is not None
            if tensor and self._static_shape(src) and not target.dynamic:
                # same shapes on every call: a bare copy once verified
                copy = _copy_call(self._frame, src, self._changing(src), target)
                self._trusted[pc] = (copy, outs)
            return move_tensor
        self._dynamic.add(dst)

        def move(values: list[Any]) -> int:
            values[dst] = values[src]
            return nxt

        return move

    def _compile_delegate(
        self, pc: int, index: int, args: tuple[int, ...], outputs: tuple[int, ...]
    ) -> Step:
        backend, handle = self._program._delegate(index, self._site(pc))
        outs = self._writes(pc, outputs)
        nxt = pc + 1
        resolve = self._resolve
        # a backend that is not thread-safe runs one call at a time (results are copied out
        # of whatever buffer it reuses before the next call may start)
        lock = self._program._delegate_lock(index)

        def step(values: list[Any]) -> int:
            with lock:
                results = _delegate_results(
                    backend.execute(handle, [resolve(values, i) for i in args]), len(outs)
                )
                for out, got in zip(outs, results):
                    _store(out, got, values)
            return nxt

        # A backend promising new tensors on every call (``fresh_outputs``) hands a result
        # that is only a method output straight to the caller on trusted runs: no copy into
        # the arena, no clone out of it.
        direct = [
            getattr(backend, "fresh_outputs", False) and self._output_only(out.value)
            for out in outs
        ]
        if any(direct) and all(self._static_shape(i) for i in (*args, *outputs)):
            handed = [self._fresh_box_slot(out.value) if d else None for out, d in zip(outs, direct)]
            call = _delegate_call(backend, handle, args, outs, handed, self)
            self._trusted[pc] = (_locked(call, lock), outs)
            if len(self.meta.instructions) == 1 and all(direct) and isinstance(lock, contextlib.nullcontext):
                self._direct = (backend, handle, args, outs)
        return step

    def _fresh_box_slot(self, index: int) -> int:
        slot = self._fresh_slots[index] = len(self._fresh_box)
        self._fresh_box.append(None)
        return slot

    def _list_items_or_self(self, index: int) -> tuple[int, ...]:
        v = self.meta.values[index]
        if isinstance(v, _LIST_KINDS):
            return v.items
        return (index,)

    def _writes(self, pc: int, indices: Sequence[int]) -> tuple[_Out, ...]:
        """The tensors an instruction writes, checked writable (never a constant)."""
        outs = []
        for i in indices:
            t = self._tensor_meta(i)
            if t is None:
                continue
            if isinstance(t.storage, schema.ConstantData):
                raise self._failure(
                    pc, f"writes value {i}, a read-only constant (the program is malformed)"
                )
            if isinstance(t.storage, schema.ViewOf):
                raise self._failure(
                    pc, f"writes value {i}, a view of value {t.storage.base} (views are "
                    "read-only; the program is malformed)"
                )
            if isinstance(t.storage, schema.InputStorage):  # input mutation: the caller's tensor
                self._mutated.add(i)
                outs.append(_Out(i, None, t.sizes, t.dynamic, None))
                continue
            runtime = isinstance(t.storage, schema.DynamicStorage)
            capacity = self._regions[i].capacity if runtime else t.storage.nbytes
            dynamic = t.dynamic or runtime
            outs.append(_Out(i, self._template[i], t.sizes, dynamic, capacity, runtime))
        return tuple(outs)

    # -- running ---------------------------------------------------------------------------------

    def _run(self, values: list[Any]) -> None:
        """Run every instruction on ``values``.

        The first run of a straight-line method (no jumps), and the first run after a failure,
        runs the checked steps: each kernel's outputs are checked against the plan. Once a run
        succeeded, shapes are known to come out as planned wherever they cannot vary (static
        operand shapes, static outs), so later runs call those kernels bare, back to back.
        """
        if self._verified:
            self._run_trusted()
            return
        steps = self._steps
        if self._straight:
            pc = 0
            try:
                for pc, step in enumerate(steps):  # pc names a failing step
                    step(values)
            except RuntimeFailure:
                self._reset()
                raise
            except Exception as exc:
                raise self._failed(pc, exc) from exc
            self._verified = True
            return
        pc, end = 0, len(steps)
        while pc < end:
            try:
                pc = steps[pc](values)
            except RuntimeFailure:
                self._reset()
                raise
            except Exception as exc:
                raise self._failed(pc, exc) from exc

    def _run_trusted(self) -> None:
        pc = 0
        try:
            for pc, call in enumerate(self._calls):  # pc names a failing call
                call()
        except RuntimeFailure:
            self._reset()
            raise
        except Exception as exc:
            trusted = self._trusted.get(pc)
            error = exc if trusted is None else _kernel_error(exc, trusted[1])
            raise self._failed(pc, error) from exc

    def _failed(self, pc: int, exc: Exception) -> RuntimeFailure:
        """The :class:`RuntimeFailure` for ``exc``, raised by instruction ``pc``; resets."""
        self._reset()
        limit = getattr(exc, "limit", None)  # LimitBreach, or a backend's limit error
        if isinstance(exc, LimitBreach) or isinstance(limit, str):
            return ResourceLimitExceeded(self._site(pc), str(exc), limit_hint(limit),
                                         limit=limit)
        return self._failure(pc, f"{type(exc).__name__}: {exc}")

    def _reset(self) -> None:
        """After a failed run: planned layouts back, runtime-allocated tensors emptied, and the
        next run runs checked."""
        self._verified = False
        self._restore_layouts()
        for region in self._regions.values():
            region.attach()
        self._fresh_box[:] = [None] * len(self._fresh_box)

    def _check_dynamic(self) -> None:
        """Runtime-allocated tensors hold at most ``max_dynamic_bytes`` together."""
        total = sum(r.tensor.nbytes if r.attached() else r.tensor.untyped_storage().nbytes()
                    for r in self._regions.values())
        if total > self._dynamic_cap:
            raise LimitBreach(
                f"runtime-allocated tensors hold {total} bytes, more than max_dynamic_bytes "
                f"({self._dynamic_cap})", "max_dynamic_bytes")

    def _restore_layouts(self) -> None:
        """Give every planned tensor back its planned shape after a failed run (a kernel may
        have resized an out before failing), so the next call starts from the plan."""
        for tensor, sizes, strides in self._planned:
            if tensor.shape != sizes or tensor.stride() != strides:
                tensor.as_strided_(sizes, strides, 0)

    def _outputs(self, values: list[Any], trusted: bool) -> tuple[Any, ...]:
        """The method's outputs: tensors cloned (and those in lists), anything else as is;
        after a trusted run, the fresh tensors written for outputs (:class:`_Fresh`)."""
        lists, fresh, box = self._lists, self._fresh_slots if trusted else {}, self._fresh_box
        outputs = []
        for index in self.meta.outputs:
            if index in fresh:
                slot = fresh[index]
                outputs.append(box[slot])
                box[slot] = None
            elif index in lists:
                items = [values[i] for i in lists[index]]
                outputs.append([v.clone() if isinstance(v, torch.Tensor) else v for v in items])
            else:
                value = values[index]
                outputs.append(value.clone() if isinstance(value, torch.Tensor) else value)
        return tuple(outputs)

    # -- inputs ----------------------------------------------------------------------------------

    def _flatten_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Sequence[Any]:
        n = len(self.meta.inputs)
        if not kwargs and len(args) == n:
            return args
        if self._flatten is not None:
            flat = self._flatten((args, kwargs))
            if flat is not None:
                return flat
        if kwargs:
            raise MethodInputError(
                f"method {self.name!r}: cannot match keyword arguments {sorted(kwargs)} to its "
                f"inputs ({', '.join(self._input_label(k) for k in range(n))}); pass them "
                "positionally or use method.execute(flat_inputs)"
            )
        return args  # execute() reports the count mismatch

    def _input_label(self, k: int) -> str:
        names = self.meta.input_names
        return names[k] if k < len(names) and names[k] else f"input {k}"

    def _bind_inputs(self, values: list[Any], inputs: Sequence[Any]) -> None:
        expected = self.meta.inputs
        if len(inputs) != len(expected):
            labels = ", ".join(self._input_label(k) for k in range(len(expected)))
            raise MethodInputError(
                f"method {self.name!r} takes {len(expected)} input(s) ({labels}); "
                f"got {len(inputs)}"
            )
        for k, (index, given, check) in enumerate(zip(expected, inputs, self._input_checks)):
            if check is not None and check.accepts(given):
                values[index] = given  # the fast path: exactly what the method was built for
            else:
                bound = values[index] = self._check_input(k, self.meta.values[index], given)
                if index in self._mutated and not _same_memory(bound, given):
                    self._write_back.append((index, self._writable(k, given)))
        if self._input_sizes is not None:
            self._input_sizes.check(values, expected)
        for view, base, meta in self._input_views:  # inputs are contiguous when viewed
            values[view] = memory.view_tensor(values[base], meta)

    def _writable(self, k: int, given: torch.Tensor) -> torch.Tensor:
        """The caller's tensor an input mutation is copied back into after the call (the
        method ran on a contiguous copy); refused, as eager refuses the in-place write, when
        its elements overlap in memory."""
        if torch._debug_has_internal_overlap(given) == 1:
            raise MethodInputError(
                f"method {self.name!r}: input {k} ({self._input_label(k)}) is written by the "
                f"method (an in-place op on it in the model) but several of its elements share "
                f"memory (strides {tuple(given.stride())}, e.g. an expand); eager PyTorch refuses "
                "that in-place write too: pass a tensor that owns its elements (.clone())"
            )
        return given

    def _check_input(self, k: int, v: schema.EValue, given: Any) -> Any:
        label = f"method {self.name!r}: input {k} ({self._input_label(k)})"
        if isinstance(v, schema.Tensor):
            return _check_tensor_input(label, v, given)
        if isinstance(v, schema.Null):
            if given is not None:
                raise MethodInputError(f"{label} must be None; got {type(given).__name__}")
            return None
        allowed = _SCALAR_TYPES.get(type(v), ())
        if isinstance(given, torch.Tensor) and given.numel() == 1 and given.dim() == 0:
            given = given.item()
        if not isinstance(given, allowed) or (isinstance(given, bool) and bool not in allowed):
            want = type(v).__name__.lower()
            raise MethodInputError(f"{label} must be a {want}; got {given!r}")
        return float(given) if isinstance(v, schema.Double) else given

    # -- errors ----------------------------------------------------------------------------------

    def _site(self, pc: int | None) -> FailureSite:
        if pc is None:
            return FailureSite(self.name)
        ins = self.meta.instructions[pc]
        node = source = None
        debug = self.meta.debug
        if 0 <= ins.debug < len(debug):
            node = debug[ins.debug].node_name or None
            source = debug[ins.debug].source or None
        return FailureSite(self.name, pc, self._op_label(ins), node, source)

    def _op_label(self, ins: schema.Instruction) -> str:
        match ins:
            case schema.KernelCall(op_index=i) if 0 <= i < len(self.meta.operators):
                op = self.meta.operators[i]
                return canonical_op_name(op.name, op.overload)
            case schema.DelegateCall(delegate_index=d):
                return f"delegate {self._program._backend_id(d)}"
        return type(ins).__name__

    def _failure(self, pc: int | None, reason: str, hint: str = "") -> RuntimeFailure:
        return RuntimeFailure(self._site(pc), reason, hint)


def _same_memory(bound: Any, given: Any) -> bool:
    """Whether the value bound for a tensor input is the caller's tensor's memory as given."""
    return not isinstance(given, torch.Tensor) or (
        isinstance(bound, torch.Tensor)
        and bound.data_ptr() == given.data_ptr()
        and bound.stride() == given.stride()
    )


_SCALAR_SAMPLES: dict[type, Any] = {
    schema.Int: 0,
    schema.Double: 0.0,
    schema.Bool: False,
    schema.String: "",
}

_set_grad_enabled = torch._C._set_grad_enabled  # torch.set_grad_enabled, without its object
