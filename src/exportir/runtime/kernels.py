"""The kernel registry: operator name -> kernel.

A program's ``KernelCall`` names an operator (``aten::add.out``) and passes value indices in the
operator's schema order, out arguments included, exactly as ATen's out variants take them. The
default kernels call ``torch.ops.<ns>.<op>.<overload>`` with ``out=`` tensors that view the
method's planned arena, so every result lands where memory planning put it.

Two calling conventions exist:

* **out kernels** (the operator has arguments it writes, ``Tensor(a!)``): one value index per
  schema argument; the kernel writes into the out arguments and its return value is dropped.
* **value kernels** (nothing written, e.g. ``aten::sym_size.int`` or scalar arithmetic): one value
  index per schema argument plus one trailing index, the slot that receives the returned value.

A third, **functional fallbacks** (``mylib::op.default@functional``, emitted only for custom
ops without an out variant), calls the functional op by name and copies its results into the
instruction's trailing out tensors: the custom op's library must be imported (registered with
``torch.library``) in the process that runs the program.

``KernelRegistry`` is an explicit object; the runtime's default registry is made by
:func:`default_kernel_registry` and resolves the operators of the kernel table
(:mod:`exportir.runtime.kernel_table`: what the compiler emits), lazily, on first use. Any other
operator runs only when the caller registers it on purpose (:meth:`KernelRegistry.register_op`).
"""

from __future__ import annotations

import functools
import importlib
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from exportir.format import schema
from exportir.runtime import operands
from exportir.runtime.bindings import Call, fast_call, functional_call, split_arguments
from exportir.runtime.bindings import bind as bind_call
from exportir.runtime.kernel_table import KERNEL_TABLE, TORCH_VERSION

KernelFn = Callable[[Sequence[object]], object]
# binder(args, changing, unread, functional) -> Kernel.bind's callable, or None for the default
Binder = Callable[
    [Sequence[object], Sequence[int], Sequence[int], bool], Callable[..., object] | None
]
Converter = Callable[[object], object]

# Program files store dtypes, layouts and memory formats as Int codes, devices as String.
_MEMORY_FORMATS = (
    torch.contiguous_format,
    torch.preserve_format,
    torch.channels_last,
    torch.channels_last_3d,
)
_LAYOUTS = (torch.strided, torch.sparse_coo)


def _to_dtype(code: object) -> object:
    if not isinstance(code, int) or isinstance(code, bool):
        return code
    return getattr(torch, schema.TORCH_DTYPE_NAME[schema.ScalarType(code)])


def _to_memory_format(code: object) -> object:
    return _MEMORY_FORMATS[code] if isinstance(code, int) and not isinstance(code, bool) else code


def _to_layout(code: object) -> object:
    return _LAYOUTS[code] if isinstance(code, int) and not isinstance(code, bool) else code


def _to_device(name: object) -> object:
    return torch.device(name) if isinstance(name, str) else name


_CONVERTERS: tuple[tuple[str, Converter], ...] = (
    ("ScalarType", _to_dtype),
    ("MemoryFormat", _to_memory_format),
    ("Layout", _to_layout),
    ("Device", _to_device),
)


def _converter(arg: object) -> Converter | None:
    real = str(getattr(arg, "real_type", getattr(arg, "type", "")))
    for marker, fn in _CONVERTERS:
        if marker in real:
            return fn
    return None


