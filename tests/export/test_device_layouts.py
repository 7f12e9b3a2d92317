"""Layouts decided by a device's kernel, and the reshapes a re-trace re-decides after them.

- A convolution's fake output is laid out as torch.export's fake convolution lays it out (the
  CPU backend's choice: a channels-last input gives a channels-last output), checked against
  torch.export on the same modules (capture/_device_layout.py).
- ``run_decompositions()`` keeps torch's layout of flash attention's decomposition
  (``(L, N, H, E)``) and re-decides the reshapes after it as torch's re-trace does; a ``view``
  that no longer fits becomes a copy where torch's fails (capture/_redecide.py);
- an in-place op on a value a decomposition made a view is written back as torch's re-trace
  writes it back.
"""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

import exportir

CL = torch.channels_last

CONVOLUTIONS = {
    "conv1d_transposed_input": (torch.nn.Conv1d(8, 4, 1), lambda: torch.randn(2, 5, 8).transpose(1, 2)),
    "conv2d_channels_last": (torch.nn.Conv2d(8, 4, 3), lambda: torch.randn(2, 8, 5, 5).to(memory_format=CL)),
    "conv2d_grouped_batch_20": (
        torch.nn.Conv2d(8, 8, 3, groups=8),
        lambda: torch.randn(20, 8, 5, 5).to(memory_format=CL),
    ),
    "conv_transpose2d_channels_last": (
        torch.nn.ConvTranspose2d(8, 4, 3),
        lambda: torch.randn(2, 8, 5, 5).to(memory_format=CL),
    ),
    "conv3d_channels_last": (
        torch.nn.Conv3d(4, 2, 3),
        lambda: torch.randn(1, 4, 4, 4, 4).to(memory_format=torch.channels_last_3d),
    ),
}  # fmt: skip


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _first_value(graph) -> torch.Tensor:
    return next(n.meta["val"] for n in graph.nodes if n.op == "call_function")


@pytest.mark.parametrize("name", list(CONVOLUTIONS))
def test_convolution_output_layout_is_torch_exports(name: str) -> None:
    module, make = CONVOLUTIONS[name]
    x = make()
    ours = _quiet(exportir.export, module, (x,))
    theirs = _quiet(torch.export.export, module, (x,))
    want = _first_value(theirs.graph).stride()
    assert _first_value(ours.graph).stride() == want, f"{name}: kept convolution's strides"
    assert _first_value(ours.run_decompositions().graph).stride() == want, f"{name}: core"
    torch.testing.assert_close(ours.module()(x), module(x))


def test_pooling_a_channels_last_convolution_restrides_as_torch() -> None:
    """The 1x1 pooling of a channels-last convolution: ``mean`` + ``as_strided`` (restriding
    the channels-last mean), as torch's core graph has it."""
    module = torch.nn.Sequential(torch.nn.Conv2d(8, 4, 1), torch.nn.AdaptiveAvgPool2d(1))
    x = torch.randn(2, 8, 5, 5).to(memory_format=CL)
    core = _quiet(exportir.export(module, (x,)).run_decompositions)
    ops = Counter(str(n.target) for n in core.graph.nodes if n.op == "call_function")
    assert ops == Counter(["aten.convolution.default", "aten.mean.dim", "aten.as_strided.default"])
    torch.testing.assert_close(core.module()(x), module(x))


class _Attention(torch.nn.Module):
    """Self-attention whose output projection reads ``sdpa(...).transpose(1, 2)`` reshaped to
    (B, L, D) (``user_view``: then ``.view(-1, D)``, as gpt2's Conv1D does)."""

    def __init__(self, user_view: bool) -> None:
        super().__init__()
        self.qkv, self.out, self.user_view = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16), user_view

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, 2, 8).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        if self.user_view:
            return self.out(a.view(-1, d)).view(b, n, d)
        return self.out(a)


def _op_counts(graph) -> Counter:
    return Counter(str(n.target) for n in graph.nodes if n.op == "call_function")


def test_projection_after_attention_is_decided_on_torchs_layout() -> None:
    """Batch 2: after torch's attention decomposition the (B, L, D) input of the projection is
    not contiguous, so ``linear`` becomes expand + bmm + add, as in torch's core graph."""
    module, x = _Attention(user_view=False).eval(), torch.randn(2, 5, 16)
    core = _quiet(exportir.export(module, (x,)).run_decompositions)
    theirs = _quiet(torch.export.export(module, (x,)).run_decompositions)
    assert _op_counts(core.graph) == _op_counts(theirs.graph)
    assert _op_counts(core.graph)["aten.bmm.default"] == 3
    torch.testing.assert_close(core.module()(x), module(x))


def test_a_view_that_no_longer_fits_becomes_a_copy() -> None:
    """The user's ``.view(-1, D)`` of the attention output: torch's re-trace cannot view the
    decomposition's layout; exportir's copies (clone + view) and computes the same values."""
    module, x = _Attention(user_view=True).eval(), torch.randn(2, 5, 16)
    with pytest.raises(Exception, match="Cannot view a tensor"):
        _quiet(torch.export.export(module, (x,)).run_decompositions)
    core = _quiet(exportir.export(module, (x,)).run_decompositions)
    without = _quiet(exportir.export(_Attention(user_view=False), (x,)).run_decompositions)
    clones = _op_counts(core.graph)["aten.clone.default"]
    assert clones == _op_counts(without.graph)["aten.clone.default"] + 1
    torch.testing.assert_close(core.module()(x), module(x))


class _InPlaceAfterMatmul(torch.nn.Module):
    """falcon's ``mlp_output += attention_output`` after its ``input @ weight.T``."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(16, 16))

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight.T
        y += a
        return y * 2


def test_an_in_place_add_on_a_decomposed_matmul_writes_back_as_torchs() -> None:
    """``matmul`` decomposes to ``view(mm)``: torch's re-trace functionalizes the ``add_`` on
    that view (a write-back ``view`` and a regenerated one); exportir's re-runs it in place."""
    module, x, a = _InPlaceAfterMatmul(), torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    core = _quiet(exportir.export(module, (x, a)).run_decompositions)
    theirs = _quiet(torch.export.export(module, (x, a)).run_decompositions)
    assert _op_counts(core.graph) == _op_counts(theirs.graph)
    assert _op_counts(core.graph)["aten.view.default"] == 4
    torch.testing.assert_close(core.module()(x, a), module(x, a))


class _InPlaceOnAReshapedAttention(torch.nn.Module):
    """A reshape that copies on the kernel's layout and views on the decomposition's, then
    written in place while the attention output is still read."""

    def forward(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        o = F.scaled_dot_product_attention(q, q, q)
        n, h, length, e = o.shape
        y = o.permute(2, 0, 1, 3).reshape(length * n, h * e)
        y.add_(1)
        return y * 2, o.sum()


def test_an_in_place_op_never_writes_into_a_value_the_graph_still_reads() -> None:
    """The re-decided reshape is a view of the attention output, which ``o.sum()`` reads: the
    ``add_`` stays functional (torch's re-trace writes into it and its sum is off by the add)."""
    module, q = _InPlaceOnAReshapedAttention(), torch.randn(2, 3, 4, 8).transpose(1, 2)
    core = _quiet(exportir.export(module, (q,)).run_decompositions)
    for got, want in zip(core.module()(q), module(q)):
        torch.testing.assert_close(got, want)
