"""``torch.compiler.assume_constant_result`` and draft decisions: values of the example inputs.

A function decorated with ``torch.compiler.assume_constant_result`` (torch marks it with
``_dynamo_marked_constant``) returns a constant of the program: its value on the example
inputs, as torch.export's strict mode burns it in. While capture runs, each marked function is
called through a wrapper: inside it, a data-dependent decision (``int(t.sum().item())``)
specializes its symbols to their example values; a returned data-dependent scalar
(``y.int().item()``) is specialized to its example value (its symbol replaced everywhere, no
runtime assert) and a returned tensor becomes a lifted constant of that value. The ops that
computed them are then dead and removed.

Marked functions are found, and wrapped, where code looks them up: in the class dicts of the
exported module and its submodules and in the globals of the Python modules defining those
classes (and of the exported function). A marked function reached another way (a closure, a
module not scanned) is traced like any other function.

:class:`DataDependentHooks` is the context object capture enters: it owns the
:class:`RealValues` replay and the wrappers, and in draft mode lets the ShapeEnv decide
data-dependent conditions by the example inputs. Replacing the namespace entries is an
interception of user code: it is scoped to this context and every entry is restored in
``__exit__``, whatever happened.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self

import torch

from exportir import pytree
from exportir.export.capture._real_values import RealValues
from exportir.export.capture.fake import fake_like
from exportir.symbolic.data_dependent import SYM_TYPES as _SYM_TYPES

if TYPE_CHECKING:
    from exportir.export.capture.recorder import Recorder

_MARK = "_dynamo_marked_constant"


class ConstantResultError(RuntimeError):
    """A marked function's result cannot be made a constant."""


def _namespaces(mod: torch.nn.Module) -> list[Any]:
    """Classes and module dicts where ``mod``'s code looks functions up."""
    classes = {cls for m in mod.modules() for cls in type(m).__mro__}
    classes = {c for c in classes if c is not object and not c.__module__.startswith("torch.nn.")}
    owners: list[Any] = list(classes)
    owners += [sys.modules[m] for m in {c.__module__ for c in classes} if m in sys.modules]
    fn = getattr(mod, "exported_function", None)
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is not None:
        owners.append(module)
    return owners


def _marked(value: Any) -> Callable[..., Any] | None:
    fn = getattr(value, "__func__", value)  # staticmethod / classmethod
    return fn if getattr(fn, _MARK, False) and callable(fn) else None


def marked_functions(mod: torch.nn.Module) -> list[tuple[Any, str, Any]]:
    """``(owner, name, value)`` of every marked function ``mod``'s code can look up."""
    found = []
    for owner in _namespaces(mod):
        for name, value in list(vars(owner).items()):
            if _marked(value) is not None:
                found.append((owner, name, value))
    return found


class DataDependentHooks:
    """Context object of one capture: example-input values for ``assume_constant_result`` and,
    with ``draft=True``, for data-dependent decisions (see the module docstring)."""

    __slots__ = ("_active", "_draft", "_marked", "_rec", "_running", "values")

    def __init__(self, rec: Recorder, mod: torch.nn.Module, *, draft: bool = False) -> None:
        self._rec = rec
        self._draft = draft
        self._marked = marked_functions(mod)
        self._running: list[Callable[..., Any]] = []  # the marked functions running now
        self._active = False
        self.values = RealValues(rec)

    def __enter__(self) -> Self:
        env = self._rec.shape_env
        env.example_value = self._example_value
        env.draft = self._draft
        self._active = True
        for owner, name, value in self._marked:
            setattr(owner, name, self._wrap(value))
        return self

    def __exit__(self, *exc: object) -> None:
        self._active = False
        try:
            for owner, name, value in reversed(self._marked):
                setattr(owner, name, value)
        finally:
            env = self._rec.shape_env
            env.example_value, env.draft, env.constant_depth = None, False, 0

    def _wrap(self, value: Any) -> Any:
        fn = _marked(value)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if not self._active:  # (another thread, after capture)
                return fn(*args, **kwargs)
            # inside the function, data-dependent decisions take the example's values too
            self._running.append(fn)
            self._rec.shape_env.constant_depth += 1
            try:
                result = fn(*args, **kwargs)
            finally:
                self._running.pop()
                self._rec.shape_env.constant_depth -= 1
            self.make_constant(result, fn)
            return result

        return type(value)(call) if isinstance(value, (staticmethod, classmethod)) else call

    def _example_value(self, expr: Any) -> Any:
        value = self.values.value_of(expr)
        if value is None and self._running:  # inside a marked function: say which
            raise self._unknown(str(expr), self._running[-1])
        return value

    # -- burning in -------------------------------------------------------------------------

    def make_constant(self, result: Any, fn: Callable[..., Any] | None = None) -> None:
        """Make every data-dependent part of ``result`` its value on the example inputs."""
        for leaf in pytree.tree_leaves(result):
            if isinstance(leaf, _SYM_TYPES):
                self._constant_scalar(leaf, fn)
            elif isinstance(leaf, torch.Tensor):
                self._constant_tensor(leaf, fn)

    def _unknown(self, what: str, fn: Callable[..., Any] | None) -> ConstantResultError:
        code = getattr(fn, "__code__", None)
        where = (
            f'File "{code.co_filename}", line {code.co_firstlineno}, in {code.co_name}'
            if code is not None else "<unknown>"
        )
        return ConstantResultError(
            f"assume_constant_result: the value of {what} on the example inputs could not be "
            f"computed (an op before it has no kernel that runs on real tensors).\n  {where}\n"
            "Compute the value outside the model and pass it in, or remove the decorator."
        )

    def _constant_scalar(self, x: Any, fn: Callable[..., Any] | None) -> None:
        env = self._rec.shape_env
        expr = x.node.expr
        for sym in sorted(expr.free_symbols - env.var_to_hint.keys(), key=str):
            value = self.values.symbol_value(sym)
            if value is None:
                raise self._unknown(str(sym), fn)
            env.specialize(sym, value)

    def _constant_tensor(self, fake: torch.Tensor, fn: Callable[..., Any] | None) -> None:
        real = self.values.tensor_value(fake)
        if real is None:
            raise self._unknown(f"a {tuple(fake.shape)} tensor", fn)
        for size in fake.shape:
            if isinstance(size, torch.SymInt):
                self._constant_scalar(size, fn)
        placeholder_val = fake_like(real, requires_grad=False)
        self._rec._lift_constant(real, placeholder_val)
        self._rec.nodes[id(fake)] = (fake, self._rec.nodes[id(placeholder_val)][1])
