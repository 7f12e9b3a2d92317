"""Differential tests of ``Interpreter`` / ``Transformer`` against torch.fx.

Every corpus program is traced by both implementations and interpreted; results, the
values left in ``env``, error messages, and the code a ``Transformer`` produces must match.
Random graphs (flat, nested and keyword arguments, methods, tuples) are built identically in
both implementations and interpreted by both.

Sanity mode: ``EXPORTIR_FX_IMPL=torch.fx`` runs this file with torch.fx on both sides.
"""

from __future__ import annotations

import inspect
import operator
import random

import pytest
import torch
import torch.fx
from conftest import import_ours_fx
from corpus.fx_models import ENTRIES, build
from test_parity import assert_same_value as _assert_same_value
from torch import nn

fx = import_ours_fx()


def _plain(value):
    """Each implementation's immutable_list/immutable_dict as plain list/dict."""
    if isinstance(value, (list, tuple)) and type(value).__name__ == "immutable_list":
        return [_plain(v) for v in value]
    if isinstance(value, dict) and type(value).__name__ == "immutable_dict":
        return {k: _plain(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_plain(v) for v in value)
    if type(value) is dict:
        return {k: _plain(v) for k, v in value.items()}
    return value


def assert_same_value(expected, actual, path="out"):
    _assert_same_value(_plain(expected), _plain(actual), path)

# --------------------------------------------------------------------------------------------
# Corpus: interpreting a traced program gives what running it gives, in both implementations.

NAMES = [e.name for e in ENTRIES]
BY_NAME = {e.name: e for e in ENTRIES}


def _trace(impl, case):
    if case.make_tracer is None:
        return impl.symbolic_trace(case.root, concrete_args=case.concrete_args)
    tracer = case.make_tracer()
    graph = tracer.trace(case.root, concrete_args=case.concrete_args)
    return impl.GraphModule(tracer.root, graph)


def _positional(gm, case):
    """The case's inputs as one positional list in placeholder order."""
    args = list(case.inputs)
    names = [n.target for n in gm.graph.nodes if n.op == "placeholder"][len(args):]
    for name in names:
        if name in case.kwinputs:
            args.append(case.kwinputs[name])
        elif case.concrete_args and name in case.concrete_args:
            args.append(case.concrete_args[name])
    return args


def _traced_pair(name):
    theirs_case = build(BY_NAME[name], torch.fx)
    ours_case = build(BY_NAME[name], fx)
    return (theirs_case, _trace(torch.fx, theirs_case)), (ours_case, _trace(fx, ours_case))


def _has_var_keyword(gm):
    return any(n.op == "placeholder" and n.target.startswith("**") for n in gm.graph.nodes)


@pytest.mark.parametrize("name", NAMES)
def test_corpus_interpreter_matches_torch(name):
    (t_case, t_gm), (o_case, o_gm) = _traced_pair(name)
    t_args, o_args = _positional(t_gm, t_case), _positional(o_gm, o_case)
    if _has_var_keyword(t_gm):  # run() is positional-only: both fail on the **kwargs lookup
        theirs = _error_of(lambda: torch.fx.Interpreter(t_gm).run(*t_args))
        ours = _error_of(lambda: fx.Interpreter(o_gm).run(*o_args))
        assert type(ours) is type(theirs)
        assert str(ours).split("\n")[:3] == str(theirs).split("\n")[:3]
        return
    torch.manual_seed(7)
    expected = torch.fx.Interpreter(t_gm).run(*t_args)
    torch.manual_seed(7)
    actual = fx.Interpreter(o_gm).run(*o_args)
    assert_same_value(expected, actual)
    torch.manual_seed(7)
    assert_same_value(o_gm(*o_args), actual, "gm() vs Interpreter")


@pytest.mark.parametrize("name", NAMES)
def test_corpus_env_after_run(name):
    """Same values are retained in ``env`` with and without garbage collection."""
    (t_case, t_gm), (o_case, o_gm) = _traced_pair(name)
    if _has_var_keyword(t_gm):
        return  # covered by test_corpus_interpreter_matches_torch
    for gc in (True, False):
        theirs = torch.fx.Interpreter(t_gm, garbage_collect_values=gc)
        ours = fx.Interpreter(o_gm, garbage_collect_values=gc)
        torch.manual_seed(3)
        theirs.run(*_positional(t_gm, t_case))
        torch.manual_seed(3)
        ours.run(*_positional(o_gm, o_case))
        assert [n.name for n in ours.env] == [n.name for n in theirs.env]


@pytest.mark.parametrize("name", NAMES)
def test_corpus_identity_transformer_code(name):
    (_, t_gm), (_, o_gm) = _traced_pair(name)
    expected = torch.fx.Transformer(t_gm).transform()
    actual = fx.Transformer(o_gm).transform()
    assert actual.code == expected.code
    assert str(actual.graph) == str(expected.graph)
    assert isinstance(actual, fx.GraphModule)


# --------------------------------------------------------------------------------------------
# Random graphs built node by node, identically in both implementations.

UNARY = [torch.relu, torch.neg, torch.sigmoid, torch.tanh]
BINARY = [operator.add, operator.mul, operator.sub, torch.add, torch.mul, torch.maximum]
METHODS = ["relu", "neg", "exp", "abs"]


def _random_graph(impl, seed, size=60):
    """A graph drawing each node's inputs from earlier values; returns (gm, n_inputs)."""
    rng = random.Random(seed)
    graph = impl.Graph()
    values = [graph.placeholder(f"x{i}") for i in range(3)]
    for _ in range(size):
        pick = lambda: values[rng.randrange(len(values))]
        kind = rng.randrange(8)
        if kind == 0:
            node = graph.call_function(rng.choice(UNARY), (pick(),))
        elif kind == 1:
            node = graph.call_function(rng.choice(BINARY), (pick(), pick()))
        elif kind == 2:
            node = graph.call_function(operator.add, (pick(), rng.choice([1, 0.5, -2])))
        elif kind == 3:
            node = graph.call_method(rng.choice(METHODS), (pick(),))
        elif kind == 4:  # nested list argument with a keyword
            parts = graph.call_function(torch.stack, ([pick(), pick(), pick()],), {"dim": 0})
            node = graph.call_method("sum", (parts,), {"dim": 0})
        elif kind == 5:  # node in kwargs
            node = graph.call_function(torch.add, (pick(),), {"other": pick(), "alpha": 2})
        elif kind == 6:  # tuple-producing op and getitem
            halves = graph.call_function(torch.chunk, (pick(), 2))
            node = graph.call_function(operator.getitem, (halves, rng.randrange(2)))
            node = graph.call_function(torch.cat, ((node, node),), {"dim": 0})
        else:
            node = graph.call_function(torch.clamp, (pick(),), {"min": -1.0, "max": 1.0})
        values.append(node)
    graph.output((values[-1], [values[-2], {"k": values[-3]}]))
    return impl.GraphModule(nn.Module(), graph)


@pytest.mark.parametrize("seed", range(25))
def test_random_graphs_match_torch(seed):
    t_gm, o_gm = _random_graph(torch.fx, seed), _random_graph(fx, seed)
    assert o_gm.code == t_gm.code
    gen = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(4, 3, generator=gen) for _ in range(3)]
    expected = torch.fx.Interpreter(t_gm).run(*inputs)
    for gc in (True, False):
        actual = fx.Interpreter(o_gm, garbage_collect_values=gc).run(*inputs)
        assert_same_value(expected, actual)
    assert_same_value(expected, o_gm(*inputs), "gm()")


