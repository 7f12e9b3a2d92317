"""The graph signature of an ExportedProgram: what each placeholder and each output means.

An exported graph takes ``[*parameters, *buffers, *constants, *flat user inputs]`` and returns
``[*mutated state, *flat user outputs]``. ``ExportGraphSignature`` lists one ``InputSpec`` per
placeholder and one ``OutputSpec`` per output, in graph order, and answers the usual questions
(``inputs_to_parameters``, ``buffers_to_mutate``, ...) from a lazily built index, so every view
is O(1) after the first access. Names, fields and the printed text follow
``torch.export.graph_signature``.

``ModuleCallSignature`` / ``ModuleCallEntry`` (the module call graph's entries, which capture
builds and the program holds) live here too, at the bottom of the export rooms; torch defines them
in ``torch.export.exported_program``, which ``exportir.export.exported_program`` mirrors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, TypeAlias

import torch

from exportir import pytree
from exportir.fx.node import Node

__all__ = [
    "ArgumentSpec",
    "ConstantArgument",
    "CustomObjArgument",
    "ExportBackwardSignature",
    "ExportGraphSignature",
    "InputKind",
    "InputSpec",
    "ModuleCallEntry",
    "ModuleCallSignature",
    "OutputKind",
    "OutputSpec",
    "SymBoolArgument",
    "SymFloatArgument",
    "SymIntArgument",
    "TensorArgument",
    "TokenArgument",
    "make_argument_spec",
]


# ---------------------------------------------------------------------------- arguments


@dataclass(frozen=True, slots=True)
class TensorArgument:
    name: str


@dataclass(frozen=True, slots=True)
class TokenArgument:
    name: str


@dataclass(frozen=True, slots=True)
class SymIntArgument:
    name: str


@dataclass(frozen=True, slots=True)
class SymFloatArgument:
    name: str


@dataclass(frozen=True, slots=True)
class SymBoolArgument:
    name: str


@dataclass(frozen=True, slots=True)
class CustomObjArgument:
    name: str
    class_fqn: str
    fake_val: Any = field(default=None, compare=False, hash=False)


@dataclass(frozen=True, slots=True)
class ConstantArgument:
    name: str
    value: int | float | bool | str | None


ArgumentSpec: TypeAlias = (
    TensorArgument
    | SymIntArgument
    | SymFloatArgument
    | SymBoolArgument
    | ConstantArgument
    | CustomObjArgument
    | TokenArgument
)
_ARGUMENT_TYPES = (
    TensorArgument,
    SymIntArgument,
    SymFloatArgument,
    SymBoolArgument,
    ConstantArgument,
    CustomObjArgument,
    TokenArgument,
)
# Arguments that name a graph node (ConstantArgument carries a value instead).
_NAMED_ARGUMENT_TYPES = (
    TensorArgument,
    SymIntArgument,
    SymFloatArgument,
    SymBoolArgument,
    CustomObjArgument,
    TokenArgument,
)


# ---------------------------------------------------------------------------- kinds and specs


class InputKind(str, Enum):
    """What a graph input (placeholder) stands for."""

    USER_INPUT = "USER_INPUT"
    PARAMETER = "PARAMETER"
    BUFFER = "BUFFER"
    CONSTANT_TENSOR = "CONSTANT_TENSOR"
    CUSTOM_OBJ = "CUSTOM_OBJ"
    TOKEN = "TOKEN"


class OutputKind(str, Enum):
    """What a graph output stands for."""

    USER_OUTPUT = "USER_OUTPUT"
    LOSS_OUTPUT = "LOSS_OUTPUT"
    BUFFER_MUTATION = "BUFFER_MUTATION"
    PARAMETER_MUTATION = "PARAMETER_MUTATION"
    GRADIENT_TO_PARAMETER = "GRADIENT_TO_PARAMETER"
    GRADIENT_TO_USER_INPUT = "GRADIENT_TO_USER_INPUT"
    USER_INPUT_MUTATION = "USER_INPUT_MUTATION"
    TOKEN = "TOKEN"


def _check_argument(owner: str, arg: object) -> None:
    if not isinstance(arg, _ARGUMENT_TYPES):
        names = ", ".join(t.__name__ for t in _ARGUMENT_TYPES)
        raise TypeError(f"{owner}.arg must be one of {names}; got {type(arg).__name__}: {arg!r}")


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One placeholder: its kind, the node it names, and the state it comes from (FQN)."""

    kind: InputKind
    arg: ArgumentSpec
    target: str | None
    persistent: bool | None = None

    def __post_init__(self) -> None:
        if self.kind == InputKind.BUFFER and self.persistent is None:
            raise ValueError(
                f"InputSpec for buffer {self.target!r} has persistent=None; pass persistent=True "
                "(saved in the state_dict) or persistent=False (kept in constants)"
            )
        _check_argument("InputSpec", self.arg)

    def __str__(self) -> str:
        target = "" if self.target is None else f" target='{self.target}'"
        persistent = "" if self.persistent is None else f" persistent={self.persistent}"
        return f"{self.arg.name}: {self.kind.name}{target}{persistent}"


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """One output: its kind, the node it names, and the state it updates (if a mutation)."""

    kind: OutputKind
    arg: ArgumentSpec
    target: str | None

    def __post_init__(self) -> None:
        _check_argument("OutputSpec", self.arg)

    def __str__(self) -> str:
        target = "" if self.target is None else f" target='{self.target}'"
        return f"{self.arg.name}: {self.kind.name}{target}"


