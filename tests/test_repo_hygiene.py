"""Repository rules that keep the suite runnable: pytest's default import mode needs every
test module basename to be unique across folders."""

import collections
import pathlib

TESTS = pathlib.Path(__file__).resolve().parent


def test_test_module_basenames_are_unique():
    seen = collections.defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        seen[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"rename one of each: {clashes}"


def test_ruff_finds_nothing():
    """The lint rules of pyproject.toml's [tool.ruff] hold on every Python file we ship or run."""
    import shutil
    import subprocess
    import sys

    ruff = pathlib.Path(sys.executable).with_name("ruff")
    exe = str(ruff) if ruff.exists() else shutil.which("ruff")
    assert exe, "ruff is a test dependency (pip install -e '.[test]')"
    root = TESTS.parent
    done = subprocess.run([exe, "check", "--no-cache", "src", "tests", "benchmarks", "scripts"],
                          cwd=root, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
