"""``convert_pt2e``: observers become quantize / dequantize ops.

Each observer node becomes ``quantize -> dequantize`` with the qparams it computed
(``quantized_decomposed.quantize_per_tensor`` / ``quantize_per_channel`` and their
``dequantize_*``); a dynamic one (``is_dynamic``) becomes ``choose_qparams.tensor -> quantize_
per_tensor.tensor -> dequantize_per_tensor.tensor``, the qparams computed from each input at
run time. With ``fold_quantize`` (default), a quantize reading a constant (a weight) is computed
now: the graph keeps the int8 tensor (``_frozen_param<i>``) and its ``dequantize``. A
dequantize read by several nodes is duplicated, one per reader (as torchao does).
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from exportir.format import quantized_ops
from exportir.fx.graph_module import GraphModule
from exportir.fx.node import Node
from exportir.quantization._graph import (
    add_constant,
    attr_value,
    drop_unused_state,
    require_graph_module,
)
from exportir.quantization.observer import ObserverBase
from exportir.quantization.prepare import OBSERVER_PREFIX

__all__ = ["convert_pt2e"]

_PER_CHANNEL = (torch.per_channel_symmetric, torch.per_channel_affine)


def _ops() -> Any:
    quantized_ops.define()
    return torch.ops.quantized_decomposed


def _meta(x: Any) -> Any:
    if isinstance(x, Node):
        v = x.meta.get("val")
        if not isinstance(v, torch.Tensor) or not all(type(d) is int for d in v.shape):
            raise TypeError("no static tensor value")  # int() of a symbolic size would guard
        return torch.empty(tuple(v.shape), dtype=v.dtype, device="meta")
    if isinstance(x, (list, tuple)):
        return type(x)(_meta(a) for a in x)
    return x


def _call(model: GraphModule, op: Any, args: tuple, before: Node) -> Node:
    with model.graph.inserting_before(before):
        node = model.graph.call_function(op, args)
    try:
        node.meta["val"] = op(*_meta(args))
    except (TypeError, RuntimeError, ValueError):
        pass  # symbolic sizes: the next export computes it
    return node


def _is_constant(node: Any) -> bool:
    return isinstance(node, Node) and node.op == "get_attr"


class _Converter:
    def __init__(self, model: GraphModule, fold: bool) -> None:
        self.model = model
        self.fold = fold
        self.q = _ops()

    def quantize(self, op: Any, x: Node, qargs: tuple, at: Node) -> Node:
        """``op(x, *qargs)``, computed now when ``x`` is a constant and folding is on."""
        if self.fold and _is_constant(x) and all(not isinstance(a, Node) or _is_constant(a)
                                                 for a in qargs):
            values = [attr_value(self.model, a.target) if isinstance(a, Node) else a
                      for a in (x, *qargs)]
            with torch.no_grad():
                folded = op(*values)
            return add_constant(self.model, "_frozen_param", folded, at)
        return _call(self.model, op, (x, *qargs), at)

    def static(self, node: Node, obs: ObserverBase) -> Node:
        x = node.args[0]
        if _is_constant(x):  # a weight: observed here too, calibrated or not
            with torch.no_grad():
                obs(attr_value(self.model, x.target))
        scale, zero_point = obs.calculate_qparams()
        bounds = (obs.quant_min, obs.quant_max, obs.dtype)
        if obs.qscheme in _PER_CHANNEL:
            s = add_constant(self.model, "_scale_", scale.float(), node)
            z = add_constant(self.model, "_zero_point_", zero_point.to(torch.int64), node)
            qargs = (s, z, obs.ch_axis, *bounds)
            q = self.quantize(self.q.quantize_per_channel.default, x, qargs, node)
            return _call(self.model, self.q.dequantize_per_channel.default, (q, *qargs), node)
        qargs = (float(scale.reshape(-1)[0]), int(zero_point.reshape(-1)[0]), *bounds)
        q = self.quantize(self.q.quantize_per_tensor.default, x, qargs, node)
        return _call(self.model, self.q.dequantize_per_tensor.default, (q, *qargs), node)

    def dynamic(self, node: Node, obs: ObserverBase) -> Node:
        if obs.qscheme not in (torch.per_tensor_affine, None):
            raise NotImplementedError(
                f"convert_pt2e: dynamic quantization with {obs.qscheme} is not built; use "
                "torch.per_tensor_affine for dynamically quantized activations"
            )
        x = node.args[0]
        choose = _call(self.model, self.q.choose_qparams.tensor,
                       (x, obs.quant_min, obs.quant_max, obs.eps, obs.dtype), node)
        scale = _call(self.model, operator.getitem, (choose, 0), node)
        zero_point = _call(self.model, operator.getitem, (choose, 1), node)
        qargs = (scale, zero_point, obs.quant_min, obs.quant_max, obs.dtype)
        q = _call(self.model, self.q.quantize_per_tensor.tensor, (x, *qargs), node)
        return _call(self.model, self.q.dequantize_per_tensor.tensor, (q, *qargs), node)

    def run(self) -> None:
        for node in list(self.model.graph.nodes):
            if node.op != "call_module" or not str(node.target).startswith(OBSERVER_PREFIX):
                continue
            obs = self.model.get_submodule(node.target)
            if not isinstance(obs, ObserverBase):
                continue
            dq = self.dynamic(node, obs) if obs.is_dynamic else self.static(node, obs)
            node.replace_all_uses_with(dq)
            self.model.graph.erase_node(node)
            self.model.delete_submodule(node.target)


_DEQUANTIZE = frozenset({"dequantize_per_tensor", "dequantize_per_channel"})


def _duplicate_dequantize(model: GraphModule) -> None:
    """One dequantize per reader (torchao's ``DuplicateDQPass``): each quantized pattern a
    backend matches (``dq -> op -> q``) owns its dequantize."""
    for node in list(model.graph.nodes):
        name = getattr(node.target, "_schema", None)
        if name is None or name.name.partition("::")[2] not in _DEQUANTIZE:
            continue
        for user in list(node.users)[1:]:
            with model.graph.inserting_after(node):
                copy = model.graph.call_function(node.target, node.args, dict(node.kwargs))
            copy.meta.update(node.meta)
            user.replace_input_with(node, copy)


def convert_pt2e(model: GraphModule, use_reference_representation: bool = False,
                 fold_quantize: bool = True) -> GraphModule:
    """Replace the observers of a calibrated :func:`prepare_pt2e` module by quantize /
    dequantize ops (module docstring). Returns the module; export it again
    (``exportir.export(converted, args)``) to lower it."""
    model = require_graph_module(model, "convert_pt2e")
    if use_reference_representation:
        raise NotImplementedError(
            "convert_pt2e(use_reference_representation=True) is not built: exportir keeps the "
            "quantize/dequantize ops; call it with use_reference_representation=False"
        )
    _Converter(model, fold_quantize).run()
    _duplicate_dequantize(model)
    model.graph.eliminate_dead_code()
    drop_unused_state(model)
    model.graph.lint()
    model.recompile()
    return model