@dataclass(frozen=True, slots=True)
class Kernel:
    """A callable for one operator overload and how an instruction feeds it.

    ``fn(args)`` receives the resolved argument values (``arity`` of them, the result slot
    excluded). ``writes`` lists argument positions the kernel writes in place; ``result_slot``
    says the instruction carries one extra trailing value index that receives ``fn``'s return.
    ``converters`` turn stored argument values into what ``fn`` takes (dtype codes into
    ``torch.dtype``, ...); the runtime applies them once to arguments that never change.
    ``empties`` are out positions the kernel may leave with no elements (see
    :data:`EMPTIED_OUTS`); the runtime resizes them to zero elements before each call.
    ``params`` say what each argument may be (checked when a program is loaded;
    :mod:`exportir.runtime.operands`), ``None`` for a kernel without a schema (a registered
    function: only its arity and writes are checked); ``result_kinds``, the value kinds its
    result slot may have.
    """

    name: str
    fn: KernelFn
    arity: int
    writes: tuple[int, ...] = ()
    result_slot: bool = False
    converters: tuple[tuple[int, Converter], ...] = ()
    empties: tuple[int, ...] = ()
    binder: Binder | None = None
    params: tuple[operands.Param, ...] | None = None
    result_kinds: frozenset[type] = operands.ANY_RESULT

    def bind(
        self, args: Sequence[object], changing: Sequence[int] = (), unread: Sequence[int] = ()
    ) -> Callable[..., object]:
        """This kernel on ``args``, as a callable taking only the arguments at the ``changing``
        positions (in that order; none when nothing changes). Bound once, it runs without
        per-call argument packing. At changing positions ``args`` holds samples of what the
        calls will pass (same types, tensor dtypes and ranks): the binder may use them to pick
        the fastest entry into the kernel. ``unread`` are out positions whose values nobody
        reads: the kernel may leave them unwritten."""
        if self.binder is not None:
            bound = self.binder(args, changing, unread, False)
            if bound is not None:
                return bound
        return _packing(self.fn, args, changing)

    def bind_functional(
        self, args: Sequence[object], changing: Sequence[int] = ()
    ) -> Callable[..., object] | None:
        """Like :meth:`bind` for a kernel with one out, but the callable *returns* a new tensor
        holding what the kernel would write into ``args``' out (same shape, dtype and strides)
        and writes nothing; ``None`` when the kernel has no such entry."""
        if self.binder is None or len(self.writes) != 1:
            return None
        return self.binder(args, changing, (), True)

    @property
    def num_value_args(self) -> int:
        """How many value indices a ``KernelCall`` to this kernel carries."""
        return self.arity + (1 if self.result_slot else 0)


def _packing(
    fn: KernelFn, args: Sequence[object], changing: Sequence[int]
) -> Callable[..., object]:
    template = list(args)
    if not changing:
        return lambda: fn(template)

    def call(*given: object) -> object:
        packed = template.copy()
        for p, value in zip(changing, given):
            packed[p] = value
        return fn(packed)

    return call


def canonical_op_name(name: str, overload: str | None = None) -> str:
    """``ns::op.overload`` from the spellings programs and users write.

    Accepts ``aten::add.out``, ``aten.add.out``, ``aten::add`` (the ``default`` overload) and a
    separate ``overload`` argument (``"aten::add", "out"``). An empty overload means ``default``.
    """
    if "::" in name:
        ns, rest = name.split("::", 1)
    elif "." in name:
        ns, rest = name.split(".", 1)
    else:
        raise ValueError(f"operator name {name!r} has no namespace (expected e.g. 'aten::add.out')")
    if overload is not None:
        op = rest
    else:
        op, _, overload = rest.partition(".")
    return f"{ns}::{op}.{overload or 'default'}"


# torch.library namespaces the runtime defines before looking their ops up (torch defines them
# only when its own quantization stack is imported): namespace -> module whose ``define()`` does
# it, imported only when a program calls such an op
_LIBRARIES: Mapping[str, str] = {"quantized_decomposed": "exportir.format.quantized_ops"}

_NAME_PART = re.compile(r"(?!__)[A-Za-z_][A-Za-z0-9_]*\Z")


def _lookup_torch_op(name: str) -> torch._ops.OpOverload | None:
    """``torch.ops.<ns>.<op>.<overload>`` for a canonical name, or ``None``; names that are
    not plain identifiers (``__class__``) are never looked up."""
    ns, rest = name.split("::", 1)
    op, overload = rest.split(".", 1)
    if not all(_NAME_PART.match(part) for part in (ns, op, overload)):
        return None
    if ns in _LIBRARIES:
        importlib.import_module(_LIBRARIES[ns]).define()
    try:
        packet = getattr(getattr(torch.ops, ns), op)
        found = getattr(packet, overload)
    except (AttributeError, RuntimeError):
        return None
    return found if isinstance(found, torch._ops.OpOverload) else None


