"""The FX text format: ``str(graph)``, ``Node.format_node``, ``print_tabular`` and the naming
helpers, compared with torch.fx 2.13 (and with ``tabulate`` for the table layout)."""

# ruff: noqa: UP006, UP045  # the typing spellings are under test

from __future__ import annotations

import math
import operator
import re
import typing

import pytest
import torch
import torch.fx
import torch.fx.node as tnode
from hypothesis import given, settings
from hypothesis import strategies as st
from test_codegen import BUILDERS, ours, user_fn

from exportir.fx import printer as our_printer


class _TorchPrinter:
    """torch.fx's spelling of the printer helpers (for sanity mode, EXPORTIR_FX_IMPL=torch.fx)."""

    _get_qualified_name = staticmethod(tnode._get_qualified_name)
    _type_repr = staticmethod(tnode._type_repr)
    _format_arg = staticmethod(tnode._format_arg)
    pretty_print_target = staticmethod(torch.fx.Node._pretty_print_target)
    format_tabular = staticmethod(our_printer.format_tabular)  # torch has no counterpart


printer = _TorchPrinter if ours is torch.fx else our_printer


try:
    from tabulate import tabulate as _tabulate
except ImportError:  # the golden string below still pins the layout
    _tabulate = None


def _lines_of(graph) -> list[str | None]:
    return [n.format_node() for n in graph.nodes]


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_str_graph_matches_torch(name):
    build = BUILDERS[name]
    assert str(build(ours)) == str(build(torch.fx))


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_format_node_matches_torch(name):
    build = BUILDERS[name]
    assert _lines_of(build(ours)) == _lines_of(build(torch.fx))


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_format_node_with_tensor_metadata(name):
    build = BUILDERS[name]
    mine = [n.format_node(include_tensor_metadata=True) for n in build(ours).nodes]
    theirs = [n.format_node(include_tensor_metadata=True) for n in build(torch.fx).nodes]
    assert mine == theirs


def test_format_node_signature_collectors():
    """Placeholders append to a non-empty list (typed ones repeat their name, as torch does);
    the output records its type only when given a return-typename cell."""
    results = []
    for fx in (torch.fx, ours):
        g = BUILDERS["g_basic"](fx)
        names, ret = ["seed"], [""]
        lines = [n.format_node(names, ret) for n in g.nodes]
        results.append((lines, names, ret))
    assert results[0] == results[1]
    lines, names, ret = results[1]
    assert lines[0] is None and names == ["seed", "xx: torch.Tensor", "y"]
    assert ret == [" -> tuple"]


def test_print_tabular_matches_torch(capsys):
    if _tabulate is None:
        pytest.fail("tabulate is needed as the oracle of torch's print_tabular")
    for name, build in sorted(BUILDERS.items()):
        build(torch.fx).print_tabular()
        theirs = capsys.readouterr().out
        build(ours).print_tabular()
        mine = capsys.readouterr().out
        assert mine == theirs, name


GOLDEN_TABLE = """\
opcode       name    target    args          kwargs
-----------  ------  --------  ------------  --------
placeholder  x       x         ()            {}
placeholder  y       y         (3,)          {}
call_method  relu    relu      (x,)          {}
output       output  output    ((relu, y),)  {}
"""


def test_print_tabular_golden(capsys):
    g = ours.Graph()
    x = g.placeholder("x")
    y = g.placeholder("y", default_value=3)
    r = g.call_method("relu", (x,))
    g.output((r, y))
    g.print_tabular()
    assert capsys.readouterr().out == GOLDEN_TABLE


# Graph tables never hold an empty cell (op, name, target, str(args), str(kwargs)), so the
# generated cells are non-blank; tabulate types an all-blank column specially.
_cell = st.one_of(
    st.text(alphabet="ab c_.-\n", max_size=8),
    st.integers(-1000, 1000).map(str),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(lambda f: f"{f:.3f}"),
    st.tuples(st.integers(0, 9)),
    st.dictionaries(st.text(alphabet="kv", max_size=2), st.integers(0, 9), max_size=2),
).filter(lambda c: str(c).strip() != "")


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda ncols: st.tuples(
            st.lists(st.text(alphabet="hdr", min_size=1, max_size=6), min_size=ncols, max_size=ncols),
            st.lists(st.lists(_cell, min_size=ncols, max_size=ncols), max_size=5),
        )
    )
)
def test_format_tabular_matches_tabulate(table):
    if _tabulate is None:
        pytest.fail("tabulate is needed as the oracle of the table layout")
    headers, rows = table
    assert printer.format_tabular(rows, headers) == _tabulate(rows, headers=headers)