@dataclass(frozen=True, slots=True)
class ExportBackwardSignature:
    gradients_to_parameters: dict[str, str]
    gradients_to_user_inputs: dict[str, str]
    loss_output: str


# ---------------------------------------------------------------------------- the index


def _freeze(pairs: Iterable[tuple[str, str]]) -> Mapping[str, str]:
    return MappingProxyType(dict(pairs))


def _user_value(arg: ArgumentSpec) -> Any:
    """A user input/output as torch lists it: the node name, or the constant's value."""
    return arg.value if isinstance(arg, ConstantArgument) else arg.name


def _targets(specs: Iterable[InputSpec], kind: InputKind) -> tuple[str, ...]:
    return tuple(s.target for s in specs if s.kind == kind and isinstance(s.target, str))


def _named_targets(specs: Iterable[Any], kind: Enum, arg_type: type) -> Mapping[str, str]:
    return _freeze(
        (s.arg.name, s.target)
        for s in specs
        if s.kind == kind and isinstance(s.arg, arg_type) and isinstance(s.target, str)
    )


def _tokens(specs: Iterable[Any], kind: Enum) -> tuple[str, ...]:
    out = []
    for s in specs:
        if s.kind != kind:
            continue
        if not isinstance(s.arg, TokenArgument):
            raise TypeError(f"a TOKEN spec must carry a TokenArgument; got {s.arg!r}")
        out.append(s.arg.name)
    return tuple(out)


_USER_OUTPUT_KINDS = (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT)


