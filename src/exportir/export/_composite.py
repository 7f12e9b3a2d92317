"""Composite-implicit ops that capture does not let autograd decompose the usual way.

Capture records below autograd, where CompositeImplicitAutograd (CIA) ops arrive already
decomposed by their C++ / Python kernels. torch.export instead records them whole
(pre-dispatch) and decomposes them in ``run_decompositions()``, on tensors that do not require
grad. Three consequences are visible in torch's decomposed graphs, and this module reproduces
them by giving a few ops their own kernel at the autograd dispatch keys while capture runs:

- ``KEPT_WHOLE`` ops (``upsample_nearest2d.vec``...) stay single nodes: torch's default
  decomposition table preserves them. Their kernel redispatches below autograd, so the
  recorder sees the op itself.
- ``aten.to`` (dtype / device / dtype_layout) is preceded by an
  ``aten._assert_tensor_metadata(x, dtype=, device=, layout=)`` node, as torch.export inserts
  before every ``to`` it records.
- ``aten.matmul`` is decomposed on inputs that do not require grad: C++ ``matmul`` folds a
  3-D @ 2-D product into ``mm`` when the 2-D side requires grad, and into ``expand`` + ``bmm``
  otherwise (torch's ``run_decompositions`` sees no grad).

The kernels live in ``OpOverload.py_kernels``, consulted because capture runs under the Python
dispatcher. :class:`CompositeOverrides` installs them on ``__enter__`` and restores each op's
table on ``__exit__``; nothing outlives the capture.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Self

import torch

aten = torch.ops.aten
_DK = torch._C.DispatchKey

# The autograd keys of real devices (not Meta: fakes compute on meta twins, which must
# decompose normally).
_AUTOGRAD_KEYS = tuple(
    getattr(_DK, name)
    for name in (
        "AutogradCPU", "AutogradCUDA", "AutogradXLA", "AutogradLazy", "AutogradIPU",
        "AutogradXPU", "AutogradMPS", "AutogradHPU", "AutogradPrivateUse1",
    )
    if hasattr(_DK, name)
)  # fmt: skip

# Functional CIA ops torch's default decomposition table preserves (torch/export/decomp_utils.py).
KEPT_WHOLE: frozenset[Any] = frozenset(
    {
        aten.upsample_bilinear2d.vec,
        aten.upsample_nearest2d.vec,
    }
)

_TO_OVERLOADS = (aten.to.dtype, aten.to.device, aten.to.dtype_layout)


def _with_grad_of(out: Any, inputs: tuple) -> Any:
    """``out`` computed without autograd: give it ``requires_grad`` as autograd would have,
    through a node that only errors if differentiated (as torch.export does)."""
    if not torch.is_grad_enabled():
        return out
    if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in inputs):
        return out
    if not isinstance(out, torch.Tensor) or not (out.is_floating_point() or out.is_complex()):
        return out
    return torch._C._functions.DelayedError("exportir: not differentiable while capturing", 1)(out)


def _below_autograd(op: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._AutoDispatchBelowAutograd():
            out = op(*args, **kwargs)
        return _with_grad_of(out, args)

    return kernel


def _to_with_assert(op: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        x = args[0]
        aten._assert_tensor_metadata.default(x, dtype=x.dtype, device=x.device, layout=x.layout)
        return op.decompose(*args, **kwargs)

    return kernel


def _matmul_without_grad(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = aten.matmul.default.decompose(a.detach(), b.detach())
    return _with_grad_of(out, (a, b))


def _kernels() -> dict[Any, Callable[..., Any]]:
    table: dict[Any, Callable[..., Any]] = {op: _below_autograd(op) for op in KEPT_WHOLE}
    table.update({op: _to_with_assert(op) for op in _TO_OVERLOADS})
    table[aten.matmul.default] = _matmul_without_grad
    return table


class CompositeOverrides:
    """Installs the kernels above at the autograd keys; restores the ops' tables on exit.

    (Modifying ``py_kernels`` is the dispatcher's own extension point; it is scoped to this
    context and undone in ``__exit__`` whatever happened.)
    """

    __slots__ = ("_saved",)

    def __init__(self) -> None:
        self._saved: dict[Any, dict[Any, Any]] = {}

    def __enter__(self) -> Self:
        for op, kernel in _kernels().items():
            self._saved[op] = dict(op.py_kernels)
            for key in _AUTOGRAD_KEYS:
                op.py_kernels[key] = kernel
            op._dispatch_cache.clear()
        return self

    def __exit__(self, *exc: object) -> None:
        for op, saved in self._saved.items():
            op.py_kernels.clear()
            op.py_kernels.update(saved)
            op._dispatch_cache.clear()
        self._saved = {}
