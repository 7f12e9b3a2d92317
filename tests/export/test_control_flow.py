"""Control flow in exportir.export: torch.cond, map and torch.while_loop.

Every program is exported by exportir and by the oracle (``torch.export.export(strict=False)``)
and compared after ``run_decompositions()``: the submodule names (``true_graph_0``,
``body_graph_0``, ``while_loop_cond_graph_0``...), per (sub)graph the multiset of ops and the
get_attr targets, the graph signature, and the set of operands each control-flow node receives
(closures over outer tensors, parameters and buffers are lifted to operands; torch's *order* of
lifted operands follows dynamo's variable tracking, which exportir does not reproduce, so only
the set is compared). Numerics are checked against a plain-Python reference for inputs taking
every branch, through ``ep.module()``, ``run_decompositions()`` and save/load.
"""

from __future__ import annotations

import io
from collections import Counter
from typing import Any

import pytest
import torch
from corpus import control_flow_models as cf_models
from corpus import export_harness as h
from corpus.control_flow_models import PROGRAMS
from torch import nn

from exportir.export import ExportedProgram, export, load, save
from exportir.export.control_flow.rules import ControlFlowError


@pytest.fixture(scope="module")
def exported() -> dict[str, tuple[nn.Module, ExportedProgram]]:
    torch.manual_seed(0)
    out = {}
    for name, (factory, example, _) in PROGRAMS.items():
        module = factory()
        out[name] = (module, export(module, example))
    return out


# --- structure vs torch ------------------------------------------------------------------------


def _graphs(ep: Any) -> dict[str, Any]:
    return {name: m.graph for name, m in ep.graph_module.named_modules() if hasattr(m, "graph")}


def _structure(ep: Any) -> dict[str, tuple]:
    """Per (sub)graph: (op multiset, get_attr targets, operand sets of control-flow nodes)."""
    found = {}
    for name, graph in _graphs(ep).items():
        ops = Counter(h.op_name(n.target) for n in graph.nodes if n.op == "call_function")
        attrs = sorted(n.target for n in graph.nodes if n.op == "get_attr")
        operands = sorted(_operand_names(n) for n in graph.nodes if _is_hop(n))
        found[name] = (ops, attrs, operands)
    return found


def _is_hop(n: Any) -> bool:
    return n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator)


def _operand_names(n: Any) -> tuple[str, ...]:
    def flat(a: Any) -> list:
        if isinstance(a, (list, tuple)):
            return [y for x in a for y in flat(x)]
        return [a]

    nodes = [a for a in flat(n.args) if hasattr(a, "op") and a.op != "get_attr"]
    return tuple(sorted(a.name for a in nodes))


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_structure_matches_torch(name: str, exported: dict) -> None:
    module, ours = exported[name]
    theirs = h.torch_export(module, PROGRAMS[name][1])
    ours_d, theirs_d = ours.run_decompositions(), theirs.run_decompositions()
    assert sorted(_graphs(ours_d)) == sorted(_graphs(theirs_d))
    assert _structure(ours_d) == _structure(theirs_d)
    assert h.signature_rows(ours_d) == h.signature_rows(theirs_d)
    assert h.signature_rows(ours)[0] == h.signature_rows(theirs)[0]


def test_cond_graph_form(exported: dict) -> None:
    _, ep = exported["cond_closures"]
    gm = ep.graph_module
    cond = next(n for n in ep.graph.nodes if _is_hop(n))
    assert cond.target is torch.ops.higher_order.cond
    pred, true_attr, false_attr, operands = cond.args
    assert (true_attr.op, true_attr.target) == ("get_attr", "true_graph_0")
    assert (false_attr.op, false_attr.target) == ("get_attr", "false_graph_0")
    assert pred.name == "gt" and isinstance(operands, tuple)
    # the operand comes first, then the lifted closures in first-use order
    assert [o.name for o in operands] == ["x", "p_lin_weight", "p_lin_bias", "mul", "b_buf"]
    for sub in (gm.true_graph_0, gm.false_graph_0):
        names = [n.name for n in sub.graph.find_nodes(op="placeholder")]
        assert names == ["x", "p_lin_weight", "p_lin_bias", "mul", "b_buf"]
    assert [n.target for n in cond.users] == [__import__("operator").getitem]


