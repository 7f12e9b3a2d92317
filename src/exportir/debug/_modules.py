"""Module-level comparison: each eager submodule's output against the program's value for it.

Forward hooks on the model's submodules record each one's output (the first tensor of it, the
last call of a module called several times). The program's value for module ``encoder.0`` is
the last intermediate, in execution order, computed by a node that ran in ``encoder.0`` or one
of its submodules (the debug tables give every node's module) whose value has the output's
dtype and number of elements. When its node is the last graph node of the module (a
``getitem`` aside), it is the module's output; when views follow it (they are no
instructions), they may have transposed it, so only a match counts. This compares the program with the model itself, so a difference the captured
graph already had (not only one the lowering introduced) shows up at its module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from exportir import pytree


@dataclass(frozen=True, slots=True)
class ModuleComparison:
    """One eager submodule's output against the program's value computed for it."""

    module: str
    module_type: str
    node: str
    max_abs: float
    max_rel: float
    within: bool


def _first_tensor(value: Any) -> torch.Tensor | None:
    return next((v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)), None)


class ModuleOutputs:
    """Context manager recording the output of every submodule of ``model`` while it runs
    (hooks removed on exit)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.outputs: dict[str, torch.Tensor] = {}
        self.types: dict[str, str] = {}
        self.order: list[str] = []
        self._handles: list[Any] = []

    def __enter__(self) -> ModuleOutputs:  # noqa: PYI034 - no typing.Self on Python 3.10
        if not isinstance(self.model, torch.nn.Module):
            return self
        for name, module in self.model.named_modules():
            if name:
                self._handles.append(module.register_forward_hook(self._hook(name, module)))
        return self

    def _hook(self, name: str, module: torch.nn.Module) -> Any:
        kind = f"{type(module).__module__}.{type(module).__qualname__}"

        def hook(mod: Any, args: Any, output: Any) -> None:
            tensor = _first_tensor(output)
            if tensor is None:
                return
            self.outputs[name] = tensor.detach().clone()
            self.types[name] = kind
            if name in self.order:
                self.order.remove(name)
            self.order.append(name)

        return hook

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def last_nodes(modules: dict[str, str], order: dict[str, int]) -> dict[str, str]:
    """Module path -> the last node (in graph order) that ran in it or its submodules, from
    node -> innermost module path (``getitem`` nodes left out by the caller)."""
    last: dict[str, str] = {}
    for node in sorted(modules, key=order.__getitem__):
        parts = modules[node].split(".") if modules[node] else []
        for depth in range(1, len(parts) + 1):
            last[".".join(parts[:depth])] = node
    return last


def compare_modules(
    recorded: ModuleOutputs,
    computed: Sequence[tuple[str, str, torch.Tensor]],
    graph_last: dict[str, str],
    errors: Any,
    rtol: float,
    atol: float,
) -> list[ModuleComparison]:
    """``computed``: (node, module path, value) of every program intermediate in execution
    order; ``graph_last``: module path -> the last graph node in it (:func:`last_nodes`);
    ``errors(got, want, rtol, atol)`` the comparison of two tensors."""
    found = []
    for name in recorded.order:
        want = recorded.outputs[name]
        prefix = name + "."
        match = None
        for node, module, value in reversed(computed):
            if (module == name or module.startswith(prefix)) and (
                value.dtype == want.dtype and value.numel() == want.numel()
            ):
                match = (node, value)
                break
        if match is None:
            continue
        node, value = match
        result = errors(value.reshape(want.shape), want, rtol, atol)
        # the value is the module's output when its node is the module's last; else views
        # follow it (no instructions), which may have transposed it: only a match counts
        if (graph_last.get(name) == node and value.shape == want.shape) or result[2]:
            found.append(ModuleComparison(name, recorded.types[name], node, *result))
    return found
