"""Shared by the .pte tests: compile corpus models both ways and compare with eager."""

from __future__ import annotations

import warnings

import torch
from corpus.export_models import BY_NAME, build

from exportir import pytree


def tensors(tree) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def flat_inputs(args: tuple, kwargs: dict) -> list:
    """What a flat-input runtime call takes: the leaves of (args, kwargs), str ones left out
    (a str input is fixed at export)."""
    return [x for x in pytree.tree_leaves((args, kwargs)) if not isinstance(x, str)]


def assert_same(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def our_pte(name: str) -> bytes:
    """Corpus model ``name`` compiled by exportir and written as a .pte."""
    from exportir.export import export
    from exportir.program.manager import to_edge

    module, args, kwargs = build(BY_NAME[name])
    return to_edge(export(module, args, kwargs)).to_program().pte_buffer()


def executorch_pte(name: str) -> bytes:
    """Corpus model ``name`` compiled by ExecuTorch (torch.export -> to_edge ->
    to_executorch), the oracle's own .pte."""
    from executorch.exir import to_edge

    module, args, kwargs = build(BY_NAME[name])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return to_edge(torch.export.export(module, args, kwargs)).to_executorch().buffer


class BufferView(torch.nn.Module):
    """Reads a view of a buffer before mutating it in place, and a view after: ExecuTorch plans
    the first view on the buffer's own bytes (tests/format/data/executorch_buffer_view.pte)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("buf", torch.zeros(2, 3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        before = self.buf.view(-1) * 2
        self.buf.add_(x)
        return before + 1, self.buf.view(3, 2) * 1


def executorch_pte_of(module: torch.nn.Module, args: tuple) -> bytes:
    """``module`` compiled by ExecuTorch (torch.export -> to_edge -> to_executorch)."""
    from executorch.exir import to_edge

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return to_edge(torch.export.export(module, args)).to_executorch().buffer


def run_in_executorch(data: bytes, name: str, calls: int = 2) -> None:
    """Load ``data`` in ExecuTorch's runtime and check ``calls`` calls against eager (the
    second sees the state the first left)."""
    from executorch.runtime import Runtime

    # ExecuTorch's runtime reads ``data`` in place: the caller keeps it alive meanwhile
    method = Runtime.get().load_program(data).load_method("forward")
    eager, args, kwargs = build(BY_NAME[name])
    _, args2, kwargs2 = build(BY_NAME[name])
    for _ in range(calls):
        expected = tensors(eager(*args, **kwargs))
        assert_same(tensors(method.execute(flat_inputs(args2, kwargs2))), expected)


def run_in_exportir(data: bytes, name: str, calls: int = 2) -> None:
    from exportir.runtime import Program

    method = Program.load(data).method("forward")
    eager, args, kwargs = build(BY_NAME[name])
    _, args2, kwargs2 = build(BY_NAME[name])
    for _ in range(calls):
        expected = tensors(eager(*args, **kwargs))
        assert_same(tensors(method.execute(flat_inputs(args2, kwargs2))), expected)


# -- hand-edited .pte files (hostile variants of a real one) ----------------------------------


def _plan(data: bytes):
    from exportir.format import _pte_fbs as fbs
    from exportir.format import pte_read

    buf = pte_read._Buf(data)
    root = pte_read._Table(buf, buf.read("<I", 0, "root"), "program")
    return root.tables(fbs.Program.execution_plan, "execution_plan")[0]


def _patch_u32(data: bytes, pos: int | None, new: int) -> bytes:
    assert pos is not None, "the field is absent (its default): nothing to patch in place"
    out = bytearray(data)
    out[pos:pos + 4] = new.to_bytes(4, "little")
    return bytes(out)


def with_allocation_offset(data: bytes, value: int, offset: int) -> bytes:
    """``data`` with value ``value``'s planned offset (``allocation_info.memory_offset_low``)
    set to ``offset``; checks that no other value changed (flatbuffers may share tables)."""
    from exportir.format import _pte_fbs as fbs
    from exportir.format.pte_read import read_pte

    tensor = _plan(data).tables(fbs.ExecutionPlan.values, "values")[value].table(
        fbs.EValue.val, "val")
    alloc = tensor.table(fbs.Tensor.allocation_info, "allocation_info")
    out = _patch_u32(data, alloc._field(fbs.AllocationDetails.memory_offset_low), offset)
    before, after = _allocations(read_pte, data), _allocations(read_pte, out)
    assert {k for k in before if before[k] != after.get(k)} <= {value}, "edited another value"
    return out


def _allocations(read, data: bytes) -> dict:
    from exportir.format import schema

    return {k: v.storage for k, v in enumerate(read(data).methods[0].values)
            if isinstance(v, schema.Tensor)}


def with_call_arg(data: bytes, instruction: int, arg: int, value: int) -> bytes:
    """``data`` with argument ``arg`` of kernel call ``instruction`` naming value ``value``."""
    from exportir.format import _pte_fbs as fbs

    chain = _plan(data).tables(fbs.ExecutionPlan.chains, "chains")[0]
    call = chain.tables(fbs.Chain.instructions, "instructions")[instruction].table(
        fbs.Instruction.instr_args, "instr_args")
    start, n = call._vector(1, "args", 4)
    assert 0 <= arg < n
    return _patch_u32(data, start + 4 * arg, value)


def with_list_item(data: bytes, value: int, item: int, new: int) -> bytes:
    """``data`` with item ``item`` of list value ``value`` (a ``TensorList``) naming ``new``."""
    from exportir.format import _pte_fbs as fbs

    lst = _plan(data).tables(fbs.ExecutionPlan.values, "values")[value].table(
        fbs.EValue.val, "val")
    start, n = lst._vector(0, "items", 4)
    assert 0 <= item < n
    return _patch_u32(data, start + 4 * item, new & 0xFFFFFFFF)
