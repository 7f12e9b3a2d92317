"""What ``FusedCpuBackend.preprocess`` rewrites (batch norm folding, linear/matmul, layout
chains, select/unbind, constant folding, attention kept whole) and the in-place reuse rule: each
checked on the blob's op list and against eager."""

from __future__ import annotations

import json
import math
import struct

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from exportir.backends.fused_cpu import FusedCpuBackend, FusedCpuPartitioner
from exportir.backends.fused_cpu.runtime import FusedCpuBlobError, FusedCpuRuntime, decode
from exportir.dialects.backend import CompileSpec
from exportir.export import export
from exportir.program.manager import to_edge
from exportir.program.transform_and_lower import to_edge_transform_and_lower
from exportir.runtime import Program
from exportir.runtime.backends.fused_cpu.sized_conv import ConvPointwise


def _lower(model, args, transform_and_lower=True):
    ep = export(model, args)
    if transform_and_lower:
        return to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()])
    return to_edge(ep).to_backend(FusedCpuPartitioner())


def _headers(edge):
    gm = edge.exported_program().graph_module
    return [_header(m.processed_bytes) for _, m in gm.named_children()]


def _header(blob):
    _, _, length = struct.unpack_from("<4sII", blob)
    return json.loads(blob[12 : 12 + length])


def _ops(edge):
    return [op[0] for h in _headers(edge) for op in h["ops"]]


def _conv_ops(edge):
    """The ops but the channels-last conversions before oneDNN convolutions."""
    return [op for op in _ops(edge) if op != "aten.clone.default"]


def _check(model, args, edge, atol=1e-5):
    with torch.no_grad():
        expected = model(*args)
    method = Program.load(edge.to_program().buffer).method("forward")
    expected = _tuple(expected)
    for got in (method(*args), edge.exported_program().module()(*args)):
        assert len(_tuple(got)) == len(expected)
        for g, e in zip(_tuple(got), expected):
            torch.testing.assert_close(g, e, atol=atol, rtol=atol)


def _tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


class ConvBn(nn.Module):
    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=bias)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 4, 1)
        self.bn2 = nn.BatchNorm2d(4, affine=False)

    def forward(self, x):
        return self.bn2(self.conv2(F.relu(self.bn(self.conv(x)))))


def _trained(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                if m.affine:
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.5, 0.5)
    return model.eval()


@pytest.mark.parametrize("bias", [True, False])
def test_batch_norm_is_folded_into_the_convolution(bias):
    model = _trained(ConvBn(bias))
    args = (torch.randn(2, 3, 8, 8),)
    edge = _lower(model, args)
    ops = _ops(edge)
    assert not [o for o in ops if "batch_norm" in o], ops
    assert sum(o in ("aten.convolution.default", "aten.thnn_conv2d.default") for o in ops) == 2
    # the folded weights moved into the blob: the parent keeps no conv / bn weights
    kept = edge.exported_program().state_dict
    assert not [k for k in kept if "weight" in k or "running" in k or "bias" in k], kept
    _check(model, args, edge)


def test_batch_norm_stays_when_its_weights_are_not_the_backends():
    model = _trained(ConvBn(True))
    args = (torch.randn(2, 3, 8, 8),)
    ep = to_edge(export(model, args)).to_backend(FusedCpuPartitioner(own_constants=False))
    assert any("batch_norm" in o for o in _ops(ep))
    _check(model, args, ep)


def test_linear_is_one_call_on_any_rank():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    args = (torch.randn(2, 5, 8),)
    edge = _lower(model, args)
    assert _ops(edge) == ["aten.linear.default", "aten.relu.default", "aten.linear.default"]
    assert _headers(edge)[0]["inplace"] == [0, 1, 0]  # relu overwrites the dead linear result
    _check(model, args, edge)


class HandAttention(nn.Module):
    def forward(self, q, k, v):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        return torch.softmax(scores, dim=-1) @ v


def test_batched_matmul_decomposition_becomes_matmul():
    model = HandAttention()
    args = tuple(torch.randn(2, 3, 5, 4) for _ in range(3))
    edge = _lower(model, args)
    ops = _ops(edge)
    assert ops.count("aten.matmul.default") == 2
    assert not {"aten.bmm.default", "aten.expand_copy.default", "aten.clone.default"} & set(ops)
    _check(model, args, edge)


