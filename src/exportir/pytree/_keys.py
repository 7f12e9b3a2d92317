"""Key entries: how a key path names one step from a pytree node to a child.

Contract: ``SequenceKey(i)``, ``MappingKey(k)`` and ``GetAttrKey(name)`` print as ``[i]``,
``[repr(k)]`` and ``.name`` and fetch the child with ``.get(node)``; :func:`keystr` renders a
path and :func:`key_get` follows one. Same classes and text as ``torch.utils._pytree``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# --------------------------------------------------------------------------- key entries


@dataclasses.dataclass(frozen=True, slots=True)
class SequenceKey:
    """Position ``idx`` in a sequence; prints as ``[idx]``."""

    idx: int

    def __str__(self) -> str:
        return f"[{self.idx!r}]"

    def get(self, sequence: Any) -> Any:
        return sequence[self.idx]


@dataclasses.dataclass(frozen=True, slots=True)
class MappingKey:
    """Key ``key`` of a mapping; prints as ``[repr(key)]``."""

    key: Any

    def __str__(self) -> str:
        return f"[{self.key!r}]"

    def get(self, mapping: Any) -> Any:
        return mapping[self.key]


@dataclasses.dataclass(frozen=True, slots=True)
class GetAttrKey:
    """Attribute ``name`` of an object; prints as ``.name``."""

    name: str

    def __str__(self) -> str:
        return f".{self.name}"

    def get(self, obj: Any) -> Any:
        return getattr(obj, self.name)


KeyEntry = Any  # SequenceKey | MappingKey | GetAttrKey | any object with __str__ and get()
KeyPath = tuple[Any, ...]


def keystr(kp: KeyPath) -> str:
    """Render a key path, e.g. ``[0]['a'].x``."""
    return "".join(str(k) for k in kp)


def key_get(obj: Any, kp: KeyPath) -> Any:
    """Follow key path ``kp`` from ``obj`` and return the value reached."""
    for key in kp:
        obj = key.get(obj)
    return obj
