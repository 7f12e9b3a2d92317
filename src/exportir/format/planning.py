"""Memory planning: tensor lifetimes from an instruction schedule, then greedy best-fit arenas.

Pure functions over plain data. :func:`lifetimes` reads a schedule (``schema.Instruction`` s over
a value table); :func:`plan_memory` packs :class:`BufferRequest` s into arenas and returns a
:class:`MemoryPlan`; :func:`verify_plan` proves that no two simultaneously-live buffers overlap.

Lifetimes are closed intervals of instruction indices. A value is live from the first
instruction that mentions it to the last; outputs stay live to the end of the method
(``len(instructions)``), values named ``whole_method`` (mutable state) from 0 to the end. A list
value (``TensorList``, ``IntList``, ``OptionalTensorList``) mentions its items. A view
(``schema.ViewOf`` storage: no bytes of its own) mentions its base, so the base stays live
while any view of it is and no buffer is placed over memory a live view reads. Jumps must go
forward (no loops): then every execution visits instructions in increasing order, and values
whose intervals are disjoint are never live together. A jump back (``dest <= pc``, format 3:
the loops of ``map`` / ``while_loop``) makes ``[dest, pc]`` a loop: a value mentioned both inside
and outside it (loop state, its inputs and results) lives across the whole loop; a value
mentioned only inside is made anew by each iteration before it is read, and keeps its interval.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from exportir.format import schema


class PlanError(ValueError):
    """A memory plan is inconsistent (overlap, misalignment, out of arena bounds)."""


@dataclass(frozen=True, slots=True)
class Lifetime:
    first: int
    last: int

    def overlaps(self, other: Lifetime) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True, slots=True)
class BufferRequest:
    """One buffer to place: ``nbytes`` live over ``lifetime``, in arena ``arena``."""

    value: int
    nbytes: int
    lifetime: Lifetime
    arena: int = 0
    name: str = ""


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Arena sizes, one allocation per planned value, and the lower bound of each arena.

    ``lower_bound`` is the sum over arenas of the peak of simultaneously-live (aligned) bytes: no
    plan can use less memory. ``views`` maps each view to its base (``lifetimes`` has both).
    """

    arenas: tuple[int, ...]
    allocations: Mapping[int, schema.Allocation]
    lower_bound: int
    arena_lower_bounds: tuple[int, ...] = ()
    alignment: int = 16
    lifetimes: Mapping[int, Lifetime] = field(default_factory=dict)
    names: Mapping[int, str] = field(default_factory=dict)
    views: Mapping[int, int] = field(default_factory=dict)


