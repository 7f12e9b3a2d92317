"""The small graph ``preprocess`` rewrites before it writes a blob.

A :class:`Graph` is the delegate's program as a list of :class:`Op` over :class:`Value` s: the
delegate's inputs, constants whose contents are known at compile time (``Value.const``: the
parameters, buffers and constants handed to the backend, and what folding computes from them),
and op results. Ops are named by kernel-table entry (``"aten.addmm.default"``) and are pure, so
an op nobody reads can go. ``Value.meta`` is the example value (shape, dtype) the Edge program
recorded; rewrites keep it exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Graph", "Op", "Value", "same_shape", "static_shape", "values_in"]


@dataclass(eq=False, slots=True)
class Value:
    """One value: ``meta`` its example tensor, ``const`` its contents when known."""

    meta: Any
    const: torch.Tensor | None = None
    name: str = ""

    @property
    def shape(self) -> tuple[int, ...] | None:
        return tuple(self.meta.shape) if isinstance(self.meta, torch.Tensor) else None

    @property
    def dtype(self) -> torch.dtype | None:
        return self.meta.dtype if isinstance(self.meta, torch.Tensor) else None


@dataclass(eq=False, slots=True)
class Op:
    """``outs = name(*args, **kwargs)``; ``nodes``: the Edge nodes it computes (for errors)."""

    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    outs: list[Value]
    multi: bool
    nodes: tuple[str, ...]
    inplace: bool = False

    @property
    def out(self) -> Value:
        return self.outs[0]


def static_shape(v: Any) -> tuple[int, ...] | None:
    """``v``'s shape when it is a tensor value of known, non-symbolic size."""
    if not isinstance(v, Value) or v.shape is None:
        return None
    shape = v.shape
    return shape if all(type(d) is int for d in shape) else None


def same_shape(a: Any, b: Any) -> bool:
    """Whether two shapes are the same, deciding nothing about symbolic sizes: a symbolic
    dimension equals only one with the same expression (``s0 == 16`` would record a guard and
    specialize the program)."""
    if len(a) != len(b):
        return False
    return all(_same_dim(x, y) for x, y in zip(a, b))


def _same_dim(x: Any, y: Any) -> bool:
    if type(x) is int and type(y) is int:
        return x == y
    ex, ey = (getattr(getattr(d, "node", None), "expr", None) for d in (x, y))
    return ex is not None and ex == ey


