"""``exportir export --dynamic``: dynamic-dimension specs written on the command line.

A spec is ``INPUT:DIM=NAME[MIN,MAX]``:

* ``INPUT`` names an argument of ``forward`` (``x``) or gives its position (``0``);
* ``DIM`` is the index of a dimension of that tensor (negative counts from the end);
* ``NAME`` names the :class:`exportir.Dim`; the same name at several places is one Dim (the
  sizes are equal);
* ``[MIN,MAX]`` bounds it; either bound may be left out (``[2,]``, ``[,512]``) and so may the
  brackets (export's default range).

Several specs may share one flag, separated by spaces or ``;``
(``--dynamic "x:0=batch[1,64] x:1=seq[2,128]"``), and the flag repeats. :func:`dynamic_shapes`
turns them into the ``dynamic_shapes`` argument of :func:`exportir.export`.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DimSpecError", "DynamicSpec", "dynamic_shapes", "parse_dynamic"]

_SPEC = re.compile(
    r"^(?P<input>[A-Za-z_][A-Za-z0-9_]*|\d+):(?P<dim>-?\d+)="
    r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:\[(?P<min>\s*\d*\s*),(?P<max>\s*\d*\s*)\])?$"
)
_FORM = "INPUT:DIM=NAME[MIN,MAX], e.g. x:0=batch[1,64] (INPUT: a name or position of forward's inputs)"


class DimSpecError(ValueError):
    """A ``--dynamic`` spec that cannot be applied; the message says why and what to write."""


@dataclass(frozen=True, slots=True)
class DynamicSpec:
    """One parsed spec: ``input`` is a name or a position."""

    input: str | int
    dim: int
    name: str
    min: int | None
    max: int | None
    text: str


def parse_dynamic(texts: Sequence[str]) -> list[DynamicSpec]:
    """The specs of every ``--dynamic`` value (each may hold several)."""
    specs = []
    for text in texts:
        for part in re.split(r"[\s;]+", text.strip()):
            if part:
                specs.append(_parse_one(part))
    return specs


def _parse_one(text: str) -> DynamicSpec:
    match = _SPEC.match(text)
    if match is None:
        raise DimSpecError(f"cannot read dynamic spec {text!r}: expected {_FORM}")
    low = match["min"].strip() if match["min"] is not None else ""
    high = match["max"].strip() if match["max"] is not None else ""
    where = match["input"]
    return DynamicSpec(
        input=int(where) if where.isdigit() else where,
        dim=int(match["dim"]),
        name=match["name"],
        min=int(low) if low else None,
        max=int(high) if high else None,
        text=text,
    )


def _input_names(module: torch.nn.Module, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> list[tuple[str, Any]] | None:
    """(name, value) of every input in call order, or None when ``forward`` takes ``*args``."""
    try:
        signature = inspect.signature(module.forward)
        bound = signature.bind(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    named: list[tuple[str, Any]] = []
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            return None
        if kind is inspect.Parameter.VAR_KEYWORD:
            named += list(value.items())
        else:
            named.append((name, value))
    return named


def _make_dims(specs: Sequence[DynamicSpec]) -> dict[str, Any]:
    """One Dim per name; a name's range is given once (specs without brackets take it)."""
    from exportir.export import Dim

    ranged: dict[str, DynamicSpec] = {}
    for spec in specs:
        if spec.min is None and spec.max is None:
            continue
        first = ranged.setdefault(spec.name, spec)
        if (spec.min, spec.max) != (first.min, first.max):
            raise DimSpecError(
                f"Dim {spec.name!r} has two ranges: {first.text!r} and {spec.text!r}; give the "
                "range once (the same name is the same Dim)"
            )
    dims: dict[str, Any] = {}
    for spec in specs:
        if spec.name in dims:
            continue
        bounds = ranged.get(spec.name, spec)
        try:
            dims[spec.name] = Dim(spec.name, min=bounds.min, max=bounds.max)
        except ValueError as exc:
            raise DimSpecError(f"dynamic spec {bounds.text!r}: {exc}") from None
    return dims


def dynamic_shapes(
    specs: Sequence[DynamicSpec], module: torch.nn.Module, args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> dict[str, Any] | tuple[Any, ...] | None:
    """The ``dynamic_shapes`` argument for ``export(module, args, kwargs)``: a dict keyed by
    ``forward``'s argument names (a tuple when ``forward`` takes ``*args``)."""
    if not specs:
        return None
    named = _input_names(module, args, kwargs)
    if named is None:
        if kwargs:
            raise DimSpecError("forward takes *args: --dynamic works on positional inputs only "
                               "there; pass the inputs positionally")
        named = [(str(k), v) for k, v in enumerate(args)]
    names = [name for name, _ in named]
    dims = _make_dims(specs)
    per_input: dict[int, dict[int, Any]] = {}
    for spec in specs:
        k = _find_input(spec, names)
        value = named[k][1]
        if not isinstance(value, torch.Tensor):
            raise DimSpecError(
                f"dynamic spec {spec.text!r}: input {names[k]!r} is a {type(value).__name__}, "
                "not a tensor (--dynamic marks tensor inputs; use the Python API's "
                "dynamic_shapes for nested inputs)"
            )
        rank = value.dim()
        if not -rank <= spec.dim < rank:
            raise DimSpecError(
                f"dynamic spec {spec.text!r}: input {names[k]!r} has {rank} dimension(s) "
                f"(shape {list(value.shape)}); dimension {spec.dim} is out of range"
            )
        dim = spec.dim % rank
        marks = per_input.setdefault(k, {})
        if dim in marks and marks[dim] is not dims[spec.name]:
            raise DimSpecError(f"dynamic spec {spec.text!r}: dimension {dim} of {names[k]!r} "
                               "is marked twice")
        marks[dim] = dims[spec.name]
    shapes = [per_input.get(k) for k in range(len(named))]
    if names == [str(k) for k in range(len(named))]:
        return tuple(shapes)
    return dict(zip(names, shapes))


def _find_input(spec: DynamicSpec, names: list[str]) -> int:
    if isinstance(spec.input, int):
        if spec.input < len(names):
            return spec.input
        raise DimSpecError(f"dynamic spec {spec.text!r}: the model takes {len(names)} input(s) "
                           f"({', '.join(names)}); there is no input {spec.input}")
    if spec.input in names:
        return names.index(spec.input)
    raise DimSpecError(f"dynamic spec {spec.text!r}: the model has no input {spec.input!r}; "
                       f"its inputs are {', '.join(names) or '(none)'}")
