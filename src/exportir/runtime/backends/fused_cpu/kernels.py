"""The fused CPU backend's kernel table: every op a blob may name, and how the executor calls it.

Each entry is keyed by an ATen overload name (``"aten.addmm.default"``) and computes exactly
what that ATen op computes, through the fastest Python entry torch has for it: a ``torch.*``
function (``torch.addmm``) or a ``torch._C._nn`` one rather than the ``torch.ops.aten``
overload, a Tensor method for the layout ops (``Tensor.permute``, ``Tensor.reshape``). Layout
ops may therefore return views: inside a delegate nothing mutates a value in place except the
in-place forms below, and the executor runs those only on memory nothing else still reads
(:func:`exportir.runtime.backends.fused_cpu.plan.check_inplace`).

A kernel is called with the op's ATen arguments normalised to the schema (positional arguments
positionally, keyword-only ones by name); a few entries bind their own calling convention
(``bind``): ``slice_copy`` becomes a subscript ``x[key]``, ``clone`` ``Tensor.contiguous`` or
nothing.

The table is closed: a blob names an entry or is refused; it never names a callable.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import torch

from exportir.runtime.backends.fused_cpu.dense import (
    LINEAR_KERNELS,
    AttrError,
    apply_attr,
    check_attr,
)
from exportir.runtime.backends.fused_cpu.dynamic_int8 import (
    DYNAMIC_INT8_KERNELS,
    DYNAMIC_INT8_SCHEMAS,
    DYNAMIC_INT8_SPECIALIZED,
)
from exportir.runtime.backends.fused_cpu.gemv import RowLinear
from exportir.runtime.backends.fused_cpu.quantized import (
    QUANTIZED_KERNEL_FNS,
    QUANTIZED_SPECIALIZED,
    library_schema,
)
from exportir.runtime.backends.fused_cpu.records import record
from exportir.runtime.backends.fused_cpu.rnn import RNN_KERNELS, RNN_PER_OP, RnnShapeError
from exportir.runtime.backends.fused_cpu.sized_conv import (
    ConvBinary,
    ConvPointwise,
    SizedConvWeight,
)

__all__ = [
    "INPLACE",
    "KERNELS",
    "OPS",
    "Call",
    "Kernel",
    "Ref",
    "SchemaMismatch",
    "bind",
    "check_args",
    "normalize",
    "op_schema",
]

_nn = torch._C._nn
_T = torch.Tensor


# The value types of this package are records (.records: tuples with named fields; Ref a small
# slotted class), not frozen dataclasses, typing.NamedTuple nor collections.namedtuple: the
# package is imported by the first load of a program with a fused delegate, and each of those
# compiles source when its class is made (a frozen dataclass ~0.6 ms, a namedtuple's __new__
# ~0.15 ms, a NamedTuple also each string annotation). The annotations below document the
# fields; defaults are the record's.

_NO_KWARGS: Mapping[str, Any] = MappingProxyType({})


class Call(record("Call", "form fn args kwargs splat",
                      defaults=(None, (), _NO_KWARGS, False))):
    """How one op runs: ``fn(*args, **kwargs)`` (``form="call"``), ``args[0][args[1]]``
    (``"item"``) or ``args[0]`` itself (``"alias"``). ``splat``: the second argument, a list of
    ints, may be passed as separate ints (``x.reshape(2, 3)`` parses faster than
    ``x.reshape([2, 3])``)."""

    __slots__ = ()
    form: str
    fn: Any
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    splat: bool


_KERNEL_DEFAULTS = (None, False, None, False, None, (), False)  # every field but fn


class Kernel(record("Kernel", "fn inplace alias bind overlaps prepare keywords splat",
                        defaults=_KERNEL_DEFAULTS)):
    """``fn`` computes the ATen op from its normalised arguments; ``inplace`` (same arguments)
    overwrites and returns the first; ``alias``: the result may share memory with the first
    argument; ``bind(args, kwargs) -> Call`` replaces the default ``Call("call", fn, ...)``;
    ``keywords`` are schema-positional arguments ``fn`` takes by name."""

    __slots__ = ()
    fn: Callable[..., Any] | None
    inplace: Callable[..., Any] | None
    alias: bool
    bind: Callable[[tuple[Any, ...], dict[str, Any]], Call] | None
    overlaps: bool  # the result may view one element several times (expand, unfold)
    # at load, ``prepare(args, constant)`` may replace arguments that are constants
    # (``constant(ref)`` gives a constant slot's tensor, or None): weights packed for oneDNN
    prepare: Callable[[tuple[Any, ...], Callable[[Any], Any]], tuple[Any, ...]] | None
    keywords: tuple[str, ...]  # positional in the schema, keyword-only in ``fn``
    splat: bool  # ``fn`` takes its int-list argument as separate ints too


class Ref:
    """An argument reading value slot ``slot`` (immutable; equal when the slots are)."""

    __slots__ = ("slot",)
    slot: int

    def __init__(self, slot: int) -> None:
        object.__setattr__(self, "slot", slot)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Ref is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Ref is immutable: cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        return type(other) is Ref and other.slot == self.slot

    def __hash__(self) -> int:
        return hash((Ref, self.slot))

    def __repr__(self) -> str:
        return f"Ref(slot={self.slot!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Ref, (self.slot,))


class SchemaMismatch(ValueError):
    """Arguments that do not fit the op's ATen schema."""


