"""Input mutations land in the caller's tensor, as eager's do, whatever its layout.

Reproduces the issue's "a model that mutates its input (``x.add_(1)``) loses the mutation when
the caller passes a non-contiguous tensor (the runtime mutates its contiguous copy)".
"""

from __future__ import annotations

import pytest
import torch

import exportir
from exportir.backends.fused_cpu import FusedCpuPartitioner
from exportir.runtime import MethodInputError, Program


class AddOne(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x * 2


class ScaleBy(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.mul_(y)
        return x.sum(-1)


LAYOUTS = {
    "contiguous": lambda: torch.randn(3, 4),
    "transposed": lambda: torch.randn(4, 3).t(),
    "strided": lambda: torch.randn(3, 8)[:, ::2],
    "offset view": lambda: torch.randn(5, 4)[1:4],
    "rows of a bigger tensor": lambda: torch.randn(3, 6)[:, 1:5],
}


def _method(model: torch.nn.Module, args: tuple, road: str):
    ep = exportir.export(model, tuple(a.clone() for a in args))
    lowered = (exportir.to_edge(ep) if road == "portable" else
               exportir.to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()]))
    return Program.load(lowered.to_program().buffer).method()


@pytest.mark.parametrize("road", ["portable", "fused"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_an_input_mutation_reaches_the_callers_tensor_in_any_layout(road, layout):
    method = _method(AddOne(), (torch.randn(3, 4),), road)
    torch.manual_seed(0)
    ours = LAYOUTS[layout]()
    base = ours._base if ours._base is not None else ours
    theirs_base = base.clone()
    theirs = theirs_base.as_strided(ours.shape, ours.stride(), ours.storage_offset())
    got = method(ours)
    want = AddOne()(theirs)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(base, theirs_base)  # and nothing else of the base changed
    again = method(ours)  # the second (trusted) run writes it back too
    torch.testing.assert_close(again, AddOne()(theirs))
    torch.testing.assert_close(base, theirs_base)


@pytest.mark.parametrize("road", ["portable", "fused"])
def test_a_mutated_input_next_to_a_broadcast_operand(road):
    method = _method(ScaleBy(), (torch.randn(3, 4), torch.randn(4)), road)
    x = torch.randn(4, 3).t()
    y = torch.randn(4)
    x_eager = x.clone()
    torch.testing.assert_close(method(x, y), ScaleBy()(x_eager, y))
    torch.testing.assert_close(x, x_eager)


def test_an_overlapping_input_the_method_writes_is_refused_as_eager_refuses_it():
    method = _method(AddOne(), (torch.randn(3, 4),), "portable")
    x = torch.randn(1, 4).expand(3, 4)
    with pytest.raises(RuntimeError, match="single memory location"):
        AddOne()(torch.randn(1, 4).expand(3, 4))
    with pytest.raises(MethodInputError, match=r"input 0 \(x\).*share memory.*clone"):
        method(x)
    y = torch.randn(1, 1).expand(4, 1)[:, 0]  # read only: fine where the method only reads it
    reader = _method(ScaleBy(), (torch.randn(3, 4), torch.randn(4)), "portable")
    x2 = torch.randn(3, 4)
    torch.testing.assert_close(reader(x2.clone(), y), ScaleBy()(x2.clone(), y))
