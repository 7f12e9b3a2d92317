"""Where an op came from: the node metadata that capture records besides ``val``.

- ``stack_trace``: the user's frames, outer -> inner, like torch.export's non-strict mode: only
  frames of ``forward`` methods (user modules and ``torch.nn`` modules alike), formatted as
  ``File "...", line N, in forward\\n    code``.
- ``nn_module_stack``: ``{"L__self__<fqn>[@k]": (fqn, "module.QualName")}`` outer -> inner, the root
  module included with fqn ``""``. Maintained by :class:`ModuleCalls`, which registers global
  forward pre/post hooks for the duration of the capture (removed in ``finally``).
- ``source_fn_stack``: ``[(name, fn_or_class)]``: the innermost ``torch.nn`` module class when the
  op runs inside one, else the torch-level function being called (recorded by
  :class:`TorchFunctions`, a ``TorchFunctionMode``), else the op itself.

And the node's name: :func:`node_name`.
"""

from __future__ import annotations

import functools
import linecache
import sys
from typing import Any, Self

import torch
from torch.overrides import TorchFunctionMode

from exportir.fx.namespace import is_magic, snake_case

_EXPORTIR_DIR = __file__.rsplit("/export/", 1)[0] + "/"
_TORCH_INIT = torch.__file__
# torch's custom-op glue: its autograd.Function ``forward`` runs the op below autograd, where
# capture records it; torch.export records custom ops before autograd, without this frame.
_TORCH_LIBRARY_DIR = _TORCH_INIT.rsplit("/", 1)[0] + "/_library/"


# Autograd saves the result of an op whose backward reads it (relu, sigmoid, exp) by detaching
# it, right after the op: capture, below autograd, records that detach; torch.export, tracing
# above autograd, never sees it. It is dead code, recorded under a name of its own so that it
# does not use up the counter of the user's own detaches (functionalization drops it unnamed).
AUTOGRAD_DETACH = "autograd_detach"


def node_name(target: Any) -> str:
    """The name torch.export gives a node calling ``target`` before de-duplication: the op's
    name, dunders stripped and snake-cased (``aten.__and__.Tensor`` -> ``and`` -> ``and_1``)."""
    try:
        return _cached_node_name(target)
    except TypeError:  # (an unhashable callable)
        return _node_name(target)


@functools.lru_cache(maxsize=4096)
def _cached_node_name(target: Any) -> str:
    return _node_name(target)


def _node_name(target: Any) -> str:
    packet = getattr(target, "overloadpacket", None)
    name = packet.__name__ if packet is not None else getattr(target, "__name__", "fn")
    return snake_case(name[2:-2] if is_magic(name) else name)


def _is_user_forward(code: Any) -> bool:
    if code.co_name != "forward":
        return False
    filename = code.co_filename
    return not filename.startswith((_EXPORTIR_DIR, _TORCH_LIBRARY_DIR)) and filename != _TORCH_INIT


_FRAME_TEXT: dict[tuple[str, int], str] = {}


def _frame_text(filename: str, lineno: int, name: str) -> str:
    key = (filename, lineno)
    text = _FRAME_TEXT.get(key)
    if text is None:
        code = linecache.getline(filename, lineno).strip()
        text = f'File "{filename}", line {lineno}, in {name}'
        if code:
            text += f"\n    {code}"
        _FRAME_TEXT[key] = text
    return text


