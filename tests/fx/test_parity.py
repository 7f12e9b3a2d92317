"""Differential tests: ``exportir.fx.symbolic_trace`` against ``torch.fx.symbolic_trace``.

Every corpus entry is traced by both implementations (each with its own freshly built, identically
seeded model) and compared on: the node sequence, ``str(gm.graph)``, ``gm.code``,
``print_readable``, the GraphModule's state, and the numerics of the traced module against the
original program. Programs the seed says cannot be traced must fail the same way in both.

Sanity mode: ``EXPORTIR_FX_IMPL=torch.fx pytest tests/fx/test_parity.py`` runs the harness with
torch.fx on both sides; everything must pass there.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import importlib
import pickle
import re

import pytest
import torch
import torch.fx
from conftest import import_ours_fx, ours_fx_name, torch_code_as_ours
from corpus import fx_models
from corpus.fx_models import ENTRIES, LIMITATIONS, Case, Entry, build
from torch import nn

ENTRY_BY_NAME = fx_models.by_name(ENTRIES)
IDS = [e.name for e in ENTRIES]


def test_corpus_is_big_enough():
    assert len(ENTRIES) >= 45
    assert len(set(IDS)) == len(IDS)


# --------------------------------------------------------------------------------------------
# Harness.


def _root_name(root) -> str:
    return root.__class__.__name__ if isinstance(root, nn.Module) else root.__name__


def trace_case(fx, case: Case):
    """Trace ``case`` with implementation ``fx``; mirrors what ``symbolic_trace`` does."""
    if case.make_tracer is None:
        return fx.symbolic_trace(case.root, concrete_args=case.concrete_args)
    tracer = case.make_tracer()
    graph = tracer.trace(case.root, concrete_args=case.concrete_args)
    return fx.GraphModule(tracer.root, graph, _root_name(case.root))


def retrace(fx, case: Case, gm):
    """Trace a GraphModule again with the case's tracer (its entry point is ``forward``)."""
    def make_tracer():
        tracer = case.make_tracer() if case.make_tracer else fx.Tracer()
        tracer.traced_func_name = "forward"
        return tracer

    return trace_case(fx, dataclasses.replace(case, root=gm, concrete_args=None,
                                              make_tracer=make_tracer))


@functools.cache
def traced(impl: str, name: str):
    """(case, GraphModule) for one entry and one implementation, built once per session."""
    fx = importlib.import_module(impl)
    case = build(ENTRY_BY_NAME[name], fx)
    return case, trace_case(fx, case)


def pair(name: str):
    return traced("torch.fx", name), traced(ours_fx_name(), name)


def assert_same_text(expected: str, actual: str, what: str) -> None:
    expected = torch_code_as_ours(expected)  # the documented wrap-line difference, nothing else
    if expected == actual:
        return
    diff = "\n".join(
        difflib.unified_diff(
            expected.splitlines(), actual.splitlines(),
            fromfile=f"torch.fx {what}", tofile=f"{ours_fx_name()} {what}", lineterm="",
        )
    )
    pytest.fail(f"{what} differs from torch.fx:\n{diff}", pytrace=False)


def _is_node(a) -> bool:
    return type(a).__name__ == "Node" and hasattr(a, "op") and hasattr(a, "graph")


def norm_arg(a):
    """A structural, implementation-independent description of a node argument."""
    if _is_node(a):
        return ("%", a.name)
    if isinstance(a, tuple) and hasattr(a, "_fields"):
        return (type(a).__qualname__, tuple(norm_arg(x) for x in a))
    if isinstance(a, tuple):
        return ("tuple", tuple(norm_arg(x) for x in a))
    if isinstance(a, list):  # immutable_list of either implementation is a list subclass
        return ("list", tuple(norm_arg(x) for x in a))
    if isinstance(a, dict):
        return ("dict", tuple((k, norm_arg(v)) for k, v in a.items()))
    if isinstance(a, slice):
        return ("slice", norm_arg(a.start), norm_arg(a.stop), norm_arg(a.step))
    if isinstance(a, torch.Tensor):
        return ("tensor", a.dtype, tuple(a.shape), a.tolist())
    return (type(a).__name__, a)


def _qualname(t) -> str:
    return f"{getattr(t, '__module__', None)}.{getattr(t, '__qualname__', repr(t))}"


def same_target(expected, actual) -> bool:
    if isinstance(expected, str) or isinstance(actual, str):
        return expected == actual
    return expected is actual or _qualname(expected) == _qualname(actual)


