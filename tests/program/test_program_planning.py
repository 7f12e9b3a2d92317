"""Memory planning: lifetimes from schedules, greedy best-fit arenas, the plan verifier."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exportir.format.planning import BufferRequest, Lifetime, MemoryPlan, PlanError
from exportir.format.schema import Allocation, InputStorage, KernelCall, MoveCall, TensorList
from exportir.program import planning, schema


def _brute_force_no_overlap(plan: MemoryPlan) -> None:
    items = list(plan.allocations.items())
    for i, (a, x) in enumerate(items):
        for b, y in items[i + 1:]:
            if x.arena != y.arena or not x.nbytes or not y.nbytes:
                continue
            if plan.lifetimes[a].overlaps(plan.lifetimes[b]):
                assert x.offset + x.nbytes <= y.offset or y.offset + y.nbytes <= x.offset


def _tensor(n: int = 4) -> schema.Tensor:
    return schema.Tensor(schema.ScalarType.FLOAT, (n,), (0,), InputStorage())


def test_lifetimes_from_schedule_lists_and_outputs():
    values = [_tensor(), _tensor(), _tensor(), TensorList((1, 2)), _tensor(), _tensor()]
    instructions = [
        KernelCall(0, (0, 1)),      # 1 defined at 0
        KernelCall(0, (1, 2)),      # 2 defined at 1
        KernelCall(1, (3, 4)),      # reads list [1, 2] at 2, defines 4
        MoveCall(4, 5),
    ]
    spans = planning.lifetimes(values, instructions, outputs=(4,), whole_method=(5,))
    assert spans[1] == Lifetime(0, 2)
    assert spans[2] == Lifetime(1, 2)
    assert spans[3] == Lifetime(2, 2)
    assert spans[4] == Lifetime(2, 4)  # an output lives to the end
    assert spans[5] == Lifetime(0, 4)  # state lives through the whole method


def test_chain_reuses_memory_and_meets_lower_bound():
    # a -> b -> c -> d: at most two live at once
    reqs = [BufferRequest(i, 100, Lifetime(i, i + 1)) for i in range(4)]
    plan = planning.plan_memory(reqs, alignment=16)
    planning.verify_plan(plan)
    assert plan.lower_bound == 2 * 112
    assert plan.arenas == (224,)
    _brute_force_no_overlap(plan)


def test_alignment_rounds_offsets():
    reqs = [BufferRequest(0, 3, Lifetime(0, 1)), BufferRequest(1, 5, Lifetime(0, 1))]
    plan = planning.plan_memory(reqs, alignment=64)
    assert all(a.offset % 64 == 0 for a in plan.allocations.values())
    assert plan.arenas == (128,)
    assert plan.allocations[0].nbytes == 3  # the allocation keeps the real size


def test_multiple_arenas_are_planned_separately():
    reqs = [BufferRequest(0, 32, Lifetime(0, 3), arena=0),
            BufferRequest(1, 32, Lifetime(0, 3), arena=1),
            BufferRequest(2, 16, Lifetime(1, 2), arena=1)]
    plan = planning.plan_memory(reqs)
    assert plan.arenas == (32, 48)
    assert plan.arena_lower_bounds == (32, 48)
    assert plan.lower_bound == 80
    planning.verify_plan(plan)


def test_zero_sized_buffers():
    reqs = [BufferRequest(0, 0, Lifetime(0, 5)), BufferRequest(1, 8, Lifetime(0, 5))]
    plan = planning.plan_memory(reqs)
    planning.verify_plan(plan)
    assert plan.arenas == (16,)


def test_bad_requests_are_rejected():
    with pytest.raises(ValueError, match="power of two"):
        planning.plan_memory([], alignment=12)
    with pytest.raises(ValueError, match="twice"):
        planning.plan_memory([BufferRequest(0, 4, Lifetime(0, 0))] * 2)
    with pytest.raises(ValueError, match="malformed"):
        planning.plan_memory([BufferRequest(0, 4, Lifetime(3, 1))])


def test_plan_method_on_a_schedule():
    values = [_tensor(8) for _ in range(5)]
    instructions = [KernelCall(0, (0, 1)), KernelCall(0, (1, 2)), KernelCall(0, (2, 3)),
                    KernelCall(0, (3, 4))]
    plan = planning.plan_method(values, instructions, {i: 32 for i in range(1, 5)}, outputs=(4,),
                                names={1: "a", 2: "b"})
    assert plan.lower_bound == 64
    assert plan.arenas[0] >= plan.lower_bound
    assert plan.names[1] == "a"


def _planned_view(base: int) -> schema.Tensor:
    return schema.Tensor(schema.ScalarType.FLOAT, (2, 4), (1, 0),
                         schema.ViewOf(base, 0, (1, 2)))


def test_a_view_keeps_its_base_live_and_nothing_is_planned_over_it():
    # 0 input -> 1 planned -> 2 view of 1 (no instruction); 3 and 4 are produced while 2 is
    # still to be read: they must not reuse 1's bytes
    values = [_tensor(8), _tensor(8), _planned_view(1), _tensor(8), _tensor(8), _tensor(8),
              TensorList((2, 3))]
    instructions = [KernelCall(0, (0, 1)), KernelCall(0, (0, 3)), KernelCall(0, (3, 4)),
                    KernelCall(0, (6, 5))]  # reads the view through a list
    spans = planning.lifetimes(values, instructions)
    assert spans[1] == Lifetime(0, 3)  # the base lives as long as its view
    plan = planning.plan_method(values, instructions, {1: 32, 3: 32, 4: 32, 5: 32})
    assert plan.views == {2: 1} and plan.lifetimes[2] == Lifetime(3, 3)
    base = plan.allocations[1]
    for other in (3, 4, 5):
        a = plan.allocations[other]
        assert a.offset >= base.offset + 32 or a.offset + 32 <= base.offset


def test_verifier_rejects_a_view_outliving_its_base():
    plan = MemoryPlan(arenas=(64,), allocations={0: Allocation(0, 0, 32), 1: Allocation(0, 0, 32)},
                      lower_bound=0, alignment=16, names={0: "mm", 2: "view"},
                      lifetimes={0: Lifetime(0, 1), 1: Lifetime(2, 3), 2: Lifetime(1, 3)},
                      views={2: 0})
    with pytest.raises(PlanError, match=r"value 2 \(view\) is a view of value 0 \(mm\) and "
                                        r"live at instructions 1-3, but its base is live at 0-1"):
        planning.verify_plan(plan)
    ok = MemoryPlan(arenas=(64,), allocations={0: Allocation(0, 0, 32)}, lower_bound=0,
                    alignment=16, lifetimes={0: Lifetime(0, 3), 2: Lifetime(1, 3)},
                    views={2: 0, 3: 7})  # a view of an unplanned (input) value: no rule
    planning.verify_plan(ok)


# ------------------------------------------------------------------------------ verifier


def _plan(allocs: dict[int, Allocation], spans: dict[int, Lifetime], arenas=(64,), names=None):
    return MemoryPlan(arenas=arenas, allocations=allocs, lower_bound=0, alignment=16,
                      lifetimes=spans, names=names or {})


def test_verifier_accepts_disjoint_in_time_or_space():
    plan = _plan({0: Allocation(0, 0, 32), 1: Allocation(0, 0, 32), 2: Allocation(0, 32, 32)},
                 {0: Lifetime(0, 1), 1: Lifetime(2, 3), 2: Lifetime(0, 3)})
    planning.verify_plan(plan)


def test_verifier_names_both_overlapping_values():
    plan = _plan({0: Allocation(0, 0, 32), 1: Allocation(0, 16, 32)},
                 {0: Lifetime(0, 2), 1: Lifetime(2, 3)}, names={0: "relu", 1: "add"})
    with pytest.raises(PlanError, match=r"value 0 \(relu\) and value 1 \(add\) overlap"):
        planning.verify_plan(plan)


def test_verifier_same_offset_different_arenas_is_fine():
    plan = _plan({0: Allocation(0, 0, 32), 1: Allocation(1, 0, 32)},
                 {0: Lifetime(0, 2), 1: Lifetime(0, 2)}, arenas=(32, 32))
    planning.verify_plan(plan)


@pytest.mark.parametrize(
    "alloc, message",
    [
        (Allocation(0, 8, 4), "multiples of 16"),
        (Allocation(0, 48, 32), "past the end"),
        (Allocation(2, 0, 4), "arena 2"),
        (Allocation(0, -16, 4), "non-negative"),
    ],
)
def test_verifier_rejects_bad_allocations(alloc, message):
    with pytest.raises(PlanError, match=message):
        planning.verify_plan(_plan({0: alloc}, {0: Lifetime(0, 0)}))


def test_verifier_requires_a_lifetime():
    with pytest.raises(PlanError, match="no lifetime"):
        planning.verify_plan(_plan({0: Allocation(0, 0, 4)}, {}))


# ------------------------------------------------------------------------------ random schedules

_request = st.tuples(st.integers(0, 300), st.integers(0, 30), st.integers(0, 10), st.integers(0, 1))


@settings(max_examples=150, deadline=None)
@given(st.lists(_request, max_size=40), st.sampled_from([1, 16, 64]))
def test_random_plans_are_valid_and_above_the_lower_bound(specs, alignment):
    reqs = [BufferRequest(i, n, Lifetime(s, s + d), arena)
            for i, (n, s, d, arena) in enumerate(specs)]
    plan = planning.plan_memory(reqs, alignment=alignment)
    planning.verify_plan(plan)
    _brute_force_no_overlap(plan)
    for a in range(len(plan.arenas)):
        assert plan.arenas[a] >= plan.arena_lower_bounds[a]
    assert sum(plan.arenas) >= plan.lower_bound
    assert set(plan.allocations) == set(range(len(reqs)))
