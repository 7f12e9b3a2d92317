"""ExportGraphSignature and its spec classes, against torch.export.graph_signature.

Each case builds the same signature with exportir's and torch's classes and compares the
printed text and every derived view; then checks what torch does not promise: views are
cached (O(1) after the first access) and stay correct after the spec lists change.
"""

from __future__ import annotations

import copy
import operator
import pickle

import pytest
import torch
import torch.export.graph_signature as T

import exportir.fx as efx
from exportir.export import signature as S

# ---------------------------------------------------------------------------- twin builders

_KIND_ARGS = {
    "tensor": (S.TensorArgument, T.TensorArgument),
    "symint": (S.SymIntArgument, T.SymIntArgument),
    "symfloat": (S.SymFloatArgument, T.SymFloatArgument),
    "symbool": (S.SymBoolArgument, T.SymBoolArgument),
    "token": (S.TokenArgument, T.TokenArgument),
}


def _arg(which: int, kind: str, name: str, *extra):
    if kind == "const":
        return (S.ConstantArgument, T.ConstantArgument)[which](name, *extra)
    if kind == "obj":
        return (S.CustomObjArgument, T.CustomObjArgument)[which](name, *extra)
    return _KIND_ARGS[kind][which](name)


def _twins(inputs, outputs):
    """(ours, torch's) signatures from rows ``(kind name, arg kind, name, target, ...)``."""
    made = []
    for which, mod in ((0, S), (1, T)):
        ins = [
            mod.InputSpec(getattr(mod.InputKind, k), _arg(which, a, n, *extra), target, persistent)
            for k, a, n, target, persistent, *extra in inputs
        ]
        outs = [
            mod.OutputSpec(getattr(mod.OutputKind, k), _arg(which, a, n, *extra), target)
            for k, a, n, target, *extra in outputs
        ]
        made.append(mod.ExportGraphSignature(ins, outs))
    return made


INFERENCE = (
    [
        ("PARAMETER", "tensor", "p_linear_weight", "linear.weight", None),
        ("PARAMETER", "tensor", "p_linear_bias", "linear.bias", None),
        ("BUFFER", "tensor", "b_running_mean", "bn.running_mean", True),
        ("BUFFER", "tensor", "b_scratch", "scratch", False),
        ("CONSTANT_TENSOR", "tensor", "c_lifted_tensor_0", "lifted_tensor_0", None),
        (
            "CUSTOM_OBJ",
            "obj",
            "obj_attr",
            "attr",
            None,
            "__torch__.torch.classes._TorchScriptTesting._Foo",
        ),
        ("TOKEN", "token", "token", None, None),
        ("USER_INPUT", "tensor", "x", None, None),
        ("USER_INPUT", "symint", "s0", None, None),
        ("USER_INPUT", "const", "flag", None, None, True),
        ("USER_INPUT", "symfloat", "f", None, None),
        ("USER_INPUT", "symbool", "b", None, None),
    ],
    [
        ("TOKEN", "token", "token_out", None),
        ("BUFFER_MUTATION", "tensor", "add", "bn.running_mean"),
        ("PARAMETER_MUTATION", "tensor", "mul", "linear.bias"),
        ("USER_INPUT_MUTATION", "tensor", "copy", "x"),
        ("USER_OUTPUT", "tensor", "relu", None),
        ("USER_OUTPUT", "const", "", None, 3),
        ("USER_OUTPUT", "symint", "sym_size", None),
    ],
)

JOINT = (
    [
        ("PARAMETER", "tensor", "p_w", "w", None),
        ("USER_INPUT", "tensor", "x", None, None),
    ],
    [
        ("LOSS_OUTPUT", "tensor", "loss", None),
        ("GRADIENT_TO_PARAMETER", "tensor", "grad_w", "w"),
        ("GRADIENT_TO_USER_INPUT", "tensor", "grad_x", "x"),
    ],
)

EMPTY = ([], [])

