"""Differential tests of ``replace_pattern`` / ``SubgraphMatcher`` against torch.fx.

Each case builds the same program in both implementations, rewrites it with the same
pattern/replacement, and compares the rewritten code, the graph text, the returned matches
(anchor and node mapping, by name) and the numerics of the rewritten module.

Sanity mode: ``EXPORTIR_FX_IMPL=torch.fx`` runs this file with torch.fx on both sides.
"""

from __future__ import annotations

import importlib
import random

import pytest
import torch
import torch.fx
import torch.fx.subgraph_rewriter as t_rewriter
from conftest import import_ours_fx, ours_fx_name
from torch import nn
from torch.fx.passes.utils.matcher_utils import SubgraphMatcher as TMatcher

fx = import_ours_fx()
o_rewriter = importlib.import_module(f"{ours_fx_name()}.subgraph_rewriter")
OMatcher = importlib.import_module(f"{ours_fx_name()}.passes.utils.matcher_utils").SubgraphMatcher


def _name(v):
    return v.name if type(v).__name__ == "Node" else repr(v)


def describe_matches(matches):
    return [
        (m.anchor.name, [(k.name, _name(v)) for k, v in m.nodes_map.items()]) for m in matches
    ]


def describe_replaced(replaced):
    return [
        (r.anchor.name, [(k.name, _name(v)) for k, v in r.nodes_map.items()],
         [_name(n) for n in r.replacements])
        for r in replaced
    ]


def rewrite_both(make_root, pattern, replacement, inputs=None, **filters):
    """Rewrite ``make_root()`` in both implementations; compare everything; return ours."""
    roots = []
    for impl in (torch.fx, fx):
        torch.manual_seed(0)
        roots.append(make_root())
    t_gm, o_gm = torch.fx.symbolic_trace(roots[0]), fx.symbolic_trace(roots[1])
    if filters:
        theirs = t_rewriter.replace_pattern_with_filters(t_gm, pattern, replacement, **filters)
        ours = o_rewriter.replace_pattern_with_filters(o_gm, pattern, replacement, **filters)
        assert describe_replaced(ours) == describe_replaced(theirs)
    else:
        theirs = t_rewriter.replace_pattern(t_gm, pattern, replacement)
        ours = o_rewriter.replace_pattern(o_gm, pattern, replacement)
        assert describe_matches(ours) == describe_matches(theirs)
        assert all(isinstance(m, o_rewriter.Match) for m in ours)
    assert str(o_gm.graph) == str(t_gm.graph)
    assert o_gm.code == t_gm.code
    if inputs is not None:
        torch.testing.assert_close(o_gm(*inputs), t_gm(*inputs))
    return o_gm, ours


