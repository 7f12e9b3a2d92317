"""Lets torchvision's Python package import beside torch's CPU build.

The torchvision wheel on the package index is built against torch's CUDA build: its C++
extension does not load here, so ``torchvision::nms`` / ``torchvision::qnms`` are never defined,
and ``import torchvision`` fails when its Python side registers fake kernels for them. transformers
and timm import torchvision whenever it is installed, so without this nothing of theirs imports.

Declaring the two schemas (no kernels: calling them raises torch's "no kernel" error) is enough for
the Python side — models, ``ops.misc`` — to import. Import this module before transformers, timm
or torchvision.
"""

from __future__ import annotations

import torch


def _declare() -> torch.library.Library | None:
    if hasattr(torch.ops, "torchvision") and hasattr(torch.ops.torchvision, "nms"):
        return None  # a working torchvision build already defined them
    try:
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for name in ("nms", "qnms"):
            lib.define(f"{name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    except RuntimeError:
        return None
    return lib


# kept alive for the process: dropping the Library object would undefine the schemas
_LIBRARY = _declare()