@dataclass(frozen=True, slots=True)
class _Index:
    """Every derived view of one version of the spec lists, built in one go."""

    parameters: tuple[str, ...]
    buffers: tuple[str, ...]
    non_persistent_buffers: tuple[str, ...]
    lifted_tensor_constants: tuple[str, ...]
    lifted_custom_objs: tuple[str, ...]
    user_inputs: tuple[Any, ...]
    user_outputs: tuple[Any, ...]
    inputs_to_parameters: Mapping[str, str]
    inputs_to_buffers: Mapping[str, str]
    inputs_to_lifted_tensor_constants: Mapping[str, str]
    inputs_to_lifted_custom_objs: Mapping[str, str]
    buffers_to_mutate: Mapping[str, str]
    parameters_to_mutate: Mapping[str, str]
    user_inputs_to_mutate: Mapping[str, str]
    input_tokens: tuple[str, ...]
    output_tokens: tuple[str, ...]

    @staticmethod
    def build(ins: list[InputSpec], outs: list[OutputSpec]) -> _Index:
        buffers = [s for s in ins if s.kind == InputKind.BUFFER]
        return _Index(
            parameters=_targets(ins, InputKind.PARAMETER),
            buffers=_targets(ins, InputKind.BUFFER),
            non_persistent_buffers=tuple(
                s.target for s in buffers if s.persistent is False and isinstance(s.target, str)
            ),
            lifted_tensor_constants=_targets(ins, InputKind.CONSTANT_TENSOR),
            lifted_custom_objs=_targets(ins, InputKind.CUSTOM_OBJ),
            user_inputs=tuple(_user_value(s.arg) for s in ins if s.kind == InputKind.USER_INPUT),
            user_outputs=tuple(_user_value(s.arg) for s in outs if s.kind in _USER_OUTPUT_KINDS),
            inputs_to_parameters=_named_targets(ins, InputKind.PARAMETER, TensorArgument),
            inputs_to_buffers=_named_targets(ins, InputKind.BUFFER, TensorArgument),
            inputs_to_lifted_tensor_constants=_named_targets(
                ins, InputKind.CONSTANT_TENSOR, TensorArgument
            ),
            inputs_to_lifted_custom_objs=_named_targets(
                ins, InputKind.CUSTOM_OBJ, CustomObjArgument
            ),
            buffers_to_mutate=_named_targets(outs, OutputKind.BUFFER_MUTATION, TensorArgument),
            parameters_to_mutate=_named_targets(
                outs, OutputKind.PARAMETER_MUTATION, TensorArgument
            ),
            user_inputs_to_mutate=_named_targets(
                outs, OutputKind.USER_INPUT_MUTATION, TensorArgument
            ),
            input_tokens=_tokens(ins, InputKind.TOKEN),
            output_tokens=_tokens(outs, OutputKind.TOKEN),
        )


class _SpecList(list):  # type: ignore[type-arg]  # holds InputSpec or OutputSpec
    """A list that counts its mutations, so the signature knows when its index is stale."""

    __slots__ = ("version",)

    def __init__(self, items: Iterable[Any] = ()) -> None:
        super().__init__(items)
        self.version = 0

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (_SpecList, (list(self),))


def _counting(name: str) -> Callable[..., Any]:
    method = getattr(list, name)

    def mutate(self: _SpecList, *args: Any, **kwargs: Any) -> Any:
        self.version += 1
        return method(self, *args, **kwargs)

    mutate.__name__ = name
    return mutate


for _name in (
    "__setitem__", "__delitem__", "__iadd__", "__imul__", "append", "extend", "insert",
    "pop", "remove", "clear", "sort", "reverse",
):  # fmt: skip
    setattr(_SpecList, _name, _counting(_name))


# ---------------------------------------------------------------------------- the signature


def _cached_view(name: str) -> property:
    def get(self: ExportGraphSignature) -> Any:
        return getattr(self._index(), name)

    get.__name__ = name
    return property(get)


