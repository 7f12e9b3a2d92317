"""The Edge verifier: each rule has a passing and a failing case with the expected message.

Failing programs come from a valid edge program through ``EdgeProgramManager.transform`` with
a pass that breaks one rule, so the tests also check that ``transform`` re-verifies. Errors
must name the node and op, the offending dtype/value, the user's source line and a way out,
and show the graph around the node with ``-->``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exportir.dialects.edge.ops import ops
from exportir.export.program.verifier import SpecViolationError
from exportir.fx.passes.infra.pass_base import PassResult

THIS_FILE = __file__.rsplit("/", 1)[-1]


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x, n: int = 2):
        y = self.lin(x) * 2
        z = torch.sigmoid(y.to(torch.int32))
        return y.view(-1) + 1, z


def _edge(model=None, args=None, **kw):
    from exportir.export import export
    from exportir.program.manager import to_edge

    model = model or Small().eval()
    ep = export(model, args or (torch.randn(2, 4),))
    return to_edge(ep, **kw)


@pytest.fixture(scope="module")
def edge():
    return _edge()


def _node(gm, name):
    return next(n for n in gm.graph.nodes if n.name == name)


def _rewrite(fn):
    """A GraphModule pass applying ``fn(gm)`` in place."""

    def rewrite(gm):
        fn(gm)
        gm.recompile()
        return PassResult(gm, True)

    return rewrite


def _expect(edge, fn, *patterns):
    with pytest.raises(SpecViolationError) as info:
        edge.transform([_rewrite(fn)])
    message = str(info.value)
    for p in patterns:
        assert p in message, f"{p!r} not in:\n{message}"
    assert "-->" in message and "Way out:" in message
    return message


def test_valid_edge_program_passes_and_transform_keeps_it_valid(edge):
    ep = edge.exported_program()
    assert ep.dialect == "EDGE"
    again = edge.transform([_rewrite(lambda gm: None)])
    assert again.exported_program().dialect == "EDGE"
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any("view_copy" in t for t in targets) and not any(
        "aten.view.default" in t for t in targets
    )


# ---------------------------------------------------------------------------- rule 1: op set


def test_op_set_rejects_aten_ops(edge):
    def use_aten(gm):
        _node(gm, "sigmoid").target = torch.ops.aten.sigmoid.default

    _expect(
        edge,
        use_aten,
        "node sigmoid",
        "aten.sigmoid.default is an ATen op, not an edge op",
        "ops.edge.aten.sigmoid.default",
        f"{THIS_FILE}:",
    )


def test_op_set_rejects_non_core_edge_ops_unless_excepted(edge):
    from exportir.dialects.edge.config import EdgeCompileConfig

    def use_noncore(gm):
        node = _node(gm, "sigmoid")
        node.target = ops.edge.aten.special_expit.default  # non-core alias of sigmoid

    message = _expect(
        edge,
        use_noncore,
        "aten.special_expit.default is not in the core ATen op set",
        "_core_aten_ops_exception_list=[torch.ops.aten.special_expit.default]",
    )
    assert "model.eval()" in message
    config = EdgeCompileConfig(_core_aten_ops_exception_list=[torch.ops.aten.special_expit.default])
    edge.transform([_rewrite(use_noncore)], compile_config=config)  # accepted


def test_op_set_rejects_views(edge):
    def use_view(gm):
        _node(gm, "view").target = ops.edge.aten.view.default

    _expect(
        edge,
        use_view,
        "node view",
        "returns a view of its input",
        "ops.edge.aten.view_copy.default",
    )


# ---------------------------------------------------------------------------- rule 2: scalar operands


def test_scalar_operand_in_tensor_position_is_rejected(edge):
    def put_scalar(gm):
        mul = _node(gm, "mul")
        mul.args = (mul.args[0], 2)

    _expect(
        edge,
        put_scalar,
        "node mul",
        "argument 'other' of edge op aten.mul.Tensor is the Python scalar 2",
        "torch.tensor(2)",
        f"{THIS_FILE}:",
    )


def test_scalar_operands_of_scalar_overloads_are_fine():
    class M(nn.Module):
        def forward(self, x):
            return torch.ops.aten.add.Scalar(x, 2), (x > 0.5)

    ep = _edge(M(), (torch.randn(3),)).exported_program()
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert any("add.Scalar" in t for t in targets)


# ---------------------------------------------------------------------------- rule 3: dtypes


def test_dtype_combination_outside_the_table_is_rejected(edge):
    from exportir.export.capture.fake import fake_like

    def claim_int_sigmoid(gm):
        node = _node(gm, "sigmoid")  # sigmoid(Int) -> Float; claim it returns Int
        node.meta["val"] = fake_like(torch.zeros(2, 3, dtype=torch.int32))

    message = _expect(
        edge,
        claim_int_sigmoid,
        "node sigmoid",
        "edge op aten.sigmoid.default does not support "
        "the dtype combination (self: torch.int32, __ret_0: torch.int32)",
        "Allowed (edge.yaml)",
        "x.to(torch.float32)",
        f"{THIS_FILE}:",
    )
    assert "self=Bool|Byte|Char|Int|Long|Short, __ret_0=Float" in message


def test_non_edge_dtype_is_rejected_and_can_be_let_through():
    from exportir.dialects.edge.config import EdgeCompileConfig

    class Complex(nn.Module):
        def forward(self, x):
            return (x.to(torch.complex64) * 3).abs()

    with pytest.raises(SpecViolationError) as info:
        _edge(Complex(), (torch.randn(2),))
    message = str(info.value)
    assert "torch.complex64 is not an edge dtype" in message and "node _to_copy" in message
    assert "_check_ir_validity=False" in message and f"{THIS_FILE}:" in message
    relaxed = _edge(
        Complex(), (torch.randn(2),), compile_config=EdgeCompileConfig(_check_ir_validity=False)
    )
    assert relaxed.exported_program().dialect == "EDGE"


def test_reduced_precision_floats_pass_where_the_kernels_run_them():
    class Reduced(nn.Module):
        def forward(self, x):
            h = torch.sigmoid(x.to(torch.bfloat16) * 3)
            return h.float() + x.half().float()

    edge = _edge(Reduced(), (torch.randn(2),))  # edge_reduced_float.yaml admits these nodes
    assert edge.exported_program().dialect == "EDGE"
    # edge.yaml and the printed allowed_types keep the seed's eight dtypes
    sigmoid = ops.edge.aten.sigmoid.default
    assert torch.bfloat16 not in sigmoid._schema.returns[0].allowed_types


def test_reduced_float_combination_the_kernels_refuse_is_rejected():
    class MixedReduced(nn.Module):
        def forward(self, x):
            return torch.sigmoid(x.to(torch.bfloat16)).to(torch.float16)

    from exportir.export.capture.fake import fake_like

    def claim_bf16_to_half_sigmoid(gm):
        node = _node(gm, "sigmoid")  # sigmoid(BFloat16) -> BFloat16; claim it returns Half
        node.meta["val"] = fake_like(torch.zeros(2, dtype=torch.float16))

    edge = _edge(MixedReduced(), (torch.randn(2),))
    _expect(
        edge,
        claim_bf16_to_half_sigmoid,
        "(self: torch.bfloat16, __ret_0: torch.float16)",
        "with Half/BFloat16: (self=BFloat16|Half, __ret_0=<same as self>)",
    )


# ---------------------------------------------------------------------------- rule 4: scalar I/O


def test_scalar_graph_input_used_by_the_graph_is_rejected():
    class WithInt(nn.Module):
        def forward(self, x, n: int):
            return x * 2

    edge = _edge(WithInt(), (torch.randn(2), 3))  # n is burned in: an unused placeholder passes

    def use_n(gm):
        n = next(p for p in gm.graph.nodes if p.op == "placeholder" and p.name == "n")
        mul = next(m for m in gm.graph.nodes if m.name == "mul")
        mul.args = (mul.args[0], n)

    _expect(
        edge,
        use_n,
        "graph input n is the scalar 3 (int)",
        "Edge graph inputs are tensors",
        "torch.tensor(value)",
    )


def test_scalar_graph_output_is_rejected_and_literal_outputs_pass(edge):
    def return_size(gm):
        out = gm.graph.output_node()
        view = _node(gm, "view")
        with gm.graph.inserting_before(out):
            size = gm.graph.call_function(torch.ops.aten.sym_size.int, (view, 0))
        size.meta.update(view.meta)
        size.meta["val"] = 6
        out.args = ((size, *out.args[0][1:]),)

    _expect(
        edge,
        return_size,
        "graph output sym_size_int is the scalar 6 (int)",
        "Edge graph outputs are tensors",
        f"{THIS_FILE}:",
    )

    class Literal(nn.Module):
        def forward(self, x):
            return x + 1, 2

    _edge(Literal(), (torch.randn(2),))  # a burned-in literal output is fine


# ---------------------------------------------------------------------------- metadata


def test_metadata_must_be_kept(edge):
    def drop_stack_trace(gm):
        del _node(gm, "sigmoid").meta["stack_trace"]

    with pytest.raises(SpecViolationError, match=r"sigmoid .*missing metadata \['stack_trace'\]"):
        edge.transform([_rewrite(drop_stack_trace)])


def test_default_exception_list_accepts_training_batch_norm_and_adaptive_max_pool():
    from exportir.dialects.edge.config import DEFAULT_CORE_ATEN_OPS_EXCEPTIONS

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm2d(2)
            self.pool = nn.AdaptiveMaxPool2d((2, 3))

        def forward(self, x):
            return self.pool(self.bn(x))

    ep = _edge(Net().train(), (torch.randn(2, 2, 5, 7),)).exported_program()
    aten_ops = {n.target.aten_op for n in ep.graph.nodes if hasattr(n.target, "aten_op")}
    aten = torch.ops.aten
    for op in (aten._native_batch_norm_legit_functional.default, aten.adaptive_max_pool2d.default):
        assert op in aten_ops and op in DEFAULT_CORE_ATEN_OPS_EXCEPTIONS
    assert not any(torch.Tag.core in op.tags for op in DEFAULT_CORE_ATEN_OPS_EXCEPTIONS)
