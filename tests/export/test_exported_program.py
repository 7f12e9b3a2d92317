"""ExportedProgram built by hand, checked against torch.export programs of the same models.

``from_torch(tep)`` rebuilds a torch ``ExportedProgram`` node for node as an exportir one
(exportir.fx graph with the same nodes and meta, exportir signature classes, exportir pytree
specs, the same state tensors). This tests the program layer (printing, properties,
``module()`` and its input checks, the verifier on real graphs) independently of capture:
every corpus model's ``str(ep)``, ``ep.module()`` code, results, buffer updates and input-check
errors must equal torch's. torch's ``module(check_guards=False)`` is the oracle for the input
checks (with guards on, torch reports the same conditions as ``Guard failed: ...``).

Reproduce one model: ``PYTHONPATH=src .venv/bin/python -m pytest -p no:xdist
tests/export/test_exported_program.py -k <name>``.
"""

from __future__ import annotations

import copy
import functools
import warnings

import pytest
import torch
import torch.fx as tfx
from corpus import export_models as em
from torch.export import Dim

import exportir.fx as efx
from exportir import pytree
from exportir.export import (
    ExportedProgram,
    ExportGraphSignature,
    InputKind,
    InputSpec,
    ModuleCallEntry,
    ModuleCallSignature,
    OutputKind,
    OutputSpec,
    TensorArgument,
    default_decompositions,
)
from exportir.export import signature as S
from exportir.export.program.verifier import TrainingIRVerifier, Verifier

# ---------------------------------------------------------------------------- the converter

_ARGS = {
    "TensorArgument": lambda a: S.TensorArgument(a.name),
    "SymIntArgument": lambda a: S.SymIntArgument(a.name),
    "SymFloatArgument": lambda a: S.SymFloatArgument(a.name),
    "SymBoolArgument": lambda a: S.SymBoolArgument(a.name),
    "ConstantArgument": lambda a: S.ConstantArgument(a.name, a.value),
    "TokenArgument": lambda a: S.TokenArgument(a.name),
    "CustomObjArgument": lambda a: S.CustomObjArgument(a.name, a.class_fqn, a.fake_val),
}


def convert_arg(a):
    return _ARGS[type(a).__name__](a)


def convert_signature(tsig) -> ExportGraphSignature:
    ins = [
        InputSpec(InputKind[s.kind.name], convert_arg(s.arg), s.target, s.persistent)
        for s in tsig.input_specs
    ]
    outs = [
        OutputSpec(OutputKind[s.kind.name], convert_arg(s.arg), s.target) for s in tsig.output_specs
    ]
    return ExportGraphSignature(ins, outs)


def convert_graph_module(tgm) -> efx.GraphModule:
    graph = efx.Graph()
    env = {}

    def remap(a):
        return tfx.map_arg(a, lambda x: env[x])

    for n in tgm.graph.nodes:
        if n.op == "output":
            new = graph.output(remap(n.args[0]))
        else:
            new = graph.create_node(n.op, n.target, remap(n.args), remap(n.kwargs), name=n.name)
        new.meta = dict(n.meta)
        env[n] = new
    root = torch.nn.Module()
    for name, child in tgm.named_children():
        if isinstance(child, tfx.GraphModule):
            root.add_module(name, convert_graph_module(child))
    return efx.GraphModule(root, graph)


def _spec(ts):
    return None if ts is None else pytree.from_torch_treespec(ts)


def convert_call_graph(entries) -> list[ModuleCallEntry]:
    out = []
    for e in entries:
        sig = e.signature
        if sig is not None:
            sig = ModuleCallSignature(
                [convert_arg(a) for a in sig.inputs],
                [convert_arg(a) for a in sig.outputs],
                _spec(sig.in_spec),
                _spec(sig.out_spec),
                sig.forward_arg_names,
            )
        out.append(ModuleCallEntry(e.fqn, sig))
    return out


