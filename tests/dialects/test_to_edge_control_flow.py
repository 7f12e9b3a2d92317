"""``to_edge`` on programs with torch.cond / map / torch.while_loop: every edge pass reaches
the subgraphs (nested ones too), the result verifies, and it computes what eager computes on
inputs taking every branch."""

from __future__ import annotations

import pytest
import torch
from corpus import export_harness as h
from corpus.control_flow_models import PROGRAMS
from torch import nn

from exportir.dialects.edge.ops import EdgeOpOverload
from exportir.export import export
from exportir.fx import GraphModule
from exportir.program.manager import to_edge


def _graphs(ep) -> dict[str, GraphModule]:
    return {n: m for n, m in ep.graph_module.named_modules() if isinstance(m, GraphModule)}


def _check(module, ep, inputs) -> None:
    run = ep.module()
    for args in inputs:
        expected = module(*args, eager=True)
        for a, e in zip(h.leaves(run(*args)), h.leaves(expected)):
            torch.testing.assert_close(a, e)


def _no_scalar_tensor_args(ep) -> None:
    """No Python number left where an edge op's schema asks for a Tensor, in any graph."""
    for name, gm in _graphs(ep).items():
        for node in gm.graph.nodes:
            if not isinstance(node.target, EdgeOpOverload):
                continue
            schema = node.target.aten_op._schema.arguments
            for arg, value in zip(schema, node.args):
                if isinstance(arg.type, torch.TensorType):
                    assert not isinstance(value, (bool, int, float)), (name, node.format_node())


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_control_flow_corpus_through_to_edge(name: str) -> None:
    torch.manual_seed(0)
    factory, example, inputs = PROGRAMS[name]
    module = factory()
    edge = to_edge(export(module, example)).exported_program()
    edge.validate()
    _no_scalar_tensor_args(edge)
    _check(module, edge, inputs)


class ScalarsInBranches(nn.Module):
    """Different scalars per branch, one also used at top level and in a kwarg position."""

    def forward(self, x, eager=False):
        def t(a):
            return a + 1, a * 2.5

        def f(a):
            return a - 1, torch.add(a, other=3)

        y = x * 2.5
        if eager:
            return (t(y) if x.sum() > 0 else f(y)), y
        return torch.cond(x.sum() > 0, t, f, (y,)), y


def test_scalars_in_branches_become_threaded_constants() -> None:
    m = ScalarsInBranches()
    x = torch.rand(3) + 0.1
    edge = to_edge(export(m, (x,))).exported_program()
    consts = [s for s in edge.graph_signature.input_specs if s.kind.name == "CONSTANT_TENSOR"]
    # 2.5 is shared by the top level and the true branch: one constant for it
    assert sorted(edge.constants[s.target].item() for s in consts) == [1, 2.5, 3]
    cond = next(n for n in edge.graph.nodes if n.target is torch.ops.higher_order.cond)
    operands = cond.args[3]
    assert len(operands) == 1 + len(consts)
    for branch in ("true_graph_0", "false_graph_0"):  # both branches take the same inputs
        placeholders = getattr(edge.graph_module, branch).graph.find_nodes(op="placeholder")
        assert len(placeholders) == len(operands)
    _no_scalar_tensor_args(edge)
    _check(m, edge, [(x,), (-x,)])


class NestedScalars(nn.Module):
    """A scalar only the innermost branch of a nested cond uses: threaded through two levels."""

    def forward(self, x, eager=False):
        def inner_t(a):
            return a.sin() * 7

        def inner_f(a):
            return a.cos()

        def outer_t(a):
            if eager:
                return inner_t(a) if a.mean() > 0.5 else inner_f(a)
            return torch.cond(a.mean() > 0.5, inner_t, inner_f, (a,))

        def outer_f(a):
            return a.neg()

        if eager:
            return outer_t(x) if x.sum() > 0 else outer_f(x)
        return torch.cond(x.sum() > 0, outer_t, outer_f, (x,))


def test_nested_cond_scalar_threaded_through_every_level() -> None:
    m = NestedScalars()
    x = torch.full((3,), 0.9)
    edge = to_edge(export(m, (x,))).exported_program()
    gms = _graphs(edge)
    for name in ("", "true_graph_0", "false_graph_0"):
        cond_nodes = [n for n in gms[name].graph.nodes if n.target is torch.ops.higher_order.cond]
        for node in cond_nodes:
            assert len(node.args[3]) == 2, (name, node.format_node())  # a, the constant 7
    _no_scalar_tensor_args(edge)
    _check(m, edge, [(x,), (torch.full((3,), 0.1),), (-x,)])


class ViewsInBranches(nn.Module):
    """View ops in a cond branch, a map body and a while_loop body become ``*_copy`` ops."""

    def forward(self, x, i, eager=False):
        def t(a):
            return a.view(6).permute(0).unsqueeze(0) + 1

        def f(a):
            return a.t().reshape(1, 6)

        def body(row):
            return row.unsqueeze(0).squeeze(0) * 2

        def w_cond(j, a):
            return j < 3

        def w_body(j, a):
            return j + 1, a.transpose(0, 1).transpose(0, 1) + 1

        if eager:
            c = t(x) if x.sum() > 0 else f(x)
            mapped = torch.stack([body(r) for r in x])
            j, a = i, x
            while w_cond(j, a):
                j, a = w_body(j, a)
            return c, mapped, j, a
        from functorch.experimental.control_flow import map as cf_map

        c = torch.cond(x.sum() > 0, t, f, (x,))
        mapped = cf_map(body, x)
        j, a = torch.while_loop(w_cond, w_body, (i, x))
        return c, mapped, j, a


def test_views_in_bodies_become_view_copy() -> None:
    m = ViewsInBranches()
    x = torch.rand(2, 3) + 0.1
    edge = to_edge(export(m, (x, torch.tensor(0)))).exported_program()
    for name, gm in _graphs(edge).items():
        for node in gm.graph.nodes:
            target = getattr(node.target, "aten_op", None)
            assert target is None or target._schema.returns[0].alias_info is None, (
                name,
                node.format_node(),
            )
    _check(m, edge, [(x, torch.tensor(0)), (-x, torch.tensor(1)), (x, torch.tensor(5))])


def test_aten_program_is_left_untouched() -> None:
    m = ScalarsInBranches()
    ep = export(m, (torch.rand(3),))
    before = {n: str(g.graph) for n, g in _graphs(ep).items()}
    to_edge(ep)
    assert {n: str(g.graph) for n, g in _graphs(ep).items()} == before