class _Fn(nn.Module):
    """Wrap a plain function as a module so both tracers get a fresh root."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def fn_root(fn):
    return lambda: fn


# --------------------------------------------------------------------------------------------
# The seed's examples.


class SeedM(nn.Module):
    def forward(self, x, w1, w2):
        m1 = torch.cat([w1, w2]).sum()
        m2 = torch.cat([w1, w2]).sum()
        return x + torch.max(m1) + torch.max(m2)


def test_seed_cat_sum_to_stack():
    def pattern(w1, w2):
        return torch.cat([w1, w2]).sum()

    def replacement(w1, w2):
        return torch.stack([w1, w2])

    args = (torch.randn(2), torch.randn(2), torch.randn(2))
    gm, matches = rewrite_both(SeedM, pattern, replacement, args)
    assert len(matches) == 2
    assert "torch.stack" in gm.code and "torch.cat" not in gm.code


def test_seed_docstring_cat_to_stack():
    def pattern(w1, w2):
        return torch.cat([w1, w2])

    def replacement(w1, w2):
        return torch.stack([w1, w2])

    args = (torch.randn(2), torch.randn(2), torch.randn(2))
    gm, _ = rewrite_both(SeedM, pattern, replacement, args)
    expected_body = [
        "stack = torch.stack([w1, w2])",
        "sum_1 = stack.sum();  stack = None",
        "stack_1 = torch.stack([w1, w2]);  w1 = w2 = None",
        "sum_2 = stack_1.sum();  stack_1 = None",
    ]
    lines = [line.strip() for line in gm.code.splitlines()]
    for line in expected_body:
        assert line in lines


def test_seed_unused_parameter_in_replacement():
    def pattern(x, y):
        return torch.neg(x) + torch.relu(y)

    def replacement(x, y):
        return torch.relu(x)

    def prog(a, b, c):
        return (torch.neg(a) + torch.relu(b)) * (torch.neg(b) + torch.relu(c))

    args = (torch.randn(3), torch.randn(3), torch.randn(3))
    rewrite_both(fn_root(prog), pattern, replacement, args)


# --------------------------------------------------------------------------------------------
# Matching semantics.


def test_overlapping_matches_first_wins():
    def pattern(x):
        return torch.relu(torch.relu(x))

    def replacement(x):
        return torch.sigmoid(x)

    def prog(x):
        return torch.relu(torch.relu(torch.relu(torch.relu(torch.relu(x)))))

    _, matches = rewrite_both(fn_root(prog), pattern, replacement, (torch.randn(4),))
    assert len(matches) == 2


def test_replacement_output_feeds_next_match():
    """A later match binds a node an earlier replacement substituted."""

    def pattern(x):
        return torch.relu(x)

    def replacement(x):
        return torch.neg(x)

    def prog(x):
        return torch.relu(torch.relu(x) + 1)

    rewrite_both(fn_root(prog), pattern, replacement, (torch.randn(4),))

    def prog2(x):
        return torch.relu(torch.relu(torch.relu(x)))

    rewrite_both(fn_root(prog2), pattern, replacement, (torch.randn(4),))


def test_literals_must_match_unless_ignored():
    def pattern(x):
        return x + 1

    def replacement(x):
        return x * 3

    def prog(x):
        return (x + 1) + 2

    _, matches = rewrite_both(fn_root(prog), pattern, replacement, (torch.randn(2),))
    assert len(matches) == 1
    _, replaced = rewrite_both(
        fn_root(prog), pattern, replacement, (torch.randn(2),), ignore_literals=True
    )
    assert len(replaced) == 2


def test_not_contained_internal_value_used_outside():
    def pattern(x):
        return torch.sigmoid(torch.relu(x))

    def replacement(x):
        return torch.tanh(x)

    def prog(x):
        r = torch.relu(x)
        return torch.sigmoid(r) + r

    _, matches = rewrite_both(fn_root(prog), pattern, replacement, (torch.randn(2),))
    assert matches == []


def test_two_placeholders_cannot_bind_one_value():
    def pattern(x, y):
        return torch.add(x, y)

    def replacement(x, y):
        return torch.sub(x, y)

    def prog(a, b):
        return torch.add(a, a) * torch.add(a, b)

    _, matches = rewrite_both(fn_root(prog), pattern, replacement,
                              (torch.randn(2), torch.randn(2)))
    assert len(matches) == 1


def test_placeholder_binds_literal_and_nested_lists():
    def pattern(x, y):
        return torch.cat([x, y], 0)

    def replacement(x, y):
        return torch.cat([y, x], 0)

    def prog(a, b):
        return torch.cat([a, b], 0) + torch.cat([b, a], 1).sum()

    rewrite_both(fn_root(prog), pattern, replacement, (torch.randn(2, 2), torch.randn(2, 2)))


def test_multi_output_pattern():
    def pattern(x):
        a = torch.relu(x)
        b = torch.sigmoid(x)
        return a, b

    def replacement(x):
        return torch.tanh(x), torch.neg(x)

    def prog(x, y):
        return torch.relu(x) * torch.sigmoid(x) + torch.relu(y) - torch.sigmoid(y)

    rewrite_both(fn_root(prog), pattern, replacement, (torch.randn(3), torch.randn(3)))


def test_replacement_returning_its_input():
    def pattern(x):
        return torch.relu(torch.relu(x))

    def replacement(x):
        return x

    def prog(x):
        return torch.relu(torch.relu(x)) + 1

    rewrite_both(fn_root(prog), pattern, replacement, (torch.randn(3),))


def test_call_method_and_kwargs_pattern():
    def pattern(x):
        return x.sum(dim=0, keepdim=True).relu()

    def replacement(x):
        return x.mean(dim=0, keepdim=True)

    def prog(x):
        return x.sum(dim=0, keepdim=True).relu() + x.sum(dim=1, keepdim=True).relu()

    _, matches = rewrite_both(fn_root(prog), pattern, replacement, (torch.randn(3, 3),))
    assert len(matches) == 1


def test_unused_match_output_inserted_after_last_returning_node():
    def pattern(x):
        return torch.relu(x)

    def replacement(x):
        return torch.sigmoid(x)

    def prog(x):
        torch.relu(x)
        return x + 1

    rewrite_both(fn_root(prog), pattern, replacement, (torch.randn(3),))


def test_cycle_forming_match_is_rejected():
    """Fusing {relu, add} would need neg, which reads relu and feeds add."""

    def pattern(x, w):
        a = torch.relu(x)
        return a, a + w

    def replacement(x, w):
        a = torch.sigmoid(x)
        return a, a - w

    def prog(x):
        a = torch.relu(x)
        w = torch.neg(a)
        return a + w, a

    _, matches = rewrite_both(fn_root(prog), pattern, replacement, (torch.randn(3),))
    assert matches == []


class _WithSub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return torch.relu(self.lin(x))


def test_graph_module_replacement_brings_submodules_and_attrs():
    class Repl(nn.Module):
        def __init__(self):
            super().__init__()
            self.extra = nn.Linear(3, 3)
            self.scale = nn.Parameter(torch.full((3,), 2.0))

        def forward(self, x):
            return self.extra(x) * self.scale

    def pattern(x):
        return torch.relu(x)

    torch.manual_seed(1)
    t_rep = torch.fx.symbolic_trace(Repl())
    torch.manual_seed(1)
    o_rep = fx.symbolic_trace(Repl())
    torch.manual_seed(0)
    t_gm = torch.fx.symbolic_trace(_WithSub())
    torch.manual_seed(0)
    o_gm = fx.symbolic_trace(_WithSub())
    theirs = t_rewriter.replace_pattern(t_gm, pattern, t_rep)
    ours = o_rewriter.replace_pattern(o_gm, pattern, o_rep)
    assert describe_matches(ours) == describe_matches(theirs)
    assert o_gm.code == t_gm.code
    assert sorted(dict(o_gm.named_parameters())) == sorted(dict(t_gm.named_parameters()))
    x = torch.randn(2, 3)
    torch.testing.assert_close(o_gm(x), t_gm(x))


def test_match_filters_callback_and_name_match():
    def pattern(x):
        return torch.relu(x)

    def replacement(x):
        return torch.sigmoid(x)

    def prog(x):
        return torch.relu(x) + torch.relu(x + 1) + torch.relu(x - 1)

    def only_from_add(match, original_graph, pattern_graph):
        return match.placeholder_nodes[0].name.startswith("add")

    rewrite_both(fn_root(prog), pattern, replacement, (torch.randn(3),),
                 match_filters=[only_from_add])

    def callback(impl):
        def build(match, original_graph, pattern_graph):
            g = impl.Graph()
            x = g.placeholder("x")
            g.output(g.call_function(torch.tanh, (x,)))
            return g

        return build

    def prog2(x):
        return torch.relu(x) * 2

    torch_cb, ours_cb = callback(torch.fx), callback(fx)
    t_gm, o_gm = torch.fx.symbolic_trace(prog2), fx.symbolic_trace(prog2)
    theirs = t_rewriter.replace_pattern_with_filters(t_gm, pattern, replacement_callback=torch_cb)
    ours = o_rewriter.replace_pattern_with_filters(o_gm, pattern, replacement_callback=ours_cb)
    assert describe_replaced(ours) == describe_replaced(theirs)
    assert o_gm.code == t_gm.code

    def pattern_neg(x):
        return torch.neg(x)

    rewrite_both(fn_root(prog), pattern_neg, replacement, (torch.randn(3),),
                 node_name_match="relu_1")


def test_requires_replacement_or_callback():
    gm = fx.symbolic_trace(lambda x: torch.relu(x))
    with pytest.raises(AssertionError, match="Must provide either a replacement"):
        o_rewriter.replace_pattern_with_filters(gm, lambda x: torch.relu(x), None)


# --------------------------------------------------------------------------------------------
# SubgraphMatcher directly.


def _graph_of(impl, fn):
    return impl.symbolic_trace(fn).graph


def test_matcher_rejects_empty_and_dead_code_patterns():
    with pytest.raises(ValueError, match="empty pattern"):
        OMatcher(fx.Graph())

    def dead(x):
        torch.relu(x)  # not used, and relu is pure
        return torch.neg(x)

    with pytest.raises(AssertionError, match="dead code"):
        OMatcher(_graph_of(fx, dead))


@pytest.mark.parametrize("match_output", [False, True])
@pytest.mark.parametrize("match_placeholder", [False, True])
def test_matcher_flags_match_torch(match_output, match_placeholder):
    def pattern(x):
        return torch.relu(x) + 1

    def prog(x, y):
        return torch.relu(x) + 1, torch.relu(torch.relu(y) + 1) + 1

    theirs = TMatcher(_graph_of(torch.fx, pattern), match_output, match_placeholder)
    ours = OMatcher(_graph_of(fx, pattern), match_output, match_placeholder)
    t_matches = theirs.match(_graph_of(torch.fx, prog))
    o_matches = ours.match(_graph_of(fx, prog))
    assert [
        ([a.name for a in m.anchors], [(k.name, _name(v)) for k, v in m.nodes_map.items()],
         [_name(n) for n in m.placeholder_nodes], [_name(n) for n in m.returning_nodes])
        for m in o_matches
    ] == [
        ([a.name for a in m.anchors], [(k.name, _name(v)) for k, v in m.nodes_map.items()],
         [_name(n) for n in m.placeholder_nodes], [_name(n) for n in m.returning_nodes])
        for m in t_matches
    ]


def test_matcher_normalizes_op_overload_arguments():
    aten = torch.ops.aten

    def build(impl, with_default):
        g = impl.Graph()
        x = g.placeholder("x")
        args = (x, 0, True) if with_default else (x, 0)
        g.output(g.call_function(aten.softmax.int, args))
        return g

    for impl, matcher in ((torch.fx, TMatcher), (fx, OMatcher)):
        pattern = build(impl, with_default=False)
        found = matcher(pattern).match(build(impl, with_default=True))
        assert len(found) == 0  # schema default for half_to_float is None, not True
        found = matcher(pattern).match(build(impl, with_default=False))
        assert len(found) == 1


# --------------------------------------------------------------------------------------------
# Random programs x a table of patterns.

PATTERNS = [
    (lambda x: torch.relu(x), lambda x: torch.sigmoid(x)),
    (lambda x: torch.relu(torch.neg(x)), lambda x: torch.neg(torch.relu(x))),
    (lambda x, y: x + y, lambda x, y: x - y),
    (lambda x, y: torch.mul(torch.relu(x), y), lambda x, y: x * y),
    (lambda x: torch.sigmoid(x) * 2, lambda x: torch.tanh(x)),
]


OPS = {
    "relu": lambda a, b: torch.relu(a),
    "neg": lambda a, b: torch.neg(a),
    "sigmoid": lambda a, b: torch.sigmoid(a),
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "tmul": lambda a, b: torch.mul(a, b),
    "scale": lambda a, b: a * 2,
}


def _random_program(seed):
    rng = random.Random(seed)
    ops = ["relu", "neg", "sigmoid", "add", "mul", "tmul", "scale"]
    plan = [(rng.choice(ops), rng.randrange(1000), rng.randrange(1000)) for _ in range(30)]

    def prog(x, y):
        values = [x, y]
        for op, i, j in plan:
            a, b = values[i % len(values)], values[j % len(values)]
            values.append(OPS[op](a, b))
        return values[-1], values[-5]

    return prog


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("which", range(len(PATTERNS)))
def test_random_programs_match_torch(seed, which):
    pattern, replacement = PATTERNS[which]
    prog = _random_program(seed)
    inputs = (torch.randn(3), torch.randn(3))
    rewrite_both(fn_root(prog), pattern, replacement, inputs)


def test_many_matches_stay_in_order():
    def prog(x):
        for _ in range(300):
            x = torch.sigmoid(torch.relu(x)) + 1
        return x

    def pattern(x):
        return torch.sigmoid(torch.relu(x))

    def replacement(x):
        return torch.tanh(x)

    _, matches = rewrite_both(fn_root(prog), pattern, replacement, (torch.randn(3),))
    assert len(matches) == 300
