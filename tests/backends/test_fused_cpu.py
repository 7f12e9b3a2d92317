"""The fused CPU backend: what its partitioner claims, preprocess into a safe blob, running
lowered modules in Python (same executor as the runtime), blob validation, and the runtime side
importing nothing of the compiler."""

from __future__ import annotations

import json
import os
import pathlib
import struct
import subprocess
import sys

import pytest
import torch

from exportir.backends.fused_cpu import BACKEND_ID, FusedCpuBackend, FusedCpuPartitioner
from exportir.backends.fused_cpu.backend import FusedCpuLoweringError
from exportir.backends.fused_cpu.runtime import FusedCpuBlobError, FusedCpuRuntime, decode
from exportir.dialects.backend import (
    CompileSpec,
    LoweredBackendModule,
    executorch_call_delegate,
)
from exportir.export import export
from exportir.passes.to_backend import to_backend
from exportir.program.manager import to_edge

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"


class Block(torch.nn.Module):
    """linear -> gelu -> layer_norm -> round (not supported) -> linear -> softmax."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = self.norm(torch.nn.functional.gelu(self.fc1(x)))
        h = torch.round(h)
        return torch.softmax(self.fc2(h), dim=-1), h.sigmoid()


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    model = Block().eval()
    args = (torch.randn(5, 8),)
    return model, args, to_edge(export(model, args))


def _calls(ep):
    return [n for n in ep.graph.nodes if n.op == "call_function"]


def _ops(ep):
    return [getattr(n.target, "__name__", str(n.target)) for n in _calls(ep)]


def test_partitioner_claims_supported_subgraphs_and_leaves_the_rest(block):
    model, args, edge = block
    ep = edge.to_backend(FusedCpuPartitioner()).exported_program()
    ops = _ops(ep)
    assert ops.count("executorch_call_delegate") == 2
    assert "aten.round.default" in ops  # unclaimed, stays a runtime kernel
    leftovers = {o for o in ops if o not in ("executorch_call_delegate", "getitem")}
    assert leftovers == {"aten.round.default"}
    text = str(ep.graph)
    assert "get_attr[target=lowered_module_0]" in text
    assert "get_attr[target=lowered_module_1]" in text
    # topological order holds and the graph lints
    ep.graph.lint()
    expected = model(*args)
    got = ep.module()(*args)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


def test_lowered_module_runs_the_blob_with_the_runtime_executor(block):
    _, _, edge = block
    ep = edge.to_backend(FusedCpuPartitioner()).exported_program()
    lowered = ep.graph_module.lowered_module_0
    assert isinstance(lowered, LoweredBackendModule)
    assert lowered.backend_id == BACKEND_ID == FusedCpuBackend.backend_id
    assert isinstance(lowered._runtime, FusedCpuRuntime)
    assert lowered.processed_bytes.startswith(b"XFC1")
    call = next(n for n in ep.graph.nodes if n.target is executorch_call_delegate)
    # the original partition program and the blob agree
    sub = lowered.original_module
    inputs = [torch.randn(tuple(n.meta["val"].shape)) for n in call.args[1:]]
    from_blob = lowered(*inputs)
    from_graph = sub.module()(*inputs)
    for a, b in zip(from_blob, from_graph):
        torch.testing.assert_close(a, b)


def test_own_constants_moves_weights_into_the_blob(block):
    model, args, edge = block
    ep = edge.to_backend(FusedCpuPartitioner(own_constants=True)).exported_program()
    assert not any(s.kind.name == "PARAMETER" for s in ep.graph_signature.input_specs)
    assert ep.state_dict == {}
    blob_bytes = sum(len(m.processed_bytes) for m in ep.graph_module.children())
    weight_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert blob_bytes > weight_bytes
    for g, e in zip(ep.module()(*args), model(*args)):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("inplace", [b"0", b"1"])
def test_whole_program_lowering(block, inplace):
    _, args, edge = block
    ep = edge.exported_program()
    # round is not supported: whole-program lowering of Block fails with the way out
    with pytest.raises(FusedCpuLoweringError, match="round.*FusedCpuPartitioner"):
        to_backend(BACKEND_ID, ep, [CompileSpec("inplace", inplace)])
    torch.manual_seed(1)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    mlp_ep = to_edge(export(mlp, args)).exported_program()
    lowered = to_backend(BACKEND_ID, mlp_ep, [CompileSpec("inplace", inplace)])
    torch.testing.assert_close(lowered(*args)[0], mlp(*args))
    header = _header(lowered.processed_bytes)
    assert any(header["inplace"]) == (inplace == b"1")  # relu after addmm reuses its buffer
    # a graph module can be lowered too (every placeholder is a delegate input)
    by_gm = to_backend(FusedCpuBackend, mlp_ep.graph_module, [])
    state = [
        mlp_ep.state_dict[s.target]
        for s in mlp_ep.graph_signature.input_specs
        if s.target is not None
    ]
    torch.testing.assert_close(by_gm(*state, *args)[0], mlp(*args))


def test_unknown_compile_spec_is_refused(block):
    _, _, edge = block
    with pytest.raises(ValueError, match="unknown compile spec 'fast'"):
        edge.to_backend(FusedCpuPartitioner([CompileSpec("fast", b"1")]))


def test_partitioner_rejects_ops_the_backend_does_not_run():
    with pytest.raises(ValueError, match="does not run"):
        FusedCpuPartitioner(ops=["aten.round.default"])


def test_op_subset_narrows_what_is_claimed(block):
    _, _, edge = block
    only_mm = FusedCpuPartitioner(ops=["aten.addmm.default", "aten.permute_copy.default"])
    ep = edge.to_backend(only_mm).exported_program()
    ops = _ops(ep)
    assert "aten.gelu.default" in ops and "aten.addmm.default" not in ops


# ------------------------------------------------------------------------------ the blob


def _header(blob: bytes) -> dict:
    _, _, length = struct.unpack_from("<4sII", blob)
    return json.loads(blob[12 : 12 + length])


def _blob() -> bytes:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    ep = to_edge(export(mlp, (torch.randn(2, 4),))).exported_program()
    return FusedCpuBackend.preprocess(ep, []).processed_bytes


def _data(blob: bytes) -> bytes:
    _, _, length = struct.unpack_from("<4sII", blob)
    return blob[-(-(12 + length) // 16) * 16 :]


def _rebuild(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    head = struct.pack("<4sII", b"XFC1", 2, len(text)) + text
    return head + b"\0" * (-len(head) % 16) + data


def test_blob_is_json_plus_raw_constants_and_round_trips():
    blob = _blob()
    header = _header(blob)
    # permute + addmm became one linear; tanh runs in place on its result
    assert [op[0] for op in header["ops"]] == ["aten.linear.default", "aten.tanh.default"]
    assert header["inplace"] == [0, 1]
    program = decode(blob)
    assert len(program.constants) == 2 and len(program.inputs) == 1
    assert b"pickle" not in blob and b"\x80\x04" not in blob[:12]


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda b: b"XXXX" + b[4:], "magic"),
        (lambda b: b[:8], "too short"),
        (lambda b: b[:4] + struct.pack("<I", 9) + b[8:], "version"),
        (lambda b: b[:8] + struct.pack("<I", 1 << 30) + b[12:], "runs past"),
        (lambda b: b[:12] + b"[" + b[13:], "not valid JSON"),
    ],
)
def test_malformed_blobs_are_refused_with_the_field(mutate, field):
    with pytest.raises(FusedCpuBlobError, match=field):
        decode(mutate(_blob()))


def test_blob_ops_come_from_a_closed_table():
    blob = _blob()
    data = _data(blob)
    assert decode(_rebuild(_header(blob), data)).ops  # the rebuilt blob is valid as is
    header = _header(blob)
    header["ops"][0][0] = "aten.__import__.default"
    with pytest.raises(FusedCpuBlobError, match="ops\\[0\\].op.*not one the fused_cpu backend"):
        decode(_rebuild(header, data))
    header = _header(blob)
    header["ops"][0][1] = [{"v": 10_000}]
    with pytest.raises(FusedCpuBlobError, match="ops\\[0\\].args"):
        decode(_rebuild(header, data))
    header = _header(blob)
    header["constants"][0][4] = 1 << 20
    with pytest.raises(FusedCpuBlobError, match="constants\\[0\\]"):
        decode(_rebuild(header, data))


def test_execution_errors_name_the_op_and_node():
    runtime = FusedCpuRuntime()
    handle = runtime.init(_blob(), [])
    with pytest.raises(RuntimeError, match="aten.linear.default \\(graph nodes addmm, permute\\)"):
        runtime.execute(handle, [torch.randn(2, 5)])
    with pytest.raises(RuntimeError, match="takes 1 inputs; got 2"):
        runtime.execute(handle, [torch.randn(2, 4), torch.randn(2, 4)])


def test_runtime_side_imports_nothing_of_the_compiler():
    code = (
        "import sys, exportir.runtime.backends.fused_cpu as r\n"
        "r.FusedCpuRuntime()\n"
        "print(sorted(m for m in sys.modules if m.startswith('exportir')))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(SRC))
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    loaded = eval(done.stdout)  # a printed list of module names
    # the executor lives in the runtime package: the runtime and the program format, nothing more
    allowed_prefixes = ("exportir.runtime", "exportir.format")
    packages = ("exportir",)
    compiler = [m for m in loaded if m not in packages and not m.startswith(allowed_prefixes)]
    assert not compiler, compiler
    assert "exportir.program.emit" not in loaded and "exportir.runtime.backends.fused_cpu" in loaded
