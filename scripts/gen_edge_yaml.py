"""Generate ``src/exportir/dialects/edge/edge.yaml`` by probing ATen's CPU kernels.

For every core ATen operator (``torch.Tag.core``), the ``*_copy`` ops the Edge dialect uses for
views and the non-core ops it accepts by default (``DEFAULT_CORE_ATEN_OPS_EXCEPTIONS``), a
*probe plan* below builds small sample inputs. The script runs the real CPU kernel
over combinations of the edge dtypes (Bool, Byte, Char, Short, Int, Long, Float, Double, and the
reduced-precision floats Half and BFloat16) for the tensor inputs -- every combination when few,
otherwise per tied group -- and, for ``Scalar`` and ``ScalarType`` arguments, over a few
representative values. A combination is allowed when the kernel runs and every tensor it returns
has an edge dtype. The allowed combinations are compressed into the YAML DSL of seed 001
(``constraints.aggregate``): those over the seed's eight dtypes into ``edge.yaml``, those using
Half or BFloat16 into ``edge_reduced_float.yaml`` (see ``constraints.REDUCED_FLOAT_NAMES``).

Usage::

    PYTHONPATH=src .venv/bin/python scripts/gen_edge_yaml.py [--check] [--only OP ...]

``--check`` regenerates in memory and fails if a committed file differs.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from exportir.dialects.edge.config import DEFAULT_CORE_ATEN_OPS_EXCEPTIONS
from exportir.dialects.edge.constraints import (
    ALL_DTYPE_NAMES,
    ALL_EDGE_DTYPES,
    DTYPE_NAMES,
    aggregate,
    format_entry,
    is_tensor_like,
    tensor_variable_names,
)

OUT = Path(__file__).resolve().parents[1] / "src/exportir/dialects/edge/edge.yaml"
OUT_REDUCED = OUT.with_name("edge_reduced_float.yaml")
COMMAND = "PYTHONPATH=src .venv/bin/python scripts/gen_edge_yaml.py"
MAX_PROBES = 20000

aten = torch.ops.aten


# ---------------------------------------------------------------------------- plan vocabulary


@dataclass(frozen=True)
class X:
    """A probed tensor input. ``fill``: "pos" (1, 2, 3, ...), "zero" (index-like), "one"."""

    shape: tuple[int, ...] = (2, 3)
    fill: str = "pos"
    tie: str | None = None  # inputs with the same tie share one dtype
    zero_dim: bool = False  # also probe as a 0-dim tensor (a scalar turned into a tensor)


@dataclass(frozen=True)
class XList:
    """A list of probed tensors sharing one dtype."""

    shapes: tuple[tuple[int, ...], ...]
    fill: str = "pos"
    tie: str | None = None


@dataclass(frozen=True)
class S:
    """A Python scalar taking each of ``values``."""

    values: tuple[Any, ...] = (2, 1.5, True)


@dataclass(frozen=True)
class D:
    """A ``ScalarType`` argument taking each edge dtype (and None when ``optional``)."""

    optional: bool = False


@dataclass(frozen=True)
class Plan:
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


def P(*args: Any, **kwargs: Any) -> Plan:
    return Plan(args, kwargs)


NCHW = (1, 2, 4, 4)
NCDHW = (1, 2, 4, 4, 4)


def _with_suffix(key: str, suffix: str) -> str:
    name, dot, overload = key.partition(".")
    return f"{name}{suffix}{dot}{overload}"


def _unary() -> Plan:
    return P(X())


def _binary() -> Plan:
    return P(X(), X(zero_dim=True))


# One probe plan per op overload ("name.overload"; "name" for the default overload).
PLANS: dict[str, Plan] = {
    # -- elementwise unary
    **{
        name: _unary()
        for name in (
            "abs",
            "acos",
            "acosh",
            "asin",
            "asinh",
            "atan",
            "atanh",
            "bitwise_not",
            "ceil",
            "clone",
            "cos",
            "cosh",
            "erf",
            "exp",
            "expm1",
            "floor",
            "isinf",
            "isnan",
            "log",
            "log10",
            "log1p",
            "log2",
            "logical_not",
            "neg",
            "reciprocal",
            "relu",
            "round",
            "rsqrt",
            "sigmoid",
            "sign",
            "sin",
            "sinh",
            "sqrt",
            "tan",
            "tanh",
            "trunc",
            "alias",
            "nonzero",
            "alias_copy",
            "detach_copy",
            "lift_fresh_copy",
            "gelu",
            "elu",
            "hardtanh",
            "leaky_relu",
            "bitwise_not",
        )
    },
    "_local_scalar_dense": P(X((1,))),
    "sym_size.int": P(X(), 0),
    "sym_numel": P(X()),
    "sym_stride.int": P(X(), 0),
    "sym_storage_offset": P(X()),
    "sym_is_contiguous": P(X()),
    "resize_": P(X(), [3, 2]),
    # -- elementwise binary (tensor, tensor)
    **{
        name: _binary()
        for name in (
            "add.Tensor",
            "sub.Tensor",
            "mul.Tensor",
            "div.Tensor",
            "atan2",
            "bitwise_and.Tensor",
            "bitwise_or.Tensor",
            "bitwise_xor.Tensor",
            "eq.Tensor",
            "ge.Tensor",
            "gt.Tensor",
            "le.Tensor",
            "lt.Tensor",
            "ne.Tensor",
            "fmod.Tensor",
            "remainder.Tensor",
            "logical_and",
            "logical_or",
            "logical_xor",
            "maximum",
            "minimum",
            "pow.Tensor_Tensor",
        )
    },
    "div.Tensor_mode": P(X(), X(zero_dim=True), rounding_mode="floor"),
    "atan2.out": P(X(), X(), out=X()),
    # -- elementwise with a Scalar operand
    **{
        name: P(X(), S())
        for name in (
            "add.Scalar",
            "sub.Scalar",
            "mul.Scalar",
            "div.Scalar",
            "bitwise_and.Scalar",
            "bitwise_or.Scalar",
            "bitwise_xor.Scalar",
            "eq.Scalar",
            "ge.Scalar",
            "gt.Scalar",
            "le.Scalar",
            "lt.Scalar",
            "ne.Scalar",
            "fmod.Scalar",
            "remainder.Scalar",
            "pow.Tensor_Scalar",
            "fill.Scalar",
        )
    },
    "div.Scalar_mode": P(X(), S(), rounding_mode="floor"),
    "pow.Scalar": P(S(), X()),
    "clamp": P(X(), S((1, 1.5)), S((2, 2.5))),
    "clamp.Tensor": P(X(), X(zero_dim=True), X(zero_dim=True)),
    "where.self": P(X(), X(), X(zero_dim=True)),
    "full_like": P(X(), S(), dtype=D(optional=True)),
    # -- reductions and scans
    "amax": P(X(), [1]),
    "amin": P(X(), [1]),
    "any": P(X()),
    "any.dim": P(X(), 1),
    "any.dims": P(X(), [1]),
    "argmax": P(X(), 1),
    "argmin": P(X(), 1),
    "cumsum": P(X(), 1, dtype=D(optional=True)),
    "mean": P(X(), dtype=D(optional=True)),
    "mean.dim": P(X(), [1], dtype=D(optional=True)),
    "prod": P(X(), dtype=D(optional=True)),
    "prod.dim_int": P(X(), 1, dtype=D(optional=True)),
    "sum.dim_IntList": P(X(), [1], dtype=D(optional=True)),
    "var.correction": P(X(), [1]),
    "var.dim": P(X(), [1]),
    "max.dim": P(X(), 1),
    "min.dim": P(X(), 1),
    "sort": P(X()),
    "topk": P(X(), 2),
    "_log_softmax": P(X(), 1, False),
    "_softmax": P(X(), 1, False),
    # -- shapes and views (and their *_copy forms)
    **{
        _with_suffix(name, suffix): plan
        for name, plan in {
            "expand": P(X((1, 3)), [2, 3]),
            "permute": P(X(), [1, 0]),
            "view": P(X(), [6]),
            "select.int": P(X(), 0, 0),
            "slice.Tensor": P(X(), 1, 0, 2),
            "squeeze.dim": P(X((1, 3)), 0),
            "squeeze.dims": P(X((1, 3)), [0]),
            "unsqueeze": P(X(), 0),
            "split_with_sizes": P(X(), [1, 1]),
            "diagonal": P(X()),
            "as_strided": P(X(), [2, 2], [1, 1]),
        }.items()
        for suffix in ("", "_copy")
    },
    "squeeze_copy": P(X((1, 3))),
    "t_copy": P(X()),
    "transpose_copy.int": P(X(), 0, 1),
    "unbind_copy.int": P(X(), 0),
    "unfold_copy": P(X(), 1, 2, 1),
    "narrow_copy": P(X(), 1, 0, 2),
    "split_copy.Tensor": P(X(), 1),
    "view_copy.dtype": P(X((2, 8)), D()),
    "flip": P(X(), [0]),
    "repeat": P(X(), [2, 1]),
    "constant_pad_nd": P(X(), [1, 1]),
    "cat": P(XList(((2, 3), (2, 3)))),
    "copy": P(X(), X()),
    "_to_copy": P(X(), dtype=D()),
    # -- indexing
    "index.Tensor": P(X(), [X((2,), fill="zero")]),
    "index_put": P(X(), [X((2,), fill="zero")], X((3,))),
    "index_select": P(X(), 0, X((1,), fill="zero")),
    "gather": P(X(), 1, X((2, 3), fill="zero")),
    "scatter.src": P(X(), 1, X((2, 3), fill="zero"), X()),
    "scatter.value": P(X(), 1, X((2, 3), fill="zero"), S()),
    "scatter_add": P(X(), 1, X((2, 3), fill="zero"), X()),
    "scatter_reduce.two": P(X(), 1, X((2, 3), fill="zero"), X(), "sum"),
    "select_scatter": P(X(), X((3,)), 0, 0),
    "slice_scatter": P(X(), X((2, 2)), 1, 0, 2),
    "masked_scatter": P(X(), X(fill="one"), X()),
    "embedding": P(X((5, 3)), X((4,), fill="zero")),
    "embedding_dense_backward": P(X((4, 3)), X((4,), fill="zero"), 5, -1, False),
    "_embedding_bag": P(
        X((5, 3)),
        X((4,), fill="zero", tie="idx"),
        X((2,), fill="zero", tie="idx"),
        False,
        0,
        False,
        X((4,), tie="w"),
    ),
    # -- factories
    "empty.memory_format": P([2, 3], dtype=D()),
    "empty_strided": P([2, 3], [3, 1], dtype=D()),
    "full": P([2, 3], S(), dtype=D(optional=True)),
    "arange.start_step": P(0, 4, 1, dtype=D()),
    "rand": P([2, 3], dtype=D()),
    "randn": P([2, 3], dtype=D()),
    "randperm": P(4, dtype=D()),
    "scalar_tensor": P(S(), dtype=D()),
    # -- linear algebra
    "addmm": P(X((3,)), X((2, 4)), X((4, 3))),
    "mm": P(X((2, 3)), X((3, 2))),
    "bmm": P(X((1, 2, 3)), X((1, 3, 2))),
    "_cdist_forward": P(X((2, 3)), X((4, 3)), 2.0, None),
    "_pdist_forward": P(X((4, 3)), 2.0),
    # -- convolution and pooling
    "convolution": P(
        X((1, 2, 5, 5)), X((3, 2, 3, 3)), X((3,)), [1, 1], [0, 0], [1, 1], False, [0, 0], 1
    ),
    "convolution_backward": P(
        X((1, 3, 3, 3)),
        X((1, 2, 5, 5)),
        X((3, 2, 3, 3)),
        [3],
        [1, 1],
        [0, 0],
        [1, 1],
        False,
        [0, 0],
        1,
        [True, True, True],
    ),
    "_adaptive_avg_pool2d": P(X(NCHW), [2, 2]),
    "_adaptive_avg_pool2d_backward": P(X((1, 2, 2, 2)), X(NCHW)),
    "_adaptive_avg_pool3d": P(X(NCDHW), [2, 2, 2]),
    "adaptive_avg_pool1d": P(X((1, 2, 4)), [2]),
    "avg_pool1d": P(X((1, 2, 4)), [2]),
    "avg_pool2d": P(X(NCHW), [2, 2]),
    "avg_pool2d_backward": P(X((1, 2, 2, 2)), X(NCHW), [2, 2], [2, 2], [0, 0], False, True, None),
    "avg_pool3d": P(X(NCDHW), [2, 2, 2]),
    "max_pool2d_with_indices": P(X(NCHW), [2, 2]),
    "max_pool2d_with_indices_backward": P(
        X((1, 2, 2, 2)),
        X(NCHW),
        [2, 2],
        [2, 2],
        [0, 0],
        [1, 1],
        False,
        X((1, 2, 2, 2), fill="zero"),
    ),
    "max_pool3d_with_indices": P(X(NCDHW), [2, 2, 2]),
    "col2im": P(X((1, 4, 4)), [3, 3], [2, 2], [1, 1], [0, 0], [1, 1]),
    "grid_sampler_2d": P(X((1, 1, 3, 3)), X((1, 2, 2, 2), fill="zero"), 0, 0, False),
    "reflection_pad1d": P(X((1, 2, 4)), [1, 1]),
    "reflection_pad2d": P(X(NCHW), [1, 1, 1, 1]),
    "reflection_pad3d": P(X((1, 1, 3, 3, 3)), [1, 1, 1, 1, 1, 1]),
    "replication_pad2d": P(X(NCHW), [1, 1, 1, 1]),
    "replication_pad3d": P(X((1, 1, 3, 3, 3)), [1, 1, 1, 1, 1, 1]),
    "upsample_bilinear2d.vec": P(X((1, 1, 2, 2)), [4, 4], False, None),
    "upsample_nearest2d.vec": P(X((1, 1, 2, 2)), [4, 4], None),
    # -- normalization and dropout
    "native_dropout": P(X(), 0.5, False),
    "native_layer_norm": P(X(), [3], X((3,), tie="wb"), X((3,), tie="wb"), 1e-5),
    "native_layer_norm_backward": P(
        X(tie="g"),
        X(tie="g"),
        [3],
        X((2, 1), tie="stat"),
        X((2, 1), tie="stat"),
        X((3,), tie="wb"),
        X((3,), tie="wb"),
        [True, True, True],
    ),
    "native_group_norm": P(X((2, 4, 3)), X((4,), tie="wb"), X((4,), tie="wb"), 2, 4, 3, 2, 1e-5),
    "native_group_norm_backward": P(
        X((2, 4, 3), tie="g"),
        X((2, 4, 3), tie="g"),
        X((2, 2), tie="stat"),
        X((2, 2), tie="stat"),
        X((4,)),
        2,
        4,
        3,
        2,
        [True, True, True],
    ),
    "_native_batch_norm_legit": P(
        X((2, 3, 4)),
        X((3,), tie="wb"),
        X((3,), tie="wb"),
        X((3,), tie="run"),
        X((3,), tie="run"),
        False,
        0.1,
        1e-5,
    ),
    "_native_batch_norm_legit.no_stats": P(
        X((2, 3, 4)),
        X((3,), tie="wb"),
        X((3,), tie="wb"),
        True,
        0.1,
        1e-5,
    ),
    "_native_batch_norm_legit_no_training": P(
        X((2, 3, 4)),
        X((3,), tie="wb"),
        X((3,), tie="wb"),
        X((3,), tie="run"),
        X((3,), tie="run"),
        0.1,
        1e-5,
    ),
    # -- non-core ops the Edge dialect accepts by default (DEFAULT_CORE_ATEN_OPS_EXCEPTIONS)
    "max": P(X()),
    "min": P(X()),
    "_upsample_bilinear2d_aa": P(X((1, 1, 2, 2)), [4, 4], False, None, None),
    "adaptive_max_pool2d": P(X((1, 1, 4, 4)), [2, 2]),
    "_native_batch_norm_legit_functional": P(
        X((2, 3, 4)),
        X((3,), tie="wb"),
        X((3,), tie="wb"),
        X((3,), tie="run"),
        X((3,), tie="run"),
        True,
        0.1,
        1e-5,
    ),
    # -- FFT (complex results: no edge dtype combination exists)
    "_fft_r2c": P(X((4,)), [0], 0, True),
    "_fft_c2r": P(X((4,)), [0], 0, 6),
}

# The view ops' copy forms the Edge dialect uses (beside every core op).
EXTRA_OPS = (
    "alias_copy",
    "as_strided_copy",
    "detach_copy",
    "diagonal_copy",
    "expand_copy",
    "lift_fresh_copy",
    "narrow_copy",
    "permute_copy",
    "select_copy.int",
    "slice_copy.Tensor",
    "split_copy.Tensor",
    "split_with_sizes_copy",
    "squeeze_copy",
    "squeeze_copy.dim",
    "squeeze_copy.dims",
    "t_copy",
    "transpose_copy.int",
    "unbind_copy.int",
    "unfold_copy",
    "unsqueeze_copy",
    "view_copy",
    "view_copy.dtype",
)


# ---------------------------------------------------------------------------- op list


def plan_key(op: torch._ops.OpOverload) -> str:
    name = op._schema.name.split("::", 1)[1]
    return name if op._overloadname == "default" else f"{name}.{op._overloadname}"


def _resolve(key: str) -> torch._ops.OpOverload:
    name, _, overload = key.partition(".")
    return getattr(getattr(aten, name), overload or "default")


def edge_ops() -> list[torch._ops.OpOverload]:
    """Every core ATen overload, the view-copy ops and the non-core ops every Edge program may
    contain (``DEFAULT_CORE_ATEN_OPS_EXCEPTIONS``), in name order."""
    found: dict[str, torch._ops.OpOverload] = {}
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        packet = getattr(aten, schema.name[len("aten::") :], None)
        op = getattr(packet, schema.overload_name or "default", None) if packet else None
        if isinstance(op, torch._ops.OpOverload) and torch.Tag.core in op.tags:
            found[plan_key(op)] = op
    for key in EXTRA_OPS:
        found[key] = _resolve(key)
    for op in DEFAULT_CORE_ATEN_OPS_EXCEPTIONS:
        found[plan_key(op)] = op
    return [found[k] for k in sorted(found)]


# ---------------------------------------------------------------------------- probing


def _leaves(plan: Plan) -> list[Any]:
    out: list[Any] = []

    def walk(value: Any) -> None:
        if isinstance(value, (X, XList, S, D)):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    for v in (*plan.args, *plan.kwargs.values()):
        walk(v)
    return out


def _make_tensor(shape: tuple[int, ...], fill: str, dtype: torch.dtype) -> torch.Tensor:
    numel = 1
    for s in shape:
        numel *= s
    if fill == "zero":
        base = torch.zeros(numel)
    elif fill == "one":
        base = torch.ones(numel)
    else:
        base = torch.arange(numel, dtype=torch.float64) % 3 + 1
    return base.reshape(shape).to(dtype)


def _assignments(plan: Plan) -> Iterator[dict[Any, Any]]:
    """Each probe: leaf index -> chosen dtype (tensors) or value (S, D); for tensors probed
    as 0-dim too, ``("zero_dim", index)`` -> whether this probe uses the 0-dim form."""
    leaves = _leaves(plan)
    groups: dict[str, list[int]] = {}
    choice_axes: list[tuple[list[int], list[Any]]] = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, (X, XList)):
            key = leaf.tie or f"#{i}"
            if key not in groups:
                groups[key] = []
                choice_axes.append((groups[key], list(ALL_EDGE_DTYPES)))
            groups[key].append(i)
        elif isinstance(leaf, S):
            choice_axes.append(([i], list(leaf.values)))
        else:
            choice_axes.append(([i], [*ALL_EDGE_DTYPES, *([None] if leaf.optional else [])]))
    zero_dims = [i for i, leaf in enumerate(leaves) if isinstance(leaf, X) and leaf.zero_dim]
    if zero_dims:
        choice_axes.append((zero_dims, [False, True]))
    total = 1
    for _, values in choice_axes:
        total *= len(values)
    if total > MAX_PROBES:
        raise SystemExit(f"a probe plan needs {total} probes (> {MAX_PROBES}); tie some inputs")
    for picks in itertools.product(*(values for _, values in choice_axes)):
        chosen: dict[Any, Any] = {}
        for (indices, _), pick in zip(choice_axes, picks):
            for i in indices:
                chosen.setdefault(i, pick)
        if zero_dims:
            flag = picks[-1]
            for i in zero_dims:
                chosen[("zero_dim", i)] = flag
        yield chosen


def _build(plan: Plan, chosen: dict[Any, Any]) -> tuple[list[Any], dict[str, Any]]:
    counter = itertools.count()

    def make(value: Any) -> Any:
        if isinstance(value, (X, XList, S, D)):
            i = next(counter)
            pick = chosen[i]
            if isinstance(value, X):
                shape = () if chosen.get(("zero_dim", i)) else value.shape
                return _make_tensor(shape, value.fill, pick)
            if isinstance(value, XList):
                return [_make_tensor(s, value.fill, pick) for s in value.shapes]
            return pick
        if isinstance(value, list):
            return [make(v) for v in value]
        if isinstance(value, tuple):
            return tuple(make(v) for v in value)
        return value

    args = [make(a) for a in plan.args]
    kwargs = {k: make(v) for k, v in plan.kwargs.items()}
    return args, kwargs


def _dtype_of(value: Any) -> torch.dtype | None:
    if isinstance(value, torch.Tensor):
        return value.dtype
    if isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, torch.Tensor):
                return v.dtype
    return None


def _bind(
    schema: torch._C.FunctionSchema, args: list[Any], kwargs: dict[str, Any]
) -> dict[str, Any]:
    bound = {a.name: v for a, v in zip(schema.arguments, args)}
    bound.update(kwargs)
    return bound


def probe(op: torch._ops.OpOverload, plan: Plan) -> tuple[list[str], set[tuple[str, ...]]]:
    """The tensor variable names of ``op`` and the edge dtype combinations its kernel accepts."""
    schema = op._schema
    arg_vars, ret_vars = tensor_variable_names(schema)
    tensor_returns = [i for i, r in enumerate(schema.returns) if is_tensor_like(r.type)]
    allowed: set[tuple[str, ...]] = set()
    for chosen in _assignments(plan):
        args, kwargs = _build(plan, chosen)
        bound = _bind(schema, args, kwargs)
        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                torch.manual_seed(0)
                out = op(*args, **kwargs)
        except Exception:  # noqa: BLE001, S112  # any failure means: this combination is unsupported
            continue
        outs = out if isinstance(out, tuple) else (out,)
        dtypes = [_dtype_of(bound.get(name)) for name in arg_vars]
        dtypes += [_dtype_of(outs[i]) for i in tensor_returns]
        if any(d is None or d not in ALL_DTYPE_NAMES for d in dtypes):
            continue
        allowed.add(tuple(ALL_DTYPE_NAMES[d] for d in dtypes))
    return [*arg_vars, *ret_vars], allowed


# ---------------------------------------------------------------------------- output

HEADER = f"""\
# @generated by scripts/gen_edge_yaml.py -- do not edit by hand.
# Regenerate with: {COMMAND}
#
# Dtype constraints of the Edge dialect (seed 001 DSL), found by running the ATen CPU kernels of
# torch {torch.__version__.split("+")[0]} over combinations of the edge dtypes. An entry with an empty
# type_constraint has no combination of edge dtypes its kernel supports.
"""

REDUCED_HEADER = f"""\
# @generated by scripts/gen_edge_yaml.py -- do not edit by hand.
# Regenerate with: {COMMAND}
#
# Reduced-precision float extension of edge.yaml (same DSL): the dtype combinations involving
# Half or BFloat16 that the ATen CPU kernels of torch {torch.__version__.split("+")[0]} run. The Edge verifier
# admits a node when edge.yaml or this table does; edge.yaml (and the allowed_types printed from
# it) keeps the seed's eight dtypes. Ops without such a combination are not listed.
"""

_BASE_NAMES = frozenset(DTYPE_NAMES.values())


def _split(combos: set[tuple[str, ...]]) -> tuple[set[tuple[str, ...]], set[tuple[str, ...]]]:
    """(combinations over the seed's eight dtypes, combinations using a reduced float)."""
    base = {c for c in combos if _BASE_NAMES.issuperset(c)}
    return base, combos - base


def generate(only: list[str] | None = None) -> tuple[str, list[str], str]:
    """``(edge.yaml text, ops without a probe plan, edge_reduced_float.yaml text)``."""
    entries: list[tuple[str, str]] = []
    reduced: list[tuple[str, str]] = []
    missing: list[str] = []
    for op in edge_ops():
        key = plan_key(op)
        if only and key not in only:
            continue
        plan = PLANS.get(key)
        if plan is None:
            missing.append(key)
            continue
        names, combos = probe(op, plan)
        base, extra = _split(combos)
        inherits = f"aten::{key}"
        type_alias, rows = aggregate(names, base)
        entries.append((key, format_entry(key, inherits, type_alias, rows)))
        if extra:
            type_alias, rows = aggregate(names, extra)
            reduced.append((key, format_entry(key, inherits, type_alias, rows)))
    body = "\n".join(text for _, text in sorted(entries))
    reduced_body = "\n".join(text for _, text in sorted(reduced))
    return HEADER + "\n" + body, missing, REDUCED_HEADER + "\n" + reduced_body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if edge.yaml is stale")
    parser.add_argument("--only", nargs="*", help="probe only these ops and print the result")
    ns = parser.parse_args(argv)
    text, missing, reduced = generate(ns.only)
    if missing:
        print(f"no probe plan for: {', '.join(missing)}; add them to PLANS", file=sys.stderr)
        return 1
    if ns.only:
        print(text)
        print(reduced)
        return 0
    if ns.check:
        stale = [p for p, t in ((OUT, text), (OUT_REDUCED, reduced))
                 if not p.exists() or p.read_text(encoding="utf-8") != t]
        for path in stale:
            print(f"{path} is stale; regenerate with: {COMMAND}", file=sys.stderr)
        return 1 if stale else 0
    OUT.write_text(text, encoding="utf-8")
    OUT_REDUCED.write_text(reduced, encoding="utf-8")
    empty = text.count("type_constraint: []")
    print(f"wrote {OUT} ({text.count('- func:')} ops, {empty} without a supported combination)")
    print(f"wrote {OUT_REDUCED} ({reduced.count('- func:')} ops with Half/BFloat16 combinations)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
