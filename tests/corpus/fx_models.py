"""The FX parity corpus: modules and plain functions that ``symbolic_trace`` must handle.

Each :class:`Entry` has a ``name`` and a ``factory(fx) -> Case``. The factory receives the FX
implementation being exercised (``torch.fx`` or ``exportir.fx``) so that anything that is
per-implementation (``fx.PH`` in ``concrete_args``, a ``Tracer`` subclass) comes from that
implementation. :func:`build` seeds torch before calling the factory, so two builds of one
entry have identical parameters and inputs.

Functions wrapped with ``wrap`` are registered at the top level of this module with *both*
``torch.fx.wrap`` and ``exportir.fx.wrap``: each tracer patches only what it registered.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

import exportir.fx
from corpus import fx_seed_wrapped


@dataclass(frozen=True)
class Case:
    """One traceable program: ``root`` called as ``root(*inputs, **kwinputs)``."""

    root: Callable[..., Any]
    inputs: tuple = ()
    kwinputs: dict = field(default_factory=dict)
    concrete_args: dict | None = None
    # Builds the tracer instance to use; None means plain ``fx.symbolic_trace``.
    make_tracer: Callable[[], Any] | None = None
    # What the traced module must agree with numerically; None means ``root`` itself.
    reference: Callable[..., Any] | None = None


@dataclass(frozen=True)
class Entry:
    name: str
    factory: Callable[[ModuleType], Case]


def build(entry: Entry, fx: ModuleType, seed: int = 0) -> Case:
    torch.manual_seed(seed)
    return entry.factory(fx)


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


# --------------------------------------------------------------------------------------------
# Wrapped ("leaf") functions, registered with both implementations at module scope.


def wrapped_sq_sum(x, y):
    return x * x + y * y


torch.fx.wrap("wrapped_sq_sum")
exportir.fx.wrap("wrapped_sq_sum")


@exportir.fx.wrap
@torch.fx.wrap
def wrapped_scale_shift(x, scale, shift=1.0):
    return x * scale + shift


@exportir.fx.wrap
@torch.fx.wrap
def torch_randn(x, shape):
    return torch.randn(shape)


def wrapped_untraceable(x):
    # Data-dependent control flow: tracing through it would fail, wrapping makes it a leaf.
    if x.sum() > 0:
        return x.relu()
    return x.neg()


torch.fx.wrap("wrapped_untraceable")
exportir.fx.wrap("wrapped_untraceable")


# --------------------------------------------------------------------------------------------
# Seed 003 examples.


class SeedOverview(nn.Module):
    def __init__(self):
        super().__init__()
        self.param = nn.Parameter(torch.rand(3, 4))
        self.linear = nn.Linear(4, 5)

    def forward(self, x):
        return self.linear(x + self.param).clamp(min=0.0, max=1.0)


class SeedTopk(nn.Module):
    def __init__(self):
        super().__init__()
        self.param = nn.Parameter(torch.rand(3, 4))
        self.linear = nn.Linear(4, 5)

    def forward(self, x):
        return torch.topk(torch.sum(self.linear(x + self.linear.weight).relu(), dim=-1), 3)


class SeedTorchAdd(nn.Module):
    def forward(self, x, y):
        return torch.add(x, y)


class SeedOpAdd(nn.Module):
    def forward(self, x, y):
        return x + y


class SeedStaticControlFlow(nn.Module):
    def __init__(self, do_activation: bool = False):
        super().__init__()
        self.do_activation = do_activation
        self.linear = nn.Linear(512, 512)

    def forward(self, x):
        x = self.linear(x)
        if self.do_activation:
            x = torch.relu(x)
        return x


class MySpecialSubmodule(nn.Module):
    def forward(self, x):
        return torch.neg(x)


class SeedLeafDefault(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 4)
        self.submod = MySpecialSubmodule()

    def forward(self, x):
        return self.submod(self.linear(x))


class SeedTensorConstructor(nn.Module):
    def forward(self, x):
        return torch.relu(x) + torch.ones(3, 4)


class DropoutRepro(nn.Module):
    def forward(self, x):
        return F.dropout(x, training=self.training)


class DropoutRepro2(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout()

    def forward(self, x):
        return self.drop(x)


def seed_flag(x, flag):
    if flag:
        return x
    else:
        return x * 2


def seed_b_equals_true(a, b):
    if b == True:
        return a
    else:
        return a * 2


def seed_dict_values(x):
    out = 0
    for v in x.values():
        out += v
    return out


def seed_wrap_call(x, y):
    return wrapped_sq_sum(x, y)


def seed_randn_wrap(x):
    return x + torch_randn(x, 5)


class SeedCatSum(nn.Module):
    def forward(self, x, w1, w2):
        m1 = torch.cat([w1, w2]).sum()
        m2 = torch.cat([w1, w2]).sum()
        return x + torch.max(m1) + torch.max(m2)


def seed_sigmoid_neg(x):
    return torch.sigmoid(x).neg()


def seed_relu_decomposition(x):
    return (x > 0) * x


# --------------------------------------------------------------------------------------------
# Networks.


class ConvBNReLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class LeNetish(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 5)
        self.conv2 = nn.Conv2d(4, 8, 5)
        self.fc1 = nn.Linear(8 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), kernel_size=2, stride=2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


class FunctionalConv(nn.Module):
    """Functional conv/linear over module parameters: get_attr nodes for weights."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        y = F.conv2d(x, self.conv.weight, self.conv.bias, stride=1, padding=1)
        y = F.adaptive_avg_pool2d(y, (1, 1)).flatten(1)
        return F.linear(y, self.fc.weight.t().t(), bias=self.fc.bias)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class TinyResNet(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = nn.Sequential(BasicBlock(8, 8), BasicBlock(8, 8))
        self.layer2 = nn.Sequential(BasicBlock(8, 16, stride=2), BasicBlock(16, 16))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


class SelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q = q.view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.heads, self.head_dim).transpose(1, 2)
        v = v.reshape(B, T, self.heads, -1).permute(0, 2, 1, 3)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        if mask is not None:
            att = att.masked_fill(mask == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class TransformerBlock(nn.Module):
    def __init__(self, dim=16, heads=4):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, mask=None):
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab=20, dim=16, heads=4, layers=2, max_len=8):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, max_len, dim) * 0.02)
        self.blocks = nn.ModuleList([TransformerBlock(dim, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len)))

    def forward(self, idx):
        t = idx.size(1)
        x = self.tok(idx) + self.pos[:, :t, :]
        mask = self.causal.narrow(0, 0, t).narrow(1, 0, t)  # buffers are not proxied
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln_f(x))


class TorchEncoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16,
                                              dropout=0.0, batch_first=True)

    def forward(self, x):
        return self.enc(x)


class LSTMHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.lstm = nn.LSTM(6, 5, batch_first=True)
        self.fc = nn.Linear(5, 2)

    def forward(self, tokens):
        out, (h, _c) = self.lstm(self.emb(tokens))
        return self.fc(out[:, -1]), h.squeeze(0)


# --------------------------------------------------------------------------------------------
# Module hierarchies, parameters, buffers and constants.


class NestedSequential(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Sequential(nn.Linear(4, 8), nn.ReLU()),
            nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Tanh(), nn.Linear(8, 2))),
        )

    def forward(self, x):
        return self.body(x)


class ModuleListLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.acts = nn.ModuleList([nn.ReLU(), nn.Sigmoid(), nn.Tanh()])

    def forward(self, x):
        for layer, act in zip(self.layers, self.acts):
            x = act(layer(x)) + x
        return self.layers[-1](x)


class ModuleDictRoute(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"cls": nn.Linear(4, 3), "reg": nn.Linear(4, 1)})
        self.order = ["reg", "cls"]

    def forward(self, x):
        return {k: self.heads[k](x) for k in self.order}


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.lin(x) * self.scale


class Middle(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.inner2 = Inner()

    def forward(self, x):
        return self.inner2(self.inner(x)) - self.inner.lin.bias


class DeepHierarchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.mid = Middle()

    def forward(self, x):
        return self.mid(x) + self.mid.inner.scale.sum()


class Buffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.randn(4))
        self.register_buffer("std", torch.rand(4) + 0.5)
        self.register_buffer("steps", torch.tensor(3), persistent=False)

    def forward(self, x):
        return (x - self.mean) / self.std * self.steps


