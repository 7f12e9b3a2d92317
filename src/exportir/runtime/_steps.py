"""The compiled steps of a method: how one instruction runs, checked or bare.

:class:`~exportir.runtime._state.MethodState` compiles each instruction into a checked *step*
(``step(values) -> next index``) and, where shapes cannot vary, a bare call; the helpers that
build them live here: kernel steps (:func:`kernel_step`), delegate calls, fresh outputs, moves
and the checks of a kernel's outputs against the plan (:func:`store`, :func:`check_capacity`).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from exportir.format import schema
from exportir.runtime.errors import LimitBreach, RuntimeFailure
from exportir.runtime.kernels import Kernel

if TYPE_CHECKING:
    from exportir.runtime._state import MethodState

Step = Callable[[list[Any]], int]


@dataclass(frozen=True, slots=True)
class _Out:
    """A tensor an instruction writes: where it lives and what shape it must end with."""

    value: int
    tensor: torch.Tensor | None  # None: a caller's input, bound per call (input mutation)
    sizes: tuple[int, ...]
    dynamic: bool  # sizes are an upper bound (or unbounded runtime storage)
    capacity: int | None  # bytes available (arena, or max_dynamic_bytes); None: an input
    runtime: bool = False  # runtime-allocated (DynamicStorage): capped by max_dynamic_bytes



def _truth(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"jump condition is a tensor of {value.numel()} elements")
        return bool(value.item())
    return bool(value)


def _store(out: _Out, value: Any, values: list[Any]) -> None:
    """Copy ``value`` into the tensor ``out`` describes (its planned or owned memory)."""
    dst = out.tensor if out.tensor is not None else values[out.value]
    if not isinstance(value, torch.Tensor):
        dst.fill_(value)
        return
    if dst.shape != value.shape:
        if not out.dynamic:
            raise ValueError(
                f"result of shape {tuple(value.shape)} does not fit value {out.value} "
                f"(planned shape {out.sizes})"
            )
        dst.resize_(0)
        try:
            dst.resize_(value.shape)
        except RuntimeError as exc:
            raise _kernel_error(exc, (out,)) from exc
        _check_capacity(out, dst)
    dst.copy_(value)


def _check_capacity(out: _Out, tensor: torch.Tensor) -> None:
    if out.capacity is None:
        return
    used = tensor.numel() * tensor.element_size()
    if used > out.capacity:
        if out.runtime:
            raise _dynamic_breach((out,))
        raise ValueError(
            f"value {out.value} grew to shape {tuple(tensor.shape)} ({used} bytes), beyond "
            f"its planned upper bound {out.sizes} ({out.capacity} bytes); {_BOUND_HINT}"
        )


_BOUND_HINT = (
    "call with inputs within the sizes the method was exported for, or export with a larger "
    "max in dynamic_shapes"
)


def _dynamic_breach(outs: Sequence[_Out]) -> LimitBreach:
    values = ", ".join(str(o.value) for o in outs if o.runtime)
    cap = next(o.capacity for o in outs if o.runtime)
    return LimitBreach(
        f"a runtime-allocated result (value {values}) needs more than max_dynamic_bytes "
        f"({cap} bytes); nothing was allocated", "max_dynamic_bytes")


def _overflow(outs: Sequence[_Out]) -> ValueError:
    planned = ", ".join(f"value {o.value} {o.sizes}" for o in outs)
    return ValueError(
        f"a result needs more memory than the plan gives it (planned: {planned}); {_BOUND_HINT}"
    )


def _copy_call(
    frame: list[Any], src: int, changing: bool, target: _Out
) -> Callable[[], object]:
    """``target``'s tensor ``copy_`` from value ``src`` (each read from ``frame`` per call
    when it changes between calls: ``changing``, or a caller's input as the target)."""
    source = frame[src]
    if target.tensor is None:
        dst = target.value
        if changing:
            return lambda: frame[dst].copy_(frame[src])
        return lambda: frame[dst].copy_(source)
    if changing:
        copy = target.tensor.copy_
        return lambda: copy(frame[src])
    return functools.partial(target.tensor.copy_, source)


