"""ExecuTorch's own .pte files (committed, written by ExecuTorch 1.5.1's ``to_executorch()``:
scripts/gen_pte_fixtures.py) in exportir's runtime: the views and the uninitialised buffer state
ExecuTorch leaves to memory offsets (exportir.format.pte_memory), against eager, and hand-edited
variants whose memory claims would read bytes nothing wrote, refused at load. No executorch
import: the whole corpus against ExecuTorch's runtime is test_pte_corpus.py (slow)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from corpus.export_models import BY_NAME, build
from pte_helpers import (
    BufferView,
    assert_same,
    flat_inputs,
    tensors,
    with_allocation_offset,
    with_call_arg,
    with_list_item,
)

from exportir.format import schema
from exportir.format.pte_read import read_pte
from exportir.format.validate import ProgramLoadError
from exportir.runtime import Program

DATA = Path(__file__).resolve().parent / "data"


def _file(name: str) -> bytes:
    return (DATA / f"executorch_{name}.pte").read_bytes()


def _calls(data: bytes, name: str, eager: torch.nn.Module | None = None, calls: int = 2) -> None:
    """``calls`` calls of ExecuTorch's file ``name`` in exportir's runtime equal to eager (the
    same module throughout: state carries over)."""
    method = Program.load(data).method("forward")
    eager = eager if eager is not None else build(BY_NAME[name])[0]
    for _ in range(calls):
        _, args, kwargs = build(BY_NAME[name])
        _, args2, kwargs2 = build(BY_NAME[name])
        assert_same(tensors(method.execute(flat_inputs(args, kwargs))),
                    tensors(eager(*args2, **kwargs2)))


def _storage(data: bytes, value: int) -> schema.Storage:
    return read_pte(data).methods[0].values[value].storage


# -- views ---------------------------------------------------------------------------------------


def test_views_of_an_input_and_of_a_planned_value_run_like_eager():
    data = _file("view_ops")
    # value 9 (x.reshape(4, 6)) is planned on input 0's bytes, value 19 on value 14's (a clone)
    assert _storage(data, 9) == schema.ViewOf(0, 0, (6, 1))
    assert _storage(data, 19) == schema.ViewOf(14, 0, (12, 4, 1))
    # the split's out list (an op returning nothing) is written, not an alias of something else
    assert isinstance(_storage(data, 1), schema.Allocation)
    _calls(data, "view_ops")


def test_a_view_of_bytes_nothing_wrote_is_refused():
    # value 9 moved to bytes [192, 288): free at its read (instruction 1), and no value
    # written before holds them
    data = with_allocation_offset(_file("view_ops"), 9, 192)
    with pytest.raises(ProgramLoadError, match=r"instructions\[1\]: reads value 9 before any "):
        Program.load(data)


def test_a_view_reaching_outside_its_source_is_refused():
    # bytes [240, 336) end inside input 0's [288, 384) but start before it: no alias
    data = with_allocation_offset(_file("view_ops"), 9, 240)
    with pytest.raises(ProgramLoadError, match=r"instructions\[1\]: reads value 9 before any "):
        Program.load(data)


def test_a_view_past_the_arena_is_refused():
    data = with_allocation_offset(_file("view_ops"), 9, 480)
    with pytest.raises(ProgramLoadError, match=r"values\[9\]\.storage: bytes \[480, 576\) "
                                               r"exceed arena 0"):
        Program.load(data)


def test_a_view_of_an_input_read_after_its_bytes_are_overwritten_is_refused():
    # the last call (a permute) reads value 9, the reshaped input, after instruction 18 wrote
    # value 78 over the input's planned bytes: exportir would read the caller's tensor,
    # ExecuTorch the overwritten arena
    data = with_call_arg(_file("view_ops"), 19, 0, 9)
    with pytest.raises(ProgramLoadError, match=r"values\[9\]\.val\.allocation_info: value 9 "
                                               r"reads the memory planned for an input"):
        Program.load(data)


@pytest.mark.parametrize("item", [-1, 9999])
def test_a_list_item_out_of_range_is_refused(item):
    # value 7 is the split's out list [1, 2]: its items are read before they are validated
    data = with_list_item(_file("view_ops"), 7, 0, item)
    with pytest.raises(ProgramLoadError, match=rf"values\[7\]\.items\[0\]: value index {item} "):
        Program.load(data)


# -- mutated buffers without initial value ------------------------------------------------------


def test_mutated_buffers_start_at_zero_and_keep_state_across_calls():
    data = _file("buffer_inplace")
    state = [v for v in read_pte(data).methods[0].values
             if isinstance(v, schema.Tensor) and v.initial is not None]
    assert [(v.dtype, v.sizes) for v in state] == [
        (schema.ScalarType.FLOAT, (4,)), (schema.ScalarType.LONG, ())]
    _calls(data, "buffer_inplace", calls=3)  # the buffers start as zeros in eager too


def test_a_buffer_whose_initial_value_the_file_drops_starts_at_zero():
    """ExecuTorch writes no initial value for the mutated buffer 'scratch' (ones in eager):
    exportir's runtime starts it at zero, as ExecuTorch's runtime does."""
    eager = build(BY_NAME["buffer_reassign"])[0]
    eager.scratch.zero_()
    _calls(_file("buffer_reassign"), "buffer_reassign", eager)


def test_a_buffer_sharing_its_bytes_with_another_value_is_refused():
    # the result (value 16, bytes [32, 48)) moved onto the buffer 'total' (value 0, [112, 128)):
    # the buffer's value would then depend on what the result left there
    data = with_allocation_offset(_file("buffer_inplace"), 16, 112)
    with pytest.raises(ProgramLoadError, match=r"plan: value 0 and value 16 overlap in arena 0"):
        Program.load(data)


def test_a_view_of_a_buffer_reads_its_state_when_read():
    # value 5 (buf.view(-1), read before buf.add_) is planned on the buffer's (value 0) bytes
    data = _file("buffer_view")
    values = read_pte(data).methods[0].values
    assert values[0].initial is not None and values[5].storage == schema.ViewOf(0, 0, (1,))
    method, eager = Program.load(data).method("forward"), BufferView()
    for seed in range(3):
        x = torch.randn(2, 3, generator=torch.Generator().manual_seed(seed))
        assert_same(tensors(method.execute([x])), tensors(eager(x.clone())))


def test_a_view_reaching_past_a_buffer_is_refused():
    # value 5 moved to bytes [104, 128): past the buffer's [96, 120), so no view of it
    data = with_allocation_offset(_file("buffer_view"), 5, 104)
    with pytest.raises(ProgramLoadError, match=r"plan: value 0 and value 5 overlap in arena 0"):
        Program.load(data)


# -- a kernel ExecuTorch writes but its portable runtime lacks -----------------------------------


def test_sort_values_runs_like_eager():
    data = _file("int_and_bool_ops")
    assert "aten::sort.values" in {str(op) for op in read_pte(data).methods[0].operators}
    _calls(data, "int_and_bool_ops")