VIEWS = [
    "parameters",
    "buffers",
    "non_persistent_buffers",
    "lifted_tensor_constants",
    "lifted_custom_objs",
    "user_inputs",
    "user_outputs",
    "inputs_to_parameters",
    "inputs_to_buffers",
    "inputs_to_lifted_tensor_constants",
    "inputs_to_lifted_custom_objs",
    "buffers_to_mutate",
    "parameters_to_mutate",
    "user_inputs_to_mutate",
    "input_tokens",
    "output_tokens",
    "assertion_dep_token",
]


def _plain(value):
    if hasattr(value, "items"):
        return dict(value)
    if isinstance(value, tuple):
        return list(value)
    return value


@pytest.mark.parametrize("case", [INFERENCE, JOINT, EMPTY], ids=["inference", "joint", "empty"])
def test_str_matches_torch(case):
    ours, theirs = _twins(*case)
    assert str(ours) == str(theirs)
    for mine, want in zip(ours.input_specs, theirs.input_specs):
        assert str(mine) == str(want)
    for mine, want in zip(ours.output_specs, theirs.output_specs):
        assert str(mine) == str(want)


@pytest.mark.parametrize("case", [INFERENCE, JOINT, EMPTY], ids=["inference", "joint", "empty"])
@pytest.mark.parametrize("view", VIEWS)
def test_views_match_torch(case, view):
    ours, theirs = _twins(*case)
    assert _plain(getattr(ours, view)) == _plain(getattr(theirs, view))
    assert type(getattr(ours, view)) is type(getattr(theirs, view))


def test_backward_signature_matches_torch():
    ours, theirs = _twins(*JOINT)
    mine, want = ours.backward_signature, theirs.backward_signature
    assert mine.loss_output == want.loss_output == "loss"
    assert mine.gradients_to_parameters == want.gradients_to_parameters == {"grad_w": "w"}
    assert mine.gradients_to_user_inputs == want.gradients_to_user_inputs == {"grad_x": "x"}
    assert _twins(*INFERENCE)[0].backward_signature is None


def test_mapping_views_are_read_only():
    ours, _ = _twins(*INFERENCE)
    with pytest.raises(TypeError):
        ours.inputs_to_parameters["p_new"] = "new"  # type: ignore[index]


def test_the_kind_enums_have_torchs_members_in_order():
    assert [k.name for k in S.InputKind] == [k.name for k in T.InputKind]
    assert [k.name for k in S.OutputKind] == [k.name for k in T.OutputKind]
    assert S.InputKind.BUFFER == "BUFFER" and S.OutputKind["USER_OUTPUT"].value == "USER_OUTPUT"


# ---------------------------------------------------------------------------- caching


def _sig():
    return _twins(*INFERENCE)[0]


def test_views_are_cached():
    sig = _sig()
    first = sig.inputs_to_parameters
    assert sig.inputs_to_parameters is first
    assert sig.user_inputs is sig.user_inputs


@pytest.mark.parametrize(
    "edit",
    [
        lambda specs, spec: specs.append(spec),
        lambda specs, spec: specs.insert(0, spec),
        lambda specs, spec: specs.extend([spec]),
        lambda specs, spec: specs.__iadd__([spec]),
        lambda specs, spec: specs.__setitem__(0, spec),
        lambda specs, spec: specs.__setitem__(slice(0, 1), [spec]),
    ],
    ids=["append", "insert", "extend", "iadd", "setitem", "setslice"],
)
def test_views_follow_list_edits(edit):
    sig = _sig()
    assert "p_new" not in sig.inputs_to_parameters
    edit(sig.input_specs, S.InputSpec(S.InputKind.PARAMETER, S.TensorArgument("p_new"), "new"))
    assert sig.inputs_to_parameters["p_new"] == "new"
    assert "new" in sig.parameters