# --------------------------------------------------------------------------------------------
# The documented override points.


def _both(build_fn):
    return build_fn(torch.fx), build_fn(fx)


def _sigmoid_neg(x):
    return torch.sigmoid(x).neg()


def _swap_class(impl):
    class NegSigmSwapInterpreter(impl.Interpreter):
        def call_function(self, target, args, kwargs):
            if target is torch.sigmoid:
                return torch.neg(*args, **kwargs)
            return super().call_function(target, args, kwargs)

        def call_method(self, target, args, kwargs):
            if target == "neg":
                call_self, *args_tail = args
                return call_self.sigmoid(*args_tail, **kwargs)
            return super().call_method(target, args, kwargs)

    return NegSigmSwapInterpreter


def test_seed_neg_sigmoid_swap_interpreter():
    gm = fx.symbolic_trace(_sigmoid_neg)
    x = torch.randn(3, 4)
    torch.testing.assert_close(_swap_class(fx)(gm).run(x), torch.neg(x).sigmoid())


def _swap_transformer(impl):
    class NegSigmSwapXformer(impl.Transformer):
        def call_function(self, target, args, kwargs):
            if target is torch.sigmoid:
                return torch.neg(*args, **kwargs)
            return super().call_function(target, args, kwargs)

        def call_method(self, target, args, kwargs):
            if target == "neg":
                call_self, *args_tail = args
                return call_self.sigmoid(*args_tail, **kwargs)
            return super().call_method(target, args, kwargs)

    return NegSigmSwapXformer


