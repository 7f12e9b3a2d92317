"""Saving a program over the file a loaded program maps: the running program is unaffected.

Writing in place would truncate the mapped file and the next call would die with SIGBUS, so the
check runs in a fresh subprocess (a crash there fails the test instead of the test run).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import exportir
from exportir.format.serialize import replace_file

SRC = Path(__file__).resolve().parents[2] / "src"

SCRIPT = textwrap.dedent("""
    import sys, torch, exportir
    from exportir.runtime import Program
    path = sys.argv[1]
    torch.manual_seed(0)
    x = torch.randn(2, 64)
    first = torch.nn.Linear(64, 64).eval()
    exportir.to_edge(exportir.export(first, (x,))).to_program().save(path)
    method = Program.load(path).method("forward")
    before = method(x).clone()
    second = torch.nn.Linear(64, 8).eval()
    exportir.to_edge(exportir.export(second, (x,))).to_program().save(path)
    after = method(x)
    assert torch.equal(before, after) and torch.allclose(after, first(x), atol=1e-5)
    assert Program.load(path).method("forward")(x).shape == (2, 8)
    print("ok")
""")


def test_saving_over_a_loaded_program_keeps_it_running(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "m.xpt")],
                          check=False, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.strip() == "ok"
    assert [p.name for p in tmp_path.iterdir()] == ["m.xpt"]  # no temporary file left behind


def test_a_failed_save_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "m.xpt"
    x = torch.randn(1, 4)
    manager = exportir.to_edge(exportir.export(torch.nn.Linear(4, 4), (x,))).to_program()
    manager.save(path)
    old = path.read_bytes()

    def broken(f):
        f.write(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        replace_file(path, broken)
    assert path.read_bytes() == old
    assert [p.name for p in tmp_path.iterdir()] == ["m.xpt"]
