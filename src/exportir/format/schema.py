"""The program file format as plain data: frozen, slotted dataclasses and closed unions.

A :class:`Program` holds named :class:`Method` s, the constant buffers they read and the delegate
blobs they call. A method is a table of values (``values``), the indices of its inputs and
outputs, the operators it calls, a schedule of :data:`Instruction` s that refer to values by
index, a debug table and its memory plan (arena sizes).

This module imports nothing but the standard library: the runtime reads it without the compiler.
Conventions that the emitter and the runtime share are documented in
``docs/format/program-file.md``; the essentials:

- ``KernelCall.args`` holds one value index per argument of the *out-variant* schema of
  ``operators[op_index]``, in schema order (keyword-only and out arguments included; defaults are
  filled in). Runtime-provided primitives (:data:`PRIM_OPERATORS`) put their result last.
  A *functional fallback* operator (overload ending in :data:`FUNCTIONAL_FALLBACK`, emitted
  only for custom ops without an out variant) takes one value per argument of the functional
  schema, then one out tensor per result: the runtime calls the functional op and copies its
  results into the outs.
- ``DelegateCall.args`` are the inputs of the delegated subgraph, ``outputs`` its results.
- ``MoveCall`` copies the contents of ``src`` into ``dst`` (same kind; tensors of equal shape).
- ``JumpFalseCall`` jumps to instruction ``dest`` when the Bool (or one-element tensor) value
  ``cond_value`` is false; otherwise falls through. ``dest <= pc`` (format 3) closes a loop.
- ``FreeCall`` releases a runtime-allocated (``DynamicStorage``) tensor.
- A tensor with ``ViewOf`` storage aliases another tensor's memory (a view: no instruction
  computes it); instructions only read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

FORMAT_VERSION = 2
"""Major version of the program format written for programs without loops."""

LOOP_FORMAT_VERSION = 3
"""Major version written for programs with a loop (a ``JumpFalseCall`` jumping back: ``map``,
``while_loop``); a 2.x reader cannot run one, so such a file is 3.0."""

READABLE_VERSIONS = (1, 2, 3)
"""Major versions a reader accepts: 2 added ``ViewOf`` storage; a 1.x file is a valid 2.x file
without views; 3 added loops (jumps back), a 2.x file is a valid 3.x file without them."""

MINOR_VERSIONS: dict[int, int] = {1: 0, 2: 2, 3: 1}
"""The minor version written with each major version. 2.2 and 3.1 added two optional method
fields: the debug node table (:class:`DebugNode`; older readers ignore it) and state shared
between methods (``Method.shared_state``; an older reader would run such a file with one state
per method)."""

SHARED_STATE_MINOR: dict[int, int] = {2: 2, 3: 1}
"""The minor version a file needs when some method shares state: 2.2 / 3.1."""


class ScalarType(IntEnum):
    """Tensor element types, numbered as c10::ScalarType (and ExecuTorch) number them."""

    BYTE = 0
    CHAR = 1
    SHORT = 2
    INT = 3
    LONG = 4
    HALF = 5
    FLOAT = 6
    DOUBLE = 7
    COMPLEX_HALF = 8
    COMPLEX_FLOAT = 9
    COMPLEX_DOUBLE = 10
    BOOL = 11
    BFLOAT16 = 15
    UINT16 = 27
    UINT32 = 28
    UINT64 = 29


ELEMENT_SIZE: dict[ScalarType, int] = {
    ScalarType.BYTE: 1,
    ScalarType.CHAR: 1,
    ScalarType.SHORT: 2,
    ScalarType.INT: 4,
    ScalarType.LONG: 8,
    ScalarType.HALF: 2,
    ScalarType.FLOAT: 4,
    ScalarType.DOUBLE: 8,
    ScalarType.COMPLEX_HALF: 4,
    ScalarType.COMPLEX_FLOAT: 8,
    ScalarType.COMPLEX_DOUBLE: 16,
    ScalarType.BOOL: 1,
    ScalarType.BFLOAT16: 2,
    ScalarType.UINT16: 2,
    ScalarType.UINT32: 4,
    ScalarType.UINT64: 8,
}

TORCH_DTYPE_NAME: dict[ScalarType, str] = {
    ScalarType.BYTE: "uint8",
    ScalarType.CHAR: "int8",
    ScalarType.SHORT: "int16",
    ScalarType.INT: "int32",
    ScalarType.LONG: "int64",
    ScalarType.HALF: "float16",
    ScalarType.FLOAT: "float32",
    ScalarType.DOUBLE: "float64",
    ScalarType.COMPLEX_HALF: "complex32",
    ScalarType.COMPLEX_FLOAT: "complex64",
    ScalarType.COMPLEX_DOUBLE: "complex128",
    ScalarType.BOOL: "bool",
    ScalarType.BFLOAT16: "bfloat16",
    ScalarType.UINT16: "uint16",
    ScalarType.UINT32: "uint32",
    ScalarType.UINT64: "uint64",
}
"""``getattr(torch, TORCH_DTYPE_NAME[t])`` is the torch dtype of ``t``."""

# Runtime-provided primitives: (name, overload) -> arity; the result is the last argument.
PRIM_OPERATORS: dict[tuple[str, str], int] = {
    ("aten::sym_size", "int"): 2,
    ("aten::sym_numel", ""): 1,
    ("aten::sym_storage_offset", ""): 1,
    ("aten::_local_scalar_dense", ""): 1,
    ("aten::_assert_scalar", ""): 2,
    ("exportir_prim::add", "Scalar"): 2,
    ("exportir_prim::sub", "Scalar"): 2,
    ("exportir_prim::mul", "Scalar"): 2,
    ("exportir_prim::floordiv", "Scalar"): 2,
    ("exportir_prim::truediv", "Scalar"): 2,
    ("exportir_prim::mod", "Scalar"): 2,
    ("exportir_prim::neg", "Scalar"): 1,
    ("exportir_prim::eq", "Scalar"): 2,
    ("exportir_prim::ne", "Scalar"): 2,
    ("exportir_prim::lt", "Scalar"): 2,
    ("exportir_prim::le", "Scalar"): 2,
    ("exportir_prim::gt", "Scalar"): 2,
    ("exportir_prim::ge", "Scalar"): 2,
}


# ------------------------------------------------------------------------------ tensor storage


@dataclass(frozen=True, slots=True)
class ConstantData:
    """Read-only data: ``Program.constants[buffer]`` (in the file's aligned data segment)."""

    buffer: int


@dataclass(frozen=True, slots=True)
class Allocation:
    """Planned memory: ``nbytes`` at byte ``offset`` of arena ``arena`` of the method."""

    arena: int
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class InputStorage:
    """A user input: the caller's tensor is bound to this value at call time."""


@dataclass(frozen=True, slots=True)
class DynamicStorage:
    """Memory the runtime allocates while running (sizes without a static upper bound)."""


@dataclass(frozen=True, slots=True)
class ViewOf:
    """An alias of the memory of value ``base`` (a tensor whose storage is not a view): element
    ``i`` of the view is element ``offset + sum(i[d] * strides[d])`` of the base's memory
    (counted in elements from its first, in its ``dim_order`` layout). Never written."""

    base: int
    offset: int
    strides: tuple[int, ...]


Storage = ConstantData | Allocation | InputStorage | DynamicStorage | ViewOf


# ------------------------------------------------------------------------------ values


def dense_strides(sizes: Sequence[int], dim_order: Sequence[int]) -> tuple[int, ...]:
    """Strides of a tensor of ``sizes`` stored densely in ``dim_order`` (outermost first)."""
    strides = [0] * len(sizes)
    step = 1
    for d in reversed(dim_order):
        strides[d] = step
        step *= max(sizes[d], 1)
    return tuple(strides)


@dataclass(frozen=True, slots=True)
class Tensor:
    """A tensor value. ``sizes`` are exact, or upper bounds when ``dynamic``.

    ``dim_order`` lists the dimensions from outermost to innermost in memory (``(0, 1, ..., n-1)``
    is contiguous). ``initial`` names a constant buffer copied into planned storage when the
    method is loaded (mutable buffers: state kept across calls).
    """

    dtype: ScalarType
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    storage: Storage
    dynamic: bool = False
    initial: int | None = None

    @property
    def numel(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * ELEMENT_SIZE[self.dtype]


@dataclass(frozen=True, slots=True)
class Int:
    value: int


@dataclass(frozen=True, slots=True)
class Double:
    value: float


@dataclass(frozen=True, slots=True)
class Bool:
    value: bool


@dataclass(frozen=True, slots=True)
class String:
    value: str


@dataclass(frozen=True, slots=True)
class Null:
    pass


@dataclass(frozen=True, slots=True)
class IntList:
    """Indices of ``Int`` values (so that list entries may be computed at run time)."""

    items: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DoubleList:
    values: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class BoolList:
    values: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class TensorList:
    """Indices of ``Tensor`` values."""

    items: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OptionalTensorList:
    """Indices of ``Tensor`` or ``Null`` values (``Tensor?[]`` arguments)."""

    items: tuple[int, ...]


EValue = (
    Tensor | Int | Double | Bool | String | Null | IntList | DoubleList | BoolList | TensorList
    | OptionalTensorList
)

EVALUE_TYPES: tuple[type, ...] = (
    Tensor, Int, Double, Bool, String, Null, IntList, DoubleList, BoolList, TensorList,
    OptionalTensorList,
)


# ------------------------------------------------------------------------------ instructions


@dataclass(frozen=True, slots=True)
class KernelCall:
    op_index: int
    args: tuple[int, ...]
    debug: int = 0


@dataclass(frozen=True, slots=True)
class DelegateCall:
    delegate_index: int
    args: tuple[int, ...]
    outputs: tuple[int, ...] = ()
    debug: int = 0


@dataclass(frozen=True, slots=True)
class MoveCall:
    src: int
    dst: int
    debug: int = 0


@dataclass(frozen=True, slots=True)
class JumpFalseCall:
    cond_value: int
    dest: int
    debug: int = 0


@dataclass(frozen=True, slots=True)
class FreeCall:
    value: int
    debug: int = 0


Instruction = KernelCall | DelegateCall | MoveCall | JumpFalseCall | FreeCall

INSTRUCTION_TYPES: tuple[type, ...] = (KernelCall, DelegateCall, MoveCall, JumpFalseCall, FreeCall)


# ------------------------------------------------------------------------------ method, program


@dataclass(frozen=True, slots=True)
class Operator:
    """An operator a method calls: ``aten::add`` + ``out`` is ``torch.ops.aten.add.out``.

    ``mylib::op`` + ``default@functional`` is the functional fallback of
    ``torch.ops.mylib.op.default`` (see :data:`FUNCTIONAL_FALLBACK`)."""

    name: str
    overload: str

    def __str__(self) -> str:
        return f"{self.name}.{self.overload}" if self.overload else self.name

    @property
    def is_functional_fallback(self) -> bool:
        return self.overload.endswith(FUNCTIONAL_FALLBACK)


FUNCTIONAL_FALLBACK = "@functional"
"""Overload suffix of a functional-fallback operator: ``KernelCall.args`` are one value per
argument of the functional op's schema, then one planned out tensor per (tensor) result; the
runtime calls the functional op by name and copies each result into its out. Only custom ops
(no out variant in their ``torch.library`` namespace) are emitted this way."""


@dataclass(frozen=True, slots=True)
class DebugEntry:
    """Where an instruction came from: the graph node and the user's ``file:line``."""

    node_name: str
    source: str = ""


DEBUG_METHOD_SCOPE = -1
"""``DebugNode.scope`` of a node of the method's own graph (else: a delegate index)."""


@dataclass(frozen=True, slots=True)
class DebugNode:
    """A graph node an instruction, or an op inside a delegate, came from (since 2.2 / 3.1).

    ``scope`` is :data:`DEBUG_METHOD_SCOPE` for nodes of the method's graph (named by the
    ``DebugEntry`` of an instruction) and the delegate index for nodes of a delegated
    subgraph (named by the delegate's own op table, e.g. the fused CPU blob's ``node`` field).
    ``target`` is the op the node called (``aten.addmm.default``), ``module`` the innermost
    ``nn.Module`` path it ran in (``encoder.layers.0.attn``; ``""`` for the root) and
    ``module_type`` that module's class. Informational: nothing at run time depends on it.
    """

    scope: int
    name: str
    target: str = ""
    source: str = ""
    module: str = ""
    module_type: str = ""


@dataclass(frozen=True, slots=True)
class MethodPlan:
    """Arena sizes in bytes (one per arena) and the plan's lower bound (peak live bytes)."""

    arenas: tuple[int, ...] = ()
    lower_bound: int = 0
    alignment: int = 16


@dataclass(frozen=True, slots=True)
class SymbolRange:
    """A symbolic size of a method's inputs (since 2.1): the name the user gave it (the ``Dim``
    name, else the input dimension it was first seen at) and the values the method accepts,
    ``min <= value <= max`` (``max`` None: unbounded)."""

    name: str
    min: int
    max: int | None


@dataclass(frozen=True, slots=True)
class DimSize:
    """A dynamic dimension of an input tensor (since 2.1): its size is
    ``coeff * symbols[symbol] + offset`` (``coeff >= 1``: ``dx``, ``2 * dx``, ``dx + 1``)."""

    symbol: int
    coeff: int = 1
    offset: int = 0


@dataclass(frozen=True, slots=True)
class SharedState:
    """A mutable buffer shared between methods (since 2.2): value ``value`` of the method is the
    program's one state tensor named ``name`` (the buffer's fully-qualified name). Every method
    naming ``name`` reads and writes the same memory, kept across calls of any of them; it is
    initialised once per loaded program, from the ``initial`` of the first method prepared."""

    name: str
    value: int


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    values: tuple[EValue, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    operators: tuple[Operator, ...]
    instructions: tuple[Instruction, ...]
    debug: tuple[DebugEntry, ...]
    plan: MethodPlan
    input_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ()
    in_spec: str = ""
    out_spec: str = ""
    # Since 2.1: the input sizes a call must have. ``input_dims`` has one entry per input: a
    # tuple with one entry per dimension of a tensor input (``None``: static, the size must be
    # exactly ``sizes[d]``; a DimSize: symbolic), ``()`` for other inputs. Both empty: unknown
    # (a 2.0 file), only the upper bounds of ``sizes`` are checked.
    symbols: tuple[SymbolRange, ...] = ()
    input_dims: tuple[tuple[DimSize | None, ...], ...] = ()
    # Since 2.2 / 3.1: the graph nodes instructions and delegate ops came from (optional).
    nodes: tuple[DebugNode, ...] = ()
    # Since 2.2: mutable buffers this method shares with the program's other methods.
    shared_state: tuple[SharedState, ...] = ()


@dataclass(frozen=True, slots=True)
class ConstantBuffer:
    """Bytes of one constant tensor (contiguous, native little-endian element layout)."""

    data: bytes | memoryview

    @property
    def nbytes(self) -> int:
        return len(self.data) if isinstance(self.data, bytes) else self.data.nbytes


@dataclass(frozen=True, slots=True)
class CompileSpec:
    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class Delegate:
    """A blob produced by a backend's ``preprocess``, executed by the runtime's delegate
    registry entry for ``backend_id``."""

    backend_id: str
    data: bytes | memoryview
    compile_specs: tuple[CompileSpec, ...] = ()

    @property
    def nbytes(self) -> int:
        return len(self.data) if isinstance(self.data, bytes) else self.data.nbytes


@dataclass(frozen=True, slots=True)
class Program:
    version: int
    methods: tuple[Method, ...]
    constants: tuple[ConstantBuffer, ...] = ()
    delegates: tuple[Delegate, ...] = ()

    def method(self, name: str) -> Method:
        for m in self.methods:
            if m.name == name:
                return m
        names = ", ".join(repr(m.name) for m in self.methods)
        raise KeyError(f"program has no method {name!r}; it has {names}")

    @property
    def method_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.methods)