def describe(n) -> str:
    return f"{n.op} {n.name} target={n.target!r} args={n.args!r} kwargs={n.kwargs!r}"


def assert_same_nodes(expected_graph, actual_graph) -> None:
    exp, act = list(expected_graph.nodes), list(actual_graph.nodes)
    listing = "\n".join(
        difflib.unified_diff([describe(n) for n in exp], [describe(n) for n in act],
                             fromfile="torch.fx", tofile=ours_fx_name(), lineterm="")
    )
    assert len(exp) == len(act), f"node count {len(act)} != {len(exp)}\n{listing}"
    for e, a in zip(exp, act):
        where = f"at node {e.name!r}\n{listing}"
        assert a.op == e.op, f"op {a.op!r} != {e.op!r} {where}"
        assert a.name == e.name, f"name {a.name!r} != {e.name!r} {where}"
        assert same_target(e.target, a.target), f"target {a.target!r} != {e.target!r} {where}"
        assert norm_arg(a.args) == norm_arg(e.args), f"args differ {where}"
        assert norm_arg(a.kwargs) == norm_arg(e.kwargs), f"kwargs differ {where}"
        assert [u.name for u in a.users] == [u.name for u in e.users], f"users differ {where}"


def _clone(x):
    return torch.utils._pytree.tree_map(
        lambda t: t.clone() if isinstance(t, torch.Tensor) else t, x
    )


def run(fn, case: Case, seed: int = 1234):
    args, kwargs = _clone(case.inputs), _clone(case.kwinputs)
    torch.manual_seed(seed)
    return fn(*args, **kwargs)