class Heads(nn.Module):
    """Layout juggling around a projection: view / unsqueeze / permute / squeeze / unbind."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 24)

    def forward(self, x):
        b, t, _ = x.shape
        y = self.proj(x).view(b, t, 3, 2, 4).unsqueeze(0).permute(3, 0, 1, 4, 2, 5).squeeze(1)
        q, k, v = y.unbind(0)
        return q * k + v, y[1:2].squeeze(0).sum()


def test_layout_chains_collapse_and_unbind_is_one_call():
    model = Heads().eval()
    args = (torch.randn(2, 3, 8),)
    edge = _lower(model, args)
    ops = _ops(edge)
    assert "aten.unsqueeze_copy.default" not in ops and "aten.squeeze_copy.dims" not in ops
    assert ops.count("aten.permute_copy.default") == 1
    assert "aten.unbind_copy.int" in ops
    _check(model, args, edge)


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("causal", torch.ones(8, 8, dtype=torch.bool).tril())

    def forward(self, x):
        t = x.shape[-1]
        return x.masked_fill(~self.causal[:t, :t], float("-inf")).softmax(-1)


def test_constants_computed_from_constants_are_folded():
    model = Masked()
    args = (torch.randn(2, 5, 5),)
    edge = _lower(model, args)
    ops = _ops(edge)
    assert not {"aten.slice_copy.Tensor", "aten.bitwise_not.default"} & set(ops), ops
    (header,) = _headers(edge)
    assert any(c[2] == [5, 5] and c[1] == "bool" for c in header["constants"])
    _check(model, args, edge)


class Sdpa(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)


def test_attention_is_kept_whole_and_claimed():
    model = Sdpa().eval()
    args = (torch.randn(2, 3, 8),)
    keep, _ = FusedCpuPartitioner().ops_to_not_decompose(None)
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default in keep
    edge = _lower(model, args)
    ops = _ops(edge)
    assert ops.count("aten._scaled_dot_product_flash_attention_for_cpu.default") == 1
    assert "aten._softmax.default" not in ops and "aten.bmm.default" not in ops
    assert len(ops) <= 8, ops
    _check(model, args, edge)
    # decomposed (plain to_edge) it still runs, as one delegate
    decomposed = _lower(model, args, transform_and_lower=False)
    assert "aten._softmax.default" in _ops(decomposed)
    _check(model, args, decomposed)



class GroupedAttention(nn.Module):
    """Grouped-query attention, heads repeated as transformers' repeat_kv does."""

    def forward(self, q, k, v):
        b, h, s, d = k.shape
        g = q.shape[1] // h
        k = (k * 2)[:, :, None].expand(b, h, g, s, d).reshape(b, h * g, s, d)
        v = (v + 1)[:, :, None].expand(b, h, g, s, d).reshape(b, h * g, s, d)
        return F.scaled_dot_product_attention(q, k, v)


def test_grouped_query_attention_reads_the_unrepeated_cache():
    model = GroupedAttention().eval()
    args = (torch.randn(1, 4, 3, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8))
    edge = _lower(model, args)
    ops = _ops(edge)
    assert ops.count("aten._scaled_dot_product_flash_attention_for_cpu.default") == 1
    assert "aten.expand_copy.default" not in ops, ops
    _check(model, args, edge)


def test_flash_attention_refuses_heads_that_do_not_divide():
    from exportir.runtime.backends.fused_cpu.kernels import KERNELS, AttentionShapeError

    flash = KERNELS["aten._scaled_dot_product_flash_attention_for_cpu.default"].fn
    q, kv = torch.randn(1, 8, 2, 4), torch.randn(1, 4, 5, 4)
    expected = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, kv.repeat_interleave(2, 1), kv.repeat_interleave(2, 1))[0]
    torch.testing.assert_close(flash(q, kv, kv)[0], expected)
    for k, v in ((torch.randn(1, 3, 5, 4),) * 2, (kv, torch.randn(1, 2, 5, 4)),
                 (torch.randn(3, 5, 4),) * 2):
        with pytest.raises(AttentionShapeError, match="heads dividing"):
            flash(q, k, v)

