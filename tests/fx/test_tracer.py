"""Symbolic tracing behaviour of ``exportir.fx`` compared with ``torch.fx`` as the oracle.

Each case is traced by both implementations; node sequences (op, name, target, args, kwargs
with nodes compared by name), ``str(graph)`` and ``gm.code`` must agree, and so must error
types and messages. ``EXPORTIR_FX_IMPL=torch.fx`` runs the file against torch.fx itself.
"""

from __future__ import annotations

import importlib
import math
import typing

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from conftest import import_ours_fx, torch_code_as_ours
from torch import nn

fx = import_ours_fx()
# Where Tracer/PH helpers live: ``<impl>.tracer`` for us, ``torch.fx._symbolic_trace`` for torch.
tracer_mod = importlib.import_module(
    "torch.fx._symbolic_trace" if fx is torch.fx else f"{fx.__name__}.tracer"
)


# --------------------------------------------------------------------------------------------
# Leaf functions registered with both implementations (must be at module top level).


def sq_sum(x, y):
    return x * x + y * y


torch.fx.wrap("sq_sum")
fx.wrap("sq_sum")


@torch.fx.wrap
@fx.wrap
def decorated_leaf(x):
    return x.relu() + 1


def plain_helper(x):
    return x * 3


torch.fx.wrap("len")
fx.wrap("len")


def _with_len(x):
    return x + len(x)


# --------------------------------------------------------------------------------------------
# Comparison helpers.


def _target_key(target):
    if isinstance(target, str):
        return target
    name = getattr(target, "__name__", None)
    if name in {"_assert_is_none", "assert_fn", "sq_sum", "decorated_leaf"}:
        return name  # defined once per implementation / wrapped: compare by name
    return target


def _arg_key(a):
    if isinstance(a, (torch.fx.Node, fx.Node)):
        return ("node", a.name)
    if isinstance(a, (tuple, list)):
        return (type(a).__name__ if not isinstance(a, list) else "list", [_arg_key(x) for x in a])
    if isinstance(a, dict):
        return ("dict", [(k, _arg_key(v)) for k, v in a.items()])
    if isinstance(a, slice):
        return ("slice", _arg_key(a.start), _arg_key(a.stop), _arg_key(a.step))
    return a


def node_rows(graph):
    return [
        (n.op, n.name, _target_key(n.target), _arg_key(n.args), _arg_key(n.kwargs))
        for n in graph.nodes
    ]


def assert_same_graph(g_theirs, g_ours):
    assert node_rows(g_ours) == node_rows(g_theirs)
    assert str(g_ours) == str(g_theirs)


def same_code_body(theirs: str, ours: str) -> bool:
    """Code equality, with torch's wrap lines spelled the way ours are (see conftest)."""
    return ours == torch_code_as_ours(theirs)


def trace_both(root_factory, concrete_args=None, code=True):
    """symbolic_trace with both implementations; returns (theirs, ours) GraphModules."""
    theirs = torch.fx.symbolic_trace(root_factory(), concrete_args=concrete_args)
    ours = fx.symbolic_trace(root_factory(), concrete_args=concrete_args)
    assert_same_graph(theirs.graph, ours.graph)
    if code:
        assert same_code_body(theirs.code, ours.code), (theirs.code, ours.code)
    return theirs, ours


def raises_same(fn_theirs, fn_ours):
    with pytest.raises(Exception) as theirs:
        fn_theirs()
    with pytest.raises(Exception) as ours:
        fn_ours()
    assert type(ours.value).__name__ == type(theirs.value).__name__
    assert str(ours.value) == str(theirs.value)
    return theirs.value, ours.value


# --------------------------------------------------------------------------------------------
# Small programs.


def f_operators(x, y):
    a = x + y - x * y / (y + 1) // 2 % 3
    b = 2 + x
    c = 2 - x
    d = 2 * x
    e = 2 / x
    g = 2 // x
    h = 2 % x
    i = 2**x
    j = x**2
    k = -x + (+x) + abs(x)
    m = x @ y
    n = (x > 0) & (y < 1) | (x >= y) ^ (x <= y)
    o = ~(x == y) | (x != y)
    p = x.int() << 1 >> 1
    q = 1 << x.int()
    r = 8 >> x.int()
    s = 1 & x.int()
    t = 1 | x.int()
    u = 1 ^ x.int()
    return a, b, c, d, e, g, h, i, j, k, m, n, o, p, q, r, s, t, u


