"""Fast calls for ATen out kernels: the cheapest Python entry that computes the same values.

Calling an ``OpOverload`` (``torch.ops.aten.addmm.out._op``) converts every argument through the
TorchScript stack (~1-2 us per call); torch's generated Python bindings (``torch.addmm(...,
out=o)``) parse arguments in C++ and are markedly cheaper. For each kernel call the runtime binds,
:func:`fast_call` tries these entries, in order, and takes the first that applies:

1. an **alternative** out overload (:data:`ALTERNATIVES`): ``relu.out`` is ``clamp_min.out(x,
   0)``, whose out overload is a real CPU kernel;
2. a **scalar stand-in** (:data:`SCALAR_AS_TENSOR`): ``mul.Scalar_out(x, 2.0)`` as ``mul.out(x,
   t)`` with ``t`` a 0-dim tensor of ``x``'s dtype holding 2.0, made once (ATen wraps the scalar
   in a new tensor on every call);
3. **direct**: ``torch.<name>(..., out=...)`` (or ``torch._C._nn.<name>``, ...);
4. an entry computing only what is read (:data:`UNREAD_OUT_ENTRIES`): ``native_layer_norm.out``
   whose mean and rstd nobody reads runs ``torch.layer_norm`` and copies its result;
5. **functional + copy**, for out overloads ATen implements as "call the functional op, then
   copy into the outs" (no CPU kernel of their own, e.g. ``convolution.out``): the functional op
   through its Python binding, then ``out.copy_(result)`` (outs nobody reads are not copied). A
   result whose shape differs from its out (an out being resized) runs the overload instead.

Which ATen overload a Python entry reaches is never assumed: it is *observed*, once per operator
and argument kinds, by calling the entry under a :class:`TorchDispatchMode` that records the first
overload dispatched and aborts before any kernel runs (no computation, nothing written). An entry
that parses differently, reaches another overload or decomposes into something else is not used.
"""

from __future__ import annotations

import functools
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Where torch's generated Python bindings live (``python_module`` of native_functions.yaml).
_NAMESPACES = (torch, torch._C._nn, torch._C._special, torch._C._linalg, torch._C._fft)


@dataclass(frozen=True, slots=True)
class Call:
    """``fn(*positional, **keywords)``: one kernel call with its arguments laid out. The
    positional arguments are the operator schema's own, in its order."""

    fn: Callable[..., object]
    positional: tuple[object, ...]
    keywords: Mapping[str, object]


def bind(call: Call, changing: Sequence[int] = ()) -> Callable[..., object] | None:
    """``call`` as a callable taking the arguments at ``changing`` positions (indices into
    positional-then-keyword order) per call, in that order; the others are bound now.

    ``None`` when a changing argument is a keyword (callers then pack arguments themselves).
    """
    fn, positional, keywords = call.fn, call.positional, dict(call.keywords)
    if not changing:
        return functools.partial(fn, *positional, **keywords)
    if any(p >= len(positional) for p in changing):
        return None
    with_keywords = functools.partial(fn, **keywords) if keywords else fn
    if tuple(changing) == tuple(range(len(changing))):  # a prefix: the usual case
        rest = positional[len(changing) :]
        if len(changing) == 1:
            return lambda value: with_keywords(value, *rest)
        return lambda *given: with_keywords(*given, *rest)
    if len(changing) == 1:
        (p,) = changing
        before, after = positional[:p], positional[p + 1 :]
        return lambda value: with_keywords(*before, value, *after)
    template = list(positional)

    def call_with(*given: object) -> object:
        args = template.copy()
        for p, value in zip(changing, given):
            args[p] = value
        return with_keywords(*args)

    return call_with


# Out overloads computed by another out overload: (the other, how many leading positional
# arguments keep their position, a rewrite of (positional, keywords) into the other's).
_Rewrite = Callable[[tuple[object, ...], dict[str, object]], tuple[tuple[object, ...], dict]]

