"""The ``exportir`` command: export, inspect and run as subprocesses (the way users call it);
input variants and error paths in-process through ``exportir.cli.main`` (fast)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

SRC = Path(__file__).resolve().parents[1] / "src"

MODEL = textwrap.dedent(
    """
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(6, 3)
            self.norm = torch.nn.LayerNorm(3)

        def forward(self, x):
            return self.norm(self.fc(x)).relu()

    def make():
        torch.manual_seed(0)
        return Net(), (torch.randn(2, 6),)

    def make_plain():
        torch.manual_seed(0)
        return Net()
    """
)


def exportir(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    return subprocess.run(
        [sys.executable, "-m", "exportir.cli", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False,
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    (d / "netmod.py").write_text(MODEL)
    return d


@pytest.fixture(scope="module")
def exported(workdir) -> Path:
    done = exportir("export", "netmod:make", "-o", "net.xpt", cwd=workdir)
    assert done.returncode == 0, done.stderr
    for stage in ("imports", "export", "to_edge", "to_program", "wrote net.xpt"):
        assert stage in done.stdout
    assert "\x1b" not in done.stdout + done.stderr and "\r" not in done.stdout  # not a TTY
    return workdir / "net.xpt"


@pytest.fixture
def in_workdir(workdir, monkeypatch):
    """Run ``main`` in-process from ``workdir`` (sys.path and cwd restored afterwards)."""
    monkeypatch.chdir(workdir)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "netmod", raising=False)
    from exportir.cli import main

    return main


def _eager(workdir: Path, x: torch.Tensor) -> torch.Tensor:
    sys.path.insert(0, str(workdir))
    try:
        import netmod

        module, _ = netmod.make()
        return module.eval()(x)
    finally:
        sys.path.remove(str(workdir))


def test_export_writes_a_program_that_runs_like_eager(exported, workdir):
    from exportir.runtime import Program

    x = torch.randn(2, 6)
    got = Program.load(exported).method("forward")(x)
    torch.testing.assert_close(got, _eager(workdir, x))


def test_export_from_a_file_path_with_example_input_specs(workdir, in_workdir, capsys):
    code = in_workdir(["export", "netmod.py:make_plain", "--example-inputs", "f32[4,6]",
                       "-o", "plain.xpt"])
    assert code == 0, capsys.readouterr().err
    from exportir.runtime import Program

    method = Program.load(workdir / "plain.xpt").method()
    assert method.meta.values[method.meta.inputs[0]].sizes == (4, 6)


def test_export_delegated_and_run(workdir, in_workdir, capsys):
    assert in_workdir(["export", "netmod:make", "--backend", "fused_cpu", "-o", "d.xpt"]) == 0
    out = capsys.readouterr().out
    assert "lower" in out and "1 delegate(s)" in out
    assert in_workdir(["run", "d.xpt", "--inputs", "f32[2,6]",
                       "--repeat", "1"]) == 0
    assert "output 0     float32[2, 3]" in capsys.readouterr().out


def test_inspect_shows_methods_ops_plan_and_sizes(exported, workdir, in_workdir, capsys):
    done = exportir("inspect", str(exported), cwd=workdir)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "1 method(s) ['forward']" in out
    assert "aten::addmm.out" in out and "aten::native_layer_norm.out" in out
    assert "memory plan: 1 arena(s)" in out
    assert "Size breakdown:" in out and "constants" in out
    assert in_workdir(["inspect", str(exported), "--method", "forward"]) == 0
    assert "Method 'forward'" in capsys.readouterr().out
    assert in_workdir(["inspect", str(exported), "--method", "nope"]) == 2
    assert "has no method 'nope'" in capsys.readouterr().err


def test_run_with_random_inputs_prints_timing_and_outputs(exported, workdir):
    done = exportir("run", str(exported), "--repeat", "3", cwd=workdir)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "\x1b" not in out + done.stderr  # plain output when stdout is not a terminal
    assert "load" in out and "prepare" in out and "bound to kernels" in out
    assert "first call" in out and "warm-up" in out
    assert "execute" in out and "median" in out and "over 3 runs" in out
    assert "input 0      float32[2, 6]" in out
    assert "output 0     float32[2, 3]" in out


def test_run_with_given_npy_input_matches_eager(exported, workdir, in_workdir, capsys):
    x = torch.randn(2, 6)
    np.save(workdir / "x.npy", x.numpy())
    assert in_workdir(["run", str(exported), "--inputs", "x.npy", "--repeat", "1"]) == 0
    want = _eager(workdir, x)
    first = f"{want.reshape(-1)[0].item():.4g}"
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("output 0"))
    assert f"[{first}," in line


def test_run_reports_bad_inputs_clearly(exported, in_workdir, capsys):
    assert in_workdir(["run", str(exported), "--inputs", "f32[2,5]"]) == 1
    err = capsys.readouterr().err
    assert "input 0 (x) has shape float32[2, 5]" in err


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("export", "no_colon", "-o", "x.xpt"), 2, "expected MODULE:FACTORY"),
        (("export", "netmod:make_plain", "-o", "x.xpt"), 2, "pass --example-inputs"),
        (("export", "netmod:missing", "-o", "x.xpt"), 2, "has no attribute 'missing'"),
        (("export", "netmod:make_plain", "--example-inputs", "q9[2]", "-o", "x.xpt"), 2,
         "unknown dtype 'q9'"),
        (("run", "nothere.xpt"), 1, "No such file or directory"),
        (("inspect", "netmod.py"), 1, "not a valid program file"),
    ],
)
def test_error_paths(in_workdir, capsys, args, code, message):
    assert in_workdir(list(args)) == code
    assert message in capsys.readouterr().err


def test_run_and_inspect_do_not_load_the_compiler(exported):
    code = textwrap.dedent(
        f"""
        import sys
        from exportir.cli import main
        assert main(["run", {str(exported)!r}, "--repeat", "1"]) == 0
        assert main(["inspect", {str(exported)!r}]) == 0
        assert main(["inspect", "--summary", {str(exported)!r}]) == 0
        bad = [m for m in sys.modules if m.startswith(("exportir.export", "exportir.fx",
               "exportir.dialects", "exportir.passes", "exportir.program.emit",
               "exportir.backends.fused_cpu.backend",
               "exportir.backends.fused_cpu.partitioner"))]
        print("COMPILER", bad)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(SRC))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "COMPILER []" in done.stdout


