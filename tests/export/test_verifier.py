"""The Export IR verifier: valid programs pass, each rule's violation fails with its message.

Programs are built by hand with exportir.fx. The base program is valid::

    p_w (PARAMETER w), b_buf (BUFFER buf), c_k (CONSTANT_TENSOR k), x (USER_INPUT)
    add = aten.add.Tensor(x, p_w); mul = aten.mul.Tensor(add, b_buf)
    add_1 = aten.add.Tensor(b_buf, c_k)
    return (add_1 -> BUFFER_MUTATION buf, mul -> USER_OUTPUT)

and every test breaks one thing. Node errors must name the node and show the graph window
with the node marked ``-->``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import pytest
import torch

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
    SpecViolationError,
    TensorArgument,
)
from exportir.export.verifier import (
    NodeSpecViolationError,
    TrainingIRVerifier,
    Verifier,
    load_verifier,
)

META = {
    "stack_trace": '  File "model.py", line 3, in forward\n    return x + w',
    "nn_module_stack": {"L__self__": ("", "model.M")},
    "source_fn_stack": [("add", operator.add)],
}


IN_SPEC = pytree.tree_structure(((0,), {}))
OUT_SPEC = pytree.tree_structure(0)


def _val(*shape):
    return torch.empty(*shape, device="meta")


@dataclass
class Parts:
    graph: efx.Graph
    nodes: dict
    inputs: list
    outputs: list
    state_dict: dict = field(default_factory=dict)
    constants: dict = field(default_factory=dict)
    root: torch.nn.Module = field(default_factory=torch.nn.Module)
    call_graph: list = field(default_factory=list)

    def program(self, verifiers=None) -> ExportedProgram:
        gm = efx.GraphModule(self.root, self.graph)
        sig = ExportGraphSignature(self.inputs, self.outputs)
        return ExportedProgram(
            gm, gm.graph, sig, self.state_dict, {}, self.call_graph, None, self.constants,
            verifiers=verifiers,
        )  # fmt: skip


def _call(graph, target, args, val, name=None):
    node = graph.create_node("call_function", target, args, name=name)
    node.meta.update(META, val=val)
    return node


def base() -> Parts:
    g = efx.Graph()
    nodes = {}
    for name in ("p_w", "b_buf", "c_k", "x"):
        nodes[name] = g.placeholder(name)
        nodes[name].meta["val"] = _val(3)
    add, mul = torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor
    nodes["add"] = _call(g, add, (nodes["x"], nodes["p_w"]), _val(3), "add")
    nodes["mul"] = _call(g, mul, (nodes["add"], nodes["b_buf"]), _val(3), "mul")
    nodes["add_1"] = _call(g, add, (nodes["b_buf"], nodes["c_k"]), _val(3), "add_1")
    nodes["output"] = g.output((nodes["add_1"], nodes["mul"]))
    return Parts(
        graph=g,
        nodes=nodes,
        inputs=[
            InputSpec(InputKind.PARAMETER, TensorArgument("p_w"), "w"),
            InputSpec(InputKind.BUFFER, TensorArgument("b_buf"), "buf", persistent=True),
            InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument("c_k"), "k"),
            InputSpec(InputKind.USER_INPUT, TensorArgument("x"), None),
        ],
        outputs=[
            OutputSpec(OutputKind.BUFFER_MUTATION, TensorArgument("add_1"), "buf"),
            OutputSpec(OutputKind.USER_OUTPUT, TensorArgument("mul"), None),
        ],
        state_dict={"w": torch.nn.Parameter(torch.ones(3)), "buf": torch.zeros(3)},
        constants={"k": torch.full((3,), 2.0)},
        call_graph=[ModuleCallEntry("", ModuleCallSignature([], [], IN_SPEC, OUT_SPEC, ["x"]))],
    )


def _fails(parts: Parts, pattern: str, *, node: str | None = None, verifiers=None):
    with pytest.raises(SpecViolationError, match=pattern) as info:
        parts.program(verifiers)
    if node is not None:
        assert isinstance(info.value, NodeSpecViolationError)
        assert info.value.node_name == node
        marked = [line for line in str(info.value).splitlines() if line.startswith("-->")]
        text = "--> return" if node == "output" else f"--> %{node} "
        assert len(marked) == 1 and marked[0].startswith(text), str(info.value)
    return info.value


# ---------------------------------------------------------------------------- passing


def test_base_program_is_valid_and_runs():
    ep = base().program()
    ep.validate()
    assert ep.dialect == "ATEN"
    out = ep.module()(torch.ones(3))
    torch.testing.assert_close(out, torch.zeros(3))


def test_getitem_symint_builtins_and_subgraph_getattr_are_allowed():
    parts = base()
    g, n = parts.graph, parts.nodes
    with g.inserting_before(n["output"]):
        split = _call(g, torch.ops.aten.split.Tensor, (n["mul"], 1), [_val(1)] * 3)
        first = _call(g, operator.getitem, (split, 0), _val(1))
        size = _call(g, torch.ops.aten.sym_size.int, (first, 0), 1)
        _call(g, operator.mul, (size, 2), 2)
        sub = g.get_attr("branch")
        sub.meta["val"] = None
    branch = efx.Graph()
    y = branch.placeholder("y")
    y.meta["val"] = _val(3)
    branch.output((y,))
    parts.root.add_module("branch", efx.GraphModule(torch.nn.Module(), branch))
    parts.program().validate()


def test_no_return_ops_need_no_val():
    parts = base()
    g, n = parts.graph, parts.nodes
    with g.inserting_before(n["output"]):
        node = g.call_function(torch.ops.aten._assert_async.msg, (n["mul"], "fail"))
        node.meta.update(META)
    parts.program()


# ---------------------------------------------------------------------------- graph structure


def test_placeholder_after_call_function():
    parts = base()
    g = parts.graph
    with g.inserting_after(parts.nodes["add"]):
        late = g.placeholder("late")
        late.meta["val"] = _val(3)
    _fails(parts, "placeholder late comes after call_function node add", node="late")


def test_output_must_be_last():
    parts = base()
    g = parts.graph
    with g.inserting_after(parts.nodes["output"]):
        extra = _call(g, torch.ops.aten.relu.default, (parts.nodes["mul"],), _val(3))
    _fails(parts, "the last node of an exported graph must be the output node", node=extra.name)


def test_output_must_be_a_flat_tuple():
    parts = base()
    parts.nodes["output"].args = (parts.nodes["mul"],)
    parts.outputs = parts.outputs[1:]
    _fails(parts, "returns a flat tuple/list of values; got Node", node="output")


# ---------------------------------------------------------------------------- node rules


def test_multi_output_node_as_an_argument_is_rejected():
    """A tuple-returning operator feeds other operators only through operator.getitem (the
    graph export made for F.rrelu(x, training=True) before the fix passed it to add)."""
    parts = base()
    g, n = parts.graph, parts.nodes
    with g.inserting_before(n["mul"]):
        split = _call(g, torch.ops.aten.split.Tensor, (n["add"], 1), [_val(1)] * 3, "split")
    n["mul"].update_arg(0, split)
    err = _fails(parts, "operator 'aten.mul.Tensor' \\(node mul\\) takes argument 'self' from node "
                 "split, which produces 3 values", node="mul")
    assert "operator.getitem (e.g. split[0])" in str(err)


def test_multi_output_node_in_a_list_argument_is_rejected():
    parts = base()
    g, n = parts.graph, parts.nodes
    with g.inserting_before(n["output"]):
        split = _call(g, torch.ops.aten.split.Tensor, (n["mul"], 1), [_val(1)] * 3, "split")
        _call(g, torch.ops.aten.cat.default, ([split, n["mul"]],), _val(4), "cat")
    _fails(parts, "takes argument 'tensors' from node split", node="cat")


def test_rrelu_training_exports_a_valid_graph():
    from exportir.export import export

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.rrelu(x, training=True) + 1

    exported = export(M(), (torch.randn(4, 3),))
    # aten.rrelu is a composite op export keeps whole (as torch.export's
    # run_decompositions({})); its core decomposition is the multi-output functional variant
    (kept,) = [x for x in exported.graph.nodes if "rrelu" in str(x.target)]
    assert kept.target is torch.ops.aten.rrelu.default
    ep = exported.run_decompositions()
    ep.validate()
    (rrelu,) = [x for x in ep.graph.nodes if "rrelu" in str(x.target)]
    assert rrelu.target is torch.ops.aten.rrelu_with_noise_functional.default
    (user,) = rrelu.users
    assert user.target is operator.getitem and user.args == (rrelu, 0)
    x = -torch.rand(4, 3) - 0.5
    for program in (exported, ep):
        slope = (program.module()(x) - 1) / x  # a random slope in [1/8, 1/3] per element
        assert bool(((slope >= 1 / 8 - 1e-6) & (slope <= 1 / 3 + 1e-6)).all())


def test_missing_val():
    parts = base()
    del parts.nodes["mul"].meta["val"]
    err = _fails(parts, "Node.meta mul is missing val field", node="mul")
    assert "meta['val']" in str(err)


def test_placeholder_missing_val():
    parts = base()
    del parts.nodes["x"].meta["val"]
    _fails(parts, "Node.meta x is missing val field", node="x")


def test_invalid_val():
    parts = base()
    parts.nodes["add"].meta["val"] = object()
    _fails(parts, "Node.meta add has invalid val field", node="add")


@pytest.mark.parametrize("key", ["stack_trace", "nn_module_stack"])
def test_missing_required_metadata(key):
    parts = base()
    del parts.nodes["add"].meta[key]
    _fails(parts, rf"missing metadata \['{key}'\]; the Export IR metadata contract", node="add")


def test_metadata_hook_can_relax_the_contract():
    class Relaxed(Verifier):
        dialect = "TEST_RELAXED"

        def required_call_function_meta(self):
            return ()

    parts = base()
    del parts.nodes["add"].meta["stack_trace"]
    assert parts.program([Relaxed]).dialect == "TEST_RELAXED"


def test_torch_function_target_is_rejected():
    parts = base()
    parts.nodes["add"].target = torch.add
    err = _fails(
        parts, "Operator 'torch.add' .node add. is not an allowed operator type", node="add"
    )
    assert "torch.ops.aten.add.Tensor, not torch.add" in str(err)


def test_python_function_target_is_rejected():
    parts = base()
    parts.nodes["add"].target = lambda a, b: a + b
    _fails(parts, "is not an allowed operator type", node="add")


def test_mutating_op_is_rejected_in_aten_dialect():
    parts = base()
    parts.nodes["add_1"].target = torch.ops.aten.add_.Tensor
    err = _fails(parts, "operator 'aten.add_.Tensor' .node add_1. is not functional", node="add_1")
    assert "out-of-place variant" in str(err)


def test_mutating_op_is_allowed_in_training_dialect():
    parts = base()
    parts.nodes["add_1"].target = torch.ops.aten.add_.Tensor
    assert parts.program([TrainingIRVerifier]).dialect == "TRAINING"


@pytest.mark.parametrize("op", ["call_module", "call_method"])
def test_call_module_and_call_method_are_rejected(op):
    parts = base()
    g = parts.graph
    with g.inserting_before(parts.nodes["output"]):
        node = g.create_node(op, "relu", (parts.nodes["mul"],), name="bad")
        node.meta.update(META, val=_val(3))
    parts.root.add_module("relu", torch.nn.ReLU())
    _fails(parts, f"{op} is not valid in an exported graph: got node bad", node="bad")


def test_get_attr_of_a_tensor_at_top_level_is_rejected():
    parts = base()
    g = parts.graph
    with g.inserting_before(parts.nodes["output"]):
        node = g.get_attr("weight")
        node.meta["val"] = _val(3)
    parts.root.register_buffer("weight", torch.zeros(3))
    err = _fails(parts, "Invalid get_attr type Tensor on target weight", node="weight")
    assert "lifted to placeholders" in str(err)


def test_get_attr_of_a_tensor_inside_a_branch_graph_is_allowed():
    parts = base()
    branch = efx.Graph()
    w = branch.get_attr("w")
    w.meta["val"] = _val(3)
    branch.output((w,))
    sub_root = torch.nn.Module()
    sub_root.register_buffer("w", torch.zeros(3))
    parts.root.add_module("branch", efx.GraphModule(sub_root, branch))
    with parts.graph.inserting_before(parts.nodes["output"]):
        parts.graph.get_attr("branch").meta["val"] = None
    parts.program()


def test_get_attr_of_a_tensor_constant_treespec_is_allowed():
    parts = base()
    parts.root.spec = pytree.tree_structure((1, 2))
    with parts.graph.inserting_before(parts.nodes["output"]):
        parts.graph.get_attr("spec")
    parts.program()


def test_node_error_window_is_short_on_big_graphs():
    parts = base()
    g, prev = parts.graph, parts.nodes["mul"]
    with g.inserting_before(parts.nodes["add_1"]):
        for _ in range(200):
            prev = _call(g, torch.ops.aten.relu.default, (prev,), _val(3))
    del prev.meta["val"]
    err = _fails(parts, "is missing val field", node=prev.name)
    assert len(str(err).splitlines()) < 15


# ---------------------------------------------------------------------------- signature


def test_input_count_mismatch():
    parts = base()
    parts.inputs = parts.inputs[:-1]
    _fails(parts, r"Number of graph inputs \(4\) does not match number of inputs in the graph "
           r"signature \(3\)\nPlaceholders missing input_specs: \['x'\]")  # fmt: skip


def test_input_name_mismatch():
    parts = base()
    parts.inputs[3] = InputSpec(InputKind.USER_INPUT, TensorArgument("y"), None)
    _fails(parts, "Input spec name y does not match node name x", node="x")


def test_lifted_input_needs_a_target():
    parts = base()
    parts.inputs[0] = InputSpec(InputKind.PARAMETER, TensorArgument("p_w"), None)
    _fails(parts, r"InputSpec for p_w \(PARAMETER\) has no target", node="p_w")


def test_parameter_must_be_a_tensor_argument():
    from exportir.export import SymIntArgument

    parts = base()
    parts.inputs[0] = InputSpec(InputKind.PARAMETER, SymIntArgument("p_w"), "w")
    _fails(parts, "PARAMETER input p_w is not a tensor argument", node="p_w")


def test_output_count_mismatch():
    parts = base()
    parts.outputs = parts.outputs[1:]
    _fails(parts, "Number of output nodes 2 is different than the number of outputs specified "
           "by the graph signature: 1", node="output")  # fmt: skip


def test_output_name_mismatch():
    parts = base()
    parts.outputs[1] = OutputSpec(OutputKind.USER_OUTPUT, TensorArgument("add"), None)
    _fails(parts, "names 'add' but the graph returns 'mul' at that position", node="output")


def test_mutation_after_user_output():
    parts = base()
    parts.nodes["output"].args = ((parts.nodes["mul"], parts.nodes["add_1"]),)
    parts.outputs = parts.outputs[::-1]
    _fails(parts, "mutation output add_1 .BUFFER_MUTATION. comes after user output mul",
           node="output")  # fmt: skip


@pytest.mark.parametrize(
    "kind, target, what",
    [
        (OutputKind.BUFFER_MUTATION, "nope", "Buffer"),
        (OutputKind.PARAMETER_MUTATION, "buf", "Parameter"),
        (OutputKind.USER_INPUT_MUTATION, "w", "User input"),
    ],
)
def test_mutation_target_must_exist(kind, target, what):
    parts = base()
    parts.outputs[0] = OutputSpec(kind, TensorArgument("add_1"), target)
    _fails(parts, f"{what} output add_1 does not point to a {what.lower()} that exists",
           node="output")  # fmt: skip


def test_user_input_mutation_of_an_existing_input_is_valid():
    parts = base()
    parts.outputs[0] = OutputSpec(OutputKind.USER_INPUT_MUTATION, TensorArgument("add_1"), "x")
    parts.program()


# ---------------------------------------------------------------------------- state


def test_parameter_missing_from_state_dict():
    parts = base()
    del parts.state_dict["w"]
    _fails(parts, "Parameter w is not in the state dict", node="p_w")


def test_parameter_must_be_a_parameter():
    parts = base()
    parts.state_dict["w"] = torch.ones(3)
    _fails(parts, "State dict entry for parameter w is not an instance of torch.nn.Parameter",
           node="p_w")  # fmt: skip


def test_buffer_missing_from_state_dict():
    parts = base()
    del parts.state_dict["buf"]
    _fails(parts, "Buffer buf is not in the state dict", node="b_buf")


def test_non_persistent_buffer_rules():
    parts = base()
    parts.inputs[1] = InputSpec(InputKind.BUFFER, TensorArgument("b_buf"), "buf", False)
    _fails(parts, "Non-persistent buffer buf is in the state dict, it should not be",
           node="b_buf")  # fmt: skip
    parts.state_dict.pop("buf")
    _fails(parts, "Non-persistent buffer buf is not in the constants dictionary", node="b_buf")
    parts.constants["buf"] = torch.zeros(3)
    parts.program()


def test_constant_missing_from_constants():
    parts = base()
    parts.constants.clear()
    _fails(parts, "Constant tensor k is not in the constants dictionary", node="c_k")


def test_module_call_graph_names_must_exist():
    parts = base()
    parts.call_graph[0].signature.outputs.append(TensorArgument("gone"))
    _fails(parts, "Output gone of module call entry '' does not exist in the graph")


# ---------------------------------------------------------------------------- verifier classes


def test_validate_catches_edits_after_construction():
    ep = base().program()
    mul = next(n for n in ep.graph.nodes if n.name == "mul")
    mul.target = torch.ops.aten.mul_.Tensor
    with pytest.raises(NodeSpecViolationError, match="is not functional"):
        ep.validate()


def test_check_valid_op_hook_errors_are_marked():
    class NoMul(Verifier):
        dialect = "TEST_NO_MUL"

        def check_valid_op(self, op):
            if op is torch.ops.aten.mul.Tensor:
                raise SpecViolationError("mul is not in this dialect")

    _fails(base(), "mul is not in this dialect", node="mul", verifiers=[NoMul])


def test_allowed_op_types_hook_narrows_the_allowlist():
    class OnlyBuiltins(Verifier):
        dialect = "TEST_ONLY_BUILTINS"

        def allowed_op_types(self):
            return (type(None),)

    _fails(base(), "is not an allowed operator type", node="add", verifiers=[OnlyBuiltins])


def test_subclasses_register_and_load_by_dialect():
    class Edgeish(Verifier):
        dialect = "TEST_EDGEISH"

    assert load_verifier("TEST_EDGEISH") is Edgeish
    assert load_verifier("ATEN") is Verifier and load_verifier("") is Verifier
    assert load_verifier("TRAINING") is TrainingIRVerifier
    with pytest.raises(SpecViolationError, match="no verifier is registered for dialect 'NOPE'"):
        load_verifier("NOPE")


def test_subclasses_may_not_override_check_or_reuse_aten():
    with pytest.raises(TypeError, match="overrides Verifier.check"):

        class Bad(Verifier):
            dialect = "TEST_BAD"

            def check(self, ep):  # type: ignore[override]
                pass

    with pytest.raises(TypeError, match="must set a dialect name other than 'ATEN'"):

        class NoDialect(Verifier):
            pass


def test_verifiers_must_be_verifier_classes():
    with pytest.raises(TypeError, match="verifiers must be Verifier subclasses"):
        base().program(verifiers=[object])