def _kernel_error(exc: Exception, outs: Sequence[_Out]) -> Exception:
    """A kernel's exception as the runtime reports it (planned tensors have fixed-size storage:
    "not resizable" means a result outgrew its plan)."""
    if isinstance(exc, RuntimeError) and "not resizable" in str(exc):
        error = _dynamic_breach(outs) if any(o.runtime for o in outs) else _overflow(outs)
        error.__cause__ = exc
        return error
    return exc


def _kernel_step(
    method: MethodState,
    pc: int,
    kernel: Kernel,
    operands: tuple[int, ...],
    outs: tuple[_Out, ...],
    result: int | None,
    result_out: tuple[_Out, ...],
    fresh: _Fresh | None = None,
) -> tuple[Step, Callable[[], object], bool]:
    """The checked step running one kernel, the bare call for the trusted loop, and whether
    that call writes a fresh tensor (``fresh``) instead of the planned out.

    The kernel is bound once (:meth:`Kernel.bind`) to every argument that never changes; the
    ones that do (inputs, their views, scalar results) are passed per call. The step resets
    dynamic outputs to zero elements (ATen then resizes them without a warning), calls, checks
    that every output has the shape the plan gave it and stayed within its planned bytes, and
    stores a returned value. The bare call only calls (on the method's frame).
    """
    nxt = pc + 1
    converters = dict(kernel.converters)
    args = [method._fixed(i) for i in operands]
    for p, convert in converters.items():
        if p < len(args):
            args[p] = convert(args[p])
    changing = [p for p, i in enumerate(operands) if method._changing(i)]
    for p in changing:  # what the calls will pass, for the binder to pick its entry
        args[p] = method._sample(operands[p])
    unread = [p for p in kernel.writes if method._unread(operands[p])]
    bound = kernel.bind(args, changing, unread)
    invoke = _invoker(method, bound, operands, changing, converters)
    reads = tuple(operands[p] for p in changing)  # plain values, when invoke is None
    call = _frame_call(bound, method._frame, reads) if invoke is None else functools.partial(
        invoke, method._frame
    )
    runner = kernel.bind_functional(args, changing) if fresh and not invoke else None
    if runner is not None:
        call = _fresh_call(runner, method._frame, reads, fresh)
    # outputs that are caller inputs (tensor None) are the caller's business: not checked
    dynamic_outs = tuple(o for o in outs if o.dynamic and o.tensor is not None)
    # a dynamic out the kernel also reads (index_copy.out(self=o, out=o), a loop's output
    # filled row by row) is updated in place: not emptied first
    read = {operands[p] for p in range(len(operands)) if p not in kernel.writes}
    emptied = tuple(o for o in dynamic_outs if o.value not in read)
    static_outs = tuple(
        (o.tensor, torch.Size(o.sizes), o) for o in outs if not o.dynamic and o.tensor is not None
    )

    regions = [method._regions[o.value] for o in outs if o.runtime]

    def step(values: list[Any]) -> int:
        for region in regions:  # a kernel may have swapped a runtime tensor's storage
            if not region.attached():
                region.attach()
        for o in emptied:
            o.tensor.resize_(0)
        try:
            if invoke is not None:
                returned = invoke(values)
            else:
                returned = bound(*[values[i] for i in reads])
        except Exception as exc:
            error = _kernel_error(exc, outs)
            if error is exc:
                raise
            raise error from exc
        for tensor, size, o in static_outs:
            # emptying an out is harmless (batch norm's unused save_mean / save_invstd)
            if tensor.shape != size and tensor.numel() != 0:
                raise ValueError(
                    f"kernel resized value {o.value} to {tuple(tensor.shape)}; the plan "
                    f"gives it {o.sizes}"
                )
        for o in dynamic_outs:
            _check_capacity(o, o.tensor)
        if regions:
            method._check_dynamic()
        if result is not None:
            if result_out:
                _store(result_out[0], returned, values)
            else:
                values[result] = returned
        return nxt

    return step, call, runner is not None


def _frame_call(
    bound: Callable[..., object], frame: list[Any], reads: tuple[int, ...]
) -> Callable[[], object]:
    """``bound`` called with the values at ``reads`` in ``frame``, as they are when called."""
    match reads:
        case ():
            return bound
        case (i,):
            return lambda: bound(frame[i])
        case (i, j):
            return lambda: bound(frame[i], frame[j])
    return lambda: bound(*[frame[i] for i in reads])


