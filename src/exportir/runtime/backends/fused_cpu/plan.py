"""Value lifetimes and memory sharing of a decoded blob, and the in-place safety rule.

Inside a delegate, layout ops return views (:mod:`.kernels`), so a slot's value may share memory
with the slot it was computed from: its *root*. Delegate inputs and constants are *external*
roots: nothing in the delegate may write them. An op may run in place on its first argument
only when that argument's memory is the delegate's own and nothing that shares it is read later:

1. the argument's root is not external (not an input, not a constant);
2. the argument does not view one element several times (``expand``, ``unfold``);
3. no other argument of the op shares that root;
4. every slot sharing the root that exists before the op is read last by this op and is not a
   delegate output.

The compile side asks :func:`inplace_hazard` before it marks an op in place, and the executor
asks again when it loads a blob (a blob asking for an unsafe in-place op is refused), so the two
never disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exportir.runtime.backends.fused_cpu.kernels import KERNELS, Ref
from exportir.runtime.backends.fused_cpu.records import record

__all__ = ["Plan", "first_ref", "inplace_hazard", "plan", "refs"]


class Plan(record("Plan", "defined last_use root external outputs overlapping")):
    """``defined``: op index defining each slot (-1 for inputs and constants); ``last_use``:
    op index of each slot's last reader (``len(ops)`` for outputs, absent if never read);
    ``root``: the slot whose memory each slot may share; ``external``: inputs and constants;
    ``overlapping``: slots that may view one element several times."""

    __slots__ = ()
    defined: dict[int, int]
    last_use: dict[int, int]
    root: dict[int, int]
    external: frozenset[int]
    outputs: frozenset[int]
    overlapping: frozenset[int]


def refs(x: Any) -> list[int]:
    """Slots an argument (or a list, tuple or dict of them) reads."""
    if type(x) is Ref:
        return [x.slot]
    if isinstance(x, dict):
        x = x.values()
    elif not isinstance(x, (list, tuple)):
        return []
    found: list[int] = []
    for v in x:  # scalars are most items: no call for them (this runs for every op at load)
        if type(v) is Ref:
            found.append(v.slot)
        elif isinstance(v, (list, tuple, dict)):
            found += refs(v)
    return found


def first_ref(row: Any) -> int | None:
    """The slot of an op's first argument, when it is a slot."""
    return row.args[0].slot if row.args and isinstance(row.args[0], Ref) else None


class SlotError(ValueError):
    """A slot read before it is written, or written twice (``field`` names where)."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(why)
        self.field = field


def plan(
    inputs: Sequence[int], constants: Sequence[int], ops: Sequence[Any], outputs: Sequence[int]
) -> Plan:
    """Lifetimes and roots of op rows (``name``, ``args``, ``kwargs``, ``outs``, ``inplace``);
    raises :class:`SlotError` unless every slot is written once before it is read."""
    defined: dict[int, int] = {}
    for s in (*inputs, *constants):
        if s in defined:
            raise SlotError("inputs", f"slot {s} is bound twice (inputs/constants)")
        defined[s] = -1
    external = frozenset(defined)
    root = {s: s for s in defined}
    last_use: dict[int, int] = {}
    overlapping: set[int] = set()
    for i, row in enumerate(ops):
        for s in refs(row.args) + refs(row.kwargs):
            if s not in defined:
                raise SlotError(f"ops[{i}].args", f"reads slot {s} before anything writes it")
            last_use[s] = i
        first = first_ref(row)
        kernel = KERNELS[row.name]
        shares = (row.inplace or kernel.alias) and first is not None
        overlaps = kernel.overlaps or (shares and first in overlapping)
        for s in row.outs:
            if s in defined:
                raise SlotError(f"ops[{i}].outs", f"slot {s} is written twice")
            defined[s] = i
            root[s] = root[first] if shares else s
            if overlaps:
                overlapping.add(s)
    for s in outputs:
        if s not in defined:
            raise SlotError("outputs", f"slot {s} is never written")
        last_use[s] = len(ops)
    return Plan(defined, last_use, root, external, frozenset(outputs), frozenset(overlapping))


def inplace_hazard(p: Plan, ops: Sequence[Any], i: int) -> str | None:
    """Why op ``i`` may not overwrite its first argument, or None when it may."""
    row = ops[i]
    s = first_ref(row)
    if s is None:
        return "its first argument is not a tensor the delegate computed"
    r = p.root[s]
    if r in p.external:
        return f"slot {s} is (a view of) a delegate input or constant"
    if s in p.overlapping:
        return f"slot {s} views some elements several times (expand, unfold)"
    if any(p.root[t] == r for t in refs(row.args[1:]) + refs(row.kwargs)):
        return f"another argument shares slot {s}'s memory"
    for t, at in p.defined.items():
        if p.root[t] != r or at >= i:
            continue
        if t in p.outputs:
            return f"slot {t}, sharing slot {s}'s memory, is a delegate output"
        if p.last_use.get(t, -1) > i:
            return f"slot {t}, sharing slot {s}'s memory, is read after op {i}"
    return None
