"""``torch.compiler.assume_constant_result`` and draft decisions: values of the example inputs.

A function decorated with ``torch.compiler.assume_constant_result`` (torch marks it with
``_dynamo_marked_constant``) returns a constant of the program: its value on the example
inputs, as torch.export's strict mode burns it in. While capture runs, a profile hook watches
the calls and returns of the marked functions: inside one, a data-dependent decision (``int(t.
sum().item())``) specializes its symbols to their example values; a returned data-dependent scalar (``y.int().item()``) is
specialized to its example value (its symbol replaced everywhere, no runtime assert) and a
returned tensor becomes a lifted constant of that value. The ops that computed them are then
dead and removed.

Marked functions are found on the classes of the exported module and its submodules and in the
Python modules defining them (and the exported function's module); a marked function defined
elsewhere (another library) is traced like any other.

:class:`DataDependentHooks` is the context object capture enters: it owns the
:class:`RealValues` replay, installs the hook only when marked functions exist (no cost
otherwise), and in draft mode lets the ShapeEnv decide data-dependent conditions by the example
inputs. Everything is restored on exit.
"""

from __future__ import annotations

import sys
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any, Self

import torch

from exportir import pytree
from exportir.export._real_values import RealValues
from exportir.export.fake import fake_like

if TYPE_CHECKING:
    from exportir.export.capture import Recorder

_MARK = "_dynamo_marked_constant"
_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


class ConstantResultError(RuntimeError):
    """A marked function's result cannot be made a constant."""


def marked_functions(mod: torch.nn.Module) -> set[CodeType]:
    """Code objects of the functions marked ``assume_constant_result`` that ``mod`` can call."""
    namespaces: list[dict[str, Any]] = []
    for m in mod.modules():
        for cls in type(m).__mro__:
            if cls is object or cls.__module__.startswith("torch.nn."):
                continue
            namespaces.append(vars(cls))
            module = sys.modules.get(cls.__module__)
            if module is not None:
                namespaces.append(vars(module))
    fn = getattr(mod, "exported_function", None)
    if fn is not None and hasattr(fn, "__globals__"):
        namespaces.append({"fn": fn, **fn.__globals__})
    found = set()
    for ns in namespaces:
        for value in list(ns.values()):
            value = getattr(value, "__func__", value)  # staticmethod / classmethod
            if getattr(value, _MARK, False) and hasattr(value, "__code__"):
                found.add(value.__code__)
    return found


class DataDependentHooks:
    """Context object of one capture: example-input values for ``assume_constant_result`` and,
    with ``draft=True``, for data-dependent decisions (see the module docstring)."""

    __slots__ = ("_codes", "_draft", "_frames", "_previous", "_rec", "values")

    def __init__(self, rec: Recorder, mod: torch.nn.Module, *, draft: bool = False) -> None:
        self._rec = rec
        self._draft = draft
        self._codes = marked_functions(mod)
        self._previous: Any = None
        self._frames: list[FrameType] = []  # the marked functions running now
        self.values = RealValues(rec)

    def __enter__(self) -> Self:
        env = self._rec.shape_env
        env.example_value = self._example_value
        env.draft = self._draft
        if self._codes:
            # sys.setprofile is process state: the previous profiler is chained and restored
            self._previous = sys.getprofile()
            sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._codes:
                sys.setprofile(self._previous)
        finally:
            env = self._rec.shape_env
            env.example_value, env.draft, env.constant_depth = None, False, 0

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if self._previous is not None:
            self._previous(frame, event, arg)
        if frame.f_code not in self._codes:
            return
        # inside the function, data-dependent decisions take the example's values too
        if event == "call":
            self._frames.append(frame)
            self._rec.shape_env.constant_depth += 1
        elif event == "return":
            self._frames.pop()
            self._rec.shape_env.constant_depth -= 1
            self.make_constant(arg, frame)

    def _example_value(self, expr: Any) -> Any:
        value = self.values.value_of(expr)
        if value is None and self._frames:  # inside a marked function: say which
            raise self._unknown(str(expr), self._frames[-1])
        return value

    # -- burning in -------------------------------------------------------------------------

    def make_constant(self, result: Any, frame: FrameType | None = None) -> None:
        """Make every data-dependent part of ``result`` its value on the example inputs."""
        for leaf in pytree.tree_leaves(result):
            if isinstance(leaf, _SYM_TYPES):
                self._constant_scalar(leaf, frame)
            elif isinstance(leaf, torch.Tensor):
                self._constant_tensor(leaf, frame)

    def _unknown(self, what: str, frame: FrameType | None) -> ConstantResultError:
        where = (
            f'File "{frame.f_code.co_filename}", line {frame.f_code.co_firstlineno}, in '
            f"{frame.f_code.co_name}" if frame is not None else "<unknown>"
        )
        return ConstantResultError(
            f"assume_constant_result: the value of {what} on the example inputs could not be "
            f"computed (an op before it has no kernel that runs on real tensors).\n  {where}\n"
            "Compute the value outside the model and pass it in, or remove the decorator."
        )

    def _constant_scalar(self, x: Any, frame: FrameType | None) -> None:
        env = self._rec.shape_env
        expr = x.node.expr
        for sym in sorted(expr.free_symbols - env.var_to_hint.keys(), key=str):
            value = self.values.symbol_value(sym)
            if value is None:
                raise self._unknown(str(sym), frame)
            env.specialize(sym, value)

    def _constant_tensor(self, fake: torch.Tensor, frame: FrameType | None) -> None:
        real = self.values.tensor_value(fake)
        if real is None:
            raise self._unknown(f"a {tuple(fake.shape)} tensor", frame)
        for size in fake.shape:
            if isinstance(size, torch.SymInt):
                self._constant_scalar(size, frame)
        placeholder_val = fake_like(real, requires_grad=False)
        self._rec._lift_constant(real, placeholder_val)
        self._rec.nodes[id(fake)] = (fake, self._rec.nodes[id(placeholder_val)][1])