# Out arguments that ATen's CPU kernels leave empty although the meta kernels (and so memory
# planning) give them a shape: batch norm's save_mean / save_invstd outside training. ATen
# resizes an out with elements and warns; emptied first, the out is resized silently (inside its
# planned bytes, which the runtime checks).
EMPTIED_OUTS: Mapping[str, tuple[str, ...]] = {
    "aten::_native_batch_norm_legit_no_training.out": ("out1", "out2"),
    "aten::native_batch_norm.out": ("save_mean", "save_invstd"),
}


# Copy ops (the edge dialect's views, materialised) bound as ``out.copy_(view)``: the same result
# as the out variant when ``out`` already has the view's shape and dtype, without the cost of
# the generic operator call. Otherwise (a dynamic out being resized) the operator runs. Keyword
# arguments other than ``out`` follow the positional ones.
_COPY_VIEWS: Mapping[str, Callable[..., torch.Tensor]] = {
    "aten::view_copy.out": lambda t, size: t.view(size),
    "aten::permute_copy.out": lambda t, dims: t.permute(dims),
    "aten::expand_copy.out": lambda t, size, implicit=False: t.expand(size),
    # any memory_format: clone.out copies the clone into ``out``, whose layout is the plan's
    "aten::clone.out": lambda t, memory_format=None: t,
}


def _copy_view_call(name: str, op: torch._ops.OpOverload, args: Sequence[object]) -> Call | None:
    view = _COPY_VIEWS.get(name)
    if view is None:
        return None
    positional, keywords = split_arguments(op, args)
    *rest_keywords, out_name = keywords
    if out_name != "out":
        return None
    out = keywords["out"]
    source = positional[0]
    if (
        not isinstance(source, torch.Tensor)
        or not isinstance(out, torch.Tensor)
        or source.dtype != out.dtype
    ):
        return None
    extra = [keywords[k] for k in rest_keywords]
    generic = functools.partial(op._op, **keywords)

    def run(source: torch.Tensor, *rest: object) -> object:
        v = view(source, *rest, *extra)
        if v.shape != out.shape:
            return generic(source, *rest)
        return out.copy_(v)

    return Call(run, tuple(positional), {})


# Per operator name: fast / functional entries by argument kinds, for the whole process.
_CHOSEN: dict[str, dict] = {}
_FUNCTIONALS: dict[str, dict] = {}
# Kernels made for torch's operators (KernelRegistry.lookup), by name, with the op they wrap.
_RESOLVED: dict[str, tuple[torch._ops.OpOverload, Kernel]] = {}


def kernel_from_op(name: str, op: torch._ops.OpOverload) -> Kernel:
    """Wrap an ATen (or custom) ``OpOverload`` in the instruction calling convention."""
    arguments = op._schema.arguments
    writes = tuple(
        i for i, a in enumerate(arguments) if a.alias_info is not None and a.alias_info.is_write
    )
    positional = sum(1 for a in arguments if not a.kwarg_only)
    keywords = tuple(a.name for a in arguments[positional:])
    call = op._op  # the C++ callable behind OpOverload.__call__, without the Python frame

    if keywords:

        def fn(args: Sequence[object]) -> object:
            return call(*args[:positional], **dict(zip(keywords, args[positional:])))

    else:

        def fn(args: Sequence[object]) -> object:
            return call(*args)

    # entries chosen by argument kinds, shared by every load in the process (the choice depends
    # only on the operator and the kinds; observing it costs a dispatch per entry tried)
    chosen = _CHOSEN.setdefault(name, {})  # bindings.fast_call
    functionals = _FUNCTIONALS.setdefault(name, {})  # bindings.functional_call

    def binder(
        args: Sequence[object], changing: Sequence[int], unread: Sequence[int], functional: bool
    ) -> Callable[..., object] | None:
        if functional:
            entry = functional_call(op, args, functionals)
            return None if entry is None else bind_call(entry, changing)
        unread_names = frozenset(arguments[p].name for p in unread)
        entry = (
            _copy_view_call(name, op, args)
            or fast_call(name, op, args, changing, unread_names, chosen)
            or Call(call, *split_arguments(op, args))
        )
        return bind_call(entry, changing)

    converters = tuple(
        (i, fn) for i, fn in ((i, _converter(a)) for i, a in enumerate(arguments)) if fn
    )
    emptied = EMPTIED_OUTS.get(name, ())
    empties = tuple(i for i, a in enumerate(arguments) if a.name in emptied)
    return Kernel(
        name, fn, len(arguments), writes, not writes, converters, empties, binder,
        _params(arguments), _result_kinds(op._schema.returns),
    )


