"""Dynamic shapes end to end: a program is planned for every size its ``Dim`` ranges allow, and
a call's inputs are checked up front against each symbol's range, by the symbol's name.

Reproduces the issue's dynamic-shape bullets: a program exported with ``T`` in [2, 128]
(``mask[:T]`` on a 128-row buffer) was planned for 127 and failed at T=128 mid-run; an input
above a dim's max failed at instruction 1 with "planned: value 3 (127,)"; batch 0 was accepted
although the ``Dim``'s min is 1.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from runtime_programs import MethodBuilder

import exportir
from exportir.backends.fused_cpu import FusedCpuPartitioner
from exportir.format.validate import ProgramLoadError
from exportir.program import printer, schema, serialize
from exportir.runtime import MethodInputError, Program

DATA = Path(__file__).resolve().parents[1] / "program" / "data"


class Causal(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mask", torch.tril(torch.ones(128, 128)))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        return x.masked_fill(self.mask[:t, :t] == 0, 0.0).sum(0) + y.sum()


def _causal(road: str = "portable"):
    T = exportir.Dim("T", min=2, max=128)
    B = exportir.Dim("batch", min=1, max=16)
    ep = exportir.export(Causal(), (torch.randn(16, 16), torch.randn(4, 3)),
                         dynamic_shapes={"x": {0: T, 1: T}, "y": {0: B}})
    lowered = (exportir.to_edge(ep) if road == "portable" else
               exportir.to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()]))
    return ep, lowered.to_program().buffer


@pytest.mark.parametrize("road", ["portable", "fused"])
def test_a_buffer_slice_over_the_whole_range_runs_at_min_middle_and_max(road):
    ep, data = _causal(road)
    assert "VR[2, 128]" in str(ep.range_constraints)
    method = Program.load(data).method()
    for t, b in ((2, 1), (65, 7), (128, 16)):
        x, y = torch.randn(t, t), torch.randn(b, 3)
        torch.testing.assert_close(method(x, y), Causal()(x, y))


def test_inputs_beyond_a_range_are_refused_up_front_naming_the_dim():
    _, data = _causal()
    method = Program.load(data).method()
    with pytest.raises(MethodInputError) as info:
        method(torch.randn(129, 129), torch.randn(1, 3))
    assert str(info.value) == (
        "method 'forward': input 0 (x) has size 129 at dim 0; it is T, which the method accepts "
        "in [2, 128]; call with sizes in that range, or export with a wider range for it in "
        "dynamic_shapes")
    with pytest.raises(MethodInputError, match=r"input 1 \(y\) has size 0 at dim 0; it is batch, "
                                                r"which the method accepts in \[1, 16\]"):
        method(torch.randn(5, 5), torch.randn(0, 3))
    with pytest.raises(MethodInputError, match=r"size 6 at dim 1, which makes T = 6; input 0 "
                                                r"\(x\) makes it 5 at dim 0"):
        method(torch.randn(5, 6), torch.randn(1, 3))
    with pytest.raises(MethodInputError, match="exported with it static = 3"):
        method(torch.randn(5, 5), torch.randn(2, 4))
    x, y = torch.randn(3, 3), torch.randn(2, 3)
    torch.testing.assert_close(method(x, y), Causal()(x, y))  # the method still works


class Shifted(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a[1:] + b


def test_derived_dims_are_checked_in_their_form():
    dx = exportir.Dim("dx", min=1, max=32)
    ep = exportir.export(Shifted(), (torch.randn(5), torch.randn(4)),
                         dynamic_shapes={"a": {0: dx + 1}, "b": {0: dx}})
    method = Program.load(exportir.to_edge(ep).to_program().buffer).method()
    for n in (1, 17, 32):
        a, b = torch.randn(n + 1), torch.randn(n)
        torch.testing.assert_close(method(a, b), Shifted()(a, b))
    with pytest.raises(MethodInputError, match=r"it is dx \+ 1, so dx = 33, which the method "
                                                r"accepts in \[1, 32\]"):
        method(torch.randn(34), torch.randn(33))
    with pytest.raises(MethodInputError, match="makes dx = 4; input 0 .a. makes it 3"):
        method(torch.randn(4), torch.randn(4))


def test_the_program_records_and_prints_the_symbols():
    _, data = _causal()
    program = serialize.deserialize_program(data)
    m = program.methods[0]
    assert m.symbols == (schema.SymbolRange("T", 2, 128), schema.SymbolRange("batch", 1, 16))
    assert m.input_dims == ((schema.DimSize(0), schema.DimSize(0)), (schema.DimSize(1), None))
    text = printer.format_program(program)
    assert "symbols: T in [2, 128], batch in [1, 16]" in text
    assert "x: [T, T]" in text and "y: [batch, 3]" in text


def dynamic_program() -> schema.Program:
    """out = x * 2 with x of sizes [2*n + 1, 3], n in [1, 8] (the format 2.1 sample)."""
    b = MethodBuilder()
    x = b.input("x", (17, 3), dynamic=True)
    two = b.add(schema.Double(2.0))
    out = b.planned((17, 3), dynamic=True)
    b.kernel("aten::mul", "Scalar_out", (x, two, out), "mul", "model.py:2")
    b.outputs.append(out)
    method = b.build()
    method = schema.Method(**{**{f: getattr(method, f) for f in method.__slots__},
                              "symbols": (schema.SymbolRange("n", 1, 8),),
                              "input_dims": ((schema.DimSize(0, 2, 1), None),)})
    return schema.Program(schema.FORMAT_VERSION, (method,))


def test_format_2_1_file_with_symbolic_sizes_still_loads():
    """A committed file written by format 2.1 (symbolic input sizes)."""
    path = DATA / "program_v2_1.xpt"
    assert serialize.load(path) == dynamic_program()
    method = Program.load(path).method()
    torch.testing.assert_close(method(torch.ones(5, 3))[0], torch.full((5, 3), 2.0))
    with pytest.raises(MethodInputError, match=r"it is 2\*n \+ 1 \(n in \[1, 8\]\), and 4 is not"):
        method(torch.ones(4, 3))


def test_a_file_without_symbolic_sizes_runs_as_before():
    """A 2.0 program (no symbols): only the planned upper bounds apply."""
    plain = dynamic_program()
    m = plain.methods[0]
    plain = schema.Program(plain.version, (schema.Method(
        **{**{f: getattr(m, f) for f in m.__slots__}, "symbols": (), "input_dims": ()}),))
    data = serialize.serialize_program(plain)
    assert b"symbols" not in serialize._inflate(
        memoryview(data)[80:80 + serialize.read_layout(data).structure_length],
        serialize.read_layout(data).structure_raw_length, serialize.DEFAULT_LIMITS, 80)
    method = Program.load(data).method()
    torch.testing.assert_close(method(torch.ones(4, 3))[0], torch.full((4, 3), 2.0))


def test_a_plan_smaller_than_a_symbols_range_is_refused_at_load():
    program = dynamic_program()
    m = program.methods[0]
    wide = schema.Method(**{**{f: getattr(m, f) for f in m.__slots__},
                            "symbols": (schema.SymbolRange("n", 1, 9),)})
    with pytest.raises(ProgramLoadError) as info:
        Program.from_schema(schema.Program(program.version, (wide,)))
    assert info.value.field == "methods[0].input_dims[0][0]"
    assert "n up to 9 makes dimension 0 19, beyond its planned size 17" in str(info.value)


if __name__ == "__main__":
    # Writes the 2.1 compatibility file (only when releasing the version: never regenerated).
    serialize.save(dynamic_program(), DATA / "program_v2_1.xpt")
