"""Trace-time interception: ``wrap()`` leaf registration and the :class:`_TracePatches`
context that owns every temporary replacement made while a trace runs.

Contract: ``wrap(fn)`` (called at module top level) registers ``fn``'s name in its module's
globals; during every trace, :meth:`_TracePatches.patch_wrapped_functions` swaps such names
(and the methods in ``_wrapped_methods_to_patch``) for stand-ins that record one
``call_function`` / ``call_method`` node when given a Proxy. Leaving the context restores
everything in reverse order, whether or not the trace failed.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from exportir.fx.proxy import Proxy

__all__ = ["wrap"]

# --------------------------------------------------------------------------------------------
# Finding proxies in nested arguments
# --------------------------------------------------------------------------------------------


def _first_proxy(a: Any) -> Proxy | None:
    """The first Proxy nested in tuples, lists, dicts or slices of ``a``, or None."""
    if isinstance(a, Proxy):
        return a
    if isinstance(a, (tuple, list)):
        items: Any = a
    elif isinstance(a, dict):
        items = a.values()
    elif isinstance(a, slice):
        items = (a.start, a.stop, a.step)
    else:
        return None
    for x in items:
        found = _first_proxy(x)
        if found is not None:
            return found
    return None


_find_proxy = _first_proxy


# --------------------------------------------------------------------------------------------
# wrap(): leaf functions
# --------------------------------------------------------------------------------------------

# (id(module globals), function name) -> module globals: names to wrap during every trace.
_wrapped_fns_to_patch: dict[tuple[int, str], dict[str, Any]] = {}

# (class, method name): methods recorded as call_method instead of traced through.
_wrapped_methods_to_patch: list[tuple[type, str]] = []
if os.environ.get("FX_PATCH_GETITEM") == "1":
    _wrapped_methods_to_patch.append((torch.Tensor, "__getitem__"))

# Marks replacement functions installed by _TracePatches (never torch.fx's own marker, so the
# two implementations' wrap registries cannot mistake each other's wrappers).
_PATCHED_MARK = "__exportir_fx_patched__"


def _create_wrapped_func(orig_fn: Callable[..., Any]) -> Callable[..., Any]:
    """A stand-in for ``orig_fn`` that records a call_function node when given a Proxy."""

    @functools.wraps(orig_fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        proxy = _first_proxy((args, kwargs))
        if proxy is None:
            return orig_fn(*args, **kwargs)
        result = proxy.tracer.create_proxy("call_function", orig_fn, args, kwargs)
        result.node.meta["is_wrapped"] = True
        return result

    return wrapped


def _create_wrapped_method(cls: type, name: str) -> Callable[..., Any]:
    """A stand-in for ``cls.name`` that records a call_method node when given a Proxy."""
    orig_fn = getattr(cls, name)

    @functools.wraps(orig_fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        proxy = _first_proxy((args, kwargs))
        if proxy is None:
            return orig_fn(*args, **kwargs)
        return proxy.tracer.create_proxy("call_method", name, args, kwargs)

    return wrapped


def wrap(fn_or_name: Any) -> Any:
    """Register a module-level function (or its name) as a leaf: traced calls to it are kept
    as one ``call_function`` node instead of being traced through.

    Must be called at the top level of the module defining (or importing) the function; usable
    as a decorator. Returns its argument unchanged.
    """
    if not callable(fn_or_name) and not isinstance(fn_or_name, str):
        raise RuntimeError(  # noqa: TRY004  # torch.fx's error type
            "Unsupported type for global function! Must be either a callable or string name"
        )
    fn_name = fn_or_name if isinstance(fn_or_name, str) else fn_or_name.__name__
    caller = sys._getframe(1)
    if caller.f_code.co_name != "<module>":
        raise NotImplementedError("wrap must be called at the top level of a module")
    _wrapped_fns_to_patch[(id(caller.f_globals), fn_name)] = caller.f_globals
    return fn_or_name


# --------------------------------------------------------------------------------------------
# _TracePatches: every temporary replacement made during a trace, undone in one place
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Patch:
    """One replacement: ``owner[name]`` (a dict) or ``owner.name`` (a class)."""

    owner: Any
    name: str
    original: Any
    replacement: Any
    kind: str  # "item": dict entry; "new_item": dict entry that did not exist; "attr": class attr

    def apply(self) -> None:
        _APPLY[self.kind](self)

    def revert(self) -> None:
        _REVERT[self.kind](self)


def _set_item(p: _Patch) -> None:
    p.owner[p.name] = p.replacement


def _restore_item(p: _Patch) -> None:
    p.owner[p.name] = p.original


def _drop_item(p: _Patch) -> None:
    p.owner.pop(p.name, None)


def _set_attr(p: _Patch) -> None:
    setattr(p.owner, p.name, p.replacement)


def _restore_attr(p: _Patch) -> None:
    setattr(p.owner, p.name, p.original)


_APPLY: dict[str, Callable[[_Patch], None]] = {
    "item": _set_item,
    "new_item": _set_item,
    "attr": _set_attr,
}
_REVERT: dict[str, Callable[[_Patch], None]] = {
    "item": _restore_item,
    "new_item": _drop_item,
    "attr": _restore_attr,
}

_current_patches: _TracePatches | None = None


class _TracePatches:
    """Context object owning every global/class replacement made while one trace runs.

    We intercept module calls and wrapped functions by replacement (torch.fx does the same);
    this object is the only place that replaces anything, and ``__exit__`` restores all of
    it in reverse order in a ``finally``-equivalent path, whether or not the trace failed.
    """

    def __init__(self) -> None:
        self.patches: list[_Patch] = []
        self._visited: set[int] = set()
        self._prior: _TracePatches | None = None

    def __enter__(self) -> _TracePatches:  # noqa: PYI034  # not subclassed
        global _current_patches
        self._prior, _current_patches = _current_patches, self
        return self

    def __exit__(self, *exc: object) -> None:
        global _current_patches
        try:
            while self.patches:
                self.patches.pop().revert()
            self._visited.clear()
        finally:
            _current_patches = self._prior

    def patch(
        self, frame_dict: dict[str, Any], name: str, new_fn: Any, deduplicate: bool = True
    ) -> None:
        """Replace ``frame_dict[name]`` by ``new_fn`` (adding it if it names a builtin)."""
        setattr(new_fn, _PATCHED_MARK, deduplicate)
        if name not in frame_dict and hasattr(builtins, name):
            self._record(_Patch(frame_dict, name, None, new_fn, "new_item"))
            return
        if getattr(frame_dict[name], _PATCHED_MARK, False):
            return
        self._record(_Patch(frame_dict, name, frame_dict[name], new_fn, "item"))

    def patch_method(self, cls: type, name: str, new_fn: Any, deduplicate: bool = True) -> None:
        """Replace the class attribute ``cls.name`` by ``new_fn``."""
        setattr(new_fn, _PATCHED_MARK, deduplicate)
        orig_fn = getattr(cls, name)
        if getattr(orig_fn, _PATCHED_MARK, False):
            return
        self._record(_Patch(cls, name, orig_fn, new_fn, "attr"))

    def _record(self, p: _Patch) -> None:
        self.patches.append(p)
        p.apply()

    def visit_once(self, thing: object) -> bool:
        """True the first time ``thing`` is seen by this context."""
        key = id(thing)
        if key in self._visited:
            return False
        self._visited.add(key)
        return True

    def revert_all_patches(self) -> list[_Patch]:
        """Temporarily undo every replacement (kept for :meth:`reapply_all_patches`)."""
        for p in self.patches:
            p.revert()
        return self.patches

    def reapply_all_patches(self) -> list[_Patch]:
        for p in self.patches:
            p.apply()
        return self.patches

    def patch_wrapped_functions(self) -> None:
        """Install wrappers for every ``wrap()``-registered name and method."""
        for (_, name), frame_dict in list(_wrapped_fns_to_patch.items()):
            if name not in frame_dict and hasattr(builtins, name):
                orig_fn = getattr(builtins, name)
            else:
                orig_fn = frame_dict[name]
            self.patch(frame_dict, name, _create_wrapped_func(orig_fn))
        for cls, name in _wrapped_methods_to_patch:
            self.patch_method(cls, name, _create_wrapped_method(cls, name))

    def autowrap(self, frame_dict: dict[str, Any], function_ids: set[int]) -> None:
        """Wrap, in ``frame_dict``, the public globals whose identity is in ``function_ids``."""
        if not self.visit_once(frame_dict):
            return
        hits = [
            (name, value)
            for name, value in frame_dict.items()
            if not name.startswith("_") and callable(value) and id(value) in function_ids
        ]
        for name, value in hits:
            self.patch(frame_dict, name, _create_wrapped_func(value))


# --------------------------------------------------------------------------------------------
# torch.fx._symbolic_trace's spellings of the same machinery
# --------------------------------------------------------------------------------------------

_Patcher = _TracePatches


@contextlib.contextmanager
def _new_patcher() -> Iterator[_TracePatches]:
    """A fresh patch context, current for the duration of the block; its patches are undone
    at exit."""
    with _TracePatches() as patcher:
        yield patcher


@contextlib.contextmanager
def _maybe_revert_all_patches() -> Iterator[None]:
    """Run the block with the current trace's patches undone (the real functions and
    ``Module.__call__`` in place), and put them back afterwards. No-op outside a trace."""
    current = _current_patches
    removed = current.revert_all_patches() if current is not None else None
    try:
        yield
    finally:
        reapplied = current.reapply_all_patches() if current is not None else None
        if reapplied != removed:
            raise AssertionError("CURRENT_PATCHER was changed during a revert_all_patches")


def _patch_wrapped_functions(patcher: _TracePatches) -> None:
    """Install ``patcher``'s wrappers for every ``wrap()``-registered function and method."""
    patcher.patch_wrapped_functions()


def _autowrap_check(
    patcher: _TracePatches, frame_dict: dict[str, Any], function_ids: set[int]
) -> None:
    """Wrap, in ``frame_dict``, the public globals whose ``id`` is in ``function_ids``."""
    patcher.autowrap(frame_dict, function_ids)
