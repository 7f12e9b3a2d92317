"""ExecuTorch's .pte format both ways (docs/format/pte.md), with ExecuTorch 1.5.1 as the oracle:
exportir's .pte files run in ExecuTorch's runtime equal to eager, ExecuTorch's own .pte files
run in exportir's runtime equal to eager, and what .pte cannot carry is refused before writing.
The whole corpus runs in test_pte_corpus.py (slow). Importing executorch takes ~15 s, so
``make test`` keeps a few models here and the rest is marked slow."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch
from corpus.export_models import BY_NAME, build
from pte_helpers import executorch_pte, our_pte, run_in_executorch, run_in_exportir

from exportir.format import pte_read
from exportir.format.pte_write import PteEncodeError, PteKernelCoverageError

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"
TESTS = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["mlp", "buffer_inplace", "view_ops", "aliasing_outputs"])
def test_our_pte_runs_in_executorch_like_eager(name):
    data = our_pte(name)
    assert data[4:8] == b"ET12" and data[8:12] == b"eh00"
    run_in_executorch(data, name)


@pytest.mark.parametrize("name", [
    "mlp", pytest.param("tied_weights", marks=pytest.mark.slow),
    pytest.param("dict_io", marks=pytest.mark.slow),
])
def test_executorch_pte_runs_in_exportir_like_eager(name):
    run_in_exportir(executorch_pte(name), name)


def test_dynamic_batch_pte_runs_in_executorch_at_other_sizes():
    from executorch.runtime import Runtime

    import exportir

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    batch = exportir.Dim("batch", min=1, max=16)
    ep = exportir.export(model, (torch.randn(5, 4),), dynamic_shapes={"input": {0: batch}})
    data = exportir.to_edge(ep).to_program().pte_buffer()  # ExecuTorch reads it in place
    method = Runtime.get().load_program(data).load_method("forward")
    for n in (1, 7, 16):
        x = torch.randn(n, 4)
        torch.testing.assert_close(method.execute([x])[0], model(x))


def _flatbuffer(data: bytes):
    from executorch.exir._serialize._program import _flatbuffer_to_program, _get_extended_header

    return _flatbuffer_to_program(data[:_get_extended_header(data).program_size])


def _ops(plan) -> list[str]:
    return [plan.operators[i.instr_args.op_index].name for i in plan.chains[0].instructions
            if hasattr(i.instr_args, "op_index")]


def test_method_state_shares_the_constant_segment():
    """The initial values of method state are a subsegment of the one constant segment (no
    second 128-byte aligned segment), loaded by both runtimes; equal vectors are written once
    (ExecutionPlan and Chain share their input and output lists)."""
    data = our_pte("buffer_inplace")
    program = _flatbuffer(data)
    assert len(program.segments) == 1
    assert [s.segment_index for s in program.mutable_data_segments] == [0]
    assert program.segments[0].offset == 0
    run_in_executorch(data, "buffer_inplace", calls=3)
    run_in_exportir(data, "buffer_inplace", calls=3)


def test_inputs_read_through_views_or_returned_are_planned():
    """As ExecuTorch does: the runtime copies such an input into planned memory once, its
    views alias that memory (no as_strided_copy) and returning it needs no copy_; an input the
    method writes stays the caller's tensor, so the caller sees the write."""
    plan = _flatbuffer(our_pte("aliasing_outputs")).execution_plan[0]
    assert [plan.values[i].val.allocation_info is not None for i in plan.inputs] == [True, True]
    assert not {"aten::as_strided_copy", "aten::copy_"} & set(_ops(plan))
    run_in_executorch(our_pte("aliasing_outputs"), "aliasing_outputs")

    from executorch.runtime import Runtime

    data = our_pte("user_input_mutation")
    plan = _flatbuffer(data).execution_plan[0]
    assert all(plan.values[i].val.allocation_info is None for i in plan.inputs)
    method = Runtime.get().load_program(data).load_method("forward")
    eager, args, _ = build(BY_NAME["user_input_mutation"])
    _, mine, _ = build(BY_NAME["user_input_mutation"])
    torch.testing.assert_close(method.execute(list(mine))[-1], eager(*args))
    for got, want in zip(mine, args):  # mutated in place like eager's
        torch.testing.assert_close(got, want)


def test_our_pte_loads_back_in_exportir():
    data = our_pte("mlp")
    assert pte_read.is_pte(data)
    run_in_exportir(data, "mlp")


