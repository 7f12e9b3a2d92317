"""The fused CPU backend's one-row linear (decode steps): ATen's ``linear`` or the blocked
layout, chosen once per blob by timing, results equal to ATen's ``linear`` up to float rounding,
and every case it does not block left to ATen."""

from __future__ import annotations

import pytest
import torch

from exportir.runtime.backends.fused_cpu.gemv import (
    BLOCK,
    BLOCKED,
    LINEAR,
    RowLinear,
    block_weight,
    blockable,
    blocked_linear,
    blocked_streams_faster,
    fastest,
)
from exportir.runtime.backends.fused_cpu.quantized import DenseWeight


@pytest.mark.parametrize("rows", [(1, 1), (1,), (1, 5), (3,)])
@pytest.mark.parametrize("bias", [False, True])
def test_blocked_linear_matches_linear(rows: tuple[int, ...], bias: bool) -> None:
    torch.manual_seed(0)
    w = torch.randn(3 * BLOCK, 24)
    b = torch.randn(3 * BLOCK) if bias else None
    x = torch.randn(*rows, 24)
    got = blocked_linear(x, block_weight(w), b)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, w, b))
    assert got.shape == (*rows, 3 * BLOCK)


def test_block_weight_layout() -> None:
    w = torch.arange(2 * BLOCK * 3, dtype=torch.float32).reshape(2 * BLOCK, 3)
    blocked = block_weight(w)
    assert blocked.shape == (2, 3, BLOCK) and blocked.is_contiguous()
    assert torch.equal(blocked[1, :, 5], w[BLOCK + 5])


def _picks(mode: str):
    """A chooser that takes ``mode``, recording the timings it was offered."""
    offered: list[dict[str, float]] = []

    def choose(timings: dict[str, float]) -> str:
        offered.append(dict(timings))
        return mode

    return choose, offered


@pytest.mark.parametrize("mode", [LINEAR, BLOCKED])
@pytest.mark.parametrize("bias", [False, True])
def test_row_linear_runs_the_chosen_layout_equal_to_linear(mode: str, bias: bool) -> None:
    torch.manual_seed(0)
    choose, offered = _picks(mode)
    op, w = RowLinear(min_bytes=0, choose=choose), torch.randn(2 * BLOCK, 8)
    b = torch.randn(2 * BLOCK) if bias else None
    for x in (torch.randn(1, 1, 8), torch.randn(1, 1, 8), torch.randn(1, 1, 8),
              torch.randn(1, 8), torch.randn(1, 8), torch.randn(4, 8), torch.randn(1, 1, 1, 8)):
        torch.testing.assert_close(op(x, w, b), torch.nn.functional.linear(x, w, b))
    assert op.mode is mode and len(offered) == 1  # decided once
    assert set(offered[0]) == {LINEAR, BLOCKED} and all(t > 0 for t in offered[0].values())
    assert (op._state[3] is None) == (mode is LINEAR)  # a blocked copy only when chosen


def test_the_default_chooser_keeps_copies_only_when_they_pay() -> None:
    assert fastest({LINEAR: 10.0, BLOCKED: 8.0}) == BLOCKED
    assert fastest({LINEAR: 10.0, BLOCKED: 9.8}) == LINEAR  # under 5%: no copies
    assert fastest({LINEAR: 5.0, BLOCKED: 6.0}) == LINEAR


def test_row_linear_refuses_a_chooser_picking_what_was_not_offered() -> None:
    op, w = RowLinear(min_bytes=0, choose=lambda timings: "transposed"), torch.randn(2 * BLOCK, 8)
    x = torch.randn(1, 8)
    op(x, w)
    with pytest.raises(ValueError, match="chooser picked 'transposed'"):
        op(x, w)


def test_row_linear_keeps_atens_linear_for_weights_that_stay_in_cache() -> None:
    """Below BLOCK_MIN_BYTES of one-row weights in the blob nothing is timed, no blocked copy is
    made and every call (any row shape) runs ATen's linear."""
    torch.manual_seed(0)
    choose, offered = _picks(BLOCKED)
    op, w, b = RowLinear(choose=choose), torch.randn(2 * BLOCK, 8), torch.randn(2 * BLOCK)
    for x in (torch.randn(1, 8), torch.randn(1, 8), torch.randn(1, 8), torch.randn(1, 1, 8),
              torch.randn(3, 8), torch.randn(1, 8)):
        torch.testing.assert_close(op(x, w, b), torch.nn.functional.linear(x, w, b))
    assert offered == [] and op.mode is LINEAR and op._state[3] is None