@pytest.mark.parametrize("odd", ["q", "k", "v", "kv"])
@pytest.mark.parametrize("groups", [1, 4])
def test_flash_attention_takes_inputs_whose_last_dim_is_strided(odd, groups):
    """torch's CPU flash kernel reads each head's rows as if the last dim were contiguous; the
    fused kernel copies a query / key / value whose last dim is not (they came out wrong by
    up to 4.3 before, against the same inputs made contiguous)."""
    from exportir.runtime.backends.fused_cpu.kernels import KERNELS

    flash = KERNELS["aten._scaled_dot_product_flash_attention_for_cpu.default"].fn

    def strided(b, h, s, d):  # [B, H, S, D] with S innermost (a convolution over time)
        return torch.randn(b, h, d, s).transpose(2, 3)

    q = strided(2, 4 * groups, 8, 16) if "q" in odd else torch.randn(2, 4 * groups, 8, 16)
    k = strided(2, 4, 8, 16) if "k" in odd else torch.randn(2, 4, 8, 16)
    v = strided(2, 4, 8, 16) if "v" in odd else torch.randn(2, 4, 8, 16)
    mask = torch.randn(2, 4 * groups, 8, 8)
    expected = F.scaled_dot_product_attention(
        q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), attn_mask=mask)
    torch.testing.assert_close(flash(q, k, v, attn_mask=mask)[0], expected, rtol=1e-5, atol=1e-5)


class ConvKeyAttention(nn.Module):
    """Grouped-query attention over keys and values from a convolution over time (the
    short-convolution attention of transformers' Inkling): after repeat_kv is skipped, the
    flash kernel gets keys laid out [B, H, S, D] with S innermost."""

    def __init__(self, heads=4, kv_heads=2, dim=8):
        super().__init__()
        self.h, self.kv, self.d = heads, kv_heads, dim
        self.q = nn.Linear(16, heads * dim)
        self.k_proj, self.v_proj = nn.Linear(16, kv_heads * dim), nn.Linear(16, kv_heads * dim)
        self.k = nn.Conv1d(kv_heads * dim, kv_heads * dim, 3, padding=1, groups=kv_heads * dim)
        self.v = nn.Conv1d(kv_heads * dim, kv_heads * dim, 3, padding=1, groups=kv_heads * dim)
        self.register_buffer("mask", torch.randn(1, 1, 8, 8))

    def forward(self, x):
        b, s, _ = x.shape
        g = self.h // self.kv
        q = self.q(x).view(b, s, self.h, self.d).transpose(1, 2)
        k, v = self.k_proj(x), self.v_proj(x)
        # the convolution's [B, C, S] transposed back and added to the residual: the sum keeps
        # the transposed layout (C innermost no more), as Inkling's short convolution does
        k = (self.k(k.transpose(1, 2)).transpose(1, 2) + k).view(b, s, self.kv, self.d).transpose(1, 2)
        v = (self.v(v.transpose(1, 2)).transpose(1, 2) + v).view(b, s, self.kv, self.d).transpose(1, 2)
        k = k[:, :, None].expand(b, self.kv, g, s, self.d).reshape(b, self.h, s, self.d)
        v = v[:, :, None].expand(b, self.kv, g, s, self.d).reshape(b, self.h, s, self.d)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask[..., :s, :s])


def test_grouped_attention_over_convolved_keys_matches_eager():
    model = ConvKeyAttention().eval()
    args = (torch.randn(2, 8, 16),)
    edge = _lower(model, args)
    assert _ops(edge).count("aten._scaled_dot_product_flash_attention_for_cpu.default") == 1
    _check(model, args, edge)


def test_optimize_spec_off_writes_the_edge_ops():
    model = _trained(ConvBn(True))
    args = (torch.randn(1, 3, 6, 6),)
    part = FusedCpuPartitioner([CompileSpec("optimize", b"0")])
    edge = to_edge(export(model, args)).to_backend(part)
    assert any("batch_norm" in o for o in _ops(edge))
    _check(model, args, edge)


# ------------------------------------------------------------------------------ in-place reuse


