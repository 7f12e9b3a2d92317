"""torch.cond through to_edge -> to_program -> file bytes -> runtime, on inputs taking every
branch, compared with eager; the emitted jumps and the memory plan around them. (map and
while_loop: tests/program/test_program_loops.py.)"""

from __future__ import annotations

import pytest
import torch
from corpus import export_harness as h
from corpus.control_flow_models import PROGRAMS
from torch import nn

from exportir.export import export
from exportir.program import planning, schema
from exportir.program.emit import ControlFlowNotSupportedError, EmitError
from exportir.program.manager import to_edge
from exportir.runtime import Program

COND_PROGRAMS = [name for name in PROGRAMS if name.startswith("cond")]


def _program(module: nn.Module, example: tuple):
    return to_edge(export(module, example)).to_program()


def _check_runs(module: nn.Module, example: tuple, inputs: list[tuple]) -> schema.Program:
    pm = _program(module, example)
    loaded = Program.load(pm.buffer)
    for args in inputs:
        expected = module(*args, eager=True)
        got = loaded(*args)
        for a, e in zip(h.leaves(got), h.leaves(expected)):
            torch.testing.assert_close(a, e)
    return pm.program


def _verify(method: schema.Method) -> None:
    """The stored plan against lifetimes recomputed from the schedule (jumps included)."""
    allocations = {
        i: v.storage
        for i, v in enumerate(method.values)
        if isinstance(v, schema.Tensor) and isinstance(v.storage, schema.Allocation)
    }
    spans = planning.lifetimes(method.values, method.instructions, method.outputs)
    plan = planning.MemoryPlan(
        method.plan.arenas,
        allocations,
        method.plan.lower_bound,
        alignment=method.plan.alignment,
        lifetimes=spans,
        views=planning.view_bases(method.values),
    )
    planning.verify_plan(plan)


@pytest.mark.parametrize("name", COND_PROGRAMS)
def test_cond_corpus_runs_every_branch(name: str) -> None:
    torch.manual_seed(0)
    factory, example, inputs = PROGRAMS[name]
    program = _check_runs(factory(), example, inputs)
    _verify(program.methods[0])


def _jumps(method: schema.Method) -> list[tuple[int, schema.JumpFalseCall]]:
    return [
        (i, j) for i, j in enumerate(method.instructions) if isinstance(j, schema.JumpFalseCall)
    ]


def test_cond_schedule_shape() -> None:
    """jump_false pred -> false; true branch; moves; jump over; false branch; moves."""
    factory, example, _ = PROGRAMS["cond_two_outputs"]
    method = _program(factory(), example).program.methods[0]
    (first, to_false), (second, over) = _jumps(method)
    assert to_false.dest == second + 1
    assert method.values[over.cond_value] == schema.Bool(False)
    assert second < over.dest <= len(method.instructions)
    moves = [i for i, ins in enumerate(method.instructions) if isinstance(ins, schema.MoveCall)]
    true_moves = [i for i in moves if first < i < second]
    false_moves = [i for i in moves if second < i < over.dest]
    assert len(true_moves) == len(false_moves) == 2
    # both branches write the same output values
    dst = [method.instructions[i].dst for i in true_moves]
    assert dst == [method.instructions[i].dst for i in false_moves]


class ScalarPredViews(nn.Module):
    """Views and scalars in both branches; the predicate a scalar read from a tensor."""

    def forward(self, x, eager=False):
        def t(a):
            return a.view(6).unsqueeze(0).permute(1, 0) * 3, a.t()[0] + 1

        def f(a):
            return a.reshape(6, 1) - 2, a[:, 1].sin()

        if eager:
            return t(x) if x[0, 0].item() > 0 else f(x)
        return torch.cond(x[0, 0] > 0, t, f, (x,))


