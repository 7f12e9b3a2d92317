"""The partitioner interface (ExecuTorch's ``exir.backend.partitioner.Partitioner``).

A partitioner looks at an Edge ``ExportedProgram`` and says which nodes a backend takes: it sets
``node.meta["delegation_tag"] = tag`` on them and returns a
:class:`~exportir.dialects.backend.specs.PartitionResult` mapping every tag it used to a
:class:`~exportir.dialects.backend.specs.DelegationSpec`. ``to_backend(program, partitioner)``
then fuses each tag's nodes into one delegate call (``exportir.passes.to_backend``).

Contract of ``partition``:

- tag ``call_function`` nodes (``operator.getitem`` nodes of a tagged multi-output node take
  the same tag, or are tagged automatically);
- tag a parameter / buffer / constant placeholder with a partition's tag to hand that tensor
  over to the backend (it moves into the delegate's blob); untagged ones are passed to the
  delegate as inputs;
- a tag's nodes must be fusable without a cycle: no path may leave the partition and come back,
  where a path entering another tag's partition leaves it from any of its nodes (it becomes one
  delegate call) (:func:`exportir.passes.partition.propose_partitions` builds such partitions);
- tagging happens on the program it is given; ``to_backend`` hands it a copy;
- symbolic sizes are not to be decided (``x.shape[0] == 16`` records a guard in the program's
  ShapeEnv and narrows the sizes it accepts): compare them by expression; ``to_backend``
  refuses a ``partition`` or ``preprocess`` that adds guards.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from exportir.dialects.backend.specs import PartitionResult

__all__ = ["Partitioner"]


class Partitioner(ABC):
    """Base class of partitioners; ``spec`` is free-form configuration kept as ``self.spec``."""

    def __init__(self, spec: Mapping[Any, Any] = MappingProxyType({})) -> None:
        self._spec = spec

    @property
    def spec(self) -> Mapping[Any, Any]:
        return self._spec

    @abstractmethod
    def partition(self, exported_program: Any) -> PartitionResult:
        """Tag the nodes backends take (see the module docstring)."""

    def ops_to_not_decompose(self, ep: Any) -> tuple[list[Any], Callable[[Any], bool] | None]:
        """ATen ``OpOverload``s the backend wants kept whole by ``to_edge_transform_and_lower``,
        and an optional filter: ``filter(node) -> bool`` on a node of one of those ops in the
        ATen program ``ep``; a node it rejects is decomposed as usual. Kept nodes that this and
        later partitioners do not claim are decomposed after partitioning."""
        return [], None
