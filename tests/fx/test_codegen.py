"""Code generation parity: ``Graph.python_code`` of ours against torch.fx 2.13.

Each case builds the same graph through the Graph API of both implementations and compares the
generated source, the global names, the line -> node map and the prologue position. Runtime
behaviour of the generated code is checked by executing it.

Sanity mode: ``EXPORTIR_FX_IMPL=torch.fx`` runs the graph-level cases with torch.fx on both sides.
"""

# ruff: noqa: UP006, UP007, UP045, S102  # the typing spellings are under test; exec runs generated code

from __future__ import annotations

import collections
import enum
import importlib
import math
import operator
import typing

import pytest
import torch
import torch.fx
import torch.utils._pytree as torch_pytree
from conftest import TORCH_WRAP_CALL, import_ours_fx, torch_code_as_ours
from torch.fx.passes.shape_prop import TensorMetadata

ours = import_ours_fx()
ours_graph = importlib.import_module(f"{ours.__name__}.graph")
ours_codegen = (
    ours_graph if ours is torch.fx else importlib.import_module(f"{ours.__name__}.codegen")
)
ours_pytree = torch_pytree if ours is torch.fx else importlib.import_module("exportir.pytree")


# --------------------------------------------------------------------------- shared objects


def user_fn(x, y=1):
    return x + y


def _other_user_fn(x):
    return x


_other_user_fn.__name__ = "user_fn"  # same name as user_fn: the second gets "user_fn_1"


class Color(enum.Enum):
    RED = 1


Point = collections.namedtuple("Point", ["x", "y"])


class MyType:
    pass


# --------------------------------------------------------------------------- graph builders


def g_basic(fx):
    g = fx.Graph()
    x = g.placeholder("x", type_expr=torch.Tensor)
    y = g.placeholder("y", default_value=3)
    a = g.call_function(torch.add, (x, y), {"alpha": 2})
    b = g.call_method("relu", (a,))
    g.output((b, a), type_expr=tuple)
    return g


def g_magic(fx):
    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    cur = x
    binary = ["add", "sub", "mul", "floordiv", "truediv", "mod", "pow", "lshift", "rshift",
              "and_", "or_", "xor", "matmul", "eq", "ne", "lt", "gt", "le", "ge", "getitem"]
    for name in binary:
        cur = g.call_function(getattr(operator, name), (cur, y))
    for name in ["pos", "neg", "invert"]:
        cur = g.call_function(getattr(operator, name), (cur,))
    g.output(cur)
    return g


def g_inplace(fx):
    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    cur = x
    for name in ["iadd", "iand", "ifloordiv", "ilshift", "imod", "imul", "imatmul", "ior",
                 "ipow", "irshift", "isub", "itruediv", "ixor"]:
        cur = g.call_function(getattr(operator, name), (cur, y))
    g.call_function(operator.setitem, (cur, 0, y))
    g.output(cur)
    return g


def g_getattr(fx):
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(getattr, (x, "shape"))
    b = g.call_function(getattr, (x, "not-ident"))
    c = g.call_function(getattr, (x, "missing", None))
    d = g.call_function(operator.getitem, (a, slice(1, None, -1)))
    e = g.call_function(operator.getitem, (x, (Ellipsis, None, slice(None, 2))))
    g.output([a, b, c, d, e])
    return g


def g_modules_attrs(fx):
    g = fx.Graph()
    x = g.placeholder("x")
    w = g.get_attr("sub.weight")
    w2 = g.get_attr("layers.0.bias")
    m = g.call_module("layers.0", (x,), {"scale": w})
    m2 = g.call_module("block.conv-1", (m, w2))
    m3 = g.call_module("Linear", (m2,))
    g.output(m3)
    return g


def g_constants(fx):
    g = fx.Graph()
    x = g.placeholder("x")
    consts = [
        torch.float16, torch.device("cpu"), math.inf, -math.inf, math.nan, None, True, 1.5,
        1 + 2j, "it's \"quoted\"", b"bytes", (1,), (), [1, [2, (3,)]], {"k": x, 2: "v"},
        torch.zeros(2, 3), torch.channels_last, torch.strided, Color.RED, Point(1, 2),
        slice(None), Ellipsis, torch.ops.aten.add.Tensor, frozenset(),
    ]
    out = g.call_function(user_fn, (x, consts))
    g.output(out)
    return g


