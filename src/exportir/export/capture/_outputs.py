"""What ``forward`` may return: the checks that turn a captured run's outputs into the graph's
output node, with errors that name the output's path and the library's own fix (a pytree
registration, ``use_cache=False``) for classes libraries are known to return."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from exportir import pytree
from exportir.export.capture._errors import ExportError
from exportir.symbolic.data_dependent import SYM_TYPES as _SYM_TYPES

if TYPE_CHECKING:
    from exportir.export.capture.recorder import Recorder

_OUTPUT_LEAF_TYPES = (torch.Tensor, *_SYM_TYPES, int, float, bool, str, type(None))

@dataclass(frozen=True, slots=True)
class _OutputHint:
    """What a library offers for one of its classes returned from forward."""

    register: str | None  # a call that registers the class as a pytree node, if the library has one
    leave_out: str  # how to keep it out of the outputs


# classes libraries return from forward, by qualified name
_OUTPUT_HINTS = {
    "transformers.cache_utils.DynamicCache": _OutputHint(
        "transformers.integrations.executorch.register_dynamic_cache_export_support()",
        "pass use_cache=False to forward, or set model.config.use_cache = False",
    ),
    # transformers registers no pytree node for it: leaving it out is the fix that works
    "transformers.cache_utils.EncoderDecoderCache": _OutputHint(
        None, "pass use_cache=False to forward, or set model.config.use_cache = False",
    ),
}


def _check_outputs(mod: torch.nn.Module, out: Any, flat_out: list) -> None:
    """Every output leaf must be a tensor / symbolic or plain scalar / str / None; else an
    error naming the output's path and the ways out."""
    if all(isinstance(o, _OUTPUT_LEAF_TYPES) for o in flat_out):
        return
    path, leaf = next(
        (p, o) for p, o in pytree.tree_flatten_with_path(out)[0]
        if not isinstance(o, _OUTPUT_LEAF_TYPES)
    )
    cls = type(leaf)
    qualname = f"{cls.__module__}.{cls.__qualname__}"
    hint = _OUTPUT_HINTS.get(qualname)
    where = f"output{pytree.keystr(path)}" if path else "the output"
    register = f"call {hint.register} before exporting, or " if hint and hint.register else ""
    leave_out = f" ({hint.leave_out})" if hint else ""
    raise ExportError(
        f"{type(mod).__name__}.forward returns a {cls.__name__} ({qualname}) at {where}, which "
        "an exported program cannot return: outputs are tensors, Python scalars, strings, None "
        "and containers of them.\nTo fix it:\n  - if it holds tensors, "
        f"{register}register it as a pytree node with exportir.pytree.register_pytree_node("
        f"{cls.__name__}, flatten_fn, unflatten_fn) or torch.utils._pytree.register_pytree_node "
        f"(exportir honours both);\n  - or leave it out of the outputs{leave_out}."
    )


def _output_value(rec: Recorder, o: Any) -> Any:
    if isinstance(o, torch.Tensor):
        return rec.node_for(o)
    if isinstance(o, _SYM_TYPES):
        return rec.sym_arg(o)
    if isinstance(o, (int, float, bool, str, type(None))):
        return o
    raise ExportError(
        f"forward returns a {type(o).__name__}, which an exported program cannot return. "
        "Return tensors, Python scalars/strings/None, or containers of them."
    )
