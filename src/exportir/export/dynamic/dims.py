"""The ``dynamic_shapes`` API of ``exportir.export``: ``Dim``, derived dims, hints, spec checks.

A user marks tensor dimensions dynamic with a spec shaped like the inputs: a dict keyed by
``forward``'s argument names, a tuple/list in input order, or any nesting of those that follows
the inputs' pytree structure. At a tensor, the spec is ``None`` (all static), a dict
``{dim_index: d}`` or a tuple/list with one ``d`` per dimension, where each ``d`` is an int
(static, must equal the example), ``None``, a named :class:`Dim`, a derived dim (``2*dx``,
``dx + 1``) or a hint ``Dim.AUTO`` / ``Dim.DYNAMIC`` / ``Dim.STATIC`` (optionally bounded:
``Dim.AUTO(min=2, max=64)``).

``torch.export.Dim`` objects are accepted as well, duck-typed (by class name and attributes),
so code written for torch.export works unchanged.

:func:`plan_dims` checks a spec with torch.export's error texts and returns a :class:`DimPlan`:
one :class:`DimRequest` per marked tensor dimension. The export glue turns it into symbols of the
ShapeEnv (``_symbols.make_sizes``), and ``_constraints.solve`` later checks the guards.
"""

from __future__ import annotations

import enum
import inspect
import sys
from dataclasses import dataclass
from typing import Any

import sympy
import torch

__all__ = [
    "Dim",
    "DimPlan",
    "DimRequest",
    "ShapesCollection",
    "UserError",
    "UserErrorType",
    "dims",
    "plan_dims",
]

_EXPORTDB = "https://pytorch.org/docs/main/generated/exportdb/index.html"

# The largest finite value a derived dim may reach (torch's bound).
_MAX_DIM = sys.maxsize - 1


class UserErrorType(enum.Enum):
    """Why a :class:`UserError` was raised (torch's ``UserErrorType`` members used by export)."""

    CONSTRAINT_VIOLATION = enum.auto()
    INVALID_INPUT = enum.auto()


class UserError(RuntimeError):
    """The export call itself is wrong (its spec or inputs); the message says how to fix it.

    Mirrors ``torch._dynamo.exc.UserError``: with a ``case_name`` the message ends with a link to
    the exportdb page of that case.
    """

    def __init__(self, error_type: UserErrorType, msg: str, case_name: str | None = None):
        if case_name is not None:
            msg += " " if msg.endswith(".") else "\n"
            msg += f"For more information about this error, see: {_EXPORTDB}#{case_name.replace('_', '-')}"
        super().__init__(msg)
        self.error_type = error_type
        self.msg = msg
        self.violations: tuple[Any, ...] = ()  # CONSTRAINT_VIOLATION: the solver's findings
        self.fixes: dict[str, str] = {}  # dim name -> suggested definition


def _invalid(msg: str) -> UserError:
    return UserError(UserErrorType.INVALID_INPUT, msg, case_name="dynamic_shapes_validation")


# ---------------------------------------------------------------------------- hints


class _DimHintType(enum.Enum):
    AUTO = enum.auto()
    STATIC = enum.auto()
    DYNAMIC = enum.auto()


@dataclass(frozen=True, slots=True)
class _DimHint:
    """``Dim.AUTO`` / ``Dim.DYNAMIC`` / ``Dim.STATIC``; call one to bound it: ``Dim.AUTO(max=8)``."""

    type: _DimHintType
    min: int | None = None
    max: int | None = None
    _factory: bool = True

    def __call__(self, min: int | None = None, max: int | None = None) -> _DimHint:
        if not self._factory:
            raise TypeError(f"'{type(self)}' object is not callable")
        if min is not None and min < 0:
            raise ValueError(f"min must be non-negative, got {min}")
        if max is not None and max < 0:
            raise ValueError(f"max must be non-negative, got {max}")
        if min is not None and max is not None and min > max:
            raise ValueError(f"min must be <= max, got min={min}, max={max}")
        return _DimHint(self.type, min, max, _factory=False)

    def __repr__(self) -> str:
        parts = [self.type.name]
        if self.min is not None:
            parts.append(f"min={self.min}")
        if self.max is not None:
            parts.append(f"max={self.max}")
        return f"DimHint({', '.join(parts)})"


