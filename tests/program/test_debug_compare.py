"""``exportir.debug.compare``: a program's intermediates against eager, node by node; drifts
injected on purpose (a perturbed runtime kernel, an edited weight in the program file, inside
a fused delegate) are named with their node and source line, and a clean program has none."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from corpus.debug_models import Net, source_line

import exportir
import exportir.debug
from exportir.backends.fused_cpu import FusedCpuPartitioner
from exportir.format import schema
from exportir.program.manager import ProgramManager
from exportir.runtime import default_kernel_registry

SRC = Path(__file__).resolve().parents[2] / "src"



@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(2, 4)
    return model, x, exportir.export(model, (x,))


def _perturb_constant(manager: ProgramManager, tensor: torch.Tensor) -> ProgramManager:
    """The same program with the constant buffer holding ``tensor`` changed by +0.5."""
    program = manager.program
    raw = tensor.detach().contiguous().numpy().tobytes()
    (index,) = [i for i, c in enumerate(program.constants) if bytes(c.data) == raw]
    edited = (tensor.detach() + 0.5).contiguous().numpy().tobytes()
    constants = list(program.constants)
    constants[index] = schema.ConstantBuffer(edited)
    changed = dataclasses.replace(program, constants=tuple(constants))
    return ProgramManager(changed, {m: manager.exported_program(m) for m in manager.methods})


def test_a_clean_program_has_no_drift(setup):
    model, x, ep = setup
    report = exportir.debug.compare(ep, model, (x,))
    assert report.first_drift is None and report.ok
    assert [c.node for c in report.nodes] == ["addmm", "native_layer_norm", "relu", "addmm_1",
                                              "mul"]
    assert all(c.max_abs < 1e-5 for c in report.nodes)
    assert "no drift" in str(report)
    assert [(m.module, m.node, m.within) for m in report.modules] == [
        ("block.lin", "addmm", True), ("block.ln", "native_layer_norm", True),
        ("block", "relu", True), ("head", "addmm_1", True)]


def test_a_perturbed_kernel_is_named_with_its_node_and_source_line(setup):
    model, x, ep = setup
    kernels = default_kernel_registry()

    def drifting_relu(x, out):
        torch.clamp_min(x, 0, out=out)
        out.add_(0.25)

    kernels.register_function("aten::relu.out", drifting_relu, arity=2, writes=(1,))
    report = exportir.debug.compare(ep, model, (x,), kernels=kernels)
    first = report.first_drift
    assert first is not None
    assert (first.node, first.op, first.module) == ("relu", "aten::relu.out", "block")
    assert first.source.endswith(source_line("# BLOCK_LINE"))
    assert first.max_abs == pytest.approx(0.25, abs=1e-5)
    assert [c.within for c in report.nodes[:2]] == [True, True]  # before it: clean
    assert not report.ok and not report.outputs[0].within
    module = report.first_module_drift  # against the eager model's own submodule outputs
    assert (module.module, module.module_type, module.node) == (
        "block", "corpus.debug_models.Block", "relu")
    text = str(report)
    assert "first drift: node 'relu' (aten::relu.out, instruction 2) in module block" in text
    assert source_line("# BLOCK_LINE") in text and "DRIFT" in text


def test_an_edited_weight_is_found_at_the_node_reading_it(setup):
    model, x, ep = setup
    manager = _perturb_constant(exportir.to_edge(ep).to_program(), model.head.weight)
    report = exportir.debug.compare(manager, model, (x,))
    first = report.first_drift
    assert (first.node, first.module) == ("addmm_1", "head")
    assert first.source.endswith(source_line("# NET_LINE"))
    assert report.first_module_drift.module == "head"


def test_a_drift_inside_a_fused_delegate_names_the_fused_op_and_its_nodes(setup):
    model, x, ep = setup
    lowered = exportir.to_edge_transform_and_lower(ep, partitioner=[FusedCpuPartitioner()])
    clean = exportir.debug.compare(lowered, model, (x,))
    assert clean.first_drift is None
    assert {c.op for c in clean.nodes} >= {"aten.linear.default", "aten.layer_norm.default"}
    manager = _perturb_constant(lowered.to_program(), model.head.weight)
    first = exportir.debug.compare(manager, model, (x,)).first_drift
    assert first.delegate_op is not None and first.op == "aten.linear.default"
    assert (first.node, first.module) == ("addmm_1", "head")
    assert first.source.endswith(source_line("# NET_LINE"))


def test_bad_arguments_are_refused_clearly(setup, tmp_path):
    model, x, ep = setup
    with pytest.raises(TypeError, match="A program file alone has no graph"):
        exportir.debug.compare(b"EXPORTIR...", model, (x,))
    with pytest.raises(ValueError, match="rtol must be a number >= 0; got -1"):
        exportir.debug.compare(ep, model, (x,), rtol=-1)
    with pytest.raises(ValueError, match="no method 'decode'"):
        exportir.debug.compare(ep, model, (x,), method="decode")


@pytest.mark.slow  # a fresh interpreter importing torch and exporting: ~15 s on a busy machine
def test_compare_runs_in_a_fresh_process(tmp_path):
    code = (
        "import sys, torch, exportir, exportir.debug\n"
        "m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU()).eval()\n"
        "x = torch.randn(2, 3)\n"
        "r = exportir.debug.compare(exportir.export(m, (x,)), m, (x,))\n"
        "pm = exportir.to_edge(exportir.export(m, (x,))).to_program()\n"
        "pm.get_etrecord().save(sys.argv[1])\n"
        "e = exportir.debug.compare(pm.buffer, m, (x,), etrecord=sys.argv[1])\n"
        "print(r.ok, len(r.nodes), e.ok)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.etrecord")],
                          capture_output=True, text=True,
                          env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "2", "True"]


# ------------------------------------------------------------------------------ ETRecord


def test_a_program_file_compares_through_its_saved_etrecord(setup, tmp_path):
    model, x, ep = setup
    manager = exportir.to_edge(ep).to_program()
    manager.save(tmp_path / "model.xpt")
    manager.get_etrecord().save(tmp_path / "model.etrecord")
    clean = exportir.debug.compare(tmp_path / "model.xpt", model, (x,),
                                   etrecord=tmp_path / "model.etrecord")
    assert clean.ok and len(clean.nodes) == 5
    kernels = default_kernel_registry()

    def drifting_relu(x, out):
        torch.clamp_min(x, 0, out=out)
        out.add_(0.25)

    kernels.register_function("aten::relu.out", drifting_relu, arity=2, writes=(1,))
    first = exportir.debug.compare(str(tmp_path / "model.xpt"), model, (x,), kernels=kernels,
                                   etrecord=str(tmp_path / "model.etrecord")).first_drift
    assert first.node == "relu" and first.source.endswith(source_line("# BLOCK_LINE"))


def test_the_etrecord_of_a_delegated_program_inlines_the_delegated_subgraph(setup, tmp_path):
    model, x, ep = setup
    lowered = exportir.to_edge_transform_and_lower(
        ep, partitioner=[FusedCpuPartitioner(own_constants=True)], generate_etrecord=True)
    manager = lowered.to_program()
    record = manager.get_etrecord()
    reference = record.reference_programs["forward"]
    names = [n.name for n in reference.graph.nodes if n.op == "call_function"]
    assert names == ["permute", "addmm", "native_layer_norm", "getitem", "relu", "permute_1",
                     "addmm_1", "mul"]
    record.save(tmp_path / "fused.etrecord")
    report = exportir.debug.compare(manager.buffer, model, (x,),
                                    etrecord=tmp_path / "fused.etrecord")
    assert report.ok and {c.op for c in report.nodes} >= {"aten.linear.default"}


def test_an_etrecord_is_checked_against_its_program(setup, tmp_path):
    model, x, ep = setup
    other = exportir.to_edge(exportir.export(Net().eval(), (x,))).to_program()
    mine = exportir.to_edge(ep).to_program()
    with pytest.raises(ValueError, match="made for another program"):
        exportir.debug.compare(mine.buffer, model, (x,), etrecord=other.get_etrecord())
    exportir.save(ep, tmp_path / "plain.pt2")
    with pytest.raises(exportir.debug.ETRecordError, match="is not an exportir ETRecord"):
        exportir.debug.load_etrecord(tmp_path / "plain.pt2")


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("steps", torch.zeros(1))

    def forward(self, x, *, scale):
        self.steps.add_(1)
        return x * scale + self.steps


def test_keyword_inputs_and_a_mutated_buffer_are_handled():
    model = Counter()
    x = torch.randn(2, 3)
    kwargs = {"x": x, "scale": torch.tensor(2.0)}
    ep = exportir.export(model, (), kwargs)
    model.steps.zero_()  # exporting ran forward on fake tensors only; make it explicit
    report = exportir.debug.compare(ep, model, kwargs)
    assert report.ok and report.outputs and report.outputs[0].within
    assert model.steps.item() == 0  # compare ran the model, then restored its buffer


def test_an_etrecord_holds_every_method(setup, tmp_path):
    model, _, ep = setup
    head = exportir.export(model.head, (torch.randn(2, 8),))
    manager = exportir.to_edge({"forward": ep, "head": head}).to_program()
    manager.get_etrecord().save(tmp_path / "two.etrecord")
    record = exportir.debug.load_etrecord(tmp_path / "two.etrecord")
    assert sorted(record.reference_programs) == ["forward", "head"]
    report = exportir.debug.compare(manager.buffer, model.head, (torch.randn(2, 8),),
                                    method="head", etrecord=record)
    assert report.ok and [c.node for c in report.nodes] == ["addmm"]
