"""The export corpus: small models that ``exportir.export`` must capture like ``torch.export``.

Each :class:`Entry` has a ``name``, a ``factory() -> (module, args, kwargs)`` and ``tags``.
:func:`build` seeds torch before calling the factory, so two builds of one entry have identical
parameters and inputs. Models are tiny on purpose: the whole export suite (ours and torch's
export, both decompositions, several runs per model) must stay fast.

Tags say what an entry exercises, so a test can pick a subset:

- ``mutation``: forward updates buffers (``BUFFER_MUTATION`` outputs).
- ``input_mutation``: forward mutates a user input in place (``USER_INPUT_MUTATION``).
- ``train``: the module is in training mode.
- ``custom_op``: uses an operator defined in this file with ``torch.library.custom_op``.
- ``pytree``: non-tensor containers or registered classes in the inputs/outputs.
- ``dataclass``: a registered dataclass input.
- ``constant``: a plain tensor attribute lifted as ``CONSTANT_TENSOR``.
- ``static``: Python primitives among the inputs, burned into the graph.
- ``rnn``, ``attention``, ``conv``, ``norm``: model families.

Nothing here imports ``exportir.export``: the corpus must be importable while export is
incomplete. Registration with ``exportir.register_dataclass`` happens lazily (see
:func:`register_dataclasses`).
"""

from __future__ import annotations

import itertools
import math
from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Case = tuple[nn.Module, tuple, dict]

# The custom-op namespace private to the test suite (nobody else registers ops here).
CUSTOM_NS = "exportir_test"


@dataclass(frozen=True)
class Entry:
    name: str
    factory: Callable[[], Case]
    tags: frozenset[str] = field(default_factory=frozenset)


def build(entry: Entry, seed: int = 0) -> Case:
    """A fresh ``(module, args, kwargs)`` for ``entry``; deterministic for a given seed."""
    register_dataclasses()
    torch.manual_seed(seed)
    return entry.factory()


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


# --------------------------------------------------------------------------------------------
# Custom operators (test-private namespace).