def test_seed_neg_sigmoid_swap_transformer():
    theirs = _swap_transformer(torch.fx)(torch.fx.symbolic_trace(_sigmoid_neg)).transform()
    ours = _swap_transformer(fx)(fx.symbolic_trace(_sigmoid_neg)).transform()
    assert ours.code == theirs.code
    x = torch.randn(3, 4)
    torch.testing.assert_close(ours(x), torch.neg(x).sigmoid())


def test_fetch_overrides_are_honoured():
    calls = {"fetch": 0, "map": 0}

    class Counting(fx.Interpreter):
        def fetch_args_kwargs_from_env(self, n):
            calls["fetch"] += 1
            return super().fetch_args_kwargs_from_env(n)

        def map_nodes_to_values(self, args, n):
            calls["map"] += 1
            return super().map_nodes_to_values(args, n)

    gm = fx.symbolic_trace(lambda x, y: (x + y).relu() * 2)
    Counting(gm).run(torch.ones(2), torch.ones(2))
    assert calls == {"fetch": 6, "map": 12}  # x, y, add, relu, mul, output


def test_map_nodes_to_values_override_changes_values():
    class Doubling(fx.Interpreter):
        def map_nodes_to_values(self, args, n):
            return fx.node.map_arg(args, lambda a: self.env[a] * 2)

    gm = fx.symbolic_trace(lambda x: x + 1)
    # x is doubled when add reads it, the add result is doubled when output reads it
    assert Doubling(gm).run(torch.tensor(1.0)).item() == 6.0


def test_run_node_override_sees_every_node():
    seen = []

    class Recording(fx.Interpreter):
        def run_node(self, n):
            seen.append(n.name)
            return super().run_node(n)

    gm = fx.symbolic_trace(lambda x: torch.relu(x).sum())
    Recording(gm).run(torch.randn(3))
    assert seen == ["x", "relu", "sum_1", "output"]


def test_interpreter_attributes_match_torch():
    gm_t = torch.fx.symbolic_trace(_sigmoid_neg)
    gm_o = fx.symbolic_trace(_sigmoid_neg)
    t, o = torch.fx.Interpreter(gm_t), fx.Interpreter(gm_o)
    assert o.name == t.name == "Interpreter"
    assert o.extra_traceback is True
    assert o.garbage_collect_values is True
    assert list(o.submodules) == list(t.submodules)
    assert {k.name: [n.name for n in v] for k, v in o.user_to_last_uses.items()} == {
        k.name: [n.name for n in v] for k, v in t.user_to_last_uses.items()
    }
    for meth in ("run", "boxed_run", "run_node", "placeholder", "get_attr", "call_function",
                 "call_method", "call_module", "output", "fetch_attr",
                 "fetch_args_kwargs_from_env", "map_nodes_to_values"):
        assert _params(getattr(fx.Interpreter, meth)) == _params(
            getattr(torch.fx.Interpreter, meth)
        ), meth
    assert _params(fx.Interpreter.__init__) == _params(torch.fx.Interpreter.__init__)
    assert _params(fx.Transformer.__init__) == _params(torch.fx.Transformer.__init__)
    assert _params(fx.Transformer.transform) == _params(torch.fx.Transformer.transform)


