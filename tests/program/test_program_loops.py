"""``map`` and ``torch.while_loop`` through to_edge -> to_program -> file bytes -> runtime,
compared with eager (the issue's "``torch.map`` / ``while_loop`` export but cannot be written to a
program file"); the loops' memory plan, their format version, and the bounds a call's loops
respect."""

from __future__ import annotations

import pytest
import torch
from corpus import export_harness as h
from corpus.control_flow_models import PROGRAMS
from functorch.experimental.control_flow import map as cf_map
from runtime.runtime_programs import MethodBuilder
from torch import nn

import exportir
from exportir.backends.fused_cpu import FusedCpuPartitioner
from exportir.format.validate import LoadLimits, ProgramLoadError
from exportir.program import planning, schema, serialize
from exportir.runtime import Program
from exportir.runtime.errors import ResourceLimitExceeded

LOOP_PROGRAMS = [name for name in PROGRAMS if name.startswith(("map", "while"))]


def _lower(module: nn.Module, example: tuple, road: str = "portable", **kwargs):
    ep = exportir.export(module, example, **kwargs)
    if road == "portable":
        return exportir.to_edge(ep).to_program()
    return exportir.to_edge_transform_and_lower(
        ep, partitioner=[FusedCpuPartitioner()]).to_program()


def _same(got, expected) -> None:
    got, expected = h.leaves(got), h.leaves(expected)
    assert len(got) == len(expected)
    for a, e in zip(got, expected):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("road", ["portable", "fused"])
@pytest.mark.parametrize("name", LOOP_PROGRAMS)
def test_loop_corpus_runs_like_eager(name: str, road: str) -> None:
    torch.manual_seed(0)
    factory, example, inputs = PROGRAMS[name]
    module = factory()
    pm = _lower(module, example, road)
    assert pm.program.version == schema.LOOP_FORMAT_VERSION
    assert serialize.read_layout(pm.buffer).major == 3
    method = Program.load(pm.buffer).method()
    for args in inputs:
        _same(method(*args), module(*args, eager=True))
        _same(method(*args), module(*args, eager=True))  # the loop state starts afresh


def _verify(method: schema.Method) -> None:
    """The stored plan against lifetimes recomputed from the schedule (loops included)."""
    allocations = {i: v.storage for i, v in enumerate(method.values)
                   if isinstance(v, schema.Tensor) and isinstance(v.storage, schema.Allocation)}
    spans = planning.lifetimes(method.values, method.instructions, method.outputs)
    planning.verify_plan(planning.MemoryPlan(
        method.plan.arenas, allocations, method.plan.lower_bound,
        alignment=method.plan.alignment, lifetimes=spans,
        views=planning.view_bases(method.values)))


def test_loop_state_lives_across_the_loop() -> None:
    factory, example, _ = PROGRAMS["while_counter"]
    method = _lower(factory(), example).program.methods[0]
    _verify(method)
    ((start, end),) = planning.loops(method.instructions)
    spans = planning.lifetimes(method.values, method.instructions, method.outputs)
    moves = [ins for ins in method.instructions[:start] if isinstance(ins, schema.MoveCall)]
    assert moves  # the carried values, initialised before the loop
    for move in moves:
        assert spans[move.dst].first < start and spans[move.dst].last >= end


class MapDynamic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, xs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return cf_map(lambda x, b: (x @ self.w + b).relu(), xs, y)


@pytest.mark.parametrize("road", ["portable", "fused"])
def test_map_over_a_dynamic_leading_dim_at_min_middle_and_max(road: str) -> None:
    torch.manual_seed(0)
    module = MapDynamic()
    n = exportir.Dim("n", min=1, max=16)
    pm = _lower(module, (torch.randn(3, 2, 4), torch.randn(4)), road,
                dynamic_shapes={"xs": {0: n}, "y": None})
    method = Program.load(pm.buffer).method()
    for rows in (1, 9, 16):
        xs, y = torch.randn(rows, 2, 4), torch.randn(4)
        want = torch.stack([(x @ module.w + y).relu() for x in xs])
        torch.testing.assert_close(method(xs, y), want)


class Swap(nn.Module):
    """The body's results read the carried values the moves overwrite: every result is made
    before any carried value is written."""

    def forward(self, i: torch.Tensor, a: torch.Tensor, b: torch.Tensor, eager: bool = False):
        def cond(i, a, b):
            return i < 3

        def body(i, a, b):
            return i + 1, b.clone(), a + b

        if eager:
            while cond(i, a, b):
                i, a, b = body(i, a, b)
            return i, a, b
        return torch.while_loop(cond, body, (i, a, b))


def test_a_while_body_returning_its_carried_values_swapped() -> None:
    args = (torch.tensor(0), torch.tensor([1.0, 2.0]), torch.tensor([3.0, 5.0]))
    method = Program.load(_lower(Swap(), args).buffer).method()
    _same(method(*args), Swap()(*args, eager=True))
    _same(method(torch.tensor(2), *args[1:]), Swap()(torch.tensor(2), *args[1:], eager=True))


def _endless() -> schema.Program:
    """``JF False -> 0`` at instruction 1: a loop that never ends (format 3)."""
    b = MethodBuilder()
    x = b.input("x", (2,))
    out = b.planned((2,))
    b.kernel("aten::add", "out", (x, x, b.add(schema.Int(1)), out), "add")
    false = b.add(schema.Bool(False))
    b.instruction(lambda d: schema.JumpFalseCall(false, 0, d), "spin", "model.py:4")
    b.outputs.append(out)
    return schema.Program(schema.LOOP_FORMAT_VERSION, (b.build(),))


def test_a_loop_that_never_ends_stops_at_the_iteration_cap() -> None:
    program = _endless()
    method = Program.from_schema(program, limits=LoadLimits(max_loop_iterations=1000)).method()
    with pytest.raises(ResourceLimitExceeded) as info:
        method(torch.ones(2))
    assert info.value.limit == "max_loop_iterations" and info.value.instruction == 1
    assert "max_loop_iterations (1000)" in str(info.value)


def test_a_loop_is_charged_its_work_per_iteration() -> None:
    program = _endless()
    method = Program.from_schema(program, limits=LoadLimits(max_work=100)).method()
    with pytest.raises(ResourceLimitExceeded) as info:
        method(torch.ones(2))
    assert info.value.limit == "max_work"


def test_a_jump_back_in_a_format_2_file_is_refused() -> None:
    program = _endless()
    old = schema.Program(schema.FORMAT_VERSION, program.methods)
    with pytest.raises(ProgramLoadError) as info:
        Program.from_schema(old)
    assert info.value.field == "methods[0].instructions[1].dest"
    assert "needs format 3" in str(info.value)
    data = serialize.serialize_program(program)
    assert serialize.read_layout(data).major == 3
    assert serialize.deserialize_program(data) == program
