"""to_edge_transform_and_lower: ops a partitioner keeps whole (``ops_to_not_decompose``) survive
to partitioning and are lowered, unclaimed ones are decomposed afterwards, filters pick nodes,
several partitioners and per-method dicts, transform passes first, argument errors -- and every
result goes to_program and runs in the runtime like eager."""

from __future__ import annotations

import json
import operator

import pytest
import torch
import torch.nn.functional as F

import exportir
from exportir import pytree
from exportir.dialects.backend import (
    DELEGATION_TAG,
    BackendDetails,
    DelegationSpec,
    Partitioner,
    PartitionResult,
    PreprocessResult,
    executorch_call_delegate,
)
from exportir.dialects.edge.config import EdgeCompileConfig
from exportir.export import Dim, export
from exportir.export.signature import InputKind
from exportir.fx.passes.infra.pass_base import PassResult
from exportir.fx.passes.infra.pass_manager import PassManager
from exportir.passes.partition import PartitionError
from exportir.program.manager import to_edge
from exportir.runtime import Program, default_delegate_registry

aten = torch.ops.aten
SDPA = aten._scaled_dot_product_flash_attention_for_cpu.default


# ------------------------------------------------------------------------------ a one-op backend


class OneOpBackend(BackendDetails):
    """Lowers a partition holding one op (plus getitems) to JSON naming the op, where each
    argument comes from and which results leave; its runtime calls the ATen op."""

    @classmethod
    def preprocess(cls, edge_program, compile_specs):
        graph = edge_program.graph
        placeholders = {n: i for i, n in enumerate(graph.find_nodes(op="placeholder"))}
        (call,) = [
            n for n in graph.nodes if n.op == "call_function" and n.target is not operator.getitem
        ]
        op = call.target.aten_op

        def encode(a):
            return {"input": placeholders[a]} if a in placeholders else a

        outputs = [o.args[1] if o.target is operator.getitem else None for o in graph.output_node().args[0]]  # fmt: skip
        blob = {
            "op": [op._schema.name.split("::")[1], op._overloadname],
            "args": [encode(a) for a in call.args],
            "kwargs": {k: encode(v) for k, v in call.kwargs.items()},
            "outputs": outputs,
        }
        return PreprocessResult(json.dumps(blob).encode())


class OneOpRuntime:
    def init(self, processed, compile_specs):
        return json.loads(bytes(processed))

    def execute(self, handle, inputs):
        name, overload = handle["op"]
        op = getattr(getattr(aten, name), overload)

        def decode(a):
            return inputs[a["input"]] if isinstance(a, dict) else a

        result = op(*[decode(a) for a in handle["args"]],
                    **{k: decode(v) for k, v in handle["kwargs"].items()})  # fmt: skip
        return [result if i is None else result[i] for i in handle["outputs"]]


class KeepAndClaim(Partitioner):
    """Keeps ``ops`` whole (with ``node_filter``) and claims each of their nodes (when
    ``claim``), one partition per node; records what it saw."""

    def __init__(self, ops, node_filter=None, claim=True):
        super().__init__()
        self.ops, self.node_filter, self.claim = list(ops), node_filter, claim
        self.seen: list[str] = []  # kept op nodes at partitioning time

    def ops_to_not_decompose(self, ep):
        return self.ops, self.node_filter

    def partition(self, exported_program):
        tags = {}
        for node in exported_program.graph.nodes:
            if node.op != "call_function" or getattr(node.target, "aten_op", None) not in self.ops:
                continue
            self.seen.append(node.name)
            if not self.claim:
                continue
            tag = f"{type(self).__name__}_{len(tags)}"
            node.meta[DELEGATION_TAG] = tag
            for user in node.users:
                if user.target is operator.getitem:
                    user.meta[DELEGATION_TAG] = tag
            tags[tag] = DelegationSpec("OneOpBackend")
        return PartitionResult(exported_program, tags)


# ------------------------------------------------------------------------------ models, helpers


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(F.silu(self.proj(q)), k, v) * 2 + 1


class PlainAttention(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v) * 2 + 1


class TwoAttentions(torch.nn.Module):
    def forward(self, q, k, v, q2, k2, v2):
        return F.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q2, k2, v2)


