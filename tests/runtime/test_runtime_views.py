"""Views in the runtime: aliases built once at load (per call for views of inputs), outputs that
are views are copies, and an instruction writing into a view is refused at load."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from runtime_programs import view_program

from exportir.program import schema, serialize
from exportir.runtime import Program, ProgramLoadError


def _expected(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = x.t() + torch.arange(6.0).reshape(2, 3)[1].unsqueeze(1)
    return s, s.t()


def test_views_of_inputs_constants_and_planned_tensors(tmp_path):
    path = tmp_path / "views.xpt"
    path.write_bytes(serialize.serialize_program(view_program()))
    method = Program.load(path).method()  # the constant's view reads the mapped file
    for x in (torch.randn(2, 3), torch.randn(3, 2).t()):  # the second is made contiguous
        for got, expected in zip(method(x), _expected(x)):
            torch.testing.assert_close(got, expected)


def test_outputs_that_are_views_do_not_change_on_the_next_call():
    method = Program.from_schema(view_program()).method()
    first = method(torch.zeros(2, 3))
    kept = [t.clone() for t in first]
    method(torch.ones(2, 3))
    for got, expected in zip(first, kept):
        assert torch.equal(got, expected)


def test_an_instruction_writing_into_a_view_is_refused_at_load():
    program = view_program()
    m = program.methods[0]
    view = len(m.values) - 1  # s.t()
    bad = dataclasses.replace(m, instructions=m.instructions + (schema.MoveCall(3, view, 0),))
    with pytest.raises(ProgramLoadError, match=rf"instructions\[\d+\].dst: a move writes value "
                                               rf"{view}, a view \(read-only\)"):
        Program.from_schema(dataclasses.replace(program, methods=(bad,)))


def test_exported_outputs_that_are_views_are_fresh_tensors():
    from exportir.export import export
    from exportir.program.manager import to_edge

    class M(torch.nn.Module):
        def forward(self, x):
            y = torch.relu(x)
            return y.t(), y[1:], x.view(6), (y * 2).unsqueeze(0)

    x = torch.randn(2, 3)
    method = Program.load(to_edge(export(M(), (x,))).to_program().buffer).method()
    for _ in range(3):  # verified and trusted runs alike
        first = method(x)
        kept = [t.clone() for t in first]
        method(-x)
        for got, expected, e in zip(first, kept, M()(x)):
            assert torch.equal(got, expected) and torch.equal(got, e)
        assert first[2].data_ptr() != x.data_ptr()  # never the caller's tensor
