"""``LoweredBackendModule`` and the ``executorch_call_delegate`` op of the Backend dialect.

A delegated program calls its lowered modules through one op::

    %lowered_module_0 = get_attr[target=lowered_module_0]
    %executorch_call_delegate = call_function[target=executorch_call_delegate](
        args = (%lowered_module_0, %x, %p_weight))
    %getitem = call_function[target=operator.getitem](args = (%executorch_call_delegate, 0))

The call returns a tuple of the partition's outputs (``meta["val"]`` is that tuple) and every
use goes through ``operator.getitem``. Emission turns the pair into a ``DelegateCall``
instruction whose blob is the module's ``processed_bytes``.

Calling a :class:`LoweredBackendModule` in Python runs the blob with the backend's runtime object
(``BackendDetails.runtime()``: the same ``init`` / ``execute`` the program runtime uses), or,
for a backend without one, runs the original program of the partition.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch._ops import HigherOrderOperator, OperatorBase

from exportir import pytree
from exportir.dialects.backend.specs import CompileSpec

__all__ = ["ExecutorchCallDelegate", "LoweredBackendModule", "executorch_call_delegate"]


class LoweredBackendModule(torch.nn.Module):
    """A program lowered to one backend: ``backend_id``, ``processed_bytes`` (the backend's blob),
    ``compile_specs`` and ``original_module`` (the Edge ``ExportedProgram`` it came from)."""

    def __init__(
        self,
        edge_program: Any,
        backend_id: str,
        processed_bytes: bytes,
        compile_specs: Sequence[CompileSpec] = (),
        *,
        runtime: Any | None = None,
    ) -> None:
        super().__init__()
        self._original_exported_program = edge_program
        self._backend_id = backend_id
        self._processed_bytes = bytes(processed_bytes)
        self._compile_specs = tuple(compile_specs)
        self._runtime = runtime
        self._handle: Any = None
        self.meta: dict[str, Any] = {}

    @property
    def backend_id(self) -> str:
        return self._backend_id

    @property
    def processed_bytes(self) -> bytes:
        return self._processed_bytes

    @property
    def compile_specs(self) -> tuple[CompileSpec, ...]:
        return self._compile_specs

    @property
    def original_module(self) -> Any:
        """The Edge ``ExportedProgram`` this module was lowered from."""
        return self._original_exported_program

    def forward(self, *args: Any) -> tuple[Any, ...]:
        """Run the lowered program on the delegate's inputs; returns its outputs as a tuple."""
        if self._runtime is None:
            out = self._original_exported_program.module()(*args)
            return tuple(pytree.tree_leaves(out))
        if self._handle is None:
            self._handle = self._runtime.init(self._processed_bytes, self._compile_specs)
        return tuple(self._runtime.execute(self._handle, list(args)))

    def __deepcopy__(self, memo: dict[int, Any]) -> LoweredBackendModule:
        new = LoweredBackendModule(
            copy.deepcopy(self._original_exported_program, memo),
            self._backend_id,
            self._processed_bytes,
            self._compile_specs,
            runtime=self._runtime,
        )
        new.meta = copy.deepcopy(self.meta, memo)
        return new

    def extra_repr(self) -> str:
        return (
            f"backend_id={self._backend_id!r}, processed_bytes={len(self._processed_bytes)} B, "
            f"compile_specs={[s.key for s in self._compile_specs]}"
        )


class ExecutorchCallDelegate(HigherOrderOperator):
    """The delegate-call op: ``executorch_call_delegate(lowered_module, *args) -> tuple``.

    It is a ``HigherOrderOperator`` so that Export IR verifiers accept it as a node target, but
    it does not go through torch's dispatcher: calling it calls the lowered module. Construction
    deliberately skips ``HigherOrderOperator.__init__``, which would add the op to torch's
    process-global ``torch.ops.higher_order`` table.
    """

    def __init__(self) -> None:
        OperatorBase.__init__(self)
        self._name = "executorch_call_delegate"
        self.__name__ = self._name
        self.__qualname__ = self._name
        self._ns = "higher_order"
        self.__module__ = "exportir.dialects.backend"  # its public home (pickles by name)

    def __call__(self, lowered_module: Any, *args: Any) -> tuple[Any, ...]:
        if not isinstance(lowered_module, LoweredBackendModule):
            raise TypeError(
                f"executorch_call_delegate expects a LoweredBackendModule as its first argument; "
                f"got {type(lowered_module).__name__}"
            )
        return lowered_module(*args)

    def __repr__(self) -> str:
        return self._name

    def __reduce__(self) -> str:
        return self._name  # the module-level singleton below

    def __deepcopy__(self, memo: dict[int, Any]) -> ExecutorchCallDelegate:
        return self


executorch_call_delegate = ExecutorchCallDelegate()


def is_delegate_call(node: Any) -> bool:
    """Whether ``node`` calls ``executorch_call_delegate``."""
    return getattr(node, "op", None) == "call_function" and node.target is executorch_call_delegate
