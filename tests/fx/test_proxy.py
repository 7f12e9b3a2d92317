"""Proxy behaviour of ``exportir.fx`` compared with ``torch.fx`` as the oracle.

Graphs are built by applying operations to proxies over a fresh graph (the "Proxy outside
tracing" pattern of the spec) and compared node by node with what torch.fx records.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import importlib
import operator

import pytest
import torch
import torch.fx
from conftest import import_ours_fx
from hypothesis import given, settings
from hypothesis import strategies as st

fx = import_ours_fx()
proxy_mod = importlib.import_module(f"{fx.__name__}.proxy")


def rows(graph):
    def key(a):
        if isinstance(a, (torch.fx.Node, fx.Node)):
            return ("node", a.name)
        if isinstance(a, (tuple, list)):
            return (type(a).__name__, [key(x) for x in a])
        if isinstance(a, dict):
            return ("dict", [(k, key(v)) for k, v in a.items()])
        if isinstance(a, slice):
            return ("slice", key(a.start), key(a.stop), key(a.step))
        return a

    return [(n.op, n.name, n.target, key(n.args), key(n.kwargs)) for n in graph.nodes]


def build_both(body, n_inputs=2):
    """Run ``body(*proxies)`` over fresh graphs of both implementations; return both graphs."""
    graphs = []
    for impl in (torch.fx, fx):
        g = impl.Graph()
        tracer = impl.proxy.GraphAppendingTracer(g)
        proxies = [impl.Proxy(g.placeholder(f"x{i}"), tracer) for i in range(n_inputs)]
        out = body(*proxies)
        g.output(out.node if isinstance(out, impl.Proxy) else _nodes(out, impl))
        graphs.append(g)
    return graphs


def _nodes(out, impl):
    if isinstance(out, impl.Proxy):
        return out.node
    if isinstance(out, (tuple, list)):
        return type(out)(_nodes(o, impl) for o in out)
    return out


def assert_same(body, n_inputs=2):
    theirs, ours = build_both(body, n_inputs)
    assert rows(ours) == rows(theirs)
    assert str(ours) == str(theirs)
    return theirs, ours


# --------------------------------------------------------------------------------------------
# Operator overloads.


def test_same_dunder_methods_as_torch():
    def dunders(cls):
        return {n for n in vars(cls) if n.startswith("__") and n.endswith("__")}

    assert dunders(torch.fx.Proxy) - {"__annotations__", "__weakref__", "__dict__"} <= dunders(
        fx.Proxy
    ) | {"__module__", "__doc__", "__qualname__", "__firstlineno__", "__static_attributes__"}


BINARY = [
    "add", "sub", "mul", "floordiv", "truediv", "mod", "pow", "lshift", "rshift",
    "and_", "or_", "xor", "getitem", "matmul", "eq", "ne", "lt", "gt", "le", "ge",
]  # fmt: skip
REFLECTABLE = [
    "add", "sub", "mul", "floordiv", "truediv", "mod", "pow", "lshift", "rshift",
    "and_", "or_", "xor", "matmul",
]  # fmt: skip


@pytest.mark.parametrize("op", BINARY)
def test_binary_operator_records_operator_function(op):
    fn = getattr(operator, op)
    _, ours = assert_same(lambda a, b: fn(a, b))
    node = next(n for n in ours.nodes if n.op == "call_function")
    assert node.target is fn
    assert [a.name for a in node.args] == ["x0", "x1"]


@pytest.mark.parametrize("op", REFLECTABLE)
def test_reflected_operator_swaps_operands(op):
    fn = getattr(operator, op)
    _, ours = assert_same(lambda a: fn(3, a), n_inputs=1)
    node = next(n for n in ours.nodes if n.op == "call_function")
    assert node.target is fn and node.args[0] == 3 and node.args[1].name == "x0"


@pytest.mark.parametrize("op", ["neg", "pos", "invert", "abs"])
def test_unary_operators(op):
    fn = getattr(operator, op)
    _, ours = assert_same(lambda a: fn(a), n_inputs=1)
    assert [n.target for n in ours.nodes if n.op == "call_function"] == [fn]


def test_getitem_with_slices_and_ellipsis():
    assert_same(lambda a, b: a[1:b, ..., None, ::2], n_inputs=2)


def test_python3_div_dunders_exist_but_fail_like_torch():
    g = fx.Graph()
    p = fx.Proxy(g.placeholder("x"))
    tg = torch.fx.Graph()
    tp = torch.fx.Proxy(tg.placeholder("x"))
    for name in ("__div__", "__rdiv__"):
        with pytest.raises(AttributeError) as ours:
            getattr(p, name)(1)
        with pytest.raises(AttributeError) as theirs:
            getattr(tp, name)(1)
        assert str(ours.value) == str(theirs.value)


# --------------------------------------------------------------------------------------------
# torch functions, methods and attributes.


def test_torch_function_and_tensor_method_routing():
    def body(a, b):
        c = torch.relu(a)
        d = torch.ones(1).add(c) + b  # a real tensor's method given a proxy: call_method
        e = torch.nn.functional.gelu(d, approximate="tanh")
        f = torch.ops.aten.mul.Tensor(e, 2)
        return torch.cat([f, a], dim=1)

    _, ours = assert_same(body)
    ops = [(n.op, n.target) for n in ours.nodes][2:-1]
    assert ops[1] == ("call_method", "add")
    assert ops[0] == ("call_function", torch.relu)


def test_attribute_is_lazy_and_call_is_one_method_node():
    g = fx.Graph()
    p = fx.Proxy(g.placeholder("x"))
    attr = p.shape
    assert isinstance(attr, proxy_mod.Attribute)
    assert len(g.nodes) == 1  # nothing recorded yet
    p.view(-1)
    assert [n.op for n in g.nodes] == ["placeholder", "call_method"]
    _ = attr[0]
    assert [n.target for n in g.nodes][-2:] == [getattr, operator.getitem]
    assert attr.node is attr.node  # created once


def test_attribute_chains_match_torch():
    assert_same(lambda a, b: a.T.sum() + a.shape[0] + b.dtype.itemsize)


def test_proxy_call_and_keys():
    assert_same(lambda a, b: a(b, k=1))
    assert_same(lambda a, b: a.keys())


def test_repr():
    g = fx.Graph()
    p = fx.Proxy(g.placeholder("x"))
    assert repr(p) == "Proxy(x)"
    assert repr(p + 1) == "Proxy(add)"


def test_unpacking_iterates_by_index():
    def body(a, b):
        c, d, e = a
        return c + d + e

    _, ours = assert_same(body)
    assert [n.args[1] for n in ours.nodes if n.target is operator.getitem] == [0, 1, 2]


# --------------------------------------------------------------------------------------------
# Errors.


def _one_proxy(impl):
    g = impl.Graph()
    return impl.Proxy(g.placeholder("x"))


@pytest.mark.parametrize(
    "use",
    [bool, len, list, lambda p: [v for v in p], lambda p: p if p else None],
    ids=["bool", "len", "list", "loop", "if"],
)
def test_concrete_value_errors_match_torch(use):
    with pytest.raises(Exception) as theirs:
        use(_one_proxy(torch.fx))
    with pytest.raises(Exception) as ours:
        use(_one_proxy(fx))
    assert type(ours.value).__name__ == type(theirs.value).__name__
    assert str(ours.value) == str(theirs.value)
    assert isinstance(ours.value, (ValueError, RuntimeError))


def test_trace_error_hierarchy():
    assert issubclass(proxy_mod.TraceError, ValueError)


# --------------------------------------------------------------------------------------------
# Argument lowering.


class Color(enum.Enum):
    RED = 1


@dataclasses.dataclass
class Box:
    lo: object
    hi: object


def test_create_arg_lowering_table():
    g = fx.Graph()
    tracer = proxy_mod.GraphAppendingTracer(g)
    p = fx.Proxy(g.placeholder("x"), tracer)
    assert tracer.create_arg((1, [p, {"k": p}])) == (1, [p.node, {"k": p.node}])
    assert tracer.create_arg(slice(p, 2, None)) == slice(p.node, 2, None)
    assert tracer.create_arg(range(3)) == range(3)
    assert tracer.create_arg(Color.RED) is Color.RED
    assert tracer.create_arg(...) is ...
    assert tracer.create_arg(torch.float16) is torch.float16
    assert tracer.create_arg(torch.ops.aten.add.Tensor) is torch.ops.aten.add.Tensor
    box = tracer.create_arg(Box(p, 1))
    assert box.op == "call_function" and box.target is Box and box.kwargs == {"lo": p.node, "hi": 1}
    with pytest.raises(NotImplementedError, match="argument of type: <class 'object'>"):
        tracer.create_arg(object())


def test_create_arg_fx_create_arg_hook_and_dict_keys():
    class Hooked:
        def __fx_create_arg__(self, tracer):
            return 42

    g = fx.Graph()
    tracer = proxy_mod.GraphAppendingTracer(g)
    p = fx.Proxy(g.placeholder("x"), tracer)
    assert tracer.create_arg(Hooked()) == 42
    assert tracer.create_arg({(1, 2): 3}) == {(1, 2): 3}
    with pytest.raises(RuntimeError, match="Keys for dictionaries used as an argument cannot"):
        tracer.create_arg({(p,): 1})


def test_proxy_without_tracer_appends_to_node_graph():
    g = fx.Graph()
    x = g.placeholder("x")
    p = fx.Proxy(x)
    assert isinstance(p.tracer, proxy_mod.GraphAppendingTracer)
    out = torch.relu(p) * 2
    g.output(out.node)
    gm = fx.GraphModule(torch.nn.Module(), g)
    torch.testing.assert_close(gm(torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 4.0]))


def test_deepcopy_proxy():
    g = fx.Graph()
    p = fx.Proxy(g.placeholder("x"))
    p.extra = [1, 2]
    q = copy.deepcopy(p)
    assert type(q) is fx.Proxy
    assert q.extra == [1, 2] and q.extra is not p.extra
    assert q.node.name == "x"


def test_scope_context_manager_restores():
    scope = proxy_mod.Scope("", None)
    with proxy_mod.ScopeContextManager(scope, proxy_mod.Scope("a.b", int)) as s:
        assert s is scope
        assert (scope.module_path, scope.module_type) == ("a.b", int)
    assert (scope.module_path, scope.module_type) == ("", None)


def test_parameter_proxy_reports_real_shapes():
    g = fx.Graph()
    tracer = proxy_mod.GraphAppendingTracer(g)
    param = torch.nn.Parameter(torch.zeros(2, 3))
    pp = proxy_mod.ParameterProxy(tracer, g.get_attr("w"), "w", param)
    assert repr(pp) == "ParameterProxy(w)"
    assert pp.shape == (2, 3) and pp.size() == (2, 3)
    assert (pp.dim(), pp.ndim, pp.numel(), pp.nelement()) == (2, 2, 6, 6)
    with pytest.raises(AssertionError, match="Expected Parameter"):
        proxy_mod.ParameterProxy(tracer, g.get_attr("w"), "w", torch.zeros(1))


def test_meta_proxy_propagates_fake_values():
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    g = fx.Graph()
    tracer = proxy_mod.GraphAppendingTracer(g)
    x = g.placeholder("x")
    with mode:
        x.meta["val"] = torch.empty(2, 3)
    p = proxy_mod.MetaProxy(x, tracer, mode)
    out = torch.sum(p, 0)
    assert isinstance(out, proxy_mod.MetaProxy)
    assert repr(out) == "MetaProxy(sum_1)"
    assert out.node.meta["val"].shape == (3,)


def test_higher_order_operator_refuses_python_callables():
    from torch._higher_order_ops.cond import cond_op

    messages = []
    for impl in (torch.fx, fx):
        g = impl.Graph()
        p = impl.Proxy(g.placeholder("x"))
        with pytest.raises(RuntimeError) as info:
            impl.Proxy.__torch_function__(cond_op, (), (p, operator.neg), {})
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "Unable to symbolically trace the HigherOrderOperator cond" in messages[1]


def _relu_decomposition(x):
    return (x > 0) * x


def test_seed_decomposition_with_graph_appending_tracer():
    """The spec's ``decompose`` example: rewrite F.relu through proxies on a new graph."""

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.relu(x) + 1

    results = []
    for impl in (torch.fx, fx):
        graph = impl.Tracer().trace(M())
        new_graph = impl.Graph()
        env = {}
        tracer = impl.proxy.GraphAppendingTracer(new_graph)
        for node in graph.nodes:
            if node.op == "call_function" and node.target is torch.nn.functional.relu:
                args = [impl.Proxy(env[a.name], tracer) for a in node.args]
                env[node.name] = _relu_decomposition(*args).node
            else:
                env[node.name] = new_graph.node_copy(node, lambda x, env=env: env[x.name])
        results.append(impl.GraphModule(M(), new_graph))
    assert results[1].code == results[0].code
    assert rows(results[1].graph) == rows(results[0].graph)
    x = torch.tensor([-1.0, 2.0])
    torch.testing.assert_close(results[1](x), torch.tensor([1.0, 3.0]))


