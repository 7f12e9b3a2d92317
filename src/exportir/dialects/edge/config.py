"""``EdgeCompileConfig``: the knobs of ``to_edge`` and of the Edge verifier (as ExecuTorch's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CONFIG_META_KEY", "EdgeCompileConfig"]

# The edge program's graph module carries its config here, so re-verification (after
# ``transform``, after loading) applies the same exceptions.
CONFIG_META_KEY = "edge_compile_config"


@dataclass(frozen=True, slots=True)
class EdgeCompileConfig:
    """How ``to_edge`` lowers and verifies.

    - ``_check_ir_validity``: run the Edge verifier's dialect checks (op set, dtypes, scalars).
    - ``_core_aten_ops_exception_list``: non-core ATen ops the verifier accepts (your backend
      or runtime has kernels for them).
    - ``preserve_ops``: ops kept whole (not decomposed) by ``to_edge``; accepted by the
      verifier too.
    """

    _check_ir_validity: bool = True
    _core_aten_ops_exception_list: list[Any] = field(default_factory=list)
    preserve_ops: list[Any] = field(default_factory=list)

    def accepted_noncore_ops(self) -> frozenset[Any]:
        return frozenset((*self._core_aten_ops_exception_list, *self.preserve_ops))