class ExportGraphSignature:
    """Inputs and outputs of an exported graph, one spec per placeholder / output.

    ``input_specs`` and ``output_specs`` are ordinary (mutable) lists; every derived view is
    rebuilt lazily after the lists change, so reading a view costs O(1).
    """

    __slots__ = ("_cache", "_cache_key", "_input_specs", "_output_specs")

    def __init__(self, input_specs: Iterable[InputSpec], output_specs: Iterable[OutputSpec]):
        self.input_specs = input_specs  # type: ignore[assignment]  # setter wraps into _SpecList
        self.output_specs = output_specs  # type: ignore[assignment]
        self._cache: _Index | None = None
        self._cache_key: tuple[int, int, int, int] = (0, 0, -1, -1)

    # -- the two lists ------------------------------------------------------------------------

    @property
    def input_specs(self) -> list[InputSpec]:
        return self._input_specs

    @input_specs.setter
    def input_specs(self, specs: Iterable[InputSpec]) -> None:
        self._input_specs = _SpecList(specs)

    @property
    def output_specs(self) -> list[OutputSpec]:
        return self._output_specs

    @output_specs.setter
    def output_specs(self, specs: Iterable[OutputSpec]) -> None:
        self._output_specs = _SpecList(specs)

    def _index(self) -> _Index:
        ins, outs = self._input_specs, self._output_specs
        key = (id(ins), id(outs), ins.version, outs.version)
        if self._cache is None or key != self._cache_key:
            self._cache = _Index.build(ins, outs)
            self._cache_key = key
        return self._cache

    # -- derived views (all O(1) once built) --------------------------------------------------

    parameters = _cached_view("parameters")
    buffers = _cached_view("buffers")
    non_persistent_buffers = _cached_view("non_persistent_buffers")
    lifted_tensor_constants = _cached_view("lifted_tensor_constants")
    lifted_custom_objs = _cached_view("lifted_custom_objs")
    user_inputs = _cached_view("user_inputs")
    user_outputs = _cached_view("user_outputs")
    inputs_to_parameters = _cached_view("inputs_to_parameters")
    inputs_to_buffers = _cached_view("inputs_to_buffers")
    inputs_to_lifted_tensor_constants = _cached_view("inputs_to_lifted_tensor_constants")
    inputs_to_lifted_custom_objs = _cached_view("inputs_to_lifted_custom_objs")
    buffers_to_mutate = _cached_view("buffers_to_mutate")
    parameters_to_mutate = _cached_view("parameters_to_mutate")
    user_inputs_to_mutate = _cached_view("user_inputs_to_mutate")
    input_tokens = _cached_view("input_tokens")
    output_tokens = _cached_view("output_tokens")

    @property
    def assertion_dep_token(self) -> Mapping[int, str] | None:
        return None

    @property
    def backward_signature(self) -> ExportBackwardSignature | None:
        return _backward_signature(self._output_specs)

    # -- editing ------------------------------------------------------------------------------

    def replace_all_uses(self, old: str, new: str) -> None:
        """Rename every argument called ``old`` (inputs and outputs) to ``new``."""
        if not isinstance(old, str) or not isinstance(new, str):
            raise TypeError(f"replace_all_uses takes two node names (str); got {old!r} and {new!r}")
        for specs in (self._output_specs, self._input_specs):
            for i, spec in enumerate(specs):
                if isinstance(spec.arg, _NAMED_ARGUMENT_TYPES) and spec.arg.name == old:
                    arg = dataclasses.replace(spec.arg, name=new)
                    specs[i] = dataclasses.replace(spec, arg=arg)

    def get_replace_hook(self, replace_inputs: bool = False) -> Callable[[Any, str, Any], None]:
        """A GraphModule replace hook keeping output (and optionally input) names in sync."""

        def hook(old: Any, new: str, user: Any) -> None:
            if user.op == "output" or (replace_inputs and old.op == "placeholder"):
                self.replace_all_uses(old.name, new)

        return hook

    # -- value semantics and printing ---------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ExportGraphSignature):
            return NotImplemented
        return list(self._input_specs) == list(other._input_specs) and list(
            self._output_specs
        ) == list(other._output_specs)

    __hash__ = None  # type: ignore[assignment]  # mutable container

    def __repr__(self) -> str:
        return (
            f"ExportGraphSignature(input_specs={list(self._input_specs)!r}, "
            f"output_specs={list(self._output_specs)!r})"
        )

    def __str__(self) -> str:
        input_specs = "\n".join(str(s) for s in self._input_specs)
        output_specs = "\n".join(str(s) for s in self._output_specs)
        return f"\n# inputs\n{input_specs}\n\n# outputs\n{output_specs}\n"

    def __copy__(self) -> ExportGraphSignature:
        return ExportGraphSignature(self._input_specs, self._output_specs)

    def __deepcopy__(self, memo: dict[int, Any]) -> ExportGraphSignature:
        # Specs are immutable values; a fresh pair of lists is a deep copy.
        return ExportGraphSignature(self._input_specs, self._output_specs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ExportGraphSignature, (list(self._input_specs), list(self._output_specs)))


