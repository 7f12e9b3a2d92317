"""Control-flow programs (torch.cond, map, torch.while_loop) shared by the export, edge and
program tests: each with example inputs and input tuples taking every branch.

The modules take ``eager=True`` to run a plain-Python reference of the same computation.
"""

from __future__ import annotations

from typing import Any

import torch
from functorch.experimental.control_flow import map as cf_map
from torch import nn

__all__ = ["PROGRAMS"]


class CondClosures(nn.Module):
    """Tensor predicate; the branches close over an outer intermediate, a Linear and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("buf", torch.arange(3.0))

    def forward(self, x: torch.Tensor, y: torch.Tensor, eager: bool = False) -> torch.Tensor:
        z = y * 2

        def true_fn(a: torch.Tensor) -> torch.Tensor:
            return self.lin(a) + z + self.buf

        def false_fn(a: torch.Tensor) -> torch.Tensor:
            return a.cos() - self.buf

        if eager:
            return true_fn(x) if x.sum() > 0 else false_fn(x)
        return torch.cond(x.sum() > 0, true_fn, false_fn, (x,))


class CondTwoOutputs(nn.Module):
    """Two operands, a tuple of outputs, a closure over an input the operands don't carry."""

    def forward(self, x, y, w, eager=False):
        def true_fn(a, b):
            return a + b, (a * w).sum(0)

        def false_fn(a, b):
            return a - b, b.exp().sum(0)

        if eager:
            return true_fn(x, y) if x.mean() > 0 else false_fn(x, y)
        return torch.cond(x.mean() > 0, true_fn, false_fn, (x, y))


class CondPredInput(nn.Module):
    """The predicate is a user input (a bool scalar tensor); a parameter inside one branch."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([1.5, -2.0, 0.5]))

    def forward(self, p, x, eager=False):
        def true_fn(a):
            return a * self.scale

        def false_fn(a):
            return a.relu() + 1

        if eager:
            return true_fn(x) if p else false_fn(x)
        return torch.cond(p, true_fn, false_fn, [x])


class CondNested(nn.Module):
    """A cond inside the true branch of a cond; the inner false branch closes over ``y``."""

    def forward(self, x, y, eager=False):
        def inner_true(b):
            return b.sin()

        def inner_false(b):
            return b.cos() + y

        def outer_true(a):
            if eager:
                return inner_true(a) if a.mean() > 0 else inner_false(a)
            return torch.cond(a.mean() > 0, inner_true, inner_false, (a,))

        def outer_false(a):
            return a * 2

        if eager:
            return outer_true(x) if x.sum() > 0 else outer_false(x)
        return torch.cond(x.sum() > 0, outer_true, outer_false, (x,))


class MapClosures(nn.Module):
    """map over the leading dim with an explicit extra argument, a parameter and a closure."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([0.5, 1.0, 2.0]))

    def forward(self, xs, y, eager=False):
        z = y + 1

        def body(x, b):
            return x * self.w + z, (x * b).sum()

        if eager:
            outs = [body(x, y) for x in xs]
            return torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs])
        return cf_map(body, xs, y)


class WhileCounter(nn.Module):
    """A counter and a value carried; the body closes over a parameter and an intermediate."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0, 0.5, -1.0]))

    def forward(self, i, x, y, eager=False):
        z = y + 1

        def cond_fn(i, x):
            return i < 5

        def body_fn(i, x):
            return i + 1, x * self.w + z

        if eager:
            while cond_fn(i, x):
                i, x = body_fn(i, x)
            return i, x
        return torch.while_loop(cond_fn, body_fn, (i, x))


class WhileWithCond(nn.Module):
    """A cond inside a while_loop body: the inner subgraphs live in the body's module."""

    def forward(self, i, x, eager=False):
        def cond_fn(i, x):
            return x.sum() < 100

        def body_fn(i, x):
            def grow(a):
                return a * 2

            def shift(a):
                return a + 3

            if eager:
                return i + 1, grow(x) if i % 2 == 0 else shift(x)
            return i + 1, torch.cond(i % 2 == 0, grow, shift, (x,))

        if eager:
            while cond_fn(i, x):
                i, x = body_fn(i, x)
            return i, x
        return torch.while_loop(cond_fn, body_fn, (i, x))


def _x(*shape: int, sign: float = 1.0) -> torch.Tensor:
    return sign * (torch.rand(*shape) + 0.1)


# name -> (module factory, example inputs, list of input tuples covering every branch)
PROGRAMS: dict[str, tuple[Any, tuple, list[tuple]]] = {
    "cond_closures": (
        CondClosures,
        (_x(2, 3), torch.randn(3)),
        [(_x(2, 3), torch.randn(3)), (_x(2, 3, sign=-1), torch.randn(3))],
    ),
    "cond_two_outputs": (
        CondTwoOutputs,
        (_x(2, 3), torch.randn(2, 3), torch.randn(3)),
        [
            (_x(2, 3), torch.randn(2, 3), torch.randn(3)),
            (_x(2, 3, sign=-1), torch.randn(2, 3), torch.randn(3)),
        ],
    ),
    "cond_pred_input": (
        CondPredInput,
        (torch.tensor(True), torch.randn(3)),
        [(torch.tensor(True), torch.randn(3)), (torch.tensor(False), torch.randn(3))],
    ),
    "cond_nested": (
        CondNested,
        (_x(2, 3), torch.randn(3)),
        [
            (_x(2, 3), torch.randn(3)),
            (_x(2, 3, sign=-1), torch.randn(3)),
        ],
    ),
    "map_closures": (
        MapClosures,
        (torch.randn(4, 3), torch.randn(3)),
        [(torch.randn(4, 3), torch.randn(3)), (torch.randn(4, 3), torch.randn(3))],
    ),
    "while_counter": (
        WhileCounter,
        (torch.tensor(0), torch.randn(3), torch.randn(3)),
        [
            (torch.tensor(0), torch.randn(3), torch.randn(3)),
            (torch.tensor(4), torch.randn(3), torch.randn(3)),
            (torch.tensor(7), torch.randn(3), torch.randn(3)),
        ],
    ),
    "while_with_cond": (
        WhileWithCond,
        (torch.tensor(0), torch.ones(3)),
        [(torch.tensor(0), torch.ones(3)), (torch.tensor(1), torch.full((3,), 2.0))],
    ),
}
