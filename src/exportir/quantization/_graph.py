"""Small graph edits the quantization passes share."""

from __future__ import annotations

import operator
from typing import Any

import torch

from exportir.fx.graph_module import GraphModule
from exportir.fx.node import Node

__all__ = ["add_constant", "attr_value", "fold_conv_bn", "require_graph_module", "val_of"]


def require_graph_module(model: Any, api: str) -> GraphModule:
    if not isinstance(model, GraphModule):
        raise TypeError(
            f"{api} takes the GraphModule of a captured program, got {type(model).__name__}. "
            "Capture the model first: exportir.export(model, example_args).module()"
        )
    return model


def attr_value(model: torch.nn.Module, target: str) -> Any:
    obj: Any = model
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def add_constant(model: GraphModule, prefix: str, value: torch.Tensor, before: Node) -> Node:
    """Register ``value`` as a new buffer of ``model`` and read it with a get_attr node."""
    i = 0
    while hasattr(model, f"{prefix}{i}"):
        i += 1
    name = f"{prefix}{i}"
    model.register_buffer(name, value.detach().clone())
    with model.graph.inserting_before(before):
        node = model.graph.get_attr(name)
    node.meta["val"] = torch.empty_like(value, device="meta")
    return node


def val_of(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, Node) else None


_BN = torch.ops.aten._native_batch_norm_legit_no_training.default
_CONVS = (torch.ops.aten.conv2d.default, torch.ops.aten.conv1d.default)


def _bn_parts(model: GraphModule, bn: Node) -> tuple[torch.Tensor, ...] | None:
    conv = bn.args[0]
    if not (isinstance(conv, Node) and conv.target in _CONVS and len(conv.users) == 1):
        return None
    nodes = [conv.args[1], conv.args[2] if len(conv.args) > 2 else None, *bn.args[1:5]]
    if not all(n is None or (isinstance(n, Node) and n.op == "get_attr") for n in nodes):
        return None
    if nodes[0] is None or any(n is None for n in nodes[3:5]):
        return None
    return tuple(None if n is None else attr_value(model, n.target).detach() for n in nodes)


def fold_conv_bn(model: GraphModule) -> bool:
    """Fold eval-mode batch norms into the convolution they alone follow (new constants; the
    user's parameters are not changed). True when something was folded."""
    folded = False
    for bn in list(model.graph.find_nodes(op="call_function", target=_BN)):
        parts = _bn_parts(model, bn)
        items = list(bn.users)
        if parts is None or not all(u.target is operator.getitem for u in items):
            continue
        if any(u.args[1] != 0 for u in items):
            continue
        w, b, gamma, beta, mean, var = parts
        eps = bn.args[6]
        factor = torch.rsqrt(var.double() + eps)
        if gamma is not None:
            factor = factor * gamma.double()
        shape = [-1] + [1] * (w.dim() - 1)
        new_w = (w.double() * factor.reshape(shape)).to(w.dtype)
        bias = torch.zeros_like(mean) if b is None else b
        new_b = ((bias.double() - mean.double()) * factor).to(w.dtype)
        if beta is not None:
            new_b = new_b + beta
        conv = bn.args[0]
        w_node = add_constant(model, "_folded_weight_", new_w, conv)
        b_node = add_constant(model, "_folded_bias_", new_b, conv)
        args = list(conv.args) + [None] * max(0, 3 - len(conv.args))
        args[1], args[2] = w_node, b_node
        conv.args = tuple(args)
        for u in items:
            u.replace_all_uses_with(conv)
            model.graph.erase_node(u)
        model.graph.erase_node(bn)
        folded = True
    if folded:
        model.graph.eliminate_dead_code()
        model.delete_all_unused_submodules()
        model.recompile()
    return folded


def drop_unused_state(model: GraphModule) -> None:
    """Delete parameters and buffers no get_attr node reads (weights replaced by their
    quantized or folded forms), so a new export does not carry them."""
    used = {n.target for n in model.graph.find_nodes(op="get_attr")}
    names = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    names += [name for name, _ in model.named_buffers(remove_duplicate=False)]
    for name in names:
        if name in used:
            continue
        owner_path, _, attr = name.rpartition(".")
        owner = model.get_submodule(owner_path) if owner_path else model
        if hasattr(owner, attr):
            delattr(owner, attr)
    model.delete_all_unused_submodules()
