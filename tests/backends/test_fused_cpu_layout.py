"""Random chains of layout ops (view / permute / squeeze / unsqueeze) rewritten by the fused
CPU backend's layout rules compute what the chain computes, in fewer ops."""

from __future__ import annotations

import math
import random

import pytest
import torch

from exportir.backends.fused_cpu.ir import Graph, Op, Value
from exportir.backends.fused_cpu.layout import _replacement
from exportir.backends.fused_cpu.rewrites import optimize


def _factor(n: int, rng: random.Random) -> list[int]:
    dims = []
    while n > 1:
        divisors = [d for d in range(2, n + 1) if n % d == 0]
        d = rng.choice(divisors)
        dims.append(d)
        n //= d
    rng.shuffle(dims)
    for _ in range(rng.randint(0, 2)):
        dims.insert(rng.randint(0, len(dims)), 1)
    return dims or [1]


def _chain(rng: random.Random) -> tuple[list[int], list[tuple[str, object]]]:
    shape = _factor(rng.choice([12, 24, 36, 48, 60, 64]), rng)
    steps: list[tuple[str, object]] = []
    current = list(shape)
    for _ in range(rng.randint(2, 6)):
        kind = rng.choice(["view", "permute", "permute", "squeeze", "unsqueeze"])
        if kind == "view":
            current = _factor(math.prod(current), rng)
            steps.append(("aten.view_copy.default", list(current)))
        elif kind == "permute":
            perm = list(range(len(current)))
            rng.shuffle(perm)
            current = [current[d] for d in perm]
            steps.append(("aten.permute_copy.default", perm))
        elif kind == "squeeze" and 1 in current:
            d = current.index(1)
            current.pop(d)
            steps.append(("aten.squeeze_copy.dims", [d - len(current) - 1]))
        else:
            d = rng.randint(0, len(current))
            current.insert(d, 1)
            steps.append(("aten.unsqueeze_copy.default", d))
    return shape, steps


def _run(graph: Graph, x: torch.Tensor) -> torch.Tensor:
    env = {id(graph.inputs[0]): x}
    for op in graph.ops:
        args = [env[id(a)] if isinstance(a, Value) else a for a in op.args]
        _, packet, overload = op.name.split(".")
        env[id(op.out)] = getattr(getattr(torch.ops.aten, packet), overload)(*args)
    out = graph.outputs[0]
    return env[id(out)]


@pytest.mark.parametrize("seed", range(200))
def test_random_layout_chains(seed):
    rng = random.Random(seed)
    shape, steps = _chain(rng)
    x = Value(torch.empty(shape, device="meta"), name="x")
    graph = Graph([x], [], [])
    current = x
    for name, arg in steps:
        _, packet, overload = name.split(".")
        meta = getattr(getattr(torch.ops.aten, packet), overload)(current.meta, arg)
        out = Value(meta, name=f"v{len(graph.ops)}")
        graph.ops.append(Op(name, [current, arg], {}, [out], False, (out.name,)))
        current = out
    # a reader that is not a layout op, so the chain's end stays
    result = Value(current.meta, name="r")
    graph.ops.append(Op("aten.neg.default", [current], {}, [result], False, ("r",)))
    graph.outputs.append(result)
    before = len(graph.ops)
    whole = _replacement(x, graph.ops[:-1]) is not None  # the chain is one view-permute-view
    data = torch.randn(shape)
    expected = _run(graph, data)
    optimize(graph)
    assert len(graph.ops) <= (min(before, 4) if whole else before)
    torch.testing.assert_close(_run(graph, data), expected, rtol=0, atol=0)