@dataclass(frozen=True, slots=True)
class _Fresh:
    """A method output a trusted call computes as a new tensor (the kernel's functional entry,
    :meth:`Kernel.bind_functional`) instead of writing the arena and cloning: the call leaves it
    in ``box[slot]`` for the outputs to take."""

    box: list[torch.Tensor | None]
    slot: int


def _delegate_results(results: Sequence[Any], expected: int) -> Sequence[Any]:
    if len(results) != expected:
        raise ValueError(f"delegate returned {len(results)} outputs; the program expects {expected}")
    return results


def _delegate_call(
    backend: Any,
    handle: Any,
    args: tuple[int, ...],
    outs: tuple[_Out, ...],
    handed: list[int | None],
    method: MethodState,
) -> Callable[[], object]:
    """The trusted call of a delegate: results the caller may take as they are (``handed``:
    their slot in the fresh box) go there once their shape and dtype are the plan's; the
    others are copied into their planned memory as on checked runs."""
    frame, box, resolve = method._frame, method._fresh_box, method._resolve
    plan = [
        (out, slot, torch.Size(out.sizes), None if out.tensor is None else out.tensor.dtype)
        for out, slot in zip(outs, handed)
    ]
    if any(i in method._lists for i in args):
        def inputs() -> list[Any]:
            return [resolve(frame, i) for i in args]
    else:  # plain values: read straight from the frame
        getter = operator.itemgetter(*args) if args else (lambda _: ())
        one = len(args) == 1

        def inputs() -> list[Any]:
            got = getter(frame)
            return [got] if one else list(got)

    def call() -> None:
        results = _delegate_results(backend.execute(handle, inputs()), len(plan))
        for (out, slot, size, dtype), got in zip(plan, results):
            if (
                slot is not None and isinstance(got, torch.Tensor)
                and got.shape == size and got.dtype == dtype
            ):
                box[slot] = got
            else:
                _store(out, got, frame)
                if slot is not None:  # not as planned after all: the caller gets a copy
                    box[slot] = out.tensor.clone()

    return call


def _fresh_call(
    runner: Callable[..., Any], frame: list[Any], reads: tuple[int, ...], fresh: _Fresh
) -> Callable[[], object]:
    """``runner`` (returning the result, taking the values at ``reads``) into ``fresh``."""
    box, slot = fresh.box, fresh.slot
    match reads:
        case ():

            def call() -> None:
                box[slot] = runner()

        case (i,):

            def call() -> None:
                box[slot] = runner(frame[i])

        case (i, j):

            def call() -> None:
                box[slot] = runner(frame[i], frame[j])

        case _:

            def call() -> None:
                box[slot] = runner(*[frame[i] for i in reads])

    return call


def _invoker(
    method: MethodState,
    bound: Callable[..., object],
    operands: tuple[int, ...],
    changing: list[int],
    converters: dict[int, Any],
) -> Callable[[list[Any]], object] | None:
    """``bound`` called with the changing arguments read from ``values``; ``None`` when they
    are plain values (no list, no conversion: the callers read them themselves, faster)."""
    if all(p not in converters and operands[p] not in method._lists for p in changing):
        return None
    resolve = method._resolve
    reads = [(operands[p], converters.get(p)) for p in changing]

    def invoke(values: list[Any]) -> object:
        given = []
        for index, convert in reads:
            value = resolve(values, index)
            given.append(value if convert is None else convert(value))
        return bound(*given)

    return invoke


def _locked(call: Callable[[], object], lock: Any) -> Callable[[], object]:
    if isinstance(lock, contextlib.nullcontext):
        return call

    def locked() -> object:
        with lock:
            return call()

    return locked


