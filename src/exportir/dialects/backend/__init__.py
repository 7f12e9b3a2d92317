"""The Backend dialect: subgraphs of an Edge program handed to backends (seed 001).

- :class:`Partitioner` tags the nodes a backend takes and returns a :class:`PartitionResult`
  (``tag -> DelegationSpec(backend_id, compile_specs)``).
- :class:`BackendDetails` is a backend's ahead-of-time side: ``preprocess(edge_program,
  compile_specs) -> PreprocessResult`` turns a partition into the bytes its runtime executes;
  :class:`BackendRegistry` finds backends by id.
- :class:`LoweredBackendModule` holds one lowered partition; the parent graph calls it through
  :data:`executorch_call_delegate`.
- :class:`BackendVerifier` checks Backend-dialect programs.

``exportir.passes.to_backend.to_backend`` drives all of it.
"""

from exportir.dialects.backend.backend_details import (
    BackendDetails,
    BackendRegistry,
    PreprocessResult,
    default_backend_registry,
)
from exportir.dialects.backend.lowered import (
    ExecutorchCallDelegate,
    LoweredBackendModule,
    executorch_call_delegate,
    is_delegate_call,
)
from exportir.dialects.backend.partitioner import Partitioner
from exportir.dialects.backend.specs import (
    DELEGATION_TAG,
    CompileSpec,
    DelegationSpec,
    PartitionResult,
)
from exportir.dialects.backend.verifier import BackendVerifier

__all__ = [
    "DELEGATION_TAG",
    "BackendDetails",
    "BackendRegistry",
    "BackendVerifier",
    "CompileSpec",
    "DelegationSpec",
    "ExecutorchCallDelegate",
    "LoweredBackendModule",
    "PartitionResult",
    "Partitioner",
    "PreprocessResult",
    "default_backend_registry",
    "executorch_call_delegate",
    "is_delegate_call",
]
