"""draft_export's problems found by capture itself: ops with no fake kernel, state updates.

A custom op with no fake (meta) kernel (no ``register_fake``) stops
``export``. In draft mode the op runs for real instead: its arguments' values on the example
inputs come from the replay of the graph recorded so far (``RealValues``), and the real
outputs' sizes, strides and dtypes become the fake outputs. An output shaped like a tensor
argument takes that argument's (possibly symbolic) sizes; another gets the example's sizes when
the arguments are static, else a fresh size-like unbacked size per dimension. The op is recorded
as usual, so the program calls the real kernel. Each op is reported once, with a
``register_fake`` function to add.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from exportir.export.capture._problems import (
    FailureReport,
    FailureType,
    assignment_frame,
    fake_kernel_snippet,
)
from exportir.export.capture._real_values import RealMode, RealValues
from exportir.symbolic import user_frame

if TYPE_CHECKING:
    from exportir.export.capture._module_state import StateUpdateError
    from exportir.export.capture.recorder import Recorder

__all__ = ["DraftProblems"]


class DraftProblems:
    """Context object of a draft capture: runs ops with no fake kernel for real and collects
    :class:`FailureReport` s (``reports``)."""

    __slots__ = ("_rec", "_reported_ops", "_values", "reports")

    def __init__(self, rec: Recorder, values: RealValues) -> None:
        self._rec = rec
        self._values = values
        self._reported_ops: set[str] = set()
        self.reports: list[FailureReport] = []

    def __enter__(self) -> Self:
        self._rec.converter.real_kernel = self.run_real
        return self

    def __exit__(self, *exc: object) -> None:
        self._rec.converter.real_kernel = None

    # -- ops with no fake kernel ------------------------------------------------------------

    def run_real(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Meta outputs of ``func`` from its real kernel on the example values (None when an
        argument's example value is unknown, and for ATen ops: capture has its own ways
        with those, such as decomposing them)."""
        if getattr(func, "namespace", "aten") in ("aten", "prims"):
            return None
        try:
            real_args, real_kwargs = tree_map(self._real, (args, kwargs))
        except _Unavailable:
            return None
        with RealMode():
            real_out = func(*real_args, **real_kwargs)
        fakes = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        reals = [a for a in tree_flatten((real_args, real_kwargs))[0] if isinstance(a, torch.Tensor)]
        leaves, spec = tree_flatten(real_out)
        metas = [self._meta_of(r, fakes, reals) if isinstance(r, torch.Tensor) else r for r in leaves]
        self._report_op(func, real_args, real_kwargs, [r for r in leaves if isinstance(r, torch.Tensor)])
        return tree_unflatten(metas, spec)

    def _real(self, a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            real = self._values.tensor_value(a)
            if real is None:
                raise _Unavailable
            return real
        if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            value = self._values.value_of(a.node.expr)
            if value is None:
                raise _Unavailable
            return value
        return a

    def _meta_of(self, real: torch.Tensor, fakes: list, reals: list) -> torch.Tensor:
        for fake, r in zip(fakes, reals):
            if tuple(r.shape) == tuple(real.shape):
                return torch.empty(fake.shape, dtype=real.dtype, device="meta")
        if all(isinstance(s, int) for f in fakes for s in f.shape):
            return torch.empty_strided(real.shape, real.stride(), dtype=real.dtype, device="meta")
        env = self._rec.shape_env
        sizes = []
        for _ in real.shape:
            u = env.create_unbacked_symint()
            env.constrain_size_like(u.node.expr)
            sizes.append(u)
        return torch.empty(sizes, dtype=real.dtype, device="meta")

    def _report_op(self, func: Any, args: tuple, kwargs: dict, outs: list) -> None:
        name = func._schema.name
        if name in self._reported_ops:
            return
        self._reported_ops.add(name)
        self.reports.append(FailureReport(
            FailureType.MISSING_FAKE_KERNEL,
            f"torch.ops.{name.replace('::', '.')} has no fake kernel; its outputs' sizes and "
            "dtypes were taken from running it on the example inputs",
            user_frame(),
            fake_kernel_snippet(func, args, kwargs, outs),
            "register it once, after the op is defined",
            {"op": str(func)},
        ))

    # -- state updates ----------------------------------------------------------------------

    def state_update(
        self, err: StateUpdateError, module: torch.nn.Module, attr: str, fix: str
    ) -> None:
        what = str(err).splitlines()[0].rstrip(".")
        self.reports.append(FailureReport(
            FailureType.STATE_UPDATE,
            f"{what}; the exported program does not carry the new value",
            assignment_frame(module, attr),
            fix,
            f"in {type(module).__name__}",
            {"attribute": attr, "module": type(module).__name__},
        ))


class _Unavailable(Exception):
    """An argument's example value is unknown (an earlier op could not run for real)."""