# --------------------------------------------------------------------------------------------
# Randomized: any chain of recordable operations builds the same graph as torch.fx.


_STEPS = {
    "add": lambda a, b: a + b,
    "radd": lambda a, b: 2 + a,
    "rsub": lambda a, b: 1.5 - b,
    "mul": lambda a, b: a * b,
    "neg": lambda a, b: -a,
    "relu": lambda a, b: torch.relu(a),
    "sum_dim": lambda a, b: a.sum(dim=0, keepdim=True),
    "getitem": lambda a, b: a[0:2],
    "shape": lambda a, b: a.shape[0] + b,
    "view": lambda a, b: a.view(-1),
    "cat": lambda a, b: torch.cat([a, b], dim=-1),
    "where": lambda a, b: torch.where(a > b, a, b),
    "method_kw": lambda a, b: a.softmax(dim=-1),
    "pow": lambda a, b: a**2,
    "rpow": lambda a, b: 2**a,
    "matmul": lambda a, b: a @ b,
    "max": lambda a, b: torch.max(a, b),
}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(_STEPS)), st.booleans()), max_size=12))
def test_random_operation_chains_match_torch(steps):
    def body(a, b):
        for name, swap in steps:
            x, y = (b, a) if swap else (a, b)
            a, b = _STEPS[name](x, y), a
        return a, b

    assert_same(body)