@torch.library.custom_op(f"{CUSTOM_NS}::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


@scaled_tanh.register_fake
def _scaled_tanh_fake(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op(f"{CUSTOM_NS}::split_stats", mutates_args=())
def split_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.mean(dim=-1), x.amax(dim=-1)


@split_stats.register_fake
def _split_stats_fake(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    shape = x.shape[:-1]
    return x.new_empty(shape), x.new_empty(shape)


# --------------------------------------------------------------------------------------------
# Pytree types.

Pair = namedtuple("Pair", ["left", "right"])


@dataclass
class TorchRegisteredInput:
    """Registered only with ``torch.export.register_dataclass`` (exportir must duck-type it)."""

    features: torch.Tensor
    bias: torch.Tensor
    scale: float = 2.0


@dataclass
class BothRegisteredInput:
    """Registered with both ``torch.export.register_dataclass`` and
    ``exportir.register_dataclass`` (when exportir provides it)."""

    tokens: torch.Tensor
    mask: torch.Tensor


_REGISTERED: set[str] = set()
_PAIR_NAME = "exportir_test.Pair"
_TORCH_ONLY_NAME = "exportir_test.TorchRegisteredInput"
_BOTH_NAME = "exportir_test.BothRegisteredInput"


def register_dataclasses() -> None:
    """Register the corpus dataclasses (idempotent). ``exportir.register_dataclass`` is used
    only if the package provides it; a missing or broken exportir does not stop torch's."""
    if "torch" not in _REGISTERED:
        import torch.export
        import torch.utils._pytree as torch_pytree

        torch.export.register_dataclass(TorchRegisteredInput, serialized_type_name=_TORCH_ONLY_NAME)
        torch.export.register_dataclass(BothRegisteredInput, serialized_type_name=_BOTH_NAME)
        torch_pytree._register_namedtuple(Pair, serialized_type_name=_PAIR_NAME)
        _REGISTERED.add("torch")
    try:
        import exportir
        import exportir.pytree
    except Exception:  # noqa: BLE001 - exportir may be mid-rewrite; torch's still works
        return
    if "exportir.pytree" not in _REGISTERED:
        exportir.pytree.register_namedtuple(Pair, serialized_type_name=_PAIR_NAME)
        _REGISTERED.add("exportir.pytree")
    register = getattr(exportir, "register_dataclass", None) or exportir.pytree.register_dataclass
    if "exportir" not in _REGISTERED:
        register(BothRegisteredInput, serialized_type_name=_BOTH_NAME)
        _REGISTERED.add("exportir")


# --------------------------------------------------------------------------------------------
# MLPs.


class MLP(nn.Module):
    def __init__(self, sizes=(8, 16, 4), act=nn.ReLU):
        super().__init__()
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(itertools.pairwise(sizes)):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(act())
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class MLPNormDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(self.drop(F.gelu(self.norm(self.fc1(x)))))


class MLPKwargs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x, *, scale, offset=None):
        y = self.fc(x) * scale
        if offset is not None:
            y = y + offset
        return torch.sigmoid(y)


class TiedWeights(nn.Module):
    """One parameter used by two modules: lifted once."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.proj = nn.Linear(6, 11, bias=False)
        self.proj.weight = self.embed.weight

    def forward(self, tokens):
        return self.proj(torch.tanh(self.embed(tokens)))


# --------------------------------------------------------------------------------------------
# Convolutional nets.


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 8, 3, stride=2)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 1 * 1, 5)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.pool(F.relu(self.bn2(self.conv2(x))))
        return self.fc(torch.flatten(x, 1))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


class TinyResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.layer1 = BasicBlock(8, 8)
        self.layer2 = BasicBlock(8, 16, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _randomize_bn_stats(module: nn.Module) -> nn.Module:
    """Give every batchnorm non-trivial running stats so eval mode is not an identity."""
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    return module


class ConvTransposeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)
        self.up1d = nn.ConvTranspose1d(3, 2, 4, stride=2)

    def forward(self, x, seq):
        return torch.relu(self.up(x)), self.up1d(seq)


class PoolingNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.maxpool = nn.MaxPool2d(2, stride=2)
        self.avgpool = nn.AvgPool2d(3, stride=1, padding=1)
        self.adaptive = nn.AdaptiveAvgPool2d((2, 3))
        self.adaptive_max = nn.AdaptiveMaxPool2d(1)

    def forward(self, x):
        a = self.maxpool(x)
        b = self.avgpool(x)
        c = self.adaptive(x)
        d = self.adaptive_max(x)
        return a.sum(dim=(2, 3)) + b.mean(dim=(2, 3)) + c.amax(dim=(2, 3)) + d.flatten(1)


class UpsampleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.nearest = nn.Upsample(scale_factor=2, mode="nearest")
        self.conv = nn.Conv2d(2, 2, 1)

    def forward(self, x):
        y = self.nearest(x)
        z = F.interpolate(x, size=(6, 7), mode="bilinear", align_corners=False)
        return self.conv(y)[:, :, :6, :7] + z


class DepthwiseConv1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.depthwise = nn.Conv1d(4, 4, 3, padding=1, groups=4)
        self.pointwise = nn.Conv1d(4, 6, 1)
        self.norm = nn.GroupNorm(2, 6)

    def forward(self, x):
        return F.silu(self.norm(self.pointwise(self.depthwise(x))))


class NormZoo(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn1d = nn.BatchNorm1d(5)
        self.inorm = nn.InstanceNorm1d(5, affine=True)
        self.ln = nn.LayerNorm([5, 4], elementwise_affine=True)

    def forward(self, x):
        return self.ln(self.bn1d(x) + self.inorm(x))


# --------------------------------------------------------------------------------------------
# Recurrent nets.


class LSTMNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(input_size=5, hidden_size=7, num_layers=2, batch_first=True)
        self.head = nn.Linear(7, 3)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return self.head(out[:, -1]), (h, c)


class GRUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(input_size=4, hidden_size=6, bidirectional=True)

    def forward(self, x, h0):
        out, h = self.gru(x, h0)
        return out.sum(dim=0), h


# --------------------------------------------------------------------------------------------
# Attention and decoders.


class EmbeddingMHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.attn = nn.MultiheadAttention(8, num_heads=2, batch_first=True)
        self.out = nn.Linear(8, 20)

    def forward(self, tokens):
        h = self.embed(tokens)
        attn, _ = self.attn(h, h, h, need_weights=False)
        return self.out(attn + h)


class HandAttention(nn.Module):
    """Multi-head causal self-attention written out by hand; the mask is a buffer."""

    def __init__(self, dim=8, heads=2, max_len=6):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        mask = torch.tril(torch.ones(max_len, max_len, dtype=torch.bool))
        self.register_buffer("causal", mask)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(~self.causal[:t, :t], float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class SDPAAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)


class KVCacheAttention(nn.Module):
    def __init__(self, dim, heads, max_len, use_index_copy):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.use_index_copy = use_index_copy
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.register_buffer("k_cache", torch.zeros(1, heads, max_len, self.head_dim))
        self.register_buffer("v_cache", torch.zeros(1, heads, max_len, self.head_dim))

    def forward(self, x, input_pos, mask):
        b, t, d = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.use_index_copy:
            self.k_cache.index_copy_(2, input_pos, k)
            self.v_cache.index_copy_(2, input_pos, v)
        else:
            self.k_cache[:, :, input_pos] = k
            self.v_cache[:, :, input_pos] = v
        att = (q @ self.k_cache.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        att = att.masked_fill(~mask, -1e4).softmax(dim=-1)
        y = (att @ self.v_cache).transpose(1, 2).reshape(b, t, d)
        return self.o(y)


class DecoderBlock(nn.Module):
    def __init__(self, dim, heads, max_len, use_index_copy):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = KVCacheAttention(dim, heads, max_len, use_index_copy)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(approximate="tanh"), nn.Linear(2 * dim, dim))

    def forward(self, x, input_pos, mask):
        x = x + self.attn(self.ln1(x), input_pos, mask)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A GPT-style decoder whose per-layer KV caches are buffers updated in place."""

    def __init__(self, vocab=16, dim=8, heads=2, max_len=8, layers=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(
            DecoderBlock(dim, heads, max_len, use_index_copy=(i % 2 == 0)) for i in range(layers)
        )
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool)), persistent=False)

    def forward(self, tokens, input_pos):
        x = self.tok(tokens) + self.pos(input_pos)
        mask = self.causal[input_pos].unsqueeze(0).unsqueeze(0)
        for block in self.blocks:
            x = block(x, input_pos, mask)
        return self.head(self.ln_f(x))


class TransformerEncoderNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, dropout=0.1, batch_first=True)

    def forward(self, x):
        return self.layer(x)


# --------------------------------------------------------------------------------------------
# Pytree inputs and outputs.


class TupleIO(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, pair):
        a, b = pair
        return (self.fc(a) + b, (a * b, a - b))


class ListIO(nn.Module):
    def forward(self, xs, weights):
        total = xs[0] * weights[0]
        for x, w in zip(xs[1:], weights[1:]):
            total = total + x * w
        return [total, total.relu(), [xs[-1].exp()]]


class DictIO(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, inputs):
        h = self.fc(inputs["x"]) + inputs["y"]
        return {"hidden": h, "score": h.sum(dim=-1), "nested": {"y2": inputs["y"] * 2}}


class NamedTupleIO(nn.Module):
    def forward(self, pair: Pair):
        return Pair(left=pair.left @ pair.right, right=pair.right.t() + 1)


class NestedMixed(nn.Module):
    """Static primitives inside containers, and a None leaf."""

    def forward(self, batch):
        x = batch["x"]
        for t, factor in batch["terms"]:
            x = x + t * factor
        if batch["extra"] is None:
            x = x * 2
        return x, {"n": x.shape[0], "y": [x.cos()]}


class TorchDataclassInput(nn.Module):
    def forward(self, inp: TorchRegisteredInput):
        return inp.features * inp.scale + inp.bias


class BothDataclassInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)

    def forward(self, batch: BothRegisteredInput, bias):
        h = self.embed(batch.tokens) * batch.mask.unsqueeze(-1)
        return h.sum(dim=1) + bias


# --------------------------------------------------------------------------------------------
# State: buffer mutation, input mutation, constants.


