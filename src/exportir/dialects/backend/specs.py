"""Value types of the Backend dialect: compile specs, delegation specs, partition results.

These mirror ``executorch.exir.backend.compile_spec_schema`` / ``partitioner``:

- :class:`CompileSpec` ``(key, value: bytes)`` -- one option handed to a backend's
  ``preprocess`` and, unchanged, to its runtime ``init``.
- :class:`DelegationSpec` ``(backend_id, compile_specs)`` -- which backend a partition goes to.
- :class:`PartitionResult` ``(tagged_exported_program, partition_tags)`` -- what a
  :class:`~exportir.dialects.backend.partitioner.Partitioner` returns: the program whose nodes
  carry ``node.meta["delegation_tag"]`` and, per tag, the delegation spec.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["DELEGATION_TAG", "CompileSpec", "DelegationSpec", "PartitionResult"]

# node.meta key a partitioner sets on every node (and, to hand it over, every constant
# placeholder) a backend takes; one tag per partition.
DELEGATION_TAG = "delegation_tag"


@dataclass(frozen=True, slots=True)
class CompileSpec:
    """One backend option: ``key`` and an opaque ``value`` (bytes, stored as given)."""

    key: str
    value: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise TypeError(f"CompileSpec key must be a non-empty str; got {self.key!r}")
        if isinstance(self.value, (bytearray, memoryview)):
            object.__setattr__(self, "value", bytes(self.value))
        if not isinstance(self.value, bytes):
            raise TypeError(
                f"CompileSpec {self.key!r}: value must be bytes; got {type(self.value).__name__} "
                f"(encode it, e.g. b'1' or 'text'.encode())"
            )


def _specs(compile_specs: Iterable[CompileSpec] | None) -> tuple[CompileSpec, ...]:
    specs = tuple(compile_specs or ())
    bad = [s for s in specs if not isinstance(s, CompileSpec)]
    if bad:
        raise TypeError(f"compile_specs must be CompileSpec objects; got {bad!r}")
    return specs


@dataclass(frozen=True, slots=True)
class DelegationSpec:
    """The backend (by id) and compile specs one partition is lowered with."""

    backend_id: str
    compile_specs: tuple[CompileSpec, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.backend_id, str) or not self.backend_id:
            raise TypeError(
                f"DelegationSpec backend_id must be a non-empty str; got {self.backend_id!r}"
            )
        object.__setattr__(self, "compile_specs", _specs(self.compile_specs))


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """A partitioner's answer: the tagged program and ``tag -> DelegationSpec``."""

    tagged_exported_program: Any
    partition_tags: Mapping[str, DelegationSpec] = field(default_factory=dict)

    def __post_init__(self) -> None:
        tags = dict(self.partition_tags)
        for tag, spec in tags.items():
            if not isinstance(spec, DelegationSpec):
                raise TypeError(
                    f"partition tag {tag!r} maps to {type(spec).__name__}; PartitionResult."
                    "partition_tags maps each tag to a DelegationSpec(backend_id, compile_specs)"
                )
        object.__setattr__(self, "partition_tags", MappingProxyType(tags))