ALTERNATIVES: Mapping[str, tuple[str, int, _Rewrite]] = {
    # ATen's relu is clamp_min(self, 0); relu.out only wraps the functional op and copies
    "aten::relu.out": ("aten::clamp_min.out", 1, lambda pos, kw: ((pos[0], 0), kw)),
    # ATen's _native_batch_norm_legit_no_training is _native_batch_norm_legit(training=False),
    # whose out overload is a CPU kernel (the no_training one is functional + copy)
    "aten::_native_batch_norm_legit_no_training.out": (
        "aten::_native_batch_norm_legit.out",
        5,
        lambda pos, kw: (
            (*pos[:5], False, *pos[5:]),
            {"out": kw["out0"], "save_mean": kw["out1"], "save_invstd": kw["out2"]},
        ),
    ),
}

# Scalar overloads that ATen defines as the Tensor overload on the scalar wrapped in a 0-dim
# tensor: Scalar out overload -> (Tensor out overload, whether it is arithmetic). Passed a 0-dim
# tensor of ``self``'s dtype instead of a wrapped number, the Tensor overload computes the same
# values when that dtype holds the scalar exactly as the kernel would have converted it (float32
# / float64 for a float or a small int, int64 for an int: :func:`_scalar_stand_in`) and, for
# arithmetic, ``out`` has the result's dtype. A Python number passed to the Tensor overload's
# binding is wrapped like ATen wraps it: the direct entry accepts that overload too.
SCALAR_AS_TENSOR: Mapping[str, tuple[str, bool]] = {
    "aten::add.Scalar_out": ("aten::add.out", True),
    "aten::sub.Scalar_out": ("aten::sub.out", True),
    "aten::mul.Scalar_out": ("aten::mul.out", True),
    "aten::div.Scalar_out": ("aten::div.out", True),
    "aten::div.Scalar_mode_out": ("aten::div.out_mode", True),
    "aten::eq.Scalar_out": ("aten::eq.Tensor_out", False),
    "aten::ne.Scalar_out": ("aten::ne.Tensor_out", False),
    "aten::lt.Scalar_out": ("aten::lt.Tensor_out", False),
    "aten::le.Scalar_out": ("aten::le.Tensor_out", False),
    "aten::gt.Scalar_out": ("aten::gt.Tensor_out", False),
    "aten::ge.Scalar_out": ("aten::ge.Tensor_out", False),
}

# Multi-out overloads with a cheaper functional entry when some outs are never read:
# op -> (outs that must be unread, the Python function, the out receiving its result). The
# entry must reach the op's functional twin (checked), so it computes the same values.
UNREAD_OUT_ENTRIES: Mapping[str, tuple[frozenset[str], Callable[..., object], str]] = {
    # layer_norm is native_layer_norm(...)[0], without returning mean and rstd to Python
    "aten::native_layer_norm.out": (frozenset({"out1", "out2"}), torch.layer_norm, "out0"),
}


@dataclass(frozen=True, slots=True)
class _Request:
    name: str
    op: torch._ops.OpOverload
    positional: tuple[object, ...]
    keywords: dict[str, object]
    changing: tuple[int, ...]
    unread: frozenset[str]


_Maker = Callable[[tuple[object, ...], dict[str, object]], Call | None]


def fast_call(
    name: str,
    op: torch._ops.OpOverload,
    args: Sequence[object],
    changing: Sequence[int] = (),
    unread: frozenset[str] = frozenset(),
    cache: dict | None = None,
) -> Call | None:
    """A :class:`Call` running ``op`` (named ``name``) on ``args`` (schema order, out tensors
    included) through a faster entry than the generic overload, or ``None``.

    ``changing`` are the positions :func:`bind` will vary (their ``args`` are samples: tensors
    of the dtypes and ranks that will be passed, Python scalars of the same types); ``unread``
    names outs whose values nobody reads (they may be left unwritten). The choice of entry
    depends only on the argument kinds and is kept in ``cache``.
    """
    positional, keywords = split_arguments(op, args)
    key = (_kinds(positional), _kinds(keywords.values()), tuple(changing), unread)
    cache = {} if cache is None else cache
    if key not in cache:
        request = _Request(name, op, positional, keywords, tuple(changing), unread)
        cache[key] = _choose(request)
    maker = cache[key]
    return None if maker is None else maker(positional, keywords)


