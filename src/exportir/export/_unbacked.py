"""Fake rules for ops whose output depends on tensor data: they create unbacked symbols.

Each rule runs on meta tensors with the export's ShapeEnv and returns meta outputs (or a
``torch.SymInt``) whose data-dependent sizes / values are fresh ``u`` symbols, with the ranges
torch gives them (a ``nonzero`` count lies in ``[0, numel]``). Custom ops registered with
``torch.library.register_fake`` get a context whose ``new_dynamic_size()`` does the same.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from exportir.symbolic import ShapeEnv

aten = torch.ops.aten
_META = torch.device("meta")


def _size_like(env: ShapeEnv, upper: Any) -> torch.SymInt:
    u = env.create_unbacked_symint()
    env.constrain_size_like(u.node.expr, upper if isinstance(upper, int) else torch.inf)
    return u


def _local_scalar_dense(env: ShapeEnv, t: torch.Tensor) -> Any:
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return env.create_unbacked_symfloat()
    if t.dtype is torch.bool:
        return env.create_unbacked_symbool()
    return env.create_unbacked_symint()


def _nonzero(env: ShapeEnv, t: torch.Tensor) -> torch.Tensor:
    n = _size_like(env, t.numel() if not _symbolic(t.numel()) else None)
    return torch.empty((n, t.dim()), dtype=torch.long, device=_META)


def _masked_select(env: ShapeEnv, t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    numel = torch.broadcast_shapes(t.shape, mask.shape).numel()
    n = _size_like(env, numel if not _symbolic(numel) else None)
    return torch.empty((n,), dtype=t.dtype, device=_META)


def _unique_outputs(
    env: ShapeEnv, t: torch.Tensor, return_inverse: bool, return_counts: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = _size_like(env, t.numel() if not _symbolic(t.numel()) else None)
    values = torch.empty((n,), dtype=t.dtype, device=_META)
    inverse = torch.empty(t.shape if return_inverse else (0,), dtype=torch.long, device=_META)
    counts = torch.empty((n,) if return_counts else (0,), dtype=torch.long, device=_META)
    return values, inverse, counts


def _unique2(env: ShapeEnv, t: torch.Tensor, sorted: bool = True, return_inverse: bool = False,
             return_counts: bool = False) -> tuple:
    return _unique_outputs(env, t, return_inverse, return_counts)


def _unique_consecutive(env: ShapeEnv, t: torch.Tensor, return_inverse: bool = False,
                        return_counts: bool = False, dim: int | None = None) -> tuple:
    if dim is not None:
        return _unique_dim(env, t, dim, True, return_inverse, return_counts)
    return _unique_outputs(env, t, return_inverse, return_counts)


def _unique_dim(env: ShapeEnv, t: torch.Tensor, dim: int, sorted: bool = True,
                return_inverse: bool = False, return_counts: bool = False) -> tuple:
    n = _size_like(env, t.shape[dim] if not _symbolic(t.shape[dim]) else None)
    shape = list(t.shape)
    shape[dim] = n
    values = torch.empty(shape, dtype=t.dtype, device=_META)
    inverse = torch.empty((t.shape[dim],) if return_inverse else (0,), dtype=torch.long, device=_META)
    counts = torch.empty((n,) if return_counts else (0,), dtype=torch.long, device=_META)
    return values, inverse, counts


def _repeat_interleave(env: ShapeEnv, repeats: torch.Tensor, output_size: Any = None) -> torch.Tensor:
    n = output_size if output_size is not None else _size_like(env, None)
    return torch.empty((n,), dtype=repeats.dtype, device=_META)


def _symbolic(x: Any) -> bool:
    return isinstance(x, torch.SymInt)


UNBACKED_RULES: dict[Any, Callable[..., Any]] = {
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.nonzero.default: _nonzero,
    aten.masked_select.default: _masked_select,
    aten._unique2.default: _unique2,
    aten.unique_dim.default: _unique_dim,
    aten.unique_consecutive.default: _unique_consecutive,
    aten.repeat_interleave.Tensor: _repeat_interleave,
}


# --- custom ops ------------------------------------------------------------------------------


def custom_fake_impl(func: Any) -> Callable[..., Any] | None:
    """The ``register_fake`` kernel of a custom op, if it has one (None for ATen ops)."""
    schema = getattr(func, "_schema", None)
    if schema is None or getattr(func, "namespace", "aten") in ("aten", "prim", "prims"):
        return None
    from torch._library.simple_registry import singleton

    kernel = singleton.find(schema.name).fake_impl.kernel
    return kernel if kernel is not None else None


class FakeImplContext:
    """What ``torch.library.get_ctx()`` returns inside a custom op's fake impl during export."""

    __slots__ = ("_env", "_op")

    def __init__(self, env: ShapeEnv, op: Any) -> None:
        self._env = env
        self._op = op

    def new_dynamic_size(self, *, min: int = 0, max: int | None = None) -> torch.SymInt:
        """A fresh data-dependent size (unbacked symbol) in ``[min, max]``."""
        if min < 0:
            raise ValueError(
                f"new_dynamic_size(min={min}): a size cannot be negative; use min >= 0 "
                f"(in the fake impl of {self._op})"
            )
        u = self._env.create_unbacked_symint()
        self._env.constrain_size_like(u.node.expr, torch.inf if max is None else max)
        if min > 0:
            self._env.constrain_range(u.node.expr, min)
        return u

    create_unbacked_symint = new_dynamic_size


@contextlib.contextmanager
def fake_impl_context(env: ShapeEnv, op: Any) -> Iterator[None]:
    """Make ``torch.library.get_ctx()`` return our context while ``op``'s fake impl runs."""
    from torch._library.fake_impl import set_ctx_getter

    ctx = FakeImplContext(env, op)
    with set_ctx_getter(lambda: ctx):
        yield