@pytest.mark.parametrize("rows", [
    [["_", "0", "0"], ["0", "0", "4999995.000"]],  # 5e+06 aligns at its "e", like a point
    [["1.5"], ["-1e-05"], ["2"], ["123456789.000"]],
], ids=["exponent_vs_int", "mixed_exponents"])
def test_format_tabular_aligns_exponents_like_tabulate(rows):
    if _tabulate is None:
        pytest.fail("tabulate is needed as the oracle of the table layout")
    headers = ["d"] * len(rows[0])
    assert printer.format_tabular(rows, headers) == _tabulate(rows, headers=headers)


# --------------------------------------------------------------------------- helpers


def _lam():
    return lambda x: x


qualified_lambda = lambda x: x


QUALIFIED = [
    operator.add, operator.getitem, getattr, print, len, torch.add, torch.sum, torch.relu,
    torch.Tensor.add, torch.Tensor.__getitem__, torch.Tensor.size, torch.Tensor.type,
    torch.nn.functional.relu, torch.nn.functional.linear, torch._C._nn.linear, math.sqrt,
    torch.ops.aten.add.Tensor, torch.ops.aten.add, torch.ops.aten.sym_size.int,
    torch.segment_reduce, user_fn, qualified_lambda, torch.Tensor, torch.device, int,
    torch.nn.Linear, typing.NamedTuple,
]


def _stable_id(obj) -> str:
    """A test id without memory addresses (pytest-xdist needs identical ids in every worker)."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(obj))


@pytest.mark.parametrize("func", QUALIFIED, ids=lambda f: getattr(f, "__name__", repr(f)))
def test_get_qualified_name_matches_torch(func):
    assert printer._get_qualified_name(func) == tnode._get_qualified_name(func)


@pytest.mark.parametrize("target", QUALIFIED + ["layers.0", "relu"], ids=_stable_id)
def test_pretty_print_target_matches_torch(target):
    assert printer.pretty_print_target(target) == torch.fx.Node._pretty_print_target(target)


def test_unrepresentable_lambda():
    fn = eval("lambda x: x")  # no source file to read the name from
    with pytest.raises(RuntimeError, match="Unable to represent lambda"):
        printer._get_qualified_name(fn)


TYPES = [
    int, torch.Tensor, typing.List[int], list[int], typing.Optional[int], int | None, ...,
    user_fn, type(None), torch.nn.Module, "forward_ref", None, typing.Any, tuple,
]


@pytest.mark.parametrize("obj", TYPES, ids=_stable_id)
def test_type_repr_matches_torch(obj):
    assert printer._type_repr(obj) == tnode._type_repr(obj)


def _format_arg_samples(fx):
    g = fx.Graph()
    x = g.placeholder("x")
    return [(x, 1, [x, 2.5, "s"], (x,), {"k": x, 3: (x, None)}, list(range(7)), ())]


@pytest.mark.parametrize("max_len", [math.inf, 0, 1, 2, 5])
def test_format_arg_matches_torch(max_len):
    mine_args, their_args = _format_arg_samples(ours), _format_arg_samples(torch.fx)
    mine = [printer._format_arg(a, max_len) for a in mine_args] + [printer._format_arg(mine_args)]
    theirs = [tnode._format_arg(a, max_len) for a in their_args] + [tnode._format_arg(their_args)]
    assert mine == theirs


def test_custom_fx_repr_fn():
    class Special:
        def _custom_fx_repr_fn(self):
            return "SPECIAL"

    assert printer._format_arg([Special(), 1]) == tnode._format_arg([Special(), 1]) == "[SPECIAL, 1]"
