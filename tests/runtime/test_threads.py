"""One ``Method`` called from many threads: every result equals eager.

A method runs each call on an execution state taken from its pool (arenas, value frame,
compiled steps); a stateful method (buffers it updates) and a delegate whose backend is not
``thread_safe`` run one call at a time. Reproduces the issue's "one Method called from 8
threads: 25-59 of 1,200 results silently wrong, double free or corruption / SIGSEGV".
"""

from __future__ import annotations

import threading

import pytest
import torch
from corpus import real_models as R
from runtime_programs import MethodBuilder, program_of
from torch.utils import _pytree as tree

import exportir
from exportir.backends.fused_cpu import FusedCpuPartitioner
from exportir.format import schema
from exportir.runtime import DelegateRegistry, Program

THREADS, CALLS, INPUTS = 8, 25, 6


def _leaves(x):
    return [v for v in tree.tree_leaves(x) if isinstance(v, torch.Tensor)]


def _hammer(call, n_inputs: int) -> list[tuple[int, object]]:
    """Every thread makes CALLS calls (input index, result); a start barrier makes them
    overlap."""
    results: list[tuple[int, object]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(THREADS)

    def work(k: int) -> None:
        barrier.wait()
        try:
            for i in range(CALLS):
                j = (k + i) % n_inputs
                results.append((j, call(j)))
        except Exception as e:  # noqa: BLE001 - reported by the test, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"a thread failed: {errors[0]!r}"
    assert len(results) == THREADS * CALLS
    return results


@pytest.fixture(scope="module")
def llama():
    case = R.build("llama")
    ep = exportir.export(case.model, (), case.kwargs)
    inputs = [case.inputs(2, 8, seed) for seed in range(INPUTS)]
    with torch.no_grad():
        expected = [case.model(**kw) for kw in inputs]
    return ep, inputs, expected


@pytest.mark.parametrize("road", ["portable", "fused"])
def test_a_real_model_method_called_from_many_threads_matches_eager(llama, road):
    ep, inputs, expected = llama
    lowered = (exportir.to_edge(ep) if road == "portable" else
               exportir.to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()]))
    method = Program.load(lowered.to_program().buffer).method("forward")
    results = _hammer(lambda j: method(**inputs[j]), INPUTS)
    wrong = 0
    for j, got in results:
        got, want = _leaves(got), _leaves(expected[j])
        assert len(got) == len(want)
        wrong += not all(torch.allclose(a, b, atol=1e-4, rtol=1e-4) for a, b in zip(got, want))
    assert wrong == 0, f"{road}: {wrong} of {len(results)} results differ from eager"
    assert 1 <= method.num_states <= THREADS  # a state per concurrent call, kept for reuse


class Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        return x + self.count


def test_a_stateful_method_runs_its_calls_one_at_a_time():
    x = torch.zeros(4)
    program = exportir.to_edge(exportir.export(Counter(), (x,))).to_program()
    method = Program.load(program.buffer).method("forward")
    results = _hammer(lambda j: method(x), 1)
    counts = sorted(int(got[0]) for _, got in results)
    assert counts == list(range(1, THREADS * CALLS + 1))  # every update seen exactly once
    assert all(bool((got == got[0]).all()) for _, got in results)
    assert method.num_states == 1


class ReusingBackend:
    """Writes every result into one buffer it keeps, and checks nobody else is inside: not
    thread-safe, and it does not claim to be."""

    def __init__(self) -> None:
        self.buffer = torch.empty(2, 2)
        self.inside = 0
        self.overlaps = 0

    def init(self, processed, compile_specs):
        return 2.0

    def execute(self, handle, inputs):
        self.inside += 1
        if self.inside > 1:
            self.overlaps += 1
        a, b = inputs
        torch.mul(a, handle, out=self.buffer).add_(b)
        for _ in range(50):  # widen the window another thread would have to interleave
            self.buffer.add_(0)
        self.inside -= 1
        return [self.buffer]


def _delegate_program():
    b = MethodBuilder()
    x, y = b.input("x", (2, 2)), b.input("y", (2, 2))
    out = b.planned((2, 2))
    b.instruction(lambda d: schema.DelegateCall(0, (x, y), (out,), d), "delegate", "m.py:1")
    b.outputs += [out]
    return program_of(b, delegates=[schema.Delegate("reusing", b"", ())])


def test_a_delegate_that_is_not_thread_safe_runs_one_call_at_a_time():
    backend = ReusingBackend()
    program = Program.from_schema(_delegate_program(),
                                  delegates=DelegateRegistry({"reusing": backend}))
    method = program.method()
    xs = [torch.randn(2, 2) for _ in range(INPUTS)]
    ys = [torch.randn(2, 2) for _ in range(INPUTS)]
    results = _hammer(lambda j: method(xs[j], ys[j])[0], INPUTS)
    assert backend.overlaps == 0
    for j, got in results:
        torch.testing.assert_close(got, xs[j] * 2 + ys[j])
