"""The dynamic-shapes feature suite: one small program per behaviour, each against torch.export.

Every feature is exported by exportir and by ``torch.export.export(strict=False)`` with the same
spec (our ``Dim`` for ours, torch's for torch), then compared: the same ``range_constraints``
(symbols renamed by first appearance in the inputs' shapes), the same graph-signature inputs and
output kinds, and the same numerics as eager on three input sizes through ``ep.module()``.

Error features expect torch's "Constraints violated" text (ours adds the ``file:line`` of each
guard: this file), then apply the *Suggested fixes* lines as Python and export again.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import sympy
import torch
import torch.export as texport
import torch.nn.functional as F
from corpus import export_harness as h
from torch import nn

import exportir.export as ours
from exportir.export.dynamic import dims as ds

THIS_FILE = __file__.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Feature:
    name: str
    make: Callable[[], nn.Module]
    inputs: Callable[[int], tuple]  # example args at "size" n
    spec: Callable[[dict], Any]  # namespace of dims -> dynamic_shapes
    setup: str = ""  # Python defining the dims (Dim, dims in scope)
    sizes: tuple[int, ...] = (4, 7, 9)  # the first one is the export example
    error: str | None = None  # expected violation text; the fix is then applied
    fix: str | None = None  # a fix to apply instead of the suggested one (none suggested)
    torch_ok: bool = True
    kwargs: Callable[[int], dict] | None = None


def _fn(body: Callable[..., Any]) -> Callable[[], nn.Module]:
    """A module whose forward is ``body`` (named arguments are kept)."""
    import inspect

    params = list(inspect.signature(body).parameters)

    def make() -> nn.Module:
        cls = type(f"F_{body.__name__}", (nn.Module,), {})
        src = f"def forward(self, {', '.join(params)}):\n    return body({', '.join(params)})"
        scope: dict[str, Any] = {"body": body}
        exec(src, scope)  # noqa: S102  # a forward with the body's argument names
        cls.forward = scope["forward"]
        return cls()

    return make


r = torch.randn


# ---------------------------------------------------------------------------- programs

def shape_if(x):
    if x.shape[0] > 2:
        return x + 1
    return x - 1


def shape_assert(x):
    assert x.shape[0] >= 4
    return x * 2


def slice_half(x):
    return x[: x.shape[0] // 2] * 3


def view_batch(x):
    return x.view(x.shape[0], -1).sum(1)


def constructor(x):
    return torch.zeros(x.shape[0], 3) + x


def arange_add(x):
    return x + torch.arange(x.shape[0], dtype=x.dtype)


def shifted(x, y):
    return x[1:] + y


def flat_add(x, y):
    return x.reshape(-1) + y


def plain_add(x, y):
    return x + y


def mul_two(x):
    return x * 2


def view4(x):
    return x.view(4, -1)


def cat_dyn(x, y):
    return torch.cat([x, y]).sin()


def expand_rows(x, y):
    return x.expand(y.shape[0], 3) + y


def double_rows(x):
    return x.reshape(x.shape[0] * 2, -1)


def softmax_seq(x):
    return F.softmax(x, dim=-1)


def mean_batch(x):
    return x.mean(0), x.sum()


def matmul_w(x, w):
    return x @ w


def unsq_flat(x):
    return x.unsqueeze(1).flatten(0, 1) + 1


def pad_end(x):
    return F.pad(x, (1, 2))


def new_zeros(x):
    return x.new_zeros(x.shape) + x.size(0)


def in_range(x):
    if 3 <= x.shape[0] <= 6:
        return x + 1
    return x


def gt5(x):
    if x.shape[0] > 5:
        return x + 1
    return x[:4] * 2


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def index_sel(x):
    return x.index_select(0, torch.arange(0, x.shape[0], 2))


def nested_io(xs, d):
    return xs[0] + xs[1] * d["a"]


def kw_io(x, scale):
    return x * scale


def two_dims(x, y):
    return x @ y


def transpose_add(x, y):
    return x.t() + y


def chunked(x):
    a, b = x.chunk(2, dim=1)
    return a * b


def cumsum_dyn(x):
    return x.cumsum(0)


def where_mask(x):
    return torch.where(x > 0, x, torch.zeros_like(x))


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x):
        return self.fc(x).relu()


class Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        return self.pool(self.conv(x))


class Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(8)

    def forward(self, x):
        return self.ln(x)


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, ids):
        return self.emb(ids).sum(1)


class WithBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("bias", torch.randn(3))

    def forward(self, x):
        return x + self.bias


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


def _ids(n: int) -> torch.Tensor:
    return torch.randint(0, 10, (n, 3))


FEATURES = [
    Feature("linear_batch", Linear, lambda n: (r(n, 3),), lambda d: {"x": {0: d["batch"]}}, "batch = Dim('batch', max=64)"),
    Feature("same_dim_twice", _fn(plain_add), lambda n: (r(n, 3), r(n, 3)), lambda d: ({0: d["b"]}, {0: d["b"]}), "b = Dim('b')"),
    Feature("shape_if", _fn(shape_if), lambda n: (r(n, 2),), lambda d: {"x": {0: d["dx"]}}, "dx = Dim('dx', min=3)"),
    Feature("shape_assert", _fn(shape_assert), lambda n: (r(n),), lambda d: ({0: d["dx"]},), "dx = Dim('dx', min=4)", (5, 4, 9)),
    Feature("slice_half", _fn(slice_half), lambda n: (r(n, 2),), lambda d: ({0: d["dx"]},), "dx = Dim('dx')", torch_ok=False),  # torch: guards on s // 2
    Feature("view_batch", _fn(view_batch), lambda n: (r(n, 2, 3),), lambda d: ({0: d["dx"]},), "dx = Dim('dx')"),
    Feature("constructor", _fn(constructor), lambda n: (r(n, 3),), lambda d: ({0: d["dx"]},), "dx = Dim('dx')"),
    Feature("arange", _fn(arange_add), lambda n: (r(n),), lambda d: ({0: d["dx"]},), "dx = Dim('dx')"),
    Feature("derived_plus_one", _fn(shifted), lambda n: (r(n + 1), r(n)), lambda d: ({0: d["dy"] + 1}, {0: d["dy"]}), "dy = Dim('dy')"),
    Feature("derived_times_two", _fn(flat_add), lambda n: (r(n, 2), r(2 * n)), lambda d: ({0: d["dx"]}, {0: 2 * d["dx"]}), "dx = Dim('dx')"),
    Feature("derived_phantom_root", _fn(mul_two), lambda n: (r(2 * n),), lambda d: ({0: 2 * d["dx"]},), "dx = Dim('dx')", (3, 4, 8)),
    # torch 2.13 fails on dx - 1 while rendering its own range check (KeyError 'max')
    Feature("derived_minus_one", _fn(shifted), lambda n: (r(n), r(n - 1)), lambda d: ({0: d["dx"]}, {0: d["dx"] - 1}), "dx = Dim('dx', min=2)", torch_ok=False),
    Feature("auto_all", _fn(plain_add), lambda n: (r(n, 3), r(n, 3)), lambda d: ({0: Dim_(d).AUTO, 1: Dim_(d).AUTO}, {0: Dim_(d).AUTO, 1: Dim_(d).AUTO}), "", (4, 7, 9)),
    Feature("auto_specializes", _fn(view4), lambda n: (r(4, n),), lambda d: ({0: Dim_(d).AUTO, 1: Dim_(d).AUTO},), "", (6, 3, 8)),
    Feature("auto_relation", _fn(shifted), lambda n: (r(n + 1), r(n)), lambda d: ({0: Dim_(d).AUTO}, {0: Dim_(d).AUTO})),
    Feature("auto_bounded", _fn(mul_two), lambda n: (r(n),), lambda d: ({0: Dim_(d).AUTO(min=3, max=10)},), "", (5, 3, 10)),
    Feature("dynamic_hint", _fn(mul_two), lambda n: (r(n, 2),), lambda d: ({0: Dim_(d).DYNAMIC},)),
    Feature("dynamic_bounded", _fn(mul_two), lambda n: (r(n),), lambda d: ({0: Dim_(d).DYNAMIC(max=10)},), "", (5, 2, 10)),
    Feature("static_hint_and_int", _fn(plain_add), lambda n: (r(n, 3), r(n, 3)), lambda d: ({0: d["b"], 1: 3}, {0: d["b"], 1: Dim_(d).STATIC}), "b = Dim('b')"),
    Feature("list_spec_order", _fn(two_dims), lambda n: (r(n, 5), r(5, n + 1)), lambda d: [{0: d["m"], 1: d["k"]}, {0: d["k"], 1: d["n"]}], "m, k, n = dims('m', 'k', 'n')", (4, 5, 6)),
    Feature("nested_inputs", _fn(nested_io), lambda n: ((r(n, 2), r(n, 2)), {"a": r(n, 2)}), lambda d: {"xs": ({0: d["b"]}, {0: d["b"]}), "d": {"a": {0: d["b"]}}}, "b = Dim('b')"),
    Feature("kwargs_spec", _fn(kw_io), lambda n: (r(n, 2),), lambda d: {"x": {0: d["b"]}, "scale": {0: d["b"]}}, "b = Dim('b')", kwargs=lambda n: {"scale": r(n, 2)}),
    Feature("cat", _fn(cat_dyn), lambda n: (r(n, 2), r(n + 2, 2)), lambda d: ({0: d["dx"]}, {0: d["dy"]}), "dx, dy = dims('dx', 'dy')"),
    Feature("expand", _fn(expand_rows), lambda n: (r(1, 3), r(n, 3)), lambda d: (None, {0: d["dy"]}), "dy = Dim('dy')"),
    Feature("double_rows", _fn(double_rows), lambda n: (r(n, 4),), lambda d: ({0: d["dx"]},), "dx = Dim('dx')"),
    Feature("softmax_seq", _fn(softmax_seq), lambda n: (r(2, n),), lambda d: ({0: d["b"], 1: d["s"]},), "b, s = dims('b', 's')"),
    Feature("reductions", _fn(mean_batch), lambda n: (r(n, 3),), lambda d: ({0: d["dx"]},), "dx = Dim('dx')"),
    Feature("matmul_batch_seq", _fn(matmul_w), lambda n: (r(2, n, 3), r(3, 5)), lambda d: ({0: d["b"], 1: d["s"]}, None), "b, s = dims('b', 's')"),
    Feature("unsqueeze_flatten", _fn(unsq_flat), lambda n: (r(n, 3),), lambda d: ({0: d["dx"]},), "dx = Dim('dx')"),
    Feature("pad", _fn(pad_end), lambda n: (r(2, n),), lambda d: ({1: d["dx"]},), "dx = Dim('dx')"),
    Feature("new_zeros_size_value", _fn(new_zeros), lambda n: (r(n, 2),), lambda d: ({0: d["dx"]},), "dx = Dim('dx')"),
    Feature("range_guards_implied", _fn(in_range), lambda n: (r(n),), lambda d: ({0: d["dx"]},), "dx = Dim('dx', min=3, max=6)", (5, 3, 6)),
    Feature("torch_dims_accepted", _fn(plain_add), lambda n: (r(n, 3), r(n, 3)), lambda d: ({0: texport.Dim("b")}, {0: texport.Dim("b")})),
    Feature("shapes_collection", _fn(plain_add), lambda n: (r(n, 3), r(n, 3)), lambda d: d["_sc"], "b = Dim('b')"),
    Feature("conv_pool_batch", Conv, lambda n: (r(n, 2, 8, 8),), lambda d: ({0: d["b"]},), "b = Dim('b')"),
    Feature("layernorm_batch_seq", Norm, lambda n: (r(n, n + 1, 8),), lambda d: ({0: d["b"], 1: d["s"]},), "b, s = dims('b', 's')"),
    Feature("embedding", Embed, lambda n: (_ids(n),), lambda d: ({0: d["b"]},), "b = Dim('b')"),
    Feature("buffer_broadcast", WithBuffer, lambda n: (r(n, 3),), lambda d: ({0: d["b"]},), "b = Dim('b')"),
    Feature("sdpa_seq", _fn(sdpa), lambda n: (r(2, 2, n, 4), r(2, 2, n, 4), r(2, 2, n, 4)), lambda d: ({2: d["s"]}, {2: d["s"]}, {2: d["s"]}), "s = Dim('s')"),
    Feature("mha_seq", Attention, lambda n: (r(2, n, 8),), lambda d: ({1: d["s"]},), "s = Dim('s')"),
    # torch guards the length of arange(0, s, 2) (s >= 3); exportir's arange length needs none
    Feature("index_select_step", _fn(index_sel), lambda n: (r(n, 2),), lambda d: ({0: d["dx"]},), "dx = Dim('dx')", torch_ok=False),
    Feature("transpose", _fn(transpose_add), lambda n: (r(n, 3), r(3, n)), lambda d: ({0: d["dx"]}, {1: d["dx"]}), "dx = Dim('dx')"),
    Feature("chunk", _fn(chunked), lambda n: (r(n, 4),), lambda d: ({0: d["dx"]},), "dx = Dim('dx')"),
    Feature("cumsum", _fn(cumsum_dyn), lambda n: (r(n, 2),), lambda d: ({0: d["dx"]},), "dx = Dim('dx')"),
    Feature("where", _fn(where_mask), lambda n: (r(n, 2),), lambda d: ({0: d["dx"]},), "dx = Dim('dx')"),
    # --- errors: torch's text, then the suggested fix applied
    Feature("err_min_bound", _fn(gt5), lambda n: (r(n, 3),), lambda d: ({0: d["dx"]},), "dx = Dim('dx')", (8, 6, 12),
            error="Not all values of dx = L['x'].size()[0] in the specified range satisfy the generated guard 6 <= L['x'].size()[0]"),
    Feature("err_two_sided", _fn(in_range), lambda n: (r(n),), lambda d: ({0: d["dx"]},), "dx = Dim('dx')", (5, 3, 6),
            error="Suggested fixes:\n  dx = Dim('dx', min=3, max=6)"),
    Feature("err_user_max_and_guard_min", _fn(gt5), lambda n: (r(n, 3),), lambda d: ({0: d["dx"]},), "dx = Dim('dx', max=20)", (8, 6, 20),
            error="in the specified range dx <= 20 satisfy the generated guard 6 <= L['x'].size()[0] and L['x'].size()[0] <= 20"),
    Feature("err_specialized", _fn(view4), lambda n: (r(4, 6),), lambda d: ({0: d["dx"]},), "dx = Dim('dx')", (4, 4, 4),
            error="You marked dx as dynamic but your code specialized it to be a constant (4)."),
    Feature("err_equal", _fn(plain_add), lambda n: (r(n), r(n)), lambda d: ({0: d["dx"]}, {0: d["dy"]}), "dx, dy = dims('dx', 'dy')",
            error="The values of dy = L['y'].size()[0] and dx = L['x'].size()[0] must always be equal."),
    Feature("err_derived", _fn(shifted), lambda n: (r(n + 1), r(n)), lambda d: ({0: d["dx"]}, {0: d["dy"]}), "dx, dy = dims('dx', 'dy')",
            error="by dx = dy + 1."),
    Feature("err_times_two", _fn(flat_add), lambda n: (r(n, 2), r(2 * n)), lambda d: ({0: d["dx"]}, {0: d["dy"]}), "dx, dy = dims('dx', 'dy')",
            error="by dy = 2*dx."),
    Feature("err_dynamic_specialized", _fn(view4), lambda n: (r(4, n),), lambda d: ({0: d["h"], 1: d["w"]},), "h = Dim.DYNAMIC\nw = Dim.DYNAMIC", (6, 3, 8),
            error="You marked L['x'].size()[0] as dynamic but your code specialized it to be a constant (4).", fix="h = Dim.AUTO"),
]


def Dim_(d: dict) -> Any:  # the Dim class of the namespace (ours or torch's)
    return d["Dim"]


def _namespace(dim_cls: Any, feature: Feature, args: tuple, kwargs: dict, extra: str = "") -> dict:
    ns: dict[str, Any] = {"Dim": dim_cls, "dims": ds.dims if dim_cls is ds.Dim else texport.dims}
    exec(feature.setup + "\n" + extra, ns)  # noqa: S102  # the test's own dim definitions / fixes
    if feature.name == "shapes_collection":
        sc = (ds.ShapesCollection if dim_cls is ds.Dim else texport.ShapesCollection)()
        sc[args[0]] = {0: ns["b"]}
        sc[args[1]] = {0: ns["b"]}
        ns["_sc"] = sc
    return ns


def _inputs(feature: Feature, n: int) -> tuple[tuple, dict]:
    torch.manual_seed(n)
    return feature.inputs(n), (feature.kwargs(n) if feature.kwargs else {})


def _torch_export(mod, args, kwargs, spec):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return texport.export(mod, args, kwargs, dynamic_shapes=spec, strict=False)


def _canonical_ranges(ep: Any) -> dict[str, str]:
    """range_constraints with symbols renamed a0, a1, ... by first appearance in input shapes."""
    rename: dict[Any, Any] = {}
    for node in ep.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        for size in getattr(val, "shape", ()):
            expr = getattr(getattr(size, "node", None), "expr", None)
            for s in sorted(getattr(expr, "free_symbols", ()), key=str):
                rename.setdefault(s, sympy.Symbol(f"a{len(rename)}", integer=True))
    out = {}
    for expr, vr in ep.range_constraints.items():
        for s in sorted(expr.free_symbols, key=str):
            rename.setdefault(s, sympy.Symbol(f"a{len(rename)}", integer=True))
        out[str(expr.xreplace(rename))] = str(vr)
    return out


def _input_dim_ranges(ep: Any) -> list[str]:
    """The range each user input dimension may take (``bound`` of its size over the ranges)."""
    from exportir.symbolic import ValueRanges, bound

    ranges = {s: ValueRanges.of(vr.lower, vr.upper) for e, vr in ep.range_constraints.items() if e.is_Symbol for s in [e]}
    out = []
    for node in ep.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        for size in getattr(val, "shape", ()):
            expr = getattr(getattr(size, "node", None), "expr", None)
            out.append(str(bound(expr, ranges)) if expr is not None else str(size))
    return out


# Known differences in range_constraints' keys (ours, torch's), with the reason; asserted exactly.
RANGE_KEY_DIFFERENCES: dict[str, tuple[dict, dict]] = {
    # Eq(s0 - 1, s1): our ShapeEnv replaces the newer symbol (y: s0 - 1), torch the one with the
    # larger hint (x: s0 + 1). Each input dim has the same range either way (checked above).
    "auto_relation": (
        {"a0": "VR[3, int_oo]", "a0 - 1": "VR[2, int_oo]"},
        {"a0 + 1": "VR[3, int_oo]", "a0": "VR[2, int_oo]"},
    ),
}


def _check_numerics(feature: Feature, mod: nn.Module, ep: Any) -> None:
    module = ep.module()
    for n in feature.sizes:
        args, kwargs = _inputs(feature, n)
        h.assert_same_tree(module(*args, **kwargs), mod(*args, **kwargs), f"{feature.name} at size {n}")


SUCCESS = [f for f in FEATURES if f.error is None]
ERRORS = [f for f in FEATURES if f.error is not None]


def test_suite_is_large_enough():
    assert len(FEATURES) >= 40


@pytest.mark.parametrize("feature", SUCCESS, ids=lambda f: f.name)
def test_feature_matches_torch(feature: Feature):
    torch.manual_seed(0)
    mod = feature.make().eval()
    args, kwargs = _inputs(feature, feature.sizes[0])
    ep = ours.export(mod, args, kwargs, dynamic_shapes=feature.spec(_namespace(ds.Dim, feature, args, kwargs)))
    _check_numerics(feature, mod, ep)
    if not feature.torch_ok:
        return
    tep = _torch_export(mod, args, kwargs, feature.spec(_namespace(texport.Dim, feature, args, kwargs)))
    assert _input_dim_ranges(ep) == _input_dim_ranges(tep)
    if feature.name in RANGE_KEY_DIFFERENCES:
        assert _canonical_ranges(ep) == RANGE_KEY_DIFFERENCES[feature.name][0]
        assert _canonical_ranges(tep) == RANGE_KEY_DIFFERENCES[feature.name][1]
    else:
        assert _canonical_ranges(ep) == _canonical_ranges(tep)
    ours_in, ours_out = h.signature_rows(ep)
    torch_in, torch_out = h.signature_rows(tep)
    assert ours_in == torch_in
    assert [row[:2] for row in ours_out] == [row[:2] for row in torch_out]


def _strip_locations(msg: str) -> str:
    return "\n".join(line for line in msg.splitlines() if not line.startswith("    (guard added at "))


def _fixes(msg: str) -> str:
    if "Suggested fixes:\n" not in msg:
        return ""
    return "\n".join(line.strip() for line in msg.split("Suggested fixes:\n", 1)[1].splitlines())


@pytest.mark.parametrize("feature", ERRORS, ids=lambda f: f.name)
def test_error_feature_message_and_fix(feature: Feature):
    torch.manual_seed(0)
    mod = feature.make().eval()
    args, kwargs = _inputs(feature, feature.sizes[0])
    with pytest.raises(ds.UserError) as info:
        ours.export(mod, args, kwargs, dynamic_shapes=feature.spec(_namespace(ds.Dim, feature, args, kwargs)))
    msg = str(info.value)
    assert feature.error in msg
    assert re.search(rf"\(guard added at .*{re.escape(THIS_FILE)}:\d+ in ", msg), msg
    if feature.torch_ok:
        with pytest.raises(Exception) as theirs:  # torch's UserError
            _torch_export(mod, args, kwargs, feature.spec(_namespace(texport.Dim, feature, args, kwargs)))
        assert _strip_locations(msg) == str(theirs.value).split("\n\nThe error above occurred")[0]
    fix = feature.fix or _fixes(msg)
    assert fix, "no suggested fix"
    ep = ours.export(mod, args, kwargs, dynamic_shapes=feature.spec(_namespace(ds.Dim, feature, args, kwargs, fix)))
    _check_numerics(feature, mod, ep)


def test_module_checks_inputs_against_ranges_like_torch():
    mod = Linear().eval()
    ep = ours.export(mod, (r(5, 3),), dynamic_shapes={"x": {0: ds.Dim("batch", min=3, max=64)}})
    tep = _torch_export(mod, (r(5, 3),), {}, {"x": {0: texport.Dim("batch", min=3, max=64)}})
    assert str(ep.range_constraints).replace("s0", "S") == re.sub(r"s\d+", "S", str(tep.range_constraints))
    # torch 2.13's module() raises AssertionError("Guard failed: x.size()[0] <= 64"); we keep the
    # input-path texts of torch.export's input checks (the issue's acceptance text)
    module = ep.module()
    with pytest.raises(RuntimeError, match=re.escape("Expected input at *args[0].shape[0] to be <= 64, but got 65")):
        module(r(65, 3))
    with pytest.raises(RuntimeError, match=re.escape("Expected input at *args[0].shape[0] to be >= 3, but got 2")):
        module(r(2, 3))
    x = r(64, 3)
    h.assert_same_tree(module(x), mod(x), "in range")
