"""Just enough of the pytree TreeSpec JSON (``Method.in_spec`` / ``out_spec``) for the runtime.

The runtime may not import the compiler's pytree, so it reads the serialized spec itself and
understands the builtin containers: tuple, list, dict, OrderedDict, namedtuple (rebuilt as a
tuple), None and leaves. Other registered types (dataclasses, custom nodes) can still be
*flattened* by duck typing — a tuple/list of the right length, or an object with the attributes
the spec's context names — but not rebuilt: for outputs the caller then gets the flat values.
A spec that cannot be parsed at all yields ``None``.
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
    keys: tuple[object, ...]  # dict keys, or attribute names of other registered types
    children: tuple[Spec, ...]

    @property
    def rebuildable(self) -> bool:
        """Whether :func:`unflatten` can rebuild it (only builtin containers)."""
        known = self.kind is None or self.kind in _SEQUENCES or self.kind in _MAPPINGS or (
            self.kind == "builtins.NoneType"
        )
        return known and all(c.rebuildable for c in self.children)

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
    if not isinstance(kind, str):
        return None
    keys: tuple[object, ...] = ()
    if kind in _MAPPINGS:
        context = json.loads(obj["context"])
        if not isinstance(context, list) or len(context) != len(children):
            return None
        keys = tuple(context)
    elif kind not in _SEQUENCES:
        keys = _attribute_names(obj.get("context"), len(children))
    return Spec(kind, keys, tuple(children))


def _attribute_names(context: object, count: int) -> tuple[object, ...]:
    """Field names from a registered type's context (dataclasses: ``[[fields], [none_fields]]``)."""
    try:
        decoded = json.loads(context) if isinstance(context, str) else context
    except ValueError:
        return ()
    if isinstance(decoded, list) and decoded and isinstance(decoded[0], list):
        decoded = decoded[0]
    if isinstance(decoded, list) and len(decoded) == count:
        return tuple(decoded) if all(isinstance(n, str) for n in decoded) else ()
    return ()


def unflatten(spec: Spec, leaves: Sequence[object]) -> object:
    """Rebuild the container ``spec`` describes from ``leaves`` (``len == spec.num_leaves``;
    ``spec.rebuildable``)."""
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
    if isinstance(obj, (tuple, list)):
        if len(obj) != len(spec.children):
            return False
        return all(_walk(c, o, out) for c, o in zip(spec.children, obj))
    if spec.kind in _SEQUENCES or not spec.keys:
        return False
    if not all(isinstance(k, str) and hasattr(obj, k) for k in spec.keys):
        return False
    return all(_walk(c, getattr(obj, k), out) for k, c in zip(spec.keys, spec.children))
