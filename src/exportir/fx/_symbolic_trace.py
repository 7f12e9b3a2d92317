"""``torch.fx._symbolic_trace``'s module path for exportir's tracer.

Code written against torch.fx imports tracer internals from ``torch.fx._symbolic_trace``:
``is_fx_tracing``, ``_assert_is_none``, ``_Patcher``, ``_maybe_revert_all_patches``,
``_is_fx_tracing_flag``, ``_ConstantAttributeType``... Our tracer lives in
:mod:`exportir.fx.tracer`; every attribute of this module is read from there when it is
accessed, so the objects are the very same ones (a node whose target is ``_assert_is_none``
matches whichever module it was imported from) and flags a trace rebinds
(``_is_fx_tracing_flag``, ``CURRENT_PATCHER``) are current. Assigning an attribute here does
not change the tracer: set it on :mod:`exportir.fx.tracer`.
"""

from __future__ import annotations

from typing import Any

from exportir.fx import tracer as _tracer


def __getattr__(name: str) -> Any:
    return getattr(_tracer, name)


def __dir__() -> list[str]:
    return dir(_tracer)
