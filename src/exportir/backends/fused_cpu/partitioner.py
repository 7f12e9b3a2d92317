"""``FusedCpuPartitioner``: claims the subgraphs the fused CPU backend runs.

A node is claimed when its op is in the backend's op table (:data:`runtime.OPS`: elementwise
math, activations, softmax, layer/group/batch norm, reductions, addmm/mm/bmm, convolution,
pooling and copy-semantics layout ops), every tensor it reads and writes is a concrete tensor
value, and its other arguments can be stored in the blob (no symbolic sizes). Claimed nodes are
grouped into cycle-free partitions (:func:`exportir.passes.partition.propose_partitions`);
partitions made only of layout ops are left to the runtime (fusing them gains nothing).

``own_constants=True`` hands the parameters/buffers/constants only one partition reads to the
backend (they move into its blob); by default they stay in the program's constant segment and
are passed to the delegate, which keeps them memory-mapped and shared.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from exportir.backends.fused_cpu.backend import Unencodable, encode_arg, op_name
from exportir.dialects.backend import (
    DELEGATION_TAG,
    CompileSpec,
    DelegationSpec,
    Partitioner,
    PartitionResult,
)
from exportir.export.signature import InputKind, OutputKind
from exportir.fx.node import Node
from exportir.passes.partition import propose_partitions, tag_partitions
from exportir.runtime.backends.fused_cpu import BACKEND_ID, OPS

__all__ = ["LAYOUT_OPS", "FusedCpuPartitioner"]

# Ops that only move data: a partition of nothing else is not worth a delegate call.
LAYOUT_OPS = frozenset({
    "aten.view_copy.default", "aten.permute_copy.default", "aten.expand_copy.default",
    "aten.unsqueeze_copy.default", "aten.squeeze_copy.dims", "aten.clone.default",
    "aten.cat.default", "aten.slice_copy.Tensor", "aten.select_copy.int",
    "aten._to_copy.default",
})  # fmt: skip

_STATE = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def _is_tensor_val(val: Any) -> bool:
    if isinstance(val, torch.Tensor):
        return val.device.type in ("cpu", "meta")
    if isinstance(val, (tuple, list)):
        return bool(val) and all(_is_tensor_val(v) for v in val)
    return False


class FusedCpuPartitioner(Partitioner):
    """Partitioner of the fused CPU backend (module docstring)."""

    def __init__(
        self,
        compile_specs: Sequence[CompileSpec] = (),
        *,
        ops: Iterable[str] | None = None,
        own_constants: bool = False,
    ) -> None:
        super().__init__({"own_constants": own_constants})
        self.delegation_spec = DelegationSpec(BACKEND_ID, tuple(compile_specs))
        self.ops = frozenset(ops) if ops is not None else OPS
        unknown = sorted(self.ops - OPS)
        if unknown:
            raise ValueError(
                f"FusedCpuPartitioner: the backend does not run {unknown}; it runs "
                f"a subset of exportir.runtime.backends.fused_cpu.OPS"
            )
        self.own_constants = own_constants

    def is_supported(self, node: Node) -> bool:
        """Whether the backend can run ``node`` (see the module docstring)."""
        if node.op != "call_function" or op_name(node.target) not in self.ops:
            return False
        if not _is_tensor_val(node.meta.get("val")):
            return False
        if not all(_is_tensor_val(n.meta.get("val")) for n in node.all_input_nodes):
            return False
        try:
            encode_arg([*node.args, *node.kwargs.values()], lambda _: 0)
        except Unencodable:
            return False
        return True

    def partition(self, exported_program: Any) -> PartitionResult:
        graph = exported_program.graph
        parts = [
            p
            for p in propose_partitions(graph, self.is_supported)
            if any(
                op_name(n.target) not in LAYOUT_OPS for n in p if n.target is not operator.getitem
            )
        ]
        tags = tag_partitions(parts)
        if self.own_constants:
            self._tag_constants(exported_program)
        return PartitionResult(exported_program, {t: self.delegation_spec for t in tags})

    def _tag_constants(self, program: Any) -> None:
        signature = program.graph_signature
        mutated = {s.target for s in signature.output_specs if s.kind == OutputKind.BUFFER_MUTATION}
        kinds = {getattr(s.arg, "name", None): s for s in signature.input_specs}
        for node in program.graph.find_nodes(op="placeholder"):
            spec = kinds.get(node.name)
            if spec is None or spec.kind not in _STATE or spec.target in mutated:
                continue
            tags = {u.meta.get(DELEGATION_TAG) for u in node.users}
            if len(tags) == 1 and None not in tags:
                node.meta[DELEGATION_TAG] = tags.pop()