class Lifted(nn.Module):
    """Branches closing over a parameter, a buffer and an outer intermediate."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
        self.register_buffer("b", torch.tensor([0.5, 0.25, 0.125]))

    def forward(self, x, eager=False):
        z = x.relu() + 1

        def t(a):
            return a * self.w + z

        def f(a):
            return a - self.b * z

        if eager:
            return t(x) if x.sum() > 0 else f(x)
        return torch.cond(x.sum() > 0, t, f, (x,))


class NestedThree(nn.Module):
    """cond in both branches of a cond, intermediates used after the cond."""

    def forward(self, x, eager=False):
        def it(a):
            return a.exp()

        def if_(a):
            return a.abs() + 5

        def t(a):
            if eager:
                return it(a) if a.mean() > 0.5 else if_(a)
            return torch.cond(a.mean() > 0.5, it, if_, (a,))

        def f(a):
            if eager:
                return if_(a) if a.mean() < -0.5 else it(a)
            return torch.cond(a.mean() < -0.5, if_, it, (a,))

        y = x * 2
        if eager:
            r = t(y) if x.sum() > 0 else f(y)
        else:
            r = torch.cond(x.sum() > 0, t, f, (y,))
        return r + y


@pytest.mark.parametrize(
    ("factory", "inputs"),
    [
        (
            ScalarPredViews,
            [(torch.rand(2, 3) + 0.1,), (-torch.rand(2, 3) - 0.1,)],
        ),
        (Lifted, [(torch.rand(3) + 0.1,), (-torch.rand(3) - 0.1,)]),
        (
            NestedThree,
            [
                (torch.tensor([1.4, 1.1, 1.2]),),
                (torch.tensor([0.1, 0.1, 0.1]),),
                (torch.tensor([-1.4, -1.1, 0.2]),),
                (torch.tensor([-0.1, -0.1, 0.05]),),
            ],
        ),
    ],
)
def test_cond_programs_run_every_branch(factory, inputs) -> None:
    torch.manual_seed(0)
    program = _check_runs(factory(), inputs[0], inputs)
    _verify(program.methods[0])


def test_cond_outputs_live_across_both_branches() -> None:
    """The cond's outputs are written in both branches: live from the true branch's move
    through the false branch to their last reader."""
    factory, example, _ = PROGRAMS["cond_two_outputs"]
    method = _program(factory(), example).program.methods[0]
    spans = planning.lifetimes(method.values, method.instructions, method.outputs)
    (_, _), (second, over) = _jumps(method)
    moves = [ins for ins in method.instructions if isinstance(ins, schema.MoveCall)]
    for move in moves:  # outputs of the cond: live from the true branch's move to the end
        assert spans[move.dst].last >= over.dest - 1
        assert spans[move.dst].first < second


def test_no_control_flow_is_refused_any_more() -> None:
    """map and while_loop are emitted as loops (tests/program/test_program_loops.py); the
    table of constructs to_program refuses is empty, the error type stays for new ones."""
    from exportir.program import kernels

    assert kernels.UNSUPPORTED_CONTROL_FLOW == {}
    assert issubclass(ControlFlowNotSupportedError, NotImplementedError)
    assert issubclass(ControlFlowNotSupportedError, EmitError)


class ViewsOfBranchValues(nn.Module):
    """A branch returns a view of a value computed in the branch (an alias in the program)."""

    def forward(self, x, eager=False):
        return torch.cond(x.sum() > 0, lambda a: (a + 1).t(), lambda a: (a * 2)[:, :].t(), (x,))


def test_views_of_branch_values_stay_valid() -> None:
    x = torch.rand(2, 3) + 0.1
    module = ViewsOfBranchValues()
    pm = _program(module, (x,))
    loaded = Program.load(pm.buffer)
    for probe in (x, -x):
        expected = (probe + 1).t() if probe.sum() > 0 else (probe * 2).t()
        torch.testing.assert_close(h.leaves(loaded(probe))[0], expected)
    method = pm.program.methods[0]
    views = [v for v in method.values if isinstance(getattr(v, "storage", None), schema.ViewOf)]
    # aliases of branch values, no copy instruction: the true branch's t; the false branch's
    # [:, :] (an aten.alias node, as in torch.export's graph) and its t
    assert len(views) == 3
    _verify(method)


def test_cond_with_a_dynamic_dim() -> None:
    from torch.export import Dim

    class Sym(nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda a: a.sin(), lambda a: a.cos() * 2, (x,))

    ep = export(Sym(), (torch.randn(6, 3),), dynamic_shapes={"x": {0: Dim("b", min=2, max=64)}})
    loaded = Program.load(to_edge(ep).to_program().buffer)
    for n in (3, 7):
        for probe in (torch.rand(n, 3) + 0.1, -torch.rand(n, 3) - 0.1):
            torch.testing.assert_close(h.leaves(loaded(probe))[0], Sym()(probe))
