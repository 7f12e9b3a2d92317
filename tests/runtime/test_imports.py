"""The runtime never loads the compiler: importing it, loading a program file and running it in
a fresh interpreter loads only the program format modules besides the runtime itself.

(torch's own export stack is not checked here: ``import torch`` loads torch.export itself.)
"""

import os
import pathlib
import subprocess
import sys
import textwrap

import torch

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"

# exportir modules the runtime may load: the program format package (validate verifies memory
# plans with the pure, stdlib-only planning.verify_plan and estimates work with the stdlib-only
# work module) and the runtime's own modules.
ALLOWED = {
    "exportir",
    "exportir.format",
    "exportir.format.schema",
    "exportir.format.serialize",
    "exportir.format.validate",
    "exportir.format._codec",
    "exportir.format._checksum",
    "exportir.format.planning",
    "exportir.format.work",
    "exportir.format.pte_read",  # ExecuTorch's .pte files (stdlib-only, like the rest)
    "exportir.format._pte_fbs",
    "exportir.format.pte_kernels",
    "exportir.format.pte_memory",
}

PROBE = textwrap.dedent(
    """
    import sys
    {prelude}
    import exportir.runtime
    import exportir.runtime.program, exportir.runtime.method, exportir.runtime.kernels
    import exportir.runtime.delegates, exportir.runtime.errors
    allowed = {allowed!r}
    {body}
    loaded = sorted(
        m for m in sys.modules
        if m.startswith("exportir") and m not in allowed and not m.startswith("exportir.runtime")
    )
    print("LOADED", loaded)
    """
)


def _run(prelude: str = "", body: str = "", env_extra: dict | None = None) -> str:
    code = PROBE.format(prelude=prelude, body=body, allowed=ALLOWED)
    env = dict(os.environ, PYTHONPATH=str(SRC), **(env_extra or {}))
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_runtime_import_loads_only_the_program_format():
    out = _run()
    assert "LOADED []" in out, out


def test_loading_and_running_a_file_loads_only_the_program_format(tmp_path):
    from runtime_programs import add_mul_program

    from exportir.format import serialize

    path = tmp_path / "m.xpt"
    serialize.save(add_mul_program(), path)
    body = textwrap.dedent(
        f"""
        import torch
        from exportir.runtime import Program
        program = Program.load({str(path)!r})
        out = program.method("forward")(torch.ones(2, 3), torch.ones(2, 3))
        assert torch.equal(out[0], torch.full((2, 3), 4.0)), out
        """
    )
    out = _run(body=body)
    assert "LOADED []" in out, out


def test_running_a_delegated_program_loads_only_the_runtime_and_its_backends(tmp_path):
    from exportir.backends.fused_cpu import FusedCpuPartitioner
    from exportir.export import export
    from exportir.program.manager import to_edge

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    x = torch.randn(2, 4)
    edge = to_edge(export(model, (x,))).to_backend(FusedCpuPartitioner())
    path = tmp_path / "d.xpt"
    path.write_bytes(edge.to_program().buffer)
    body = textwrap.dedent(
        f"""
        import torch
        from exportir.runtime import Program
        program = Program.load({str(path)!r})  # the default registry has the executor
        assert program.schema.delegates
        program.method("forward")(torch.ones(2, 4))
        """
    )
    out = _run(body=body)
    assert "LOADED []" in out, out


def test_probe_would_see_a_compiler_import():
    assert "LOADED []" not in _run(prelude="import exportir.fx")
