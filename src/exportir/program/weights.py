"""Weights attached after emission: programs of models built on the ``meta`` device.

A model built under ``torch.device("meta")`` has parameters and buffers without data. It exports,
lowers and plans like any other (shapes and dtypes are all the compiler reads); when the emitter
meets a meta tensor it stores a :class:`DeferredWeight` in place of the constant's bytes (named by
the tensor's fully-qualified name in the exported program). Nothing computed from a meta tensor
is folded at emission, so every constant of the program is either real or such a named weight.

:func:`attach_weights` then fills the deferred constants from safetensors files (memory-mapped:
each tensor's bytes are viewed, never the whole model materialised) or from mappings of name ->
tensor. A program name matches a checkpoint key when they are equal or the name ends with
``"." + key`` (an export wrapper adds prefixes such as ``model.``), and only one key matches.
Mutable state missing from every source (a KV cache) starts at zero; any other missing weight, a
shape or dtype mismatch is a :class:`WeightsError` naming the tensor.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from exportir.export.serialize.tensors import open_tensors
from exportir.format import schema

__all__ = ["DeferredWeight", "WeightsError", "attach_weights", "deferred_weights", "load_safetensors"]


class WeightsError(ValueError):
    """A weight could not be attached: missing, ambiguous, or of another shape or dtype."""


@dataclass(frozen=True, slots=True)
class DeferredWeight:
    """The bytes of constant ``name`` (a meta tensor at emission), to be attached.

    ``state``: the initial value of a mutable buffer (zero when no source provides it)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    state: bool = False

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for s in self.shape:
            n *= s
        return n


def deferred_weights(program: schema.Program) -> list[str]:
    """Names of the constants of ``program`` still waiting for their weights."""
    return [c.data.name for c in program.constants if isinstance(c.data, DeferredWeight)]


WeightSource = str | os.PathLike[str] | Mapping[str, torch.Tensor]


def load_safetensors(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file as read-only views of its memory-mapped bytes (nothing
    is copied). The header is checked before anything is mapped into tensors (sizes, offsets,
    dtypes), with errors naming the field."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise WeightsError(f"{os.fspath(path)}: empty file, not a safetensors checkpoint")
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    tensors, _ = open_tensors(mapped, os.fspath(path))
    return tensors


def _sources(sources: Iterable[WeightSource]) -> list[Mapping[str, torch.Tensor]]:
    out: list[Mapping[str, torch.Tensor]] = []
    for source in sources:
        if isinstance(source, Mapping):
            out.append(source)
        elif isinstance(source, (str, os.PathLike)):
            out.append(load_safetensors(source))
        else:
            raise TypeError(f"a weight source is a safetensors path or a mapping of name -> "
                            f"tensor; got {type(source).__name__}")
    return out


def _find(name: str, sources: list[Mapping[str, torch.Tensor]]) -> torch.Tensor | None:
    for source in sources:
        found = source.get(name)
        if found is not None:
            return found
        keys = [k for k in source if name.endswith("." + k)]
        if len(keys) > 1:
            raise WeightsError(f"weight {name!r} matches several checkpoint keys {keys[:4]}; "
                               "pass a mapping with the program's own names")
        if keys:
            return source[keys[0]]
    return None


def _bytes_of(w: DeferredWeight, t: torch.Tensor | None) -> bytes | memoryview:
    if t is None:
        if w.state:
            return bytes(w.nbytes)  # mutable state (a KV cache) starts at zero
        raise WeightsError(f"no weight {w.name!r} ({w.dtype}{list(w.shape)}) in the sources; a "
                           "buffer a checkpoint does not save (a rotary inv_freq) is passed as "
                           "a mapping: attach_weights(path, {name: tensor})")
    if tuple(t.shape) != w.shape:
        raise WeightsError(f"weight {w.name!r} has shape {list(t.shape)} in the source; the "
                           f"program needs {list(w.shape)}")
    if t.is_floating_point() != w.dtype.is_floating_point:
        raise WeightsError(f"weight {w.name!r} is {t.dtype} in the source; the program needs "
                           f"{w.dtype}")
    if t.device.type == "meta":
        raise WeightsError(f"weight {w.name!r} in the source is a meta tensor (no data)")
    t = t.detach().to(dtype=w.dtype, device="cpu").contiguous()
    if t.numel() == 0:
        return b""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def attach_weights(program: schema.Program, sources: Iterable[WeightSource]) -> schema.Program:
    """``program`` with every :class:`DeferredWeight` replaced by the bytes of its tensor from
    ``sources`` (tried in order); see the module docstring for matching and errors."""
    found = _sources(sources)
    constants: list[schema.ConstantBuffer] = []
    for c in program.constants:
        if isinstance(c.data, DeferredWeight):
            data = _bytes_of(c.data, _find(c.data.name, found))
            c = schema.ConstantBuffer(data)
        constants.append(c)
    return dataclasses.replace(program, constants=tuple(constants))


def is_meta(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "meta"
