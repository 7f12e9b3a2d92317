"""The ``@compatibility`` marker of ``torch.fx._compatibility``, for code written against it.

Passes written for torch.fx (and copied from it) decorate their classes and functions with
``@compatibility(is_backward_compatible=...)``. The decorator returns the object itself with a
note appended to its docstring and records it in :data:`_MARKED_WITH_COMPATIBILITY` (and, when
backward compatible, in :data:`_BACK_COMPAT_OBJECTS`), as torch's does. exportir's own API is
pinned by tests instead, so nothing in exportir is decorated.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["compatibility"]

_T = TypeVar("_T")

_BACK_COMPAT_OBJECTS: dict[Any, None] = {}
_MARKED_WITH_COMPATIBILITY: dict[Any, None] = {}

_BACK_COMPAT_NOTE = """

.. note::
    Backwards-compatibility for this API is guaranteed.
"""
_EXPERIMENTAL_NOTE = """

.. warning::
    This API is experimental and is *NOT* backward-compatible.
"""


def compatibility(is_backward_compatible: bool) -> Callable[[_T], _T]:
    """A decorator marking an API as backward compatible (or explicitly experimental)."""
    note = _BACK_COMPAT_NOTE if is_backward_compatible else _EXPERIMENTAL_NOTE

    def mark(obj: _T) -> _T:
        obj.__doc__ = textwrap.dedent(getattr(obj, "__doc__", None) or "") + note
        if is_backward_compatible:
            _BACK_COMPAT_OBJECTS.setdefault(obj)
        _MARKED_WITH_COMPATIBILITY.setdefault(obj)
        return obj

    return mark