def test_row_linears_of_one_blob_block_by_their_total_size() -> None:
    """Two linears each under the threshold, together over it: one decision, timed once over
    both weights, and both block (the decision counts the weights every op of the group saw on
    the first call)."""
    torch.manual_seed(0)
    group: list[RowLinear] = []
    choose, offered = _picks(BLOCKED)
    ops = [RowLinear(min_bytes=3 * BLOCK * 8 * 4, choose=choose) for _ in range(2)]
    for op in ops:
        op.join(group)
    ws, x = [torch.randn(2 * BLOCK, 8) for _ in ops], torch.randn(1, 8)
    for _ in range(2):
        for op, w in zip(ops, ws):
            torch.testing.assert_close(op(x, w), torch.nn.functional.linear(x, w))
    assert all(op.mode is BLOCKED for op in ops) and len(offered) == 1
    alone = RowLinear(min_bytes=3 * BLOCK * 8 * 4, choose=choose)
    alone(x, ws[0]), alone(x, ws[0])
    assert alone.mode is LINEAR and len(offered) == 1  # under the threshold: not timed


@pytest.mark.parametrize("mode", [LINEAR, BLOCKED])
def test_row_linear_follows_a_changed_weight(mode: str) -> None:
    torch.manual_seed(0)
    op, w = RowLinear(min_bytes=0, choose=_picks(mode)[0]), torch.randn(BLOCK, 8)
    x = torch.randn(1, 8)
    op(x, w), op(x, w)
    assert op.mode is mode
    w.mul_(2)  # written in place: the copy is stale
    torch.testing.assert_close(op(x, w), torch.nn.functional.linear(x, w))
    other = torch.randn(BLOCK, 8)
    torch.testing.assert_close(op(x, other), torch.nn.functional.linear(x, other))


@pytest.mark.parametrize("w", [torch.randn(BLOCK + 1, 8), torch.randn(BLOCK, 8).double(),
                               torch.randn(2, BLOCK, 8)], ids=["rows", "float64", "3d"])
def test_row_linear_leaves_other_weights_to_aten(w: torch.Tensor) -> None:
    op = RowLinear()
    x = torch.randn(1, 8, dtype=w.dtype)
    if w.dim() != 2:
        with pytest.raises(RuntimeError):
            op(x, w), op(x, w)
        return
    assert not blockable(w)
    for _ in range(3):  # the third from __call__'s fast path
        torch.testing.assert_close(op(x, w), torch.nn.functional.linear(x, w))
    assert op.mode is LINEAR and op._state[3] is None  # no copy
    wider = torch.randn(1, 1, 8, dtype=w.dtype)  # another row shape: the general path again
    torch.testing.assert_close(op(wider, w), torch.nn.functional.linear(wider, w))


def test_row_linear_wrong_width_fails_as_aten_does() -> None:
    op, w = RowLinear(), torch.randn(BLOCK, 8)
    op(torch.randn(1, 8), w)
    with pytest.raises(RuntimeError):
        op(torch.randn(1, 7), w)


@pytest.mark.parametrize("blocked_faster", [True, False])
def test_dense_weight_keeps_one_layout_the_one_this_cpu_streams_faster(
        monkeypatch: pytest.MonkeyPatch, blocked_faster: bool) -> None:
    from exportir.runtime.backends.fused_cpu import quantized

    monkeypatch.setattr(quantized, "blocked_streams_faster", lambda: blocked_faster)
    torch.manual_seed(0)
    dense = torch.randn(2 * BLOCK, 8)
    held = DenseWeight.of(dense)
    assert (held.weight is None) == blocked_faster and (held.blocked is None) != blocked_faster
    assert held.in_features == 8
    for x in (torch.randn(1, 8), torch.randn(5, 8)):
        torch.testing.assert_close(held.linear(x), torch.nn.functional.linear(x, dense))
    odd = DenseWeight.of(torch.randn(BLOCK + 2, 8))
    assert odd.blocked is None and odd.in_features == 8


def test_the_cpu_verdict_is_measured_once_per_process() -> None:
    verdict = blocked_streams_faster()
    assert isinstance(verdict, bool) and blocked_streams_faster() is verdict
    assert blocked_streams_faster.cache_info().hits >= 1