# A value kernel's single return type -> the value kinds its result slot may have.
_RESULT_KINDS: Mapping[str, frozenset[type]] = {
    "Tensor": frozenset({schema.Tensor}),
    "int": frozenset({schema.Int}),
    "SymInt": frozenset({schema.Int}),
    "float": frozenset({schema.Double}),
    "bool": frozenset({schema.Bool}),
}


def _result_kinds(returns: Sequence[object]) -> frozenset[type]:
    """What a value kernel's result may be stored in: nothing unless it returns one value of a
    kind a program value holds (a tuple or no result has no slot)."""
    if len(returns) != 1:
        return frozenset()
    return _RESULT_KINDS.get(str(returns[0].type), frozenset())


def _params(arguments: Sequence[object], extra: Sequence[operands.Param] = ()) -> (
    tuple[operands.Param, ...] | None
):
    try:
        return (*operands.params_of(arguments), *extra)
    except operands.UnsupportedSchema:  # typed by the kernel itself when it runs
        return None


def fallback_kernel_from_op(name: str, op: torch._ops.OpOverload) -> Kernel:
    """The functional fallback of a custom op without an out variant
    (:data:`schema.FUNCTIONAL_FALLBACK`): call ``op`` on the instruction's leading values,
    copy each returned tensor into the trailing out tensors (same dtype; resized only where
    the plan lets the runtime resize)."""
    arguments = op._schema.arguments
    arity = len(arguments)
    positional = sum(1 for a in arguments if not a.kwarg_only)
    keywords = tuple(a.name for a in arguments[positional:])
    call = op._op

    def fn(args: Sequence[object]) -> object:
        result = call(*args[:positional], **dict(zip(keywords, args[positional:arity])))
        results = result if isinstance(result, (tuple, list)) else (result,)
        outs = args[arity:]
        if len(results) != len(outs):
            raise ValueError(f"{name} returned {len(results)} results for {len(outs)} outs")
        for out, value in zip(outs, results):
            if not isinstance(value, torch.Tensor) or value.dtype != out.dtype:
                got = getattr(value, "dtype", type(value).__name__)
                raise ValueError(f"{name} returned {got}; the program planned {out.dtype}")
            if out.shape != value.shape:
                out.resize_(value.shape)
            out.copy_(value)
        return None

    num_outs = len(op._schema.returns)
    converters = tuple(
        (i, fn) for i, fn in ((i, _converter(a)) for i, a in enumerate(arguments)) if fn
    )
    writes = tuple(range(arity, arity + num_outs))
    outs = [operands.out_tensor(f"result{i}") for i in range(num_outs)]
    return Kernel(
        name, fn, arity + num_outs, writes, False, converters, params=_params(arguments, outs)
    )


def _value_kernel(name: str, arity: int, fn: Callable[..., object]) -> Kernel:
    return Kernel(
        name, lambda args: fn(*args), arity, (), result_slot=True,
        params=operands.prim_params(name, arity), result_kinds=operands.prim_result(name),
    )


def _assert_scalar(cond: object, message: object) -> None:
    """A check the program keeps on a value read from tensor data (``torch._check``)."""
    if not cond:
        raise RuntimeError(str(message))


