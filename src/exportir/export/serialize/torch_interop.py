"""torch.export's ExportedProgram objects in: :func:`from_torch`.

A torch ``ExportedProgram`` is read by attribute only (``graph_module.graph``,
``graph_signature``, ``state_dict``, ``constants``, ``range_constraints``,
``module_call_graph``): nothing of torch.export or torch.fx is imported. It is encoded to
torch's serialized-program JSON (torch_encode.py) in memory and decoded as a .pt2 is
(torch_decode.py), so an object and a file of the same program become the same ExportedProgram
and pass the same checks (op table, refusals, verifier).
"""

from __future__ import annotations

from typing import Any

import torch

from exportir.export.program.exported_program import ExportedProgram
from exportir.export.serialize.common import SerializationError
from exportir.export.serialize.torch_decode import decode_torch_program
from exportir.export.serialize.torch_encode import encode_torch_program

__all__ = ["as_exported_program", "from_torch", "is_torch_program"]

_ATTRS = ("graph_module", "graph_signature", "state_dict", "range_constraints",
          "module_call_graph", "constants")


def is_torch_program(obj: Any) -> bool:
    """Whether ``obj`` is a ``torch.export.ExportedProgram`` (by its class's module and shape)."""
    module = type(obj).__module__ or ""
    return module.startswith("torch.export") and all(hasattr(obj, a) for a in _ATTRS)


def from_torch(ep: Any) -> ExportedProgram:
    """Our :class:`ExportedProgram` for a ``torch.export.ExportedProgram``.

    The graph, signature, parameters, buffers, constants, symbolic shapes and range
    constraints, module call graph, custom ops and ``cond`` / ``map`` / ``while_loop`` carry
    over; torch's training IR (``torch.export.export``'s in-place ops) is functionalized into
    the ATen dialect with mutation outputs. ``example_inputs`` are kept. Raises ``TypeError``
    for anything else, :class:`SerializationError` naming the node or field for a program
    holding what exportir does not read (custom objects, tensor subclasses).
    """
    if isinstance(ep, ExportedProgram):
        return ep
    if not is_torch_program(ep):
        raise TypeError(f"from_torch expects a torch.export.ExportedProgram, got "
                        f"{type(ep).__module__}.{type(ep).__qualname__}")
    opset = {"aten": int(torch._C._get_max_operator_version())}
    model = encode_torch_program(ep, opset, where="torch ExportedProgram")
    constants = dict(ep.constants)
    bad = [k for k, v in constants.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise SerializationError(f"constants[{bad[0]!r}]: a {type(constants[bad[0]]).__name__} "
                                 "(custom object); only tensor constants are read")
    return decode_torch_program(model, dict(ep.state_dict), constants, "torch ExportedProgram",
                                getattr(ep, "example_inputs", None))


def as_exported_program(obj: Any, who: str) -> ExportedProgram:
    """``obj`` if it is ours, :func:`from_torch` of it if it is torch's; else a TypeError
    naming what ``who`` accepts."""
    if isinstance(obj, ExportedProgram):
        return obj
    if is_torch_program(obj):
        return from_torch(obj)
    raise TypeError(f"{who} takes an exportir ExportedProgram (exportir.export) or a "
                    f"torch.export.ExportedProgram (torch.export.export); got "
                    f"{type(obj).__module__}.{type(obj).__qualname__}")