def g_torch_ops(fx):
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.ops.aten.add.Tensor, (x, x), {"alpha": 2})
    b = g.call_function(torch.ops.aten.sum.dim_IntList, (a, [0]), {"keepdim": True})
    c = g.call_function(torch.ops.aten.relu, (b,))
    d = g.call_function(torch.Tensor.add, (c, 1))
    e = g.call_function(torch.nn.functional.relu, (d,), {"inplace": False})
    f = g.call_function(torch._C._nn.linear, (e, x))
    h = g.call_function(torch.sum, (f,), {"dtype": torch.float32})
    s = g.call_function(torch.segment_reduce, (h, "sum"))
    g.output(s)
    return g


def g_names(fx):
    """Node names that collide with globals, builtins and each other."""
    g = fx.Graph()
    t = g.placeholder("torch")
    i = g.placeholder("inf")
    dev = g.placeholder("device")
    p = g.placeholder("print")
    lst = g.placeholder("list")
    star = g.placeholder("*args")
    a = g.call_function(user_fn, (t, i))
    b = g.call_function(_other_user_fn, (a,))
    c = g.call_function(print, (b, dev, p, lst, star))
    d = g.create_node("call_function", user_fn, (c,), name="user_fn")
    e = g.create_node("call_method", "foo", (d,), name="getattr")
    g.output(e)
    return g


def g_types(fx):
    g = fx.Graph()
    a = g.placeholder("a", type_expr=typing.List[int])
    b = g.placeholder("b", type_expr=list[int])
    c = g.placeholder("c", type_expr=typing.Optional[torch.Tensor])
    d = g.placeholder("d", type_expr=int | None)
    e = g.placeholder("e", type_expr=typing.Tuple[()])
    f = g.placeholder("f", type_expr=typing.Dict[str, torch.Tensor])
    h = g.placeholder("h", type_expr=MyType)
    k = g.placeholder("k", type_expr=type(None))
    n = g.call_function(user_fn, (a, b), type_expr=torch.Tensor)
    m = g.call_method("foo", (n, c, d, e, f, h, k), type_expr=typing.Union[int, str])
    g.output(m, type_expr=typing.Tuple[torch.Tensor, ...])
    return g


def g_side_effects(fx):
    g = fx.Graph()
    x = g.placeholder("x")
    g.call_function(torch._assert, (x, "msg"))
    unused = g.call_function(user_fn, (x,))
    g.call_method("add_", (unused, 1))
    g.output(None)
    return g


def g_empty(fx):
    return fx.Graph()


def g_only_placeholders(fx):
    g = fx.Graph()
    g.placeholder("x")
    g.placeholder("y")
    return g


def g_only_output(fx):
    g = fx.Graph()
    g.output(1)
    return g


def g_deep_nesting(fx):
    g = fx.Graph()
    xs = [g.placeholder(f"x{i}") for i in range(4)]
    a = g.call_function(torch.cat, ([xs[0], xs[1]],), {"dim": 0})
    b = g.call_function(user_fn, ((a, [xs[2], {"q": (xs[3],)}]),))
    g.output({"a": a, "b": [b, (xs[0],)]})
    return g


def g_wrapped(fx):
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(user_fn, (x,))
    a.meta["is_wrapped"] = True
    b = g.call_function(_other_user_fn, (a,))
    b.meta["is_wrapped"] = True
    g.output(b)
    return g


def _tensor_meta_graph(fx):
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.zeros(2, 3)
    a = g.call_function(torch.relu, (x,))
    a.meta["val"] = torch.zeros(3, 2, dtype=torch.float16).t()
    a.meta["stack_trace"] = (
        'Traceback:\n  File "/a/model.py", line 12, in forward\n    y = torch.relu(x)\n'
    )
    a.meta["custom"] = {"tag": "x" * 50, "n": 1}
    a.meta["desc"] = "relu out"
    b = g.call_method("sum", (a,))
    b.meta["tensor_meta"] = TensorMetadata(
        torch.Size([]), torch.int64, False, (), torch.contiguous_format, False, {}
    )
    b.meta["stack_trace"] = a.meta["stack_trace"]
    b.meta["custom"] = a.meta["custom"]
    c = g.call_function(user_fn, (b,))
    c.meta["val"] = torch.nn.Parameter(torch.zeros(1))
    c.meta["nn_module_stack"] = "stack-info"
    x.meta["desc"] = "user input x"
    g.output((c, b))
    g.output_node().meta["desc"] = ["first", "second"]
    return g


BUILDERS = {
    f.__name__: f
    for f in [
        g_basic, g_magic, g_inplace, g_getattr, g_modules_attrs, g_constants, g_torch_ops,
        g_names, g_types, g_side_effects, g_empty, g_only_placeholders, g_only_output,
        g_deep_nesting, g_wrapped, _tensor_meta_graph,
    ]
}