def _mentions(meta: schema.Method, lists: dict[int, tuple[int, ...]]) -> collections.Counter[int]:
    """How often each value is named: by instruction arguments (list items included), and
    twice (so never "unread") as a method output or input, the base of a view, or state."""
    counts: collections.Counter[int] = collections.Counter()

    def name(index: int, times: int = 1) -> None:
        counts[index] += times
        for item in lists.get(index, ()):
            counts[item] += times

    for ins in meta.instructions:
        match ins:
            case schema.KernelCall(args=args) | schema.DelegateCall(args=args):
                for i in args:
                    name(i)
                for i in getattr(ins, "outputs", ()):
                    name(i)
            case schema.MoveCall(src=src, dst=dst):
                name(src, 2)
                name(dst)
            case schema.JumpFalseCall(cond_value=cond):
                name(cond, 2)
            case schema.FreeCall(value=v):
                name(v)
    for i in meta.outputs:
        name(i, 2)
    for i in meta.inputs:  # the caller reads what is written into its tensors
        name(i, 2)
    for i, v in enumerate(meta.values):
        if not isinstance(v, schema.Tensor):
            continue
        if isinstance(v.storage, schema.ViewOf):
            name(v.storage.base, 2)
        if v.initial is not None:  # state: read by the next call
            name(i, 2)
    return counts


def _direct_call(
    method: MethodState,
    backend: Any,
    handle: Any,
    args: tuple[int, ...],
    outs: tuple[_Out, ...],
) -> Callable[[Sequence[Any]], tuple[Any, ...] | None] | None:
    """A whole trusted call of a method that is one thread-safe delegate with fresh outputs
    (``MethodState._direct``): the inputs the method was built for go straight to the backend,
    its results straight to the caller. Returns None (use the general path) unless every input
    is a static tensor, no input is viewed or written, and the method's outputs are exactly the
    delegate's, each handed out as it is. The call itself returns None for inputs its checks
    do not accept as they are: the general path then converts them or raises the typed error.
    """
    meta = method.meta
    checks = method._input_checks
    if (
        tuple(meta.outputs) != tuple(o.value for o in outs)
        or any(c is None or c.dynamic for c in checks)
        or method._input_views or method._mutated or method._regions
        or method._input_sizes is not None
        or any(o.value not in method._fresh_slots for o in outs)
        or any(i in method._lists for i in args)
    ):
        return None
    frame = method._frame
    template = [frame[i] for i in args]
    # (position in the delegate's arguments, method input) for each argument an input fills
    places = tuple((pos, meta.inputs.index(i)) for pos, i in enumerate(args) if i in meta.inputs)
    accepts = tuple(c.accepts for c in checks)
    expected = tuple((torch.Size(o.sizes), o.tensor.dtype) for o in outs)
    count = len(checks)
    is_grad_enabled = torch.is_grad_enabled
    set_grad = torch._C._set_grad_enabled

    def direct(inputs: Sequence[Any]) -> tuple[Any, ...] | None:
        if len(inputs) != count:
            return None
        for accept, given in zip(accepts, inputs):
            if not accept(given):
                return None
        values = template.copy()
        for pos, k in places:
            values[pos] = inputs[k]
        grad = is_grad_enabled()
        set_grad(False)
        try:
            results = backend.execute(handle, values)
        except RuntimeFailure:
            method._reset()
            raise
        except Exception as exc:
            raise method._failed(0, _kernel_error(exc, outs)) from exc
        finally:
            set_grad(grad)
        if len(results) == len(expected) and all(
            isinstance(got, torch.Tensor) and got.shape == size and got.dtype == dtype
            for got, (size, dtype) in zip(results, expected)
        ):
            return tuple(results)
        return _settle(method, results, outs, expected)

    return direct


def _settle(
    method: MethodState, results: Sequence[Any], outs: tuple[_Out, ...],
    expected: tuple[tuple[torch.Size, torch.dtype], ...],
) -> tuple[Any, ...]:
    """The direct call's outputs when the delegate's results are not as planned: each is
    stored into its planned tensor as on checked runs (raising what they raise) and the caller
    gets a copy."""
    try:
        results = _delegate_results(results, len(outs))
        final = []
        for out, got, (size, dtype) in zip(outs, results, expected):
            if isinstance(got, torch.Tensor) and got.shape == size and got.dtype == dtype:
                final.append(got)
            else:
                _store(out, got, method._frame)
                final.append(out.tensor.clone())
    except Exception as exc:
        raise method._failed(0, exc) from exc
    return tuple(final)