@pytest.mark.parametrize(
    "edit",
    [
        lambda specs: specs.pop(),
        lambda specs: specs.pop(0),
        lambda specs: specs.remove(specs[0]),
        lambda specs: specs.__delitem__(0),
        lambda specs: specs.clear(),
        lambda specs: specs.reverse(),
        lambda specs: specs.sort(key=lambda s: s.arg.name),
    ],
    ids=["pop", "pop0", "remove", "delitem", "clear", "reverse", "sort"],
)
def test_views_follow_removals_and_reorders(edit):
    sig = _sig()
    before = sig.user_inputs
    edit(sig.input_specs)
    want = tuple(
        s.arg.value if isinstance(s.arg, S.ConstantArgument) else s.arg.name
        for s in sig.input_specs
        if s.kind == S.InputKind.USER_INPUT
    )
    assert sig.user_inputs == want
    assert before is not sig.user_inputs or want == before


def test_views_follow_list_replacement():
    sig = _sig()
    assert sig.parameters
    sig.input_specs = [S.InputSpec(S.InputKind.USER_INPUT, S.TensorArgument("only"), None)]
    assert sig.parameters == () and sig.user_inputs == ("only",)
    sig.output_specs = []
    assert sig.user_outputs == () and dict(sig.buffers_to_mutate) == {}


def test_replace_all_uses_renames_inputs_and_outputs():
    ours, theirs = _twins(*INFERENCE)
    for sig in (ours, theirs):
        _ = sig.buffers_to_mutate  # build the cache first
        sig.replace_all_uses("add", "add_renamed")
        sig.replace_all_uses("x", "x_renamed")
    assert str(ours) == str(theirs)
    assert dict(ours.buffers_to_mutate) == {"add_renamed": "bn.running_mean"}
    assert "x_renamed" in ours.user_inputs
    with pytest.raises(TypeError, match="two node names"):
        ours.replace_all_uses("x", 1)  # type: ignore[arg-type]


def test_replace_all_uses_leaves_constants_alone():
    ours, _ = _twins(*INFERENCE)
    ours.replace_all_uses("", "something")
    assert 3 in ours.user_outputs


def test_get_replace_hook_tracks_output_renames_in_a_graph_module():
    graph = efx.Graph()
    x = graph.placeholder("x")
    relu = graph.call_function(torch.ops.aten.relu.default, (x,))
    graph.output((relu,))
    gm = efx.GraphModule(torch.nn.Module(), graph)
    sig = S.ExportGraphSignature(
        [S.InputSpec(S.InputKind.USER_INPUT, S.TensorArgument("x"), None)],
        [S.OutputSpec(S.OutputKind.USER_OUTPUT, S.TensorArgument(relu.name), None)],
    )
    assert sig.user_outputs == (relu.name,)
    with gm._set_replace_hook(sig.get_replace_hook()):
        with graph.inserting_after(relu):
            sig_node = graph.call_function(torch.ops.aten.sigmoid.default, (x,))
        relu.replace_all_uses_with(sig_node)
    assert sig.user_outputs == (sig_node.name,) != (relu.name,)


def test_get_replace_hook_with_inputs():
    sig = _sig()
    hook = sig.get_replace_hook(replace_inputs=True)

    class _N:
        def __init__(self, name, op):
            self.name, self.op = name, op

    hook(_N("x", "placeholder"), "x2", _N("relu", "call_function"))
    assert "x2" in sig.user_inputs
    sig.get_replace_hook()(_N("s0", "placeholder"), "s1", _N("relu", "call_function"))
    assert "s0" in sig.user_inputs


# ---------------------------------------------------------------------------- value semantics


def test_equality_copy_and_pickle():
    sig = _sig()
    assert sig == _sig()
    assert copy.copy(sig) == sig and copy.deepcopy(sig) == sig
    assert pickle.loads(pickle.dumps(sig)) == sig
    other = copy.deepcopy(sig)
    other.input_specs.pop()
    assert other != sig and len(sig.input_specs) == len(INFERENCE[0])