# ---------------------------------------------------------------------------- named dims


class _IntInfinity:
    """Unbounded ``max`` of a Dim; prints as torch's ``int_oo``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "int_oo"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _IntInfinity) or other == sympy.oo or other == float("inf")

    def __hash__(self) -> int:
        return hash(float("inf"))

    def __gt__(self, other: object) -> bool:
        return not self == other

    def __ge__(self, other: object) -> bool:
        return True

    def __lt__(self, other: object) -> bool:
        return False

    def __le__(self, other: object) -> bool:
        return self == other


int_oo = _IntInfinity()


class Dim:
    """A named symbolic dimension: ``Dim("batch", min=1, max=64)``.

    The same Dim at two places says the two sizes are equal; ``2*dx``, ``dx + 1``, ``dx - 1``
    derive dims related to ``dx`` by an increasing linear function. ``Dim.AUTO`` lets export
    choose (static or dynamic, no error), ``Dim.DYNAMIC`` requires a dynamic dimension without a
    name, ``Dim.STATIC`` fixes it to the example's size.
    """

    AUTO = _DimHint(_DimHintType.AUTO)
    DYNAMIC = _DimHint(_DimHintType.DYNAMIC)
    STATIC = _DimHint(_DimHintType.STATIC)

    def __init__(self, name: str, *, min: int | None = None, max: int | None = None):
        low = 0 if min is None else min
        high = int_oo if max is None else max
        if not high > low:
            raise ValueError(f"Cannot create Dim with inconsistent min={min}, max={max}")
        if not name.isidentifier():
            raise ValueError(f"Dim name must be a valid identifier, got {name}")
        self.__name__ = name
        self.min = low
        self.max = high

    def _linear(self, scale: int, offset: int) -> Dim:
        return _DerivedDim(self, scale, offset)

    def __add__(self, other: object) -> Dim:
        if type(other) is not int:
            raise NotImplementedError(
                f"Attempted to add {other} to {self.__name__}, where an integer was expected. "
                "(Only increasing linear operations with integer coefficients are supported.)"
            )
        return self._linear(1, other)

    __radd__ = __add__

    def __sub__(self, other: object) -> Dim:
        if type(other) is not int:
            raise NotImplementedError(
                f"Attempted to subtract {other} from {self.__name__}, where an integer was "
                "expected. (Only increasing linear operations with integer coefficients are "
                "supported.)"
            )
        return self._linear(1, -other)

    def __rsub__(self, other: object) -> Dim:
        raise NotImplementedError(
            f"Attempted to negate {self.__name__}. "
            "(Only increasing linear operations with integer coefficients are supported.)"
        )

    def __mul__(self, other: object) -> Dim:
        if type(other) is not int or other <= 0:
            raise NotImplementedError(
                f"Attempted to multiply {other} with {self.__name__}, where a positive integer "
                "was expected. (Only increasing linear operations with integer coefficients are "
                "supported.)"
            )
        return self._linear(other, 0)

    __rmul__ = __mul__

    @staticmethod
    def _readable(name: str, min_: Any, max_: Any) -> str:
        """``Dim('dx', min=3)``: the Python that recreates the dim (min 2 and no max omitted)."""
        args = [f"'{name}'"]
        if min_ != 2:
            args.append(f"min={min_}")
        if max_ != int_oo:
            args.append(f"max={max_}")
        return f"Dim({', '.join(args)})"

    def __repr__(self) -> str:
        return Dim._readable(self.__name__, self.min, self.max)


class _DerivedDim(Dim):
    """``scale * root + offset`` for a named root Dim (``scale`` positive)."""

    def __init__(self, root: Dim, scale: int, offset: int):
        if isinstance(root, _DerivedDim):
            root, scale, offset = root.root, root.scale * scale, root.offset * scale + offset
        self.root = root
        self.scale = scale
        self.offset = offset
        self.__name__ = str(scale * sympy.Symbol(root.__name__, integer=True) + offset)

    def _linear(self, scale: int, offset: int) -> Dim:
        return _DerivedDim(self.root, self.scale * scale, self.offset * scale + offset)

    def fn(self, x: Any) -> Any:
        return self.scale * x + self.offset

    @property
    def min(self) -> Any:  # type: ignore[override]  # computed from the root
        low = self.fn(self.root.min)
        if low < 0:
            raise ValueError(
                f"Expected derived min value of {self.__name__} to be >= 0. Please specify an "
                f"appropriate min value for {self.root.__name__} (currently {self.root.min})."
            )
        return low

    @property
    def max(self) -> Any:  # type: ignore[override]  # computed from the root
        if self.root.max == int_oo:
            return int_oo
        high = self.fn(self.root.max)
        if high > _MAX_DIM:
            raise ValueError(
                f"Expected derived max value of {self.__name__} to be <= {_MAX_DIM}. Please "
                f"specify an appropriate max value for {self.root.__name__} "
                f"(currently {self.root.max})."
            )
        return high

    def __repr__(self) -> str:
        return self.__name__


def dims(*names: str, min: int | None = None, max: int | None = None) -> tuple[Dim, ...]:
    """Several Dims with the same bounds: ``batch, seq = dims("batch", "seq", max=512)``."""
    return tuple(Dim(name, min=min, max=max) for name in names)


# ---------------------------------------------------------------------------- duck typing

# torch.export's classes, recognised by name so src/ never imports torch.export.
_TORCH_DIM_CLASSES = frozenset({"Dim", "_Dim", "_DerivedDim", "_StaticDim"})


@dataclass(frozen=True, slots=True)
class DimSpec:
    """One spec entry, normalized: a named dim, a derived dim, a hint, or a static size."""

    kind: str  # "named" | "derived" | "auto" | "dynamic" | "static"
    name: str | None = None  # the Dim's name (derived: the root's name)
    min: int | None = None
    max: int | None = None  # None: unbounded
    scale: int = 1  # derived: size = scale * root + offset
    offset: int = 0
    value: int | None = None  # static int given by the user
    text: str = ""  # how the user wrote it (for messages)


def _bound(v: Any) -> int | None:
    if v is None or v == int_oo or type(v).__name__ in ("IntInfinity", "_IntInfinity"):
        return None
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return None


def _torch_derived_linear(dim: Any) -> tuple[int, int]:
    """(scale, offset) of a torch ``_DerivedDim`` by evaluating its ``fn`` at 0 and 1."""
    at0, at1 = dim.fn(sympy.Integer(0)), dim.fn(sympy.Integer(1))
    return int(at1 - at0), int(at0)


def _hint_spec(d: Any) -> DimSpec | None:
    kind = getattr(getattr(d, "type", None), "name", None)
    if type(d).__name__ not in ("_DimHint", "DimHint") or kind not in ("AUTO", "STATIC", "DYNAMIC"):
        return None
    return DimSpec(kind.lower(), min=d.min, max=_bound(d.max), text=repr(d))


def as_dim_spec(d: Any) -> DimSpec | None:
    """Normalize one spec entry (ours or torch's, duck-typed); None if it is not a dim."""
    if d is None:
        return DimSpec("static", text="None")
    if type(d) is int:
        return DimSpec("static", value=d, text=str(d))
    hint = _hint_spec(d)
    if hint is not None:
        return hint
    cls = type(d).__name__
    if not (isinstance(d, Dim) or (cls in _TORCH_DIM_CLASSES and hasattr(d, "__name__"))):
        return None
    if cls == "_StaticDim":
        return DimSpec("static", value=int(d.value), text=str(d.value))
    if isinstance(d, _DerivedDim) or cls == "_DerivedDim":
        scale, offset = (d.scale, d.offset) if isinstance(d, _DerivedDim) else _torch_derived_linear(d)
        root = d.root
        return DimSpec(
            "derived", root.__name__, int(root.min), _bound(root.max), scale, offset, text=d.__name__
        )
    return DimSpec("named", d.__name__, int(d.min), _bound(d.max), text=repr(d))


# ---------------------------------------------------------------------------- plans


@dataclass(frozen=True, slots=True)
class DimRequest:
    """One marked tensor dimension: where it is, its example size and what the user asked."""

    tensor_id: int
    dim: int
    hint: int  # the example input's size
    source: str  # torch's source text: L['x'].size()[0]
    spec: DimSpec


@dataclass(frozen=True, slots=True)
class DimPlan:
    """Every marked dimension of one export call (empty without ``dynamic_shapes``)."""

    requests: tuple[DimRequest, ...]
    dynamic_shapes: Any  # the user's spec, kept for messages

    def for_tensor(self, t: torch.Tensor) -> tuple[DimRequest, ...]:
        return tuple(r for r in self.requests if r.tensor_id == id(t))


# ---------------------------------------------------------------------------- spec walking


def combine_args(f: Any, args: tuple, kwargs: dict | None) -> dict[str, Any]:
    """``forward``'s arguments bound to the example inputs, by parameter name (torch's order)."""
    fn = getattr(f, "exported_function", None) or (f.forward if isinstance(f, torch.nn.Module) else f)
    return inspect.signature(fn).bind(*args, **(kwargs or {})).arguments


def _keystr(path: tuple[Any, ...]) -> str:
    return "".join(f"[{k!r}]" for k in path)


def _children(tree: Any) -> tuple[str, list[Any], list[Any]] | None:
    """``(kind, keys, children)`` of a pytree container (kind: the type's role), None for a leaf."""
    typ = type(tree)
    if typ in (tuple, list):
        return typ.__name__, list(range(len(tree))), list(tree)
    if typ is dict:
        return "dict", list(tree), list(tree.values())
    from exportir.pytree import DEFAULT_REGISTRY

    node = DEFAULT_REGISTRY.node_for(typ) if isinstance(tree, object) else None
    if node is None or isinstance(tree, torch.Tensor):
        return None
    children, _ = node.flatten_fn(tree)
    children = list(children)
    return "other", list(range(len(children))), children  # user classes: their children


def _mismatch(msg: str) -> UserError:
    return _invalid(f"Detected mismatch between the structure of `inputs` and `dynamic_shapes`: {msg}")


_SPEC_KIND = {tuple: "tuple", list: "list", dict: "dict"}


def _walk(tree: Any, spec: Any, path: tuple, out: list[tuple[tuple, Any, Any]]) -> None:
    """Pair each input leaf with its spec; raise torch's mismatch error on a structure difference."""
    node = _children(tree)
    if node is None:
        out.append((path, tree, spec))
        return
    kind, keys, children = node
    where, at = f"`inputs{_keystr(path)}`", f"`dynamic_shapes{_keystr(path)}`"
    spec_kind = _SPEC_KIND.get(type(spec))
    if spec_kind is None and type(spec) is not type(tree):
        raise _mismatch(f"{where} is a {type(tree)}, but {at} is not")
    if kind == "other" and type(spec) is type(tree):
        spec = _children(spec)[2]  # a spec built like the input class (a namedtuple of specs)
    elif spec_kind != kind and not (kind == "other" and spec_kind in ("tuple", "list")):
        raise _mismatch(f"{where} is a {type(tree)}, but {at} is a {type(spec)}")
    if len(spec) != len(children):
        raise _mismatch(f"{where} has {len(children)} elements, but {at} has {len(spec)} elements")
    if kind == "dict":
        if set(spec) != set(keys):
            raise _mismatch(f"{where} has keys {keys}, but {at} has keys {list(spec)}")
        spec_children = [spec[k] for k in keys]
    else:
        spec_children = list(spec)
    for key, child, child_spec in zip(keys, children, spec_children):
        _walk(child, child_spec, (*path, key), out)


def _top_level(combined: dict[str, Any], dynamic_shapes: Any) -> tuple[Any, Any]:
    if isinstance(dynamic_shapes, dict):
        got, expected = list(dynamic_shapes), list(combined)
        if sorted(got) != sorted(expected):
            msg = (
                "When `dynamic_shapes` is specified as a dict, its top-level keys must be the arg "
                f"names {expected} of `inputs`, but here they are {got}. "
            )
            if len(combined) == 1 and expected[0] not in got and isinstance(combined[expected[0]], dict):
                msg += (
                    "Since here `inputs` is a list/tuple enclosing a single dict, maybe you just "
                    "forgot to enclose `dynamic_shapes` in a list/tuple?"
                )
            else:
                msg += (
                    "Alternatively, you could also ignore arg names entirely and specify "
                    "`dynamic_shapes` as a list/tuple matching `inputs`."
                )
            raise _invalid(msg)
        return combined, dynamic_shapes
    if isinstance(dynamic_shapes, (tuple, list)):
        return type(dynamic_shapes)(combined.values()), dynamic_shapes
    raise _invalid(
        f"Expected dynamic_shapes to be a dict, tuple, or list, but got {type(dynamic_shapes)}: "
        "write a dict keyed by argument name, e.g. {'x': {0: Dim('batch')}}, or a tuple in "
        "input order, e.g. ({0: Dim('batch')},)"
    )


# ---------------------------------------------------------------------------- leaf checks


def _dim_items(path: tuple, t: torch.Tensor, shape: Any) -> list[tuple[int, Any]]:
    at = f"`dynamic_shapes{_keystr(path)}`"
    if shape is None:
        return []
    if isinstance(shape, dict):
        items = list(shape.items())
        bad_text = "mapped to index {i}"
        extra = " "
    elif isinstance(shape, (tuple, list)):
        if len(shape) != t.dim():
            raise _invalid(
                f"Expected dynamic shape spec {shape} specified at {at} to have the same length "
                f"as the actual tensor shape {t.shape} (expected {t.dim()}, but got "
                f"{len(shape)} instead)"
            )
        items = list(enumerate(shape))
        bad_text = "#{i}"
        extra = ""
    else:
        raise _invalid(
            f"Unexpected input tensor shape {shape} specified at {at} (expected either a "
            "list/tuple of dimensions, or a dict mapping indices to dimensions, where each "
            "dimension is an int, a Dim, Dim.AUTO, Dim.STATIC, or Dim.DYNAMIC)"
        )
    for i, d in items:
        if as_dim_spec(d) is None:
            raise _invalid(
                f"Unexpected dimension {bad_text.format(i=i)} in input tensor shape {shape} "
                f"specified at {at} (expected None, an int, a Dim, Dim.AUTO, Dim.STATIC, or "
                f"Dim.DYNAMIC,{extra} but got {d!r} instead)"
            )
        if not (isinstance(i, int) and -t.dim() <= i < t.dim()):
            raise _invalid(
                f"Dimension index {i!r} in input tensor shape {shape} specified at {at} is out "
                f"of range for a tensor of shape {t.shape}: use an int in [0, {t.dim()})"
            )
    return [(i % t.dim(), d) for i, d in items]


def source_name(path: tuple) -> str:
    """torch's source text of an input: ``L['x']``, ``L['ys'][0]``, ``L['d']['a']``."""
    name, *rest = path
    return f"L[{name!r}]" + "".join(f"[{k!r}]" for k in rest)


def _check_leaf(path: tuple, leaf: Any, shape: Any, bounds: dict[str, tuple[Any, Any, str]]):
    if not isinstance(leaf, torch.Tensor):
        if shape is not None and not (type(leaf) is int and _hint_spec(shape) is not None):
            raise _invalid(
                f"Cannot associate shape {shape} specified at `dynamic_shapes{_keystr(path)}` to "
                f"non-tensor type {type(leaf)} at `inputs{_keystr(path)}` (expected None)"
            )
        return []
    items = _dim_items(path, leaf, shape)
    for _, d in items:
        spec = as_dim_spec(d)
        if spec.kind in ("named", "derived"):
            _check_same_bounds(spec, d, bounds)
    return items


def _check_same_bounds(spec: DimSpec, d: Any, bounds: dict[str, tuple[Any, Any, str]]) -> None:
    root = d.root if spec.kind == "derived" else d
    low, high = root.min, root.max
    seen = bounds.setdefault(spec.name, (low, high, repr(root)))
    if (seen[0], _bound(seen[1])) != (low, _bound(high)):
        this = Dim._readable(spec.name, seen[0], seen[1])
        that = Dim._readable(spec.name, low, high)
        raise UserError(
            UserErrorType.INVALID_INPUT,
            f"Found different definitions {this} and {that} for the same symbolic dimension "
            f"{root!r}!",
        )


def plan_dims(f: Any, args: tuple, kwargs: dict | None, dynamic_shapes: Any) -> DimPlan:
    """Check ``dynamic_shapes`` against the example inputs; one request per marked dimension.

    Raises :class:`UserError` with torch.export's messages for a malformed spec.
    """
    if dynamic_shapes is None:
        return DimPlan((), None)
    if isinstance(dynamic_shapes, ShapesCollection):
        dynamic_shapes = dynamic_shapes.dynamic_shapes(f, args, kwargs)
    combined = combine_args(f, args, kwargs)
    if isinstance(dynamic_shapes, (dict, tuple, list)) and len(dynamic_shapes) == 0:
        return DimPlan((), dynamic_shapes)
    tree, spec = _top_level(combined, dynamic_shapes)
    names = list(combined)
    pairs: list[tuple[tuple, Any, Any]] = []
    _walk(tree, spec, (), pairs)
    bounds: dict[str, tuple[Any, Any, str]] = {}
    requests: list[DimRequest] = []
    seen_ids: set[int] = set()
    for path, leaf, shape in pairs:
        named_path = (names[path[0]], *path[1:]) if isinstance(path[0], int) else path
        items = _check_leaf(path, leaf, shape, bounds)
        if not isinstance(leaf, torch.Tensor) or id(leaf) in seen_ids:
            continue
        seen_ids.add(id(leaf))
        src = source_name(named_path)
        for i, d in items:
            spec = as_dim_spec(d)
            if spec.kind == "static" and spec.value is None:
                continue  # None / Dim.STATIC: the example's size, nothing to check
            requests.append(DimRequest(id(leaf), i, int(leaf.shape[i]), f"{src}.size()[{i}]", spec))
    _check_static_values(requests)
    return DimPlan(tuple(requests), dynamic_shapes)


def _check_static_values(requests: list[DimRequest]) -> None:
    for r in requests:
        if r.spec.kind == "static" and r.spec.value is not None and r.spec.value != r.hint:
            raise UserError(
                UserErrorType.CONSTRAINT_VIOLATION,
                f"Static shape constraint of {r.spec.value} does not match input size of "
                f"{r.hint}, for {r.source}",
            )


# ---------------------------------------------------------------------------- ShapesCollection


class ShapesCollection:
    """Build a spec by tensor instead of by position: ``sc[x] = (batch, 3)``.

    ``export(..., dynamic_shapes=sc)`` (or ``sc.dynamic_shapes(mod, args)``) lays the shapes out
    like the inputs; tensors not given a shape get ``None``.
    """

    def __init__(self) -> None:
        self._shapes: dict[int, Any] = {}

    def __setitem__(self, t: torch.Tensor, shape: Any) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"Cannot assign shape to non-tensor type {type(t)}")
        if id(t) in self._shapes and self._shapes[id(t)] != shape:
            raise ValueError(
                f"Shapes assigned to input do not match: expected {self._shapes[id(t)]}, got {shape}"
            )
        self._shapes[id(t)] = shape

    def __getitem__(self, t: torch.Tensor) -> Any:
        return self._shapes.setdefault(id(t), {})

    def __len__(self) -> int:
        return len(self._shapes)

    def dynamic_shapes(self, m: Any, args: tuple, kwargs: dict | None = None) -> dict[str, Any]:
        """The spec as a dict by argument name, nested like the inputs."""
        found: set[int] = set()

        def build(tree: Any) -> Any:
            node = _children(tree)
            if node is None:
                if isinstance(tree, torch.Tensor) and id(tree) in self._shapes:
                    found.add(id(tree))
                    return self._shapes[id(tree)]
                return None
            kind, keys, children = node
            built = [build(c) for c in children]
            if kind == "dict":
                return dict(zip(keys, built))
            return tuple(built) if kind == "tuple" else built

        result = {name: build(v) for name, v in combine_args(m, args, kwargs).items()}
        if set(self._shapes) - found:
            raise ValueError(
                "Some tensors that were assigned shapes were not found in args. Maybe such "
                "tensors were copied when passing them as args? Maybe such tensors are contained "
                "in classes that were not registered with pytree?"
            )
        return result