def _backward_signature(outs: Iterable[OutputSpec]) -> ExportBackwardSignature | None:
    loss_output = None
    to_params: dict[str, str] = {}
    to_inputs: dict[str, str] = {}
    tables = {
        OutputKind.GRADIENT_TO_PARAMETER: to_params,
        OutputKind.GRADIENT_TO_USER_INPUT: to_inputs,
    }
    for spec in outs:
        if spec.kind == OutputKind.LOSS_OUTPUT:
            if loss_output is not None:
                raise ValueError("the signature has more than one LOSS_OUTPUT; keep exactly one")
            loss_output = spec.arg.name
        elif spec.kind in tables:
            if not isinstance(spec.target, str) or not isinstance(spec.arg, TensorArgument):
                raise ValueError(f"{spec.kind.name} output {spec} needs a tensor and a target")
            tables[spec.kind][spec.arg.name] = spec.target
    if loss_output is None:
        return None
    return ExportBackwardSignature(to_params, to_inputs, loss_output)


# ---------------------------------------------------------------------------- building specs


def _custom_obj_argument(name: str, val: Any) -> CustomObjArgument | None:
    if isinstance(val, torch.ScriptObject):
        return CustomObjArgument(name, val._type().qualified_name(), None)
    script_class_name = getattr(val, "script_class_name", None)  # a fake script object
    if isinstance(script_class_name, str):
        return CustomObjArgument(name, script_class_name, val)
    return None


_SYM_ARGUMENTS: tuple[tuple[type, type], ...] = (
    (torch.SymInt, SymIntArgument),
    (torch.SymFloat, SymFloatArgument),
    (torch.SymBool, SymBoolArgument),
)


def make_argument_spec(node: Any, token_names: Iterable[str] = ()) -> ArgumentSpec:
    """The argument describing ``node`` (an fx Node with ``meta["val"]``, or a constant)."""
    if isinstance(node, (int, float, bool, str, type(None))):
        return ConstantArgument(name="", value=node)
    if "val" not in node.meta:
        raise ValueError(
            f"node {node.name} has no meta['val']; every placeholder and output value of an "
            "exported graph must record the value it produces"
        )
    val = node.meta["val"]
    if node.name in set(token_names):
        return TokenArgument(node.name)
    if isinstance(val, torch.Tensor):
        return TensorArgument(node.name)
    for sym_type, arg_type in _SYM_ARGUMENTS:
        if isinstance(val, sym_type):
            return arg_type(node.name)
    custom = _custom_obj_argument(node.name, val)
    if custom is not None:
        return custom
    if isinstance(val, (int, float, bool, str, type(None))):
        return ConstantArgument(name=node.name, value=val)
    raise TypeError(
        f"node {node.name} has a meta['val'] of unsupported type {type(val).__name__}; an "
        "exported graph's values are tensors, SymInt/SymFloat/SymBool, script objects or "
        "Python constants"
    )


# ---------------------------------------------------------------------------- module calls


@dataclass(slots=True)
class ModuleCallSignature:
    """Flat inputs/outputs and pytree specs of one (preserved) module call."""

    inputs: list[ArgumentSpec]
    outputs: list[ArgumentSpec]
    in_spec: pytree.TreeSpec
    out_spec: pytree.TreeSpec
    forward_arg_names: list[str] | None = None

    def replace_all_uses_with(self, original_node: Node, new_node: Node) -> None:
        """Rename arguments naming ``original_node`` to ``new_node``'s name."""
        for args in (self.inputs, self.outputs):
            for i, arg in enumerate(args):
                if getattr(arg, "name", None) == original_node.name:
                    args[i] = dataclasses.replace(arg, name=new_node.name)


@dataclass(slots=True)
class ModuleCallEntry:
    fqn: str
    signature: ModuleCallSignature | None = None