def values_in(x: Any) -> Iterator[Value]:
    """The values an argument (or a list / dict of them) reads."""
    if isinstance(x, Value):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from values_in(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from values_in(v)


def _collect(x: Any, out: list[Value]) -> None:
    """Append the values ``x`` reads to ``out`` (:func:`values_in` without generators: the
    graph's index runs it over every op)."""
    if isinstance(x, Value):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            if isinstance(v, Value):
                out.append(v)
            elif isinstance(v, (list, tuple, dict)):
                _collect(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            _collect(v, out)


def _reads(op: Op) -> dict[Value, None]:
    """The distinct values ``op`` reads, in argument order."""
    found: list[Value] = []
    _collect(op.args, found)
    if op.kwargs:
        _collect(op.kwargs, found)
    return dict.fromkeys(found)


def _replace(x: Any, old: Value, new: Value) -> Any:
    if x is old:
        return new
    if isinstance(x, list):
        return [_replace(v, old, new) for v in x]
    return x


@dataclass(eq=False, slots=True)
class Graph:
    """The delegate program: ``inputs`` in call order, ``ops`` in run order, ``outputs``."""

    inputs: list[Value]
    ops: list[Op]
    outputs: list[Value]
    _readers: dict[Value, list[Op]] | None = field(default=None, repr=False)
    _producers: dict[Value, Op] = field(default_factory=dict, repr=False)

    def _index(self) -> dict[Value, list[Op]]:
        """Readers (in run order) and producer of every value. Made when first asked after a
        change; :meth:`remove`, :meth:`replace_uses` and :meth:`absorb` keep it up to date.
        A rewrite that sets an op's ``args`` / ``kwargs`` itself must call :meth:`changed`
        (the rule driver does after every rule that fired: HF EfficientNet's lowering once
        read a value no op produced any more when it did not)."""
        if self._readers is None:
            table: dict[Value, list[Op]] = {}
            producers: dict[Value, Op] = {}
            for op in self.ops:
                for v in _reads(op):
                    readers = table.get(v)
                    if readers is None:
                        table[v] = [op]
                    else:
                        readers.append(op)
                for v in op.outs:
                    producers[v] = op
            self._producers = producers
            self._readers = table
        return self._readers

    def readers(self, value: Value) -> list[Op]:
        """The ops reading ``value`` (cached until the graph changes: call :meth:`changed`)."""
        return self._index().get(value, [])

    def changed(self) -> None:
        self._readers = None

    def only_reader(self, value: Value) -> Op | None:
        """The op reading ``value`` when it is the only reader and ``value`` is no output."""
        readers = self.readers(value)
        if len(readers) != 1 or any(v is value for v in self.outputs):
            return None
        return readers[0]

    def producer(self, value: Value, name: str | None = None) -> Op | None:
        """The op computing ``value`` (when it is op ``name``, if given)."""
        self._index()
        op = self._producers.get(value)
        return op if op is not None and (name is None or op.name == name) else None

    def residual_add(self, op: Op, producer_name: str, attr_at: int) -> tuple[Op, Value] | None:
        """For ``op`` an ``add(y, other)`` (either order, same static shape and dtype, no
        alpha) whose ``y`` only it reads and op ``producer_name`` computes with no post-op yet
        (``args[attr_at] == "none"``): that producer and ``other``, the residual a binary
        post-op can add in the producer; else ``None``."""
        if op.kwargs or len(op.args) != 2 or not all(isinstance(a, Value) for a in op.args):
            return None
        for y, other in (op.args, op.args[::-1]):
            producer = self.producer(y, producer_name)
            if producer is None or producer.args[attr_at] != "none":
                continue
            if self.only_reader(y) is not op:
                continue
            if static_shape(other) != static_shape(y) or other.dtype != y.dtype or other is y:
                continue
            return producer, other
        return None

    def remove(self, op: Op) -> None:
        self.ops = [o for o in self.ops if o is not op]
        table = self._readers
        if table is None:
            return
        for v in _reads(op):
            readers = table.get(v)
            if readers is not None:
                table[v] = [r for r in readers if r is not op]
        for v in op.outs:
            if self._producers.get(v) is op:
                del self._producers[v]

    def insert_before(self, anchor: Op, op: Op) -> None:
        at = next(i for i, o in enumerate(self.ops) if o is anchor)
        self.ops.insert(at, op)
        self.changed()

    def emit_before(
        self, anchor: Op, name: str, args: list[Any], shape: Any, dtype: Any, nodes: tuple
    ) -> Value:
        """Insert ``name(*args)`` before ``anchor``; returns its result (shape and dtype given)."""
        value = Value(torch.empty(tuple(shape), dtype=dtype, device="meta"), name=nodes[-1])
        self.insert_before(anchor, Op(name, args, {}, [value], False, nodes))
        return value

    def absorb(self, op: Op, reader: Op) -> None:
        """``op`` now produces what ``reader`` produced; ``reader`` goes."""
        if self._readers is not None:
            for v in op.outs:
                if self._producers.get(v) is op:
                    del self._producers[v]
            for v in reader.outs:
                self._producers[v] = op
        op.outs = reader.outs
        op.nodes = (*op.nodes, *reader.nodes)
        self.remove(reader)

    def alias(self, op: Op, source: Value) -> bool:
        """``op`` computes ``source`` unchanged: its readers read ``source``; ``op`` goes."""
        self.replace_uses(op.out, source)
        self.remove(op)
        return True

    def unread(self, values: list[Value]) -> bool:
        """No op reads any of ``values`` and none is an output."""
        return all(not self.readers(v) and all(o is not v for o in self.outputs) for v in values)

    def replace_uses(self, old: Value, new: Value) -> None:
        """Every reader of ``old`` (and the outputs) reads ``new`` instead."""
        table = self._readers
        moved = self.ops if table is None else table.get(old, [])
        for op in moved:
            op.args = [_replace(a, old, new) for a in op.args]
            op.kwargs = {k: _replace(v, old, new) for k, v in op.kwargs.items()}
        self.outputs = [new if v is old else v for v in self.outputs]
        if table is None or not moved:
            return
        if any(old in _reads(op) for op in moved):  # read inside a tuple / dict: not replaced
            self.changed()
            return
        # the readers of ``new`` now: both lists merged, in run order
        del table[old]
        readers = {id(r) for r in table.get(new, ())} | {id(r) for r in moved}
        table[new] = [op for op in self.ops if id(op) in readers]

    def remove_dead(self) -> bool:
        """Drop ops none of whose results is read; True when something went."""
        live = set(self.outputs)
        kept: list[Op] = []
        for op in reversed(self.ops):
            if any(v in live for v in op.outs):
                kept.append(op)
                live.update(values_in([op.args, op.kwargs]))
        removed = len(kept) != len(self.ops)
        self.ops = kept[::-1]
        self.changed()
        return removed