def f_torch_calls(x):
    y = torch.relu(x)
    y = torch.add(y, 1, alpha=2)
    y = F.gelu(y)
    y = torch.cat([y, x], dim=0)
    y = torch.stack((y, y))
    z = torch.sum(y, dim=(0, 1), keepdim=True)
    return torch.nn.functional.softmax(z, -1)


def f_methods_and_attrs(x):
    a = x.relu().view(-1).sum()
    b = x.shape
    c = x.size(0) + x.ndim + x.T.sum() + x.dtype.itemsize
    d = x[0, 1:3, ..., None]
    e = x[:, ::2]
    f = x.sum(dim=0, keepdim=True)
    return a, b, c, d, e, f


def f_containers(x, y):
    return {"a": [x, (y, x + 1)], "b": None, "c": 3.5, "d": torch.float32, "e": "s"}


def f_builtin_names(x):
    s = x.sum()
    s2 = x.sum()
    m = x.max()
    i = x.int()
    return torch.sum(s + s2 + m + i), x.abs()


def f_unpack(x):
    a, b = x.chunk(2)
    c, d = torch.split(x, 2)
    return a + b + c + d


def f_defaults(x, y=2, z: int = 3, *, w=None):
    return x + y + z


def f_annotated(x: torch.Tensor, n: int) -> torch.Tensor:
    return x * n


def f_varargs(x, *args, **kwargs):
    return x + args[0] + kwargs["k"]


def f_math(x):
    return x + math.sqrt(x.size(0)) + math.floor(x.dim()) + math.pi


def f_wrapped(x, y):
    return sq_sum(x, y) + decorated_leaf(x) + plain_helper(y)


def f_len(x):
    return _with_len(x)


def f_tensor_constant(x):
    return x + torch.tensor([1.0, 2.0]) + torch.ones(2)


def f_getattr_call(x):
    return x.relu() + x.transpose(0, 1).contiguous()


def f_slices_proxy(x):
    n = x.size(0)
    return x[: n // 2], x[n - 1 :: 1]


FUNCTIONS = [
    f_operators,
    f_torch_calls,
    f_methods_and_attrs,
    f_containers,
    f_builtin_names,
    f_unpack,
    f_defaults,
    f_annotated,
    f_varargs,
    f_math,
    f_wrapped,
    f_len,
    f_tensor_constant,
    f_getattr_call,
    f_slices_proxy,
]


@pytest.mark.parametrize("fn", FUNCTIONS, ids=[f.__name__ for f in FUNCTIONS])
def test_function_trace_matches_torch(fn):
    trace_both(lambda: fn)


def test_traced_functions_compute_like_eager():
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    for fn, args in [(f_torch_calls, (x,)), (f_wrapped, (x, y)), (f_unpack, (x,)), (f_math, (x,))]:
        gm = fx.symbolic_trace(fn)
        torch.testing.assert_close(gm(*args), fn(*args))


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))
        self.register_buffer("buf", torch.ones(4))
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(torch.relu(x @ self.w) + self.buf)


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.sub = Sub()
        self.seq = nn.Sequential(nn.ReLU(), Sub(), nn.Linear(4, 2))
        self.mods = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
        self.plain = torch.arange(4.0)
        self.shared = self.sub.w

    def forward(self, x):
        x = self.sub(x)
        x = self.sub(x)  # called twice: module key "sub@1"
        for m in self.mods:
            x = m(x)
        y = self.seq(x + self.plain)
        return y, self.shared.t(), self.sub.lin.weight.sum()


class ReusedParam(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.randn(3))

    def forward(self, x):
        return x + self.p + self.p * 2 + torch.add(self.p, 1)


class KwargsModule(nn.Module):
    def forward(self, x, *, scale=2.0):
        return F.dropout(x, p=0.5, training=self.training) * scale


