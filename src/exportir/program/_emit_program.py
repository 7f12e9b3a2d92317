"""What the methods of one program share while they are emitted: the constant buffers and
delegate blobs (deduplicated by content), and methods that only return constants."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch

from exportir.format import schema
from exportir.program import kernels
from exportir.program.kernels import EmitError
from exportir.program.weights import DeferredWeight

__all__ = ["ProgramBuilder", "constant_method", "tensor_bytes"]


class ProgramBuilder:
    """Constant buffers and delegate blobs shared by all methods (deduplicated by content)."""

    def __init__(self) -> None:
        self.constants: list[schema.ConstantBuffer] = []
        self.delegates: list[schema.Delegate] = []
        self._constant_index: dict[bytes, int] = {}
        self._delegate_index: dict[tuple[Any, ...], int] = {}
        # names of the buffers every method keeps as one shared state (EmitConfig)
        self.shared: frozenset[str] = frozenset()
        self._deferred_index: dict[tuple[str, str], int] = {}

    def constant(self, data: bytes) -> int:
        key = hashlib.sha256(data).digest()
        found = self._constant_index.get(key)
        if found is None:
            found = self._constant_index[key] = len(self.constants)
            self.constants.append(schema.ConstantBuffer(data))
        return found

    def deferred(self, t: torch.Tensor, name: str, state: bool = False) -> int:
        """A constant whose bytes are attached later (a meta tensor: see ``weights``)."""
        key = ("deferred", name)
        found = self._deferred_index.get(key)
        if found is None:
            found = self._deferred_index[key] = len(self.constants)
            weight = DeferredWeight(name, t.dtype, tuple(t.shape), state)
            self.constants.append(schema.ConstantBuffer(weight))  # type: ignore[arg-type]  # bytes come with attach_weights
        return found

    def delegate(self, lowered: Any) -> int:
        specs = tuple(
            schema.CompileSpec(str(s.key), bytes(s.value)) for s in (lowered.compile_specs or ())
        )
        data = bytes(lowered.processed_bytes)
        key = (str(lowered.backend_id), hashlib.sha256(data).digest(), specs)
        found = self._delegate_index.get(key)
        if found is None:
            found = self._delegate_index[key] = len(self.delegates)
            self.delegates.append(schema.Delegate(str(lowered.backend_id), data, specs))
        return found


def tensor_bytes(t: torch.Tensor) -> bytes:
    """Contiguous little-endian bytes of a real tensor."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


def constant_method(name: str, value: Any, program: ProgramBuilder) -> schema.Method:
    """A method without instructions that returns ``value`` (or each item of a tuple/list)."""
    items: Sequence[Any] = value if isinstance(value, (list, tuple)) else (value,)
    values: list[schema.EValue] = []
    for item in items:
        if isinstance(item, torch.Tensor):
            buffer = program.constant(tensor_bytes(item))
            values.append(schema.Tensor(kernels.scalar_type(item.dtype), tuple(item.shape),
                                        tuple(range(item.dim())), schema.ConstantData(buffer)))
        elif isinstance(item, bool):
            values.append(schema.Bool(item))
        elif isinstance(item, int):
            values.append(schema.Int(item))
        elif isinstance(item, float):
            values.append(schema.Double(item))
        elif isinstance(item, str):
            values.append(schema.String(item))
        elif item is None:
            values.append(schema.Null())
        else:
            raise EmitError(f"constant method {name!r}: unsupported value {item!r}")
    return schema.Method(
        name=name, values=tuple(values), inputs=(), outputs=tuple(range(len(values))),
        operators=(), instructions=(), debug=(), plan=schema.MethodPlan(),
    )