def current_stack_trace() -> str:
    """The ``forward`` frames of the Python stack, formatted as torch.export formats them."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        if _is_user_forward(frame.f_code):
            frames.append(_frame_text(frame.f_code.co_filename, frame.f_lineno, "forward"))
        frame = frame.f_back
    if not frames:  # not inside any forward (a function export): the innermost user frame
        return innermost_user_frame()
    return "\n  ".join(reversed(frames))


def innermost_user_frame() -> str:
    """``File "...", line N, in fn`` of the innermost frame outside torch and exportir."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _is_library_file(filename):
            return _frame_text(filename, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return "<unknown location>"


def _is_library_file(filename: str) -> bool:
    norm = filename.replace("\\", "/")
    return "/torch/" in norm or norm.startswith((_EXPORTIR_DIR, "<frozen"))


def qualified_class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class ModuleCalls:
    """The stack of modules currently in ``forward``, kept by global forward hooks.

    Capture must know which module each op runs in without patching ``nn.Module``; torch offers
    global forward pre/post hooks for this. ``__enter__`` registers them and ``__exit__`` removes
    them, whatever happened in between.
    """

    __slots__ = ("_counts", "_handles", "_names", "_snapshot", "_stack", "called")

    def __init__(self, root: torch.nn.Module) -> None:
        self._names: dict[int, str] = {}
        for fqn, mod in root.named_modules(remove_duplicate=False):
            self._names.setdefault(id(mod), fqn)
        self._stack: list[tuple[str, tuple[str, str], torch.nn.Module]] = []
        self._handles: list[Any] = []
        self._snapshot: dict[str, tuple[str, str]] | None = {}
        self.called: list[str] = []
        self._counts: dict[str, int] = {}  # calls so far, per fqn

    def __enter__(self) -> Self:
        hooks = torch.nn.modules.module
        self._handles = [
            hooks.register_module_forward_pre_hook(self._pre),
            hooks.register_module_forward_hook(self._post, always_call=True),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _pre(self, mod: torch.nn.Module, args: Any) -> None:
        fqn = self._names.get(id(mod))
        if fqn is None:  # a module that is not part of the exported tree (created in forward)
            fqn = f"<{type(mod).__name__}>"
        # the k-th call (k >= 1) of a module is keyed "L__self__<fqn>@k", as torch.export
        # does: unflatten tells the calls apart by it
        k = self._counts.get(fqn, 0)
        self._counts[fqn] = k + 1
        key = "L__self__" + fqn + (f"@{k}" if k else "")
        self._stack.append((key, (fqn, qualified_class_name(type(mod))), mod))
        self._snapshot = None
        if fqn not in self.called:
            self.called.append(fqn)

    def _post(self, mod: torch.nn.Module, args: Any, out: Any) -> None:
        if self._stack and self._stack[-1][2] is mod:
            self._stack.pop()
            self._snapshot = None

    def current(self) -> dict[str, tuple[str, str]]:
        """A fresh copy of the module stack, outer -> inner."""
        if self._snapshot is None:
            self._snapshot = {key: entry for key, entry, _ in self._stack}
        return dict(self._snapshot)

    def innermost(self) -> tuple[str, torch.nn.Module] | None:
        if not self._stack:
            return None
        _, (fqn, _), mod = self._stack[-1]
        return fqn, mod


class TorchFunctions(TorchFunctionMode):
    """Records the torch-level function being called (``F.linear``, ``Tensor.add``...).

    While a mode's ``__torch_function__`` runs, the mode is off, so nested torch calls made by a
    torch function are not seen: ``current`` is the outermost torch-level call, which is what
    ``source_fn_stack`` reports.
    """

    def __init__(self) -> None:
        super().__init__()
        self.current: Any = None
        self._counts: dict[str, int] = {}
        self.current_name: str = ""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        outer, outer_name = self.current, self.current_name
        self.current = func
        self.current_name = self._fresh_name(getattr(func, "__name__", "fn"))
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.current, self.current_name = outer, outer_name

    def _fresh_name(self, base: str) -> str:
        n = self._counts.get(base, 0) + 1
        self._counts[base] = n
        return base if n == 1 else f"{base}_{n - 1}"


def source_fn_entry(
    modules: ModuleCalls, functions: TorchFunctions | None, op: Any
) -> list[tuple[str, Any]]:
    inner = modules.innermost()
    if inner is not None:
        fqn, mod = inner
        if type(mod).__module__.startswith("torch.nn."):
            return [(fqn.rsplit(".", 1)[-1].replace(".", "_") or "self", type(mod))]
    if functions is not None and functions.current is not None:
        return [(functions.current_name, functions.current)]
    return [(op.__name__.split(".")[0], op)]