def _params(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


# --------------------------------------------------------------------------------------------
# Inputs: defaults, *args, initial_env, boxed_run.


def _defaults_fn(x, y=3):
    return x * y


def test_placeholder_default_and_missing_argument():
    gm = fx.symbolic_trace(_defaults_fn)
    assert fx.Interpreter(gm).run(torch.tensor(2.0)).item() == 6.0
    assert fx.Interpreter(gm).run(torch.tensor(2.0), 4).item() == 8.0
    g = fx.Graph()
    g.output(g.placeholder("a"))
    with pytest.raises(RuntimeError) as ours:
        fx.Interpreter(fx.GraphModule(nn.Module(), g)).run()
    tg = torch.fx.Graph()
    tg.output(tg.placeholder("a"))
    with pytest.raises(RuntimeError) as theirs:
        torch.fx.Interpreter(torch.fx.GraphModule(nn.Module(), tg)).run()
    assert str(ours.value).split("\n")[0] == str(theirs.value).split("\n")[0]
    assert "Expected positional argument for parameter a" in str(ours.value)


def test_star_args_placeholder_takes_the_rest():
    for impl in (torch.fx, fx):
        g = impl.Graph()
        a = g.placeholder("a")
        rest = g.placeholder("*rest")
        g.output((a, rest))
        out = impl.Interpreter(impl.GraphModule(nn.Module(), g)).run(1, 2, 3)
        assert out == (1, [2, 3])


def test_initial_env_short_circuits():
    gm = fx.symbolic_trace(lambda x: torch.relu(x) + 1)
    relu = next(n for n in gm.graph.nodes if n.name == "relu")
    out = fx.Interpreter(gm).run(torch.tensor(-5.0), initial_env={relu: torch.tensor(10.0)})
    assert out.item() == 11.0


def test_boxed_run_clears_and_checks_count():
    gm = fx.symbolic_trace(lambda x, y: x - y)
    args = [torch.tensor(5.0), torch.tensor(2.0)]
    assert fx.Interpreter(gm).boxed_run(args).item() == 3.0
    assert args == []
    tgm = torch.fx.symbolic_trace(lambda x, y: x - y)
    for count in (1, 3):
        with pytest.raises(RuntimeError) as ours:
            fx.Interpreter(gm).boxed_run([torch.ones(1)] * count)
        with pytest.raises(RuntimeError) as theirs:
            torch.fx.Interpreter(tgm).boxed_run([torch.ones(1)] * count)
        assert str(ours.value) == str(theirs.value)


def test_explicit_graph_argument():
    gm = fx.symbolic_trace(lambda x: x + 1)
    other = fx.Graph()
    x = other.placeholder("x")
    other.output(other.call_function(operator.mul, (x, 10)))
    assert fx.Interpreter(gm, graph=other).run(2) == 20


# --------------------------------------------------------------------------------------------
# Errors.


class _Bad(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).relu()


def _error_of(fn):
    with pytest.raises(Exception) as info:
        fn()
    return info.value


def test_error_names_the_node_like_torch():
    torch.manual_seed(0)
    t_gm = torch.fx.symbolic_trace(_Bad())
    o_gm = fx.symbolic_trace(_Bad())
    bad = torch.randn(2, 5)
    theirs = _error_of(lambda: torch.fx.Interpreter(t_gm).run(bad))
    ours = _error_of(lambda: fx.Interpreter(o_gm).run(bad))
    assert type(ours) is type(theirs)
    # message, the failing node and the original stack trace, as torch prints them
    head = str(theirs).split("\nUse tlparse")[0]
    assert str(ours).startswith(head)
    assert "While executing %lin : [num_users=1] = call_module[target=lin]" in str(ours)


def test_error_shows_graph_window_with_marked_node():
    o_gm = fx.symbolic_trace(_Bad())
    message = str(_error_of(lambda: fx.Interpreter(o_gm).run(torch.randn(2, 5))))
    if fx is torch.fx:
        pytest.skip("graph window is an exportir addition")
    assert ">>> %lin" in message
    assert "    %x : " in message and "    %relu : " in message


def test_key_error_becomes_runtime_error():
    def boom(x):
        raise KeyError("missing")

    for impl in (torch.fx, fx):
        g = impl.Graph()
        g.output(g.call_function(boom, (g.placeholder("x"),)))
        err = _error_of(lambda impl=impl, g=g: impl.Interpreter(impl.GraphModule(nn.Module(), g)).run(1))
        assert type(err) is RuntimeError
        assert isinstance(err.__cause__, KeyError)
        assert str(err).startswith("missing\n\nWhile executing %boom")


def test_extra_traceback_off_leaves_error_untouched():
    gm = fx.symbolic_trace(_Bad())
    interp = fx.Interpreter(gm)
    interp.extra_traceback = False
    err = _error_of(lambda: interp.run(torch.randn(2, 5)))
    assert "While executing" not in str(err)


def test_missing_value_and_target_messages_match_torch():
    def build(impl):
        g = impl.Graph()
        x = g.placeholder("x")
        y = g.call_function(torch.relu, (x,))
        z = g.get_attr("nope.deeper")
        g.output((y, z))
        return impl.GraphModule(nn.Module(), g, ) if False else (g, x, y)

    results = []
    for impl in (torch.fx, fx):
        g, _, y = build(impl)
        root = nn.Module()
        root.nope = nn.Module()
        interp = impl.Interpreter(root, graph=g)
        interp.env = {}
        missing = _error_of(lambda interp=interp, y=y: interp.fetch_args_kwargs_from_env(y))
        target = _error_of(lambda interp=interp: interp.fetch_attr("nope.deeper.x"))
        results.append((type(missing), str(missing), type(target), str(target)))
    assert results[0] == results[1]


# --------------------------------------------------------------------------------------------
# Transformer specifics.


class _WithState(nn.Module):
    def __init__(self):
        super().__init__()
        self.sub = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
        self.register_buffer("buf", torch.ones(3))

    def forward(self, x, scale=2.0):
        return self.sub(x).sum(dim=-1, keepdim=True) * scale + self.buf


def test_transformer_keeps_leaf_modules_attrs_and_defaults():
    torch.manual_seed(0)
    theirs = torch.fx.Transformer(torch.fx.symbolic_trace(_WithState())).transform()
    torch.manual_seed(0)
    ours = fx.Transformer(fx.symbolic_trace(_WithState())).transform()
    assert ours.code == theirs.code
    x = torch.randn(2, 3)
    torch.testing.assert_close(ours(x), theirs(x))


def test_transformer_carries_node_meta_and_output_meta():
    gm = fx.symbolic_trace(_WithState())
    for node in gm.graph.nodes:
        node.meta["nn_module_stack"] = {"k": node.name}
        node.meta["stack_trace"] = f"File x.py, line {node.name}"
        node.meta["custom"] = {"tag": 1}
    gm.graph.output_node().meta["extra"] = "kept"
    new = fx.Transformer(gm).transform()
    for old, node in zip(gm.graph.nodes, new.graph.nodes):
        if node.op in ("placeholder", "output"):
            continue
        assert node.meta["nn_module_stack"] == {"k": old.name}
        assert node.stack_trace == f"File x.py, line {old.name}"
        assert node.meta["custom"] == {"tag": 1}
    assert list(new.graph.nodes)[-1].meta["extra"] == "kept"


def test_transformer_decomposition_rule():
    """A call_function override expanding relu into (x > 0) * x, as in the seed."""

    def make(impl):
        class Decompose(impl.Transformer):
            def call_function(self, target, args, kwargs):
                if target is torch.relu:
                    (x,) = args
                    return (x > 0) * x
                return super().call_function(target, args, kwargs)

        return Decompose

    fn = lambda x: torch.relu(x) + 1
    theirs = make(torch.fx)(torch.fx.symbolic_trace(fn)).transform()
    ours = make(fx)(fx.symbolic_trace(fn)).transform()
    assert ours.code == theirs.code
    x = torch.randn(5)
    torch.testing.assert_close(ours(x), torch.relu(x) + 1)