def functional_call(
    op: torch._ops.OpOverload, args: Sequence[object], cache: dict | None = None
) -> Call | None:
    """A :class:`Call` returning, as a new tensor, what the single-out overload ``op`` would
    write into its out ``args`` holds (schema order, out included): ``op``'s functional twin
    through its Python binding, on ``args`` minus the out. ``None`` unless the twin is reached
    (observed) and returns a tensor of exactly the out's shape, dtype and strides (computed on
    meta tensors, once per out layout).
    """
    positional, keywords = split_arguments(op, args)
    outs = _out_names(op)
    if outs is None or len(outs) != 1 or not isinstance(keywords.get(outs[0]), torch.Tensor):
        return None
    out = keywords.pop(outs[0])
    key = (_kinds(positional), _kinds(keywords.values()))
    cache = {} if cache is None else cache
    if key not in cache:
        cache[key] = _functional_entry(op, positional, keywords)
    entry = cache[key]
    if entry is None:
        return None
    fn, twin = entry
    if _meta_result(twin, positional, keywords) != (out.shape, out.dtype, out.stride()):
        return None
    return Call(fn, positional, keywords)


def _functional_entry(
    op: torch._ops.OpOverload, positional: tuple, keywords: dict
) -> tuple[Callable[..., object], torch._ops.OpOverload] | None:
    twin, fn = functional_twin(op), python_function(op)
    if twin is None or fn is None or [str(r.type) for r in twin._schema.returns] != ["Tensor"]:
        return None
    return (fn, twin) if _reaches_twin(fn, twin, positional, keywords) else None


def _meta_result(twin: torch._ops.OpOverload, positional: tuple, keywords: dict) -> object:
    """(shape, dtype, strides) of ``twin``'s result, computed on zero-filled stand-ins of the
    arguments' layouts. Not on the meta device: torch's Python meta kernels (elementwise type
    promotion) import sympy, ~0.3 s and tens of MiB a runtime does not otherwise need; the
    CPU kernel is the layout's ground truth anyway, and runs once per instruction at load."""

    def meta(value: object) -> object:
        if isinstance(value, torch.Tensor):
            stand_in = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype)
            return stand_in.zero_()
        if isinstance(value, (list, tuple)):
            return type(value)(meta(v) for v in value)
        return value

    try:
        result = twin(*meta(positional), **{k: meta(v) for k, v in keywords.items()})
    except Exception:  # noqa: BLE001 - no meta kernel (or it refuses): not this entry
        return None
    return (result.shape, result.dtype, result.stride())


def split_arguments(
    op: torch._ops.OpOverload, args: Sequence[object]
) -> tuple[tuple[object, ...], dict[str, object]]:
    """Schema-ordered ``args`` as (positional, keyword-only by name)."""
    arguments = op._schema.arguments
    count = sum(1 for a in arguments if not a.kwarg_only)
    names = [a.name for a in arguments[count:]]
    return tuple(args[:count]), dict(zip(names, args[count:]))


def _choose(request: _Request) -> _Maker | None:
    for entry in (_alternative, _scalar_stand_in_entry, _direct, _unread_outs, _functional_copy):
        maker = entry(request)
        if maker is not None:
            return maker
    return None


def _alternative(request: _Request) -> _Maker | None:
    alternative = ALTERNATIVES.get(request.name)
    if alternative is None:
        return None
    other_name, keeps, rewrite = alternative
    other = _overload(other_name)
    if other is None or max(request.changing, default=-1) >= keeps:
        return None
    pos, kw = rewrite(request.positional, request.keywords)
    maker = _direct(_Request(other_name, other, pos, kw, request.changing, frozenset()))
    if maker is None:
        return None
    return lambda p, k: maker(*rewrite(p, k))


