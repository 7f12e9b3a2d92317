"""``FusedCpuPartitioner``: claims the subgraphs the fused CPU backend runs.

A node is claimed when its op is in the backend's kernel table (:data:`runtime.OPS`:
elementwise math, activations, softmax, layer/group/batch norm (also training-mode), reductions,
linear algebra, convolution, pooling, upsampling, attention, embedding and indexing, factories
and copy-semantics layout ops), every tensor it reads and writes is a concrete tensor value, and
its other arguments can be stored in the blob (no symbolic sizes). Claimed nodes are grouped
into cycle-free partitions (:func:`exportir.passes.partition.propose_partitions`), merged further
whenever that makes no cycle (independent branches become one delegate call); partitions made
only of layout ops are left to the runtime (fusing them gains nothing).

``ops_to_not_decompose`` asks ``to_edge_transform_and_lower`` to keep
``aten._scaled_dot_product_flash_attention_for_cpu`` whole (the backend runs the fused kernel;
core decomposition would make ~25 ops of it).

Constants (parameters, buffers, lifted constants) only one partition reads can be handed to the
backend, moving into its blob. ``own_constants``:

- ``None`` (default): those the backend rewrites with their contents -- weights and statistics
  of a batch norm it folds into the convolution before it, and constants feeding ops whose
  inputs are all constants (a causal mask sliced from a buffer), which ``preprocess`` computes
  once. Other constants stay in the program's constant segment, memory-mapped and shared, and
  are passed to the delegate;
- ``True``: all of them; ``False``: none (no folding of constants).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from exportir.backends.fused_cpu.backend import Unencodable, encode_arg, op_name
from exportir.backends.fused_cpu.conv import SMALL_CONV_MACS, grouped_2d, pointwise_on_pixel
from exportir.backends.fused_cpu.epilogue import PACKED_MIN_ROWS
from exportir.dialects.backend import (
    DELEGATION_TAG,
    CompileSpec,
    DelegationSpec,
    Partitioner,
    PartitionResult,
)
from exportir.export.signature import InputKind, OutputKind
from exportir.fx.node import Node
from exportir.passes.partition import Grouping, propose_partitions, tag_partitions
from exportir.runtime.backends.fused_cpu import BACKEND_ID, OPS

__all__ = ["LAYOUT_OPS", "FusedCpuPartitioner"]

# Ops that only move data: a partition of nothing else is not worth a delegate call.
LAYOUT_OPS = frozenset({
    "aten.view_copy.default", "aten.permute_copy.default", "aten.expand_copy.default",
    "aten.unsqueeze_copy.default", "aten.squeeze_copy.dims", "aten.squeeze_copy.dim",
    "aten.transpose_copy.int", "aten.clone.default", "aten.cat.default",
    "aten.slice_copy.Tensor", "aten.select_copy.int", "aten._to_copy.default",
    "aten.split_with_sizes_copy.default", "aten.full.default", "aten.full_like.default",
    "aten.scalar_tensor.default", "aten.arange.start_step",
})  # fmt: skip

# ATen ops kept whole through core decomposition for this backend.
KEEP_WHOLE = (
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten.lstm.input,
    torch.ops.aten.gru.input,
    torch.ops.aten.hardswish.default,  # fused into oneDNN convolutions / linears as post-ops
    torch.ops.aten.hardsigmoid.default,
)

_CONV = "aten.convolution.default"
_BN = "aten._native_batch_norm_legit_no_training.default"
_TRANSPOSED_WEIGHT = "aten.permute_copy.default"  # read by addmm/mm: linear needs no folding
_MATMULS = frozenset({"aten.addmm.default", "aten.mm.default"})

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
        own_constants: bool | None = None,
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

    def ops_to_not_decompose(self, ep: Any) -> tuple[list[Any], None]:
        """The ATen ops ``to_edge_transform_and_lower`` keeps whole for this backend."""
        keep = [op for op in KEEP_WHOLE if str(op) in self.ops]
        return keep, None

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
        _infer_one_symbolic_size(graph)
        parts = [
            p
            for p in _merge_independent(graph, propose_partitions(graph, self.is_supported))
            if any(
                op_name(n.target) not in LAYOUT_OPS for n in p if n.target is not operator.getitem
            )
        ]
        tags = tag_partitions(parts)
        if self.own_constants is not False:
            self._tag_constants(exported_program)
        return PartitionResult(exported_program, {t: self.delegation_spec for t in tags})

    def _tag_constants(self, program: Any) -> None:
        signature = program.graph_signature
        mutated = {s.target for s in signature.output_specs if s.kind == OutputKind.BUFFER_MUTATION}
        kinds = {getattr(s.arg, "name", None): s for s in signature.input_specs}
        state = {
            node
            for node in program.graph.find_nodes(op="placeholder")
            if (spec := kinds.get(node.name)) is not None
            and spec.kind in _STATE
            and spec.target not in mutated
        }
        folded = None if self.own_constants else _folded_constants(program.graph, state)
        for node in state:
            tags = {u.meta.get(DELEGATION_TAG) for u in node.users}
            if len(tags) != 1 or None in tags:
                continue
            if folded is None or node in folded:
                node.meta[DELEGATION_TAG] = tags.pop()


_SIZED_VIEWS = frozenset({"aten.view_copy.default", "aten.view.default",
                          "aten._unsafe_view.default", "aten.reshape.default"})


def _infer_one_symbolic_size(graph: Any) -> None:
    """A view whose size list holds one symbolic size (a ``sym_size`` node), every other entry
    a literal above 0, gets ``-1`` there instead: the same view (the one size left is the input's
    element count over the others), and one a blob can store. Without it, the flatten before
    each linear of a dynamic-length program (an LLM's prefill) stays outside the delegates and
    splits them around every linear."""
    for node in graph.nodes:
        if node.op != "call_function" or op_name(node.target) not in _SIZED_VIEWS:
            continue
        if len(node.args) != 2 or node.kwargs or not isinstance(node.args[1], (list, tuple)):
            continue
        sizes = list(node.args[1])
        symbolic = [i for i, v in enumerate(sizes) if isinstance(v, Node)]
        if len(symbolic) != 1 or not all(
                type(v) is int and v > 0 for i, v in enumerate(sizes) if i != symbolic[0]):
            continue
        if not isinstance(sizes[symbolic[0]].meta.get("val"), torch.SymInt):
            continue
        sizes[symbolic[0]] = -1
        node.args = (node.args[0], sizes)


def _merge_independent(graph: Any, parts: list[list[Node]]) -> list[list[Node]]:
    """Partitions merged whenever that makes no cycle, counting every partition as the one node
    it fuses into (one delegate call instead of several; independent branches of a model become
    one partition)."""
    grouping = Grouping({n: i for i, n in enumerate(graph.nodes)})
    for part in parts:
        grouping.add(part)
    kept: list[Node] = []  # one node of each merged group so far
    for part in parts:
        if not any(grouping.merge(first, part[0]) for first in kept):
            kept.append(part[0])
    return grouping.groups()


def _tag(node: Node) -> Any:
    return node.meta.get(DELEGATION_TAG)


def _packed(matmul: Node) -> bool:
    """Whether ``preprocess`` will run this ``addmm`` / ``mm`` as a oneDNN linear whose weight
    the executor packs at load (:func:`exportir.backends.fused_cpu.epilogue.pack_linear`)."""
    x = matmul.args[1 if op_name(matmul.target) == "aten.addmm.default" else 0]
    val = x.meta.get("val") if isinstance(x, Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() != 2 or val.dtype != torch.float32:
        return False
    rows = val.shape[0]
    return type(rows) is int and rows >= PACKED_MIN_ROWS and torch.backends.mkldnn.is_available()


def _onednn_conv(conv: Node) -> bool:
    """Whether ``preprocess`` will run this convolution on oneDNN with its weight packed at
    load (:func:`exportir.backends.fused_cpu.conv.small_conv`)."""
    x, w, out = (getattr(n, "meta", {}).get("val") for n in (conv.args[0], conv.args[1], conv))
    if not all(isinstance(t, torch.Tensor) for t in (x, w, out)) or conv.args[6]:
        return False
    if x.dim() != 4 or x.dtype != torch.float32 or w.dtype != torch.float32:
        return False
    shapes = (*x.shape, *out.shape, *w.shape)
    if not all(type(d) is int for d in shapes):
        return False
    groups, transposed = conv.args[8], conv.args[6]
    if _pixel_conv(conv):
        return False
    macs = math.prod(out.shape) * math.prod(w.shape[1:])
    return macs > SMALL_CONV_MACS or grouped_2d(tuple(x.shape), groups, transposed)


def _pixel_conv(conv: Node) -> bool:
    """Whether ``preprocess`` will run this convolution as a linear of a reshaped weight
    (:func:`exportir.backends.fused_cpu.conv.pointwise_on_pixel`): the reshape is then folded
    once instead of run at every call."""
    x, w = (getattr(n, "meta", {}).get("val") for n in conv.args[:2])
    if not all(isinstance(t, torch.Tensor) for t in (x, w)):
        return False
    if not all(type(d) is int for d in (*x.shape, *w.shape)):
        return False
    padding = list(conv.args[4]) if isinstance(conv.args[4], (list, tuple)) else [1]
    return pointwise_on_pixel(tuple(x.shape), tuple(w.shape), padding, conv.args[8], conv.args[6])


def _packed_conv(conv: Node) -> bool:
    """Whether ``preprocess`` rewrites this convolution's weight: packed for oneDNN at load,
    or reshaped once for a linear."""
    return _onednn_conv(conv) or _pixel_conv(conv)


def _folded_constants(graph: Any, state: set[Node]) -> set[Node]:
    """The constants ``preprocess`` would rewrite with their contents (module docstring)."""
    known: set[Node] = set(state)  # constants and claimed nodes computed from constants only
    folded: set[Node] = set()
    for node in graph.nodes:
        if node.op != "call_function" or _tag(node) is None:
            continue
        inputs = node.all_input_nodes
        if all(n in known for n in inputs):  # factories (no inputs) included
            known.add(node)
            if not (
                op_name(node.target) == _TRANSPOSED_WEIGHT
                and all(op_name(u.target) in _MATMULS and not _packed(u) for u in node.users)
            ):
                folded.update(n for n in inputs if n in state)
        if op_name(node.target) == _CONV and node.args[1] in state and _packed_conv(node):
            folded.add(node.args[1])
        if op_name(node.target) == _BN:
            conv = node.args[0]
            if (
                isinstance(conv, Node)
                and op_name(conv.target) == _CONV
                and len(conv.users) == 1
                and _tag(conv) == _tag(node)
                and not conv.args[6]
            ):
                parts = [*conv.args[1:3], *node.args[1:5]]
                folded.update(n for n in parts if isinstance(n, Node) and n in state)
    return folded