# The runtime primitives of the format (schema.PRIM_OPERATORS): symbolic-int arithmetic a
# program carries between tensor ops (sizes of dynamic dimensions), and a one-element tensor's
# value (``Tensor.item()``). Python's operators give the exact int semantics.
_SCALAR_KERNELS: Mapping[str, tuple[int, Callable[..., object]]] = {
    "aten::sym_size.int": (2, lambda t, d: t.size(d)),
    "aten::sym_numel.default": (1, lambda t: t.numel()),
    "aten::sym_storage_offset.default": (1, lambda t: t.storage_offset()),
    "aten::_local_scalar_dense.default": (1, lambda t: t.item()),
    "aten::_assert_scalar.default": (2, _assert_scalar),
    "exportir_prim::add.Scalar": (2, operator.add),
    "exportir_prim::sub.Scalar": (2, operator.sub),
    "exportir_prim::mul.Scalar": (2, operator.mul),
    "exportir_prim::floordiv.Scalar": (2, operator.floordiv),
    "exportir_prim::truediv.Scalar": (2, operator.truediv),
    "exportir_prim::mod.Scalar": (2, operator.mod),
    "exportir_prim::eq.Scalar": (2, operator.eq),
    "exportir_prim::gt.Scalar": (2, operator.gt),
    "exportir_prim::lt.Scalar": (2, operator.lt),
    "exportir_prim::ge.Scalar": (2, operator.ge),
    "exportir_prim::le.Scalar": (2, operator.le),
    "exportir_prim::neg.Scalar": (1, operator.neg),
    "exportir_prim::ne.Scalar": (2, operator.ne),
}


def missing_kernel(name: str, registry: KernelRegistry) -> tuple[str, str]:
    """(reason, hint) for operator ``name`` (canonical) that ``registry`` has no kernel for."""
    base = name.removesuffix(schema.FUNCTIONAL_FALLBACK)
    namespace, _, rest = base.partition("::")
    register = (
        "kernels = default_kernel_registry(); kernels.register_op(torch.ops."
        f"{namespace}.{rest.partition('.')[0]}); Program.load(..., kernels=kernels)"
    )
    if base != name:
        known = _lookup_torch_op(base) is not None
        reason = (
            f"the program calls the custom operator {base} (functional fallback), which was "
            "not registered with this runtime"
            + ("" if known else f" (and torch.ops.{namespace} has no {rest}: its library is "
                                "not imported)")
        )
        hint = (
            f"import the Python library that defines the torch.library namespace {namespace!r} "
            f"(its torch.library.custom_op('{base.rsplit('.', 1)[0]}') definition), then "
            f"register the op on purpose: {register}"
        )
        return reason, hint
    recorded = KERNEL_TABLE.get(base)
    if recorded is None:
        reason = (
            f"operator {base} is not in the runtime's kernel table (the operators exportir's "
            "compiler emits); the file was not made by exportir, or calls an op outside the "
            "Edge dialect"
        )
        hint = (
            "if you trust the file and the operator, register it on purpose: "
            f"{register} (or KernelRegistry.register)"
        )
    elif registry.resolves_torch_ops:
        op = _lookup_torch_op(base)
        have = "no such operator" if op is None else str(op._schema)
        reason = (
            f"torch's {base} is not the one the kernel table records ({recorded}; this "
            f"torch has: {have})"
        )
        hint = f"run the program with torch {TORCH_VERSION}, for which the runtime was built"
    else:
        reason = f"no kernel is registered for {base}"
        hint = (
            "register one (KernelRegistry.register / register_function / register_op) and pass "
            "the registry to Program.load(..., kernels=...), or decompose the op before "
            "to_program()"
        )
    return reason, hint


OpLike = torch._ops.OpOverload | torch._ops.OpOverloadPacket