class Aliased(nn.Module):
    """relu(a) while views of ``a`` are still read (and one is an output)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 6)

    def forward(self, x):
        a = self.fc(x)
        b = a.view(2, 3, 2).permute(0, 2, 1)
        c = torch.relu(a)
        d = c.view(2, 2, 3) + b.sum()
        return d, a.view(12)


def test_inplace_never_overwrites_a_value_a_live_view_shares():
    model = Aliased().eval()
    args = (torch.randn(2, 4),)
    edge = _lower(model, args)
    (header,) = _headers(edge)
    names = [op[0] for op in header["ops"]]
    relu = names.index("aten.relu.default")
    assert header["inplace"][relu] == 0  # a's views are read later (one is an output)
    _check(model, args, edge)


def test_inplace_on_an_input_is_refused_at_load():
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    ep = to_edge(export(model, (torch.randn(2, 4),))).exported_program()
    blob = FusedCpuBackend.preprocess(ep, []).processed_bytes
    header = _header(blob)
    assert header["inplace"] == [0, 1]
    # ask for the linear (whose first argument is the delegate input) to run in place
    header["ops"][0][0] = "aten.relu.default"
    header["ops"][0][1] = header["ops"][0][1][:1]
    header["inplace"][0] = 1
    text = json.dumps(header).encode()
    head = struct.pack("<4sII", b"XFC1", 2, len(text)) + text
    data = blob[-(-(12 + struct.unpack_from("<4sII", blob)[2]) // 16) * 16 :]
    with pytest.raises(FusedCpuBlobError, match=r"inplace\[0\].*input or constant"):
        decode(head + b"\0" * (-len(head) % 16) + data)


def test_outputs_never_share_memory_with_inputs_or_constants():
    class PassThrough(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.arange(6.0))

        def forward(self, x):
            return x.view(6) + 1, self.table.view(2, 3), x.permute(1, 0)

    model = PassThrough()
    x = torch.randn(2, 3)
    edge = to_edge(export(model, (x,))).to_backend(FusedCpuPartitioner(own_constants=True))
    outs = edge.exported_program().module()(x)
    table_out, x_out = outs[1], outs[2]
    table_out.add_(100)
    x_out.add_(100)
    torch.testing.assert_close(edge.exported_program().module()(x)[1], model.table.view(2, 3))
    assert float(x.abs().max()) < 100
    assert isinstance(FusedCpuRuntime(), FusedCpuRuntime)


# ------------------------------------------------------------------------------ layout, merging


class MhaLayout(nn.Module):
    """nn.MultiheadAttention's head split written out: reshape to [L, N * H, d], transpose,
    reshape to [N, H, L, d] -- one reshape and one permute."""

    def forward(self, x):  # x: [L, N, E]
        q = x.contiguous().view(5, 2 * 2, 4).transpose(0, 1).view(2, 2, 5, 4)
        return q * 2


def test_view_chains_are_followed_on_atoms():
    model = MhaLayout()
    args = (torch.randn(5, 2, 8),)
    edge = _lower(model, args)
    ops = _ops(edge)
    assert ops.count("aten.view_copy.default") + ops.count("aten.permute_copy.default") <= 2, ops
    assert "aten.clone.default" not in ops
    _check(model, args, edge)


class ProjectHeads(nn.Module):
    """batch_first transposes around projections (MultiheadAttention's in/out projections)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, x):  # [N, L, E]
        h = self.inp(x.transpose(0, 1)).view(5, 2, 2, 4).permute(1, 2, 0, 3)  # [N, H, L, d]
        h = torch.tanh(h).permute(2, 0, 1, 3).reshape(10, 8)
        return self.out(h).view(5, 2, 8).transpose(0, 1) + x


def test_permutes_cross_linears_to_join_layout_ops():
    model = ProjectHeads().eval()
    args = (torch.randn(2, 5, 8),)
    edge = _lower(model, args)
    ops = _ops(edge)
    layout = [o for o in ops if o in ("aten.view_copy.default", "aten.permute_copy.default")]
    assert len(layout) <= 4, ops
    _check(model, args, edge)


class TwoBranches(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3)
        self.b = nn.Linear(6, 6)

    def forward(self, x, y):
        return torch.relu(self.a(x)), torch.tanh(self.b(y))


def test_independent_branches_are_one_delegate():
    model = TwoBranches().eval()
    args = (torch.randn(1, 3, 6, 6), torch.randn(2, 6))
    edge = _lower(model, args)
    assert len(_headers(edge)) == 1
    _check(model, args, edge)


def test_branches_joined_through_the_runtime_stay_apart():
    class Through(nn.Module):
        def forward(self, x):
            a = torch.relu(x)
            b = torch.round(a)  # not claimed: runs between the two partitions
            return torch.tanh(b) + a

    model = Through()
    args = (torch.randn(3, 4),)
    edge = _lower(model, args)
    assert len(_headers(edge)) == 2
    _check(model, args, edge)


def test_group_norm_and_silu_are_single_calls():
    model = nn.Sequential(nn.Conv1d(4, 6, 1), nn.GroupNorm(2, 6), nn.SiLU()).eval()
    args = (torch.randn(2, 4, 7),)
    edge = _lower(model, args)
    ops = _ops(edge)
    assert ops[-2:] == ["aten.group_norm.default", "aten.silu.default"], ops
    _check(model, args, edge)


class SmallConvs(nn.Module):
    def __init__(self):
        super().__init__()
        self.c2 = nn.Conv2d(3, 4, 3, padding=1)
        self.c1 = nn.Conv1d(3, 5, 3, stride=2, padding=1)
        self.dw = nn.Conv1d(3, 3, 3, padding=1, groups=3)
        self.t2 = nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1)
        self.t1 = nn.ConvTranspose1d(3, 2, 4, stride=2)
        self.big = nn.Conv2d(3, 64, 3, padding=1)

    def forward(self, img, seq, large):
        return (
            self.c2(img),
            self.c1(seq),
            torch.relu(self.dw(seq)),
            self.t2(img),
            self.t1(seq),
            self.big(large),
        )