def _qkv(d=8, n=4):
    return tuple(torch.randn(1, 2, n, d) for _ in range(3))


def _registry():
    registry = default_delegate_registry()
    registry.register("OneOpBackend", OneOpRuntime())
    return registry


def _targets(ep) -> list:
    return [getattr(n.target, "aten_op", n.target) for n in ep.graph.nodes if n.op == "call_function"]  # fmt: skip


def _delegates(ep) -> list:
    return [n for n in ep.graph.nodes if n.target is executorch_call_delegate]


def _runs_like_eager(manager, module, *args, method="forward") -> None:
    expected = pytree.tree_leaves(getattr(module, method)(*args))
    in_python = pytree.tree_leaves(manager.exported_program(method).module()(*args))
    program = Program.load(manager.to_program().buffer, delegates=_registry())
    in_runtime = pytree.tree_leaves(program.method(method)(*args))
    for got in (in_python, in_runtime):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------ preserving


def test_kept_op_reaches_the_partitioner_whole_is_lowered_and_runs():
    torch.manual_seed(0)
    model, args = Attention(), _qkv()
    part = KeepAndClaim([SDPA])
    manager = exportir.to_edge_transform_and_lower(export(model, args), partitioner=[part])
    ep = manager.exported_program()
    assert part.seen == ["_scaled_dot_product_flash_attention_for_cpu"]
    assert SDPA not in _targets(ep)
    (call,) = _delegates(ep)
    lowered = getattr(ep.graph_module, call.args[0].target)
    assert SDPA in _targets(lowered.original_module)
    assert lowered.backend_id == "OneOpBackend"
    # the rest went to core ATen as to_edge does (silu -> sigmoid + mul)
    assert aten.sigmoid.default in _targets(ep) and aten.silu.default not in _targets(ep)
    assert manager.compile_config == EdgeCompileConfig()
    _runs_like_eager(manager, model, *args)


def test_unclaimed_kept_op_is_decomposed_after_partitioning_and_runs():
    torch.manual_seed(0)
    model, args = Attention(), _qkv()
    part = KeepAndClaim([SDPA], claim=False)
    manager = exportir.to_edge_transform_and_lower(export(model, args), partitioner=[part])
    ep = manager.exported_program()
    assert part.seen == ["_scaled_dot_product_flash_attention_for_cpu"]  # it was kept until then
    assert SDPA not in _targets(ep) and not _delegates(ep)
    assert aten.bmm.default in _targets(ep) and aten._softmax.default in _targets(ep)
    # same op multiset as the plain to_edge road
    plain = to_edge(export(model, args)).exported_program()
    assert sorted(map(str, _targets(ep))) == sorted(map(str, _targets(plain)))
    assert all(s.kind != InputKind.USER_INPUT or s.arg.name in "qkv"
               for s in ep.graph_signature.input_specs)  # fmt: skip
    _runs_like_eager(manager, model, *args)


def test_unclaimed_kept_op_with_dynamic_shapes_keeps_them_symbolic():
    torch.manual_seed(0)
    model = PlainAttention()
    args = tuple(torch.randn(3, 2, 4, 8) for _ in range(3))
    batch = Dim("batch", min=2, max=64)
    ep = export(model, args, dynamic_shapes=({0: batch},) * 3)
    manager = exportir.to_edge_transform_and_lower(
        ep, partitioner=[KeepAndClaim([SDPA], claim=False)]
    )
    edge = manager.exported_program()
    assert SDPA not in _targets(edge)
    for node in edge.graph.nodes:  # the spliced decomposition kept the batch symbol
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dim() == 4:
            assert not isinstance(val.shape[0], int) or not isinstance(val.shape[1], int), node
    for n in (2, 7):
        qkv = tuple(torch.randn(n, 2, 4, 8) for _ in range(3))
        torch.testing.assert_close(edge.module()(*qkv), model(*qkv))
    (got,) = pytree.tree_leaves(Program.load(manager.to_program().buffer).method("forward")(*args))
    torch.testing.assert_close(got, model(*args))


