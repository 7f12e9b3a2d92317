"""Emission of exported programs: numerics through the file (reference executor), out-variant
selection, mutable state, determinism, kernel coverage errors, delegates, constant methods."""

from __future__ import annotations

import types

import pytest
import torch
from program_reference import Runner, run

import exportir.export as ee
from exportir.program import emit, kernels, planning, printer, schema, serialize, validate


def _edge_or_aten(ep):
    try:
        from exportir.program.manager import to_edge
    except ImportError:  # before the Edge dialect lands: emit the core-ATen graph
        return {"forward": ep.run_decompositions()}
    return dict(to_edge(ep)._edge_programs)


def _emit(module, *args, config=None):
    ep = ee.export(module, args)
    program = emit.emit_program(_edge_or_aten(ep), config)
    data = serialize.serialize_program(program)
    return serialize.deserialize_program(data), data


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return torch.softmax(self.fc2(torch.relu(self.fc1(x))), dim=-1)


class MultiOut(torch.nn.Module):
    def forward(self, x):
        values, indices = torch.max(x, dim=1)
        a, b = x.split(2, dim=0)
        return values, indices, a.reshape(-1), b.t() * 2, x.to(torch.float64).sum()


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(3))

    def forward(self, x):
        self.count.add_(1)
        return x + self.count


class Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)


@pytest.mark.parametrize(
    "factory, shapes",
    [(MLP, [(2, 8)]), (MultiOut, [(4, 3)]), (Conv, [(1, 3, 8, 8)])],
    ids=["mlp", "multi_output", "conv"],
)
def test_emitted_programs_match_eager(factory, shapes):
    torch.manual_seed(0)
    module = factory().eval()
    args = tuple(torch.randn(s) for s in shapes)
    program, _ = _emit(module, *args)
    expected = module(*args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    flat = []
    for e in expected:
        flat.extend(e if isinstance(e, (list, tuple)) else [e])
    got = run(program, "forward", *args)
    assert len(got) == len(flat)
    for g, e in zip(got, flat):
        torch.testing.assert_close(g, e.detach())
    m = program.methods[0]
    assert sum(m.plan.arenas) >= m.plan.lower_bound
    assert all(isinstance(m.values[i].storage, schema.InputStorage) for i in m.inputs)


def test_out_variants_are_selected_from_schemas():
    aten = torch.ops.aten
    cases = {
        aten.add.Tensor: "aten::add.out",
        aten.add.Scalar: "aten::add.Scalar_out",
        aten.max.dim: "aten::max.dim_max",
        aten.native_layer_norm.default: "aten::native_layer_norm.out",
        aten.view.default: "aten::view_copy.out",
        aten.permute.default: "aten::permute_copy.out",
        aten.select.int: "aten::select_copy.int_out",
        aten.full.default: "aten::full.out",
        aten._to_copy.default: "aten::_to_copy.out",
        aten.split_with_sizes.default: "aten::split_with_sizes_copy.out",
    }
    for op, expected in cases.items():
        choice = kernels.out_variant(op)
        assert choice is not None, op
        assert str(choice.operator) == expected
    assert kernels.out_variant(aten.native_layer_norm.default).out_args == ("out0", "out1", "out2")
    assert kernels.out_variant(aten.max.dim).out_args == ("max", "max_values")
    assert kernels.out_variant(aten.add_.Tensor) is None  # in-place ops never run


def test_mutable_buffer_is_planned_state_updated_by_a_move():
    program, _ = _emit(Counter(), torch.zeros(3))
    m = program.methods[0]
    state = [v for v in m.values if isinstance(v, schema.Tensor) and v.initial is not None]
    assert len(state) == 1 and isinstance(state[0].storage, schema.Allocation)
    assert isinstance(m.instructions[-1], schema.MoveCall)
    runner = Runner(program)
    x = torch.zeros(3)
    assert runner(x)[0].tolist() == [1, 1, 1]
    assert runner(x)[0].tolist() == [2, 2, 2]  # the state survives between calls


def test_user_input_mutation_writes_back_into_the_input():
    class AddOne(torch.nn.Module):
        def forward(self, x):
            x.add_(1)
            return x * 2

    program, _ = _emit(AddOne(), torch.zeros(2))
    x = torch.zeros(2)
    out = run(program, "forward", x)
    assert x.tolist() == [1, 1]
    assert out[0].tolist() == [2, 2]


def test_same_model_gives_same_bytes():
    def build():
        torch.manual_seed(3)
        return _emit(MLP(), torch.randn(2, 8))[1]

    assert build() == build()


def test_debug_table_names_nodes_and_user_lines():
    program, data = _emit(MLP(), torch.randn(2, 8))
    m = program.methods[0]
    assert len(m.debug) == len(m.instructions)
    assert any(d.source.endswith(".py:" + d.source.rsplit(":", 1)[1]) and __file__ in d.source
               for d in m.debug)
    text = printer.format_program(program, serialize.read_layout(data))
    assert "aten::addmm.out" in text and "test_program_emit.py:" in text


def test_file_size_close_to_weight_bytes():
    torch.manual_seed(0)
    big = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    program, data = _emit(big, torch.randn(1, 256))
    weights = sum(p.numel() * 4 for p in big.parameters())
    assert sum(c.nbytes for c in program.constants) == weights
    assert len(data) / weights <= 1.002


def test_shared_weights_are_stored_once():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4, bias=False)
            self.b = torch.nn.Linear(4, 4, bias=False)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(self.a(x))

    program, _ = _emit(Tied(), torch.randn(1, 4))
    assert len(program.constants) == 1