def test_parse_input_specs():
    from exportir.cli import CliError, parse_input

    assert parse_input("f32[2,3]").shape == (2, 3)
    assert parse_input("[4]").dtype == torch.float32
    ints = parse_input("int64[100]:5:7")
    assert ints.dtype == torch.int64 and set(ints.tolist()) <= {5, 6}
    assert parse_input("bool[3]").dtype == torch.bool
    assert parse_input("f32[]").shape == ()
    assert (parse_input("3"), parse_input("0.5"), parse_input("true"), parse_input("none")) == (
        3, 0.5, True, None)
    with pytest.raises(CliError, match="cannot read input"):
        parse_input("what")


def test_example_inputs_take_keyword_specs():
    from exportir.cli import CliError, _example_inputs

    args, kwargs = _example_inputs(["i64[2,8]:0:100", "attention_mask=f32[2,8]", "scale=0.5"],
                                   torch.Generator())
    assert args[0].dtype == torch.int64 and kwargs["attention_mask"].shape == (2, 8)
    assert kwargs["scale"] == 0.5
    with pytest.raises(CliError, match="after keyword inputs"):
        _example_inputs(["x=f32[2]", "f32[2]"], torch.Generator())



# ------------------------------------------------------------------------------ dynamic shapes


def test_export_dynamic_runs_at_other_sizes(workdir, in_workdir, capsys):
    # a keyword example input (NAME=SPEC), marked dynamic by its name
    assert in_workdir(["export", "netmod:make_plain", "--example-inputs", "x=f32[3,6]",
                       "--dynamic", "x:0=batch[1,64]", "-o", "dyn.xpt"]) == 0
    assert "accepts dynamic sizes: batch in [1, 64]" in capsys.readouterr().out
    for rows in (1, 5, 64):
        assert in_workdir(["run", "dyn.xpt", "--inputs", f"f32[{rows},6]", "--repeat", "1"]) == 0
        assert f"output 0     float32[{rows}, 3]" in capsys.readouterr().out
    from exportir.runtime import Program

    x = torch.randn(7, 6)
    torch.testing.assert_close(Program.load(workdir / "dyn.xpt").method()(x), _eager(workdir, x))
    assert in_workdir(["run", "dyn.xpt", "--inputs", "f32[65,6]"]) == 1
    assert "batch, which the method accepts in [1, 64]" in capsys.readouterr().err
    assert in_workdir(["inspect", "--summary", "dyn.xpt"]) == 0
    summary = capsys.readouterr().out
    assert "x: f32[batch, 6]" in summary and "dynamic sizes: batch in [1, 64]" in summary


