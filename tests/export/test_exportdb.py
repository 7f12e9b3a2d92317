"""ExportDB: every example torch ships (torch/_export/db/examples) exported by exportir.

torch.export(strict=False) (functionalized by run_decompositions({})) is the oracle: the
exported signature (placeholder names and kinds,
the root call's forward_arg_names, the in_spec) matches torch's, and ``ep.module()`` computes
what eager computes on the example inputs, on the case's extra inputs, and on other sizes of
every dynamic dimension. ``dynamic_shape_round`` is one torch cannot export (its guards on
``round(s0/2)`` are not proven); exportir exports it with the dimension kept dynamic.
"""

from __future__ import annotations

import copy
import importlib
import inspect

import pytest
import torch
from torch._export.db.examples import all_examples

from exportir import pytree
from exportir.export import export

EXAMPLES = all_examples()
EXAMPLES_PACKAGE = "torch._export.db.examples"
# examples torch.export(strict=False) fails on (and exportir exports)
TORCH_FAILS = {"dynamic_shape_round"}


def _call(fn, args, kwargs):
    """Run ``fn`` on copies (some examples mutate their inputs)."""
    return fn(*copy.deepcopy(args), **copy.deepcopy(kwargs))


def _resized(t: torch.Tensor, dims: dict, new_size: int) -> torch.Tensor:
    shape = [new_size if d in dims else s for d, s in enumerate(t.shape)]
    if t.dtype.is_floating_point:
        return torch.randn(shape, dtype=t.dtype)
    return torch.randint(0, 5, shape, dtype=t.dtype)


def _other_sizes(case) -> list[tuple[tuple, dict]]:
    """The example inputs with every dynamic dimension at other sizes."""
    if not case.dynamic_shapes:
        return []
    sig = inspect.signature(case.model.forward)
    bound = sig.bind(*case.example_args, **(case.example_kwargs or {}))
    out = []
    for size in (1, 4, 7, 10):
        values = dict(bound.arguments)
        for name, spec in case.dynamic_shapes.items():
            if spec:
                values[name] = _resized(values[name], spec, size)
        b = sig.bind(**values)
        out.append((b.args, b.kwargs))
    return out


def _input_sets(case) -> list[tuple[tuple, dict]]:
    sets = [(case.example_args, case.example_kwargs or {})]
    extra = getattr(importlib.import_module(f"{EXAMPLES_PACKAGE}.{case.name}"), "extra_inputs", None)
    if extra is not None:
        sets.append((extra, {}))
    return sets + _other_sizes(case)


def _export(case):
    return export(
        case.model, case.example_args, case.example_kwargs, dynamic_shapes=case.dynamic_shapes
    )


def _signature(ep):
    in_spec = ep.call_spec.in_spec
    if not isinstance(in_spec, pytree.TreeSpec):
        in_spec = pytree.from_torch_treespec(in_spec)
    return (
        [(s.kind.name, s.arg.name if hasattr(s.arg, "name") else s.arg) for s in
         ep.graph_signature.input_specs],
        [s.kind.name for s in ep.graph_signature.output_specs],
        ep.module_call_graph[0].signature.forward_arg_names,
        str(in_spec),
    )


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_module_matches_eager(name):
    case = EXAMPLES[name]
    module = _export(case).module()
    for args, kwargs in _input_sets(case):
        torch.testing.assert_close(_call(module, args, kwargs), _call(case.model, args, kwargs))


@pytest.mark.slow  # torch.export of every example, live (~17 s); exports are checked above
@pytest.mark.parametrize("name", sorted(set(EXAMPLES) - TORCH_FAILS))
def test_signature_matches_torch(name):
    case = EXAMPLES[name]
    theirs = torch.export.export(
        case.model, case.example_args, case.example_kwargs,
        dynamic_shapes=case.dynamic_shapes, strict=False,
    ).run_decompositions({})  # functional, as ours (mutated inputs become outputs)
    assert _signature(_export(case)) == _signature(theirs)


@pytest.mark.parametrize("name", sorted(TORCH_FAILS))
def test_torch_fails_where_we_export(name):
    case = EXAMPLES[name]
    with pytest.raises(Exception, match="Constraints violated"):
        torch.export.export(
            case.model, case.example_args, dynamic_shapes=case.dynamic_shapes, strict=False
        )
    _export(case)


def test_dynamic_shape_round_keeps_the_dim_dynamic():
    case = EXAMPLES["dynamic_shape_round"]
    ep = _export(case)
    (x,) = [n for n in ep.graph.nodes if n.op == "placeholder"]
    assert str(x.meta["val"].shape[0]) == "s0"
    assert "round(" in ep.graph_module.code  # Python's round (half to even), not a floor
    module = ep.module()
    for n in range(12):  # round(2.5) == 2, round(3.5) == 4
        x = torch.randn(n, 2)
        torch.testing.assert_close(module(x), case.model(x))


def test_fn_with_kwargs_replays_star_args_keyword_only_and_var_keyword():
    case = EXAMPLES["fn_with_kwargs"]
    ep = _export(case)
    names = [s.arg.name for s in ep.graph_signature.input_specs]
    assert names == ["pos0", "tuple0_0", "tuple0_1", "myargs_0", "myargs_1", "mykw0", "input0",
                     "input1"]
    kwargs = dict(reversed(list(case.example_kwargs.items())))  # any keyword order
    torch.testing.assert_close(
        ep.module()(*case.example_args, **kwargs), case.model(*case.example_args, **kwargs)
    )


def test_assume_constant_result_burns_in_the_example_value():
    case = EXAMPLES["assume_constant_result"]
    ep = _export(case)
    targets = {n.target for n in ep.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten._local_scalar_dense.default not in targets  # .item() is gone
    assert ep.range_constraints == {}
    x = torch.randn(3, 2)
    # the constant is 4 (the example y): any y gives x[:4], as torch's strict export does
    torch.testing.assert_close(ep.module()(x, torch.tensor(1)), x[:4])


def test_constrain_as_size_asserts_the_checked_range_at_run_time():
    case = EXAMPLES["constrain_as_size_example"]
    module = _export(case).module()
    for a in (0, 2, 5):
        assert module(torch.tensor(a)).shape == (a, 5)
    with pytest.raises(RuntimeError, match="Runtime assertion failed for expression u0 <= 5"):
        module(torch.tensor(6))