def _global_names(pc) -> set[str]:
    return set(pc.globals)


def assert_same_code(theirs, mine):
    # torch.fx's wrap lines name torch.fx itself (no global); ours name the ``exportir`` package.
    expected_globals = _global_names(theirs)
    if TORCH_WRAP_CALL in theirs.src and ours is not torch.fx:
        expected_globals.add("exportir")
    assert mine.src == torch_code_as_ours(theirs.src)
    assert _global_names(mine) == expected_globals
    assert mine._lineno_map == theirs._lineno_map
    assert mine._prologue_start == theirs._prologue_start


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_python_code_matches_torch(name):
    build = BUILDERS[name]
    assert_same_code(build(torch.fx).python_code("self"), build(ours).python_code("self"))


@pytest.mark.parametrize("name", sorted(BUILDERS))
@pytest.mark.parametrize(
    "options",
    [
        {"verbose": True},
        {"verbose": True, "include_stride": True, "include_device": True},
        {"verbose": True, "colored": True, "additional_meta": ["nn_module_stack", "absent"]},
        {"expanded_def": True},
        {"record_func": True},
    ],
    ids=["verbose", "verbose-stride-device", "verbose-colored-meta", "expanded", "record"],
)
def test_python_code_options_match_torch(name, options):
    build = BUILDERS[name]
    theirs = build(torch.fx).python_code("self", **options)
    mine = build(ours).python_code("self", **options)
    assert_same_code(theirs, mine)


def test_root_module_name_is_used():
    theirs = g_modules_attrs(torch.fx).python_code("root")
    mine = g_modules_attrs(ours).python_code("root")
    assert_same_code(theirs, mine)
    assert "root.sub.weight" in mine.src


def test_show_env_flags(monkeypatch):
    monkeypatch.setenv("FX_GRAPH_SHOW_META", "1")
    monkeypatch.setenv("FX_GRAPH_SHOW_STRIDE", "1")
    monkeypatch.setenv("FX_GRAPH_SHOW_DEVICE", "1")
    theirs = _tensor_meta_graph(torch.fx).python_code("self", verbose=True)
    mine = _tensor_meta_graph(ours).python_code("self", verbose=True)
    assert_same_code(theirs, mine)
    assert '"""' in mine.src


def test_names_avoid_globals_and_builtins():
    src = g_names(ours).python_code("self").src
    assert "def forward(self, torch, inf, device, print, list, *args):" in src
    assert "torch_1 = torch" in src
    assert "user_fn_1" in src


def test_node_reprs_are_restored_after_codegen():
    g = g_names(ours)
    before = [repr(n) for n in g.nodes]
    g.python_code("self")
    assert [repr(n) for n in g.nodes] == before


def test_generated_code_runs():
    g = ours.Graph()
    x, y = g.placeholder("x"), g.placeholder("y", default_value=2)
    a = g.call_function(operator.mul, (x, y))
    b = g.call_function(operator.iadd, (a, 1))
    c = g.call_function(torch.add, (b, x), {"alpha": 3})
    d = g.call_method("neg", (c,))
    e = g.call_function(getattr, (d, "shape"))
    g.output((d, e))
    pc = g.python_code("self")
    scope = dict(pc.globals)
    exec(pc.src, scope)
    out, shape = scope["forward"](None, torch.ones(2))
    assert torch.equal(out, -(torch.full((2,), 3.0) + 3))
    assert shape == torch.Size([2])


def test_python_code_is_pure():
    g = g_basic(ours)
    assert g.python_code("self").src == g.python_code("self").src
    assert str(g) == str(g_basic(ours))


# --------------------------------------------------------------------------- custom codegen


def _make_custom_codegen(fx):
    class ListCodeGen(fx.graph.CodeGen):
        def gen_fn_def(self, free_vars, maybe_return_annotation):
            args = ", ".join(free_vars)
            return f"def forward(self, args_list: List[torch.Tensor]){maybe_return_annotation}:\n    {args} = args_list"

        def additional_globals(self):
            return [("List", typing.List)]

        def process_inputs(self, *inputs):
            return inputs[0]

        def generate_output(self, output_args):
            return f"return list({output_args!r})"

    return ListCodeGen


@pytest.mark.parametrize("name", ["g_basic", "g_deep_nesting", "g_only_output"])
def test_custom_codegen_subclass(name):
    graphs = {}
    for fx in (torch.fx, ours):
        g = BUILDERS[name](fx)
        g.set_codegen(_make_custom_codegen(fx)())
        graphs[fx] = g
    assert_same_code(graphs[torch.fx].python_code("self"), graphs[ours].python_code("self"))
    assert graphs[ours].process_inputs([1, 2]) == [1, 2]