def test_repr_lists_the_specs():
    sig = S.ExportGraphSignature(
        [S.InputSpec(S.InputKind.USER_INPUT, S.TensorArgument("x"), None)], []
    )
    assert repr(sig) == (
        "ExportGraphSignature(input_specs=[InputSpec(kind=<InputKind.USER_INPUT: 'USER_INPUT'>, "
        "arg=TensorArgument(name='x'), target=None, persistent=None)], output_specs=[])"
    )


def test_specs_and_arguments_are_frozen_values():
    spec = S.InputSpec(S.InputKind.USER_INPUT, S.TensorArgument("x"), None)
    with pytest.raises(AttributeError):
        spec.target = "y"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        spec.arg.name = "y"  # type: ignore[misc]
    assert hash(spec) == hash(S.InputSpec(S.InputKind.USER_INPUT, S.TensorArgument("x"), None))
    assert S.CustomObjArgument("o", "cls", fake_val=object()) == S.CustomObjArgument("o", "cls")


def test_buffer_spec_needs_persistence():
    with pytest.raises(ValueError, match="persistent=None; pass persistent=True"):
        S.InputSpec(S.InputKind.BUFFER, S.TensorArgument("b_x"), "x")


@pytest.mark.parametrize("cls", [S.InputSpec, S.OutputSpec])
def test_spec_rejects_unknown_argument_types(cls):
    kind = S.InputKind.USER_INPUT if cls is S.InputSpec else S.OutputKind.USER_OUTPUT
    with pytest.raises(TypeError, match="arg must be one of TensorArgument"):
        cls(kind, "x", None)


def test_token_views_reject_non_token_arguments():
    sig = S.ExportGraphSignature([S.InputSpec(S.InputKind.TOKEN, S.TensorArgument("t"), None)], [])
    with pytest.raises(TypeError, match="TOKEN spec must carry a TokenArgument"):
        _ = sig.input_tokens


# ---------------------------------------------------------------------------- make_argument_spec


def _node_with(val, name="n"):
    graph = efx.Graph()
    node = graph.placeholder(name)
    node.meta["val"] = val
    return node


@pytest.mark.parametrize(
    "val, expected",
    [
        (torch.empty(2, device="meta"), S.TensorArgument("n")),
        (3, S.ConstantArgument("n", 3)),
        (None, S.ConstantArgument("n", None)),
        ("s", S.ConstantArgument("n", "s")),
    ],
)
def test_make_argument_spec(val, expected):
    assert S.make_argument_spec(_node_with(val)) == expected


def test_make_argument_spec_of_constants_and_tokens():
    assert S.make_argument_spec(2.5) == S.ConstantArgument("", 2.5)
    assert S.make_argument_spec(_node_with(torch.empty(1)), ["n"]) == S.TokenArgument("n")


def test_make_argument_spec_of_symints():
    import torch.export as te

    class M(torch.nn.Module):
        def forward(self, x):
            return x.shape[0] * 2

    ep = te.export(M(), (torch.randn(4),), dynamic_shapes=({0: te.Dim("n")},))
    sym_node = next(n for n in ep.graph.nodes if n.op == "call_function")
    ours = efx.Graph().placeholder(sym_node.name)
    ours.meta["val"] = sym_node.meta["val"]
    assert S.make_argument_spec(ours) == S.SymIntArgument(sym_node.name)


def test_make_argument_spec_errors():
    graph = efx.Graph()
    bare = graph.placeholder("bare")
    with pytest.raises(ValueError, match="node bare has no meta\\['val'\\]"):
        S.make_argument_spec(bare)
    with pytest.raises(TypeError, match="unsupported type object"):
        S.make_argument_spec(_node_with(object()))


def test_getitem_is_importable_for_hooks():
    # The signature module must stay importable without exportir.export's heavier pieces.
    assert operator.getitem is not None and S.__all__
