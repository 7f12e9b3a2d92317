"""Just enough of the pytree TreeSpec JSON (``Method.in_spec`` / ``out_spec``) for the runtime.

The runtime may not import the compiler's pytree, so it reads the serialized spec itself and
understands the builtin containers: tuple, list, dict, OrderedDict, namedtuple (rebuilt as a
tuple), None and leaves. A spec it does not understand yields ``None``: callers then use the
flat values, which is always correct.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

_SEQUENCES = {"builtins.tuple": tuple, "builtins.list": list, "collections.namedtuple": tuple}
_MAPPINGS = {"builtins.dict": dict, "collections.OrderedDict": OrderedDict}


@dataclass(frozen=True, slots=True)
class Spec:
    kind: str | None  # None: a leaf
    keys: tuple[object, ...]
    children: tuple[Spec, ...]

    @property
    def num_leaves(self) -> int:
        if self.kind is None:
            return 1
        return sum(c.num_leaves for c in self.children)


def parse(text: str) -> Spec | None:
    """The spec in ``text`` (``[1, node]`` JSON), or ``None`` if absent or not understood."""
    if not text:
        return None
    try:
        decoded = json.loads(text)
        if not (isinstance(decoded, list) and len(decoded) == 2 and decoded[0] == 1):
            return None
        return _node(decoded[1])
    except (ValueError, TypeError, KeyError, RecursionError):
        return None


def _node(obj: object) -> Spec | None:
    if not isinstance(obj, dict):
        return None
    kind = obj["type"]
    raw_children = obj["children_spec"]
    if not isinstance(raw_children, list):
        return None
    children = []
    for c in raw_children:
        child = _node(c)
        if child is None:
            return None
        children.append(child)
    if kind is None:
        return Spec(None, (), ()) if not children else None
    if kind == "builtins.NoneType":
        return Spec(kind, (), ())
    keys: tuple[object, ...] = ()
    if kind in _MAPPINGS:
        context = json.loads(obj["context"])
        if not isinstance(context, list) or len(context) != len(children):
            return None
        keys = tuple(context)
    elif kind not in _SEQUENCES:
        return None
    return Spec(kind, keys, tuple(children))


def unflatten(spec: Spec, leaves: Sequence[object]) -> object:
    """Rebuild the container ``spec`` describes from ``leaves`` (``len == spec.num_leaves``)."""
    it = iter(leaves)
    return _build(spec, it)


def _build(spec: Spec, it) -> object:
    if spec.kind is None:
        return next(it)
    if spec.kind == "builtins.NoneType":
        return None
    items = [_build(c, it) for c in spec.children]
    if spec.kind in _MAPPINGS:
        return _MAPPINGS[spec.kind](zip(spec.keys, items))
    return _SEQUENCES[spec.kind](items)


def flatten(spec: Spec, obj: object) -> list[object] | None:
    """The leaves of ``obj`` if its structure matches ``spec``, else ``None``."""
    out: list[object] = []
    return out if _walk(spec, obj, out) else None


def _walk(spec: Spec, obj: object, out: list[object]) -> bool:
    if spec.kind is None:
        out.append(obj)
        return True
    if spec.kind == "builtins.NoneType":
        return obj is None
    if spec.kind in _MAPPINGS:
        if not isinstance(obj, dict) or set(obj) != set(spec.keys):
            return False
        return all(_walk(c, obj[k], out) for k, c in zip(spec.keys, spec.children))
    if not isinstance(obj, (tuple, list)) or len(obj) != len(spec.children):
        return False
    return all(_walk(c, o, out) for c, o in zip(spec.children, obj))
