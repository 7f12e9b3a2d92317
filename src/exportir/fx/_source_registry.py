"""Generated source: linecache registration, compilation and deferred compilation.

Contract: :data:`_loader` (a :class:`_SourceRegistry`) gives every compiled generated source a
fake file name (``<eval_with_key>.N``) that :mod:`linecache` can read back, so tracebacks and
``inspect`` show the generated lines. :func:`_forward_from_src` compiles and returns the
``forward`` a source defines; :class:`_LazyForward` defers that compilation until the
function is first looked up.
"""

from __future__ import annotations

import linecache
from collections import OrderedDict
from collections.abc import Callable
from types import CodeType
from typing import Any


class _SourceRegistry:
    """Keeps generated sources retrievable by their fake file names (PEP 302 ``get_source``).

    ``register`` returns a fresh key per call unless ``co_fields`` names the file.  Compiled
    code objects are memoised (bounded LRU) per (source, co_fields): code objects are
    immutable, so re-executing one in fresh globals is equivalent to compiling again, and a
    recompile of an unchanged graph (pickling, deepcopy, repeated ``recompile()``) skips the
    expensive ``compile`` call.
    """

    _MAX_CODE_CACHE = 64

    def __init__(self) -> None:
        self.eval_cache: dict[str, str] = {}
        self.next_id = 0
        self._code_cache: OrderedDict[tuple[str, tuple], tuple[str, CodeType]] = OrderedDict()

    def get_source(self, module_name: str) -> str | None:
        """Loader protocol hook used by :mod:`linecache`."""
        return self.eval_cache.get(module_name)

    def _next_eval_key(self) -> str:
        """``<eval_with_key>.N`` not yet known to linecache (another FX implementation in the
        same process, e.g. torch.fx, uses the same naming scheme)."""
        while True:
            key = f"<eval_with_key>.{self.next_id}"
            self.next_id += 1
            if key not in linecache.cache:
                return key

    def _fresh_key(self, co_fields: dict[str, Any] | None) -> str:
        key = self._next_eval_key()
        if not co_fields or "co_filename" not in co_fields:
            return key
        if "co_firstlineno" not in co_fields or "co_name" not in co_fields:
            return co_fields["co_filename"]
        return (
            f"{key} from {co_fields['co_filename']}:"
            f"{co_fields['co_firstlineno']} in {co_fields['co_name']}"
        )

    def _expose(self, key: str, src: str) -> None:
        self.eval_cache[key] = src
        # lazycache only keeps a closure over the loader; a two-entry dict is enough.
        linecache.lazycache(key, {"__name__": key, "__loader__": self})

    def register(self, src: str, co_fields: dict[str, Any] | None = None) -> str:
        """Make ``src`` visible to linecache under a new fake file name and return the name."""
        key = self._fresh_key(co_fields)
        self._expose(key, src)
        return key

    def cache(
        self, src: str, globals: dict[str, Any], co_fields: dict[str, Any] | None = None
    ) -> str:
        """torch.fx's spelling of :meth:`register` (``globals`` is not needed)."""
        return self.register(src, co_fields)

    def compile(self, src: str, co_fields: dict[str, Any] | None = None) -> CodeType:
        """Compile ``src`` (registered in linecache) without inheriting our ``__future__`` flags."""
        cache_key = (src, tuple(sorted((co_fields or {}).items(), key=lambda kv: kv[0])))
        hit = self._code_cache.get(cache_key)
        if hit is not None:
            self._code_cache.move_to_end(cache_key)
            filename, code = hit
            if filename not in linecache.cache:
                self._expose(filename, src)
            return code
        filename = self.register(src, co_fields)
        code = compile(src, filename, "exec", dont_inherit=True)
        self._code_cache[cache_key] = (filename, code)
        if len(self._code_cache) > self._MAX_CODE_CACHE:
            self._code_cache.popitem(last=False)
        return code


_loader = _SourceRegistry()


def _exec_with_source(
    src: str, globals: dict[str, Any], co_fields: dict[str, Any] | None = None
) -> None:
    """Execute ``src`` in ``globals`` (mutated) with its source retrievable for tracebacks."""
    exec(_loader.compile(src, co_fields), globals)  # noqa: S102  # our own generated code


def _method_from_src(
    method_name: str,
    src: str,
    globals: dict[str, Any],
    co_fields: dict[str, Any] | None = None,
) -> Callable[..., Any]:
    """Execute ``src`` in a copy of ``globals`` and return the function it defines."""
    scope = dict(globals)
    _exec_with_source(src, scope, co_fields)
    return scope.pop(method_name)


def _forward_from_src(
    src: str, globals: dict[str, Any], co_fields: dict[str, Any] | None = None
) -> Callable[..., Any]:
    return _method_from_src("forward", src, globals, co_fields)


class _LazyForward:
    """Class attribute standing in for a generated ``forward`` until it is first looked up.

    ``recompile`` only generates source; compiling a large function costs as much again, so
    it happens on first access (a call, ``gm.forward``, tracing), after which the descriptor
    replaces itself on its class with the plain function. Non-data descriptor: an instance
    attribute ``forward`` still takes precedence, exactly as with a plain function.
    """

    __slots__ = ("_co_fields", "_globals", "_home", "_src")

    def __init__(
        self, src: str, globals: dict[str, Any], co_fields: dict[str, Any], home: type
    ) -> None:
        self._src = src
        self._globals = globals
        self._co_fields = co_fields
        self._home = home

    def resolve(self) -> Callable[..., Any]:
        """Compile now and install the function on the owning class (if still current)."""
        fn = _forward_from_src(self._src, self._globals, self._co_fields)
        if self._home.__dict__.get("forward") is self:
            self._home.forward = fn  # type: ignore[attr-defined]  # replaces this descriptor
        return fn

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        fn = self.resolve()
        return fn if obj is None else fn.__get__(obj, owner)