def test_dynamic_specs_parse_and_share_dims():
    from exportir.cli_dynamic import DimSpecError, dynamic_shapes, parse_dynamic

    class Two(torch.nn.Module):
        def forward(self, a, b):
            return a + b

    specs = parse_dynamic(["a:0=batch[1,64] 1:0=batch", "a:-1=seq[2,]; b:1=seq"])
    assert [(s.input, s.dim, s.name, s.min, s.max) for s in specs] == [
        ("a", 0, "batch", 1, 64), (1, 0, "batch", None, None),
        ("a", -1, "seq", 2, None), ("b", 1, "seq", None, None)]
    shapes = dynamic_shapes(specs, Two(), (torch.ones(2, 3), torch.ones(2, 3)), {})
    assert shapes["a"][0] is shapes["b"][0] and shapes["a"][1] is shapes["b"][1]
    assert (shapes["a"][0].min, shapes["a"][0].max, shapes["a"][1].min) == (1, 64, 2)
    with pytest.raises(DimSpecError, match="has two ranges"):
        dynamic_shapes(parse_dynamic(["a:0=n[1,8]", "b:0=n[1,9]"]), Two(),
                       (torch.ones(2), torch.ones(2)), {})
    with pytest.raises(DimSpecError, match="is a int, not a tensor"):
        dynamic_shapes(parse_dynamic(["b:0=n"]), Two(), (torch.ones(2), 3), {})


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("x0=b", "cannot read dynamic spec 'x0=b': expected INPUT:DIM=NAME[MIN,MAX]"),
        ("y:0=b", "the model has no input 'y'; its inputs are x"),
        ("1:0=b", "the model takes 1 input(s) (x); there is no input 1"),
        ("x:2=b", "input 'x' has 2 dimension(s) (shape [2, 6]); dimension 2 is out of range"),
        ("x:0=b[5,1]", "inconsistent min=5, max=1"),
        ("x:1=feat", "export refused the --dynamic specs:\nConstraints violated (feat)!"),
    ],
)
def test_dynamic_spec_errors(in_workdir, capsys, spec, message):
    assert in_workdir(["export", "netmod:make", "--dynamic", spec, "-o", "bad.xpt"]) == 2
    assert message in capsys.readouterr().err


# ------------------------------------------------------------------------------ --import, lower

CUSTOM_OPS = textwrap.dedent(
    """
    import torch

    @torch.library.custom_op("cli_test_ops::scaled_tanh", mutates_args=())
    def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
        return torch.tanh(x) * scale

    @scaled_tanh.register_fake
    def _(x, scale):
        return torch.empty_like(x)
    """
)

CUSTOM_MODEL = textwrap.dedent(
    """
    import torch

    class UsesOp(torch.nn.Module):
        def forward(self, x):
            return torch.ops.cli_test_ops.scaled_tanh(x + 1, 2.0)

    def make():
        return UsesOp(), (torch.randn(3, 4),)
    """
)


def test_import_a_custom_op_library_for_export_and_run(workdir, in_workdir, capsys):
    (workdir / "cli_ops_lib.py").write_text(CUSTOM_OPS)
    (workdir / "cli_ops_model.py").write_text(CUSTOM_MODEL)
    # export in this process (it imports the library), run in a fresh one (as users do)
    assert in_workdir(["export", "cli_ops_model:make", "--import", "cli_ops_lib",
                       "--dynamic", "x:0=n[1,8]", "-o", "op.xpt"]) == 0
    capsys.readouterr()
    np.save(workdir / "x5.npy", np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4))
    done = exportir("run", "op.xpt", "--import", "cli_ops_lib.py", "--inputs", "x5.npy",
                    "--repeat", "1", cwd=workdir)
    assert done.returncode == 0, done.stderr
    want = torch.tanh(torch.linspace(-1, 1, 20).reshape(5, 4) + 1) * 2.0
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("output 0"))
    assert line.startswith("output 0     float32[5, 4]")
    assert f"[{want.reshape(-1)[0].item():.4g}," in line
    # without --import the runtime refuses, and says what to pass
    assert in_workdir(["run", "op.xpt"]) == 1
    err = capsys.readouterr().err
    assert "cli_test_ops::scaled_tanh" in err and "pass --import MODULE" in err


