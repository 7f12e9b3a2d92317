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
    for stage in ("export", "to_edge", "to_program", "wrote net.xpt"):
        assert stage in done.stdout
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
    assert "to_backend" in out and "1 delegate(s)" in out
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
    assert "load" in out and "prepare" in out
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