def test_small_convolutions_use_the_plain_kernels():
    model = SmallConvs().eval()
    args = (torch.randn(2, 3, 6, 6), torch.randn(2, 3, 9), torch.randn(1, 3, 96, 96))
    edge = _lower(model, args)
    ops = _ops(edge)
    assert ops.count("aten.thnn_conv2d.default") == 2
    assert ops.count("aten.slow_conv_transpose2d.default") == 2
    assert "aten.unfold_copy.default" in ops  # the depthwise one
    assert ops.count("mkldnn._convolution_pointwise.default") == 1  # the large one: oneDNN, weight owned
    (header,) = _headers(edge)
    names = [op[0] for op in header["ops"]]
    # the unfolded windows overlap: the multiply by the filter never runs in place on them
    mul = names.index("aten.mul.Tensor")
    assert header["inplace"][mul] == 0
    _check(model, args, edge)


class Residual(nn.Module):
    """A ResNet basic block's shape: conv-bn-relu, conv-bn, + identity, relu."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + x)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_large_convolutions_run_on_onednn_with_relu_and_residual_add_inside():
    model = _trained(Residual())
    args = (torch.randn(1, 32, 32, 32),)
    edge = _lower(model, args)
    assert _conv_ops(edge) == [
        "mkldnn._convolution_pointwise.default",
        "mkldnn._convolution_pointwise.binary",
    ]
    (child,) = [m for _, m in edge.exported_program().graph_module.named_children()]
    program = decode(child.processed_bytes)
    convs = [v for v in program.fn.__globals__.values() if isinstance(v, ConvPointwise)]
    assert len(convs) == 2 and all(c.weight.packed is None for c in convs)  # packed by a call
    _check(model, args, edge, atol=1e-4)
    program.fn(*args)
    assert all(c.weight.packed.is_mkldnn for c in convs)  # for the input's shape


class ValidPadding(nn.Module):
    """``padding="valid"`` (SigLIP's patch embedding) exports ``padding=[0]``: one element that
    ``aten.convolution`` repeats for every spatial dim."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, 8, 4, stride=4, padding="valid")
        self.seq = nn.Conv1d(3, 4, 3, padding="valid")
        self.big = nn.Conv2d(3, 64, 3, padding="valid")

    def forward(self, img, seq, large):
        return self.patch(img), self.seq(seq), self.big(large)


def test_one_element_convolution_parameters_are_repeated_per_dim():
    model = ValidPadding().eval()
    args = (torch.randn(2, 3, 8, 8), torch.randn(2, 3, 9), torch.randn(1, 3, 96, 96))
    edge = _lower(model, args)
    ops = _ops(edge)
    assert ops.count("aten.thnn_conv2d.default") == 2
    assert ops.count("mkldnn._convolution_pointwise.default") == 1  # the large one (weight owned, packed)
    _check(model, args, edge, atol=1e-4)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_one_element_convolution_parameters_reach_onednn_per_dim():
    model = _trained(
        nn.Sequential(nn.Conv2d(32, 32, 3, padding="valid"), nn.BatchNorm2d(32), nn.ReLU())
    )
    args = (torch.randn(1, 32, 32, 32),)
    edge = _lower(model, args)
    assert _conv_ops(edge) == ["mkldnn._convolution_pointwise.default"]
    (header,) = _headers(edge)
    assert header["ops"][-1][1][3:6] == [[0, 0], [1, 1], [1, 1]]  # padding, stride, dilation
    _check(model, args, edge, atol=1e-4)


class BroadcastFirstRow(nn.Module):
    """``sin(x[0]) * x``: the mul's first argument is (4,), its result (batch, 4). Asking
    whether it could run in place compared the shapes as tuples, i.e. 4 with the symbolic
    batch first (OLMo-2's norm weight times its input: ``Ne(s0, 16)``): a guard that narrowed
    the batch the program accepts (the plan bounded a batch of 16 by 15)."""

    def forward(self, x):
        return torch.sin(x[0]) * x


def test_lowering_a_dynamic_program_decides_no_symbolic_size():
    from exportir import Dim

    model = BroadcastFirstRow()
    x = torch.randn(3, 4)
    ep = export(model, (x,), dynamic_shapes=({0: Dim("batch", min=1, max=4)},))
    env = next(iter(ep.graph.find_nodes(op="placeholder"))).meta["val"].shape[0].node.shape_env
    guards = list(env.guards)
    edge = to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()])
    assert env.guards == guards
    method = Program.load(edge.to_program().buffer).method("forward")
    for batch in (1, 4):
        inp = torch.randn(batch, 4)
        torch.testing.assert_close(method(inp), model(inp))


