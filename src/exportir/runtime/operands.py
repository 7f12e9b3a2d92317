"""What each operand of an instruction may be: the kinds of program values a kernel parameter
accepts, derived from the operator's schema (a table keyed by schema type), and whether the
kernel reads and writes it.

``Program.load`` checks every ``KernelCall`` against these before anything runs
(:mod:`exportir.runtime.typecheck`): a ``Tensor`` parameter gets a tensor value, an ``int[]``
an ``IntList``, a ``ScalarType`` an ``Int`` holding a known dtype code, an out argument a tensor
the program may write (never a constant or a view).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exportir.format import schema

Kinds = frozenset[type]

_TENSOR: Kinds = frozenset({schema.Tensor})
_NUMBER: Kinds = frozenset({schema.Int, schema.Double, schema.Bool})
_NULL: Kinds = frozenset({schema.Null})

# schema type (``str(argument.type)`` without ``Optional[...]``) -> value kinds it accepts
KINDS: Mapping[str, Kinds] = {
    "Tensor": _TENSOR,
    "List[Tensor]": frozenset({schema.TensorList}),
    "List[Optional[Tensor]]": frozenset({schema.OptionalTensorList, schema.TensorList}),
    "int": frozenset({schema.Int, schema.Bool}),
    "SymInt": frozenset({schema.Int, schema.Bool}),
    "float": _NUMBER,
    "bool": frozenset({schema.Bool, schema.Int}),
    "number": _NUMBER,
    "Scalar": _NUMBER,
    "str": frozenset({schema.String}),
    "List[int]": frozenset({schema.IntList}),
    "List[SymInt]": frozenset({schema.IntList}),
    "List[float]": frozenset({schema.DoubleList}),
    "List[bool]": frozenset({schema.BoolList}),
    "Device": frozenset({schema.String}),
    "Generator": _NULL,
}

# Enums stored as Int codes (``real_type`` names them): the codes each one has.
CODES: Mapping[str, frozenset[int]] = {
    "ScalarType": frozenset(int(t) for t in schema.ScalarType),
    "MemoryFormat": frozenset(range(4)),  # contiguous, preserve, channels_last, channels_last_3d
    "Layout": frozenset(range(2)),  # strided, sparse_coo
}

DEVICES = frozenset({"cpu"})
"""Device strings a program may name (the runtime runs on the CPU)."""


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter of a kernel: the value kinds it accepts; ``writes`` when the kernel writes
    it (``Tensor(a!)``), ``out`` when it only writes it (an out argument, not read first);
    ``code`` names the enum (:data:`CODES`) whose code an ``Int`` holds, ``device`` when the
    value names a device."""

    name: str
    kinds: Kinds
    writes: bool = False
    out: bool = False
    code: str = ""
    device: bool = False

    def describe(self) -> str:
        names = "/".join(sorted(k.__name__ for k in self.kinds))
        return f"{self.name} ({names})"


class UnsupportedSchema(ValueError):
    """A schema type the runtime has no value kind for."""


def _strip_optional(text: str) -> tuple[str, bool]:
    if text.startswith("Optional[") and text.endswith("]"):
        return text[len("Optional["):-1], True
    return text, False


def _enum(real: str) -> str:
    for name in CODES:
        if name in real:
            return name
    return ""


def param_of(argument: Any) -> Param:
    """The :class:`Param` of a ``torch._C.Argument``; raises :class:`UnsupportedSchema`."""
    text, optional = _strip_optional(str(argument.type))
    real = str(getattr(argument, "real_type", argument.type))
    code = _enum(real)
    device = "Device" in real
    kinds = KINDS.get("Device" if device else text)
    if kinds is None:
        raise UnsupportedSchema(f"argument {argument.name!r} has type {argument.type}")
    if code:
        kinds = frozenset({schema.Int})
    if optional:
        kinds = kinds | _NULL
    writes = argument.alias_info is not None and argument.alias_info.is_write
    return Param(argument.name, kinds, writes, writes and bool(argument.is_out), code, device)


def params_of(arguments: Any) -> tuple[Param, ...]:
    return tuple(param_of(a) for a in arguments)


def out_tensor(name: str) -> Param:
    """A tensor the kernel only writes (a functional fallback's result)."""
    return Param(name, _TENSOR, writes=True, out=True)


# Parameters and result kinds of the runtime primitives (schema.PRIM_OPERATORS).
_SCALAR = Param("a", _NUMBER)
_PRIM_PARAMS: Mapping[str, tuple[Param, ...]] = {
    "aten::sym_size.int": (Param("self", _TENSOR), Param("dim", frozenset({schema.Int}))),
    "aten::sym_numel.default": (Param("self", _TENSOR),),
    "aten::sym_storage_offset.default": (Param("self", _TENSOR),),
    "aten::_local_scalar_dense.default": (Param("self", _TENSOR),),
    "aten::_assert_scalar.default": (Param("self", frozenset({schema.Bool})),
                                     Param("assert_msg", frozenset({schema.String}))),
}
_INT: Kinds = frozenset({schema.Int})
_COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")
# Result kinds of the primitives: sizes are Int; comparisons Bool; true division Double; other
# arithmetic follows its operands (Int or Double).
_PRIM_RESULTS: Mapping[str, Kinds] = {
    "aten::sym_size.int": _INT,
    "aten::sym_numel.default": _INT,
    "aten::sym_storage_offset.default": _INT,
    "aten::_local_scalar_dense.default": frozenset({schema.Int, schema.Double, schema.Bool}),
    "aten::_assert_scalar.default": frozenset({schema.Null}),
    "exportir_prim::truediv.Scalar": frozenset({schema.Double}),
    **{f"exportir_prim::{c}.Scalar": frozenset({schema.Bool}) for c in _COMPARISONS},
}
SCALAR_RESULT: Kinds = frozenset({schema.Int, schema.Double})
ANY_RESULT: Kinds = _NUMBER | _TENSOR
"""What a kernel without a schema (a registered function) may return into."""


def prim_params(name: str, arity: int) -> tuple[Param, ...]:
    """The parameters of runtime primitive ``name`` (scalars unless listed)."""
    return _PRIM_PARAMS.get(name, (_SCALAR,) * arity)


def prim_result(name: str) -> Kinds:
    """The value kinds runtime primitive ``name``'s result slot may have."""
    return _PRIM_RESULTS.get(name, SCALAR_RESULT)
