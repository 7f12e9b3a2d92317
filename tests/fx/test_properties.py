"""Property tests over random graphs built with the Graph API.

- codegen -> GraphModule, the Interpreter and a direct node-by-node evaluation agree;
- random erase/insert/replace edit sequences keep ``lint()`` clean and the program correct;
- dead code elimination never removes an impure node;
- ``to_folder`` output imports and computes the same thing.
"""

import importlib
import operator
import sys
import uuid

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import exportir.fx as efx

UNARY = [torch.neg, torch.sin, torch.relu, torch.tanh, ("method", "exp"), ("method", "abs")]
BINARY = [operator.add, operator.mul, operator.sub, torch.add, torch.maximum, ("method", "mul")]

_settings = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def programs(draw):
    """A random DAG: (n_inputs, [(op_index, arg_indices)...], output_indices)."""
    n_inputs = draw(st.integers(1, 3))
    steps = []
    for i in range(draw(st.integers(1, 25))):
        avail = n_inputs + i
        if draw(st.booleans()):
            steps.append(("u", draw(st.integers(0, len(UNARY) - 1)), (draw(st.integers(0, avail - 1)),)))
        else:
            a = draw(st.integers(0, avail - 1))
            b = draw(st.integers(0, avail - 1))
            steps.append(("b", draw(st.integers(0, len(BINARY) - 1)), (a, b)))
    total = n_inputs + len(steps)
    outs = draw(st.lists(st.integers(0, total - 1), min_size=1, max_size=3))
    return n_inputs, steps, outs


def _emit(g, fn, args):
    if isinstance(fn, tuple):
        return g.call_method(fn[1], args)
    return g.call_function(fn, args)


def build(program):
    n_inputs, steps, outs = program
    g = efx.Graph()
    values = [g.placeholder(f"x{i}") for i in range(n_inputs)]
    for kind, idx, arg_idx in steps:
        fn = (UNARY if kind == "u" else BINARY)[idx]
        values.append(_emit(g, fn, tuple(values[a] for a in arg_idx)))
    g.output(tuple(values[o] for o in outs))
    return g


def evaluate(program, inputs):
    """Direct evaluation of the program description, independent of FX."""
    _, steps, outs = program
    values = list(inputs)
    for kind, idx, arg_idx in steps:
        fn = (UNARY if kind == "u" else BINARY)[idx]
        args = [values[a] for a in arg_idx]
        values.append(getattr(args[0], fn[1])(*args[1:]) if isinstance(fn, tuple) else fn(*args))
    return tuple(values[o] for o in outs)


def _inputs(n):
    gen = torch.Generator().manual_seed(n)
    return [torch.randn(4, generator=gen) for _ in range(n)]


def _close(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, equal_nan=True)


@_settings
@given(programs())
def test_codegen_interpreter_and_direct_eval_agree(program):
    g = build(program)
    g.lint()
    gm = efx.GraphModule(torch.nn.Module(), g)
    inputs = _inputs(program[0])
    expected = evaluate(program, inputs)
    _close(gm(*inputs), expected)
    _close(efx.Interpreter(gm).run(*inputs), expected)


@st.composite
def edits(draw):
    return draw(st.lists(st.tuples(st.sampled_from(["erase_dead", "insert", "replace", "move"]),
                                   st.integers(0, 10_000)), max_size=15))


def _apply_edit(g, kind, seed):
    nodes = [n for n in g.nodes if n.op == "call_function" or n.op == "call_method"]
    if not nodes:
        return
    n = nodes[seed % len(nodes)]
    if kind == "erase_dead":
        dead = [m for m in nodes if not m.users]
        if dead:
            g.erase_node(dead[seed % len(dead)])
    elif kind == "insert":
        # insert an identity-preserving pair after n and reroute n's users through it
        with g.inserting_after(n):
            neg = g.call_function(torch.neg, (n,))
        with g.inserting_after(neg):
            back = g.call_function(torch.neg, (neg,))
        n.replace_all_uses_with(back, delete_user_cb=lambda u: u is not neg)
    elif kind == "replace":
        # x * 1 rewritten to x: build mul-by-one, then replace it by its input
        with g.inserting_after(n):
            one = g.call_function(operator.mul, (n, 1.0))
        one.replace_all_uses_with(n)
        g.erase_node(one)
    elif kind == "move" and n.users:
        # move a node as late as possible: just before its first user
        min(n.users).prepend(n)


@_settings
@given(programs(), edits())
def test_edit_sequences_keep_lint_clean_and_semantics(program, edit_list):
    g = build(program)
    for kind, seed in edit_list:
        _apply_edit(g, kind, seed)
        g.lint()
    gm = efx.GraphModule(torch.nn.Module(), g)
    inputs = _inputs(program[0])
    _close(gm(*inputs), evaluate(program, inputs))


@_settings
@given(programs(), st.lists(st.integers(0, 100), max_size=5))
def test_dce_never_removes_impure_nodes(program, impure_positions):
    g = build(program)
    out = g.output_node()
    x = next(iter(g.nodes))
    impure = []
    for pos in impure_positions:
        with g.inserting_before(out):
            target = [torch._assert, operator.setitem][pos % 2]
            args = (x, "msg") if target is torch._assert else (x, 0, float(pos))
            impure.append(g.call_function(target, args))
    g.eliminate_dead_code()
    g.lint()
    remaining = set(g.nodes)
    assert all(n in remaining for n in impure)
    assert all(n.users or n.is_impure() for n in g.nodes)


@settings(max_examples=8, deadline=None)
@given(programs())
def test_to_folder_imports_and_agrees(tmp_path_factory, program):
    folder = tmp_path_factory.mktemp("fx")
    name = f"fxmod_{uuid.uuid4().hex}"
    gm = efx.GraphModule(torch.nn.Module(), build(program))
    gm.to_folder(folder / name, "Generated")
    sys.path.insert(0, str(folder))
    try:
        mod = importlib.import_module(name)
        loaded = mod.Generated()
    finally:
        sys.path.remove(str(folder))
    inputs = _inputs(program[0])
    _close(loaded(*inputs), evaluate(program, inputs))
