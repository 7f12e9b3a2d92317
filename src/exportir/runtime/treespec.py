"""Just enough of the pytree TreeSpec JSON (``Method.in_spec`` / ``out_spec``) for the runtime.

The runtime may not import the compiler's pytree, so it reads the serialized spec itself and
understands the builtin containers: tuple, list, dict, OrderedDict, namedtuple (rebuilt as a
tuple), None and leaves. Other registered types (dataclasses, custom nodes) can still be
*flattened* by duck typing — a tuple/list of the right length, or an object with the attributes
the spec's context names — but not rebuilt: for outputs the caller then gets the flat values.
A malformed spec raises :class:`TreeSpecError` (``Program.load`` reports it as a load error
naming the field).
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
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


class TreeSpecError(ValueError):
    """A spec that is present but malformed (``reason`` says how)."""


def parse(text: str) -> Spec | None:
    """The spec in ``text`` (``[1, node]`` JSON), or ``None`` if absent; raises
    :class:`TreeSpecError` if it is malformed. Specs are immutable: parsed once per text."""
    if not text:
        return None
    return _parse(text)


@functools.lru_cache(maxsize=512)
def _parse(text: str) -> Spec:
    try:
        decoded = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise TreeSpecError(f"not valid JSON: {e}") from None
    if not (isinstance(decoded, list) and len(decoded) == 2 and decoded[0] == 1):
        raise TreeSpecError("expected [1, spec] (version 1 of the TreeSpec JSON)")
    try:
        return _node(decoded[1])
    except RecursionError:
        raise TreeSpecError("nested too deeply") from None


_HASHABLE_KEYS = (str, int, float, bool, type(None))


def _node(obj: object) -> Spec:
    if not isinstance(obj, dict) or "type" not in obj or "children_spec" not in obj:
        raise TreeSpecError("a node must be an object with 'type' and 'children_spec'")
    kind = obj["type"]
    raw_children = obj["children_spec"]
    if not isinstance(raw_children, list):
        raise TreeSpecError("'children_spec' must be an array")
    children = tuple(_node(c) for c in raw_children)
    if kind is None:
        if children:
            raise TreeSpecError("a leaf has no children")
        return Spec(None, (), ())
    if kind == "builtins.NoneType":
        return Spec(kind, (), ())
    if not isinstance(kind, str):
        raise TreeSpecError(f"node type {kind!r:.40} is not a string")
    keys: tuple[object, ...] = ()
    if kind in _MAPPINGS:
        keys = _mapping_keys(obj.get("context"), len(children))
    elif kind not in _SEQUENCES:
        keys = _attribute_names(obj.get("context"), len(children))
    return Spec(kind, keys, children)


def _mapping_keys(context: object, count: int) -> tuple[object, ...]:
    """A dict's keys from its context: a JSON array (in a string) of ``count`` scalars."""
    try:
        keys = json.loads(context) if isinstance(context, str) else None
    except (ValueError, RecursionError):
        keys = None
    if not isinstance(keys, list) or len(keys) != count:
        raise TreeSpecError(f"a dict's context must be a JSON array of its {count} keys")
    for key in keys:
        if not isinstance(key, _HASHABLE_KEYS):
            raise TreeSpecError(f"dict key {key!r:.40} is not a string, number, bool or null")
    if len(set(keys)) != len(keys):
        raise TreeSpecError("a dict's keys repeat")
    return tuple(keys)


def _attribute_names(context: object, count: int) -> tuple[object, ...]:
    """Field names from a registered type's context (dataclasses: ``[[fields], [none_fields]]``)."""
    try:
        decoded = json.loads(context) if isinstance(context, str) else context
    except (ValueError, RecursionError):
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


def rebuilder(spec: Spec) -> Callable[[Sequence[object]], object]:
    """``unflatten(spec, ·)`` compiled once (``spec.rebuildable``): the runtime rebuilds a
    method's outputs on every call."""
    if spec.kind in _SEQUENCES and all(c.kind is None for c in spec.children):
        return _SEQUENCES[spec.kind]  # a tuple or list of leaves
    build = _compile_build(spec)
    return lambda leaves: build(iter(leaves))


def _compile_build(spec: Spec) -> Callable[[Iterator[object]], object]:
    if spec.kind is None:
        return next
    if spec.kind == "builtins.NoneType":
        return lambda it: None
    children = tuple(_compile_build(c) for c in spec.children)
    if spec.kind in _MAPPINGS:
        make, keys = _MAPPINGS[spec.kind], spec.keys
        return lambda it: make(zip(keys, [child(it) for child in children]))
    make = _SEQUENCES[spec.kind]
    return lambda it: make([child(it) for child in children])


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


Walk = Callable[[object, list[object]], bool]


def flattener(spec: Spec) -> Callable[[object], list[object] | None]:
    """``flatten(spec, ·)`` compiled once: the same answers, without re-reading ``spec`` on
    every call (the runtime flattens a method's inputs on every call)."""
    walk = _compile(spec)

    def run(obj: object) -> list[object] | None:
        out: list[object] = []
        return out if walk(obj, out) else None

    return run


def _compile(spec: Spec) -> Walk:
    if spec.kind is None:

        def leaf(obj: object, out: list[object]) -> bool:
            out.append(obj)
            return True

        return leaf
    if spec.kind == "builtins.NoneType":
        return lambda obj, out: obj is None
    children = tuple(_compile(c) for c in spec.children)
    if spec.kind in _MAPPINGS:
        return _compile_mapping(spec, children)
    count = len(children)
    attributes = () if spec.kind in _SEQUENCES else spec.keys
    named = bool(attributes) and all(isinstance(k, str) for k in attributes)
    all_leaves = all(c.kind is None for c in spec.children)

    def sequence(obj: object, out: list[object]) -> bool:
        if isinstance(obj, (tuple, list)):
            if len(obj) != count:
                return False
            if all_leaves:
                out.extend(obj)
                return True
            for walk, item in zip(children, obj):  # loops, not all(...): this runs per call
                if not walk(item, out):
                    return False
            return True
        if not named or not all(hasattr(obj, k) for k in attributes):
            return False
        return all(walk(getattr(obj, k), out) for k, walk in zip(attributes, children))

    return sequence


def _compile_mapping(spec: Spec, children: tuple[Walk, ...]) -> Walk:
    keys = set(spec.keys)
    pairs = tuple(zip(spec.keys, children))

    def mapping(obj: object, out: list[object]) -> bool:
        if not isinstance(obj, dict) or obj.keys() != keys:
            return False
        for k, walk in pairs:
            if not walk(obj[k], out):
                return False
        return True

    return mapping