class KernelRegistry:
    """Operator name -> :class:`Kernel`.

    What a program may call is explicit: the kernels registered here (:meth:`register`,
    :meth:`register_function`), torch operators registered on purpose (:meth:`register_op`:
    custom ops, or ATen ops outside the table), and -- with ``resolve_torch_ops``, the default
    -- the operators of the runtime's kernel table (:data:`KERNEL_TABLE`, what the compiler
    emits), each resolved to torch's kernel on first use when torch's schema is the table's.
    Nothing else resolves, whatever torch knows.
    """

    __slots__ = ("_kernels", "_ops", "_resolve_torch_ops")

    def __init__(
        self, kernels: Iterable[Kernel] = (), *, resolve_torch_ops: bool = True
    ) -> None:
        self._kernels: dict[str, Kernel] = {}
        self._ops: dict[str, torch._ops.OpOverload] = {}
        self._resolve_torch_ops = resolve_torch_ops
        for kernel in kernels:
            self.register(kernel)

    @property
    def resolves_torch_ops(self) -> bool:
        """Whether the kernel table's operators resolve to torch's kernels."""
        return self._resolve_torch_ops

    def register(self, kernel: Kernel) -> None:
        """Add (or replace) the kernel for ``kernel.name``."""
        self._kernels[canonical_op_name(kernel.name)] = kernel

    def register_function(
        self,
        name: str,
        fn: Callable[..., object],
        *,
        arity: int,
        writes: Sequence[int] = (),
    ) -> Kernel:
        """Register a plain Python function ``fn(*args)`` as the kernel for ``name``.

        With ``writes`` the function writes those argument positions in place (an out kernel);
        without, its return value is stored in the instruction's trailing result slot.
        """
        canonical = canonical_op_name(name)
        kernel = Kernel(canonical, lambda args: fn(*args), arity, tuple(writes), not writes)
        self.register(kernel)
        return kernel

    def register_op(self, *ops: OpLike) -> None:
        """Let programs call these torch operators, on purpose: custom ops
        (``torch.library``) and ATen ops outside the kernel table. A packet
        (``torch.ops.mylib.op``) registers each of its overloads; a custom op without an out
        variant runs as its functional fallback (``mylib::op.default@functional``)."""
        for op in ops:
            if isinstance(op, torch._ops.OpOverloadPacket):
                overloads = [getattr(op, name) for name in op.overloads()]
            elif isinstance(op, torch._ops.OpOverload):
                overloads = [op]
            else:
                raise TypeError(
                    f"register_op takes torch operators (torch.ops.ns.op or "
                    f"torch.ops.ns.op.overload); got {type(op).__name__}"
                )
            for overload in overloads:
                s = overload._schema
                self._ops[canonical_op_name(s.name, s.overload_name)] = overload

    def lookup(self, name: str) -> Kernel | None:
        """The kernel for ``name``, or ``None`` when there is none."""
        try:
            canonical = canonical_op_name(name)
        except ValueError:
            return None
        kernel = self._kernels.get(canonical)
        if kernel is not None:
            return kernel
        base = canonical.removesuffix(schema.FUNCTIONAL_FALLBACK)
        fallback = base != canonical
        op = self._ops.get(base)
        if op is None and not fallback and self._resolve_torch_ops and base in KERNEL_TABLE:
            op = _lookup_torch_op(base)
            if op is not None and str(op._schema) != KERNEL_TABLE[base]:
                op = None
        if op is None:
            return None
        shared = _RESOLVED.get(canonical)
        if shared is None or shared[0] is not op:  # kernels of torch's ops serve every registry
            make = fallback_kernel_from_op if fallback else kernel_from_op
            shared = _RESOLVED[canonical] = (op, make(canonical, op))
        kernel = self._kernels[canonical] = shared[1]
        return kernel

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.lookup(name) is not None

    def names(self) -> list[str]:
        """Names registered or resolved so far (sorted)."""
        return sorted(self._kernels)


def default_kernel_registry() -> KernelRegistry:
    """A fresh registry: the kernel table's operators (resolved lazily), the runtime
    primitives and the library custom ops the runtime implements itself
    (:mod:`exportir.runtime.library_kernels`)."""
    from exportir.runtime.library_kernels import library_kernels

    registry = KernelRegistry()
    for name, (arity, fn) in _SCALAR_KERNELS.items():
        registry.register(_value_kernel(name, arity, fn))
    for kernel in library_kernels():  # library custom ops known by name (transformers' MoE)
        registry.register(kernel)
    return registry