def test_boxed_codegen():
    tg, og = g_basic(torch.fx), g_basic(ours)
    tg.set_codegen(torch.fx.graph._BoxedCodeGen())
    og.set_codegen(ours_codegen._BoxedCodeGen())
    assert_same_code(tg.python_code("self"), og.python_code("self"))


@pytest.mark.parametrize("func_name", ["forward", "fw_graph"])
def test_func_name_hook(func_name):
    tg, og = g_basic(torch.fx), g_basic(ours)
    tg._codegen._func_name = func_name
    og._codegen._func_name = func_name
    assert_same_code(tg.python_code("self"), og.python_code("self"))


# --------------------------------------------------------------------------- on_generate_code


def _insert_pdb(body):
    return ["import pdb; pdb.set_trace()\n", *body]


def test_on_generate_code_transformer_and_restore():
    codes = {}
    for fx in (torch.fx, ours):
        g = g_side_effects(fx)
        seen = []

        def spy(body, seen=seen):
            seen.append(list(body))
            return body

        with g.on_generate_code(lambda _: _insert_pdb):
            with_pdb = g.python_code("self")
        g.on_generate_code(lambda cur: (lambda body: spy(cur(body) if cur else body)))
        chained = g.python_code("self")
        codes[fx] = (with_pdb, chained, seen)
    (t_pdb, t_chain, t_seen), (o_pdb, o_chain, o_seen) = codes[torch.fx], codes[ours]
    assert_same_code(t_pdb, o_pdb)
    assert_same_code(t_chain, o_chain)
    assert "pdb.set_trace()" in o_pdb.src and "pdb" not in o_chain.src
    assert o_seen == t_seen  # the transformer sees the same chunks, COUNTER markers included


def test_transformer_that_rewrites_lines():
    def upper_frees(body):
        return [chunk.replace(" = None", " = None  # freed") for chunk in body]

    results = []
    for fx in (torch.fx, ours):
        g = g_magic(fx)
        g.on_generate_code(lambda _: upper_frees)
        results.append(g.python_code("self"))
    assert_same_code(*results)


# --------------------------------------------------------------------------- pytree codegen


def _pytree_graph(fx, pytree_mod, *, with_kwargs: bool, annotate: bool):
    g = fx.Graph()
    t = torch.Tensor if annotate else None
    a = g.placeholder("a", type_expr=t)
    b = g.placeholder("b")
    c = g.placeholder("c")
    s = g.call_function(torch.add, (a, b))
    g.output([s, c])
    if with_kwargs:
        in_spec = pytree_mod.tree_flatten(((1, 2), {"c": 3}))[1]
    else:
        in_spec = pytree_mod.tree_flatten([1, 2, 3])[1]
    out_spec = pytree_mod.tree_flatten({"sum": 1, "c": 2})[1]
    graph_mod = importlib.import_module(f"{fx.__name__}.graph")
    info = graph_mod._PyTreeInfo(["a", "b", "c"], in_spec, out_spec)
    g.set_codegen(graph_mod._PyTreeCodeGen(info))
    return g


@pytest.mark.parametrize("with_kwargs", [False, True])
@pytest.mark.parametrize("annotate", [False, True])
@pytest.mark.parametrize("expanded_def", [False, True])
def test_pytree_codegen_matches_torch(with_kwargs, annotate, expanded_def):
    our_pytree = ours_pytree
    tg = _pytree_graph(torch.fx, torch_pytree, with_kwargs=with_kwargs, annotate=annotate)
    og = _pytree_graph(ours, our_pytree, with_kwargs=with_kwargs, annotate=annotate)
    theirs = tg.python_code("self", expanded_def=expanded_def)
    mine = og.python_code("self", expanded_def=expanded_def)
    assert_same_code(theirs, mine)
    # each name is bound to the module of the implementation that generated the code
    assert mine.globals["pytree"] is our_pytree
    assert mine.globals["fx_pytree"] is importlib.import_module(f"{ours.__name__}._pytree")
    assert theirs.globals["fx_pytree"] is torch.fx._pytree