def _scalar_stand_in_entry(request: _Request) -> _Maker | None:
    tensor_op, arithmetic = _tensor_overload(request.name)
    fn = python_function(request.op)
    if tensor_op is None or fn is None or 1 in request.changing:
        return None
    self, scalar = request.positional[:2]
    stand_in = _scalar_stand_in(self, scalar)
    if stand_in is None or not _result_fits(arithmetic, self, scalar, request.keywords):
        return None
    pos, kw = _relayout(request.op, tensor_op, request.positional, request.keywords)
    if dispatched(fn, (self, stand_in, *pos[2:]), kw) is not tensor_op:
        return None

    def make(p: tuple, k: dict) -> Call | None:
        value = _scalar_stand_in(p[0], p[1])  # per value: may not fit (then the generic op)
        if value is None:
            return None
        pos, kw = _relayout(request.op, tensor_op, p, k)
        return Call(fn, (pos[0], value, *pos[2:]), kw)

    return make


def _tensor_overload(name: str) -> tuple[torch._ops.OpOverload | None, bool]:
    entry = SCALAR_AS_TENSOR.get(name)
    if entry is None:
        return None, False
    return _overload(entry[0]), entry[1]


def _result_fits(arithmetic: bool, self: object, scalar: object, keywords: dict) -> bool:
    """Whether ``out`` has the dtype of ``self op scalar`` (arithmetic) or is a tensor."""
    out = keywords.get("out")
    if not isinstance(self, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    return not arithmetic or torch.result_type(self, scalar) == out.dtype


def _relayout(
    source: torch._ops.OpOverload, target: torch._ops.OpOverload, positional: tuple, keywords: dict
) -> tuple[tuple[object, ...], dict[str, object]]:
    """``source``'s arguments laid out as ``target`` takes them (matched by name)."""
    names = [a.name for a in source._schema.arguments]
    by_name = dict(zip(names, (*positional, *keywords.values())))
    arguments = target._schema.arguments
    return (
        tuple(by_name[a.name] for a in arguments if not a.kwarg_only),
        {a.name: by_name[a.name] for a in arguments if a.kwarg_only and a.name in by_name},
    )


def _scalar_stand_in(self: object, scalar: object) -> torch.Tensor | None:
    """``scalar`` as a 0-dim tensor of ``self``'s dtype, when that dtype holds it exactly as
    ATen converts the wrapped scalar for the kernel (``type`` checks: bool is not an int)."""
    if not isinstance(self, torch.Tensor):
        return None
    if self.dtype in (torch.float32, torch.float64):
        if type(scalar) is float or (type(scalar) is int and abs(scalar) <= 2**24):
            return torch.tensor(scalar, dtype=self.dtype)
        return None
    if self.dtype == torch.int64 and type(scalar) is int and -(2**63) <= scalar < 2**63:
        return torch.tensor(scalar, dtype=torch.int64)
    return None


def _direct(request: _Request) -> _Maker | None:
    fn = python_function(request.op)
    outs = [a.name for a in request.op._schema.arguments if _writes(a) and a.kwarg_only]
    if fn is None or not outs:
        return None
    layouts: list[Callable[[dict], dict]] = [lambda kw: kw]
    if len(outs) > 1:  # the Python bindings take several outs as one tuple ``out=``

        def grouped(kw: dict) -> dict:
            rest = {k: v for k, v in kw.items() if k not in outs}
            rest["out"] = tuple(kw[o] for o in outs)
            return rest

        layouts.append(grouped)
    for layout in layouts:
        if dispatched(fn, request.positional, layout(request.keywords)) is request.op:
            return lambda p, k, layout=layout: Call(fn, p, layout(k))
    return _wrapped_number(request, fn)


def _wrapped_number(request: _Request, fn: Callable[..., object]) -> _Maker | None:
    """A Scalar overload as its Tensor overload's binding given the Python number, which the
    binding wraps as ATen does (see :data:`SCALAR_AS_TENSOR`)."""
    tensor_op, arithmetic = _tensor_overload(request.name)
    if tensor_op is None:
        return None
    self, scalar = request.positional[:2]
    if not _result_fits(arithmetic, self, scalar, request.keywords):
        return None
    pos, kw = _relayout(request.op, tensor_op, request.positional, request.keywords)
    if dispatched(fn, pos, kw) is not tensor_op:
        return None
    return lambda p, k: Call(fn, *_relayout(request.op, tensor_op, p, k))


def _unread_outs(request: _Request) -> _Maker | None:
    entry = UNREAD_OUT_ENTRIES.get(request.name)
    if entry is None or not entry[0] <= request.unread:
        return None
    _, fn, target = entry
    twin = functional_twin(request.op)
    outs = _out_names(request.op)
    if twin is None or outs is None or not isinstance(request.keywords.get(target), torch.Tensor):
        return None
    inputs = {k: v for k, v in request.keywords.items() if k not in outs}
    if not _reaches_twin(fn, twin, request.positional, inputs):
        return None
    generic = request.op._op

    def make(p: tuple, k: dict) -> Call:
        kw = {key: v for key, v in k.items() if key not in outs}
        run = _copying(functools.partial(fn, **kw), (k[target],), True, generic, k)
        return Call(run, p, {})

    return make


def _functional_copy(request: _Request) -> _Maker | None:
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    name, op = request.name, request.op
    if has(name, "CPU") or not has(name, "CompositeExplicitAutograd"):
        return None  # a real out kernel (or a decomposition): only the overload is exact
    twin, fn, outs = functional_twin(op), python_function(op), _out_names(op)
    if twin is None or fn is None or not outs or len(twin._schema.returns) != len(outs):
        return None
    if any(str(r.type) != "Tensor" for r in twin._schema.returns):
        return None
    if not all(isinstance(request.keywords.get(o), torch.Tensor) for o in outs):
        return None
    inputs = {k: v for k, v in request.keywords.items() if k not in outs}
    if not _reaches_twin(fn, twin, request.positional, inputs):
        return None
    generic = op._op

    def make(p: tuple, k: dict) -> Call:
        targets = tuple(None if o in request.unread else k[o] for o in outs)
        kw = {key: v for key, v in k.items() if key not in outs}
        functional = functools.partial(fn, **kw) if kw else fn
        return Call(_copying(functional, targets, len(outs) == 1, generic, k), p, {})

    return make


def _copying(
    functional: Callable[..., Any],
    targets: tuple[torch.Tensor | None, ...],
    single: bool,
    generic: Callable[..., object],
    keywords: dict[str, object],
) -> Callable[..., object]:
    """``functional`` (one result if ``single``, else a tuple) copied into ``targets`` (``None``:
    not copied); a result of another shape than its target runs ``generic`` instead."""
    if single:
        (target,) = targets

        def run(*args: object) -> object:
            result = functional(*args)
            if result.shape != target.shape:
                return generic(*args, **keywords)
            return target.copy_(result)

        return run
    pairs = tuple((i, t) for i, t in enumerate(targets) if t is not None)

    def run_many(*args: object) -> object:
        results = functional(*args)
        for i, target in pairs:
            if results[i].shape != target.shape:
                return generic(*args, **keywords)
        for i, target in pairs:
            target.copy_(results[i])
        return targets

    return run_many


def python_function(op: torch._ops.OpOverload) -> Callable[..., object] | None:
    """torch's generated Python binding named like ``op``'s operator, if there is one."""
    ns, _, op_name = op._schema.name.partition("::")
    if ns != "aten":
        return None
    for namespace in _NAMESPACES:
        fn = getattr(namespace, op_name, None)
        if isinstance(fn, types.BuiltinFunctionType):
            return fn
    return None


def functional_twin(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The overload of ``op``'s operator taking ``op``'s arguments minus its outs, writing
    nothing (what an autogenerated out wrapper calls)."""
    wanted = [_signature(a) for a in op._schema.arguments if not _writes(a)]
    packet = op.overloadpacket
    for overload in packet.overloads():
        candidate = getattr(packet, overload)
        arguments = candidate._schema.arguments
        if any(a.alias_info is not None for a in arguments):
            continue
        if [_signature(a) for a in arguments] == wanted:
            return candidate
    return None


def _out_names(op: torch._ops.OpOverload) -> tuple[str, ...] | None:
    """The names of ``op``'s outs when all are keyword-only (``None`` otherwise)."""
    written = [a for a in op._schema.arguments if _writes(a)]
    if not all(a.kwarg_only for a in written):
        return None
    return tuple(a.name for a in written)


def _signature(a: Any) -> tuple[str, str, bool]:
    return (a.name, str(a.type), a.kwarg_only)


def _writes(a: Any) -> bool:
    return a.alias_info is not None and a.alias_info.is_write


def _overload(name: str) -> torch._ops.OpOverload | None:
    ns, rest = name.split("::", 1)
    op, overload = rest.split(".", 1)
    return getattr(getattr(getattr(torch.ops, ns), op), overload, None)


def _name(op: torch._ops.OpOverload) -> str:
    return f"{op._schema.name}.{op._overloadname}"


def _kind(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return (torch.Tensor, value.dtype, value.dim() == 0)
    if isinstance(value, (list, tuple)):
        return (type(value), _kinds(value))
    return type(value)


def _kinds(values: Sequence[object] | Any) -> tuple[object, ...]:
    return tuple(_kind(v) for v in values)


class _Reached(Exception):
    pass


class _FirstOverload(TorchDispatchMode):
    """Records the first ATen call a call dispatches, then aborts it (nothing runs)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in torch._disable_dynamo unless this says
        # no; that wrapper imports torch._dynamo (and sympy, ~500 modules, ~0.5 s) on its
        # first call. The runtime is never traced by dynamo, so there is nothing to disable.
        return False

    def __init__(self) -> None:
        super().__init__()
        self.reached: tuple[torch._ops.OpOverload, tuple, dict] | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.reached = (func, tuple(args), dict(kwargs or {}))
        raise _Reached


def first_call(
    fn: Callable[..., object], positional: Sequence[object], keywords: Mapping[str, object]
) -> tuple[torch._ops.OpOverload, tuple, dict] | None:
    """The first ATen call ``fn(*positional, **keywords)`` dispatches, as (overload, args,
    kwargs); ``None`` when the call is refused before dispatch (arguments the binding does not
    parse, or parses only with a warning: a deprecated signature)."""
    mode = _FirstOverload()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with mode:
                fn(*positional, **keywords)
    except _Reached:
        return mode.reached
    except Exception:  # noqa: BLE001 - any refusal means "not this entry"
        return None
    return None


def dispatched(
    fn: Callable[..., object], positional: Sequence[object], keywords: Mapping[str, object]
) -> torch._ops.OpOverload | None:
    """The ATen overload ``fn(*positional, **keywords)`` dispatches first (see
    :func:`first_call`)."""
    reached = first_call(fn, positional, keywords)
    return None if reached is None else reached[0]


def _reaches_twin(
    fn: Callable[..., object],
    twin: torch._ops.OpOverload,
    positional: Sequence[object],
    keywords: Mapping[str, object],
) -> bool:
    """Whether ``fn`` makes the same first ATen call as ``twin`` on these arguments (the twin
    itself, or the first op of its decomposition, on the same tensors and values)."""
    got, want = first_call(fn, positional, keywords), first_call(twin, positional, keywords)
    return got is not None and want is not None and _same_call(got, want)


def _same_call(a: tuple, b: tuple) -> bool:
    return a[0] is b[0] and _same_value(a[1], b[1]) and _same_value(a[2], b[2])


def _same_value(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b