class TensorConstants(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.arange(12.0).reshape(3, 4)  # plain attribute: not param, not buffer
        self.sub = nn.Module()
        self.sub.offset = torch.full((4,), 0.5)

    def forward(self, x):
        literal = torch.tensor([1.0, 2.0, 3.0, 4.0])  # made at trace time -> _tensor_constant
        return x * self.table + self.sub.offset + literal + torch.zeros(4)


class ParamContainers(nn.Module):
    def __init__(self):
        super().__init__()
        self.plist = nn.ParameterList([nn.Parameter(torch.randn(4)) for _ in range(2)])
        self.pdict = nn.ParameterDict({"a": nn.Parameter(torch.randn(4))})

    def forward(self, x):
        return x * self.plist[0] + self.plist[1] - self.pdict["a"]


class SharedSubmodule(nn.Module):
    """One Linear called three times, and also reached through an alias."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.alias = self.lin

    def forward(self, x):
        return self.alias(self.lin(self.lin(x)))


# --------------------------------------------------------------------------------------------
# Signatures: kwargs, defaults, *args, **kwargs, concrete args.


class KwargsDefaults(nn.Module):
    def forward(self, x, y=None, scale: float = 2.0, *, bias=1):
        out = x * scale
        if y is not None:
            out = out + y
        return out + bias


class VarArgs(nn.Module):
    def forward(self, *args):
        return torch.stack(args[:2]).sum(0) + args[2]


class VarKwargs(nn.Module):
    def forward(self, x, **kwargs):
        return x + kwargs["y"] * kwargs["z"]


class ConcreteFlag(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, use_relu: bool = False, n_repeat: int = 1):
        for _ in range(n_repeat):
            x = self.lin(x)
        if use_relu:
            x = F.relu(x)
        return x


def annotated_fn(x: torch.Tensor, y: int, z: float = 3.0) -> torch.Tensor:
    return x * y + z


def annotated_real_types(x, y, z=3.0):
    return x * y + z


# This module uses postponed (string) annotations; the seed's examples use real types.
annotated_real_types.__annotations__ = {"x": torch.Tensor, "y": int, "z": float,
                                        "return": torch.Tensor}


def default_args_fn(a, b=2, c=None, d=(1, "two", None)):
    return a + b if c is None else a + b + c


def ph_nested_structure(inp):
    return inp["x"][0] * inp["x"][1] + inp["y"]


# --------------------------------------------------------------------------------------------
# Outputs.


def nested_outputs(x, y):
    return {"sum": x + y, "list": [x * y, (x - y, None)], "const": 3}, (x.relu(),)


def tuple_output(x):
    return x.max(dim=1)


def output_is_input(x, y):
    return x, y + 1


# --------------------------------------------------------------------------------------------
# Wrapping and tracers.


def wrapped_by_name(x, y):
    return wrapped_sq_sum(x.relu(), y) + wrapped_untraceable(x)


class WrappedInModule(nn.Module):
    def forward(self, x):
        return wrapped_scale_shift(x, 2.0) + wrapped_scale_shift(x, 3.0, shift=x)


def seed_normalize_wrapped_builtins(x):
    return fx_seed_wrapped.normalize(x)


def math_autowrap(x):
    d = x.size(-1)
    return x / math.sqrt(d) + math.floor(x.shape[0] / 2) + math.log(2.0)


class MyLeaf(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x):
        if x.sum() > 0:  # would fail if traced through
            return x * self.w
        return x


class UsesCustomLeaf(nn.Module):
    def __init__(self):
        super().__init__()
        self.leaf = MyLeaf()
        self.lin = nn.Linear(4, 4)
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def forward(self, x):
        return self.seq(self.leaf(self.lin(x)))


_LEAF_TRACERS: dict = {}


def leaf_tracer_class(fx: ModuleType) -> type:
    """A ``fx.Tracer`` subclass that keeps ``MyLeaf`` and every ``nn.Sequential`` as leaves."""
    cls = _LEAF_TRACERS.get(fx.__name__)
    if cls is None:

        class LeafTracer(fx.Tracer):
            def is_leaf_module(self, m, module_qualified_name):
                if isinstance(m, (MyLeaf, nn.Sequential)):
                    return True
                return super().is_leaf_module(m, module_qualified_name)

        cls = _LEAF_TRACERS[fx.__name__] = LeafTracer
    return cls


def autowrap_target(x):
    return x * 2


def autowrap_functions_fn(x):
    return autowrap_target(x) + 1


def configured_tracer(fx: ModuleType, **attrs) -> Callable[[], Any]:
    """A factory for a plain ``fx.Tracer`` with the given class-level switches set on it."""

    def make():
        tracer = fx.Tracer()
        for k, v in attrs.items():
            setattr(tracer, k, v)
        return tracer

    return make


class BufferSlice(nn.Module):
    """Slices a buffer by a traced size: needs ``proxy_buffer_attributes``."""

    def __init__(self):
        super().__init__()
        self.register_buffer("causal", torch.tril(torch.ones(8, 8)))

    def forward(self, x):
        t = x.size(1)
        return x.masked_fill(self.causal[:t, :t] == 0, 0.0)


class ParamShapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 6)

    def forward(self, x):
        return self.lin(x).view(-1, self.lin.weight.shape[0]) * self.lin.weight.size()[1]


class CustomEntryPoint(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        raise AssertionError("traced through `encode`, never called")

    def encode(self, x, scale=2.0):
        return self.lin(x) * scale


def traced_assert(x):
    assert x.sum() > -1e9, "sum is finite"
    return x + 1


def mutating_fn(x):
    return torch.relu_(x.clone())


# --------------------------------------------------------------------------------------------
# Operators, attributes, methods, indexing.


def binary_operators(x, y):
    a = x + y - x * y / (y + 5.0)
    b = (x // 2.0) + (x % 3.0) + (y ** 2) + abs(x)
    c = -a + (+b) + (x @ y.t()).sum()
    return a, b, c


def reflected_operators(x):
    return 2 + x, 2 - x, 3 * x, 1 / (x + 4.0), 2 ** x, 7 // (x.abs() + 1), 5 % (x.abs() + 1)


def comparison_operators(x, y):
    return x < y, x <= y, x > y, x >= y, x == y, x != y


def bitwise_operators(a, b):
    return a & b, a | b, a ^ b, ~a, a << 1, b >> 1, 3 & a, 3 | a


def inplace_ops(x, y):
    x = x.clone()
    x.add_(y)
    x.mul_(2.0)
    x += y
    x *= 3
    torch.relu_(x)
    x[0].zero_()
    x.clamp_(max=5.0)
    return x


def torch_functions_kwargs(x, y):
    a = torch.cat([x, y], dim=1)
    b = torch.sum(a, dim=1, keepdim=True)
    c = torch.clamp(a, min=-0.5, max=0.5)
    d = F.softmax(a, dim=-1)
    e = torch.where(a > 0, a, torch.zeros_like(a))
    f = a.to(dtype=torch.float64).mean(dim=(0, 1))
    g = torch.einsum("ij,kj->ik", x, y)
    return a, b, c, d, e, f, g


def tensor_attributes(x):
    n = x.shape[0]
    m = x.size(1)
    dt = x.dtype
    ones = x.new_ones(n, m, dtype=dt)
    return x.ndim, x.dim(), ones + x.T.t(), x.size(), x.shape[-1], x.new_zeros(x.shape)


def slicing_indexing(x, idx):
    return (
        x[:, 1:3],
        x[..., None],
        x[0],
        x[:, ::2],
        x[1:-1, None, 2],
        x[x > 0],
        x[idx],
        x[[0, 2]],
        x[-1, -2:],
    )


def method_chains(x):
    y = x.view(2, -1).reshape(4, 3).permute(1, 0).transpose(0, 1).contiguous()
    z = y.flatten().unsqueeze(0).squeeze(0).expand(2, 12)
    return z.sum(-1), y.max(dim=1).values, y.chunk(2, dim=0)[1], y.float().double()


def unpack_and_getitem(x):
    a, b = x.chunk(2)
    h, w = x.shape
    return a * h + b * w


def builtins_and_getattr(x):
    y = x.relu()
    return y, x.shape[0] * 2, torch.float32, x.device


def names_collide(x):
    sum = x.sum()
    max = torch.max(x)
    add = torch.add(x, sum)
    add_1 = add + max
    return add_1 + torch.add(add, 1)


def factory_with_proxy_sizes(x):
    return torch.zeros(x.size()) + torch.ones([x.shape[0], 1]) + torch.full_like(x, 2.0)


def none_slice_ellipsis_args(x):
    return x.narrow(0, 0, 1), torch.split(x, [1, 2], dim=0)[0], x[None, ..., :2]


def static_loop_unrolled(x):
    acc = x
    for i in range(3):
        acc = acc * (i + 1) + x
    return acc


class TrainingFlag(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        return F.dropout(self.bn(x), p=0.2, training=self.training), self.training


# --------------------------------------------------------------------------------------------
# The corpus table.


def _module(cls: type, *inputs_shapes, train: bool = False, **init) -> Callable[[ModuleType], Case]:
    def factory(fx: ModuleType) -> Case:
        m = cls(**init)
        m.train(train)
        return Case(m, tuple(_r(*s) for s in inputs_shapes))

    return factory


def _fn(fn: Callable, *inputs_shapes) -> Callable[[ModuleType], Case]:
    return lambda fx: Case(fn, tuple(_r(*s) for s in inputs_shapes))


def _case(**kw) -> Callable[[ModuleType], Case]:
    """A Case whose inputs are built lazily (after seeding) by the callables in kw."""

    def factory(fx: ModuleType) -> Case:
        vals = {k: (v(fx) if callable(v) and k in _LAZY_KEYS else v) for k, v in kw.items()}
        return Case(**vals)

    return factory


_LAZY_KEYS = {"root", "inputs", "kwinputs", "concrete_args", "make_tracer"}


def _entry_point_case(fx: ModuleType) -> Case:
    root = CustomEntryPoint()
    return Case(root, (_r(3, 4),), make_tracer=configured_tracer(fx, traced_func_name="encode"),
                reference=root.encode)


ENTRIES: list[Entry] = [
    # seed 003 examples
    Entry("seed_overview", _module(SeedOverview, (3, 4))),
    # The seed adds linear.weight (5, 4) to x, so x must be (5, 4) for the example to run.
    Entry("seed_topk", _module(SeedTopk, (5, 4))),
    Entry("seed_torch_add", _module(SeedTorchAdd, (3, 4), (3, 4))),
    Entry("seed_op_add", _module(SeedOpAdd, (3, 4), (3, 4))),
    Entry("seed_static_cf_off", _module(SeedStaticControlFlow, (2, 512), do_activation=False)),
    Entry("seed_static_cf_on", _module(SeedStaticControlFlow, (2, 512), do_activation=True)),
    Entry("seed_leaf_default", _module(SeedLeafDefault, (2, 3))),
    Entry("seed_tensor_constructor", _module(SeedTensorConstructor, (3, 4))),
    Entry("seed_dropout_functional", _module(DropoutRepro, (5, 3), train=True)),
    Entry("seed_dropout_module", _module(DropoutRepro2, (5, 3), train=True)),
    Entry("seed_concrete_flag", _case(root=lambda fx: seed_flag,
                                      inputs=lambda fx: (_r(3), True),
                                      concrete_args={"flag": True})),
    Entry("seed_concrete_b", _case(root=lambda fx: seed_b_equals_true,
                                   inputs=lambda fx: (_r(3), False),
                                   concrete_args={"b": False})),
    Entry("seed_concrete_ph_dict", _case(
        root=lambda fx: seed_dict_values,
        inputs=lambda fx: ({"a": _r(2), "b": _r(2), "c": _r(2)},),
        concrete_args=lambda fx: {"x": {"a": fx.PH, "b": fx.PH, "c": fx.PH}})),
    Entry("seed_wrap_custom_function", _fn(seed_wrap_call, (3,), (3,))),
    Entry("seed_randn_wrap", _fn(seed_randn_wrap, (5,))),
    Entry("seed_wrap_len_sqrt", _fn(fx_seed_wrapped.normalize, (3, 4))),
    Entry("seed_cat_sum_max", _module(SeedCatSum, (2,), (2,), (2,))),
    Entry("seed_sigmoid_neg", _fn(seed_sigmoid_neg, (3, 4))),
    Entry("seed_relu_decomposition", _fn(seed_relu_decomposition, (3, 4))),
    # networks
    Entry("conv_bn_relu", _module(ConvBNReLU, (2, 3, 8, 8))),
    Entry("conv_bn_relu_train", _module(ConvBNReLU, (2, 3, 8, 8), train=True)),
    Entry("lenet", _module(LeNetish, (2, 1, 28, 28))),
    Entry("functional_conv", _module(FunctionalConv, (2, 2, 6, 6))),
    Entry("tiny_resnet", _module(TinyResNet, (2, 3, 16, 16))),
    Entry("tiny_transformer", _case(root=lambda fx: TinyTransformer().eval(),
                                    inputs=lambda fx: (torch.randint(0, 20, (2, 6)),))),
    Entry("transformer_block_kwargs", _case(
        root=lambda fx: TransformerBlock().eval(),
        inputs=lambda fx: (_r(2, 5, 16),),
        kwinputs=lambda fx: {"mask": torch.tril(torch.ones(5, 5))})),
    Entry("torch_encoder_layer", _module(TorchEncoderLayer, (2, 5, 8))),
    Entry("lstm_head", _case(root=lambda fx: LSTMHead().eval(),
                             inputs=lambda fx: (torch.randint(0, 10, (2, 7)),))),
    Entry("mlp_sequential", _case(
        root=lambda fx: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.0),
                                      nn.Linear(8, 2)).eval(),
        inputs=lambda fx: (_r(3, 4),))),
    # hierarchies, params, buffers, constants
    Entry("nested_sequential", _module(NestedSequential, (3, 4))),
    Entry("module_list_loop", _module(ModuleListLoop, (3, 4))),
    Entry("module_dict_route", _module(ModuleDictRoute, (3, 4))),
    Entry("deep_hierarchy", _module(DeepHierarchy, (3, 4))),
    Entry("buffers", _module(Buffers, (3, 4))),
    Entry("tensor_constants", _module(TensorConstants, (3, 4))),
    Entry("param_containers", _module(ParamContainers, (3, 4))),
    Entry("shared_submodule", _module(SharedSubmodule, (3, 4))),
    # signatures
    Entry("kwargs_defaults", _case(root=lambda fx: KwargsDefaults(),
                                   inputs=lambda fx: (_r(3), _r(3)),
                                   kwinputs={"bias": 1})),
    Entry("varargs", _module(VarArgs, (3,), (3,), (3,))),
    Entry("var_kwargs", _case(root=lambda fx: VarKwargs(), inputs=lambda fx: (_r(3),),
                              kwinputs=lambda fx: {"y": _r(3), "z": _r(3)})),
    Entry("concrete_flag_module", _case(
        root=lambda fx: ConcreteFlag(), inputs=lambda fx: (_r(2, 4), True, 2),
        concrete_args={"use_relu": True, "n_repeat": 2})),
    Entry("concrete_flag_module_ph", _case(
        root=lambda fx: ConcreteFlag(), inputs=lambda fx: (_r(2, 4), False, 1),
        concrete_args=lambda fx: {"x": fx.PH, "use_relu": False, "n_repeat": 1})),
    Entry("concrete_ph_nested", _case(
        root=lambda fx: ph_nested_structure,
        inputs=lambda fx: ({"x": [_r(2), _r(2)], "y": _r(2)},),
        concrete_args=lambda fx: {"inp": {"x": [fx.PH, fx.PH], "y": fx.PH}})),
    Entry("annotated_fn", _case(root=lambda fx: annotated_fn, inputs=lambda fx: (_r(3), 2))),
    Entry("annotated_real_types", _case(root=lambda fx: annotated_real_types,
                                        inputs=lambda fx: (_r(3), 2))),
    # c is a Proxy while tracing, so the `c is None` branch is never taken: call with a tensor.
    Entry("default_args_fn", _case(root=lambda fx: default_args_fn,
                                   inputs=lambda fx: (_r(3), 2, _r(3)))),
    # outputs
    Entry("nested_outputs", _fn(nested_outputs, (3,), (3,))),
    Entry("tuple_output_namedtuple", _fn(tuple_output, (3, 4))),
    Entry("output_is_input", _fn(output_is_input, (3,), (3,))),
    # wrapping and tracers
    Entry("wrapped_by_name", _fn(wrapped_by_name, (3,), (3,))),
    Entry("wrapped_decorator_in_module", _module(WrappedInModule, (3,))),
    Entry("math_autowrap", _fn(math_autowrap, (3, 4))),
    Entry("custom_leaf_tracer", _case(
        root=lambda fx: UsesCustomLeaf(), inputs=lambda fx: (_r(3, 4),),
        make_tracer=lambda fx: leaf_tracer_class(fx))),
    Entry("autowrap_functions", _case(
        root=lambda fx: autowrap_functions_fn, inputs=lambda fx: (_r(3),),
        make_tracer=lambda fx: (lambda: fx.Tracer(autowrap_functions=(autowrap_target,))))),
    Entry("tracer_proxy_buffer_attributes", _case(
        root=lambda fx: BufferSlice(), inputs=lambda fx: (_r(2, 5, 5),),
        make_tracer=lambda fx: configured_tracer(fx, proxy_buffer_attributes=True))),
    Entry("tracer_param_shapes_constant", _case(
        root=lambda fx: ParamShapes(), inputs=lambda fx: (_r(3, 4),),
        make_tracer=lambda fx: (lambda: fx.Tracer(param_shapes_constant=True)))),
    Entry("tracer_param_shapes_dynamic", _module(ParamShapes, (3, 4))),
    Entry("tracer_traced_func_name", _entry_point_case),
    # operators, attributes, methods, indexing
    Entry("binary_operators", _fn(binary_operators, (3, 3), (3, 3))),
    Entry("reflected_operators", _fn(reflected_operators, (3,))),
    Entry("comparison_operators", _fn(comparison_operators, (3,), (3,))),
    Entry("bitwise_operators", _case(root=lambda fx: bitwise_operators,
                                     inputs=lambda fx: (torch.randint(0, 16, (4,)),
                                                        torch.randint(0, 16, (4,))))),
    Entry("inplace_ops", _fn(inplace_ops, (3, 4), (3, 4))),
    Entry("torch_functions_kwargs", _fn(torch_functions_kwargs, (3, 4), (3, 4))),
    Entry("tensor_attributes", _fn(tensor_attributes, (3, 4))),
    Entry("slicing_indexing", _case(root=lambda fx: slicing_indexing,
                                    inputs=lambda fx: (_r(4, 5), torch.tensor([0, 2, 3])))),
    Entry("method_chains", _fn(method_chains, (3, 4))),
    Entry("unpack_and_getitem", _fn(unpack_and_getitem, (4, 3))),
    Entry("builtins_and_getattr", _fn(builtins_and_getattr, (3,))),
    Entry("names_collide", _fn(names_collide, (3,))),
    Entry("factory_with_proxy_sizes", _fn(factory_with_proxy_sizes, (3, 4))),
    Entry("none_slice_ellipsis_args", _fn(none_slice_ellipsis_args, (3, 4))),
    Entry("static_loop_unrolled", _fn(static_loop_unrolled, (3,))),
    Entry("training_flag_train", _module(TrainingFlag, (3, 4), train=True)),
    Entry("training_flag_eval", _module(TrainingFlag, (3, 4), train=False)),
]


# --------------------------------------------------------------------------------------------
# Programs that symbolic tracing must reject (seed 003, "Limitations of Symbolic Tracing").


def func_to_trace(x):
    if x.sum() > 0:
        return torch.relu(x)
    else:
        return torch.neg(x)


def normalize_unwrapped(x):
    return x / math.sqrt(len(x))


def iterate_proxy(x):
    out = 0
    for row in x:
        out = out + row
    return out


def star_args_proxy(x):
    return torch.stack([*x])


def proxy_as_range_bound(x):
    return sum(x for _ in range(x.size(0)))


def proxy_to_int(x):
    return x * int(x.sum())


def flag_without_concrete(x, flag):
    return seed_flag(x, flag)


def assert_on_proxy(x):
    assert x.sum() > 0, "must be positive"
    return x


LIMITATIONS: list[Entry] = [
    Entry("dynamic_control_flow", _fn(func_to_trace, (3,))),
    Entry("len_of_proxy", _fn(normalize_unwrapped, (3, 4))),
    Entry("iterate_proxy", _fn(iterate_proxy, (3, 4))),
    Entry("star_args_proxy", _fn(star_args_proxy, (3, 4))),
    Entry("proxy_as_range_bound", _fn(proxy_as_range_bound, (3, 4))),
    Entry("proxy_to_int", _fn(proxy_to_int, (3, 4))),
    Entry("flag_without_concrete_args", _case(root=lambda fx: flag_without_concrete,
                                              inputs=lambda fx: (_r(3), True))),
    Entry("assert_on_proxy", _fn(assert_on_proxy, (3,))),
    Entry("check_mutable_operations", _case(
        root=lambda fx: mutating_fn, inputs=lambda fx: (_r(3),),
        make_tracer=lambda fx: configured_tracer(fx, check_mutable_operations=True))),
    Entry("buffer_slice_without_proxy_buffers", _module(BufferSlice, (2, 5, 5))),
    # torch 2.13 only recognises the assert bytecode of Python <= 3.10 (POP_JUMP_IF_TRUE), so on
    # 3.11+ trace_asserts still ends in the control-flow TraceError.
    Entry("trace_asserts_py311", _case(
        root=lambda fx: traced_assert, inputs=lambda fx: (_r(3),),
        make_tracer=lambda fx: configured_tracer(fx, trace_asserts=True))),
]


def by_name(entries: list[Entry]) -> dict[str, Entry]:
    return {e.name: e for e in entries}