def test_pytree_codegen_runs():
    our_pytree = ours_pytree
    g = _pytree_graph(ours, our_pytree, with_kwargs=True, annotate=False)
    pc = g.python_code("self")
    scope = dict(pc.globals)
    exec(pc.src, scope)

    class Holder:
        _in_spec = g._codegen.pytree_info.in_spec
        _out_spec = g._codegen.pytree_info.out_spec

    out = scope["forward"](Holder(), torch.ones(1), torch.ones(1), c=torch.zeros(1))
    assert set(out) == {"sum", "c"}
    assert torch.equal(out["sum"], torch.full((1,), 2.0))
    assert g.process_inputs((1, 2), {"c": 3}) == [1, 2, 3]
    assert g.process_outputs([5, 6]) == {"sum": 5, "c": 6}


# --------------------------------------------------------------------------- helpers


def test_format_target_and_snake_case():
    from torch.fx.graph import _format_target as t_format_target
    from torch.fx.graph import _snake_case as t_snake_case

    from exportir.fx.codegen import _format_target, _is_magic, _snake_case

    for target in ["a", "a.b", "layers.0.weight", "x.not-ident.y", "0"]:
        assert _format_target("self", target) == t_format_target("self", target)
    for s in ["snake_case", "pascalCase", "ALL_CAPS", "mod.MyModule", "HTTPServer"]:
        assert _snake_case(s) == t_snake_case(s)
    assert _is_magic("__add__") and not _is_magic("add")


def test_operator_tables_match_torch():
    from torch.fx import graph as tgraph

    from exportir.fx import codegen

    assert codegen.magic_methods == tgraph.magic_methods
    assert codegen.reflectable_magic_methods == tgraph.reflectable_magic_methods
    assert codegen.inplace_methods == tgraph.inplace_methods
    assert list(codegen._custom_builtins) == list(tgraph._custom_builtins)


@pytest.mark.parametrize(
    "obj",
    [torch.add, torch.Tensor, torch.nn.functional.relu, torch.device, math.sqrt, user_fn,
     torch.ops.aten.add.Tensor, torch, typing.List, torch._dynamo if hasattr(torch, "_dynamo") else None],
)
def test_is_from_torch(obj):
    from torch.fx.graph import _is_from_torch as t_is_from_torch

    from exportir.fx.codegen import _is_from_torch

    assert _is_from_torch(obj) == t_is_from_torch(obj)


def test_parse_stack_trace():
    from torch.fx.graph import _parse_stack_trace as t_parse

    from exportir.fx.codegen import _parse_stack_trace

    trace = (
        'Traceback (most recent call last):\n'
        '  File "/x/a.py", line 3, in outer\n    inner()\n'
        '  File "/x/b.py", line 9, in inner\n    y = x + 1\n'
    )
    for filt in (None, lambda file, name, code: name == "outer"):
        mine, theirs = _parse_stack_trace(trace, filt), t_parse(trace, filt)
        assert mine.get_summary_str() == theirs.get_summary_str()
    assert _parse_stack_trace(None) is None
    assert _parse_stack_trace("no frames here") is None


def test_sym_repr_override():
    from exportir.fx.codegen import CodeGen, _override_sym_repr

    before = CodeGen._sym_repr
    with _override_sym_repr(lambda s: "S"):
        assert CodeGen._sym_repr(3) == "S"
    assert CodeGen._sym_repr is before


def test_unknown_op_raises():
    g = ours.Graph()
    x = g.placeholder("x")
    n = g.call_function(user_fn, (x,))
    n.op = "bogus"
    with pytest.raises(NotImplementedError, match="node: bogus"):
        g.python_code("self")


@pytest.mark.skipif(ours is torch.fx, reason="checks exportir's own wrap global")
def test_wrapped_functions_use_our_wrap():
    pc = g_wrapped(ours).python_code("self")
    expected = 'exportir.fx.wrap("test_codegen_user_fn")\nexportir.fx.wrap("test_codegen_user_fn_1")\n'
    assert expected in pc.src
    assert pc.globals["exportir"].fx.wrap is ours.wrap


def test_fx_own_objects_spelled_by_qualified_name_like_torch():
    """torch.fx spells its own classes and functions by module path; ours spells exportir.fx's
    the same way (only the package differs), for annotations and for call targets."""
    def build(impl):
        ic = importlib.import_module(f"{impl.__name__}.immutable_collections")
        st = importlib.import_module(f"{impl.__name__}._symbolic_trace")
        g = impl.Graph()
        x = g.placeholder("x", type_expr=ic.immutable_list)
        g.output(g.call_function(st._assert_is_none, (x, "msg")))
        return g.python_code("self").src

    def normalized(src):  # the package and the tracer module's name may differ
        return src.replace("exportir.fx.", "torch.fx.").replace("._symbolic_trace.", ".tracer.")

    assert normalized(build(ours)) == normalized(build(torch.fx))
    assert "exportir_fx" not in build(ours)  # no global alias
