"""``CustomDecompTable``: the default decomposition table, as ``torch.export`` hands it out.

``run_decompositions(table)`` keeps every composite-implicit op the table does not name, so a
user keeps an op by *deleting* it from the default table::

    table = exportir.export.default_decompositions()
    del table[torch.ops.aten.linear.default]
    ep.run_decompositions(table)  # linear stays; everything else goes to core ATen

Composite ops of other namespaces (custom ops) may be registered after the table was made,
so, as in torch/export/decomp_utils.py, they are added when the table is first read (or
handed to ``run_decompositions``), minus the ones the user deleted before that.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import Any

from torch._ops import OpOverload

from exportir.export.capture import _composite, _decompositions

__all__ = ["CustomDecompTable", "as_plain_table", "cia_decomposition"]

Decomposition = Callable[..., Any]


def cia_decomposition(op: OpOverload) -> Decomposition:
    """``op``'s composite kernel as a decomposition (its Python kernel when it has one)."""
    return _composite.python_cia_kernel(op) or op.decompose


@functools.cache
def _aten_table() -> dict[Any, Decomposition]:
    """(Shared by every table: copied, never changed.)"""
    # the post-autograd core ATen decompositions, ours where torch's breaks the kernel's
    # contract, then every preservable ATen composite op torch does not keep by default
    from torch._decomp import _core_aten_decompositions_post_autograd

    table: dict[Any, Decomposition] = dict(_core_aten_decompositions_post_autograd())
    table.update(_decompositions.OVERRIDES)
    for op in sorted(_composite.preservable_cia_ops(), key=str):
        if op.namespace == "aten" and op not in table and op not in _composite.PRESERVED_ATEN_CIA_OPS:
            table[op] = cia_decomposition(op)
    return table


def _is_aten(op: Any) -> bool:
    return isinstance(op, OpOverload) and op.namespace == "aten"


class CustomDecompTable(dict):  # type: ignore[type-arg]  # keys: OpOverload, values: callables
    """The table ``default_decompositions()`` returns (torch.export's ``CustomDecompTable``).

    A dict of op -> decomposition. ATen entries are there from the start; composite custom
    ops are added on the first read (``materialize``), except those deleted (``del``/``pop``)
    before it, even if their op did not exist yet when deleted.
    """

    def __init__(self) -> None:
        super().__init__()
        self._table: dict[Any, Decomposition] = dict(_aten_table())
        self._deleted_custom: set[Any] = set()
        self._materialized = False

    # -- writes never materialize ----------------------------------------------------------

    def __setitem__(self, key: Any, value: Decomposition) -> None:
        self._table[key] = value
        self._deleted_custom.discard(key)

    def __delitem__(self, key: Any) -> None:
        self.pop(key)

    def update(self, other: Mapping[Any, Decomposition] = (), /, **kw: Any) -> None:  # type: ignore[override]
        for key, value in dict(other, **kw).items():
            self[key] = value

    def pop(self, key: Any, *default: Any) -> Any:
        """Remove ``key`` (keep the op whole); ``KeyError`` unless a default is given."""
        if len(default) > 1:
            raise TypeError(f"pop expected at most 2 arguments, got {1 + len(default)}")
        try:
            return self._pop(key)
        except KeyError:
            if default:
                return default[0]
            raise

    def _pop(self, key: Any) -> Decomposition:
        if _is_aten(key):
            return self._table.pop(key)
        if key in self._table:
            self._deleted_custom.add(key)  # remembered for the next materialization too
            return self._table.pop(key)
        if key in self._deleted_custom or not _composite.is_preservable(key):
            raise KeyError(key)
        self._deleted_custom.add(key)  # not materialized yet: deleted ahead of time
        return cia_decomposition(key)

    def copy(self) -> CustomDecompTable:
        new = CustomDecompTable.__new__(CustomDecompTable)
        dict.__init__(new)
        new._table = dict(self._table)
        new._deleted_custom = set(self._deleted_custom)
        new._materialized = self._materialized
        return new

    # -- reads materialize -----------------------------------------------------------------

    def materialize(self) -> dict[Any, Decomposition]:
        """Add the composite custom ops registered so far; returns a plain dict copy."""
        for op in _composite.preservable_custom_cia_ops():
            if op in self._table or op in self._deleted_custom:
                continue
            self._table[op] = cia_decomposition(op)
        self._materialized = True
        self._deleted_custom = set()
        return dict(self._table)

    def _read(self) -> dict[Any, Decomposition]:
        if not self._materialized:
            self.materialize()
        return self._table

    def __getitem__(self, key: Any) -> Decomposition:
        return self._read()[key]

    def get(self, key: Any, default: Any = None) -> Any:
        return self._read().get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._read()

    def __len__(self) -> int:
        return len(self._read())

    def __iter__(self) -> Iterator[Any]:
        return iter(self._read())

    def __reversed__(self) -> Iterator[Any]:
        return reversed(self._read())

    def keys(self) -> KeysView[Any]:
        return self._read().keys()

    def values(self) -> ValuesView[Decomposition]:
        return self._read().values()

    def items(self) -> ItemsView[Any, Decomposition]:
        return self._read().items()

    def __eq__(self, other: object) -> bool:
        return self._read() == (other._read() if isinstance(other, CustomDecompTable) else other)

    __hash__ = None  # type: ignore[assignment]  # a mutable mapping

    def __repr__(self) -> str:
        return f"CustomDecompTable({len(self)} ops)"

    def __copy__(self) -> CustomDecompTable:
        return self.copy()

    def __deepcopy__(self, memo: dict) -> CustomDecompTable:
        return self.copy()


def as_plain_table(table: Mapping[Any, Decomposition] | None) -> dict[Any, Decomposition]:
    """The dict ``run_decompositions`` works from: ``None`` -> the default table."""
    if table is None:
        return CustomDecompTable().materialize()
    if isinstance(table, CustomDecompTable):
        return table.materialize()
    return dict(table)