def test_save_chooses_the_format_by_suffix_or_argument(tmp_path):
    from exportir.export import export
    from exportir.program.manager import to_edge

    model = torch.nn.Linear(3, 2)
    pm = to_edge(export(model, (torch.randn(1, 3),))).to_program()
    pm.save(tmp_path / "m.pte")
    pm.save(tmp_path / "m.bin", format="pte")
    pm.save(tmp_path / "m.xpt")
    assert (tmp_path / "m.pte").read_bytes() == (tmp_path / "m.bin").read_bytes()
    assert (tmp_path / "m.pte").read_bytes()[4:8] == b"ET12"
    assert (tmp_path / "m.xpt").read_bytes()[4:8] != b"ET12"
    with pytest.raises(ValueError, match="unknown program format 'onnx'"):
        pm.save(tmp_path / "m.onnx", format="onnx")


def test_refusal_lists_every_missing_kernel_and_writes_nothing(tmp_path):
    from corpus.export_models import BY_NAME, build

    from exportir.export import export
    from exportir.program.manager import to_edge

    module, args, kwargs = build(BY_NAME["pooling"])
    pm = to_edge(export(module, args, kwargs)).to_program()
    path = tmp_path / "pooling.pte"
    with pytest.raises(PteKernelCoverageError) as info:
        pm.save(path)
    assert not path.exists()
    assert set(info.value.missing) == {"aten::adaptive_max_pool2d.out"}
    message = str(info.value)
    assert "aten::adaptive_max_pool2d.out: nodes forward:" in message
    assert "export_models.py:" in message  # the user's source line of the node


def test_training_batch_norm_is_refused_with_the_fix():
    with pytest.raises(PteKernelCoverageError, match=r"training=True .*eval\(\) mode"):
        our_pte("cnn_bn_train")


def test_delegated_program_is_refused_naming_the_backend():
    from exportir.backends.fused_cpu import FusedCpuPartitioner
    from exportir.export import export
    from exportir.program.manager import to_edge

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    edge = to_edge(export(model, (torch.randn(2, 4),))).to_backend(FusedCpuPartitioner())
    with pytest.raises(PteEncodeError, match="delegates to FusedCpuBackend: ExecuTorch has no such backend"):
        edge.to_program().pte_buffer()


def test_reader_refuses_an_operator_outside_the_portable_set():
    data = bytearray(our_pte("mlp"))
    at = data.find(b"aten::addmm")
    data[at:at + 11] = b"aten::evil_"
    with pytest.raises(pte_read.ProgramLoadError, match=r"operators\[\d+\]\.name"):
        pte_read.read_pte(bytes(data))


def _fresh(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, (SRC, TESTS, TESTS / "format"))))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_our_pte_in_executorch_in_a_fresh_process(tmp_path):
    path = tmp_path / "gpt.pte"
    path.write_bytes(our_pte("gpt_kv_cache"))
    out = _fresh(f"""
        from pte_helpers import run_in_executorch
        run_in_executorch(open({str(path)!r}, "rb").read(), "gpt_kv_cache")
        print("RAN")
    """)
    assert "RAN" in out


@pytest.mark.slow
def test_executorch_pte_in_exportir_in_a_fresh_process(tmp_path):
    path = tmp_path / "mlp.pte"
    path.write_bytes(executorch_pte("mlp_deep_tanh"))
    out = _fresh(f"""
        import sys
        from exportir.runtime import Program
        from pte_helpers import run_in_exportir
        run_in_exportir(open({str(path)!r}, "rb").read(), "mlp_deep_tanh")
        Program.load({str(path)!r})  # from a path: memory-mapped
        print("RAN", sorted(m for m in sys.modules if m.startswith("exportir.program")))
    """)
    assert "RAN []" in out  # the runtime read it without the compiler


def test_real_transformers_model_runs_in_executorch():
    from corpus import real_models as R
    from executorch.runtime import Runtime

    from exportir import pytree
    from exportir.export import export
    from exportir.program.manager import to_edge

    case = R.build("distilbert")
    data = to_edge(export(case.model, (), case.kwargs)).to_program().pte_buffer()
    method = Runtime.get().load_program(data).load_method("forward")
    got = method.execute(pytree.tree_leaves(case.kwargs))
    with torch.no_grad():
        expected = [t for t in pytree.tree_leaves(case.model(**case.kwargs))
                    if isinstance(t, torch.Tensor)]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)