def align_up(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


# ------------------------------------------------------------------------------ lifetimes


def _mentions(ins: schema.Instruction) -> tuple[int, ...]:
    match ins:
        case schema.KernelCall(args=args):
            return args
        case schema.DelegateCall(args=args, outputs=outputs):
            return args + outputs
        case schema.MoveCall(src=src, dst=dst):
            return (src, dst)
        case schema.JumpFalseCall(cond_value=cond):
            return (cond,)
        case schema.FreeCall(value=value):
            return (value,)
    raise TypeError(f"not an instruction: {ins!r}")


def _with_base(value: int, values: Sequence[schema.EValue]) -> tuple[int, ...]:
    v = values[value]
    if isinstance(v, schema.Tensor) and isinstance(v.storage, schema.ViewOf):
        return (value, v.storage.base)
    return (value,)


def _expand(value: int, values: Sequence[schema.EValue]) -> tuple[int, ...]:
    v = values[value]
    if isinstance(v, (schema.TensorList, schema.IntList, schema.OptionalTensorList)):
        return (value, *(i for item in v.items for i in _with_base(item, values)))
    return _with_base(value, values)


def view_bases(values: Sequence[object]) -> dict[int, int]:
    """view value -> its base, for every tensor with ``ViewOf`` storage."""
    return {
        i: v.storage.base for i, v in enumerate(values)
        if isinstance(v, schema.Tensor) and isinstance(v.storage, schema.ViewOf)
    }


def lifetimes(
    values: Sequence[schema.EValue],
    instructions: Sequence[schema.Instruction],
    outputs: Iterable[int] = (),
    whole_method: Iterable[int] = (),
) -> dict[int, Lifetime]:
    """Live interval of every value the schedule mentions (see the module docstring)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, ins in enumerate(instructions):
        for mentioned in _mentions(ins):
            for v in _expand(mentioned, values):
                first.setdefault(v, i)
                last[v] = i
    end = len(instructions)
    for out in outputs:
        for v in _expand(out, values):
            first.setdefault(v, end)
            last[v] = end
    for v in whole_method:
        first[v] = 0
        last[v] = end
    _extend_over_loops(first, last, loops(instructions))
    return {v: Lifetime(first[v], last[v]) for v in first}


def loops(instructions: Sequence[schema.Instruction]) -> list[tuple[int, int]]:
    """``(start, end)`` of every loop: a ``JumpFalseCall`` at ``end`` jumping back to
    ``start <= end``."""
    return [
        (ins.dest, pc) for pc, ins in enumerate(instructions)
        if isinstance(ins, schema.JumpFalseCall) and isinstance(ins.dest, int) and ins.dest <= pc
    ]


def _extend_over_loops(
    first: dict[int, int], last: dict[int, int], spans: Sequence[tuple[int, int]]
) -> None:
    """Every value live both inside and outside a loop lives over the whole loop (repeated
    until nothing changes: loops may nest or overlap)."""
    changed = bool(spans)
    while changed:
        changed = False
        for start, end in spans:
            for v, a in first.items():
                b = last[v]
                inside = a <= end and start <= b
                if inside and (a < start or b > end) and (a > start or b < end):
                    first[v], last[v] = min(a, start), max(b, end)
                    changed = True


# ------------------------------------------------------------------------------ packing


def _lower_bound(requests: Sequence[BufferRequest], alignment: int) -> int:
    """Peak of simultaneously-live aligned bytes (a sweep over interval endpoints)."""
    events: list[tuple[int, int, int]] = []
    for r in requests:
        size = align_up(r.nbytes, alignment)
        if size:
            events.append((r.lifetime.first, 0, size))  # starts sort before ends at equal time
            events.append((r.lifetime.last, 1, -size))
    live = peak = 0
    for _, _, delta in sorted(events):
        live += delta
        peak = max(peak, live)
    return peak


def _best_fit(
    order: Sequence[BufferRequest], alignment: int
) -> tuple[dict[int, int], int]:
    """Place requests in ``order``; each goes into the smallest gap among the already-placed
    buffers whose lifetimes overlap its own (or on top). Returns offsets and the arena size."""
    placed: list[tuple[BufferRequest, int, int]] = []  # (request, offset, aligned size)
    offsets: dict[int, int] = {}
    top = 0
    for r in order:
        size = align_up(r.nbytes, alignment)
        busy = sorted(
            (off, off + sz) for q, off, sz in placed if sz and q.lifetime.overlaps(r.lifetime)
        )
        best, best_gap, cursor = None, None, 0
        for start, end in busy:
            gap = start - cursor
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, end)
        offset = best if best is not None else cursor
        offsets[r.value] = offset
        placed.append((r, offset, size))
        top = max(top, offset + size)
    return offsets, top


_ORDERS = (
    # biggest first (ties: earliest, then value id: deterministic)
    lambda r: (-r.nbytes, r.lifetime.first, r.value),
    # biggest first (ties: longest-lived, then earliest)
    lambda r: (-r.nbytes, -(r.lifetime.last - r.lifetime.first), r.lifetime.first, r.value),
    # latest-dying first
    lambda r: (-r.lifetime.last, -r.nbytes, r.value),
    # longest-lived first
    lambda r: (-(r.lifetime.last - r.lifetime.first), -r.nbytes, r.lifetime.first, r.value),
    # schedule order
    lambda r: (r.lifetime.first, -r.nbytes, r.value),
)


def _breadth_order(requests: Sequence[BufferRequest]) -> list[BufferRequest]:
    """Tensors live at the busiest instruction first (biggest first), then the next busiest."""
    live: dict[int, int] = {}
    for r in requests:
        for t in range(r.lifetime.first, r.lifetime.last + 1):
            live[t] = live.get(t, 0) + r.nbytes
    order: list[BufferRequest] = []
    taken: set[int] = set()
    by_size = sorted(requests, key=_ORDERS[0])
    for t in sorted(live, key=lambda t: (-live[t], t)):
        for r in by_size:
            if r.value not in taken and r.lifetime.first <= t <= r.lifetime.last:
                taken.add(r.value)
                order.append(r)
        if len(order) == len(requests):
            break
    return order


_SMALL = 400  # up to this many buffers, also try the costlier orders


def _candidate_orders(requests: Sequence[BufferRequest]) -> list[list[BufferRequest]]:
    orders = [sorted(requests, key=key) for key in _ORDERS]
    if len(requests) <= _SMALL:
        span = max((r.lifetime.last for r in requests), default=0) + 1
        if span * len(requests) <= 200_000:
            orders.append(_breadth_order(requests))
        orders.append(sorted(requests, key=lambda r: (
            -r.nbytes * (r.lifetime.last - r.lifetime.first + 1), r.value)))
    return orders


def _plan_arena(requests: Sequence[BufferRequest], alignment: int) -> tuple[dict[int, int], int]:
    best: tuple[dict[int, int], int] | None = None
    bound = _lower_bound(requests, alignment)
    for order in _candidate_orders(requests):
        offsets, size = _best_fit(order, alignment)
        if best is None or size < best[1]:
            best = (offsets, size)
        if best[1] <= bound:
            break  # optimal
    return best if best is not None else ({}, 0)


def plan_memory(requests: Sequence[BufferRequest], *, alignment: int = 16) -> MemoryPlan:
    """Pack ``requests`` into arenas (greedy best-fit, the best of a few orders)."""
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two; got {alignment}")
    seen: set[int] = set()
    for r in requests:
        if r.value in seen:
            raise ValueError(f"value {r.value} requested twice")
        if r.nbytes < 0 or r.arena < 0 or r.lifetime.first > r.lifetime.last:
            raise ValueError(f"malformed buffer request {r!r}")
        seen.add(r.value)
    n_arenas = max((r.arena + 1 for r in requests), default=0)
    arenas: list[int] = []
    bounds: list[int] = []
    allocations: dict[int, schema.Allocation] = {}
    for arena in range(n_arenas):
        mine = [r for r in requests if r.arena == arena]
        offsets, size = _plan_arena(mine, alignment)
        arenas.append(size)
        bounds.append(_lower_bound(mine, alignment))
        for r in mine:
            allocations[r.value] = schema.Allocation(arena, offsets[r.value], r.nbytes)
    return MemoryPlan(
        arenas=tuple(arenas),
        allocations=dict(sorted(allocations.items())),
        lower_bound=sum(bounds),
        arena_lower_bounds=tuple(bounds),
        alignment=alignment,
        lifetimes={r.value: r.lifetime for r in requests},
        names={r.value: r.name for r in requests if r.name},
    )


# ------------------------------------------------------------------------------ verification


def _label(plan: MemoryPlan, value: int) -> str:
    name = plan.names.get(value)
    return f"value {value} ({name})" if name else f"value {value}"


def _check_one(plan: MemoryPlan, value: int, a: schema.Allocation) -> None:
    if a.arena < 0 or a.arena >= len(plan.arenas):
        raise PlanError(f"{_label(plan, value)} is in arena {a.arena}; the plan has "
                        f"{len(plan.arenas)} arena(s)")
    if a.offset < 0 or a.nbytes < 0 or a.offset % plan.alignment:
        raise PlanError(f"{_label(plan, value)} has offset {a.offset} / nbytes {a.nbytes}: "
                        f"offsets must be non-negative multiples of {plan.alignment}")
    if a.offset + a.nbytes > plan.arenas[a.arena]:
        raise PlanError(f"{_label(plan, value)} ends at byte {a.offset + a.nbytes}, past the end "
                        f"of arena {a.arena} ({plan.arenas[a.arena]} bytes)")
    if value not in plan.lifetimes:
        raise PlanError(f"{_label(plan, value)} has an allocation but no lifetime")


def _check_views(plan: MemoryPlan) -> None:
    """A planned base is live whenever a view of it is (else a buffer could be placed over
    memory the view still reads)."""
    for view, base in plan.views.items():
        span, base_span = plan.lifetimes.get(view), plan.lifetimes.get(base)
        if base not in plan.allocations or span is None:
            continue  # constant or input base (never reused), or a view nothing reads
        if base_span is None or not base_span.first <= span.first <= span.last <= base_span.last:
            live = "never" if base_span is None else f"{base_span.first}-{base_span.last}"
            raise PlanError(
                f"{_label(plan, view)} is a view of {_label(plan, base)} and live at "
                f"instructions {span.first}-{span.last}, but its base is live at {live}: "
                "another buffer may be placed over memory the view reads"
            )


def verify_plan(plan: MemoryPlan) -> None:
    """Raise :class:`PlanError` naming both values if two simultaneously-live allocations of the
    same arena share a byte, or if a view outlives its planned base; also checks alignment and
    arena bounds."""
    for value, a in plan.allocations.items():
        _check_one(plan, value, a)
    _check_views(plan)
    by_arena: dict[int, list[tuple[int, int, int]]] = {}
    for value, a in plan.allocations.items():
        if a.nbytes:
            by_arena.setdefault(a.arena, []).append((a.offset, a.offset + a.nbytes, value))
    for arena, spans in by_arena.items():
        spans.sort()
        active: list[tuple[int, int, int]] = []  # spans whose end is past the current start
        for start, end, value in spans:
            active = [s for s in active if s[1] > start]
            for _, other_end, other in active:
                if plan.lifetimes[value].overlaps(plan.lifetimes[other]):
                    lo, hi = sorted((value, other))
                    raise PlanError(
                        f"{_label(plan, lo)} and {_label(plan, hi)} overlap in arena {arena} "
                        f"(bytes [{plan.allocations[lo].offset}, "
                        f"{plan.allocations[lo].offset + plan.allocations[lo].nbytes}) and "
                        f"[{plan.allocations[hi].offset}, "
                        f"{plan.allocations[hi].offset + plan.allocations[hi].nbytes})) while both "
                        f"are live (instructions {plan.lifetimes[lo].first}-"
                        f"{plan.lifetimes[lo].last} and {plan.lifetimes[hi].first}-"
                        f"{plan.lifetimes[hi].last})"
                    )
            active.append((start, end, value))


def plan_method(
    values: Sequence[schema.EValue],
    instructions: Sequence[schema.Instruction],
    planned: Mapping[int, int],
    *,
    outputs: Iterable[int] = (),
    whole_method: Iterable[int] = (),
    names: Mapping[int, str] | None = None,
    alignment: int = 16,
    arena_of: Mapping[int, int] | None = None,
) -> MemoryPlan:
    """Plan the values in ``planned`` (value -> nbytes) of a schedule, in arena 0 unless
    ``arena_of`` names another (state shared between methods lives in arena 1).

    A planned value the schedule never mentions gets a one-instruction lifetime at the end.
    """
    names = names or {}
    arena_of = arena_of or {}
    spans = lifetimes(values, instructions, outputs, whole_method)
    end = len(instructions)
    requests = [
        BufferRequest(v, nbytes, spans.get(v, Lifetime(end, end)), arena_of.get(v, 0),
                      names.get(v, ""))
        for v, nbytes in sorted(planned.items())
    ]
    views = view_bases(values)
    plan = plan_memory(requests, alignment=alignment)
    plan = replace(plan, views=views, lifetimes={
        **plan.lifetimes, **{v: spans[v] for v in views if v in spans},
    })
    verify_plan(plan)
    return plan
