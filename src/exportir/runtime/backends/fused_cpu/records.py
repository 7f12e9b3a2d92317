"""``record``: the package's immutable value types, made without compiling source.

``collections.namedtuple`` builds its ``__new__`` by ``eval``-ing generated source (~0.15 ms a
type with its class body); the backend defines nine value types and is imported by the first
load of every program with a fused delegate, where that was a third of the import. A record
type is a ``tuple`` subclass like a namedtuple (unpacking, equality, hashing, ``_fields``,
``_replace``, a ``Name(field=value, ...)`` repr) whose ``__new__`` is one shared function.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

try:  # CPython's C descriptor namedtuple uses (faster to read than a property)
    from _collections import _tuplegetter as _getter
except ImportError:  # pragma: no cover - other Pythons

    def _getter(index: int, doc: str) -> Any:
        return property(itemgetter(index), doc=doc)


__all__ = ["record"]

_MISSING = object()


def record(typename: str, field_names: str, defaults: tuple[Any, ...] = ()) -> type:
    """A tuple type with the named fields (space-separated), the last ``len(defaults)`` of
    them optional: ``class Row(record("Row", "a b", defaults=(0,))): __slots__ = ()``."""
    fields = tuple(field_names.split())
    n = len(fields)
    if len(defaults) > n or len(set(fields)) != n:
        raise ValueError(f"record {typename}: bad fields {field_names!r} / defaults {defaults!r}")
    required = n - len(defaults)
    defaults = tuple(defaults)
    filled = (_MISSING,) * required + defaults
    position = {name: i for i, name in enumerate(fields)}

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        given = len(args)
        if not kwargs and required <= given <= n:
            return tuple.__new__(cls, args + defaults[given - required:])
        if given > n:
            raise TypeError(f"{typename}() takes {n} arguments; got {given}")
        values = [*args, *filled[given:]]
        for key, value in kwargs.items():
            at = position.get(key, -1)
            if at < given:
                why = "unexpected" if at < 0 else "repeated"
                raise TypeError(f"{typename}() got an {why} argument {key!r}")
            values[at] = value
        if given < required and any(v is _MISSING for v in values[given:required]):
            missing = [f for f, v in zip(fields, values) if v is _MISSING]
            raise TypeError(f"{typename}() is missing {', '.join(map(repr, missing))}")
        return tuple.__new__(cls, values)

    def _replace(self: Any, **changes: Any) -> Any:
        unknown = set(changes) - set(fields)
        if unknown:
            raise TypeError(f"{typename}._replace() got unexpected fields {sorted(unknown)}")
        return tuple.__new__(type(self), [changes.get(f, v) for f, v in zip(fields, self)])

    def __repr__(self: Any) -> str:
        inner = ", ".join(f"{f}={v!r}" for f, v in zip(fields, self))
        return f"{type(self).__name__}({inner})"

    def __getnewargs__(self: Any) -> tuple[Any, ...]:
        return tuple(self)

    namespace: dict[str, Any] = {
        "__slots__": (),
        "__doc__": f"{typename}({', '.join(fields)})",
        "__new__": __new__,
        "__repr__": __repr__,
        "__getnewargs__": __getnewargs__,
        "__match_args__": fields,
        "_fields": fields,
        "_field_defaults": dict(zip(fields[n - len(defaults):], defaults)),
        "_replace": _replace,
    }
    for i, name in enumerate(fields):
        namespace[name] = _getter(i, f"field {i}: {name}")
    return type(typename, (tuple,), namespace)