def test_branch_nodes_carry_metadata(exported: dict) -> None:
    _, ep = exported["cond_closures"]
    sub = ep.graph_module.true_graph_0
    for node in sub.graph.nodes:
        assert "val" in node.meta, node.name
        if node.op == "call_function":
            assert cf_models.__file__ in node.meta["stack_trace"]
            assert "nn_module_stack" in node.meta and "source_fn_stack" in node.meta
    add = next(n for n in sub.graph.nodes if n.name == "add")
    assert "return self.lin(a) + z + self.buf" in add.meta["stack_trace"]


def test_while_loop_graph_form(exported: dict) -> None:
    _, ep = exported["while_counter"]
    loop = next(n for n in ep.graph.nodes if _is_hop(n))
    cond_attr, body_attr, carried, additional = loop.args
    assert (cond_attr.target, body_attr.target) == (
        "while_loop_cond_graph_0",
        "while_loop_body_graph_0",
    )
    assert [c.name for c in carried] == ["i", "x"]
    assert [a.name for a in additional] == ["p_w", "add"]
    cond_gm = ep.graph_module.while_loop_cond_graph_0
    names = [n.name for n in cond_gm.graph.find_nodes(op="placeholder")]
    assert names == ["arg0_1", "arg1_1", "arg2_1", "arg3_1"]
    out = next(iter(cond_gm.graph.find_nodes(op="output")))
    assert not isinstance(out.args[0], tuple)  # cond_fn's graph returns the bare bool


def test_map_graph_form(exported: dict) -> None:
    _, ep = exported["map_closures"]
    node = next(n for n in ep.graph.nodes if _is_hop(n))
    body, xs, pos = node.args
    assert body.target == "body_graph_0"
    assert [x.name for x in xs] == ["xs"] and [p.name for p in pos] == ["y", "p_w", "add"]
    vals = [u.meta["val"].shape for u in node.users]
    assert vals == [torch.Size([4, 3]), torch.Size([4])]


# --- numerics ---------------------------------------------------------------------------------


def _check_numerics(module: nn.Module, run: Any, inputs: list[tuple]) -> None:
    for args in inputs:
        expected = module(*args, eager=True)
        actual = run(*args)
        for a, e in zip(h.leaves(actual), h.leaves(expected)):
            torch.testing.assert_close(a, e)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_module_runs_every_branch(name: str, exported: dict) -> None:
    module, ep = exported[name]
    _check_numerics(module, ep.module(), PROGRAMS[name][2])


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_run_decompositions(name: str, exported: dict) -> None:
    module, ep = exported[name]
    decomposed = ep.run_decompositions()
    for graph in _graphs(decomposed).values():
        for n in graph.nodes:
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
                assert torch.Tag.core in n.target.tags, n.target
    _check_numerics(module, decomposed.module(), PROGRAMS[name][2])
    _check_numerics(module, ep.run_decompositions({}).module(), PROGRAMS[name][2])


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_save_load(name: str, exported: dict) -> None:
    module, ep = exported[name]
    buf = io.BytesIO()
    save(ep, buf)
    buf.seek(0)
    loaded = load(buf)
    assert sorted(_graphs(loaded)) == sorted(_graphs(ep))
    _check_numerics(module, loaded.module(), PROGRAMS[name][2])


def test_verifier_accepts_subgraphs(exported: dict) -> None:
    for _, ep in exported.values():
        ep.validate()


# --- errors ------------------------------------------------------------------------------------


def _export_fn(fn: Any, *args: Any) -> ExportedProgram:
    class Wrap(nn.Module):
        def forward(self, *a):
            return fn(*a)

    return export(Wrap(), args)


X = torch.randn(2, 3)


