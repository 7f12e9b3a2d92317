"""Unique Python identifiers for graph values.

A ``_Namespace`` hands out names that are valid identifiers, unique within the namespace, and
never shadow a keyword or builtin (unless the object *is* that builtin). Its naming rules are
the ones torch.fx uses, so node names come out identical: ``add``, ``add_1``, ``linear_weight``.
"""

from __future__ import annotations

import builtins
import keyword
import re

__all__ = ["_Namespace", "is_magic", "reserve_name", "snake_case"]

# Names a generated variable may not take: keywords and builtins. The value is the object that
# legitimately owns the name (a builtin), or a fresh sentinel for keywords.
_RESERVED: dict[str, object] = {k: object() for k in keyword.kwlist}
_RESERVED.update(builtins.__dict__)



def reserve_name(name: str, owner: object) -> None:
    """Forbid generated values from taking ``name`` unless they are ``owner`` itself.

    Used for the globals every generated function sees (``torch``, ``inf``, ``device``...).
    """
    _RESERVED[name] = owner


_ILLEGAL_CHARS = re.compile("[^0-9a-zA-Z_]+")
# identifier, split into a base and an optional ``_<digits>`` suffix
_BASE_AND_SUFFIX = re.compile(r"^([a-zA-Z_][0-9a-zA-Z_]*?)(?:_(\d+))?$")
_CAMEL_HUMP = re.compile(r"(?<=[a-z])([A-Z])")


def snake_case(s: str) -> str:
    """``pascalCase`` -> ``pascal_case``; ``ALL_CAPS`` -> ``all_caps``."""
    return _CAMEL_HUMP.sub(r"_\1", s).lower()


def is_magic(s: str) -> bool:
    return s.startswith("__") and s.endswith("__")


def _sanitize(candidate: str) -> re.Match[str]:
    cleaned = _ILLEGAL_CHARS.sub("_", candidate) or "_unnamed"
    if cleaned[0].isdigit():
        cleaned = "_" + cleaned
    match = _BASE_AND_SUFFIX.match(cleaned)
    if match is None:  # unreachable for sanitized input; kept as a real error, not an assert
        raise ValueError(f"cannot derive an identifier from {candidate!r}")
    return match


class _Namespace:
    """Associates objects with unique identifier names.

    Invariants: an object has at most one name; a name belongs to at most one object; a name
    never shadows a keyword or builtin unless the object is that builtin.
    """

    __slots__ = ("_base_count", "_obj_to_name", "_used_names")

    def __init__(self) -> None:
        self._obj_to_name: dict[object, str] = {}
        self._used_names: set[str] = set()
        self._base_count: dict[str, int] = {}

    def create_name(self, candidate: str, obj: object | None) -> str:
        """Return a fresh unique name derived from ``candidate`` (or ``obj``'s existing name)."""
        if obj is not None:
            known = self._obj_to_name.get(obj)
            if known is not None:
                return known
        match = _BASE_AND_SUFFIX.match(candidate) or _sanitize(candidate)
        name = match.group(0)
        base, suffix = match.group(1, 2)
        used = self._used_names
        if suffix is None or name in used:
            num = self._base_count.get(base, 0)
            if _RESERVED.get(name, obj) is not obj:
                num += 1
                name = f"{base}_{num}"
        else:
            num = int(suffix)
        while name in used:
            num += 1
            name = f"{base}_{num}"
        used.add(name)
        self._base_count[base] = num
        if obj is not None:
            self._obj_to_name[obj] = name
        return name

    def associate_name_with_obj(self, name: str, obj: object) -> None:
        """Record that ``obj`` is called ``name``; ``obj`` must not have another name already."""
        existing = self._obj_to_name.setdefault(obj, name)
        if existing is not name:
            raise ValueError(f"object {obj!r} already has the name {existing!r}, not {name!r}")

    def _rename_object(self, obj: object, name: str) -> None:
        if obj not in self._obj_to_name:
            raise KeyError(f"cannot rename {obj!r}: it has no name in this namespace")
        self._obj_to_name[obj] = name
        self._used_names.add(name)

    def copy(self) -> _Namespace:
        other = _Namespace()
        other._obj_to_name = dict(self._obj_to_name)
        other._used_names = set(self._used_names)
        other._base_count = dict(self._base_count)
        return other
