"""Output layouts that depend on the device's kernel, which a meta kernel cannot know.

A meta kernel sees ``meta`` tensors, so where the real kernel's layout is a backend's choice
it picks one (contiguous). A fake knows its device: as torch's fake tensors do
(``torch/_subclasses/fake_impls.py``), a rule here re-lays the meta result out the way the
device's kernel would. The graph after the op is captured against these strides (a
``reshape`` recorded as a ``view`` or a copy), so they must be the real kernel's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten
_META = torch.device("meta")


def _concrete(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with ``t``'s layout at its example sizes (symbols by their hints)."""

    def hint(s: Any) -> int:
        return s.node.require_hint() if isinstance(s, torch.SymInt) else s

    return torch.empty_strided(
        [hint(s) for s in t.shape], [hint(s) for s in t.stride()], dtype=t.dtype, device=_META
    )


def _convolution_format(
    args: dict[str, Any], as_device: Callable[[torch.Tensor], torch.Tensor]
) -> torch.memory_format | None:
    """The memory format ATen's convolution gives its output on the device (its backend's
    choice: on CPU, oneDNN and the slow 2-d kernels keep a channels-last input or weight
    channels-last), decided by ATen's own backend selection on the example sizes."""
    x, w, bias = _concrete(args["input"]), _concrete(args["weight"]), args.get("bias")
    if x.dim() not in (3, 4, 5) or w.dim() != x.dim():
        return None
    select = {k: list(args[k]) for k in ("stride", "padding", "dilation", "output_padding")}
    select.update(transposed=args["transposed"], groups=args["groups"])
    if w.dim() == 3:
        # conv1d as the 2-d convolution ATen runs; done here, not by ATen on the dataless
        # wrappers (ATen's own unsqueeze of one bypasses its dispatch and crashes)
        x, w = x.unsqueeze(2), w.unsqueeze(2)
        for k, pad in (("stride", 1), ("padding", 0), ("dilation", 1), ("output_padding", 0)):
            select[k] = [pad, *select[k]]
    select["bias"] = None if bias is None else as_device(_concrete(bias))
    if bias is None:
        select["bias_sizes"] = None
    backend = torch._C._select_conv_backend(as_device(x), as_device(w), **select)
    if args["weight"].dim() == 3:  # ATen decides the 1-d format on the contiguous input
        x = _concrete(args["input"]).contiguous().unsqueeze(2)
    return torch._C._conv_determine_backend_memory_format(as_device(x), as_device(w), backend)


def _to_format(out: torch.Tensor, fmt: torch.memory_format) -> torch.Tensor:
    if out.dim() == 3 and fmt == torch.channels_last:
        return out.unsqueeze(2).to(memory_format=fmt).squeeze(2)
    return out.to(memory_format=fmt)


_CONVOLUTIONS = (aten.convolution.default, aten._convolution.default, aten._convolution.deprecated)


def relayout(
    func: Any,
    meta_args: tuple,
    meta_kwargs: dict,
    meta_out: Any,
    device: torch.device | None,
    as_device: Callable[[torch.Tensor], torch.Tensor],
) -> Any:
    """``meta_out`` laid out as ``func``'s kernel on ``device`` lays it out. ``as_device``
    wraps a meta tensor as a (dataless) tensor of ``device`` for ATen's backend selection."""
    if func not in _CONVOLUTIONS or device is None or device.type != "cpu":
        return meta_out
    names = [a.name for a in func._schema.arguments]
    args = {**dict(zip(names, meta_args)), **meta_kwargs}
    fmt = _convolution_format(args, as_device)
    if fmt is None or fmt == torch.contiguous_format:
        return meta_out
    return _to_format(meta_out, fmt)