def _cond_shape(x):
    return torch.cond(x.sum() > 0, lambda a: a + 1, lambda a: a[0] + 1, (x,))


def _cond_dtype(x):
    return torch.cond(x.sum() > 0, lambda a: a + 1, lambda a: (a + 1).int(), (x,))


def _cond_structure(x):
    return torch.cond(x.sum() > 0, lambda a: (a + 1, a + 2), lambda a: [a + 1, a + 2], (x,))


def _cond_mutation(x):
    return torch.cond(x.sum() > 0, lambda a: a.add_(1), lambda a: a - 1, (x,))


def _cond_alias(x):
    return torch.cond(x.sum() > 0, lambda a: a, lambda a: a - 1, (x,))


def _cond_view_alias(x):
    return torch.cond(x.sum() > 0, lambda a: a.view(-1), lambda a: a.reshape(-1) + 1, (x,))


def _cond_pred_shape(x):
    return torch.cond(x > 0, lambda a: a + 1, lambda a: a - 1, (x,))


def _while_not_bool(i, x):
    return torch.while_loop(lambda i, x: i + 1, lambda i, x: (i + 1, x + 1), (i, x))


def _while_shape(i, x):
    return torch.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x[0] + 1), (i, x))


def _while_count(i, x):
    return torch.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1,), (i, x))


def _while_mutation(i, x):
    return torch.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x.mul_(2)), (i, x))


I = torch.tensor(0)