# ------------------------------------------------------------------------------ coverage


@torch.library.custom_op("exportir_progtest::no_out", mutates_args=())
def _no_out(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@_no_out.register_fake
def _(x):
    return torch.empty_like(x)


class UsesCustom(torch.nn.Module):
    def forward(self, x):
        y = x + 1
        return torch.ops.exportir_progtest.no_out(y)  # the line the error must cite


def test_custom_op_without_out_variant_runs_as_functional_fallback():
    ep = ee.export(UsesCustom(), (torch.randn(2),)).run_decompositions()
    program = emit.emit_program({"forward": ep})
    ops = [str(o) for o in program.methods[0].operators]
    assert "exportir_progtest::no_out.default@functional" in ops
    x = torch.randn(2)
    torch.testing.assert_close(run(program, "forward", x)[0], x + 1)


def test_kernel_coverage_error_lists_op_node_and_source_line():
    ep = ee.export(UsesCustom(), (torch.randn(2),)).run_decompositions()
    config = emit.EmitConfig(kernel_available=lambda name, _: name != "exportir_progtest::no_out")
    with pytest.raises(emit.KernelCoverageError) as info:
        emit.emit_program({"forward": ep}, config)
    message = str(info.value)
    assert (
        "exportir_progtest.no_out.default: the runtime has no kernel "
        "exportir_progtest::no_out.default@functional" in message
    )
    assert "forward:no_out" in message
    assert "test_program_emit.py:" in message
    assert "no program was written" in message


def test_aten_op_without_out_variant_is_not_a_fallback():
    op = torch.ops.aten._native_batch_norm_legit_functional.default
    assert kernels.out_variant(op).out is torch.ops.aten._native_batch_norm_legit.out
    assert kernels.fallback_reason(torch.ops.aten.lift_fresh.default) == "no out-variant overload"


def test_kernel_registry_hook_narrows_coverage():
    ep = ee.export(MLP(), (torch.randn(2, 8),)).run_decompositions()
    config = emit.EmitConfig(kernel_available=lambda name, overload: name != "aten::relu")
    with pytest.raises(emit.KernelCoverageError, match="the runtime has no kernel aten::relu.out"):
        emit.emit_program({"forward": ep}, config)


# ------------------------------------------------------------------------------ delegates


class _Lowered(torch.nn.Module):
    """Stands in for dialects.backend's LoweredBackendModule (the attributes emit reads)."""

    backend_id = "fused_cpu"
    processed_bytes = b"\x00compiled"
    compile_specs = (types.SimpleNamespace(key="opt", value=b"3"),)


def _call_delegate(lowered, *args):  # stands in for the executorch_call_delegate op
    raise NotImplementedError


def test_delegate_nodes_become_delegate_calls():
    ep = ee.export(MLP(), (torch.randn(2, 8),)).run_decompositions()
    gm = ep.graph_module
    gm.lowered_module_0 = _Lowered()
    graph = gm.graph
    x = next(n for n in graph.nodes if n.op == "placeholder" and n.name == "x")
    out = next(n for n in graph.nodes if n.op == "output")
    with graph.inserting_before(out):
        attr = graph.get_attr("lowered_module_0")
        call = graph.call_function(_call_delegate, (attr, x))
        call.meta["val"] = (torch.empty(2, 8, device="meta"),)
        item = graph.call_function(__import__("operator").getitem, (call, 0))
    old = out.args[0][0]
    out.args = ((item,),)
    for n in list(graph.nodes):
        if n is not old and n.op == "call_function" and not n.users and n not in (call, item):
            graph.erase_node(n)
    stub = types.SimpleNamespace(
        graph_module=gm, graph=graph, graph_signature=ep.graph_signature,
        state_dict=ep.state_dict, constants=ep.constants, call_spec=(None, None),
    )
    stub.graph_signature.output_specs[0] = type(stub.graph_signature.output_specs[0])(
        stub.graph_signature.output_specs[0].kind, type(stub.graph_signature.output_specs[0].arg)(
            name=item.name), None)
    program = emit.emit_program({"forward": stub})
    m = program.methods[0]
    calls = [i for i in m.instructions if isinstance(i, schema.DelegateCall)]
    assert len(calls) == 1
    assert program.delegates[0].backend_id == "fused_cpu"
    assert program.delegates[0].compile_specs == (schema.CompileSpec("opt", b"3"),)
    assert m.outputs == calls[0].outputs
    loaded = serialize.deserialize_program(serialize.serialize_program(program))
    assert bytes(loaded.delegates[0].data) == b"\x00compiled"


# ------------------------------------------------------------------------------ misc


def test_constant_methods():
    ep = ee.export(MLP(), (torch.randn(2, 8),)).run_decompositions()
    program = emit.emit_program(
        {"forward": ep},
        constant_methods={"get_vocab_size": 32000, "get_info": (1.5, True, "x", torch.ones(2))},
    )
    assert program.method_names == ("forward", "get_info", "get_vocab_size")
    m = program.method("get_vocab_size")
    assert m.values[m.outputs[0]] == schema.Int(32000)
    validate.validate_program(program)
    with pytest.raises(emit.EmitError, match="clashes"):
        emit.emit_program({"forward": ep}, constant_methods={"forward": 1})


def test_multiple_methods_share_constants():
    torch.manual_seed(0)
    mlp = MLP()
    ep1 = ee.export(mlp, (torch.randn(2, 8),)).run_decompositions()
    ep2 = ee.export(mlp, (torch.randn(5, 8),)).run_decompositions()
    program = emit.emit_program({"forward": ep1, "batch5": ep2})
    assert program.method_names == ("batch5", "forward")
    assert len(program.constants) == 4
    x = torch.randn(5, 8)
    torch.testing.assert_close(run(program, "batch5", x)[0], mlp(x).detach())


def test_emitted_plans_verify():
    program, _ = _emit(Conv().eval(), torch.randn(1, 3, 8, 8))
    m = program.methods[0]
    allocations = {i: v.storage for i, v in enumerate(m.values)
                   if isinstance(v, schema.Tensor) and isinstance(v.storage, schema.Allocation)}
    spans = planning.lifetimes(m.values, m.instructions, m.outputs)
    plan = planning.MemoryPlan(m.plan.arenas, allocations, m.plan.lower_bound,
                               alignment=m.plan.alignment, lifetimes=spans)
    planning.verify_plan(plan)


def test_symbolic_sizes_plan_their_upper_bound():
    from exportir.program._emit_values import _size_bound
    from exportir.symbolic.shape_env import ShapeEnv

    env = ShapeEnv()
    s0 = env.create_backed_symbol(4, "x.size(0)")
    env.constrain_range(s0, 2, 16)
    assert _size_bound(env.symint(s0 * 2)) == (32, True)  # planned at the upper bound
    assert _size_bound(env.create_unbacked_symint()) == (0, False)  # runtime-allocated
    assert _size_bound(5) == (5, True)


# ------------------------------------------------------------------------------ constant folding


def _op_names(program):
    m = program.methods[0]
    return [str(m.operators[i.op_index]) for i in m.instructions if hasattr(i, "op_index")]


def test_weight_transposes_are_folded_into_constants():
    model = MLP().eval()
    x = torch.randn(2, 8)
    program, _ = _emit(model, x)
    assert not any("permute" in o or "t_copy" in o for o in _op_names(program))
    torch.testing.assert_close(run(program, "forward", x)[0], model(x))
    # only the transposed weights are stored, not the originals as well
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert sum(len(c.data) for c in program.constants) == weight_bytes


def test_folding_skips_inputs_random_ops_and_growing_results():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.randn(4, 8))

        def forward(self, x):
            big = self.table.expand(1024, 4, 8)  # 128 KiB from 128 B: not stored, a view
            noise = torch.ops.aten.native_dropout(self.table, 0.5, True)[0]  # random: each call
            return x @ self.table.t() + 1, big.sum(0), noise

    program, _ = _emit(Net().eval(), torch.randn(2, 8))
    ops = _op_names(program)
    assert any("native_dropout" in o for o in ops)
    assert not any("permute" in o or "t_copy" in o or "expand" in o for o in ops)
    assert sum(c.nbytes for c in program.constants) < 1024
    views = [v for v in program.methods[0].values
             if isinstance(v, schema.Tensor) and isinstance(v.storage, schema.ViewOf)]
    # the folded transpose is a view of the stored table too (no second copy of its bytes)
    assert sorted((v.sizes, v.storage.strides) for v in views) == [
        ((8, 4), (1, 8)), ((1024, 4, 8), (0, 8, 1))
    ]


def test_a_folded_view_of_a_weight_stores_no_second_copy():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(64, 16)
            self.head = torch.nn.Linear(16, 64, bias=False)
            self.head.weight = self.embed.weight  # tied: the head reads the transpose

        def forward(self, idx):
            return self.head(self.embed(idx))

    model = Tied().eval()
    idx = torch.tensor([[1, 5, 7]])
    program, _ = _emit(model, idx)
    assert sum(c.nbytes for c in program.constants) == 64 * 16 * 4
    views = [(v.sizes, v.storage.strides) for v in program.methods[0].values
             if isinstance(v, schema.Tensor) and isinstance(v.storage, schema.ViewOf)]
    assert ((16, 64), (1, 16)) in views, views
    from exportir.runtime import Program

    got = Program.load(serialize.serialize_program(program)).method("forward")(idx)
    torch.testing.assert_close(got[0] if isinstance(got, tuple) else got, model(idx))
