"""``preserve_module_call_signature``: record the flat inputs/outputs of chosen submodule calls.

While capture runs, forward hooks on each listed submodule note the flat pytree leaves of every
call (fake tensors or Python constants) and the call's ``in_spec`` / ``out_spec``. After capture,
each tensor leaf is named by the graph node whose ``meta["val"]`` is that very fake tensor (the
placeholder for an input, the recording op for a computed value). Calls after the first are
recorded under ``fqn@1``, ``fqn@2``... as torch.export does.

Limits: a submodule input/output that the final graph does not compute (a value nothing uses,
removed as dead code) and symbolic ints among the leaves are rejected with an error.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Self

import torch

from exportir import pytree
from exportir.export.signature import (
    ArgumentSpec,
    ConstantArgument,
    ExportGraphSignature,
    ModuleCallEntry,
    ModuleCallSignature,
    TensorArgument,
)
from exportir.fx.graph_module import GraphModule
from exportir.fx.node import Node

__all__ = ["ModuleCallRecorder"]

_CONSTANT_TYPES = (str, int, float, bool, type(None))


@dataclasses.dataclass(slots=True)
class _Call:
    """One call of a preserved submodule: flat leaves and specs, as the hooks saw them."""

    fqn: str
    inputs: list[Any]
    in_spec: pytree.TreeSpec
    outputs: list[Any] = dataclasses.field(default_factory=list)
    out_spec: pytree.TreeSpec | None = None


class ModuleCallRecorder:
    """Context manager: forward hooks on the submodules named by ``fqns``.

    Hooks (not a patched ``__call__``, STYLE.md 9) are registered on entry and removed in
    ``__exit__`` even when capture fails, so the user's modules are left as they were.
    """

    def __init__(self, root: torch.nn.Module, fqns: tuple[str, ...]) -> None:
        self._modules = [(fqn, _submodule(root, fqn)) for fqn in fqns]
        self._root = root
        self._handles: list[Any] = []
        self._open: dict[str, list[_Call]] = {}
        self.calls: list[_Call] = []

    def __enter__(self) -> Self:
        for fqn, module in self._modules:
            self._handles.append(
                module.register_forward_pre_hook(self._pre_hook(fqn), with_kwargs=True)
            )
            self._handles.append(
                module.register_forward_hook(self._post_hook(fqn), with_kwargs=True)
            )
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _pre_hook(self, fqn: str) -> Any:
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            flat, in_spec = pytree.tree_flatten((args, kwargs))
            _check_leaves(fqn, "input", flat)
            call = _Call(fqn, flat, in_spec)
            self.calls.append(call)
            self._open.setdefault(fqn, []).append(call)

        return hook

    def _post_hook(self, fqn: str) -> Any:
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
            call = self._open[fqn].pop()
            call.outputs, call.out_spec = pytree.tree_flatten(out)
            _check_leaves(fqn, "output", call.outputs)

        return hook

    def apply(
        self, gm: GraphModule, signature: ExportGraphSignature, call_graph: list[ModuleCallEntry]
    ) -> list[ModuleCallEntry]:
        """``call_graph`` with a signature for every recorded call (``fqn@k`` entries appended)."""
        namer = _Namer(gm, signature, self._root)
        counts: dict[str, int] = {}
        signatures: dict[str, ModuleCallSignature] = {}
        for call in self.calls:
            k = counts.get(call.fqn, 0)
            counts[call.fqn] = k + 1
            name = call.fqn if k == 0 else f"{call.fqn}@{k}"
            signatures[name] = ModuleCallSignature(
                inputs=[namer.arg(call.fqn, "input", leaf) for leaf in call.inputs],
                outputs=[namer.arg(call.fqn, "output", leaf) for leaf in call.outputs],
                in_spec=call.in_spec,
                out_spec=call.out_spec,
                forward_arg_names=None,  # as torch: only the root entry names its arguments
            )
        known = {entry.fqn for entry in call_graph}
        entries = [
            ModuleCallEntry(e.fqn, signatures.get(e.fqn, e.signature)) if e.fqn else e
            for e in call_graph
        ]
        entries += [ModuleCallEntry(f, s) for f, s in signatures.items() if f not in known]
        return entries


def _submodule(root: torch.nn.Module, fqn: str) -> torch.nn.Module:
    """The submodule at ``fqn``; AttributeError (as torch.export) when there is none."""
    if not fqn:
        raise ValueError(
            "preserve_module_call_signature lists '' (the root module); its signature is "
            "always preserved: list submodule paths only"
        )
    module: Any = root
    for part in fqn.split("."):
        if not hasattr(module, part):
            raise AttributeError(f"'{type(module).__name__}' object has no attribute '{part}'")
        module = getattr(module, part)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(
            f"preserve_module_call_signature: {fqn!r} is a {type(module).__name__}, not an "
            "nn.Module; list submodule paths only"
        )
    return module


def _check_leaves(fqn: str, what: str, leaves: list[Any]) -> None:
    for leaf in leaves:
        if isinstance(leaf, (torch.Tensor, *_CONSTANT_TYPES)):
            continue
        raise TypeError(
            f"preserve_module_call_signature: the {what}s of submodule {fqn!r} must flatten to "
            f"tensors or Python scalars (str, int, float, bool, None); got {type(leaf).__name__}"
        )


class _Namer:
    """Names flat leaves by graph nodes: fake tensor -> the node whose ``val`` it is."""

    def __init__(
        self, gm: GraphModule, signature: ExportGraphSignature, root: torch.nn.Module
    ) -> None:
        self._by_val: dict[int, Node] = {}
        for node in gm.graph.nodes:
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                self._by_val.setdefault(id(val), node)
        state = {**signature.inputs_to_parameters, **signature.inputs_to_buffers}
        by_target = {target: name for name, target in state.items()}
        tensors = {
            **dict(root.named_parameters(remove_duplicate=False)),
            **dict(root.named_buffers(remove_duplicate=False)),
        }
        self._state = {id(t): by_target[fqn] for fqn, t in tensors.items() if fqn in by_target}

    def arg(self, fqn: str, what: str, leaf: Any) -> ArgumentSpec:
        if isinstance(leaf, torch.SymInt | torch.SymFloat | torch.SymBool):
            raise NotImplementedError(
                f"preserve_module_call_signature: submodule {fqn!r} has a symbolic {what} "
                f"({leaf}); symbolic values in submodule call signatures are not supported "
                "(as in torch.export). Pass it as a tensor or export with static shapes."
            )
        if not isinstance(leaf, torch.Tensor):
            return ConstantArgument(name="", value=leaf)
        if id(leaf) in self._state:  # a real parameter/buffer passed on to the submodule
            return TensorArgument(name=self._state[id(leaf)])
        node = self._by_val.get(id(leaf))
        if node is None:
            raise NotImplementedError(
                f"preserve_module_call_signature: an {what} of submodule {fqn!r} is not a "
                "value of the exported graph (an unused result is removed as dead code); use "
                "it in forward or do not preserve this submodule's signature."
            )
        return TensorArgument(name=node.name)
