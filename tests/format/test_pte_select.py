"""Kernel choices the .pte writer makes for ExecuTorch's portable kernels
(exportir.format.pte_select, docs/format/pte.md "Kernel choices"): each rewrite is in the file
(or, where it would change the result, is not) and the file runs in ExecuTorch's runtime like
eager, over several calls when the method keeps state, and in exportir's runtime too."""

from __future__ import annotations

import torch
from corpus.export_models import BufferInplace
from pte_helpers import our_pte, run_in_executorch, run_in_exportir

from exportir.export import export
from exportir.format import schema
from exportir.format.pte_read import read_pte
from exportir.program.manager import to_edge


def _pte(module: torch.nn.Module, args: tuple) -> bytes:
    return to_edge(export(module, args)).to_program().pte_buffer()


def _calls(data: bytes) -> list[str]:
    """The file's instructions as exportir reads them (``aten::copy_`` reads as ``move``)."""
    m = read_pte(data).methods[0]
    return [f"{m.operators[i.op_index].name}.{m.operators[i.op_index].overload}"
            if isinstance(i, schema.KernelCall) else type(i).__name__ for i in m.instructions]


def _same_as_eager(data: bytes, make, args: tuple, calls: int = 1) -> None:
    """``calls`` calls in ExecuTorch's and in exportir's runtime equal to eager's (a fresh
    module per runtime: state carries over between the calls)."""
    from executorch.runtime import Runtime

    from exportir.runtime import Program

    for run in (Runtime.get().load_program(data).load_method("forward").execute,
                Program.load(data).method("forward").execute):
        eager = make()
        for _ in range(calls):
            want = eager(*args)
            want = list(want) if isinstance(want, tuple) else [want]
            got = run(list(args))
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype
                torch.testing.assert_close(g, w)


class Arith(torch.nn.Module):
    def forward(self, x, n):
        return x * 2 + 1.5, 3 * x, x / 4, x - 0.25, n + 1, n * 0.5, 3 - x


def test_zero_dim_constants_become_scalar_overloads():
    """x * 2 (and 3 * x) runs as mul.Scalar_out (one dtype, no broadcast); an int tensor times
    0.5 (a float result from an int tensor) and 3 - x (no reversed form written) keep the tensor
    form."""
    args = (torch.randn(3, 4), torch.arange(5))
    data = _pte(Arith().eval(), args)
    calls = _calls(data)
    assert {"aten::mul.Scalar_out", "aten::add.Scalar_out", "aten::div.Scalar_out"} <= set(calls)
    assert calls.count("aten::mul.out") == 1 and calls.count("aten::sub.out") == 1
    _same_as_eager(data, lambda: Arith().eval(), args)


def test_state_is_written_in_place_and_int_state_cast_before_dividing():
    """No copy_ writes the buffers back (the adds write them), and the int64 step count is cast
    to float once before the division (the portable kernel's one-dtype path)."""
    args = (torch.randn(3, 4),)
    data = _pte(BufferInplace().eval(), args)
    calls = _calls(data)
    assert "MoveCall" not in calls and "aten::_to_copy.out" in calls
    _same_as_eager(data, lambda: BufferInplace().eval(), args, calls=3)
    corpus = our_pte("buffer_inplace")
    run_in_executorch(corpus, "buffer_inplace", calls=3)
    run_in_exportir(corpus, "buffer_inplace", calls=3)


class ReadsOldState(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("buf", torch.ones(4))

    def forward(self, x):
        new = self.buf + x
        old = self.buf * new  # the old value, read after the new one exists
        self.buf.copy_(new)
        return old


def test_state_read_after_its_new_value_keeps_the_copy():
    args = (torch.randn(4),)
    data = _pte(ReadsOldState().eval(), args)
    assert _calls(data) == ["aten::add.out", "aten::mul.out", "MoveCall"]
    _same_as_eager(data, lambda: ReadsOldState().eval(), args, calls=3)


class Views(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        return y[:, 1:] + 1, y[:, ::2] - 1, y[:, 2] * 3, y[1:, 1:3] * 1, y.t() + 0


def test_slice_and_select_views_are_copied_by_their_kernels():
    """A planned view that is a slice (also with a step) or a selection of one dimension is
    copied by slice_copy / select_copy (a memcpy per run, not one element at a time); a slice of
    two dimensions and a transpose keep as_strided_copy."""
    args = (torch.randn(4, 6),)
    data = _pte(Views().eval(), args)
    calls = _calls(data)
    assert calls.count("aten::slice_copy.Tensor_out") == 2
    assert calls.count("aten::select_copy.int_out") == 1
    assert calls.count("aten::as_strided_copy.out") == 2
    _same_as_eager(data, lambda: Views().eval(), args)


def test_view_copy_form_checks_every_dimension():
    from exportir.format.pte_views import ViewCopy, view_copy

    def form(base, sizes, strides, offset):
        t = schema.Tensor(schema.ScalarType.FLOAT, sizes, tuple(range(len(sizes))),
                          schema.ViewOf(0, offset, strides))
        b = schema.Tensor(schema.ScalarType.FLOAT, base, tuple(range(len(base))),
                          schema.Allocation(0, 0, 96))
        return view_copy(b, t, t.storage)

    assert form((4, 6), (4, 5), (6, 1), 1) == ViewCopy("aten::slice_copy", "Tensor_out",
                                                        (1, 1, 6, 1))
    assert form((4, 6), (4, 3), (6, 2), 1) == ViewCopy("aten::slice_copy", "Tensor_out",
                                                        (1, 1, 6, 2))
    assert form((4, 6), (4,), (6,), 2) == ViewCopy("aten::select_copy", "int_out", (1, 2))
    assert form((4, 6), (2, 6), (12, 1), 6) == ViewCopy("aten::slice_copy", "Tensor_out",
                                                         (0, 1, 4, 2))
    assert form((4, 6), (4, 3), (6, 2), 2) is None  # 2 + 2 * 2 steps past the end
    assert form((4, 6), (4, 5), (5, 1), 1) is None  # not a slice of this base
    assert form((4, 6), (3, 5), (6, 1), 7) is None  # two dimensions sliced
    assert form((4, 6), (6, 4), (1, 6), 0) is None  # a transpose
    assert form((4, 6), (2, 3, 4), (12, 4, 1), 0) is None  # another rank