def test_filter_picks_which_nodes_stay_whole():
    torch.manual_seed(0)
    model = TwoAttentions()
    args = (*_qkv(d=8), *_qkv(d=4))
    seen_targets = []

    def only_head_dim_8(node):
        seen_targets.append(node.target)
        return node.args[0].meta["val"].shape[-1] == 8

    part = KeepAndClaim([SDPA], node_filter=only_head_dim_8)
    manager = exportir.to_edge_transform_and_lower(export(model, args), partitioner=[part])
    ep = manager.exported_program()
    assert seen_targets and set(seen_targets) == {SDPA}  # the filter sees ATen nodes
    assert len(part.seen) == 1 and len(_delegates(ep)) == 1
    assert SDPA not in _targets(ep) and aten.bmm.default in _targets(ep)
    _runs_like_eager(manager, model, *args)


def test_several_partitioners_each_keep_and_claim_their_ops():
    torch.manual_seed(0)
    model, args = Attention(), _qkv()
    attention = KeepAndClaim([SDPA])
    silu = KeepAndClaim([aten.silu.default])
    manager = exportir.to_edge_transform_and_lower(
        export(model, args), partitioner=[attention, silu]
    )
    ep = manager.exported_program()
    assert len(attention.seen) == 1 and len(silu.seen) == 1
    assert len(_delegates(ep)) == 2
    assert not {SDPA, aten.silu.default, aten.sigmoid.default} & set(_targets(ep))
    _runs_like_eager(manager, model, *args)


def test_one_partitioner_claims_another_keeps_but_declines():
    torch.manual_seed(0)
    model, args = Attention(), _qkv()
    attention = KeepAndClaim([SDPA])
    silu = KeepAndClaim([aten.silu.default], claim=False)
    manager = exportir.to_edge_transform_and_lower(
        export(model, args), partitioner=[attention, silu]
    )
    ep = manager.exported_program()
    assert len(silu.seen) == 1 and len(_delegates(ep)) == 1
    assert aten.silu.default not in _targets(ep) and aten.sigmoid.default in _targets(ep)
    _runs_like_eager(manager, model, *args)