class BufferInplace(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(4))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.total.add_(x.sum(dim=0))
        self.steps += 1
        return self.total / self.steps


class BufferReassign(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("ema", torch.zeros(3))
        self.register_buffer("scratch", torch.ones(3), persistent=False)

    def forward(self, x):
        self.ema = 0.9 * self.ema + 0.1 * x.mean(dim=0)
        self.scratch = self.scratch * 2
        return x - self.ema + self.scratch


class BufferSliceAssign(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("window", torch.zeros(2, 6))

    def forward(self, x):
        self.window[:, :3] = x
        self.window[:, 3:].mul_(0.5)
        return self.window.sum(dim=1)


class UserInputMutation(nn.Module):
    def forward(self, x, y):
        x.add_(1.0)
        y[0].zero_()
        return x * 2 + y


class TensorConstant(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.tensor([0.5, -1.0, 2.0])  # plain attribute -> lifted constant
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return self.fc(x) * self.table + torch.tensor(3.0)


# --------------------------------------------------------------------------------------------
# Custom ops, static values, misc ops.


class CustomOpNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 5)

    def forward(self, x):
        y = torch.ops.exportir_test.scaled_tanh(self.fc(x), 3.0)
        mean, peak = torch.ops.exportir_test.split_stats(y)
        return y, mean + peak


class StaticArgs(nn.Module):
    def forward(self, x, n, flag, mode):
        z = n + 7
        for _ in range(n):
            x = x * 0.5
        if flag and mode == "shift":
            x = x + z
        return x


class OptionalInputDefault(nn.Module):
    def forward(self, x, y=None, scale=1.5):
        if y is not None:
            return y * x
        return x * scale + x


class SoftmaxNet(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1), F.log_softmax(x, dim=1), torch.logsumexp(x, dim=0)


class ViewOps(nn.Module):
    def forward(self, x):
        a, b = x.chunk(2, dim=1)
        c = x.reshape(4, 6).t().contiguous().view(2, 3, 4)
        d = torch.stack(list(x.unbind(0)), dim=-1)
        e = x[:, 1:5:2].unsqueeze(0).expand(3, 2, 2, 2).sum(0)
        f = x.narrow(1, 1, 3).select(2, 0).flatten()
        return a * b, c.permute(2, 0, 1), d, e, f


class IndexingOps(nn.Module):
    def forward(self, x, idx, mask):
        a = x.gather(1, idx)
        b = torch.zeros_like(x).scatter_add(1, idx, a)
        c = x.index_select(0, idx[:, 0])
        d = torch.where(mask, x, -x)
        e = x[idx[:, 0], idx[:, 1]]
        return a + 1, b, c, d.masked_fill(~mask, 0.25), e


class IntAndBoolOps(nn.Module):
    def forward(self, x, labels):
        pred = x.argmax(dim=-1)
        correct = (pred == labels).to(torch.int64)
        big = (x > 0).any(dim=-1)
        return correct.cumsum(0), big & (labels % 2 == 0), x.sort(dim=-1, descending=True).values


class MatmulZoo(nn.Module):
    def forward(self, a, b, c):
        return torch.einsum("bij,bjk->bik", a, b), torch.bmm(a, b) + c, torch.baddbmm(c, a, b, alpha=0.5)


class NoGradAndDtype(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            y = self.fc(x)
        z = y.to(torch.float64).pow(2).sum(dim=-1)
        return z.to(torch.float32), x.to(torch.int32) + 3


class ElementwiseZoo(nn.Module):
    def forward(self, x, y):
        return (
            torch.clamp(x, -0.5, 0.5) + F.hardtanh(y) + F.elu(x) + F.leaky_relu(y, 0.1),
            torch.atan2(x, y) + torch.rsqrt(y.abs() + 1) + x.floor() + y.ceil(),
            F.softplus(x) * F.mish(y) + torch.erf(x) + torch.addcmul(x, x, y, value=0.5),
        )


class NestedSubmodules(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.ModuleDict({"a": MLP((4, 8, 4)), "b": nn.Sequential(nn.Linear(4, 4), nn.Tanh())})
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        x = self.encoder["b"](self.encoder["a"](x))
        for i, block in enumerate(self.blocks):
            x = x + block(x) * (i + 1)
        return x


class SliceKVCache(nn.Module):
    """A cache buffer written by slice assignment at a static position (burned in)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 6, 4))
        self.proj = nn.Linear(4, 4)

    def forward(self, x, start):
        t = x.shape[1]
        self.cache[:, start : start + t] = self.proj(x)
        return self.cache.softmax(dim=-1).sum(dim=1)


class AliasingOutputs(nn.Module):
    """Outputs that are inputs, views of inputs, a buffer, or the same tensor twice."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(6.0).reshape(2, 3))

    def forward(self, x, y):
        z = x * 2
        return x, y.view(3, 2), z, z, self.table, self.table.t()


class MixedDtypes(nn.Module):
    def forward(self, x, n):
        h = x.to(torch.bfloat16) * 3
        idx = n.to(torch.int32) % 3
        return h.float().sum(dim=-1), idx.to(torch.float16) / 2, (x.double() ** 2).mean()


# --------------------------------------------------------------------------------------------
# The table.


def _entry(name: str, factory: Callable[[], Case], *tags: str) -> Entry:
    return Entry(name, factory, frozenset(tags))


def _eval(module: nn.Module) -> nn.Module:
    return module.eval()


ENTRIES: list[Entry] = [
    _entry("mlp", lambda: (_eval(MLP()), (_r(3, 8),), {})),
    _entry("mlp_deep_tanh", lambda: (_eval(MLP((6, 12, 12, 12, 2), act=nn.Tanh)), (_r(2, 6),), {})),
    _entry("mlp_layernorm_dropout_eval", lambda: (_eval(MLPNormDropout()), (_r(4, 8),), {}), "norm"),
    _entry("mlp_kwargs", lambda: (_eval(MLPKwargs()), (_r(2, 6),), {"scale": _r(2, 6), "offset": _r(6)})),
    _entry("tied_weights", lambda: (_eval(TiedWeights()), (torch.randint(0, 11, (2, 5)),), {})),
    _entry("cnn_bn_eval", lambda: (_eval(_randomize_bn_stats(SmallCNN())), (_r(2, 3, 8, 8),), {}), "conv", "norm"),
    _entry(
        "cnn_bn_train",
        lambda: (_randomize_bn_stats(SmallCNN()).train(), (_r(2, 3, 8, 8),), {}),
        "conv", "norm", "train", "mutation",
    ),
    _entry("resnet_tiny", lambda: (_eval(_randomize_bn_stats(TinyResNet())), (_r(1, 3, 8, 8),), {}), "conv", "norm"),
    _entry(
        "resnet_tiny_train",
        lambda: (_randomize_bn_stats(TinyResNet()).train(), (_r(2, 3, 6, 6),), {}),
        "conv", "norm", "train", "mutation",
    ),
    _entry("conv_transpose", lambda: (_eval(ConvTransposeNet()), (_r(1, 4, 3, 3), _r(2, 3, 5)), {}), "conv"),
    _entry("pooling", lambda: (_eval(PoolingNet()), (_r(2, 3, 6, 6),), {}), "conv"),
    _entry("upsample", lambda: (_eval(UpsampleNet()), (_r(1, 2, 3, 4),), {}), "conv"),
    _entry("depthwise_conv1d_groupnorm", lambda: (_eval(DepthwiseConv1d()), (_r(2, 4, 7),), {}), "conv", "norm"),
    _entry("norm_zoo", lambda: (_eval(_randomize_bn_stats(NormZoo())), (_r(3, 5, 4),), {}), "norm"),
    _entry("lstm", lambda: (_eval(LSTMNet()), (_r(2, 4, 5),), {}), "rnn"),
    _entry("gru_bidirectional", lambda: (_eval(GRUNet()), (_r(3, 2, 4), _r(2, 2, 6)), {}), "rnn"),
    _entry("embedding_mha", lambda: (_eval(EmbeddingMHA()), (torch.randint(0, 20, (2, 5)),), {}), "attention"),
    _entry("hand_attention", lambda: (_eval(HandAttention()), (_r(2, 5, 8),), {}), "attention"),
    _entry("sdpa_attention", lambda: (_eval(SDPAAttention()), (_r(2, 3, 8),), {}), "attention"),
    _entry(
        "gpt_kv_cache",
        lambda: (_eval(TinyGPT()), (torch.randint(0, 16, (1, 3)), torch.tensor([2, 3, 4])), {}),
        "attention", "mutation",
    ),
    _entry("transformer_encoder_layer", lambda: (_eval(TransformerEncoderNet()), (_r(2, 4, 8),), {}), "attention", "norm"),
    _entry("tuple_io", lambda: (_eval(TupleIO()), ((_r(2, 4), _r(2, 4)),), {}), "pytree"),
    _entry("list_io", lambda: (_eval(ListIO()), ([_r(3), _r(3), _r(3)], [_r(3), _r(3), _r(3)]), {}), "pytree"),
    _entry("dict_io", lambda: (_eval(DictIO()), ({"x": _r(2, 3), "y": _r(2, 3)},), {}), "pytree"),
    _entry("namedtuple_io", lambda: (_eval(NamedTupleIO()), (Pair(_r(2, 3), _r(3, 2)),), {}), "pytree"),
    _entry(
        "nested_mixed_static",
        lambda: (_eval(NestedMixed()), ({"x": _r(2, 2), "terms": [(_r(2, 2), 2), (_r(2, 2), 0.5)], "extra": None},), {}),
        "pytree", "static",
    ),
    _entry(
        "dataclass_torch_registered",
        lambda: (_eval(TorchDataclassInput()), (TorchRegisteredInput(_r(2, 3), _r(3)),), {}),
        "pytree", "dataclass",
    ),
    _entry(
        "dataclass_both_registered",
        lambda: (
            _eval(BothDataclassInput()),
            (BothRegisteredInput(torch.randint(0, 10, (2, 3)), (torch.rand(2, 3) > 0.3).float()), _r(4)),
            {},
        ),
        "pytree", "dataclass",
    ),
    _entry("buffer_inplace", lambda: (_eval(BufferInplace()), (_r(3, 4),), {}), "mutation"),
    _entry("buffer_reassign", lambda: (_eval(BufferReassign()), (_r(2, 3),), {}), "mutation"),
    _entry("buffer_slice_assign", lambda: (_eval(BufferSliceAssign()), (_r(2, 3),), {}), "mutation"),
    _entry("user_input_mutation", lambda: (_eval(UserInputMutation()), (_r(2, 3), _r(2, 3)), {}), "input_mutation"),
    _entry("tensor_constant", lambda: (_eval(TensorConstant()), (_r(2, 3),), {}), "constant"),
    _entry("custom_op", lambda: (_eval(CustomOpNet()), (_r(3, 5),), {}), "custom_op"),
    _entry("static_args", lambda: (_eval(StaticArgs()), (_r(3), 2, True, "shift"), {}), "static"),
    _entry("optional_input_default", lambda: (_eval(OptionalInputDefault()), (_r(2, 2),), {}), "static"),
    _entry("softmax_log_softmax", lambda: (_eval(SoftmaxNet()), (_r(3, 4),), {})),
    _entry("view_ops", lambda: (_eval(ViewOps()), (_r(2, 6, 2),), {})),
    _entry(
        "indexing_ops",
        lambda: (_eval(IndexingOps()), (_r(4, 3), torch.tensor([[0, 2], [1, 1], [2, 0], [1, 2]]), torch.rand(4, 3) > 0.5), {}),
    ),
    _entry("int_and_bool_ops", lambda: (_eval(IntAndBoolOps()), (_r(5, 4), torch.randint(0, 4, (5,))), {})),
    _entry("matmul_zoo", lambda: (_eval(MatmulZoo()), (_r(2, 3, 4), _r(2, 4, 5), _r(2, 3, 5)), {})),
    _entry("no_grad_and_dtype", lambda: (_eval(NoGradAndDtype()), (_r(3, 4) * 4,), {})),
    _entry("elementwise_zoo", lambda: (_eval(ElementwiseZoo()), (_r(3, 4), _r(3, 4)), {})),
    _entry("nested_submodules", lambda: (_eval(NestedSubmodules()), (_r(2, 4),), {})),
    _entry("slice_kv_cache", lambda: (_eval(SliceKVCache()), (_r(1, 2, 4), 3), {}), "mutation", "static"),
    _entry("aliasing_outputs", lambda: (_eval(AliasingOutputs()), (_r(2, 3), _r(2, 3)), {})),
    _entry("mixed_dtypes", lambda: (_eval(MixedDtypes()), (_r(3, 4), torch.randint(0, 10, (5,))), {})),
]

# Non-core ATen ops that torch 2.13's own ``run_decompositions()`` keeps (no decomposition in
# its default table). The corpus test allows exactly these besides core ATen; the oracle test
# pins this table against torch, so it cannot go stale.
TORCH_KEEPS_NONCORE: dict[str, frozenset[str]] = {
    # BatchNorm in training mode: torch leaves the functional training kernel whole.
    "cnn_bn_train": frozenset({"aten._native_batch_norm_legit_functional.default"}),
    "resnet_tiny_train": frozenset({"aten._native_batch_norm_legit_functional.default"}),
    # adaptive_max_pool2d is not tagged core and has no default decomposition.
    "pooling": frozenset({"aten.adaptive_max_pool2d.default"}),
    # Tensor.to(dtype) leaves torch's dtype assertion op in the graph.
    "int_and_bool_ops": frozenset({"aten._assert_tensor_metadata.default"}),
    "no_grad_and_dtype": frozenset({"aten._assert_tensor_metadata.default"}),
    "mixed_dtypes": frozenset({"aten._assert_tensor_metadata.default"}),
}

BY_NAME: dict[str, Entry] = {e.name: e for e in ENTRIES}
assert len(BY_NAME) == len(ENTRIES), "duplicate corpus entry names"


def with_tag(tag: str) -> list[Entry]:
    return [e for e in ENTRIES if tag in e.tags]


def fresh_inputs(args: tuple, kwargs: dict, seed: int) -> tuple[tuple, dict]:
    """New inputs with the same structure, shapes and dtypes as ``(args, kwargs)``.

    Float tensors are redrawn from a normal distribution; integer tensors are a random
    permutation of their own values (so indices stay in range and distinct indices stay
    distinct); bool tensors are redrawn. Non-tensor leaves (static values) are kept.
    """
    gen = torch.Generator().manual_seed(seed)

    def redraw(leaf: Any) -> Any:
        if not isinstance(leaf, torch.Tensor):
            return leaf
        if leaf.dtype.is_floating_point:
            return torch.randn(leaf.shape, generator=gen, dtype=leaf.dtype)
        if leaf.dtype == torch.bool:
            return torch.rand(leaf.shape, generator=gen) > 0.5
        flat = leaf.flatten()
        return flat[torch.randperm(flat.numel(), generator=gen)].reshape(leaf.shape).clone()

    return _map_tree(redraw, (args, kwargs))


def clone_inputs(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A copy of the inputs whose tensors are independent clones (for input mutation)."""
    return _map_tree(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, (args, kwargs))


def _map_tree(fn: Callable[[Any], Any], tree: Any) -> Any:
    """Map over leaves with torch's pytree (which knows the registered dataclasses)."""
    import torch.utils._pytree as pytree

    return pytree.tree_map(fn, tree)


# The models whose *live* torch.export comparisons (tests/export/test_oracle.py,
# test_exported_program.py: torch.export runs in the test, ~1 s a model) run in `make test`, one
# per kind of feature; the others run in `make test-slow` (CI runs both). The committed oracle of
# tests/export/test_fidelity.py compares every model in `make test`.
LIVE_ORACLE = frozenset({
    "mlp", "mlp_kwargs", "cnn_bn_train", "lstm", "sdpa_attention", "gpt_kv_cache", "dict_io",
    "namedtuple_io", "buffer_inplace", "user_input_mutation", "tensor_constant", "custom_op",
    "static_args", "aliasing_outputs",
})


def live_oracle_params() -> list:
    """Every model as a pytest parameter, marked ``slow`` unless it is in :data:`LIVE_ORACLE`."""
    import pytest

    return [pytest.param(e.name, id=e.name,
                         marks=() if e.name in LIVE_ORACLE else pytest.mark.slow)
            for e in ENTRIES]
