"""The real-model harness writes every lowered program of the corpus (about 1.7 GB) to one
scratch directory per process; it must be gone when that process exits. A run that left it
behind filled the shared CI disk after a few dozen runs and CI stopped in ``pip install``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_TESTS = _HERE.parent
_SRC = _TESTS.parent / "src"

_CHILD = """
import sys
sys.path[:0] = [{here!r}, {tests!r}, {src!r}]
import _harness as H
(H._TMP / "probe.xpt").write_bytes(b"x" * 4096)
print(H._TMP)
"""


def test_scratch_directory_removed_at_exit():
    code = _CHILD.format(here=str(_HERE), tests=str(_TESTS), src=str(_SRC))
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    scratch = Path(done.stdout.strip().splitlines()[-1])
    assert scratch.name.startswith("exportir-real-"), scratch
    assert not scratch.exists(), f"{scratch} outlived its process"