ERRORS = {
    "cond_shape": (_cond_shape, (X,), ControlFlowError, "expected same dim but got 2 and 1"),
    "cond_dtype": (
        _cond_dtype,
        (X,),
        ControlFlowError,
        "expected same dtype but got torch.float32 and torch.int32",
    ),
    "cond_structure": (
        _cond_structure,
        (X,),
        ControlFlowError,
        "Unmatched output spec from torch.cond branches",
    ),
    "cond_mutation": (
        _cond_mutation,
        (X,),
        ControlFlowError,
        "Encountered input mutation during higher order op tracing",
    ),
    "cond_alias": (
        _cond_alias,
        (X,),
        ControlFlowError,
        "Encountered aliasing during higher order op tracing",
    ),
    "cond_view_alias": (
        _cond_view_alias,
        (X,),
        ControlFlowError,
        "Encountered aliasing during higher order op tracing",
    ),
    "cond_pred_shape": (
        _cond_pred_shape,
        (X,),
        RuntimeError,
        "Expected pred to be bool or single-element tensor",
    ),
    "while_not_bool": (
        _while_not_bool,
        (I, X),
        ControlFlowError,
        "cond_fn must return a boolean scalar tensor or a boolean",
    ),
    "while_shape": (
        _while_shape,
        (I, X),
        ControlFlowError,
        "Expected body_fn_output and carried_inputs to have same metadata",
    ),
    "while_count": (
        _while_count,
        (I, X),
        ControlFlowError,
        "Expected body_fn_output and carried_inputs to have same number of outputs",
    ),
    "while_mutation": (
        _while_mutation,
        (I, X),
        ControlFlowError,
        "Encountered input mutation during higher order op tracing",
    ),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_errors(name: str) -> None:
    fn, args, kind, text = ERRORS[name]
    with pytest.raises(kind) as info:
        _export_fn(fn, *args)
    message = str(info.value)
    assert text in message
    if kind is ControlFlowError:
        line = fn.__code__.co_firstlineno + 1  # the torch.cond / while_loop line
        assert f'File "{__file__}", line {line}' in message, message


@pytest.mark.parametrize("name", ["cond_shape", "cond_mutation", "cond_alias", "while_mutation"])
def test_torch_rejects_the_same_programs(name: str) -> None:
    fn, args, _, _ = ERRORS[name]

    class Wrap(nn.Module):
        def forward(self, *a):
            return fn(*a)

    with pytest.raises(Exception):  # noqa: B017  # torch raises dynamo-specific types
        h.torch_export(Wrap(), args)


def test_python_bool_pred_specializes() -> None:
    ep = _export_fn(lambda x: torch.cond(True, lambda a: a + 1, lambda a: a - 1, (x,)), X)
    assert not any(_is_hop(n) for n in ep.graph.nodes)
    torch.testing.assert_close(ep.module()(X), X + 1)


class _Sin(nn.Module):
    def forward(self, x):
        return x.sin()


class _Cos(nn.Module):
    def forward(self, x):
        return x.cos() + 1


class DirectCond(nn.Module):
    """The operator called directly, modules as branches: torch keeps a single tensor output
    (no getitem, ``return sin`` in the branch) instead of torch.cond's flattened tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.t, self.f = _Sin(), _Cos()

    def forward(self, x):
        return torch.ops.higher_order.cond(x.sum() > 0, self.t, self.f, (x,))


def test_direct_operator_form_matches_torch() -> None:
    x = torch.randn(2, 3)
    ours, theirs = export(DirectCond(), (x,)), h.torch_export(DirectCond(), (x,))
    assert str(ours.graph) == str(theirs.graph)
    for name in ("true_graph_0", "false_graph_0"):
        assert str(getattr(ours.graph_module, name).graph) == str(
            getattr(theirs.graph_module, name).graph
        )
    for probe in (x.abs(), -x.abs()):
        expected = probe.sin() if probe.sum() > 0 else probe.cos() + 1
        torch.testing.assert_close(ours.module()(probe), expected)
        torch.testing.assert_close(ours.run_decompositions().module()(probe), expected)


def test_eager_torch_cond_still_works_after_export() -> None:
    """Capture must not leave dynamo state behind (torch.cond compiles a wrapper)."""
    _export_fn(lambda x: torch.cond(x.sum() > 0, lambda a: a + 1, lambda a: a - 1, (x,)), X)
    out = torch.cond(X.sum() > 0, lambda a: a + 1, lambda a: a - 1, (X,))
    torch.testing.assert_close(out, X + 1 if X.sum() > 0 else X - 1)


class CondOnSymbolicShape(nn.Module):
    """A SymBool predicate (dynamic dim); the true branch reads a symbolic size."""

    def forward(self, x):
        return torch.cond(
            x.shape[0] > 4, lambda a: a.reshape(a.shape[0], -1).sin(), lambda a: a.cos(), (x,)
        )


class CondSymbolicArithmetic(nn.Module):
    """Symbolic arithmetic inside a branch (``3 * s0``) is recorded in the branch."""

    def forward(self, x):
        return torch.cond(
            x.sum() > 0, lambda a: a.view(a.shape[0] * 3).sin(), lambda a: a.reshape(-1).cos(), (x,)
        )


@pytest.mark.parametrize("factory", [CondOnSymbolicShape, CondSymbolicArithmetic])
def test_dynamic_shapes_inside_cond(factory: Any) -> None:
    from torch.export import Dim

    spec = {"x": {0: Dim("b", min=2, max=64)}}
    x = torch.randn(6, 3)
    ours = export(factory(), (x,), dynamic_shapes=spec)
    theirs = h.quiet(torch.export.export, factory(), (x,), dynamic_shapes=spec, strict=False)
    # run_decompositions() of symbolic programs waits for a symbolic retrace (capture.retrace
    # starts a fresh ShapeEnv), so the graphs are compared before decomposition, where torch
    # keeps CompositeImplicit ops (reshape) whole: submodules, signature and operands only
    assert sorted(_graphs(ours)) == sorted(_graphs(theirs))
    assert h.signature_rows(ours)[0] == h.signature_rows(theirs)[0]
    ours_ops = {k: v[1:] for k, v in _structure(ours).items()}
    assert ours_ops == {k: v[1:] for k, v in _structure(theirs).items()}
    for n in (3, 6, 9):
        for sign in (1.0, -1.0):
            probe = sign * (torch.rand(n, 3) + 0.1)
            torch.testing.assert_close(ours.module()(probe), theirs.module()(probe))
