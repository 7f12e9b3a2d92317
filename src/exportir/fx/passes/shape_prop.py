"""Shape propagation: run a GraphModule on example inputs and record, on every
node, the tensor metadata of the value it produced."""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

import torch
from torch._prims_common import is_contiguous_for_memory_format_or_false

from exportir.fx.graph_module import GraphModule
from exportir.fx.interpreter import Interpreter
from exportir.fx.node import Node, map_aggregate

__all__ = ["ShapeProp", "TensorMetadata"]


class TensorMetadata(NamedTuple):
    """What ShapeProp records about a tensor (``node.meta['tensor_meta']``)."""

    shape: torch.Size
    dtype: torch.dtype
    requires_grad: bool
    stride: tuple[int, ...]
    memory_format: torch.memory_format | None
    is_quantized: bool
    qparams: dict[str, Any]


#: Memory formats probed, in order; the first one the tensor is laid out in wins.
_MEMORY_FORMATS = (torch.contiguous_format, torch.channels_last, torch.channels_last_3d)

_SPARSE_LAYOUTS = frozenset(
    {torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc}
)

_PER_TENSOR = (torch.per_tensor_affine, torch.per_tensor_symmetric)
_PER_CHANNEL = (
    torch.per_channel_affine,
    torch.per_channel_affine_float_qparams,
    torch.per_channel_symmetric,
)


def _is_sparse(t: torch.Tensor) -> bool:
    return t.layout in _SPARSE_LAYOUTS


def _memory_format(t: torch.Tensor) -> torch.memory_format | None:
    for candidate in _MEMORY_FORMATS:
        if is_contiguous_for_memory_format_or_false(t, memory_format=candidate):
            return candidate
    return None


def _qparams(t: torch.Tensor) -> dict[str, Any]:
    """Quantization parameters (per-channel ones as plain lists)."""
    scheme = t.qscheme()
    params: dict[str, Any] = {"qscheme": scheme}
    if scheme in _PER_TENSOR:
        params["scale"] = t.q_scale()
        params["zero_point"] = t.q_zero_point()
    elif scheme in _PER_CHANNEL:
        params["scale"] = t.q_per_channel_scales().tolist()
        params["zero_point"] = t.q_per_channel_zero_points().tolist()
        params["axis"] = t.q_per_channel_axis()
    return params


def _extract_tensor_metadata(
    result: torch.Tensor, include_contiguity: bool = True
) -> TensorMetadata:
    """Describe ``result``. ``memory_format`` is the first of contiguous /
    channels_last / channels_last_3d the tensor is definitely laid out in (None
    for sparse tensors, unknown layouts, or ``include_contiguity=False``)."""
    sparse = _is_sparse(result)
    stride = () if sparse else result.stride()
    memory_format = _memory_format(result) if include_contiguity and not sparse else None
    quantized = result.is_quantized
    return TensorMetadata(
        result.shape,
        result.dtype,
        result.requires_grad,
        stride,
        memory_format,
        quantized,
        _qparams(result) if quantized else {},
    )


def _fake_copy(module: torch.nn.Module, fake_mode: Any) -> torch.nn.Module:
    """Deep copy of ``module`` whose parameters and buffers are ``fake_mode``'s
    versions of the real ones."""
    memo: dict[int, Any] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        fake = fake_mode.from_tensor(tensor)
        if isinstance(tensor, torch.nn.Parameter):
            fake = torch.nn.Parameter(fake, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = fake
    return copy.deepcopy(module, memo)


class ShapeProp(Interpreter):
    """Interpreter that records ``meta['tensor_meta']`` (a ``TensorMetadata``,
    or a structure of them mirroring the node's value) and ``meta['type']``.

    With ``fake_mode`` (an object offering ``from_tensor`` and usable as a
    context manager) the graph runs on fake copies of the inputs and module
    state; the metadata is still written to the real module's nodes. An active
    fake mode is not auto-detected: pass it explicitly."""

    def __init__(self, gm: GraphModule, fake_mode: Any = None) -> None:
        super().__init__(gm)
        self.fake_mode = fake_mode
        self.fake_module = _fake_copy(self.module, fake_mode) if fake_mode is not None else None
        self.real_module = self.module

    def run_node(self, n: Node) -> Any:
        """Run ``n`` (under the fake mode, if any) and record its metadata."""
        try:
            result = self._run_possibly_fake(n)
        except Exception as error:
            raise RuntimeError(
                f"ShapeProp error for: node={n.format_node()} with meta={n.meta}"
            ) from error
        found_tensor = False

        def describe(value: Any) -> Any:
            nonlocal found_tensor
            if isinstance(value, torch.Tensor):
                found_tensor = True
                return _extract_tensor_metadata(value)
            return value

        meta = map_aggregate(result, describe)
        if found_tensor:
            n.meta["tensor_meta"] = meta
        n.meta["type"] = type(result)
        return result

    def _run_possibly_fake(self, n: Node) -> Any:
        if self.fake_module is None:
            return super().run_node(n)
        self.module = self.fake_module  # state reads go to the fake copy
        try:
            with self.fake_mode:
                return super().run_node(n)
        finally:
            self.module = self.real_module

    def propagate(self, *args: Any) -> Any:
        """Run the module on ``args`` (faked first under a fake mode), recording
        metadata on every node; returns the module's result."""
        if self.fake_mode is not None:
            args = tuple(
                self.fake_mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args
            )
        return super().run(*args)
