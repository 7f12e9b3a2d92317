"""``EdgeCompileConfig``: the knobs of ``to_edge`` and of the Edge verifier (as ExecuTorch's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["CONFIG_META_KEY", "DEFAULT_CORE_ATEN_OPS_EXCEPTIONS", "EdgeCompileConfig"]

# The edge program's graph module carries its config here, so re-verification (after
# ``transform``, after loading) applies the same exceptions.
CONFIG_META_KEY = "edge_compile_config"

_aten = torch.ops.aten

# Non-core ATen ops every Edge program may contain (ExecuTorch's verifier keeps such a default
# exception list too): ops export produces that no core decomposition removes, whose kernels
# the runtime has. Op -> why it is accepted and how it runs. Their dtype constraints are in
# edge.yaml with the core ops' (scripts/gen_edge_yaml.py probes them too).
DEFAULT_CORE_ATEN_OPS_EXCEPTIONS: dict[Any, str] = {
    _aten.max.default: (
        "torch.max(x) without a dim; ExecuTorch's Edge verifier accepts it too; runs as "
        "aten::max.unary_out"
    ),
    _aten.min.default: (
        "torch.min(x) without a dim; ExecuTorch's Edge verifier accepts it too; runs as "
        "aten::min.unary_out"
    ),
    _aten._upsample_bilinear2d_aa.default: (
        "F.interpolate(mode='bilinear', antialias=True); ExecuTorch's Edge verifier accepts it "
        "too; runs as aten::_upsample_bilinear2d_aa.out"
    ),
    _aten.adaptive_max_pool2d.default: (
        "nn.AdaptiveMaxPool2d has no core decomposition for arbitrary output sizes; runs as "
        "aten::adaptive_max_pool2d.out"
    ),
    _aten._native_batch_norm_legit_functional.default: (
        "training-mode batch norm (running statistics returned as results); runs as "
        "aten::_native_batch_norm_legit.out on copies of the running statistics"
    ),
}


@dataclass(frozen=True, slots=True)
class EdgeCompileConfig:
    """How ``to_edge`` lowers and verifies.

    - ``_check_ir_validity``: run the Edge verifier's dialect checks (op set, dtypes, scalars).
    - ``_core_aten_ops_exception_list``: non-core ATen ops the verifier accepts (your backend
      or runtime has kernels for them), besides :data:`DEFAULT_CORE_ATEN_OPS_EXCEPTIONS`.
    - ``preserve_ops``: ops kept whole (not decomposed) by ``to_edge``; accepted by the
      verifier too.
    """

    _check_ir_validity: bool = True
    _core_aten_ops_exception_list: list[Any] = field(default_factory=list)
    preserve_ops: list[Any] = field(default_factory=list)

    def accepted_noncore_ops(self) -> frozenset[Any]:
        return frozenset((
            *DEFAULT_CORE_ATEN_OPS_EXCEPTIONS, *self._core_aten_ops_exception_list,
            *self.preserve_ops,
        ))