# ------------------------------------------------------------------------------ custom bindings


def _slice(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    x, dim, start, end, step = (*args, *(0, None, None, 1)[len(args) - 1 :])
    if not isinstance(dim, int) or not isinstance(step, int) or step < 1:
        return Call("call", torch.ops.aten.slice_copy.Tensor, args, kwargs)
    part = slice(start, end, step)
    # Python slicing clamps start/end like aten.slice; a negative dim counts from the end
    key = (*(slice(None),) * dim, part) if dim >= 0 else (..., part, *(slice(None),) * (-dim - 1))
    return Call("item", None, (x, key))


def _row_linear(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    return Call("call", RowLinear(), args, kwargs)


def _per_op(make: Callable[[], Any]) -> Callable[[tuple[Any, ...], dict[str, Any]], Call]:
    """A binding giving each op of a blob a kernel object of its own (``make()``)."""
    return lambda args, kwargs: Call("call", make(), args, kwargs)


def _specialized(fn: Callable[..., Any], specialize: Callable[..., Any]
                 ) -> Callable[[tuple[Any, ...], dict[str, Any]], Call]:
    """A binding running the kernel ``specialize`` made at load for this op's constant
    arguments (a static int8 linear is called with ``(qx, bias)``, a quantize with its
    tensor), else ``fn`` on all the arguments."""

    def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
        special = specialize(args, kwargs)
        if special is not None:
            return Call("call", special[0], special[1])
        return Call("call", fn, args, kwargs)

    return bind


_INDEX_PUT = torch.ops.aten.index_put.default


class _IndexPutDim:
    """``index_put(x, [None] * dim + [index], values)`` (a KV-cache write at the decode step's
    positions) through ``Tensor.index_copy``, about half the cost a call. ``index_copy`` takes
    only what it computes the same way (an int64 index of one dim, in range, values of the exact
    shape and dtype) and raises for the rest (negative or bool indices, broadcast values):
    those run ``index_put`` itself."""

    __slots__ = ("dim",)

    def __init__(self, dim: int) -> None:
        self.dim = dim

    def __call__(self, x: Any, index: Any, values: Any) -> Any:
        if type(index) is torch.Tensor and index.dim() == 1:
            try:
                return x.index_copy(self.dim, index, values)
            except (IndexError, RuntimeError):
                pass
        return _INDEX_PUT(x, [None] * self.dim + [index], values)


def _index_put(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    x, indices, values, accumulate = (*args, False)[:4]
    if (not kwargs and accumulate is False and isinstance(indices, list) and indices
            and isinstance(indices[-1], Ref) and all(i is None for i in indices[:-1])):
        return Call("call", _IndexPutDim(len(indices) - 1), (x, indices[-1], values))
    return Call("call", _INDEX_PUT, args, kwargs)


class AttentionShapeError(ValueError):
    """Flash attention arguments the kernel would read out of bounds on."""


_FLASH = torch._scaled_dot_product_flash_attention_for_cpu


def _flash_attention(q: Any, k: Any, v: Any, dropout_p: float = 0.0, is_causal: bool = False,
                     *, attn_mask: Any = None, scale: Any = None) -> Any:
    """``_scaled_dot_product_flash_attention_for_cpu``, its shapes checked first: keys and
    values may have fewer heads than the query (grouped-query attention, query head ``i``
    reading head ``i // G``), but the kernel does not check that they divide it (it crashes).
    It also reads each head's rows as if their last dim were contiguous: a query, key or value
    whose last dim is not (a key from a convolution over time, ``[B, H, S, D]`` with ``S``
    innermost, once the grouped-attention rewrite skipped the copy ``repeat_kv`` made) gave
    wrong results (torch 2.13; the public ``scaled_dot_product_attention`` copies such inputs
    before calling it), so those are made contiguous here."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
            and isinstance(v, torch.Tensor) and q.dim() == k.dim() == v.dim() == 4
            and k.shape[1] == v.shape[1] and k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0):
        shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else t for t in (q, k, v)]
        raise AttentionShapeError(
            f"flash attention needs query, key, value [B, H, S, D] with the key's and value's "
            f"heads dividing the query's; got {shapes}")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    return _FLASH(q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)


def _clone(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    fmt = kwargs.get("memory_format")
    if fmt is None or fmt is torch.preserve_format:
        return Call("alias", None, args[:1])
    if fmt is torch.contiguous_format:
        return Call("call", _T.contiguous, args[:1])
    return Call("call", _T.contiguous, args[:1], {"memory_format": fmt})


def _to_copy(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    plain = (
        kwargs.get("layout") in (None, torch.strided)
        and kwargs.get("device") in (None, torch.device("cpu"))
        and not kwargs.get("pin_memory")
        and kwargs.get("memory_format") in (None, torch.preserve_format)
    )
    if not plain:
        return Call("call", torch.ops.aten._to_copy.default, args, kwargs)
    dtype = kwargs.get("dtype")
    if dtype is None:
        return Call("alias", None, args[:1])
    return Call("call", _T.to, args[:1], {"dtype": dtype})


def _bn_functional(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple[torch.Tensor, ...]:
    """aten._native_batch_norm_legit_functional: batch norm updating copies of the stats."""
    mean, var = running_mean.clone(), running_var.clone()
    out, save_mean, save_rstd = torch.native_batch_norm(
        x, weight, bias, mean, var, training, momentum, eps
    )
    return out, save_mean, save_rstd, mean, var


_MKLDNN = torch.backends.mkldnn.is_available() and hasattr(
    torch.ops.mkldnn, "_convolution_pointwise"
)


def _conv_pointwise(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    padding: list[int],
    stride: list[int],
    dilation: list[int],
    groups: int,
    attr: str,
    scalars: list | None = None,
    algorithm: str | None = None,
) -> torch.Tensor:
    """mkldnn::_convolution_pointwise without oneDNN: convolution, then post-op ``attr``."""
    y = torch.convolution(x, weight, bias, stride, padding, dilation, False, [0, 0], groups)
    return apply_attr(y, attr, scalars or [], algorithm)


def _conv_binary(
    x: torch.Tensor,
    other: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    padding: list[int],
    stride: list[int],
    dilation: list[int],
    groups: int,
    binary_attr: str,
    alpha: Any,
    unary_attr: str | None,
    *_: Any,
) -> torch.Tensor:
    """mkldnn::_convolution_pointwise.binary (``add``) without oneDNN."""
    y = _conv_pointwise(x, weight, bias, padding, stride, dilation, groups, "none")
    y = y.add_(other)
    return torch.relu_(y) if unary_attr == "relu" else y


def _packable(weight: Any, padding: Any, stride: Any, dilation: Any, groups: Any) -> bool:
    """Whether oneDNN can pack ``weight`` for these arguments without dividing by zero or
    reading past its dimensions (the reorder checks none of this: stride 0 is a SIGFPE)."""
    spatial = weight.dim() - 2 if isinstance(weight, torch.Tensor) else -1
    lists = (padding, stride, dilation)
    if spatial < 1 or not all(_ints_of_length(x, spatial) for x in lists):
        return False
    if type(groups) is not int or groups < 1 or weight.shape[0] % groups:
        return False
    return min(stride) >= 1 and min(dilation) >= 1 and min(padding) >= 0 and weight.numel() > 0


def _ints_of_length(x: Any, n: int) -> bool:
    return isinstance(x, (list, tuple)) and len(x) == n and all(type(v) is int for v in x)


def _packer(weight_at: int, padding_at: int) -> Callable[..., tuple[Any, ...]]:
    """A constant convolution weight becomes a :class:`.sized_conv.SizedConvWeight`, packed
    for oneDNN by the first call (for its input shape; :mod:`.sized_conv`); a weight that is
    no constant, or arguments it cannot be packed for, stay as they are (the op then reports
    bad arguments when it runs)."""

    def prepare(args: tuple[Any, ...], constant: Callable[[Any], Any]) -> tuple[Any, ...]:
        if weight_at == 1:  # the unary form: its post-op and scalars are read unchecked
            try:
                check_attr(*args[7:10])
            except AttrError as e:
                raise SchemaMismatch(str(e)) from None
        weight = constant(args[weight_at])
        if weight is None or not _MKLDNN or weight.dtype != torch.float32:
            return args
        padding, stride, dilation, groups = args[padding_at : padding_at + 4]
        if not _packable(weight, padding, stride, dilation, groups) or weight.dim() != 4:
            return args
        sized = SizedConvWeight(weight, padding, stride, dilation, groups)
        return (*args[:weight_at], sized, *args[weight_at + 1 :])

    return prepare


def _sized_call(weight_at: int, make: Callable[..., Any]) -> Callable[..., Any]:
    """The binding of a convolution whose weight :func:`_packer` made a ``SizedConvWeight``:
    a :mod:`.sized_conv` kernel called without the weight."""

    def specialize(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        weight = args[weight_at] if len(args) > weight_at else None
        if kwargs or not isinstance(weight, SizedConvWeight):
            return None
        return make(weight), (*args[:weight_at], *args[weight_at + 1 :])

    return specialize


def _mkldnn_kernels() -> dict[str, Kernel]:
    ops = torch.ops.mkldnn._convolution_pointwise if _MKLDNN else None
    unary, binary = (ops.default, ops.binary) if ops else (_conv_pointwise, _conv_binary)
    return {
        "mkldnn._convolution_pointwise.default": Kernel(unary, prepare=_packer(1, 3), bind=(
            _specialized(unary, _sized_call(1, lambda w: ConvPointwise(unary, w))))),
        "mkldnn._convolution_pointwise.binary": Kernel(binary, prepare=_packer(2, 4), bind=(
            _specialized(binary, _sized_call(2, lambda w: ConvBinary(binary, w))))),
    }


def _schema_errors(prepare: Callable[..., tuple[Any, ...]]) -> Callable[..., tuple[Any, ...]]:
    """``prepare`` whose argument errors (:class:`RnnShapeError`, :class:`AttrError`) are
    :class:`SchemaMismatch`."""

    def checked(args: tuple[Any, ...], constant: Callable[[Any], Any]) -> tuple[Any, ...]:
        try:
            return prepare(args, constant)
        except (RnnShapeError, AttrError) as e:
            raise SchemaMismatch(str(e)) from None

    return checked


# ------------------------------------------------------------------------------ the table


def _same(names: str, module: Any = torch, inplace: bool = False) -> dict[str, Kernel]:
    """Ops whose ``module.<op>`` takes the ATen arguments as they are; with ``inplace``,
    ``module.<op>_`` is the in-place form."""
    table = {}
    for name in names.split():
        op = name.split(".")[1]
        table[name] = Kernel(getattr(module, op), getattr(module, op + "_") if inplace else None)
    return table


_BINARY_INPLACE = {
    "aten.add.Tensor": Kernel(torch.add, _T.add_),
    "aten.sub.Tensor": Kernel(torch.sub, _T.sub_),
    "aten.mul.Tensor": Kernel(torch.mul, _T.mul_),
    "aten.div.Tensor": Kernel(torch.div, _T.div_),
}

_LAYOUT = {
    "aten.view_copy.default": Kernel(_T.reshape, alias=True, splat=True),
    "aten.permute_copy.default": Kernel(_T.permute, alias=True, splat=True),
    "aten.expand_copy.default": Kernel(_T.expand, alias=True, splat=True, overlaps=True),
    "aten.unsqueeze_copy.default": Kernel(_T.unsqueeze, alias=True),
    "aten.squeeze_copy.dims": Kernel(_T.squeeze, alias=True),
    "aten.squeeze_copy.dim": Kernel(_T.squeeze, alias=True),
    "aten.transpose_copy.int": Kernel(_T.transpose, alias=True),
    "aten.select_copy.int": Kernel(_T.select, alias=True),
    "aten.slice_copy.Tensor": Kernel(None, alias=True, bind=_slice),
    "aten.clone.default": Kernel(None, alias=True, bind=_clone),
    "aten._to_copy.default": Kernel(None, alias=True, bind=_to_copy),
    "aten.split_with_sizes_copy.default": Kernel(torch.split_with_sizes, alias=True),
    "aten.unbind_copy.int": Kernel(torch.unbind, alias=True),
    "aten.unfold_copy.default": Kernel(_T.unfold, alias=True, overlaps=True),
    "aten.cat.default": Kernel(torch.cat),
}

KERNELS: dict[str, Kernel] = {
    **_BINARY_INPLACE,
    # elementwise
    **_same("""
        aten.mul.Scalar aten.div.Scalar aten.div.Tensor_mode
        aten.pow.Tensor_Tensor aten.pow.Tensor_Scalar aten.remainder.Scalar
        aten.remainder.Tensor aten.atan2.default aten.maximum.default aten.minimum.default
        aten.where.self aten.eq.Tensor aten.ne.Tensor aten.lt.Tensor aten.le.Tensor
        aten.gt.Tensor aten.ge.Tensor aten.eq.Scalar aten.ne.Scalar aten.lt.Scalar
        aten.le.Scalar aten.gt.Scalar aten.ge.Scalar aten.logical_and.default
        aten.logical_or.default aten.logical_xor.default aten.logical_not.default
        aten.bitwise_and.Tensor aten.bitwise_or.Tensor aten.bitwise_not.default
        aten.clamp.Tensor aten.sign.default
    """),
    **_same("""
        aten.neg.default aten.abs.default aten.exp.default aten.log.default aten.log1p.default
        aten.sqrt.default aten.rsqrt.default aten.reciprocal.default aten.sin.default
        aten.cos.default aten.erf.default aten.floor.default aten.ceil.default
        aten.clamp.default aten.relu.default aten.sigmoid.default aten.tanh.default
    """, inplace=True),
    **_same("""
        aten.gelu.default aten.hardtanh.default aten.leaky_relu.default aten.silu.default
        aten.hardswish.default aten.hardsigmoid.default aten.elu.default
    """, _nn, inplace=True),
    # softmax, normalization, reductions
    **_same("""
        aten._softmax.default aten._log_softmax.default aten.native_layer_norm.default
        aten.layer_norm.default aten.native_group_norm.default aten.group_norm.default
        aten._native_batch_norm_legit_no_training.default aten.batch_norm.default
        aten.mean.dim aten.mean.default aten.sum.dim_IntList aten.amax.default
        aten.amin.default aten.any.dim aten.argmax.default aten.cumsum.default
    """),
    # linear algebra, convolution, pooling, attention
    **_same("""
        aten.addmm.default aten.mm.default aten.bmm.default aten.matmul.default
        aten.convolution.default aten._adaptive_avg_pool2d.default aten.max_pool2d.default
        aten.constant_pad_nd.default
    """),
    "aten._scaled_dot_product_flash_attention_for_cpu.default": Kernel(_flash_attention),
    # one-row linears (LLM decode) on a weight blocked once (.gemv); one instance per op
    "aten.linear.default": Kernel(_nn.linear, bind=_row_linear),
    **_same("""
        aten.thnn_conv2d.default aten.slow_conv_transpose2d.default
        aten.avg_pool2d.default aten.max_pool2d_with_indices.default
        aten.adaptive_max_pool2d.default aten.upsample_nearest2d.vec
        aten.upsample_bilinear2d.vec
    """, _nn),
    # indexing, creation
    **_same("""
        aten.embedding.default aten.index_select.default
        aten.gather.default aten.scatter_add.default aten.slice_scatter.default
        aten.flip.default aten.full.default aten.full_like.default aten.scalar_tensor.default
        aten.arange.start_step aten.roll.default
    """),
    # torch.index_put / Tensor.index_put refuse None indices: the overloads take them
    # torch.add(x, 2, 3) would be the deprecated add(input, alpha, other)
    "aten.add.Scalar": Kernel(torch.add, keywords=("alpha",)),
    "aten.sub.Scalar": Kernel(torch.sub, keywords=("alpha",)),
    "aten.index.Tensor": Kernel(torch.ops.aten.index.Tensor),
    "aten.index_put.default": Kernel(_INDEX_PUT, bind=_index_put),
    "aten.repeat.default": Kernel(_T.repeat, splat=True),
    "aten._native_batch_norm_legit_functional.default": Kernel(_bn_functional),
    **_LAYOUT,
    **(_mkldnn_kernels() if hasattr(torch.ops.mkldnn, "_convolution_pointwise") else {}),
    # oneDNN linear, weight packed at load (.dense)
    **{name: Kernel(fn, prepare=_schema_errors(prepare)) for name, (fn, prepare) in LINEAR_KERNELS.items()},
    # LSTM / GRU over the whole sequence, shapes checked (.rnn)
    **{name: Kernel(fn, prepare=_schema_errors(prepare),
                    bind=_per_op(RNN_PER_OP[name]) if name in RNN_PER_OP else None)
       for name, (fn, prepare) in RNN_KERNELS.items()},
    # int8 / int4: quantize-dequantize, oneDNN's qlinear, weight-only matmuls (.quantized)
    **{name: Kernel(fn, prepare=prepare, bind=_specialized(fn, QUANTIZED_SPECIALIZED[name])
                    if name in QUANTIZED_SPECIALIZED else None)
       for name, (fn, prepare) in QUANTIZED_KERNEL_FNS.items()},
    # dynamically quantized int8 linear on fbgemm, float32 math without it (.dynamic_int8)
    **{name: Kernel(fn, prepare=prepare, bind=_specialized(fn, DYNAMIC_INT8_SPECIALIZED[name]))
       for name, (fn, prepare) in DYNAMIC_INT8_KERNELS.items()},
}  # fmt: skip

OPS: frozenset[str] = frozenset(KERNELS)
INPLACE: frozenset[str] = frozenset(k for k, v in KERNELS.items() if v.inplace is not None)


# ------------------------------------------------------------------------------ schemas


@functools.cache
def op_schema(name: str) -> Any:
    """The schema of kernel ``name``: torch's op's, or the backend's own kernels' (parsed, no
    torch op registered)."""
    if name in DYNAMIC_INT8_SCHEMAS:  # the backend's own kernels: schemas, no torch op
        return torch._C.parse_schema(DYNAMIC_INT8_SCHEMAS[name])
    namespace, packet, overload = name.split(".")
    own = library_schema(namespace, packet, overload)
    if own is not None:
        return own
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)._schema


class _Param(record("_Param", "name kwarg_only has_default default type_text")):
    __slots__ = ()
    name: str
    kwarg_only: bool
    has_default: bool
    default: Any
    type_text: str


class _Signature(record("_Signature", "params positional by_name returns int_bounds")):
    """An op's schema as plain Python values, read from torch once per op name (its
    attributes are C++ objects: reading them for every op of every blob was most of
    :func:`normalize`'s time)."""

    __slots__ = ()
    params: tuple[_Param, ...]
    positional: tuple[_Param, ...]
    by_name: dict[str, _Param]
    returns: tuple[str, ...]
    int_bounds: tuple[tuple[int, str, int], ...]  # (position or -1, name, least)


@functools.cache
def _signature(name: str) -> _Signature:
    schema = op_schema(name)
    params = tuple(
        _Param(a.name, a.kwarg_only, a.has_default_value(),
               a.default_value if a.has_default_value() else None, str(a.type))
        for a in schema.arguments
    )  # fmt: skip
    positional = tuple(a for a in params if not a.kwarg_only)
    bounds = tuple(
        (next((i for i, a in enumerate(positional) if a.name == arg), -1), arg, least)
        for arg, least in INT_ARGUMENT_MINIMUM.items()
        if any(a.name == arg for a in params)
    )
    return _Signature(params, positional, {a.name: a for a in params},
                      tuple(str(r.type) for r in schema.returns), bounds)  # fmt: skip


def _has_ref(x: Any) -> bool:
    if isinstance(x, list):
        return any(type(v) is Ref or (isinstance(v, list) and _has_ref(v)) for v in x)
    return type(x) is Ref


def _fits(type_text: str, value: Any) -> bool:
    """Whether a decoded argument fits a schema type: tensors only where tensors go."""
    is_ref = isinstance(value, Ref)
    if type_text == "Tensor":
        return is_ref
    if type_text == "Optional[Tensor]":
        return is_ref or value is None
    if type_text in ("List[Tensor]", "List[Optional[Tensor]]"):
        optional = type_text == "List[Optional[Tensor]]"
        return isinstance(value, list) and all(
            isinstance(v, Ref) or (optional and v is None) for v in value
        )
    return not _has_ref(value)


def normalize(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple, dict]:
    """The arguments with every positional schema argument given positionally (defaults
    filled in before the last one given) and only keyword-only ones by name."""
    sig = _signature(name)
    positional = sig.positional
    if len(args) > len(positional):
        raise SchemaMismatch(f"takes {len(positional)} positional arguments; got {len(args)}")
    for key in kwargs:
        if key not in sig.by_name:
            raise SchemaMismatch(f"unknown argument {key!r}")
    given = {a.name: v for a, v in zip(positional, args)}
    for key, value in kwargs.items():
        if key in given:
            raise SchemaMismatch(f"argument {key!r} given twice")
        given[key] = value
    last = max((i for i, a in enumerate(positional) if a.name in given), default=-1)
    pos: list[Any] = []
    for a in positional[: last + 1]:
        if a.name in given:
            pos.append(given[a.name])
        elif a.has_default:
            pos.append(a.default)
        else:
            raise SchemaMismatch(f"missing argument {a.name!r}")
    for a in sig.params:
        if a.name not in given:
            if not a.has_default:
                raise SchemaMismatch(f"missing argument {a.name!r}")
        elif not _fits(a.type_text, given[a.name]):
            raise SchemaMismatch(f"argument {a.name!r} of type {a.type_text} got {given[a.name]!r}")
    kw = {a.name: given[a.name] for a in sig.params if a.kwarg_only and a.name in given}
    return tuple(pos), kw


# Integer arguments (or items of integer lists) by schema name, and the least value a literal
# one may have. ATen checks them when most ops run, but not everywhere before using them
# (oneDNN's weight packing at load divides by the stride), so a blob breaking one is refused.
INT_ARGUMENT_MINIMUM: dict[str, int] = {
    "stride": 1, "dilation": 1, "kernel_size": 1, "groups": 1, "padding": 0,
    "output_padding": 0, "output_size": 0,
}  # fmt: skip


def _check_int_bounds(name: str, pos: tuple, kw: dict) -> None:
    for at, arg, least in _signature(name).int_bounds:
        value = pos[at] if 0 <= at < len(pos) else kw.get(arg)
        for item in value if isinstance(value, list) else [value]:
            if type(item) is int and item < least:
                raise SchemaMismatch(f"argument {arg!r} has {item}; it must be >= {least}")


def check_args(
    name: str, args: tuple, kwargs: dict, n_outs: int, multi: bool
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Raise :class:`SchemaMismatch` unless the arguments and outputs fit the op's schema (and
    literal integer arguments their bounds, :data:`INT_ARGUMENT_MINIMUM`); returns the
    arguments as :func:`normalize` gives them."""
    pos, kw = normalize(name, args, kwargs)
    _check_int_bounds(name, pos, kw)
    returns = list(_signature(name).returns)
    if returns == ["List[Tensor]"]:
        if not multi:
            raise SchemaMismatch("returns a list: outs must be a list")
        return pos, kw
    if returns == ["Tensor"]:
        if multi or n_outs != 1:
            raise SchemaMismatch("returns one tensor: outs must be one slot")
        return pos, kw
    if not multi or n_outs != len(returns):
        raise SchemaMismatch(f"returns {len(returns)} tensors: outs must list {len(returns)} slots")
    return pos, kw


def bind(
    name: str,
    args: tuple,
    kwargs: dict,
    inplace: bool = False,
    constant: Callable[[Any], Any] | None = None,
    normalized: tuple[tuple[Any, ...], dict[str, Any]] | None = None,
) -> Call:
    """The call that runs op ``name`` on (decoded) arguments; ``constant(ref)`` gives the
    tensor of a constant slot (or None) to kernels that prepare constants at load;
    ``normalized``: ``normalize(name, args, kwargs)`` when the caller has it already."""
    kernel = KERNELS[name]
    pos, kw = normalized if normalized is not None else normalize(name, args, kwargs)
    if kernel.keywords:
        params = [a.name for a in _signature(name).positional]
        moved = {p: v for p, v in zip(params, pos) if p in kernel.keywords}
        pos = tuple(v for p, v in zip(params, pos) if p not in kernel.keywords)
        kw = {**moved, **kw}
    if inplace:
        return Call("call", kernel.inplace, pos, kw)
    if kernel.prepare is not None and constant is not None:
        pos = kernel.prepare(pos, constant)
    if kernel.bind is not None:
        return kernel.bind(pos, kw)
    return Call("call", kernel.fn, pos, kw, splat=kernel.splat)