def test_lower_a_saved_exported_program(workdir, in_workdir, capsys):
    import exportir as xir

    sys.path.insert(0, str(workdir))
    try:
        import netmod

        module, args = netmod.make()
    finally:
        sys.path.remove(str(workdir))
    batch = xir.Dim("batch", min=1, max=32)
    xir.save(xir.export(module.eval(), args, dynamic_shapes={"x": {0: batch}}),
             workdir / "net.pt2")
    assert in_workdir(["lower", "net.pt2", "--backend", "fused_cpu", "-o", "lowered.xpt"]) == 0
    out = capsys.readouterr().out
    assert "load" in out and "lower" in out and "wrote lowered.xpt" in out
    assert "batch in [1, 32]" in out
    from exportir.runtime import Program

    x = torch.randn(9, 6)
    got = Program.load(workdir / "lowered.xpt").method()(x)
    torch.testing.assert_close(got, _eager(workdir, x))
    assert in_workdir(["inspect", "net.pt2"]) == 2
    assert "lower it first: exportir lower net.pt2" in capsys.readouterr().err
    assert in_workdir(["lower", "missing.pt2", "-o", "x.xpt"]) == 2
    assert "no such file: missing.pt2" in capsys.readouterr().err
    assert in_workdir(["export", "netmod:make", "--import", "no_such_mod", "-o", "x.xpt"]) == 2
    assert "cannot import module 'no_such_mod'" in capsys.readouterr().err


def test_lower_a_pt2_written_by_torch_export(workdir, in_workdir, capsys):
    """`exportir lower` reads torch.export.save's archives (exportir.load, no pickle run)."""
    import torch.export

    sys.path.insert(0, str(workdir))
    try:
        import netmod

        module, args = netmod.make()
    finally:
        sys.path.remove(str(workdir))
    batch = torch.export.Dim("batch", min=1, max=32)
    torch.export.save(torch.export.export(module.eval(), args, dynamic_shapes={"x": {0: batch}}),
                      workdir / "torch.pt2")
    assert in_workdir(["lower", "torch.pt2", "-o", "from_torch.xpt"]) == 0
    assert "wrote from_torch.xpt" in capsys.readouterr().out
    from exportir.runtime import Program

    x = torch.randn(5, 6)
    got = Program.load(workdir / "from_torch.xpt").method()(x)
    torch.testing.assert_close(got, _eager(workdir, x))


# ------------------------------------------------------------------------------ inspect --summary


def test_inspect_summary_fits_one_screen(exported, workdir, in_workdir, capsys):
    if not (workdir / "d.xpt").exists():
        assert in_workdir(["export", "netmod:make", "--backend", "fused_cpu", "-o", "d.xpt"]) == 0
        capsys.readouterr()
    assert in_workdir(["inspect", "d.xpt", "--summary", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) < 40
    assert "Method 'forward'" in out and "x: f32[2, 6]" in out
    assert "instructions: 1 (1 delegate calls)" in out
    assert "Delegates (1): FusedCpuBackend x1" in out and "#0 FusedCpuBackend, blob" in out
    assert "fused op(s) in all:" in out and "linear x" in out
    assert "memory:" in out and "Size breakdown:" in out
    assert in_workdir(["inspect", "d.xpt"]) == 0  # the full dump says what delegates hold too
    assert "#0 FusedCpuBackend, blob" in capsys.readouterr().out
    assert in_workdir(["inspect", "net.xpt", "--summary", "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "operators (top 1 of" in out and "more call(s)" in out and "Delegates: none" in out
    assert in_workdir(["inspect", "net.xpt", "--summary", "--top", "0"]) == 2


def test_stages_print_one_plain_line_per_step(monkeypatch):
    import io
    import time

    from exportir import cli_progress

    monkeypatch.setattr(cli_progress, "SHOW_AFTER", 0.01)
    for live in (False, True):  # live: the bar starts after SHOW_AFTER and is removed at the end
        out = io.StringIO()
        stages = cli_progress.Stages(out=out, live=live)
        assert stages.run("slow", lambda: time.sleep(0.2) or 7, note=lambda r: f"({r})") == 7
        line = out.getvalue().splitlines()[-1]
        assert line.startswith("slow") and line.endswith("ms  (7)") and "\x1b" not in line
    assert cli_progress.Stages(out=io.StringIO()).live is False  # not a terminal
