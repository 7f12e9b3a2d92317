"""The fused CPU backend's decode-step rewrites (backends/fused_cpu/llm.py) and the per-op int8
kernel (DynamicRowLinear): fewer kernel calls, the same values."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from exportir.backends.fused_cpu import FusedCpuPartitioner
from exportir.backends.fused_cpu.runtime import decode
from exportir.export import export
from exportir.program.transform_and_lower import to_edge_transform_and_lower
from exportir.quantization import int8_dynamic_activation_int8_weight, quantize_
from exportir.runtime import Program
from exportir.runtime.backends.fused_cpu import dynamic_int8 as D

needs_fbgemm = pytest.mark.skipif(not D.fbgemm_available(), reason="needs fbgemm (x86 torch)")
EPS = torch.finfo(torch.float32).eps


class Block(nn.Module):
    """q / k / v projections of one input, a SwiGLU's gate and up projections of another."""

    def __init__(self, dim: int = 32, hidden: int = 48, bias: bool = False) -> None:
        super().__init__()
        self.q = nn.Linear(dim, dim, bias=bias)
        self.k = nn.Linear(dim, dim // 2, bias=bias)
        self.v = nn.Linear(dim, dim // 2, bias=bias)
        self.gate = nn.Linear(dim, hidden, bias=bias)
        self.up = nn.Linear(dim, hidden, bias=bias)
        self.down = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        h = torch.cat([q, k * v.sigmoid()], -1).relu()[..., :32]
        return self.down(F.silu(self.gate(h)) * self.up(h))


def _blob_ops(edge) -> list[str]:
    gm = edge.exported_program().graph_module
    return [row.name for _, m in gm.named_children() if hasattr(m, "processed_bytes")
            for row in decode(m.processed_bytes).ops]


@needs_fbgemm
@pytest.mark.parametrize(("bias", "calls"), [(False, 3), (True, 6)])
def test_int8_linears_sharing_an_input_are_one_call(bias, calls):
    """q / k / v become one int8 linear and a split, gate / up another: 6 linears -> 3 calls,
    the program equal to the quantized model (the pattern) to float rounding. Biases handed
    to the delegate at run time (parameters) are not concatenated: those linears stay apart."""
    torch.manual_seed(0)
    model = quantize_(Block(bias=bias).eval(), int8_dynamic_activation_int8_weight())
    x = torch.randn(1, 1, 32)
    edge = to_edge_transform_and_lower(export(model, (x,)),
                                       partitioner=[FusedCpuPartitioner()])
    ops = _blob_ops(edge)
    assert ops.count(D.LINEAR_DYNAMIC_INT8) == calls, ops
    assert ops.count("aten.split_with_sizes_copy.default") == (6 - calls) // 3 * 2, ops
    method = Program.load(edge.to_program().buffer).method("forward")
    for scale in (1.0, 30.0, 1e-3):
        x = torch.randn(1, 1, 32) * scale
        with torch.no_grad():
            want = model(x)
        torch.testing.assert_close(method(x), want, rtol=1e-5,
                                   atol=1e-5 * want.abs().max().item())


@needs_fbgemm
def test_concatenated_int8_weights_give_the_same_bits(exact_cpu):
    """The merged linear's outputs are bit for bit the separate linears' (same qparams, exact
    int32 sums, each channel scaled on its own), at one row and at several."""
    g = torch.Generator().manual_seed(3)
    ws = [torch.randint(-127, 128, (n, 40), dtype=torch.int8, generator=g) for n in (24, 8, 16)]
    ss = [torch.rand(w.shape[0], generator=g) * 0.02 + 1e-3 for w in ws]
    merged = D.pack(torch.cat(ws), torch.cat(ss), None)
    row = D.DynamicRowLinear(merged, EPS, "none")
    for shape in ((1, 1, 40), (5, 40)):
        x = torch.randn(*shape, generator=g) * 3
        parts = row(x, None).split([24, 8, 16], -1)
        for w, s, got in zip(ws, ss, parts):
            assert torch.equal(got, D.linear_dynamic_int8(x, D.pack(w, s, None), s, None, EPS,
                                                          "none"))


@needs_fbgemm
@pytest.mark.parametrize("cpu", ["this_cpu", "saturating_cpu"])
def test_row_kernel_takes_the_general_path_for_what_it_does_not_handle(cpu, request):
    """Non-contiguous, run-time bias, non-finite input: the general kernel (same values); on a
    CPU whose int8 products saturate, every input."""
    if cpu == "saturating_cpu":
        request.getfixturevalue("saturating_cpu")
    g = torch.Generator().manual_seed(4)
    w = torch.randint(-127, 128, (16, 32), dtype=torch.int8, generator=g)
    s = torch.rand(16, generator=g) * 0.02 + 1e-3
    packed = D.pack(w, s, None)
    row = D.DynamicRowLinear(packed, EPS, "relu")
    x = torch.randn(32, 3, generator=g).t()  # [3, 32], not contiguous
    bias = torch.randn(16, generator=g)
    want = D.linear_dynamic_int8(x.contiguous(), packed, s, bias, EPS, "relu")
    # float32 (a saturating CPU's path) reads a transposed input in another order: rounding
    torch.testing.assert_close(row(x, bias), want, rtol=1e-6, atol=1e-6)
    x = torch.randn(2, 32, generator=g)
    x[1, 0] = float("inf")
    assert row(x, None).shape == (2, 16)
    with pytest.raises(D.DynamicInt8Error, match="input must be float32"):
        row(torch.randn(2, 31), None)


class Rotary(nn.Module):
    """Rotary embeddings of q and k at one position (the rotate-half form), cos / sin gathered
    from tables as a Llama does."""

    def __init__(self, head_dim: int = 16, max_seq: int = 8, slices: bool = False) -> None:
        super().__init__()
        self.slices = slices
        angles = torch.outer(torch.arange(max_seq).float(), torch.rand(head_dim // 2) + 0.1)
        self.register_buffer("cos", torch.cat([angles, angles], -1).cos())
        self.register_buffer("sin", torch.cat([angles, angles], -1).sin())

    def _rotate_half(self, x: torch.Tensor) -> torch.Tensor:
        if self.slices:  # transformers' form
            a, b = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        else:
            a, b = x.chunk(2, dim=-1)
        return torch.cat((-b, a), dim=-1)

    def forward(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[pos], self.sin[pos]
        q = q * cos + self._rotate_half(q) * sin
        k = k * cos + self._rotate_half(k) * sin
        return q.sum(1, keepdim=True) + k


@pytest.mark.parametrize("slices", [False, True], ids=["chunk", "slices"])
def test_rotate_half_is_a_roll_with_a_signed_sin_bit_for_bit(slices):
    """split (or two slices) / neg / cat / mul becomes roll / mul; the signed ``sin`` is made
    once for q and k; the values are the eager ones exactly (negation is exact)."""
    torch.manual_seed(0)
    model = Rotary(slices=slices).eval()
    args = (torch.randn(1, 4, 1, 16) * 3, torch.randn(1, 2, 1, 16), torch.tensor([5]))
    edge = to_edge_transform_and_lower(export(model, args), partitioner=[FusedCpuPartitioner()])
    ops = _blob_ops(edge)
    assert ops.count("aten.roll.default") == 2, ops
    assert not {"aten.neg.default", "aten.cat.default", "aten.slice_copy.Tensor"} & set(ops), ops
    assert ops.count("aten.mul.Tensor") == 5, ops  # 2 x (cos, rolled * signed sin) + the sign
    method = Program.load(edge.to_program().buffer).method("forward")
    for pos in range(8):
        args = (torch.randn(1, 4, 1, 16) * 3, torch.randn(1, 2, 1, 16), torch.tensor([pos]))
        with torch.no_grad():
            assert torch.equal(method(*args), model(*args))


class TwoMasks(nn.Module):
    """Two layers each making the attention mask from the same positions."""

    def forward(self, scores: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        visible = torch.arange(6)[None, :] <= pos[:, None]
        a = scores + torch.where(visible, 0.0, float("-inf"))
        b = a.softmax(-1) + torch.where(visible, 0.0, float("-inf"))
        return b


def test_a_mask_made_twice_is_made_once():
    args = (torch.randn(2, 6), torch.tensor([2, 4]))
    edge = to_edge_transform_and_lower(export(TwoMasks(), args),
                                       partitioner=[FusedCpuPartitioner()])
    ops = _blob_ops(edge)
    assert ops.count("aten.where.self") == 1, ops
    method = Program.load(edge.to_program().buffer).method("forward")
    assert torch.equal(method(*args), TwoMasks()(*args))


@pytest.mark.parametrize(
    ("index", "values"),
    [
        ([2], (1, 2, 1, 3)),  # one position: index_copy
        ([1, 3], (1, 2, 2, 3)),
        ([-1], (1, 2, 1, 3)),  # negative: index_put wraps it, index_copy refuses
        ([1], (3,)),  # broadcast values
        (torch.tensor([1], dtype=torch.int32), (1, 2, 1, 3)),
        (torch.tensor(1), (1, 2, 3)),  # a 0-dim index drops the dim
    ],
)
def test_cache_write_at_one_dim_computes_index_put(index, values):
    """The KV-cache write's kernel (index_copy where it computes the same) equals index_put on
    every form index_put takes, errors included."""
    from exportir.runtime.backends.fused_cpu.kernels import KERNELS, Ref, bind

    call = bind("aten.index_put.default", (Ref(0), [None, None, Ref(1)], Ref(2)), {})
    assert call.args == (Ref(0), Ref(1), Ref(2))  # bound to the one-dim form
    x = torch.randn(1, 2, 5, 3)
    index = index if isinstance(index, torch.Tensor) else torch.tensor(index)
    v = torch.randn(values)
    want = KERNELS["aten.index_put.default"].fn(x, [None, None, index], v)
    assert torch.equal(call.fn(x, index, v), want)
    for bad_index, bad_v in ((torch.tensor([5]), v), (index, v.double())):
        with pytest.raises((IndexError, RuntimeError)) as want_error:
            torch.ops.aten.index_put.default(x, [None, None, bad_index], bad_v)
        with pytest.raises(type(want_error.value), match=re.escape(str(want_error.value))):
            call.fn(x, bad_index, bad_v)


def _module(folder: str, name: str):
    """Module ``name`` from ``folder`` of the repository (the benchmark's model, tests/llm's
    eager reference)."""
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def _mini_llama() -> nn.Module:
    """The benchmark's plain-module Llama (RMSNorm, rotary, grouped-query attention with its
    cache in buffers, SwiGLU: every pattern the rewrites look for), small."""
    torch.manual_seed(0)
    model = _module("benchmarks", "_mini_llama").MiniLlama(
        vocab=64, dim=32, hidden=48, layers=2, heads=4, kv_heads=2, max_seq=24)
    return model.eval().requires_grad_(False)


@pytest.mark.slow  # ~13 s: two LLM programs exported and lowered
@pytest.mark.parametrize("scheme", ["fp32", pytest.param("8da8w", marks=needs_fbgemm)])
def test_mini_llama_decodes_the_eager_tokens(scheme):
    """Prefill + greedy decode on the fused road gives the tokens the model gives eagerly; the
    decode step is one delegate with the rewrites applied."""
    from exportir.program.llm import export_llm
    from exportir.runtime import generate

    model = _mini_llama()
    if scheme == "8da8w":
        quantize_(model, int8_dynamic_activation_int8_weight())
    pm = export_llm(model, max_seq_len=24, max_prefill=8, token_arg=None, position_arg=None,
                    partitioner=[FusedCpuPartitioner()])
    program = Program.load(pm.buffer)
    prompt = [5, 9, 33, 2, 17]
    want = _module("tests/llm", "toy_lm").eager_greedy(model, prompt, 12)
    assert list(generate(program, prompt, 12, stop_at_eos=False)) == want


def test_one_row_weights_are_laid_out_by_the_first_call():
    """A decode delegate's one-row linears choose and lay out their weights (delegate inputs:
    the method's constants) during the first call, not the second: a decode loop's steady state
    starts at its second token. 8 MiB of weights (the blocking threshold: all three layouts
    timed), results equal to eager."""
    from exportir.runtime.backends.fused_cpu import FusedCpuRuntime
    from exportir.runtime.backends.fused_cpu.gemv import BLOCK_MIN_BYTES, RowLinear

    torch.manual_seed(0)
    model = nn.Linear(1024, BLOCK_MIN_BYTES // 4096, bias=False).eval().requires_grad_(False)
    x = torch.randn(1, 1, 1024)
    edge = to_edge_transform_and_lower(
        export(model, (x,)), partitioner=[FusedCpuPartitioner(own_constants=False)])
    gm = edge.exported_program().graph_module
    (blob,) = [m.processed_bytes for _, m in gm.named_children() if hasattr(m, "processed_bytes")]
    runtime = FusedCpuRuntime()
    handle = runtime.init(blob, [])
    (op,) = [f for f in handle.fn.__globals__.values() if isinstance(f, RowLinear)]
    assert len(handle.primes) == 1 and op.mode is None
    (got,) = runtime.execute(handle, [model.weight, x])  # parameters come first
    assert op.mode is not None and not handle.primes  # chosen by the first call
    torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