class Pt(typing.NamedTuple):
    a: torch.Tensor
    b: int


class NamedTupleOut(nn.Module):
    def forward(self, x):
        return Pt(x + 1, 3)


class NamedTupleArg(nn.Module):
    def forward(self, x):
        return torch.add(x, *Pt(torch.ones(1), 2)[1:])


class CallsFunctional(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.bn = nn.BatchNorm2d(2)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        return F.max_pool2d(x, 2).flatten(1)


MODULES = [Sub, Nested, ReusedParam, KwargsModule, NamedTupleOut, NamedTupleArg, CallsFunctional]


@pytest.mark.parametrize("cls", MODULES, ids=[c.__name__ for c in MODULES])
def test_module_trace_matches_torch(cls):
    torch.manual_seed(0)
    theirs, ours = trace_both(cls)
    assert dict(ours.named_parameters()).keys() == dict(theirs.named_parameters()).keys()


def test_nn_module_stack_and_scope_match_torch():
    theirs_t, ours_t = torch.fx.Tracer(), fx.Tracer()
    g_theirs, g_ours = theirs_t.trace(Nested()), ours_t.trace(Nested())
    stacks_theirs = {n.name: n.meta.get("nn_module_stack") for n in g_theirs.nodes}
    stacks_ours = {n.name: n.meta.get("nn_module_stack") for n in g_ours.nodes}
    assert stacks_ours == stacks_theirs
    assert any(s and "sub@1" in s for s in stacks_ours.values())
    assert ours_t.node_name_to_scope == theirs_t.node_name_to_scope
    assert {n.name: sorted(n.meta) for n in g_ours.nodes} == {
        n.name: sorted(n.meta) for n in g_theirs.nodes
    }


def test_nn_module_stack_is_a_snapshot_per_node():
    g = fx.Tracer().trace(Nested())
    stacks = [n.meta["nn_module_stack"] for n in g.nodes if "nn_module_stack" in n.meta]
    assert len({id(s) for s in stacks}) == len(stacks)


# --------------------------------------------------------------------------------------------
# Errors.


def f_bool(x):
    if x.sum() > 0:
        return x
    return -x


def f_iter(x):
    return [v for v in x]


def f_len_unwrapped(x):
    return x.reshape(len(x.shape.__class__.__mro__), -1) if False else x + x.size().__len__()


def f_star(x):
    return torch.add(*x)


@pytest.mark.parametrize("fn", [f_bool, f_iter, f_star], ids=lambda f: f.__name__)
def test_control_flow_errors_match_torch(fn):
    _, ours = raises_same(
        lambda: torch.fx.symbolic_trace(fn), lambda: fx.symbolic_trace(fn)
    )
    assert type(ours).__mro__[1] is ValueError  # TraceError subclasses ValueError


def test_len_error_matches_torch():
    def use_len(x):
        return x * len(x)

    # `len` is registered with wrap("len") in this module, so only module-less frames raise.
    g = fx.symbolic_trace(use_len).graph
    assert next(n.target for n in g.nodes if n.op == "call_function") is len
    graph = fx.Graph()
    proxy = fx.Proxy(graph.placeholder("x"))
    with pytest.raises(RuntimeError) as ours:
        proxy.__len__()
    tgraph = torch.fx.Graph()
    with pytest.raises(RuntimeError) as theirs:
        torch.fx.Proxy(tgraph.placeholder("x")).__len__()
    assert str(ours.value) == str(theirs.value)


def test_trace_error_is_exported_and_raised():
    with pytest.raises(fx.proxy.TraceError, match="control flow"):
        fx.symbolic_trace(f_bool)


def test_multiple_tracers_error():
    g1, g2 = fx.Graph(), fx.Graph()
    a, b = fx.Proxy(g1.placeholder("a")), fx.Proxy(g2.placeholder("b"))
    with pytest.raises(RuntimeError, match="Found multiple different tracers"):
        torch.add(a, b)


def test_unsupported_argument_type():
    class Opaque:
        pass

    def f(x):
        return x + Opaque()

    _, ours = raises_same(lambda: torch.fx.symbolic_trace(f), lambda: fx.symbolic_trace(f))
    assert isinstance(ours, NotImplementedError)


def test_dict_key_with_proxy_rejected():
    def f(x):
        return torch.add(x, 1, alpha={(x,): 1})

    raises_same(lambda: torch.fx.symbolic_trace(f), lambda: fx.symbolic_trace(f))


def test_unregistered_parameter_error():
    foreign = nn.Parameter(torch.ones(2))

    def f(x):
        return x + foreign

    raises_same(lambda: torch.fx.symbolic_trace(f), lambda: fx.symbolic_trace(f))


def test_self_cannot_be_varargs():
    class M(nn.Module):
        def forward(*args):
            return args[1]

    raises_same(lambda: torch.fx.symbolic_trace(M()), lambda: fx.symbolic_trace(M()))


# --------------------------------------------------------------------------------------------
# concrete_args and PH.


def f_flag(x, flag):
    return x if flag else x * 2


def f_none(x, y):
    return x if y is None else x + y


def f_dict_input(x):
    out = 0
    for v in x.values():
        out = out + v
    return out


def f_nested_input(pair, k):
    a, (b, c) = pair
    return a + b * c + k


@pytest.mark.parametrize(
    "fn, concrete",
    [
        (f_flag, {"flag": False}),
        (f_flag, {"flag": True}),
        (f_none, {"y": None}),
        (f_dict_input, {"x": {"a": torch.fx.PH, "b": torch.fx.PH, "c": torch.fx.PH}}),
        (f_nested_input, {"pair": (torch.fx.PH, (torch.fx.PH, torch.fx.PH))}),
        (f_nested_input, {"k": 3}),
    ],
    ids=["bool_false", "bool_true", "none", "dict_ph", "nested_ph", "int"],
)
def test_concrete_args_match_torch(fn, concrete):
    ours_concrete = _swap_ph(concrete)
    theirs = torch.fx.symbolic_trace(fn, concrete_args=concrete)
    ours = fx.symbolic_trace(fn, concrete_args=ours_concrete)
    assert node_rows(ours.graph) == node_rows(theirs.graph)
    # _assert_is_none is defined once per implementation: only its module path may differ.
    def as_ours(text):
        return text.replace(
            "torch.fx._symbolic_trace._assert_is_none", f"{tracer_mod.__name__}._assert_is_none")

    assert str(ours.graph) == as_ours(str(theirs.graph))
    assert ours.code == as_ours(theirs.code)


def _swap_ph(tree):
    if tree is torch.fx.PH:
        return fx.PH
    if isinstance(tree, dict):
        return {k: _swap_ph(v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_swap_ph(v) for v in tree)
    return tree


def test_concrete_args_run_and_guard():
    gm = fx.symbolic_trace(f_dict_input, concrete_args={"x": {"a": fx.PH, "b": fx.PH}})
    assert gm({"a": 1, "b": 2}) == 3
    gm = fx.symbolic_trace(f_flag, concrete_args={"flag": True})
    x = torch.ones(2)
    torch.testing.assert_close(gm(x, True), x)
    with pytest.raises(AssertionError, match="flag has been specialized to have value True"):
        gm(x, False)
    gm = fx.symbolic_trace(f_none, concrete_args={"y": None})
    with pytest.raises(AssertionError, match="y has been specialized to have value None"):
        gm(x, 1)


@pytest.mark.skipif(fx is torch.fx, reason="torch.fx's re-trace breaks every later trace")
def test_none_specialized_input_retraces_as_a_leaf_call():
    """Re-tracing keeps the guard as one call (found on its module, patched as a wrap()
    leaf), any number of times. torch.fx registers the dotted name with wrap() on the first
    re-trace and then fails every later trace with a KeyError; we write no such line."""
    gm = fx.symbolic_trace(f_none, concrete_args={"y": None})
    x = torch.ones(2)
    for _ in range(3):
        gm = fx.symbolic_trace(gm)
        guards = [n for n in gm.graph.nodes if n.target is tracer_mod._assert_is_none]
        assert len(guards) == 1 and guards[0].meta.get("is_wrapped")
        assert "wrap(" not in gm.code
        torch.testing.assert_close(gm(x, None), x)
    with pytest.raises(AssertionError, match="specialized to have value None"):
        gm(x, 1)
    assert fx.symbolic_trace(f_flag, concrete_args={"flag": True}).code  # tracing still works


def f_pair_or_none(pair, y=None):
    return pair[0] + pair[1] if y is None else y


@pytest.mark.skipif(fx is torch.fx, reason="intended difference: torch.fx emits bad syntax")
def test_structured_input_beside_an_input_specialized_to_its_default():
    """torch.fx writes ``a, y_1 = None, = ...`` here (a SyntaxError); we bind ``y_1``."""
    with pytest.raises(SyntaxError):
        torch.fx.symbolic_trace(
            f_pair_or_none, concrete_args={"pair": (torch.fx.PH, torch.fx.PH), "y": None})
    gm = fx.symbolic_trace(f_pair_or_none, concrete_args={"pair": (fx.PH, fx.PH), "y": None})
    a, b = torch.ones(2), torch.full((2,), 2.0)
    torch.testing.assert_close(gm((a, b), None), a + b)
    assert "pair_1, pair_2, y_1, = fx_pytree.tree_flatten_spec" in gm.code
    with pytest.raises(AssertionError, match="specialized to have value None"):
        gm((a, b), a)


def test_concrete_args_tuple_forms():
    theirs = torch.fx.symbolic_trace(f_flag, concrete_args=(torch.fx.PH, False))
    ours = fx.symbolic_trace(f_flag, concrete_args=(fx.PH, False))
    assert_same_graph(theirs.graph, ours.graph)
    raises_same(
        lambda: torch.fx.symbolic_trace(f_flag, concrete_args=(1,)),
        lambda: fx.symbolic_trace(f_flag, concrete_args=(1,)),
    )

    def star(*args, **kwargs):
        return args[0] + args[1]

    raises_same(
        lambda: torch.fx.Tracer().trace(star, concrete_args=(torch.fx.PH, torch.fx.PH)),
        lambda: fx.Tracer().trace(star, concrete_args=(fx.PH, fx.PH)),
    )

    class Star(nn.Module):
        def forward(self, *args, **kwargs):
            return args[0] + args[1]

    theirs = torch.fx.Tracer().trace(Star(), concrete_args=(torch.fx.PH, torch.fx.PH))
    ours = fx.Tracer().trace(Star(), concrete_args=(fx.PH, fx.PH))
    assert_same_graph(theirs, ours)
    assert [n.name for n in ours.nodes][:2] == ["input_0", "input_1"]


def test_concrete_args_unguardable_value_warns():
    def f(x, t):
        return x + t

    with pytest.warns(UserWarning, match="Was not able to add assertion"):
        fx.symbolic_trace(f, concrete_args={"t": torch.ones(1)})


def test_ph_with_meta_transfers_attributes():
    ph = tracer_mod.PHWithMeta(ph_key="k1")
    gm = fx.symbolic_trace(f_dict_input, concrete_args={"x": {"a": ph, "b": fx.PH}})
    a = next(n for n in gm.graph.nodes if n.op == "placeholder")
    assert a.ph_key == "k1"
    assert repr(fx.PH) == "PH"


# --------------------------------------------------------------------------------------------
# wrap / autowrap.


def test_wrap_records_leaf_call_and_marks_meta():
    gm = fx.symbolic_trace(f_wrapped)
    calls = {n.name: n for n in gm.graph.nodes if n.op == "call_function"}
    assert calls["sq_sum"].target is sq_sum
    assert calls["sq_sum"].meta["is_wrapped"] is True
    assert calls["decorated_leaf"].target is decorated_leaf
    assert "plain_helper" not in calls  # traced through: a mul node instead
    x, y = torch.randn(2), torch.randn(2)
    torch.testing.assert_close(gm(x, y), f_wrapped(x, y))


def test_wrap_restores_globals_and_module_hooks_after_trace():
    before = (globals()["sq_sum"], math.sqrt, nn.Module.__call__, nn.Module.__getattr__)
    fx.symbolic_trace(f_wrapped)
    fx.symbolic_trace(f_math)
    with pytest.raises(fx.proxy.TraceError):
        fx.symbolic_trace(f_bool)
    after = (globals()["sq_sum"], math.sqrt, nn.Module.__call__, nn.Module.__getattr__)
    assert after == before
    assert "len" not in globals()  # builtins patched into globals are removed again


def test_torch_and_ours_wrap_do_not_interfere():
    # Both registries hold sq_sum/decorated_leaf; tracing with either leaves the other intact.
    for _ in range(2):
        theirs = torch.fx.symbolic_trace(f_wrapped)
        ours = fx.symbolic_trace(f_wrapped)
        assert_same_graph(theirs.graph, ours.graph)
    assert sq_sum(torch.ones(1), torch.ones(1)).item() == 2.0


def test_wrap_must_be_top_level():
    def inner():
        fx.wrap("sq_sum")

    def inner_torch():
        torch.fx.wrap("sq_sum")

    raises_same(inner_torch, inner)
    raises_same(lambda: torch.fx.wrap(3), lambda: fx.wrap(3))


def test_wrap_returns_argument():
    assert decorated_leaf.__name__ == "decorated_leaf"
    assert decorated_leaf(torch.zeros(1)).item() == 1.0


def test_autowrap_functions_and_modules():
    def f(x):
        return plain_helper(x) + math.sqrt(x.dim())

    theirs = torch.fx.Tracer(autowrap_functions=(plain_helper,)).trace(f)
    ours = fx.Tracer(autowrap_functions=(plain_helper,)).trace(f)
    assert_same_graph(theirs, ours)
    assert any(n.target is plain_helper for n in ours.nodes)
    _, no_math = raises_same(
        lambda: torch.fx.Tracer(autowrap_modules=()).trace(f_math),
        lambda: fx.Tracer(autowrap_modules=()).trace(f_math),
    )
    assert isinstance(no_math, TypeError)


def test_autowrap_inside_submodule_globals():
    class M(nn.Module):
        def forward(self, x):
            return x * math.exp(x.size(0))

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = M()

        def forward(self, x):
            return self.m(x)

    trace_both(Outer)


# --------------------------------------------------------------------------------------------
# Tracer customization.


class LeafSub(torch.fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return isinstance(m, Sub) or super().is_leaf_module(m, qualname)


class OurLeafSub(fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return isinstance(m, Sub) or super().is_leaf_module(m, qualname)


def test_custom_leaf_modules():
    theirs, ours = LeafSub().trace(Nested()), OurLeafSub().trace(Nested())
    assert_same_graph(theirs, ours)
    assert [n.target for n in ours.nodes if n.op == "call_module"][:2] == ["sub", "sub"]


def test_leaf_module_defaults():
    t = fx.Tracer()
    assert t.is_leaf_module(nn.Linear(1, 1), "x")
    assert not t.is_leaf_module(nn.Sequential(), "x")
    assert not t.is_leaf_module(Sub(), "x")


def test_path_of_module():
    root = Nested()
    t = fx.Tracer()
    t.root = root
    assert t.path_of_module(root.seq[1].lin) == "seq.1.lin"
    with pytest.raises(NameError, match="module is not installed as a submodule"):
        t.path_of_module(nn.Linear(1, 1))


def test_param_shapes_constant():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(3, 4))

        def forward(self, x):
            if self.w.shape[0] == 3 and self.w.dim() == 2:
                return x @ self.w
            return x

    theirs = torch.fx.Tracer(param_shapes_constant=True).trace(M())
    ours = fx.Tracer(param_shapes_constant=True).trace(M())
    assert_same_graph(theirs, ours)
    with pytest.raises(fx.proxy.TraceError):
        fx.Tracer().trace(M())


def test_proxy_buffer_attributes():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("b", torch.ones(2))

        def forward(self, x):
            return x + self.b + self.b

    class T(torch.fx.Tracer):
        proxy_buffer_attributes = True

    class O(fx.Tracer):
        proxy_buffer_attributes = True

    assert_same_graph(T().trace(M()), O().trace(M()))


def test_traced_func_name():
    class M(nn.Module):
        def forward(self, x):
            return x

        def other(self, x):
            return x.neg()

    class T(torch.fx.Tracer):
        traced_func_name = "other"

    class O(fx.Tracer):
        traced_func_name = "other"

    assert_same_graph(T().trace(M()), O().trace(M()))

    class Missing(fx.Tracer):
        traced_func_name = "nope"

    class MissingT(torch.fx.Tracer):
        traced_func_name = "nope"

    raises_same(lambda: MissingT().trace(M()), lambda: Missing().trace(M()))


def test_custom_create_proxy_without_factory_arg():
    class O(fx.Tracer):
        def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None):
            return super().create_proxy(kind, target, args, kwargs, name, type_expr)

    g = O().trace(ReusedParam())
    assert [n.op for n in g.nodes].count("get_attr") == 1


def test_tensor_constants_and_fresh_qualnames():
    _, ours = trace_both(lambda: f_tensor_constant)
    assert hasattr(ours, "_tensor_constant0") and hasattr(ours, "_tensor_constant1")
    t = fx.Tracer()
    t.root = nn.Module()
    t.root._c0 = 1
    t.root._c1 = 1
    assert t.get_fresh_qualname("_c") == "_c2"
    assert t.get_fresh_qualname("_d") == "_d0"


def test_custom_to_bool_and_iter():
    class O(fx.Tracer):
        def to_bool(self, obj):
            return True

        def iter(self, obj):
            return iter([obj[0], obj[1]])

    def f(x):
        a = x
        if x.sum() > 0:
            return sum(v for v in x), a
        return x

    g = O().trace(f)
    assert [n.op for n in g.nodes].count("call_function") >= 4


@pytest.mark.parametrize(
    "f",
    [
        lambda x, y: torch.relu_(x),
        lambda x, y: torch.sigmoid(x, out=y),
        lambda x, y: torch.ops.aten.add_.Tensor(x, y),
        lambda x, y: torch.add(x, y, out=y),  # ambiguous overloads: allowed by torch too
    ],
    ids=["relu_", "sigmoid_out", "add_overload", "ambiguous"],
)
def test_check_mutable_operations(f):

    class T(torch.fx.Tracer):
        check_mutable_operations = True

    class O(fx.Tracer):
        check_mutable_operations = True

    try:
        expected = T().trace(f)
    except RuntimeError:
        raises_same(lambda: T().trace(f), lambda: O().trace(f))
    else:
        assert_same_graph(expected, O().trace(f))
    assert_same_graph(T().trace(f_torch_calls), O().trace(f_torch_calls))


def test_trace_asserts_flag_behaves_like_torch():
    def f(x):
        assert x
        return x + 1

    class T(torch.fx.Tracer):
        trace_asserts = True

    class O(fx.Tracer):
        trace_asserts = True

    outcome = []
    for tracer in (T(), O()):
        try:
            outcome.append(str(tracer.trace(f)))
        except Exception as e:  # noqa: BLE001  # compare whatever happens
            outcome.append((type(e).__name__, str(e)))
    assert outcome[0] == outcome[1]


class Pair(metaclass=fx.ProxyableClassMeta):
    def __init__(self, left, right):
        self.left, self.right = left, right

    def add(self, other):
        return Pair(self.left + other.left, self.right + other.right)


def _torch_pair_class():
    class Pair(metaclass=torch.fx.ProxyableClassMeta):
        def __init__(self, left, right):
            self.left, self.right = left, right

        def add(self, other):
            return Pair(self.left + other.left, self.right + other.right)

    return Pair


TPair = _torch_pair_class()


def test_proxyable_class_meta():
    def use(x: Pair, y):
        return x.add(Pair(y, y))

    def tuse(x: TPair, y):
        return x.add(TPair(y, y))

    ours, theirs = fx.symbolic_trace(use).graph, torch.fx.symbolic_trace(tuse).graph
    assert [(n.op, n.name) for n in ours.nodes] == [(n.op, n.name) for n in theirs.nodes]
    assert any(n.target is Pair for n in ours.nodes)
    p = Pair(1, 2)  # outside tracing: a real instance
    assert (p.left, p.right) == (1, 2)


def test_proxyable_constant_instance_becomes_attr():
    const = Pair(torch.ones(1), torch.ones(1))

    def f(x):
        return torch.add(x, 1, alpha=const) if False else x.add(const)

    gm = fx.symbolic_trace(f)
    attrs = [n.target for n in gm.graph.nodes if n.op == "get_attr"]
    assert attrs == ["_Pair_constant_0"]
    assert gm._Pair_constant_0 is const


def test_trace_function_root_is_fresh_module():
    t = fx.Tracer()
    g = t.trace(f_tensor_constant)
    assert type(t.root) is nn.Module
    assert isinstance(t.root._tensor_constant0, torch.Tensor)
    assert g._tracer_cls is fx.Tracer


def test_is_fx_tracing_during_trace_only():
    seen = []

    def f(x):
        seen.append(tracer_mod.is_fx_tracing())
        return x

    fx.symbolic_trace(f)
    assert seen == [True]
    assert tracer_mod.is_fx_tracing() is False


def test_record_stack_traces():
    t = fx.Tracer()
    t.record_stack_traces = True
    g = t.trace(Nested())
    relu = next(n for n in g.nodes if n.name == "relu")
    assert relu.stack_trace is not None
    assert "in forward" in relu.stack_trace
    assert "torch.relu(x @ self.w)" in relu.stack_trace
    assert "exportir/fx/proxy.py" not in relu.stack_trace
    assert "exportir/fx/tracer.py" not in relu.stack_trace
    assert relu.meta["stack_trace"] == relu.stack_trace
    x = next(n for n in g.nodes if n.op == "placeholder")
    assert x.stack_trace is None  # created before any forward frame
    off = fx.Tracer().trace(Nested())
    assert all(n.stack_trace is None for n in off.nodes)


def test_record_stack_traces_last_frame_is_user_line():
    class T(torch.fx.Tracer):
        record_stack_traces = True

    class O(fx.Tracer):
        record_stack_traces = True

    theirs, ours = T().trace(Sub()), O().trace(Sub())
    for nt, no in zip(theirs.nodes, ours.nodes):
        if nt.stack_trace is None:
            assert no.stack_trace is None
            continue
        # torch keeps its own proxy.py frames at the end; we drop tracer frames entirely.
        assert without_fx_frames(no.stack_trace)[-2:] == without_fx_frames(nt.stack_trace)[-2:]
        assert "in forward" in no.stack_trace


def without_fx_frames(trace):
    lines = trace.splitlines()
    out, skip = [], False
    for line in lines:
        if line.lstrip().startswith("File "):
            skip = "torch/fx/" in line or "exportir/fx/" in line
        if not skip:
            out.append(line)
    return out


def test_deepcopy_tracer():
    import copy

    t = fx.Tracer()
    t2 = copy.deepcopy(t)
    assert t2._autowrap_search == t._autowrap_search
    assert t2._autowrap_search[0] is math



def test_gc_state_restored_after_trace():
    import gc

    assert gc.isenabled()
    fx.symbolic_trace(Nested())
    assert gc.isenabled()
    with pytest.raises(fx.proxy.TraceError):
        fx.symbolic_trace(f_bool)
    assert gc.isenabled()
    gc.disable()
    try:
        fx.symbolic_trace(f_torch_calls)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_data_dependent_error_carries_partial_graph():
    def f(x):
        x.add(1)
        raise RuntimeError("data-dependent expression on a traced value")

    with pytest.raises(RuntimeError) as info:
        fx.symbolic_trace(f)
    assert "add = x.add(1)" in info.value.partial_fx_graph


def test_forward_only_stack_traces():
    class O(fx.Tracer):
        record_stack_traces = True
        _record_forward_stack_traces_only = True

    g = O().trace(Nested())
    traces = [n.stack_trace for n in g.nodes if n.stack_trace]
    assert traces
    for trace in traces:
        names = [line.rsplit(" in ", 1)[-1] for line in trace.splitlines() if "File " in line]
        assert set(names) == {"forward"}