def from_torch(tep, *, share_state: bool = False, verifiers=None) -> ExportedProgram:
    """An exportir ExportedProgram with the graph, signature and state of ``tep``."""
    gm = convert_graph_module(tep.graph_module)
    state = (dict(tep.state_dict), dict(tep.constants))
    state_dict, constants = state if share_state else copy.deepcopy(state)  # keeps ties
    return ExportedProgram(
        gm,
        gm.graph,
        convert_signature(tep.graph_signature),
        state_dict,
        dict(tep.range_constraints),
        convert_call_graph(tep.module_call_graph),
        tep.example_inputs,
        constants,
        verifiers=verifiers,
    )


def torch_program(module, args, kwargs=None, **export_kwargs):
    """torch's functional ATen-dialect program (what exportir.export produces)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tep = torch.export.export(module, args, kwargs or {}, strict=False, **export_kwargs)
        return tep.run_decompositions({})


@functools.cache
def corpus_program(name: str):
    module, args, kwargs = em.build(em.BY_NAME[name])
    return module, args, kwargs, torch_program(module, args, kwargs)


NAMES = [e.name for e in em.ENTRIES]


# ---------------------------------------------------------------------------- printing


def _lines(text: str) -> list[str]:
    return text.splitlines()


@pytest.mark.parametrize("name", em.live_oracle_params())
def test_str_matches_torch_line_by_line(name):
    *_, tep = corpus_program(name)
    ep = from_torch(tep)
    assert _lines(str(ep)) == _lines(str(tep))


def test_str_of_simple_model_exactly():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)
            self.register_buffer("steps", torch.zeros(3))

        def forward(self, x):
            self.steps.add_(1)
            return self.linear(x).relu() + self.steps

    tep = torch_program(M(), (torch.randn(2, 4),))
    text = str(from_torch(tep))
    assert text == str(tep)
    assert text.startswith("ExportedProgram:\n    class GraphModule(torch.nn.Module):\n")
    assert 'x: "f32[2, 4]"' in text and "# File: " in text
    assert "\nGraph signature: \n    # inputs\n    p_linear_weight: PARAMETER" in text
    assert "b_steps: BUFFER target='steps' persistent=True" in text
    assert "add: BUFFER_MUTATION target='steps'" in text
    assert text.endswith("Range constraints: {}\n")


def test_str_with_dynamic_shapes_prints_range_constraints():
    class M(torch.nn.Module):
        def forward(self, x, y):
            return x * 2, y[:, 0] + x.sum()

    batch = Dim("batch", min=2, max=64)
    tep = torch_program(
        M(), (torch.randn(4, 3), torch.randn(4, 5)), dynamic_shapes=({0: batch}, {0: batch})
    )
    ep = from_torch(tep)
    assert str(ep) == str(tep)
    assert "Range constraints: {" in str(ep) and "VR[2, 64]" in str(ep)


def test_repr_is_the_default_object_repr():
    *_, tep = corpus_program("mlp")
    assert repr(from_torch(tep)).startswith("<exportir.export.program.exported_program.ExportedProgram")


# ---------------------------------------------------------------------------- module()


def _assert_tree_equal(actual, expected, what):
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    assert a_spec == e_spec, f"{what}: structure {a_spec} != {e_spec}"
    for a, e in zip(a_leaves, e_leaves):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(a, e, msg=lambda m: f"{what}: {m}")
        else:
            assert a == e, what


def _module_pair(name):
    _, args, kwargs, tep = corpus_program(name)
    ours = from_torch(tep).module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = copy.deepcopy(tep).module(check_guards=False)
    return ours, theirs, args, kwargs


@pytest.mark.parametrize("name", em.live_oracle_params())
def test_module_code_matches_torch(name):
    ours, theirs, *_ = _module_pair(name)
    assert ours.code == theirs.code


@pytest.mark.parametrize("name", em.live_oracle_params())
def test_module_runs_like_torch_and_updates_state(name):
    ours, theirs, args, kwargs = _module_pair(name)
    for seed in (0, 1):
        a, k = em.fresh_inputs(args, kwargs, seed) if seed else (args, kwargs)
        a1, k1 = em.clone_inputs(a, k)
        a2, k2 = em.clone_inputs(a, k)
        with torch.no_grad():
            got, want = ours(*a1, **k1), theirs(*a2, **k2)
        _assert_tree_equal(got, want, f"{name} outputs (run {seed})")
        _assert_tree_equal((a1, k1), (a2, k2), f"{name} mutated inputs (run {seed})")
        got_buffers = dict(ours.named_buffers())
        want_buffers = dict(theirs.named_buffers())
        assert got_buffers.keys() == want_buffers.keys()
        for key, value in want_buffers.items():
            torch.testing.assert_close(got_buffers[key], value, msg=f"{name} buffer {key}")


@pytest.mark.parametrize("name", em.live_oracle_params())
def test_module_state_kinds_match_torch(name):
    ours, theirs, *_ = _module_pair(name)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert sorted(n for n, _ in ours.named_buffers()) == sorted(
        n for n, _ in theirs.named_buffers()
    )
    assert list(ours.state_dict()) == list(theirs.state_dict())


def _error(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001  # comparing whatever both raise
        return type(e), str(e)
    return None


def _first_tensor_path(args):
    leaves = pytree.tree_leaves_with_path(args)
    return next(((p, v) for p, v in leaves if isinstance(v, torch.Tensor)), (None, None))


def _with_leaf(args, path, value):
    leaves, spec = pytree.tree_flatten(args)
    paths = [p for p, _ in pytree.tree_leaves_with_path(args)]
    leaves[paths.index(path)] = value
    return pytree.tree_unflatten(leaves, spec)


def _bad_shape_variants(args):
    path, t = _first_tensor_path(args)
    if t is None or t.dim() == 0:
        return []
    bigger = list(t.shape)
    bigger[0] += 1
    return [
        ("wrong size", _with_leaf(args, path, torch.zeros(bigger, dtype=t.dtype))),
        ("extra dim", _with_leaf(args, path, torch.zeros((*t.shape, 1), dtype=t.dtype))),
        ("not a tensor", _with_leaf(args, path, 3)),
    ]


@pytest.mark.parametrize("name", em.live_oracle_params())
def test_input_check_errors_match_torch(name):
    ours, theirs, args, kwargs = _module_pair(name)
    for what, bad in _bad_shape_variants(args):
        mine = _error(ours, *bad, **kwargs)
        want = _error(theirs, *bad, **kwargs)
        assert mine is not None, f"{name}: {what} was accepted"
        assert mine == want, f"{name}: {what}"


@pytest.mark.parametrize("name", ["mlp", "dict_io", "mlp_kwargs", "namedtuple_io"])
def test_structure_errors_match_torch(name):
    ours, theirs, args, kwargs = _module_pair(name)
    cases = [((*args, torch.zeros(1)), kwargs), (args, {**kwargs, "extra": 1})]
    if kwargs:
        cases.append((args, {}))
    for bad_args, bad_kwargs in cases:
        mine = _error(ours, *bad_args, **bad_kwargs)
        assert mine is not None
        assert mine == _error(theirs, *bad_args, **bad_kwargs)


def test_shape_error_text():
    ours, _, _, _ = _module_pair("mlp")
    with pytest.raises(RuntimeError) as info:
        ours(torch.zeros(4, 8))
    assert str(info.value).startswith(
        "Expected input at *args[0].shape[0] to be equal to 3, but got 4. If you meant for "
        "this dimension to be dynamic"
    )


def test_dtype_is_checked():
    ours, _, args, _ = _module_pair("mlp")
    with pytest.raises(RuntimeError, match=r"\*args\[0\]\.dtype to be equal to torch.float32"):
        ours(args[0].double())


def test_static_input_values_are_checked_like_torch():
    ours, theirs, args, kwargs = _module_pair("static_args")
    for bad in [(args[0], 3, *args[2:]), (args[0], 2.0, *args[2:]), (*args[:3], "other")]:
        mine = _error(ours, *bad, **kwargs)
        assert mine is not None and mine == _error(theirs, *bad, **kwargs)


def test_dynamic_dims_are_checked_like_torch():
    class M(torch.nn.Module):
        def forward(self, x, y):
            return x + 1, y * 2

    batch = Dim("batch", min=3, max=8)
    tep = torch_program(
        M(), (torch.randn(4, 3), torch.randn(4, 5)), dynamic_shapes=({0: batch}, {0: batch})
    )
    ours = from_torch(tep).module()
    theirs = tep.module(check_guards=False)
    good = (torch.randn(6, 3), torch.randn(6, 5))
    _assert_tree_equal(ours(*good), theirs(*good), "dynamic run")
    for bad in [
        (torch.randn(9, 3), torch.randn(9, 5)),  # above max
        (torch.randn(3, 3), torch.randn(3, 5)),  # at min: allowed
        (torch.randn(5, 3), torch.randn(6, 5)),  # the two dims disagree
        (torch.randn(5, 4), torch.randn(5, 5)),  # a static dim
    ]:
        assert _error(ours, *bad) == _error(theirs, *bad)
    assert _error(ours, torch.randn(9, 3), torch.randn(9, 5))[1] == (
        "Expected input at *args[0].shape[0] to be <= 8, but got 9"
    )


def test_module_train_and_eval_are_not_supported_like_torch():
    ours, *_ = _module_pair("mlp")
    with pytest.raises(NotImplementedError, match=r"Calling train\(\) is not supported yet."):
        ours.train()
    with pytest.raises(NotImplementedError, match=r"Calling eval\(\) is not supported yet."):
        ours.eval()


def test_module_shares_state_with_the_program_like_torch():
    *_, tep = corpus_program("buffer_inplace")
    ep = from_torch(tep)
    mod = ep.module()
    before = {k: v.clone() for k, v in ep.state_dict.items()}
    mod(torch.randn(3, 4))
    changed = [k for k in before if not torch.equal(before[k], ep.state_dict[k])]
    assert changed, "the buffer update should land in the program's state_dict tensor"
    name = changed[0]
    assert mod.get_buffer(name) is ep.state_dict[name]


def test_module_validate_inputs_can_be_turned_off():
    ours, *_ = _module_pair("mlp")
    ours.validate_inputs = False
    with pytest.raises(RuntimeError, match="mat1 and mat2"):
        ours(torch.zeros(3, 5))


def test_module_is_an_exportir_graph_module():
    ours, *_ = _module_pair("mlp")
    assert isinstance(ours, efx.GraphModule)
    assert not any(n.op == "placeholder" and n.name.startswith("p_") for n in ours.graph.nodes)


# ---------------------------------------------------------------------------- properties


def test_properties_match_torch():
    _module, _args, _kwargs, tep = corpus_program("tensor_constant")
    ep = from_torch(tep, share_state=True)
    assert ep.graph is ep.graph_module.graph
    assert ep.state_dict == tep.state_dict and ep.constants == tep.constants
    assert ep.tensor_constants is ep.constants
    assert ep.range_constraints == {}
    assert ep.example_inputs is tep.example_inputs
    assert ep.dialect == "ATEN" and ep.verifier is Verifier and ep.verifiers == [Verifier]
    assert str(ep.graph_signature) == str(tep.graph_signature)
    assert [e.fqn for e in ep.module_call_graph] == [e.fqn for e in tep.module_call_graph]
    assert repr(ep.call_spec.in_spec) == repr(tep.call_spec.in_spec)
    assert repr(ep.call_spec.out_spec) == repr(tep.call_spec.out_spec)
    assert type(ep.call_spec).__name__ == "CallSpec"
    assert [n for n, _ in ep.named_parameters()] == [n for n, _ in tep.named_parameters()]
    assert [n for n, _ in ep.named_buffers()] == [n for n, _ in tep.named_buffers()]
    assert len(list(ep.parameters())) == len(list(tep.parameters()))
    assert len(list(ep.buffers())) == len(list(tep.buffers()))
    assert ep._num_lifted_params_buffers() == tep._num_lifted_params_buffers()


@pytest.mark.parametrize(
    "attr",
    [
        "graph_module",
        "graph",
        "graph_signature",
        "state_dict",
        "range_constraints",
        "module_call_graph",
        "call_spec",
        "verifier",
        "dialect",
        "verifiers",
        "tensor_constants",
        "constants",
    ],
)
def test_read_only_properties_refuse_assignment_like_torch(attr):
    *_, tep = corpus_program("mlp")
    ep = from_torch(tep)
    with pytest.raises(RuntimeError) as mine:
        setattr(ep, attr, None)
    with pytest.raises(RuntimeError) as theirs:
        setattr(tep, attr, None)
    assert str(mine.value) == str(theirs.value)


def test_example_inputs_setter_checks_structure_like_torch():
    _, _args, _, tep = corpus_program("mlp")
    ep = from_torch(tep)
    ep.example_inputs = ((torch.randn(3, 8),), {})
    ep.example_inputs = None
    assert ep.example_inputs is None
    for bad in [(torch.randn(3, 8),), ((torch.randn(3, 8), 1), {})]:
        with pytest.raises(ValueError) as mine:
            ep.example_inputs = bad
        with pytest.raises(ValueError) as theirs:
            tep.example_inputs = bad
        assert str(mine.value) == str(theirs.value)


def test_calling_the_program_directly_is_refused_like_torch():
    *_, tep = corpus_program("mlp")
    with pytest.raises(RuntimeError) as mine:
        from_torch(tep)(torch.randn(3, 8))
    with pytest.raises(RuntimeError) as theirs:
        tep(torch.randn(3, 8))
    assert str(mine.value) == str(theirs.value)


@pytest.mark.parametrize("name", ["mlp", "buffer_inplace", "tensor_constant", "mlp_kwargs"])
def test_graph_module_flat_inputs_run_the_graph(name):
    _module, args, kwargs, tep = corpus_program(name)
    ep = from_torch(tep)
    flat = ep._graph_module_flat_inputs(args, kwargs)
    want = tep._graph_module_flat_inputs(args, kwargs)
    assert len(flat) == len(want)
    for a, b in zip(flat, want):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        out = ep.graph_module(*flat)
    assert len(out) == len(ep.graph_signature.output_specs)


def test_validate_runs_every_verifier():
    calls = []

    class Counting(Verifier):
        dialect = "TEST_COUNTING"

        def check_additional(self, gm):
            calls.append(gm)

    *_, tep = corpus_program("mlp")
    ep = from_torch(tep, verifiers=[Counting])
    assert len(calls) == 1 and ep.dialect == "TEST_COUNTING"
    ep.validate()
    assert len(calls) == 2


def test_training_ir_program_with_inplace_ops():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("n", torch.zeros(2))

        def forward(self, x):
            self.n.add_(1)
            return x + self.n

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tep = torch.export.export(M(), (torch.randn(2),), strict=False)  # training IR (add_)
    ep = from_torch(tep, verifiers=[TrainingIRVerifier])
    assert ep.dialect == "TRAINING" and str(ep) == str(tep)
    with pytest.raises(Exception, match="is not functional"):
        from_torch(tep)


def test_duplicate_getitems_are_merged_and_signature_follows():
    graph = efx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.randn(4)
    meta = {"stack_trace": 'File "m.py", line 1, in forward', "nn_module_stack": {}}
    split = graph.call_function(torch.ops.aten.split.Tensor, (x, 2))
    split.meta.update(meta, val=list(torch.randn(4).split(2)))
    first = graph.call_function(__import__("operator").getitem, (split, 0))
    again = graph.call_function(__import__("operator").getitem, (split, 0))
    for n in (first, again):
        n.meta.update(meta, val=torch.randn(2))
    graph.output((first, again))
    sig = ExportGraphSignature(
        [InputSpec(InputKind.USER_INPUT, TensorArgument("x"), None)],
        [OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(n.name), None) for n in (first, again)],
    )
    ep = ExportedProgram(efx.GraphModule(torch.nn.Module(), graph), graph, sig, {}, {}, [])
    getitems = [n for n in ep.graph.nodes if n.target is __import__("operator").getitem]
    assert [n.name for n in getitems] == ["getitem"]
    assert ep.graph_signature.user_outputs == ("getitem", "getitem")


# ---------------------------------------------------------------------------- decompositions


def test_default_decompositions_equal_torchs_table():
    ours = default_decompositions()
    theirs = dict(torch.export.default_decompositions().materialize())
    assert {str(k) for k in ours} == {str(k) for k in theirs}
    assert ours is not default_decompositions(), "each call returns a fresh table"


def test_default_decompositions_keep_preserved_ops():
    table = default_decompositions()
    assert torch.ops.aten.upsample_bilinear2d.vec not in table
    assert torch.ops.aten.linear.default in table  # composite-implicit: decomposed
    assert torch.ops.aten.add.Tensor not in table  # core


@pytest.mark.parametrize("name", ["mlp", "cnn_bn_train", "buffer_inplace", "dict_io"])
def test_run_decompositions_matches_torch(name):
    _module, args, kwargs, tep = corpus_program(name)
    ep = from_torch(tep).run_decompositions()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = tep.run_decompositions()
    ops = sorted(str(n.target) for n in ep.graph.nodes if n.op == "call_function")
    assert ops == sorted(str(n.target) for n in want.graph.nodes if n.op == "call_function")
    assert [(s.kind, s.target) for s in ep.graph_signature.input_specs] == [
        (InputKind[s.kind.name], s.target) for s in want.graph_signature.input_specs
    ]
    a1, k1 = em.clone_inputs(args, kwargs)
    a2, k2 = em.clone_inputs(args, kwargs)
    with torch.no_grad():
        _assert_tree_equal(ep.module()(*a1, **k1), from_torch(tep).module()(*a2, **k2), name)


class _Cond(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x, p):
        return torch.cond(p.sum() > 0, lambda x: self.lin(x).sin(), lambda x: x.cos(), (x,))


def test_cond_program_with_branch_subgraphs():
    tep = torch_program(_Cond(), (torch.randn(2, 3), torch.randn(2)))
    ep = from_torch(tep)
    assert str(ep) == str(tep)
    assert isinstance(ep.graph_module.true_graph_0, efx.GraphModule)
    ours, theirs = ep.module(), tep.module(check_guards=False)
    assert ours.code == theirs.code
    x = torch.randn(2, 3)
    for p in (torch.ones(2), -torch.ones(2)):
        torch.testing.assert_close(ours(x, p), theirs(x, p))


def test_root_may_be_a_dict_of_attributes():
    tep = torch_program(_Cond(), (torch.randn(2, 3), torch.randn(2)))
    gm = convert_graph_module(tep.graph_module)
    root = dict(gm.named_children())
    ep = ExportedProgram(
        root,
        gm.graph,
        convert_signature(tep.graph_signature),
        dict(tep.state_dict),
        {},
        convert_call_graph(tep.module_call_graph),
    )
    assert ep.graph_module.false_graph_0 is root["false_graph_0"]
    assert ep.example_inputs is None and ep.constants == {}


# ---------------------------------------------------------------------------- with capture


class _Simple(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 3))
        self.register_buffer("steps", torch.zeros(3))

    def forward(self, x, *, scale):
        self.steps.add_(1)
        return {"out": (x.mm(self.w) * scale).relu() + self.steps, "n": x.sum()}


def test_exported_simple_model_prints_like_torch():
    from exportir.export import export

    args, kwargs = (torch.randn(2, 4),), {"scale": torch.randn(3)}
    torch.manual_seed(0)
    ep = export(_Simple(), args, kwargs)
    torch.manual_seed(0)
    tep = torch_program(_Simple(), args, kwargs)
    assert _lines(str(ep)) == _lines(str(tep))
    ours, theirs = ep.module(), tep.module(check_guards=False)
    assert ours.code == theirs.code
    _assert_tree_equal(ours(*args, **kwargs), theirs(*args, **kwargs), "simple model")
    assert _error(ours, torch.randn(5, 4), scale=torch.randn(3)) == _error(
        theirs, torch.randn(5, 4), scale=torch.randn(3)
    )