class TwoMethods(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    def other(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True) + 1


def _two_methods(args):
    model = TwoMethods()

    class Other(torch.nn.Module):
        def forward(self, q, k, v):
            return model.other(q, k, v)

    return model, {"forward": export(model, args), "other": export(Other(), args)}


def test_per_method_partitioner_dict():
    torch.manual_seed(0)
    args = _qkv()
    model, programs = _two_methods(args)
    part = KeepAndClaim([SDPA])
    manager = exportir.to_edge_transform_and_lower(
        programs, partitioner={"forward": [part]}, constant_methods={"heads": 2}
    )
    assert len(_delegates(manager.exported_program("forward"))) == 1
    other = manager.exported_program("other")
    assert not _delegates(other) and SDPA not in _targets(other)
    assert manager.constant_methods == {"heads": 2}
    _runs_like_eager(manager, model, *args)
    _runs_like_eager(manager, model, *args, method="other")


def test_transform_passes_run_before_partitioning_and_see_kept_ops():
    log = []

    def count_kept(gm):
        log.append(
            ("pass", sum(getattr(n.target, "aten_op", None) is SDPA for n in gm.graph.nodes))
        )
        return PassResult(gm, False)

    class Logging(KeepAndClaim):
        def partition(self, exported_program):
            log.append(("partition", None))
            return super().partition(exported_program)

    _, programs = _two_methods(_qkv())
    exportir.to_edge_transform_and_lower(
        programs, transform_passes=[count_kept], partitioner=[Logging([SDPA])]
    )
    assert log == [("pass", 1), ("pass", 1), ("partition", None), ("partition", None)]

    log.clear()
    exportir.to_edge_transform_and_lower(
        programs,
        transform_passes={"other": PassManager([count_kept])},
        partitioner={"other": Logging([SDPA])},
    )
    assert log == [("pass", 1), ("partition", None)]


def test_without_partitioners_it_is_to_edge():
    model, args = Attention(), _qkv()
    ours = exportir.to_edge_transform_and_lower(export(model, args)).exported_program()
    plain = to_edge(export(model, args)).exported_program()
    assert str(ours.graph) == str(plain.graph)


def test_user_preserve_ops_stay_and_core_ops_need_no_keeping():
    model, args = Attention(), _qkv()
    config = EdgeCompileConfig(preserve_ops=[aten.silu.default])
    part = KeepAndClaim([SDPA, aten.addmm.default], claim=False)  # addmm: core, nothing to keep
    manager = exportir.to_edge_transform_and_lower(
        export(model, args), partitioner=part, compile_config=config
    )
    targets = _targets(manager.exported_program())
    assert aten.silu.default in targets and SDPA not in targets
    assert manager.compile_config is config


def test_mutable_or_aliasing_ops_are_not_kept_with_a_warning():
    class Split(torch.nn.Module):
        def forward(self, x):
            a, b = torch.split(x, 2)
            return a * b

    x = torch.randn(4, 3)
    part = KeepAndClaim([aten.split.Tensor])
    with pytest.warns(UserWarning, match="split.Tensor.*returns an alias"):
        manager = exportir.to_edge_transform_and_lower(export(Split(), (x,)), partitioner=[part])
    assert part.seen == []
    _runs_like_eager(manager, Split(), x)


# ------------------------------------------------------------------------------ errors


def test_bad_arguments_say_what_to_pass():
    model, args = Attention(), _qkv()
    ep = export(model, args)
    lower = exportir.to_edge_transform_and_lower
    with pytest.raises(TypeError, match=r"partitioner\[1\] is a str, not a Partitioner"):
        lower(ep, partitioner=[KeepAndClaim([SDPA]), "xnnpack"])
    with pytest.raises(TypeError, match=r"partitioner\['forward'\]\[0\] is a int"):
        lower(ep, partitioner={"forward": [3]})
    with pytest.raises(ValueError, match=r"partitioner names methods \['decode'\].*\['forward'\]"):
        lower(ep, partitioner={"decode": [KeepAndClaim([SDPA])]})
    with pytest.raises(ValueError, match=r"transform_passes names methods \['decode'\]"):
        lower(ep, transform_passes={"decode": []})
    with pytest.raises(TypeError, match="transform_passes must be a list of passes"):
        lower(ep, transform_passes=lambda gm: None)
    with pytest.raises(TypeError, match="pass it as compile_config"):
        lower(ep, None, None, EdgeCompileConfig())
    with pytest.raises(TypeError, match="to_edge_transform_and_lower takes an ExportedProgram"):
        lower(model)
    with pytest.raises(TypeError, match="generate_etrecord must be a bool; got 'yes'"):
        lower(ep, generate_etrecord="yes")
    with pytest.raises(TypeError, match="must list OpOverloads"):
        lower(ep, partitioner=[KeepAndClaim([aten.linear])])  # a packet, not an overload


def test_signature_mirrors_executorch():
    import inspect

    params = inspect.signature(exportir.to_edge_transform_and_lower).parameters
    assert list(params) == [
        "programs", "transform_passes", "partitioner", "constant_methods", "compile_config",
        "generate_etrecord",
    ]  # fmt: skip


# ------------------------------------------------------------------------------ symbolic sizes


class SizeDecidingBackend(BackendDetails):
    """Asks whether the batch is 16: a guard on the program's ShapeEnv."""

    @classmethod
    def preprocess(cls, edge_program, compile_specs):
        x = next(iter(edge_program.graph.find_nodes(op="placeholder"))).meta["val"]
        return PreprocessResult(b"16" if x.shape[0] == 16 else b"other")


class Sin(torch.nn.Module):
    def forward(self, x):
        return torch.sin(x)


def test_a_backend_deciding_a_symbolic_size_is_refused():
    ep = export(Sin(), (torch.randn(3, 4),), dynamic_shapes=({0: Dim("batch", max=32)},))

    class Claim(KeepAndClaim):
        def partition(self, exported_program):
            for node in exported_program.graph.nodes:
                if node.op == "call_function":
                    node.meta[DELEGATION_TAG] = "t"
            return PartitionResult(exported_program, {"t": DelegationSpec("SizeDecidingBackend")})

    with pytest.raises(PartitionError, match=r"SizeDecidingBackend.preprocess decided symbolic "
                       r"sizes of a dynamic program \(Ne\(s\d+, 16\)\).*must not branch on symbolic"):
        to_edge(ep).to_backend(Claim([]))