def assert_same_value(expected, actual, path="out") -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: {type(actual)} is not a Tensor"
        torch.testing.assert_close(actual, expected, msg=lambda m: f"{path}: {m}")
        return
    assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_same_value(e, a, f"{path}[{i}]")
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for k in expected:
            assert_same_value(expected[k], actual[k], f"{path}[{k!r}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


# --------------------------------------------------------------------------------------------
# Parity over the corpus.


@pytest.mark.parametrize("name", IDS)
def test_node_sequence(name):
    (_, theirs), (_, ours) = pair(name)
    assert_same_nodes(theirs.graph, ours.graph)


@pytest.mark.parametrize("name", IDS)
def test_graph_text(name):
    (_, theirs), (_, ours) = pair(name)
    assert_same_text(str(theirs.graph), str(ours.graph), "str(gm.graph)")


@pytest.mark.parametrize("name", IDS)
def test_code_text(name):
    (_, theirs), (_, ours) = pair(name)
    assert_same_text(theirs.code, ours.code, "gm.code")


@pytest.mark.parametrize("name", IDS)
def test_print_readable(name):
    (_, theirs), (_, ours) = pair(name)
    assert_same_text(
        theirs.print_readable(print_output=False),
        ours.print_readable(print_output=False),
        "print_readable()",
    )


@pytest.mark.parametrize("name", IDS)
def test_graph_module_state(name):
    """Same class name, copied submodules, parameters, buffers and tensor attributes."""
    (_, theirs), (_, ours) = pair(name)
    ours_fx = import_ours_fx()
    assert isinstance(ours, ours_fx.GraphModule)
    assert isinstance(ours, nn.Module)
    assert type(ours).__name__ == type(theirs).__name__
    assert [n for n, _ in ours.named_modules()] == [n for n, _ in theirs.named_modules()]
    assert [type(m).__name__ for _, m in ours.named_modules()][1:] == [
        type(m).__name__ for _, m in theirs.named_modules()
    ][1:]
    assert_same_value(dict(theirs.named_parameters()), dict(ours.named_parameters()))
    assert_same_value(dict(theirs.named_buffers()), dict(ours.named_buffers()))
    for node in theirs.graph.nodes:
        if node.op == "get_attr":
            expected, actual = theirs, ours
            for atom in node.target.split("."):
                expected, actual = getattr(expected, atom), getattr(actual, atom)
            assert_same_value(expected, actual, f"get_attr {node.target}")


@pytest.mark.parametrize("name", IDS)
def test_numerics_against_original(name):
    case, ours = traced(ours_fx_name(), name)
    expected = run(case.reference or case.root, case)
    actual = run(ours, case)
    assert_same_value(expected, actual)


@pytest.mark.parametrize("name", IDS)
def test_retrace_is_stable(name):
    """Tracing our GraphModule again yields the same code (GraphModules are traceable)."""
    (theirs_case, theirs), (ours_case, ours) = pair(name)
    ours_fx = import_ours_fx()
    expected = retrace(torch.fx, theirs_case, theirs)
    actual = retrace(ours_fx, ours_case, ours)
    assert_same_text(expected.code, actual.code, "retraced gm.code")


# --------------------------------------------------------------------------------------------
# Limitations of symbolic tracing: same exception type and message as torch.fx.


def _trace_error(fx, entry: Entry) -> BaseException:
    case = build(entry, fx)
    with pytest.raises(Exception) as info:
        trace_case(fx, case)
    return info.value


@pytest.mark.parametrize("name", [e.name for e in LIMITATIONS])
def test_limitation_errors(name):
    entry = fx_models.by_name(LIMITATIONS)[name]
    ours_fx = import_ours_fx()
    expected = _trace_error(torch.fx, entry)
    actual = _trace_error(ours_fx, entry)
    assert type(actual).__name__ == type(expected).__name__, (
        f"{type(actual).__name__}: {actual}\n!= {type(expected).__name__}: {expected}"
    )
    assert_same_text(str(expected), str(actual), "error message")
    if isinstance(expected, torch.fx.proxy.TraceError):
        ours_proxy = importlib.import_module(ours_fx.__name__ + ".proxy")
        assert isinstance(actual, ours_proxy.TraceError)
    else:
        assert type(actual) is type(expected)


def test_seed_dynamic_control_flow_message():
    """The seed's exact wording for the most common failure."""
    ours_fx = import_ours_fx()
    with pytest.raises(ours_fx.proxy.TraceError) as info:
        ours_fx.symbolic_trace(fx_models.func_to_trace)
    assert str(info.value) == (
        "symbolically traced variables cannot be used as inputs to control flow"
    )


def test_seed_len_message():
    ours_fx = import_ours_fx()
    with pytest.raises(RuntimeError) as info:
        ours_fx.symbolic_trace(fx_models.normalize_unwrapped)
    assert str(info.value) == (
        "'len' is not supported in symbolic tracing by default. If you want this call to be "
        "recorded, please call torch.fx.wrap('len') at module scope"
    )


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line \d+, in .*$')


def user_frames(stack_trace) -> str:
    """A stack trace with the tracer's own frames (torch/fx or exportir/fx) removed."""
    if stack_trace is None:
        return "None"
    out, keep = [], True
    for line in stack_trace.splitlines():
        m = _FRAME.match(line)
        if m:
            keep = not re.search(r"[/\\](torch|exportir)[/\\]fx[/\\]", m.group("file"))
        if keep:
            out.append(line)
    return "\n".join(out)


@pytest.mark.parametrize("name", IDS)
def test_stack_traces(name):
    """With ``record_stack_traces`` both tracers attribute every node to the same user frames."""

    def with_stack_traces(fx, case):
        def make_tracer():
            tracer = case.make_tracer() if case.make_tracer else fx.Tracer()
            tracer.record_stack_traces = True
            return tracer

        return trace_case(fx, dataclasses.replace(case, make_tracer=make_tracer))

    ours_fx = import_ours_fx()
    theirs = with_stack_traces(torch.fx, build(ENTRY_BY_NAME[name], torch.fx))
    ours = with_stack_traces(ours_fx, build(ENTRY_BY_NAME[name], ours_fx))
    for e, a in zip(theirs.graph.nodes, ours.graph.nodes):
        assert_same_text(user_frames(e.stack_trace), user_frames(a.stack_trace),
                         f"stack_trace of {e.name}")


def _roundtrip(gm, how: str):
    if how == "deepcopy":
        return copy.deepcopy(gm)
    return pickle.loads(pickle.dumps(gm))


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
@pytest.mark.parametrize("name", IDS)
def test_copy_roundtrip(name, how):
    """deepcopy / pickle: same outcome as torch; a copy keeps its code and its numerics."""
    (_, theirs), (case, ours) = pair(name)
    try:
        expected = _roundtrip(theirs, how)
    except Exception as e:  # noqa: BLE001  (torch cannot copy it: ours must fail alike)
        with pytest.raises(type(e)):
            _roundtrip(ours, how)
        return
    actual = _roundtrip(ours, how)
    assert_same_text(expected.code, actual.code, f"gm.code after {how}")
    # (not asserted: code before == after; torch's pickle re-traces and drops pytree codegen)
    assert_same_value(run(case.reference or case.root, case), run(actual, case))
