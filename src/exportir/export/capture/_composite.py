"""Composite-implicit ops: which ones export keeps whole, and how capture sees them whole.

Capture records below autograd, where CompositeImplicitAutograd (CIA) ops arrive already
decomposed by their C++ / Python kernels. torch.export instead records them whole
(pre-dispatch), and ``run_decompositions(table)`` keeps every *preservable* CIA op the table
does not name (torch/_export/utils.py ``_check_valid_to_preserve``): a functional op -- no
argument with alias information, no mutation -- that has a kernel, is not a tensor-metadata
query and is not tagged ``maybe_aliasing_or_mutating``. ``conv2d``, ``linear``, ``matmul``,
``layer_norm``, ``scaled_dot_product_attention``, ``pad``... are; ``reshape``, ``flatten`` and
``to`` (they may alias their input) are not.

This module reproduces that by giving CIA ops their own kernel at the autograd dispatch keys
while capture runs:

- an op routed *whole* (:func:`preservable_cia_ops`, and in a re-trace every CIA op the
  decomposition table names) redispatches below autograd, so the recorder sees the op itself
  and either records it or applies the table's decomposition to it;
- ``aten.to`` (dtype / device / dtype_layout) is preceded by an
  ``aten._assert_tensor_metadata(x, dtype=, device=, layout=)`` node, as torch.export inserts
  before every ``to`` it records, then decomposes as usual.

The kernels live in ``OpOverload.py_kernels``, consulted because capture runs under the Python
dispatcher. :class:`CompositeOverrides` installs them on ``__enter__`` and restores each op's
table on ``__exit__``; nothing outlives the capture.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Self

import torch
from torch._decomp import _should_decompose_because_unsafe_op
from torch._ops import OpOverload

from exportir.export.capture.fake import FakeConverter, FakeTensor, FakeTensorMode, run_fake

aten = torch.ops.aten
_DK = torch._C.DispatchKey
_CIA = _DK.CompositeImplicitAutograd

# The autograd keys of real devices (not Meta: fakes compute on meta twins, which must
# decompose normally).
_AUTOGRAD_KEYS = tuple(
    getattr(_DK, name)
    for name in (
        "AutogradCPU", "AutogradCUDA", "AutogradXLA", "AutogradLazy", "AutogradIPU",
        "AutogradXPU", "AutogradMPS", "AutogradHPU", "AutogradPrivateUse1",
    )
    if hasattr(_DK, name)
)  # fmt: skip

# Preservable ATen CIA ops that torch's default decomposition table nevertheless keeps whole
# (torch/export/decomp_utils.py PRESERVED_ATEN_CIA_OPS).
PRESERVED_ATEN_CIA_OPS: frozenset[Any] = frozenset(
    {
        aten.upsample_bilinear2d.vec,
        aten.upsample_nearest2d.vec,
        aten.silu_backward.default,
        aten.mish_backward.default,
        aten._fused_rms_norm.default,
    }
)

# Tensor-metadata queries: answered by the tracer, never recorded, never kept whole.
_METADATA_OPS: frozenset[Any] = frozenset(
    {
        aten.is_contiguous.default, aten.is_contiguous.memory_format,
        aten.is_strides_like_format.default, aten.is_non_overlapping_and_dense.default,
        aten.size.default, aten.sym_size.default, aten.stride.default, aten.sym_stride.default,
        aten.storage_offset.default, aten.sym_storage_offset.default, aten.numel.default,
        aten.sym_numel.default, aten.dim.default, torch.ops.prim.device.default,
    }
)  # fmt: skip

_TO_OVERLOADS = (aten.to.dtype, aten.to.device, aten.to.dtype_layout)


# --------------------------------------------------------------------------- which ops


def python_cia_kernel(op: OpOverload) -> Callable[..., Any] | None:
    """The Python CompositeImplicitAutograd kernel of ``op`` (``torch._decomp``), if any."""
    kernel = op.py_kernels.get(_CIA)
    return None if kernel is None or isinstance(kernel, _DK) else kernel


def is_cia(op: Any) -> bool:
    """``op`` has a CompositeImplicitAutograd kernel (C++ or Python)."""
    if not isinstance(op, OpOverload):
        return False
    return _has_cpp_cia(op.name()) or _CIA in op.py_kernels


@functools.cache
def _has_cpp_cia(name: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd")


def is_preservable(op: Any) -> bool:
    """A CIA op export may keep whole (torch's ``_is_preservable_cia_op``)."""
    if not isinstance(op, OpOverload) or op in _METADATA_OPS:
        return False
    if _should_decompose_because_unsafe_op(op):
        return False
    schema = op._schema
    if schema.is_mutable or any(a.alias_info is not None for a in schema.arguments):
        return False
    return torch._C._dispatch_has_kernel(op.name()) and is_cia(op)


def _overloads(qualified_names: Iterable[str]) -> Iterator[OpOverload]:
    """The OpOverloads named ``ns::name.overload`` (materializing them in ``torch.ops``)."""
    for qualified in qualified_names:
        namespace, _, rest = qualified.partition("::")
        name, _, overload = rest.partition(".")
        packet = getattr(getattr(torch.ops, namespace, None), name, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if isinstance(op, OpOverload):
            yield op


def _cpp_cia_names() -> tuple[str, ...]:
    return tuple(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd"))


@functools.cache
def _preservable_aten() -> frozenset[OpOverload]:
    # ATen's operator set is fixed once torch is imported: C++ registrations, plus the ops
    # whose only CIA kernel is a Python one (torch._decomp registers them on import)
    from torch._decomp import decomposition_table

    names = [n for n in _cpp_cia_names() if n.startswith("aten::")]
    python_only = [
        op for op in decomposition_table
        if isinstance(op, OpOverload) and op.namespace == "aten" and python_cia_kernel(op)
    ]  # fmt: skip
    return frozenset(op for op in (*_overloads(names), *python_only) if is_preservable(op))


@functools.lru_cache(maxsize=8)
def _preservable_custom(names: tuple[str, ...]) -> frozenset[OpOverload]:
    return frozenset(op for op in _overloads(names) if is_preservable(op))


def preservable_cia_ops() -> frozenset[OpOverload]:
    """Every preservable CIA op: ATen's and those of other namespaces registered so far
    (custom ops may be defined at any time, so those are looked up on each call)."""
    return _preservable_all(_custom_cia_names())


def preservable_custom_cia_ops() -> frozenset[OpOverload]:
    """The preservable CIA ops of namespaces other than ATen registered so far."""
    return _preservable_custom(_custom_cia_names())


def _custom_cia_names() -> tuple[str, ...]:
    return tuple(n for n in _cpp_cia_names() if not n.startswith("aten::"))


@functools.lru_cache(maxsize=8)
def _preservable_all(custom: tuple[str, ...]) -> frozenset[OpOverload]:
    return _preservable_aten() | _preservable_custom(custom)


def kept_cia_ops() -> frozenset[OpOverload]:
    """The preservable CIA ops capture records as one node: those returning tensors only.
    (``is_nonzero`` -- ``bool(tensor)`` -- returns a Python bool: it is a question about a
    value, answered by decomposing it, not a node.)"""
    return _tensor_valued(preservable_cia_ops())


@functools.lru_cache(maxsize=8)
def _tensor_valued(ops: frozenset[OpOverload]) -> frozenset[OpOverload]:
    return frozenset(op for op in ops if _returns_tensors(op))


def _returns_tensors(op: OpOverload) -> bool:
    returns = op._schema.returns
    tensor, tensors = torch._C.TensorType.get(), torch._C.ListType(torch._C.TensorType.get())
    return bool(returns) and all(r.type == tensor or r.type == tensors for r in returns)


# --------------------------------------------------------------------------- the kernels


def with_grad_of(out: Any, inputs: tuple) -> Any:
    """``out``, computed below autograd, made to require grad as autograd would have had it
    (through a node that errors only if differentiated), as torch.export's kept ops do.

    Call it with no dispatch mode active: the ``detach`` it makes is not part of the program.
    """
    if not torch.is_grad_enabled():
        return out
    if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in _leaves(inputs)):
        return out
    if not isinstance(out, torch.Tensor) or not (out.is_floating_point() or out.is_complex()):
        return out
    leaf = _fresh_alias(out, requires_grad=True)
    return torch._C._functions.DelayedError("exportir: not differentiable while capturing", 1)(leaf)


def _fresh_alias(t: torch.Tensor, *, requires_grad: bool) -> torch.Tensor:
    """``t.detach()`` (with ``requires_grad``) without dispatching an op: a new fake over the
    same meta twin."""
    if isinstance(t, FakeTensor):
        return FakeTensor(t._meta, t.fake_device, requires_grad=requires_grad)
    out = t.detach()
    out.requires_grad_(requires_grad)
    return out


def _leaves(args: Any) -> Iterator[Any]:
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


@functools.cache
def _below_autograd(op: OpOverload) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args, **kwargs)

    return kernel


@functools.cache
def _to_with_assert(op: OpOverload) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        x = args[0]
        aten._assert_tensor_metadata.default(x, dtype=x.dtype, device=x.device, layout=x.layout)
        return op.decompose(*args, **kwargs)

    return kernel


def composite_plan(table: dict | None) -> tuple[frozenset[Any], frozenset[Any]]:
    """(ops recorded whole, ops routed whole to the recorder) for a decomposition table.

    As torch.export's ``run_decompositions(table)``: every preservable composite-implicit op
    the table does not name stays one node; a composite op the table names reaches the
    recorder whole too, to be decomposed by the table's entry rather than by its kernel.
    """
    preservable = kept_cia_ops()
    if not table:
        return preservable, preservable
    return _plan(preservable, frozenset(table))


@functools.lru_cache(maxsize=8)
def _plan(
    preservable: frozenset[Any], named_ops: frozenset[Any]
) -> tuple[frozenset[Any], frozenset[Any]]:
    # (keyed by the table's ops: run_decompositions() hands the same default table each time)
    named = frozenset(op for op in named_ops if is_cia(op))
    return preservable - named, preservable | named


# Composite kernels that branch on the device (or on requires_grad): their value comes from
# the kernel run on the fakes themselves, which report the real device. The others run on the
# fakes' meta twins in one call (a meta tensor never requires grad). The convolutions reach
# ``aten.convolution``, whose output layout is the device backend's (_device_layout.py).
DEVICE_DEPENDENT: frozenset[Any] = frozenset(
    {
        aten.scaled_dot_product_attention.default,
        aten.conv1d.default, aten.conv1d.padding, aten.conv2d.default, aten.conv2d.padding,
        aten.conv3d.default, aten.conv3d.padding, aten.conv_transpose1d.default,
        aten.conv_transpose2d.input, aten.conv_transpose3d.input, aten._convolution_mode.default,
    }
)  # fmt: skip


def composite_value(func: Any, args: tuple, kwargs: dict, converter: FakeConverter) -> Any:
    """``func``'s result on fakes through its composite kernel, recording nothing.

    Kernels that branch on the device or on ``requires_grad`` (``DEVICE_DEPENDENT``) run on
    the fakes as they are, so the result is laid out as the same call in eager mode lays it out
    (``scaled_dot_product_attention`` takes its math path, with a contiguous result, for a mask
    that requires grad). The graph then holds views valid for that layout, as eager code would
    be. (torch.export computes kept ops' values in a no-grad re-trace; its graph breaks when its
    ``module()`` runs with grad -- see tests/export/test_fidelity.py's ATTENTION_GRAD_LAYOUT.)
    """
    if func not in DEVICE_DEPENDENT:  # one meta call: the kernel decomposes in C++
        return run_fake(func, args, kwargs, converter)
    # module state reaches ops as the real tensor
    args, kwargs = _map_tensors(converter.from_real, (args, kwargs))
    env = converter.shape_env
    if env is not None:  # sizes computed inside the kernel are not user arithmetic
        env.listener_paused += 1
    try:
        with torch._C._AutoDispatchBelowAutograd(), FakeTensorMode(converter):
            return func.decompose(*args, **kwargs)
    finally:
        if env is not None:
            env.listener_paused -= 1


def _map_tensors(fn: Callable[[torch.Tensor], Any], x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return fn(x)
    if type(x) in (list, tuple):
        return type(x)(_map_tensors(fn, a) for a in x)
    if type(x) is dict:
        return {k: _map_tensors(fn, v) for k, v in x.items()}
    return x


class CompositeOverrides:
    """Installs the kernels above at the autograd keys; restores the ops' tables on exit.

    ``whole``: the CIA ops that must reach the recorder undecomposed. (Modifying
    ``py_kernels`` is the dispatcher's own extension point; it is scoped to this context and
    undone in ``__exit__`` whatever happened.)
    """

    __slots__ = ("_saved", "_whole")

    def __init__(self, whole: Iterable[OpOverload]) -> None:
        self._whole = whole
        self._saved: list[tuple[OpOverload, dict[Any, Any]]] = []  # in install order

    def __enter__(self) -> Self:
        try:
            for op in self._whole:
                self._install(op, _at_autograd_keys(_below_autograd(op)))
            for op in _TO_OVERLOADS:
                self._install(op, _at_autograd_keys(_to_with_assert(op)))
        except BaseException:
            self.__exit__()
            raise
        return self

    def _install(self, op: OpOverload, kernels: dict[Any, Callable[..., Any]]) -> None:
        table = op.py_kernels
        self._saved.append((op, dict(table)))
        table.update(kernels)
        op._dispatch_cache.clear()

    def __exit__(self, *exc: object) -> None:
        for op, saved in reversed(self._saved):  # (an op installed twice ends as it began)
            op.py_kernels.clear()
            op.py_kernels.update(saved)
            op._dispatch_cache.clear()
        self._saved = []


@functools.cache
def _at_autograd_keys(kernel: Callable[..., Any]) -> dict[Any, Callable[..., Any]]:
    return dict.fromkeys(_AUTOGRAD_KEYS, kernel)
