"""Module state during capture: what forward changed, and putting it back afterwards.

Seed 004's rules: all state is initialized before export; reads are always fine; plain static
attributes may change (the new value is burned in); tensor-valued plain attributes may not be
assigned (make them buffers); buffers may be updated in place or reassigned; parameters may not
be updated. Capture runs forward on the real module, so :class:`ModuleState` snapshots every
module's parameters, buffers and tensor attributes on entry, reports what forward changed, and
restores the snapshot on exit whatever happened.

Plain attributes are restored with their containers as they were: forward may fill a cache held
in a dict or list attribute (timm's LeViT keeps ``attention_bias_cache[device]``), and a fake
tensor left there would be returned by the next eager call. The snapshot copies dict / list /
tuple containers (recursively, as torch.export's snapshot does) so those writes are undone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self

import torch


class StateUpdateError(RuntimeError):
    """forward changed module state in a way export does not allow."""


@dataclass(frozen=True, slots=True)
class _Saved:
    fqn: str
    module: torch.nn.Module
    parameters: dict[str, Any]
    buffers: dict[str, Any]
    tensor_attrs: dict[str, torch.Tensor]
    attrs: dict[str, Any]  # every plain attribute (static ones may change; they are restored)


def _prefix(fqn: str, name: str) -> str:
    return f"{fqn}.{name}" if fqn else name


# nn.Module's own bookkeeping: restored separately (parameters, buffers) or never written by forward
_MODULE_ATTRS = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"})


def _copy_containers(value: Any) -> Any:
    """``value`` with its dict / list / tuple containers copied; anything else is shared."""
    kind = type(value)
    if kind is dict:
        return {k: _copy_containers(v) for k, v in value.items()}
    if kind is list:
        return [_copy_containers(v) for v in value]
    if kind is tuple:
        return tuple(_copy_containers(v) for v in value)
    return value


def _attrs(mod: torch.nn.Module) -> dict[str, Any]:
    return {
        k: v if k in _MODULE_ATTRS else _copy_containers(v) for k, v in vars(mod).items()
    }


def _tensor_attrs(mod: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in vars(mod).items() if isinstance(v, torch.Tensor)}


def _autograd_state(saved: list[_Saved]) -> list[tuple[torch.Tensor, bool]]:
    """Each leaf tensor of the snapshot with its ``requires_grad``. Capture runs forward on the
    real tensors under a dispatch mode, below autograd: an in-place write of a value that
    requires grad (``self.cache[:, i] = self.proj(x)``) leaves the real buffer with a
    ``grad_fn`` and ``requires_grad=True``, though its data is untouched."""
    seen: dict[int, tuple[torch.Tensor, bool]] = {}
    for s in saved:
        for t in (*s.parameters.values(), *s.buffers.values(), *s.tensor_attrs.values()):
            if isinstance(t, torch.Tensor) and t.grad_fn is None and id(t) not in seen:
                seen[id(t)] = (t, t.requires_grad)
    return list(seen.values())


def _restore_autograd(leaves: list[tuple[torch.Tensor, bool]]) -> None:
    for t, requires_grad in leaves:
        if t.grad_fn is not None and not t._is_view():
            t.detach_()
        if t.grad_fn is None and t.requires_grad != requires_grad:
            t.requires_grad_(requires_grad)


class ModuleState:
    """Snapshot / diff / restore of a module tree's tensors (a context manager)."""

    __slots__ = ("_leaves", "_saved")

    def __init__(self, root: torch.nn.Module) -> None:
        self._saved = [
            _Saved(
                fqn,
                mod,
                dict(mod._parameters),
                dict(mod._buffers),
                _tensor_attrs(mod),
                _attrs(mod),
            )
            for fqn, mod in root.named_modules()
        ]
        self._leaves = _autograd_state(self._saved)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        for saved in self._saved:
            mod = saved.module
            mod._parameters.clear()
            mod._parameters.update(saved.parameters)
            mod._buffers.clear()
            mod._buffers.update(saved.buffers)
            # attributes forward added stay, as under torch.export: libraries mark one-time
            # set-up with them (transformers' "_output_capturing_hooks_installed" goes with
            # forward hooks registered once; dropping the flag would register them twice)
            mod.__dict__.update(saved.attrs)
        _restore_autograd(self._leaves)

    def reassigned_buffers(
        self, on_problem: Callable[[StateUpdateError, torch.nn.Module, str, str], None] | None = None
    ) -> dict[str, torch.Tensor]:
        """Buffers forward assigned a new tensor to (``self.buf = ...``), by FQN. A parameter or
        tensor-attribute assignment raises :class:`StateUpdateError`, or, with ``on_problem``
        (draft_export), is handed to it as ``(error, module, attribute, fix)`` and left out."""
        found = {}
        for saved in self._saved:
            mod = saved.module
            for err, name, fix in (*self._parameter_problems(saved), *self._attr_problems(saved)):
                if on_problem is None:
                    raise err
                on_problem(err, mod, name, fix)
            for name, old in saved.buffers.items():
                new = mod._buffers.get(name)
                if new is not old and new is not None:
                    found[_prefix(saved.fqn, name)] = new
        return found

    @staticmethod
    def _parameter_problems(saved: _Saved) -> list[tuple[StateUpdateError, str, str]]:
        problems = []
        for name, old in saved.parameters.items():
            if saved.module._parameters.get(name) is not old:
                problems.append((StateUpdateError(
                    f"forward of {type(saved.module).__name__} reassigns parameter "
                    f"'{_prefix(saved.fqn, name)}'.\n"
                    "Parameters may not be updated during export: they are inputs of the exported "
                    "program. Keep state that changes in a buffer (self.register_buffer(...))."
                ), name, (f"self.register_buffer({name!r}, <initial value>)  # in __init__, "
                          "instead of the parameter")))
        return problems

    @staticmethod
    def _attr_problems(saved: _Saved) -> list[tuple[StateUpdateError, str, str]]:
        problems = []
        for name, value in _tensor_attrs(saved.module).items():
            if saved.tensor_attrs.get(name) is not value:
                problems.append((StateUpdateError(
                    f"forward of {type(saved.module).__name__} assigns a tensor to the plain "
                    f"attribute '{_prefix(saved.fqn, name)}'.\n"
                    "Tensor-valued plain attributes are constants of the exported program and may "
                    "not be assigned during export. Register it as a buffer "
                    f"(self.register_buffer('{name}', tensor)) and assign the buffer instead."
                ), name, (f"self.register_buffer({name!r}, <value>)  # in __init__, in "
                          f"place of self.{name} = <value>")))
        return problems