class _TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)) * 2)


def test_a_dynamic_length_flatten_joins_the_delegate():
    """The flatten before each linear of a [1, T, K] input has the symbolic size T; the
    partitioner writes it as -1, so the whole model is one delegate (it was three, split at
    each view the runtime had to run) and runs at every length."""
    from exportir import Dim

    torch.manual_seed(0)
    model = _TwoLinears().eval()
    ep = export(model, (torch.randn(1, 5, 16),), dynamic_shapes=({1: Dim("t", min=2, max=64)},))
    edge = to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()])
    graph = edge.exported_program().graph
    top = [n.target.__name__ if hasattr(n.target, "__name__") else str(n.target)
           for n in graph.nodes if n.op == "call_function"]
    assert sum("call_delegate" in t for t in top) == 1, top
    assert not [t for t in top if "view" in t], top
    method = Program.load(edge.to_program().buffer).method("forward")
    for t in (2, 17, 64):
        x = torch.randn(1, t, 16)
        torch.testing.assert_close(method(x), model(x))


class InvertedResidual(nn.Module):
    """A MobileNetV2 block at a small size (the depthwise convolution is below
    ``SMALL_CONV_MACS``), then an EfficientNet squeeze-excite on its output."""

    def __init__(self, c=32, hidden=96):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(c, hidden, 1, bias=False), nn.BatchNorm2d(hidden),
                                    nn.ReLU6())  # fmt: skip
        self.dw = nn.Sequential(nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden, bias=False),
                                nn.BatchNorm2d(hidden), nn.ReLU6())  # fmt: skip
        self.project = nn.Sequential(nn.Conv2d(hidden, c, 1, bias=False), nn.BatchNorm2d(c))
        self.reduce = nn.Conv2d(c, 4, 1)
        self.restore = nn.Conv2d(4, c, 1)

    def forward(self, x):
        y = x + self.project(self.dw(self.expand(x)))
        scale = self.restore(F.silu(self.reduce(y.mean((2, 3), keepdim=True))))
        return y * torch.sigmoid(scale)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_depthwise_and_squeeze_excite_convolutions_pick_their_kernels():
    model = _trained(InvertedResidual())
    args = (torch.randn(1, 32, 24, 24),)
    edge = _lower(model, args)
    (header,) = _headers(edge)
    ops = [op[0] for op in header["ops"]]
    # every convolution of the block on oneDNN, the ReLU6s as post-ops (the depthwise one too,
    # below SMALL_CONV_MACS), the residual add inside the projection
    convs = [op for op in header["ops"] if op[0].startswith("mkldnn._convolution_pointwise")]
    assert [c[0] for c in convs] == ["mkldnn._convolution_pointwise.default"] * 2 + [
        "mkldnn._convolution_pointwise.binary"
    ]
    assert convs[1][1][6] == 96  # groups: the depthwise one
    assert [c[1][7] for c in convs[:2]] == ["hardtanh", "hardtanh"]
    assert "aten.hardtanh.default" not in ops
    # the squeeze-excite 1x1 convolutions of a 1x1 image: linears of weights reshaped once
    assert ops.count("aten.linear.default") == 2
    assert "aten.convolution.default" not in ops and "aten.thnn_conv2d.default" not in ops
    # every weight owned by the blob (packed or reshaped once); the image and the two
    # squeeze-excite biases (used as they are) come in
    assert len(header["inputs"]) == 3
    # channels-last once: the later convolutions read oneDNN's NHWC results
    assert ops.count("aten.clone.default") == 1
    _check(model, args, edge, atol=1e-4)
